//! [`DeliveryRate`]: how fast a node's frames are delivered while it has some in flight, and
//! the send window that keeps a target delay's worth of them in flight.
//!
//! The window of a [`super::SendQueue`] decides how much of a node's round leaves the priority
//! order: everything inside it drains through quinn at the pace of each connection. Twice the
//! congestion windows is too much on a link with a deep queue (a tc tbf, a switch buffer):
//! loss-based congestion control fills that queue before it backs off, so the congestion
//! windows grow to hold it, and half a round leaves in arbitrary order at its start
//! (BENCHMARKS.md, "Per-frame timelines"). What the link needs is its rate times the time a
//! frame may wait in it: [`DeliveryRate::window`] is the measured rate times a span
//! ([`RoundTrip::span`]): the round trip the frames see, kept between a target delay and twice
//! it, or twice the minimum RTT where that is longer (a long path).
//!
//! Why the round trip and not the delay alone: a window carries `window / round trip` bytes per
//! second, so a window of `rate × delay` carries only `delay / RTT` of the rate whenever the
//! round trip is longer than the delay. That happens when acknowledgements wait in a queue the
//! node does not fill: a server's results are acknowledged through the queue of the pushes it
//! receives. The smaller rate is then measured, the window shrinks with it, and the sender
//! spirals down to its floor; the 2 × 1 cluster at 100 Mbit/s sent its results at half the link
//! that way (BENCHMARKS.md, "Wire speed"). With no margin over the round trip, the window must
//! also count whole frames ([`RoundTrip::no_margin`], `SendQueue::set_whole_frames`), or it
//! shrinks to the next whole frame at every measurement.
//!
//! Which round trip: the node's own queue lengthens it too, and a window that follows its own
//! queue grows until it stops at twice the delay, with deeper queues, drops and more frames
//! out of the priority order (measured with the longest of the connections' smoothed RTTs:
//! 4 × 4 at 100 Mbit/s dropped 300 packets a run instead of 0–110, and spent more CPU). So the
//! span is the *shortest* smoothed RTT among the node's connections ([`RoundTrip::shared`]):
//! a queue that every connection waits in, as a server's own downlink full of pushes is, and
//! not one peer's. It is taken as it is now, not as a minimum over time: the window holds its
//! rate only while the span covers the round trip, and once a stale, shorter span has let the
//! rate estimate sink, no span brings it back (measured: a two-second minimum left the 2 × 1
//! cluster at 1.42×).
//!
//! The rate is measured, not configured. A *busy period* starts when a frame is sent with none
//! in flight and ends when none is left; it is cut into samples of at least
//! [`SAMPLE_PERIOD`], each `bytes delivered / time`, and the rate is the largest sample of the
//! last [`MEMORY`] (a windowed maximum, as BBR keeps its bottleneck bandwidth). Time with
//! nothing in flight never counts, so a round's pauses don't lower it. A sample can only
//! under-estimate what the path carried while the window limited the sender, and since the
//! target delay is many times the round trip of a data-centre path, a window of `rate × delay`
//! lets the sender go many times faster than the estimate: the estimate climbs to the link's
//! rate within a few samples.
//!
//! No clock here: the shell passes the time in.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The shortest span of a rate sample.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(50);

/// How long a rate sample is remembered.
pub const MEMORY: Duration = Duration::from_secs(2);

/// What a node's connections say of the round trip, for [`DeliveryRate::window`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundTrip {
    /// The longest of the connections' minimum round trips: the path's, with empty queues.
    pub path: Duration,
    /// The shortest of the connections' smoothed round trips: what a queue that every one of
    /// them waits in adds to the path.
    pub shared: Duration,
}

impl RoundTrip {
    /// How long a window should last at the measured rate: [`RoundTrip::shared`] kept between
    /// `delay` and twice it, or twice [`RoundTrip::path`] if that is longer. See the [module
    /// docs](self).
    pub fn span(&self, delay: Duration) -> Duration {
        self.shared
            .clamp(delay, delay.saturating_mul(2))
            .max(self.path.saturating_mul(2))
    }

    /// Whether a window of [`RoundTrip::span`] has no margin over the round trip its frames
    /// see: it then carries the rate it was sized from only if it counts whole frames
    /// (`SendQueue::set_whole_frames`).
    pub fn no_margin(&self, delay: Duration) -> bool {
        self.span(delay) <= self.shared
    }
}

/// Measures a node's delivery rate over its busy periods. See the [module docs](self).
#[derive(Debug, Default)]
pub struct DeliveryRate {
    /// The start of the current sample, while frames are in flight.
    since: Option<Instant>,
    /// Bytes delivered since `since`.
    bytes: u64,
    /// Whether `since` is the start of a busy period (every byte delivered since was sent
    /// since), not the end of the previous sample (bytes sent before it may arrive just after).
    fresh: bool,
    /// `(when, bytes per second)`, oldest first, each larger than every later one (so the
    /// front is the windowed maximum).
    samples: VecDeque<(Instant, f64)>,
}

impl DeliveryRate {
    /// Nothing measured yet.
    pub fn new() -> DeliveryRate {
        DeliveryRate::default()
    }

    /// A frame was handed to the transport at `now`, with `in_flight_before` bytes in flight
    /// before it.
    pub fn sent(&mut self, now: Instant, in_flight_before: u64) {
        if in_flight_before == 0 || self.since.is_none() {
            self.since = Some(now);
            self.bytes = 0;
            self.fresh = true;
        }
    }

    /// `bytes` were delivered at `now`, leaving `in_flight_after` bytes in flight.
    pub fn delivered(&mut self, now: Instant, bytes: u64, in_flight_after: u64) {
        let Some(since) = self.since else {
            return;
        };
        self.bytes = self.bytes.saturating_add(bytes);
        let span = now.saturating_duration_since(since);
        if span >= SAMPLE_PERIOD {
            self.record(now, self.bytes as f64 / span.as_secs_f64());
            self.since = Some(now);
            self.bytes = 0;
            self.fresh = false;
        }
        if in_flight_after == 0 {
            // The busy period ends. A short one is a sample too: all its bytes were sent within
            // it, so it can only under-estimate. A short tail after a sample is not: bytes sent
            // before the tail began may be acknowledged just after it did.
            if self.fresh && self.bytes > 0 && !span.is_zero() {
                self.record(now, self.bytes as f64 / span.as_secs_f64());
            }
            self.since = None;
            self.bytes = 0;
        }
    }

    fn record(&mut self, now: Instant, rate: f64) {
        while self.samples.back().is_some_and(|&(_, r)| r <= rate) {
            self.samples.pop_back();
        }
        self.samples.push_back((now, rate));
    }

    /// The largest rate sampled in the last [`MEMORY`] before `now`, bytes per second.
    pub fn rate(&mut self, now: Instant) -> Option<f64> {
        while self
            .samples
            .front()
            .is_some_and(|&(t, _)| now.saturating_duration_since(t) > MEMORY)
        {
            self.samples.pop_front();
        }
        self.samples.front().map(|&(_, r)| r)
    }

    /// `rate × span` bytes (see [`RoundTrip::span`]), or `None` before the first sample.
    pub fn window(&mut self, now: Instant, span: Duration) -> Option<u64> {
        self.rate(now).map(|r| (r * span.as_secs_f64()) as u64)
    }
}

#[cfg(test)]
mod tests;
