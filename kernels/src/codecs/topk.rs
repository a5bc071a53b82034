//! `topk`: the k elements of largest magnitude, as (index, value) pairs (CPU only).
//!
//! Selection is exact: the k largest `|x|`, ties broken by the lower index, found in O(n) by a
//! radix select on the magnitude bits (for non-negative floats the bit pattern orders like the
//! value), in two passes over the input: a histogram of the top 11 magnitude bits finds the
//! bucket `B` holding the k-th largest; a second pass emits, in index order, every element whose
//! bucket is above `B` (all of them are in the top k) and collects the elements of bucket `B`;
//! a quickselect (`select_nth_unstable`) on the collected magnitudes gives the threshold `T`,
//! one scan of the collected elements (in index order) takes those above `T` and the first ones
//! equal to `T`, and a merge of the two index-ordered lists gives the output. No full sort.
//!
//! Wire format: `k` little-endian u32 indices in strictly increasing order, then the `k`
//! little-endian f32 values `x[idx_j]` (unscaled). Size exactly `8k` (k is fixed per chunk, so
//! there is no header). Decompress writes the values at their indices and zeros elsewhere.

use super::{prepare, Base};
use crate::error::KernelError;
use crate::simd::{multiversion, EXP};
use crate::{Compressor, RoundCtx};
use rayon::prelude::*;

/// The top-k compressor.
pub(crate) struct TopK {
    base: Base,
    k: usize,
}

impl TopK {
    pub fn new(base: Base, k: usize) -> TopK {
        assert!(k <= base.n && base.n <= u32::MAX as usize);
        TopK { base, k }
    }
}

const HBITS: u32 = 11;
const HSHIFT: u32 = 31 - HBITS;
const HSIZE: usize = 1 << HBITS;

#[inline(always)]
fn mag(v: f32) -> u32 {
    v.to_bits() & 0x7fff_ffff
}

#[inline(always)]
fn histogram_impl(x: &[f32], h: &mut [u32]) {
    // Four sub-histograms break the store-to-load dependency when many values share a bucket.
    let mut sub = vec![0u32; 4 * HSIZE];
    let (s0, rest) = sub.split_at_mut(HSIZE);
    let (s1, rest) = rest.split_at_mut(HSIZE);
    let (s2, s3) = rest.split_at_mut(HSIZE);
    let mut ch = x.chunks_exact(4);
    for c in &mut ch {
        s0[(mag(c[0]) >> HSHIFT) as usize] += 1;
        s1[(mag(c[1]) >> HSHIFT) as usize] += 1;
        s2[(mag(c[2]) >> HSHIFT) as usize] += 1;
        s3[(mag(c[3]) >> HSHIFT) as usize] += 1;
    }
    for &v in ch.remainder() {
        s0[(mag(v) >> HSHIFT) as usize] += 1;
    }
    for (i, o) in h.iter_mut().enumerate() {
        *o += s0[i] + s1[i] + s2[i] + s3[i];
    }
}

multiversion! {
    fn histogram(x: &[f32], h: &mut [u32]) = histogram_impl;
}

/// (index, value) pairs in index order.
type Entries = Vec<(u32, f32)>;

/// One segment's pass 2: elements whose bucket is above `b` go to `hi`, those in bucket `b`
/// to `cand` (both in index order; `i0` is the index of `x[0]`).
#[inline(always)]
fn split_impl(x: &[f32], i0: usize, b: u32, hi: &mut Vec<(u32, f32)>, cand: &mut Vec<(u32, f32)>) {
    let lo = b << HSHIFT;
    for (g, ch) in x.chunks(32).enumerate() {
        // A mask of the elements at or above the bucket (vectorises like sign bits), then only
        // its set bits are visited.
        let mut m = 0u32;
        for (j, &v) in ch.iter().enumerate() {
            m |= ((mag(v) >= lo) as u32) << j;
        }
        while m != 0 {
            let j = m.trailing_zeros() as usize;
            m &= m - 1;
            let v = ch[j];
            let i = (i0 + 32 * g + j) as u32;
            if mag(v) >> HSHIFT > b {
                hi.push((i, v));
            } else {
                cand.push((i, v));
            }
        }
    }
}

