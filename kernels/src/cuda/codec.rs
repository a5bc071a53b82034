//! The CUDA compressors on device buffers (feature `cuda`).
//!
//! [`GpuContext`] loads the kernels (the shipped PTX, or NVRTC's: see `ptx.rs`) on a
//! `CudaContext` and keeps the stream every launch goes to. [`GpuCodec`] runs one
//! [`GpuScheme`] for chunks of one length: `compress`, `decompress` and `decompress_add` take
//! cudarc buffers (`CudaSlice`, `CudaView`, `CudaViewMut`) and only *enqueue* work on the
//! context's stream; synchronise the stream (or copy back with cudarc, which does) before reading
//! results on the host. The `*_host` variants copy host slices in and out and wait, for tests and
//! callers whose tensors live in host memory.
//!
//! Launch sequences (each step one kernel, all on one stream):
//! * fp16/bf16: cast;
//! * onebit: `pp_onebit_compress` (the sign words and the |x| block partials in one pass), then
//!   `pp_finalize_sums(mean)` (or `pp_fill_u32(1.0)` without scaling) into the header;
//! * minmax: `pp_span_minmax` + `pp_finalize_minmax` into the header, then `pp_minmax_compress`;
//! * dithering: the norms (`pp_block_sums(x²)` + `pp_finalize_sums(sqrt)`, or `pp_span_minmax`
//!   + `pp_finalize_minmax` for max |x|), then `pp_dither_compress`;
//! * random-k: `pp_randomk_compress`; its decompress zero-fills first (`pp_fill_u32`).
//!
//! `host_shim.cpp` emulates exactly these sequences; `tests/cuda_host_kernels.rs` checks the emulation
//! against the CPU compressors and `tests/cuda_gpu.rs` checks this code on a GPU.

use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    DriverError, LaunchConfig, PushKernelArg,
};

use super::scheme::{
    num_buckets, num_pieces, pack_tile_capacity, GpuScheme, RoundStreams, GROUP, PACK_WORDS,
    REDUCE_BLOCK, SPAN,
};
use super::{gpu_unusable_reason, no_panic, CudaError, Kernel, ENTRY_POINTS};

/// Threads per block of every launch (the reductions and pack kernels require exactly this).
pub(super) const THREADS: u32 = 256;

pub(super) fn driver(what: &str) -> impl FnOnce(DriverError) -> CudaError + '_ {
    move |e| CudaError::Driver {
        what: what.to_string(),
        detail: e.to_string(),
    }
}

/// The kernels loaded on one CUDA context, and the stream they run on.
pub struct GpuContext {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    funcs: Vec<CudaFunction>,
    max_blocks: u32,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("ordinal", &self.ctx.ordinal())
            .field("max_blocks", &self.max_blocks)
            .finish()
    }
}

impl GpuContext {
    /// Opens device `ordinal` (its primary context and a new stream) and loads the kernels.
    /// Fails with [`CudaError::NoGpu`] when there is no usable GPU (never panics).
    pub fn new(ordinal: usize) -> Result<Arc<GpuContext>, CudaError> {
        if let Some(reason) = gpu_unusable_reason() {
            return Err(CudaError::NoGpu(reason));
        }
        let ctx = no_panic(|| CudaContext::new(ordinal))
            .ok_or_else(|| CudaError::NoGpu("cudarc panicked opening the device".into()))?
            .map_err(driver("opening the CUDA device"))?;
        let stream = ctx.new_stream().map_err(driver("creating a stream"))?;
        GpuContext::with_stream(stream)
    }

