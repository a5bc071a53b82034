//! Checkpoint and restart (`Worker::save_state` / `Worker::load_state`): a job checkpointed at
//! a barrier after K rounds, shut down, and restarted from the files in a fresh cluster
//! continues bit for bit as a job that never stopped (rounds K..2K on every worker), with
//! stateful chains (onebit with vanilla error feedback; top-k with momentum; dithering,
//! stochastic, with corrected error feedback and a learning rate that changes every step;
//! PowerSGD's error and warm-start Q) on workers and servers, and so does the job that saved it; so do both when the step before the
//! checkpoint was skipped (its rounds discarded); a setting that changes results is refused
//! naming it, a damaged file gives an error naming the damage, and neither changes anything.

mod common;

use common::*;
use pushpull_proto::Config;
use pushpull_worker::{Device, EmulatedDevice, ParamMap, Reduce, Tensor, Worker, WorkerError};
use std::sync::Arc;

const WORKERS: u32 = 3;
const SERVERS: u32 = 2;
const K: u64 = 3;

fn map(kv: &[(&str, &str)]) -> ParamMap {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The job's tensors: name, length, parameter map.
fn tensors() -> Vec<(&'static str, u64, ParamMap)> {
    vec![
        (
            "onebit",
            5_000,
            map(&[("compressor", "onebit"), ("ef", "vanilla")]),
        ),
        (
            "topk",
            4_000,
            map(&[
                ("compressor", "topk"),
                ("k", "0.05"),
                ("ef", "vanilla"),
                ("momentum", "nesterov"),
            ]),
        ),
        (
            "dithering",
            3_000,
            map(&[("compressor", "dithering"), ("k", "7"), ("ef", "corrected")]),
        ),
        (
            "powersgd",
            6_000,
            map(&[
                ("compressor", "powersgd"),
                ("rows", "60"),
                ("rank", "2"),
                ("start_iter", "1"),
            ]),
        ),
    ]
}

fn tweak(seed: Option<u64>) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        c.cluster.min_compress_bytes = 0;
        c.cluster.seed = seed;
    }
}

fn lr(round: u64) -> f32 {
    0.1 / (1 + round % 4) as f32
}

fn input(seed: u64, round: u64, rank: u32, tensor: usize, len: u64) -> Vec<f32> {
    let mix =
        ((round + 1) * 0x9e37_79b9) ^ ((u64::from(rank) + 1) << 32) ^ ((tensor as u64 + 1) << 48);
    data(seed ^ mix, len as usize)
}

/// Declares the parameters' tensor (no compressor state) and broadcasts it from rank 0, as a
/// training script does at start, before loading a checkpoint.
async fn broadcast_parameters(s: &Stack) {
    let ts = declare_all(s, "parameters", 100).await;
    let calls = s.workers.iter().zip(&ts).map(|(w, t)| {
        let buf = vec![w.rank() as f32; 100];
        w.broadcast(t, buf, 0)
    });
    for r in futures_util::future::join_all(calls).await {
        assert!(same_bits(&r.unwrap(), &[0.0; 100]));
    }
}

async fn declare(s: &Stack) -> Vec<Vec<Tensor>> {
    let mut out = Vec::new();
    for (name, len, params) in tensors() {
        out.push(declare_all_with(s, name, len, params).await);
    }
    out
}

/// Rounds `from..to` of every tensor on every worker: `[round][tensor][rank]`.
async fn run(
    s: &Stack,
    ts: &[Vec<Tensor>],
    seed: u64,
    from: u64,
    to: u64,
) -> Vec<Vec<Vec<Vec<f32>>>> {
    run_on(s, ts, seed, from..to, None).await
}

/// [`run`] from host buffers, or with `devices` (one per worker) from device buffers: the
/// chains of compressors with kernels then run on the device (the others on the host).
async fn run_on(
    s: &Stack,
    ts: &[Vec<Tensor>],
    seed: u64,
    rounds: std::ops::Range<u64>,
    devices: Option<&[Arc<EmulatedDevice>]>,
) -> Vec<Vec<Vec<Vec<f32>>>> {
    let set = tensors();
    let mut out = Vec::new();
    for round in rounds {
        let mut per_tensor = Vec::new();
        for (i, (_, len, _)) in set.iter().enumerate() {
            let calls = s.workers.iter().zip(&ts[i]).map(|(w, t)| {
                w.set_learning_rate(lr(round));
                let buf = input(seed, round, w.rank(), i, *len);
                let reduce = if i == 1 { Reduce::Average } else { Reduce::Sum };
                let (w, t) = (w.clone(), t.clone());
                let device = devices.map(|d| d[w.rank() as usize].clone());
                async move {
                    let Some(device) = device else {
                        return w.push_pull(&t, buf, reduce).await.unwrap();
                    };
                    let mem = device.alloc_zeros(buf.len()).unwrap();
                    // SAFETY: `mem` holds buf.len() elements.
                    unsafe { device.upload(&buf, device.mem_addr(&mem)).unwrap() };
                    let mem = w.push_pull_device(&t, &device, mem, reduce).await.unwrap();
                    let mut got = vec![0.0; buf.len()];
                    // SAFETY: as above.
                    unsafe { device.download(device.mem_addr(&mem), &mut got).unwrap() };
                    got
                }
            });
            per_tensor.push(futures_util::future::join_all(calls).await);
        }
        out.push(per_tensor);
    }
    out
}

