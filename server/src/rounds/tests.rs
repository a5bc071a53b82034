//! Tests of [`super::KeyRounds`]: each rule against an independent rank-order sum, random
//! arrival orders (with a printed seed), aborts and their messages.

use super::*;
use pushpull_codecs::{Codec, CodecInfo, KernelError};
use pushpull_proto::placement::mix64;

/// SplitMix64: a tiny deterministic generator, so tests need no extra crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }
    /// Values spread over many magnitudes, so the summation order shows in the bits.
    fn f32(&mut self) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
        let e = (self.next() % 16) as i32 - 8;
        (u * 2.0 - 1.0) * 2f32.powi(e)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `PUSHPULL_TEST_SEED` if set, else the clock; printed so a failure can be replayed.
fn seed() -> u64 {
    let s = std::env::var("PUSHPULL_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    println!("seed {s} (set PUSHPULL_TEST_SEED to repeat)");
    s
}

fn key(w: u32, len: usize) -> KeyRounds {
    key_named("fc1.weight", 3, 77, w, len)
}

fn key_named(name: &str, chunk: u32, k: u64, w: u32, len: usize) -> KeyRounds {
    KeyRounds::new(
        KeyInfo {
            tensor: name.into(),
            chunk,
            key: k,
            len,
            num_workers: w,
            local_size: 1,
            priority: 0,
        },
        fp32_codec(len),
    )
}

fn enc(x: &[f32]) -> Bytes {
    let mut out = Vec::new();
    fp32_codec(x.len())
        .compress(x, &RoundCtx::new(0), &mut out)
        .unwrap();
    Bytes::from(out)
}

fn dec(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Rank-order sum computed independently of the codec and the state machine.
fn reference_sum(data: &[Vec<f32>]) -> Vec<f32> {
    let mut acc = data[0].clone();
    for d in &data[1..] {
        for (a, v) in acc.iter_mut().zip(d) {
            *a += *v;
        }
    }
    acc
}

fn random_data(rng: &mut Rng, w: usize, len: usize) -> Vec<Vec<f32>> {
    (0..w)
        .map(|_| (0..len).map(|_| rng.f32()).collect())
        .collect()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Pushes `data` for `round` in `order`; returns the result payload, checking nothing is
/// emitted before the last push.
fn run_round(k: &mut KeyRounds, round: u64, data: &[Vec<f32>], order: &[usize]) -> Bytes {
    for (i, &r) in order.iter().enumerate() {
        let acts = k.push(r as u32, round, ReduceOp::Sum, 0, enc(&data[r]));
        if i + 1 < order.len() {
            assert!(acts.is_empty(), "emitted early: {acts:?}");
        } else {
            match acts.as_slice() {
                [Action::SendResult {
                    round: got,
                    ranks,
                    payload,
                }] => {
                    assert_eq!(*got, round);
                    // Without local groups every rank gets the result.
                    let all: Vec<u32> = (0..order.len() as u32).collect();
                    assert_eq!(ranks, &all);
                    return payload.clone();
                }
                other => panic!("expected one result, got {other:?}"),
            }
        }
    }
    unreachable!()
}

fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for p in permutations(n - 1) {
        for i in 0..=p.len() {
            let mut q = p.clone();
            q.insert(i, n - 1);
            out.push(q);
        }
    }
    out
}

#[test]
fn every_arrival_order_of_three_gives_the_rank_order_sum() {
    let mut rng = Rng(seed());
    let len = 1000;
    let data = random_data(&mut rng, 3, len);
    let expected = bits(&reference_sum(&data));
    // Sanity: another summation order differs somewhere, so the test can tell.
    let mut other = data[2].clone();
    for d in [&data[1], &data[0]] {
        for (a, v) in other.iter_mut().zip(d) {
            *a += *v;
        }
    }
    assert_ne!(
        bits(&other),
        expected,
        "data too tame to show summation order"
    );
    let mut k = key(3, len);
    let perms = permutations(3);
    assert_eq!(perms.len(), 6);
    for (round, order) in perms.iter().enumerate() {
        let got = run_round(&mut k, round as u64, &data, order);
        assert_eq!(bits(&dec(&got)), expected, "order {order:?}");
        assert!(!k.is_open());
    }
    assert_eq!(k.current_round(), 6);
}

#[test]
fn random_arrival_orders_of_eight_give_the_rank_order_sum() {
    let mut rng = Rng(seed());
    let len = 513;
    let mut k = key(8, len);
    for round in 0..40u64 {
        let data = random_data(&mut rng, 8, len);
        let expected = bits(&reference_sum(&data));
        let mut order: Vec<usize> = (0..8).collect();
        for i in (1..8).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let got = run_round(&mut k, round, &data, &order);
        assert_eq!(bits(&dec(&got)), expected, "round {round} order {order:?}");
    }
}

#[test]
fn one_worker_completes_at_once() {
    let mut k = key(1, 4);
    let got = run_round(&mut k, 0, &[vec![1.0, 2.0, 3.0, 4.0]], &[0]);
    assert_eq!(dec(&got), vec![1.0, 2.0, 3.0, 4.0]);
}

fn expect_abort(acts: &[Action], round: u64, ranks: &[u32]) -> String {
    match acts {
        [Action::SendAbort {
            round: r,
            ranks: rs,
            message,
        }] => {
            assert_eq!(*r, round, "{message}");
            assert_eq!(rs, ranks, "{message}");
            message.clone()
        }
        other => panic!("expected one abort, got {other:?}"),
    }
}

#[test]
fn duplicate_push_aborts_for_everyone_and_late_pushes_get_the_same_abort() {
    let mut k = key(3, 2);
    assert!(k.push(1, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0])).is_empty());
    let acts = k.push(1, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0]));
    let msg = expect_abort(&acts, 0, &[0, 1, 2]);
    for part in [
        "\"fc1.weight\"",
        "chunk 3",
        "key 0x000000000000004d",
        "round 0",
        "rank 1",
        "twice",
    ] {
        assert!(msg.contains(part), "{part} missing: {msg}");
    }
    // Late pushes for round 0 get the same message, only to their sender.
    let late = k.push(2, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0]));
    assert_eq!(expect_abort(&late, 0, &[2]), msg);
    let late = k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0]));
    assert_eq!(expect_abort(&late, 0, &[0]), msg);
    // Round 1 works.
    let data = vec![vec![1.0, 2.0], vec![3.0, 4.0], vec![5.0, 6.0]];
    let got = run_round(&mut k, 1, &data, &[2, 0, 1]);
    assert_eq!(dec(&got), vec![9.0, 12.0]);
}

