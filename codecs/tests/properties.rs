//! Property tests over fresh random inputs (seeds printed; replay with PUSHPULL_TEST_SEED):
//! onebit magnitudes and signs, exact top-k, random-k index sharing, independent rounding
//! noise, decompress-add, Elias versus packed. Error feedback's and momentum's are in
//! `chain.rs`.

mod common;

use common::*;
use proptest::prelude::*;
use pushpull_codecs::rng::{Permutation, Stream};
use pushpull_codecs::{Compressor, KernelError, NodeIdentity, RoundCtx};

/// Lengths around the interesting boundaries plus random ones.
fn len_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(1usize),
        Just(7),
        Just(8),
        Just(31),
        Just(32),
        Just(33),
        Just(1000),
        2usize..600,
    ]
}

/// Gradient-like values with ties, zeros, signed zeros and a wide range of magnitudes.
fn values(n: usize) -> impl Strategy<Value = Vec<f32>> {
    let v = prop_oneof![
        4 => -1000.0f32..1000.0,
        2 => -1e-3f32..1e-3,
        1 => Just(0.0f32),
        1 => Just(-0.0f32),
        1 => (-8i32..8).prop_map(|i| i as f32 * 0.25),
        1 => -1e30f32..1e30,
    ];
    proptest::collection::vec(v, n).prop_filter("not all zero", |x| x.iter().any(|&a| a != 0.0))
}

fn input() -> impl Strategy<Value = Vec<f32>> {
    len_strategy().prop_flat_map(values)
}

fn roundtrip(c: &mut Compressor, x: &[f32], round: u64) -> (Vec<u8>, Vec<f32>) {
    let mut out = Vec::new();
    c.compress(x, &RoundCtx::new(round), &mut out).unwrap();
    let mut y = vec![f32::NAN; x.len()];
    c.decompress(&out, &RoundCtx::new(round), &mut y).unwrap();
    (out, y)
}

#[test]
fn onebit_magnitude_is_the_scale_and_signs_agree() {
    proptest!(prop_config("onebit_magnitude_is_the_scale_and_signs_agree", 128), |(x in input(), scaling in any::<bool>())| {
        let s = if scaling { "true" } else { "false" };
        let mut c = build(&[("compressor", "onebit"), ("scaling", s)], x.len());
        let (_, y) = roundtrip(&mut c, &x, 0);
        let scale = if scaling {
            (x.iter().map(|v| v.abs() as f64).sum::<f64>() / x.len() as f64) as f32
        } else {
            1.0
        };
        for (i, (&a, &b)) in x.iter().zip(&y).enumerate() {
            // The reduction order differs from the f64 sum above by f32 rounding only.
            prop_assert!((b.abs() - scale).abs() <= scale * 1e-5, "i={} |y|={} scale={}", i, b.abs(), scale);
            prop_assert_eq!(b < 0.0, a < 0.0, "sign at {}", i);
        }
        // Every |y| is the same number.
        prop_assert!(y.iter().all(|v| v.abs() == y[0].abs()));
    });
}

#[test]
fn onebit_columns_use_the_column_means() {
    // Column-major (CNTK's layout): column j is the contiguous run j·R .. (j+1)·R.
    proptest!(prop_config("onebit_columns_use_the_column_means", 64), |(x in input(), cols in 1usize..40)| {
        let cs = cols.to_string();
        let mut c = build(&[("compressor", "onebit"), ("columns", &cs), ("ef", "none")], x.len());
        let (_, y) = roundtrip(&mut c, &x, 0);
        let rows = x.len().div_ceil(cols.min(x.len()).max(1)).max(1);
        for (j, col) in x.chunks(rows).enumerate() {
            let pos: Vec<f64> = col.iter().filter(|v| v.is_sign_positive() || **v == 0.0).map(|&v| v as f64).collect();
            let neg: Vec<f64> = col.iter().filter(|v| **v < 0.0).map(|&v| v as f64).collect();
            // Sums start at +0.0 (so a column of -0.0 has level +0.0).
            let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { (v.iter().fold(0.0, |a, b| a + b) / v.len() as f64) as f32 };
            let (p, q) = (mean(&pos), mean(&neg));
            for (t, &a) in col.iter().enumerate() {
                let got = y[j * rows + t];
                let want = if a < 0.0 { q } else { p };
                prop_assert_eq!(got.to_bits(), want.to_bits(), "column {} row {}", j, t);
            }
        }
    });
}

