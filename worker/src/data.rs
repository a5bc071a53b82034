//! Where a round's data lives: [`RoundData`], what `round` asks of the caller's buffer (encode
//! chunk i, decode chunk i's result), in two kinds:
//!
//! * host buffers, each chunk compressed by its CPU codec: [`HostData`] (one `AsMut<[f32]>`,
//!   in place) and [`HostInto`] (an input and a separate output);
//! * [`DeviceData`]: a tensor in a [`Device`]'s memory, each chunk compressed on the device by
//!   its [`DeviceChain`] (only the payload crosses to the host), or, for compressors without a
//!   device kernel or under a custom codec factory, copied to the host and compressed by its
//!   CPU codec. [`RoundData::launch`] starts every device chunk's compression at the start of
//!   the round; `encode` then waits for that one chunk and pushes its payload straight from
//!   its staging ([`StagingBuf`], page-locked on CUDA), which returns to the tensor's pool when
//!   QUIC drops the `Bytes`.
//!
//! A tensor's push_pull rounds all run in one place, its *home* (set by its first round), since
//! error feedback and momentum state live there: the CPU codecs for host buffers, the device
//! chains (kept in the tensor between rounds) for device buffers. A round elsewhere is refused
//! with [`WorkerError::Device`] before it uses a round number. Broadcasts touch no state and
//! run anywhere.

use std::any::Any;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use pushpull_kernels::chunk::{ChunkInfo, Node};
use pushpull_kernels::cuda::Device as Place;
use pushpull_kernels::device::{Device, DeviceChain, Started};
use pushpull_kernels::{fp32_codec, RoundCtx as CodecRound};
use pushpull_proto::pool::{BufPool, Pool, Recycle};

use crate::error::WorkerError;
use crate::round::RoundKind;
use crate::tensor::TensorInner;

/// The caller's buffer during one round (see the module docs).
pub(crate) trait RoundData: Send + 'static {
    /// Elements.
    fn len(&mut self) -> usize;

    /// The length of a buffer of this data (an input or an output) that is not `declared`
    /// elements, if any.
    fn wrong_len(&mut self, declared: u64) -> Option<u64> {
        let n = self.len() as u64;
        (n != declared).then_some(n)
    }

    /// Called holding the tensor, before a round number is used: claims the tensor's home for
    /// a push_pull round (or refuses), and takes whatever state the round needs.
    fn begin(&mut self, tensor: &TensorInner, kind: RoundKind) -> Result<(), WorkerError>;

    /// Called holding the tensor once the round's number is known, before any chunk is
    /// encoded: starts whatever can run ahead (a device launches every chunk's compression,
    /// so that it never waits between chunks). Errors surface at [`RoundData::encode`].
    fn launch(&mut self, _tensor: &TensorInner, _round: u64, _kind: RoundKind, _lr: Option<f32>) {}

    /// Encodes chunk `index` of this worker's data: the payload to push, in a buffer of
    /// `pool` (or of the data's own pool).
    fn encode(
        &mut self,
        tensor: &TensorInner,
        index: usize,
        round: u64,
        kind: RoundKind,
        lr: Option<f32>,
        pool: &Arc<BufPool>,
    ) -> Result<Bytes, String>;

    /// Decodes chunk `index`'s result into the buffer (and divides by `num_workers` for an
    /// average).
    fn decode(
        &mut self,
        tensor: &TensorInner,
        index: usize,
        round: u64,
        kind: RoundKind,
        num_workers: u32,
        payload: &[u8],
    ) -> Result<(), String>;

    /// Called after the round, whatever its outcome: gives back what `begin` took.
    fn end(&mut self, tensor: &TensorInner);
}

