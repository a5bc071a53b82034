//! [`DeviceData`]: a round's buffer in a device's memory (see the module docs of
//! [`crate::data`]). The rounds of one call (a tensor, or a group's tensors) are launched as one
//! [`Batch`] of their chunks ([`RoundData::launch`]): each step of the device chain is one
//! driver call for all of them; each round then finishes its own chunks from the batch's
//! staging as it pushes them and receives its results into the batch's decode staging, and
//! the last round of the batch to end decodes every round's results at once
//! ([`RoundData::end`]; the other rounds' outcomes wait for it). [`Batches`] keeps each set of
//! tensors' batch (tables, arena, staging) between calls.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pushpull_kernels::chunk::{ChunkInfo, Node};
use pushpull_kernels::cuda::Device as Place;
use pushpull_kernels::device::{Batch, BatchRound, Device, DeviceTensor, Started};
use pushpull_proto::pool::BufPool;

use super::{
    check_home, decode_on_host, encode_on_host, non_finite_on_host, undo_host, ChunkAt, Launch,
    Ready, RoundData, Settling, Starting,
};
use crate::core::{Encoded, RoundKind};
use crate::error::{DataError, WorkerError};
use crate::spans::BatchTrack;
use crate::tensor::{KeptChains, TensorInner};
use pushpull_kernels::ChainState;

mod host_copy;

use host_copy::HostCopy;

/// What [`DeviceData`] needs to build a tensor's device chains at its first device round.
#[derive(Clone, Copy)]
pub(crate) struct ChainSetup {
    pub(crate) job_seed: u64,
    pub(crate) rank: u32,
    pub(crate) min_compress_bytes: u64,
    /// A codec factory other than the default is set: every chunk uses its CPU codec.
    pub(crate) custom_factory: bool,
    /// The worker is in a local group (`cluster.local_size > 1`): its chunks are added to the
    /// host's sum from a host copy of the tensor ([`HostCopy`]), the results copied back, and
    /// each chunk's owner compresses the host sum with its CPU codec ([`crate::local`]), so
    /// the tensor has no device chains.
    pub(crate) local_group: bool,
}

/// A tensor's device state, kept in the tensor between its push_pull rounds: its chains, or
/// `None` when its compressor has no kernel (or a custom codec factory is set) and its chunks
/// are compressed by the CPU codecs.
struct DeviceState<D: Device> {
    chains: Option<DeviceTensor<D>>,
}

impl<D: Device> KeptChains for DeviceState<D> {
    fn chain_states(&self) -> Option<Result<Vec<ChainState>, String>> {
        let chains = self.chains.as_ref()?;
        Some(
            (0..chains.num_chunks())
                .map(|i| chains.chain_state(i).map_err(|e| e.to_string()))
                .collect(),
        )
    }
    fn undo(&mut self, round: u64) -> bool {
        self.chains.as_mut().map(|c| c.undo(round)).is_some()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// A batch's round, shared by the rounds of its tensors.
struct BatchRun<D: Device> {
    started: Started<D>,
    /// Rounds of the batch that have not ended: the last to end decodes for all.
    left: AtomicUsize,
    /// The decode's outcome, once the last round ended.
    decoded: tokio::sync::watch::Sender<Option<Result<(), DataError>>>,
    /// Set once the batch's payloads are in host staging ([`BatchRun::staged`]).
    staged: tokio::sync::OnceCell<()>,
    /// The batch's track in the timeline, when traced.
    track: Option<BatchTrack>,
}

impl<D: Device> BatchRun<D> {
    /// Waits until the batch's payloads are in host staging: once per batch (its other rounds
    /// find them there), on the blocking pool, since the wait blocks on the device's event.
    /// A failed wait is reported by every chunk's encode ([`Started::finish`]).
    async fn staged(self: Arc<Self>) {
        let run = self.clone();
        self.staged
            .get_or_init(|| async move {
                let _staged = run.track.as_ref().map(|t| t.span("staged"));
                let _ = tokio::task::spawn_blocking(move || run.started.wait_staged()).await;
            })
            .await;
    }

    /// One round of the batch has ended: the last to end decodes every round's results.
    fn leave(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let outcome = {
                // Ended before the waiting rounds hear of it.
                let _decode = self.track.as_ref().map(|t| t.span("decode"));
                self.started.decode().map_err(DataError::from)
            };
            self.decoded.send_replace(Some(outcome));
        }
    }
}

/// This round's share of its call's batch.
enum Launched<D: Device> {
    /// Not part of a batch (a broadcast, or chunks compressed on the host).
    No,
    /// Launched: the batch's round and this tensor's place in it.
    Yes { run: Arc<BatchRun<D>>, part: usize },
    /// The launch failed: every chunk's encode fails with this.
    Failed(DataError),
}

/// The batches of the sets of tensors launched together so far, by set (the tensors'
/// addresses and the device's), at most [`Batches::KEEP`] of them, the latest used last.
#[derive(Default)]
pub(crate) struct Batches(Mutex<Vec<Kept>>);

/// A kept batch (a `Batch<D>`), its set of tensors and the bytes it holds.
type Kept = (Vec<usize>, Arc<dyn Any + Send + Sync>, u64);

impl Batches {
    /// Sets of tensors kept: a training step launches a few (one per group call or bucket),
    /// or one per tensor with separate calls (ResNet-50 has 161). A round keeps its batch
    /// alive, so evicting one in use only stops its reuse.
    const KEEP: usize = 1024;

