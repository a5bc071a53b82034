//! [`CudaDevice`]: a [`GpuContext`] as a [`Device`] (feature `cuda`): tensors are `CudaSlice<f32>`, every kernel
//! goes to the context's stream (build the context with [`GpuContext::with_stream`] on the
//! stream that produces the gradients, and compression is ordered after that work without any
//! extra synchronisation), and only compressed payloads cross to the host.
//!
//! Launch sequences: the codecs are those of [`GpuCodec`]; error feedback, momentum and the
//! average are one kernel each (`pp_ef_input`, `pp_ef_residual`, `pp_nesterov`,
//! `pp_momentum_update`, `pp_divide`), whose verdict goes into the chunk's flags on the
//! device. `host_shim.cpp` runs the same element loops for the
//! [`crate::device::EmulatedDevice`].
//!
//! A compression only launches: the payload and the flags are copied asynchronously into
//! [`PinnedStaging`] (page-locked host memory, so the copy is a DMA the host does not wait
//! for), and an event recorded after the copies is what [`Device::wait_staged`] waits on. So
//! a worker launches every chunk of a tensor and then waits for each in turn, and the host
//! never drains the stream between chunks. The copies go to a second stream (a fork of the
//! context's), so a chunk's copy overlaps the next chunk's kernels: the copy stream waits for
//! the compute stream's work before each chunk's copies, and nothing on the compute stream
//! overwrites what a copy reads (the payload buffer, the flags, the tensor's range) before
//! the host has waited for that copy (the payload is pushed, and its result decoded, only
//! after); cudarc's per-slice events order the two streams as well. Pulled results travel
//! the other way through page-locked memory too ([`Device::decode`],
//! [`Device::upload_staged`]): copy and decode are only launched, ordered before the caller's
//! later work on the stream, and the host never waits for them.
//!
//! CI has no GPU: the ignored GPU tests (`tests/cuda_gpu.rs`, `tests/device_chain.rs`, the
//! worker's `tests/device.rs`) ran on an H100 and an H200 (BENCHMARKS.md, "Compression on a
//! GPU").

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, PinnedHostSlice, PushKernelArg,
};

use super::codec::{check_aligned, driver, GpuCodec, GpuContext, THREADS};
use super::{CudaError, Device as Place, GpuScheme, Kernel, RoundStreams};
use crate::device::{check_range, f32s_from_le, flag, flags_at, same_len, whole_f32s, Device};

/// Page-locked host memory for one chunk's payload and flags, and the event recorded after
/// the last copies into it.
pub struct PinnedStaging {
    mem: PinnedHostSlice<u8>,
    /// `mem`'s address, taken once at allocation (the slice's own accessors wait on an event
    /// of cudarc's that our copies do not record).
    ptr: *mut u8,
    copied: CudaEvent,
    /// Copies into `mem` were launched and not yet waited for.
    pending: bool,
}

// SAFETY: `ptr` points into `mem`, which is `Send + Sync`, and is only read through `&self` or
// written through `&mut self`.
unsafe impl Send for PinnedStaging {}
unsafe impl Sync for PinnedStaging {}

impl std::fmt::Debug for PinnedStaging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedStaging")
            .field("bytes", &self.mem.len())
            .field("pending", &self.pending)
            .finish()
    }
}

impl AsRef<[u8]> for PinnedStaging {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` is the start of `mem`'s `len` bytes, alive as long as `self`. Device
        // copies write into them only between `stage` and `wait_staged`, both of which take
        // `&mut self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.mem.len()) }
    }
}

impl Drop for PinnedStaging {
    fn drop(&mut self) {
        // Never free page-locked memory a copy is still writing into.
        if self.pending {
            let _ = self.copied.synchronize();
        }
    }
}

impl PinnedStaging {
    /// `len` bytes at `at`, for a device copy to write.
    fn region<T>(&mut self, at: usize, len: usize) -> Result<&mut [T], CudaError> {
        let bytes = len * std::mem::size_of::<T>();
        if at.checked_add(bytes).is_none_or(|end| end > self.mem.len())
            || at % std::mem::align_of::<T>() != 0
        {
            return Err(CudaError::Invalid(format!(
                "stage: {bytes} bytes at {at} into staging of {}",
                self.mem.len()
            )));
        }
        // SAFETY: in bounds and aligned (checked above; `mem` is page-aligned), and `&mut self`
        // is held.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at).cast::<T>(), len) })
    }
}

