//! Per-bucket statistics (mean |x|, l2 norm, max |x|, min and max) in the fixed order of
//! [`crate::elem`], serial or parallel with identical bits, with non-finite detection fused in.
//!
//! A chunk of `n` elements is cut into buckets of `size` elements (the last one shorter);
//! reductions restart at each bucket start: bucket `b` is reduced exactly as
//! `elem::sum_abs(&x[b * size..][..len_b])` would reduce it. The work is split into *slots*:
//! slot `b * bpb + j` is block `j` (of [`REDUCE_BLOCK`] elements) of bucket `b`, with
//! `bpb = ceil(size / 256)`; slots are computed independently (in parallel for long inputs) and
//! combined per bucket in block order.

#[cfg(doc)]
use crate::elem::tree_sum_block;
use crate::elem::REDUCE_BLOCK;
use crate::simd::{multiversion, EXP};
use rayon::prelude::*;
use std::ops::Range;

/// How a chunk is cut into buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Buckets {
    /// Chunk length.
    pub n: usize,
    /// Bucket length (>= 1).
    pub size: usize,
    /// Number of buckets: `ceil(n / size)` (0 when `n == 0`).
    pub count: usize,
}

impl Buckets {
    /// Buckets of `bucket` elements, or one bucket for the whole chunk.
    pub fn new(n: usize, bucket: Option<usize>) -> Buckets {
        let size = bucket.unwrap_or(n).clamp(1, n.max(1));
        Buckets {
            n,
            size,
            count: n.div_ceil(size),
        }
    }

    /// The element range of bucket `b`.
    #[inline]
    pub fn range(&self, b: usize) -> Range<usize> {
        let s = b * self.size;
        s..(s + self.size).min(self.n)
    }

    /// Blocks per (full) bucket.
    #[inline]
    fn bpb(&self) -> usize {
        self.size.div_ceil(REDUCE_BLOCK)
    }

    /// The element range of slot `slot` (empty for slots past the end of a short last bucket).
    #[inline(always)]
    fn slot_range(&self, slot: usize) -> Range<usize> {
        let bpb = self.bpb();
        let b = slot / bpb;
        let j = slot % bpb;
        let r = self.range(b);
        let s = (r.start + j * REDUCE_BLOCK).min(r.end);
        s..(s + REDUCE_BLOCK).min(r.end)
    }
}

/// Computes `f(slot range)` for every slot, in parallel where it pays.
fn for_slots<T: Send + Copy + Default>(
    bk: &Buckets,
    x: &[f32],
    run: impl Fn(&[f32], &Buckets, usize, &mut [T]) + Sync,
) -> Vec<T> {
    let slots = bk.count * bk.bpb();
    let mut out = vec![T::default(); slots];
    if crate::par::enabled(bk.n) {
        let per = (crate::par::SEG / REDUCE_BLOCK).max(1);
        out.par_chunks_mut(per)
            .enumerate()
            .for_each(|(c, o)| run(x, bk, c * per, o));
    } else {
        run(x, bk, 0, &mut out);
    }
    out
}

/// [`tree_sum_block`] of `|v|` or `v²`, written without a closure so that it inlines into the
/// AVX2 kernels (the same operations in the same order).
#[inline(always)]
pub(crate) fn tree_sum(v: &[f32], square: bool) -> f32 {
    if let Ok(full) = <&[f32; REDUCE_BLOCK]>::try_from(v) {
        return tree_sum_full(full, square);
    }
    let mut s = [0.0f32; REDUCE_BLOCK];
    if square {
        for (d, &a) in s.iter_mut().zip(v) {
            *d = a * a;
        }
    } else {
        for (d, &a) in s.iter_mut().zip(v) {
            *d = a.abs();
        }
    }
    halve(&mut s)
}

/// The pairwise tree of `s` (a power-of-two length): `s[i] += s[i + len/2]`, halving until one
/// element is left, which is returned.
#[inline(always)]
fn halve(s: &mut [f32]) -> f32 {
    let mut stride = s.len() / 2;
    while stride > 0 {
        let (lo, hi) = s.split_at_mut(stride);
        for (a, b) in lo.iter_mut().zip(&hi[..stride]) {
            *a += *b;
        }
        stride /= 2;
    }
    s[0]
}

