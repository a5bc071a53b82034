//! `minmax` (QSGD-TF): b-bit codes between the per-bucket minimum and maximum.
//!
//! Wire format: `nb` pairs of little-endian f32 `(min, max)` (`elem::min_max` of each bucket,
//! a zero written as +0.0, see [`elem::canonical_zero`]), then a bit stream of `n` codes of `b`
//! bits, code `i = elem::minmax_code(x_i, min, step, 2^b - 1, u_i)` with
//! `step = elem::minmax_step(min, max, 2^b - 1)` of element `i`'s bucket and `u_i` the rounding
//! uniform of element `i`. Size `8 * nb + 4 * ceil(n * b / 32)`. Decoded by
//! `super::fast::minmax_value(code, min, step)`.
//!
//! Since wire format version 3 the code is computed without a division:
//! `t = (x_i - min) * inv_step` with the per-bucket `inv_step = 1 / step`
//! ([`elem::minmax_inv_step`]; two correctly rounded f32 operations, no FMA), then
//! `code = stochastic_round(clamp(t, 0, 2^b - 1), u_i)`, and `u_i` is a 16-bit uniform
//! (`bits16 * 2^-16`, four per SplitMix64 draw, [`crate::rng::Stream::uniform`]). Only a bucket
//! whose `1 / step` overflows f32 (`step` below `2^-128`) divides, `t = (x_i - min) / step`.
//! `E[code] = t + β` with `0 <= β < 2^-16` (the uniform's resolution), and `t` is within a
//! relative `2^-23` of the exact `(x_i - min) / step`.

use super::{
    bucket_runs, bucket_suffix, bucketed, decode_groups, encode_groups, par_segments,
    par_segments_out, prepare, GroupDecoder, GroupEncoder,
};
use std::sync::Arc;

use crate::chain::Body;
use crate::codec::{Codec, CodecInfo, RoundCtx};
use crate::elem;
use crate::error::{KernelError, Result};
use crate::rng::Stream;
use crate::simd::{multiversion, stream_bytes, with_width};
use crate::spec::{BuildOptions, CodecSpec, Entry, Kind};
use crate::stats::{bucket_min_max, Buckets};
use pushpull_proto::placement::PayloadModel;

/// The registry's `minmax`: `bits`, `bucket`.
pub const ENTRY: Entry = Entry {
    name: "minmax",
    keys: &["bits", "bucket"],
    own_keys: &[],
    parse: |keys| {
        Ok(Arc::new(MinMaxSpec {
            bits: keys.bits()?,
            bucket: keys.bucket()?,
        }))
    },
};

/// Min-max's settings: QSGD-TF's quantisation between each bucket's min and max.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinMaxSpec {
    /// Bits per element.
    pub bits: u32,
    /// Bucket length (None: the whole chunk).
    pub bucket: Option<usize>,
}

impl CodecSpec for MinMaxSpec {
    fn kind(&self) -> Kind {
        Kind::new("minmax", true, true)
    }
    fn build(&self, base: CodecInfo, _: &BuildOptions) -> Result<Body> {
        Ok(Body::Plain(Box::new(MinMax::new(
            base,
            self.bits,
            self.bucket,
        ))))
    }
    fn payload(&self, _: u64) -> PayloadModel {
        bucketed(0, 8, self.bucket, self.bits)
    }
    fn display_name(&self) -> String {
        let b = bucket_suffix(self.bucket);
        format!("minmax(bits={}{b})", self.bits)
    }
    fn params(&self, put: &mut dyn FnMut(&'static str, String)) {
        put("bits", self.bits.to_string());
        if let Some(b) = self.bucket {
            put("bucket", b.to_string());
        }
    }
}

/// The minmax compressor.
pub(crate) struct MinMax {
    base: CodecInfo,
    bits: u32,
    bk: Buckets,
}

/// Per-bucket `(min, step, inv_step)` (`inv_step = elem::minmax_inv_step(step)`).
type Params = [(f32, f32, f32)];

impl MinMax {
    pub fn new(base: CodecInfo, bits: u32, bucket: Option<usize>) -> MinMax {
        let bk = Buckets::new(base.n, bucket);
        let size = 8 * bk.count + stream_bytes(base.n, bits);
        MinMax {
            base: base.sized(size),
            bits,
            bk,
        }
    }

    fn levels(&self) -> u32 {
        (1u32 << self.bits) - 1
    }
}

/// Min-max codes with per-bucket `(min, step)`.
struct Coder<'a> {
    p: &'a Params,
    size: usize,
    last: usize,
    levels: u32,
}

