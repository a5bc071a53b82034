//! Parsing a tensor's string-to-string parameter map into a validated [`CompressorSpec`].
//!
//! Keys are matched exactly (case-sensitive), values too; see the table in the crate docs or
//! [`KEYS`]. Every problem is an error naming the key as spelled, the value and what is allowed:
//! an unknown key, a key that does not apply to the chosen compressor, two spellings of one key
//! with different values, an unknown name, a number that does not parse or is out of range,
//! a missing required value. Checks that need the chunk length (k against the length) happen
//! when the compressor is built ([`crate::build_compressor`]) or in
//! [`CompressorSpec::check_len`].

mod keys;
mod parse;

pub use crate::codecs::moniqua::{Rounding, ThetaSchedule};
use crate::error::KernelError;
pub use crate::reduce::IntraCodec;
use std::collections::BTreeMap;
use std::fmt;

pub use keys::{overlay_params, KeyInfo, KEYS};
pub use parse::parse_params;

/// `k` of topk and randomk.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KSpec {
    /// A fraction of the chunk, in (0, 1).
    Fraction(f64),
    /// A count per chunk, >= 1.
    Count(u64),
}

impl fmt::Display for KSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KSpec::Fraction(v) => write!(f, "{v}"),
            KSpec::Count(v) => write!(f, "{v}"),
        }
    }
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
    /// Elias-coded gaps and levels of the non-zero elements.
    Elias,
}

/// The compressor proper (without error feedback or momentum).
#[derive(Debug, Clone, PartialEq)]
pub enum CodecSpec {
    /// fp32 as is.
    None,
    /// IEEE half precision, saturating.
    Fp16,
    /// bfloat16, saturating.
    Bf16,
    /// Sign bits and one scale.
    OneBit {
        /// Scale = mean |x| (else 1).
        scaling: bool,
    },
    /// Sign bits and two levels per column.
    OneBitColumns {
        /// Column count: column-major, a column is `len / columns` contiguous elements.
        columns: usize,
        /// The columns of one chunk of a tensor (the chunk's codec reads `chunk_columns`
        /// columns of its own; [`CompressorSpec::for_chunk`]); `None` for a codec built alone,
        /// whose columns are `columns`. Not part of the map or the name.
        chunk_columns: Option<usize>,
    },
    /// The k largest magnitudes.
    TopK {
        /// k.
        k: KSpec,
    },
    /// k values at shared pseudo-random indices.
    RandomK {
        /// k.
        k: KSpec,
        /// Scale by n/k on workers.
        unbiased: bool,
    },
    /// QSGD stochastic quantisation.
    Dithering {
        /// Levels s.
        s: u32,
        /// Level partition.
        partition: Partition,
        /// Per-bucket scale.
        normalize: Normalize,
        /// Bucket length (None: the whole chunk).
        bucket: Option<usize>,
        /// Wire encoding.
        encoding: Encoding,
    },
    /// QSGD-TF min-max quantisation.
    MinMax {
        /// Bits per element.
        bits: u32,
        /// Bucket length (None: the whole chunk).
        bucket: Option<usize>,
    },
    /// Moniqua modulo quantisation.
    Moniqua {
        /// The bound θ on |x - reference|.
        theta: f64,
        /// Bits per element.
        bits: u32,
        /// Rounding mode.
        rounding: Rounding,
        /// Whether θ follows the learning rate.
        schedule: ThetaSchedule,
        /// Whether each message carries the hash of its un-modded values (checked on decoding).
        hash: bool,
    },
}

/// Error feedback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EfKind {
    /// `p = g + e; e ← p − D(C(p))`.
    Vanilla,
    /// `p = g + (η_{t−1}/η_t)·e; e ← p − D(C(p))`, η from [`crate::RoundCtx::lr`].
    Corrected,
}

/// A validated, normalised parameter map: compare two workers' specs with `==`, print one with
/// `Display` (a canonical `key=value` list) or turn it back into a map with
/// [`CompressorSpec::to_params`].
#[derive(Debug, Clone, PartialEq)]
pub struct CompressorSpec {
    /// The compressor.
    pub codec: CodecSpec,
    /// Error feedback, if any.
    pub ef: Option<EfKind>,
    /// Nesterov momentum's `mu`, if momentum is on (applied on workers only).
    pub momentum_mu: Option<f32>,
    /// A per-tensor seed replacing the job seed.
    pub seed: Option<u64>,
    /// The intra-host codec (`intra_compressor`): what a local group's members round their
    /// gradients to before the host sum ([`crate::reduce::host_fold`]).
    pub intra: IntraCodec,
    /// How the tensor is exchanged (`exchange`): summed through the servers, or averaged
    /// with the worker's graph neighbours.
    pub exchange: Exchange,
}

