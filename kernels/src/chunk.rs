//! The bridge to the data path: a compressor chain as a [`ChunkCodec`], and the one function
//! ([`chunk_codec`]) that workers, servers and the single-process reference all use to build
//! the chain of a chunk, so that they cannot disagree.
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

use std::collections::BTreeMap;

use pushpull_common::codec::{ChunkCodec, CodecError};
use pushpull_common::protocol::TensorPlacement;

use crate::params::{parse_params, CodecSpec, CompressorSpec};
use crate::registry::{build_from_spec, BuildOptions, Purpose};
use crate::rng::Role;
use crate::{Compressor, NodeIdentity, RoundCtx};

/// The rank every server uses in its random draws (see the module docs).
pub const SERVER_RANK: u32 = 0;

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
    /// Worker or server.
    pub role: Role,
    /// The worker's rank (ignored for servers, which use [`SERVER_RANK`]).
    pub rank: u32,
    /// Tensors below this many bytes (4 per element) are not compressed.
    pub min_compress_bytes: u64,
}

/// The spec a chunk is really built with: the parsed map, or for a tensor below
/// `min_compress_bytes` raw fp32 keeping only the momentum.
pub fn effective_spec(
    params: &BTreeMap<String, String>,
    tensor_len: u64,
    min_compress_bytes: u64,
) -> Result<CompressorSpec, String> {
    let spec = parse_params(params).map_err(|e| e.to_string())?;
    if tensor_len.saturating_mul(4) < min_compress_bytes {
        return Ok(CompressorSpec {
            codec: CodecSpec::None,
            ef: None,
            ..spec
        });
    }
    Ok(spec)
}

impl<'a> ChunkInfo<'a> {
    /// Chunk `index` of a placed tensor, for a node of `role` (`rank`: a worker's rank).
    ///
    /// # Panics
    /// If `index` is not a chunk of `tensor`.
    pub fn of_placement(
        tensor: &'a TensorPlacement,
        index: usize,
        job_seed: u64,
        role: Role,
        rank: u32,
        min_compress_bytes: u64,
    ) -> ChunkInfo<'a> {
        let chunk = &tensor.chunks[index];
        ChunkInfo {
            params: &tensor.params,
            tensor_len: tensor.len,
            chunk_len: chunk.len,
            full_chunk_len: tensor.chunks.first().map_or(0, |c| c.len),
            key: chunk.key,
            job_seed,
            role,
            rank,
            min_compress_bytes,
        }
    }
}

/// Builds the codec of one chunk (see the module docs for the rules).
pub fn chunk_codec(info: &ChunkInfo<'_>) -> Result<CompressorCodec, String> {
    let spec = effective_spec(info.params, info.tensor_len, info.min_compress_bytes)?;
    let len = usize::try_from(info.chunk_len)
        .map_err(|_| format!("chunk of {} elements is too large", info.chunk_len))?;
    let full = usize::try_from(info.full_chunk_len.max(info.chunk_len))
        .map_err(|_| format!("chunk of {} elements is too large", info.full_chunk_len))?;
    let rank = match info.role {
        Role::Worker => info.rank,
        Role::Server => SERVER_RANK,
    };
    let who = NodeIdentity {
        job_seed: info.job_seed,
        key: info.key,
        role: info.role,
        rank,
    };
    let opts = BuildOptions {
        purpose: Purpose::Gradient,
        full_chunk_len: (full != len).then_some(full),
    };
    let inner = build_from_spec(&spec, len, &who, opts).map_err(|e| e.to_string())?;
    Ok(CompressorCodec::new(inner))
}

/// A [`Compressor`] chain as the data path's [`ChunkCodec`]: `encode` compresses one round
/// (with the learning rate last set), `decode`/`decode_add` decompress.
pub struct CompressorCodec {
    inner: Box<dyn Compressor>,
    lr: Option<f32>,
}

impl CompressorCodec {
    /// Wraps a chain.
    pub fn new(inner: Box<dyn Compressor>) -> CompressorCodec {
        CompressorCodec { inner, lr: None }
    }

    /// The chain.
    pub fn compressor(&self) -> &dyn Compressor {
        self.inner.as_ref()
    }
}

impl std::fmt::Debug for CompressorCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompressorCodec")
            .field("chain", &self.inner.name())
            .field("len", &self.inner.len())
            .field("lr", &self.lr)
            .finish()
    }
}

fn codec_error(e: crate::KernelError) -> CodecError {
    CodecError(e.to_string())
}

impl ChunkCodec for CompressorCodec {
    fn len(&self) -> usize {
        self.inner.len()
    }

    fn max_encoded_len(&self) -> usize {
        self.inner.max_compressed_len()
    }

    fn encode(&mut self, input: &[f32], round: u64, out: &mut Vec<u8>) -> Result<(), CodecError> {
        let mut ctx = RoundCtx::new(round);
        ctx.lr = self.lr;
        self.inner.compress(input, &ctx, out).map_err(codec_error)
    }

    fn decode(&self, payload: &[u8], round: u64, out: &mut [f32]) -> Result<(), CodecError> {
        self.inner
            .decompress(payload, &RoundCtx::new(round), out)
            .map_err(codec_error)
    }

    fn decode_add(&self, payload: &[u8], round: u64, acc: &mut [f32]) -> Result<(), CodecError> {
        self.inner
            .decompress_add(payload, &RoundCtx::new(round), acc)
            .map_err(codec_error)
    }

    fn set_learning_rate(&mut self, lr: f32) {
        self.lr = Some(lr);
    }

    fn describe(&self) -> String {
        self.inner.name().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            role: Role::Worker,
            rank: 1,
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
        assert_eq!(at.max_encoded_len(), 4 + 4 * 16384 / 32);
        assert!(at.describe().contains("onebit"), "{}", at.describe());
        let below = chunk_codec(&info(&p, 16383)).unwrap();
        assert_eq!(below.max_encoded_len(), 4 * 16383);
        assert!(
            below.describe().starts_with("nesterov"),
            "{}",
            below.describe()
        );
        assert!(!below.describe().contains("ef("), "{}", below.describe());
        // A server builds no momentum.
        let mut s = info(&p, 16383);
        s.role = Role::Server;
        assert!(!chunk_codec(&s).unwrap().describe().contains("nesterov"));
    }

    #[test]
    fn bad_maps_are_refused_even_for_small_tensors() {
        let p = map(&[("compressor", "topq")]);
        let e = chunk_codec(&info(&p, 10)).unwrap_err();
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
        let e = c.encode(&x, 0, &mut out).unwrap_err();
        assert!(e.0.contains("learning rate"), "{e}");
        c.set_learning_rate(0.1);
        c.encode(&x, 0, &mut out).unwrap();
        assert_eq!(out.len(), c.max_encoded_len());
    }
}
