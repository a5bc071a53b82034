//! Per-element math and fixed-order reductions: the reference that every path follows.
//!
//! Every quantity a compressor computes is defined here once, in plain f32/f64 arithmetic with
//! no fused multiply-add, so that the serial CPU path, the rayon path and the CUDA kernels
//! (`cuda/pushpull_elem.cuh` and `pushpull_work.cuh`, compiled with NVRTC `--fmad=false`, no fast math) produce the
//! same bits. Changing a formula here changes the wire format: change the CUDA header with it.
//!
//! # Reductions
//! Sums (mean |x|, squared l2 norm) use one fixed blocked order: the input is cut into blocks
//! of [`REDUCE_BLOCK`] = 256 elements (the last one padded with zeros); each block is reduced in
//! f32 by a binary tree (`s[i] += s[i + stride]` for `stride = 128, 64, …, 1`), which is exactly
//! what a CUDA warp does in registers and shuffles; the block partials are then added in f64, in
//! block order within groups of [`SUM_GROUP`] = 256 partials, and the group sums in order
//! ([`sum_partials`]; a GPU adds the groups in parallel). Up to 65 536 elements that is one
//! group, the plain in-order sum. Maxima and minima are order-independent and need no such care
//! (non-finite input is rejected before any reduction).
//!
//! # Stochastic rounding
//! [`stochastic_round`] rounds `t >= 0` up with probability `frac(t)`, using the uniform number
//! of [`crate::rng::Stream::uniform`] for that element. Since version 3 of the wire format that
//! uniform has 16 bits (`P(u < p) = ceil(p * 2^16) / 2^16`), so the rounding is unbiased up to
//! `2^-16` of a step (it was `2^-24` with 24-bit uniforms).
//!
//! # Reciprocals instead of divisions (wire format version 3)
//! The quantisers divide every element by a per-bucket quantity (`step` in minmax, `norm` in
//! dithering). Since version 3 they multiply by a per-bucket factor computed once instead,
//! [`bucket_factor`]`(num, den)` = `num / den` (one correctly rounded f32 division), used when it
//! is finite and non-zero; otherwise (a subnormal `den` whose reciprocal overflows, or `den <= 0`)
//! the element falls back to the division it replaces. Each product is one correctly rounded f32
//! multiplication (no FMA: the CUDA side is compiled with `--fmad=false`, the host twin with
//! `-ffp-contract=off`). Compared with the exact ratio, the scaled value `t` carries a relative
//! error below `2^-23` (two roundings instead of one), i.e. the expected decoded value is off by
//! less than `2^-23 * t` steps from the input on top of the `2^-16`-step rounding bias.

/// Elements per reduction block (one CUDA thread block).
pub const REDUCE_BLOCK: usize = 256;

/// Reduces one block of at most [`REDUCE_BLOCK`] values of `f(x)` by the fixed binary tree.
#[inline]
pub fn tree_sum_block(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    debug_assert!(x.len() <= REDUCE_BLOCK);
    let mut s = [0.0f32; REDUCE_BLOCK];
    for (d, &v) in s.iter_mut().zip(x) {
        *d = f(v);
    }
    let mut stride = REDUCE_BLOCK / 2;
    while stride > 0 {
        let (lo, hi) = s.split_at_mut(stride);
        for (a, b) in lo.iter_mut().zip(&hi[..stride]) {
            *a += *b;
        }
        stride /= 2;
    }
    s[0]
}

/// Block partials per group of the f64 sum (`PP_SUM_GROUP` in the CUDA header).
pub const SUM_GROUP: usize = 256;

/// Adds block partials in the fixed order: in f64, in order within groups of [`SUM_GROUP`]
/// (each from -0.0, as Rust's f64 `Sum`), then the group sums in order.
pub fn sum_partials(partials: &[f32]) -> f64 {
    partials
        .chunks(SUM_GROUP)
        .map(|g| g.iter().map(|&p| p as f64).sum::<f64>())
        .sum::<f64>()
}

/// Sum of `f(x)` over `x` in the fixed blocked order: f32 trees per block, then
/// [`sum_partials`].
pub fn blocked_sum(x: &[f32], f: impl Fn(f32) -> f32 + Copy) -> f64 {
    let partials: Vec<f32> = x
        .chunks(REDUCE_BLOCK)
        .map(|b| tree_sum_block(b, f))
        .collect();
    sum_partials(&partials)
}

/// Sum of `|x|` in the fixed blocked order.
pub fn sum_abs(x: &[f32]) -> f64 {
    blocked_sum(x, f32::abs)
}

