//! [`Batch`]: the resources to launch a fixed list of [`DeviceTensor`]s together (one table,
//! one payload arena, its staging), and [`Started`], one round of them in flight (see the
//! module docs of [`crate::device`] for the steps).

use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use pushpull_proto::pool::{Pool, Recycle};

use super::table::{table_bytes, Entry, Launch, Step, ENTRY_BYTES};
use super::tensor::BatchRound;
use super::{flag, read_flags, Device, DeviceTensor};
use crate::cuda::CudaError;
use crate::error::KernelError;

/// A device's staging buffer in a [`Pool`]: pushed payloads live in it (page-locked memory
/// on CUDA) until QUIC drops their `Bytes`, then it is reused.
struct StagingBuf<D: Device>(D::Staging);

impl<D: Device> AsRef<[u8]> for StagingBuf<D> {
    fn as_ref(&self) -> &[u8] {
        self.0.as_ref()
    }
}

impl<D: Device> Recycle for StagingBuf<D> {
    fn capacity(&self) -> usize {
        self.0.as_ref().len()
    }
    fn reset(&mut self) {}
}

/// One tensor of a batch: its region of the arena and its entries of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Part {
    /// Byte offset of its region in the arena.
    region: usize,
    /// Bytes of its region.
    region_bytes: usize,
    /// Its first entry in the table.
    first: usize,
    /// Its chunks.
    chunks: usize,
}

/// The table, payload arena and staging of a fixed list of tensors (one tensor, or the
/// tensors of a group call): made once, reused every round.
pub struct Batch<D: Device> {
    device: Arc<D>,
    parts: Vec<Part>,
    entries: usize,
    /// The payload arena and the table on the device, with their addresses.
    _arena: D::Bytes,
    arena: u64,
    arena_bytes: usize,
    _table: D::Bytes,
    table: u64,
    /// The table as the host writes it each round (page-locked; busy until its copy ran).
    table_host: Mutex<D::Staging>,
    /// Pulled payloads in the arena's layout, on their way to the device (page-locked; busy
    /// until its copy ran).
    decode: Mutex<D::Staging>,
    staging: Arc<Pool<StagingBuf<D>>>,
    bytes: u64,
}

impl<D: Device> std::fmt::Debug for Batch<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("tensors", &self.parts.len())
            .field("chunks", &self.entries)
            .field("arena_bytes", &self.arena_bytes)
            .finish()
    }
}

fn layout<D: Device>(tensors: &[&DeviceTensor<D>]) -> Vec<Part> {
    let (mut region, mut first) = (0, 0);
    tensors
        .iter()
        .map(|t| {
            let p = Part {
                region,
                region_bytes: t.region,
                first,
                chunks: t.chunks.len(),
            };
            region += t.region;
            first += t.chunks.len();
            p
        })
        .collect()
}

impl<D: Device> Batch<D> {
    /// The resources for `tensors` (all on `device`), in this order.
    pub fn new(device: &Arc<D>, tensors: &[&DeviceTensor<D>]) -> Result<Batch<D>, CudaError> {
        let parts = layout(tensors);
        let entries: usize = parts.iter().map(|p| p.chunks).sum();
        let arena_bytes: usize = parts.iter().map(|p| p.region_bytes).sum();
        let arena = device.alloc_bytes(arena_bytes.max(8))?;
        let table = device.alloc_bytes((entries * ENTRY_BYTES).max(8))?;
        let (arena_at, table_at) = (device.bytes_addr(&arena), device.bytes_addr(&table));
        let table_host = device.alloc_staging(entries * ENTRY_BYTES)?;
        let decode = device.alloc_staging(arena_bytes)?;
        let bytes = 3 * arena_bytes as u64 + 2 * (entries * ENTRY_BYTES) as u64;
        Ok(Batch {
            device: device.clone(),
            parts,
            entries,
            _arena: arena,
            arena: arena_at,
            arena_bytes,
            _table: table,
            table: table_at,
            table_host: Mutex::new(table_host),
            decode: Mutex::new(decode),
            // Room for two rounds' staging (QUIC may still hold a round's payloads when the
            // next starts): steady-state rounds allocate none.
            staging: Pool::new(2 * arena_bytes),
            bytes,
        })
    }

    /// Whether this batch was laid out for `tensors` (the same regions and chunk counts, in
    /// order).
    pub fn fits(&self, tensors: &[&DeviceTensor<D>]) -> bool {
        layout(tensors) == self.parts
    }

