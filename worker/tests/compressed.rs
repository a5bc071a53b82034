//! Compressed push_pull through the real scheduler and servers, checked against the
//! single-process [`Reference`] bit for bit; mismatched maps, corrupted payloads, the
//! `min_compress_bytes` boundary, lossless broadcast.

use pushpull_kernels::{Codec, CodecInfo, Compressor, Result, RoundCtx};
use pushpull_worker::{CodecContext, CodecFactory, KernelsFactory, Reduce, WorkerError};

mod common;
use common::set::*;
use common::*;

async fn run_cluster(seed: u64, into: bool) -> (Vec<Vec<Vec<Vec<f32>>>>, Vec<(u64, u64)>) {
    run_set_cluster(seed, WORKERS, 1, into).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_is_bit_identical_to_the_single_process_reference_twice() {
    tokio::time::timeout(TIMEOUT * 2, async {
        let seed = seed();
        let reference = run_reference(seed);
        let (first, bytes) = run_cluster(seed, false).await;
        if let Some(d) = first_difference(&first, &reference) {
            panic!("cluster vs reference (seed {seed}): {d}");
        }
        // Half the calls out of place (push_pull_into): the same bits.
        let (second, _) = run_cluster(seed, true).await;
        if let Some(d) = first_difference(&second, &reference) {
            panic!("second cluster run (half push_pull_into) vs reference (seed {seed}): {d}");
        }

        // The compression was real: lossy tensors differ from the exact sum and pushed fewer
        // bytes than fp32; the small tensor travelled raw.
        let set = tensor_set();
        for (i, (name, len, _, reduce)) in set.iter().enumerate() {
            let (pushed, raw) = bytes[i];
            assert_eq!(raw, ROUNDS * 4 * len, "{name}");
            if *name == "bias" {
                assert_eq!(pushed, raw, "{name} is below min_compress_bytes");
                continue;
            }
            assert!(
                pushed * 2 <= raw,
                "{name}: pushed {pushed} of {raw} raw bytes"
            );
            let round = ROUNDS - 1;
            let inputs: Vec<Vec<f32>> = (0..3)
                .map(|r| input(seed, round, r, i, *len as usize))
                .collect();
            let mut exact = rank_order_sum(&inputs);
            if *reduce == Reduce::Average {
                exact.iter_mut().for_each(|x| *x /= 3.0);
            }
            assert!(
                !same_bits(&first[round as usize][i][0], &exact),
                "{name}: result equals the uncompressed sum"
            );
        }
        // Every rank got the same bits (momentum and error feedback live in the pushes, the
        // pulled sum is decompressed identically).
        for round in &first {
            for t in round {
                assert!(t.iter().all(|x| same_bits(x, &t[0])));
            }
        }
    })
    .await
    .expect("timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_declaring_different_maps_get_an_error_naming_the_key() {
    tokio::time::timeout(TIMEOUT, async {
        let s = stack(2, 1, 64 * 1024).await;
        let (a, b) = (s.workers[0].clone(), s.workers[1].clone());
        let p0 = map(&[("compressor", "topk"), ("k", "0.01")]);
        let p1 = map(&[("compressor", "topk"), ("k", "0.02")]);
        let (r0, r1) = tokio::join!(a.declare("w", 100_000, p0), b.declare("w", 100_000, p1));
        for r in [r0, r1] {
            let e = r.unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, WorkerError::Declare { .. }), "{text}");
            assert!(
                text.contains("\"w\"")
                    && text.contains("parameter k = \"0.01\"")
                    && text.contains("k = \"0.02\""),
                "{text}"
            );
        }
        // A map the kernels refuse is named by the server's factory, on every worker.
        let bad = map(&[("compressor", "topk"), ("k", "0.9")]);
        let (r0, r1) = tokio::join!(
            a.declare("v", 100_000, bad.clone()),
            b.declare("v", 100_000, bad)
        );
        for r in [r0, r1] {
            let text = r.unwrap_err().to_string();
            assert!(text.contains("\"v\"") && text.contains("0.9"), "{text}");
        }
        // The job goes on.
        let t = declare_all(&s, "ok", 10).await;
        let (x, y) = tokio::join!(
            a.push_pull(&t[0], vec![1.0; 10], Reduce::Sum),
            b.push_pull(&t[1], vec![2.0; 10], Reduce::Sum)
        );
        assert_eq!(x.unwrap(), vec![3.0; 10]);
        assert_eq!(y.unwrap(), vec![3.0; 10]);
        s.finish_all().await;
    })
    .await
    .expect("timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_powersgd_map_that_does_not_fit_its_tensor_is_refused_naming_it() {
    tokio::time::timeout(TIMEOUT, async {
        let s = stack(2, 1, 64 * 1024).await;
        let (a, b) = (s.workers[0].clone(), s.workers[1].clone());
        let declare = |name: &'static str, rows: &'static str, rank: &'static str| {
            let params = map(&[("compressor", "powersgd"), ("rows", rows), ("rank", rank)]);
            let (a, b) = (a.clone(), b.clone());
            async move {
                let (p0, p1) = (params.clone(), params);
                let (r0, r1) =
                    tokio::join!(a.declare(name, 30_000, p0), b.declare(name, 30_000, p1));
                (r0, r1)
            }
        };
        // A 100 × 300 matrix has rank at most 100.
        let (r0, r1) = declare("w", "100", "101").await;
        for r in [r0, r1] {
            let text = r.unwrap_err().to_string();
            assert!(
                text.contains("\"w\"") && text.contains("rank") && text.contains("at most 100"),
                "{text}"
            );
        }
        // rows must divide the length; ef is PowerSGD's own.
        let (r0, _) = declare("v", "7", "1").await;
        let text = r0.unwrap_err().to_string();
        assert!(text.contains("\"v\"") && text.contains("rows"), "{text}");
        let bad = map(&[
            ("compressor", "powersgd"),
            ("rows", "100"),
            ("ef", "vanilla"),
        ]);
        let (r0, r1) = tokio::join!(
            a.declare("u", 30_000, bad.clone()),
            b.declare("u", 30_000, bad)
        );
        for r in [r0, r1] {
            let text = r.unwrap_err().to_string();
            assert!(
                text.contains("\"u\"") && text.contains("own error feedback"),
                "{text}"
            );
        }
        // The job goes on, and a fitting map declares the tensor and its P and Q tensors.
        let (r0, r1) = declare("ok", "100", "4").await;
        let (t0, t1) = (r0.unwrap(), r1.unwrap());
        assert!(a.tensor("ok#powersgd.p").unwrap().len() == 400);
        assert!(b.tensor("ok#powersgd.q").unwrap().len() == 1200);
        let (x, y) = tokio::join!(
            a.push_pull(&t0, vec![1.0; 30_000], Reduce::Sum),
            b.push_pull(&t1, vec![2.0; 30_000], Reduce::Sum)
        );
        // Before start_iter (1000 by default): a plain float32 sum.
        assert_eq!(x.unwrap(), vec![3.0; 30_000]);
        assert_eq!(y.unwrap(), vec![3.0; 30_000]);
        let names: Vec<String> = a.metrics().tensors.into_keys().collect();
        assert_eq!(
            names,
            ["ok"],
            "the P and Q tensors are counted in their owner's metrics"
        );
        s.finish_all().await;
    })
    .await
    .expect("timed out");
}

