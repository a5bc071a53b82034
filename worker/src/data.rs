//! Where a round's data lives: [`RoundData`], what `round` asks of the caller's buffer (encode
//! chunk i, decode chunk i's result), in two kinds:
//!
//! * host buffers, each chunk compressed by its CPU codec: [`HostData`] (one `AsMut<[f32]>`,
//!   in place) and [`HostInto`] (an input and a separate output);
//! * [`DeviceData`] (`data/device.rs`): a tensor in a device's memory, its chunks compressed on
//!   the device by its [`pushpull_kernels::device::DeviceTensor`] in a batch with the other
//!   tensors of its call ([`RoundData::launch`] starts them all before any round runs; only
//!   payloads cross to the host), or, for compressors without a device kernel or under a
//!   custom codec factory, copied to the host and compressed by the CPU codecs.
//!
//! A tensor's push_pull rounds all run in one place, its *home* (set by its first round), since
//! error feedback and momentum state live there: the CPU codecs for host buffers, the device
//! chains (kept in the tensor between rounds) for device buffers. A round elsewhere is refused
//! with [`WorkerError::Device`] before it uses a round number. Broadcasts touch no state and
//! run anywhere.

use std::sync::Arc;

use pushpull_kernels::cuda::Device as Place;
use pushpull_kernels::{fp32_codec, host_fold, IntraCodec, RoundCtx as CodecRound};
use pushpull_proto::pool::BufPool;

use crate::core::{Encoded, RoundKind};
use crate::error::{DataError, WorkerError};
use crate::tensor::TensorInner;

mod device;

pub(crate) use device::{Batches, ChainSetup, DeviceData};

/// One round of a call about to start, for [`RoundData::launch`]: its tensor, its data and its
/// round number.
pub(crate) struct Starting<'a, R> {
    pub(crate) tensor: &'a TensorInner,
    pub(crate) data: &'a mut R,
    pub(crate) round: u64,
}

/// What the rounds of a call share, for [`RoundData::launch`].
pub(crate) struct Launch<'a> {
    pub(crate) kind: RoundKind,
    /// The rounds' learning rate.
    pub(crate) lr: Option<f32>,
    /// The job's workers (an average divides by them).
    pub(crate) num_workers: u32,
    /// What a batch needs between calls.
    pub(crate) batches: &'a Batches,
}

/// The chunk a data call is about: which chunk of which tensor, in which round and kind of
/// round, on which worker.
#[derive(Clone, Copy)]
pub(crate) struct ChunkAt<'a> {
    pub(crate) tensor: &'a TensorInner,
    pub(crate) index: usize,
    pub(crate) round: u64,
    pub(crate) kind: RoundKind,
    /// The round's learning rate.
    pub(crate) lr: Option<f32>,
    /// The job's workers (an average divides by them).
    pub(crate) num_workers: u32,
    /// This worker's rank.
    pub(crate) rank: u32,
}

impl ChunkAt<'_> {
    /// The chunk's elements in the tensor.
    fn range(&self) -> std::ops::Range<usize> {
        self.tensor.ranges[self.index].clone()
    }
}