#[test]
fn a_missing_worker_keeps_the_round_open_until_its_loss_is_reported() {
    let mut k = key(3, 2);
    assert!(k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0])).is_empty());
    assert!(k.push(2, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0])).is_empty());
    assert!(k.is_open());
    assert_eq!(k.open_ranks(), vec![0, 2]);
    let acts = k.node_lost("worker 1 (127.0.0.1:4000)", "no heartbeat for 10.0 s");
    let msg = expect_abort(&acts, 0, &[0, 1, 2]);
    for part in [
        "worker 1 (127.0.0.1:4000)",
        "no heartbeat",
        "key 0x000000000000004d",
        "round 0",
        "chunk 3",
    ] {
        assert!(msg.contains(part), "{part} missing: {msg}");
    }
    assert!(!k.is_open() && k.is_failed());
    // Every later push is answered at once, naming the node.
    let acts = k.push(0, 1, ReduceOp::Sum, 0, enc(&[1.0, 1.0]));
    let msg = expect_abort(&acts, 1, &[0]);
    assert!(
        msg.contains("worker 1 (127.0.0.1:4000)") && msg.contains("round 1"),
        "{msg}"
    );
    // A second report changes nothing.
    assert!(k.node_lost("worker 1 (127.0.0.1:4000)", "again").is_empty());
}

