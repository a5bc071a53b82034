//! A tensor's cut, decided once: the cluster's rules ([`CutRules`]), what a chunk's payload
//! weighs as a function of its length ([`PayloadModel`], stated by each compressor as data),
//! and the chunk size and unit they give a tensor ([`TensorCut`]). The scheduler places with
//! it and the single-process reference cuts with it; `pushpull_codecs::chunk::tensor_cut`
//! makes one from a tensor's map.

use super::chunk_ranges;
pub use crate::config::CutRules;

/// The largest payload one push of a chunk of `n` elements carries, as data:
/// `header + per_element·n + 4·⌈n·stream_bits/32⌉ + per_bucket·buckets(n) + kept_bytes·k(n)`,
/// with `buckets(n) = ⌈n/bucket⌉` (one for the whole chunk without `bucket`, none when
/// `n = 0`) and `k(n)` the kept elements of a sparse compressor ([`Kept`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PayloadModel {
    /// Bytes every payload starts with.
    pub header: u64,
    /// Bytes per element written whole (fp32: 4, fp16: 2).
    pub per_element: u64,
    /// Bits per element of a bit stream padded to whole 32-bit words.
    pub stream_bits: u64,
    /// Bytes per bucket (its scale, its min and max).
    pub per_bucket: u64,
    /// The bucket's length in elements; `None`: the chunk is one bucket.
    pub bucket: Option<u64>,
    /// A sparse compressor's kept elements.
    pub kept: Option<Kept>,
}

/// The elements a sparse compressor keeps of a chunk, and the bytes each takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Kept {
    /// Bytes per kept element (an index and a value: 8; a value: 4).
    pub bytes: u64,
    /// How many.
    pub count: KeptCount,
    /// At most half the chunk (top-k), else at most the chunk.
    pub at_most_half: bool,
}

/// `k` of a sparse compressor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KeptCount {
    /// A fraction of the chunk, in (0, 1).
    Fraction(f64),
    /// A count per full-size chunk, >= 1.
    Count(u64),
}

impl Kept {
    /// The most elements a chunk of `n` may keep.
    pub fn limit(&self, n: u64) -> u64 {
        if self.at_most_half {
            (n / 2).max(n.min(1))
        } else {
            n
        }
    }

    /// The elements a chunk of `n` keeps, the tensor's full-size chunks holding `full`: a
    /// fraction `f` keeps `max(1, ⌊f·n⌋)` (0 of an empty chunk); a count `c` keeps `c` of a
    /// full-size chunk and `⌈c·n/full⌉` of a shorter one (the same proportion); never more
    /// than [`Kept::limit`]. (That `c` fits a full-size chunk is the codec's check.)
    pub fn of(&self, n: u64, full: u64) -> u64 {
        let full = full.max(n);
        let k = match self.count {
            KeptCount::Fraction(_) if n == 0 => 0,
            KeptCount::Fraction(f) => ((f * n as f64).floor() as u64).max(1),
            KeptCount::Count(c) if n == full => c,
            KeptCount::Count(c) => {
                (u128::from(c) * u128::from(n)).div_ceil(u128::from(full)) as u64
            }
        };
        k.min(self.limit(n))
    }
}

impl PayloadModel {
    /// fp32 as is: what a tensor below `min_compress_bytes`, or a map the codecs refuse,
    /// weighs.
    pub const FP32: PayloadModel = PayloadModel {
        header: 0,
        per_element: 4,
        stream_bits: 0,
        per_bucket: 0,
        bucket: None,
        kept: None,
    };

    /// The payload of a chunk of `n` elements, the tensor's full-size chunks holding `full`.
    pub fn bytes(&self, n: u64, full: u64) -> u64 {
        let buckets = match (n, self.bucket) {
            (0, _) => 0,
            (_, None) => 1,
            (_, Some(b)) => n.div_ceil(b.max(1)),
        };
        let stream = 4 * (n.saturating_mul(self.stream_bits)).div_ceil(32);
        let kept = self.kept.map_or(0, |k| k.bytes * k.of(n, full));
        self.header + self.per_element * n + stream + self.per_bucket * buckets + kept
    }
}

/// A tensor's cut: its chunks' size and unit, and what each weighs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorCut {
    /// The fp32 bytes of a full-size chunk at most: `partition_bytes`, halved (in whole
    /// elements) until one chunk's payload is at most `max_chunk_payload_bytes`.
    pub chunk_bytes: u64,
    /// Chunks hold whole units of this many elements (a column of a column-wise onebit
    /// tensor), else 1 ([`super::chunk_ranges_in`]).
    pub unit: u64,
    /// What a chunk's push carries.
    pub payload: PayloadModel,
}