    /// Device and page-locked bytes this batch holds (arena, table, their host copies, the
    /// decode staging, and the payload staging of two rounds in flight).
    pub fn bytes(&self) -> u64 {
        self.bytes + 2 * self.arena_bytes as u64
    }

    /// Chunks in the batch.
    pub fn num_chunks(&self) -> usize {
        self.entries
    }

    fn device_error(&self, e: CudaError) -> KernelError {
        KernelError::Device {
            compressor: format!("a batch of {} chunks", self.entries),
            device: self.device.place().to_string(),
            detail: e.to_string(),
        }
    }

    /// Launches one round of every tensor (`rounds[t]` for `tensors[t]`, the tensors this
    /// batch was made for): the table copied to the device, the compression steps launched
    /// once each for every chunk, and the arena copied into staging. Nothing is waited for
    /// and no state changes until [`Started::finish`]. A chunk refused before the launch
    /// (corrected error feedback without a learning rate) fails in `finish`.
    ///
    /// # Safety
    /// `rounds[t].input` and `.output` address `tensors[t].len()` f32 of the device's memory
    /// that stay alive, and that nothing else writes (nor, for the output, reads) until the
    /// round's [`Started::finish`] of every chunk and [`Started::decode`] have run and the
    /// device's work on them has completed (later work on the device's stream is ordered
    /// after it).
    pub unsafe fn start(
        self: &Arc<Self>,
        tensors: &[&DeviceTensor<D>],
        rounds: &[BatchRound],
    ) -> Result<Started<D>, KernelError> {
        if !self.fits(tensors) || rounds.len() != tensors.len() {
            return Err(self.device_error(CudaError::Invalid(format!(
                "a batch laid out for {} tensors started with {} tensors and {} rounds of \
                 another layout",
                self.parts.len(),
                tensors.len(),
                rounds.len()
            ))));
        }
        let arena = self.arena;
        let mut entries = Vec::with_capacity(self.entries);
        let mut refused = Vec::with_capacity(self.entries);
        let mut lr_used = Vec::with_capacity(self.entries);
        for ((t, round), part) in tensors.iter().zip(rounds).zip(&self.parts) {
            for c in 0..t.chunks.len() {
                let (factor, lr, refuse) = match t.ef_factor(c, round.lr) {
                    Ok((factor, lr)) => (factor, lr, None),
                    Err(e) => (1.0, None, Some(e)),
                };
                refused.push(refuse);
                lr_used.push((round.round, lr));
                entries.push(t.entry(c, round, factor, arena + part.region as u64));
            }
        }
        let staging = match self.staging.take_idle() {
            Some(StagingBuf(s)) if s.as_ref().len() >= self.arena_bytes => s,
            _ => self
                .device
                .alloc_staging(self.arena_bytes)
                .map_err(|e| self.device_error(e))?,
        };
        let table = self.table;
        let launched = (|| {
            let mut host = self.table_host.lock().unwrap_or_else(|p| p.into_inner());
            self.device.wait_staged(&mut host)?;
            let bytes = table_bytes(&entries);
            host.as_mut()[..bytes.len()].copy_from_slice(bytes);
            // SAFETY: the device table holds `entries` entries; the staging is busy until its
            // copy ran (waited for above before the next write).
            unsafe {
                self.device
                    .upload_staged(&mut host, 0..bytes.len(), table)?
            };
            drop(host);
            for step in Step::COMPRESS {
                if let Some(launch) = Launch::of(step, &entries) {
                    // SAFETY: the table's addresses are the tensors' state, scratch and
                    // arena regions (sized for their chunks) and the caller's buffers.
                    unsafe { self.device.launch(&launch, table, entries.len())? };
                }
            }
            Ok(())
        })();
        let mut staging = staging;
        let copied = launched.and_then(|()| {
            // SAFETY: the arena holds arena_bytes; the staging at least as many.
            unsafe { self.device.stage(arena, &mut staging, 0..self.arena_bytes) }
        });
        if let Err(e) = copied {
            let _ = self.device.wait_staged(&mut staging);
            self.staging.give_back(StagingBuf(staging));
            return Err(self.device_error(e));
        }
        Ok(Started {
            batch: self.clone(),
            received: Mutex::new(vec![0; entries.len()]),
            entries,
            refused,
            lr_used,
            staging: Mutex::new(Some(staging)),
            staged: OnceLock::new(),
        })
    }
}

