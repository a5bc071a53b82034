//! `none` (fp32 as is), `fp16` and `bf16`: element-wise casts.
//!
//! Wire formats: `none` is `n` little-endian f32 (`4n` bytes); `fp16`/`bf16` are `n`
//! little-endian u16 from [`elem::f32_to_f16_sat`] / [`elem::f32_to_bf16_sat`] (`2n` bytes).
//! The casts saturate (beyond ±65504 for fp16 gives ±65504). Non-finite input is refused.

use std::sync::Arc;

use super::prepare;
use crate::chain::Body;
use crate::codec::{Codec, CodecInfo, RoundCtx};
use crate::elem;
use crate::error::Result;
use crate::simd::{load_u16, multiversion, store_u16, store_u32, EXP};
use crate::spec::{BuildOptions, CodecSpec, Entry, Keys, Kind};
use pushpull_proto::placement::PayloadModel;
use rayon::prelude::*;

/// The registry's `none`: fp32 as is.
pub const NONE: Entry = Entry::keyless("none", parse);
/// The registry's `fp16`.
pub const FP16: Entry = Entry::keyless("fp16", parse);
/// The registry's `bf16`.
pub const BF16: Entry = Entry::keyless("bf16", parse);

fn parse(keys: &Keys<'_>) -> Result<Arc<dyn CodecSpec>> {
    Ok(Arc::new(match keys.compressor {
        "fp16" => Cast::Fp16,
        "bf16" => Cast::Bf16,
        _ => Cast::None,
    }))
}