#[test]
fn a_worker_that_left_fails_the_rounds_that_need_it() {
    // Worker 1 left before pushing round 0: round 0 is aborted for everyone, naming it.
    let mut k = key(3, 2);
    assert!(k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0])).is_empty());
    let msg = expect_abort(
        &k.worker_left(1, "worker 1 (127.0.0.1:4000)"),
        0,
        &[0, 1, 2],
    );
    assert!(
        msg.contains("worker 1 (127.0.0.1:4000) finished") && msg.contains("round 0"),
        "{msg}"
    );
    // A late push for round 0, and round 1, are refused at once, naming it.
    let msg = expect_abort(&k.push(2, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0])), 0, &[2]);
    assert!(
        msg.contains("worker 1") && msg.contains("finished"),
        "{msg}"
    );
    let msg = expect_abort(&k.push(0, 1, ReduceOp::Sum, 0, enc(&[1.0, 1.0])), 1, &[0]);
    assert!(
        msg.contains("worker 1") && msg.contains("finished"),
        "{msg}"
    );
    // A second departure or a loss report changes nothing.
    assert!(k.worker_left(2, "worker 2").is_empty());

    // Worker 1 left after pushing round 0: round 0 still completes, round 1 is refused.
    let mut k = key(2, 1);
    assert!(k.push(1, 0, ReduceOp::Sum, 0, enc(&[2.0])).is_empty());
    assert!(k.worker_left(1, "worker 1").is_empty());
    match k.push(0, 0, ReduceOp::Sum, 0, enc(&[3.0])).as_slice() {
        [Action::SendResult {
            round: 0, payload, ..
        }] => assert_eq!(dec(payload), vec![5.0]),
        other => panic!("expected round 0's result, got {other:?}"),
    }
    let msg = expect_abort(&k.push(0, 1, ReduceOp::Sum, 0, enc(&[3.0])), 1, &[0]);
    assert!(msg.contains("worker 1 finished"), "{msg}");

    // Without an open round, nothing is sent until someone pushes.
    let mut k = key(2, 1);
    assert!(k.worker_left(0, "worker 0").is_empty());
    expect_abort(&k.push(1, 0, ReduceOp::Sum, 0, enc(&[3.0])), 0, &[1]);
}

#[test]
fn node_lost_without_an_open_round_emits_nothing() {
    let mut k = key(2, 1);
    assert!(k
        .node_lost("server 1 (127.0.0.1:5)", "connection closed")
        .is_empty());
    let msg = expect_abort(&k.push(1, 0, ReduceOp::Sum, 0, enc(&[1.0])), 0, &[1]);
    assert!(msg.contains("server 1"), "{msg}");
}

#[test]
fn wrong_length_aborts_for_everyone_and_the_next_round_works() {
    for bad_rank in 0..3u32 {
        let mut k = key(3, 4);
        let good = enc(&[1.0; 4]);
        let bad = enc(&[1.0; 3]);
        let mut last = Vec::new();
        // The other ranks push first (held, or summed), then the bad one.
        for r in 0..3u32 {
            if r != bad_rank {
                assert!(k.push(r, 0, ReduceOp::Sum, 0, good.clone()).is_empty());
            }
        }
        last.extend(k.push(bad_rank, 0, ReduceOp::Sum, 0, bad));
        let msg = expect_abort(&last, 0, &[0, 1, 2]);
        for part in [
            format!("rank {bad_rank}"),
            "12 bytes".to_string(),
            "key 0x000000000000004d".into(),
            "round 0".into(),
            "chunk 3".into(),
            "fc1.weight".into(),
        ] {
            assert!(msg.contains(&part), "{part} missing: {msg}");
        }
        let data = vec![vec![1.0; 4], vec![2.0; 4], vec![3.0; 4]];
        let got = run_round(&mut k, 1, &data, &[1, 2, 0]);
        assert_eq!(dec(&got), vec![6.0; 4]);
    }
}

#[test]
fn a_held_payload_that_fails_to_decode_is_named_when_its_turn_comes() {
    let mut k = key(3, 4);
    // Rank 2's payload is short but arrives first: held until ranks 0 and 1 are in.
    assert!(k.push(2, 0, ReduceOp::Sum, 0, enc(&[1.0; 3])).is_empty());
    assert!(k.push(1, 0, ReduceOp::Sum, 0, enc(&[1.0; 4])).is_empty());
    let acts = k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0; 4]));
    let msg = expect_abort(&acts, 0, &[0, 1, 2]);
    assert!(
        msg.contains("rank 2") && msg.contains("undecodable"),
        "{msg}"
    );
    assert_eq!(k.current_round(), 1);
}

