//! Moniqua (Lemma 2): with `|x - y| < θ` the receiver recovers `x̂` with
//! `|x̂ - x| <= δ·B_θ` (plus the final f32 rounding of `x̂`), also when `|x|` is far larger than
//! `B_θ`; `δ = 2^-(b+1)` for nearest and `2^-b` for stochastic rounding.

mod common;

use common::*;
use proptest::prelude::*;
use pushpull_codecs::{build_compressor, KernelError, NodeIdentity, RoundCtx};

/// The message refusing a moniqua map (θ = 1) with `extra` keys.
fn refusal(extra: &[(&str, &str)]) -> String {
    let mut kv = vec![("compressor", "moniqua"), ("theta", "1")];
    kv.extend_from_slice(extra);
    pushpull_codecs::parse_params(&map(&kv))
        .unwrap_err()
        .to_string()
}

fn delta(bits: u32, nearest: bool) -> f64 {
    if nearest {
        0.5f64.powi(bits as i32 + 1)
    } else {
        0.5f64.powi(bits as i32)
    }
}

#[test]
fn recovery_error_is_within_delta_b_theta() {
    let strat = (
        1u32..=8,
        any::<bool>(),
        prop_oneof![Just(1e-3f64), Just(0.05), Just(0.5), Just(3.0), Just(100.0)],
        prop_oneof![Just(0.0f64), Just(1.0), Just(1e3), Just(1e5), Just(-7.5e4)],
        0u64..50,
        1usize..300,
    );
    proptest!(prop_config("recovery_error_is_within_delta_b_theta", 160), |((bits, nearest, theta, offset, round, n) in strat)| {
        prop_assume!(delta(bits, nearest) < 0.5);
        let b_theta = 2.0 * theta / (1.0 - 2.0 * delta(bits, nearest));
        let bound = delta(bits, nearest) * b_theta;
        let mut rng = TestRng::new(round ^ ((n as u64) << 20) ^ (bits as u64));
        // x far from 0 in units of B_theta (offset / B_theta up to ~1e8), y within theta of x.
        let x: Vec<f32> = (0..n).map(|_| (offset * (1.0 + rng.unit()) + rng.normal() * theta * 10.0) as f32).collect();
        let y: Vec<f32> = x
            .iter()
            .map(|&v| {
                let d = (rng.unit() * 2.0 - 1.0) * theta * 0.999;
                let mut y = (v as f64 + d) as f32;
                // Keep |x - y| < theta after the f32 rounding of y.
                if (y as f64 - v as f64).abs() >= theta {
                    y = v;
                }
                y
            })
            .collect();
        let ts = theta.to_string();
        let bs = bits.to_string();
        let kv = [("compressor", "moniqua"), ("theta", ts.as_str()), ("bits", bs.as_str()), ("rounding", if nearest { "nearest" } else { "stochastic" })];
        let mut c = build(&kv, n);
        let mut out = Vec::new();
        c.compress(&x, &RoundCtx::new(round), &mut out).unwrap();
        let mut xh = vec![0f32; n];
        c.decompress(&out, &RoundCtx::new(round).with_reference(&y), &mut xh).unwrap();
        for i in 0..n {
            let err = (xh[i] as f64 - x[i] as f64).abs();
            let tol = bound * (1.0 + 1e-9) + (x[i].abs() as f64 + b_theta) * 2f64.powi(-24);
            prop_assert!(err <= tol, "x={} y={} -> {} (err {} > {}), B={}", x[i], y[i], xh[i], err, tol, b_theta);
        }
        // The receiver's reference is required.
        let e = c.decompress(&out, &RoundCtx::new(round), &mut xh).unwrap_err();
        prop_assert!(matches!(e, KernelError::Context { .. }), "{}", e);
        // With the hash: the same codes and 8 bytes more, and no false alarm within theta.
        let kv_hash = [kv[0], kv[1], kv[2], kv[3], ("hash", "true")];
        let mut ch = build(&kv_hash, n);
        let mut hashed = Vec::new();
        ch.compress(&x, &RoundCtx::new(round), &mut hashed).unwrap();
        prop_assert_eq!(&hashed[..out.len()], &out[..]);
        prop_assert_eq!(hashed.len(), out.len() + 8);
        let mut xh2 = vec![0f32; n];
        ch.decompress(&hashed, &RoundCtx::new(round).with_reference(&y), &mut xh2).unwrap();
        prop_assert!(xh2.iter().zip(&xh).all(|(a, b)| a.to_bits() == b.to_bits()));
    });
}