impl CodecSpec for Cast {
    fn kind(&self) -> Kind {
        let name = match self {
            Cast::None => "none",
            Cast::Fp16 => "fp16",
            Cast::Bf16 => "bf16",
        };
        Kind::new(name, false, true)
    }
    fn build(&self, base: CodecInfo, _: &BuildOptions) -> Result<Body> {
        Ok(Body::Plain(Box::new(CastCodec::new(base, *self))))
    }
    fn payload(&self, _: u64) -> PayloadModel {
        let per_element = if *self == Cast::None { 4 } else { 2 };
        PayloadModel {
            per_element,
            ..PayloadModel::default()
        }
    }
    fn display_name(&self) -> String {
        self.kind().name.into()
    }
    fn params(&self, _: &mut dyn FnMut(&'static str, String)) {}
}

/// Which cast: the settings of `none`, `fp16` and `bf16`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cast {
    /// fp32 as is.
    None,
    /// IEEE binary16, saturating.
    Fp16,
    /// bfloat16, saturating.
    Bf16,
}

impl Cast {
    fn width(self) -> usize {
        match self {
            Cast::None => 4,
            Cast::Fp16 | Cast::Bf16 => 2,
        }
    }
}

/// An element-wise cast compressor.
pub(crate) struct CastCodec {
    base: CodecInfo,
    cast: Cast,
}

impl CastCodec {
    pub fn new(base: CodecInfo, cast: Cast) -> CastCodec {
        let size = base.n * cast.width();
        CastCodec {
            base: base.sized(size),
            cast,
        }
    }
}

// ---- fp32 ----------------------------------------------------------------------------------

#[inline(always)]
fn copy_f32_impl(x: &[f32], dst: &mut [u8]) -> bool {
    assert_eq!(dst.len(), 4 * x.len());
    if cfg!(target_endian = "big") {
        let p = dst.as_mut_ptr();
        for (i, v) in x.iter().enumerate() {
            // SAFETY: i < x.len() and dst holds 4 * x.len() bytes.
            unsafe { store_u32(p, i, v.to_bits()) };
        }
        return crate::simd::all_finite_serial(x);
    }
    // Little-endian: the payload is the input's bytes. Check and copy in cache-sized pieces.
    let mut ok = true;
    for (xs, d) in x.chunks(2048).zip(dst.chunks_mut(4 * 2048)) {
        let mut bad = 0u32;
        for v in xs {
            bad |= ((v.to_bits() & EXP) == EXP) as u32;
        }
        ok &= bad == 0;
        // SAFETY: any f32 slice may be viewed as bytes (no padding, u8 has no alignment or
        // validity requirement); the view lives only for this copy.
        let bytes = unsafe { std::slice::from_raw_parts(xs.as_ptr() as *const u8, 4 * xs.len()) };
        d.copy_from_slice(bytes);
    }
    ok
}

multiversion! {
    fn copy_f32(x: &[f32], dst: &mut [u8]) -> bool = copy_f32_impl;
}

#[inline(always)]
fn read_f32_impl<const ADD: bool>(src: &[u8], out: &mut [f32]) {
    for (o, s) in out.iter_mut().zip(src.chunks_exact(4)) {
        let v = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        if ADD {
            *o += v;
        } else {
            *o = v;
        }
    }
}

multiversion! {
    fn read_f32(src: &[u8], out: &mut [f32]) = read_f32_impl::<false>;
}
multiversion! {
    fn add_f32(src: &[u8], out: &mut [f32]) = read_f32_impl::<true>;
}

// ---- bf16 ----------------------------------------------------------------------------------

/// `elem::f32_to_bf16_sat` for finite `x`, in integer arithmetic that vectorises: clamp, then
/// round to nearest even on the upper 16 bits.
#[inline(always)]
fn bf16_bits(x: f32) -> u16 {
    const BF16_MAX: f32 = 3.389_531_4e38;
    let b = x.clamp(-BF16_MAX, BF16_MAX).to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

#[inline(always)]
fn to_bf16_impl(x: &[f32], dst: &mut [u8]) -> bool {
    assert!(dst.len() >= 2 * x.len());
    let p = dst.as_mut_ptr();
    let mut bad = 0u32;
    for (i, v) in x.iter().enumerate() {
        bad |= ((v.to_bits() & EXP) == EXP) as u32;
        // SAFETY: i < x.len(), and dst holds 2 * x.len() bytes.
        unsafe { store_u16(p, i, bf16_bits(*v)) };
    }
    bad == 0
}

multiversion! {
    fn to_bf16(x: &[f32], dst: &mut [u8]) -> bool = to_bf16_impl;
}

#[inline(always)]
fn from_bf16_impl<const ADD: bool>(src: &[u8], out: &mut [f32]) {
    assert!(src.len() >= 2 * out.len());
    let p = src.as_ptr();
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: i < out.len() and src holds 2 * out.len() bytes.
        let v = f32::from_bits((unsafe { load_u16(p, i) } as u32) << 16);
        if ADD {
            *o += v;
        } else {
            *o = v;
        }
    }
}

multiversion! {
    fn from_bf16(src: &[u8], out: &mut [f32]) = from_bf16_impl::<false>;
}
multiversion! {
    fn add_bf16(src: &[u8], out: &mut [f32]) = from_bf16_impl::<true>;
}

// ---- fp16 ----------------------------------------------------------------------------------

#[inline(always)]
fn to_f16_generic(x: &[f32], dst: &mut [u8]) -> bool {
    assert!(dst.len() >= 2 * x.len());
    let p = dst.as_mut_ptr();
    let mut bad = 0u32;
    for (i, v) in x.iter().enumerate() {
        bad |= ((v.to_bits() & EXP) == EXP) as u32;
        // SAFETY: i < x.len(), and dst holds 2 * x.len() bytes.
        unsafe { store_u16(p, i, elem::f32_to_f16_sat(*v)) };
    }
    bad == 0
}

#[inline(always)]
fn from_f16_generic<const ADD: bool>(src: &[u8], out: &mut [f32]) {
    for (o, s) in out.iter_mut().zip(src.chunks_exact(2)) {
        let v = elem::f16_to_f32(u16::from_le_bytes([s[0], s[1]]));
        if ADD {
            *o += v;
        } else {
            *o = v;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod f16c {
    //! F16C conversions (`vcvtps2ph` with round-to-nearest-even, `vcvtph2ps`): the same bits as
    //! `half`'s software conversion after the same clamp.
    use crate::simd::EXP;
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn to_f16(x: &[f32], dst: &mut [u8]) -> bool {
        let n8 = x.len() / 8;
        let lo = _mm256_set1_ps(-65504.0);
        let hi = _mm256_set1_ps(65504.0);
        let exp = _mm256_set1_epi32(EXP as i32);
        let mut bad = _mm256_setzero_si256();
        for i in 0..n8 {
            // SAFETY: `i * 8 + 8 <= x.len()` and `dst.len() == 2 * x.len()`.
            let v = _mm256_loadu_ps(x.as_ptr().add(i * 8));
            let e = _mm256_and_si256(_mm256_castps_si256(v), exp);
            bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(e, exp));
            let c = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(c);
            _mm_storeu_si128(dst.as_mut_ptr().add(i * 16) as *mut __m128i, h);
        }
        let ok = _mm256_testz_si256(bad, bad) == 1;
        let tail_ok = super::to_f16_generic(&x[n8 * 8..], &mut dst[n8 * 16..]);
        ok && tail_ok
    }

    /// # Safety
    /// The CPU must support AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub unsafe fn from_f16<const ADD: bool>(src: &[u8], out: &mut [f32]) {
        let n8 = out.len() / 8;
        for i in 0..n8 {
            // SAFETY: `src.len() == 2 * out.len()`, so both accesses are in bounds.
            let h = _mm_loadu_si128(src.as_ptr().add(i * 16) as *const __m128i);
            let mut v = _mm256_cvtph_ps(h);
            let p = out.as_mut_ptr().add(i * 8);
            if ADD {
                v = _mm256_add_ps(_mm256_loadu_ps(p), v);
            }
            _mm256_storeu_ps(p, v);
        }
        super::from_f16_generic::<ADD>(&src[n8 * 16..], &mut out[n8 * 8..]);
    }
}

fn has_f16c() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn to_f16(x: &[f32], dst: &mut [u8]) -> bool {
    assert_eq!(dst.len(), 2 * x.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: checked the CPU features; lengths asserted above.
        return unsafe { f16c::to_f16(x, dst) };
    }
    to_f16_generic(x, dst)
}

fn from_f16<const ADD: bool>(src: &[u8], out: &mut [f32]) {
    assert_eq!(src.len(), 2 * out.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: checked the CPU features; lengths asserted above.
        return unsafe { f16c::from_f16::<ADD>(src, out) };
    }
    from_f16_generic::<ADD>(src, out)
}

// ---- the codec -----------------------------------------------------------------------------

impl Codec for CastCodec {
    fn info(&self) -> &CodecInfo {
        &self.base
    }
    fn encode(&mut self, input: &[f32], _ctx: &RoundCtx, out: &mut Vec<u8>) -> Result<()> {
        let f = match self.cast {
            Cast::None => copy_f32,
            Cast::Fp16 => to_f16,
            Cast::Bf16 => to_bf16,
        };
        let w = self.cast.width();
        let dst = prepare(out, self.base.payload);
        let finite = if crate::par::enabled(input.len()) {
            let seg = crate::par::SEG;
            input
                .par_chunks(seg)
                .zip(dst.par_chunks_mut(seg * w))
                .map(|(xs, d)| f(xs, d))
                .reduce(|| true, |a, b| a && b)
        } else {
            f(input, dst)
        };
        if finite {
            Ok(())
        } else {
            out.clear();
            Err(self.base.non_finite(input))
        }
    }
    fn decode(&self, payload: &[u8], _ctx: &RoundCtx, out: &mut [f32], add: bool) -> Result<()> {
        self.base.check_payload(payload.len())?;
        let f = match (self.cast, add) {
            (Cast::None, false) => read_f32,
            (Cast::None, true) => add_f32,
            (Cast::Fp16, false) => from_f16::<false>,
            (Cast::Fp16, true) => from_f16::<true>,
            (Cast::Bf16, false) => from_bf16,
            (Cast::Bf16, true) => add_bf16,
        };
        let w = self.cast.width();
        if crate::par::enabled(out.len()) {
            let seg = crate::par::SEG;
            out.par_chunks_mut(seg)
                .zip(payload.par_chunks(seg * w))
                .for_each(|(o, s)| f(s, o));
        } else {
            f(payload, out)
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_casts_match_elem() {
        let mut vals: Vec<f32> = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            65504.0,
            65505.0,
            65519.99,
            65520.0,
            1e9,
            -1e9,
            f32::MAX,
            -f32::MAX,
            3.389_531_4e38,
            3.3895e38,
            6.1e-5,
            5.96e-8,
            2.98e-8,
            2.99e-8,
            1e-40,
            -1e-45,
            1.000_976_6,
            1.000_488_3,
            1.000_488_4,
        ];
        let mut h = 1u64;
        for _ in 0..200_000 {
            h = crate::rng::mix64(h);
            let v = f32::from_bits(h as u32);
            if v.is_finite() {
                vals.push(v);
            }
        }
        let mut d16 = vec![0u8; vals.len() * 2];
        assert!(to_f16(&vals, &mut d16));
        let mut db = vec![0u8; vals.len() * 2];
        assert!(to_bf16(&vals, &mut db));
        for (i, &v) in vals.iter().enumerate() {
            let a = u16::from_le_bytes([d16[2 * i], d16[2 * i + 1]]);
            assert_eq!(
                a,
                elem::f32_to_f16_sat(v),
                "fp16 of {v:e} ({:#x})",
                v.to_bits()
            );
            let b = u16::from_le_bytes([db[2 * i], db[2 * i + 1]]);
            assert_eq!(
                b,
                elem::f32_to_bf16_sat(v),
                "bf16 of {v:e} ({:#x})",
                v.to_bits()
            );
        }
        let mut back = vec![0f32; vals.len()];
        from_f16::<false>(&d16, &mut back);
        for (i, b) in back.iter().enumerate() {
            let e = elem::f16_to_f32(u16::from_le_bytes([d16[2 * i], d16[2 * i + 1]]));
            assert_eq!(b.to_bits(), e.to_bits());
        }
    }

    #[test]
    fn non_finite_is_detected_everywhere() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for pos in [0usize, 7, 8, 15, 33] {
                let mut x = vec![1.5f32; 37];
                x[pos] = bad;
                let mut d = vec![0u8; 37 * 4];
                assert!(!copy_f32(&x, &mut d));
                assert!(!to_f16(&x, &mut d[..74]));
                assert!(!to_bf16(&x, &mut d[..74]));
            }
        }
    }
}