async fn all<T>(
    s: &Stack,
    f: impl Fn(Worker) -> futures_util::future::BoxFuture<'static, Result<T, WorkerError>>,
) -> Vec<Result<T, WorkerError>> {
    futures_util::future::join_all(s.workers.iter().map(|w| f(w.clone()))).await
}

/// Every worker discards the last round of every tensor, as after a step its loss scaler
/// skipped.
async fn discard_all(s: &Stack, ts: &[Vec<Tensor>]) {
    for (rank, w) in s.workers.iter().enumerate() {
        let mine: Vec<Tensor> = ts.iter().map(|t| t[rank].clone()).collect();
        w.discard_last_round(&mine).await.unwrap();
    }
}

/// Every worker saves its checkpoint into `dir` (a collective), and it must succeed.
async fn save_all(s: &Stack, dir: &std::path::Path) {
    let d = dir.to_path_buf();
    for r in all(s, move |w| {
        let path = file(&d, w.rank());
        Box::pin(async move { w.save_state(path).await })
    })
    .await
    {
        r.unwrap();
    }
}

/// Every worker loads its checkpoint from `dir` (a collective), and it must succeed.
async fn load_all(s: &Stack, dir: &std::path::Path) {
    let d = dir.to_path_buf();
    for r in all(s, move |w| {
        let path = file(&d, w.rank());
        Box::pin(async move { w.load_state(path).await })
    })
    .await
    {
        r.unwrap();
    }
}

fn file(dir: &std::path::Path, rank: u32) -> std::path::PathBuf {
    dir.join(format!("ckpt-rank{rank}.bin"))
}

