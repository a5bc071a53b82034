//! The wire formats, byte for byte: every fixed-width compressor against a reference encoder
//! written straight from the spec in the crate docs (with `elem` and `rng`), and every payload
//! size against its documented formula, for lengths 0, 1, 7, 8, 31, 32, 33, 1000, one that is
//! not a multiple of the bucket, and one long enough for the parallel path (which must give the
//! same bytes with 1 and 2 threads).

mod common;

use common::*;
use pushpull_codecs::elem;
use pushpull_codecs::rng::{Permutation, Role, Stream};
use pushpull_codecs::{stream_bytes, NodeIdentity, RoundCtx};

const LENGTHS: &[usize] = &[0, 1, 7, 8, 31, 32, 33, 1000, 1001];

/// Reference payload for the fixed-width formats (None for the CPU-only variable ones).
fn reference(kv: &[(&str, &str)], x: &[f32], who: NodeIdentity, round: u64) -> Option<Vec<u8>> {
    let get = |k: &str| kv.iter().find(|(a, _)| *a == k).map(|(_, v)| *v);
    let n = x.len();
    let bucket = get("bucket").map(|b| b.parse::<usize>().unwrap());
    let u = |i: usize| uniform(who.job_seed, who.key, round, who.role, who.rank, i);
    Some(match get("compressor").unwrap() {
        "none" => f32s(x),
        "fp16" => x
            .iter()
            .flat_map(|&v| elem::f32_to_f16_sat(v).to_le_bytes())
            .collect(),
        "bf16" => x
            .iter()
            .flat_map(|&v| elem::f32_to_bf16_sat(v).to_le_bytes())
            .collect(),
        "onebit" => {
            if get("columns").is_some() {
                return None;
            }
            let scale = if get("scaling") == Some("true") {
                elem::mean_abs(x)
            } else {
                1.0
            };
            let codes: Vec<u32> = x.iter().map(|&v| elem::sign_bit(v)).collect();
            let mut p = scale.to_le_bytes().to_vec();
            p.extend(bit_stream(&codes, 1));
            p
        }
        "minmax" => {
            let bits: u32 = get("bits").map(|b| b.parse().unwrap()).unwrap_or(8);
            let levels = (1u32 << bits) - 1;
            let mut head = Vec::new();
            let mut codes = vec![0u32; n];
            for r in buckets(n, bucket) {
                let (mn, mx) = elem::min_max(&x[r.clone()]);
                let (mn, mx) = (elem::canonical_zero(mn), elem::canonical_zero(mx));
                head.extend(f32s(&[mn, mx]));
                let step = elem::minmax_step(mn, mx, levels);
                for i in r {
                    codes[i] = elem::minmax_code(x[i], mn, step, levels, u(i));
                }
            }
            head.extend(bit_stream(&codes, bits));
            head
        }
        "dithering" => {
            if get("encoding").is_some_and(|e| e.starts_with("elias")) {
                return None;
            }
            let s: u32 = get("k").unwrap().parse().unwrap();
            let natural = matches!(get("partition"), Some("natural") | Some("1"));
            let l2 = matches!(get("normalize"), Some("l2") | Some("1"));
            let w = 1 + (32 - s.leading_zeros());
            let mut head = Vec::new();
            let mut codes = vec![0u32; n];
            for r in buckets(n, bucket) {
                let b = &x[r.clone()];
                let norm = if l2 {
                    elem::l2_norm(b)
                } else {
                    elem::max_abs(b)
                };
                head.extend(f32s(&[norm]));
                for i in r {
                    let level = if natural {
                        elem::dither_natural_level(x[i], norm, s, u(i))
                    } else {
                        elem::dither_linear_level(x[i], norm, s, u(i))
                    };
                    codes[i] = (level << 1) | elem::sign_bit(x[i]);
                }
            }
            head.extend(bit_stream(&codes, w));
            head
        }
        "randomk" => {
            let kf: f64 = get("k").unwrap().parse().unwrap();
            let k = if kf < 1.0 {
                ((kf * n as f64).floor() as usize).max(1).min(n)
            } else {
                kf as usize
            };
            let unbiased = get("unbiased") == Some("true");
            let scale = if unbiased && who.role == Role::Worker {
                n as f32 / k as f32
            } else {
                1.0
            };
            let p = Permutation::new(n as u64, Stream::indices(who.job_seed, who.key, round));
            (0..k as u64)
                .flat_map(|j| (x[p.permute(j) as usize] * scale).to_le_bytes())
                .collect()
        }
        _ => return None,
    })
}

