//! The compressors themselves (without error feedback or momentum): one module per wire format.
//!
//! Each implements [`crate::Codec`] (and the chain's fast paths where it has them:
//! [`crate::chain::Subtract`], [`crate::chain::EncodeFed`]) with its [`crate::CodecInfo`].
//! Shared machinery lives here: the sparse decoding of top-k and random-k ([`scatter`], [`subtract_at`]), output-buffer preparation, and the
//! generic group encoder/decoder for bit streams of fixed-width codes, which processes 32
//! elements per `W` output words, draws one 64-bit random number per four elements (16-bit
//! uniforms, [`crate::rng::Stream::uniform`]), and goes parallel over
//! [`crate::par::SEG`]-element segments.

pub mod cast;
pub mod dithering;
pub mod minmax;
pub mod moniqua;
pub mod onebit;
pub mod onebit_col;
pub mod powersgd;
pub mod randomk;
pub mod topk;

use crate::rng::{uniform_from_bits, Stream};
use crate::simd::{load_group, pack32, put_words, unpack32};
use pushpull_proto::placement::PayloadModel;
use rayon::prelude::*;

/// The payload model of a format of buckets (`per_bucket` header bytes each; `bucket`
/// elements, or the whole chunk) followed by a bit stream of `stream_bits` per element, after
/// `header` bytes.
pub(crate) fn bucketed(
    header: u64,
    per_bucket: u64,
    bucket: Option<usize>,
    stream_bits: u32,
) -> PayloadModel {
    PayloadModel {
        header,
        per_bucket,
        bucket: bucket.map(|b| b as u64),
        stream_bits: u64::from(stream_bits),
        ..PayloadModel::default()
    }
}

/// `, bucket=B` for a display name, or nothing for a whole-chunk bucket.
pub(crate) fn bucket_suffix(bucket: Option<usize>) -> String {
    bucket.map(|b| format!(", bucket={b}")).unwrap_or_default()
}

/// The decoding of a sparse payload (top-k, random-k) given its `(index, value)` pairs at
/// distinct indices: the values at their indices and zeros elsewhere, stored (`add = false`)
/// or added to `out` bit for bit as a dense decoding would be: elements off the support get
/// `+ 0.0` (which turns -0.0 into +0.0), elements on it `+ v` from their original value.
#[inline]
pub(crate) fn scatter<I>(out: &mut [f32], entries: I, add: bool)
where
    I: Iterator<Item = (usize, f32)> + Clone,
{
    if add {
        let orig: Vec<f32> = entries.clone().map(|(i, _)| out[i]).collect();
        add_zero(out);
        for ((i, v), o) in entries.zip(orig) {
            out[i] = o + v;
        }
    } else {
        out.fill(0.0);
        for (i, v) in entries {
            out[i] = v;
        }
    }
}

/// `acc -= decode(payload)` for a sparse payload's `(index, value)` pairs, on the support only
/// (off it `a - 0.0 == a` for every `a`, `-0.0` included); whether every element it changed
/// is finite.
#[inline]
pub(crate) fn subtract_at(acc: &mut [f32], entries: impl Iterator<Item = (usize, f32)>) -> bool {
    let mut finite = true;
    for (i, v) in entries {
        let r = acc[i] - v;
        finite &= r.is_finite();
        acc[i] = r;
    }
    finite
}

/// `acc[i] += 0.0` for every element (what adding a decompressed zero does).
pub(crate) fn add_zero(acc: &mut [f32]) {
    #[inline(always)]
    fn imp(acc: &mut [f32]) {
        for a in acc.iter_mut() {
            *a += 0.0;
        }
    }
    crate::simd::multiversion! {
        fn run(acc: &mut [f32]) = imp;
    }
    run(acc)
}

/// Element math of [`crate::elem`] rewritten so that it vectorises (f32 → i32 conversions
/// instead of f32 → u32, which AVX2 lacks; `if`-based clamps without the assertion), with the
/// same results: the unit tests compare them with the `elem` originals.
pub(crate) mod fast {
    use crate::elem::pow2;

    /// `elem::clamp`-equivalent: `f32::clamp(t, lo, hi)` for `lo <= hi`.
    #[inline(always)]
    fn clamp(t: f32, lo: f32, hi: f32) -> f32 {
        let t = if t < lo { lo } else { t };
        if t > hi {
            hi
        } else {
            t
        }
    }

