//! What a compressor brings to the registry ([`crate::registry::COMPRESSORS`]): an [`Entry`]
//! (its name, the keys it reads, the parse of those keys), the parsed settings it builds its
//! codec from ([`CodecSpec`]), and the tensor's map with every spelling resolved ([`Keys`]),
//! which each parse reads through typed getters that name the key, the value and what is
//! allowed when they refuse.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use pushpull_proto::placement::{Kept, KeptCount, PayloadModel};

use crate::chain::Body;
use crate::codec::CodecInfo;
use crate::error::{KernelError, Result};

/// One compressor of the registry's table: the `compressor` value that names it, the keys it
/// reads, and its parse. Written beside its codec; the table lists it once.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// The `compressor` value, e.g. `topk`.
    pub name: &'static str,
    /// The short names of the shared keys it reads (of [`crate::params::KEYS`], such as `k`,
    /// `bits`, `bucket`).
    pub keys: &'static [&'static str],
    /// The keys that only it reads, with their spellings and documentation. A key of a map
    /// that is neither these, nor `keys`, nor the chain's (`compressor`, `ef`, `momentum`,
    /// `mu`, `seed`, `intra_compressor`, `exchange`) is refused as not applying to it.
    pub own_keys: &'static [KeyInfo],
    /// Parses its keys (every spelling resolved) into its settings.
    pub parse: fn(&Keys<'_>) -> Result<Arc<dyn CodecSpec>>,
}

impl Entry {
    /// Whether it reads the key whose short name is `short` (its own or a shared one).
    pub fn reads(&self, short: &str) -> bool {
        self.keys.contains(&short) || self.own_keys.iter().any(|k| k.name == short)
    }

    /// A compressor that reads no keys of its own.
    pub const fn keyless(
        name: &'static str,
        parse: fn(&Keys<'_>) -> Result<Arc<dyn CodecSpec>>,
    ) -> Entry {
        Entry {
            name,
            keys: &[],
            own_keys: &[],
            parse,
        }
    }
}

/// One parameter key: its short name, the other spellings accepted, and what it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyInfo {
    /// The short name (the RFC's table, or this project's).
    pub name: &'static str,
    /// Other accepted spellings (the BytePS keys).
    pub aliases: &'static [&'static str],
    /// Which compressors (or the chain) use it.
    pub applies_to: &'static str,
    /// The values it accepts.
    pub values: &'static str,
    /// The default when absent.
    pub default: &'static str,
}

/// A compressor's parsed settings, without error feedback or momentum: what its codec is built
/// from ([`CodecSpec::build`]), compared, printed and turned back into a map. Implemented
/// beside each codec; compared with [`SpecEq::same`] (same type, equal settings) and read as
/// its own type with [`downcast`](trait.CodecSpec.html#method.downcast) (the GPU's kernels do).
pub trait CodecSpec: SpecEq + fmt::Debug + Send + Sync {
    /// What kind of compressor it is: its name and the facts every caller may ask.
    fn kind(&self) -> Kind;
    /// The name a built codec reports, e.g. `topk(k=3)`.
    fn display_name(&self) -> String;
    /// Its settings as short keys, defaults filled in (the canonical map, `compressor` aside).
    fn params(&self, put: &mut dyn FnMut(&'static str, String));
    /// Builds the codec of a chunk of `base.len()` elements, as a [`Body`] of its fast paths;
    /// refuses, naming why, settings the chunk cannot take (a count `k` above the chunk) or a
    /// purpose it cannot serve.
    fn build(&self, base: CodecInfo, opts: &BuildOptions) -> Result<Body>;
    /// What a push of one of its chunks carries, as a function of the chunk's length, for a
    /// tensor of `tensor_len` elements: what the placement cuts and weighs chunks by
    /// (`pushpull_proto::placement::TensorCut`). Equals the built codec's
    /// [`CodecInfo::max_payload`] for every chunk the placement cuts.
    fn payload(&self, tensor_len: u64) -> PayloadModel;
    /// The elements of the unit a tensor of `tensor_len` elements is cut in (column-wise
    /// onebit: one column), when it is not single elements.
    fn unit(&self, _tensor_len: u64) -> Option<u64> {
        None
    }
}

/// What kind of compressor a [`CodecSpec`] is, as data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// The `compressor` value that names it.
    pub name: &'static str,
    /// Whether its codec draws random numbers (rounding or indices).
    pub stochastic: bool,
    /// Whether every payload of a chunk has the same size (what gossip relays).
    pub fixed_size: bool,
}

impl Kind {
    /// A kind by its facts: its name, whether it draws random numbers, whether its payload
    /// has a fixed size.
    pub const fn new(name: &'static str, stochastic: bool, fixed_size: bool) -> Kind {
        Kind {
            name,
            stochastic,
            fixed_size,
        }
    }
}

impl dyn CodecSpec {
    /// The settings as their own type, if they are of type `T`.
    pub fn downcast<T: CodecSpec + 'static>(&self) -> Option<&T> {
        self.as_any().downcast_ref()
    }
}