fn fixed_configs() -> Vec<Vec<(&'static str, &'static str)>> {
    let mut v: Vec<Vec<(&str, &str)>> = vec![
        vec![("compressor", "none")],
        vec![("compressor", "fp16")],
        vec![("compressor", "bf16")],
        vec![("compressor", "onebit")],
        vec![("compressor", "onebit"), ("scaling", "true")],
        vec![("compressor", "randomk"), ("k", "0.3")],
        vec![
            ("compressor", "randomk"),
            ("k", "0.3"),
            ("unbiased", "true"),
        ],
    ];
    for bits in ["1", "2", "3", "4", "5", "6", "7", "8"] {
        v.push(vec![("compressor", "minmax"), ("bits", bits)]);
        v.push(vec![
            ("compressor", "minmax"),
            ("bits", bits),
            ("bucket", "64"),
        ]);
    }
    v.push(vec![
        ("compressor", "minmax"),
        ("bits", "5"),
        ("bucket", "7"),
    ]);
    for s in ["1", "2", "3", "7", "8", "15", "31", "32"] {
        for p in ["linear", "natural"] {
            for nrm in ["max", "l2"] {
                v.push(vec![
                    ("compressor", "dithering"),
                    ("k", s),
                    ("partition", p),
                    ("normalize", nrm),
                ]);
            }
        }
    }
    v.push(vec![
        ("compressor", "dithering"),
        ("k", "127"),
        ("bucket", "64"),
    ]);
    v.push(vec![
        ("compressor", "dithering"),
        ("k", "32767"),
        ("normalize", "l2"),
        ("bucket", "100"),
    ]);
    v.push(vec![
        ("compressor", "dithering"),
        ("k", "4"),
        ("partition", "1"),
        ("normalize", "1"),
        ("bucket", "7"),
    ]);
    v
}

#[test]
fn fixed_width_payloads_match_the_reference_encoder() {
    let seed = seed("fixed_width_payloads_match_the_reference_encoder");
    let mut rng = TestRng::new(seed);
    let mut checked = 0;
    for kv in fixed_configs() {
        for &n in LENGTHS {
            let scale = 0.01 + rng.unit();
            let x = rng.gradient(n, scale);
            for who in [
                NodeIdentity::worker(rng.next_u64(), rng.next_u64(), rng.below(8) as u32),
                NodeIdentity::server(rng.next_u64(), rng.next_u64(), rng.below(8) as u32),
            ] {
                let round = rng.below(1000);
                let mut c = build_as(&kv, n, who);
                let mut out = Vec::new();
                c.compress(&x, &RoundCtx::new(round), &mut out).unwrap();
                let want = reference(&kv, &x, who, round).unwrap();
                assert_eq!(out.len(), want.len(), "{kv:?} n={n}: size");
                assert!(
                    out == want,
                    "{kv:?} n={n} {who:?} round {round}: bytes differ"
                );
                assert_eq!(out.len(), c.max_compressed_len(), "{kv:?} n={n}");
                checked += 1;
            }
        }
    }
    assert!(checked > 300);
}

