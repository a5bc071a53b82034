//! [`RoundTimes`]: a fixed-bucket histogram of a tensor's round durations, counted with
//! atomics on the round's task (one observation per completed round) and read at any time,
//! e.g. by a Prometheus endpoint at scrape time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds, in seconds, of [`RoundTimes::counts`]' buckets (each bucket counts the rounds
/// that took at most its bound and more than the one before; the last bucket, past the last
/// bound, is the `+Inf` bucket).
pub const ROUND_SECONDS_BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// A snapshot of the wall-clock times of a tensor's completed rounds (push_pull and broadcast
/// calls, from the start of the round's task until its result was in the buffer).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RoundTimes {
    /// Rounds per bucket (not cumulative): `counts[i]` for `i <
    /// ROUND_SECONDS_BUCKETS.len()` took at most `ROUND_SECONDS_BUCKETS[i]` seconds (and more
    /// than the bound before); the last entry counts the longer ones.
    pub counts: [u64; ROUND_SECONDS_BUCKETS.len() + 1],
    /// Seconds of every counted round, summed.
    pub sum_seconds: f64,
}

impl RoundTimes {
    /// Rounds counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// `(upper bound, rounds that took at most that long)` per bound: Prometheus's cumulative
    /// buckets (the `+Inf` bucket is [`RoundTimes::count`]).
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut acc = 0;
        ROUND_SECONDS_BUCKETS
            .iter()
            .zip(self.counts)
            .map(|(&bound, n)| {
                acc += n;
                (bound, acc)
            })
            .collect()
    }

    /// Adds `other`'s counts and sum to these.
    pub fn add(&mut self, other: &RoundTimes) {
        for (a, b) in self.counts.iter_mut().zip(other.counts) {
            *a += b;
        }
        self.sum_seconds += other.sum_seconds;
    }
}

/// The live counters behind a [`RoundTimes`].
#[derive(Debug, Default)]
pub(crate) struct RoundClock {
    counts: [AtomicU64; ROUND_SECONDS_BUCKETS.len() + 1],
    nanos: AtomicU64,
}

impl RoundClock {
    /// Counts one round that took `took`.
    pub(crate) fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let i = ROUND_SECONDS_BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(ROUND_SECONDS_BUCKETS.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The counts so far.
    pub(crate) fn snapshot(&self) -> RoundTimes {
        RoundTimes {
            counts: std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed)),
            sum_seconds: self.nanos.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_the_long_ones_are_counted() {
        let c = RoundClock::default();
        c.observe(Duration::from_micros(300)); // first bucket
        c.observe(Duration::from_millis(1)); // exactly a bound: that bucket
        c.observe(Duration::from_millis(40)); // 0.05
        c.observe(Duration::from_secs(100)); // past the last bound
        let t = c.snapshot();
        assert_eq!(t.count(), 4);
        let cum = t.cumulative();
        assert_eq!(cum[0], (0.0005, 1));
        assert_eq!(cum[1], (0.001, 2));
        assert_eq!(cum[6], (0.05, 3));
        assert_eq!(cum.last().unwrap().1, 3);
        assert!((t.sum_seconds - 100.0413).abs() < 1e-6);
        let mut twice = t;
        twice.add(&t);
        assert_eq!(twice.count(), 8);
    }
}
