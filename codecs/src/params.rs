//! A tensor's parsed parameter map ([`CompressorSpec`]: the compressor's own settings and the
//! chain's), and the keys of the chain and those several compressors share ([`KEYS`]; each
//! compressor's own keys are in its registry entry). The registry parses maps
//! ([`crate::registry::parse_params`]); checks that need the chunk length (k against the
//! length) happen when the codec is built ([`crate::build_compressor`], or
//! [`CompressorSpec::check_len`]).

mod keys;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

pub use crate::chain::EfKind;
pub use crate::codecs::cast::Cast;
pub use crate::codecs::dithering::{DitheringSpec, EliasCode, Encoding, Normalize, Partition};
pub use crate::codecs::minmax::MinMaxSpec;
pub use crate::codecs::moniqua::{MoniquaSpec, Rounding, ThetaSchedule};
pub use crate::codecs::onebit::OneBitSpec;
pub use crate::codecs::onebit_col::OneBitColumnsSpec;
pub use crate::codecs::powersgd::{
    Layout as PowerSgdLayout, Matrices as PowerSgdMatrices, Part as PowerSgdPart,
    Piece as PowerSgdPiece, Plan as PowerSgdPlan, PowerSgd, PowerSgdSpec, PowerSgdState,
    Shape as PowerSgdShape,
};
pub use crate::codecs::randomk::RandomKSpec;
pub use crate::codecs::topk::TopKSpec;
pub use crate::reduce::IntraCodec;
pub use crate::spec::{CodecSpec, KSpec, KeyInfo};
pub use keys::KEYS;

use crate::codec::{CodecInfo, NodeIdentity};
use crate::error::KernelError;
use crate::spec::{BuildOptions, Purpose};

/// A validated, normalised parameter map: compare two workers' specs with `==`, print one with
/// `Display` (a canonical `key=value` list) or turn it back into a map with
/// [`CompressorSpec::to_params`].
#[derive(Debug, Clone)]
pub struct CompressorSpec {
    /// The compressor's own settings (its entry in [`crate::registry::COMPRESSORS`]).
    pub codec: Arc<dyn CodecSpec>,
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
    /// `gossip_direct`: the direct (naive) quantised averaging of Moniqua's equation 4,
    /// `x_i W_ii + Σ_{j≠i} W_ij Q(x_j)`: as `gossip`, but each worker keeps its own exact
    /// model in place of its own message's decoding (`x_i + Σ_j W_ij (x̂_j − x_i)`). The
    /// scheme Theorem 1 shows stalling at a floor of `φ²δ²/(8(1+φ²))`; a baseline.
    GossipDirect,
}

impl Exchange {
    /// Whether a round averages models with the graph neighbours (either gossip form).
    pub fn is_gossip(self) -> bool {
        self != Exchange::PushPull
    }

    /// The `exchange` value that names it.
    pub fn name(self) -> &'static str {
        match self {
            Exchange::PushPull => "push_pull",
            Exchange::Gossip => "gossip",
            Exchange::GossipDirect => "gossip_direct",
        }
    }
}

impl PartialEq for CompressorSpec {
    fn eq(&self, other: &CompressorSpec) -> bool {
        self.codec.same(other.codec.as_any())
            && self.ef == other.ef
            && self.momentum_mu == other.momentum_mu
            && self.seed == other.seed
            && self.intra == other.intra
            && self.exchange == other.exchange
    }
}

impl Default for CompressorSpec {
    fn default() -> Self {
        CompressorSpec {
            codec: Arc::new(Cast::None),
            ef: None,
            momentum_mu: None,
            seed: None,
            intra: IntraCodec::None,
            exchange: Exchange::PushPull,
        }
    }
}

impl CompressorSpec {
    /// Whether a round of the tensor is a plain float32 sum through the servers: no codec, no
    /// error feedback, no momentum, no intra-host rounding, not gossiped. Such a tensor holds no
    /// state and each element is summed on its own, so several of them may travel as one
    /// tensor, bit for bit the same (`pushpull.torch`'s `DistributedOptimizer` packs a
    /// bucket's small ones together).
    pub fn is_plain(&self) -> bool {
        self.codec.kind().name == "none"
            && self.ef.is_none()
            && self.momentum_mu.is_none()
            && self.intra == IntraCodec::None
            && self.exchange == Exchange::PushPull
    }

    /// The elements of the unit a tensor of `tensor_len` elements is cut in, when it is not
    /// single elements: one column of a column-wise onebit tensor (`columns` columns,
    /// column-major: a column is `tensor_len / columns` contiguous elements;
    /// `pushpull_proto::placement::chunk_ranges_in`). `None` for other compressors, or when
    /// `columns` does not divide `tensor_len`.
    pub fn column_len(&self, tensor_len: u64) -> Option<u64> {
        self.codec.unit(tensor_len)
    }

    /// The canonical map (short keys, defaults filled in): two maps that parse to equal specs
    /// give equal canonical maps.
    pub fn to_params(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert("compressor".into(), self.codec.kind().name.into());
        self.codec.params(&mut |k, v| {
            m.insert(k.into(), v);
        });
        if let Some(ef) = self.ef {
            m.insert("ef".into(), ef.name().into());
        }
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
        if self.exchange.is_gossip() {
            m.insert("exchange".into(), self.exchange.name().into());
        }
        m
    }

    /// Whether the chain draws random numbers (rounding or indices).
    pub fn is_stochastic(&self) -> bool {
        self.codec.kind().stochastic
    }

    /// Checks the length-dependent settings for full-size chunks of `len` elements (what the
    /// scheduler can check once per tensor): builds the codec, whose refusal names the key.
    pub fn check_len(&self, len: usize) -> Result<(), KernelError> {
        let who = NodeIdentity::worker(0, 0, 0);
        let base = CodecInfo::new(self.codec.display_name(), len, &who, self.seed);
        let opts = BuildOptions {
            purpose: Purpose::ModelAveraging,
            ..BuildOptions::default()
        };
        self.codec.build(base, &opts).map(|_| ())
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