/// The k largest |x|, ties to the lower index, by a full sort.
fn topk_reference(x: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[b].abs().total_cmp(&x[a].abs()).then(a.cmp(&b)));
    let mut top: Vec<usize> = idx[..k].to_vec();
    top.sort();
    top
}

#[test]
fn topk_keeps_exactly_the_k_largest() {
    let strat = input().prop_flat_map(|x| {
        let n = x.len();
        (Just(x), 1usize..=(n / 2).max(1))
    });
    proptest!(prop_config("topk_keeps_exactly_the_k_largest", 256), |((x, k) in strat)| {
        let ks = k.to_string();
        let mut c = build(&[("compressor", "topk"), ("k", &ks)], x.len());
        let (out, y) = roundtrip(&mut c, &x, 0);
        prop_assert_eq!(out.len(), 8 * k);
        let idx: Vec<usize> = out[..4 * k].chunks(4).map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize).collect();
        let want = topk_reference(&x, k);
        prop_assert_eq!(&idx, &want);
        for (i, (&a, &b)) in x.iter().zip(&y).enumerate() {
            if want.binary_search(&i).is_ok() {
                prop_assert_eq!(a.to_bits(), b.to_bits());
            } else {
                prop_assert_eq!(b.to_bits(), 0.0f32.to_bits());
            }
        }
    });
}

#[test]
fn topk_with_massive_ties_and_large_input() {
    let seed = seed("topk_with_massive_ties_and_large_input");
    let mut rng = TestRng::new(seed);
    let one = pool(1);
    let two = pool(2);
    for &(n, k, levels) in &[
        (300_000usize, 3000usize, 3u64),
        (200_000, 100_000, 1000),
        (150_000, 7, 1),
    ] {
        let x: Vec<f32> = (0..n)
            .map(|_| {
                let v = rng.below(levels) as f32 * 0.5 + 1.0;
                if rng.below(2) == 0 {
                    v
                } else {
                    -v
                }
            })
            .collect();
        let ks = k.to_string();
        let want = topk_reference(&x, k);
        for pool in [&one, &two] {
            let idx = pool.install(|| {
                let mut c = build(&[("compressor", "topk"), ("k", &ks)], n);
                let mut out = Vec::new();
                c.compress(&x, &RoundCtx::new(0), &mut out).unwrap();
                out[..4 * k]
                    .chunks(4)
                    .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize)
                    .collect::<Vec<_>>()
            });
            assert_eq!(idx, want, "n={n} k={k}");
        }
    }
}