/// Whether a tensor with map `params` is gossiped (`exchange = "gossip"`); a map the codecs
/// refuse is not (its codec's factory names what is wrong).
pub fn is_gossip(params: &BTreeMap<String, String>) -> bool {
    parse_params(params).is_ok_and(|s| s.exchange == Exchange::Gossip)
}

/// The `exchange` key: what a round of the tensor does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Exchange {
    /// `push_pull` (the default): every worker's values summed (or averaged) through the
    /// servers; what gradients need.
    #[default]
    PushPull,
    /// `gossip`: decentralised averaging of model parameters (Moniqua's Algorithm 1): each
    /// worker's encoded values go to its neighbours in the cluster's mixing matrix (relayed
    /// by the servers, undecoded), and each worker averages what it receives with its own
    /// (`pushpull_codecs::gossip`). Takes the compressors with a fixed payload (none, fp16,
    /// bf16, minmax, moniqua) and no error feedback or momentum; the workers' rounding draws
    /// are shared (the same for every rank).
    Gossip,
}

impl Default for CompressorSpec {
    fn default() -> Self {
        CompressorSpec {
            codec: CodecSpec::None,
            ef: None,
            momentum_mu: None,
            seed: None,
            intra: IntraCodec::None,
            exchange: Exchange::PushPull,
        }
    }
}

impl CodecSpec {
    /// The compressor's name as in the `compressor` key.
    pub fn kind(&self) -> &'static str {
        match self {
            CodecSpec::None => "none",
            CodecSpec::Fp16 => "fp16",
            CodecSpec::Bf16 => "bf16",
            CodecSpec::OneBit { .. } | CodecSpec::OneBitColumns { .. } => "onebit",
            CodecSpec::TopK { .. } => "topk",
            CodecSpec::RandomK { .. } => "randomk",
            CodecSpec::Dithering { .. } => "dithering",
            CodecSpec::MinMax { .. } => "minmax",
            CodecSpec::Moniqua { .. } => "moniqua",
        }
    }

    /// The canonical short-key map of the compressor's own settings (defaults included).
    fn params(&self, m: &mut BTreeMap<String, String>) {
        let mut put = |k: &str, v: String| {
            m.insert(k.to_string(), v);
        };
        put("compressor", self.kind().to_string());
        match self {
            CodecSpec::None | CodecSpec::Fp16 | CodecSpec::Bf16 => {}
            CodecSpec::OneBit { scaling } => put("scaling", scaling.to_string()),
            CodecSpec::OneBitColumns { columns, .. } => put("columns", columns.to_string()),
            CodecSpec::TopK { k } => put("k", k.to_string()),
            CodecSpec::RandomK { k, unbiased } => {
                put("k", k.to_string());
                put("unbiased", unbiased.to_string());
            }
            CodecSpec::Dithering {
                s,
                partition,
                normalize,
                bucket,
                encoding,
            } => {
                put("k", s.to_string());
                put("partition", partition_name(*partition).to_string());
                put("normalize", normalize_name(*normalize).to_string());
                if let Some(b) = bucket {
                    put("bucket", b.to_string());
                }
                put("encoding", encoding_name(*encoding).to_string());
            }
            CodecSpec::MinMax { bits, bucket } => {
                put("bits", bits.to_string());
                if let Some(b) = bucket {
                    put("bucket", b.to_string());
                }
            }
            CodecSpec::Moniqua {
                theta,
                bits,
                rounding,
                schedule,
                hash,
            } => {
                put("theta", theta.to_string());
                if *hash {
                    put("hash", "true".to_string());
                }
                put("bits", bits.to_string());
                put("rounding", rounding_name(*rounding).to_string());
                match schedule {
                    ThetaSchedule::Fixed => {}
                    ThetaSchedule::Lr => put("theta_schedule", "lr".to_string()),
                    ThetaSchedule::Bound => put("theta_schedule", "bound".to_string()),
                }
            }
        }
    }

    /// The name a built compressor reports (without error feedback or momentum), e.g. `topk(k=3)`.
    pub fn display_name(&self) -> String {
        match self {
            CodecSpec::None => "none".into(),
            CodecSpec::Fp16 => "fp16".into(),
            CodecSpec::Bf16 => "bf16".into(),
            CodecSpec::OneBit { scaling } => format!("onebit(scaling={scaling})"),
            CodecSpec::OneBitColumns { columns, .. } => format!("onebit(columns={columns})"),
            CodecSpec::TopK { k } => format!("topk(k={k})"),
            CodecSpec::RandomK { k, unbiased } => format!("randomk(k={k}, unbiased={unbiased})"),
            CodecSpec::Dithering {
                s,
                partition,
                normalize,
                bucket,
                encoding,
            } => {
                let b = bucket.map(|b| format!(", bucket={b}")).unwrap_or_default();
                format!(
                    "dithering(k={s}, {}, {}{b}, {})",
                    partition_name(*partition),
                    normalize_name(*normalize),
                    encoding_name(*encoding)
                )
            }
            CodecSpec::MinMax { bits, bucket } => {
                let b = bucket.map(|b| format!(", bucket={b}")).unwrap_or_default();
                format!("minmax(bits={bits}{b})")
            }
            CodecSpec::Moniqua {
                theta,
                bits,
                rounding,
                schedule,
                hash,
            } => {
                let check = if *hash { ", hash" } else { "" };
                let per_lr = match schedule {
                    ThetaSchedule::Fixed => "",
                    ThetaSchedule::Lr => " x lr",
                    ThetaSchedule::Bound => " x bound",
                };
                format!(
                    "moniqua(theta={theta}{per_lr}, bits={bits}, {}{check})",
                    rounding_name(*rounding)
                )
            }
        }
    }
}

