//! Compression of tensors that live in device memory, many chunks per driver call: the one
//! small trait ([`Device`]) behind which the data path keeps its orchestration, the chains of
//! a tensor's chunks on it ([`DeviceTensor`]), and batches of tensors launched together
//! ([`Batch`]).
//!
//! # Map
//!
//! | item | what |
//! |---|---|
//! | [`Device`] | memory (f32 tensors, byte arenas, page-locked staging), copies by address, one launch of a table kernel ([`table::Step`]) over a table of chunks, and a count of driver calls |
//! | [`table`] | [`table::Entry`] (a chunk of a table: `PPChunk` of the CUDA header), the steps and their grids |
//! | [`DeviceTensor`] | a tensor's chunk chains on a device: every chunk's `nesterov(ef(codec))`, the state (residual, momentum) in device memory, the pulled payloads on their way back; the same bytes and state as the CPU chains of [`crate::chunk::chunk_codec`] |
//! | [`Batch`] | the tables, payload arena and staging of a fixed list of tensors; [`Batch::start`] launches one round of each, [`Started`] hands out each chunk's payload (judged, its state committed) and decodes each tensor's results |
//! | [`Tickets`] | the word other streams wait on ([`Device::wait_ticket`]) and what the device's stream writes into it ([`Device::signal`]), when the work waited for finishes in any order |
//! | [`EmulatedDevice`] | "device" memory in host memory, every table step run by the host-compiled twin of the CUDA source ([`crate::cuda::host`]): how CI runs the device data path without a GPU |
//! | `CudaDevice` (feature `cuda`) | a CUDA GPU: `CudaSlice` memory, the NVRTC-compiled table kernels on one stream (`cuda/device.rs`) |
//!
//! # A round of a batch
//! The tensors of a batch (one tensor, or a group's) are laid out in one table of chunks and
//! one payload arena whose layout is the staging's: each chunk's payload, then its check words
//! ([`flag`]), 8-aligned. [`Batch::start`] writes the table for the round (the buffers'
//! addresses, each chunk's random streams and error-feedback factor) into page-locked memory,
//! copies it to the device and launches, each once for every chunk of the batch:
//! 1. `Clear`: every chunk's check words;
//! 2. `Prepare`: momentum (workers, when configured) `p₁ = g + μ·(μ·m + g)` and the next
//!    momentum `μ·m + g` aside (`m` unchanged yet); error feedback `p₂ = p₁ + e` (vanilla) or
//!    `p₁ + (η_{t−1}/η_t)·e`; the index of the codec input's first non-finite element;
//! 3. `Stats`, `Finalize`, `Encode`: the codec on `p₂`, into the chunk's payload;
//! 4. `Residual` (and `ResidualScatter` for random-k): the new residual `d = p₂ − D(C(p₂))`
//!    from the bytes actually sent;
//!
//! and then one copy of the whole arena into page-locked staging. Nothing is committed yet.
//! [`Started::finish`] waits for that copy (once, whoever asks first), judges a chunk's checks
//! in the CPU chain's order and, only if every check passed, commits its state (`e ← d`,
//! `m ← μ·m + g`: the chunk's halves of two buffers swap). A refused round changes nothing, as
//! on the CPU. The payload is pushed straight from the staging (a `Bytes` slice of it; the
//! staging goes back to the batch's pool when QUIC drops the last one).
//!
//! Pulled payloads are checked as the CPU decoders check them ([`Started::receive`]) and
//! copied into the batch's page-locked decode staging; once every tensor of the batch has
//! received its results, [`Started::decode`] uploads them in one copy and decodes every
//! received chunk into its round's output with `Decode` (and `DecodeScatter`), divided by the
//! number of workers for an average. So a batch costs about a dozen driver calls a round
//! however many chunks and tensors it holds ([`Device::driver_calls`] counts them).
//!
//! The element formulas are those of [`crate::chain`], written once more in
//! `kernels/cuda/pushpull_table.cuh` (`pp_prepare_elem`, `pp_residual_group`, ...) with FMA
//! contraction off, so the bits agree: `tests/device_batch.rs` checks batches on the
//! [`EmulatedDevice`] against the CPU chains, bytes and state, round after round.
//!
//! Compressors without a kernel (top-k, column-wise onebit, Elias-coded dithering, Moniqua)
//! have no device chain ([`DeviceTensor::build`] returns `None`): the worker copies such a
//! tensor to the host (once a round, and its results back once) and uses the CPU chains (its
//! metrics then say `cpu`).

