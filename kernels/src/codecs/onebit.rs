//! `onebit`: one sign bit per element and one f32 scale (signSGD / 1-bit SGD).
//!
//! Wire format: f32 scale (`elem::mean_abs` of the whole chunk when `scaling = true`, else
//! 1.0), then a bit stream of `n` sign bits (`elem::sign_bit`: set for `x < 0`).
//! Size `4 + 4 * ceil(n / 32)`. Element `i` decodes to `-scale` if its bit is set, else `scale`.

use super::{decode_groups, encode_groups, par_segments, par_segments_out, prepare, Base};
use crate::elem;
use crate::error::KernelError;
use crate::simd::{multiversion, stream_bytes, EXP};
use crate::stats::{bucket_sums, Buckets};
use crate::{Compressor, RoundCtx};

/// The onebit compressor.
pub(crate) struct OneBit {
    base: Base,
    scaling: bool,
}

impl OneBit {
    pub fn new(base: Base, scaling: bool) -> OneBit {
        OneBit { base, scaling }
    }

    fn size(&self) -> usize {
        4 + stream_bytes(self.base.n, 1)
    }
}

#[inline(always)]
fn signs_impl(x: &[f32], i0: usize, dst: &mut [u8]) -> u32 {
    let bad = std::cell::Cell::new(0u32);
    encode_groups::<1>(x, i0, None, dst, |_, xs, _, c| {
        let mut b = 0u32;
        for (ct, v) in c.iter_mut().zip(xs) {
            *ct = elem::sign_bit(*v);
            b |= ((v.to_bits() & EXP) == EXP) as u32;
        }
        bad.set(bad.get() | b);
    });
    bad.get()
}

multiversion! {
    fn signs(x: &[f32], i0: usize, dst: &mut [u8]) -> u32 = signs_impl;
}

#[inline(always)]
fn expand_impl<const ADD: bool>(src: &[u8], i0: usize, out: &mut [f32], scale: f32) {
    decode_groups::<1, ADD>(src, i0, out, |_, c, v| {
        for (vt, &ct) in v.iter_mut().zip(c) {
            *vt = if ct != 0 { -scale } else { scale };
        }
    });
}

multiversion! {
    fn expand(src: &[u8], i0: usize, out: &mut [f32], scale: f32) = expand_impl::<false>;
}
multiversion! {
    fn expand_add(src: &[u8], i0: usize, out: &mut [f32], scale: f32) = expand_impl::<true>;
}

impl OneBit {
    fn decode(&self, payload: &[u8], out: &mut [f32], add: bool) -> Result<(), KernelError> {
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
        let f = if add { expand_add } else { expand };
        par_segments_out(bits, 1, out, |s, i0, o| f(s, i0, o, scale));
        Ok(())
    }
}

impl Compressor for OneBit {
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
        let n = self.base.n;
        let scale = if self.scaling {
            let s = bucket_sums(input, &Buckets::new(n, None), false);
            let sum = s.first().copied().unwrap_or(0.0);
            let m = if n == 0 { 0.0 } else { (sum / n as f64) as f32 };
            if !m.is_finite() {
                return Err(self.base.non_finite(input));
            }
            m
        } else {
            1.0
        };
        let dst = prepare(out, self.size());
        dst[..4].copy_from_slice(&scale.to_le_bytes());
        let bad = std::sync::atomic::AtomicU32::new(0);
        par_segments(input, 1, &mut dst[4..], |xs, i0, d| {
            let b = signs(xs, i0, d);
            bad.fetch_or(b, std::sync::atomic::Ordering::Relaxed);
        });
        if bad.into_inner() != 0 {
            out.clear();
            return Err(self.base.non_finite(input));
        }
        Ok(())
    }
    fn decompress(&self, payload: &[u8], _ctx: &RoundCtx, out: &mut [f32]) -> Result<(), KernelError> {
        self.base.check("output", out.len())?;
        self.decode(payload, out, false)
    }
    fn decompress_add(
        &self,
        payload: &[u8],
        _ctx: &RoundCtx,
        acc: &mut [f32],
    ) -> Result<(), KernelError> {
        self.base.check("accumulator", acc.len())?;
        self.decode(payload, acc, true)
    }
}