impl TensorCut {
    /// The cut of a tensor of `len` elements in whole `unit`s whose chunks carry `payload`.
    /// Compressed chunks are small and keep `partition_bytes`; a tensor sent as fp32 or fp16
    /// gets chunks of about `max_chunk_payload_bytes` on the wire, because a server can send a
    /// chunk's sum only once every worker's copy of it has arrived, so on a slow link the
    /// round's first results wait, and its last ones trail, about one chunk per worker
    /// (BENCHMARKS.md, "Chunk size"). Never below one element. A trial's longest chunk is
    /// weighed in whole units.
    pub fn new(len: u64, rules: &CutRules, unit: u64, payload: PayloadModel) -> TensorCut {
        let mut elems = (rules.partition_bytes / 4).max(1);
        let unit = unit.max(1);
        loop {
            let full = chunk_ranges(len, elems * 4).next().map_or(0, |(_, l)| l);
            let whole = if full % unit != 0 {
                (full / unit).max(1) * unit
            } else {
                full
            };
            if full <= 1
                || elems <= 1
                || payload.bytes(whole, whole) <= rules.max_chunk_payload_bytes
            {
                return TensorCut {
                    chunk_bytes: elems * 4,
                    unit,
                    payload,
                };
            }
            elems /= 2;
        }
    }

    /// Chunks of `partition_bytes`, single elements, weighed as fp32 ([`super::Placer::place`]).
    pub fn fp32(partition_bytes: u64) -> TensorCut {
        TensorCut {
            chunk_bytes: partition_bytes,
            unit: 1,
            payload: PayloadModel::FP32,
        }
    }

    /// `(offset, len)` of every chunk of a tensor of `len` elements
    /// ([`super::chunk_ranges_in`]).
    pub fn ranges(&self, len: u64) -> Box<dyn Iterator<Item = (u64, u64)>> {
        super::chunk_ranges_in(len, self.chunk_bytes, self.unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(partition_bytes: u64, max_chunk_payload_bytes: u64) -> CutRules {
        CutRules {
            partition_bytes,
            max_chunk_payload_bytes,
            min_compress_bytes: 0,
        }
    }

    fn cut_bytes(len: u64, p: u64, m: u64, model: PayloadModel) -> u64 {
        TensorCut::new(len, &rules(p, m), 1, model).chunk_bytes
    }

    #[test]
    fn cut_halves_until_the_payload_fits() {
        let fp32 = PayloadModel::FP32;
        // Raw fp32: 128 KiB -> 32 KiB chunks under a 32 KiB payload bound.
        assert_eq!(cut_bytes(1 << 20, 131_072, 32_768, fp32), 32_768);
        // (header, bytes per element, stream bits per element)
        let model = |header, per_element, stream_bits| PayloadModel {
            header,
            per_element,
            stream_bits,
            ..PayloadModel::default()
        };
        // A payload already within the bound keeps the partition (onebit: 1 bit + 4 bytes).
        assert_eq!(cut_bytes(1 << 20, 131_072, 32_768, model(4, 0, 1)), 131_072);
        // fp16: 2 bytes per element -> 64 KiB of fp32 per chunk.
        assert_eq!(cut_bytes(1 << 20, 131_072, 32_768, model(0, 2, 0)), 65_536);
        // A header over the bound halves once more: whole halvings, no odd sizes.
        assert_eq!(
            cut_bytes(1 << 20, 131_072, 32_768, model(512, 1, 0)),
            65_536
        );
        // A small tensor is cut only as far as its own chunks need: 10,000 fp32 elements
        // (40 kB) in two chunks of 5,000.
        let part = cut_bytes(10_000, 131_072, 32_768, fp32);
        assert_eq!(chunk_ranges(10_000, part).count(), 2);
        // Never below one element, whatever the bound; odd partitions stay multiples of 4.
        assert_eq!(cut_bytes(1 << 20, 131_072, 0, fp32), 4);
        for (p, m) in [(131_076u64, 1_000u64), (12, 5), (4, 1)] {
            let c = cut_bytes(1 << 16, p, m, fp32);
            assert!(c % 4 == 0 && c >= 4 && c <= p, "{p} {m}: {c}");
        }
        // Every chunk of the cut respects the bound when the payload is proportional.
        for len in [1u64, 7, 8_193, 100_000, 3_000_001] {
            let part = cut_bytes(len, 131_072, 32_768, fp32);
            assert!(chunk_ranges(len, part).all(|(_, l)| 4 * l <= 32_768 || l == 1));
        }
    }

    #[test]
    fn kept_counts_follow_the_chunk() {
        let top = |count| Kept {
            bytes: 8,
            count,
            at_most_half: true,
        };
        let f = top(KeptCount::Fraction(0.01));
        assert_eq!((f.of(1000, 1000), f.of(50, 1000), f.of(0, 0)), (10, 1, 0));
        let c = top(KeptCount::Count(100));
        assert_eq!(
            (c.of(1000, 1000), c.of(250, 1000), c.of(3, 1000)),
            (100, 25, 1)
        );
        assert_eq!(top(KeptCount::Count(9)).of(10, 10), 5);
        let model = PayloadModel {
            kept: Some(f),
            ..PayloadModel::default()
        };
        assert_eq!(model.bytes(20_000, 20_000), 8 * 200);
    }
}