#[test]
fn the_hash_check_names_a_reference_beyond_theta() {
    let mut rng = TestRng::new(seed("the_hash_check_names_a_reference_beyond_theta"));
    let n = 700;
    let theta = 0.1;
    let x: Vec<f32> = (0..n).map(|_| (rng.normal() * 10.0) as f32).collect();
    let kv = [
        ("compressor", "moniqua"),
        ("theta", "0.1"),
        ("bits", "3"),
        ("hash", "true"),
    ];
    let mut c = build(&kv, n);
    let mut out = Vec::new();
    c.compress(&x, &RoundCtx::new(1), &mut out).unwrap();
    let mut xh = vec![0f32; n];
    // Within theta everywhere: recovered, checked.
    let near: Vec<f32> = x.iter().map(|&v| v + (theta * 0.5) as f32).collect();
    c.decompress(&out, &RoundCtx::new(1).with_reference(&near), &mut xh)
        .unwrap();
    // One element (of 700, anywhere) a whole B_theta off: it wraps, and the hash says so.
    for at in [0, 351, n - 1] {
        let mut far = near.clone();
        far[at] += (4.0 * theta) as f32;
        let e = c
            .decompress(&out, &RoundCtx::new(1).with_reference(&far), &mut xh)
            .unwrap_err();
        assert!(e.to_string().contains("hash check failed"), "{e}");
        assert!(e.to_string().contains("more than theta"), "{e}");
    }
    // A corrupted hash is caught the same way (the codes alone are fine).
    let mut bad = out.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(c
        .decompress(&bad, &RoundCtx::new(1).with_reference(&near), &mut xh)
        .is_err());
    // Without the hash the same far reference decodes silently to wrong values.
    let mut plain = build(&kv[..3], n);
    let mut p = Vec::new();
    plain.compress(&x, &RoundCtx::new(1), &mut p).unwrap();
    let mut far = near.clone();
    far[351] += (4.0 * theta) as f32;
    plain
        .decompress(&p, &RoundCtx::new(1).with_reference(&far), &mut xh)
        .unwrap();
    assert!(
        (xh[351] - x[351]).abs() > theta as f32,
        "{} vs {}",
        xh[351],
        x[351]
    );
    // `hash` takes true or false.
    let e = refusal(&[("hash", "yes")]);
    assert!(e.contains("\"hash\" = \"yes\""), "{e}");
}

#[test]
fn moniqua_is_refused_for_gradients_and_delta_must_stay_below_half() {
    let who = NodeIdentity::worker(1, 2, 0);
    let e = build_compressor(&map(&[("compressor", "moniqua"), ("theta", "1")]), 10, &who)
        .err()
        .unwrap();
    assert!(matches!(e, KernelError::Refused { .. }), "{e}");
    assert!(e.to_string().contains("gradients"), "{e}");
    // One bit with stochastic rounding: delta = 1/2.
    let e = refusal(&[("bits", "1")]);
    assert!(e.contains("\"bits\" = \"1\""), "{e}");
    assert!(e.contains("delta"), "{e}");
    // With nearest rounding it is fine (delta = 1/4).
    pushpull_codecs::parse_params(&map(&[
        ("compressor", "moniqua"),
        ("theta", "1"),
        ("bits", "1"),
        ("rounding", "nearest"),
    ]))
    .unwrap();
}

#[test]
fn theta_schedule_lr_scales_theta_by_the_rounds_learning_rate() {
    // theta = 0.5 per unit of learning rate: at lr 0.02 the bound is theta 0.01, so values
    // within 0.01 of the reference are recovered within delta * B_theta(0.01), and a fixed
    // theta of 0.5 would be 50 times coarser.
    let mut rng = TestRng::new(seed(
        "theta_schedule_lr_scales_theta_by_the_rounds_learning_rate",
    ));
    let n = 1000;
    let (c, lr, bits) = (0.5f64, 0.02f32, 4u32);
    let theta = c * lr as f64;
    let x: Vec<f32> = (0..n).map(|_| (3.0 + rng.normal()) as f32).collect();
    let y: Vec<f32> = x
        .iter()
        .map(|&v| (v as f64 + (rng.unit() * 2.0 - 1.0) * theta * 0.9) as f32)
        .collect();
    let kv = [
        ("compressor", "moniqua"),
        ("theta", "0.5"),
        ("bits", "4"),
        ("theta_schedule", "lr"),
    ];
    let mut codec = build(&kv, n);
    let ctx = RoundCtx::new(7).with_lr(lr);
    let mut out = Vec::new();
    codec.compress(&x, &ctx, &mut out).unwrap();
    let mut xh = vec![0f32; n];
    codec
        .decompress(&out, &ctx.with_reference(&y), &mut xh)
        .unwrap();
    let b_theta = 2.0 * theta / (1.0 - 2.0 * delta(bits, false));
    let bound = delta(bits, false) * b_theta;
    let worst = x
        .iter()
        .zip(&xh)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0, f64::max);
    assert!(
        worst <= bound * (1.0 + 1e-6) + 4.0 * 2f64.powi(-22),
        "{worst} > {bound}"
    );
    // The fixed schedule with the same map would be 50x coarser: its error is larger.
    let mut fixed = build(&kv[..3], n);
    let mut coarse = Vec::new();
    fixed.compress(&x, &RoundCtx::new(7), &mut coarse).unwrap();
    fixed
        .decompress(&coarse, &RoundCtx::new(7).with_reference(&y), &mut xh)
        .unwrap();
    let worst_fixed = x
        .iter()
        .zip(&xh)
        .map(|(a, b)| (*a as f64 - *b as f64).abs())
        .fold(0.0, f64::max);
    assert!(worst_fixed > 10.0 * worst, "{worst_fixed} vs {worst}");
    // A round without a learning rate is refused, naming the key, both ways; the refused
    // round leaves no payload.
    let sent = out.clone();
    let e = codec.compress(&x, &RoundCtx::new(8), &mut out).unwrap_err();
    assert!(e.to_string().contains("theta_schedule = lr"), "{e}");
    assert!(out.is_empty());
    let e = codec
        .decompress(&sent, &RoundCtx::new(8).with_reference(&y), &mut xh)
        .unwrap_err();
    assert!(e.to_string().contains("learning rate"), "{e}");
    // An unknown schedule names the key and what is allowed.
    let e = refusal(&[("theta_schedule", "cosine")]);
    assert!(e.contains("\"theta_schedule\" = \"cosine\""), "{e}");
    assert!(e.contains("fixed, lr or bound"), "{e}");
}

