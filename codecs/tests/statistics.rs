//! Statistical properties of the stochastic quantisers, over many rounds (each round draws new
//! noise): unbiasedness (a Bernstein bound per element, Bonferroni-corrected over all elements
//! and configurations, plus a few ulps of f32 dequantisation), levels in range, and the variance
//! bounds of each scheme: QSGD's `min(n/s², √n/s)·‖v‖²` for linear levels with l2 scaling,
//! Horváth et al.'s natural-dithering bound `(1/8 + √n·2^(1-s)·min(1, √n·2^(1-s)))·‖v‖²`, and
//! `n·(max - min)² / (4(2^b - 1)²)` for minmax. The exact expected error (from each element's two
//! neighbouring levels) is checked against the bound, and the measured mean error against the
//! exact expectation.

mod common;

use common::*;
use pushpull_codecs::elem;
use pushpull_codecs::RoundCtx;

/// Total false-alarm probability of all bounds in this file.
const ALPHA: f64 = 1e-6;
/// A generous count of the bounds checked (for the Bonferroni correction).
const CHECKS: f64 = 1e5;

/// Bernstein deviation bound for the mean of `r` draws with variance `var`, range `range`.
fn bernstein(var: f64, range: f64, r: usize) -> f64 {
    let l = (2.0 * CHECKS / ALPHA).ln();
    (2.0 * var * l / r as f64).sqrt() + range * l / (3.0 * r as f64)
}

/// Per element: the two reconstruction values it rounds between (`lo`, `hi`) and the
/// probability of `hi`.
struct Neighbours {
    lo: f64,
    hi: f64,
    p: f64,
    /// The magnitude that f32 dequantisation errors are relative to (the bucket's scale).
    scale: f64,
}

impl Neighbours {
    fn from(x: f32, lo: f32, hi: f32, scale: f64) -> Neighbours {
        let (lo, hi) = (lo as f64, hi as f64);
        let p = if hi == lo {
            0.0
        } else {
            ((x as f64 - lo) / (hi - lo)).clamp(0.0, 1.0)
        };
        Neighbours { lo, hi, p, scale }
    }
    fn var(&self) -> f64 {
        (self.hi - self.lo).powi(2) * self.p * (1.0 - self.p)
    }
}

/// Runs `rounds` rounds and checks unbiasedness and the error against `bound`.
fn check(kv: &[(&str, &str)], x: &[f32], nb: &[Neighbours], bound: f64, rounds: usize, seed: u64) {
    let n = x.len();
    let mut c = build_as(kv, n, pushpull_codecs::NodeIdentity::worker(seed, 11, 2));
    let mut sum = vec![0f64; n];
    let mut err_sum = 0.0;
    let mut y = vec![0f32; n];
    let mut out = Vec::new();
    for r in 0..rounds {
        c.compress(x, &RoundCtx::new(r as u64), &mut out).unwrap();
        c.decompress(&out, &RoundCtx::new(r as u64), &mut y)
            .unwrap();
        let mut e = 0.0;
        for i in 0..n {
            let v = y[i] as f64;
            // Levels in range: each value is one of the element's two neighbours.
            let ulps = 4.0 * f32::EPSILON as f64 * nb[i].lo.abs().max(nb[i].hi.abs());
            assert!(
                (v - nb[i].lo).abs() <= ulps || (v - nb[i].hi).abs() <= ulps,
                "{kv:?}: element {i} = {} decoded to {v}, not {} or {}",
                x[i],
                nb[i].lo,
                nb[i].hi
            );
            sum[i] += v;
            e += (v - x[i] as f64).powi(2);
        }
        err_sum += e;
    }
    // Unbiased.
    for i in 0..n {
        let mean = sum[i] / rounds as f64;
        let range = (nb[i].hi - nb[i].lo).abs();
        // A few ulps of f32 arithmetic relative to the bucket's scale: dequantisation
        // (min + q * step, norm * level / s) and the scaled value t = (x - min) * (1 / step),
        // |x| * (s / norm), |x| * (1 / norm) (relative error below 2^-23 = 2 eps, wire format
        // version 3). Plus the rounding bias of the 16-bit uniforms: P(u < p) =
        // ceil(p * 2^16) / 2^16 exceeds p by less than 2^-16, so E[value] exceeds the exact
        // interpolation by less than 2^-16 of the step `range`.
        let tol = bernstein(nb[i].var(), range, rounds)
            + 8.0 * f32::EPSILON as f64 * (nb[i].scale + nb[i].lo.abs().max(nb[i].hi.abs()))
            + range * 2f64.powi(-16);
        assert!(
            (mean - x[i] as f64).abs() <= tol,
            "{kv:?}: element {i} = {}: mean of {rounds} rounds is {mean} (tolerance {tol})",
            x[i]
        );
    }
    // Variance: exact expectation within the scheme's bound, measured mean near it.
    let exact: f64 = nb.iter().map(Neighbours::var).sum();
    assert!(
        exact <= bound * (1.0 + 1e-9),
        "{kv:?}: exact E|Q(v)-v|^2 = {exact} exceeds the bound {bound}"
    );
    let range: f64 = nb.iter().map(|b| (b.hi - b.lo).powi(2)).sum();
    let measured = err_sum / rounds as f64;
    let tol = range * ((2.0 * CHECKS / ALPHA).ln() / (2.0 * rounds as f64)).sqrt() + exact * 1e-5;
    assert!(
        (measured - exact).abs() <= tol,
        "{kv:?}: measured E|Q(v)-v|^2 = {measured}, expected {exact} (tolerance {tol})"
    );
    assert!(measured <= bound + tol);
}