    /// The batch of `key`'s tensors, made by `make` when there is none (or it no longer fits).
    fn get<D: Device>(
        &self,
        key: Vec<usize>,
        fits: impl Fn(&Batch<D>) -> bool,
        make: impl FnOnce() -> Result<Batch<D>, DataError>,
    ) -> Result<Arc<Batch<D>>, DataError> {
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = kept.iter().position(|(k, ..)| *k == key) {
            let (k, b, bytes) = kept.remove(at);
            if let Ok(batch) = b.downcast::<Batch<D>>() {
                if fits(&batch) {
                    kept.push((k, batch.clone(), bytes));
                    return Ok(batch);
                }
            }
        }
        let batch = Arc::new(make()?);
        if kept.len() >= Self::KEEP {
            kept.remove(0);
        }
        kept.push((key, batch.clone(), batch.bytes()));
        Ok(batch)
    }

    /// Device and page-locked bytes the kept batches hold.
    pub(crate) fn bytes(&self) -> u64 {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter().map(|(.., bytes)| bytes).sum()
    }
}

/// A tensor in device memory: `len` f32 at device address `addr`, kept alive by `keep` (the
/// caller's own buffer, handed back after the round).
pub(crate) struct DeviceData<D: Device, K> {
    device: Arc<D>,
    addr: u64,
    len: usize,
    /// The caller's buffer (`None` once handed back).
    keep: Option<K>,
    setup: ChainSetup,
    /// The tensor's device state during a push_pull round.
    state: Option<DeviceState<D>>,
    launched: Launched<D>,
    /// The round is a broadcast: it uses the tensor's kept host copy if there is one, else
    /// memory it does not keep (`HostCopy`).
    broadcast: bool,
    /// The buffer on the host, for chunks that go through the host.
    copy: HostCopy<D>,
}

impl<D: Device> DeviceData<D, D::Mem> {
    /// A round over `mem`, the caller's own device buffer.
    pub(crate) fn owned(device: Arc<D>, mem: D::Mem, setup: ChainSetup) -> Self {
        let (addr, len) = (device.mem_addr(&mem), device.mem_len(&mem));
        DeviceData::new(device, addr, len, mem, setup)
    }
}

impl<D: Device, K> DeviceData<D, K> {
    fn new(device: Arc<D>, addr: u64, len: usize, keep: K, setup: ChainSetup) -> Self {
        DeviceData {
            device,
            addr,
            len,
            keep: Some(keep),
            setup,
            state: None,
            launched: Launched::No,
            broadcast: false,
            copy: HostCopy::default(),
        }
    }