/// Comparison and downcasting of [`CodecSpec`]s, for every type with `==` (derive `PartialEq`).
pub trait SpecEq: Any {
    /// Whether `other` is of this type, with equal settings.
    fn same(&self, other: &dyn Any) -> bool;
    /// As [`Any`].
    fn as_any(&self) -> &dyn Any;
}

impl<T: PartialEq + Any> SpecEq for T {
    fn same(&self, other: &dyn Any) -> bool {
        other.downcast_ref::<T>() == Some(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// What the values being compressed are; some compressors only make sense for one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Purpose {
    /// Gradients in push_pull (the default). Moniqua is refused: it needs a reference within
    /// θ of the values, which gradients do not have.
    #[default]
    Gradient,
    /// Model parameters in decentralised averaging (`exchange = "gossip"`, Moniqua's setting:
    /// the reference is the receiver's own parameters).
    ModelAveraging,
}

/// Options of building a chunk's codec beyond its length and identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BuildOptions {
    /// What is compressed.
    pub purpose: Purpose,
    /// Length of the tensor's full-size chunks when this chunk may be shorter (the tensor's
    /// last chunk); `None` means this chunk is full-size. Top-k's and random-k's count `k` is
    /// validated against it and scaled down for a shorter chunk ([`KSpec::chunk_k`]).
    pub full_chunk_len: Option<usize>,
    /// The whole tensor's length, when the chunk is one of several: column-wise onebit reads
    /// its chunk's share of the tensor's columns from it. `None`: the chunk is the tensor.
    pub tensor_len: Option<u64>,
}

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

impl KSpec {
    /// The k a chunk of `len` elements uses, with `full_len` the length of the tensor's
    /// full-size chunks (`full_len >= len`; pass `len` when the tensor is a single chunk or the
    /// chunk is full-size); `topk` caps it at half the chunk, random-k at the chunk.
    ///
    /// * A fraction `f` gives `max(1, floor(f * len))` (0 when `len == 0`).
    /// * A count `k` is checked against `full_len` (topk: `k <= max(1, full_len / 2)`,
    ///   randomk: `k <= full_len`) and applies to every full-size chunk; a shorter chunk (the
    ///   tensor's last) keeps the same proportion, `ceil(k * len / full_len)`.
    ///
    /// The result never exceeds `max(1, len / 2)` for topk or `len` for randomk.
    pub fn chunk_k(self, topk: bool, len: usize, full_len: usize) -> Result<usize> {
        let kept = self.kept(topk, 0);
        let full_len = full_len.max(len) as u64;
        if let KSpec::Count(c) = self {
            let lim = kept.limit(full_len);
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
        }
        Ok(kept.of(len as u64, full_len) as usize)
    }

