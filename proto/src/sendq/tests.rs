use super::*;
use proptest::prelude::*;

/// Pops everything the window allows.
fn pop_all<T>(q: &mut SendQueue<T>) -> Vec<(T, i32, u64)> {
    std::iter::from_fn(|| q.pop()).collect()
}

#[test]
fn higher_priority_first_then_fifo() {
    let mut q = SendQueue::new(u64::MAX);
    q.push("a0", 0, 10);
    q.push("b5", 5, 10);
    q.push("a1", 0, 10);
    q.push("c-3", -3, 10);
    q.push("b5'", 5, 10);
    let order: Vec<&str> = pop_all(&mut q).into_iter().map(|e| e.0).collect();
    assert_eq!(order, ["b5", "b5'", "a0", "a1", "c-3"]);
    assert_eq!(q.in_flight(), 50);
    assert!(q.is_empty());
}

#[test]
fn the_window_holds_frames_back_until_delivery() {
    let mut q = SendQueue::new(100);
    for i in 0..5 {
        q.push(i, 0, 40);
    }
    assert_eq!(
        pop_all(&mut q).len(),
        2,
        "40 + 40 fit in 100, a third does not"
    );
    assert_eq!(q.in_flight(), 80);
    assert_eq!((q.len(), q.queued_bytes()), (3, 120));
    q.delivered(40);
    let next = pop_all(&mut q);
    assert_eq!(next.iter().map(|e| e.0).collect::<Vec<_>>(), [2]);
    assert_eq!(q.in_flight(), 80);
}

#[test]
fn a_window_of_whole_frames_lets_the_last_one_overshoot_it() {
    // A window of 3.5 frames keeps 4 in flight, not 3: one that kept 3 would carry 3/3.5 of
    // the rate it was sized from (see the module docs).
    let mut q = SendQueue::new(350);
    for i in 0..8 {
        q.push(i, 0, 100);
    }
    assert_eq!(pop_all(&mut q).len(), 3, "whole frames in full by default");
    q.set_whole_frames(true);
    assert_eq!(pop_all(&mut q).len(), 1, "300 in flight is below 350");
    q.delivered(100);
    assert_eq!(pop_all(&mut q).len(), 1);
    q.set_window(300);
    q.delivered(100);
    assert!(q.pop().is_none(), "300 in flight, window 300");
}

#[test]
fn frames_larger_than_the_window_go_two_at_a_time() {
    let mut q = SendQueue::new(10);
    for name in ["big0", "big1", "big2"] {
        q.push(name, 0, 1000);
    }
    q.push("small", 0, 1);
    let sent: Vec<&str> = pop_all(&mut q).into_iter().map(|e| e.0).collect();
    assert_eq!(sent, ["big0", "big1"]);
    q.delivered(1000);
    assert_eq!(q.pop().map(|e| e.0), Some("big2"));
    assert!(
        q.pop().is_none(),
        "2000 in flight: a small frame waits for the window"
    );
    q.delivered(1000);
    q.delivered(1000);
    assert_eq!(q.pop().map(|e| e.0), Some("small"));
}

#[test]
fn a_later_higher_priority_frame_overtakes_queued_ones_but_not_sent_ones() {
    let mut q = SendQueue::new(100);
    for i in 0..4 {
        q.push(format!("low{i}"), 0, 50);
    }
    let sent: Vec<String> = pop_all(&mut q).into_iter().map(|e| e.0).collect();
    assert_eq!(sent, ["low0", "low1"]);
    q.push("high".to_string(), 9, 50);
    q.delivered(50);
    assert_eq!(q.pop().map(|e| e.0).as_deref(), Some("high"));
    q.delivered(50);
    assert_eq!(q.pop().map(|e| e.0).as_deref(), Some("low2"));
}

#[test]
fn a_smaller_window_holds_later_frames_and_a_larger_one_lets_them_go() {
    let mut q = SendQueue::new(100);
    for i in 0..4 {
        q.push(i, 0, 30);
    }
    assert_eq!(pop_all(&mut q).len(), 3);
    q.set_window(40);
    q.delivered(30);
    assert!(q.pop().is_none(), "60 in flight, window 40");
    q.set_window(90);
    assert_eq!(q.pop().map(|e| e.0), Some(3));
    assert_eq!(q.window(), 90);
}

#[test]
fn min_frames_keeps_that_many_frames_in_flight_under_a_small_window() {
    let mut q = SendQueue::new(1);
    q.set_min_frames(4);
    for i in 0..6 {
        q.push(i, 0, 100);
    }
    assert_eq!(pop_all(&mut q).len(), 4);
    q.set_min_frames(0); // means 2
    q.delivered(100);
    assert!(q.pop().is_none(), "3 frames in flight, room for 2");
    q.delivered(100);
    q.delivered(100);
    assert_eq!(pop_all(&mut q).len(), 1);
}