use std::ops::Range;

use crate::cuda::{CudaError, Device as Place};

mod batch;
mod emulated;
pub mod table;
mod tensor;
mod ticket;

pub use batch::{Batch, Started};
pub use emulated::{EmulatedDevice, EmulatedStaging};
pub use tensor::{BatchRound, DeviceTensor};
pub use ticket::Tickets;

/// Where a chunk's checks leave their verdicts (`u32` words after its payload; 0 = fine).
pub mod flag {
    /// Nesterov momentum's input or new momentum was not finite.
    pub const NESTEROV: usize = 0;
    /// The gradient plus the error-feedback residual was not finite.
    pub const EF_INPUT: usize = 1;
    /// The new residual `p - D(C(p))` was not finite.
    pub const EF_RESIDUAL: usize = 2;
    /// Decoding: the chunk's pulled payload is there (1), or not (0), or its sum was not
    /// finite ([`NON_FINITE`]: the chunk decodes as NaN).
    pub const PRESENT: usize = 3;
    /// [`PRESENT`]'s value for a chunk whose sum was not finite.
    pub const NON_FINITE: u32 = 2;
    /// Two words (low, high) of the index of the codec input's first non-finite element;
    /// all ones when there is none.
    pub const FIRST_BAD: usize = 4;
    /// Words in a chunk's flags.
    pub const WORDS: usize = 6;
    /// Bytes of flags after a payload.
    pub const BYTES: usize = 4 * WORDS;
}

/// Where a chunk's flags sit after a payload of `len` bytes (8-aligned).
pub fn flags_at(len: usize) -> usize {
    len.div_ceil(8) * 8
}

/// Bytes of a chunk's slot in a payload arena (payload, then its flags).
pub fn slot_bytes(len: usize) -> usize {
    flags_at(len) + flag::BYTES
}

