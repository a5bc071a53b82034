//! [`CudaDevice`]: a [`GpuContext`] as a [`Device`] (feature `cuda`): tensors are
//! `CudaSlice<f32>` (or memory borrowed by address, e.g. torch's), every kernel and copy goes
//! to the context's one stream (build the context with [`GpuContext::with_stream`] on the
//! stream that produces the gradients, or order that stream before it: [`CudaDevice::stream`]),
//! and only compressed payloads cross to the host.
//!
//! A batch's round is a handful of driver calls whatever its size (see [`crate::device`]): the
//! table is copied from page-locked memory, each step is one launch of a `pp_t_*` kernel with
//! the chunk in `blockIdx.y` (tables of more than 65,535 chunks take one launch per 65,535),
//! the arena is copied into page-locked staging, and an event recorded after each copy is what
//! [`Device::wait_staged`] waits on. [`CudaDevice::driver_calls`] counts them the way the
//! [`crate::device::EmulatedDevice`] does.
//!
//! CI has no GPU: the ignored GPU tests (`tests/cuda_gpu.rs`, `tests/device_batch.rs`, the
//! worker's `tests/device.rs`) are run on a lent GPU machine (BENCHMARKS.md, "GPU").

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{self, CUevent_flags};
use cudarc::driver::{
    result, CudaEvent, CudaSlice, DevicePtr, LaunchConfig, PinnedHostSlice, PushKernelArg,
};

use super::codec::{driver, GpuContext, THREADS};
use super::{CudaError, Device as Place, Kernel};
use crate::device::table::{Launch, Step, ENTRY_BYTES};
use crate::device::{check_range, Device, Tickets};

/// Page-locked host memory (a batch's payloads, its table, a tensor's pulled payloads), and
/// the event recorded after the last copy into or out of it.
pub struct PinnedStaging {
    /// Owns the allocation (read through `ptr`); `None` once leaked ([`PinnedStaging::lost`]).
    mem: Option<PinnedHostSlice<u8>>,
    /// `mem`'s address, taken once at allocation (the slice's own accessors wait on an event
    /// of cudarc's that our copies do not record).
    ptr: *mut u8,
    /// Bytes asked for (`mem` holds at least one).
    len: usize,
    copied: CudaEvent,
    /// A copy into or out of `mem` was launched and not yet waited for.
    pending: bool,
    /// A copy was launched and nothing can tell when it ends (its event could not be recorded
    /// nor the stream waited for, or waiting for the event failed at drop): the memory is
    /// never freed.
    lost: bool,
}

// SAFETY: `ptr` points into `mem`, which is `Send + Sync`, and is only read through `&self` or
// written through `&mut self`.
unsafe impl Send for PinnedStaging {}
unsafe impl Sync for PinnedStaging {}

impl std::fmt::Debug for PinnedStaging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedStaging")
            .field("bytes", &self.len)
            .field("pending", &self.pending)
            .finish()
    }
}

impl AsRef<[u8]> for PinnedStaging {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` is the start of `mem`'s at least `len` bytes, alive as long as `self`.
        // Device copies write into them only between `stage` and `wait_staged`, both of which
        // take `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AsMut<[u8]> for PinnedStaging {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `as_ref`, and `&mut self` is held.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for PinnedStaging {
    fn drop(&mut self) {
        // Never free page-locked memory a copy is still using.
        if self.pending && self.copied.synchronize().is_err() {
            self.lost = true;
        }
        if self.lost {
            std::mem::forget(self.mem.take());
        }
    }
}

/// The word other streams wait on ([`Device::wait_ticket`]): page-locked host memory mapped
/// into the device, so that the device's stream writes it in stream order
/// (`cuStreamWriteValue32`) and the host can write it too, when that stream cannot. Never
/// freed (4 bytes a device): a stream may still wait on it, or the device's stream still
/// have a write to it queued, after the device is dropped.
#[derive(Debug)]
struct TicketWord {
    host: *mut u32,
    device: sys::CUdeviceptr,
}

// SAFETY: `host` is a page-locked allocation owned by the word, written only with volatile
// stores under the device's ticket lock, and never freed.
unsafe impl Send for TicketWord {}
unsafe impl Sync for TicketWord {}

impl TicketWord {
    /// A zeroed word on the current context.
    fn new() -> Result<TicketWord, CudaError> {
        let what = "allocating the page-locked word other streams wait on";
        let mut host = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: asks for 4 bytes into `host`.
        unsafe { sys::cuMemHostAlloc(&mut host, 4, flags) }
            .result()
            .map_err(driver(what))?;
        let host = host as *mut u32;
        // SAFETY: `host` addresses the 4 bytes just allocated.
        unsafe { host.write_volatile(0) };
        let mut device = 0;
        // SAFETY: `host` is a mapped page-locked allocation; flags must be 0.
        let mapped = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) }
            .result()
            .map_err(driver(what));
        if let Err(e) = mapped {
            // SAFETY: allocated above and not used since.
            unsafe { sys::cuMemFreeHost(host.cast()) };
            return Err(e);
        }
        Ok(TicketWord { host, device })
    }

