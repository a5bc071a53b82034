//! Whole-cluster correctness: the real scheduler and server binaries as processes, workers in
//! process. Every result is checked bit for bit against the rank-order f32 sum computed here.

mod common;

use common::*;
use pushpull::jobs::data;
use pushpull_proto::ParamMap;
use pushpull_worker::{Reduce, Tensor, Worker, WorkerError};

/// Declares `specs` on every worker concurrently; returns tensors[rank][i].
async fn declare_all(workers: &[Worker], specs: &[(String, u64)]) -> Vec<Vec<Tensor>> {
    let mut set = tokio::task::JoinSet::new();
    for (rank, w) in workers.iter().enumerate() {
        for (i, (name, len)) in specs.iter().enumerate() {
            let (w, name, len) = (w.clone(), name.clone(), *len);
            set.spawn(async move {
                let t = w
                    .declare(&name, len, ParamMap::new())
                    .await
                    .unwrap_or_else(|e| panic!("declare {name} on rank {rank}: {e}"));
                (rank, i, t)
            });
        }
    }
    let mut out: Vec<Vec<Option<Tensor>>> = vec![vec![None; specs.len()]; workers.len()];
    while let Some(r) = set.join_next().await {
        let (rank, i, t) = r.unwrap();
        out[rank][i] = Some(t);
    }
    out.into_iter()
        .map(|v| v.into_iter().map(Option::unwrap).collect())
        .collect()
}

/// `rounds` rounds of push_pull(Sum) of every tensor on every worker at once, fresh data each
/// round, every result checked; then one broadcast per tensor from `root`.
async fn check_rounds(
    workers: &[Worker],
    specs: &[(String, u64)],
    rounds: u64,
    seed: u64,
    root: u32,
) -> Vec<Vec<Tensor>> {
    let n = workers.len() as u32;
    let tensors = declare_all(workers, specs).await;
    for round in 0..rounds {
        let inputs: Vec<Vec<Vec<f32>>> = (0..n)
            .map(|r| {
                specs
                    .iter()
                    .enumerate()
                    .map(|(i, (_, len))| data::generate(seed, round, r, i as u32, *len as usize))
                    .collect()
            })
            .collect();
        let mut set = tokio::task::JoinSet::new();
        for (rank, w) in workers.iter().enumerate() {
            for (i, t) in tensors[rank].iter().enumerate() {
                let (w, t, buf) = (w.clone(), t.clone(), inputs[rank][i].clone());
                set.spawn(async move {
                    let out = w.push_pull(&t, buf, Reduce::Sum).await;
                    (rank, i, out)
                });
            }
        }
        let mut results = vec![vec![None; specs.len()]; workers.len()];
        while let Some(r) = set.join_next().await {
            let (rank, i, out) = r.unwrap();
            let out = out.unwrap_or_else(|e| {
                panic!("push_pull {} rank {rank} round {round}: {e}", specs[i].0)
            });
            results[rank][i] = Some(out);
        }
        for (i, (name, _)) in specs.iter().enumerate() {
            let bufs: Vec<Vec<f32>> = (0..n as usize).map(|r| inputs[r][i].clone()).collect();
            let want = rank_order_sum(&bufs);
            for (rank, res) in results.iter().enumerate() {
                assert_bits_eq(
                    res[i].as_ref().unwrap(),
                    &want,
                    &format!("tensor {name} rank {rank} round {round} seed {seed}"),
                );
            }
        }
    }
    // Broadcast delivers the root's bytes.
    let mut set = tokio::task::JoinSet::new();
    for (rank, w) in workers.iter().enumerate() {
        for (i, t) in tensors[rank].iter().enumerate() {
            let len = specs[i].1 as usize;
            let buf = if rank as u32 == root {
                data::generate(seed, 999_999, root, i as u32, len)
            } else {
                data::generate(seed, 999_999, rank as u32, i as u32, len) // ignored
            };
            let (w, t) = (w.clone(), t.clone());
            set.spawn(async move { (rank, i, w.broadcast(&t, buf, root).await) });
        }
    }
    while let Some(r) = set.join_next().await {
        let (rank, i, out) = r.unwrap();
        let out = out.unwrap_or_else(|e| panic!("broadcast {} rank {rank}: {e}", specs[i].0));
        let want = data::generate(seed, 999_999, root, i as u32, specs[i].1 as usize);
        assert_bits_eq(
            &out,
            &want,
            &format!("broadcast of {} to rank {rank}", specs[i].0),
        );
    }
    tensors
}

async fn finish_all(workers: Vec<Worker>) {
    let mut set = tokio::task::JoinSet::new();
    for w in workers {
        set.spawn(async move { w.finish().await });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap().expect("finish");
    }
}

fn lengths() -> Vec<(String, u64)> {
    vec![
        ("len1".into(), 1),
        ("len1000".into(), 1000),
        ("len1000003".into(), 1_000_003),
    ]
}

#[test]
fn one_worker_one_server_sums_and_broadcasts() {
    let _g = cluster_lock();
    let seed = test_seed();
    let mut cluster = ProcCluster::start(test_config(1, 1));
    run_async(async {
        let workers = cluster.join_all().await;
        check_rounds(&workers, &lengths(), 20, seed, 0).await;
        finish_all(workers).await;
    });
    cluster.expect_clean_exit();
}

