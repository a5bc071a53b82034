use super::*;

fn at(t0: Instant, secs: f64) -> Instant {
    t0 + Duration::from_secs_f64(secs)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs()
}

#[test]
fn nothing_measured_means_no_rate() {
    let t0 = Instant::now();
    let mut r = DeliveryRate::new();
    assert_eq!(r.rate(t0), None);
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
fn a_reply_spans_the_round_trip_within_its_bounds() {
    let ms = Duration::from_millis;
    let rtt = |path, shared| RoundTrip {
        path: ms(path),
        shared: ms(shared),
    };
    // A short round trip: the least span, with a margin over it.
    assert_eq!(rtt(1, 2).reply_span(), REPLY_SPAN.0);
    // Queues on the way: the round trip, up to the most.
    assert_eq!(rtt(1, 70).reply_span(), ms(70));
    assert_eq!(rtt(1, 400).reply_span(), REPLY_SPAN.1);
    // A long path: twice its minimum round trip.
    assert_eq!(rtt(60, 65).reply_span(), ms(120));
}

#[test]
fn the_window_of_each_flow() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let rtt = RoundTrip {
        path: ms(2),
        shared: ms(70),
    };
    let mut r = DeliveryRate::new();
    // Before the first sample: a source's is its queue, a reply has none.
    assert_eq!(
        r.window(t0, Flow::SOURCE, rtt),
        Some(Window {
            bytes: SOURCE_QUEUE,
            whole_frames: false
        })
    );
    assert_eq!(r.window(t0, Flow::Reply, rtt), None);
    r.sent(t0, 0);
    r.delivered(at(t0, 0.1), 1_000_000, 0); // 10 MB/s
    let now = at(t0, 0.1);
    // The source: what the bare path holds (10 MB/s × 4 ms) plus its queue; its own round
    // trip does not count.
    assert_eq!(
        r.window(now, Flow::SOURCE, rtt),
        Some(Window {
            bytes: SOURCE_QUEUE + 40_000,
            whole_frames: false
        })
    );
    // The reply: the rate times its round trip, in whole frames.
    assert_eq!(
        r.window(now, Flow::Reply, rtt),
        Some(Window {
            bytes: 700_000,
            whole_frames: true
        })
    );
    // A source's queue at other rates (bytes delivered in 0.1 s; the path adds rate × 4 ms):
    // a slow node (1 MB/s) queues at most SOURCE_DELAY of its rate, a fast one (2 GB/s)
    // SOURCE_FAST_QUEUE of it (10 MB), not 256 KiB.
    for (delivered, queue) in [
        (100_000, (1e6 * SOURCE_DELAY.as_secs_f64()) as u64),
        (200_000_000, 10_000_000),
    ] {
        let mut node = DeliveryRate::new();
        node.sent(t0, 0);
        node.delivered(at(t0, 0.1), delivered, 0);
        let path = delivered * 10 * 4 / 1000;
        assert_eq!(
            node.window(now, Flow::SOURCE, rtt),
            Some(Window {
                bytes: queue + path,
                whole_frames: false
            }),
            "{delivered} bytes in 0.1 s"
        );
    }
}

#[test]
fn a_source_of_large_frames_keeps_a_fast_path_busy() {
    // Loopback as an H100 machine's training job saw it (BENCHMARKS.md at 60710fe, "PyTorch
    // on GPUs"): 2 GB/s, a bare round trip of 50 µs, and each frame acknowledged 1 ms after
    // its last byte (the receiving process's delay); 1 MiB frames. A window of 256 KiB plus
    // the bare path held two frames at a time and carried about two thirds of the path.
    let path = Path {
        rate: 2e9,
        rtt: 50e-6,
        reverse: 1e-3,
    };
    let out = &simulate(path, &[(Flow::SOURCE, 0.0)], 1 << 20, 65_536, 3.0)[0];
    assert!(out.carried >= 0.95 * path.rate, "{out:?}");
    assert!(
        (0.95..=1.05).contains(&(out.estimate / path.rate)),
        "{out:?}"
    );
    // The window is what the rule gives at that rate: SOURCE_FAST_QUEUE of it and the path.
    let want = out.estimate * (SOURCE_FAST_QUEUE.as_secs_f64() + 2.0 * path.rtt);
    assert!(
        (out.window as f64 - want).abs() <= 2.0,
        "{out:?}, want {want}"
    );
}

/// A link as the simulations see it: `rate` bytes/s through one FIFO queue that every sender
/// shares, a round trip of `rtt` seconds, and acknowledgements that wait `reverse` seconds
/// more in a queue of another flow's (e.g. a server's results, acknowledged through the queue
/// of the pushes it receives).
#[derive(Clone, Copy, Debug)]
struct Path {
    rate: f64,
    rtt: f64,
    reverse: f64,
}

