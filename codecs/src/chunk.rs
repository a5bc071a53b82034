//! The codec plug-in: where compression enters the data path, and the one function
//! ([`chunk_codec`]) that workers, servers and the single-process reference all use to build
//! the chain of a chunk, so that they cannot disagree.
//!
//! When the scheduler places a tensor, a worker (for every chunk) and a server (for the chunks
//! it holds) ask their [`CodecFactory`] for one [`Compressor`] per chunk, told in a
//! [`CodecContext`] which tensor, which chunk and which node ([`Node`]: a worker's rank or a
//! server's id). The codec is kept for every round of that chunk, so it may keep state (error
//! feedback, momentum). The default, [`KernelsFactory`], builds the chain of the tensor's
//! agreed parameter map; [`Fp32Factory`] ignores the map and carries raw fp32. A factory's
//! `Err` names what is wrong: on a worker it fails the declare, on a server it goes back to the
//! scheduler and fails every worker's declare of that tensor.
//!
//! # What a chunk gets
//! * The tensor's parameter map is parsed once ([`parse_params`]); a bad map is an error naming
//!   the key, whatever the tensor's size.
//! * A tensor smaller than `min_compress_bytes` (4 bytes per element) travels as raw fp32
//!   (`none`, no error feedback); on a worker its momentum decorator still applies, so biases
//!   keep their momentum when the training loop's own momentum is 0 (as BytePS requires).
//! * Workers build the chain with [`Role::Worker`] and their rank; servers with
//!   [`Role::Server`] and rank 0 ([`SERVER_RANK`]), whichever server holds the key: the
//!   rounding streams differ per key anyway, and the result then does not depend on the
//!   placement (the same job on 1 or 4 servers gives the same bits).
//! * A tensor's chunks differ in length by at most one; the first (longest) is the full-size
//!   chunk that a top-k/random-k count `k` refers to ([`BuildOptions::full_chunk_len`]).
//! * The learning rate of a round (what the training loop set with the worker's
//!   `set_learning_rate`; on servers, what the round's pushes carried) reaches the codec in
//!   [`crate::RoundCtx::lr`]; only corrected error feedback needs it.

use std::collections::BTreeMap;

use pushpull_proto::config::CutRules;
use pushpull_proto::placement::{PayloadModel, TensorCut};
use pushpull_proto::protocol::{ChunkPlacement, TensorPlacement};
use pushpull_proto::Config;

use std::sync::Arc;

use crate::chain::Compressor;
use crate::codec::{CodecInfo, NodeIdentity};
use crate::codecs::cast::{Cast, CastCodec};
use crate::params::{CompressorSpec, PowerSgd, PowerSgdLayout, PowerSgdPlan, PowerSgdSpec};
use crate::registry::{build_from_spec, parse_params};
use crate::rng::Role;
use crate::spec::{BuildOptions, Purpose};

/// The rank every server uses in its random draws (see the module docs).
pub const SERVER_RANK: u32 = 0;

/// The node that builds a codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    /// The worker of this rank.
    Worker {
        /// Its rank.
        rank: u32,
    },
    /// The server of this id.
    Server {
        /// Its id.
        id: u32,
    },
}

impl Node {
    /// Worker or server.
    pub fn role(self) -> Role {
        match self {
            Node::Worker { .. } => Role::Worker,
            Node::Server { .. } => Role::Server,
        }
    }

    /// The rank of its random draws: a worker's rank, [`SERVER_RANK`] on every server.
    pub fn draw_rank(self) -> u32 {
        match self {
            Node::Worker { rank } => rank,
            Node::Server { .. } => SERVER_RANK,
        }
    }
}

/// What a [`CodecFactory`] is told about the chunk it builds a codec for.
#[derive(Debug, Clone, Copy)]
pub struct CodecContext<'a> {
    /// The whole tensor's placement: name, element count, agreed parameter map (config
    /// defaults < per-tensor table < declare map), priority, all chunks.
    pub tensor: &'a TensorPlacement,
    /// The chunk: key, offset, element count, server (`tensor.chunks[chunk_index]`).
    pub chunk: &'a ChunkPlacement,
    /// The chunk's index in `tensor.chunks`.
    pub chunk_index: u32,
    /// The job seed (the same on every node).
    pub job_seed: u64,
    /// Who builds it.
    pub node: Node,
    /// The cluster file the node runs with (e.g. `cluster.min_compress_bytes`).
    pub config: &'a Config,
}