#[test]
fn parallel_path_gives_the_same_bytes() {
    let seed = seed("parallel_path_gives_the_same_bytes");
    let mut rng = TestRng::new(seed);
    let n = 300_001; // above the parallel threshold, not a multiple of anything useful
    let x = rng.gradient(n, 0.3);
    let one = pool(1);
    let two = pool(2);
    let mut configs = vec![
        vec![("compressor", "fp16")],
        vec![("compressor", "bf16")],
        vec![("compressor", "none")],
        vec![("compressor", "onebit"), ("scaling", "true")],
        vec![("compressor", "onebit")],
        vec![("compressor", "minmax"), ("bits", "6")],
        vec![("compressor", "minmax"), ("bits", "8"), ("bucket", "1000")],
        vec![("compressor", "dithering"), ("k", "7"), ("normalize", "l2")],
        vec![
            ("compressor", "dithering"),
            ("k", "6"),
            ("partition", "natural"),
            ("bucket", "512"),
        ],
        vec![
            ("compressor", "randomk"),
            ("k", "0.05"),
            ("unbiased", "true"),
        ],
    ];
    // The CPU-only formats have no reference encoder here, but must not depend on threads.
    configs.push(vec![("compressor", "topk"), ("k", "0.01")]);
    configs.push(vec![
        ("compressor", "dithering"),
        ("k", "2"),
        ("encoding", "elias"),
        ("bucket", "512"),
    ]);
    configs.push(vec![
        ("compressor", "moniqua"),
        ("theta", "1"),
        ("bits", "5"),
    ]);
    // Decorated chains, whose state must not depend on the threads either: onebit forms
    // error feedback's input in its own split pass and subtracts in place; minmax decodes
    // into a buffer under serial error-feedback and momentum passes.
    configs.push(vec![("compressor", "onebit"), ("ef", "vanilla")]);
    configs.push(vec![
        ("compressor", "minmax"),
        ("bits", "4"),
        ("ef", "vanilla"),
        ("momentum", "nesterov"),
    ]);
    let reference_vals: Vec<f32> = x.iter().map(|v| v + 0.25).collect();
    for kv in configs {
        let who = NodeIdentity::worker(seed, 5, 1);
        let round = 3;
        let ctx = ctx(round, &reference_vals);
        let run = |pool: &rayon::ThreadPool| {
            pool.install(|| {
                let mut c = build_as(&kv, n, who);
                let mut out = Vec::new();
                c.compress(&x, &ctx, &mut out).unwrap();
                let mut y = vec![0f32; n];
                c.decompress(&out, &ctx, &mut y).unwrap();
                let mut acc = x.clone();
                c.decompress_add(&out, &ctx, &mut acc).unwrap();
                // A second round from the state the first left.
                let mut second = Vec::new();
                c.compress(&reference_vals, &ctx, &mut second).unwrap();
                let state = c.state();
                let bits = |v: Option<Vec<f32>>| {
                    v.map(|v| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>())
                };
                let state = (bits(state.residual), bits(state.momentum), second);
                (out, y, acc, state)
            })
        };
        let (a, ya, aa, sa) = run(&one);
        let (b, yb, ab, sb) = run(&two);
        assert!(a == b, "{kv:?}: payload depends on the thread count");
        assert!(sa == sb, "{kv:?}: state depends on the thread count");
        assert!(
            ya.iter().zip(&yb).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{kv:?}: decompress"
        );
        assert!(
            aa.iter().zip(&ab).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{kv:?}: decompress_add"
        );
        // The reference encoders know the plain codecs (a decorated chain encodes more than x).
        let plain = !kv.iter().any(|(k, _)| matches!(*k, "ef" | "momentum"));
        if let Some(want) = reference(&kv, &x, who, round).filter(|_| plain) {
            assert!(
                a == want,
                "{kv:?}: parallel bytes differ from the reference encoder"
            );
        }
    }
}

