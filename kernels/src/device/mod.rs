//! Compression of tensors that live in device memory: the one small trait ([`Device`]) behind
//! which the worker's device data path keeps its orchestration, and the compressor chain that
//! runs on it ([`DeviceChain`]).
//!
//! # Map
//!
//! | item | what |
//! |---|---|
//! | [`Device`] | device memory and the kernels a chunk needs: compress / decode one fixed-width [`GpuScheme`], error feedback, Nesterov momentum, the average, copies to and from the host, asynchronous copies into staging ([`Device::Staging`], page-locked on CUDA) with the chunk's check results ([`flag`]) |
//! | [`DeviceChain`] | one chunk's `Momentum(ErrorFeedback(codec))` on a device, state (residual, momentum) in device memory; the same bytes and state as the CPU chain of [`crate::chunk::chunk_codec`]; [`DeviceChain::start`] launches a compression, [`DeviceChain::finish`] waits for it and commits ([`Started`] in between) |
//! | [`EmulatedDevice`] | "device" memory in host `Vec<f32>`s, every kernel run by the host-compiled twin of the CUDA source ([`crate::cuda::host`]): how CI runs the device data path without a GPU |
//! | `GpuContext` (feature `cuda`) | the CUDA device: `CudaSlice<f32>` memory, the NVRTC-compiled kernels on the context's stream (`cuda/device.rs`) |
//!
//! # How a chunk is compressed on a device
//! The worker holds a tensor in one [`Device::Mem`] and each chunk is a range of it. The chain
//! of a chunk (for the fixed-width encodings: fp16, bf16, onebit, minmax, packed dithering,
//! random-k, and raw fp32) runs, for round t with gradient `g = x[range]`:
//! 1. momentum (workers, when configured): `p₁ = g + μ·(μ·m + g)` (`m` unchanged yet);
//! 2. error feedback (when configured): `p₂ = p₁ + e` (vanilla) or `p₁ + (η_{t−1}/η_t)·e`;
//! 3. the codec compresses `p₂` on the device;
//! 4. error feedback decodes that payload on the device into `d` and sets `d = p₂ − d`;
//!    the next momentum `μ·m + g` is computed aside; only the payload and the chunk's check
//!    results ([`flag`]) are copied to the host, into staging;
//! 5. only if every step succeeded (all values finite, the header acceptable): `e ← d`,
//!    `m ← μ·m + g`. A failed round leaves the state as it was, as on the CPU.
//!
//! Steps 1–4 only launch work ([`DeviceChain::start`]); step 5 ([`DeviceChain::finish`])
//! waits for the copies and reads the checks. So a worker launches every chunk of a tensor
//! and then finishes them one by one, pushing each payload as it lands, and the host never
//! drains the device between chunks (one wait per chunk, instead of one per check). The
//! payload is pushed straight from its staging (page-locked memory on CUDA), which goes back
//! to the tensor's pool when QUIC drops the payload's `Bytes`.
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

pub use chain::{DeviceChain, Started};
pub use emulated::EmulatedDevice;

/// Where a chunk's checks leave their verdicts in [`Device::Flags`] (`u32` words; 0 = fine).
pub mod flag {
    /// Nesterov momentum's input or new momentum was not finite.
    pub const NESTEROV: usize = 0;
    /// The gradient plus the error-feedback residual was not finite.
    pub const EF_INPUT: usize = 1;
    /// The new residual `p - D(C(p))` was not finite.
    pub const EF_RESIDUAL: usize = 2;
    /// Two words (low, high) of the index of the codec input's first non-finite element;
    /// all ones when there is none.
    pub const FIRST_BAD: usize = 4;
    /// Words in a chunk's flags.
    pub const WORDS: usize = 6;
    /// Bytes of flags at the end of a staging buffer.
    pub const BYTES: usize = 4 * WORDS;
}

