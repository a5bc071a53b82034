//! `dithering` (QSGD): stochastic quantisation of `|x| / norm` to `s` levels, with a sign.
//!
//! Levels: `linear` (`0, 1/s, …, 1`, [`elem::dither_linear_level`]) or `natural`
//! (`0, 2^-(s-1), …, 1/2, 1`, [`elem::dither_natural_level`]); `norm` per bucket is `max |x|`
//! ([`elem::max_abs`]) or the l2 norm ([`elem::l2_norm`]). Element `i` draws its level with the
//! rounding uniform of element `i`; the level is unbiased: `E[value] = x` up to `2^-16` of a
//! step (the resolution of the 16-bit rounding uniforms, [`crate::rng::Stream::uniform`]) and
//! the f32 roundings of the scaled value. An all-zero bucket has norm 0 and every level 0.
//!
//! # Element math (wire format version 3)
//! Each bucket computes one factor and multiplies instead of dividing per element: linear
//! `t = |x| * scale` with `scale = s / norm` ([`elem::dither_linear_scale`]), level
//! `stochastic_round(clamp(t, 0, s), u)`; natural `r = min(|x| * inv, 1)` with `inv = 1 / norm`
//! ([`elem::dither_natural_inv`]). Every operation is one correctly rounded f32 operation (no
//! FMA), so `t` and `r` are within a relative `2^-23` of the exact ratio. Only a bucket whose
//! factor overflows f32 (a subnormal norm) divides instead (`|x| / norm * s`, `|x| / norm`). The
//! rounding uniforms have 16 bits (`P(u < p) = ceil(p * 2^16) / 2^16`), so a level's rounding
//! bias is below `2^-16` of a step. Versions up to 2 divided per element and used 24-bit
//! uniforms.
//!
//! # `encoding = packed` (fixed width; the CUDA kernels produce the same bytes)
//! `nb` little-endian f32 norms, then a bit stream of `n` codes of `w = 1 + bitlen(s)` bits
//! (`bitlen(s) = 32 - s.leading_zeros()`), code `= (level << 1) | sign_bit(x)`.
//! Size `4 * nb + 4 * ceil(n * w / 32)`. A level-0 element with its sign bit set decodes to
//! `-0.0`.
//!
//! # `encoding = elias` or `elias_omega` (variable length; CPU only)
//! * u32 `m`: the number of elements with a non-zero level;
//! * `nb` f32 norms;
//! * a bit stream (same bit order as the packed stream: stream bit `j` is bit `j % 32` of u32
//!   word `j / 32`) holding, for each element with a non-zero level in increasing index order:
//!   `code(gap)`, the sign bit, `code(level)`; `gap = i - previous i` (the previous index
//!   starts at -1, so `gap >= 1`); padded with zero bits to a whole word. `code` is `gamma`
//!   for `elias` (also spelled `elias_gamma`), `omega` for `elias_omega`.
//!
//! `gamma(v)` for `v >= 1` is an Elias gamma code written least significant bit first: with
//! `N = floor(log2 v)`, `N` zero bits, a one bit, then the `N` low bits of `v`, least
//! significant first (`2N + 1` bits; cheap to decode with one `trailing_zeros`).
//!
//! `omega(v)` for `v >= 1` is Elias's recursive (omega) code, the one QSGD's paper uses: with
//! groups `g_1 < … < g_k = v` where each `g_j` is the bit length of `g_{j+1}` minus one and
//! `g_1 ∈ {2, 3}` (none for `v = 1`), each group of `N + 1` bits is written as a one bit then
//! its `N` low bits, least significant first, and a zero bit ends the code:
//! `log v + log log v + … + 1` bits, shorter than gamma from `v = 16` on (longer for 4..=7).
//!
//! Size `4 + 4 * nb + 4 * ceil(bits / 32)`, at most `4 + 4 * nb + 4 * ceil(n * b / 32)` with
//! `b = 3 + 2 * floor(log2 s)` for gamma and `2 + max(|omega(l)|, l <= s)` for omega (a gap costs
//! at most `2 * gap - 1` bits in either code and the gaps add up to at most `n`). Zero levels
//! are not sent, so they decode to `+0.0` whatever the sign: the values equal the packed
//! encoding's (`==`).