/// One round of a [`Batch`] in flight: the entries it launched and the staging its payloads
/// land in. It keeps its batch (the table, arena and staging its device work uses) alive.
/// Shared by the rounds of its tensors (`Sync`); dropped without being waited for, it waits
/// for its copy and gives the staging back.
pub struct Started<D: Device> {
    batch: Arc<Batch<D>>,
    /// Each chunk's [`flag::PRESENT`] word: whether its result is in the batch's decode
    /// staging (or its sum was not finite).
    received: Mutex<Vec<u32>>,
    entries: Vec<Entry>,
    refused: Vec<Option<KernelError>>,
    /// Each chunk's round and the learning rate its error feedback used.
    lr_used: Vec<(u64, Option<f32>)>,
    /// The staging until the first [`Started::finish`] waits for it.
    staging: Mutex<Option<D::Staging>>,
    /// The staging once waited for, as `Bytes` (or why the wait failed).
    staged: OnceLock<Result<Bytes, String>>,
}

impl<D: Device> std::fmt::Debug for Started<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Started")
            .field("chunks", &self.entries.len())
            .field("waited", &self.staged.get().is_some())
            .finish()
    }
}

impl<D: Device> Drop for Started<D> {
    fn drop(&mut self) {
        let staging = self.staging.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(mut s) = staging.take() {
            // Never hand out staging a copy is still writing into.
            if self.batch.device.wait_staged(&mut s).is_ok() {
                self.batch.staging.give_back(StagingBuf(s));
            }
        }
    }
}

impl<D: Device> Started<D> {
    /// Waits until the batch's payloads are in host staging (a blocking wait on the device:
    /// an async caller runs it off its async threads); [`Started::finish`] then finds them
    /// there. The error is the one every chunk's `finish` returns.
    pub fn wait_staged(&self) -> Result<(), String> {
        self.staged().map(drop)
    }