fn dithering_neighbours(
    x: &[f32],
    bucket: Option<usize>,
    s: u32,
    natural: bool,
    l2: bool,
) -> (Vec<Neighbours>, Vec<(f64, usize)>) {
    let mut nb = Vec::with_capacity(x.len());
    let mut norms = Vec::new();
    for r in buckets(x.len(), bucket) {
        let b = &x[r.clone()];
        let norm = if l2 {
            elem::l2_norm(b)
        } else {
            elem::max_abs(b)
        };
        norms.push((norm as f64, r.len()));
        for &v in b {
            // u just below 1 never rounds up, u = 0 always does (when it can).
            let (down, up) = if natural {
                (
                    elem::dither_natural_level(v, norm, s, 0.999_999_94),
                    elem::dither_natural_level(v, norm, s, 0.0),
                )
            } else {
                (
                    elem::dither_linear_level(v, norm, s, 0.999_999_94),
                    elem::dither_linear_level(v, norm, s, 0.0),
                )
            };
            let val = |l: u32| {
                let sign = elem::sign_bit(v);
                if natural {
                    elem::dither_natural_value(l, sign, norm, s)
                } else {
                    elem::dither_linear_value(l, sign, norm, s)
                }
            };
            let (lo, hi) = (val(down), val(up));
            let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
            nb.push(Neighbours::from(v, lo, hi, norm as f64));
        }
    }
    (nb, norms)
}

#[test]
fn linear_dithering_with_l2_meets_the_qsgd_bound() {
    let seed = seed("linear_dithering_with_l2_meets_the_qsgd_bound");
    let mut rng = TestRng::new(seed);
    for &(n, s, bucket) in &[
        (64usize, 1u32, None),
        (64, 4, None),
        (100, 2, Some(16usize)),
        (50, 16, Some(7)),
        (9, 3, None),
    ] {
        let x = rng.gradient(n, 1.0);
        let ss = s.to_string();
        let bs = bucket.map(|b| b.to_string());
        let mut kv = vec![
            ("compressor", "dithering"),
            ("k", ss.as_str()),
            ("normalize", "l2"),
        ];
        if let Some(b) = &bs {
            kv.push(("bucket", b.as_str()));
        }
        let (nb, norms) = dithering_neighbours(&x, bucket, s, false, true);
        // QSGD (Alistarh et al., Lemma 3.1) per bucket of length d: min(d/s², √d/s)·‖v_b‖².
        let bound: f64 = norms
            .iter()
            .map(|&(norm, d)| {
                let d = d as f64;
                let s = s as f64;
                (d / (s * s)).min(d.sqrt() / s) * norm * norm
            })
            .sum();
        check(&kv, &x, &nb, bound, 400, seed);
    }
}