    /// `v as u32` for an integer-valued `0 <= v < 2^23`, without Rust's saturating cast
    /// (which AVX2 cannot vectorise): `v + 2^23` is exact and its mantissa is `v`.
    #[inline(always)]
    pub fn small_int(v: f32) -> u32 {
        (v + 8_388_608.0).to_bits() - 0x4b00_0000
    }

    /// `q as f32` for `q < 2^31` through a signed conversion (AVX2 has no unsigned one).
    #[inline(always)]
    pub fn to_f32(q: u32) -> f32 {
        q as i32 as f32
    }

    /// [`crate::elem::stochastic_round`] for `0 <= t < 2^23`.
    #[inline(always)]
    pub fn stochastic_round(t: f32, u: f32) -> u32 {
        let fl = t.floor();
        let frac = t - fl;
        small_int(fl) + (u < frac) as u32
    }

    /// [`crate::elem::minmax_value`] for `q < 2^31`.
    #[inline(always)]
    pub fn minmax_value(q: u32, min: f32, step: f32) -> f32 {
        min + to_f32(q) * step
    }

    /// [`crate::elem::dither_linear_value`] for `level < 2^31`.
    #[inline(always)]
    pub fn dither_linear_value(level: u32, sign: u32, norm: f32, s: u32) -> f32 {
        let v = norm * to_f32(level) / to_f32(s);
        if sign != 0 {
            -v
        } else {
            v
        }
    }

    /// `stochastic_round(clamp(t, 0, hi), u).min(hi)` for `hi < 2^23`: the rounding step of
    /// [`crate::elem::minmax_code`] and [`crate::elem::dither_linear_level`] once `t` is known.
    #[inline(always)]
    pub fn clamped_round(t: f32, hi: u32, u: f32) -> u32 {
        let t = clamp(t, 0.0, hi as f32);
        stochastic_round(t, u).min(hi)
    }

    /// [`crate::elem::minmax_code`] (`levels < 2^23`) with the bucket's
    /// `inv_step = elem::minmax_inv_step(step)` precomputed. The encoder's hot loop is
    /// `clamped_round((x - min) * inv_step, levels, u)` for buckets with `inv_step != 0`.
    #[inline(always)]
    pub fn minmax_code(x: f32, min: f32, step: f32, inv_step: f32, levels: u32, u: f32) -> u32 {
        if step > 0.0 {
            let d = x - min;
            let t = if inv_step != 0.0 {
                d * inv_step
            } else {
                d / step
            };
            clamped_round(t, levels, u)
        } else {
            0
        }
    }

    /// [`crate::elem::dither_linear_level`] (`s < 2^23`) with the bucket's
    /// `scale = elem::dither_linear_scale(norm, s)` precomputed. The encoder's hot loop is
    /// `clamped_round(|x| * scale, s, u)` for buckets with `scale != 0`.
    #[inline(always)]
    pub fn dither_linear_level(x: f32, norm: f32, scale: f32, s: u32, u: f32) -> u32 {
        if norm > 0.0 {
            let t = if scale != 0.0 {
                x.abs() * scale
            } else {
                x.abs() / norm * s as f32
            };
            clamped_round(t, s, u)
        } else {
            0
        }
    }

    /// [`crate::elem::dither_natural_level`] with the bucket's
    /// `inv = elem::dither_natural_inv(norm)` precomputed. The encoder's hot loop is
    /// `dither_natural_from_ratio((|x| * inv).min(1.0), s, u)` for buckets with `inv != 0`.
    #[inline(always)]
    pub fn dither_natural_level(x: f32, norm: f32, inv: f32, s: u32, u: f32) -> u32 {
        if norm.is_nan() || norm <= 0.0 {
            return 0;
        }
        let r = if inv != 0.0 {
            x.abs() * inv
        } else {
            x.abs() / norm
        };
        dither_natural_from_ratio(r.min(1.0), s, u)
    }

    /// The natural dithering level of a ratio `r = min(|x| / norm, 1)` in `[0, 1]`, branch-free
    /// (all paths computed, one selected).
    #[inline(always)]
    pub fn dither_natural_from_ratio(r: f32, s: u32, u: f32) -> u32 {
        let bottom = 1 - s as i32;
        let small = (u < r * pow2(s as i32 - 1)) as u32;
        let e = ((r.to_bits() >> 23) & 0xff) as i32 - 127;
        // 2^-e for e in [-127, 0] (r in (0, 1)); other e only occur on unselected paths.
        let inv = f32::from_bits((((127 - e) as u32) & 0xff) << 23);
        let p = r * inv - 1.0;
        let big = ((e - bottom + 1) as u32).wrapping_add((u < p) as u32);
        if r >= 1.0 {
            s
        } else if r < pow2(bottom) {
            small
        } else {
            big
        }
    }
}