impl<'a> CodecContext<'a> {
    /// The context of chunk `index` of `tensor` (`None` if there is no such chunk).
    pub fn new(
        tensor: &'a TensorPlacement,
        index: usize,
        job_seed: u64,
        node: Node,
        config: &'a Config,
    ) -> Option<CodecContext<'a>> {
        Some(CodecContext {
            tensor,
            chunk: tensor.chunks.get(index)?,
            chunk_index: u32::try_from(index).ok()?,
            job_seed,
            node,
            config,
        })
    }
}

/// Builds the codec of each chunk a node handles (see the module docs). Must return a codec
/// whose `len()` is `ctx.chunk.len`; an `Err` names what is wrong.
///
/// Any `Fn(&CodecContext) -> Result<Compressor, String> + Send + Sync` is a factory.
pub trait CodecFactory: Send + Sync {
    /// A fresh codec (with fresh state) for `ctx.chunk`.
    fn make(&self, ctx: &CodecContext<'_>) -> Result<Compressor, String>;
}

impl<F> CodecFactory for F
where
    F: Fn(&CodecContext<'_>) -> Result<Compressor, String> + Send + Sync,
{
    fn make(&self, ctx: &CodecContext<'_>) -> Result<Compressor, String> {
        self(ctx)
    }
}

/// The default factory: each chunk's compressor chain from the tensor's agreed parameter map
/// ([`chunk_codec`]: on workers momentum and error feedback if configured, on servers error
/// feedback only; a tensor below `cluster.min_compress_bytes` travels as raw fp32).
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelsFactory;

impl CodecFactory for KernelsFactory {
    fn make(&self, ctx: &CodecContext<'_>) -> Result<Compressor, String> {
        chunk_codec(&ChunkInfo::of_context(ctx))
    }
}

/// Raw little-endian fp32 ([`fp32_codec`]) for every chunk, whatever the parameters say.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fp32Factory;

impl CodecFactory for Fp32Factory {
    fn make(&self, ctx: &CodecContext<'_>) -> Result<Compressor, String> {
        let len = usize::try_from(ctx.chunk.len)
            .map_err(|_| format!("chunk of {} elements is too large", ctx.chunk.len))?;
        Ok(fp32_codec(len))
    }
}

/// Raw little-endian fp32 for a chunk of `len` elements (the `none` compressor, no state):
/// what broadcasts carry whatever a tensor's map says.
pub fn fp32_codec(len: usize) -> Compressor {
    let who = NodeIdentity::worker(0, 0, 0);
    Compressor::new(Box::new(CastCodec::new(
        CodecInfo::new("none".into(), len, &who, None),
        Cast::None,
    )))
}

/// What [`chunk_codec`] needs to know about the chunk and the node.
#[derive(Debug, Clone, Copy)]
pub struct ChunkInfo<'a> {
    /// The tensor's agreed parameter map.
    pub params: &'a BTreeMap<String, String>,
    /// The tensor's element count.
    pub tensor_len: u64,
    /// This chunk's element count.
    pub chunk_len: u64,
    /// The tensor's longest chunk (its first).
    pub full_chunk_len: u64,
    /// The chunk's key.
    pub key: u64,
    /// The job seed.
    pub job_seed: u64,
    /// Who builds it.
    pub node: Node,
    /// Tensors below this many bytes (4 per element) are not compressed.
    pub min_compress_bytes: u64,
}

/// Whether a tensor of `tensor_len` elements is under `min_compress_bytes` (4 bytes per
/// element), so that it travels uncompressed ([`effective_spec`]).
pub fn is_small(tensor_len: u64, min_compress_bytes: u64) -> bool {
    tensor_len.saturating_mul(4) < min_compress_bytes
}

/// The spec a chunk is really built with: the parsed map, or for a tensor below
/// `min_compress_bytes` raw fp32 keeping only the momentum.
pub fn effective_spec(
    params: &BTreeMap<String, String>,
    tensor_len: u64,
    min_compress_bytes: u64,
) -> Result<CompressorSpec, String> {
    let spec = parse_params(params).map_err(|e| e.to_string())?;
    if is_small(tensor_len, min_compress_bytes) {
        return Ok(CompressorSpec {
            codec: Arc::new(Cast::None),
            ef: None,
            ..spec
        });
    }
    Ok(spec)
}

/// A tensor PowerSGD compresses (`compressor = powersgd`, [`crate::PowerSgdPlan::LowRank`]):
/// its settings, its matrices, and the map's `seed` if any.
#[derive(Debug, Clone, PartialEq)]
pub struct LowRankPlan {
    /// The settings.
    pub spec: PowerSgdSpec,
    /// The matrices and the ranks.
    pub layout: PowerSgdLayout,
    /// The map's seed, replacing the job's.
    pub seed: Option<u64>,
}

impl LowRankPlan {
    /// The tensors the P and Q of tensor `name` are summed as: their names and lengths. Their
    /// map is [`LowRankPlan::sum_map`], whatever the cluster file's defaults.
    pub fn sum_tensors(&self, name: &str) -> [(String, u64); 2] {
        [
            (format!("{name}#powersgd.p"), self.layout.p_len() as u64),
            (format!("{name}#powersgd.q"), self.layout.q_len() as u64),
        ]
    }

