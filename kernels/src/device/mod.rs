//! Compression of tensors that live in device memory: the one small trait ([`Device`]) behind
//! which the worker's device data path keeps its orchestration, and the compressor chain that
//! runs on it ([`DeviceChain`]).
//!
//! # Map
//!
//! | item | what |
//! |---|---|
//! | [`Device`] | device memory and the kernels a chunk needs: compress / decode one fixed-width [`GpuScheme`], error feedback, Nesterov momentum, the average, copies to and from the host |
//! | [`DeviceChain`] | one chunk's `Momentum(ErrorFeedback(codec))` on a device, state (residual, momentum) in device memory; the same bytes and state as the CPU chain of [`crate::chunk::chunk_codec`] |
//! | [`EmulatedDevice`] | "device" memory in host `Vec<f32>`s, every kernel run by the host-compiled twin of the CUDA source ([`crate::cuda::host`]): how CI runs the device data path without a GPU |
//! | `GpuContext` (feature `cuda`) | the CUDA device: `CudaSlice<f32>` memory, the NVRTC-compiled kernels on the context's stream (`cuda/device.rs`) |
//!
//! # How a chunk is compressed on a device
//! The worker holds a tensor in one [`Device::Mem`] and each chunk is a range of it. The chain
//! of a chunk (for the fixed-width encodings: fp16, bf16, onebit, minmax, packed dithering,
//! random-k, and raw fp32) runs, for round t with gradient `g = x[range]`:
//! 1. momentum (workers, when configured): `p₁ = g + μ·(μ·m + g)` (`m` unchanged yet);
//! 2. error feedback (when configured): `p₂ = p₁ + e` (vanilla) or `p₁ + (η_{t−1}/η_t)·e`;
//! 3. the codec compresses `p₂` on the device and only the payload is copied to the host;
//! 4. error feedback decodes that payload on the device into `d` and sets `d = p₂ − d`;
//! 5. only if every step succeeded (all values finite, the header acceptable): `e ← d`,
//!    `m ← μ·m + g`. A failed round leaves the state as it was, as on the CPU.
//!
//! Pulled payloads are decoded on the device straight into the chunk's range (and divided by
//! the number of workers for an average). The element formulas are those of
//! [`crate::decorators`], written once more in `kernels/cuda/pushpull_elem.cuh`
//! (`pp_ef_sum`, `pp_momentum_next`, `pp_nesterov_value`) with FMA contraction off, so the
//! bits agree: `tests/device_chain.rs` checks the chain on the [`EmulatedDevice`] against the
//! CPU chain, bytes and state, round after round.
//!
//! Compressors without a kernel (top-k, column-wise onebit, Elias-coded dithering, Moniqua)
//! have no device chain ([`DeviceChain::build`] returns `None`): the worker copies such a chunk
//! to the host and uses the CPU chain (its metrics then say `cpu`).

use std::ops::Range;

use crate::cuda::{CudaError, Device as Place, GpuScheme, RoundStreams};

mod chain;
mod emulated;

pub use chain::DeviceChain;
pub use emulated::EmulatedDevice;

/// A device that holds f32 tensors and runs the chunk kernels on them.
///
/// Every method *orders* its work after everything asked of the device before (one stream);
/// methods that hand something to the host (`compress`'s payload, `download`, the `bool`
/// results) wait for it. Ranges are element ranges of a [`Device::Mem`]; a range outside the
/// buffer is an error, never undefined behaviour.
pub trait Device: Send + Sync + 'static {
    /// f32 memory on the device: a whole tensor, or the state of one chunk.
    type Mem: Send + 'static;
    /// One [`GpuScheme`] for chunks of one length, with any scratch memory it needs.
    type Codec: Send + 'static;

    /// Where compression runs on this device, for metrics (`cuda:N`, or `emulated`).
    fn place(&self) -> Place;

    /// `len` zeroed elements.
    fn alloc_zeros(&self, len: usize) -> Result<Self::Mem, CudaError>;

    /// The number of elements of `mem`.
    fn mem_len(&self, mem: &Self::Mem) -> usize;

    /// Copies `src` into `dst[at .. at + src.len()]`.
    fn upload(&self, src: &[f32], dst: &mut Self::Mem, at: usize) -> Result<(), CudaError>;

    /// Copies `src[range]` into `dst` (`range.len()` elements) and waits.
    fn download(
        &self,
        src: &Self::Mem,
        range: Range<usize>,
        dst: &mut [f32],
    ) -> Result<(), CudaError>;

    /// The kernels of `scheme` for chunks of `len` elements (validates the scheme).
    fn codec(&self, scheme: GpuScheme, len: usize) -> Result<Self::Codec, CudaError>;

    /// Compresses `x[range]` (the codec's length) and replaces `out` with exactly
    /// [`GpuScheme::compressed_len`] bytes of payload. Refuses non-finite input, naming the
    /// first such element.
    fn compress(
        &self,
        codec: &mut Self::Codec,
        x: &Self::Mem,
        range: Range<usize>,
        streams: RoundStreams,
        out: &mut Vec<u8>,
    ) -> Result<(), CudaError>;

    /// Decodes `payload` (exactly the scheme's size) into `y[range]`, or adds it there when
    /// `add`. `streams` matters only for random-k.
    fn decode(
        &self,
        codec: &mut Self::Codec,
        payload: &[u8],
        streams: RoundStreams,
        y: &mut Self::Mem,
        range: Range<usize>,
        add: bool,
    ) -> Result<(), CudaError>;

    /// `p = g[range] + e` (vanilla) or `g[range] + factor * e`; whether every element of `p` is
    /// finite. `e` and `p` hold `range.len()` elements.
    fn ef_input(
        &self,
        g: (&Self::Mem, Range<usize>),
        e: &Self::Mem,
        factor: f32,
        vanilla: bool,
        p: &mut Self::Mem,
    ) -> Result<bool, CudaError>;

    /// `d = p - d` (equal lengths); whether every element is finite.
    fn ef_residual(&self, p: &Self::Mem, d: &mut Self::Mem) -> Result<bool, CudaError>;

    /// `p = g + mu * (mu * m + g)` for `g = g[range]` (`m` unchanged); whether `p` and the new
    /// momentum are finite everywhere.
    fn nesterov(
        &self,
        g: (&Self::Mem, Range<usize>),
        m: &Self::Mem,
        mu: f32,
        p: &mut Self::Mem,
    ) -> Result<bool, CudaError>;

    /// `m = mu * m + g[range]`.
    fn momentum_update(
        &self,
        g: (&Self::Mem, Range<usize>),
        m: &mut Self::Mem,
        mu: f32,
    ) -> Result<(), CudaError>;

    /// `y[range] = y[range] / w`.
    fn divide(&self, y: &mut Self::Mem, range: Range<usize>, w: f32) -> Result<(), CudaError>;
}

/// The error for a range that does not fit a buffer of `len` elements.
pub(crate) fn check_range(what: &str, range: &Range<usize>, len: usize) -> Result<(), CudaError> {
    if range.start <= range.end && range.end <= len {
        Ok(())
    } else {
        Err(CudaError::Invalid(format!(
            "{what}: elements {}..{} of a buffer of {len}",
            range.start, range.end
        )))
    }
}

/// The error for two buffers that must have the same number of elements and do not.
pub(crate) fn same_len(what: &str, a: usize, b: usize) -> Result<(), CudaError> {
    if a == b {
        Ok(())
    } else {
        Err(CudaError::Invalid(format!(
            "{what}: buffers of {a} and {b} elements"
        )))
    }
}
