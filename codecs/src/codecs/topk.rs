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
//! Most inputs skip the histogram: a strided sample of 1024 elements gives a threshold `t`
//! that a little over 2k elements reach, one pass collects them (in index order), and when at
//! least k did, the k largest are among them and the same quickselect and scan finish (see
//! [`select_sampled`]; about twice as fast at chunk sizes). When the estimate fails (too few or
//! too many collected) the histogram runs; either way the result is the same exact top k.
//!
//! Wire format: `k` little-endian u32 indices in strictly increasing order, then the `k`
//! little-endian f32 values `x[idx_j]` (unscaled). Size exactly `8k` (k is fixed per chunk, so
//! there is no header). Decompress writes the values at their indices and zeros elsewhere.

use std::sync::Arc;

use super::{prepare, scatter, subtract_at};
use crate::chain::{Body, Subtract};
use crate::codec::{Codec, CodecInfo, RoundCtx};
use crate::error::{KernelError, Result};
use crate::simd::{multiversion, EXP};
use crate::spec::{BuildOptions, CodecSpec, Entry, KSpec, Kind};
use pushpull_proto::placement::PayloadModel;
use rayon::prelude::*;

/// The registry's `topk`: `k` (required).
pub const ENTRY: Entry = Entry {
    name: "topk",
    keys: &["k"],
    own_keys: &[],
    parse: |keys| Ok(Arc::new(TopKSpec { k: keys.k(true)? })),
};

/// Top-k's settings: the k largest magnitudes of each chunk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TopKSpec {
    /// k.
    pub k: KSpec,
}