    /// Loads the kernels on the context of `stream` and launches everything on `stream` (use
    /// the stream your tensors are produced on to avoid extra synchronisation).
    pub fn with_stream(stream: Arc<CudaStream>) -> Result<Arc<GpuContext>, CudaError> {
        let ctx = stream.context().clone();
        let module =
            super::ptx::load_kernels(|ptx| ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)))?;
        let funcs = ENTRY_POINTS
            .iter()
            .map(|name| module.load_function(name).map_err(driver(name)))
            .collect::<Result<Vec<_>, _>>()?;
        let sms = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("querying the multiprocessor count"))?;
        Ok(Arc::new(GpuContext {
            ctx,
            stream,
            _module: module,
            funcs,
            max_blocks: (sms.max(1) as u32).saturating_mul(16),
        }))
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every kernel is launched on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits until everything launched so far has finished.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(driver("synchronising the stream"))
    }

    pub(super) fn func(&self, k: Kernel) -> &CudaFunction {
        &self.funcs[k as usize]
    }

    /// The most blocks a launch's x-dimension gets (16 per multiprocessor; the kernels loop
    /// grid-stride).
    pub(super) fn max_blocks(&self) -> u32 {
        self.max_blocks
    }

    /// A launch of 256-thread blocks covering `units` work units of `per_block` each (capped;
    /// every kernel loops grid-stride), or `None` when there is no work.
    pub(super) fn config(
        &self,
        units: u64,
        per_block: u64,
        shared_bytes: u32,
    ) -> Option<LaunchConfig> {
        if units == 0 {
            return None;
        }
        let blocks = units.div_ceil(per_block).min(self.max_blocks as u64) as u32;
        Some(LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: shared_bytes,
        })
    }
}

/// Launches kernel `$k` with config `$cfg` (skipped when `None`). Arguments must be local
/// variables (the launch keeps pointers to them until it is enqueued), of exactly the kernel's
/// parameter types: u64 for `pp_u64` and device pointers, u32 for `pp_u32`, f32 for `float`.
macro_rules! launch {
    ($gpu:expr, $k:expr, $cfg:expr, $($arg:ident),+ $(,)?) => {{
        match $cfg {
            None => Ok(()),
            Some(cfg) => {
                let gpu: &GpuContext = $gpu;
                let mut b = gpu.stream().launch_builder(gpu.func($k));
                $( b.arg(&$arg); )+
                // SAFETY: the arguments match the kernel's signature in pushpull_kernels.cu
                // (checked by the GPU tests), device pointers point into live buffers whose
                // lengths the caller checked, and the kernels stay inside the sizes they are
                // given.
                unsafe { b.launch(cfg) }
                    .map(|_| ())
                    .map_err(driver($k.name()))
            }
        }
    }};
}

impl GpuContext {
    /// Launches setting every word of `dst` to `value`.
    pub(crate) fn fill_u32<D: DevicePtrMut<u32>>(
        &self,
        dst: &mut D,
        value: u32,
    ) -> Result<(), CudaError> {
        let count = dst.len() as u64;
        let (o, _o_guard) = dst.device_ptr_mut(&self.stream);
        launch!(
            self,
            Kernel::FillU32,
            self.config(count, THREADS as u64, 0),
            o,
            count,
            value
        )
    }
}

/// One [`GpuScheme`] for chunks of one length, with its scratch buffers.
pub struct GpuCodec {
    gpu: Arc<GpuContext>,
    scheme: GpuScheme,
    len: usize,
    bucket: u64,
    block_partials: CudaSlice<f64>,
    span_partials: CudaSlice<f32>,
}

impl std::fmt::Debug for GpuCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuCodec")
            .field("scheme", &self.scheme)
            .field("len", &self.len)
            .finish()
    }
}

pub(super) fn check_aligned(ptr: u64, what: &str) -> Result<(), CudaError> {
    if ptr & 3 == 0 {
        Ok(())
    } else {
        Err(CudaError::Invalid(format!(
            "{what} must start at a 4-byte aligned device address"
        )))
    }
}

