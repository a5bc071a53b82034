//! Rounds through the whole stack (the test kit in `common`: the real scheduler and servers,
//! workers of this crate): results bit for bit against the rank-order f32 sum computed here,
//! many keys in opposite orders, calls that are refused, dropped or blocking.

use std::time::Duration;

use pushpull_worker::{JoinOptions, ParamMap, Reduce, WorkerError};

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sums_are_bit_identical_to_the_rank_order_sum() {
    tokio::time::timeout(TIMEOUT, async {
        let seed = seed();
        // 64-byte partitions: 16 elements per chunk, so the 10_007-element tensor has 626
        // chunks spread over 2 servers.
        let mut s = nodes_with(2, 2, 64, |_| {}).await;
        // The first worker to join asks for rank 1, the second for rank 0.
        let mut ws: Vec<_> = s
            .join(&[Some(1), Some(0)])
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!((ws[0].rank(), ws[1].rank()), (1, 0));
        ws.reverse();
        s.workers = ws;
        let w = &s.workers;
        assert_eq!(w[0].num_workers(), 2);
        assert_eq!(w[0].num_servers(), 2);
        assert_eq!(w[0].job_seed(), w[1].job_seed());
        let sizes = [1usize, 1000, 10_007];
        let mut tensors = Vec::new();
        for (i, len) in sizes.iter().enumerate() {
            tensors.push(declare_all(&s, &format!("t{i}"), *len as u64).await);
        }
        let big = &tensors[2];
        assert_eq!(big[0].num_chunks(), 626);
        assert_eq!(big[0].placement(), big[1].placement());
        for round in 0..3u64 {
            let op = if round == 2 { Reduce::Average } else { Reduce::Sum };
            let inputs: Vec<Vec<Vec<f32>>> = sizes
                .iter()
                .enumerate()
                .map(|(i, &len)| {
                    (0..2u64)
                        .map(|r| data(seed ^ (r << 48) ^ ((i as u64) << 32) ^ round, len))
                        .collect()
                })
                .collect();
            // All tensors of both workers at once (different tensors run concurrently).
            let calls = (0..2usize).flat_map(|r| {
                let inputs = &inputs;
                let tensors = &tensors;
                (0..sizes.len()).map(move |i| {
                    let (w, t) = (w[r].clone(), tensors[i][r].clone());
                    let buf = inputs[i][r].clone();
                    async move { (r, i, w.push_pull(&t, buf, op).await.unwrap()) }
                })
            });
            for (r, i, got) in futures_util::future::join_all(calls).await {
                let mut expected = rank_order_sum(&inputs[i]);
                if op == Reduce::Average {
                    expected.iter_mut().for_each(|x| *x /= 2.0);
                }
                assert!(
                    same_bits(&got, &expected),
                    "round {round}, tensor t{i}, worker {r}: differs from the rank-order sum (seed {seed})"
                );
            }
        }
        assert_eq!(big[0].rounds_started(), 3);
        // Broadcast from rank 1.
        let root_data = data(seed ^ 0xb0, sizes[2]);
        let (a, b) = tokio::join!(
            w[0].broadcast(&big[0], vec![0.0; sizes[2]], 1),
            w[1].broadcast(&big[1], root_data.clone(), 1)
        );
        assert!(same_bits(&a.unwrap(), &root_data));
        assert!(same_bits(&b.unwrap(), &root_data));

        let m = w[0].metrics();
        println!("worker 0: {m}");
        assert_eq!(m.rounds, 3 * 3 + 1);
        assert_eq!(m.tensors["t2"].rounds, 4);
        let elems: u64 = sizes.iter().map(|&l| l as u64).sum();
        assert_eq!(m.bytes_pushed, 3 * 4 * elems); // non-root broadcast pushes are empty
        assert_eq!(m.bytes_pulled, 3 * 4 * elems + 4 * sizes[2] as u64);

        let (x, y) = tokio::join!(w[0].barrier(), w[1].barrier());
        x.unwrap();
        y.unwrap();
        s.finish_all().await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_issued_in_opposite_orders() {
    tokio::time::timeout(TIMEOUT, async {
        let seed = seed();
        // 16-byte partitions: the 1000-element tensor has 250 keys on one server; 120
        // one-key tensors are issued in opposite orders by the two workers. A send window of
        // 4 frames (56 bytes each) keeps most of them queued.
        let s = stack_with(2, 1, 16, |c| c.cluster.send_window_bytes = 4 * 56).await;
        let n = 120;
        let mut small = Vec::new();
        for i in 0..n {
            small.push(declare_all(&s, &format!("s{i:03}"), 2).await);
        }
        let long = declare_all(&s, "long", 1000).await;
        assert_eq!(long[0].num_chunks(), 250);
        let input =
            |r: usize, i: usize, len: usize| data(seed ^ ((r as u64) << 40) ^ i as u64, len);
        let run = |r: usize| {
            let w = s.workers[r].clone();
            let mut order: Vec<usize> = (0..n).collect();
            if r == 1 {
                order.reverse();
            }
            let calls: Vec<_> = order
                .into_iter()
                .map(|i| {
                    let (w, t) = (w.clone(), small[i][r].clone());
                    let buf = input(r, i, 2);
                    async move { (i, w.push_pull(&t, buf, Reduce::Sum).await.unwrap()) }
                })
                .collect();
            let (w, t) = (w.clone(), long[r].clone());
            let long_buf = input(r, 9999, 1000);
            async move {
                let (results, long_result) = tokio::join!(
                    futures_util::future::join_all(calls),
                    w.push_pull(&t, long_buf, Reduce::Sum)
                );
                (results, long_result.unwrap())
            }
        };
        let (a, b) = tokio::join!(run(0), run(1));
        for (i, got) in a.0.iter().chain(&b.0) {
            let expected = rank_order_sum(&[input(0, *i, 2), input(1, *i, 2)]);
            assert!(same_bits(got, &expected), "tensor s{i:03} (seed {seed})");
        }
        let expected = rank_order_sum(&[input(0, 9999, 1000), input(1, 9999, 1000)]);
        assert!(same_bits(&a.1, &expected));
        assert!(same_bits(&b.1, &expected));
        assert_eq!(s.workers[0].metrics().tensors.len(), n + 1);
        s.finish_all().await;
    })
    .await
    .expect("test timed out");
}

/// Tensors `{prefix}00`.. of `len(i)` elements whose priorities interleave with the index:
/// every `every`-th one first (`1000 - i`), the others after (`-i`). Per tensor, one handle per
/// worker.
async fn declare_interleaved(
    s: &Stack,
    prefix: &str,
    n: usize,
    len: impl Fn(usize) -> usize,
    every: usize,
) -> Vec<Vec<pushpull_worker::Tensor>> {
    let mut tensors = Vec::new();
    for i in 0..n {
        let priority = if i % every == every - 1 {
            1000 - i as i32
        } else {
            -(i as i32)
        };
        tensors.push(declare_all_at(s, &format!("{prefix}{i:02}"), len(i) as u64, priority).await);
    }
    tensors
}

/// The order in which worker `r` issues `n` tensors: rank 0 first to last, the others last to
/// first.
fn issue_order(r: usize, n: usize) -> Vec<usize> {
    if r == 0 {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    }
}

/// Calls spawned as separate tasks, issued in opposite orders by the two workers, on tensors
/// with priorities that order them differently again (so each worker's queue releases frames
/// in neither worker's issue order), several chunks per tensor on 2 servers, and a send window
/// of about two frames: every call completes with the rank-order sum. Frames leave a window
/// when delivered, so no worker waits for a result while holding the other's next push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawned_calls_in_opposite_orders_with_priorities_and_a_tiny_window() {
    tokio::time::timeout(TIMEOUT, async {
        let seed = seed();
        // 64-byte partitions: 16 elements per chunk; frames of 104 bytes.
        let s = stack_with(2, 2, 64, |c| c.cluster.send_window_bytes = 200).await;
        let n = 60usize;
        // 1..50 elements: 1 to 4 chunks; odd tensors first, then even ones.
        let len = |i: usize| 1 + (i * 7) % 50;
        let tensors = declare_interleaved(&s, "p", n, len, 2).await;
        let input = |r: usize, i: usize| data(seed ^ ((r as u64) << 40) ^ i as u64, len(i));
        let mut handles = Vec::new();
        for (r, w) in s.workers.iter().enumerate() {
            let order = issue_order(r, n);
            for i in order {
                let (w, t) = (w.clone(), tensors[i][r].clone());
                let buf = input(r, i);
                handles.push((
                    r,
                    i,
                    tokio::spawn(async move { w.push_pull(&t, buf, Reduce::Sum).await }),
                ));
            }
        }
        for (r, i, h) in handles {
            let got = h.await.unwrap().unwrap();
            let expected = rank_order_sum(&[input(0, i), input(1, i)]);
            assert!(
                same_bits(&got, &expected),
                "rank {r} tensor p{i:02} (seed {seed})"
            );
        }
        s.finish_all().await;
    })
    .await
    .expect("test timed out");
}

/// A group call per worker, its entries listed in opposite orders on the two workers, with
/// interleaved priorities and a window of about two frames: every result is the rank-order
/// sum, for two rounds in a row; an entry given twice, or with a wrong length, fails alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_calls_in_opposite_orders() {
    tokio::time::timeout(TIMEOUT, async {
        let seed = seed();
        let s = stack_with(2, 2, 64, |c| c.cluster.send_window_bytes = 200).await;
        let n = 40usize;
        let len = |i: usize| 1 + (i * 13) % 60; // 1..60 elements: 1 to 4 chunks
        let tensors = declare_interleaved(&s, "g", n, len, 3).await;
        let lone = declare_all(&s, "lone", 5).await;
        for round in 0..2u64 {
            let input = |r: usize, i: usize| {
                data(
                    seed ^ ((r as u64) << 40) ^ ((round) << 32) ^ i as u64,
                    len(i),
                )
            };
            let groups = s.workers.iter().enumerate().map(|(r, w)| {
                let order = issue_order(r, n);
                let mut calls: Vec<_> = order
                    .iter()
                    .map(|&i| (tensors[i][r].clone(), input(r, i), vec![f32::NAN; len(i)]))
                    .collect();
                // Worker 0 also lists tensor 5 a second time, and another with a long output.
                if r == 0 {
                    calls.push((tensors[5][0].clone(), input(0, 5), vec![0.0; len(5)]));
                    calls.push((lone[0].clone(), vec![0.0; 5], vec![0.0; 6]));
                }
                let w = w.clone();
                async move { (r, order, w.push_pull_group_into(calls, Reduce::Sum).await) }
            });
            for (r, order, handles) in futures_util::future::join_all(groups).await {
                let mut handles = handles.into_iter();
                for (&i, h) in order.iter().zip(handles.by_ref()) {
                    let (inp, out) = h.await.unwrap();
                    assert!(same_bits(&inp, &input(r, i)), "input kept (seed {seed})");
                    let expected = rank_order_sum(&[input(0, i), input(1, i)]);
                    assert!(
                        same_bits(&out, &expected),
                        "rank {r} tensor g{i:02} round {round} (seed {seed})"
                    );
                }
                let extra: Vec<_> = handles.collect();
                assert_eq!(extra.len(), if r == 0 { 2 } else { 0 });
                if r == 0 {
                    let mut extra = extra.into_iter();
                    let e = extra.next().unwrap().await.unwrap_err();
                    assert!(matches!(e, WorkerError::TwiceInGroup { .. }), "{e}");
                    assert!(e.to_string().contains("\"g05\""), "{e}");
                    let e = extra.next().unwrap().await.unwrap_err();
                    assert!(matches!(e, WorkerError::LengthMismatch { .. }), "{e}");
                }
            }
        }
        s.finish_all().await;
    })
    .await
    .expect("test timed out");
}

/// The in-place group call (`push_pull_group`): listed in opposite orders on two workers,
/// every buffer becomes the rank-order sum; a buffer of the wrong length fails alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_group_calls_in_opposite_orders() {
    tokio::time::timeout(TIMEOUT, async {
        let seed = seed();
        let s = stack_with(2, 2, 64, |c| c.cluster.send_window_bytes = 200).await;
        let n = 12usize;
        let len = |i: usize| 1 + (i * 29) % 70;
        let tensors = declare_interleaved(&s, "h", n, len, 3).await;
        let lone = declare_all(&s, "lone", 5).await;
        let input = |r: usize, i: usize| data(seed ^ ((r as u64) << 40) ^ i as u64, len(i));
        let groups = s.workers.iter().enumerate().map(|(r, w)| {
            let order = issue_order(r, n);
            let mut calls: Vec<_> = order
                .iter()
                .map(|&i| (tensors[i][r].clone(), input(r, i)))
                .collect();
            if r == 1 {
                calls.push((lone[1].clone(), vec![0.0; 6]));
            }
            let w = w.clone();
            // Spawned: the group call's future must be `Send`.
            tokio::spawn(async move { (r, order, w.push_pull_group(calls, Reduce::Average).await) })
        });
        for spawned in futures_util::future::join_all(groups).await {
            let (r, order, handles) = spawned.unwrap();
            let mut handles = handles.into_iter();
            for (&i, h) in order.iter().zip(handles.by_ref()) {
                let got = h.await.unwrap();
                let sum = rank_order_sum(&[input(0, i), input(1, i)]);
                let expected: Vec<f32> = sum.iter().map(|v| v / 2.0).collect();
                assert!(
                    same_bits(&got, &expected),
                    "rank {r} tensor h{i:02} (seed {seed})"
                );
            }
            let extra: Vec<_> = handles.collect();
            assert_eq!(extra.len(), r);
            for h in extra {
                let e = h.await.unwrap_err();
                assert!(matches!(e, WorkerError::LengthMismatch { .. }), "{e}");
                assert!(e.to_string().contains("\"lone\""), "{e}");
            }
        }
        s.finish_all().await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_errors_name_the_tensor_and_values() {
    tokio::time::timeout(TIMEOUT, async {
        let c = stack(2, 1, 4096).await;
        let w = &c.workers;
        let t = declare_all(&c, "fc1.weight", 10).await;
        let e = w[0]
            .push_pull(&t[0], vec![0.0; 9], Reduce::Sum)
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "tensor \"fc1.weight\" was declared with 10 elements, but the buffer has 9"
        );
        // push_pull_into checks both buffers.
        for (input, output) in [(9, 10), (10, 11)] {
            let e = w[0]
                .push_pull_into(&t[0], vec![0.0; input], vec![0.0; output], Reduce::Sum)
                .await
                .unwrap_err();
            let bad = if input != 10 { input } else { output };
            assert_eq!(
                e.to_string(),
                format!(
                    "tensor \"fc1.weight\" was declared with 10 elements, but the buffer has {bad}"
                )
            );
        }
        // A handle from another worker is refused, even with the same name.
        let e = w[0]
            .push_pull(&t[1], vec![0.0; 10], Reduce::Sum)
            .await
            .unwrap_err();
        assert!(matches!(e, WorkerError::Undeclared { .. }), "{e}");
        assert!(e.to_string().contains("\"fc1.weight\""), "{e}");
        let e = w[0].tensor("nope").unwrap_err();
        assert!(
            e.to_string().contains("tensor \"nope\" is not declared"),
            "{e}"
        );
        let e = w[0].broadcast(&t[0], vec![0.0; 10], 2).await.unwrap_err();
        assert!(e.to_string().contains("root 2 is not a rank"), "{e}");
        assert_eq!(t[0].rounds_started(), 0, "rejected calls use no round");
        assert_eq!(w[0].tensor("fc1.weight").unwrap().rounds_started(), 0);

        // Lengths that differ between workers: both get an error naming both values; other
        // tensors keep working.
        let (a, b) = tokio::join!(
            w[0].declare("mismatch", 1000, ParamMap::new()),
            w[1].declare("mismatch", 999, ParamMap::new())
        );
        for e in [a.unwrap_err(), b.unwrap_err()] {
            let s = e.to_string();
            assert!(
                s.contains("\"mismatch\"") && s.contains("1000") && s.contains("999"),
                "{s}"
            );
        }
        // Parameters overlay: declare params win over the config's [tensors.default].
        let mut p = ParamMap::new();
        p.insert("compressor".into(), "none".into());
        let (a, b) = tokio::join!(
            w[0].declare("with_params", 5, p.clone()),
            w[1].declare("with_params", 5, p.clone())
        );
        assert_eq!(a.unwrap().params(), b.unwrap().params());
        // Declaring again returns the same tensor (same round counter).
        let (x, y) = tokio::join!(
            w[0].push_pull(&t[0], vec![1.0; 10], Reduce::Average),
            w[1].push_pull(&t[1], vec![3.0; 10], Reduce::Average)
        );
        assert_eq!(x.unwrap(), vec![2.0; 10]);
        assert_eq!(y.unwrap(), vec![2.0; 10]);
        let again = w[0]
            .declare("fc1.weight", 10, ParamMap::new())
            .await
            .unwrap();
        assert_eq!(again.rounds_started(), 1);
        c.finish_all().await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_push_pull_completes_in_the_background() {
    tokio::time::timeout(TIMEOUT, async {
        let c = stack(2, 1, 16).await;
        let w = &c.workers;
        let t = declare_all(&c, "grad", 10).await;
        // Worker 0 gives up waiting for worker 1: its round 0 is detached, not cancelled.
        let r = tokio::time::timeout(
            Duration::from_millis(200),
            w[0].push_pull(&t[0], vec![1.0; 10], Reduce::Sum),
        )
        .await;
        assert!(r.is_err(), "worker 1 has not pushed yet");
        assert_eq!(t[0].rounds_started(), 1);
        let b = w[1]
            .push_pull(&t[1], vec![2.0; 10], Reduce::Sum)
            .await
            .unwrap();
        assert_eq!(b, vec![3.0; 10], "worker 0's detached round completed");
        // The next round pairs up correctly.
        let (a, b) = tokio::join!(
            w[0].push_pull(&t[0], vec![5.0; 10], Reduce::Sum),
            w[1].push_pull(&t[1], vec![6.0; 10], Reduce::Sum)
        );
        assert_eq!(a.unwrap(), vec![11.0; 10]);
        assert_eq!(b.unwrap(), vec![11.0; 10]);
        c.finish_all().await;
    })
    .await
    .expect("test timed out");
}

#[test]
fn blocking_workers_in_threads() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = rt.block_on(nodes_with(2, 2, 64, |_| {}));
    let threads: Vec<_> = (0..2)
        .map(|w| {
            let (config, id) = (c.config.clone(), c.identity(w));
            std::thread::spawn(move || {
                let bw = pushpull_worker::BlockingWorker::join(&config, id, JoinOptions::default())
                    .unwrap();
                let t = bw.declare("p", 1000, ParamMap::new()).unwrap();
                let mut buf: Vec<f32> = (0..1000).map(|i| (i * (bw.rank() + 1)) as f32).collect();
                bw.push_pull(&t, &mut buf, Reduce::Sum).unwrap();
                assert!(buf.iter().enumerate().all(|(i, v)| *v == (3 * i) as f32));
                let mut b = vec![bw.rank() as f32; 1000];
                bw.broadcast(&t, &mut b, 1).unwrap();
                assert_eq!(b, vec![1.0; 1000]);
                let mut wrong = vec![0.0; 3];
                let e = bw.push_pull(&t, &mut wrong, Reduce::Sum).unwrap_err();
                assert!(e
                    .to_string()
                    .contains("1000 elements, but the buffer has 3"));
                assert_eq!(wrong, vec![0.0; 3], "unchanged on error");
                bw.barrier().unwrap();
                assert_eq!(bw.metrics().tensors["p"].rounds, 2);
                bw.finish().unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    rt.block_on(c.finish_all());
}

/// A ResNet-50-sized gradient (25.6 M elements, 100 MB) in one tensor with the default
/// partition size, a few rounds, checked bit for bit; prints seconds per round. Ignored by
/// default (slow in debug builds); `PUSHPULL_SMOKE_LEN` sets the element count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn large_tensor_rounds() {
    let len: usize = std::env::var("PUSHPULL_SMOKE_LEN")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(25_600_000);
    let seed = seed();
    let s = stack(2, 2, 4_096_000).await;
    let t = declare_all(&s, "resnet50.flat", len as u64).await;
    println!("{} elements in {} chunks", len, t[0].num_chunks());
    let inputs: Vec<Vec<f32>> = (0..2u64).map(|r| data(seed ^ (r << 48), len)).collect();
    let expected = rank_order_sum(&inputs);
    for round in 0..3 {
        let start = std::time::Instant::now();
        let (a, b) = tokio::join!(
            s.workers[0].push_pull(&t[0], inputs[0].clone(), Reduce::Sum),
            s.workers[1].push_pull(&t[1], inputs[1].clone(), Reduce::Sum)
        );
        let secs = start.elapsed().as_secs_f64();
        println!(
            "round {round}: {secs:.2} s ({:.0} MB/s of fp32 per worker)",
            4.0 * len as f64 / secs / 1e6
        );
        let a = a.unwrap_or_else(|e| panic!("worker 0, round {round}: {e}"));
        let b = b.unwrap_or_else(|e| panic!("worker 1, round {round}: {e}"));
        assert!(same_bits(&a, &expected), "seed {seed}");
        assert!(same_bits(&b, &expected), "seed {seed}");
    }
    println!("worker 0: {}", s.workers[0].metrics());
    s.finish_all().await;
}