/// A device that holds f32 tensors and runs the table kernels on them.
///
/// Every method *orders* its work after everything asked of the device before (one stream).
/// Methods that hand something to the host wait for it (`download`, and `wait_staged`, which
/// waits for the copies into or out of a staging buffer); everything else only launches. The
/// batch data path addresses memory by device address (a tensor may be borrowed from another
/// library, e.g. torch's allocator), so the copies and launches are `unsafe`: the caller
/// vouches for the addresses.
pub trait Device: Send + Sync + 'static {
    /// f32 memory on the device: a whole tensor, or state.
    type Mem: Send + Sync + 'static;
    /// Byte memory on the device (tables, payload arenas, scratch), 8-byte aligned.
    type Bytes: Send + Sync + 'static;
    /// Host memory the device copies into and out of while the host goes on: page-locked
    /// (pinned) memory on CUDA, at least 8-byte aligned (so it may be read as f32 or u64).
    /// After a copy out of the device, its bytes are meaningful only once
    /// [`Device::wait_staged`] returned; after a copy into the device, the host must not
    /// change them until then.
    type Staging: AsRef<[u8]> + AsMut<[u8]> + std::fmt::Debug + Send + Sync + 'static;

    /// Where compression runs on this device, for metrics (`cuda:N`, or `emulated`).
    fn place(&self) -> Place;

    /// `len` zeroed elements.
    fn alloc_zeros(&self, len: usize) -> Result<Self::Mem, CudaError>;

    /// The number of elements of `mem`.
    fn mem_len(&self, mem: &Self::Mem) -> usize;

    /// The device address of `mem`'s first element.
    fn mem_addr(&self, mem: &Self::Mem) -> u64;

    /// `bytes` zeroed bytes, 8-byte aligned.
    fn alloc_bytes(&self, bytes: usize) -> Result<Self::Bytes, CudaError>;

    /// The device address of `b`'s first byte.
    fn bytes_addr(&self, b: &Self::Bytes) -> u64;

    /// Staging of at least `bytes` bytes, zeroed.
    fn alloc_staging(&self, bytes: usize) -> Result<Self::Staging, CudaError>;

    /// Copies `dst.len()` f32 at device address `src` into `dst`, and waits.
    ///
    /// # Safety
    /// `src` addresses `dst.len()` f32 of this device's memory, alive during the call.
    unsafe fn download(&self, src: u64, dst: &mut [f32]) -> Result<(), CudaError>;

    /// Copies `src` to device address `dst`, and waits (`src` may change once this returns).
    ///
    /// # Safety
    /// `dst` addresses `src.len()` f32 of this device's memory that nothing else uses.
    unsafe fn upload(&self, src: &[f32], dst: u64) -> Result<(), CudaError>;

    /// Starts copying `staging[range]` to device address `dst`; the staging is busy until
    /// [`Device::wait_staged`].
    ///
    /// # Safety
    /// `dst` addresses `range.len()` bytes of this device's memory that nothing else uses
    /// until the copy has run.
    unsafe fn upload_staged(
        &self,
        staging: &mut Self::Staging,
        range: Range<usize>,
        dst: u64,
    ) -> Result<(), CudaError>;

    /// Starts copying `range.len()` bytes at device address `src` into `staging[range]`;
    /// read them after [`Device::wait_staged`].
    ///
    /// # Safety
    /// `src` addresses `range.len()` bytes of this device's memory, alive until the copy has
    /// run.
    unsafe fn stage(
        &self,
        src: u64,
        staging: &mut Self::Staging,
        range: Range<usize>,
    ) -> Result<(), CudaError>;

    /// Waits until the copies into or out of `staging` have run (at once when none is
    /// pending).
    fn wait_staged(&self, staging: &mut Self::Staging) -> Result<(), CudaError>;

    /// Launches `launch` over the `chunks` entries of the table at device address `table`.
    ///
    /// # Safety
    /// The table holds `chunks` valid [`table::Entry`] whose addresses point into live memory
    /// of this device, large enough for their chunks.
    unsafe fn launch(
        &self,
        launch: &table::Launch,
        table: u64,
        chunks: usize,
    ) -> Result<(), CudaError>;

    /// A new ticket for [`Device::wait_ticket`] and [`Device::signal`] (after every ticket
    /// handed out before).
    fn ticket(&self) -> Result<u32, CudaError>;

    /// Makes later work on `stream` wait, without the host waiting, until this device's stream
    /// has run the [`Device::signal`] of `ticket` and of every ticket handed out before it.
    /// `stream` is the driver's handle of another stream of this device (on a CUDA GPU, e.g.
    /// torch's current stream; 0 is the legacy default stream). The emulated device has no
    /// streams: there `stream` must be 0 and the calling thread waits (the host is the stream
    /// of its memory).
    ///
    /// # Safety
    /// `stream` is a live stream of this device's context, and `ticket` is signalled later
    /// whatever becomes of the work it stands for: until then the stream runs nothing more.
    unsafe fn wait_ticket(&self, stream: u64, ticket: u32) -> Result<(), CudaError>;

    /// Marks `ticket` done: once every ticket handed out before it is done too ([`Tickets`]),
    /// this device's stream, after everything asked of it so far, releases their waiters.
    /// Signal every ticket once, also when its work failed. If the device cannot queue the
    /// release, the host releases the waiters at once (no stream waits forever) and the error
    /// is returned.
    fn signal(&self, ticket: u32) -> Result<(), CudaError>;

    /// Driver calls made so far (allocations, copies, launches, event records and waits): a
    /// round's cost is the difference before and after it.
    fn driver_calls(&self) -> u64;
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

/// The error for a range that does not fit a buffer of `len` elements (or bytes).
pub(crate) fn check_range(what: &str, range: &Range<usize>, len: usize) -> Result<(), CudaError> {
    if range.start <= range.end && range.end <= len {
        Ok(())
    } else {
        Err(CudaError::Invalid(format!(
            "{what}: {}..{} of a buffer of {len}",
            range.start, range.end
        )))
    }
}