    /// The staged arena, waited for by the first caller.
    fn staged(&self) -> Result<&Bytes, String> {
        self.staged
            .get_or_init(|| {
                let taken = self
                    .staging
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                let mut s = taken.ok_or("the batch's staging is gone")?;
                self.batch.device.wait_staged(&mut s).map_err(|e| {
                    format!(
                        "waiting for the payloads on {}: {e}",
                        self.batch.device.place()
                    )
                })?;
                Ok(self.batch.staging.freeze(StagingBuf(s)))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Chunk `chunk` of the batch's tensor `part` (`tensor`, the one it was started with):
    /// waits for the batch's payloads (the first call does; later ones find them there),
    /// judges the chunk (the first failed check, in the order of the steps, is the error, as
    /// on the CPU) and, if it passed, commits its new error-feedback and momentum state.
    /// Returns its payload, a slice of the page-locked staging.
    pub fn finish(
        &self,
        part: usize,
        tensor: &mut DeviceTensor<D>,
        chunk: usize,
    ) -> Result<Bytes, KernelError> {
        let i = self.batch.parts[part].first + chunk;
        if let Some(e) = &self.refused[i] {
            return Err(e.clone());
        }
        let staged = self.staged().map_err(|detail| KernelError::Device {
            compressor: tensor.name(chunk).to_string(),
            device: self.batch.device.place().to_string(),
            detail,
        })?;
        let entry = &self.entries[i];
        let (slot, payload) = (tensor.chunks[chunk].slot, tensor.chunks[chunk].payload);
        let at = self.batch.parts[part].region + slot;
        self.judge(
            tensor,
            chunk,
            entry,
            &staged[at..at + super::slot_bytes(payload)],
        )?;
        let (round, lr) = self.lr_used[i];
        tensor.commit(chunk, round, lr);
        Ok(staged.slice(at..at + payload))
    }

    /// The error of a finished compression whose checks failed, if any.
    fn judge(
        &self,
        tensor: &DeviceTensor<D>,
        chunk: usize,
        entry: &Entry,
        slot: &[u8],
    ) -> Result<(), KernelError> {
        let c = &tensor.chunks[chunk];
        let flags = read_flags(slot, c.payload).ok_or_else(|| {
            tensor.device_error(chunk, CudaError::Invalid("a slot without flags".into()))
        })?;
        if flags[flag::NESTEROV] != 0 {
            return Err(tensor.not_finite(chunk, entry.g, "the momentum update overflows f32"));
        }
        if flags[flag::EF_INPUT] != 0 {
            let input = if entry.m != 0 { entry.mp } else { entry.g };
            return Err(tensor.not_finite(
                chunk,
                input,
                "the gradient plus the error-feedback residual overflows f32",
            ));
        }
        let first_bad =
            u64::from(flags[flag::FIRST_BAD]) | (u64::from(flags[flag::FIRST_BAD + 1]) << 32);
        if first_bad != u64::MAX {
            return Err(tensor.not_finite(
                chunk,
                entry.x,
                &format!("input element {first_bad} is not finite"),
            ));
        }
        if let Some(scheme) = &c.scheme {
            if let Some(problem) = scheme.header_problem(c.len, &slot[..c.payload]) {
                return Err(KernelError::Overflow {
                    compressor: c.name.clone(),
                    detail: problem,
                });
            }
        }
        if flags[flag::EF_RESIDUAL] != 0 {
            return Err(KernelError::Overflow {
                compressor: c.name.clone(),
                detail: "the new residual p - D(C(p)) overflows f32".into(),
            });
        }
        Ok(())
    }

    /// Takes the pulled `payload` of chunk `chunk` of tensor `part` (`tensor`, the server's
    /// sum in the chunk's encoding): refuses what the CPU decoders refuse (a wrong length, a
    /// bad header, non-zero padding, a level out of range), else copies it into the batch's
    /// decode staging, for [`Started::decode`].
    pub fn receive(
        &self,
        part: usize,
        tensor: &DeviceTensor<D>,
        chunk: usize,
        payload: &[u8],
    ) -> Result<(), KernelError> {
        tensor.check_payload(chunk, payload)?;
        let at = self.batch.parts[part].region + tensor.chunks[chunk].slot;
        let mut staging = self.batch.decode.lock().unwrap_or_else(|p| p.into_inner());
        // The staging may still be on its way to the device from the last round.
        if let Err(e) = self.batch.device.wait_staged(&mut staging) {
            return Err(tensor.device_error(chunk, e));
        }
        staging.as_mut()[at..at + payload.len()].copy_from_slice(payload);
        self.received.lock().unwrap_or_else(|p| p.into_inner())
            [self.batch.parts[part].first + chunk] = 1;
        Ok(())
    }

    /// Chunk `chunk` of tensor `part` (`tensor`) has a non-finite sum (some worker's chunk,
    /// or the sum itself, held inf or NaN): undoes the chunk's round if this worker committed
    /// it, and [`Started::decode`] writes NaN over the chunk's output.
    pub fn receive_non_finite(&self, part: usize, tensor: &mut DeviceTensor<D>, chunk: usize) {
        let i = self.batch.parts[part].first + chunk;
        tensor.undo_chunk(chunk, self.lr_used[i].0);
        self.received.lock().unwrap_or_else(|p| p.into_inner())[i] = flag::NON_FINITE;
    }

    /// Decodes every result received this round ([`Started::receive`]), of every tensor of the
    /// batch, into the rounds' outputs: one copy of the decode staging into the arena, then
    /// `Decode` (and `DecodeScatter`) over the table, averaged where the round asked. Only
    /// launches (later work on the device's stream is ordered after it); nothing when nothing
    /// was received. Call it once every round of the batch has received what it will.
    pub fn decode(&self) -> Result<(), KernelError> {
        let received =
            std::mem::take(&mut *self.received.lock().unwrap_or_else(|p| p.into_inner()));
        if received.iter().all(|&r| r == 0) {
            return Ok(());
        }
        let error = |e: CudaError| KernelError::Device {
            compressor: format!("a batch of {} chunks", self.entries.len()),
            device: self.batch.device.place().to_string(),
            detail: e.to_string(),
        };
        let mut staging = self.batch.decode.lock().unwrap_or_else(|p| p.into_inner());
        // Receiving waited for the staging's last copy: it is free to write.
        for (e, got) in self.entries.iter().zip(&received) {
            let at = (e.flags - self.batch.arena) as usize + 4 * flag::PRESENT;
            staging.as_mut()[at..at + 4].copy_from_slice(&got.to_le_bytes());
        }
        // SAFETY: the arena holds arena_bytes, which the staging mirrors; the entries'
        // addresses are those `start` was given.
        unsafe {
            self.batch
                .device
                .upload_staged(&mut staging, 0..self.batch.arena_bytes, self.batch.arena)
                .map_err(error)?;
            drop(staging);
            for step in Step::DECODE {
                if let Some(launch) = Launch::of(step, &self.entries) {
                    self.batch
                        .device
                        .launch(&launch, self.batch.table, self.entries.len())
                        .map_err(error)?;
                }
            }
        }
        Ok(())
    }
}
