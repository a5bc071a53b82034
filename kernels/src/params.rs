//! Parsing a tensor's string-to-string parameter map into a validated [`CompressorSpec`].
//!
//! Keys are matched exactly (case-sensitive), values too; see the table in the crate docs or
//! [`KEYS`]. Every problem is an error naming the key as spelled, the value and what is allowed:
//! an unknown key, a key that does not apply to the chosen compressor, two spellings of one key
//! with different values, an unknown name, a number that does not parse or is out of range,
//! a missing required value. Checks that need the chunk length (k against the length) happen
//! when the compressor is built ([`crate::build_compressor`]) or in
//! [`CompressorSpec::check_len`].

pub use crate::codecs::moniqua::Rounding;
use crate::error::KernelError;
use std::collections::BTreeMap;
use std::fmt;

/// One parameter key: its short name, the other spellings accepted, and what it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyInfo {
    /// The short name (the RFC's table, or this project's).
    pub name: &'static str,
    /// Other accepted spellings (the BytePS keys).
    pub aliases: &'static [&'static str],
    /// Which compressors or decorators use it.
    pub applies_to: &'static str,
    /// The values it accepts.
    pub values: &'static str,
    /// The default when absent.
    pub default: &'static str,
}

/// Every key the registry accepts.
pub const KEYS: &[KeyInfo] = &[
    KeyInfo {
        name: "compressor",
        aliases: &["byteps_compressor_type"],
        applies_to: "all",
        values: "none, fp16, bf16, onebit, topk, randomk, dithering, minmax, moniqua",
        default: "none",
    },
    KeyInfo {
        name: "k",
        aliases: &["byteps_compressor_k"],
        applies_to: "topk, randomk, dithering",
        values: "topk/randomk: a fraction of the chunk in (0, 1) (topk: <= 0.5) or a whole count \
                 >= 1 per chunk (topk: <= len/2, randomk: <= len); dithering: the number of levels \
                 s, a whole number, 1..=32767 (linear) or 1..=32 (natural)",
        default: "required",
    },
    KeyInfo {
        name: "scaling",
        aliases: &["byteps_compressor_onebit_scaling"],
        applies_to: "onebit",
        values: "true, false",
        default: "false",
    },
    KeyInfo {
        name: "columns",
        aliases: &[],
        applies_to: "onebit",
        values: "a whole number >= 1: the column count of the row-major 2-D shape; selects the \
                 column-wise variant (two levels per column)",
        default: "absent (one scale for the chunk)",
    },
    KeyInfo {
        name: "unbiased",
        aliases: &[],
        applies_to: "randomk",
        values: "true, false (true scales the k values by n/k on workers)",
        default: "false",
    },
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
        values: "packed, elias",
        default: "packed",
    },
    KeyInfo {
        name: "bucket",
        aliases: &[],
        applies_to: "dithering, minmax",
        values: "a whole number >= 1 of elements per bucket (QSGD uses 512)",
        default: "the whole chunk",
    },
    KeyInfo {
        name: "bits",
        aliases: &[],
        applies_to: "minmax, moniqua",
        values: "a whole number 1..=8 (moniqua with stochastic rounding: 2..=8)",
        default: "8",
    },
    KeyInfo {
        name: "theta",
        aliases: &[],
        applies_to: "moniqua",
        values: "a finite number > 0: the a-priori bound on |x - reference|",
        default: "required",
    },
    KeyInfo {
        name: "rounding",
        aliases: &[],
        applies_to: "moniqua",
        values: "stochastic (delta = 2^-bits), nearest (delta = 2^-(bits+1))",
        default: "stochastic",
    },
    KeyInfo {
        name: "ef",
        aliases: &["byteps_error_feedback_type", "byteps_ef_type"],
        applies_to: "all (decorator)",
        values:
            "none, vanilla, corrected (learning-rate corrected: needs RoundCtx::lr every round)",
        default: "none",
    },
    KeyInfo {
        name: "momentum",
        aliases: &["byteps_momentum_type"],
        applies_to: "all (decorator, workers only)",
        values: "none, nesterov",
        default: "none",
    },
    KeyInfo {
        name: "mu",
        aliases: &["byteps_momentum_mu"],
        applies_to: "momentum=nesterov",
        values: "a number in [0, 1)",
        default: "0.9",
    },
    KeyInfo {
        name: "seed",
        aliases: &["byteps_seed"],
        applies_to: "all",
        values: "an unsigned 64-bit integer; replaces the job seed for this tensor's random draws",
        default: "the job seed",
    },
];

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