#[test]
fn three_workers_two_servers_sum_bit_exactly() {
    let _g = cluster_lock();
    let seed = test_seed();
    let mut config = test_config(3, 2);
    // 64 Ki elements per chunk: the 1 000 003-element tensor spans 16 chunks, several on every
    // server.
    config.cluster.partition_bytes = 256 * 1024;
    let mut cluster = ProcCluster::start(config);
    run_async(async {
        let workers = cluster.join_all().await;
        let mut specs = lengths();
        specs.push(("multi_chunk".into(), 300_001));
        let tensors = check_rounds(&workers, &specs, 20, seed, 2).await;
        // The big tensors span several chunks on every server.
        for t in &tensors[0][2..] {
            for s in 0..2 {
                assert!(
                    t.placement().chunks_on(s).count() >= 2,
                    "{} on server {s}: {:?}",
                    t.name(),
                    t.placement()
                );
            }
        }
        finish_all(workers).await;
    });
    cluster.expect_clean_exit();
}

#[test]
fn opposite_orders_over_a_hundred_keys_complete() {
    let _g = cluster_lock();
    let seed = test_seed();
    let mut cluster = ProcCluster::start(test_config(2, 2));
    run_async(async {
        let workers = cluster.join_all().await;
        let specs: Vec<(String, u64)> = (0..150).map(|i| (format!("t{i:03}"), 1000 + i)).collect();
        let tensors = declare_all(&workers, &specs).await;
        for round in 0..3u64 {
            let mut set = tokio::task::JoinSet::new();
            for (rank, w) in workers.iter().enumerate() {
                // Worker 0 starts the push_pulls in order, worker 1 in reverse; all concurrent.
                let order: Vec<usize> = if rank == 0 {
                    (0..specs.len()).collect()
                } else {
                    (0..specs.len()).rev().collect()
                };
                for i in order {
                    let (w, t) = (w.clone(), tensors[rank][i].clone());
                    let buf =
                        data::generate(seed, round, rank as u32, i as u32, specs[i].1 as usize);
                    set.spawn(async move { (rank, i, w.push_pull(&t, buf, Reduce::Sum).await) });
                    tokio::task::yield_now().await;
                }
            }
            while let Some(r) = set.join_next().await {
                let (rank, i, out) = r.unwrap();
                let out = out.unwrap_or_else(|e| panic!("rank {rank} tensor {i}: {e}"));
                let len = specs[i].1 as usize;
                let want = rank_order_sum(&[
                    data::generate(seed, round, 0, i as u32, len),
                    data::generate(seed, round, 1, i as u32, len),
                ]);
                assert_bits_eq(&out, &want, &format!("t{i:03} rank {rank} round {round}"));
            }
        }
        finish_all(workers).await;
    });
    cluster.expect_clean_exit();
}

#[test]
fn misuse_is_reported_and_the_job_goes_on() {
    let _g = cluster_lock();
    let mut cluster = ProcCluster::start(test_config(2, 1));
    run_async(async {
        let workers = cluster.join_all().await;
        let (w0, w1) = (&workers[0], &workers[1]);

        // Different lengths: both workers get an error naming the tensor and both values.
        let (a, b) = tokio::join!(
            w0.declare("fc1.weight", 1000, ParamMap::new()),
            w1.declare("fc1.weight", 999, ParamMap::new())
        );
        for e in [a.unwrap_err(), b.unwrap_err()] {
            let m = e.to_string();
            assert!(matches!(e, WorkerError::Declare { .. }), "{m}");
            assert!(
                m.contains("fc1.weight") && m.contains("1000") && m.contains("999"),
                "{m}"
            );
        }

        // Different parameter maps: the same, naming both values.
        let p = |v: &str| ParamMap::from([("compressor".to_string(), v.to_string())]);
        let (a, b) = tokio::join!(
            w0.declare("conv.weight", 10, p("none")),
            w1.declare("conv.weight", 10, p("fp16"))
        );
        for e in [a.unwrap_err(), b.unwrap_err()] {
            let m = e.to_string();
            assert!(
                m.contains("conv.weight") && m.contains("none") && m.contains("fp16"),
                "{m}"
            );
        }

        // Another tensor still works.
        let (a, b) = tokio::join!(
            w0.declare("ok", 5, ParamMap::new()),
            w1.declare("ok", 5, ParamMap::new())
        );
        let (t0, t1) = (a.unwrap(), b.unwrap());

        // A buffer of the wrong length: an error naming the tensor and both lengths; nothing
        // is sent, so the next call is still round 0 for everyone.
        let e = w0
            .push_pull(&t0, vec![1.0; 4], Reduce::Sum)
            .await
            .unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("\"ok\"") && m.contains('5') && m.contains('4'),
            "{m}"
        );

        // An undeclared tensor, by name and as another worker's handle.
        let e = w0.tensor("never.declared").unwrap_err().to_string();
        assert!(e.contains("never.declared"), "{e}");
        let e = w0
            .push_pull(&t1, vec![1.0; 5], Reduce::Sum)
            .await
            .unwrap_err();
        assert!(matches!(e, WorkerError::Undeclared { .. }), "{e}");
        assert!(e.to_string().contains("\"ok\""), "{e}");

        let (a, b) = tokio::join!(
            w0.push_pull(&t0, vec![1.5; 5], Reduce::Sum),
            w1.push_pull(&t1, vec![2.25; 5], Reduce::Sum)
        );
        assert_eq!(a.unwrap(), vec![3.75; 5]);
        assert_eq!(b.unwrap(), vec![3.75; 5]);
        finish_all(workers).await;
    });
    cluster.expect_clean_exit();
}
