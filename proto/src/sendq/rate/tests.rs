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
    assert_eq!(r.window(t0, Duration::from_millis(50)), None);
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
fn the_span_is_the_round_trip_kept_between_the_delay_and_twice_it() {
    let ms = Duration::from_millis;
    let rtt = |path, shared| RoundTrip {
        path: ms(path),
        shared: ms(shared),
    };
    // A short round trip: the delay, with a margin over it.
    assert_eq!(rtt(1, 2).span(ms(50)), ms(50));
    assert!(!rtt(1, 2).no_margin(ms(50)));
    // Queues on the way: the round trip, up to twice the delay, with no margin.
    assert_eq!(rtt(1, 70).span(ms(50)), ms(70));
    assert!(rtt(1, 70).no_margin(ms(50)));
    assert_eq!(rtt(1, 400).span(ms(50)), ms(100));
    assert!(rtt(1, 400).no_margin(ms(50)));
    // A long path: twice its minimum round trip.
    assert_eq!(rtt(40, 45).span(ms(50)), ms(80));
    assert!(!rtt(40, 45).no_margin(ms(50)));
}

#[test]
fn the_window_is_the_rate_times_the_span() {
    let t0 = Instant::now();
    let mut r = DeliveryRate::new();
    r.sent(t0, 0);
    r.delivered(at(t0, 0.1), 1_000_000, 0); // 10 MB/s
    let ms = Duration::from_millis;
    assert_eq!(r.window(at(t0, 0.1), ms(50)), Some(500_000));
    assert_eq!(r.window(at(t0, 0.1), ms(70)), Some(700_000));
}

/// A [`SendQueue`](crate::sendq::SendQueue) with an endless backlog of `frame`-byte frames
/// behind a window of what the estimator says (`initial` before it says anything, and counting
/// whole frames where the span has no margin, as the net crate's sender does), over a FIFO
/// link of `rate` bytes/s and round trip `rtt`, whose acknowledgements wait `reverse` seconds
/// more in a queue of another flow's (e.g. a server's results, acknowledged through the queue
/// of the pushes it receives), for `secs` seconds. The smoothed round trip is quinn's (7/8 of
/// the last plus 1/8 of each sample), the minimum the bare path's. Returns the estimate, the
/// last window and the bytes delivered per second over the last half of the run.
fn simulate(
    rate: f64,
    rtt: f64,
    reverse: f64,
    frame: u64,
    initial: u64,
    secs: f64,
) -> (f64, u64, f64) {
    let t0 = Instant::now();
    let delay = Duration::from_millis(50);
    let mut est = DeliveryRate::new();
    let mut q = crate::sendq::SendQueue::new(initial);
    // (sent, acknowledged) per frame in flight, oldest first.
    let mut acks: VecDeque<(f64, f64)> = VecDeque::new();
    let (mut now, mut link_free) = (0.0f64, 0.0f64);
    let mut smoothed = rtt;
    let mut late_bytes = 0u64;
    while now < secs {
        loop {
            if q.is_empty() {
                q.push((), 0, frame);
            }
            let in_flight = q.in_flight();
            if q.pop().is_none() {
                break;
            }
            est.sent(at(t0, now), in_flight);
            link_free = link_free.max(now) + frame as f64 / rate;
            acks.push_back((now, link_free + rtt + reverse));
        }
        let sent;
        (sent, now) = acks.pop_front().expect("a frame is in flight");
        smoothed = smoothed * 7.0 / 8.0 + (now - sent) / 8.0;
        q.delivered(frame);
        est.delivered(at(t0, now), frame, q.in_flight());
        if now >= secs / 2.0 {
            late_bytes += frame;
        }
        let rtt = RoundTrip {
            path: Duration::from_secs_f64(rtt),
            shared: Duration::from_secs_f64(smoothed),
        };
        if let Some(w) = est.window(at(t0, now), rtt.span(delay)) {
            q.set_window(w);
            q.set_whole_frames(rtt.no_margin(delay));
        }
    }
    let estimate = est.rate(at(t0, now)).expect("measured");
    (estimate, q.window(), late_bytes as f64 / (secs / 2.0))
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
        let (estimate, window, carried) = simulate(rate, rtt, 0.0, 16_384, 65_536, 3.0);
        assert!(
            (0.95..=1.05).contains(&(estimate / rate)),
            "rate {rate} rtt {rtt}: estimate {estimate}"
        );
        // Our own queue lengthens the round trip, so the window may grow up to twice the
        // delay's worth (or twice the path's round trip), never further.
        let (least, most) = (0.05f64.max(2.0 * rtt), 0.1f64.max(2.0 * rtt));
        let w = window as f64 / rate;
        assert!(
            (0.9 * least..=1.1 * most).contains(&w),
            "rate {rate} rtt {rtt}: window {window} ({w} s of the link)"
        );
        assert!(
            carried >= 0.95 * rate,
            "rate {rate} rtt {rtt}: the link carried {carried}"
        );
    }
}

#[test]
fn acknowledgements_delayed_by_another_flow_do_not_shrink_the_window() {
    // The 2 × 1 cluster at 100 Mbit/s (BENCHMARKS.md, "Wire speed"): the server's results are
    // acknowledged through the queue of the pushes it receives, so its frames' round trip is
    // longer than the delay. A window of the rate times the delay then carries delay / round
    // trip of the rate, measures that, and shrinks again, down to its floor; the window of the
    // round trip keeps the rate it found. The window before the first sample is what the
    // congestion windows allow (here 2 MB).
    // Frames of 16 KiB, and of 128 KiB: a window of a few of those carries its rate only if it
    // counts whole frames.
    for (rate, reverse, frame) in [
        (12.5e6, 0.07, 16_384),
        (12.5e6, 0.09, 16_384),
        (1.25e6, 0.07, 16_384),
        (12.5e6, 0.07, 131_072),
        (12.5e6, 0.09, 131_072),
    ] {
        let (estimate, _, carried) = simulate(rate, 0.0005, reverse, frame, 2_000_000, 4.0);
        assert!(
            carried >= 0.95 * rate,
            "rate {rate} reverse queue {reverse} s, {frame}-byte frames: the link carried \
             {carried}, estimate {estimate}"
        );
    }
}