    /// Writes `value` from the host.
    fn write(&self, value: u32) {
        // SAFETY: `host` addresses the word's 4 bytes, alive as long as `self`.
        unsafe { self.host.write_volatile(value) };
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}

/// A CUDA GPU as a [`Device`]: the kernels loaded on one context and stream.
#[derive(Debug, Clone)]
pub struct CudaDevice {
    gpu: Arc<GpuContext>,
    calls: Arc<AtomicU64>,
    /// The tickets of [`Device::wait_ticket`] (the lock orders the writes of the word).
    tickets: Arc<Mutex<Tickets>>,
    /// Allocated at the first ticket.
    word: Arc<OnceLock<TicketWord>>,
}

impl CudaDevice {
    /// The device of a loaded [`GpuContext`] (e.g. `GpuContext::with_stream` on the stream
    /// your framework computes gradients on).
    pub fn new(gpu: Arc<GpuContext>) -> CudaDevice {
        CudaDevice {
            gpu,
            calls: Arc::new(AtomicU64::new(0)),
            tickets: Arc::default(),
            word: Arc::default(),
        }
    }

    /// The context.
    pub fn gpu(&self) -> &Arc<GpuContext> {
        &self.gpu
    }

    /// The stream every copy and kernel goes to, as the driver's handle (`CUstream`): order
    /// other streams with it (e.g. `torch.cuda.ExternalStream(handle)`).
    pub fn stream(&self) -> u64 {
        self.gpu.stream().cu_stream() as u64
    }

    fn count(&self, calls: u64) {
        self.calls.fetch_add(calls, Ordering::Relaxed);
    }

    /// Makes the context current on this thread (driver calls below are raw).
    fn bind(&self) -> Result<(), CudaError> {
        self.gpu
            .context()
            .bind_to_thread()
            .map_err(driver("making the CUDA context current"))
    }

    fn cu_stream(&self) -> cudarc::driver::sys::CUstream {
        self.gpu.stream().cu_stream()
    }

    /// Runs `f` with the device's context current on this thread, then makes the thread's
    /// previous context current again: for calls from a thread that is not the worker's
    /// (Python's, whose current context is torch's current device). A panic of cudarc's (a
    /// driver without the symbol) becomes an error.
    fn on_borrowed_thread<R>(
        &self,
        what: &str,
        f: impl FnOnce() -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        let previous = result::ctx::get_current().map_err(driver("reading the current context"))?;
        self.bind()?;
        let out = super::no_panic(f).unwrap_or_else(|| Err(missing(what)));
        if let Some(ctx) = previous {
            // SAFETY: the context that was current on this thread a moment ago.
            unsafe { result::ctx::set_current(ctx) }
                .map_err(driver("restoring the thread's context"))?;
        }
        out
    }

    /// Records the staging's event after the copies just launched.
    /// If the event cannot be recorded, nothing would tell when those copies have run: the
    /// stream is waited for here instead, and if that fails too the staging's memory is never
    /// freed, so that no copy ever runs into freed memory.
    fn copied(&self, staging: &mut PinnedStaging) -> Result<(), CudaError> {
        self.count(1);
        if let Err(e) = staging.copied.record(self.gpu.stream()) {
            self.count(1);
            if self.gpu.stream().synchronize().is_err() {
                staging.lost = true;
            }
            return Err(driver("recording a staging event")(e));
        }
        staging.pending = true;
        Ok(())
    }
}

impl Device for CudaDevice {
    type Mem = CudaSlice<f32>;
    type Bytes = CudaSlice<u8>;
    type Staging = PinnedStaging;

    fn place(&self) -> Place {
        Place::Cuda {
            ordinal: self.gpu.context().ordinal(),
        }
    }