    /// The map of the P and Q tensors: plain float32 sums, which is all the servers do.
    pub fn sum_map() -> BTreeMap<String, String> {
        BTreeMap::from([("compressor".to_string(), "none".to_string())])
    }

    /// A worker's state of the tensor, in a job seeded `job_seed`; `key` is the tensor's first
    /// chunk's (what its random starting matrices are drawn with).
    pub fn start(&self, job_seed: u64, key: u64) -> PowerSgd {
        PowerSgd::new(
            self.spec.clone(),
            self.layout.clone(),
            self.seed.unwrap_or(job_seed),
            key,
        )
    }
}

/// Whether a tensor of `tensor_len` elements with map `params` is compressed by PowerSGD, and
/// how ([`effective_spec`] first: a tensor under `min_compress_bytes` is not); `Ok(None)` for
/// other compressors, for tensors PowerSGD sums uncompressed, and for a map the codecs refuse
/// (its declare names the problem). Refused, naming the key, where `rows` does not divide the
/// length, `pieces` do not add up to it, or `rank` exceeds the matrix's.
pub fn low_rank_plan(
    params: &BTreeMap<String, String>,
    tensor_len: u64,
    min_compress_bytes: u64,
) -> Result<Option<LowRankPlan>, String> {
    let Ok(spec) = effective_spec(params, tensor_len, min_compress_bytes) else {
        return Ok(None);
    };
    let Some(low) = spec.codec.downcast::<PowerSgdSpec>() else {
        return Ok(None);
    };
    match low.plan(tensor_len).map_err(|e| e.to_string())? {
        PowerSgdPlan::Plain => Ok(None),
        PowerSgdPlan::LowRank(layout) => Ok(Some(LowRankPlan {
            spec: (*low).clone(),
            layout,
            seed: spec.seed,
        })),
    }
}

impl<'a> ChunkInfo<'a> {
    /// What [`chunk_codec`] needs from a factory's context.
    pub fn of_context(ctx: &CodecContext<'a>) -> ChunkInfo<'a> {
        ChunkInfo {
            params: &ctx.tensor.params,
            tensor_len: ctx.tensor.len,
            chunk_len: ctx.chunk.len,
            full_chunk_len: ctx.tensor.chunks.first().map_or(0, |c| c.len),
            key: ctx.chunk.key,
            job_seed: ctx.job_seed,
            node: ctx.node,
            min_compress_bytes: ctx.config.cluster.min_compress_bytes,
        }
    }
}

/// Builds the codec of one chunk (see the module docs for the rules).
pub fn chunk_codec(info: &ChunkInfo<'_>) -> Result<Compressor, String> {
    let (spec, len, who, opts) = chunk_spec(info)?;
    build_from_spec(&spec, len, &who, opts).map_err(|e| e.to_string())
}

/// What [`chunk_codec`] builds from: the effective spec, the chunk's length, who builds it
/// and the build options.
fn chunk_spec(
    info: &ChunkInfo<'_>,
) -> Result<(CompressorSpec, usize, NodeIdentity, BuildOptions), String> {
    let spec = effective_spec(info.params, info.tensor_len, info.min_compress_bytes)?;
    let len = usize::try_from(info.chunk_len)
        .map_err(|_| format!("chunk of {} elements is too large", info.chunk_len))?;
    let full = usize::try_from(info.full_chunk_len.max(info.chunk_len))
        .map_err(|_| format!("chunk of {} elements is too large", info.full_chunk_len))?;
    let gossip = spec.exchange.is_gossip();
    let who = NodeIdentity {
        job_seed: info.job_seed,
        key: info.key,
        role: info.node.role(),
        // Gossip's rounding draws are shared: every worker draws as rank 0.
        rank: if gossip { 0 } else { info.node.draw_rank() },
    };
    let opts = BuildOptions {
        purpose: if gossip {
            Purpose::ModelAveraging
        } else {
            Purpose::Gradient
        },
        full_chunk_len: (full != len).then_some(full),
        tensor_len: Some(info.tensor_len),
    };
    Ok((spec, len, who, opts))
}

/// The cut of a tensor of `len` elements with map `params` under the cluster's `rules`: its
/// codec's payload model ([`crate::spec::CodecSpec::payload`]; fp32 for a tensor below
/// `min_compress_bytes`, or a map the codecs refuse, which the servers' factories refuse later
/// with a named error) and unit (a column of a column-wise onebit tensor, so that each column's
/// levels are the same however the tensor is chunked; else 1), with the chunk size
/// [`TensorCut::new`] gives them. The scheduler places with it and the single-process
/// reference cuts with it.
pub fn tensor_cut(params: &BTreeMap<String, String>, len: u64, rules: &CutRules) -> TensorCut {
    let spec = effective_spec(params, len, rules.min_compress_bytes).ok();
    let unit = spec.as_ref().and_then(|s| s.column_len(len)).unwrap_or(1);
    let payload = spec.map_or(PayloadModel::FP32, |s| s.codec.payload(len));
    TensorCut::new(len, rules, unit, payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::RoundCtx;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn info<'a>(params: &'a BTreeMap<String, String>, tensor_len: u64) -> ChunkInfo<'a> {
        ChunkInfo {
            params,
            tensor_len,
            chunk_len: tensor_len,
            full_chunk_len: tensor_len,
            key: 7,
            job_seed: 42,
            node: Node::Worker { rank: 1 },
            min_compress_bytes: 65536,
        }
    }