/// Checks that a round of `kind` on a buffer at `place` may run on `tensor`: broadcasts run
/// anywhere, push_pull rounds only at the tensor's home (or anywhere before its first).
fn check_home(tensor: &TensorInner, kind: RoundKind, place: Place) -> Result<(), WorkerError> {
    if !matches!(kind, RoundKind::Sum { .. }) {
        return Ok(());
    }
    match tensor.residence().home {
        Some(home) if home != place => Err(WorkerError::Device {
            name: tensor.placement.name.clone(),
            message: format!(
                "its push_pull rounds run on {home} (where its first round ran and its \
                 compressor state lives), so a buffer on {place} cannot be used; hand in \
                 {} buffers",
                if home == Place::Cpu { "host" } else { "device" }
            ),
        }),
        _ => Ok(()),
    }
}

/// Encodes `slice` (chunk `index`) on the host into a buffer of `pool`: the tensor's CPU
/// codec, or raw fp32 for a broadcast.
#[allow(clippy::too_many_arguments)]
fn encode_host(
    tensor: &TensorInner,
    index: usize,
    slice: &[f32],
    round: u64,
    kind: RoundKind,
    lr: Option<f32>,
    pool: &Arc<BufPool>,
) -> Result<Bytes, String> {
    let ctx = CodecRound {
        lr,
        ..CodecRound::new(round)
    };
    let mut out = pool.take();
    let encoded = match kind {
        // Broadcasts carry raw fp32 whatever the tensor's compressor: the root's values
        // arrive exactly, and no compressor state (error feedback, momentum) is touched.
        RoundKind::Broadcast { .. } => fp32_codec(slice.len()).compress(slice, &ctx, &mut out),
        RoundKind::Sum { .. } => tensor.codec(index).compress(slice, &ctx, &mut out),
    };
    match encoded {
        Ok(()) => Ok(pool.freeze(out)),
        Err(e) => {
            pool.give_back(out);
            Err(e.to_string())
        }
    }
}

/// Decodes a result into `slice` (chunk `index`) on the host.
fn decode_host(
    tensor: &TensorInner,
    index: usize,
    slice: &mut [f32],
    round: u64,
    kind: RoundKind,
    num_workers: u32,
    payload: &[u8],
) -> Result<(), String> {
    let ctx = CodecRound::new(round);
    match kind {
        RoundKind::Broadcast { .. } => fp32_codec(slice.len()).decompress(payload, &ctx, slice),
        RoundKind::Sum { .. } => tensor.codec(index).decompress(payload, &ctx, slice),
    }
    .map_err(|e| e.to_string())?;
    if let RoundKind::Sum { average: true } = kind {
        let w = num_workers as f32;
        for x in slice.iter_mut() {
            *x /= w;
        }
    }
    Ok(())
}

/// The host buffers of a round: where chunks are read from and where results are written.
trait HostBuffers: Send + 'static {
    fn input(&mut self) -> &[f32];
    fn output(&mut self) -> &mut [f32];
}

/// A host buffer, read and overwritten in place ([`crate::Worker::push_pull`]).
pub(crate) struct HostData<B>(pub(crate) B);

impl<B: AsMut<[f32]> + Send + 'static> HostBuffers for HostData<B> {
    fn input(&mut self) -> &[f32] {
        self.0.as_mut()
    }
    fn output(&mut self) -> &mut [f32] {
        self.0.as_mut()
    }
}

/// A host input and a separate host output: the round reads `input` and writes each chunk's
/// result into `output` ([`crate::Worker::push_pull_into`]).
pub(crate) struct HostInto<I, O> {
    pub(crate) input: I,
    pub(crate) output: O,
}

impl<I, O> HostBuffers for HostInto<I, O>
where
    I: AsRef<[f32]> + Send + 'static,
    O: AsMut<[f32]> + Send + 'static,
{
    fn input(&mut self) -> &[f32] {
        self.input.as_ref()
    }
    fn output(&mut self) -> &mut [f32] {
        self.output.as_mut()
    }
}

impl<H: HostBuffers> RoundData for H {
    fn len(&mut self) -> usize {
        self.input().len()
    }

    fn wrong_len(&mut self, declared: u64) -> Option<u64> {
        let lens = [self.input().len(), self.output().len()];
        lens.into_iter().map(|n| n as u64).find(|&n| n != declared)
    }

