//! The chain's properties over fresh random inputs (seeds printed; replay with
//! PUSHPULL_TEST_SEED): error feedback's and Nesterov momentum's formulas and invariants for
//! every compressor, the passes onebit fuses with them, and what a refused round leaves.

mod common;

use common::*;
use pushpull_codecs::{NodeIdentity, RoundCtx};

/// Error feedback over many rounds, for every compressor: the payload is the plain codec's
/// of `p = fl(g + e_prev)` (whether the codec forms `p` itself, as onebit does, or not),
/// `e == fl(p - D(C(p)))` bit for bit, and `sum g - sum D(C(p)) == e` in f64 within the
/// accumulated rounding.
#[test]
fn error_feedback_invariants_for_every_compressor() {
    let seed = seed("error_feedback_invariants_for_every_compressor");
    let mut rng = TestRng::new(seed);
    let n = 200;
    for kv in all_configs() {
        let mut plain = build(&kv, n);
        let mut kv = kv;
        kv.push(("ef", "vanilla"));
        let mut c = build(&kv, n);
        assert!(c.name().starts_with("ef(vanilla, "), "{}", c.name());
        let mut e_prev = vec![0f32; n];
        let mut sum_g = vec![0f64; n];
        let mut sum_d = vec![0f64; n];
        let mut slack = vec![0f64; n];
        for round in 0..40u64 {
            let scale = 0.5 + rng.unit();
            let g = rng.gradient(n, scale);
            let p: Vec<f32> = g.iter().zip(&e_prev).map(|(a, b)| a + b).collect();
            // Moniqua decodes against a reference within theta of p.
            let refv: Vec<f32> = p.iter().map(|v| v + 0.1).collect();
            let cx = ctx(round, &refv);
            let mut out = Vec::new();
            c.compress(&g, &cx, &mut out).unwrap();
            let mut want_out = Vec::new();
            plain.compress(&p, &cx, &mut want_out).unwrap();
            assert!(
                out == want_out,
                "{kv:?} round {round}: the payload is not C(p)"
            );
            let mut d = vec![0f32; n];
            c.decompress(&out, &cx, &mut d).unwrap();
            let e = c.residual().expect("ef has a residual").to_vec();
            for i in 0..n {
                let want = p[i] - d[i];
                assert_eq!(e[i].to_bits(), want.to_bits(), "{kv:?} round {round} i={i}");
                sum_g[i] += g[i] as f64;
                sum_d[i] += d[i] as f64;
                slack[i] +=
                    (p[i].abs() as f64 + e[i].abs() as f64 + d[i].abs() as f64) * 2f64.powi(-23);
            }
            e_prev = e;
        }
        for i in 0..n {
            let lhs = sum_g[i] - sum_d[i];
            assert!(
                (lhs - e_prev[i] as f64).abs() <= slack[i] + 1e-30,
                "{kv:?} i={i}: sum g - sum D(C(p)) = {lhs}, e = {}, slack {}",
                e_prev[i],
                slack[i]
            );
        }
    }
}