impl GpuCodec {
    /// A codec for chunks of `len` elements. Validates the scheme and allocates the reduction
    /// scratch on the context's stream.
    pub fn new(gpu: Arc<GpuContext>, scheme: GpuScheme, len: usize) -> Result<GpuCodec, CudaError> {
        scheme.validate(len)?;
        let n = len as u64;
        let bucket = scheme.bucket_len(len) as u64;
        let blocks = num_pieces(n, bucket, REDUCE_BLOCK).max(1) as usize;
        let spans = num_pieces(n, bucket, SPAN).max(1) as usize;
        let block_partials = gpu
            .stream
            .alloc_zeros::<f64>(blocks)
            .map_err(driver("allocating reduction scratch"))?;
        let span_partials = gpu
            .stream
            .alloc_zeros::<f32>(2 * spans)
            .map_err(driver("allocating reduction scratch"))?;
        Ok(GpuCodec {
            gpu,
            scheme,
            len,
            bucket,
            block_partials,
            span_partials,
        })
    }

    /// The scheme.
    pub fn scheme(&self) -> &GpuScheme {
        &self.scheme
    }

    /// The chunk length (elements).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether chunks are empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Payload bytes of one compressed chunk.
    pub fn compressed_len(&self) -> usize {
        self.scheme.compressed_len(self.len)
    }

    /// The context the codec launches on.
    pub fn gpu(&self) -> &Arc<GpuContext> {
        &self.gpu
    }

    /// Enqueues the compression of `input` (exactly `len` f32) into the first
    /// [`Self::compressed_len`] bytes of `out`; returns that length. `streams` gives the rounding
    /// noise (minmax, dithering) and random-k's indices.
    pub fn compress<I, O>(
        &mut self,
        input: &I,
        streams: RoundStreams,
        out: &mut O,
    ) -> Result<usize, CudaError>
    where
        I: DevicePtr<f32>,
        O: DevicePtrMut<u8>,
    {
        let need = self.compressed_len();
        if input.len() != self.len {
            return Err(CudaError::Invalid(format!(
                "input has {} elements, the codec was built for {}",
                input.len(),
                self.len
            )));
        }
        if out.len() < need {
            return Err(CudaError::Invalid(format!(
                "output buffer of {} bytes, {need} needed",
                out.len()
            )));
        }
        let gpu = self.gpu.clone();
        let g: &GpuContext = &gpu;
        let stream = &g.stream;
        let (x, _x_guard) = input.device_ptr(stream);
        let (o, _o_guard) = out.device_ptr_mut(stream);
        check_aligned(x, "the input")?;
        check_aligned(o, "the output")?;
        let (bp, _bp_guard) = self.block_partials.device_ptr_mut(stream);
        let (sp, _sp_guard) = self.span_partials.device_ptr_mut(stream);

        let n = self.len as u64;
        let bucket = self.bucket;
        let nb = num_buckets(self.len, bucket as usize) as u64;
        let elems = g.config(n, THREADS as u64, 0);
        // The finalize kernels: a block per bucket (narrow ones use a thread per bucket).
        let per_bucket = g.config(nb, 1, 0);
        // A warp per reduction block or span.
        let warps = (THREADS / 32) as u64;
        let block_cfg = g.config(num_pieces(n, bucket, REDUCE_BLOCK), warps, 0);
        let span_cfg = g.config(num_pieces(n, bucket, SPAN), warps, 0);
        let pack_cfg = |w: u32| {
            let words = (n * w as u64).div_ceil(32);
            g.config(words, PACK_WORDS, 4 * pack_tile_capacity(w) as u32)
        };
        let stream_base = streams.rounding.base();

        match self.scheme {
            GpuScheme::Fp16 => launch!(g, Kernel::Fp16Compress, elems, x, n, o)?,
            GpuScheme::Bf16 => launch!(g, Kernel::Bf16Compress, elems, x, n, o)?,
            GpuScheme::OneBit { scaling } => {
                // The signs and the |x| block partials in one pass, then the scale header.
                let words = o + 4;
                launch!(g, Kernel::OnebitCompress, block_cfg, x, n, words, bp)?;
                if scaling && n > 0 {
                    let (mode, whole) = (0u32, n);
                    let one_bucket = g.config(1, 1, 0);
                    launch!(g, Kernel::FinalizeSums, one_bucket, bp, n, whole, mode, o)?;
                } else {
                    // mean |x| of an empty chunk is 0 (elem::mean_abs); no scaling is 1.0.
                    let (count, value) = (1u64, if scaling { 0f32 } else { 1f32 }.to_bits());
                    launch!(g, Kernel::FillU32, g.config(1, 1, 0), o, count, value)?;
                }
            }
            GpuScheme::MinMax { bits, .. } => {
                let mode = 0u32;
                launch!(g, Kernel::SpanMinmax, span_cfg, x, n, bucket, mode, sp)?;
                launch!(
                    g,
                    Kernel::FinalizeMinmax,
                    per_bucket,
                    sp,
                    n,
                    bucket,
                    mode,
                    o
                )?;
                launch!(
                    g,
                    Kernel::MinmaxCompress,
                    pack_cfg(bits),
                    x,
                    n,
                    bucket,
                    bits,
                    stream_base,
                    o
                )?;
            }
            GpuScheme::Dithering {
                levels,
                natural,
                l2,
                ..
            } => {
                if l2 {
                    let (op, mode) = (1u32, 1u32);
                    launch!(g, Kernel::BlockSums, block_cfg, x, n, bucket, op, bp)?;
                    launch!(g, Kernel::FinalizeSums, per_bucket, bp, n, bucket, mode, o)?;
                } else {
                    let mode = 1u32;
                    launch!(g, Kernel::SpanMinmax, span_cfg, x, n, bucket, mode, sp)?;
                    launch!(
                        g,
                        Kernel::FinalizeMinmax,
                        per_bucket,
                        sp,
                        n,
                        bucket,
                        mode,
                        o
                    )?;
                }
                let w = self.scheme.code_bits().unwrap_or(1);
                let natural = natural as u32;
                launch!(
                    g,
                    Kernel::DitherCompress,
                    pack_cfg(w),
                    x,
                    n,
                    bucket,
                    levels,
                    natural,
                    stream_base,
                    o
                )?;
            }
            GpuScheme::RandomK { k, unbiased } => {
                let scale = GpuScheme::randomk_scale(self.len, k, unbiased);
                let (k, key) = (k as u64, streams.indices.base());
                let cfg = g.config(k, THREADS as u64, 0);
                launch!(g, Kernel::RandomkCompress, cfg, x, n, k, key, scale, o)?;
            }
        }
        Ok(need)
    }