    fn alloc_zeros(&self, len: usize) -> Result<CudaSlice<f32>, CudaError> {
        self.count(1);
        // cuMemAlloc rejects 0 bytes.
        self.gpu
            .stream()
            .alloc_zeros::<f32>(len.max(1))
            .map_err(driver(&format!(
                "allocating {} bytes of device memory",
                4 * len.max(1)
            )))
    }

    fn mem_len(&self, mem: &CudaSlice<f32>) -> usize {
        mem.len()
    }

    fn mem_addr(&self, mem: &CudaSlice<f32>) -> u64 {
        // With cudarc's event tracking on, this records an event: callers take addresses once.
        let (p, _sync) = mem.device_ptr(self.gpu.stream());
        p
    }

    fn alloc_bytes(&self, bytes: usize) -> Result<CudaSlice<u8>, CudaError> {
        self.count(1);
        self.gpu
            .stream()
            .alloc_zeros::<u8>(bytes.max(8))
            .map_err(driver(&format!(
                "allocating {} bytes of device memory",
                bytes.max(8)
            )))
    }

    fn bytes_addr(&self, b: &CudaSlice<u8>) -> u64 {
        let (p, _sync) = b.device_ptr(self.gpu.stream());
        p
    }

    fn alloc_staging(&self, bytes: usize) -> Result<PinnedStaging, CudaError> {
        self.count(2);
        let ctx = self.gpu.context();
        let what = format!("allocating {bytes} bytes of page-locked host memory");
        // Default flags, not write-combined: the host reads this memory (write-combined
        // memory is fast to write from the host and very slow to read).
        // SAFETY: the contents are uninitialised bytes, zeroed below before anything reads
        // them.
        let mut mem =
            unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes.max(1), 0) }.map_err(driver(&what))?;
        let ptr = mem.as_mut_ptr().map_err(driver(&what))?;
        // SAFETY: `ptr` addresses the allocation's bytes.max(1) bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes.max(1)) };
        let copied = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(driver("creating a staging event"))?;
        Ok(PinnedStaging {
            mem: Some(mem),
            ptr,
            len: bytes,
            copied,
            pending: false,
            lost: false,
        })
    }

    unsafe fn download(&self, src: u64, dst: &mut [f32]) -> Result<(), CudaError> {
        if dst.is_empty() {
            return Ok(());
        }
        self.count(2);
        self.bind()?;
        // SAFETY: the caller vouches for `src`; the host side is `dst`.
        unsafe { result::memcpy_dtoh_async(dst, src, self.cu_stream()) }
            .map_err(driver("copying to the host"))?;
        self.gpu.synchronize()
    }

    unsafe fn upload(&self, src: &[f32], dst: u64) -> Result<(), CudaError> {
        if src.is_empty() {
            return Ok(());
        }
        self.count(2);
        self.bind()?;
        // SAFETY: the caller vouches for `dst`; the host side is `src`.
        unsafe { result::memcpy_htod_async(dst, src, self.cu_stream()) }
            .map_err(driver("copying to the device"))?;
        // The source is caller memory that may change once this returns.
        self.gpu.synchronize()
    }

    unsafe fn upload_staged(
        &self,
        staging: &mut PinnedStaging,
        range: Range<usize>,
        dst: u64,
    ) -> Result<(), CudaError> {
        check_range("upload_staged", &range, staging.len)?;
        if range.is_empty() {
            return Ok(());
        }
        self.count(1);
        self.bind()?;
        let src = &staging.as_ref()[range];
        // SAFETY: the caller vouches for `dst`; `src` is page-locked, so the copy runs in
        // stream order and the staging stays busy until `wait_staged`.
        unsafe { result::memcpy_htod_async(dst, src, self.cu_stream()) }
            .map_err(driver("copying staging to the device"))?;
        self.copied(staging)
    }

    unsafe fn stage(
        &self,
        src: u64,
        staging: &mut PinnedStaging,
        range: Range<usize>,
    ) -> Result<(), CudaError> {
        check_range("stage", &range, staging.len)?;
        if range.is_empty() {
            return Ok(());
        }
        self.count(1);
        self.bind()?;
        let dst = &mut staging.as_mut()[range];
        // SAFETY: the caller vouches for `src`; `dst` is page-locked, so this only launches
        // the copy, and nothing reads it before `wait_staged`.
        unsafe { result::memcpy_dtoh_async(dst, src, self.cu_stream()) }
            .map_err(driver("copying to staging"))?;
        self.copied(staging)
    }

    fn wait_staged(&self, staging: &mut PinnedStaging) -> Result<(), CudaError> {
        if staging.pending {
            self.count(1);
            staging
                .copied
                .synchronize()
                .map_err(driver("waiting for staging"))?;
            staging.pending = false;
        }
        Ok(())
    }

    unsafe fn launch(&self, launch: &Launch, table: u64, chunks: usize) -> Result<(), CudaError> {
        let func = self.gpu.func(Kernel::of_step(launch.step));
        let stream = self.gpu.stream();
        let blocks = launch.blocks.min(self.gpu.max_blocks() as u64).max(1) as u32;
        if launch.step == Step::Clear {
            // One thread per chunk, in x.
            let count = chunks as u64;
            let cfg = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            self.count(1);
            let mut b = stream.launch_builder(func);
            b.arg(&table).arg(&count);
            // SAFETY: `pp_t_clear(const PPChunk*, pp_u64)`; the caller vouches for the table.
            return unsafe { b.launch(cfg) }
                .map(|_| ())
                .map_err(driver(launch.step.kernel()));
        }
        for first in (0..chunks).step_by(MAX_GRID_Y) {
            let rows = (chunks - first).min(MAX_GRID_Y) as u32;
            let at = table + (first * ENTRY_BYTES) as u64;
            let cfg = LaunchConfig {
                grid_dim: (blocks, rows, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: launch.shared_bytes,
            };
            self.count(1);
            let mut b = stream.launch_builder(func);
            b.arg(&at);
            // SAFETY: every `pp_t_*` but `pp_t_clear` takes `(const PPChunk*)`; the caller
            // vouches for the table and the memory it addresses.
            unsafe { b.launch(cfg) }
                .map(|_| ())
                .map_err(driver(launch.step.kernel()))?;
        }
        Ok(())
    }

    fn ticket(&self) -> Result<u32, CudaError> {
        if self.word.get().is_none() {
            self.count(2);
            let word = self.on_borrowed_thread("allocating the ticket word", TicketWord::new)?;
            // Another thread may have set it meanwhile; then this one is left unused.
            let _ = self.word.set(word);
        }
        Ok(Tickets::locked(&self.tickets).issue())
    }

    unsafe fn wait_ticket(&self, stream: u64, ticket: u32) -> Result<(), CudaError> {
        let word = self.word.get().ok_or_else(|| {
            CudaError::Invalid(format!("wait_ticket({ticket}): no ticket was handed out"))
        })?;
        self.count(1);
        let what = "ordering a stream after the worker's (cuStreamWaitValue32)";
        let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        self.on_borrowed_thread(what, || {
            // SAFETY: the caller vouches for `stream`; `word.device` is the mapped word, never
            // freed.
            unsafe {
                sys::cuStreamWaitValue32_v2(stream as sys::CUstream, word.device, ticket, flags)
            }
            .result()
            .map_err(driver(what))
        })
    }

    fn signal(&self, ticket: u32) -> Result<(), CudaError> {
        let Some(word) = self.word.get() else {
            return Err(CudaError::Invalid(format!(
                "signal({ticket}): no ticket was handed out"
            )));
        };
        // Held while the write is queued, so that the word's writes are queued in order.
        let mut tickets = Tickets::locked(&self.tickets);
        let Some(value) = tickets.finish(ticket) else {
            return Ok(());
        };
        self.count(1);
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        let what = "releasing the streams ordered after the worker's (cuStreamWriteValue32)";
        let queued = self.bind().and_then(|()| {
            super::no_panic(|| {
                // SAFETY: the word is mapped page-locked memory, never freed; the default
                // flags put a memory barrier before the write, so the work queued before (the
                // decodes) is visible to whoever the word releases.
                unsafe { sys::cuStreamWriteValue32_v2(self.cu_stream(), word.device, value, flags) }
                    .result()
                    .map_err(driver(what))
            })
            .unwrap_or_else(|| Err(missing(what)))
        });
        if queued.is_err() {
            // No stream may wait forever. The work queued before may still be running: the
            // caller reports the error, and the streams it released run on what there is.
            word.write(value);
        }
        queued
    }

    fn driver_calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

/// The error for a driver call cudarc could not load.
fn missing(what: &str) -> CudaError {
    CudaError::Driver {
        what: what.to_string(),
        detail: "the CUDA driver does not have this call (older than CUDA 11.7?)".into(),
    }
}

/// The most chunks one launch takes (CUDA's limit on `gridDim.y`).
const MAX_GRID_Y: usize = 65_535;