/// The caller's buffer as the host sees it: where a chunk's values are read and its result
/// written when the chunk goes through the host (always for host buffers; for a device's, the
/// buffer's copy on the host).
pub(crate) trait HostView {
    /// Chunk `at` of the input.
    fn input(&mut self, at: &ChunkAt<'_>) -> Result<&[f32], DataError>;

    /// Chunk `at` of the output, to be overwritten.
    fn output(&mut self, at: &ChunkAt<'_>) -> Result<&mut [f32], DataError>;

    /// Chunk `at`'s decode failed partway through the output (a device's copy then gives the
    /// chunk its input back).
    fn output_failed(&mut self, _at: &ChunkAt<'_>) {}
}

/// The caller's buffer during one round (see the module docs). The chunk operations are the
/// host's ([`HostView`]: the tensor's CPU codecs) unless a kind of data compresses elsewhere
/// (a device's chains, for a device round's launched chunks).
pub(crate) trait RoundData: HostView + Send + 'static {
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

    /// Called once for the rounds of a call (one, or a group's), holding their tensors, once
    /// their numbers are known and before any runs: starts whatever can run ahead together (a
    /// device launches every chunk of every round as one batch, so that it never waits
    /// between chunks or tensors). Errors surface at [`RoundData::encode`].
    fn launch(_rounds: &mut [Starting<'_, Self>], _call: &Launch<'_>)
    where
        Self: Sized,
    {
    }

    /// Why the round cannot start, after [`RoundData::launch`] (a device that could not
    /// allocate or launch the call's batch): the round is then given up before it uses a
    /// round number, as a refusal in `begin` is.
    fn refused(&mut self) -> Option<DataError> {
        None
    }

    /// What the round waits for before its chunks are encoded, if anything: a device batch's
    /// payloads on their way to host staging, or a device buffer's copy to the host (its
    /// `HostCopy`), which take as long as the device is busy with work queued before them (a
    /// training's kernels). Awaited before the round's sends are
    /// held ([`crate::Worker::push_pull_group_into`]) and before its chunks are encoded, so
    /// that a busy device holds back neither the runtime's threads nor the frames of other
    /// tensors.
    fn ready(&mut self) -> Option<Ready> {
        None
    }

    /// The whole input, copied to the host: what a round made of other rounds (a PowerSGD
    /// step, `crate::worker`'s `low_rank`) reads. May wait for a device (call it off the
    /// async threads).
    fn whole_input(&mut self) -> Result<Vec<f32>, DataError>;

    /// Overwrites the whole output with `values` (a round made of other rounds' result). May
    /// wait for a device.
    fn set_whole_output(&mut self, values: &[f32]) -> Result<(), DataError>;

    /// Encodes chunk `at` of this worker's data: the payload to push, in a buffer of `pool`
    /// (or of the data's own pool), or [`Encoded::NonFinite`] for a sum's chunk that is not
    /// finite.
    fn encode(&mut self, at: &ChunkAt<'_>, pool: &Arc<BufPool>) -> Result<Encoded, DataError> {
        encode_on_host(self, at, pool)
    }

    /// Decodes chunk `at`'s result into the buffer (and divides by the workers for an
    /// average).
    fn decode(&mut self, at: &ChunkAt<'_>, payload: &[u8]) -> Result<(), DataError> {
        decode_on_host(self, at, payload)
    }

    /// Chunk `at`'s sum was not finite: undoes this worker's round of the chunk (if it
    /// committed one) and fills the chunk of the buffer with NaN.
    fn non_finite(&mut self, at: &ChunkAt<'_>) -> Result<(), DataError> {
        non_finite_on_host(self, at)
    }

    /// Local groups ([`crate::local`]): adds this member's part of chunk `at` to its host's
    /// sum `acc` ([`host_fold`] with the tensor's intra-host codec; member 0, `first`,
    /// writes). In a broadcast the root contributes its values exactly and every other member
    /// `-0.0`, which changes no value.
    fn contribute(
        &mut self,
        at: &ChunkAt<'_>,
        first: bool,
        intra: IntraCodec,
        acc: &mut [f32],
    ) -> Result<(), DataError> {
        let x = self.input(at)?;
        match at.kind {
            RoundKind::Sum { .. } => host_fold(intra, first, x, acc),
            RoundKind::Broadcast { root } if root == at.rank => {
                host_fold(IntraCodec::None, first, x, acc)
            }
            // `a + -0.0 == a` for every `a`: only a first writer has something to do.
            RoundKind::Broadcast { .. } if first => acc.fill(-0.0),
            RoundKind::Broadcast { .. } | RoundKind::Gossip => {}
        }
        Ok(())
    }

    /// Local groups: copies the host's result `acc` into chunk `at` of the buffer (divided by
    /// the workers for an average).
    fn take_result(&mut self, at: &ChunkAt<'_>, acc: &[f32]) -> Result<(), DataError> {
        let out = self.output(at)?;
        out.copy_from_slice(acc);
        if let RoundKind::Sum { average: true } = at.kind {
            pushpull_kernels::average(out, at.num_workers);
        }
        Ok(())
    }

    /// Undoes `round` of every chunk of the tensor (a discarded round: see
    /// [`crate::Worker::discard_last_round`]), wherever the tensor's state lives; called
    /// after [`RoundData::begin`] of the next push_pull round, before anything is launched.
    fn undo(&mut self, tensor: &TensorInner, round: u64) {
        undo_host(tensor, round);
    }

    /// Called after the round, whatever its outcome: gives back what `begin` took, and
    /// finishes the decoding. What it returns, if anything, resolves once the results are in
    /// the buffer (a device's batch decodes the results of all its rounds at once, when the
    /// last of them ends), and the round's outcome waits for it.
    fn end(&mut self, _tensor: &TensorInner) -> Option<Settling> {
        None
    }
}

/// A round's wait before encoding ([`RoundData::ready`]).
pub(crate) type Ready = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The rest of a round's decoding, after [`RoundData::end`].
pub(crate) type Settling =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), WorkerError>> + Send>>;

/// Checks that a round of `kind` on a buffer at `place` may run on `tensor`: broadcasts run
/// anywhere, push_pull rounds only at the tensor's home (or anywhere before its first).
pub(crate) fn check_home(
    tensor: &TensorInner,
    kind: RoundKind,
    place: Place,
) -> Result<(), WorkerError> {
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

/// [`RoundData::encode`] through the host: chunk `at` of `data`'s host view, by its CPU codec.
pub(crate) fn encode_on_host<V: HostView + ?Sized>(
    data: &mut V,
    at: &ChunkAt<'_>,
    pool: &Arc<BufPool>,
) -> Result<Encoded, DataError> {
    encode_host(at, data.input(at)?, pool)
}

/// [`RoundData::decode`] through the host: into chunk `at` of `data`'s host view.
pub(crate) fn decode_on_host<V: HostView + ?Sized>(
    data: &mut V,
    at: &ChunkAt<'_>,
    payload: &[u8],
) -> Result<(), DataError> {
    let decoded = decode_host(at, data.output(at)?, payload);
    if decoded.is_err() {
        data.output_failed(at);
    }
    decoded
}

/// [`RoundData::non_finite`] through the host: undoes the chunk's CPU codec's round and fills
/// chunk `at` of `data`'s host view with NaN.
pub(crate) fn non_finite_on_host<V: HostView + ?Sized>(
    data: &mut V,
    at: &ChunkAt<'_>,
) -> Result<(), DataError> {
    at.tensor.codec(at.index).undo(at.round);
    data.output(at)?.fill(f32::NAN);
    Ok(())
}

/// Encodes `slice` (chunk `at`) on the host into a buffer of `pool`: the tensor's CPU codec,
/// or raw fp32 for a broadcast. A sum's chunk that is not finite is [`Encoded::NonFinite`].
pub(crate) fn encode_host(
    at: &ChunkAt<'_>,
    slice: &[f32],
    pool: &Arc<BufPool>,
) -> Result<Encoded, DataError> {
    let ctx = CodecRound {
        lr: at.lr,
        theta_bound: at.tensor.bound.theta_bound(at.round, at.lr),
        ..CodecRound::new(at.round)
    };
    let mut out = pool.take();
    let encoded = match at.kind {
        // Broadcasts carry raw fp32 whatever the tensor's compressor: the root's values
        // arrive exactly, and no compressor state (error feedback, momentum) is touched.
        RoundKind::Broadcast { .. } => fp32_codec(slice.len()).compress(slice, &ctx, &mut out),
        RoundKind::Sum { .. } | RoundKind::Gossip => {
            at.tensor.codec(at.index).compress(slice, &ctx, &mut out)
        }
    };
    match encoded {
        Ok(()) => Ok(Encoded::Payload(pool.freeze(out))),
        Err(e) => {
            pool.give_back(out);
            match at.kind {
                RoundKind::Sum { .. } if e.is_non_finite() => Ok(Encoded::NonFinite(e.to_string())),
                _ => Err(e.into()),
            }
        }
    }
}

/// Undoes `round` of every chunk's CPU codec (see [`RoundData::undo`]).
pub(crate) fn undo_host(tensor: &TensorInner, round: u64) {
    for index in 0..tensor.codecs.len() {
        tensor.codec(index).undo(round);
    }
}

/// Decodes a result into `slice` (chunk `at`) on the host, averaged for an average; the
/// round's learning rate matters to a gossip round only (moniqua's `theta_schedule = lr`).
pub(crate) fn decode_host(
    at: &ChunkAt<'_>,
    slice: &mut [f32],
    payload: &[u8],
) -> Result<(), DataError> {
    let ctx = CodecRound::new(at.round);
    let (tensor, index) = (at.tensor, at.index);
    match at.kind {
        RoundKind::Broadcast { .. } => fp32_codec(slice.len()).decompress(payload, &ctx, slice),
        RoundKind::Sum { .. } => tensor.codec(index).decompress(payload, &ctx, slice),
        RoundKind::Gossip => {
            return crate::gossip::average_gossip(tensor, index, slice, at.round, at.lr, payload)
        }
    }?;
    if let RoundKind::Sum { average: true } = at.kind {
        pushpull_kernels::average(slice, at.num_workers);
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

impl<H: HostBuffers> HostView for H {
    fn input(&mut self, at: &ChunkAt<'_>) -> Result<&[f32], DataError> {
        Ok(&HostBuffers::input(self)[at.range()])
    }

    fn output(&mut self, at: &ChunkAt<'_>) -> Result<&mut [f32], DataError> {
        Ok(&mut HostBuffers::output(self)[at.range()])
    }
}

impl<H: HostBuffers> RoundData for H {
    fn len(&mut self) -> usize {
        HostBuffers::input(self).len()
    }

    fn wrong_len(&mut self, declared: u64) -> Option<u64> {
        let lens = [
            HostBuffers::input(self).len(),
            HostBuffers::output(self).len(),
        ];
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

    fn whole_input(&mut self) -> Result<Vec<f32>, DataError> {
        Ok(HostBuffers::input(self).to_vec())
    }

    fn set_whole_output(&mut self, values: &[f32]) -> Result<(), DataError> {
        HostBuffers::output(self).copy_from_slice(values);
        Ok(())
    }
}