/// A codec that corrupts its payload in one round: truncates it, or overwrites its first
/// bytes (a top-k payload then has indices out of order or out of range).
struct Corrupt {
    inner: Compressor,
    round: u64,
    truncate: bool,
}

impl Codec for Corrupt {
    fn info(&self) -> &CodecInfo {
        self.inner.codec().info()
    }
    fn encode(&mut self, input: &[f32], ctx: &RoundCtx, out: &mut Vec<u8>) -> Result<()> {
        self.inner.compress(input, ctx, out)?;
        if ctx.round == self.round {
            if self.truncate {
                out.truncate(out.len() - 3);
            } else {
                for (i, b) in out.iter_mut().take(16).enumerate() {
                    *b = 0xff - i as u8;
                }
            }
        }
        Ok(())
    }
    fn decode(&self, payload: &[u8], ctx: &RoundCtx, out: &mut [f32], add: bool) -> Result<()> {
        self.inner.codec().decode(payload, ctx, out, add)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_payload_aborts_that_key_for_everyone_naming_key_and_rank() {
    tokio::time::timeout(TIMEOUT, async {
        let seed = seed();
        let s = stack_with(WORKERS, SERVERS, PARTITION_BYTES, |c| {
            c.cluster.seed = Some(seed)
        })
        .await;
        // Rank 1 corrupts chunk 0 of "a" (onebit) in round 1 by truncation, and chunk 0 of
        // "b" (topk) in round 2 with garbage.
        let factory = |ctx: &CodecContext<'_>| -> Result<Compressor, String> {
            let inner = KernelsFactory.make(ctx)?;
            let target = match ctx.tensor.name.as_str() {
                "a" if ctx.chunk_index == 0 => Some((1, true)),
                "b" if ctx.chunk_index == 0 => Some((2, false)),
                _ => None,
            };
            Ok(match target {
                Some((round, truncate)) => Compressor::new(Box::new(Corrupt {
                    inner,
                    round,
                    truncate,
                })),
                None => inner,
            })
        };
        s.workers[1].set_codec_factory(factory);
        let pa = map(&[("compressor", "onebit"), ("ef", "vanilla")]);
        let pb = map(&[("compressor", "topk"), ("k", "0.01")]);
        let ta = declare_all_with(&s, "a", 40_000, pa).await;
        let tb = declare_all_with(&s, "b", 40_000, pb).await;
        let key_a = ta[0].placement().chunks[0].key;
        let key_b = tb[0].placement().chunks[0].key;
        for round in 0..4u64 {
            let mut calls = Vec::new();
            for (r, w) in s.workers.iter().enumerate() {
                for (i, t) in [&ta[r], &tb[r]].into_iter().enumerate() {
                    let (w, t) = (w.clone(), t.clone());
                    let buf = input(seed, round, r as u32, i, 40_000);
                    calls.push(tokio::spawn(async move {
                        w.push_pull(&t, buf, Reduce::Sum).await
                    }));
                }
            }
            let results: Vec<Result<Vec<f32>, WorkerError>> = futures_util::future::join_all(calls)
                .await
                .into_iter()
                .map(|j| j.unwrap())
                .collect();
            for (j, res) in results.iter().enumerate() {
                let tensor = if j % 2 == 0 { "a" } else { "b" };
                let bad = (tensor == "a" && round == 1) || (tensor == "b" && round == 2);
                match res {
                    Ok(v) => {
                        assert!(
                            !bad,
                            "round {round} tensor {tensor}: corrupted but succeeded"
                        );
                        let first = results[j % 2].as_ref().unwrap();
                        assert!(same_bits(v, first), "ranks disagree");
                    }
                    Err(e) => {
                        assert!(bad, "round {round} tensor {tensor}: {e}");
                        let text = e.to_string();
                        let key = format!("{:#018x}", if tensor == "a" { key_a } else { key_b });
                        assert!(
                            matches!(e, WorkerError::Aborted { .. })
                                && text.contains(&key)
                                && text.contains("rank 1")
                                && text.contains("undecodable")
                                && text.contains("server "),
                            "{text}"
                        );
                    }
                }
            }
        }
        s.finish_all().await;
    })
    .await
    .expect("timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_compress_bytes_boundary_and_lossless_broadcast() {
    tokio::time::timeout(TIMEOUT, async {
        let seed = seed();
        let s = stack_with(2, 1, 4 * 1024 * 1024, |c| {
            c.cluster.min_compress_bytes = 4000;
            c.cluster.seed = Some(seed);
        })
        .await;
        let p = map(&[("compressor", "onebit"), ("scaling", "true")]);
        // 1000 elements = 4000 bytes: compressed; 999: raw fp32.
        let at = declare_all_with(&s, "at", 1000, p.clone()).await;
        let below = declare_all_with(&s, "below", 999, p.clone()).await;
        for (ts, len) in [(&at, 1000usize), (&below, 999)] {
            let bufs: Vec<Vec<f32>> = (0..2).map(|r| data(seed + r, len)).collect();
            let (x, y) = tokio::join!(
                s.workers[0].push_pull(&ts[0], bufs[0].clone(), Reduce::Sum),
                s.workers[1].push_pull(&ts[1], bufs[1].clone(), Reduce::Sum)
            );
            let (x, y) = (x.unwrap(), y.unwrap());
            assert!(same_bits(&x, &y));
            let m = ts[0].metrics();
            if len == 999 {
                assert_eq!(m.bytes_pushed, 4 * 999);
                assert!(
                    same_bits(&x, &rank_order_sum(&bufs)),
                    "raw tensor not exact"
                );
            } else {
                assert_eq!(m.bytes_pushed, 4 + 4 * 1000u64.div_ceil(32));
                assert!(m.compression_ratio() > 25.0, "{m:?}");
                // onebit with scaling: every element is +-scale.
                let scale = x[0].abs();
                assert!(x.iter().all(|v| v.abs() == scale || *v == 0.0), "{x:?}");
            }
        }
        // A broadcast through a lossy tensor delivers the root's bits.
        let root = data(seed ^ 7, 1000);
        let (x, y) = tokio::join!(
            s.workers[0].broadcast(&at[0], vec![0.0; 1000], 1),
            s.workers[1].broadcast(&at[1], root.clone(), 1)
        );
        assert!(same_bits(&x.unwrap(), &root));
        assert!(same_bits(&y.unwrap(), &root));
        s.finish_all().await;
    })
    .await
    .expect("timed out");
}