use super::{
    bucket_runs, bucket_suffix, bucketed, decode_groups, encode_groups, par_segments,
    par_segments_out, prepare, scatter, GroupDecoder, GroupEncoder,
};
use std::sync::Arc;

use crate::chain::Body;
use crate::codec::{Codec, CodecInfo, RoundCtx};
use crate::elem;
use crate::error::{KernelError, Result};
use crate::rng::Stream;
use crate::simd::{multiversion, stream_bytes, with_width};
use crate::spec::{name_of, BuildOptions, CodecSpec, Entry, KeyInfo, Keys, Kind, Spellings};
use crate::stats::{bucket_max_abs, bucket_sums, Buckets};
use pushpull_proto::placement::PayloadModel;
use rayon::prelude::*;

mod elias;

/// The registry's `dithering`: `k` (the levels s, required), `partition`, `normalize`,
/// `encoding`, `bucket`.
pub const ENTRY: Entry = Entry {
    name: "dithering",
    keys: &["k", "bucket"],
    own_keys: &[
        KeyInfo {
            name: "partition",
            aliases: &["byteps_dithering_partition"],
            applies_to: "dithering",
            values: "linear or 0, natural or 1",
            default: "linear",
        },
        KeyInfo {
            name: "normalize",
            aliases: &["byteps_dithering_normalize"],
            applies_to: "dithering",
            values: "max or 0, l2 or 1",
            default: "max",
        },
        KeyInfo {
            name: "encoding",
            aliases: &[],
            applies_to: "dithering",
            values: "packed, elias (or elias_gamma), elias_omega",
            default: "packed",
        },
    ],
    parse,
};

/// Dithering's settings: QSGD's stochastic quantisation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DitheringSpec {
    /// Levels s.
    pub s: u32,
    /// Level partition.
    pub partition: Partition,
    /// Per-bucket scale.
    pub normalize: Normalize,
    /// Bucket length (None: the whole chunk).
    pub bucket: Option<usize>,
    /// Wire encoding.
    pub encoding: Encoding,
}

/// Dithering's level partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partition {
    /// Levels `0, 1/s, …, 1`.
    Linear,
    /// Levels `0, 2^-(s-1), …, 1/2, 1` (Horváth et al.'s natural dithering).
    Natural,
}

/// Dithering's per-bucket scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Normalize {
    /// `max |x|`.
    Max,
    /// The l2 norm.
    L2,
}

/// Dithering's wire encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Fixed width per element.
    Packed,
    /// The gaps and levels of the non-zero elements in an Elias code.
    Elias(EliasCode),
}

/// The integer code of [`Encoding::Elias`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EliasCode {
    /// Elias gamma: `2⌊log2 v⌋ + 1` bits (`encoding = elias`).
    Gamma,
    /// Elias omega, the recursive code of QSGD's paper: `log v + log log v + … + 1` bits
    /// (`encoding = elias_omega`).
    Omega,
}

/// The partitions' spellings.
const PARTITIONS: Spellings<Partition> = &[
    (&["linear", "0"], Partition::Linear),
    (&["natural", "1"], Partition::Natural),
];
/// The normalisations' spellings.
const NORMALIZES: Spellings<Normalize> = &[
    (&["max", "0"], Normalize::Max),
    (&["l2", "1"], Normalize::L2),
];
/// The encodings' spellings.
const ENCODINGS: Spellings<Encoding> = &[
    (&["packed"], Encoding::Packed),
    (&["elias", "elias_gamma"], Encoding::Elias(EliasCode::Gamma)),
    (&["elias_omega"], Encoding::Elias(EliasCode::Omega)),
];

