use super::*;

fn at(t0: Instant, secs: f64) -> Instant {
    t0 + Duration::from_secs_f64(secs)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs()
}

#[test]
fn nothing_measured_means_no_window() {
    let t0 = Instant::now();
    let mut r = DeliveryRate::new();
    assert_eq!(r.rate(t0), None);
    assert_eq!(
        r.window(t0, Duration::from_millis(50), Duration::ZERO),
        None
    );
    // A delivery without a send (a frame the estimator never saw) measures nothing.
    r.delivered(at(t0, 0.1), 1000, 0);
    assert_eq!(r.rate(at(t0, 0.1)), None);
}

#[test]
fn idle_time_between_busy_periods_does_not_count() {
    let t0 = Instant::now();
    let mut r = DeliveryRate::new();
    r.sent(t0, 0);
    r.delivered(at(t0, 0.1), 100_000, 0);
    assert!(close(r.rate(at(t0, 0.1)).unwrap(), 1e6));
    // One second idle, then the same again: still 1 MB/s, not 200 kB over 1.2 s.
    r.sent(at(t0, 1.1), 0);
    r.delivered(at(t0, 1.2), 100_000, 0);
    assert!(close(r.rate(at(t0, 1.2)).unwrap(), 1e6));
}

#[test]
fn a_busy_period_is_cut_into_samples_and_the_largest_is_kept() {
    let t0 = Instant::now();
    let mut r = DeliveryRate::new();
    r.sent(t0, 0);
    r.sent(at(t0, 0.001), 10_000);
    // 50 ms at 2 MB/s, then 100 ms at 1 MB/s: the maximum is 2 MB/s.
    r.delivered(at(t0, 0.05), 100_000, 50_000);
    r.delivered(at(t0, 0.15), 100_000, 10_000);
    assert!(close(r.rate(at(t0, 0.15)).unwrap(), 2e6));
}

#[test]
fn a_short_tail_after_a_sample_is_not_a_sample() {
    let t0 = Instant::now();
    let mut r = DeliveryRate::new();
    r.sent(t0, 0);
    r.delivered(at(t0, 0.06), 60_000, 60_000);
    let first = r.rate(at(t0, 0.06)).unwrap();
    assert!(close(first, 1e6));
    // The last 60 kB, sent long before, acknowledged 1 ms after the sample ended: 60 MB/s
    // over that millisecond, which says nothing about the link.
    r.delivered(at(t0, 0.061), 60_000, 0);
    assert!(close(r.rate(at(t0, 0.061)).unwrap(), first));
}

#[test]
fn samples_are_forgotten_after_the_memory() {
    let t0 = Instant::now();
    let mut r = DeliveryRate::new();
    r.sent(t0, 0);
    r.delivered(at(t0, 0.1), 400_000, 0); // 4 MB/s
    r.sent(at(t0, 1.0), 0);
    r.delivered(at(t0, 1.1), 100_000, 0); // 1 MB/s
    assert!(close(r.rate(at(t0, 1.1)).unwrap(), 4e6));
    let later = at(t0, 0.1) + MEMORY + Duration::from_millis(1);
    assert!(close(r.rate(later).unwrap(), 1e6));
    assert_eq!(r.rate(later + MEMORY), None);
}

#[test]
fn the_window_is_the_rate_times_the_larger_of_the_delay_and_two_round_trips() {
    let t0 = Instant::now();
    let mut r = DeliveryRate::new();
    r.sent(t0, 0);
    r.delivered(at(t0, 0.1), 1_000_000, 0); // 10 MB/s
    let now = at(t0, 0.1);
    let ms = Duration::from_millis;
    assert_eq!(r.window(now, ms(50), ms(1)), Some(500_000));
    assert_eq!(r.window(now, ms(50), ms(40)), Some(800_000));
}

/// A sender with an endless backlog of `frame`-byte frames behind a window of what the
/// estimator says (`initial` before it says anything), over a FIFO link of `rate` bytes/s and
/// round trip `rtt`, for `secs` seconds. Returns the estimate, the last window and the bytes
/// delivered per second over the last half of the run.
fn simulate(rate: f64, rtt: f64, frame: u64, initial: u64, secs: f64) -> (f64, u64, f64) {
    let t0 = Instant::now();
    let delay = Duration::from_millis(50);
    let mut est = DeliveryRate::new();
    let mut acks: VecDeque<f64> = VecDeque::new();
    let (mut now, mut link_free, mut in_flight, mut window) = (0.0f64, 0.0f64, 0u64, initial);
    let mut late_bytes = 0u64;
    while now < secs {
        while in_flight + frame <= window.max(2 * frame) {
            est.sent(at(t0, now), in_flight);
            in_flight += frame;
            link_free = link_free.max(now) + frame as f64 / rate;
            acks.push_back(link_free + rtt);
        }
        now = acks.pop_front().expect("a frame is in flight");
        in_flight -= frame;
        est.delivered(at(t0, now), frame, in_flight);
        if now >= secs / 2.0 {
            late_bytes += frame;
        }
        let rtt = Duration::from_secs_f64(rtt);
        window = est.window(at(t0, now), delay, rtt).unwrap_or(initial);
    }
    let estimate = est.rate(at(t0, now)).expect("measured");
    (estimate, window, late_bytes as f64 / (secs / 2.0))
}

#[test]
fn a_small_first_window_grows_to_fill_the_link_and_no_further() {
    // 10 Mbit/s to 10 Gbit/s on a data-centre round trip, and 100 Mbit/s across a continent.
    for (rate, rtt) in [
        (1.25e6, 0.0005),
        (12.5e6, 0.0005),
        (125e6, 0.0002),
        (1.25e9, 0.0001),
        (12.5e6, 0.040),
    ] {
        let (estimate, window, carried) = simulate(rate, rtt, 16_384, 65_536, 3.0);
        let span = 0.05f64.max(2.0 * rtt);
        assert!(
            (0.95..=1.05).contains(&(estimate / rate)),
            "rate {rate} rtt {rtt}: estimate {estimate}"
        );
        assert!(
            (0.9..=1.1).contains(&(window as f64 / (rate * span))),
            "rate {rate} rtt {rtt}: window {window}"
        );
        assert!(
            carried >= 0.95 * rate,
            "rate {rate} rtt {rtt}: the link carried {carried}"
        );
    }
}
