//! The tensor set of the compressed-reproducibility tests (`compressed.rs` with host buffers,
//! `device.rs` with device buffers): several compressors (stochastic ones included), error
//! feedback of both kinds, momentum, a tensor below `min_compress_bytes`, tensors spanning
//! several chunks with a shorter last one; their seeded inputs (with mixed precision's
//! overflows now and then, and their steps discarded), the learning-rate schedule, and the
//! single-process [`Reference`] run of the set.

use pushpull_worker::reference::{RefTensor, Reference};
use pushpull_worker::{ParamMap, Reduce};

use pushpull_worker::Tensor;

use super::{data, declare_all_with, stack_with};

/// Rounds of every reproducibility run.
pub const ROUNDS: u64 = 10;

/// Workers and servers of the reproducibility cluster, and its partition size.
pub const WORKERS: u32 = 3;
pub const SERVERS: u32 = 2;
pub const PARTITION_BYTES: u64 = 64 * 1024;

/// The set's `cluster.max_chunk_payload_bytes`: low enough that the placement cuts the
/// chunk-sensitive 8-bit minmax tensors finer than `PARTITION_BYTES` (a bucket and a
/// stochastic stream per chunk), which the reference must do the same way.
pub const MAX_CHUNK_PAYLOAD: u64 = 8 * 1024;

/// The reproducibility cluster's settings on top of a test stack's.
pub fn set_config(c: &mut pushpull_proto::Config, seed: u64) {
    c.cluster.seed = Some(seed);
    c.cluster.partition_bytes = PARTITION_BYTES;
    c.cluster.max_chunk_payload_bytes = Some(MAX_CHUNK_PAYLOAD);
}