/// One simulated sender: a [`SendQueue`](crate::sendq::SendQueue) with an endless backlog
/// behind the window its [`DeliveryRate`] gives for its flow (the shell's rule: `initial`
/// until the rule gives one, whole frames where it says, and the flow's floor of frames).
struct Sim {
    flow: Flow,
    start: f64,
    est: DeliveryRate,
    q: crate::sendq::SendQueue<()>,
    /// quinn's smoothed round trip: 7/8 of the last plus 1/8 of each sample.
    smoothed: f64,
    /// Bytes delivered in the last half of the run.
    late: u64,
}

/// What a simulated sender ended with: its rate estimate, its window, and the bytes per second
/// the link carried for it over the last half of the run.
#[derive(Debug)]
struct Outcome {
    estimate: f64,
    window: u64,
    carried: f64,
}

/// Senders of `frame`-byte frames, one per `(flow, start second)`, over `path` for `secs`
/// seconds. See [`Sim`].
fn simulate(
    path: Path,
    senders: &[(Flow, f64)],
    frame: u64,
    initial: u64,
    secs: f64,
) -> Vec<Outcome> {
    let t0 = Instant::now();
    let mut sims: Vec<Sim> = senders
        .iter()
        .map(|&(flow, start)| Sim {
            flow,
            start,
            est: DeliveryRate::new(),
            q: {
                let mut q = crate::sendq::SendQueue::new(initial);
                q.set_min_frames(flow.min_frames());
                q
            },
            smoothed: path.rtt,
            late: 0,
        })
        .collect();
    // (sender, sent, acknowledged) per frame in flight, in the link's order.
    let mut acks: VecDeque<(usize, f64, f64)> = VecDeque::new();
    let (mut now, mut link_free) = (0.0f64, 0.0f64);
    while now < secs {
        for (i, s) in sims.iter_mut().enumerate() {
            if s.start > now {
                continue;
            }
            let rtt = RoundTrip {
                path: Duration::from_secs_f64(path.rtt),
                shared: Duration::from_secs_f64(s.smoothed),
            };
            if let Some(w) = s.est.window(at(t0, now), s.flow, rtt) {
                s.q.set_window(w.bytes);
                s.q.set_whole_frames(w.whole_frames);
            }
            loop {
                if s.q.is_empty() {
                    s.q.push((), 0, frame);
                }
                let in_flight = s.q.in_flight();
                if s.q.pop().is_none() {
                    break;
                }
                s.est.sent(at(t0, now), in_flight);
                link_free = link_free.max(now) + frame as f64 / path.rate;
                acks.push_back((i, now, link_free + path.rtt + path.reverse));
            }
        }
        let next_start = sims
            .iter()
            .map(|s| s.start)
            .filter(|&t| t > now)
            .fold(f64::INFINITY, f64::min);
        match acks.front() {
            Some(&(_, _, t)) if t <= next_start => {}
            _ => {
                now = next_start;
                continue;
            }
        }
        let (i, sent, t) = acks.pop_front().expect("a frame is in flight");
        now = t;
        let s = &mut sims[i];
        s.smoothed = s.smoothed * 7.0 / 8.0 + (now - sent) / 8.0;
        s.q.delivered(frame);
        s.est.delivered(at(t0, now), frame, s.q.in_flight());
        if now >= secs / 2.0 {
            s.late += frame;
        }
    }
    sims.into_iter()
        .map(|mut s| Outcome {
            estimate: s.est.rate(at(t0, now)).expect("measured"),
            window: s.q.window(),
            carried: s.late as f64 / (secs / 2.0),
        })
        .collect()
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
        let path = Path {
            rate,
            rtt,
            reverse: 0.0,
        };
        for flow in [Flow::SOURCE, Flow::Reply] {
            let out = &simulate(path, &[(flow, 0.0)], 16_384, 65_536, 3.0)[0];
            let what = format!("{flow:?} at rate {rate}, rtt {rtt}: {out:?}");
            assert!((0.95..=1.05).contains(&(out.estimate / rate)), "{what}");
            assert!(out.carried >= 0.95 * rate, "{what}");
            let w = out.window as f64;
            match flow {
                // What the bare path holds, and the queue.
                Flow::Source { .. } => {
                    let queue = (SOURCE_QUEUE as f64)
                        .max((out.estimate * SOURCE_FAST_QUEUE.as_secs_f64()).floor())
                        .min(out.estimate * SOURCE_DELAY.as_secs_f64());
                    let expected = queue.floor() + out.estimate * 2.0 * rtt;
                    assert!((w - expected).abs() <= 1.0, "{what}");
                }
                // A reply's own queue lengthens its round trip, so its window may grow up to
                // the longest span's worth (or twice the path's round trip), never further.
                Flow::Reply => {
                    let least = REPLY_SPAN.0.as_secs_f64().max(2.0 * rtt);
                    let most = REPLY_SPAN.1.as_secs_f64().max(2.0 * rtt);
                    let s = w / rate;
                    assert!((0.9 * least..=1.1 * most).contains(&s), "{what}");
                }
            }
        }
    }
}