/// Where a chunk's flags sit in a staging buffer after a payload of `len` bytes (8-aligned).
pub fn flags_at(len: usize) -> usize {
    len.div_ceil(8) * 8
}

/// Bytes of staging a chunk with a payload of `len` bytes needs (payload, then its flags).
pub fn staging_bytes(len: usize) -> usize {
    flags_at(len) + flag::BYTES
}

/// A device that holds f32 tensors and runs the chunk kernels on them.
///
/// Every method *orders* its work after everything asked of the device before (one stream;
/// the copies of `stage` may run on a stream of their own that first waits for that work).
/// Methods that hand something to the host wait for it (`download`, and `wait_staged`, which
/// waits for the copies `stage` started); everything else only launches, so a worker can
/// launch every chunk of a tensor before it waits for the first (the host never stalls the
/// device between chunks). Checks write their verdict into a chunk's [`Device::Flags`] (see
/// [`flag`]), which travel to the host with the payload. Ranges are element ranges of a
/// [`Device::Mem`]; a range outside the buffer is an error, never undefined behaviour.
pub trait Device: Send + Sync + 'static {
    /// f32 memory on the device: a whole tensor, or the state of one chunk.
    type Mem: Send + 'static;
    /// One [`GpuScheme`] for chunks of one length, with any scratch memory it needs and the
    /// device buffer its payloads pass through.
    type Codec: Send + 'static;
    /// [`flag::WORDS`] `u32` words on the device: one chunk's check results.
    type Flags: Send + 'static;
    /// Host memory the device copies payloads into while the host goes on: page-locked
    /// (pinned) memory on CUDA. Its bytes are meaningful only after [`Device::wait_staged`].
    type Staging: AsRef<[u8]> + std::fmt::Debug + Send + Sync + 'static;

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

    /// Copies all of `src` into `dst` (equal lengths) on the device.
    fn copy(&self, src: &Self::Mem, dst: &mut Self::Mem) -> Result<(), CudaError>;

    /// The kernels of `scheme` for chunks of `len` elements (validates the scheme).
    fn codec(&self, scheme: GpuScheme, len: usize) -> Result<Self::Codec, CudaError>;

    /// Zeroed flags, with [`flag::FIRST_BAD`] at "none".
    fn alloc_flags(&self) -> Result<Self::Flags, CudaError>;

    /// Resets `flags` as [`Device::alloc_flags`] makes them.
    fn clear_flags(&self, flags: &mut Self::Flags) -> Result<(), CudaError>;

    /// Staging of at least `bytes` bytes.
    fn alloc_staging(&self, bytes: usize) -> Result<Self::Staging, CudaError>;

    /// Compresses `x[range]` (the codec's length) into the codec's device payload buffer and
    /// returns the payload's length ([`GpuScheme::compressed_len`]); records the index of the
    /// first non-finite input element in `flags` ([`flag::FIRST_BAD`]).
    fn compress(
        &self,
        codec: &mut Self::Codec,
        x: &Self::Mem,
        range: Range<usize>,
        streams: RoundStreams,
        flags: &mut Self::Flags,
    ) -> Result<usize, CudaError>;

    /// Decodes the payload the last [`Device::compress`] left in the codec's buffer into
    /// `y[range]` (what error feedback subtracts: the bytes actually sent).
    fn decode_own(
        &self,
        codec: &mut Self::Codec,
        streams: RoundStreams,
        y: &mut Self::Mem,
        range: Range<usize>,
    ) -> Result<(), CudaError>;

    /// Starts copying the codec's payload (`len` bytes, as [`Device::compress`] returned)
    /// and then `flags` into `staging` (at [`flags_at`]`(len)`; `staging` holds at least
    /// [`staging_bytes`]`(len)`). Read them after [`Device::wait_staged`].
    fn stage(
        &self,
        codec: &Self::Codec,
        len: usize,
        flags: &Self::Flags,
        staging: &mut Self::Staging,
    ) -> Result<(), CudaError>;

    /// Starts copying `src[range]` as little-endian f32 bytes (raw fp32, the payload of an
    /// uncompressed chunk), then `flags`, into `staging` like [`Device::stage`].
    fn stage_raw(
        &self,
        src: &Self::Mem,
        range: Range<usize>,
        flags: &mut Self::Flags,
        staging: &mut Self::Staging,
    ) -> Result<(), CudaError>;

    /// Waits until the copies into `staging` have landed.
    fn wait_staged(&self, staging: &mut Self::Staging) -> Result<(), CudaError>;

    /// Copies `bytes` (little-endian f32: a raw fp32 payload) into `dst[at ..]` through
    /// `staging` (at least `bytes.len()` long; page-locked on CUDA). Only launches, like
    /// [`Device::decode`]: `bytes` may change once this returns; the staging's previous copy
    /// is waited for before it is overwritten.
    fn upload_staged(
        &self,
        bytes: &[u8],
        staging: &mut Self::Staging,
        dst: &mut Self::Mem,
        at: usize,
    ) -> Result<(), CudaError>;

    /// Decodes `payload` (exactly the scheme's size, in host memory) into `y[range]`, or adds
    /// it there when `add`. Only launches: `payload` may change once this returns (it has been
    /// copied), and the decode is ordered before later work on the device (a `download` waits
    /// for it). `streams` matters only for random-k.
    fn decode(
        &self,
        codec: &mut Self::Codec,
        payload: &[u8],
        streams: RoundStreams,
        y: &mut Self::Mem,
        range: Range<usize>,
        add: bool,
    ) -> Result<(), CudaError>;

    /// `p = g[range] + e` (vanilla) or `g[range] + factor * e`; sets [`flag::EF_INPUT`] when
    /// an element of `p` is not finite. `e` and `p` hold `range.len()` elements.
    fn ef_input(
        &self,
        g: (&Self::Mem, Range<usize>),
        e: &Self::Mem,
        factor: f32,
        vanilla: bool,
        p: &mut Self::Mem,
        flags: &mut Self::Flags,
    ) -> Result<(), CudaError>;

    /// `d = p - d` (equal lengths); sets [`flag::EF_RESIDUAL`] when an element is not finite.
    fn ef_residual(
        &self,
        p: &Self::Mem,
        d: &mut Self::Mem,
        flags: &mut Self::Flags,
    ) -> Result<(), CudaError>;

    /// `p = g + mu * (mu * m + g)` for `g = g[range]` (`m` unchanged); sets
    /// [`flag::NESTEROV`] when `p` or the new momentum is not finite somewhere.
    fn nesterov(
        &self,
        g: (&Self::Mem, Range<usize>),
        m: &Self::Mem,
        mu: f32,
        p: &mut Self::Mem,
        flags: &mut Self::Flags,
    ) -> Result<(), CudaError>;

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

/// The flags at the end of a staged chunk whose payload is `len` bytes.
pub fn read_flags(staged: &[u8], len: usize) -> Option<[u32; flag::WORDS]> {
    let at = flags_at(len);
    let bytes = staged.get(at..at + flag::BYTES)?;
    let mut words = [0u32; flag::WORDS];
    for (w, b) in words.iter_mut().zip(bytes.chunks_exact(4)) {
        *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    Some(words)
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

/// The f32 values of `bytes` (a raw fp32 payload), or the error when they are not whole ones.
pub(crate) fn whole_f32s(what: &str, bytes: &[u8]) -> Result<usize, CudaError> {
    if bytes.len() % 4 == 0 {
        Ok(bytes.len() / 4)
    } else {
        Err(CudaError::Invalid(format!(
            "{what}: {} bytes are not whole f32 values",
            bytes.len()
        )))
    }
}

/// Decodes little-endian f32 `bytes` into `out` (as many as both hold).
pub(crate) fn f32s_from_le(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
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
