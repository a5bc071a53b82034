//! `onebit`: one sign bit per element and one f32 scale (signSGD / 1-bit SGD).
//!
//! Wire format: f32 scale (`elem::mean_abs` of the whole chunk when `scaling = true`, else
//! 1.0), then a bit stream of `n` sign bits (`elem::sign_bit`: set for `x < 0`).
//! Size `4 + 4 * ceil(n / 32)`. Element `i` decodes to `-scale` if its bit is set, else `scale`.

use super::{decode_groups, par_segments_out, prepare, GroupDecoder};
use std::sync::Arc;

use crate::chain::{Body, EncodeFed, Fed, Nesterov, Subtract};
use crate::codec::{Codec, CodecInfo, RoundCtx};
use crate::elem;
use crate::elem::REDUCE_BLOCK;
use crate::error::{KernelError, Result};
use crate::simd::{multiversion, store_u32, stream_bytes, EXP};
use crate::spec::{BuildOptions, CodecSpec, Entry, KeyInfo, Kind};
use pushpull_proto::placement::PayloadModel;
use rayon::prelude::*;

/// The registry's `onebit`: `scaling`; or with `columns`, the column-wise variant
/// ([`super::onebit_col`]).
pub const ENTRY: Entry = Entry {
    name: "onebit",
    keys: &[],
    own_keys: &[
        KeyInfo {
            name: "scaling",
            aliases: &["byteps_compressor_onebit_scaling"],
            applies_to: "onebit",
            values: "true, false",
            default: "false",
        },
        KeyInfo {
            name: "columns",
            aliases: &[],
            applies_to: "onebit",
            values: "a whole number >= 1 that divides the tensor's length: its column count, \
                     column-major (CNTK's layout: a column is len / columns contiguous elements); \
                     selects the column-wise variant (two levels per column, chunks cut at column \
                     boundaries), which requires `ef` (1-bit SGD's residual: vanilla, or none)",
            default: "absent (one scale for the chunk)",
        },
    ],
    parse: |keys| match keys.get("columns") {
        Some(columns) => super::onebit_col::parse(keys, columns),
        None => Ok(Arc::new(OneBitSpec {
            scaling: keys.flag("scaling", false)?,
        })),
    },
};

/// Onebit's settings: sign bits and one scale per chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OneBitSpec {
    /// Scale = mean |x| (else 1).
    pub scaling: bool,
}

impl CodecSpec for OneBitSpec {
    fn kind(&self) -> Kind {
        Kind::new("onebit", false, false)
    }
    fn build(&self, base: CodecInfo, _: &BuildOptions) -> Result<Body> {
        Ok(Body::Fused(Box::new(OneBit::new(base, self.scaling))))
    }
    fn payload(&self, _: u64) -> PayloadModel {
        PayloadModel {
            header: 4,
            stream_bits: 1,
            ..PayloadModel::default()
        }
    }
    fn display_name(&self) -> String {
        format!("onebit(scaling={})", self.scaling)
    }
    fn params(&self, put: &mut dyn FnMut(&'static str, String)) {
        put("scaling", self.scaling.to_string());
    }
}

/// The onebit compressor.
pub(crate) struct OneBit {
    base: CodecInfo,
    scaling: bool,
}

impl OneBit {
    pub fn new(base: CodecInfo, scaling: bool) -> OneBit {
        let size = 4 + stream_bytes(base.n, 1);
        OneBit {
            base: base.sized(size),
            scaling,
        }
    }
}

/// Sign words of `x` (elements `i0..`, `i0 % 256 == 0`) into `dst`, and the abs-sum of each
/// 256-element block into `partials` (the blocked order of `elem::sum_abs`), in one pass;
/// returns non-zero if some element is not finite.
#[inline(always)]
fn signs_sums_impl(x: &[f32], dst: &mut [u8], partials: &mut [f32]) -> u32 {
    let words = dst.len() / 4;
    assert!(words >= x.len().div_ceil(32) && partials.len() >= x.len().div_ceil(REDUCE_BLOCK));
    let p = dst.as_mut_ptr();
    let mut bad = 0u32;
    for (bi, blk) in x.chunks(REDUCE_BLOCK).enumerate() {
        // SAFETY: block `bi` of `x` has its words in `dst` (asserted above).
        bad |= unsafe { block_signs_sum(blk, bi, p, &mut partials[bi]) };
    }
    bad
}

/// Error feedback's input as onebit forms it ([`Fed`]'s fields), whole or one segment of it
/// (the parallel path's).
struct FedSeg<'a> {
    g: &'a [f32],
    e: &'a [f32],
    f: f32,
    vanilla: bool,
    nesterov: Option<Nesterov<'a>>,
}