impl CodecSpec for TopKSpec {
    fn kind(&self) -> Kind {
        Kind::new("topk", false, false)
    }
    fn build(&self, base: CodecInfo, opts: &BuildOptions) -> Result<Body> {
        let len = base.n;
        let k = self
            .k
            .chunk_k(true, len, opts.full_chunk_len.unwrap_or(len))?;
        Ok(Body::Sparse(Box::new(TopK::new(base, k))))
    }
    fn payload(&self, _: u64) -> PayloadModel {
        PayloadModel {
            kept: Some(self.k.kept(true, 8)),
            ..PayloadModel::default()
        }
    }
    fn display_name(&self) -> String {
        format!("topk(k={})", self.k)
    }
    fn params(&self, put: &mut dyn FnMut(&'static str, String)) {
        put("k", self.k.to_string());
    }
}

/// The top-k compressor.
pub(crate) struct TopK {
    base: CodecInfo,
    k: usize,
}

impl TopK {
    pub fn new(base: CodecInfo, k: usize) -> TopK {
        assert!(k <= base.n && base.n <= u32::MAX as usize);
        TopK {
            base: base.sized(8 * k),
            k,
        }
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

/// Bit `j` set where `|ch[j]| >= lo` (as magnitude bits), for a block of at most 32.
#[inline(always)]
fn mask(ch: &[f32], lo: u32) -> u32 {
    let mut m = 0u32;
    // Whole blocks take the fixed-length loop, which vectorises like sign bits.
    if let Ok(block) = <&[f32; 32]>::try_from(ch) {
        for (j, &v) in block.iter().enumerate() {
            m |= ((mag(v) >= lo) as u32) << j;
        }
    } else {
        for (j, &v) in ch.iter().enumerate() {
            m |= ((mag(v) >= lo) as u32) << j;
        }
    }
    m
}

/// One segment's pass 2: elements whose bucket is above `b` go to `hi`, those in bucket `b`
/// to `cand` (both in index order; `i0` is the index of `x[0]`).
#[inline(always)]
fn split_impl(x: &[f32], i0: usize, b: u32, hi: &mut Vec<(u32, f32)>, cand: &mut Vec<(u32, f32)>) {
    for (g, ch) in x.chunks(32).enumerate() {
        // Only the set bits of the block's mask are visited.
        let mut m = mask(ch, b << HSHIFT);
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

/// Every element with magnitude bits `>= lo`, in index order, into `cand`; false (stopping
/// early) once more than `cap` are collected.
#[inline(always)]
fn collect_impl(x: &[f32], lo: u32, cap: usize, cand: &mut Vec<(u32, f32)>) -> bool {
    for (g, ch) in x.chunks(32).enumerate() {
        let mut m = mask(ch, lo);
        while m != 0 {
            let j = m.trailing_zeros() as usize;
            m &= m - 1;
            cand.push(((32 * g + j) as u32, ch[j]));
        }
        if cand.len() > cap {
            return false;
        }
    }
    true
}

multiversion! {
    fn collect(x: &[f32], lo: u32, cap: usize, cand: &mut Vec<(u32, f32)>) -> bool = collect_impl;
}

multiversion! {
    fn split(x: &[f32], i0: usize, b: u32, hi: &mut Vec<(u32, f32)>, cand: &mut Vec<(u32, f32)>) = split_impl;
}

/// Elements in the strided sample from which [`select_sampled`] estimates its threshold.
const SAMPLE: usize = 1024;

/// The top k of `x` by a threshold estimated from a strided sample of [`SAMPLE`] elements:
/// one pass collects every element whose magnitude reaches the estimate `t`, and when at least
/// k do, the k largest are among them (the k-th largest magnitude is `>= t`), so the result is
/// the exact one. The estimate is the magnitude the sample ranks at about twice its expected
/// share of the top k (plus three standard deviations), so on most inputs a little over 2k
/// elements are collected. `None` where the estimate does not work out (fewer than k collected,
/// more than four times the sample's share, a non-finite sample, a large k or a short input),
/// and the caller uses the histogram. This skips the histogram pass of every chunk where it
/// works, which is most of a chunk's selection time.
fn select_sampled(x: &[f32], k: usize) -> Option<Result<Vec<(u32, f32)>, usize>> {
    let n = x.len();
    if n < 4 * SAMPLE {
        return None;
    }
    let expected = (k * SAMPLE) as f64 / n as f64;
    let rank = (2.0 * expected + 3.0 * expected.sqrt() + 4.0) as usize;
    if rank >= SAMPLE / 8 {
        return None;
    }
    let stride = n / SAMPLE;
    let mut sample = [0u32; SAMPLE];
    for (i, m) in sample.iter_mut().enumerate() {
        *m = mag(x[i * stride + stride / 2]);
    }
    if sample.iter().any(|&m| m >= EXP) {
        return None;
    }
    let (_, &mut t, _) = sample.select_nth_unstable_by(rank, |a, b| b.cmp(a));
    // A sample of mostly zeros (a server's sum of sparse payloads): collect the nonzeros.
    let t = t.max(1);
    // The sample's share, four times over, with room for small k (`collect` may pass it by
    // one block of 32 before it stops).
    let cap = (4 * (rank + 1) * n / SAMPLE).max(2 * k);
    let mut cand = Vec::with_capacity(cap + 32);
    if !collect(x, t, cap, &mut cand) || cand.len() < k {
        return None;
    }
    // A non-finite element's magnitude is above every finite `t`: the first collected is the
    // first of `x`.
    if let Some(&(i, _)) = cand.iter().find(|&&(_, v)| !v.is_finite()) {
        return Some(Err(i as usize));
    }
    Some(Ok(choose(Vec::new(), cand, k)))
}

/// The top k of `x` as (index, value) pairs in index order, or the index of a non-finite
/// element.
fn select(x: &[f32], k: usize) -> Result<Vec<(u32, f32)>, usize> {
    let par = crate::par::enabled(x.len());
    if !par {
        if let Some(r) = select_sampled(x, k) {
            return r;
        }
    }
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
    Ok(choose(hi, cand, need))
}

/// The top k given `hi`, elements all among them, and `cand`, candidates of which the `need`
/// largest (ties to the lower index) complete them; both lists in index order, and so is the
/// result.
fn choose(hi: Entries, cand: Entries, need: usize) -> Entries {
    let k = hi.len() + need;
    // The threshold among the candidates, then the chosen candidates in index order.
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
    out
}

impl TopK {
    /// Validated (index, value) pairs of a payload.
    fn entries<'a>(&self, payload: &'a [u8]) -> Result<(&'a [u8], &'a [u8]), KernelError> {
        self.base.check_payload(payload.len())?;
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

fn pairs<'a>(ib: &'a [u8], vb: &'a [u8]) -> impl Iterator<Item = (usize, f32)> + Clone + 'a {
    ib.chunks_exact(4).zip(vb.chunks_exact(4)).map(|(i, v)| {
        (
            u32::from_le_bytes([i[0], i[1], i[2], i[3]]) as usize,
            f32::from_le_bytes([v[0], v[1], v[2], v[3]]),
        )
    })
}

impl Codec for TopK {
    fn info(&self) -> &CodecInfo {
        &self.base
    }
    fn encode(&mut self, input: &[f32], _ctx: &RoundCtx, out: &mut Vec<u8>) -> Result<()> {
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
        let dst = prepare(out, self.base.payload);
        let (ib, vb) = dst.split_at_mut(4 * k);
        for ((i, v), &(idx, val)) in ib.chunks_exact_mut(4).zip(vb.chunks_exact_mut(4)).zip(&top) {
            i.copy_from_slice(&idx.to_le_bytes());
            v.copy_from_slice(&val.to_le_bytes());
        }
        Ok(())
    }
    fn decode(&self, payload: &[u8], _ctx: &RoundCtx, out: &mut [f32], add: bool) -> Result<()> {
        let (ib, vb) = self.entries(payload)?;
        scatter(out, pairs(ib, vb), add);
        Ok(())
    }
}

impl Subtract for TopK {
    fn subtract_decoded(&self, payload: &[u8], _ctx: &RoundCtx, acc: &mut [f32]) -> Result<bool> {
        let (ib, vb) = self.entries(payload)?;
        Ok(subtract_at(acc, pairs(ib, vb)))
    }
}
