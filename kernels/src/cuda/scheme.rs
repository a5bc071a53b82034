//! [`GpuScheme`]: the fixed-width encodings the CUDA kernels implement, their parameters and
//! payload sizes; [`RoundStreams`]: the random streams of one round.
//!
//! The formats are the ones documented in [`crate::cuda`]; the CPU compressors write the same
//! bytes. Elias-coded dithering, top-k, column-wise onebit and Moniqua stay on the CPU.

use super::CudaError;
use crate::rng::{Role, Stream};
use pushpull_proto::placement::{Kept, KeptCount, PayloadModel};

/// A fixed-width encoding and its parameters, as the CUDA path sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuScheme {
    /// n × IEEE binary16, saturating at ±65504.
    Fp16,
    /// n × bfloat16, saturating at the largest finite bf16.
    Bf16,
    /// f32 scale + n sign bits.
    OneBit {
        /// Scale = mean |x| of the chunk when true, 1.0 when false.
        scaling: bool,
    },
    /// Per-bucket (min, max) + n codes of `bits` bits with stochastic rounding.
    MinMax {
        /// Bits per code, 1..=8.
        bits: u32,
        /// Elements per bucket; `None` = the whole chunk.
        bucket: Option<usize>,
    },
    /// QSGD stochastic quantisation, packed: per-bucket norm + n codes of
    /// `1 + bit_length(levels)` bits.
    Dithering {
        /// Number of levels s (1..=32 for natural levels; 1..2^31 for linear).
        levels: u32,
        /// Natural (powers of two) levels instead of linear ones.
        natural: bool,
        /// Normalise by the l2 norm of the bucket instead of its max |x|.
        l2: bool,
        /// Elements per bucket; `None` = the whole chunk.
        bucket: Option<usize>,
    },
    /// k values at the keyed permutation's first k indices.
    RandomK {
        /// Number of values sent (at most the chunk length).
        k: usize,
        /// Scale by n / k so the decoded chunk is unbiased.
        unbiased: bool,
    },
}

impl GpuScheme {
    /// Checks the parameters for a chunk of `len` elements.
    pub fn validate(&self, len: usize) -> Result<(), CudaError> {
        let bad = |m: String| Err(CudaError::Invalid(m));
        match *self {
            GpuScheme::MinMax { bits, bucket } => {
                if !(1..=8).contains(&bits) {
                    return bad(format!("minmax bits = {bits}, allowed 1..=8"));
                }
                check_bucket(bucket)
            }
            GpuScheme::Dithering {
                levels,
                natural,
                bucket,
                ..
            } => {
                if natural && !(1..=32).contains(&levels) {
                    return bad(format!(
                        "natural dithering levels = {levels}, allowed 1..=32"
                    ));
                }
                if !(1..1u32 << 31).contains(&levels) {
                    return bad(format!("dithering levels = {levels}, allowed 1..2^31"));
                }
                check_bucket(bucket)
            }
            GpuScheme::RandomK { k, .. } => {
                if k > len {
                    return bad(format!("randomk k = {k} exceeds the chunk length {len}"));
                }
                Ok(())
            }
            GpuScheme::Fp16 | GpuScheme::Bf16 | GpuScheme::OneBit { .. } => Ok(()),
        }
    }

    /// The bucket length used for a chunk of `len` elements: the configured one clamped to
    /// `1..=max(len, 1)`, the chunk itself by default (never 0, so geometry never divides by
    /// zero; the same rule as the CPU compressors).
    pub fn bucket_len(&self, len: usize) -> usize {
        let b = match *self {
            GpuScheme::MinMax { bucket, .. } | GpuScheme::Dithering { bucket, .. } => bucket,
            _ => None,
        };
        b.unwrap_or(len).clamp(1, len.max(1))
    }

