//! [`CudaDevice`]: a [`GpuContext`] as a [`Device`] (feature `cuda`): tensors are `CudaSlice<f32>`, every kernel
//! goes to the context's stream (build the context with [`GpuContext::with_stream`] on the
//! stream that produces the gradients, and compression is ordered after that work without any
//! extra synchronisation), and only compressed payloads cross to the host.
//!
//! Launch sequences: the codecs are those of [`GpuCodec`]; error feedback, momentum and the
//! average are one kernel each (`pp_ef_input`, `pp_ef_residual`, `pp_nesterov`,
//! `pp_momentum_update`, `pp_divide`), whose `bool` result is a device flag read back (which
//! waits for the stream). `host_shim.cpp` runs the same element loops for the
//! [`crate::device::EmulatedDevice`].
//!
//! Not done yet: payloads are copied into pageable host memory and each chunk waits for its
//! copy, so copies and kernels of consecutive chunks do not overlap (pinned staging buffers and
//! a second stream would); this path has not run on a GPU in this repository's CI.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};

use super::codec::{check_aligned, driver, GpuCodec, GpuContext, THREADS};
use super::{CudaError, Device as Place, GpuScheme, Kernel, RoundStreams};
use crate::device::{check_range, same_len, Device};

/// The kernels of one scheme for one chunk length, and the device buffer its payloads pass
/// through.
pub struct CudaChunkCodec {
    codec: GpuCodec,
    payload: CudaSlice<u8>,
}

impl std::fmt::Debug for CudaChunkCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.codec.fmt(f)
    }
}

/// A CUDA GPU as a [`Device`]: the kernels loaded on one context and stream.
#[derive(Debug, Clone)]
pub struct CudaDevice {
    gpu: Arc<GpuContext>,
}

impl CudaDevice {
    /// The device of a loaded [`GpuContext`] (e.g. `GpuContext::with_stream` on the stream
    /// your framework computes gradients on).
    pub fn new(gpu: Arc<GpuContext>) -> CudaDevice {
        CudaDevice { gpu }
    }

    /// The context.
    pub fn gpu(&self) -> &Arc<GpuContext> {
        &self.gpu
    }
}

impl GpuContext {
    fn flag(&self) -> Result<CudaSlice<u32>, CudaError> {
        self.stream()
            .alloc_zeros::<u32>(1)
            .map_err(driver("allocating a flag"))
    }

    /// Whether the flag is still 0 (waits for the stream).
    fn flag_clear(&self, flag: &CudaSlice<u32>) -> Result<bool, CudaError> {
        let v = self
            .stream()
            .clone_dtoh(flag)
            .map_err(driver("reading a flag"))?;
        self.synchronize()?;
        Ok(v.first() == Some(&0))
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

impl Device for CudaDevice {
    type Mem = CudaSlice<f32>;
    type Codec = CudaChunkCodec;

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
        Ok(CudaChunkCodec { codec, payload })
    }

    fn compress(
        &self,
        codec: &mut CudaChunkCodec,
        x: &CudaSlice<f32>,
        range: Range<usize>,
        streams: RoundStreams,
        out: &mut Vec<u8>,
    ) -> Result<(), CudaError> {
        check_range("compress", &range, x.len())?;
        let view = x.slice(range);
        if let Some(i) = codec.codec.find_non_finite(&view)? {
            return Err(CudaError::Invalid(format!(
                "input element {i} is not finite"
            )));
        }
        let len = codec.codec.compress(&view, streams, &mut codec.payload)?;
        out.clear();
        out.resize(len, 0);
        if len > 0 {
            self.gpu
                .stream()
                .memcpy_dtoh(&codec.payload.slice(0..len), out.as_mut_slice())
                .map_err(driver("copying the payload to the host"))?;
        }
        self.gpu.synchronize()
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
            self.gpu
                .stream()
                .memcpy_htod(payload, &mut codec.payload.slice_mut(0..payload.len()))
                .map_err(driver("copying the payload to the device"))?;
        }
        let p = codec.payload.slice(0..payload.len());
        let mut out = y.slice_mut(range);
        if add {
            codec.codec.decompress_add(&p, streams, &mut out)?;
        } else {
            codec.codec.decompress(&p, streams, &mut out)?;
        }
        // The payload buffer is reused by the next round: wait until it has been read.
        self.gpu.synchronize()
    }

    fn ef_input(
        &self,
        (g, range): (&CudaSlice<f32>, Range<usize>),
        e: &CudaSlice<f32>,
        factor: f32,
        vanilla: bool,
        p: &mut CudaSlice<f32>,
    ) -> Result<bool, CudaError> {
        check_range("ef_input", &range, g.len())?;
        holds("ef_input", range.len(), e.len().min(p.len()))?;
        let mut bad = self.gpu.flag()?;
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
        self.gpu.flag_clear(&bad)
    }

    fn ef_residual(&self, p: &CudaSlice<f32>, d: &mut CudaSlice<f32>) -> Result<bool, CudaError> {
        same_len("ef_residual", p.len(), d.len())?;
        let mut bad = self.gpu.flag()?;
        {
            let stream = self.gpu.stream();
            let (pp, _p) = p.device_ptr(stream);
            let (dp, _d) = d.device_ptr_mut(stream);
            let (bp, _b) = bad.device_ptr_mut(stream);
            let n = p.len() as u64;
            let cfg = self.gpu.config(n, THREADS as u64, 0);
            launch!(&self.gpu, Kernel::EfResidual, cfg, pp, dp, n, bp)?;
        }
        self.gpu.flag_clear(&bad)
    }

    fn nesterov(
        &self,
        (g, range): (&CudaSlice<f32>, Range<usize>),
        m: &CudaSlice<f32>,
        mu: f32,
        p: &mut CudaSlice<f32>,
    ) -> Result<bool, CudaError> {
        check_range("nesterov", &range, g.len())?;
        holds("nesterov", range.len(), m.len().min(p.len()))?;
        let mut bad = self.gpu.flag()?;
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
        self.gpu.flag_clear(&bad)
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