/// Chunk-sized inputs, where top-k estimates its threshold from a strided sample before it
/// falls back to a histogram: every shape of input (smooth, heavy-tailed, sorted, mostly zeros,
/// a few spikes, constant, large only where the sample looks) and k from 1 to n/2 give the
/// reference's indices, and a non-finite element is named at the reference's index.
#[test]
fn topk_at_chunk_sizes_matches_the_reference_on_every_shape() {
    let seed = seed("topk_at_chunk_sizes_matches_the_reference_on_every_shape");
    let mut rng = TestRng::new(seed);
    let one = pool(1);
    for &n in &[4096usize, 4097, 32768, 50_001] {
        let shapes: Vec<(&str, Vec<f32>)> = vec![
            ("gaussian", rng.gradient(n, 1.0)),
            (
                "heavy",
                (0..n)
                    .map(|_| {
                        (rng.normal() * 6.0).exp() as f32
                            * if rng.below(2) == 0 { 1.0 } else { -1.0 }
                    })
                    .collect(),
            ),
            ("sorted", {
                let mut v = rng.gradient(n, 1.0);
                v.sort_by(|a, b| a.abs().total_cmp(&b.abs()));
                v
            }),
            (
                "sparse",
                (0..n)
                    .map(|_| {
                        if rng.below(200) == 0 {
                            rng.normal() as f32
                        } else {
                            0.0
                        }
                    })
                    .collect(),
            ),
            ("spikes", {
                let mut v = rng.gradient(n, 1e-3);
                for _ in 0..5 {
                    v[rng.below(n as u64) as usize] = 1e3;
                }
                v
            }),
            ("constant", vec![-0.25; n]),
            // Large exactly where a stride of n / 1024 samples (top-k's estimate sees only
            // large values): too few reach it for k = n / 20.
            ("aliased", {
                let stride = n / 1024;
                (0..n)
                    .map(|i| {
                        if i % stride == stride / 2 {
                            2.0
                        } else {
                            rng.normal() as f32 * 0.1
                        }
                    })
                    .collect()
            }),
        ];
        for (shape, x) in &shapes {
            for k in [1, 5, n / 100, n / 20, n / 10, n / 2] {
                let want = topk_reference(x, k);
                let ks = k.to_string();
                let got: Vec<usize> = one.install(|| {
                    let mut c = build(&[("compressor", "topk"), ("k", &ks)], n);
                    let mut out = Vec::new();
                    c.compress(x, &RoundCtx::new(0), &mut out).unwrap();
                    out[..4 * k]
                        .chunks(4)
                        .map(|b| u32::from_le_bytes(b.try_into().unwrap()) as usize)
                        .collect()
                });
                assert_eq!(got, want, "{shape} n={n} k={k} (seed {seed})");
            }
            // Non-finite elements: the first is named.
            let mut bad = x.clone();
            let (a, b) = (rng.below(n as u64) as usize, rng.below(n as u64) as usize);
            bad[a] = f32::NAN;
            bad[b] = f32::INFINITY;
            let first = a.min(b);
            let ks = (n / 100).to_string();
            let e = one
                .install(|| {
                    let mut c = build(&[("compressor", "topk"), ("k", &ks)], n);
                    c.compress(&bad, &RoundCtx::new(0), &mut Vec::new())
                })
                .unwrap_err();
            assert!(
                matches!(e, KernelError::NonFinite { index, .. } if index == first),
                "{shape} n={n}: {e} (first non-finite at {first}, seed {seed})"
            );
        }
    }
}

/// The support (indices of the values) a random-k payload of this identity covers.
fn randomk_support(seed: u64, key: u64, round: u64, n: usize, rank: u32) -> Vec<usize> {
    randomk_support_k(seed, key, round, n, rank, "0.1")
}

/// [`randomk_support`] for the setting `k` (read off a payload of `x[i] = i + 1`, sorted).
fn randomk_support_k(seed: u64, key: u64, round: u64, n: usize, rank: u32, k: &str) -> Vec<usize> {
    let x: Vec<f32> = (0..n).map(|i| i as f32 + 1.0).collect();
    let mut c = build_as(
        &[("compressor", "randomk"), ("k", k)],
        n,
        NodeIdentity::worker(seed, key, rank),
    );
    let mut out = Vec::new();
    c.compress(&x, &RoundCtx::new(round), &mut out).unwrap();
    let mut idx: Vec<usize> = out
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as usize - 1)
        .collect();
    let k = idx.len();
    idx.sort();
    idx.dedup();
    assert_eq!(idx.len(), k, "random-k drew an index twice");
    idx
}

#[test]
fn randomk_indices_are_shared_and_seeded() {
    proptest!(prop_config("randomk_indices_are_shared_and_seeded", 64), |(seed in any::<u64>(), key in any::<u64>(), round in 0u64..1000, n in 200usize..3000)| {
        let a = randomk_support(seed, key, round, n, 0);
        // Same seed and key: the same indices on every rank (and on the server, below).
        prop_assert_eq!(&a, &randomk_support(seed, key, round, n, 5));
        // A different seed, key or round: different indices.
        prop_assert_ne!(&a, &randomk_support(seed ^ 1, key, round, n, 0));
        prop_assert_ne!(&a, &randomk_support(seed, key.wrapping_add(1), round, n, 0));
        prop_assert_ne!(&a, &randomk_support(seed, key, round + 1, n, 0));
    });
}

