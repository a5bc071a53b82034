//! [`EmulatedDevice`]: the [`Device`] of CI. Its memory is host memory and every table step
//! is the host-compiled twin of the CUDA source (`kernels/cuda/host_shim.cpp`,
//! `pp_emu_table_step`), chunk after chunk. It is slow (serial) and exists so that the device
//! data path (tables, arenas, payload sizes, residual and momentum state, the order of steps)
//! runs and is checked bit for bit where there is no GPU, and so that its driver calls can be
//! counted: it counts each operation a [`crate::cuda::CudaDevice`] makes one driver call for.
//!
//! Copies out of the device into [`EmulatedStaging`] are asynchronous as on a GPU: the bytes
//! are taken when the copy is asked for (in stream order) but land in the staging only when
//! [`Device::wait_staged`] is called, so a caller that reads staging before waiting reads
//! stale bytes here too (and the tests see it).

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use super::table::Launch;
use super::{check_range, Device, Tickets};
use crate::cuda::{host, CudaError, Device as Place};

/// A device whose memory is host memory and whose kernels are the CUDA kernels' host twin.
#[derive(Debug, Default)]
pub struct EmulatedDevice {
    calls: AtomicU64,
    /// Bytes handed out by its allocations so far, and the most it hands out (a test's "out
    /// of memory").
    allocated: AtomicU64,
    limit: Option<u64>,
    /// The same for page-locked staging alone ([`EmulatedDevice::with_staging_limit`]).
    staging_allocated: AtomicU64,
    staging_limit: Option<u64>,
    /// While true, a wait for staged copies blocks ([`EmulatedDevice::hold_staging`]).
    staging_held: Mutex<bool>,
    staging_gate: Condvar,
    /// Waits blocked by [`EmulatedDevice::hold_staging`] now.
    held_waits: AtomicU64,
    /// The tickets of [`Device::wait_ticket`], and the gate its waiters sleep on.
    tickets: Mutex<Tickets>,
    ticket_gate: Condvar,
}

impl EmulatedDevice {
    /// A new emulated device (its driver-call count at 0).
    pub fn new() -> EmulatedDevice {
        EmulatedDevice::default()
    }

    /// An emulated device whose allocations fail, as a GPU out of memory does, once they would
    /// hand out more than `bytes` in total (freed memory is not given back to the count): how
    /// tests run out of device memory.
    pub fn with_limit(bytes: u64) -> EmulatedDevice {
        EmulatedDevice {
            limit: Some(bytes),
            ..EmulatedDevice::default()
        }
    }

    /// An emulated device whose staging allocations fail, as a host out of page-locked memory
    /// does, once they would hand out more than `bytes` in total (its other memory is
    /// unlimited).
    pub fn with_staging_limit(bytes: u64) -> EmulatedDevice {
        EmulatedDevice {
            staging_limit: Some(bytes),
            ..EmulatedDevice::default()
        }
    }

    /// Holds every copy into host staging until [`EmulatedDevice::release_staging`]: a wait
    /// for one ([`Device::wait_staged`]) blocks meanwhile, and so does a blocking copy
    /// ([`Device::download`], [`Device::upload`]), as on a GPU still busy with work queued
    /// before them (the training's kernels). How tests check that a busy device holds up
    /// only the rounds that wait for it.
    pub fn hold_staging(&self) {
        *self.staging_held.lock().unwrap_or_else(|p| p.into_inner()) = true;
    }

    /// Ends [`EmulatedDevice::hold_staging`]: the waits blocked on it return.
    pub fn release_staging(&self) {
        *self.staging_held.lock().unwrap_or_else(|p| p.into_inner()) = false;
        self.staging_gate.notify_all();
    }

    /// How many waits for the device (staged copies, blocking copies) are blocked by
    /// [`EmulatedDevice::hold_staging`] now: how a test knows its calls reached the device.
    pub fn held_waits(&self) -> u64 {
        self.held_waits.load(Ordering::Relaxed)
    }