fn compare(a: &[Vec<Vec<Vec<f32>>>], b: &[Vec<Vec<Vec<f32>>>], first_round: u64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    let names = tensors();
    for (r, (ra, rb)) in a.iter().zip(b).enumerate() {
        for (t, (ta, tb)) in ra.iter().zip(rb).enumerate() {
            for (w, (wa, wb)) in ta.iter().zip(tb).enumerate() {
                assert!(
                    same_bits(wa, wb),
                    "{what}: round {} tensor {:?} rank {w} differs",
                    first_round + r as u64,
                    names[t].0
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_job_continues_bit_for_bit() {
    restart_case(WORKERS, 1, false).await;
}

/// Two hosts of two workers (`cluster.local_size` 2): each chunk's chain lives with its owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_two_level_job_continues_bit_for_bit() {
    restart_case(4, 2, false).await;
}

/// The step before the checkpoint was skipped: its rounds are discarded on every worker, and
/// the checkpoint is saved before the next round carries the discard to the servers. The
/// restarted job's first round asks the servers to undo it too, as the uninterrupted one's
/// does; the state was saved undone, so that undoes nothing more. Then a discard of a round
/// that ran before a checkpoint and was not discarded then is refused naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_checkpointed_after_a_skipped_step_continues_bit_for_bit() {
    restart_case(WORKERS, 1, true).await;
}

/// The same with two hosts of two workers: the chunks' owners hold the state they undo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_level_job_checkpointed_after_a_skipped_step_continues_bit_for_bit() {
    restart_case(4, 2, true).await;
}

/// Rounds 0..K, the last discarded when `skipped`, a checkpoint; rounds K..2K after it in the
/// job that saved it and in a restarted one, against a job that never saved.
async fn restart_case(workers: u32, local_size: u32, skipped: bool) {
    tokio::time::timeout(TIMEOUT * 2, async {
        let seed = seed();
        let dir = tempfile::tempdir().unwrap();
        let tweak = move |seed: Option<u64>| {
            move |c: &mut Config| {
                tweak(seed)(c);
                c.cluster.local_size = local_size;
            }
        };

        // The job that stops: no cluster.seed (the scheduler picks one), K rounds, a checkpoint.
        let s = stack_with(workers, SERVERS, 4096, tweak(None)).await;
        let job_seed = s.workers[0].job_seed();
        println!("job seed {job_seed}");
        let ts = declare(&s).await;
        broadcast_parameters(&s).await;
        assert!(ts[0][0].num_chunks() > 1, "several chunks, on both servers");
        let before = run(&s, &ts, seed, 0, K).await;
        if skipped {
            discard_all(&s, &ts).await;
        }
        save_all(&s, dir.path()).await;
        let continued = run(&s, &ts, seed, K, 2 * K).await;
        // A second checkpoint, after round 2K-1, which was not discarded.
        let later = tempfile::tempdir().unwrap();
        save_all(&s, later.path()).await;
        s.finish_all().await;

        // The job that never stops: the same seed, 2K rounds.
        let s = stack_with(workers, SERVERS, 4096, tweak(Some(job_seed))).await;
        let ts = declare(&s).await;
        broadcast_parameters(&s).await;
        let mut whole = run(&s, &ts, seed, 0, K).await;
        if skipped {
            discard_all(&s, &ts).await;
        }
        whole.extend(run(&s, &ts, seed, K, 2 * K).await);
        s.finish_all().await;
        compare(
            &before,
            &whole[..K as usize],
            0,
            "rounds before the checkpoint",
        );
        compare(
            &continued,
            &whole[K as usize..],
            K,
            "rounds after the checkpoint, in the job that saved it",
        );

        // The restart: a fresh cluster told the seed, with settings that do not change
        // results changed, loads the checkpoint and runs rounds K..2K.
        let restart = |c: &mut Config| {
            tweak(Some(job_seed))(c);
            c.cluster.send_window_bytes = 1 << 20;
            c.cluster.heartbeat_interval_ms = 300;
        };
        let s = stack_with(workers, SERVERS, 4096, restart).await;
        let ts = declare(&s).await;
        // Broadcast before loading: the checkpoint has no state for it, so it is kept.
        broadcast_parameters(&s).await;
        load_all(&s, dir.path()).await;
        assert_eq!(ts[2][1].rounds_started(), K);
        if skipped {
            // Discarding again does nothing, as in the job that saved it.
            discard_all(&s, &ts).await;
        }
        let after = run(&s, &ts, seed, K, 2 * K).await;
        s.finish_all().await;
        compare(&after, &whole[K as usize..], K, "rounds after the restart");

        if skipped {
            // A discard after loading the second checkpoint: refused naming the file.
            let s = stack_with(workers, SERVERS, 4096, restart).await;
            let ts = declare(&s).await;
            broadcast_parameters(&s).await;
            load_all(&s, later.path()).await;
            let e = s.workers[1]
                .discard_last_round(&[ts[0][1].clone()])
                .await
                .unwrap_err();
            let m = e.to_string();
            let path = file(later.path(), 1).display().to_string();
            let round = format!("round {}", 2 * K - 1);
            assert!(
                m.contains(&path) && m.contains(&round) && m.contains("onebit"),
                "{m}"
            );
            s.finish_all().await;
        }
    })
    .await
    .expect("timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_settings_and_damaged_files_are_refused_by_name() {
    tokio::time::timeout(TIMEOUT * 2, async {
        let seed = seed();
        let dir = tempfile::tempdir().unwrap();
        let s = stack_with(WORKERS, SERVERS, 4096, tweak(Some(seed))).await;
        let ts = declare(&s).await;
        run(&s, &ts, seed, 0, 1).await;
        save_all(&s, dir.path()).await;
        s.finish_all().await;

        // Another top-k fraction: a parameter map that differs.
        let s = stack_with(WORKERS, SERVERS, 4096, tweak(Some(seed))).await;
        let mut set = tensors();
        set[1].2.insert("k".into(), "0.1".into());
        for (name, len, params) in set {
            declare_all_with(&s, name, len, params).await;
        }
        let w = &s.workers[0];
        let message = |e: WorkerError| e.to_string();
        let e = message(w.load_state(file(dir.path(), 0)).await.unwrap_err());
        assert!(
            e.contains("ckpt-rank0.bin") && e.contains("\"topk\"") && e.contains("parameter map"),
            "{e}"
        );
        // Another rank's file.
        let e = message(w.load_state(file(dir.path(), 1)).await.unwrap_err());
        assert!(e.contains("rank 1") && e.contains("rank 0"), "{e}");
        // Damaged files: truncated, a flipped byte, not a checkpoint, missing.
        let good = std::fs::read(file(dir.path(), 0)).unwrap();
        let bad = dir.path().join("bad.bin");
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..good.len() / 2].to_vec(), "truncated"),
            (good[..10].to_vec(), "truncated"),
            (
                {
                    let mut g = good.clone();
                    let i = g.len() - 5;
                    g[i] ^= 1;
                    g
                },
                "corrupted",
            ),
            (
                b"# a TOML file, not a checkpoint: [cluster]\nnum_workers = 3\n".to_vec(),
                "not a pushpull checkpoint",
            ),
        ];
        for (bytes, want) in cases {
            std::fs::write(&bad, &bytes).unwrap();
            let e = message(w.load_state(&bad).await.unwrap_err());
            assert!(e.contains("bad.bin") && e.contains(want), "{want}: {e}");
        }
        let e = message(w.load_state(dir.path().join("none.bin")).await.unwrap_err());
        assert!(e.contains("none.bin") && e.contains("reading"), "{e}");
        // Nothing changed: the job still runs its rounds from 0.
        assert_eq!(s.workers[0].tensor("onebit").unwrap().rounds_started(), 0);
        s.finish_all().await;
    })
    .await
    .expect("timed out");
}