fn partition_name(p: Partition) -> &'static str {
    match p {
        Partition::Linear => "linear",
        Partition::Natural => "natural",
    }
}
fn normalize_name(p: Normalize) -> &'static str {
    match p {
        Normalize::Max => "max",
        Normalize::L2 => "l2",
    }
}
fn encoding_name(p: Encoding) -> &'static str {
    match p {
        Encoding::Packed => "packed",
        Encoding::Elias => "elias",
    }
}
fn rounding_name(p: Rounding) -> &'static str {
    match p {
        Rounding::Stochastic => "stochastic",
        Rounding::Nearest => "nearest",
    }
}

impl CompressorSpec {
    /// Whether a round of the tensor is a plain float32 sum through the servers: no codec, no
    /// error feedback, no momentum, no intra-host rounding, not gossiped. Such a tensor holds no
    /// state and each element is summed on its own, so several of them may travel as one
    /// tensor, bit for bit the same (`pushpull.torch`'s `DistributedOptimizer` packs a
    /// bucket's small ones together).
    pub fn is_plain(&self) -> bool {
        self.codec == CodecSpec::None
            && self.ef.is_none()
            && self.momentum_mu.is_none()
            && self.intra == IntraCodec::None
            && self.exchange == Exchange::PushPull
    }

    /// The elements of one column of a column-wise onebit tensor of `tensor_len` elements
    /// (`columns` columns, column-major: a column is `tensor_len / columns` contiguous
    /// elements): the unit its chunks are cut in (`pushpull_proto::placement::chunk_ranges_in`).
    /// `None` for other compressors, or when `columns` does not divide `tensor_len`.
    pub fn column_len(&self, tensor_len: u64) -> Option<u64> {
        match self.codec {
            CodecSpec::OneBitColumns { columns, .. } => {
                let c = columns as u64;
                (c > 0 && tensor_len > 0 && tensor_len % c == 0).then(|| tensor_len / c)
            }
            _ => None,
        }
    }

    /// The spec of one chunk of `chunk_len` elements of a tensor of `tensor_len`: the same,
    /// except that column-wise onebit gets the chunk's own count of whole columns
    /// (`chunk_columns`; its name stays the tensor's). Errors name the tensor's length, the columns and the chunk when the columns do
    /// not divide the tensor or the chunk does not hold whole columns.
    pub fn for_chunk(&self, tensor_len: u64, chunk_len: u64) -> Result<CompressorSpec, String> {
        let CodecSpec::OneBitColumns { columns, .. } = self.codec else {
            return Ok(self.clone());
        };
        let Some(col) = self.column_len(tensor_len) else {
            return Err(format!(
                "onebit with columns={columns}: a tensor of {tensor_len} elements is not \
                 {columns} whole columns (column-major: columns must divide the element count)"
            ));
        };
        if chunk_len % col != 0 {
            return Err(format!(
                "onebit with columns={columns}: a chunk of {chunk_len} elements does not hold \
                 whole columns of {col} (the scheduler cuts such tensors at column boundaries)"
            ));
        }
        Ok(CompressorSpec {
            codec: CodecSpec::OneBitColumns {
                columns,
                chunk_columns: Some((chunk_len / col) as usize),
            },
            ..self.clone()
        })
    }