fn parse(keys: &Keys<'_>) -> Result<Arc<dyn CodecSpec>> {
    let partition = keys.choice(
        "partition",
        PARTITIONS,
        Partition::Linear,
        "expected linear (or 0) or natural (or 1)",
    )?;
    let normalize = keys.choice(
        "normalize",
        NORMALIZES,
        Normalize::Max,
        "expected max (or 0) or l2 (or 1)",
    )?;
    let encoding = keys.choice(
        "encoding",
        ENCODINGS,
        Encoding::Packed,
        "expected packed, elias (or elias_gamma) or elias_omega",
    )?;
    let (k, v) = keys.require("k", "byteps_compressor_k / k: the number of levels s >= 1")?;
    let hi = if partition == Partition::Linear {
        32767
    } else {
        32
    };
    let s = match v.parse::<u64>() {
        Ok(s) if (1..=hi).contains(&s) => s as u32,
        _ => {
            return Err(KernelError::bad(
                k,
                v,
                format!(
                    "expected the number of dithering levels s, a whole number in 1..={hi} for \
                     the {} partition",
                    name_of(PARTITIONS, partition)
                ),
            ))
        }
    };
    Ok(Arc::new(DitheringSpec {
        s,
        partition,
        normalize,
        bucket: keys.bucket()?,
        encoding,
    }))
}

impl CodecSpec for DitheringSpec {
    fn kind(&self) -> Kind {
        Kind::new("dithering", true, false)
    }
    fn build(&self, base: CodecInfo, _: &BuildOptions) -> Result<Body> {
        Ok(Body::Plain(Box::new(Dithering::new(base, *self))))
    }
    fn payload(&self, _: u64) -> PayloadModel {
        let (header, stream_bits) = match self.encoding {
            Encoding::Packed => (0, packed_width(self.s)),
            // The bound: the count, and at most a code's bits per element.
            Encoding::Elias(code) => (4, code.max_bits_per_element(self.s)),
        };
        bucketed(header, 4, self.bucket, stream_bits)
    }
    fn display_name(&self) -> String {
        let b = bucket_suffix(self.bucket);
        format!(
            "dithering(k={}, {}, {}{b}, {})",
            self.s,
            name_of(PARTITIONS, self.partition),
            name_of(NORMALIZES, self.normalize),
            name_of(ENCODINGS, self.encoding)
        )
    }
    fn params(&self, put: &mut dyn FnMut(&'static str, String)) {
        put("k", self.s.to_string());
        put("partition", name_of(PARTITIONS, self.partition).to_string());
        put("normalize", name_of(NORMALIZES, self.normalize).to_string());
        if let Some(b) = self.bucket {
            put("bucket", b.to_string());
        }
        put("encoding", name_of(ENCODINGS, self.encoding).to_string());
    }
}

/// The dithering compressor.
pub(crate) struct Dithering {
    base: CodecInfo,
    s: u32,
    partition: Partition,
    normalize: Normalize,
    encoding: Encoding,
    bk: Buckets,
}

/// Code width of the packed encoding for `s` levels.
pub fn packed_width(s: u32) -> u32 {
    1 + (32 - s.leading_zeros())
}

impl Dithering {
    pub fn new(base: CodecInfo, spec: DitheringSpec) -> Dithering {
        let DitheringSpec {
            s,
            partition,
            normalize,
            bucket,
            encoding,
        } = spec;
        let bk = Buckets::new(base.n, bucket);
        let mut d = Dithering {
            base,
            s,
            partition,
            normalize,
            encoding,
            bk,
        };
        let size = match encoding {
            Encoding::Packed => d.packed_size(),
            Encoding::Elias(code) => d.elias_max_size(code),
        };
        d.base.payload = size;
        d
    }

    fn w(&self) -> u32 {
        packed_width(self.s)
    }

    fn packed_size(&self) -> usize {
        4 * self.bk.count + stream_bytes(self.base.n, self.w())
    }

    fn elias_max_size(&self, code: EliasCode) -> usize {
        4 + 4 * self.bk.count + stream_bytes(self.base.n, code.max_bits_per_element(self.s))
    }

    /// The per-bucket [`factor`]s of `norms`.
    fn factors(&self, norms: &[f32]) -> Vec<f32> {
        let natural = self.partition == Partition::Natural;
        norms
            .iter()
            .map(|&nm| factor(natural, nm, self.s))
            .collect()
    }

