//! [`HostCopy`]: a device buffer's copy on the host, for the rounds of [`DeviceData`] whose
//! chunks go through the host.

use std::sync::{Arc, Mutex};

use pushpull_kernels::device::Device;

use super::DeviceData;
use crate::data::{ChunkAt, HostView, Ready, Settling};
use crate::error::{DataError, WorkerError};
use crate::tensor::{KeptCopy, TensorInner};

/// A device buffer's copy on the host, for a round whose chunks go through the host (a local
/// group's sum, a compressor without a kernel, a custom codec factory, a broadcast): the whole
/// buffer is copied in before the first chunk is read or written, and copied back when the
/// round ends if a chunk was written (the chunks not written go back as they came). Such a
/// round costs one copy each way, not one per chunk.
///
/// The copy is the device's page-locked staging (faster copies than pageable memory on a GPU,
/// as BytePS pins its host copies), kept in the tensor between rounds
/// (`Residence::host_copy`). Its copy in is started by
/// [`RoundData::ready`](crate::data::RoundData::ready) and waited for on the blocking pool, so
/// that a device still busy with the training's kernels holds up this round only, not a
/// runtime thread; its copy back is waited for the same way before the round completes, and
/// the memory then goes back to the tensor (through a [`CopySlot`]). A broadcast uses the
/// tensor's copy, or memory it does not keep. Where the device has no page-locked memory to
/// give, the copy is pageable memory: the same bits, slower copies, each waited for on the
/// round's thread (which the runtime then knows blocks: `waiting_for_device`).
pub(super) struct HostCopy<D: Device> {
    /// Host memory taken from the tensor when the round began, for the copy in.
    spare: Option<Held<D>>,
    /// The memory is not the tensor's to keep (a broadcast's).
    transient: bool,
    /// The copy in started by `ready`: its outcome lands here once waited for.
    coming: Option<Arc<Mutex<Option<CopyIn<D>>>>>,
    /// The buffer on the host once copied in, or why that failed (every chunk of the round
    /// then fails with it); `None` before.
    held: Option<CopyIn<D>>,
    /// A chunk was written since.
    written: bool,
    /// Chunks whose decode failed partway: they are copied in again before the copy goes
    /// back, so that a failed chunk keeps its input (as a device chain's chunk does).
    failed: Vec<usize>,
}

/// A copy in's outcome: the host memory holding the buffer, or why it does not.
type CopyIn<D> = Result<Held<D>, DataError>;

/// Where a tensor keeps its copy's host memory between rounds (`Residence::host_copy`): filled
/// once the round's copy back has been waited for, before the tensor's next round can begin.
type CopySlot<D> = Arc<Mutex<Option<Held<D>>>>;

/// The host memory of a [`HostCopy`].
enum Held<D: Device> {
    /// The device's page-locked staging, at least 8-byte aligned.
    Staging(D::Staging),
    /// Pageable memory, where the device had no staging to give.
    Pageable(Vec<f32>),
}

impl<D: Device> Held<D> {
    /// Host memory for `len` elements: the device's staging, or pageable memory if it has
    /// none to give (a warning the first time in the process, then a debug line per tensor;
    /// the tensor keeps what it got).
    fn new(device: &D, len: usize, name: &str) -> Held<D> {
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        match device.alloc_staging(4 * len) {
            Ok(staging) => Held::Staging(staging),
            Err(e) => {
                let place = device.place();
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        tensor = name,
                        "no page-locked host memory for a copy of the device buffer ({e}): \
                         its copies to and from {place} go through pageable memory (slower), \
                         as will those of other tensors that find none"
                    );
                } else {
                    tracing::debug!(tensor = name, "no page-locked host memory on {place}: {e}");
                }
                Held::Pageable(vec![0.0; len])
            }
        }
    }

    /// The first `len` elements.
    fn floats(&mut self, len: usize) -> Result<&mut [f32], DataError> {
        let short = || {
            DataError::Device("the host copy is shorter than the buffer (internal error)".into())
        };
        match self {
            Held::Staging(staging) => {
                as_f32(staging.as_mut().get_mut(..4 * len).ok_or_else(short)?)
            }
            Held::Pageable(v) => v.get_mut(..len).ok_or_else(short),
        }
    }

    /// Whether it holds `len` elements.
    fn fits(&self, len: usize) -> bool {
        match self {
            Held::Staging(staging) => staging.as_ref().len() >= 4 * len,
            Held::Pageable(v) => v.len() >= len,
        }
    }

    /// Page-locked bytes held.
    fn pinned_bytes(&self) -> u64 {
        match self {
            Held::Staging(staging) => staging.as_ref().len() as u64,
            Held::Pageable(_) => 0,
        }
    }
}

impl<D: Device> Default for HostCopy<D> {
    fn default() -> Self {
        HostCopy {
            spare: None,
            transient: false,
            coming: None,
            held: None,
            written: false,
            failed: Vec::new(),
        }
    }
}