multiversion! {
    fn split(x: &[f32], i0: usize, b: u32, hi: &mut Vec<(u32, f32)>, cand: &mut Vec<(u32, f32)>) = split_impl;
}

/// The top k of `x` as (index, value) pairs in index order, or the index of a non-finite
/// element.
fn select(x: &[f32], k: usize) -> Result<Vec<(u32, f32)>, usize> {
    let par = crate::par::enabled(x.len());
    let seg = crate::par::SEG * 4;
    // Pass 1: histogram of the top magnitude bits.
    let mut h = vec![0u32; HSIZE];
    if par {
        h = x
            .par_chunks(seg)
            .map(|c| {
                let mut h = vec![0u32; HSIZE];
                histogram(c, &mut h);
                h
            })
            .reduce(
                || vec![0u32; HSIZE],
                |mut a, b| {
                    for (x, y) in a.iter_mut().zip(b) {
                        *x += y;
                    }
                    a
                },
            );
    } else {
        histogram(x, &mut h);
    }
    if h[(EXP >> HSHIFT) as usize..].iter().any(|&c| c > 0) {
        return Err(x.iter().position(|v| !v.is_finite()).unwrap_or(0));
    }
    // The bucket holding the k-th largest magnitude.
    let mut above = 0usize;
    let mut bucket = 0u32;
    for b in (0..HSIZE).rev() {
        let c = h[b] as usize;
        if above + c >= k {
            bucket = b as u32;
            break;
        }
        above += c;
    }
    let need = k - above; // 1..=h[bucket]
                          // Pass 2: everything above the bucket, and the bucket's elements, in index order.
    let mut hi = Vec::with_capacity(above);
    let mut cand = Vec::with_capacity(h[bucket as usize] as usize);
    if par {
        let parts: Vec<(Entries, Entries)> = x
            .par_chunks(seg)
            .enumerate()
            .map(|(s, c)| {
                let (mut hi, mut cand) = (Vec::new(), Vec::new());
                split(c, s * seg, bucket, &mut hi, &mut cand);
                (hi, cand)
            })
            .collect();
        for (a, b) in parts {
            hi.extend_from_slice(&a);
            cand.extend_from_slice(&b);
        }
    } else {
        split(x, 0, bucket, &mut hi, &mut cand);
    }
    debug_assert_eq!(hi.len(), above);
    // The threshold inside the bucket, then the chosen candidates in index order.
    let mut mags: Vec<u32> = cand.iter().map(|&(_, v)| mag(v)).collect();
    let (_, &mut t, _) = mags.select_nth_unstable_by(need - 1, |a, b| b.cmp(a));
    let greater = cand.iter().filter(|&&(_, v)| mag(v) > t).count();
    let mut ties = need - greater;
    let chosen = cand.iter().copied().filter(move |&(_, v)| {
        let m = mag(v);
        if m > t {
            true
        } else if m == t && ties > 0 {
            ties -= 1;
            true
        } else {
            false
        }
    });
    // Merge the two index-ordered lists.
    let mut out = Vec::with_capacity(k);
    let mut a = hi.into_iter().peekable();
    let mut b = chosen.peekable();
    loop {
        let take_a = match (a.peek(), b.peek()) {
            (Some(p), Some(q)) => p.0 < q.0,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        out.extend(if take_a { a.next() } else { b.next() });
    }
    debug_assert_eq!(out.len(), k);
    Ok(out)
}

impl TopK {
    fn size(&self) -> usize {
        8 * self.k
    }

    /// Validated (index, value) pairs of a payload.
    fn entries<'a>(&self, payload: &'a [u8]) -> Result<(&'a [u8], &'a [u8]), KernelError> {
        self.base.check_payload(self.size(), payload.len())?;
        let (ib, vb) = payload.split_at(4 * self.k);
        let mut prev: i64 = -1;
        for (j, (i, v)) in ib.chunks_exact(4).zip(vb.chunks_exact(4)).enumerate() {
            let i = u32::from_le_bytes([i[0], i[1], i[2], i[3]]) as i64;
            if i <= prev || i >= self.base.n as i64 {
                return Err(KernelError::malformed(
                    &self.base.name,
                    format!(
                        "index {j} is {i}; indices must increase strictly and stay below {}",
                        self.base.n
                    ),
                ));
            }
            let v = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
            if !v.is_finite() {
                return Err(KernelError::malformed(
                    &self.base.name,
                    format!("value {j} (index {i}) is {v}"),
                ));
            }
            prev = i;
        }
        Ok((ib, vb))
    }
}