/// Nesterov momentum before error feedback takes one pass with error feedback's for every
/// compressor (the chain's fused pass): each round's payload is the plain codec's of
/// `p = g + μ·m' + e` with `m' = μ·m + g` computed here, the residual is `p - D(C(p))` and the
/// momentum `m'`; a round with a non-finite gradient element is refused naming it, with the
/// state unchanged.
#[test]
fn momentum_and_error_feedback_agree_with_their_formulas_for_every_compressor() {
    let seed = seed("momentum_and_error_feedback_agree_with_their_formulas_for_every_compressor");
    let mut rng = TestRng::new(seed);
    let n = 300;
    let mu = 0.9f32;
    for kv in all_configs() {
        let mut plain = build(&kv, n);
        let mut kv = kv;
        kv.extend([("ef", "vanilla"), ("momentum", "nesterov"), ("mu", "0.9")]);
        let mut c = build(&kv, n);
        let (mut e, mut m) = (vec![0f32; n], vec![0f32; n]);
        for round in 0..6u64 {
            let scale = 0.5 + rng.unit();
            let g = rng.gradient(n, scale);
            let next: Vec<f32> = g.iter().zip(&m).map(|(g, m)| mu * m + g).collect();
            let p: Vec<f32> = (0..n).map(|i| (g[i] + mu * next[i]) + e[i]).collect();
            // Moniqua decodes against a reference within theta of p.
            let refv: Vec<f32> = p.iter().map(|v| v + 0.1).collect();
            let cx = ctx(round, &refv);
            let (mut out, mut want) = (Vec::new(), Vec::new());
            c.compress(&g, &cx, &mut out).unwrap();
            plain.compress(&p, &cx, &mut want).unwrap();
            assert!(out == want, "{kv:?} round {round}: the payload is not C(p)");
            let mut d = vec![0f32; n];
            c.decompress(&out, &cx, &mut d).unwrap();
            let (got_e, got_m) = (c.residual().unwrap(), c.momentum().unwrap());
            for i in 0..n {
                let want_e = p[i] - d[i];
                assert_eq!(
                    got_e[i].to_bits(),
                    want_e.to_bits(),
                    "{kv:?} {round} e[{i}]"
                );
                assert_eq!(
                    got_m[i].to_bits(),
                    next[i].to_bits(),
                    "{kv:?} {round} m[{i}]"
                );
            }
            (e, m) = (got_e.to_vec(), next);
        }
        let mut g = rng.gradient(n, 1.0);
        let at = rng.below(n as u64) as usize;
        g[at] = f32::NAN;
        let mut out = vec![1u8; 3];
        let err = c
            .compress(&g, &ctx(9, &e), &mut out)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("element {at}")), "{kv:?}: {err}");
        assert!(out.is_empty(), "{kv:?}: a refused round leaves no payload");
        assert!(
            c.residual().unwrap() == e && c.momentum().unwrap() == m,
            "{kv:?}"
        );
    }
}

/// A decorated chain's refused round leaves no payload, whichever pass refuses it: a wrong
/// length, a missing learning rate (corrected error feedback refuses it before any pass), a
/// non-finite gradient (momentum's pass, or error feedback's fused one).
#[test]
fn refused_rounds_leave_no_payload_whichever_pass_refuses() {
    let seed = seed("refused_rounds_leave_no_payload_whichever_pass_refuses");
    let mut rng = TestRng::new(seed);
    let n = 100;
    for (codec, ef, momentum) in [
        ("onebit", "corrected", true),
        ("onebit", "vanilla", true),
        ("onebit", "corrected", false),
        ("topk", "corrected", true),
        ("topk", "vanilla", false),
    ] {
        let mut kv = vec![("compressor", codec), ("ef", ef)];
        if codec == "topk" {
            kv.push(("k", "0.1"));
        }
        if momentum {
            kv.push(("momentum", "nesterov"));
        }
        let mut c = build(&kv, n);
        let g = rng.gradient(n, 1.0);
        c.compress(&g, &RoundCtx::new(0).with_lr(0.1), &mut Vec::new())
            .unwrap();
        let mut bad = rng.gradient(n, 1.0);
        bad[rng.below(n as u64) as usize] = f32::NAN;
        let cases = [
            (
                "a short input",
                g[1..].to_vec(),
                RoundCtx::new(1).with_lr(0.1),
            ),
            ("a NaN", bad.clone(), RoundCtx::new(1).with_lr(0.1)),
            ("a NaN, no learning rate", bad, RoundCtx::new(1)),
        ];
        for (what, input, cx) in cases {
            let mut out = vec![1u8; 3];
            let err = c.compress(&input, &cx, &mut out);
            assert!(err.is_err(), "{kv:?}, {what}: accepted");
            assert!(out.is_empty(), "{kv:?}, {what}: {err:?} left {out:?}");
        }
    }
}