/// Sets `out` to exactly `len` bytes, keeping (not re-zeroing) bytes that are already there:
/// every codec overwrites every byte of its payload.
#[inline]
pub(crate) fn prepare(out: &mut Vec<u8>, len: usize) -> &mut [u8] {
    out.truncate(len);
    out.resize(len, 0);
    &mut out[..]
}

/// Writes `v` as little-endian f32s.
#[inline]
pub(crate) fn put_f32s(dst: &mut [u8], v: impl IntoIterator<Item = f32>) {
    for (d, x) in dst.chunks_exact_mut(4).zip(v) {
        d.copy_from_slice(&x.to_le_bytes());
    }
}

/// Elements per block of the encoders and decoders (a multiple of 32).
pub(crate) const BLOCK: usize = 256;

/// The uniforms of elements `i0 .. i0 + u.len()` (`i0` and `u.len()` multiples of 4,
/// `u.len() <= BLOCK`): one 64-bit draw per four elements, element `i0 + 4q + l` from 16-bit lane
/// `l` (lane 0 = the low bits) of draw `i0 / 4 + q` ([`Stream::uniform`]).
#[inline(always)]
pub(crate) fn uniforms(s: Stream, i0: usize, u: &mut [f32]) {
    debug_assert!(i0 % 4 == 0 && u.len() % 4 == 0 && u.len() <= BLOCK);
    let base = (i0 as u64) >> 2;
    let mut d = [0u64; BLOCK / 4];
    let quads = u.len() / 4;
    for (q, dq) in d[..quads].iter_mut().enumerate() {
        *dq = s.draw(base + q as u64);
    }
    // The 16-bit lanes in element order: on little-endian targets this is the memory layout
    // of `d` itself, so no shuffles are needed.
    #[cfg(target_endian = "little")]
    let lanes: [u16; BLOCK] = {
        // SAFETY: both are plain integer arrays of the same size; every bit pattern is valid.
        unsafe { std::mem::transmute::<[u64; BLOCK / 4], [u16; BLOCK]>(d) }
    };
    #[cfg(not(target_endian = "little"))]
    let lanes: [u16; BLOCK] = std::array::from_fn(|i| (d[i / 4] >> (16 * (i % 4))) as u16);
    for (ui, &h) in u.iter_mut().zip(lanes.iter()) {
        *ui = uniform_from_bits(h);
    }
}

/// Per-block quantisation: the codes of consecutive elements.
///
/// Implementations mark `codes` `#[inline(always)]` (closures would not be inlined into the
/// AVX2 build of the kernels and would fall back to the baseline target).
pub(crate) trait GroupEncoder {
    /// Whether `codes` uses the uniforms (they are drawn only then).
    const STOCHASTIC: bool;
    /// Codes of elements `gi .. gi + xs.len()` (`xs` their values, `u` their uniforms; the
    /// length is a multiple of 32 and at most [`BLOCK`]; elements past the chunk are zeros).
    fn codes(&self, gi: usize, xs: &[f32], u: &[f32], c: &mut [u32]);
}

/// Per-block reconstruction: the values of consecutive codes.
pub(crate) trait GroupDecoder {
    /// Values of elements `gi .. gi + c.len()` from their codes (length as for
    /// [`GroupEncoder::codes`]).
    fn values(&self, gi: usize, c: &[u32], v: &mut [f32]);
}

/// The runs `(bucket, start, end)` of `gi + start .. gi + end` that lie in one bucket of `size`
/// elements, covering `0 .. len`; indices past `last` count as in `last`'s bucket. (An iterator,
/// not a closure-taking function: closures are not reliably inlined into the AVX2 kernels.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct BucketRuns {
    gi: usize,
    len: usize,
    size: usize,
    last: usize,
    s: usize,
}

#[inline(always)]
pub(crate) fn bucket_runs(gi: usize, len: usize, size: usize, last: usize) -> BucketRuns {
    BucketRuns {
        gi,
        len,
        size,
        last,
        s: 0,
    }
}