impl GroupEncoder for Coder<'_> {
    const STOCHASTIC: bool = true;
    #[inline(always)]
    fn codes(&self, gi: usize, xs: &[f32], u: &[f32], c: &mut [u32]) {
        for (b, s, e) in bucket_runs(gi, xs.len(), self.size, self.last) {
            let (mn, st, inv) = self.p[b];
            let cs = c[s..e].iter_mut().zip(&xs[s..e]).zip(&u[s..e]);
            if inv != 0.0 {
                // The hot loop: one subtraction and one multiplication per element.
                for ((ci, &x), &ui) in cs {
                    *ci = super::fast::clamped_round((x - mn) * inv, self.levels, ui);
                }
            } else {
                // A constant bucket (step 0) or a subnormal step whose reciprocal overflows.
                for ((ci, &x), &ui) in cs {
                    *ci = super::fast::minmax_code(x, mn, st, 0.0, self.levels, ui);
                }
            }
        }
    }
}

impl GroupDecoder for Coder<'_> {
    #[inline(always)]
    fn values(&self, gi: usize, c: &[u32], v: &mut [f32]) {
        for (b, s, e) in bucket_runs(gi, c.len(), self.size, self.last) {
            let (mn, st, _) = self.p[b];
            for (vi, &ci) in v[s..e].iter_mut().zip(&c[s..e]) {
                *vi = super::fast::minmax_value(ci, mn, st);
            }
        }
    }
}

fn coder<'a>(p: &'a Params, bk: &Buckets, bits: u32) -> Coder<'a> {
    Coder {
        p,
        size: bk.size,
        last: bk.n.saturating_sub(1),
        levels: (1u32 << bits) - 1,
    }
}

#[inline(always)]
fn encode_impl(
    x: &[f32],
    i0: usize,
    dst: &mut [u8],
    stream: Stream,
    p: &Params,
    bk: &Buckets,
    bits: u32,
) {
    let enc = coder(p, bk, bits);
    with_width!(bits, W => encode_groups::<W, _>(x, i0, stream, dst, &enc))
}

multiversion! {
    fn encode(x: &[f32], i0: usize, dst: &mut [u8], stream: Stream, p: &Params, bk: &Buckets, bits: u32) = encode_impl;
}

#[inline(always)]
fn decode_impl<const ADD: bool>(
    src: &[u8],
    i0: usize,
    out: &mut [f32],
    p: &Params,
    bk: &Buckets,
    bits: u32,
) {
    let dec = coder(p, bk, bits);
    with_width!(bits, W => decode_groups::<W, ADD, _>(src, i0, out, &dec))
}

multiversion! {
    fn decode(src: &[u8], i0: usize, out: &mut [f32], p: &Params, bk: &Buckets, bits: u32) = decode_impl::<false>;
}
multiversion! {
    fn decode_add(src: &[u8], i0: usize, out: &mut [f32], p: &Params, bk: &Buckets, bits: u32) = decode_impl::<true>;
}

impl Codec for MinMax {
    fn info(&self) -> &CodecInfo {
        &self.base
    }
    fn encode(&mut self, input: &[f32], ctx: &RoundCtx, out: &mut Vec<u8>) -> Result<()> {
        let (mm, bad) = bucket_min_max(input, &self.bk);
        if bad {
            return Err(self.base.non_finite(input));
        }
        let levels = self.levels();
        let mut params = Vec::with_capacity(mm.len());
        for (b, &(mn, mx)) in mm.iter().enumerate() {
            let step = elem::minmax_step(mn, mx, levels);
            if !step.is_finite() {
                return Err(KernelError::overflow(
                    &self.base.name,
                    format!("bucket {b}: max - min = {mx} - {mn} overflows f32"),
                ));
            }
            params.push((mn, step, elem::minmax_inv_step(step)));
        }
        let dst = prepare(out, self.base.payload);
        let (head, bits) = dst.split_at_mut(8 * self.bk.count);
        super::put_f32s(head, mm.iter().flat_map(|&(a, b)| [a, b]));
        let stream = self.base.rounding(ctx.round);
        par_segments(input, self.bits, bits, |xs, i0, d| {
            encode(xs, i0, d, stream, &params, &self.bk, self.bits)
        });
        Ok(())
    }
    fn decode(&self, payload: &[u8], _ctx: &RoundCtx, out: &mut [f32], add: bool) -> Result<()> {
        self.base.check_payload(payload.len())?;
        let nb = self.bk.count;
        let levels = self.levels();
        let mut params = Vec::with_capacity(nb);
        for b in 0..nb {
            let mn = crate::simd::get_f32(payload, 2 * b);
            let mx = crate::simd::get_f32(payload, 2 * b + 1);
            let step = elem::minmax_step(mn, mx, levels);
            if !(mn.is_finite() && mx.is_finite() && mn <= mx && step.is_finite()) {
                return Err(KernelError::malformed(
                    &self.base.name,
                    format!("bucket {b}: min {mn} and max {mx} are not finite with min <= max"),
                ));
            }
            params.push((mn, step, 0.0));
        }
        let bits = &payload[8 * nb..];
        if !super::tail_bits_zero(bits, self.base.n, self.bits) {
            return Err(KernelError::malformed(
                &self.base.name,
                "padding bits after the last code are not zero",
            ));
        }
        let f = if add { decode_add } else { decode };
        par_segments_out(bits, self.bits, out, |s, i0, o| {
            f(s, i0, o, &params, &self.bk, self.bits)
        });
        Ok(())
    }
}
