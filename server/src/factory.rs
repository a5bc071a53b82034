//! Where codecs come from: the plug-in point for compression on the server side.
//!
//! When the scheduler places a tensor ([`common::protocol::FromScheduler::Placement`]), the
//! server asks its [`CodecFactory`] for one [`ChunkCodec`] per chunk it holds. The codec
//! decides which payloads are valid (`decode`/`decode_add`) and encodes each round's sum
//! (`encode`, with whatever per-key state it keeps, e.g. error feedback). The default,
//! [`KernelsFactory`], builds each chunk's compressor chain from the tensor's agreed parameter
//! map (`placement.params`, e.g. `compressor = "topk"`) with the kernels' registry in the
//! server role ([`pushpull_kernels::chunk::chunk_codec`]: error feedback if configured, never
//! momentum; raw fp32 below `config.cluster.min_compress_bytes`). [`Fp32Factory`] ignores the
//! map and carries raw fp32. Another factory plugs in through
//! [`crate::Server::with_codec_factory`].
//!
//! A factory error (an unknown compressor, a bad parameter) is sent back to the scheduler in
//! `PlacementAck { error }`, and every worker's `declare` of that tensor fails with it; the
//! server keeps none of that tensor's keys.

use common::codec::{ChunkCodec, Fp32Codec};
use common::protocol::{ChunkPlacement, TensorPlacement};
use common::Config;

/// What a [`CodecFactory`] is told about the chunk it builds a codec for.
#[derive(Debug, Clone, Copy)]
pub struct CodecContext<'a> {
    /// The whole tensor's placement: name, element count, agreed parameter map, all chunks.
    pub tensor: &'a TensorPlacement,
    /// The chunk: key, offset, element count, server.
    pub chunk: &'a ChunkPlacement,
    /// The chunk's index in `tensor.chunks`.
    pub chunk_index: u32,
    /// The job seed (from the scheduler's `Welcome`).
    pub job_seed: u64,
    /// This server's id.
    pub server_id: u32,
    /// The cluster file this server runs with.
    pub config: &'a Config,
}

/// Builds the codec of each chunk a server holds. Must return a codec whose `len()` is
/// `ctx.chunk.len`; an `Err` names what is wrong (it reaches every worker's `declare`).
///
/// Any `Fn(&CodecContext) -> Result<Box<dyn ChunkCodec>, String> + Send + Sync` is a factory.
pub trait CodecFactory: Send + Sync {
    /// A fresh codec (with fresh state) for `ctx.chunk`.
    fn make(&self, ctx: &CodecContext<'_>) -> Result<Box<dyn ChunkCodec>, String>;
}

impl<F> CodecFactory for F
where
    F: Fn(&CodecContext<'_>) -> Result<Box<dyn ChunkCodec>, String> + Send + Sync,
{
    fn make(&self, ctx: &CodecContext<'_>) -> Result<Box<dyn ChunkCodec>, String> {
        self(ctx)
    }
}

/// The default factory: the tensor's compressor chain from the kernels' registry, in the
/// server role (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelsFactory;

impl CodecFactory for KernelsFactory {
    fn make(&self, ctx: &CodecContext<'_>) -> Result<Box<dyn ChunkCodec>, String> {
        let info = pushpull_kernels::chunk::ChunkInfo::of_placement(
            ctx.tensor,
            ctx.chunk_index as usize,
            ctx.job_seed,
            pushpull_kernels::Role::Server,
            ctx.server_id,
            ctx.config.cluster.min_compress_bytes,
        );
        Ok(Box::new(pushpull_kernels::chunk::chunk_codec(&info)?))
    }
}

/// [`Fp32Codec`] for every chunk, whatever the parameters say.
#[derive(Debug, Clone, Copy, Default)]
pub struct Fp32Factory;

impl CodecFactory for Fp32Factory {
    fn make(&self, ctx: &CodecContext<'_>) -> Result<Box<dyn ChunkCodec>, String> {
        let len = usize::try_from(ctx.chunk.len)
            .map_err(|_| format!("chunk of {} elements is too large", ctx.chunk.len))?;
        Ok(Box::new(Fp32Codec::new(len)))
    }
}
