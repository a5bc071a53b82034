//! Where a round's data lives: [`RoundData`], what `round` asks of the caller's buffer (encode
//! chunk i, decode chunk i's result), in two kinds:
//!
//! * host buffers, each chunk compressed by its CPU codec: [`HostData`] (one `AsMut<[f32]>`,
//!   in place) and [`HostInto`] (an input and a separate output);
//! * [`DeviceData`]: a tensor in a [`Device`]'s memory, each chunk compressed on the device by
//!   its [`DeviceChain`] (only the payload crosses to the host), or, for compressors without a
//!   device kernel or under a custom codec factory, copied to the host and compressed by its
//!   CPU codec.
//!
//! A tensor's push_pull rounds all run in one place, its *home* (set by its first round), since
//! error feedback and momentum state live there: the CPU codecs for host buffers, the device
//! chains (kept in the tensor between rounds) for device buffers. A round elsewhere is refused
//! with [`WorkerError::Device`] before it uses a round number. Broadcasts touch no state and
//! run anywhere.

use std::any::Any;
use std::ops::Range;
use std::sync::Arc;

use pushpull_kernels::chunk::{ChunkInfo, Node};
use pushpull_kernels::cuda::Device as Place;
use pushpull_kernels::device::{Device, DeviceChain};
use pushpull_kernels::{fp32_codec, RoundCtx as CodecRound};

use crate::error::WorkerError;
use crate::round::RoundKind;
use crate::tensor::TensorInner;

/// The caller's buffer during one round (see the module docs).
pub(crate) trait RoundData: Send + 'static {
    /// Elements.
    fn len(&mut self) -> usize;

    /// Called holding the tensor, before a round number is used: claims the tensor's home for
    /// a push_pull round (or refuses), and takes whatever state the round needs.
    fn begin(&mut self, tensor: &TensorInner, kind: RoundKind) -> Result<(), WorkerError>;

    /// Encodes chunk `index` of this worker's data into `out` (replacing its contents).
    fn encode(
        &mut self,
        tensor: &TensorInner,
        index: usize,
        round: u64,
        kind: RoundKind,
        lr: Option<f32>,
        out: &mut Vec<u8>,
    ) -> Result<(), String>;

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

/// Encodes `slice` (chunk `index`) on the host: the tensor's CPU codec, or raw fp32 for a
/// broadcast.
fn encode_host(
    tensor: &TensorInner,
    index: usize,
    slice: &[f32],
    round: u64,
    kind: RoundKind,
    lr: Option<f32>,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    let ctx = CodecRound {
        lr,
        ..CodecRound::new(round)
    };
    match kind {
        // Broadcasts carry raw fp32 whatever the tensor's compressor: the root's values
        // arrive exactly, and no compressor state (error feedback, momentum) is touched.
        RoundKind::Broadcast { .. } => fp32_codec(slice.len()).compress(slice, &ctx, out),
        RoundKind::Sum { .. } => tensor.codec(index).compress(slice, &ctx, out),
    }
    .map_err(|e| e.to_string())
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
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        let slice = &self.input()[tensor.ranges[index].clone()];
        encode_host(tensor, index, slice, round, kind, lr, out)
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

/// The chains of one tensor on a device of type `D` (one per chunk; `None`: the CPU codec).
type Chains<D> = Vec<Option<DeviceChain<D>>>;

/// A tensor in device memory.
pub(crate) struct DeviceData<D: Device> {
    pub(crate) device: Arc<D>,
    pub(crate) mem: D::Mem,
    setup: ChainSetup,
    /// The tensor's chains during a push_pull round (empty otherwise).
    chains: Chains<D>,
    /// Host staging for chunks compressed on the CPU and for broadcasts.
    host: Vec<f32>,
}

impl<D: Device> DeviceData<D> {
    pub(crate) fn new(device: Arc<D>, mem: D::Mem, setup: ChainSetup) -> DeviceData<D> {
        DeviceData {
            device,
            mem,
            setup,
            chains: Vec::new(),
            host: Vec::new(),
        }
    }

    fn build_chains(&self, tensor: &TensorInner) -> Result<Chains<D>, WorkerError> {
        let p = &tensor.placement;
        let full = p.chunks.first().map_or(0, |c| c.len);
        p.chunks
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
            .collect()
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
        self.chains = match kept.map(|b| b.downcast::<Chains<D>>()) {
            Some(Ok(chains)) => *chains,
            Some(Err(other)) => {
                tensor.residence().chains = Some(other);
                return Err(WorkerError::Device {
                    name: tensor.placement.name.clone(),
                    message: format!(
                        "its device state was made for another kind of device than {place}"
                    ),
                });
            }
            None => self.build_chains(tensor)?,
        };
        let on = if self.chains.iter().all(Option::is_some) {
            place
        } else {
            Place::Cpu
        };
        // The home is claimed only once the chains exist: a device that failed to build them
        // leaves the tensor free to run elsewhere.
        let mut res = tensor.residence();
        res.home = Some(place);
        res.ran(on, place);
        Ok(())
    }

    fn encode(
        &mut self,
        tensor: &TensorInner,
        index: usize,
        round: u64,
        kind: RoundKind,
        lr: Option<f32>,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        let range = tensor.ranges[index].clone();
        if let (RoundKind::Sum { .. }, Some(Some(chain))) = (kind, self.chains.get_mut(index)) {
            let ctx = CodecRound {
                lr,
                ..CodecRound::new(round)
            };
            return chain
                .compress(&self.mem, range, &ctx, out)
                .map_err(|e| e.to_string());
        }
        self.stage(range)?;
        encode_host(tensor, index, &self.host, round, kind, lr, out)
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
        if let (RoundKind::Sum { average }, Some(Some(chain))) = (kind, self.chains.get_mut(index))
        {
            let over = average.then_some(num_workers as f32);
            return chain
                .decompress(payload, &CodecRound::new(round), &mut self.mem, range, over)
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
        if !self.chains.is_empty() {
            let chains: Box<dyn Any + Send> = Box::new(std::mem::take(&mut self.chains));
            tensor.residence().chains = Some(chains);
        }
    }
}