pub fn map(kv: &[(&str, &str)]) -> ParamMap {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The tensors of the reproducibility test: several compressors (stochastic ones included),
/// error feedback of both kinds, momentum, a tensor below `min_compress_bytes`, tensors
/// spanning several chunks with a shorter last one.
pub fn tensor_set() -> Vec<(&'static str, u64, ParamMap, Reduce)> {
    vec![
        (
            "onebit",
            50_001,
            map(&[
                ("compressor", "onebit"),
                ("scaling", "true"),
                ("ef", "vanilla"),
                ("momentum", "nesterov"),
            ]),
            Reduce::Average,
        ),
        (
            "topk",
            40_000,
            map(&[
                ("byteps_compressor_type", "topk"),
                ("byteps_compressor_k", "0.01"),
                ("byteps_error_feedback_type", "vanilla"),
            ]),
            Reduce::Sum,
        ),
        (
            "randomk",
            33_333,
            map(&[("compressor", "randomk"), ("k", "0.05"), ("ef", "vanilla")]),
            Reduce::Average,
        ),
        (
            "dithering",
            30_000,
            map(&[("compressor", "dithering"), ("k", "4"), ("bucket", "512")]),
            Reduce::Average,
        ),
        (
            "dithering elias",
            24_000,
            map(&[
                ("compressor", "dithering"),
                ("k", "2"),
                ("bucket", "512"),
                ("encoding", "elias"),
            ]),
            Reduce::Sum,
        ),
        (
            "minmax",
            20_000,
            map(&[("compressor", "minmax"), ("bits", "8"), ("ef", "corrected")]),
            Reduce::Sum,
        ),
        (
            "minmax buckets",
            36_864,
            map(&[("compressor", "minmax"), ("bits", "8"), ("bucket", "512")]),
            Reduce::Sum,
        ),
        (
            "fp16",
            17_000,
            map(&[("compressor", "fp16")]),
            Reduce::Average,
        ),
        (
            "bias",
            100,
            map(&[("compressor", "onebit"), ("momentum", "nesterov")]),
            Reduce::Average,
        ),
        // CNTK's column-wise onebit: 6 columns of 5000 (column-major), cut at column
        // boundaries into chunks of 3 whole columns (the set's partition holds 3.3).
        (
            "onebit columns",
            30_000,
            map(&[
                ("compressor", "onebit"),
                ("columns", "6"),
                ("ef", "vanilla"),
            ]),
            Reduce::Sum,
        ),
        // PowerSGD: a 200 × 200 matrix at rank 2 after two uncompressed steps, and a 150 × 200
        // one at rank 1 from the first step, a new random Q each step, summed.
        (
            "powersgd",
            40_000,
            map(&[
                ("compressor", "powersgd"),
                ("rows", "200"),
                ("rank", "2"),
                ("start_iter", "2"),
            ]),
            Reduce::Average,
        ),
        (
            "powersgd sum",
            30_000,
            map(&[
                ("compressor", "powersgd"),
                ("rows", "150"),
                ("start_iter", "0"),
                ("warm_start", "false"),
            ]),
            Reduce::Sum,
        ),
        // A bucket of gradients (pieces): two matrices at rank 3 with one round of their Ps
        // and one of their Qs, a bias riding in the P round, and a 7 × 1 vector.
        (
            "powersgd bucket",
            18_127,
            map(&[
                ("compressor", "powersgd"),
                ("pieces", "100x120,120,60x100,7"),
                ("rank", "3"),
                ("start_iter", "1"),
            ]),
            Reduce::Average,
        ),
    ]
}

pub fn input(seed: u64, round: u64, rank: u32, tensor: usize, len: usize) -> Vec<f32> {
    data(
        seed ^ round.wrapping_mul(0x1000_0001) ^ ((rank as u64) << 40) ^ ((tensor as u64) << 50),
        len,
    )
}

/// Mixed precision in the set's runs: `(round, rank, tensor, value)`, an input holding a
/// non-finite value (as a loss scaler's overflow does): onebit with momentum (a device kernel),
/// top-k (the CPU fallback on a device), minmax with corrected error feedback, PowerSGD (a matrix
/// and a bucket). Their rounds are
/// discarded on every worker afterwards, every tensor, as a skipped optimizer step is.
const POISONED: &[(u64, u32, usize, f32)] = &[
    (3, 1, 0, f32::INFINITY),
    (3, 2, 1, f32::NAN),
    (6, 0, 4, f32::NEG_INFINITY),
    (5, 2, 11, f32::NAN),
    (5, 1, 13, f32::INFINITY),
];

/// [`input`], with [`POISONED`]'s non-finite values.
pub fn step_input(seed: u64, round: u64, rank: u32, tensor: usize, len: usize) -> Vec<f32> {
    let mut x = input(seed, round, rank, tensor, len);
    for &(r, k, t, v) in POISONED {
        if (r, k, t) == (round, rank, tensor) && len > 0 {
            x[(seed ^ round) as usize % len] = v;
        }
    }
    x
}

/// Whether `round`'s step is discarded ([`POISONED`]).
pub fn discarded(round: u64) -> bool {
    POISONED.iter().any(|p| p.0 == round)
}

/// How many rounds of tensor `tensor` have a non-finite sum.
pub fn non_finite_rounds(tensor: usize) -> u64 {
    POISONED.iter().filter(|p| p.2 == tensor).count() as u64
}

pub fn lr(round: u64) -> f32 {
    0.1 * 0.8f32.powi(round as i32)
}

/// The set's results in the single-process reference: `[round][tensor][rank]`.
pub fn run_reference(seed: u64) -> Vec<Vec<Vec<Vec<f32>>>> {
    run_reference_of(seed, WORKERS, 1)
}

/// [`run_reference`] of a job of `workers` in local groups of `local_size`.
pub fn run_reference_of(seed: u64, workers: u32, local_size: u32) -> Vec<Vec<Vec<Vec<f32>>>> {
    let mut config = pushpull_proto::Config::local(workers, SERVERS);
    set_config(&mut config, seed);
    config.cluster.local_size = local_size;
    let mut reference = Reference::new(&config, seed);
    let set = tensor_set();
    let handles: Vec<RefTensor> = set
        .iter()
        .map(|(name, len, params, _)| reference.declare(name, *len, params.clone()).unwrap())
        .collect();
    let mut out = Vec::new();
    for round in 0..ROUNDS {
        if round > 0 && discarded(round - 1) {
            handles
                .iter()
                .for_each(|&h| reference.discard_last_round(h));
        }
        reference.set_learning_rate(lr(round));
        let mut per_tensor = Vec::new();
        for (i, (_, len, _, reduce)) in set.iter().enumerate() {
            let inputs: Vec<Vec<f32>> = (0..workers)
                .map(|r| step_input(seed, round, r, i, *len as usize))
                .collect();
            per_tensor.push(reference.push_pull(handles[i], &inputs, *reduce).unwrap());
        }
        out.push(per_tensor);
    }
    out
}

pub fn first_difference(a: &[Vec<Vec<Vec<f32>>>], b: &[Vec<Vec<Vec<f32>>>]) -> Option<String> {
    let names: Vec<_> = tensor_set().into_iter().map(|t| t.0).collect();
    for (round, (ra, rb)) in a.iter().zip(b).enumerate() {
        for (t, (ta, tb)) in ra.iter().zip(rb).enumerate() {
            for (rank, (xa, xb)) in ta.iter().zip(tb).enumerate() {
                if let Some(i) = (0..xa.len()).find(|&i| xa[i].to_bits() != xb[i].to_bits()) {
                    return Some(format!(
                        "round {round}, tensor {:?}, rank {rank}, element {i}: {} vs {}",
                        names[t], xa[i], xb[i]
                    ));
                }
            }
        }
    }
    None
}

/// Runs the tensor set for [`ROUNDS`] rounds on a cluster of `workers` in local groups of
/// `local_size` and [`SERVERS`] servers; returns
/// `[round][tensor][rank]` results and the workers' pushed/raw bytes per tensor. With `into`,
/// every other call (by rank and round) is a `push_pull_into` whose output starts as NaNs and
/// whose input must come back unchanged.
pub async fn run_set_cluster(
    seed: u64,
    workers: u32,
    local_size: u32,
    into: bool,
) -> (Vec<Vec<Vec<Vec<f32>>>>, Vec<(u64, u64)>) {
    let s = stack_with(workers, SERVERS, PARTITION_BYTES, |c| {
        set_config(c, seed);
        c.cluster.local_size = local_size;
    })
    .await;
    let set = tensor_set();
    let mut tensors: Vec<Vec<Tensor>> = Vec::new();
    for (name, len, params, _) in &set {
        tensors.push(declare_all_with(&s, name, *len, params.clone()).await);
    }
    // The premise of `MAX_CHUNK_PAYLOAD`: 8-bit minmax is cut finer than the partition (where
    // the job has servers: one group alone cuts at `LOCAL_PARTITION_BYTES`).
    if local_size == 1 || workers > local_size {
        let i = set.iter().position(|t| t.0 == "minmax buckets").unwrap();
        let by_partition = (set[i].1 * 4).div_ceil(PARTITION_BYTES) as usize;
        assert!(tensors[i][0].num_chunks() > by_partition);
        // Column-wise onebit is cut at column boundaries: 2 chunks of 3 columns of 5000.
        let i = set.iter().position(|t| t.0 == "onebit columns").unwrap();
        assert_eq!(tensors[i][0].num_chunks(), 2);
    }
    let mut out = Vec::new();
    for round in 0..ROUNDS {
        for (r, w) in s.workers.iter().enumerate() {
            if round > 0 && discarded(round - 1) {
                let mine: Vec<Tensor> = tensors.iter().map(|t| t[r].clone()).collect();
                w.discard_last_round(&mine).await.unwrap();
            }
            w.set_learning_rate(lr(round));
        }
        // Every tensor of every worker at once: the rounds interleave on the wire.
        let mut calls = Vec::new();
        for (i, (_, len, _, reduce)) in set.iter().enumerate() {
            for (r, w) in s.workers.iter().enumerate() {
                let (w, t, reduce) = (w.clone(), tensors[i][r].clone(), *reduce);
                let buf = step_input(seed, round, r as u32, i, *len as usize);
                if into && (r as u64 + round) % 2 == 1 {
                    let output = vec![f32::NAN; buf.len()];
                    calls.push(tokio::spawn(async move {
                        let kept = buf.clone();
                        let (buf, output) = w.push_pull_into(&t, buf, output, reduce).await?;
                        assert!(
                            buf.iter()
                                .zip(&kept)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "push_pull_into changed its input"
                        );
                        Ok(output)
                    }));
                    continue;
                }
                calls.push(tokio::spawn(
                    async move { w.push_pull(&t, buf, reduce).await },
                ));
            }
        }
        let mut results = futures_util::future::join_all(calls).await.into_iter();
        let mut per_tensor = Vec::new();
        for _ in &set {
            let ranks: Vec<Vec<f32>> = (0..s.workers.len())
                .map(|_| results.next().unwrap().unwrap().unwrap())
                .collect();
            per_tensor.push(ranks);
        }
        out.push(per_tensor);
    }
    let bytes = tensors
        .iter()
        .map(|ts| {
            let m = ts[0].metrics();
            (m.bytes_pushed, m.raw_bytes)
        })
        .collect();
    s.finish_all().await;
    (out, bytes)
}
