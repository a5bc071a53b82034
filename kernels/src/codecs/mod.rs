//! The compressors themselves (no decorators): one module per wire format.
//!
//! Shared machinery lives here: the identity every codec carries ([`Base`]), output-buffer
//! preparation, and the generic group encoder/decoder for bit streams of fixed-width codes,
//! which processes 32 elements per `W` output words, draws one 64-bit random number per pair of
//! elements, and goes parallel over [`crate::par::SEG`]-element segments.

pub mod cast;
pub mod dithering;
pub mod minmax;
pub mod moniqua;
pub mod onebit;
pub mod onebit_col;
pub mod randomk;
pub mod topk;

use crate::error::KernelError;
use crate::rng::{uniform_from_bits, Role, Stream};
use crate::simd::{load_group, pack32, put_words, unpack32};
use crate::NodeIdentity;
use rayon::prelude::*;

/// What every codec knows about itself: its name, chunk length and where its random numbers
/// come from.
#[derive(Debug, Clone)]
pub(crate) struct Base {
    pub name: String,
    pub n: usize,
    pub seed: u64,
    pub key: u64,
    pub role: Role,
    pub rank: u32,
}

impl Base {
    pub fn new(name: String, n: usize, who: &NodeIdentity, seed: Option<u64>) -> Base {
        Base {
            name,
            n,
            seed: seed.unwrap_or(who.job_seed),
            key: who.key,
            role: who.role,
            rank: who.rank,
        }
    }

    /// The stochastic-rounding stream of `round`.
    #[inline]
    pub fn rounding(&self, round: u64) -> Stream {
        Stream::rounding(self.seed, self.key, round, self.role, self.rank)
    }

    /// Checks a slice length against the chunk length.
    #[inline]
    pub fn check(&self, what: &'static str, len: usize) -> Result<(), KernelError> {
        if len == self.n {
            Ok(())
        } else {
            Err(KernelError::len(&self.name, what, self.n, len))
        }
    }

    /// Checks an exact payload length.
    #[inline]
    pub fn check_payload(&self, expected: usize, actual: usize) -> Result<(), KernelError> {
        if expected == actual {
            Ok(())
        } else {
            Err(KernelError::payload_exact(&self.name, expected, actual))
        }
    }

    /// The error for an input known to hold a non-finite element.
    pub fn non_finite(&self, x: &[f32]) -> KernelError {
        match x.iter().position(|v| !v.is_finite()) {
            Some(i) => KernelError::NonFinite {
                compressor: self.name.clone(),
                what: "input",
                index: i,
                value: x[i],
            },
            None => KernelError::overflow(&self.name, "input statistics overflow f32"),
        }
    }

    /// `Err(non_finite)` if some element of `x` is NaN or infinite.
    pub fn require_finite(&self, x: &[f32]) -> Result<(), KernelError> {
        match crate::simd::first_non_finite(x) {
            None => Ok(()),
            Some(i) => Err(KernelError::NonFinite {
                compressor: self.name.clone(),
                what: "input",
                index: i,
                value: x[i],
            }),
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

/// The uniforms of the 32 elements starting at `i0` (even): one 64-bit draw per pair.
#[inline(always)]
pub(crate) fn uniforms32(s: Stream, i0: usize, u: &mut [f32; 32]) {
    let base = (i0 as u64) >> 1;
    for p in 0..16 {
        let d = s.draw(base + p as u64);
        u[2 * p] = uniform_from_bits(d as u32);
        u[2 * p + 1] = uniform_from_bits((d >> 32) as u32);
    }
}

/// Encodes `x` (elements `i0 .. i0 + x.len()` of the chunk, `i0 % 32 == 0`) into the bit stream
/// bytes `dst` (`stream_bytes(x.len(), W)` long) with `code(first index, values, uniforms,
/// codes)` per group of 32. The last group is padded with zero values, and its codes past the
/// end are zeroed before packing. Uniforms are drawn only when `stream` is `Some`.
#[inline(always)]
pub(crate) fn encode_groups<const W: usize>(
    x: &[f32],
    i0: usize,
    stream: Option<Stream>,
    dst: &mut [u8],
    code: impl Fn(usize, &[f32; 32], &[f32; 32], &mut [u32; 32]),
) {
    let mut u = [0f32; 32];
    let mut c = [0u32; 32];
    let mut words = [0u32; 16];
    let mut groups = x.chunks_exact(32);
    let mut dchunks = dst.chunks_exact_mut(4 * W);
    for (g, (xs, d)) in (&mut groups).zip(&mut dchunks).enumerate() {
        let xs: &[f32; 32] = xs.try_into().expect("32");
        let gi = i0 + 32 * g;
        if let Some(s) = stream {
            uniforms32(s, gi, &mut u);
        }
        code(gi, xs, &u, &mut c);
        pack32::<W>(&c, &mut words);
        put_words(d, &words[..W]);
    }
    let rem = groups.remainder();
    if !rem.is_empty() {
        let gi = i0 + x.len() - rem.len();
        let mut xs = [0f32; 32];
        xs[..rem.len()].copy_from_slice(rem);
        if let Some(s) = stream {
            uniforms32(s, gi, &mut u);
        }
        code(gi, &xs, &u, &mut c);
        for v in c[rem.len()..].iter_mut() {
            *v = 0;
        }
        pack32::<W>(&c, &mut words);
        let tail = dchunks.into_remainder();
        let nw = tail.len() / 4;
        put_words(tail, &words[..nw]);
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
/// `i0 .. i0 + out.len()` (`i0 % 32 == 0`): `value(first index, codes, values)` per group of 32;
/// the values are stored (`ADD = false`) or added (`ADD = true`) to `out`.
#[inline(always)]
pub(crate) fn decode_groups<const W: usize, const ADD: bool>(
    src: &[u8],
    i0: usize,
    out: &mut [f32],
    value: impl Fn(usize, &[u32; 32], &mut [f32; 32]),
) {
    let mut words = [0u32; 16];
    let mut c = [0u32; 32];
    let mut v = [0f32; 32];
    let full = out.len() / 32;
    let (head, tail) = out.split_at_mut(full * 32);
    for (g, o) in head.chunks_exact_mut(32).enumerate() {
        load_group::<W>(src, g, &mut words);
        unpack32::<W>(&words, &mut c);
        value(i0 + 32 * g, &c, &mut v);
        if ADD {
            for (a, b) in o.iter_mut().zip(&v) {
                *a += *b;
            }
        } else {
            o.copy_from_slice(&v);
        }
    }
    if !tail.is_empty() {
        let start = full * 4 * W;
        let rest = &src[start..];
        for (wd, b) in words.iter_mut().zip(rest.chunks_exact(4)) {
            *wd = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        for wd in words[rest.len() / 4..].iter_mut() {
            *wd = 0;
        }
        unpack32::<W>(&words, &mut c);
        value(i0 + 32 * full, &c, &mut v);
        for (a, b) in tail.iter_mut().zip(&v) {
            if ADD {
                *a += *b;
            } else {
                *a = *b;
            }
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