#[test]
fn corrected_error_feedback_scales_the_residual_by_the_lr_ratio() {
    let seed = seed("corrected_error_feedback_scales_the_residual_by_the_lr_ratio");
    let mut rng = TestRng::new(seed);
    let n = 100;
    let mut c = build(
        &[("compressor", "topk"), ("k", "10"), ("ef", "corrected")],
        n,
    );
    let mut e_prev = vec![0f32; n];
    let mut lr_prev: Option<f32> = None;
    for round in 0..20u64 {
        let lr = 0.1 / (1.0 + round as f32);
        let g = rng.gradient(n, 1.0);
        let f = lr_prev.map(|p| p / lr).unwrap_or(1.0);
        let p: Vec<f32> = g.iter().zip(&e_prev).map(|(a, b)| a + f * b).collect();
        let cx = RoundCtx::new(round).with_lr(lr);
        let mut out = Vec::new();
        c.compress(&g, &cx, &mut out).unwrap();
        let mut d = vec![0f32; n];
        c.decompress(&out, &cx, &mut d).unwrap();
        let e = c.residual().unwrap().to_vec();
        for i in 0..n {
            assert_eq!(
                e[i].to_bits(),
                (p[i] - d[i]).to_bits(),
                "round {round} i={i}"
            );
        }
        e_prev = e;
        lr_prev = Some(lr);
    }
    // Without a learning rate: a named error, state unchanged.
    let before = c.residual().unwrap().to_vec();
    let err = c
        .compress(&vec![1.0; n], &RoundCtx::new(99), &mut Vec::new())
        .unwrap_err();
    assert!(err.to_string().contains("learning rate"), "{err}");
    assert_eq!(before, c.residual().unwrap());
}

/// onebit forms error feedback's `p` while it encodes (its `EncodeFed` fast path), and Nesterov
/// momentum's step before it: at a length that goes
/// parallel, on one thread and two, vanilla and corrected, with and without momentum, the
/// payload is the plain codec's of `p` computed here, the residual `p - D(C(p))` and the
/// momentum `μ·m + g`; a round whose `p` overflows is refused, with the state unchanged.
#[test]
fn onebit_forms_the_error_feedback_input_as_it_encodes() {
    let seed = seed("onebit_forms_the_error_feedback_input_as_it_encodes");
    let mut rng = TestRng::new(seed);
    let n = 300_001;
    let mu = 0.9f32;
    for (ef, momentum) in [
        ("vanilla", false),
        ("corrected", false),
        ("vanilla", true),
        ("corrected", true),
    ] {
        for threads in [1, 2] {
            let what = format!("{ef}, momentum {momentum}, {threads} threads");
            pool(threads).install(|| {
                let kv = [("compressor", "onebit"), ("scaling", "true")];
                let mut plain = build(&kv, n);
                let mut chain = vec![kv[0], kv[1], ("ef", ef)];
                if momentum {
                    chain.extend([("momentum", "nesterov"), ("mu", "0.9")]);
                }
                let mut c = build(&chain, n);
                let mut e_prev = vec![0f32; n];
                let mut m_prev = vec![0f32; n];
                let mut lr_prev: Option<f32> = None;
                for round in 0..4u64 {
                    let lr = 0.1 / (1.0 + round as f32);
                    let f = match ef {
                        "vanilla" => 1.0,
                        _ => lr_prev.map(|p| p / lr).unwrap_or(1.0),
                    };
                    let g = rng.gradient(n, 1.0);
                    // Momentum's output (or the gradient), then error feedback's input.
                    let m: Vec<f32> = g.iter().zip(&m_prev).map(|(g, m)| mu * m + g).collect();
                    let x: Vec<f32> = match momentum {
                        true => g.iter().zip(&m).map(|(g, m)| g + mu * m).collect(),
                        false => g.clone(),
                    };
                    let p: Vec<f32> = match ef {
                        "vanilla" => x.iter().zip(&e_prev).map(|(a, b)| a + b).collect(),
                        _ => x.iter().zip(&e_prev).map(|(a, b)| a + f * b).collect(),
                    };
                    let cx = RoundCtx::new(round).with_lr(lr);
                    let (mut out, mut want) = (Vec::new(), Vec::new());
                    c.compress(&g, &cx, &mut out).unwrap();
                    plain.compress(&p, &cx, &mut want).unwrap();
                    assert!(out == want, "{what}, round {round}: payload");
                    let mut d = vec![0f32; n];
                    c.decompress(&out, &cx, &mut d).unwrap();
                    let e = c.residual().unwrap().to_vec();
                    for i in 0..n {
                        let r = p[i] - d[i];
                        assert_eq!(e[i].to_bits(), r.to_bits(), "{what} round {round} i={i}");
                    }
                    if momentum {
                        let got = c.momentum().unwrap();
                        let i = (0..n).find(|&i| got[i].to_bits() != m[i].to_bits());
                        assert!(i.is_none(), "{what} round {round}: momentum at {i:?}");
                    }
                    e_prev = e;
                    m_prev = m;
                    lr_prev = Some(lr);
                }
                // One huge element makes the scale (mean |p|) huge and so every residual;
                // then p overflows where g is finite: refused (without momentum naming the
                // element), nothing changes.
                let lr = lr_prev.unwrap();
                let mut g = rng.gradient(n, 1.0);
                g[0] = if momentum { 1.0e38 } else { 3.0e38 };
                c.compress(&g, &RoundCtx::new(8).with_lr(lr), &mut Vec::new())
                    .unwrap();
                let before = c.residual().unwrap().to_vec();
                let m_before = c.momentum().map(|m| m.to_vec());
                let mut g = rng.gradient(n, 1.0);
                let at = 1 + rng.below(n as u64 - 1) as usize;
                g[at] = f32::MAX.copysign(before[at]);
                let cx = RoundCtx::new(9).with_lr(lr);
                let mut out = vec![1u8; 3];
                let err = c.compress(&g, &cx, &mut out).unwrap_err().to_string();
                let named = match momentum {
                    true => "the momentum update overflows".to_string(),
                    false => format!("element {at}"),
                };
                assert!(err.contains(&named), "{what}: {err}");
                assert!(out.is_empty(), "{what}: a refused round leaves no payload");
                assert!(before == c.residual().unwrap(), "{what}: state changed");
                assert!(
                    m_before.as_deref() == c.momentum(),
                    "{what}: momentum changed"
                );
                // With momentum, p = x + e overflowing after a finite momentum step is error
                // feedback's refusal, as when the passes run one by one.
                if momentum {
                    let mut g = rng.gradient(n, 1.0);
                    // p₁ = g·(1 + μ) + μ²·m falls just short of f32::MAX: the residual
                    // (about the scale, mean |p| ≈ 1.9e38 / n) pushes it over.
                    g[at] = (f32::MAX / (1.0 + mu) * (1.0 - 4.0e-7)).copysign(before[at]);
                    let err = c.compress(&g, &cx, &mut out).unwrap_err().to_string();
                    assert!(err.contains(&format!("element {at}")), "{what}: {err}");
                    assert!(before == c.residual().unwrap(), "{what}: state changed");
                    assert!(
                        m_before.as_deref() == c.momentum(),
                        "{what}: momentum changed"
                    );
                }
            });
        }
    }
}