impl Iterator for BucketRuns {
    type Item = (usize, usize, usize);
    #[inline(always)]
    fn next(&mut self) -> Option<(usize, usize, usize)> {
        if self.s >= self.len {
            return None;
        }
        let s = self.s;
        let b = (self.gi + s).min(self.last) / self.size;
        let b_last = (self.gi + self.len - 1).min(self.last) / self.size;
        let end = if b == b_last {
            self.len
        } else {
            (b + 1) * self.size - self.gi
        };
        self.s = end;
        Some((b, s, end))
    }
}

/// Encodes `x` (elements `i0 .. i0 + x.len()` of the chunk, `i0 % BLOCK == 0`) into the bit
/// stream bytes `dst` (`stream_bytes(x.len(), W)` long) with `enc` per block. The last group
/// of 32 is padded with zero values, and its codes past the end are zeroed before packing.
#[inline(always)]
pub(crate) fn encode_groups<const W: usize, E: GroupEncoder>(
    x: &[f32],
    i0: usize,
    stream: Stream,
    dst: &mut [u8],
    enc: &E,
) {
    let mut u = [0f32; BLOCK];
    let mut c = [0u32; BLOCK];
    let mut pad = [0f32; BLOCK];
    let mut words = [0u32; 16];
    let total_words = dst.len() / 4;
    for (bi, xs) in x.chunks(BLOCK).enumerate() {
        let gi = i0 + bi * BLOCK;
        let len = xs.len();
        let glen = len.div_ceil(32) * 32;
        let xs: &[f32] = if glen == len {
            xs
        } else {
            pad[..len].copy_from_slice(xs);
            pad[len..glen].fill(0.0);
            &pad[..glen]
        };
        if E::STOCHASTIC {
            uniforms(stream, gi, &mut u[..glen]);
        }
        enc.codes(gi, xs, &u[..glen], &mut c[..glen]);
        c[len..glen].fill(0);
        let wbase = bi * BLOCK / 32 * W;
        for g in 0..glen / 32 {
            let cg: &[u32; 32] = c[32 * g..32 * g + 32].try_into().expect("32");
            pack32::<W>(cg, &mut words);
            let at = wbase + g * W;
            let nw = (total_words - at).min(W);
            put_words(&mut dst[4 * at..], &words[..nw]);
        }
    }
}

/// Runs `enc(segment, first index, segment bytes)` over [`crate::par::SEG`]-element segments of
/// `x` and the matching pieces of the `W`-bit stream `dst`, in parallel where it pays.
pub(crate) fn par_segments(
    x: &[f32],
    w: u32,
    dst: &mut [u8],
    enc: impl Fn(&[f32], usize, &mut [u8]) + Sync + Send,
) {
    let seg = crate::par::SEG;
    if crate::par::enabled(x.len()) {
        let seg_bytes = seg / 8 * w as usize;
        x.par_chunks(seg)
            .zip(dst.par_chunks_mut(seg_bytes))
            .enumerate()
            .for_each(|(i, (xs, d))| enc(xs, i * seg, d));
    } else {
        enc(x, 0, dst);
    }
}

/// Like [`par_segments`] for decoding: `dec(stream bytes, first index, output segment)`.
pub(crate) fn par_segments_out(
    src: &[u8],
    w: u32,
    out: &mut [f32],
    dec: impl Fn(&[u8], usize, &mut [f32]) + Sync + Send,
) {
    let seg = crate::par::SEG;
    if crate::par::enabled(out.len()) {
        let seg_bytes = seg / 8 * w as usize;
        out.par_chunks_mut(seg)
            .zip(src.par_chunks(seg_bytes))
            .enumerate()
            .for_each(|(i, (o, s))| dec(s, i * seg, o));
    } else {
        dec(src, 0, out);
    }
}