    #[test]
    fn min_compress_bytes_boundary_keeps_momentum() {
        let p = map(&[
            ("compressor", "onebit"),
            ("ef", "vanilla"),
            ("momentum", "nesterov"),
        ]);
        // 16384 elements = 65536 bytes: compressed; one fewer: raw fp32 with momentum.
        let at = chunk_codec(&info(&p, 16384)).unwrap();
        assert_eq!(at.max_compressed_len(), 4 + 4 * 16384 / 32);
        assert!(at.name().contains("onebit"), "{}", at.name());
        let below = chunk_codec(&info(&p, 16383)).unwrap();
        assert_eq!(below.max_compressed_len(), 4 * 16383);
        assert!(below.name().starts_with("nesterov"), "{}", below.name());
        assert!(!below.name().contains("ef("), "{}", below.name());
        // A server builds no momentum.
        let mut s = info(&p, 16383);
        s.node = Node::Server { id: 3 };
        assert!(!chunk_codec(&s).unwrap().name().contains("nesterov"));
    }

    fn rules(partition_bytes: u64, max_chunk_payload_bytes: u64) -> CutRules {
        CutRules {
            partition_bytes,
            max_chunk_payload_bytes,
            min_compress_bytes: 65_536,
        }
    }

    #[test]
    fn the_cut_shrinks_what_travels_wide() {
        let cut = |kv: &[(&str, &str)], len: u64| {
            tensor_cut(&map(kv), len, &rules(131_072, 32_768)).chunk_bytes
        };
        let n = 1 << 20;
        assert_eq!(cut(&[("compressor", "none")], n), 32_768);
        assert_eq!(cut(&[("compressor", "fp16")], n), 65_536);
        assert_eq!(
            cut(&[("compressor", "onebit"), ("ef", "vanilla")], n),
            131_072
        );
        assert_eq!(cut(&[("compressor", "topk"), ("k", "0.01")], n), 131_072);
        // minmax at 8 bits: 32 KiB of codes plus a header per bucket is over 32 KiB.
        assert_eq!(
            cut(
                &[("compressor", "minmax"), ("bits", "8"), ("bucket", "512")],
                n
            ),
            65_536
        );
        // Below min_compress_bytes onebit travels as fp32 and is cut as fp32.
        assert_eq!(cut(&[("compressor", "onebit")], 16_000), 32_768);
        // A map the kernels refuse weighs as fp32.
        assert_eq!(cut(&[("compressor", "nonsense")], n), 32_768);
        // A bound at the partition cuts nothing.
        let off = tensor_cut(&map(&[]), n, &rules(131_072, 131_072)).chunk_bytes;
        assert_eq!(off, 131_072);
    }

