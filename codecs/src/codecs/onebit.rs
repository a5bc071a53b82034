//! `onebit`: one sign bit per element and one f32 scale (signSGD / 1-bit SGD).
//!
//! Wire format: f32 scale (`elem::mean_abs` of the whole chunk when `scaling = true`, else
//! 1.0), then a bit stream of `n` sign bits (`elem::sign_bit`: set for `x < 0`).
//! Size `4 + 4 * ceil(n / 32)`. Element `i` decodes to `-scale` if its bit is set, else `scale`.

use super::{decode_groups, par_segments_out, prepare, Base, Format, GroupDecoder, Subtract};
use crate::elem;
use crate::elem::REDUCE_BLOCK;
use crate::error::KernelError;
use crate::simd::{multiversion, store_u32, stream_bytes, EXP};
use crate::RoundCtx;
use rayon::prelude::*;

/// The onebit compressor.
pub(crate) struct OneBit {
    base: Base,
    scaling: bool,
}

impl OneBit {
    pub fn new(base: Base, scaling: bool) -> OneBit {
        OneBit { base, scaling }
    }
}

/// Sign words of `x` (elements `i0..`, `i0 % 256 == 0`) into `dst`, and the abs-sum of each
/// 256-element block into `partials` (the blocked order of `elem::sum_abs`), in one pass;
/// returns non-zero if some element is not finite.
#[inline(always)]
fn signs_sums_impl(x: &[f32], dst: &mut [u8], partials: &mut [f32]) -> u32 {
    let mut bad = 0u32;
    let words = dst.len() / 4;
    assert!(words >= x.len().div_ceil(32) && partials.len() >= x.len().div_ceil(REDUCE_BLOCK));
    let p = dst.as_mut_ptr();
    for (bi, blk) in x.chunks(REDUCE_BLOCK).enumerate() {
        partials[bi] = crate::stats::tree_sum(blk, false);
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
            // SAFETY: wi < ceil(x.len() / 32) <= words.
            unsafe { store_u32(p, wi, w) };
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
            unsafe { store_u32(p, wi, w) };
        }
    }
    bad
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
    fn decode_as(&self, payload: &[u8], out: &mut [f32], mode: Mode) -> Result<(), KernelError> {
        self.base.check_payload(self.size(), payload.len())?;
        let scale = crate::simd::get_f32(payload, 0);
        if !scale.is_finite() || scale < 0.0 {
            return Err(KernelError::malformed(
                &self.base.name,
                format!("scale {scale} is not a finite number >= 0"),
            ));
        }
        let bits = &payload[4..];
        if !super::tail_bits_zero(bits, self.base.n, 1) {
            return Err(KernelError::malformed(
                &self.base.name,
                "padding bits after the last sign bit are not zero",
            ));
        }
        let (add, scale) = match mode {
            Mode::Store => (false, scale),
            Mode::Add => (true, scale),
            // `a - v == a + (-v)` exactly: the decoding with the scale negated, added.
            Mode::Subtract => (true, -scale),
        };
        let f = if add { expand_add } else { expand };
        par_segments_out(bits, 1, out, |s, i0, o| f(s, i0, o, scale));
        Ok(())
    }
}

/// What [`OneBit::decode_as`] does with the decoded values.
#[derive(Clone, Copy)]
enum Mode {
    /// `out = D(payload)`.
    Store,
    /// `out += D(payload)`.
    Add,
    /// `out -= D(payload)`.
    Subtract,
}

impl Format for OneBit {
    fn base(&self) -> &Base {
        &self.base
    }
    fn size(&self) -> usize {
        4 + stream_bytes(self.base.n, 1)
    }
    fn stochastic(&self) -> bool {
        false
    }
    fn encode(
        &mut self,
        input: &[f32],
        _ctx: &RoundCtx,
        out: &mut Vec<u8>,
    ) -> Result<(), KernelError> {
        let n = self.base.n;
        // One pass: sign words and the blocked |x| sums (the scale), in parallel segments.
        let mut partials = vec![0f32; n.div_ceil(REDUCE_BLOCK)];
        let size = self.size();
        let dst = prepare(out, size);
        let (head, bits) = dst.split_at_mut(4);
        let bad = if crate::par::enabled(n) {
            let seg = crate::par::SEG;
            input
                .par_chunks(seg)
                .zip(bits.par_chunks_mut(seg / 8))
                .zip(partials.par_chunks_mut(seg / REDUCE_BLOCK))
                .map(|((xs, d), ps)| signs_sums(xs, d, ps))
                .reduce(|| 0, |a, b| a | b)
        } else {
            signs_sums(input, bits, &mut partials)
        };
        if bad != 0 {
            out.clear();
            return Err(self.base.non_finite(input));
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
        head.copy_from_slice(&scale.to_le_bytes());
        Ok(())
    }
    fn decode(
        &self,
        payload: &[u8],
        _ctx: &RoundCtx,
        out: &mut [f32],
        add: bool,
    ) -> Result<(), KernelError> {
        self.decode_as(payload, out, if add { Mode::Add } else { Mode::Store })
    }
    fn subtract(&self) -> Option<Subtract<Self>> {
        Some(|c, payload, _ctx, acc| {
            c.decode_as(payload, acc, Mode::Subtract)?;
            Ok(crate::simd::first_non_finite(acc).is_none())
        })
    }
}