    /// The per-bucket norms, or the error for non-finite input / overflow.
    fn norms(&self, x: &[f32]) -> Result<Vec<f32>, KernelError> {
        match self.normalize {
            Normalize::Max => {
                let (v, bad) = bucket_max_abs(x, &self.bk);
                if bad {
                    return Err(self.base.non_finite(x));
                }
                Ok(v)
            }
            Normalize::L2 => {
                let sums = bucket_sums(x, &self.bk, true);
                let v: Vec<f32> = sums.iter().map(|s| s.sqrt() as f32).collect();
                if v.iter().any(|n| !n.is_finite()) {
                    if let Some(i) = x.iter().position(|a| !a.is_finite()) {
                        return Err(KernelError::NonFinite {
                            compressor: self.base.name.clone(),
                            what: "input",
                            index: i,
                            value: x[i],
                        });
                    }
                    return Err(KernelError::overflow(
                        &self.base.name,
                        "the sum of squares of a bucket overflows f32 (|x| above ~1.8e19); \
                         use normalize=max",
                    ));
                }
                Ok(v)
            }
        }
    }
}

/// The level of `x` (`NATURAL` selects the partition) for a bucket with scale `norm` and
/// factor `f` ([`factor`]).
#[inline(always)]
fn level<const NATURAL: bool>(x: f32, norm: f32, f: f32, s: u32, u: f32) -> u32 {
    if NATURAL {
        super::fast::dither_natural_level(x, norm, f, s, u)
    } else {
        super::fast::dither_linear_level(x, norm, f, s, u)
    }
}

/// The level of `x` in a bucket whose factor `f` is not 0: `|x|` is multiplied by `f`.
#[inline(always)]
fn level_scaled<const NATURAL: bool>(x: f32, f: f32, s: u32, u: f32) -> u32 {
    let t = x.abs() * f;
    if NATURAL {
        super::fast::dither_natural_from_ratio(t.min(1.0), s, u)
    } else {
        super::fast::clamped_round(t, s, u)
    }
}

/// The per-bucket factor that replaces the division by `norm`: `s / norm` (linear,
/// [`elem::dither_linear_scale`]) or `1 / norm` (natural, [`elem::dither_natural_inv`]); 0 when
/// that is not finite (the elements then divide).
fn factor(natural: bool, norm: f32, s: u32) -> f32 {
    if natural {
        elem::dither_natural_inv(norm)
    } else {
        elem::dither_linear_scale(norm, s)
    }
}

/// The value of a level.
#[inline(always)]
fn value<const NATURAL: bool>(level: u32, sign: u32, norm: f32, s: u32) -> f32 {
    if NATURAL {
        elem::dither_natural_value(level, sign, norm, s)
    } else {
        super::fast::dither_linear_value(level, sign, norm, s)
    }
}

/// Dithering codes `(level << 1) | sign` with per-bucket norms.
struct Coder<'a, const NATURAL: bool> {
    norms: &'a [f32],
    /// Per-bucket [`factor`]s (empty when decoding).
    factors: &'a [f32],
    size: usize,
    last: usize,
    s: u32,
}

impl<const NATURAL: bool> GroupEncoder for Coder<'_, NATURAL> {
    const STOCHASTIC: bool = true;
    #[inline(always)]
    fn codes(&self, gi: usize, xs: &[f32], u: &[f32], c: &mut [u32]) {
        for (b, s, e) in bucket_runs(gi, xs.len(), self.size, self.last) {
            let nm = self.norms[b];
            let f = self.factors[b];
            let cs = c[s..e].iter_mut().zip(&xs[s..e]).zip(&u[s..e]);
            if f != 0.0 {
                // The hot loop: one multiplication per element, no division.
                for ((ci, &x), &ui) in cs {
                    *ci = (level_scaled::<NATURAL>(x, f, self.s, ui) << 1) | elem::sign_bit(x);
                }
            } else {
                // Norm 0, or a subnormal norm whose factor overflows: divide.
                for ((ci, &x), &ui) in cs {
                    *ci = (level::<NATURAL>(x, nm, 0.0, self.s, ui) << 1) | elem::sign_bit(x);
                }
            }
        }
    }
}

impl<const NATURAL: bool> GroupDecoder for Coder<'_, NATURAL> {
    #[inline(always)]
    fn values(&self, gi: usize, c: &[u32], v: &mut [f32]) {
        for (b, s, e) in bucket_runs(gi, c.len(), self.size, self.last) {
            let nm = self.norms[b];
            for (vi, &ci) in v[s..e].iter_mut().zip(&c[s..e]) {
                *vi = value::<NATURAL>(ci >> 1, ci & 1, nm, self.s);
            }
        }
    }
}