    /// The payload model every compressor states is what its built chain writes at most, for
    /// full-size chunks and a tensor's shorter last one, and fp32 below `min_compress_bytes`.
    #[test]
    fn payload_models_are_the_built_chains_sizes() {
        let maps: &[&[(&str, &str)]] = &[
            &[("compressor", "none")],
            &[("compressor", "fp16")],
            &[("compressor", "bf16"), ("momentum", "nesterov")],
            &[("compressor", "onebit"), ("ef", "vanilla")],
            &[("compressor", "onebit"), ("scaling", "true")],
            &[("compressor", "topk"), ("k", "0.01")],
            &[("compressor", "topk"), ("k", "100")],
            &[("compressor", "randomk"), ("k", "0.1"), ("ef", "vanilla")],
            &[("compressor", "randomk"), ("k", "37")],
            &[("compressor", "dithering"), ("k", "7")],
            &[
                ("compressor", "dithering"),
                ("k", "5"),
                ("encoding", "elias"),
            ],
            &[
                ("compressor", "dithering"),
                ("k", "3"),
                ("partition", "natural"),
                ("bucket", "512"),
            ],
            &[
                ("compressor", "minmax"),
                ("bucket", "300"),
                ("ef", "corrected"),
            ],
            &[("compressor", "minmax"), ("bits", "3")],
            &[
                ("compressor", "moniqua"),
                ("theta", "1"),
                ("exchange", "gossip"),
            ],
            &[
                ("compressor", "moniqua"),
                ("theta", "1"),
                ("theta_schedule", "bound"),
                ("hash", "true"),
                ("exchange", "gossip"),
            ],
        ];
        let rules = rules(131_072, 32_768);
        for kv in maps {
            let params = map(kv);
            for tensor_len in [1_000u64, 16_384, 70_001, 250_001] {
                let cut = tensor_cut(&params, tensor_len, &rules);
                let ranges: Vec<(u64, u64)> = cut.ranges(tensor_len).collect();
                let full = ranges[0].1;
                for &(_, len) in [ranges[0], ranges[ranges.len() - 1]].iter() {
                    let chain = chunk_codec(&ChunkInfo {
                        chunk_len: len,
                        full_chunk_len: full,
                        ..info(&params, tensor_len)
                    })
                    .unwrap();
                    assert_eq!(
                        cut.payload.bytes(len, full),
                        chain.max_compressed_len() as u64,
                        "{kv:?}: a chunk of {len} of a tensor of {tensor_len}"
                    );
                }
            }
        }
        let onebit = map(&[("compressor", "onebit"), ("ef", "vanilla")]);
        let below = tensor_cut(&onebit, 1000, &rules).payload;
        assert_eq!(below.bytes(1000, 1000), 4000);
    }