#[test]
fn acknowledgements_delayed_by_another_flow_do_not_shrink_a_reply_window() {
    // The 2 × 1 cluster at 100 Mbit/s (BENCHMARKS.md at 60710fe, "The window spans the round
    // trip"): the server's results are acknowledged through the queue of the pushes it
    // receives, so its frames' round trip is longer than the least span. A window of the rate
    // times that span then carries span / round trip of the rate, measures that, and shrinks
    // again, down to its floor; the window of the round trip keeps the rate it found. The
    // window before the first sample is what the congestion windows allow (here 2 MB).
    // Frames of 16 KiB, and of 128 KiB: a window of a few of those carries its rate only if it
    // counts whole frames.
    for (rate, reverse, frame) in [
        (12.5e6, 0.07, 16_384),
        (12.5e6, 0.09, 16_384),
        (1.25e6, 0.07, 16_384),
        (12.5e6, 0.07, 131_072),
        (12.5e6, 0.09, 131_072),
    ] {
        let path = Path {
            rate,
            rtt: 0.0005,
            reverse,
        };
        let out = &simulate(path, &[(Flow::Reply, 0.0)], frame, 2_000_000, 4.0)[0];
        assert!(
            out.carried >= 0.95 * rate,
            "rate {rate} reverse queue {reverse} s, {frame}-byte frames: {out:?}"
        );
    }
}

#[test]
fn sources_sharing_a_link_take_equal_shares_of_it() {
    // Two workers pushing into one server (BENCHMARKS.md at 60710fe, "Equal windows for
    // sources"): the first starts alone, measures the whole link, and would keep that sample's
    // window for MEMORY if its window followed its own rate; the second starts from the floor.
    // With a fixed queue each, the shares meet within a few round trips, whatever the start.
    for (rate, frame) in [
        (12.5e6, 131_072),
        (12.5e6, 65_536),
        (1.25e6, 131_072),
        (1.25e6, 16_384),
    ] {
        let path = Path {
            rate,
            rtt: 0.0005,
            reverse: 0.0,
        };
        let senders = [(Flow::SOURCE, 0.0), (Flow::SOURCE, 0.5)];
        let out = simulate(path, &senders, frame, 65_536, 8.0);
        let what = format!("rate {rate}, {frame}-byte frames: {out:?}");
        assert!(out[0].carried + out[1].carried >= 0.95 * rate, "{what}");
        for o in &out {
            assert!((0.45..=0.55).contains(&(o.carried / rate)), "{what}");
        }
    }
}

#[test]
fn sources_that_share_a_link_split_one_queue() {
    // A local group of four on a 100 Mbit/s host link (`bench net --local-size 4`): each member
    // owns a quarter of the chunks and pushes them. With a queue each, the four keep four
    // queues in the link's buffer (at a quarter of the link each, SOURCE_DELAY of their rate:
    // 625 kB, most of the tbf queue of 756 kB); as sharers of one queue they keep one, and
    // still fill the link in equal shares.
    let path = Path {
        rate: 12.5e6,
        rtt: 0.0005,
        reverse: 0.0,
    };
    for sharers in [1, 4] {
        let flow = Flow::Source { sharers };
        let senders = [(flow, 0.0), (flow, 0.1), (flow, 0.2), (flow, 0.3)];
        let out = simulate(path, &senders, 131_072, 65_536, 8.0);
        let what = format!("{sharers} sharers: {out:?}");
        let carried: f64 = out.iter().map(|o| o.carried).sum();
        assert!(carried >= 0.95 * path.rate, "{what}");
        for o in &out {
            assert!((0.2..=0.3).contains(&(o.carried / path.rate)), "{what}");
        }
        // What the four keep queued: their windows less what the bare path holds.
        let queued: f64 = out
            .iter()
            .map(|o| o.window as f64 - o.estimate * 2.0 * path.rtt)
            .sum();
        if sharers == 1 {
            let each = (path.rate / 4.0 * SOURCE_DELAY.as_secs_f64()).min(SOURCE_QUEUE as f64);
            assert!(queued >= 0.9 * 4.0 * each, "{what}: {queued} queued");
        } else {
            assert!(
                (queued - SOURCE_QUEUE as f64).abs() <= 4.0,
                "{what}: {queued} queued"
            );
        }
    }
}

#[test]
fn a_reply_keeps_its_link_busy_when_acknowledgements_wait_longer_than_a_frame() {
    // The 2 × 1 cluster at 10 Mbit/s (BENCHMARKS.md at 60710fe, "A ceiling on the congestion
    // window"): a 118 kB result is 94 ms of the server's link, and its acknowledgement waits
    // 150 ms more in the queue of pushes into the server. Two frames in flight leave the link
    // idle from the end of the second until the first one's acknowledgement, 2 × 94 ms of
    // every 245 ms.
    let path = Path {
        rate: 1.25e6,
        rtt: 0.0005,
        reverse: 0.150,
    };
    let frame = 118_000;
    let out = &simulate(path, &[(Flow::Reply, 0.0)], frame, 65_536, 20.0)[0];
    // With a floor of two, 0.78 of the link.
    assert!(out.carried >= 0.95 * path.rate, "{out:?}");
}