    fn begin(&mut self, tensor: &TensorInner, kind: RoundKind) -> Result<(), WorkerError> {
        check_home(tensor, kind, Place::Cpu)?;
        let mut res = tensor.residence();
        if let RoundKind::Sum { .. } = kind {
            res.home = Some(Place::Cpu);
            res.compressed_on = Place::Cpu;
        }
        res.buffer_on = Place::Cpu;
        Ok(())
    }

    fn encode(
        &mut self,
        tensor: &TensorInner,
        index: usize,
        round: u64,
        kind: RoundKind,
        lr: Option<f32>,
        pool: &Arc<BufPool>,
    ) -> Result<Bytes, String> {
        let slice = &self.input()[tensor.ranges[index].clone()];
        encode_host(tensor, index, slice, round, kind, lr, pool)
    }

    fn decode(
        &mut self,
        tensor: &TensorInner,
        index: usize,
        round: u64,
        kind: RoundKind,
        num_workers: u32,
        payload: &[u8],
    ) -> Result<(), String> {
        let slice = &mut self.output()[tensor.ranges[index].clone()];
        decode_host(tensor, index, slice, round, kind, num_workers, payload)
    }

    fn end(&mut self, _tensor: &TensorInner) {}
}

/// What [`DeviceData`] needs to build a tensor's device chains at its first device round.
#[derive(Clone, Copy)]
pub(crate) struct ChainSetup {
    pub(crate) job_seed: u64,
    pub(crate) rank: u32,
    pub(crate) min_compress_bytes: u64,
    /// A codec factory other than the default is set: every chunk uses its CPU codec.
    pub(crate) custom_factory: bool,
}

/// A device's staging buffer in a [`Pool`]: pushed payloads live in it (page-locked memory
/// on CUDA) until QUIC drops their `Bytes`, then it is reused.
pub(crate) struct StagingBuf<D: Device>(D::Staging);

impl<D: Device> AsRef<[u8]> for StagingBuf<D> {
    fn as_ref(&self) -> &[u8] {
        self.0.as_ref()
    }
}

impl<D: Device> Recycle for StagingBuf<D> {
    fn capacity(&self) -> usize {
        self.0.as_ref().len()
    }
    fn reset(&mut self) {}
}

/// A tensor's device state, kept in the tensor between its push_pull rounds: one chain per
/// chunk (`None`: the CPU codec) and the pool of its payloads' staging.
struct DeviceState<D: Device> {
    chains: Vec<Option<DeviceChain<D>>>,
    staging: Arc<Pool<StagingBuf<D>>>,
}

/// The chain of chunk `index`, if it compresses on the device.
fn chain_of<D: Device>(
    state: &mut Option<DeviceState<D>>,
    index: usize,
) -> Option<&mut DeviceChain<D>> {
    state.as_mut()?.chains.get_mut(index)?.as_mut()
}

/// A chunk's compression as [`RoundData::launch`] left it.
enum Launched<S> {
    Started(Started<S>),
    Failed(String),
}

/// A tensor in device memory.
pub(crate) struct DeviceData<D: Device> {
    pub(crate) device: Arc<D>,
    pub(crate) mem: D::Mem,
    setup: ChainSetup,
    /// The tensor's device state during a push_pull round.
    state: Option<DeviceState<D>>,
    /// Per chunk, its compression launched this round and not yet encoded.
    launched: Vec<Option<Launched<D::Staging>>>,
    /// Host staging for chunks compressed on the CPU and for broadcasts.
    host: Vec<f32>,
}

impl<D: Device> DeviceData<D> {
    pub(crate) fn new(device: Arc<D>, mem: D::Mem, setup: ChainSetup) -> DeviceData<D> {
        DeviceData {
            device,
            mem,
            setup,
            state: None,
            launched: Vec::new(),
            host: Vec::new(),
        }
    }