fn pairs<'a>(ib: &'a [u8], vb: &'a [u8]) -> impl Iterator<Item = (usize, f32)> + 'a {
    ib.chunks_exact(4).zip(vb.chunks_exact(4)).map(|(i, v)| {
        (
            u32::from_le_bytes([i[0], i[1], i[2], i[3]]) as usize,
            f32::from_le_bytes([v[0], v[1], v[2], v[3]]),
        )
    })
}

impl Compressor for TopK {
    fn name(&self) -> &str {
        &self.base.name
    }
    fn len(&self) -> usize {
        self.base.n
    }
    fn max_compressed_len(&self) -> usize {
        self.size()
    }
    fn is_stochastic(&self) -> bool {
        false
    }
    fn compress(
        &mut self,
        input: &[f32],
        _ctx: &RoundCtx,
        out: &mut Vec<u8>,
    ) -> Result<(), KernelError> {
        self.base.check("input", input.len())?;
        let k = self.k;
        if k == 0 {
            self.base.require_finite(input)?;
            out.clear();
            return Ok(());
        }
        let top = match select(input, k) {
            Ok(v) => v,
            Err(i) => {
                return Err(KernelError::NonFinite {
                    compressor: self.base.name.clone(),
                    what: "input",
                    index: i,
                    value: input[i],
                })
            }
        };
        let dst = prepare(out, self.size());
        let (ib, vb) = dst.split_at_mut(4 * k);
        for ((i, v), &(idx, val)) in ib.chunks_exact_mut(4).zip(vb.chunks_exact_mut(4)).zip(&top) {
            i.copy_from_slice(&idx.to_le_bytes());
            v.copy_from_slice(&val.to_le_bytes());
        }
        Ok(())
    }
    fn decompress(
        &self,
        payload: &[u8],
        _ctx: &RoundCtx,
        out: &mut [f32],
    ) -> Result<(), KernelError> {
        self.base.check("output", out.len())?;
        let (ib, vb) = self.entries(payload)?;
        out.fill(0.0);
        for (i, v) in pairs(ib, vb) {
            out[i] = v;
        }
        Ok(())
    }
    fn subtract_decoded(
        &self,
        payload: &[u8],
        _ctx: &RoundCtx,
        acc: &mut [f32],
    ) -> Option<Result<bool, KernelError>> {
        Some((|| {
            self.base.check("accumulator", acc.len())?;
            let (ib, vb) = self.entries(payload)?;
            let mut finite = true;
            for (i, v) in pairs(ib, vb) {
                let r = acc[i] - v;
                finite &= r.is_finite();
                acc[i] = r;
            }
            Ok(finite)
        })())
    }
    fn decompress_add(
        &self,
        payload: &[u8],
        _ctx: &RoundCtx,
        acc: &mut [f32],
    ) -> Result<(), KernelError> {
        self.base.check("accumulator", acc.len())?;
        let (ib, vb) = self.entries(payload)?;
        let orig: Vec<f32> = pairs(ib, vb).map(|(i, _)| acc[i]).collect();
        super::randomk::add_zero(acc);
        for ((i, v), o) in pairs(ib, vb).zip(orig) {
            acc[i] = o + v;
        }
        Ok(())
    }
}