/// `bytes` as f32 (staging is page-aligned on a GPU, heap memory on the emulated device).
fn as_f32(bytes: &mut [u8]) -> Result<&mut [f32], DataError> {
    // SAFETY: every bit pattern is a valid f32; `align_to_mut` only hands out aligned floats.
    let (head, floats, tail) = unsafe { bytes.align_to_mut::<f32>() };
    if head.is_empty() && tail.is_empty() {
        Ok(floats)
    } else {
        Err(DataError::Device(
            "the host staging is not 4-byte aligned".into(),
        ))
    }
}

/// Runs `f`, a copy that waits for the device, telling a multi-threaded runtime that this
/// thread blocks (`block_in_place`: its other tasks move to other threads), so that a busy
/// device holds up no other round; on any other thread `f` just runs.
fn waiting_for_device<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Waits for a started copy into `held`'s staging (at once for pageable memory).
fn copy_landed<D: Device>(device: &D, held: Held<D>) -> CopyIn<D> {
    match held {
        Held::Staging(mut staging) => {
            device.wait_staged(&mut staging).map_err(|e| {
                DataError::Device(format!("copying the buffer from {}: {e}", device.place()))
            })?;
            Ok(Held::Staging(staging))
        }
        pageable => Ok(pageable),
    }
}

impl<D: Device, K> DeviceData<D, K> {
    /// The round's chunks go through the host: takes the host memory for its copy from the
    /// tensor (if it was made for this device and fits), or makes it ([`Held::new`]); memory
    /// made for a broadcast is not kept (a broadcast usually runs once, and a tensor whose
    /// push_pulls compress on the device never uses a host copy again).
    pub(super) fn take_host_memory(&mut self, tensor: &TensorInner) {
        let place = self.device.place();
        let kept = tensor.residence().host_copy.take();
        let kept = kept
            .filter(|k| k.place == place)
            .and_then(|k| k.held.downcast::<CopySlot<D>>().ok())
            .and_then(|slot| slot.lock().unwrap_or_else(|p| p.into_inner()).take())
            .filter(|held| held.fits(self.len));
        self.copy.transient = kept.is_none() && self.broadcast;
        let memory = match kept {
            Some(held) => held,
            None => Held::new(&*self.device, self.len, &tensor.placement.name),
        };
        self.copy.spare = Some(memory);
    }

    /// Host memory for the buffer's copy: the spare taken from the tensor, or new.
    fn host_memory(&mut self, tensor: &TensorInner) -> Held<D> {
        match self.copy.spare.take() {
            Some(held) if held.fits(self.len) => held,
            _ => Held::new(&self.device, self.len, &tensor.placement.name),
        }
    }

    /// Copies the buffer into `held` and waits. A staging's copy is only started by
    /// [`DeviceData::start_copy_in`] and waited for by [`copy_landed`].
    fn copy_in_now(&self, held: Held<D>) -> CopyIn<D> {
        match held {
            Held::Pageable(mut v) => {
                // SAFETY: the buffer holds `len` f32 (checked against the tensor before the
                // round), alive while `keep` is; `v` at least as many.
                waiting_for_device(|| unsafe {
                    self.device.download(self.addr, &mut v[..self.len])
                })
                .map_err(|e| self.copy_error("from", e))?;
                Ok(Held::Pageable(v))
            }
            staging => {
                let started = self.start_copy_in(staging)?;
                waiting_for_device(|| copy_landed(&*self.device, started))
            }
        }
    }

    /// Starts copying the buffer into `held`'s staging (the copy runs in the device's stream
    /// order; nothing is read from the buffer after this returns).
    fn start_copy_in(&self, mut held: Held<D>) -> CopyIn<D> {
        if let Held::Staging(staging) = &mut held {
            // SAFETY: as in `copy_in_now`; the staging holds at least `4 * len` bytes
            // (`Held::fits`), untouched until the copy has been waited for.
            unsafe { self.device.stage(self.addr, staging, 0..4 * self.len) }
                .map_err(|e| self.copy_error("from", e))?;
        }
        Ok(held)
    }

    fn copy_error(&self, direction: &str, e: impl std::fmt::Display) -> DataError {
        let place = self.device.place();
        DataError::Device(format!("copying the buffer {direction} {place}: {e}"))
    }

    /// The buffer on the host ([`HostCopy`]): the copy `ready` started, or one made now.
    fn host_copy(&mut self, tensor: &TensorInner) -> Result<&mut [f32], DataError> {
        if self.copy.held.is_none() {
            let landed = self
                .copy
                .coming
                .take()
                .and_then(|slot| slot.lock().unwrap_or_else(|p| p.into_inner()).take());
            let held = match landed {
                Some(copied) => copied,
                // `ready` started no copy (or its future was dropped before the copy landed).
                None => {
                    let memory = self.host_memory(tensor);
                    self.copy_in_now(memory)
                }
            };
            self.copy.held = Some(held);
        }
        match self.copy.held.as_mut() {
            Some(Ok(held)) => held.floats(self.len),
            Some(Err(e)) => Err(e.clone()),
            None => Err(DataError::Device(
                "the host copy is missing (internal error)".into(),
            )),
        }
    }