fn coder<'a, const NATURAL: bool>(
    norms: &'a [f32],
    factors: &'a [f32],
    bk: &Buckets,
    s: u32,
) -> Coder<'a, NATURAL> {
    Coder {
        norms,
        factors,
        size: bk.size,
        last: bk.n.saturating_sub(1),
        s,
    }
}

#[inline(always)]
fn encode_impl<const NATURAL: bool>(
    x: &[f32],
    i0: usize,
    dst: &mut [u8],
    stream: Stream,
    nf: (&[f32], &[f32]),
    bk: &Buckets,
    s: u32,
) {
    // `nf`: the per-bucket norms and their factors.
    let enc = coder::<NATURAL>(nf.0, nf.1, bk, s);
    with_width!(packed_width(s), W => encode_groups::<W, _>(x, i0, stream, dst, &enc))
}

multiversion! {
    fn encode_linear(x: &[f32], i0: usize, dst: &mut [u8], stream: Stream, nf: (&[f32], &[f32]), bk: &Buckets, s: u32) = encode_impl::<false>;
}
multiversion! {
    fn encode_natural(x: &[f32], i0: usize, dst: &mut [u8], stream: Stream, nf: (&[f32], &[f32]), bk: &Buckets, s: u32) = encode_impl::<true>;
}

#[inline(always)]
fn decode_impl<const NATURAL: bool, const ADD: bool>(
    src: &[u8],
    i0: usize,
    out: &mut [f32],
    norms: &[f32],
    bk: &Buckets,
    s: u32,
) {
    let dec = coder::<NATURAL>(norms, &[], bk, s);
    with_width!(packed_width(s), W => decode_groups::<W, ADD, _>(src, i0, out, &dec))
}

multiversion! {
    fn decode_linear(src: &[u8], i0: usize, out: &mut [f32], norms: &[f32], bk: &Buckets, s: u32) = decode_impl::<false, false>;
}
multiversion! {
    fn decode_linear_add(src: &[u8], i0: usize, out: &mut [f32], norms: &[f32], bk: &Buckets, s: u32) = decode_impl::<false, true>;
}
multiversion! {
    fn decode_natural(src: &[u8], i0: usize, out: &mut [f32], norms: &[f32], bk: &Buckets, s: u32) = decode_impl::<true, false>;
}
multiversion! {
    fn decode_natural_add(src: &[u8], i0: usize, out: &mut [f32], norms: &[f32], bk: &Buckets, s: u32) = decode_impl::<true, true>;
}

/// Whether every packed code of the segment has a level `<= s`.
#[inline(always)]
fn levels_ok_impl(src: &[u8], n: usize, s: u32) -> bool {
    let mut bad = 0u32;
    with_width!(packed_width(s), W => {
        let mut words = [0u32; 16];
        let mut c = [0u32; 32];
        let groups = n.div_ceil(32);
        for g in 0..groups {
            let start = g * 4 * W;
            let end = (start + 4 * W).min(src.len());
            for (k, wd) in words[..W].iter_mut().enumerate() {
                let o = start + 4 * k;
                *wd = if o + 4 <= end { crate::simd::get_u32(src, o / 4) } else { 0 };
            }
            crate::simd::unpack32::<W>(&words, &mut c);
            for &ct in c.iter() {
                bad |= ((ct >> 1) > s) as u32;
            }
        }
    });
    bad == 0
}

multiversion! {
    fn levels_ok(src: &[u8], n: usize, s: u32) -> bool = levels_ok_impl;
}

/// Whether every code of a packed stream of `n` codes has a level `<= s` (what decoding
/// requires; also checked by the CUDA path's payload validation).
pub(crate) fn packed_levels_ok(src: &[u8], n: usize, s: u32) -> bool {
    levels_ok(src, n, s)
}