impl<'a> FedSeg<'a> {
    /// The first `at` elements, and the rest.
    fn split_at(self, at: usize) -> (FedSeg<'a>, FedSeg<'a>) {
        let FedSeg {
            g,
            e,
            f,
            vanilla,
            nesterov,
        } = self;
        let ((g, g2), (e, e2)) = (g.split_at(at), e.split_at(at));
        let (n, n2) = match nesterov {
            Some(Nesterov { momentum, mu, next }) => {
                let ((m, m2), (next, next2)) = (momentum.split_at(at), next.split_at_mut(at));
                let head = Nesterov {
                    momentum: m,
                    mu,
                    next,
                };
                let tail = Nesterov {
                    momentum: m2,
                    mu,
                    next: next2,
                };
                (Some(head), Some(tail))
            }
            None => (None, None),
        };
        let head = FedSeg {
            g,
            e,
            f,
            vanilla,
            nesterov: n,
        };
        let tail = FedSeg {
            g: g2,
            e: e2,
            f,
            vanilla,
            nesterov: n2,
        };
        (head, tail)
    }

    /// Segments of `seg` elements (the last one shorter).
    fn split(self, seg: usize) -> Vec<FedSeg<'a>> {
        let mut segs = Vec::with_capacity(self.g.len().div_ceil(seg));
        let mut rest = self;
        while rest.g.len() > seg {
            let (head, tail) = rest.split_at(seg);
            segs.push(head);
            rest = tail;
        }
        segs.push(rest);
        segs
    }
}

/// [`signs_sums_impl`] of error feedback's input ([`FedSeg`]: `elem::fed` of the gradient, or
/// of Nesterov momentum's `elem::nesterov` output, writing the next momentum), formed block by
/// block into `x` as it goes (each block is then signed and summed from the cache): one pass
/// over the inputs. Non-zero if some element of `x` or of the next momentum is not finite.
#[inline(always)]
fn fed_signs_sums_impl(
    fed: FedSeg<'_>,
    x: &mut [f32],
    dst: &mut [u8],
    partials: &mut [f32],
) -> u32 {
    let FedSeg {
        g,
        e,
        f,
        vanilla,
        mut nesterov,
    } = fed;
    let words = dst.len() / 4;
    assert!(words >= x.len().div_ceil(32) && partials.len() >= x.len().div_ceil(REDUCE_BLOCK));
    assert!(g.len() == x.len() && e.len() == x.len());
    if let Some(n) = &nesterov {
        assert!(n.momentum.len() == x.len() && n.next.len() == x.len());
    }
    let p = dst.as_mut_ptr();
    let mut bad = 0u32;
    let blocks = x
        .chunks_mut(REDUCE_BLOCK)
        .zip(g.chunks(REDUCE_BLOCK))
        .zip(e.chunks(REDUCE_BLOCK));
    for (bi, ((blk, gb), eb)) in blocks.enumerate() {
        match &mut nesterov {
            None => {
                for ((xi, gi), ei) in blk.iter_mut().zip(gb).zip(eb) {
                    *xi = elem::fed(*gi, *ei, f, vanilla);
                }
            }
            Some(Nesterov {
                momentum: m,
                mu,
                next,
            }) => {
                let len = blk.len();
                let at = bi * REDUCE_BLOCK;
                let (mb, nb) = (&m[at..at + len], &mut next[at..at + len]);
                let (gb, eb) = (&gb[..len], &eb[..len]);
                let mut b = 0u32;
                for i in 0..len {
                    let (mn, v) = elem::nesterov(gb[i], mb[i], *mu);
                    // A non-finite `v` makes `p` non-finite too, which the block's signs pass
                    // flags.
                    b |= ((mn.to_bits() & EXP) == EXP) as u32;
                    nb[i] = mn;
                    blk[i] = elem::fed(v, eb[i], f, vanilla);
                }
                bad |= b;
            }
        }
        // SAFETY: as in `signs_sums_impl`.
        bad |= unsafe { block_signs_sum(blk, bi, p, &mut partials[bi]) };
    }
    bad
}

