//! No panics on bad input: garbage, truncated and bit-flipped payloads, wrong lengths,
//! non-finite values and overflowing statistics. Errors name the problem, and a decompress
//! that fails leaves the output or accumulator untouched (every check happens before writing).

mod common;

use common::*;
use proptest::prelude::*;
use pushpull_codecs::{KernelError, RoundCtx};

fn configs() -> Vec<Vec<(&'static str, &'static str)>> {
    let mut v = all_configs();
    for kv in all_configs() {
        let mut e = kv.clone();
        e.push(("ef", "vanilla"));
        v.push(e);
    }
    v
}

#[test]
fn garbage_payloads_never_panic_and_never_half_write() {
    let strat = (
        0usize..configs().len(),
        prop_oneof![Just(0usize), Just(1), Just(33), 2usize..200],
        any::<u64>(),
        0u8..4,
    );
    proptest!(prop_config("garbage_payloads_never_panic_and_never_half_write", 1500), |((ci, n, s, how) in strat)| {
        let kv = &configs()[ci];
        let mut rng = TestRng::new(s);
        let c = try_build(kv, n);
        prop_assume!(c.is_some());
        let mut c = c.unwrap();
        let x = rng.gradient(n, 1.0);
        let refv: Vec<f32> = x.iter().map(|v| v + 0.1).collect();
        let cx = ctx(3, &refv);
        let mut good = Vec::new();
        c.compress(&x, &cx, &mut good).unwrap();
        let payload: Vec<u8> = match how {
            // Random bytes of the right length (or around it).
            0 => {
                let len = (good.len() as i64 + rng.below(9) as i64 - 4).max(0) as usize;
                (0..len).map(|_| rng.next_u64() as u8).collect()
            }
            // Truncated or extended.
            1 => {
                let mut p = good.clone();
                if !p.is_empty() && rng.below(2) == 0 {
                    p.truncate(rng.below(p.len() as u64) as usize);
                } else {
                    p.extend((0..1 + rng.below(8)).map(|_| rng.next_u64() as u8));
                }
                p
            }
            // A few flipped bits.
            2 => {
                let mut p = good.clone();
                for _ in 0..1 + rng.below(4) {
                    if !p.is_empty() {
                        let i = rng.below(p.len() as u64) as usize;
                        p[i] ^= 1 << rng.below(8);
                    }
                }
                p
            }
            // Completely random length.
            _ => (0..rng.below(300)).map(|_| rng.next_u64() as u8).collect(),
        };
        let sentinel: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
        let mut out = sentinel.clone();
        let r = c.decompress(&payload, &cx, &mut out);
        if r.is_err() {
            prop_assert!(out.iter().zip(&sentinel).all(|(a, b)| a.to_bits() == b.to_bits()), "{:?}: failed decompress wrote", kv);
        }
        let mut acc = sentinel.clone();
        let r2 = c.decompress_add(&payload, &cx, &mut acc);
        prop_assert_eq!(r.is_ok(), r2.is_ok());
        if let Err(e) = r2 {
            prop_assert!(acc.iter().zip(&sentinel).all(|(a, b)| a.to_bits() == b.to_bits()), "{:?}: failed decompress_add wrote", kv);
            prop_assert!(!e.to_string().is_empty());
            if let KernelError::PayloadLength { actual, .. } = e {
                prop_assert_eq!(actual, payload.len());
            }
        }
        // A payload of the wrong length is always refused for fixed-size formats.
        if how == 1 && payload.len() != good.len() && !kv.iter().any(|&(k, v)| k == "encoding" && v.starts_with("elias")) {
            prop_assert!(r.is_err(), "{:?}: accepted {} bytes instead of {}", kv, payload.len(), good.len());
        }
    });
}