/// Sum of `x²` (f32 products) in the fixed blocked order.
pub fn sum_sq(x: &[f32]) -> f64 {
    blocked_sum(x, |v| v * v)
}

/// Mean of `|x|` as f32: `(sum_abs(x) / n) as f32`; 0 for an empty slice.
pub fn mean_abs(x: &[f32]) -> f32 {
    if x.is_empty() {
        0.0
    } else {
        (sum_abs(x) / x.len() as f64) as f32
    }
}

/// The l2 norm as f32: `sqrt(sum_sq(x))` taken in f64, then rounded to f32.
pub fn l2_norm(x: &[f32]) -> f32 {
    sum_sq(x).sqrt() as f32
}

/// Largest `|x|` (0 for an empty slice).
pub fn max_abs(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, &v| m.max(v.abs()))
}

/// Smallest and largest value; `(0, 0)` for an empty slice.
pub fn min_max(x: &[f32]) -> (f32, f32) {
    if x.is_empty() {
        return (0.0, 0.0);
    }
    x.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

/// `+0.0` for either zero, `x` otherwise.
///
/// The per-bucket `min` and `max` that minmax puts on the wire are `canonical_zero` of
/// [`min_max`]'s results: `f32::min`/`f32::max` may return either zero when `-0.0` and `+0.0`
/// meet, so the wire format fixes the sign (added for the minmax codec; the CUDA kernels must do
/// the same).
#[inline(always)]
pub fn canonical_zero(x: f32) -> f32 {
    if x == 0.0 {
        0.0
    } else {
        x
    }
}

/// Rounds `t >= 0` down or up: up when `u < t - floor(t)`. `t - floor(t)` is exact in f32.
#[inline(always)]
pub fn stochastic_round(t: f32, u: f32) -> u32 {
    let fl = t.floor();
    let frac = t - fl;
    fl as u32 + (u < frac) as u32
}

/// Error feedback's codec input: `g + e` (vanilla), or `g + f·e` (corrected, `f` = η_{t−1}/η_t),
/// one rounding each (no FMA): the chain's error feedback ([`crate::chain`]), and the onebit
/// pass that forms it while encoding.
#[inline(always)]
pub fn fed(g: f32, e: f32, f: f32, vanilla: bool) -> f32 {
    if vanilla {
        g + e
    } else {
        g + f * e
    }
}

/// Nesterov momentum's step: the next momentum `μ·m + g` and the input it hands on,
/// `g + μ·(μ·m + g)`, one rounding each (no FMA): the chain's momentum ([`crate::chain`]), and
/// the onebit pass that forms error feedback's input from it while encoding.
#[inline(always)]
pub fn nesterov(g: f32, m: f32, mu: f32) -> (f32, f32) {
    let next = mu * m + g;
    (next, g + mu * next)
}

/// The sign bit every sign-carrying code uses: 1 for `x < 0` (so `-0.0` gives 0).
#[inline(always)]
pub fn sign_bit(x: f32) -> u32 {
    (x < 0.0) as u32
}

/// Saturating f32 → IEEE binary16 (round to nearest even; beyond ±65504 gives ±65504).
#[inline(always)]
pub fn f32_to_f16_sat(x: f32) -> u16 {
    half::f16::from_f32(x.clamp(-65504.0, 65504.0)).to_bits()
}

/// binary16 bits → f32 (exact).
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// Saturating f32 → bfloat16 (round to nearest even; beyond the largest finite bf16 saturates).
#[inline(always)]
pub fn f32_to_bf16_sat(x: f32) -> u16 {
    const BF16_MAX: f32 = 3.389_531_4e38; // 0x7f7f as bf16
    half::bf16::from_f32(x.clamp(-BF16_MAX, BF16_MAX)).to_bits()
}

/// bfloat16 bits → f32 (exact, NaN payloads included: the bits shifted into place, as the
/// `bf16` decoder of `codecs/cast.rs` does; `half`'s `to_f32` would set a NaN's quiet bit).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// Min-max quantisation step: `(max - min) / levels` with `levels = 2^b - 1`.
#[inline(always)]
pub fn minmax_step(min: f32, max: f32, levels: u32) -> f32 {
    (max - min) / levels as f32
}

/// The per-bucket factor that replaces a division by `den`: `num / den` (f32, correctly
/// rounded) when `den > 0` and the quotient is finite, else 0, which tells the element functions
/// to divide by `den` instead. (`num >= 1` and `den <= f32::MAX`, so a finite quotient is never 0.)
#[inline(always)]
pub fn bucket_factor(num: f32, den: f32) -> f32 {
    if den > 0.0 {
        let f = num / den;
        if f.is_finite() {
            return f;
        }
    }
    0.0
}

/// Min-max reciprocal step of a bucket: [`bucket_factor`]`(1, step)`.
#[inline(always)]
pub fn minmax_inv_step(step: f32) -> f32 {
    bucket_factor(1.0, step)
}

/// Min-max code of `x` in `0..=levels`: `stochastic_round(clamp(t, 0, levels))` with
/// `t = (x - min) * inv_step` for `inv_step = minmax_inv_step(step) != 0`, else
/// `t = (x - min) / step`; 0 when `step` is 0 (a constant bucket).
#[inline(always)]
pub fn minmax_code(x: f32, min: f32, step: f32, levels: u32, u: f32) -> u32 {
    if step > 0.0 {
        let inv_step = minmax_inv_step(step);
        let d = x - min;
        let t = if inv_step != 0.0 {
            d * inv_step
        } else {
            d / step
        };
        let t = t.clamp(0.0, levels as f32);
        stochastic_round(t, u).min(levels)
    } else {
        0
    }
}

/// Min-max reconstruction: `min + q * step`.
#[inline(always)]
pub fn minmax_value(q: u32, min: f32, step: f32) -> f32 {
    min + q as f32 * step
}

/// Linear dithering scale of a bucket: [`bucket_factor`]`(s, norm)` (`s / norm`).
#[inline(always)]
pub fn dither_linear_scale(norm: f32, s: u32) -> f32 {
    bucket_factor(s as f32, norm)
}

/// Linear dithering level of `x` in `0..=s` for a bucket scale `norm > 0`:
/// `stochastic_round(clamp(t, 0, s))` with `t = |x| * scale` for
/// `scale = dither_linear_scale(norm, s) != 0`, else `t = |x| / norm * s`; 0 when `norm` is 0.
#[inline(always)]
pub fn dither_linear_level(x: f32, norm: f32, s: u32, u: f32) -> u32 {
    if norm > 0.0 {
        let scale = dither_linear_scale(norm, s);
        let t = if scale != 0.0 {
            x.abs() * scale
        } else {
            x.abs() / norm * s as f32
        };
        let t = t.clamp(0.0, s as f32);
        stochastic_round(t, u).min(s)
    } else {
        0
    }
}

/// Linear dithering reconstruction `±(norm * level) / s`, negative when `sign` is 1.
#[inline(always)]
pub fn dither_linear_value(level: u32, sign: u32, norm: f32, s: u32) -> f32 {
    let v = norm * level as f32 / s as f32;
    if sign != 0 {
        -v
    } else {
        v
    }
}

/// `2^e` as f32 for `-126 <= e <= 127` (exact).
#[inline(always)]
pub fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// Natural dithering level of `x` in `0..=s` (Horváth et al.): normalised levels
/// `0, 2^-(s-1), …, 1/2, 1` with codes `0, 1, …, s` (code `c > 0` means `2^(c - s)`).
///
/// With `r = min(|x| * inv, 1)` for `inv = dither_natural_inv(norm) != 0` (else
/// `r = min(|x| / norm, 1)`): below `2^-(s-1)` it rounds between 0 and `2^-(s-1)` with
/// `p = r * 2^(s-1)`; in `[2^e, 2^(e+1))` between those two with `p = r * 2^-e - 1`. Both are
/// exact in f32, so the draw is unbiased (for `r`) up to the uniform's 2^-16 resolution.
/// `1 <= s <= 32`.
#[inline(always)]
pub fn dither_natural_level(x: f32, norm: f32, s: u32, u: f32) -> u32 {
    if norm.is_nan() || norm <= 0.0 {
        return 0;
    }
    let inv = dither_natural_inv(norm);
    let r = if inv != 0.0 {
        x.abs() * inv
    } else {
        x.abs() / norm
    };
    let r = r.min(1.0);
    if r >= 1.0 {
        return s;
    }
    let bottom = 1 - s as i32; // exponent of the smallest non-zero level
    if r < pow2(bottom) {
        let p = r * pow2(s as i32 - 1);
        return (u < p) as u32;
    }
    // r is normal here (r >= 2^-31), so its exponent field gives floor(log2 r).
    let e = ((r.to_bits() >> 23) & 0xff) as i32 - 127;
    let p = r * pow2(-e) - 1.0;
    let lower = (e - bottom + 1) as u32; // code of 2^e
    lower + (u < p) as u32
}

/// Natural dithering reciprocal norm of a bucket: [`bucket_factor`]`(1, norm)`.
#[inline(always)]
pub fn dither_natural_inv(norm: f32) -> f32 {
    bucket_factor(1.0, norm)
}

/// Natural dithering reconstruction: 0 for code 0, else `±norm * 2^(code - s)`.
#[inline(always)]
pub fn dither_natural_value(level: u32, sign: u32, norm: f32, s: u32) -> f32 {
    if level == 0 {
        return 0.0;
    }
    let v = norm * pow2(level as i32 - s as i32);
    if sign != 0 {
        -v
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Groups of 256 partials are added first: 256 ones in the second group survive next to
    /// 2^60 (whose f64 ulp is 256), where the plain in-order sum drops each one.
    #[test]
    fn partials_are_added_in_groups_then_in_order() {
        let big = 2f32.powi(60);
        let mut p = vec![0.0f32; 2 * SUM_GROUP];
        p[0] = big;
        p[SUM_GROUP..].fill(1.0);
        assert_eq!(sum_partials(&p), big as f64 + 256.0);
        let plain: f64 = p.iter().map(|&v| v as f64).sum();
        assert_eq!(plain, big as f64);
        // Up to one group, the plain sum; none at all is -0.0 (as f64's Sum).
        assert_eq!(sum_partials(&p[..SUM_GROUP]), big as f64);
        assert_eq!(sum_partials(&[]).to_bits(), (-0.0f64).to_bits());
    }

    #[test]
    fn tree_sum_matches_f64_within_f32_rounding() {
        let x: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 1013) as f32 * 0.01 - 5.0)
            .collect();
        let exact: f64 = x.iter().map(|&v| (v as f64).abs()).sum();
        let got = sum_abs(&x);
        assert!((got - exact).abs() <= exact * 1e-6, "{got} vs {exact}");
    }

    #[test]
    fn tree_order_is_the_documented_one() {
        // 1e8 + 1 - 1e8 depends on the order: the tree pairs x[0] with x[128] first.
        let mut x = vec![0.0f32; 256];
        x[0] = 1e8;
        x[128] = -1e8;
        x[1] = 1.0;
        assert_eq!(tree_sum_block(&x, |v| v), 1.0);
    }

    #[test]
    fn natural_levels_are_unbiased_in_expectation() {
        let s = 4;
        for &r in &[0.0f32, 0.01, 0.1, 0.126, 0.3, 0.5, 0.74, 0.99, 1.0] {
            let n = 4096;
            let mut mean = 0.0f64;
            for i in 0..n {
                let u = (i as f32 + 0.5) / n as f32; // a uniform grid instead of random draws
                let l = dither_natural_level(r, 1.0, s, u);
                assert!(l <= s);
                mean += dither_natural_value(l, 0, 1.0, s) as f64;
            }
            mean /= n as f64;
            assert!((mean - r as f64).abs() < 1e-3, "r = {r}: mean {mean}");
        }
    }

    #[test]
    fn reciprocal_factors_and_their_division_fallback() {
        // Ordinary buckets multiply by the correctly rounded reciprocal.
        assert_eq!(minmax_inv_step(0.25), 4.0);
        assert_eq!(dither_linear_scale(2.0, 7), 3.5);
        assert_eq!(dither_natural_inv(0.5), 2.0);
        assert_eq!(minmax_code(1.0, 0.0, 0.25, 8, 0.0), 4);
        // A subnormal step or norm: 1/step overflows, the factor is 0 and the element divides.
        let tiny = f32::from_bits(1); // 2^-149
        assert_eq!(minmax_inv_step(tiny), 0.0);
        assert_eq!(minmax_code(3.0 * tiny, 0.0, tiny, 255, 0.5), 3);
        assert_eq!(dither_linear_scale(4.0 * tiny, 4), 0.0);
        assert_eq!(dither_linear_level(2.0 * tiny, 4.0 * tiny, 4, 0.5), 2);
        assert_eq!(dither_natural_inv(tiny), 0.0);
        assert_eq!(dither_natural_level(tiny, tiny, 3, 0.5), 3);
        // Constant buckets and zero norms.
        assert_eq!(minmax_inv_step(0.0), 0.0);
        assert_eq!(minmax_code(1.0, 1.0, 0.0, 255, 0.0), 0);
        assert_eq!(dither_linear_level(1.0, 0.0, 7, 0.0), 0);
    }

    #[test]
    fn saturating_casts() {
        assert_eq!(f16_to_f32(f32_to_f16_sat(1e9)), 65504.0);
        assert_eq!(f16_to_f32(f32_to_f16_sat(-1e9)), -65504.0);
        assert_eq!(bf16_to_f32(f32_to_bf16_sat(f32::MAX)), 3.389_531_4e38);
        assert_eq!(f16_to_f32(f32_to_f16_sat(1.5)), 1.5);
    }
}