#[test]
fn sizes_follow_the_documented_formulas() {
    let seed = seed("sizes_follow_the_documented_formulas");
    let mut rng = TestRng::new(seed);
    for &n in LENGTHS {
        let x = rng.gradient(n, 1.0);
        let refv: Vec<f32> = x.iter().map(|v| v + 0.1).collect();
        let check = |kv: &[(&str, &str)], expected: usize| {
            let mut c = build(kv, n);
            let mut out = vec![0xAAu8; 3];
            c.compress(&x, &ctx(1, &refv), &mut out).unwrap();
            assert_eq!(out.len(), expected, "{kv:?} n={n}");
            assert_eq!(c.max_compressed_len(), expected, "{kv:?} n={n}: max");
        };
        let nb = |b: usize| n.div_ceil(b);
        check(&[("compressor", "none")], 4 * n);
        check(&[("compressor", "fp16")], 2 * n);
        check(&[("compressor", "bf16")], 2 * n);
        check(&[("compressor", "onebit")], 4 + 4 * n.div_ceil(32));
        check(
            &[("compressor", "onebit"), ("columns", "10"), ("ef", "none")],
            8 * n.min(10) + 4 * n.div_ceil(32),
        );
        for b in 1..=8u32 {
            let bs = b.to_string();
            check(
                &[("compressor", "minmax"), ("bits", &bs)],
                8 * nb(n.max(1)) + stream_bytes(n, b),
            );
            check(
                &[("compressor", "minmax"), ("bits", &bs), ("bucket", "64")],
                8 * nb(64) + stream_bytes(n, b),
            );
            check(
                &[
                    ("compressor", "moniqua"),
                    ("theta", "1"),
                    ("bits", &bs),
                    ("rounding", "nearest"),
                ],
                stream_bytes(n, b),
            );
        }
        for (s, w) in [
            (1u32, 2u32),
            (2, 3),
            (3, 3),
            (4, 4),
            (7, 4),
            (8, 5),
            (32, 7),
            (255, 9),
            (32767, 16),
        ] {
            let ss = s.to_string();
            check(
                &[("compressor", "dithering"), ("k", &ss)],
                4 * nb(n.max(1)) + stream_bytes(n, w),
            );
            check(
                &[("compressor", "dithering"), ("k", &ss), ("bucket", "7")],
                4 * nb(7) + stream_bytes(n, w),
            );
        }
        if n >= 2 {
            let k = (n / 2).to_string();
            check(&[("compressor", "topk"), ("k", &k)], 8 * (n / 2));
            check(
                &[("compressor", "topk"), ("k", "0.1")],
                8 * ((n as f64 * 0.1).floor() as usize).max(1),
            );
        }
        check(
            &[("compressor", "randomk"), ("k", "0.1")],
            4 * if n == 0 {
                0
            } else {
                ((n as f64 * 0.1).floor() as usize).max(1)
            },
        );
        // Elias: variable, within the documented maximum, header consistent with the body.
        let omega_len = |mut v: u32| {
            let mut bits = 1;
            while v > 1 {
                let n = 31 - v.leading_zeros();
                bits += n + 1;
                v = n;
            }
            bits
        };
        let cases = [(1u32, None), (3, Some(7usize)), (200, Some(64))];
        for ((s, b), code) in cases
            .into_iter()
            .flat_map(|c| [(c, "elias"), (c, "elias_omega")])
        {
            let ss = s.to_string();
            let bs = b.map(|v| v.to_string());
            let mut kv = vec![
                ("compressor", "dithering"),
                ("k", ss.as_str()),
                ("encoding", code),
            ];
            if let Some(bs) = &bs {
                kv.push(("bucket", bs.as_str()));
            }
            let mut c = build(&kv, n);
            let mut out = Vec::new();
            c.compress(&x, &RoundCtx::new(2), &mut out).unwrap();
            let nbk = b.map(|v| n.div_ceil(v)).unwrap_or(usize::from(n > 0));
            let per_element = match code {
                "elias" => 3 + 2 * (31 - s.leading_zeros()),
                _ => 2 + (1..=s).map(omega_len).max().unwrap(),
            };
            let max = 4 + 4 * nbk + stream_bytes(n, per_element);
            assert_eq!(c.max_compressed_len(), max);
            assert!(out.len() <= max && out.len() >= 4 + 4 * nbk && out.len() % 4 == 0);
            let m = u32::from_le_bytes(out[..4].try_into().unwrap()) as usize;
            assert!(m <= n);
        }
    }
}

#[test]
fn fp16_and_bf16_saturate() {
    let x = [1e9f32, -1e9, 70000.0, -65519.0, f32::MAX, -f32::MAX, 1.0];
    let mut c = build(&[("compressor", "fp16")], x.len());
    let mut out = Vec::new();
    c.compress(&x, &RoundCtx::new(0), &mut out).unwrap();
    let mut y = [0f32; 7];
    c.decompress(&out, &RoundCtx::new(0), &mut y).unwrap();
    assert_eq!(
        y,
        [65504.0, -65504.0, 65504.0, -65504.0, 65504.0, -65504.0, 1.0]
    );
    let mut c = build(&[("compressor", "bf16")], x.len());
    c.compress(&x, &RoundCtx::new(0), &mut out).unwrap();
    c.decompress(&out, &RoundCtx::new(0), &mut y).unwrap();
    assert!(y.iter().all(|v| v.is_finite()));
    assert_eq!(y[4], 3.389_531_4e38);
}