/// Block `bi` of [`signs_sums_impl`]: its sign words at `dst` and its abs-sum in `partial`.
///
/// # Safety
/// `dst` is valid for writes of the words of elements up to `bi * REDUCE_BLOCK + blk.len()`.
#[inline(always)]
unsafe fn block_signs_sum(blk: &[f32], bi: usize, dst: *mut u8, partial: &mut f32) -> u32 {
    *partial = crate::stats::tree_sum(blk, false);
    let mut bad = 0u32;
    let mut groups = blk.chunks_exact(32);
    let mut wi = bi * (REDUCE_BLOCK / 32);
    for g in &mut groups {
        let mut w = 0u32;
        let mut b = 0u32;
        for (t, &v) in g.iter().enumerate() {
            w |= elem::sign_bit(v) << t;
            b |= ((v.to_bits() & EXP) == EXP) as u32;
        }
        bad |= b;
        // SAFETY: guaranteed by the caller.
        unsafe { store_u32(dst, wi, w) };
        wi += 1;
    }
    let rem = groups.remainder();
    if !rem.is_empty() {
        let mut w = 0u32;
        for (t, &v) in rem.iter().enumerate() {
            w |= elem::sign_bit(v) << t;
            bad |= ((v.to_bits() & EXP) == EXP) as u32;
        }
        // SAFETY: as above.
        unsafe { store_u32(dst, wi, w) };
    }
    bad
}