#[test]
fn randomk_server_uses_the_same_support_and_does_not_rescale() {
    let seed = seed("randomk_server_uses_the_same_support_and_does_not_rescale");
    let mut rng = TestRng::new(seed);
    let n = 1000;
    let kv = [("compressor", "randomk"), ("k", "50"), ("unbiased", "true")];
    let round = rng.below(100);
    let ctx = RoundCtx::new(round);
    // Three workers push; the server sums, recompresses; the pull equals the sum on the support.
    let mut sum = vec![0f32; n];
    let server = build_as(&kv, n, NodeIdentity::server(seed, 9, 0));
    let mut grads = Vec::new();
    for rank in 0..3 {
        let mut w = build_as(&kv, n, NodeIdentity::worker(seed, 9, rank));
        let g = rng.gradient(n, 1.0);
        let mut out = Vec::new();
        w.compress(&g, &ctx, &mut out).unwrap();
        server.decompress_add(&out, &ctx, &mut sum).unwrap();
        grads.push(g);
    }
    let mut server = server;
    let mut pushed = Vec::new();
    server.compress(&sum, &ctx, &mut pushed).unwrap();
    let mut pulled = vec![0f32; n];
    let w = build_as(&kv, n, NodeIdentity::worker(seed, 9, 1));
    w.decompress(&pushed, &ctx, &mut pulled).unwrap();
    for i in 0..n {
        assert_eq!(pulled[i].to_bits(), sum[i].to_bits(), "element {i}");
    }
    // The support itself, not a count of non-zero sums (a gradient element may be ±0, so a
    // summed support element may be zero): the k = 50 indices the compressor selects, which
    // must be the module docs' `Permutation::new(n, Stream::indices(seed, key, round))`.
    let support = randomk_support_k(seed, 9, round, n, 0, "50");
    let p = Permutation::new(n as u64, Stream::indices(seed, 9, round));
    let mut want: Vec<usize> = (0..50).map(|j| p.permute(j) as usize).collect();
    want.sort();
    assert_eq!(support, want, "seed {seed}: the selected indices");
    // On the support, each push scaled by n/k once (on the worker) and summed in rank order;
    // off it, +0.0 exactly.
    let scale = n as f32 / 50.0;
    for i in 0..n {
        let want = if support.binary_search(&i).is_ok() {
            grads.iter().fold(0f32, |acc, g| acc + g[i] * scale)
        } else {
            0.0
        };
        assert_eq!(sum[i].to_bits(), want.to_bits(), "seed {seed}: element {i}");
    }
}

#[test]
fn rounding_noise_differs_between_ranks_and_roles() {
    let seed = seed("rounding_noise_differs_between_ranks_and_roles");
    let mut rng = TestRng::new(seed);
    let n = 512;
    let x = rng.gradient(n, 1.0);
    for kv in [
        vec![("compressor", "minmax"), ("bits", "2")],
        vec![("compressor", "dithering"), ("k", "2")],
        vec![
            ("compressor", "dithering"),
            ("k", "2"),
            ("partition", "natural"),
        ],
        vec![("compressor", "moniqua"), ("theta", "1"), ("bits", "3")],
    ] {
        let payload = |who: NodeIdentity, round: u64| {
            let mut c = build_as(&kv, n, who);
            let mut out = Vec::new();
            c.compress(&x, &RoundCtx::new(round), &mut out).unwrap();
            out
        };
        let base = payload(NodeIdentity::worker(seed, 3, 0), 7);
        assert_eq!(
            base,
            payload(NodeIdentity::worker(seed, 3, 0), 7),
            "{kv:?}: not reproducible"
        );
        assert_ne!(
            base,
            payload(NodeIdentity::worker(seed, 3, 1), 7),
            "{kv:?}: rank 0 and 1 round alike"
        );
        assert_ne!(
            base,
            payload(NodeIdentity::server(seed, 3, 0), 7),
            "{kv:?}: worker and server round alike"
        );
        assert_ne!(
            base,
            payload(NodeIdentity::worker(seed, 3, 0), 8),
            "{kv:?}: rounds round alike"
        );
        assert_ne!(
            base,
            payload(NodeIdentity::worker(seed ^ 1, 3, 0), 7),
            "{kv:?}: seeds round alike"
        );
    }
}