/// [`tree_sum`] of a whole block, its first level (`s[i] + s[i + 128]`) fused with the
/// squares or magnitudes so the block's terms are never stored: the same operations in the
/// same order.
#[inline(always)]
fn tree_sum_full(v: &[f32; REDUCE_BLOCK], square: bool) -> f32 {
    const HALF: usize = REDUCE_BLOCK / 2;
    let (lo, hi) = v.split_at(HALF);
    let mut s = [0.0f32; HALF];
    if square {
        for ((d, &a), &b) in s.iter_mut().zip(lo).zip(hi) {
            *d = a * a + b * b;
        }
    } else {
        for ((d, &a), &b) in s.iter_mut().zip(lo).zip(hi) {
            *d = a.abs() + b.abs();
        }
    }
    halve(&mut s)
}

#[inline(always)]
fn sums_impl(x: &[f32], bk: &Buckets, first: usize, out: &mut [f32], square: bool) {
    for (t, o) in out.iter_mut().enumerate() {
        let r = bk.slot_range(first + t);
        *o = tree_sum(&x[r], square);
    }
}

#[inline(always)]
fn abs_sums_impl(x: &[f32], bk: &Buckets, first: usize, out: &mut [f32]) {
    sums_impl(x, bk, first, out, false)
}

#[inline(always)]
fn sq_sums_impl(x: &[f32], bk: &Buckets, first: usize, out: &mut [f32]) {
    sums_impl(x, bk, first, out, true)
}

multiversion! {
    fn abs_sums(x: &[f32], bk: &Buckets, first: usize, out: &mut [f32]) = abs_sums_impl;
}
multiversion! {
    fn sq_sums(x: &[f32], bk: &Buckets, first: usize, out: &mut [f32]) = sq_sums_impl;
}

/// Per-bucket sums of `|x|` (or `x²`) in the fixed blocked order of [`crate::elem`]:
/// `sums[b] == elem::sum_abs(bucket b)` (or `elem::sum_sq`), bit for bit.
pub(crate) fn bucket_sums(x: &[f32], bk: &Buckets, square: bool) -> Vec<f64> {
    let partials = if square {
        for_slots(bk, x, sq_sums)
    } else {
        for_slots(bk, x, abs_sums)
    };
    let bpb = bk.bpb();
    (0..bk.count)
        .map(|b| {
            let blocks = bk.range(b).len().div_ceil(REDUCE_BLOCK);
            crate::elem::sum_partials(&partials[b * bpb..b * bpb + blocks])
        })
        .collect()
}

#[inline(always)]
fn max_abs_bits_impl(x: &[f32], bk: &Buckets, first: usize, out: &mut [u32]) {
    for (t, o) in out.iter_mut().enumerate() {
        let v = &x[bk.slot_range(first + t)];
        let mut r = 0u32;
        for a in v {
            r = r.max(a.to_bits() & 0x7fff_ffff);
        }
        *o = r;
    }
}

multiversion! {
    fn max_abs_bits(x: &[f32], bk: &Buckets, first: usize, out: &mut [u32]) = max_abs_bits_impl;
}

/// Per-bucket `max |x|` (equal to `elem::max_abs` for finite input) and whether some element is
/// non-finite.
pub(crate) fn bucket_max_abs(x: &[f32], bk: &Buckets) -> (Vec<f32>, bool) {
    let partials = for_slots(bk, x, max_abs_bits);
    let bpb = bk.bpb();
    let mut bad = false;
    let v = (0..bk.count)
        .map(|b| {
            let m = partials[b * bpb..(b + 1) * bpb]
                .iter()
                .copied()
                .max()
                .unwrap_or(0);
            bad |= m >= EXP;
            f32::from_bits(m)
        })
        .collect();
    (v, bad)
}

/// Maps f32 bits to an i32 whose order is the total order of the floats (-NaN < -Inf < … <
/// -0 < +0 < … < +Inf < +NaN).
#[inline(always)]
fn ordered(bits: u32) -> i32 {
    let i = bits as i32;
    i ^ (((i >> 31) as u32) >> 1) as i32
}

/// The inverse of [`ordered`].
#[inline(always)]
fn unordered(k: i32) -> f32 {
    f32::from_bits((k ^ (((k >> 31) as u32) >> 1) as i32) as u32)
}