/// The kernels of one scheme for one chunk length, the device buffer its payloads pass
/// through, and the page-locked buffer pulled payloads are copied to the device from.
pub struct CudaChunkCodec {
    codec: GpuCodec,
    payload: CudaSlice<u8>,
    /// A pulled payload's way to the device: page-locked, so the copy is asynchronous; its
    /// event says when the copy has read it.
    upload: PinnedStaging,
}

impl std::fmt::Debug for CudaChunkCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.codec.fmt(f)
    }
}

/// A CUDA GPU as a [`Device`]: the kernels loaded on one context and stream, and a second
/// stream for the copies into staging.
#[derive(Debug, Clone)]
pub struct CudaDevice {
    gpu: Arc<GpuContext>,
    /// The copy stream, made at the first copy (`None` inside: none could be made, or the
    /// context's event tracking is off; copies then go to the compute stream).
    copies: Arc<OnceLock<Option<Arc<CudaStream>>>>,
}

impl CudaDevice {
    /// The device of a loaded [`GpuContext`] (e.g. `GpuContext::with_stream` on the stream
    /// your framework computes gradients on).
    pub fn new(gpu: Arc<GpuContext>) -> CudaDevice {
        CudaDevice {
            gpu,
            copies: Arc::new(OnceLock::new()),
        }
    }

    /// The stream copies into staging go to: a fork of the compute stream, so that a chunk's
    /// copy overlaps the next chunk's kernels. The order between the two streams is cudarc's
    /// event tracking (every `CudaSlice` use records an event that a use on another stream
    /// waits for: the copy waits for the kernels that wrote the payload, and the next write
    /// of the payload or the flags waits for the copy), so without it (the context's
    /// `disable_event_tracking`) everything stays on the compute stream.
    fn copy_stream(&self) -> &Arc<CudaStream> {
        let forked = self.copies.get_or_init(|| {
            if !self.gpu.context().is_event_tracking() {
                return None;
            }
            self.gpu.stream().fork().ok()
        });
        forked.as_ref().unwrap_or_else(|| self.gpu.stream())
    }

    /// The context.
    pub fn gpu(&self) -> &Arc<GpuContext> {
        &self.gpu
    }
}

/// Whether state memory of `len` elements holds a chunk of `n` (allocations are at least one
/// element long).
fn holds(what: &str, n: usize, len: usize) -> Result<(), CudaError> {
    if len >= n {
        Ok(())
    } else {
        Err(CudaError::Invalid(format!(
            "{what}: a buffer of {len} elements for a chunk of {n}"
        )))
    }
}

impl CudaDevice {
    /// Launches copying `src` into `staging` at `at` (no wait).
    fn copy_out<T: cudarc::driver::DeviceRepr, S: DevicePtr<T>>(
        &self,
        src: &S,
        staging: &mut PinnedStaging,
        at: usize,
    ) -> Result<(), CudaError> {
        if src.len() == 0 {
            return Ok(());
        }
        let dst = staging.region::<T>(at, src.len())?;
        // A `[T]` destination: cudarc issues cuMemcpyDtoHAsync and does not synchronise; the
        // memory is page-locked, so the copy is asynchronous, and `wait_staged` waits for it.
        self.copy_stream()
            .memcpy_dtoh(src, dst)
            .map_err(driver("copying to staging"))
    }

    /// Makes the copy stream wait for everything launched on the compute stream so far (the
    /// kernels that wrote what is about to be copied), whether or not cudarc tracks the
    /// slices involved (a tensor handed in from elsewhere may not be).
    fn copies_follow(&self) -> Result<(), CudaError> {
        let copies = self.copy_stream();
        if Arc::ptr_eq(copies, self.gpu.stream()) {
            return Ok(());
        }
        copies
            .join(self.gpu.stream())
            .map_err(driver("ordering the copy stream"))
    }

    /// Records the staging's event after the copies just launched.
    fn copied(&self, staging: &mut PinnedStaging) -> Result<(), CudaError> {
        staging
            .copied
            .record(self.copy_stream())
            .map_err(driver("recording a staging event"))?;
        staging.pending = true;
        Ok(())
    }
}

impl Device for CudaDevice {
    type Mem = CudaSlice<f32>;
    type Codec = CudaChunkCodec;
    type Flags = CudaSlice<u32>;
    type Staging = PinnedStaging;

    fn place(&self) -> Place {
        Place::Cuda {
            ordinal: self.gpu.context().ordinal(),
        }
    }

    fn alloc_zeros(&self, len: usize) -> Result<CudaSlice<f32>, CudaError> {
        // cuMemAlloc rejects 0 bytes.
        self.gpu
            .stream()
            .alloc_zeros::<f32>(len.max(1))
            .map_err(driver("allocating device memory"))
    }