    /// As the placement's model of kept elements, `bytes` each (`topk`: at most half the
    /// chunk).
    pub fn kept(self, topk: bool, bytes: u64) -> Kept {
        Kept {
            bytes,
            count: match self {
                KSpec::Fraction(f) => KeptCount::Fraction(f),
                KSpec::Count(c) => KeptCount::Count(c),
            },
            at_most_half: topk,
        }
    }
}

/// The values of a setting, each with its spellings (the first is its name): what a parse
/// accepts ([`Keys::choice`]) and what the canonical map prints ([`name_of`]).
pub type Spellings<T> = &'static [(&'static [&'static str], T)];

/// The name of `value` in `table` (its first spelling).
pub fn name_of<T: PartialEq>(table: Spellings<T>, value: T) -> &'static str {
    table
        .iter()
        .find(|(_, v)| *v == value)
        .map_or("", |(names, _)| names[0])
}

/// A tensor's map with every spelling resolved to its short key: what a compressor's parse
/// reads. Each getter's error names the key as spelled, the value and what is allowed.
#[derive(Debug)]
pub struct Keys<'a> {
    /// Short key → (spelled key, value).
    pub(crate) map: BTreeMap<&'static str, (&'a str, &'a str)>,
    /// The compressor's name (what `compressor` says, or `none`).
    pub(crate) compressor: &'a str,
}

impl<'a> Keys<'a> {
    /// `(spelled key, value)` of `short`, if the map has it.
    pub fn get(&self, short: &str) -> Option<(&'a str, &'a str)> {
        self.map.get(short).copied()
    }

    /// `short`'s value, which must be there: `allowed` says what it takes.
    pub fn require(&self, short: &str, allowed: &str) -> Result<(&'a str, &'a str)> {
        self.get(short).ok_or_else(|| KernelError::Missing {
            key: short.to_string(),
            needed_by: self.compressor.to_string(),
            allowed: allowed.to_string(),
        })
    }

    /// `true` or `false`; `default` when absent.
    pub fn flag(&self, short: &str, default: bool) -> Result<bool> {
        match self.get(short) {
            None => Ok(default),
            Some((_, "true")) => Ok(true),
            Some((_, "false")) => Ok(false),
            Some((k, v)) => Err(KernelError::bad(k, v, "expected true or false")),
        }
    }

    /// A whole number in `lo..=hi` (`what` names it), if present.
    pub fn whole(&self, short: &str, lo: u64, hi: u64, what: &str) -> Result<Option<u64>> {
        let Some((k, v)) = self.get(short) else {
            return Ok(None);
        };
        match v.parse::<u64>() {
            Ok(n) if (lo..=hi).contains(&n) => Ok(Some(n)),
            _ => Err(KernelError::bad(
                k,
                v,
                format!("expected {what}, a whole number in {lo}..={hi}"),
            )),
        }
    }

    /// One of `choices` ([`Spellings`]); `default` when absent; `allowed` says what is.
    pub fn choice<T: Copy>(
        &self,
        short: &str,
        choices: Spellings<T>,
        default: T,
        allowed: &str,
    ) -> Result<T> {
        let Some((k, v)) = self.get(short) else {
            return Ok(default);
        };
        choices
            .iter()
            .find(|(names, _)| names.contains(&v))
            .map(|&(_, t)| t)
            .ok_or_else(|| KernelError::bad(k, v, allowed))
    }

    /// `bucket`: elements per bucket, if given (absent: the whole chunk).
    pub fn bucket(&self) -> Result<Option<usize>> {
        let b = self.whole("bucket", 1, u32::MAX as u64, "a bucket length in elements")?;
        Ok(b.map(|b| b as usize))
    }

    /// `bits`: bits per element, 1..=8, 8 when absent.
    pub fn bits(&self) -> Result<u32> {
        Ok(self.whole("bits", 1, 8, "bits per element")?.unwrap_or(8) as u32)
    }

    /// `k` of topk (`topk`) or randomk: a fraction of the chunk or a count.
    pub fn k(&self, topk: bool) -> Result<KSpec> {
        let (key, v) = self.require(
            "k",
            "byteps_compressor_k / k: a fraction < 1 or a count >= 1",
        )?;
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
}