    fn decode<P, O>(
        &self,
        payload: &P,
        streams: RoundStreams,
        out: &mut O,
        add: bool,
    ) -> Result<(), CudaError>
    where
        P: DevicePtr<u8>,
        O: DevicePtrMut<f32>,
    {
        let need = self.compressed_len();
        if payload.len() < need {
            return Err(CudaError::Invalid(format!(
                "payload of {} bytes, a {:?} chunk of {} elements has {need}",
                payload.len(),
                self.scheme,
                self.len
            )));
        }
        if out.len() != self.len {
            return Err(CudaError::Invalid(format!(
                "output has {} elements, the codec was built for {}",
                out.len(),
                self.len
            )));
        }
        let g: &GpuContext = &self.gpu;
        let stream = &g.stream;
        let (p, _p_guard) = payload.device_ptr(stream);
        let (o, _o_guard) = out.device_ptr_mut(stream);
        check_aligned(p, "the payload")?;
        check_aligned(o, "the output")?;
        let n = self.len as u64;
        let bucket = self.bucket;
        let elems = g.config(n, THREADS as u64, 0);
        let groups = g.config(n.div_ceil(GROUP), THREADS as u64, 0);
        let pick = |plain: Kernel, summed: Kernel| if add { summed } else { plain };

        match self.scheme {
            GpuScheme::Fp16 => {
                let k = pick(Kernel::Fp16Decompress, Kernel::Fp16DecompressAdd);
                launch!(g, k, elems, p, n, o)
            }
            GpuScheme::Bf16 => {
                let k = pick(Kernel::Bf16Decompress, Kernel::Bf16DecompressAdd);
                launch!(g, k, elems, p, n, o)
            }
            GpuScheme::OneBit { .. } => {
                let k = pick(Kernel::OnebitDecompress, Kernel::OnebitDecompressAdd);
                launch!(g, k, groups, p, n, o)
            }
            GpuScheme::MinMax { bits, .. } => {
                let k = pick(Kernel::MinmaxDecompress, Kernel::MinmaxDecompressAdd);
                launch!(g, k, groups, p, n, bucket, bits, o)
            }
            GpuScheme::Dithering {
                levels, natural, ..
            } => {
                let k = pick(Kernel::DitherDecompress, Kernel::DitherDecompressAdd);
                let natural = natural as u32;
                launch!(g, k, groups, p, n, bucket, levels, natural, o)
            }
            GpuScheme::RandomK { k, .. } => {
                let (kk, key) = (k as u64, streams.indices.base());
                let cfg = g.config(kk, THREADS as u64, 0);
                if !add {
                    let zero = 0u32;
                    launch!(g, Kernel::FillU32, elems, o, n, zero)?;
                    return launch!(g, Kernel::RandomkDecompress, cfg, p, n, kk, key, o);
                }
                // acc + decompress(payload): r = acc[idx] + v from the original acc, then
                // acc += 0.0 everywhere (-0.0 becomes +0.0 off the support), then scatter r.
                let mut r = stream
                    .alloc_zeros::<f32>(k.max(1))
                    .map_err(driver("allocating random-k scratch"))?;
                let (rp, _r_guard) = r.device_ptr_mut(stream);
                launch!(g, Kernel::RandomkDecompressAdd, cfg, p, n, kk, key, o, rp)?;
                launch!(g, Kernel::AddZero, elems, o, n)?;
                launch!(g, Kernel::RandomkDecompress, cfg, rp, n, kk, key, o)
            }
        }
    }