#[test]
fn a_small_frame_does_not_wait_behind_a_large_one_that_fills_the_window() {
    // 10 Mbit/s (BENCHMARKS.md at 60710fe, "Small frames behind a large one"): one 118 KB
    // chunk in flight against a window of 108 KB, and next a bias's 104-byte chunk, then more
    // large ones. The small frame goes at once, and the next large one as soon as it is
    // delivered.
    let mut q = SendQueue::new(108_000);
    q.push("large0", 0, 118_000);
    q.push("bias", 0, 104);
    q.push("large1", 0, 118_000);
    assert_eq!(q.pop().map(|e| e.0), Some("large0"));
    assert_eq!(q.pop().map(|e| e.0), Some("bias"));
    assert!(q.pop().is_none(), "two frames in flight, over the window");
    q.delivered(104);
    assert_eq!(q.pop().map(|e| e.0), Some("large1"));
}

#[test]
fn a_hold_keeps_lower_priority_frames_back_until_released() {
    // Two tensors queued at once: the low one was encoded first, the high one is still being
    // encoded under its hold. Nothing of the low one leaves before the high one's frames.
    let mut q = SendQueue::new(u64::MAX);
    q.hold(5);
    q.hold(1);
    q.push("low0", 0, 10);
    q.push("low1", 0, 10);
    assert!(q.pop().is_none(), "held by priorities 5 and 1");
    q.push("one", 1, 10);
    assert!(q.pop().is_none(), "priority 1 is below the hold of 5");
    q.push("high", 5, 10);
    assert_eq!(
        q.pop().map(|e| e.0),
        Some("high"),
        "a frame at the hold's priority leaves"
    );
    q.release(5);
    assert_eq!(q.pop().map(|e| e.0), Some("one"));
    assert!(q.pop().is_none(), "still held by priority 1");
    q.hold(1);
    q.release(1);
    assert!(q.pop().is_none(), "holds count: one of priority 1 is left");
    q.release(1);
    q.release(1); // one release too many does nothing
    let rest: Vec<&str> = pop_all(&mut q).into_iter().map(|e| e.0).collect();
    assert_eq!(rest, ["low0", "low1"]);
}

#[test]
fn drain_returns_waiting_frames_in_order() {
    let mut q = SendQueue::new(1);
    q.push(1, 1, 5);
    q.push(2, 2, 5);
    q.push(3, 1, 5);
    assert_eq!(q.pop().map(|e| e.0), Some(2));
    assert_eq!(q.drain(), [1, 3]);
    assert_eq!(q.queued_bytes(), 0);
    assert_eq!(q.in_flight(), 5);
}

proptest! {
    /// Whatever order frames become ready in, and however deliveries interleave with new
    /// frames, every frame is sent exactly once; a frame is sent only within the window (in
    /// full, or, counting whole frames, while the bytes in flight are below it), within twice
    /// its own size, or with fewer than two frames in flight; and whenever a frame is sent, no
    /// frame of higher
    /// priority, and no older frame of the same priority, is still waiting. The reference is
    /// an independent one: the waiting set kept as a plain list.
    #[test]
    fn sends_in_priority_order_whatever_the_arrival_order(
        frames in prop::collection::vec((-3i32..3, 1u64..300), 1..120),
        window in 1u64..1000,
        whole in any::<bool>(),
        steps in prop::collection::vec(0u8..3, 1..400),
    ) {
        let mut q = SendQueue::new(window);
        q.set_whole_frames(whole);
        let mut waiting: Vec<(usize, i32)> = Vec::new(); // (arrival index, priority)
        let mut flying: Vec<u64> = Vec::new();
        let mut sent = vec![false; frames.len()];
        let mut next = 0usize;
        let mut step = steps.iter().cycle();
        while sent.iter().any(|s| !s) {
            match step.next().copied().unwrap_or(0) {
                0 if next < frames.len() => {
                    let (p, b) = frames[next];
                    q.push(next, p, b);
                    waiting.push((next, p));
                    next += 1;
                }
                1 if !flying.is_empty() => {
                    let b = flying.remove(0);
                    q.delivered(b);
                }
                _ => {
                    if let Some((i, p, b)) = q.pop() {
                        prop_assert_eq!((p, b), frames[i]);
                        prop_assert!(!sent[i], "frame {} sent twice", i);
                        let best = waiting.iter().copied().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)));
                        prop_assert_eq!(best, Some((i, p)), "sent {} while a better frame waited", i);
                        waiting.retain(|w| w.0 != i);
                        let before: u64 = flying.iter().sum();
                        let in_window = if whole { before < window } else { before + b <= window };
                        prop_assert!(in_window || before + b <= 2 * b || flying.len() < 2, "{} + {} in window {} (whole frames: {})", before, b, window, whole);
                        flying.push(b);
                        sent[i] = true;
                    } else if next == frames.len() && flying.is_empty() {
                        prop_assert!(waiting.is_empty(), "nothing in flight, yet {:?} wait", waiting);
                    } else if !flying.is_empty() {
                        q.delivered(flying.remove(0));
                    } else {
                        let (p, b) = frames[next];
                        q.push(next, p, b);
                        waiting.push((next, p));
                        next += 1;
                    }
                }
            }
            prop_assert_eq!(q.in_flight(), flying.iter().sum::<u64>());
        }
    }
}