/// The compressor proper (without decorators).
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
        /// Column count of the row-major 2-D view.
        columns: usize,
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
}

impl Default for CompressorSpec {
    fn default() -> Self {
        CompressorSpec {
            codec: CodecSpec::None,
            ef: None,
            momentum_mu: None,
            seed: None,
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
            CodecSpec::OneBitColumns { columns } => put("columns", columns.to_string()),
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
            } => {
                put("theta", theta.to_string());
                put("bits", bits.to_string());
                put("rounding", rounding_name(*rounding).to_string());
            }
        }
    }

    /// The name a built compressor reports (before decorators), e.g. `topk(k=3)`.
    pub fn display_name(&self) -> String {
        match self {
            CodecSpec::None => "none".into(),
            CodecSpec::Fp16 => "fp16".into(),
            CodecSpec::Bf16 => "bf16".into(),
            CodecSpec::OneBit { scaling } => format!("onebit(scaling={scaling})"),
            CodecSpec::OneBitColumns { columns } => format!("onebit(columns={columns})"),
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
            } => format!(
                "moniqua(theta={theta}, bits={bits}, {})",
                rounding_name(*rounding)
            ),
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
    /// The canonical map (short keys, defaults filled in): two maps that parse to equal specs
    /// give equal canonical maps.
    pub fn to_params(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        self.codec.params(&mut m);
        if let Some(ef) = self.ef {
            let v = match ef {
                EfKind::Vanilla => "vanilla",
                EfKind::Corrected => "corrected",
            };
            m.insert("ef".into(), v.into());
        }
        if let Some(mu) = self.momentum_mu {
            m.insert("momentum".into(), "nesterov".into());
            m.insert("mu".into(), mu.to_string());
        }
        if let Some(s) = self.seed {
            m.insert("seed".into(), s.to_string());
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

/// The map with every spelling resolved to the short key: short key → (spelled key, value).
struct Resolved<'a> {
    m: BTreeMap<&'static str, (&'a str, &'a str)>,
}

impl<'a> Resolved<'a> {
    fn get(&self, key: &str) -> Option<(&'a str, &'a str)> {
        self.m.get(key).copied()
    }
}

fn known_keys() -> String {
    let mut v = Vec::new();
    for k in KEYS {
        v.push(k.name);
        v.extend_from_slice(k.aliases);
    }
    v.join(", ")
}

fn parse_bool(key: &str, v: &str) -> Result<bool, KernelError> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(KernelError::bad(key, v, "expected true or false")),
    }
}

fn parse_whole(key: &str, v: &str, lo: u64, hi: u64, what: &str) -> Result<u64, KernelError> {
    let allowed = || format!("expected {what}, a whole number in {lo}..={hi}");
    let n: u64 = v.parse().map_err(|_| KernelError::bad(key, v, allowed()))?;
    if n < lo || n > hi {
        return Err(KernelError::bad(key, v, allowed()));
    }
    Ok(n)
}

fn parse_k(key: &str, v: &str, topk: bool) -> Result<KSpec, KernelError> {
    let allowed = "expected a positive number (a fraction < 1 or a count >= 1)";
    let x: f64 = v.parse().map_err(|_| KernelError::bad(key, v, allowed))?;
    if !x.is_finite() || x <= 0.0 {
        return Err(KernelError::bad(key, v, allowed));
    }
    if x < 1.0 {
        if topk && x > 0.5 {
            return Err(KernelError::bad(
                key,
                v,
                "a fraction for topk must be <= 0.5 (topk keeps at most half the chunk)",
            ));
        }
        return Ok(KSpec::Fraction(x));
    }
    if x.fract() != 0.0 || x > u32::MAX as f64 {
        return Err(KernelError::bad(
            key,
            v,
            "a count >= 1 must be a whole number (below 2^32); a fraction must be < 1",
        ));
    }
    Ok(KSpec::Count(x as u64))
}