#[test]
fn non_finite_input_is_refused_with_its_index_and_state_is_kept() {
    let seed = seed("non_finite_input_is_refused_with_its_index_and_state_is_kept");
    let mut rng = TestRng::new(seed);
    for kv in configs() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let n = 1 + rng.below(300) as usize;
            let mut c = build(&kv, n);
            let mut x = rng.gradient(n, 1.0);
            let refv: Vec<f32> = x.iter().map(|v| v + 0.1).collect();
            // One good round first, so error feedback has a state to keep.
            let mut out = Vec::new();
            c.compress(&x, &ctx(0, &refv), &mut out).unwrap();
            let state = c.residual().map(|r| r.to_vec());
            let i = rng.below(n as u64) as usize;
            x[i] = bad;
            if i + 1 < n {
                x[n - 1] = f32::NAN; // only the first one is reported
            }
            let e = c.compress(&x, &ctx(1, &refv), &mut out).unwrap_err();
            match &e {
                KernelError::NonFinite { index, .. } => assert_eq!(*index, i, "{kv:?}: {e}"),
                other => panic!("{kv:?}: {other}"),
            }
            assert!(e.to_string().contains(&format!("element {i}")), "{e}");
            assert_eq!(
                state.as_deref(),
                c.residual(),
                "{kv:?}: residual changed by a failed round"
            );
        }
    }
}

#[test]
fn length_mismatches_name_both_lengths() {
    for kv in configs() {
        let n = 40;
        let mut c = build(&kv, n);
        let x = vec![1.0f32; n + 1];
        let e = c
            .compress(&x, &RoundCtx::new(0), &mut Vec::new())
            .unwrap_err();
        assert!(
            matches!(
                e,
                KernelError::LengthMismatch {
                    expected: 40,
                    actual: 41,
                    ..
                }
            ),
            "{kv:?}: {e}"
        );
        assert!(e.to_string().contains("41") && e.to_string().contains("40"));
        let refv = vec![0.5f32; n];
        let mut good = Vec::new();
        c.compress(&refv, &ctx(0, &refv), &mut good).unwrap();
        let mut y = vec![0f32; n - 1];
        for add in [false, true] {
            let e = if add {
                c.decompress_add(&good, &ctx(0, &refv), &mut y)
            } else {
                c.decompress(&good, &ctx(0, &refv), &mut y)
            }
            .unwrap_err();
            assert!(
                matches!(
                    e,
                    KernelError::LengthMismatch {
                        expected: 40,
                        actual: 39,
                        ..
                    }
                ),
                "{kv:?} (add: {add}): {e}"
            );
        }
    }
    // Moniqua's reference must have the chunk length too.
    let c = build(&[("compressor", "moniqua"), ("theta", "1")], 10);
    let e = c
        .decompress(&[0u8; 12], &ctx(0, &[0.0; 9]), &mut [0f32; 10])
        .unwrap_err();
    assert!(e.to_string().contains("reference"), "{e}");
}

#[test]
fn overflowing_statistics_are_errors_not_infinities() {
    let big = vec![3.0e38f32; 512];
    let e = build(&[("compressor", "onebit"), ("scaling", "true")], 512)
        .compress(&big, &RoundCtx::new(0), &mut Vec::new())
        .unwrap_err();
    assert!(matches!(e, KernelError::Overflow { .. }), "{e}");
    let x = [f32::MAX, -f32::MAX, 0.0];
    let e = build(&[("compressor", "minmax")], 3)
        .compress(&x, &RoundCtx::new(0), &mut Vec::new())
        .unwrap_err();
    assert!(
        matches!(e, KernelError::Overflow { .. }) && e.to_string().contains("max - min"),
        "{e}"
    );
    let x = [1e20f32, 1.0];
    let e = build(
        &[("compressor", "dithering"), ("k", "3"), ("normalize", "l2")],
        2,
    )
    .compress(&x, &RoundCtx::new(0), &mut Vec::new())
    .unwrap_err();
    assert!(matches!(e, KernelError::Overflow { .. }), "{e}");
    // Error feedback: g + e overflowing is refused, the residual kept.
    let mut c = build(&[("compressor", "topk"), ("k", "1"), ("ef", "vanilla")], 2);
    c.compress(&[3e38, 3e38], &RoundCtx::new(0), &mut Vec::new())
        .unwrap();
    let before = c.residual().unwrap().to_vec();
    let e = c
        .compress(&[1.0, 3e38], &RoundCtx::new(1), &mut Vec::new())
        .unwrap_err();
    assert!(matches!(e, KernelError::Overflow { .. }), "{e}");
    assert_eq!(before, c.residual().unwrap());
}