impl Dithering {
    /// Norms read from a payload: finite, `>= 0`, and (linear) `norm * s` finite.
    fn check_norms(&self, norms: &[f32]) -> Result<(), KernelError> {
        let linear = self.partition == Partition::Linear;
        match norms.iter().enumerate().find(|(_, v)| {
            !(v.is_finite() && **v >= 0.0 && (!linear || (**v * self.s as f32).is_finite()))
        }) {
            Some((b, v)) => Err(KernelError::malformed(
                &self.base.name,
                format!("bucket {b}: norm {v} is not a finite number >= 0 (with norm * s finite)"),
            )),
            None => Ok(()),
        }
    }

    fn decode_packed(&self, payload: &[u8], out: &mut [f32], add: bool) -> Result<(), KernelError> {
        self.base.check_payload(payload.len())?;
        let nb = self.bk.count;
        let norms: Vec<f32> = (0..nb).map(|b| crate::simd::get_f32(payload, b)).collect();
        self.check_norms(&norms)?;
        let bits = &payload[4 * nb..];
        let w = self.w();
        if !super::tail_bits_zero(bits, self.base.n, w) {
            return Err(KernelError::malformed(
                &self.base.name,
                "padding bits after the last code are not zero",
            ));
        }
        // Codes whose level exceeds s can only exist when s + 1 is not a power of two.
        if (self.s + 1).count_ones() != 1 {
            let seg = crate::par::SEG;
            let seg_bytes = seg / 8 * w as usize;
            let n = self.base.n;
            let ok = if crate::par::enabled(n) {
                bits.par_chunks(seg_bytes)
                    .enumerate()
                    .all(|(i, c)| levels_ok(c, seg.min(n - i * seg), self.s))
            } else {
                levels_ok(bits, n, self.s)
            };
            if !ok {
                return Err(KernelError::malformed(
                    &self.base.name,
                    format!("a code has a level above s = {}", self.s),
                ));
            }
        }
        let natural = self.partition == Partition::Natural;
        let f = match (natural, add) {
            (false, false) => decode_linear,
            (false, true) => decode_linear_add,
            (true, false) => decode_natural,
            (true, true) => decode_natural_add,
        };
        par_segments_out(bits, w, out, |s, i0, o| {
            f(s, i0, o, &norms, &self.bk, self.s)
        });
        Ok(())
    }
}

impl Codec for Dithering {
    fn info(&self) -> &CodecInfo {
        &self.base
    }
    fn encode(&mut self, input: &[f32], ctx: &RoundCtx, out: &mut Vec<u8>) -> Result<()> {
        let norms = self.norms(input)?;
        if self.partition == Partition::Linear {
            // Linear values are (norm * level) / s: norm * s must stay finite.
            if let Some((b, nm)) = norms
                .iter()
                .enumerate()
                .find(|(_, nm)| !(**nm * self.s as f32).is_finite())
            {
                return Err(KernelError::overflow(
                    &self.base.name,
                    format!(
                        "bucket {b}: norm {nm} times s = {} overflows f32 (decoded values are \
                         norm * level / s)",
                        self.s
                    ),
                ));
            }
        }
        let stream = self.base.rounding(ctx.round);
        match self.encoding {
            Encoding::Elias(code) => self.compress_elias(code, input, &norms, stream, out),
            Encoding::Packed => {
                let nb = self.bk.count;
                let dst = prepare(out, self.packed_size());
                let (head, bits) = dst.split_at_mut(4 * nb);
                super::put_f32s(head, norms.iter().copied());
                let f = match self.partition {
                    Partition::Linear => encode_linear,
                    Partition::Natural => encode_natural,
                };
                let factors = self.factors(&norms);
                par_segments(input, self.w(), bits, |xs, i0, d| {
                    f(xs, i0, d, stream, (&norms, &factors), &self.bk, self.s)
                });
                Ok(())
            }
        }
    }
    fn decode(&self, payload: &[u8], _ctx: &RoundCtx, out: &mut [f32], add: bool) -> Result<()> {
        match self.encoding {
            Encoding::Packed => self.decode_packed(payload, out, add),
            Encoding::Elias(code) => {
                let entries = self.elias_entries(code, payload)?;
                scatter(out, entries.iter().map(|&(i, v)| (i as usize, v)), add);
                Ok(())
            }
        }
    }
}