#[inline(always)]
fn min_max_keys_impl(x: &[f32], bk: &Buckets, first: usize, out: &mut [(i32, i32)]) {
    for (t, o) in out.iter_mut().enumerate() {
        let v = &x[bk.slot_range(first + t)];
        let mut l = i32::MAX;
        let mut h = i32::MIN;
        for a in v {
            let k = ordered(a.to_bits());
            l = l.min(k);
            h = h.max(k);
        }
        *o = (l, h);
    }
}

multiversion! {
    fn min_max_keys(x: &[f32], bk: &Buckets, first: usize, out: &mut [(i32, i32)]) = min_max_keys_impl;
}

/// Per-bucket `(min, max)`, equal to `elem::min_max` with a zero result written as `+0.0`
/// ([`crate::elem::canonical_zero`]), and whether some element is non-finite.
pub(crate) fn bucket_min_max(x: &[f32], bk: &Buckets) -> (Vec<(f32, f32)>, bool) {
    let partials = for_slots(bk, x, min_max_keys);
    let bpb = bk.bpb();
    let lo_ok = ordered((-f32::MAX).to_bits());
    let hi_ok = ordered(f32::MAX.to_bits());
    let mut bad = false;
    let v = (0..bk.count)
        .map(|b| {
            let (l, h) = partials[b * bpb..(b + 1) * bpb]
                .iter()
                .fold((i32::MAX, i32::MIN), |(l, h), &(a, c)| (l.min(a), h.max(c)));
            bad |= l < lo_ok || h > hi_ok;
            (
                crate::elem::canonical_zero(unordered(l)),
                crate::elem::canonical_zero(unordered(h)),
            )
        })
        .collect();
    (v, bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elem;

    fn data(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = crate::rng::mix64(i as u64 + 17);
                ((h >> 40) as f32 / 16_777_216.0 - 0.5) * 3.0
            })
            .collect()
    }

    #[test]
    fn matches_elem_per_bucket() {
        for &(n, bucket) in &[
            (0usize, None),
            (1, None),
            (300, None),
            (1000, Some(100usize)),
            (1000, Some(512)),
            (5000, Some(1)),
            (300_000, None),
            (300_001, Some(70_000)),
        ] {
            let x = data(n);
            let bk = Buckets::new(n, bucket);
            let sa = bucket_sums(&x, &bk, false);
            let sq = bucket_sums(&x, &bk, true);
            let (ma, bad) = bucket_max_abs(&x, &bk);
            assert!(!bad);
            let (mm, bad) = bucket_min_max(&x, &bk);
            assert!(!bad);
            assert_eq!(sa.len(), bk.count);
            for b in 0..bk.count {
                let v = &x[bk.range(b)];
                assert_eq!(sa[b].to_bits(), elem::sum_abs(v).to_bits());
                assert_eq!(sq[b].to_bits(), elem::sum_sq(v).to_bits());
                assert_eq!(ma[b].to_bits(), elem::max_abs(v).to_bits());
                let (l, h) = elem::min_max(v);
                assert_eq!(mm[b], (l, h));
            }
        }
    }

    #[test]
    fn detects_non_finite() {
        let mut x = data(1000);
        x[500] = f32::NAN;
        let bk = Buckets::new(1000, Some(256));
        assert!(bucket_max_abs(&x, &bk).1);
        assert!(bucket_min_max(&x, &bk).1);
        x[500] = f32::NEG_INFINITY;
        assert!(bucket_max_abs(&x, &bk).1);
        assert!(bucket_min_max(&x, &bk).1);
        x[500] = -f32::MAX;
        assert!(!bucket_max_abs(&x, &bk).1);
        assert!(!bucket_min_max(&x, &bk).1);
    }

    #[test]
    fn signed_zero_min_is_canonical() {
        let x = [0.0f32, -0.0, 1.0, -0.0];
        let (mm, _) = bucket_min_max(&x, &Buckets::new(4, None));
        assert_eq!(mm[0].0.to_bits(), 0);
        let x = [-0.0f32, -0.0, -1.0];
        let (mm, _) = bucket_min_max(&x, &Buckets::new(3, None));
        assert_eq!(mm[0].1.to_bits(), 0);
    }
}