    /// Column-wise onebit: `columns` counts the tensor's columns; a chunk of whole columns
    /// gets its own count, a chunk between columns is refused by name, and a trial cut between
    /// columns weighs whole ones.
    #[test]
    fn column_wise_chunks_hold_whole_columns() {
        let params = map(&[
            ("compressor", "onebit"),
            ("columns", "7"),
            ("ef", "none"),
            ("momentum", "nesterov"),
        ]);
        // 7 columns of 10,000; a chunk of 2 columns: 2 pairs of levels and 20,000 bits.
        let cut = tensor_cut(&params, 70_000, &rules(4 * 25_000, 2 * 8 + 20_000 / 8));
        assert_eq!(cut.unit, 10_000);
        assert_eq!(
            tensor_cut(&params, 70_001, &rules(4 * 25_000, 1 << 20)).unit,
            1
        );
        let chain = chunk_codec(&ChunkInfo {
            chunk_len: 20_000,
            full_chunk_len: 30_000,
            ..info(&params, 70_000)
        })
        .unwrap();
        assert_eq!(chain.max_compressed_len(), 2 * 8 + 20_000 / 8);
        assert_eq!(
            cut.payload.bytes(20_000, 30_000),
            chain.max_compressed_len() as u64
        );
        // A trial cut of 2.5 columns weighs the 2 whole ones its chunks would hold: that fits
        // the bound, so the partition is kept (3 columns' worth would not fit).
        assert_eq!(cut.chunk_bytes, 4 * 25_000);
        let e = chunk_codec(&ChunkInfo {
            chunk_len: 25_000,
            full_chunk_len: 30_000,
            ..info(&params, 70_000)
        })
        .err()
        .unwrap();
        assert!(e.contains("whole columns of 10000"), "{e}");
        let e = chunk_codec(&info(&params, 70_001)).err().unwrap();
        assert!(e.contains("not 7 whole columns"), "{e}");
    }

    #[test]
    fn bad_maps_are_refused_even_for_small_tensors() {
        let p = map(&[("compressor", "topq")]);
        let Err(e) = chunk_codec(&info(&p, 10)) else {
            panic!("a bad map was accepted")
        };
        assert!(e.contains("compressor") && e.contains("topq"), "{e}");
    }

    #[test]
    fn corrected_ef_uses_the_learning_rate_set() {
        let p = map(&[("compressor", "onebit"), ("ef", "corrected")]);
        let mut c = chunk_codec(&info(&p, 20000)).unwrap();
        let x: Vec<f32> = (0..20000)
            .map(|i| ((i * 7919) % 1000) as f32 - 500.0)
            .collect();
        let mut out = Vec::new();
        let e = c.compress(&x, &RoundCtx::new(0), &mut out).unwrap_err();
        assert!(e.to_string().contains("learning rate"), "{e}");
        c.compress(&x, &RoundCtx::new(0).with_lr(0.1), &mut out)
            .unwrap();
        assert_eq!(out.len(), c.max_compressed_len());
    }

    #[test]
    fn fp32_round_trip_and_add() {
        let x: Vec<f32> = (0..1001).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
        let mut c = fp32_codec(x.len());
        let mut bytes = Vec::new();
        c.compress(&x, &RoundCtx::new(0), &mut bytes).unwrap();
        assert_eq!(bytes.len(), c.max_compressed_len());
        // The format is plain little-endian f32, checked against the standard library.
        let le: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(bytes, le);
        let mut y = vec![0.0; x.len()];
        c.decompress(&bytes, &RoundCtx::new(0), &mut y).unwrap();
        assert_eq!(x, y);
        let mut acc = x.clone();
        c.decompress_add(&bytes, &RoundCtx::new(0), &mut acc)
            .unwrap();
        assert!(acc.iter().zip(&x).all(|(a, b)| *a == b + b));
        let e = c
            .decompress(&bytes[..7], &RoundCtx::new(0), &mut y)
            .unwrap_err()
            .to_string();
        assert!(e.contains('7'), "{e}");
    }
}