    /// The GPU scheme of a parsed parameter map, for a chunk of `len` elements
    /// (`full_chunk_len`: the tensor's full chunk length when this chunk is its shorter last
    /// one, as in [`crate::BuildOptions`]), on a node of `role`. `Ok(None)` for the compressors
    /// that stay on the CPU (`none`, `topk`, column-wise `onebit`, Elias-coded `dithering`,
    /// `moniqua`). Only the codec proper: error feedback and momentum are not part of it.
    /// Random-k scales by n/k only on workers, as the CPU compressor does.
    pub fn from_spec(
        spec: &crate::CompressorSpec,
        len: usize,
        full_chunk_len: Option<usize>,
        role: Role,
    ) -> Result<Option<GpuScheme>, crate::KernelError> {
        use crate::{
            Cast, DitheringSpec, Encoding, MinMaxSpec, Normalize, OneBitSpec, Partition,
            RandomKSpec,
        };
        let codec = &*spec.codec;
        if let Some(cast) = codec.downcast::<Cast>() {
            return Ok(match cast {
                Cast::Fp16 => Some(GpuScheme::Fp16),
                Cast::Bf16 => Some(GpuScheme::Bf16),
                Cast::None => None,
            });
        }
        if let Some(&OneBitSpec { scaling }) = codec.downcast() {
            return Ok(Some(GpuScheme::OneBit { scaling }));
        }
        if let Some(&MinMaxSpec { bits, bucket }) = codec.downcast() {
            return Ok(Some(GpuScheme::MinMax { bits, bucket }));
        }
        if let Some(d) = codec.downcast::<DitheringSpec>() {
            return Ok(
                (d.encoding == Encoding::Packed).then_some(GpuScheme::Dithering {
                    levels: d.s,
                    natural: d.partition == Partition::Natural,
                    l2: d.normalize == Normalize::L2,
                    bucket: d.bucket,
                }),
            );
        }
        if let Some(r) = codec.downcast::<RandomKSpec>() {
            let k = r.k.chunk_k(false, len, full_chunk_len.unwrap_or(len))?;
            return Ok(Some(GpuScheme::RandomK {
                k,
                unbiased: r.unbiased && role == Role::Worker,
            }));
        }
        Ok(None)
    }

    /// Code width in bits of the bit-stream encodings (`None` for the others).
    pub fn code_bits(&self) -> Option<u32> {
        match *self {
            GpuScheme::OneBit { .. } => Some(1),
            GpuScheme::MinMax { bits, .. } => Some(bits),
            GpuScheme::Dithering { levels, .. } => Some(1 + (32 - levels.leading_zeros())),
            _ => None,
        }
    }

    /// Payload bytes for a chunk of `len` elements (the documented formulas).
    pub fn compressed_len(&self, len: usize) -> usize {
        self.payload(len).bytes(len as u64, len as u64) as usize
    }

    /// Its payload for a chunk of `len` elements as the placement's model (the sizes'
    /// arithmetic is `PayloadModel::bytes`, the one the CPU compressors state theirs in).
    pub fn payload(&self, len: usize) -> PayloadModel {
        let bucket = Some(self.bucket_len(len) as u64);
        let stream_bits = u64::from(self.code_bits().unwrap_or(0));
        let base = PayloadModel {
            stream_bits,
            ..PayloadModel::default()
        };
        match *self {
            GpuScheme::Fp16 | GpuScheme::Bf16 => PayloadModel {
                per_element: 2,
                ..base
            },
            GpuScheme::OneBit { .. } => PayloadModel { header: 4, ..base },
            GpuScheme::MinMax { .. } => PayloadModel {
                per_bucket: 8,
                bucket,
                ..base
            },
            GpuScheme::Dithering { .. } => PayloadModel {
                per_bucket: 4,
                bucket,
                ..base
            },
            GpuScheme::RandomK { k, .. } => PayloadModel {
                kept: Some(Kept {
                    bytes: 4,
                    count: KeptCount::Count(k as u64),
                    at_most_half: false,
                }),
                ..base
            },
        }
    }