#[test]
fn nesterov_momentum_follows_its_formula() {
    let seed = seed("nesterov_momentum_follows_its_formula");
    let mut rng = TestRng::new(seed);
    let n = 64;
    let mu = 0.85f32;
    let mut c = build(
        &[
            ("compressor", "none"),
            ("momentum", "nesterov"),
            ("mu", "0.85"),
        ],
        n,
    );
    let mut m = vec![0f32; n];
    for round in 0..10 {
        let g = rng.gradient(n, 1.0);
        let mut out = Vec::new();
        c.compress(&g, &RoundCtx::new(round), &mut out).unwrap();
        let mut p = vec![0f32; n];
        c.decompress(&out, &RoundCtx::new(round), &mut p).unwrap();
        for i in 0..n {
            m[i] = mu * m[i] + g[i];
            assert_eq!(p[i].to_bits(), (g[i] + mu * m[i]).to_bits());
        }
        assert_eq!(c.momentum().unwrap(), &m[..]);
    }
    // Servers get no momentum.
    let s = build_as(
        &[("compressor", "none"), ("momentum", "nesterov")],
        n,
        NodeIdentity::server(1, 1, 0),
    );
    assert!(s.momentum().is_none() && s.name() == "none");
    // The chain order: momentum outside error feedback.
    let c = build(
        &[
            ("compressor", "topk"),
            ("k", "3"),
            ("ef", "vanilla"),
            ("momentum", "nesterov"),
        ],
        n,
    );
    assert_eq!(c.name(), "nesterov(mu=0.9, ef(vanilla, topk(k=3)))");
}