    fn mem_len(&self, mem: &CudaSlice<f32>) -> usize {
        mem.len()
    }

    fn upload(&self, src: &[f32], dst: &mut CudaSlice<f32>, at: usize) -> Result<(), CudaError> {
        let range = at..at.saturating_add(src.len());
        check_range("upload", &range, dst.len())?;
        if src.is_empty() {
            return Ok(());
        }
        self.gpu
            .stream()
            .memcpy_htod(src, &mut dst.slice_mut(range))
            .map_err(driver("copying to the device"))?;
        // The source is caller memory that may change once this returns.
        self.gpu.synchronize()
    }

    fn download(
        &self,
        src: &CudaSlice<f32>,
        range: Range<usize>,
        dst: &mut [f32],
    ) -> Result<(), CudaError> {
        check_range("download", &range, src.len())?;
        same_len("download", range.len(), dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        self.gpu
            .stream()
            .memcpy_dtoh(&src.slice(range), dst)
            .map_err(driver("copying to the host"))?;
        self.gpu.synchronize()
    }

    fn codec(&self, scheme: GpuScheme, len: usize) -> Result<CudaChunkCodec, CudaError> {
        let codec = GpuCodec::new(self.gpu.clone(), scheme, len)?;
        let payload = self
            .gpu
            .stream()
            .alloc_zeros::<u8>(codec.compressed_len().max(4))
            .map_err(driver("allocating a payload buffer"))?;
        let upload = self.alloc_staging(codec.compressed_len())?;
        Ok(CudaChunkCodec {
            codec,
            payload,
            upload,
        })
    }

    fn copy(&self, src: &CudaSlice<f32>, dst: &mut CudaSlice<f32>) -> Result<(), CudaError> {
        same_len("copy", src.len(), dst.len())?;
        self.gpu
            .stream()
            .memcpy_dtod(src, dst)
            .map_err(driver("copying on the device"))
    }

    fn alloc_flags(&self) -> Result<CudaSlice<u32>, CudaError> {
        let mut flags = self
            .gpu
            .stream()
            .alloc_zeros::<u32>(flag::WORDS)
            .map_err(driver("allocating flags"))?;
        self.clear_flags(&mut flags)?;
        Ok(flags)
    }

    fn clear_flags(&self, flags: &mut CudaSlice<u32>) -> Result<(), CudaError> {
        if flags.len() != flag::WORDS {
            return Err(CudaError::Invalid(format!(
                "flags of {} words, expected {}",
                flags.len(),
                flag::WORDS
            )));
        }
        self.gpu
            .stream()
            .memset_zeros(flags)
            .map_err(driver("clearing flags"))?;
        let mut first = flags.slice_mut(flag::FIRST_BAD..flag::FIRST_BAD + 2);
        self.gpu.fill_u32(&mut first, u32::MAX)
    }

    fn alloc_staging(&self, bytes: usize) -> Result<PinnedStaging, CudaError> {
        let ctx = self.gpu.context();
        // Default flags, not write-combined: the host reads this memory (write-combined
        // memory is fast to write from the host and very slow to read).
        // SAFETY: the contents are uninitialised bytes; nothing reads them before a copy
        // has written them (`wait_staged`) except as plain bytes.
        let mut mem = unsafe { ctx.alloc_pinned_with_flags::<u8>(bytes.max(1), 0) }
            .map_err(driver("allocating page-locked staging"))?;
        let ptr = mem
            .as_mut_ptr()
            .map_err(driver("allocating page-locked staging"))?;
        let copied = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))
            .map_err(driver("creating a staging event"))?;
        Ok(PinnedStaging {
            mem,
            ptr,
            copied,
            pending: false,
        })
    }

    fn compress(
        &self,
        codec: &mut CudaChunkCodec,
        x: &CudaSlice<f32>,
        range: Range<usize>,
        streams: RoundStreams,
        flags: &mut CudaSlice<u32>,
    ) -> Result<usize, CudaError> {
        check_range("compress", &range, x.len())?;
        let view = x.slice(range);
        let mut first = flags.slice_mut(flag::FIRST_BAD..flag::FIRST_BAD + 2);
        codec.codec.flag_non_finite(&view, &mut first)?;
        codec.codec.compress(&view, streams, &mut codec.payload)
    }

    fn decode_own(
        &self,
        codec: &mut CudaChunkCodec,
        streams: RoundStreams,
        y: &mut CudaSlice<f32>,
        range: Range<usize>,
    ) -> Result<(), CudaError> {
        check_range("decode_own", &range, y.len())?;
        let len = codec.codec.compressed_len();
        let p = codec.payload.slice(0..len);
        let mut out = y.slice_mut(range);
        codec.codec.decompress(&p, streams, &mut out)
    }

    fn stage(
        &self,
        codec: &CudaChunkCodec,
        len: usize,
        flags: &CudaSlice<u32>,
        staging: &mut PinnedStaging,
    ) -> Result<(), CudaError> {
        if len > codec.payload.len() {
            return Err(CudaError::Invalid(format!(
                "stage: {len} bytes of a payload buffer of {}",
                codec.payload.len()
            )));
        }
        self.copies_follow()?;
        self.copy_out(&codec.payload.slice(0..len), staging, 0)?;
        self.copy_out(flags, staging, flags_at(len))?;
        self.copied(staging)
    }

    fn stage_raw(
        &self,
        src: &CudaSlice<f32>,
        range: Range<usize>,
        flags: &mut CudaSlice<u32>,
        staging: &mut PinnedStaging,
    ) -> Result<(), CudaError> {
        check_range("stage_raw", &range, src.len())?;
        let len = 4 * range.len();
        let view = src.slice(range);
        if !view.is_empty() {
            let (x, _x_guard) = view.device_ptr(self.gpu.stream());
            check_aligned(x, "the input")?;
            let n = view.len() as u64;
            let mut first = flags.slice_mut(flag::FIRST_BAD..flag::FIRST_BAD + 2);
            let (fp, _f_guard) = first.device_ptr_mut(self.gpu.stream());
            let cfg = self.gpu.config(n, THREADS as u64, 0);
            launch!(&self.gpu, Kernel::FirstNonfinite, cfg, x, n, fp)?;
        }
        // f32 on the device and the host is little-endian: the bytes are the raw fp32 payload.
        self.copies_follow()?;
        self.copy_out(&view, staging, 0)?;
        self.copy_out(flags, staging, flags_at(len))?;
        self.copied(staging)
    }

    fn wait_staged(&self, staging: &mut PinnedStaging) -> Result<(), CudaError> {
        if staging.pending {
            staging
                .copied
                .synchronize()
                .map_err(driver("waiting for staging"))?;
            staging.pending = false;
        }
        Ok(())
    }

    fn upload_staged(
        &self,
        bytes: &[u8],
        staging: &mut PinnedStaging,
        dst: &mut CudaSlice<f32>,
        at: usize,
    ) -> Result<(), CudaError> {
        let n = whole_f32s("upload_staged", bytes)?;
        let range = at..at.saturating_add(n);
        check_range("upload_staged", &range, dst.len())?;
        if n == 0 {
            return Ok(());
        }
        self.wait_staged(staging)?;
        let host = staging.region::<f32>(0, n)?;
        f32s_from_le(bytes, host);
        self.gpu
            .stream()
            .memcpy_htod(&*host, &mut dst.slice_mut(range))
            .map_err(driver("copying to the device"))?;
        staging
            .copied
            .record(self.gpu.stream())
            .map_err(driver("recording an upload event"))?;
        staging.pending = true;
        Ok(())
    }

    fn decode(
        &self,
        codec: &mut CudaChunkCodec,
        payload: &[u8],
        streams: RoundStreams,
        y: &mut CudaSlice<f32>,
        range: Range<usize>,
        add: bool,
    ) -> Result<(), CudaError> {
        check_range("decode", &range, y.len())?;
        let want = codec.codec.compressed_len();
        if payload.len() != want {
            return Err(CudaError::Invalid(format!(
                "payload of {} bytes, expected {want}",
                payload.len()
            )));
        }
        if !payload.is_empty() {
            // Through page-locked memory, so neither the copy nor the decode makes the host
            // wait: the caller's next use of `y` on this stream comes after them. The upload
            // buffer's previous copy (a round ago) is waited for before it is overwritten.
            let up = &mut codec.upload;
            self.wait_staged(up)?;
            let host = up.region::<u8>(0, payload.len())?;
            host.copy_from_slice(payload);
            self.gpu
                .stream()
                .memcpy_htod(&*host, &mut codec.payload.slice_mut(0..payload.len()))
                .map_err(driver("copying the payload to the device"))?;
            up.copied
                .record(self.gpu.stream())
                .map_err(driver("recording an upload event"))?;
            up.pending = true;
        }
        let p = codec.payload.slice(0..payload.len());
        let mut out = y.slice_mut(range);
        if add {
            codec.codec.decompress_add(&p, streams, &mut out)
        } else {
            codec.codec.decompress(&p, streams, &mut out)
        }
    }

    fn ef_input(
        &self,
        (g, range): (&CudaSlice<f32>, Range<usize>),
        e: &CudaSlice<f32>,
        factor: f32,
        vanilla: bool,
        p: &mut CudaSlice<f32>,
        flags: &mut CudaSlice<u32>,
    ) -> Result<(), CudaError> {
        check_range("ef_input", &range, g.len())?;
        holds("ef_input", range.len(), e.len().min(p.len()))?;
        let mut bad = flags.slice_mut(flag::EF_INPUT..flag::EF_INPUT + 1);
        {
            let stream = self.gpu.stream();
            let gv = g.slice(range.clone());
            let (gp, _g) = gv.device_ptr(stream);
            let (ep, _e) = e.device_ptr(stream);
            let (pp, _p) = p.device_ptr_mut(stream);
            let (bp, _b) = bad.device_ptr_mut(stream);
            check_aligned(gp, "the gradient")?;
            let n = range.len() as u64;
            let vanilla = u32::from(vanilla);
            let cfg = self.gpu.config(n, THREADS as u64, 0);
            launch!(
                &self.gpu,
                Kernel::EfInput,
                cfg,
                gp,
                ep,
                n,
                factor,
                vanilla,
                pp,
                bp
            )?;
        }
        Ok(())
    }

    fn ef_residual(
        &self,
        p: &CudaSlice<f32>,
        d: &mut CudaSlice<f32>,
        flags: &mut CudaSlice<u32>,
    ) -> Result<(), CudaError> {
        same_len("ef_residual", p.len(), d.len())?;
        let mut bad = flags.slice_mut(flag::EF_RESIDUAL..flag::EF_RESIDUAL + 1);
        {
            let stream = self.gpu.stream();
            let (pp, _p) = p.device_ptr(stream);
            let (dp, _d) = d.device_ptr_mut(stream);
            let (bp, _b) = bad.device_ptr_mut(stream);
            let n = p.len() as u64;
            let cfg = self.gpu.config(n, THREADS as u64, 0);
            launch!(&self.gpu, Kernel::EfResidual, cfg, pp, dp, n, bp)?;
        }
        Ok(())
    }

    fn nesterov(
        &self,
        (g, range): (&CudaSlice<f32>, Range<usize>),
        m: &CudaSlice<f32>,
        mu: f32,
        p: &mut CudaSlice<f32>,
        flags: &mut CudaSlice<u32>,
    ) -> Result<(), CudaError> {
        check_range("nesterov", &range, g.len())?;
        holds("nesterov", range.len(), m.len().min(p.len()))?;
        let mut bad = flags.slice_mut(flag::NESTEROV..flag::NESTEROV + 1);
        {
            let stream = self.gpu.stream();
            let gv = g.slice(range.clone());
            let (gp, _g) = gv.device_ptr(stream);
            let (mp, _m) = m.device_ptr(stream);
            let (pp, _p) = p.device_ptr_mut(stream);
            let (bp, _b) = bad.device_ptr_mut(stream);
            check_aligned(gp, "the gradient")?;
            let n = range.len() as u64;
            let cfg = self.gpu.config(n, THREADS as u64, 0);
            launch!(&self.gpu, Kernel::Nesterov, cfg, gp, mp, n, mu, pp, bp)?;
        }
        Ok(())
    }

    fn momentum_update(
        &self,
        (g, range): (&CudaSlice<f32>, Range<usize>),
        m: &mut CudaSlice<f32>,
        mu: f32,
    ) -> Result<(), CudaError> {
        check_range("momentum_update", &range, g.len())?;
        holds("momentum_update", range.len(), m.len())?;
        let stream = self.gpu.stream();
        let gv = g.slice(range.clone());
        let (gp, _g) = gv.device_ptr(stream);
        let (mp, _m) = m.device_ptr_mut(stream);
        check_aligned(gp, "the gradient")?;
        let n = range.len() as u64;
        let cfg = self.gpu.config(n, THREADS as u64, 0);
        launch!(&self.gpu, Kernel::MomentumUpdate, cfg, gp, mp, n, mu)
    }

    fn divide(&self, y: &mut CudaSlice<f32>, range: Range<usize>, w: f32) -> Result<(), CudaError> {
        check_range("divide", &range, y.len())?;
        let stream = self.gpu.stream();
        let n = range.len() as u64;
        let mut view = y.slice_mut(range);
        let (yp, _y) = view.device_ptr_mut(stream);
        check_aligned(yp, "the output")?;
        let cfg = self.gpu.config(n, THREADS as u64, 0);
        launch!(&self.gpu, Kernel::Divide, cfg, yp, n, w)
    }
}