#[test]
fn decompress_add_equals_decompress_then_add() {
    let seed = seed("decompress_add_equals_decompress_then_add");
    let mut rng = TestRng::new(seed);
    for kv in all_configs() {
        for n in [1usize, 33, 1000] {
            let x = rng.gradient(n, 1.0);
            let refv: Vec<f32> = x.iter().map(|v| v + 0.2).collect();
            let mut c = build(&kv, n);
            let cx = ctx(5, &refv);
            let mut out = Vec::new();
            c.compress(&x, &cx, &mut out).unwrap();
            let mut d = vec![0f32; n];
            c.decompress(&out, &cx, &mut d).unwrap();
            // An accumulator with -0.0, +0.0 and ordinary values.
            let acc0: Vec<f32> = (0..n)
                .map(|i| match i % 4 {
                    0 => -0.0,
                    1 => 0.0,
                    _ => rng.normal() as f32,
                })
                .collect();
            let mut acc = acc0.clone();
            c.decompress_add(&out, &cx, &mut acc).unwrap();
            for i in 0..n {
                let want = acc0[i] + d[i];
                assert_eq!(
                    acc[i].to_bits(),
                    want.to_bits(),
                    "{kv:?} n={n} i={i}: {} + {} -> {}",
                    acc0[i],
                    d[i],
                    acc[i]
                );
            }
        }
    }
}

#[test]
fn elias_and_packed_decode_to_the_same_values() {
    proptest!(prop_config("elias_and_packed_decode_to_the_same_values", 96), |(
        x in input(),
        s in prop_oneof![1u32..10, Just(31u32), Just(32u32), Just(300u32)],
        natural in any::<bool>(),
        l2 in any::<bool>(),
        bucket in prop_oneof![Just(None), (1usize..80).prop_map(Some)],
        round in 0u64..100,
    )| {
        let s = if natural { s.min(32) } else { s };
        // The l2 norm of values near 1e30 overflows f32 (a documented error, tested elsewhere).
        prop_assume!(!l2 || x.iter().all(|v| v.abs() < 1e18));
        let ss = s.to_string();
        let bs = bucket.map(|b: usize| b.to_string());
        let mut kv = vec![
            ("compressor", "dithering"),
            ("k", ss.as_str()),
            ("partition", if natural { "natural" } else { "linear" }),
            ("normalize", if l2 { "l2" } else { "max" }),
        ];
        if let Some(b) = &bs {
            kv.push(("bucket", b.as_str()));
        }
        let mut packed = build(&kv, x.len());
        let (_, a) = roundtrip(&mut packed, &x, round);
        for code in ["elias", "elias_omega"] {
            let mut kv = kv.clone();
            kv.push(("encoding", code));
            let mut elias = build(&kv, x.len());
            let (pe, b) = roundtrip(&mut elias, &x, round);
            for i in 0..x.len() {
                // Equal values; a level-0 element may be -0.0 in packed and +0.0 in Elias.
                prop_assert!(a[i] == b[i], "i={}: packed {} {} {}", i, a[i], code, b[i]);
            }
            prop_assert!(pe.len() <= elias.max_compressed_len());
        }
    });
}

#[test]
fn every_compressor_roundtrips_exactly_where_it_should() {
    let seed = seed("every_compressor_roundtrips_exactly_where_it_should");
    let mut rng = TestRng::new(seed);
    let n = 257;
    let x = rng.gradient(n, 1.0);
    for kv in [
        vec![("compressor", "none")],
        vec![("compressor", "topk"), ("k", "128")],
    ] {
        let mut c = build(&kv, n);
        let (_, y) = roundtrip(&mut c, &x, 0);
        let exact = y
            .iter()
            .zip(&x)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        assert!(exact >= 128, "{kv:?}");
    }
    // fp16 / bf16 are within half an ulp of their format for in-range values.
    for (kv, rel) in [("fp16", 2f32.powi(-11)), ("bf16", 2f32.powi(-8))] {
        let mut c = build(&[("compressor", kv)], n);
        let (_, y) = roundtrip(&mut c, &x, 0);
        for (a, b) in x.iter().zip(&y) {
            if a.abs() > 1e-4 && a.abs() < 6e4 {
                assert!((a - b).abs() <= a.abs() * rel, "{kv}: {a} -> {b}");
            }
        }
    }
}