    fn build_state(&self, tensor: &TensorInner) -> Result<DeviceState<D>, WorkerError> {
        let p = &tensor.placement;
        let full = p.chunks.first().map_or(0, |c| c.len);
        let chains = p
            .chunks
            .iter()
            .map(|c| {
                if self.setup.custom_factory {
                    return Ok(None);
                }
                let info = ChunkInfo {
                    params: &p.params,
                    tensor_len: p.len,
                    chunk_len: c.len,
                    full_chunk_len: full,
                    key: c.key,
                    job_seed: self.setup.job_seed,
                    node: Node::Worker {
                        rank: self.setup.rank,
                    },
                    min_compress_bytes: self.setup.min_compress_bytes,
                };
                DeviceChain::build(&self.device, &info).map_err(|message| WorkerError::Device {
                    name: p.name.clone(),
                    message,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // Room for two rounds' staging of every chunk (QUIC may still hold a round's payloads
        // when the next starts): steady-state rounds allocate none.
        let bytes: usize = chains
            .iter()
            .flatten()
            .map(DeviceChain::staging_bytes)
            .sum();
        Ok(DeviceState {
            chains,
            staging: Pool::new(2 * bytes),
        })
    }

    /// Launches chunk `index`'s compression on the device (`None`: it has no device chain).
    fn start_chunk(
        &mut self,
        index: usize,
        range: Range<usize>,
        ctx: &CodecRound<'_>,
    ) -> Option<Launched<D::Staging>> {
        let bytes = chain_of(&mut self.state, index)?.staging_bytes();
        let staging = match self.staging(bytes) {
            Ok(s) => s,
            Err(e) => return Some(Launched::Failed(e)),
        };
        let state = self.state.as_mut()?;
        let chain = state.chains.get_mut(index)?.as_mut()?;
        Some(match chain.start(&self.mem, range, ctx, staging) {
            Ok(started) => Launched::Started(started),
            Err((e, staging)) => {
                state.staging.give_back(StagingBuf(staging));
                Launched::Failed(e.to_string())
            }
        })
    }

    /// Staging of at least `bytes` from the tensor's pool, or a new one.
    fn staging(&self, bytes: usize) -> Result<D::Staging, String> {
        let pool = &self.state.as_ref().ok_or("no device state")?.staging;
        match pool.take_idle() {
            Some(StagingBuf(s)) if s.as_ref().len() >= bytes => Ok(s),
            other => {
                drop(other);
                self.device
                    .alloc_staging(bytes)
                    .map_err(|e| format!("allocating staging on {}: {e}", self.device.place()))
            }
        }
    }

    /// Copies `range` of the tensor into the host staging buffer.
    fn stage(&mut self, range: Range<usize>) -> Result<(), String> {
        self.host.resize(range.len(), 0.0);
        self.device
            .download(&self.mem, range, &mut self.host)
            .map_err(|e| format!("copying the chunk from {}: {e}", self.device.place()))
    }

    /// Copies the host staging buffer to `at` in the tensor.
    fn unstage(&mut self, at: usize) -> Result<(), String> {
        self.device
            .upload(&self.host, &mut self.mem, at)
            .map_err(|e| format!("copying the result to {}: {e}", self.device.place()))
    }
}

impl<D: Device> RoundData for DeviceData<D> {
    fn len(&mut self) -> usize {
        self.device.mem_len(&self.mem)
    }

    fn begin(&mut self, tensor: &TensorInner, kind: RoundKind) -> Result<(), WorkerError> {
        let place = self.device.place();
        check_home(tensor, kind, place)?;
        if !matches!(kind, RoundKind::Sum { .. }) {
            tensor.residence().buffer_on = place;
            return Ok(());
        }
        let kept = tensor.residence().chains.take();
        let state = match kept.map(|b| b.downcast::<DeviceState<D>>()) {
            Some(Ok(state)) => *state,
            Some(Err(other)) => {
                tensor.residence().chains = Some(other);
                return Err(WorkerError::Device {
                    name: tensor.placement.name.clone(),
                    message: format!(
                        "its device state was made for another kind of device than {place}"
                    ),
                });
            }
            None => self.build_state(tensor)?,
        };
        let on = if state.chains.iter().all(Option::is_some) {
            place
        } else {
            Place::Cpu
        };
        // The home is claimed only once the chains exist: a device that failed to build them
        // leaves the tensor free to run elsewhere.
        self.state = Some(state);
        let mut res = tensor.residence();
        res.home = Some(place);
        res.ran(on, place);
        Ok(())
    }

    fn launch(&mut self, tensor: &TensorInner, round: u64, kind: RoundKind, lr: Option<f32>) {
        if !matches!(kind, RoundKind::Sum { .. }) {
            return;
        }
        let ctx = CodecRound {
            lr,
            ..CodecRound::new(round)
        };
        let launched = (0..tensor.ranges.len())
            .map(|i| self.start_chunk(i, tensor.ranges[i].clone(), &ctx))
            .collect();
        self.launched = launched;
    }

    fn encode(
        &mut self,
        tensor: &TensorInner,
        index: usize,
        round: u64,
        kind: RoundKind,
        lr: Option<f32>,
        pool: &Arc<BufPool>,
    ) -> Result<Bytes, String> {
        let range = tensor.ranges[index].clone();
        if let RoundKind::Sum { .. } = kind {
            match self.launched.get_mut(index).and_then(Option::take) {
                Some(Launched::Failed(e)) => return Err(e),
                Some(Launched::Started(started)) => {
                    let (state, mem) = (self.state.as_mut(), &self.mem);
                    let state = state.ok_or("no device state")?;
                    let chain = state.chains[index].as_mut().ok_or("no device chain")?;
                    let (staging, len) = chain.finish(mem, started);
                    return match len {
                        Ok(len) => Ok(state.staging.freeze(StagingBuf(staging)).slice(..len)),
                        Err(e) => {
                            state.staging.give_back(StagingBuf(staging));
                            Err(e.to_string())
                        }
                    };
                }
                None => {}
            }
            if let Some(chain) = chain_of(&mut self.state, index) {
                // Not launched (a round driven without `launch`): compress and wait here.
                let ctx = CodecRound {
                    lr,
                    ..CodecRound::new(round)
                };
                let mut out = pool.take();
                return match chain.compress(&self.mem, range, &ctx, &mut out) {
                    Ok(()) => Ok(pool.freeze(out)),
                    Err(e) => {
                        pool.give_back(out);
                        Err(e.to_string())
                    }
                };
            }
        }
        self.stage(range)?;
        encode_host(tensor, index, &self.host, round, kind, lr, pool)
    }

    fn decode(
        &mut self,
        tensor: &TensorInner,
        index: usize,
        round: u64,
        kind: RoundKind,
        num_workers: u32,
        payload: &[u8],
    ) -> Result<(), String> {
        let range = tensor.ranges[index].clone();
        let mem = &mut self.mem;
        if let (RoundKind::Sum { average }, Some(chain)) = (kind, chain_of(&mut self.state, index))
        {
            let over = average.then_some(num_workers as f32);
            return chain
                .decompress(payload, &CodecRound::new(round), mem, range, over)
                .map_err(|e| e.to_string());
        }
        self.host.resize(range.len(), 0.0);
        let mut host = std::mem::take(&mut self.host);
        let res = decode_host(tensor, index, &mut host, round, kind, num_workers, payload);
        self.host = host;
        res?;
        self.unstage(range.start)
    }

    fn end(&mut self, tensor: &TensorInner) {
        // Compressions launched but never encoded (the round ended early): wait for their
        // copies and return their staging; the chains' state was never committed.
        for launched in std::mem::take(&mut self.launched).into_iter().flatten() {
            if let (Launched::Started(started), Some(state)) = (launched, self.state.as_ref()) {
                let mut staging = started.into_staging();
                let _ = self.device.wait_staged(&mut staging);
                state.staging.give_back(StagingBuf(staging));
            }
        }
        if let Some(state) = self.state.take() {
            let state: Box<dyn Any + Send> = Box::new(state);
            tensor.residence().chains = Some(state);
        }
    }
}