#[test]
fn too_long_payload_is_rejected_on_arrival() {
    let mut k = key(2, 4);
    let acts = k.push(1, 0, ReduceOp::Sum, 0, enc(&[1.0; 5]));
    let msg = expect_abort(&acts, 0, &[0, 1]);
    assert!(msg.contains("20 bytes") && msg.contains("rank 1"), "{msg}");
}

#[test]
fn out_of_range_rank_and_op_mismatch_abort() {
    let mut k = key(2, 1);
    let msg = expect_abort(&k.push(5, 0, ReduceOp::Sum, 0, enc(&[1.0])), 0, &[0, 1]);
    assert!(msg.contains("rank 5 is out of range"), "{msg}");
    assert!(k.push(0, 1, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
    let acts = k.push(1, 1, ReduceOp::Broadcast, 0, Bytes::new());
    let msg = expect_abort(&acts, 1, &[0, 1]);
    assert!(
        msg.contains("rank 1") && msg.contains("Broadcast") && msg.contains("op Sum"),
        "{msg}"
    );
    let got = run_round(&mut k, 2, &[vec![1.0], vec![2.0]], &[1, 0]);
    assert_eq!(dec(&got), vec![3.0]);
}

#[test]
fn broadcast_returns_the_roots_payload() {
    let mut k = key(3, 3);
    let root = enc(&[1.5, -2.0, 7.0]);
    assert!(k
        .push(0, 0, ReduceOp::Broadcast, 1, Bytes::new())
        .is_empty());
    assert!(k
        .push(1, 0, ReduceOp::Broadcast, 1, root.clone())
        .is_empty());
    match k
        .push(2, 0, ReduceOp::Broadcast, 1, Bytes::new())
        .as_slice()
    {
        [Action::SendResult {
            round: 0, payload, ..
        }] => assert_eq!(payload, &root),
        other => panic!("{other:?}"),
    }
    // A root mismatch, a non-empty non-root payload and a bad root payload all abort.
    assert!(k
        .push(0, 1, ReduceOp::Broadcast, 1, Bytes::new())
        .is_empty());
    let msg = expect_abort(
        &k.push(2, 1, ReduceOp::Broadcast, 0, Bytes::new()),
        1,
        &[0, 1, 2],
    );
    assert!(msg.contains("root 0") && msg.contains("root 1"), "{msg}");
    let msg = expect_abort(
        &k.push(2, 2, ReduceOp::Broadcast, 0, root.clone()),
        2,
        &[0, 1, 2],
    );
    assert!(msg.contains("non-root") && msg.contains("rank 2"), "{msg}");
    let msg = expect_abort(
        &k.push(0, 3, ReduceOp::Broadcast, 0, enc(&[1.0])),
        3,
        &[0, 1, 2],
    );
    assert!(msg.contains("undecodable broadcast payload"), "{msg}");
    let msg = expect_abort(
        &k.push(0, 4, ReduceOp::Broadcast, 3, Bytes::new()),
        4,
        &[0, 1, 2],
    );
    assert!(msg.contains("root 3 is out of range"), "{msg}");
    // Then sums work again.
    let got = run_round(
        &mut k,
        5,
        &[vec![1.0; 3], vec![1.0; 3], vec![1.0; 3]],
        &[0, 1, 2],
    );
    assert_eq!(dec(&got), vec![3.0; 3]);
}

#[test]
fn many_keys_are_independent() {
    let mut rng = Rng(seed());
    let mut keys: Vec<KeyRounds> = (0..20)
        .map(|i| key_named(&format!("t{i}"), i, 1000 + i as u64, 4, 8 + i as usize))
        .collect();
    let data: Vec<Vec<Vec<f32>>> = keys
        .iter()
        .map(|k| random_data(&mut rng, 4, k.info().len))
        .collect();
    // Abort key 7's round 0 with a duplicate; every other key completes round 0, pushes
    // interleaved across keys in random rank orders.
    let mut schedule: Vec<(usize, u32)> = (0..20)
        .flat_map(|k| (0..4u32).map(move |r| (k, r)))
        .collect();
    for i in (1..schedule.len()).rev() {
        schedule.swap(i, rng.below(i + 1));
    }
    let mut results = vec![None; 20];
    let mut aborted = false;
    for (ki, r) in schedule {
        let mut acts = keys[ki].push(r, 0, ReduceOp::Sum, 0, enc(&data[ki][r as usize]));
        if ki == 7 && !aborted {
            acts = keys[ki].push(r, 0, ReduceOp::Sum, 0, enc(&data[ki][r as usize]));
            aborted = true;
            expect_abort(&acts, 0, &[0, 1, 2, 3]);
            continue;
        }
        for a in acts {
            match a {
                Action::SendResult {
                    round: 0, payload, ..
                } => results[ki] = Some(payload),
                Action::SendAbort { ranks, .. } => {
                    assert!(ki == 7 && ranks.len() == 1, "key {ki}: {ranks:?}")
                }
                other => panic!("key {ki}: {other:?}"),
            }
        }
    }
    for (ki, res) in results.iter().enumerate() {
        if ki == 7 {
            assert!(res.is_none());
        } else {
            let got = res
                .as_ref()
                .unwrap_or_else(|| panic!("key {ki} incomplete"));
            assert_eq!(bits(&dec(got)), bits(&reference_sum(&data[ki])));
        }
        assert_eq!(keys[ki].current_round(), 1);
    }
}

#[test]
fn a_push_ahead_skips_the_round_it_abandons() {
    let mut k = key(3, 1);
    // Ranks 0 and 1 push round 0; rank 2 gave up on round 0 and pushes round 1.
    assert!(k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
    assert!(k.push(1, 0, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
    let acts = k.push(2, 1, ReduceOp::Sum, 0, enc(&[3.0]));
    let msg = expect_abort(&acts, 0, &[0, 1, 2]);
    assert!(
        msg.contains("rank 2 pushed round 1") && msg.contains("round 0"),
        "{msg}"
    );
    assert_eq!(k.current_round(), 1);
    assert_eq!(k.open_ranks(), vec![2]);
    // Round 1 completes with the held push.
    assert!(k.push(1, 1, ReduceOp::Sum, 0, enc(&[2.0])).is_empty());
    match k.push(0, 1, ReduceOp::Sum, 0, enc(&[1.0])).as_slice() {
        [Action::SendResult {
            round: 1, payload, ..
        }] => assert_eq!(dec(payload), vec![6.0]),
        other => panic!("{other:?}"),
    }
    // Skipping several rounds remembers all of them.
    assert!(k.push(0, 5, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
    for round in 2..5 {
        let late = k.push(1, round, ReduceOp::Sum, 0, enc(&[1.0]));
        let msg = expect_abort(&late, round, &[1]);
        assert!(msg.contains("rounds 2..=4 are skipped"), "{msg}");
    }
}

#[test]
fn a_push_far_ahead_is_rejected() {
    let mut k = key(2, 1);
    let acts = k.push(1, u64::MAX, ReduceOp::Sum, 0, enc(&[1.0]));
    assert_eq!(acts.len(), 2, "{acts:?}");
    match &acts[0] {
        Action::SendAbort {
            round,
            ranks,
            message,
        } => {
            assert_eq!((*round, ranks.as_slice()), (u64::MAX, &[1][..]));
            assert!(message.contains("rounds ahead"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    expect_abort(&acts[1..], 0, &[0, 1]);
    let got = run_round(&mut k, 1, &[vec![1.0], vec![2.0]], &[0, 1]);
    assert_eq!(dec(&got), vec![3.0]);
}

#[test]
fn a_stale_round_is_rejected_and_its_sender_told() {
    let mut k = key(2, 1);
    run_round(&mut k, 0, &[vec![1.0], vec![1.0]], &[0, 1]);
    assert!(k.push(1, 1, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
    let acts = k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0]));
    assert_eq!(acts.len(), 2, "{acts:?}");
    match &acts[0] {
        Action::SendAbort {
            round: 0,
            ranks,
            message,
        } => {
            assert_eq!(ranks, &[0]);
            assert!(message.contains("round 0 is over"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    expect_abort(&acts[1..], 1, &[0, 1]);
    assert_eq!(k.current_round(), 2);
}

#[test]
fn shell_rejections_abort_like_bad_pushes() {
    let mut k = key(2, 1);
    assert!(k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
    let msg = expect_abort(
        &k.reject(1, 0, "truncated frame payload: 2 of 4 bytes"),
        0,
        &[0, 1],
    );
    assert!(msg.contains("rank 1") && msg.contains("truncated"), "{msg}");
    // Rejecting a push for an aborted round just repeats the abort.
    assert_eq!(expect_abort(&k.reject(0, 0, "whatever"), 0, &[0]), msg);
}

/// A codec whose compress fails: the round is aborted, not lost.
struct FailingEncode(Compressor);
impl Codec for FailingEncode {
    fn info(&self) -> &CodecInfo {
        self.0.codec().info()
    }
    fn encode(&mut self, _: &[f32], _: &RoundCtx, _: &mut Vec<u8>) -> Result<(), KernelError> {
        Err(KernelError::Context {
            compressor: "failing".into(),
            detail: "out of ideas".into(),
        })
    }
    fn decode(
        &self,
        payload: &[u8],
        ctx: &RoundCtx,
        out: &mut [f32],
        add: bool,
    ) -> Result<(), KernelError> {
        self.0.codec().decode(payload, ctx, out, add)
    }
}

#[test]
fn an_encode_failure_aborts_the_round() {
    let info = KeyInfo {
        tensor: "t".into(),
        chunk: 0,
        key: 9,
        len: 1,
        num_workers: 1,
        local_size: 1,
        priority: 0,
    };
    let mut k = KeyRounds::new(
        info,
        Compressor::new(Box::new(FailingEncode(fp32_codec(1)))),
    );
    let msg = expect_abort(&k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0])), 0, &[0]);
    assert!(
        msg.contains("out of ideas") && msg.contains("key 0x0000000000000009"),
        "{msg}"
    );
    assert_eq!(k.current_round(), 1);
}

/// Non-finite rounds (mixed precision): a non-finite push, or finite pushes whose sum
/// overflows, complete with `SendNonFinite` whatever the arrival order, leaving the key's
/// error-feedback state as it was; a round flagged undo-previous undoes the previous sum
/// round's state change first. Checked against a plain chain driven by hand.
#[test]
fn non_finite_rounds_and_undo_leave_the_codec_as_a_plain_chain_says() {
    use pushpull_codecs::chunk::{chunk_codec, ChunkInfo, Node};
    let s = seed();
    let mut rng = Rng(s);
    let (w, len) = (3usize, 37usize);
    let params: std::collections::BTreeMap<String, String> =
        [("compressor", "topk"), ("k", "0.5"), ("ef", "vanilla")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    let chain = |node| {
        chunk_codec(&ChunkInfo {
            params: &params,
            tensor_len: len as u64,
            chunk_len: len as u64,
            full_chunk_len: len as u64,
            key: 77,
            job_seed: 5,
            node,
            min_compress_bytes: 0,
        })
        .unwrap()
    };
    let info = KeyInfo {
        tensor: "t".into(),
        chunk: 0,
        key: 77,
        len,
        num_workers: w as u32,
        local_size: 1,
        priority: 0,
    };
    let mut k = KeyRounds::new(info, chain(Node::Server { id: 0 }));
    let mut plain = chain(Node::Server { id: 0 });
    let mut workers: Vec<_> = (0..w as u32)
        .map(|rank| chain(Node::Worker { rank }))
        .collect();
    let flags = |non_finite, undo_previous| FrameFlags {
        non_finite,
        undo_previous,
    };
    // One round: rank `bad` (if any) pushes non-finite; every push carries `undo`. Returns
    // the actions of the last push.
    let mut round_of = |k: &mut KeyRounds,
                        workers: &mut [Compressor],
                        round: u64,
                        scale: f32,
                        bad: Option<usize>,
                        undo| {
        let ctx = RoundCtx::new(round);
        let mut order: Vec<usize> = (0..w).collect();
        for i in (1..w).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let mut pushes = vec![Bytes::new(); w];
        for r in 0..w {
            // Huge scales push the same value everywhere: finite, but where two ranks pick
            // the same index (18 of 37 each: some do) their sum is not.
            let x: Vec<f32> = (0..len)
                .map(|_| {
                    if scale > 1e30 {
                        scale
                    } else {
                        rng.f32() * scale
                    }
                })
                .collect();
            let mut out = Vec::new();
            workers[r].compress(&x, &ctx, &mut out).unwrap();
            pushes[r] = Bytes::from(out);
        }
        let mut acts = Vec::new();
        for (i, &r) in order.iter().enumerate() {
            let nf = bad == Some(r);
            let payload = if nf { Bytes::new() } else { pushes[r].clone() };
            acts = k.push_flagged(r as u32, round, ReduceOp::Sum, 0, flags(nf, undo), payload);
            assert!(i + 1 == w || acts.is_empty(), "seed {s}: early {acts:?}");
        }
        (pushes, acts)
    };
    // The plain chain's result for pushes: the rank-order sum, compressed.
    let sum_of = |pushes: &[Bytes], round: u64, plain: &mut Compressor| {
        let ctx = RoundCtx::new(round);
        let mut acc = vec![0.0f32; len];
        plain.decompress(&pushes[0], &ctx, &mut acc).unwrap();
        for p in &pushes[1..] {
            plain.decompress_add(p, &ctx, &mut acc).unwrap();
        }
        let mut out = Vec::new();
        plain.compress(&acc, &ctx, &mut out).map(|()| out)
    };
    let result = |acts: &[Action]| match acts {
        [Action::SendResult { payload, .. }] => payload.to_vec(),
        other => panic!("seed {s}: expected a result, got {other:?}"),
    };
    let non_finite = |acts: &[Action], round: u64| {
        let ranks = (0..w as u32).collect();
        assert_eq!(acts, [Action::SendNonFinite { round, ranks }], "seed {s}");
    };
    // Round 0 finite; round 1 has a non-finite push; round 2 matches a chain that never saw
    // round 1.
    let (p, a) = round_of(&mut k, &mut workers, 0, 1.0, None, false);
    assert_eq!(result(&a), sum_of(&p, 0, &mut plain).unwrap());
    let bad = (s % w as u64) as usize;
    let (_, a) = round_of(&mut k, &mut workers, 1, 1.0, Some(bad), false);
    non_finite(&a, 1);
    // As a worker does on a non-finite result.
    workers.iter_mut().for_each(|c| c.undo(1));
    let (p, a) = round_of(&mut k, &mut workers, 2, 1.0, None, false);
    assert_eq!(result(&a), sum_of(&p, 2, &mut plain).unwrap());
    // Round 3: finite pushes whose sum overflows f32 (the plain chain refuses it too).
    let (p, a) = round_of(&mut k, &mut workers, 3, 2e38, None, false);
    non_finite(&a, 3);
    workers.iter_mut().for_each(|c| c.undo(3));
    assert!(sum_of(&p, 3, &mut plain).unwrap_err().is_non_finite());
    // Round 4 finite, then round 5 undoes it: the chain undoes round 4 too.
    let (p, a) = round_of(&mut k, &mut workers, 4, 1.0, None, false);
    assert_eq!(result(&a), sum_of(&p, 4, &mut plain).unwrap());
    plain.undo(4);
    workers.iter_mut().for_each(|c| c.undo(4));
    let (p, a) = round_of(&mut k, &mut workers, 5, 1.0, None, true);
    assert_eq!(result(&a), sum_of(&p, 5, &mut plain).unwrap());
    // Pushes that disagree on undoing abort the round, naming the rank.
    let mut payload = {
        let mut r = 0;
        move || {
            let mut out = Vec::new();
            workers[r]
                .compress(&vec![1.0; len], &RoundCtx::new(6), &mut out)
                .unwrap();
            r += 2;
            Bytes::from(out)
        }
    };
    assert!(k
        .push_flagged(0, 6, ReduceOp::Sum, 0, flags(false, true), payload())
        .is_empty());
    let msg = expect_abort(
        &k.push_flagged(2, 6, ReduceOp::Sum, 0, flags(false, false), payload()),
        6,
        &[0, 1, 2],
    );
    assert!(
        msg.contains("rank 2") && msg.contains("keeps the previous round but rank 0 undoes"),
        "{msg}"
    );
}

// Local groups: one push per host (tests/hosts.rs).
mod hosts;

mod gossip;