/// Parses and validates a parameter map (see the crate docs for the table of keys).
pub fn parse_params(params: &BTreeMap<String, String>) -> Result<CompressorSpec, KernelError> {
    // 1. Resolve spellings.
    let mut r = Resolved { m: BTreeMap::new() };
    for (key, value) in params {
        let info = KEYS
            .iter()
            .find(|k| k.name == key.as_str() || k.aliases.contains(&key.as_str()))
            .ok_or_else(|| KernelError::UnknownKey {
                key: key.clone(),
                value: value.clone(),
                known: known_keys(),
            })?;
        if let Some(&(k0, v0)) = r.m.get(info.name) {
            if v0 != value.as_str() {
                return Err(KernelError::Conflict {
                    key: k0.to_string(),
                    value: v0.to_string(),
                    other_key: key.clone(),
                    other_value: value.clone(),
                });
            }
            continue;
        }
        r.m.insert(info.name, (key.as_str(), value.as_str()));
    }

    // 2. The compressor and which keys apply to it.
    let compressor = r.get("compressor").map(|(_, v)| v).unwrap_or("none");
    let applicable: &[&str] = match compressor {
        "none" | "fp16" | "bf16" => &[],
        "onebit" => &["scaling", "columns"],
        "topk" => &["k"],
        "randomk" => &["k", "unbiased"],
        "dithering" => &["k", "partition", "normalize", "encoding", "bucket"],
        "minmax" => &["bits", "bucket"],
        "moniqua" => &["theta", "bits", "rounding"],
        _ => {
            let (k, v) = r
                .get("compressor")
                .expect("a non-default name came from the map");
            return Err(KernelError::bad(
                k,
                v,
                "expected one of none, fp16, bf16, onebit, topk, randomk, dithering, minmax, moniqua",
            ));
        }
    };
    let general = ["compressor", "ef", "momentum", "mu", "seed"];
    for (&short, &(k, v)) in &r.m {
        if general.contains(&short) || applicable.contains(&short) {
            continue;
        }
        let info = KEYS.iter().find(|i| i.name == short).expect("resolved");
        return Err(KernelError::NotApplicable {
            key: k.to_string(),
            value: v.to_string(),
            why: format!(
                "compressor \"{compressor}\" does not use it (it applies to {})",
                info.applies_to
            ),
        });
    }

    // 3. Decorators and seed.
    let ef = match r.get("ef") {
        None => None,
        Some((_, "none")) => None,
        Some((_, "vanilla")) => Some(EfKind::Vanilla),
        Some((_, "corrected")) => Some(EfKind::Corrected),
        Some((k, v)) => {
            return Err(KernelError::bad(
                k,
                v,
                "expected none, vanilla or corrected",
            ))
        }
    };
    let momentum = match r.get("momentum") {
        None | Some((_, "none")) => false,
        Some((_, "nesterov")) => true,
        Some((k, v)) => return Err(KernelError::bad(k, v, "expected none or nesterov")),
    };
    let momentum_mu = match (momentum, r.get("mu")) {
        (false, None) => None,
        (false, Some((k, v))) => {
            return Err(KernelError::NotApplicable {
                key: k.to_string(),
                value: v.to_string(),
                why: "mu applies only with momentum=nesterov".into(),
            })
        }
        (true, None) => Some(0.9),
        (true, Some((k, v))) => {
            let allowed = "expected a number in [0, 1)";
            let mu: f32 = v.parse().map_err(|_| KernelError::bad(k, v, allowed))?;
            if !(0.0..1.0).contains(&mu) {
                return Err(KernelError::bad(k, v, allowed));
            }
            Some(mu)
        }
    };
    let seed = match r.get("seed") {
        None => None,
        Some((k, v)) => Some(
            v.parse::<u64>()
                .map_err(|_| KernelError::bad(k, v, "expected an unsigned 64-bit integer"))?,
        ),
    };

    // 4. The compressor's own settings.
    let bool_or = |short: &str, d: bool| -> Result<bool, KernelError> {
        match r.get(short) {
            None => Ok(d),
            Some((k, v)) => parse_bool(k, v),
        }
    };
    let bucket = || -> Result<Option<usize>, KernelError> {
        match r.get("bucket") {
            None => Ok(None),
            Some((k, v)) => {
                Ok(Some(
                    parse_whole(k, v, 1, u32::MAX as u64, "a bucket length in elements")? as usize,
                ))
            }
        }
    };
    let bits = |hi_note: &str| -> Result<u32, KernelError> {
        match r.get("bits") {
            None => Ok(8),
            Some((k, v)) => Ok(parse_whole(k, v, 1, 8, hi_note)? as u32),
        }
    };
    let require = |short: &str, allowed: &str| {
        r.get(short).ok_or_else(|| KernelError::Missing {
            key: short.to_string(),
            needed_by: compressor.to_string(),
            allowed: allowed.to_string(),
        })
    };
    let codec = match compressor {
        "none" => CodecSpec::None,
        "fp16" => CodecSpec::Fp16,
        "bf16" => CodecSpec::Bf16,
        "onebit" => match r.get("columns") {
            None => CodecSpec::OneBit {
                scaling: bool_or("scaling", false)?,
            },
            Some((k, v)) => {
                let columns = parse_whole(k, v, 1, u32::MAX as u64, "a column count")? as usize;
                if let Some((sk, sv)) = r.get("scaling") {
                    return Err(KernelError::NotApplicable {
                        key: sk.to_string(),
                        value: sv.to_string(),
                        why: format!(
                            "the column-wise onebit variant ({k}={v}) has its own per-column \
                             levels; remove \"{sk}\""
                        ),
                    });
                }
                CodecSpec::OneBitColumns { columns }
            }
        },
        "topk" => {
            let (k, v) = require(
                "k",
                "byteps_compressor_k / k: a fraction < 1 or a count >= 1",
            )?;
            CodecSpec::TopK {
                k: parse_k(k, v, true)?,
            }
        }
        "randomk" => {
            let (k, v) = require(
                "k",
                "byteps_compressor_k / k: a fraction < 1 or a count >= 1",
            )?;
            CodecSpec::RandomK {
                k: parse_k(k, v, false)?,
                unbiased: bool_or("unbiased", false)?,
            }
        }
        "dithering" => {
            let partition = match r.get("partition") {
                None => Partition::Linear,
                Some((_, "linear" | "0")) => Partition::Linear,
                Some((_, "natural" | "1")) => Partition::Natural,
                Some((k, v)) => {
                    return Err(KernelError::bad(
                        k,
                        v,
                        "expected linear (or 0) or natural (or 1)",
                    ))
                }
            };
            let normalize = match r.get("normalize") {
                None => Normalize::Max,
                Some((_, "max" | "0")) => Normalize::Max,
                Some((_, "l2" | "1")) => Normalize::L2,
                Some((k, v)) => {
                    return Err(KernelError::bad(k, v, "expected max (or 0) or l2 (or 1)"))
                }
            };
            let encoding = match r.get("encoding") {
                None | Some((_, "packed")) => Encoding::Packed,
                Some((_, "elias")) => Encoding::Elias,
                Some((k, v)) => return Err(KernelError::bad(k, v, "expected packed or elias")),
            };
            let (k, v) = require("k", "byteps_compressor_k / k: the number of levels s >= 1")?;
            let hi = match partition {
                Partition::Linear => 32767,
                Partition::Natural => 32,
            };
            let s = match v.parse::<u64>() {
                Ok(s) if (1..=hi).contains(&s) => s as u32,
                _ => {
                    return Err(KernelError::bad(
                        k,
                        v,
                        format!(
                            "expected the number of dithering levels s, a whole number in 1..={hi} \
                             for the {} partition",
                            partition_name(partition)
                        ),
                    ))
                }
            };
            CodecSpec::Dithering {
                s,
                partition,
                normalize,
                bucket: bucket()?,
                encoding,
            }
        }
        "minmax" => CodecSpec::MinMax {
            bits: bits("bits per element")?,
            bucket: bucket()?,
        },
        "moniqua" => {
            let (k, v) = require("theta", "theta: a finite number > 0")?;
            let theta: f64 = v
                .parse()
                .map_err(|_| KernelError::bad(k, v, "expected a finite number > 0"))?;
            if !(theta.is_finite() && theta > 0.0) {
                return Err(KernelError::bad(k, v, "expected a finite number > 0"));
            }
            let rounding = match r.get("rounding") {
                None | Some((_, "stochastic")) => Rounding::Stochastic,
                Some((_, "nearest")) => Rounding::Nearest,
                Some((k, v)) => {
                    return Err(KernelError::bad(k, v, "expected stochastic or nearest"))
                }
            };
            let b = bits("bits per element")?;
            let delta = crate::codecs::moniqua::delta(b, rounding);
            if delta >= 0.5 {
                return Err(KernelError::bad(
                    r.get("bits").map(|(k, _)| k).unwrap_or("bits"),
                    &b.to_string(),
                    format!(
                        "moniqua needs delta < 1/2, and {} rounding with {b} bit(s) gives delta = \
                         {delta}; use bits >= 2 or rounding=nearest",
                        rounding_name(rounding)
                    ),
                ));
            }
            let b_theta = crate::codecs::moniqua::b_theta(theta, b, rounding);
            if !b_theta.is_finite() {
                return Err(KernelError::bad(
                    k,
                    v,
                    "theta is too large: B_theta overflows",
                ));
            }
            CodecSpec::Moniqua {
                theta,
                bits: b,
                rounding,
            }
        }
        _ => unreachable!("checked above"),
    };
    Ok(CompressorSpec {
        codec,
        ef,
        momentum_mu,
        seed,
    })
}