    /// Whether [`EmulatedDevice::hold_staging`] holds the copies now.
    pub fn staging_held(&self) -> bool {
        *self.staging_held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks while [`EmulatedDevice::hold_staging`] holds the device: what a wait for the
    /// device's earlier work does on a GPU still busy with it (a staged copy's wait, a
    /// blocking copy).
    fn wait_unless_held(&self) {
        let mut held = self.staging_held.lock().unwrap_or_else(|p| p.into_inner());
        if *held {
            self.held_waits.fetch_add(1, Ordering::Relaxed);
            while *held {
                held = self
                    .staging_gate
                    .wait(held)
                    .unwrap_or_else(|p| p.into_inner());
            }
            self.held_waits.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn count(&self, calls: u64) {
        self.calls.fetch_add(calls, Ordering::Relaxed);
    }

    /// Takes `bytes` from the limit (a failed allocation takes nothing), or the driver's
    /// out-of-memory error.
    fn take(&self, bytes: usize) -> Result<(), CudaError> {
        self.count(1);
        Self::take_from(&self.allocated, self.limit, bytes)
    }

    /// Takes `bytes` from `allocated`, which may not pass `limit`.
    fn take_from(allocated: &AtomicU64, limit: Option<u64>, bytes: usize) -> Result<(), CudaError> {
        let limit = limit.unwrap_or(u64::MAX);
        allocated
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |had| {
                had.checked_add(bytes as u64).filter(|&now| now <= limit)
            })
            .map(drop)
            .map_err(|_| CudaError::Driver {
                what: format!("allocating {bytes} bytes"),
                detail: format!(
                    "out of memory (the emulated device's limit of {limit} bytes is reached)"
                ),
            })
    }
}

/// The emulated device's staging: host bytes, and the copies out of the device started into
/// them but not yet waited for.
#[derive(Debug, Default)]
pub struct EmulatedStaging {
    /// The bytes, in u64 words so that they are 8-byte aligned as a GPU's page-locked memory
    /// is (page-aligned there).
    words: Vec<u64>,
    /// Bytes asked for (`words` holds at least as many).
    len: usize,
    pending: Vec<(usize, Vec<u8>)>,
    /// A copy into the device or a recorded event waits to be waited for.
    busy: bool,
}

impl AsRef<[u8]> for EmulatedStaging {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes, alive as long as `self`.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
}

impl AsMut<[u8]> for EmulatedStaging {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `as_ref`, and `&mut self` is held.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

impl Device for EmulatedDevice {
    type Mem = Vec<f32>;
    /// Bytes in u64 words, so that arenas are 8-byte aligned as on a GPU.
    type Bytes = Vec<u64>;
    type Staging = EmulatedStaging;

    fn place(&self) -> Place {
        Place::Emulated
    }

    fn alloc_zeros(&self, len: usize) -> Result<Vec<f32>, CudaError> {
        self.take(4 * len)?;
        Ok(vec![0.0; len])
    }

    fn mem_len(&self, mem: &Vec<f32>) -> usize {
        mem.len()
    }

    fn mem_addr(&self, mem: &Vec<f32>) -> u64 {
        mem.as_ptr() as u64
    }

    fn alloc_bytes(&self, bytes: usize) -> Result<Vec<u64>, CudaError> {
        self.take(bytes)?;
        Ok(vec![0; bytes.div_ceil(8)])
    }

    fn bytes_addr(&self, b: &Vec<u64>) -> u64 {
        b.as_ptr() as u64
    }

    fn alloc_staging(&self, bytes: usize) -> Result<EmulatedStaging, CudaError> {
        self.count(1);
        Self::take_from(&self.allocated, self.limit, bytes)?;
        if let Err(e) = Self::take_from(&self.staging_allocated, self.staging_limit, bytes) {
            // A failed allocation takes nothing.
            self.allocated.fetch_sub(bytes as u64, Ordering::Relaxed);
            return Err(e);
        }
        Ok(EmulatedStaging {
            words: vec![0; bytes.div_ceil(8)],
            len: bytes,
            pending: Vec::new(),
            busy: false,
        })
    }

    unsafe fn download(&self, src: u64, dst: &mut [f32]) -> Result<(), CudaError> {
        self.count(2);
        self.wait_unless_held();
        if !dst.is_empty() {
            // SAFETY: the caller vouches that `src` addresses dst.len() live f32.
            dst.copy_from_slice(unsafe {
                std::slice::from_raw_parts(src as *const f32, dst.len())
            });
        }
        Ok(())
    }

    unsafe fn upload(&self, src: &[f32], dst: u64) -> Result<(), CudaError> {
        self.count(2);
        self.wait_unless_held();
        if !src.is_empty() {
            // SAFETY: the caller vouches that `dst` addresses src.len() f32 nothing else uses.
            unsafe { std::slice::from_raw_parts_mut(dst as *mut f32, src.len()) }
                .copy_from_slice(src);
        }
        Ok(())
    }

    unsafe fn upload_staged(
        &self,
        staging: &mut EmulatedStaging,
        range: Range<usize>,
        dst: u64,
    ) -> Result<(), CudaError> {
        check_range("upload_staged", &range, staging.len)?;
        self.count(2);
        let src = &staging.as_ref()[range];
        if !src.is_empty() {
            // SAFETY: the caller vouches that `dst` addresses src.len() bytes nothing else uses.
            unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, src.len()) }
                .copy_from_slice(src);
        }
        staging.busy = true;
        Ok(())
    }

    unsafe fn stage(
        &self,
        src: u64,
        staging: &mut EmulatedStaging,
        range: Range<usize>,
    ) -> Result<(), CudaError> {
        check_range("stage", &range, staging.len)?;
        self.count(2);
        let bytes = if range.is_empty() {
            Vec::new()
        } else {
            // SAFETY: the caller vouches that `src` addresses range.len() live bytes.
            unsafe { std::slice::from_raw_parts(src as *const u8, range.len()) }.to_vec()
        };
        staging.pending.push((range.start, bytes));
        staging.busy = true;
        Ok(())
    }

    fn wait_staged(&self, staging: &mut EmulatedStaging) -> Result<(), CudaError> {
        if !staging.busy {
            return Ok(());
        }
        self.count(1);
        self.wait_unless_held();
        for (at, bytes) in std::mem::take(&mut staging.pending) {
            staging.as_mut()[at..at + bytes.len()].copy_from_slice(&bytes);
        }
        staging.busy = false;
        Ok(())
    }

    unsafe fn launch(&self, launch: &Launch, table: u64, chunks: usize) -> Result<(), CudaError> {
        self.count(1);
        // SAFETY: the caller vouches for the table and every address in it.
        unsafe { host::table_step(launch.step, table, chunks) }
    }

    fn ticket(&self) -> Result<u32, CudaError> {
        Ok(Tickets::locked(&self.tickets).issue())
    }

    unsafe fn wait_ticket(&self, stream: u64, ticket: u32) -> Result<(), CudaError> {
        if stream != 0 {
            return Err(CudaError::Invalid(format!(
                "the emulated device has no streams: wait_ticket orders the calling thread \
                 (stream 0), not stream {stream:#x}"
            )));
        }
        self.count(1);
        let mut tickets = Tickets::locked(&self.tickets);
        while !Tickets::passed(tickets.word(), ticket) {
            tickets = self
                .ticket_gate
                .wait(tickets)
                .unwrap_or_else(|p| p.into_inner());
        }
        Ok(())
    }

    fn signal(&self, ticket: u32) -> Result<(), CudaError> {
        // The work queued before runs as it is asked for here, so the word is written now.
        let mut tickets = Tickets::locked(&self.tickets);
        if tickets.finish(ticket).is_some() {
            self.count(1);
            self.ticket_gate.notify_all();
        }
        Ok(())
    }

    fn driver_calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}