#[test]
fn theta_schedule_bound_sends_each_senders_b_theta() {
    // θ = theta · RoundCtx::theta_bound (the worker's Theorem 2 bound, different on every
    // worker): the message carries the sender's B_θ, and a receiver recovers with it, whatever
    // its own bound, within δ·B_θ of the sender's values.
    let mut rng = TestRng::new(seed("theta_schedule_bound_sends_each_senders_b_theta"));
    let n = 1000;
    let bits = 4u32;
    let kv = [
        ("compressor", "moniqua"),
        ("theta", "0.5"),
        ("bits", "4"),
        ("theta_schedule", "bound"),
    ];
    let mut sender = build(&kv, n);
    let receiver = build(&kv, n);
    let mut plain = build(&kv[..3], n);
    let bound = 0.04f64;
    let theta = 0.5 * bound;
    let x: Vec<f32> = (0..n).map(|_| (3.0 + rng.normal()) as f32).collect();
    let y: Vec<f32> = x
        .iter()
        .map(|&v| (v as f64 + (rng.unit() * 2.0 - 1.0) * theta * 0.9) as f32)
        .collect();
    let ctx = RoundCtx {
        theta_bound: Some(bound),
        ..RoundCtx::new(3)
    };
    let (mut out, mut fixed) = (Vec::new(), Vec::new());
    sender.compress(&x, &ctx, &mut out).unwrap();
    plain.compress(&x, &ctx, &mut fixed).unwrap();
    assert_eq!(out.len(), fixed.len() + 8, "the codes and B_theta");
    let b_theta = 2.0 * 0.5 * bound / (1.0 - 2.0 * delta(bits, false));
    let sent = f64::from_le_bytes(out[out.len() - 8..].try_into().unwrap());
    assert!(
        (sent - b_theta).abs() <= 1e-15 * b_theta,
        "the payload's B_theta {sent}"
    );
    // The receiver's own bound is another (or none): it decodes with the sender's.
    for theirs in [None, Some(5.0 * bound)] {
        let at = RoundCtx {
            theta_bound: theirs,
            ..RoundCtx::new(3)
        };
        let mut xh = vec![0f32; n];
        receiver
            .decompress(&out, &at.with_reference(&y), &mut xh)
            .unwrap();
        let worst = x
            .iter()
            .zip(&xh)
            .map(|(a, b)| (*a as f64 - *b as f64).abs())
            .fold(0.0, f64::max);
        let limit = delta(bits, false) * b_theta;
        assert!(
            worst <= limit * (1.0 + 1e-6) + 4.0 * 2f64.powi(-22),
            "{worst} > {limit}"
        );
    }
    // Encoding without a bound names what is missing; a B_theta that is not a finite number
    // > 0 in a payload is refused as malformed.
    let e = sender
        .compress(&x, &RoundCtx::new(4), &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("track_gradient"), "{e}");
    let mut xh = vec![0f32; n];
    sender.compress(&x, &ctx, &mut out).unwrap();
    for bad in [f64::NAN, 0.0, -1.0, f64::INFINITY] {
        let k = out.len() - 8;
        out[k..].copy_from_slice(&bad.to_le_bytes());
        let e = receiver
            .decompress(&out, &RoundCtx::new(3).with_reference(&y), &mut xh)
            .unwrap_err();
        assert!(e.to_string().contains("B_theta"), "{bad}: {e}");
    }
}