#[test]
fn natural_dithering_meets_the_horvath_bound() {
    let seed = seed("natural_dithering_meets_the_horvath_bound");
    let mut rng = TestRng::new(seed);
    for &(n, s, bucket, l2) in &[
        (64usize, 1u32, None, true),
        (64, 3, None, true),
        (100, 5, Some(16usize), true),
        (64, 8, None, false),
        (40, 2, Some(9), false),
    ] {
        let x = rng.gradient(n, 1.0);
        let ss = s.to_string();
        let bs = bucket.map(|b| b.to_string());
        let mut kv = vec![
            ("compressor", "dithering"),
            ("k", ss.as_str()),
            ("partition", "natural"),
            ("normalize", if l2 { "l2" } else { "max" }),
        ];
        if let Some(b) = &bs {
            kv.push(("bucket", b.as_str()));
        }
        let (nb, _) = dithering_neighbours(&x, bucket, s, true, l2);
        // Horváth et al. (natural dithering, r = 2): ω = 1/8 + √d·2^(1-s)·min(1, √d·2^(1-s)),
        // E‖C(v) - v‖² <= ω‖v‖², per bucket of length d.
        let bound: f64 = buckets(n, bucket)
            .into_iter()
            .map(|r| {
                let d = r.len() as f64;
                let a = d.sqrt() * 2f64.powi(1 - s as i32);
                let w = 0.125 + a * a.min(1.0);
                w * x[r].iter().map(|&v| (v as f64).powi(2)).sum::<f64>()
            })
            .sum();
        check(&kv, &x, &nb, bound, 400, seed);
    }
}

#[test]
fn minmax_is_unbiased_and_meets_its_bound() {
    let seed = seed("minmax_is_unbiased_and_meets_its_bound");
    let mut rng = TestRng::new(seed);
    for &(n, bits, bucket) in &[
        (64usize, 1u32, None),
        (64, 2, None),
        (100, 4, Some(16usize)),
        (50, 8, Some(7)),
        (33, 3, None),
    ] {
        let x = rng.gradient(n, 1.0);
        let b = bits.to_string();
        let bs = bucket.map(|v| v.to_string());
        let mut kv = vec![("compressor", "minmax"), ("bits", b.as_str())];
        if let Some(v) = &bs {
            kv.push(("bucket", v.as_str()));
        }
        let levels = (1u32 << bits) - 1;
        let mut nb = Vec::new();
        let mut bound = 0.0;
        for r in buckets(n, bucket) {
            let (mn, mx) = elem::min_max(&x[r.clone()]);
            let step = elem::minmax_step(mn, mx, levels);
            bound += r.len() as f64 * ((mx as f64 - mn as f64).powi(2))
                / (4.0 * (levels as f64).powi(2));
            for &v in &x[r] {
                let down = elem::minmax_code(v, mn, step, levels, 0.999_999_94);
                let up = elem::minmax_code(v, mn, step, levels, 0.0);
                nb.push(Neighbours::from(
                    v,
                    elem::minmax_value(down, mn, step),
                    elem::minmax_value(up, mn, step),
                    mn.abs() as f64 + mx.abs() as f64,
                ));
            }
        }
        // The f32 step (max - min) / levels rounds, so allow its relative error in the bound.
        check(&kv, &x, &nb, bound * (1.0 + 1e-6), 400, seed);
    }
}

#[test]
fn an_all_zero_input_gives_zeros_not_nan() {
    for kv in all_configs() {
        let n = 100;
        let x = vec![0f32; n];
        let mut c = build(&kv, n);
        let mut out = Vec::new();
        let refv = vec![0f32; n];
        c.compress(&x, &ctx(0, &refv), &mut out).unwrap();
        let mut y = vec![1f32; n];
        c.decompress(&out, &ctx(0, &refv), &mut y).unwrap();
        let onebit_unscaled = kv == vec![("compressor", "onebit")];
        for v in y {
            assert!(v.is_finite(), "{kv:?}");
            if !onebit_unscaled {
                assert_eq!(v, 0.0, "{kv:?}");
            }
        }
    }
}