multiversion! {
    fn fed_signs_sums(fed: FedSeg<'_>, x: &mut [f32], dst: &mut [u8], partials: &mut [f32]) -> u32 = fed_signs_sums_impl;
}

/// `acc -= D(payload)` for the sign words `src` of `acc`'s elements (a segment starting at a
/// multiple of 32), as
/// decoding with the scale negated and adding it (`a - v == a + (-v)` exactly, signed zeros
/// included: the bits of `decompress` into a buffer and a subtraction); returns non-zero if a
/// result is not finite.
#[inline(always)]
fn subtract_signs_impl(src: &[u8], acc: &mut [f32], scale: f32) -> u32 {
    assert!(src.len() >= 4 * acc.len().div_ceil(32));
    let mut bad = 0u32;
    for (wi, g) in acc.chunks_mut(32).enumerate() {
        // SAFETY: word `wi` lies within `src` (asserted above).
        let w = unsafe { crate::simd::load_u32(src.as_ptr(), wi) };
        let mut b = 0u32;
        for (t, a) in g.iter_mut().enumerate() {
            let v = if (w >> t) & 1 != 0 { scale } else { -scale };
            let r = *a + v;
            b |= ((r.to_bits() & EXP) == EXP) as u32;
            *a = r;
        }
        bad |= b;
    }
    bad
}

multiversion! {
    fn subtract_signs(src: &[u8], acc: &mut [f32], scale: f32) -> u32 = subtract_signs_impl;
}

multiversion! {
    fn signs_sums(x: &[f32], dst: &mut [u8], partials: &mut [f32]) -> u32 = signs_sums_impl;
}

/// `±scale`.
struct Expand {
    scale: f32,
}

impl GroupDecoder for Expand {
    #[inline(always)]
    fn values(&self, _gi: usize, c: &[u32], v: &mut [f32]) {
        for (vt, &ct) in v.iter_mut().zip(c) {
            *vt = if ct != 0 { -self.scale } else { self.scale };
        }
    }
}

#[inline(always)]
fn expand_impl<const ADD: bool>(src: &[u8], i0: usize, out: &mut [f32], scale: f32) {
    decode_groups::<1, ADD, _>(src, i0, out, &Expand { scale });
}

multiversion! {
    fn expand(src: &[u8], i0: usize, out: &mut [f32], scale: f32) = expand_impl::<false>;
}
multiversion! {
    fn expand_add(src: &[u8], i0: usize, out: &mut [f32], scale: f32) = expand_impl::<true>;
}

impl OneBit {
    /// The scale of a payload, once its length, scale and padding are checked.
    fn checked_scale(&self, payload: &[u8]) -> Result<f32, KernelError> {
        self.base.check_payload(payload.len())?;
        let scale = crate::simd::get_f32(payload, 0);
        if !scale.is_finite() || scale < 0.0 {
            return Err(KernelError::malformed(
                &self.base.name,
                format!("scale {scale} is not a finite number >= 0"),
            ));
        }
        if !super::tail_bits_zero(&payload[4..], self.base.n, 1) {
            return Err(KernelError::malformed(
                &self.base.name,
                "padding bits after the last sign bit are not zero",
            ));
        }
        Ok(scale)
    }

    /// Encodes the sign words and block sums that `signs` writes (returning its non-finite
    /// flag) into a payload with its scale: `Ok(false)`, with `out` empty, when `signs` saw a
    /// non-finite element.
    fn encode_signs(
        &self,
        out: &mut Vec<u8>,
        signs: impl FnOnce(&mut [u8], &mut [f32]) -> u32,
    ) -> Result<bool, KernelError> {
        let n = self.base.n;
        let mut partials = vec![0f32; n.div_ceil(REDUCE_BLOCK)];
        let bad = signs(&mut prepare(out, self.base.payload)[4..], &mut partials);
        if bad != 0 {
            out.clear();
            return Ok(false);
        }
        let scale = if self.scaling {
            let sum = elem::sum_partials(&partials);
            let m = if n == 0 { 0.0 } else { (sum / n as f64) as f32 };
            if !m.is_finite() {
                out.clear();
                return Err(KernelError::overflow(
                    &self.base.name,
                    "the sum of |x| overflows f32 within a block of 256 elements",
                ));
            }
            m
        } else {
            1.0
        };
        out[..4].copy_from_slice(&scale.to_le_bytes());
        Ok(true)
    }
}

impl Codec for OneBit {
    fn info(&self) -> &CodecInfo {
        &self.base
    }
    fn encode(&mut self, input: &[f32], _ctx: &RoundCtx, out: &mut Vec<u8>) -> Result<()> {
        let n = self.base.n;
        // One pass: sign words and the blocked |x| sums (the scale), in parallel segments.
        let finite = self.encode_signs(out, |bits, partials| {
            if !crate::par::enabled(n) {
                return signs_sums(input, bits, partials);
            }
            let seg = crate::par::SEG;
            input
                .par_chunks(seg)
                .zip(bits.par_chunks_mut(seg / 8))
                .zip(partials.par_chunks_mut(seg / REDUCE_BLOCK))
                .map(|((xs, d), ps)| signs_sums(xs, d, ps))
                .reduce(|| 0, |a, b| a | b)
        })?;
        if !finite {
            return Err(self.base.non_finite(input));
        }
        Ok(())
    }
    fn decode(&self, payload: &[u8], _ctx: &RoundCtx, out: &mut [f32], add: bool) -> Result<()> {
        let scale = self.checked_scale(payload)?;
        let f = if add { expand_add } else { expand };
        par_segments_out(&payload[4..], 1, out, |s, i0, o| f(s, i0, o, scale));
        Ok(())
    }
}

impl Subtract for OneBit {
    fn subtract_decoded(&self, payload: &[u8], _ctx: &RoundCtx, acc: &mut [f32]) -> Result<bool> {
        let scale = self.checked_scale(payload)?;
        let bits = &payload[4..];
        // One pass: the subtraction and its finiteness.
        let bad = if crate::par::enabled(acc.len()) {
            let seg = crate::par::SEG;
            acc.par_chunks_mut(seg)
                .zip(bits.par_chunks(seg / 8))
                .map(|(a, s)| subtract_signs(s, a, scale))
                .reduce(|| 0, |a, b| a | b)
        } else {
            subtract_signs(bits, acc, scale)
        };
        Ok(bad == 0)
    }
}

impl EncodeFed for OneBit {
    fn encode_fed(
        &mut self,
        fed: Fed<'_>,
        p: &mut [f32],
        _ctx: &RoundCtx,
        out: &mut Vec<u8>,
    ) -> Result<bool> {
        let n = self.base.n;
        let Fed {
            gradient: g,
            nesterov,
            residual: e,
            factor: f,
            vanilla,
        } = fed;
        let fed = FedSeg {
            g,
            e,
            f,
            vanilla,
            nesterov,
        };
        // `encode`'s pass, forming p as it goes.
        self.encode_signs(out, |bits, partials| {
            if !crate::par::enabled(n) {
                return fed_signs_sums(fed, p, bits, partials);
            }
            let seg = crate::par::SEG;
            fed.split(seg)
                .into_par_iter()
                .zip(p.par_chunks_mut(seg))
                .zip(bits.par_chunks_mut(seg / 8))
                .zip(partials.par_chunks_mut(seg / REDUCE_BLOCK))
                .map(|(((fed, x), d), ps)| fed_signs_sums(fed, x, d, ps))
                .reduce(|| 0, |a, b| a | b)
        })
    }
}