    /// Enqueues the decoding of `payload` (at least [`Self::compressed_len`] bytes) into `out`
    /// (exactly `len` f32). `streams` matters only for random-k (its indices).
    pub fn decompress<P, O>(
        &self,
        payload: &P,
        streams: RoundStreams,
        out: &mut O,
    ) -> Result<(), CudaError>
    where
        P: DevicePtr<u8>,
        O: DevicePtrMut<f32>,
    {
        self.decode(payload, streams, out, false)
    }

    /// Enqueues `acc += decode(payload)` (bit for bit `decompress` followed by an f32 add).
    pub fn decompress_add<P, O>(
        &self,
        payload: &P,
        streams: RoundStreams,
        acc: &mut O,
    ) -> Result<(), CudaError>
    where
        P: DevicePtr<u8>,
        O: DevicePtrMut<f32>,
    {
        self.decode(payload, streams, acc, true)
    }

    /// The index of the first non-finite element of `input` (NaN or ±Inf), if any. Waits for
    /// the stream. [`Self::compress`] does not check (the CPU compressors reject such input);
    /// call this first when the input may hold non-finite values.
    pub fn find_non_finite<I: DevicePtr<f32>>(
        &self,
        input: &I,
    ) -> Result<Option<usize>, CudaError> {
        let g: &GpuContext = &self.gpu;
        let stream = &g.stream;
        let mut first = stream
            .alloc_zeros::<u32>(2)
            .map_err(driver("allocating a flag"))?;
        g.fill_u32(&mut first, u32::MAX)?;
        self.flag_non_finite(input, &mut first)?;
        let v = stream
            .clone_dtoh(&first)
            .map_err(driver("reading a flag"))?;
        g.synchronize()?;
        let i = u64::from(v[0]) | (u64::from(v[1]) << 32);
        Ok((i != u64::MAX).then_some(i as usize))
    }