    /// What the CPU compressors would have refused, read from a compressed chunk's header:
    /// a onebit scale, a minmax bucket's `max - min`, a dithering norm (or, for linear levels,
    /// norm × s) that overflows f32, or a random-k value `x · n/k` that does.
    /// `None` when the payload is fine (or too short to hold the header).
    pub fn header_problem(&self, len: usize, payload: &[u8]) -> Option<String> {
        let nb = num_buckets(len, self.bucket_len(len));
        let f = |i: usize| {
            payload
                .get(4 * i..4 * i + 4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        match *self {
            GpuScheme::OneBit { .. } => f(0)
                .filter(|v| !v.is_finite())
                .map(|v| format!("the scale (mean |x|) is {v}: the sum of |x| overflows f32")),
            GpuScheme::MinMax { .. } => (0..nb).find_map(|b| {
                let (mn, mx) = (f(2 * b)?, f(2 * b + 1)?);
                (!(mx - mn).is_finite())
                    .then(|| format!("bucket {b}: max - min = {mx} - {mn} overflows f32"))
            }),
            GpuScheme::Dithering {
                levels, natural, ..
            } => (0..nb).find_map(|b| {
                let v = f(b)?;
                if !v.is_finite() {
                    return Some(format!(
                        "bucket {b}: norm {v} is not finite (the sum of squares overflows f32; \
                         use normalize=max)"
                    ));
                }
                // Linear values are (norm * level) / s: norm * s must stay finite.
                (!natural && !(v * levels as f32).is_finite()).then(|| {
                    format!(
                        "bucket {b}: norm {v} times s = {levels} overflows f32 (decoded values \
                         are norm * level / s)"
                    )
                })
            }),
            // Values are x * n/k, which overflows for |x| near f32::MAX.
            GpuScheme::RandomK { k, unbiased } => (0..k).find_map(|j| {
                let v = f(j)?;
                (!v.is_finite()).then(|| {
                    let scale = GpuScheme::randomk_scale(len, k, unbiased);
                    format!("value {j} of the payload is x times n/k = {scale}: it overflows f32")
                })
            }),
            _ => None,
        }
    }

    /// What the CPU compressors' decompress would refuse in `payload` for a chunk of `len`
    /// elements, or `None`: a wrong length, a onebit scale or a dithering norm that is not a
    /// finite number `>= 0` (for linear levels also `norm × s` finite), a minmax bucket without
    /// finite `min <= max` and step, non-zero padding bits after the last code, a dithering
    /// level above s, a random-k value that is not finite. The CUDA decoders check none of
    /// this, so the device data path calls it before it uploads a payload.
    pub fn payload_problem(&self, len: usize, payload: &[u8]) -> Option<String> {
        let want = self.compressed_len(len);
        if payload.len() != want {
            return Some(format!(
                "payload is {} bytes, expected {want}",
                payload.len()
            ));
        }
        let nb = num_buckets(len, self.bucket_len(len));
        let f = |i: usize| pushpull_codecs::payload::f32_at(payload, i);
        let tail = |header_words: usize, w: u32| {
            (!pushpull_codecs::payload::tail_bits_zero(&payload[4 * header_words..], len, w))
                .then(|| "padding bits after the last code are not zero".to_string())
        };
        match *self {
            GpuScheme::Fp16 | GpuScheme::Bf16 => None,
            GpuScheme::OneBit { .. } => {
                let scale = f(0);
                if !(scale.is_finite() && scale >= 0.0) {
                    return Some(format!("scale {scale} is not a finite number >= 0"));
                }
                tail(1, 1)
            }
            GpuScheme::MinMax { bits, .. } => {
                let levels = (1u32 << bits) - 1;
                for b in 0..nb {
                    let (mn, mx) = (f(2 * b), f(2 * b + 1));
                    let step = crate::elem::minmax_step(mn, mx, levels);
                    if !(mn.is_finite() && mx.is_finite() && mn <= mx && step.is_finite()) {
                        return Some(format!(
                            "bucket {b}: min {mn} and max {mx} are not finite with min <= max"
                        ));
                    }
                }
                tail(2 * nb, bits)
            }
            GpuScheme::Dithering {
                levels, natural, ..
            } => {
                for b in 0..nb {
                    let v = f(b);
                    if !(v.is_finite() && v >= 0.0 && (natural || (v * levels as f32).is_finite()))
                    {
                        return Some(format!(
                            "bucket {b}: norm {v} is not a finite number >= 0 (with norm * s \
                             finite)"
                        ));
                    }
                }
                let w = self.code_bits().unwrap_or(1);
                if let Some(p) = tail(nb, w) {
                    return Some(p);
                }
                let codes = &payload[4 * nb..];
                ((levels + 1).count_ones() != 1
                    && !pushpull_codecs::payload::packed_levels_ok(codes, len, levels))
                .then(|| format!("a code has a level above s = {levels}"))
            }
            GpuScheme::RandomK { k, .. } => (0..k)
                .find(|&j| !f(j).is_finite())
                .map(|j| format!("value {j} is not finite")),
        }
    }

    /// Random-k's value scale: `len as f32 / k as f32` when unbiased, else 1.
    pub fn randomk_scale(len: usize, k: usize, unbiased: bool) -> f32 {
        if unbiased && k > 0 {
            len as f32 / k as f32
        } else {
            1.0
        }
    }
}

fn check_bucket(bucket: Option<usize>) -> Result<(), CudaError> {
    match bucket {
        Some(0) => Err(CudaError::Invalid(
            "bucket = 0, allowed: at least 1 (or unset for the whole chunk)".into(),
        )),
        _ => Ok(()),
    }
}

/// `ceil(len / bucket)`, 0 for an empty chunk.
pub fn num_buckets(len: usize, bucket: usize) -> usize {
    if len == 0 {
        0
    } else {
        len.div_ceil(bucket.max(1))
    }
}

/// Pieces of `unit` elements (reduction blocks, min/max spans) of a chunk of `n` elements, counted
/// from each bucket start: `pp_num_pieces` of the CUDA header.
pub fn num_pieces(n: u64, bucket: u64, unit: u64) -> u64 {
    let nb = num_buckets(n as usize, bucket as usize) as u64;
    if nb == 0 {
        return 0;
    }
    let last = n - (nb - 1) * bucket;
    (nb - 1) * bucket.div_ceil(unit) + last.div_ceil(unit)
}

/// Elements per reduction block (`PP_REDUCE_BLOCK`; [`crate::elem::REDUCE_BLOCK`]).
pub const REDUCE_BLOCK: u64 = 256;
/// Elements per min/max span (`PP_SPAN`).
pub const SPAN: u64 = 2048;
/// Output words per pack block (`PP_PACK_WORDS`).
pub const PACK_WORDS: u64 = 256;
/// Elements per decode thread (`PP_GROUP`).
pub const GROUP: u64 = 4;

/// Shared-memory floats a pack (compress) block needs for code width `w`:
/// `pp_pack_tile_capacity` of the CUDA header (256 words of codes, one padding float per 32).
pub fn pack_tile_capacity(w: u32) -> u64 {
    let elems = 256 * 32 / w.max(1) as u64 + 2;
    elems + (elems >> 5) + 1
}

/// The two random streams of one (key, round) on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundStreams {
    /// Stochastic rounding: [`Stream::rounding`] of (job seed, key, round, role, rank).
    pub rounding: Stream,
    /// Random-k indices: [`Stream::indices`] of (job seed, key, round), the same on every node.
    pub indices: Stream,
}

impl RoundStreams {
    /// The streams a node of `role` and `rank` uses for `key` in `round`.
    pub fn new(job_seed: u64, key: u64, round: u64, role: Role, rank: u32) -> RoundStreams {
        RoundStreams {
            rounding: Stream::rounding(job_seed, key, round, role, rank),
            indices: Stream::indices(job_seed, key, round),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_the_formulas() {
        let mm = GpuScheme::MinMax {
            bits: 3,
            bucket: Some(10),
        };
        assert_eq!(mm.compressed_len(0), 0);
        assert_eq!(mm.compressed_len(1), 8 + 4);
        assert_eq!(mm.compressed_len(21), 3 * 8 + 4 * 2); // 63 bits
        let d = GpuScheme::Dithering {
            levels: 4,
            natural: false,
            l2: true,
            bucket: None,
        };
        assert_eq!(d.code_bits(), Some(4));
        assert_eq!(d.compressed_len(33), 4 + 4 * 5);
        assert_eq!(GpuScheme::OneBit { scaling: true }.compressed_len(0), 4);
        assert_eq!(GpuScheme::OneBit { scaling: true }.compressed_len(33), 12);
        assert_eq!(GpuScheme::Fp16.compressed_len(7), 14);
        let rk = GpuScheme::RandomK {
            k: 5,
            unbiased: true,
        };
        assert_eq!(rk.compressed_len(100), 20);
    }

    #[test]
    fn geometry_constants_match_the_header() {
        for (name, v) in [
            ("PP_REDUCE_BLOCK", REDUCE_BLOCK),
            ("PP_PACK_WORDS", PACK_WORDS),
            ("PP_GROUP", GROUP),
        ] {
            let line = format!("#define {name} {v}u");
            assert!(
                super::super::SOURCE.contains(&line),
                "{line} not in the header"
            );
        }
        assert!(super::super::SOURCE.contains(&format!("#define PP_SPAN {SPAN}u")));
        let group = format!("#define PP_SUM_GROUP {}u", crate::elem::SUM_GROUP);
        assert!(
            super::super::SOURCE.contains(&group),
            "{group} not in the header"
        );
        assert_eq!(REDUCE_BLOCK as usize, crate::elem::REDUCE_BLOCK);
    }

    #[test]
    fn validation_names_the_value() {
        let e = GpuScheme::MinMax {
            bits: 9,
            bucket: None,
        }
        .validate(10)
        .unwrap_err()
        .to_string();
        assert!(e.contains('9') && e.contains("1..=8"), "{e}");
        let e = GpuScheme::RandomK {
            k: 11,
            unbiased: false,
        }
        .validate(10)
        .unwrap_err()
        .to_string();
        assert!(e.contains("11") && e.contains("10"), "{e}");
        assert!(GpuScheme::Dithering {
            levels: 33,
            natural: true,
            l2: false,
            bucket: None
        }
        .validate(1)
        .is_err());
    }
}