/// Decodes the `W`-bit stream `src` (`stream_bytes(out.len(), W)` bytes) for elements
/// `i0 .. i0 + out.len()` (`i0 % BLOCK == 0`) with `dec` per block; the values are stored
/// (`ADD = false`) or added (`ADD = true`) to `out`.
#[inline(always)]
pub(crate) fn decode_groups<const W: usize, const ADD: bool, D: GroupDecoder>(
    src: &[u8],
    i0: usize,
    out: &mut [f32],
    dec: &D,
) {
    let mut words = [0u32; 16];
    let mut c = [0u32; BLOCK];
    let mut v = [0f32; BLOCK];
    let total_words = src.len() / 4;
    for (bi, o) in out.chunks_mut(BLOCK).enumerate() {
        let len = o.len();
        let glen = len.div_ceil(32) * 32;
        let wbase = bi * BLOCK / 32 * W;
        for g in 0..glen / 32 {
            let at = wbase + g * W;
            if at + W <= total_words {
                load_group::<W>(src, at / W, &mut words);
            } else {
                for (k, wd) in words[..W].iter_mut().enumerate() {
                    *wd = if at + k < total_words {
                        crate::simd::get_u32(src, at + k)
                    } else {
                        0
                    };
                }
            }
            let cg: &mut [u32; 32] = (&mut c[32 * g..32 * g + 32]).try_into().expect("32");
            unpack32::<W>(&words, cg);
        }
        dec.values(i0 + bi * BLOCK, &c[..glen], &mut v[..glen]);
        if ADD {
            for (a, b) in o.iter_mut().zip(&v[..len]) {
                *a += *b;
            }
        } else {
            o.copy_from_slice(&v[..len]);
        }
    }
}

/// Whether the tail bits of a bit stream (past `n * w` bits) are zero, as the format requires.
pub(crate) fn tail_bits_zero(stream: &[u8], n: usize, w: u32) -> bool {
    let bits = n * w as usize;
    let words = stream.len() / 4;
    if bits == words * 32 || words == 0 {
        return true;
    }
    let last = crate::simd::get_u32(stream, words - 1);
    (last >> (bits % 32)) == 0
}

#[cfg(test)]
mod tests {
    use super::fast;
    use crate::elem;
    use crate::rng::mix64;

    fn f(h: u64) -> f32 {
        // Mostly ordinary magnitudes, sometimes extreme bit patterns.
        if h >> 61 == 0 {
            let v = f32::from_bits(h as u32);
            if v.is_finite() {
                return v;
            }
        }
        ((h >> 40) as f32 / 16_777_216.0 - 0.5) * 8.0
    }

    #[test]
    fn fast_element_math_matches_elem() {
        let mut h = 99u64;
        let mut next = || {
            h = mix64(h.wrapping_add(1));
            h
        };
        let edge = [0.0f32, -0.0, 1.0, -1.0, 0.5, 1e-30, 3.0, 255.0];
        for i in 0..400_000 {
            let x = if i % 7 == 0 {
                edge[i % edge.len()]
            } else {
                f(next())
            };
            let u = crate::rng::uniform_from_bits(next() as u16);
            let (lo, hi) = {
                let a = f(next());
                let b = f(next());
                if a <= b {
                    (a, b)
                } else {
                    (b, a)
                }
            };
            let x = if i % 3 == 0 { x.clamp(lo, hi) } else { x };
            for bits in [1u32, 3, 8] {
                let levels = (1 << bits) - 1;
                let step = elem::minmax_step(lo, hi, levels);
                if step.is_finite() {
                    let inv = elem::minmax_inv_step(step);
                    assert_eq!(
                        fast::minmax_code(x, lo, step, inv, levels, u),
                        elem::minmax_code(x, lo, step, levels, u),
                        "minmax x={x} lo={lo} hi={hi} u={u}"
                    );
                }
            }
            let norm = if i % 5 == 0 {
                x.abs()
            } else {
                hi.abs().max(lo.abs())
            };
            for s in [1u32, 2, 3, 7, 8, 31, 32] {
                assert_eq!(
                    fast::dither_natural_level(x, norm, elem::dither_natural_inv(norm), s, u),
                    elem::dither_natural_level(x, norm, s, u),
                    "natural x={x} norm={norm} s={s} u={u}"
                );
            }
            for q in [0u32, 1, 5, 255] {
                let st = elem::minmax_step(lo, hi, 255);
                assert_eq!(
                    fast::minmax_value(q, lo, st).to_bits(),
                    elem::minmax_value(q, lo, st).to_bits()
                );
                for s in [1u32, 7, 255, 32767] {
                    for sign in [0, 1] {
                        assert_eq!(
                            fast::dither_linear_value(q.min(s), sign, norm, s).to_bits(),
                            elem::dither_linear_value(q.min(s), sign, norm, s).to_bits()
                        );
                    }
                }
            }
            for s in [1u32, 2, 7, 127, 32767] {
                let scale = elem::dither_linear_scale(norm, s);
                assert_eq!(
                    fast::dither_linear_level(x, norm, scale, s, u),
                    elem::dither_linear_level(x, norm, s, u),
                    "linear x={x} norm={norm} s={s} u={u}"
                );
            }
        }
    }
}