    /// The canonical map (short keys, defaults filled in): two maps that parse to equal specs
    /// give equal canonical maps.
    pub fn to_params(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        self.codec.params(&mut m);
        match self.ef {
            Some(EfKind::Vanilla) => m.insert("ef".into(), "vanilla".into()),
            Some(EfKind::Corrected) => m.insert("ef".into(), "corrected".into()),
            // Column-wise onebit must say it goes without 1-bit SGD's residual.
            None if matches!(self.codec, CodecSpec::OneBitColumns { .. }) => {
                m.insert("ef".into(), "none".into())
            }
            None => None,
        };
        if let Some(mu) = self.momentum_mu {
            m.insert("momentum".into(), "nesterov".into());
            m.insert("mu".into(), mu.to_string());
        }
        if let Some(s) = self.seed {
            m.insert("seed".into(), s.to_string());
        }
        if self.intra != IntraCodec::None {
            m.insert("intra_compressor".into(), self.intra.name().into());
        }
        if self.exchange == Exchange::Gossip {
            m.insert("exchange".into(), "gossip".into());
        }
        m
    }

    /// Whether the chain draws random numbers (rounding or indices).
    pub fn is_stochastic(&self) -> bool {
        match &self.codec {
            CodecSpec::None
            | CodecSpec::Fp16
            | CodecSpec::Bf16
            | CodecSpec::OneBit { .. }
            | CodecSpec::OneBitColumns { .. }
            | CodecSpec::TopK { .. } => false,
            CodecSpec::RandomK { .. } | CodecSpec::Dithering { .. } | CodecSpec::MinMax { .. } => {
                true
            }
            CodecSpec::Moniqua { rounding, .. } => *rounding == Rounding::Stochastic,
        }
    }

    /// The k a chunk of `len` elements uses (topk and randomk; `None` for the others), with
    /// `full_len` the length of the tensor's full-size chunks (`full_len >= len`; pass `len`
    /// when the tensor is a single chunk or the chunk is full-size).
    ///
    /// * A fraction `f` gives `max(1, floor(f * len))` (0 when `len == 0`).
    /// * A count `k` is checked against `full_len` (topk: `k <= max(1, full_len / 2)`,
    ///   randomk: `k <= full_len`) and applies to every full-size chunk; a shorter chunk (the
    ///   tensor's last) keeps the same proportion, `ceil(k * len / full_len)`.
    ///
    /// The result never exceeds `max(1, len / 2)` for topk or `len` for randomk.
    pub fn chunk_k(&self, len: usize, full_len: usize) -> Result<Option<usize>, KernelError> {
        let (k, topk) = match &self.codec {
            CodecSpec::TopK { k } => (k, true),
            CodecSpec::RandomK { k, .. } => (k, false),
            _ => return Ok(None),
        };
        let full_len = full_len.max(len);
        let limit = |l: usize| if topk { (l / 2).max(l.min(1)) } else { l };
        let kk = match *k {
            KSpec::Fraction(f) => {
                if len == 0 {
                    0
                } else {
                    ((f * len as f64).floor() as usize).max(1)
                }
            }
            KSpec::Count(c) => {
                let lim = limit(full_len) as u64;
                if c > lim {
                    let what = if topk {
                        format!(
                            "topk keeps at most half the chunk: k <= {lim} for chunks of {full_len} elements"
                        )
                    } else {
                        format!("randomk needs k <= {lim}, the chunk length")
                    };
                    return Err(KernelError::bad("k", &c.to_string(), what));
                }
                if len == full_len {
                    c as usize
                } else {
                    ((c as u128 * len as u128).div_ceil(full_len as u128)) as usize
                }
            }
        };
        Ok(Some(kk.min(limit(len))))
    }

    /// Checks the length-dependent settings for chunks of `len` elements (what the scheduler
    /// can call once per tensor with its full chunk length).
    pub fn check_len(&self, len: usize) -> Result<(), KernelError> {
        self.chunk_k(len, len).map(|_| ())
    }
}

impl fmt::Display for CompressorSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.to_params();
        let mut first = true;
        for (k, v) in &m {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}