    /// A round over `len` f32 of device memory at `addr`, borrowed from `keep` (e.g. a torch
    /// tensor).
    ///
    /// # Safety
    /// `addr` addresses `len` f32 of `device`'s memory, which `keep` keeps alive and which
    /// nothing else reads or writes until the round has ended and the device's work on it
    /// has completed (later work on the device's stream is ordered after it).
    pub(crate) unsafe fn borrowed(
        device: Arc<D>,
        addr: u64,
        len: usize,
        keep: K,
        setup: ChainSetup,
    ) -> Self {
        DeviceData::new(device, addr, len, keep, setup)
    }

    /// The caller's buffer, handed back after the round.
    pub(crate) fn into_keep(mut self) -> Result<K, WorkerError> {
        self.keep
            .take()
            .ok_or_else(|| WorkerError::Internal("a device buffer was handed back twice".into()))
    }

    fn device_error(&self, tensor: &TensorInner, message: String) -> WorkerError {
        WorkerError::Device {
            name: tensor.placement.name.clone(),
            message,
        }
    }

    /// The tensor's chains, built at its first device round.
    fn build_state(&self, tensor: &TensorInner) -> Result<DeviceState<D>, WorkerError> {
        if self.setup.custom_factory || self.setup.local_group {
            return Ok(DeviceState { chains: None });
        }
        let p = &tensor.placement;
        let full = p.chunks.first().map_or(0, |c| c.len);
        let infos: Vec<ChunkInfo<'_>> = p
            .chunks
            .iter()
            .map(|c| ChunkInfo {
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
            })
            .collect();
        let mut chains = DeviceTensor::build(&self.device, &infos)
            .map_err(|message| self.device_error(tensor, message))?;
        // A checkpoint's state was restored into the host chains: the device chains start
        // from it.
        let restored = tensor.residence().restored;
        if let (true, Some(device)) = (restored, chains.as_mut()) {
            for i in 0..device.num_chunks() {
                let state = tensor.codec(i).state();
                device.set_chain_state(i, &state).map_err(|e| {
                    self.device_error(tensor, format!("restoring the checkpoint's state: {e}"))
                })?;
            }
            tensor.residence().restored = false;
        }
        Ok(DeviceState { chains })
    }

    /// The tensor's device chains this round, if its chunks compress on the device.
    fn chains(&mut self) -> Option<&mut DeviceTensor<D>> {
        self.state.as_mut()?.chains.as_mut()
    }
}

impl<D: Device, K: Send + 'static> RoundData for DeviceData<D, K> {
    fn len(&mut self) -> usize {
        self.len
    }

    fn begin(&mut self, tensor: &TensorInner, kind: RoundKind) -> Result<(), WorkerError> {
        let place = self.device.place();
        check_home(tensor, kind, place)?;
        self.broadcast = matches!(kind, RoundKind::Broadcast { .. });
        if !matches!(kind, RoundKind::Sum { .. }) {
            tensor.residence().buffer_on = place;
            self.take_host_memory(tensor);
            return Ok(());
        }
        let kept = tensor.residence().chains.take();
        let state = match kept {
            Some(b) if b.as_any().is::<DeviceState<D>>() => match b.into_any().downcast() {
                Ok(state) => *state,
                Err(_) => return Err(WorkerError::Internal("a device state changed type".into())),
            },
            Some(other) => {
                tensor.residence().chains = Some(other);
                return Err(self.device_error(
                    tensor,
                    format!("its device state was made for another kind of device than {place}"),
                ));
            }
            None => self.build_state(tensor)?,
        };
        let on = if state.chains.is_some() {
            place
        } else {
            Place::Cpu
        };
        // The home is claimed only once the chains exist: a device that failed to build them
        // leaves the tensor free to run elsewhere.
        let mut res = tensor.residence();
        res.device_bytes = state.chains.as_ref().map_or(0, DeviceTensor::bytes);
        self.state = Some(state);
        res.home = Some(place);
        res.ran(on, place);
        drop(res);
        if on == Place::Cpu {
            self.take_host_memory(tensor);
        }
        Ok(())
    }