    /// Copies the host copy back to the buffer if a chunk was written (the chunks whose decode
    /// failed first get their input back), and gives the host memory back to the tensor
    /// (unless it is a broadcast's own; memory whose copy in failed is dropped). A copy back
    /// from staging is only started here: the returned future waits for it on the blocking
    /// pool, then puts the memory in the tensor's slot.
    pub(super) fn write_back(
        &mut self,
        tensor: &TensorInner,
    ) -> Result<Option<Settling>, DataError> {
        let copy = std::mem::take(&mut self.copy);
        let landed = copy
            .coming
            .and_then(|slot| slot.lock().unwrap_or_else(|p| p.into_inner()).take());
        let mut held = match (copy.held.or(landed), copy.spare) {
            (Some(Ok(held)), _) => held,
            // Never copied into (no chunk was read or written): it goes back unused.
            (None, Some(spare)) => spare,
            _ => return Ok(None),
        };
        let mut started = false;
        if copy.written {
            let floats = held.floats(self.len)?;
            for &index in &copy.failed {
                let range = tensor.ranges[index].clone();
                let from = self.addr + 4 * range.start as u64;
                // SAFETY: the chunk lies within the buffer's `len` f32 (`tensor.ranges`), alive
                // while `keep` is; nothing has been copied back yet.
                waiting_for_device(|| unsafe { self.device.download(from, &mut floats[range]) })
                    .map_err(|e| self.copy_error("from", e))?;
            }
            match &mut held {
                // SAFETY: as in `copy_in_now`; the staging is not touched until the copy has
                // been waited for (below).
                Held::Staging(staging) => unsafe {
                    self.device
                        .upload_staged(staging, 0..4 * self.len, self.addr)
                },
                // SAFETY: as in `copy_in_now`.
                Held::Pageable(v) => {
                    waiting_for_device(|| unsafe { self.device.upload(&v[..self.len], self.addr) })
                }
            }
            .map_err(|e| self.copy_error("to", e))?;
            started = matches!(held, Held::Staging(_));
        }
        let slot: CopySlot<D> = Arc::default();
        if !copy.transient {
            tensor.residence().host_copy = Some(KeptCopy {
                bytes: held.pinned_bytes(),
                held: Box::new(slot.clone()),
                place: self.device.place(),
            });
        }
        if !started {
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(held);
            return Ok(None);
        }
        let (device, name) = (self.device.clone(), tensor.placement.name.clone());
        Ok(Some(Box::pin(async move {
            let waited = tokio::task::spawn_blocking(move || {
                let Held::Staging(mut staging) = held else {
                    return Ok(());
                };
                device
                    .wait_staged(&mut staging)
                    .map_err(|e| format!("copying the buffer to {}: {e}", device.place()))?;
                *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(Held::Staging(staging));
                Ok(())
            })
            .await
            .unwrap_or_else(|e| Err(format!("waiting for the copy to the device: {e}")));
            waited.map_err(|message| WorkerError::Device { name, message })
        })))
    }

    /// [`RoundData::ready`](crate::data::RoundData::ready) of a round whose chunks go through
    /// the host: starts the copy into staging and waits for it on the blocking pool (pageable
    /// memory is copied into at the first chunk).
    pub(super) fn start_host_copy(&mut self) -> Option<Ready> {
        if !matches!(self.copy.spare, Some(Held::Staging(_))) {
            return None;
        }
        let held = self.copy.spare.take()?;
        let started = self.start_copy_in(held);
        let slot = Arc::new(Mutex::new(None));
        self.copy.coming = Some(slot.clone());
        let device = self.device.clone();
        Some(Box::pin(async move {
            let landed = match started {
                Ok(held) => tokio::task::spawn_blocking(move || copy_landed(&*device, held))
                    .await
                    .unwrap_or_else(|e| {
                        Err(DataError::Device(format!(
                            "waiting for the copy to the host: {e}"
                        )))
                    }),
                Err(e) => Err(e),
            };
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(landed);
        }))
    }
}

impl<D: Device, K> HostView for DeviceData<D, K> {
    /// Chunk `at` of the buffer, read on the host ([`HostCopy`]).
    fn input(&mut self, at: &ChunkAt<'_>) -> Result<&[f32], DataError> {
        Ok(&self.host_copy(at.tensor)?[at.range()])
    }

    /// Chunk `at` of the buffer on the host, to be overwritten and copied back.
    fn output(&mut self, at: &ChunkAt<'_>) -> Result<&mut [f32], DataError> {
        self.copy.written = true;
        Ok(&mut self.host_copy(at.tensor)?[at.range()])
    }

    /// The chunk gets its input back before the copy goes back ([`HostCopy`]'s `failed`).
    fn output_failed(&mut self, at: &ChunkAt<'_>) {
        self.copy.failed.push(at.index);
    }
}
