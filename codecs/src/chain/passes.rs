//! The chain's passes over a chunk, each a loop written to vectorise and compiled for every
//! SIMD level ([`crate::simd`]), each telling whether every value it wrote is finite: error
//! feedback's input, Nesterov momentum's step, both in one pass, and the residual.

use crate::simd::multiversion;

/// Whether `v` is NaN or infinite, as a 0/1 flag the loops OR together.
#[inline(always)]
fn bad(v: f32) -> u32 {
    ((v.to_bits() & crate::simd::EXP) == crate::simd::EXP) as u32
}

#[inline(always)]
fn add_scaled_impl(g: &[f32], e: &[f32], f: f32, vanilla: bool, p: &mut [f32]) -> bool {
    let mut flags = 0u32;
    for ((pi, gi), ei) in p.iter_mut().zip(g).zip(e) {
        let v = crate::elem::fed(*gi, *ei, f, vanilla);
        flags |= bad(v);
        *pi = v;
    }
    flags == 0
}

multiversion! {
    pub(super) fn add_scaled(g: &[f32], e: &[f32], f: f32, vanilla: bool, p: &mut [f32]) -> bool = add_scaled_impl;
}

/// Momentum's step and error feedback's input in one pass, for a codec without its own
/// ([`EncodeFed`]): `next = μ·m + g`, `p = fed(g + μ·next, e)` ([`crate::elem`]'s `nesterov`
/// and `fed`); whether every `next` and `p` is finite.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn nesterov_fed_impl(
    g: &[f32],
    m: &[f32],
    mu: f32,
    next: &mut [f32],
    e: &[f32],
    f: f32,
    vanilla: bool,
    p: &mut [f32],
) -> bool {
    let n = p.len();
    let (g, m, next, e) = (&g[..n], &m[..n], &mut next[..n], &e[..n]);
    let mut flags = 0u32;
    for i in 0..n {
        let (mn, x) = crate::elem::nesterov(g[i], m[i], mu);
        let v = crate::elem::fed(x, e[i], f, vanilla);
        flags |= bad(v) | bad(mn);
        next[i] = mn;
        p[i] = v;
    }
    flags == 0
}

multiversion! {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn nesterov_fed(g: &[f32], m: &[f32], mu: f32, next: &mut [f32], e: &[f32], f: f32, vanilla: bool, p: &mut [f32]) -> bool = nesterov_fed_impl;
}

/// `d = p - d`; whether every result is finite.
#[inline(always)]
fn sub_into_impl(p: &[f32], d: &mut [f32]) -> bool {
    let mut flags = 0u32;
    for (di, pi) in d.iter_mut().zip(p) {
        let v = *pi - *di;
        flags |= bad(v);
        *di = v;
    }
    flags == 0
}

multiversion! {
    pub(super) fn sub_into(p: &[f32], d: &mut [f32]) -> bool = sub_into_impl;
}

/// `next = μ·m + g; p = g + μ·next`; whether every value is finite.
#[inline(always)]
fn nesterov_impl(g: &[f32], m: &[f32], mu: f32, next: &mut [f32], p: &mut [f32]) -> bool {
    let mut flags = 0u32;
    for (((pi, ni), gi), mi) in p.iter_mut().zip(next.iter_mut()).zip(g).zip(m) {
        let (mn, v) = crate::elem::nesterov(*gi, *mi, mu);
        flags |= bad(v) | bad(mn);
        *ni = mn;
        *pi = v;
    }
    flags == 0
}

multiversion! {
    pub(super) fn nesterov(g: &[f32], m: &[f32], mu: f32, next: &mut [f32], p: &mut [f32]) -> bool = nesterov_impl;
}