    /// Launches the search for `input`'s first non-finite element: lowers the index in the two
    /// words of `first` (low, high; set them to all ones before) to it. Does not wait.
    pub(crate) fn flag_non_finite<I: DevicePtr<f32>, F: DevicePtrMut<u32>>(
        &self,
        input: &I,
        first: &mut F,
    ) -> Result<(), CudaError> {
        let g: &GpuContext = &self.gpu;
        let stream = &g.stream;
        if first.len() < 2 {
            return Err(CudaError::Invalid(
                "the first-non-finite flag needs two words".into(),
            ));
        }
        let (fp, _f_guard) = first.device_ptr_mut(stream);
        let (x, _x_guard) = input.device_ptr(stream);
        check_aligned(x, "the input")?;
        let n = input.len() as u64;
        let cfg = g.config(n, THREADS as u64, 0);
        launch!(g, Kernel::FirstNonfinite, cfg, x, n, fp)
    }

    /// Copies `input` to the device, compresses it there, copies the payload back into `out`
    /// (replacing its contents) and waits. Rejects what the CPU compressors reject: non-finite
    /// input, a bucket whose `max - min` or sum of squares overflows f32.
    pub fn compress_host(
        &mut self,
        input: &[f32],
        streams: RoundStreams,
        out: &mut Vec<u8>,
    ) -> Result<(), CudaError> {
        let stream = self.gpu.stream.clone();
        // cuMemAlloc rejects 0 bytes: give an empty chunk a 1-element buffer and view none of it.
        let dx = if input.is_empty() {
            stream.alloc_zeros::<f32>(1)
        } else {
            stream.clone_htod(input)
        }
        .map_err(driver("copying the input to the device"))?;
        let dx = dx.slice(0..input.len());
        if let Some(i) = self.find_non_finite(&dx)? {
            return Err(CudaError::Invalid(format!(
                "input element {i} is not finite ({})",
                input[i]
            )));
        }
        let mut dout = stream
            .alloc_zeros::<u8>(self.compressed_len().max(1))
            .map_err(driver("allocating the payload"))?;
        let len = self.compress(&dx, streams, &mut dout)?;
        let mut bytes = stream
            .clone_dtoh(&dout)
            .map_err(driver("copying the payload to the host"))?;
        self.gpu.synchronize()?;
        bytes.truncate(len);
        if let Some(problem) = self.scheme.header_problem(self.len, &bytes) {
            return Err(CudaError::Invalid(problem));
        }
        *out = bytes;
        Ok(())
    }

    fn decode_host(
        &self,
        payload: &[u8],
        streams: RoundStreams,
        out: &mut [f32],
        add: bool,
    ) -> Result<(), CudaError> {
        let stream = self.gpu.stream.clone();
        let padded: Vec<u8> = if payload.is_empty() {
            vec![0]
        } else {
            payload.to_vec()
        };
        let dp = stream
            .clone_htod(&padded)
            .map_err(driver("copying the payload to the device"))?;
        let dp = dp.slice(0..payload.len());
        let mut dout = if out.is_empty() {
            stream.alloc_zeros::<f32>(1)
        } else {
            stream.clone_htod(out)
        }
        .map_err(driver("copying the output to the device"))?;
        {
            let mut view = dout.slice_mut(0..out.len());
            self.decode(&dp, streams, &mut view, add)?;
        }
        stream
            .memcpy_dtoh(&dout.slice(0..out.len()), out)
            .map_err(driver("copying the result to the host"))?;
        self.gpu.synchronize()
    }

    /// Host-buffer [`Self::decompress`]: copies in, decodes, copies back, waits.
    pub fn decompress_host(
        &self,
        payload: &[u8],
        streams: RoundStreams,
        out: &mut [f32],
    ) -> Result<(), CudaError> {
        self.decode_host(payload, streams, out, false)
    }

    /// Host-buffer [`Self::decompress_add`]: copies in, adds, copies back, waits.
    pub fn decompress_add_host(
        &self,
        payload: &[u8],
        streams: RoundStreams,
        acc: &mut [f32],
    ) -> Result<(), CudaError> {
        self.decode_host(payload, streams, acc, true)
    }
}