    fn launch(rounds: &mut [Starting<'_, Self>], call: &Launch<'_>) {
        let RoundKind::Sum { average } = call.kind else {
            return;
        };
        // The rounds whose chunks compress on the device, by device (a group call has one).
        let on: Vec<usize> = (0..rounds.len())
            .filter(|&i| rounds[i].data.chains().is_some())
            .collect();
        let Some(&first) = on.first() else { return };
        let device = rounds[first].data.device.clone();
        let rank = rounds[first].data.setup.rank;
        let track = BatchTrack::of(
            rank,
            on.iter().map(|&i| (rounds[i].tensor, rounds[i].round)),
        );
        let launch = track.as_ref().map(|t| t.span("launch"));
        let key: Vec<usize> = std::iter::once(Arc::as_ptr(&device) as *const () as usize)
            .chain(
                on.iter()
                    .map(|&i| rounds[i].tensor as *const TensorInner as usize),
            )
            .collect();
        let launched = {
            let tensors: Vec<&DeviceTensor<D>> = on
                .iter()
                .filter_map(|&i| rounds[i].data.state.as_ref()?.chains.as_ref())
                .collect();
            let batch = call.batches.get(
                key,
                |b| b.fits(&tensors),
                || {
                    Batch::new(&device, &tensors).map_err(|e| {
                        let place = device.place();
                        DataError::Device(format!("allocating a batch on {place}: {e}"))
                    })
                },
            );
            let args: Vec<BatchRound> = on
                .iter()
                .map(|&i| BatchRound {
                    input: rounds[i].data.addr,
                    output: rounds[i].data.addr,
                    round: rounds[i].round,
                    lr: call.lr,
                    average_over: average.then_some(call.num_workers as f32),
                })
                .collect();
            // SAFETY: each round's buffer is its data's (owned, or borrowed under the
            // contract of `DeviceData::borrowed`), alive until the round ends; the rounds
            // settle (decode) before they end.
            batch.and_then(|b| unsafe { b.start(&tensors, &args) }.map_err(DataError::from))
        };
        drop(launch);
        match launched {
            Ok(started) => {
                let run = Arc::new(BatchRun {
                    started,
                    left: AtomicUsize::new(on.len()),
                    decoded: tokio::sync::watch::Sender::new(None),
                    staged: tokio::sync::OnceCell::new(),
                    track,
                });
                for (part, &i) in on.iter().enumerate() {
                    rounds[i].data.launched = Launched::Yes {
                        run: run.clone(),
                        part,
                    };
                }
            }
            Err(e) => {
                for &i in &on {
                    rounds[i].data.launched = Launched::Failed(e.clone());
                }
            }
        }
    }

    fn whole_input(&mut self) -> Result<Vec<f32>, DataError> {
        let mut host = vec![0.0f32; self.len];
        // SAFETY: `addr` addresses `len` f32 of the device's memory that `keep` keeps alive
        // (`DeviceData::borrowed`'s contract, or the caller's own buffer).
        unsafe { self.device.download(self.addr, &mut host) }
            .map_err(|e| DataError::Device(format!("copying the tensor to the host: {e}")))?;
        Ok(host)
    }

    fn set_whole_output(&mut self, values: &[f32]) -> Result<(), DataError> {
        // SAFETY: as in `whole_input`; nothing else uses the buffer during the round.
        unsafe { self.device.upload(values, self.addr) }
            .map_err(|e| DataError::Device(format!("copying the result to the device: {e}")))
    }

    fn refused(&mut self) -> Option<DataError> {
        match &self.launched {
            Launched::Failed(e) => Some(e.clone()),
            _ => None,
        }
    }

    fn ready(&mut self) -> Option<Ready> {
        match &self.launched {
            Launched::Yes { run, .. } => return Some(Box::pin(run.clone().staged())),
            Launched::Failed(_) => return None,
            Launched::No => {}
        }
        self.start_host_copy()
    }

    fn encode(&mut self, at: &ChunkAt<'_>, pool: &Arc<BufPool>) -> Result<Encoded, DataError> {
        if let RoundKind::Sum { .. } = at.kind {
            match &self.launched {
                Launched::Failed(e) => return Err(e.clone()),
                Launched::Yes { run, part } => {
                    let (run, part) = (run.clone(), *part);
                    let chains = self.chains().ok_or_else(no_chains)?;
                    return match run.started.finish(part, chains, at.index) {
                        Ok(payload) => Ok(Encoded::Payload(payload)),
                        Err(e) if e.is_non_finite() => Ok(Encoded::NonFinite(e.to_string())),
                        Err(e) => Err(e.into()),
                    };
                }
                // Chains that were not launched would fall behind the other workers' state.
                Launched::No if self.state.as_ref().is_some_and(|s| s.chains.is_some()) => {
                    let message = "internal error: a device round was not launched";
                    return Err(DataError::Device(message.into()));
                }
                Launched::No => {}
            }
        }
        encode_on_host(self, at, pool)
    }

    fn decode(&mut self, at: &ChunkAt<'_>, payload: &[u8]) -> Result<(), DataError> {
        if let (RoundKind::Sum { .. }, Launched::Yes { run, part }) = (at.kind, &self.launched) {
            let chains = self.state.as_ref().and_then(|s| s.chains.as_ref());
            let chains = chains.ok_or_else(no_chains)?;
            return run
                .started
                .receive(*part, chains, at.index, payload)
                .map_err(DataError::from);
        }
        decode_on_host(self, at, payload)
    }

    fn non_finite(&mut self, at: &ChunkAt<'_>) -> Result<(), DataError> {
        if let Launched::Yes { run, part } = &self.launched {
            let (run, part) = (run.clone(), *part);
            let chains = self.chains().ok_or_else(no_chains)?;
            run.started.receive_non_finite(part, chains, at.index);
            return Ok(());
        }
        non_finite_on_host(self, at)
    }

    fn undo(&mut self, tensor: &TensorInner, round: u64) {
        match self.chains() {
            Some(chains) => chains.undo(round),
            None => undo_host(tensor, round),
        }
    }

    fn end(&mut self, tensor: &TensorInner) -> Option<Settling> {
        if let Some(state) = self.state.take() {
            tensor.residence().chains = Some(Box::new(state));
        }
        let name = tensor.placement.name.clone();
        let copied = self.write_back(tensor).map_err(|e| WorkerError::Device {
            name: name.clone(),
            message: e.to_string(),
        });
        let Launched::Yes { run, .. } = std::mem::replace(&mut self.launched, Launched::No) else {
            return match copied {
                Ok(settling) => settling,
                Err(e) => Some(Box::pin(std::future::ready(Err(e)))),
            };
        };
        let mut decoded = run.decoded.subscribe();
        run.leave();
        Some(Box::pin(async move {
            // `run` holds the sender until the outcome is read.
            let _run = run;
            let outcome = match decoded.wait_for(Option::is_some).await {
                Ok(v) => v.clone().unwrap_or(Ok(())),
                Err(_) => Err(DataError::Device("the batch ended without decoding".into())),
            };
            if let Some(copied_back) = copied? {
                copied_back.await?;
            }
            outcome.map_err(|e| WorkerError::Device {
                name,
                message: format!("decoding the results: {e}"),
            })
        }))
    }
}

impl<D: Device, K> Drop for DeviceData<D, K> {
    fn drop(&mut self) {
        // A round that never ended (its task panicked) must not keep its batch's other rounds
        // waiting for the decode.
        if let Launched::Yes { run, .. } = std::mem::replace(&mut self.launched, Launched::No) {
            run.leave();
        }
    }
}

/// A device round's chunk with no device chains to take it (internal error).
fn no_chains() -> DataError {
    DataError::Device("no device chains".into())
}