/// Compressor state kept on a device (emulated: the same code as a GPU's): a job on device
/// buffers saves it (after a skipped step: the device chains undo its rounds) and goes on, a
/// fresh job on device buffers loads it, and the rounds after the checkpoint, in both, are
/// those of a job that never stopped, on host buffers (device and host chains give the same
/// bits). The topk tensor has
/// no kernel: its chains run on the host either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_on_device_buffers_restarts_bit_for_bit() {
    tokio::time::timeout(TIMEOUT * 2, async {
        let seed = seed();
        let dir = tempfile::tempdir().unwrap();
        let devices = || -> Vec<Arc<EmulatedDevice>> {
            (0..WORKERS)
                .map(|_| Arc::new(EmulatedDevice::new()))
                .collect()
        };

        let s = stack_with(WORKERS, SERVERS, 4096, tweak(None)).await;
        let job_seed = s.workers[0].job_seed();
        let ts = declare(&s).await;
        let on = devices();
        let before = run_on(&s, &ts, seed, 0..K, Some(&on)).await;
        let m = ts[0][0].metrics();
        assert_ne!(m.device, pushpull_worker::Place::Cpu, "{m:?}");
        discard_all(&s, &ts).await;
        save_all(&s, dir.path()).await;
        let continued = run_on(&s, &ts, seed, K..2 * K, Some(&on)).await;
        s.finish_all().await;

        let s = stack_with(WORKERS, SERVERS, 4096, tweak(Some(job_seed))).await;
        let ts = declare(&s).await;
        let mut whole = run(&s, &ts, seed, 0, K).await;
        discard_all(&s, &ts).await;
        whole.extend(run(&s, &ts, seed, K, 2 * K).await);
        s.finish_all().await;
        compare(
            &before,
            &whole[..K as usize],
            0,
            "device rounds before the checkpoint",
        );
        compare(
            &continued,
            &whole[K as usize..],
            K,
            "device rounds after the checkpoint, in the job that saved it",
        );

        let s = stack_with(WORKERS, SERVERS, 4096, tweak(Some(job_seed))).await;
        let ts = declare(&s).await;
        load_all(&s, dir.path()).await;
        let on = devices();
        let after = run_on(&s, &ts, seed, K..2 * K, Some(&on)).await;
        s.finish_all().await;
        compare(
            &after,
            &whole[K as usize..],
            K,
            "device rounds after the restart",
        );
    })
    .await
    .expect("timed out");
}

/// A gossiped tensor's gradient bound (moniqua's `theta_schedule = bound`, the largest
/// |gradient| each worker reported) is part of its checkpoint: after a restart each worker's θ
/// comes from the bound the stopped job had, not from a fresh start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gossiped_tensors_gradient_bound_survives_a_restart() {
    tokio::time::timeout(TIMEOUT, async {
        let dir = tempfile::tempdir().unwrap();
        let kv = map(&[
            ("compressor", "moniqua"),
            ("theta", "1"),
            ("bits", "4"),
            ("theta_schedule", "bound"),
            ("exchange", "gossip"),
        ]);
        let g = |rank: u32| 0.5 + rank as f32;
        let s = stack_with(WORKERS, SERVERS, 4096, tweak(Some(7))).await;
        let ts = declare_all_with(&s, "model", 1000, kv.clone()).await;
        for (w, t) in s.workers.iter().zip(&ts) {
            let mut grad = vec![0.25; 1000];
            grad[w.rank() as usize * 7] = -g(w.rank());
            w.track_gradient(t, &grad).unwrap();
            assert_eq!(w.gradient_bound(t), Some(g(w.rank())));
        }
        save_all(&s, dir.path()).await;
        s.finish_all().await;

        let s = stack_with(WORKERS, SERVERS, 4096, tweak(Some(7))).await;
        let ts = declare_all_with(&s, "model", 1000, kv).await;
        assert_eq!(s.workers[0].gradient_bound(&ts[0]), None);
        load_all(&s, dir.path()).await;
        for (w, t) in s.workers.iter().zip(&ts) {
            assert_eq!(w.gradient_bound(t), Some(g(w.rank())), "rank {}", w.rank());
        }
        s.finish_all().await;
    })
    .await
    .expect("timed out");
}
