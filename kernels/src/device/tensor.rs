//! [`DeviceTensor`]: the chains of a tensor's chunks on a device (see the module docs of
//! [`crate::device`]): what each chunk compresses with, its state in device memory, and its
//! slot in a payload arena.

use std::sync::Arc;

use super::table::{opt, scheme, Entry};
use super::{slot_bytes, Device};
use crate::chunk::{chunk_codec, effective_spec, ChunkInfo};
use crate::cuda::scheme::num_pieces;
use crate::cuda::{CudaError, GpuScheme, RoundStreams};
use crate::error::KernelError;
use crate::params::EfKind;
use crate::rng::Role;
use crate::ChainState;

/// One chunk of a [`DeviceTensor`].
#[derive(Debug)]
pub(super) struct ChunkPlan {
    /// The chunk's chain, as the CPU names it (errors name it).
    pub(super) name: String,
    /// Element offset in the tensor.
    pub(super) offset: usize,
    /// Elements.
    pub(super) len: usize,
    /// The codec, or `None` for raw fp32.
    pub(super) scheme: Option<GpuScheme>,
    /// `(seed, key, role, rank)` of the random streams (the per-tensor seed, if set, replaces
    /// the job seed, as on the CPU).
    pub(super) who: (u64, u64, Role, u32),
    /// Payload bytes.
    pub(super) payload: usize,
    /// Byte offset of the chunk's slot (payload, then flags) in the tensor's region.
    pub(super) slot: usize,
    /// Byte offsets of its f64 block partials and f32 span partials in the scratch.
    pub(super) partials: usize,
    pub(super) spans: usize,
    /// The learning rate of its last committed round (corrected error feedback).
    pub(super) prev_lr: Option<f32>,
    /// Which half of the residual / momentum buffers holds the current state.
    pub(super) ef_half: usize,
    pub(super) m_half: usize,
    /// The last round committed and not undone, and the learning rate before it.
    committed: Option<(u64, Option<f32>)>,
}

impl ChunkPlan {
    pub(super) fn streams(&self, round: u64) -> RoundStreams {
        let (seed, key, role, rank) = self.who;
        RoundStreams::new(seed, key, round, role, rank)
    }

    fn scheme_code(&self) -> (u32, u32, u32) {
        match self.scheme {
            None => (scheme::RAW, 0, 0),
            Some(GpuScheme::Fp16) => (scheme::FP16, 0, 0),
            Some(GpuScheme::Bf16) => (scheme::BF16, 0, 0),
            Some(GpuScheme::OneBit { scaling }) => {
                (scheme::ONEBIT, 0, if scaling { opt::SCALING } else { 0 })
            }
            Some(GpuScheme::MinMax { bits, .. }) => (scheme::MINMAX, bits, 0),
            Some(GpuScheme::Dithering {
                levels,
                natural,
                l2,
                ..
            }) => {
                let o = if natural { opt::NATURAL } else { 0 } | if l2 { opt::L2 } else { 0 };
                (scheme::DITHER, levels, o)
            }
            Some(GpuScheme::RandomK { .. }) => (scheme::RANDOMK, 0, 0),
        }
    }
}

/// Error feedback's state: the addresses of the residual `e` (two halves: the current one and
/// the next round's candidate) and of the codec input `ep`, each the tensor's length.
struct Ef {
    kind: EfKind,
    at: [u64; 3],
}

/// Nesterov momentum's state: the addresses of `m` (two halves, as `e`) and of its output
/// `mp`.
struct Momentum {
    mu: f32,
    at: [u64; 3],
}

/// What one round of a tensor needs besides its state: its buffers' device addresses, its
/// number and learning rate, and the divisor of an average.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchRound {
    /// The gradient (the tensor's length in f32).
    pub input: u64,
    /// Where results are decoded (the input itself for an in-place call).
    pub output: u64,
    /// The round number.
    pub round: u64,
    /// This round's learning rate (corrected error feedback needs it).
    pub lr: Option<f32>,
    /// Divide the results by this (the number of workers of an average).
    pub average_over: Option<f32>,
}

/// The device chains of every chunk of one tensor and their state in device memory. Built once
/// (at a tensor's first device round) and kept with the tensor; launched through a
/// [`super::Batch`].
pub struct DeviceTensor<D: Device> {
    pub(super) device: Arc<D>,
    pub(super) chunks: Vec<ChunkPlan>,
    len: usize,
    ef: Option<Ef>,
    momentum: Option<Momentum>,
    /// The address of every chunk's reduction partials.
    scratch_at: u64,
    /// The device memory behind `ef`, `momentum` and `scratch_at`.
    _owned: (Vec<D::Mem>, D::Bytes),
    /// Bytes of the tensor's region of a payload arena.
    pub(super) region: usize,
    /// Device bytes this holds.
    bytes: u64,
}

impl<D: Device> std::fmt::Debug for DeviceTensor<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTensor")
            .field("chain", &self.chunks.first().map(|c| c.name.as_str()))
            .field("chunks", &self.chunks.len())
            .field("len", &self.len)
            .field("place", &self.device.place())
            .finish()
    }
}

impl<D: Device> DeviceTensor<D> {
    /// The chains of a tensor whose chunks `infos` describes (in order, covering the tensor),
    /// or `Ok(None)` when its compressor has no device kernel (top-k, column-wise onebit,
    /// Elias-coded dithering, Moniqua: the caller compresses it with the CPU chains). Errors
    /// are those of [`chunk_codec`] (a bad parameter map, named), or the device's (an
    /// allocation that failed names the device and the bytes asked for).
    pub fn build(device: &Arc<D>, infos: &[ChunkInfo<'_>]) -> Result<Option<Self>, String> {
        let mut chunks = Vec::with_capacity(infos.len());
        let (mut ef, mut momentum) = (None, None);
        let (mut offset, mut slot, mut scratch) = (0usize, 0usize, 0usize);
        for info in infos {
            // The CPU chain validates the map exactly as every other node does, names it and
            // states the payload size the kernels write (the same bytes).
            let chain = chunk_codec(info)?;
            let name = chain.name().to_string();
            let spec = effective_spec(info.params, info.tensor_len, info.min_compress_bytes)?;
            let len = usize::try_from(info.chunk_len)
                .map_err(|_| format!("chunk of {} elements is too large", info.chunk_len))?;
            let full = usize::try_from(info.full_chunk_len.max(info.chunk_len))
                .map_err(|_| format!("chunk of {} elements is too large", info.full_chunk_len))?;
            let role = info.node.role();
            let scheme = match spec.codec.kind().name {
                "none" => None,
                _ => match GpuScheme::from_spec(&spec, len, (full != len).then_some(full), role)
                    .map_err(|e| e.to_string())?
                {
                    Some(s) => {
                        s.validate(len).map_err(|e| format!("{name}: {e}"))?;
                        Some(s)
                    }
                    None => return Ok(None),
                },
            };
            ef = spec.ef;
            momentum = match role {
                Role::Worker => spec.momentum_mu,
                Role::Server => None,
            };
            let payload = chain.max_compressed_len();
            let (n, bucket) = (len as u64, scheme.map_or(len, |s| s.bucket_len(len)) as u64);
            let (partials, spans) = match scheme {
                Some(GpuScheme::OneBit { .. }) => (num_pieces(n, n.max(1), 256), 0),
                Some(GpuScheme::MinMax { .. }) => (0, num_pieces(n, bucket, 2048)),
                Some(GpuScheme::Dithering { l2: true, .. }) => (num_pieces(n, bucket, 256), 0),
                Some(GpuScheme::Dithering { l2: false, .. }) => (0, num_pieces(n, bucket, 2048)),
                _ => (0, 0),
            };
            chunks.push(ChunkPlan {
                name,
                offset,
                len,
                scheme,
                who: (
                    spec.seed.unwrap_or(info.job_seed),
                    info.key,
                    role,
                    info.node.draw_rank(),
                ),
                payload,
                slot,
                partials: scratch,
                spans: scratch + 8 * partials as usize,
                prev_lr: None,
                ef_half: 0,
                m_half: 0,
                committed: None,
            });
            offset += len;
            slot += slot_bytes(payload);
            scratch += 8 * partials as usize + 8 * spans as usize;
        }
        let dev_err = |e: CudaError| {
            let chain = chunks.first().map_or("", |c: &ChunkPlan| c.name.as_str());
            format!("{chain} on {}: {e}", device.place())
        };
        let zeros = || device.alloc_zeros(offset).map_err(dev_err);
        let mut owned = Vec::new();
        let mut three = || -> Result<[u64; 3], String> {
            let mut at = [0; 3];
            for a in &mut at {
                let mem = zeros()?;
                *a = device.mem_addr(&mem);
                owned.push(mem);
            }
            Ok(at)
        };
        let ef = match ef {
            Some(kind) => Some(Ef { kind, at: three()? }),
            None => None,
        };
        let momentum = match momentum {
            Some(mu) => Some(Momentum { mu, at: three()? }),
            None => None,
        };
        let scratch_mem = device.alloc_bytes(scratch).map_err(dev_err)?;
        let scratch_at = device.bytes_addr(&scratch_mem);
        let buffers = 3 * (ef.is_some() as u64 + momentum.is_some() as u64);
        let bytes = buffers * 4 * offset as u64 + scratch as u64;
        Ok(Some(DeviceTensor {
            device: device.clone(),
            chunks,
            len: offset,
            ef,
            momentum,
            scratch_at,
            _owned: (owned, scratch_mem),
            region: slot,
            bytes,
        }))
    }

    /// The chain of chunk `chunk`, as the CPU names it (e.g. `nesterov(mu=0.9, ef(vanilla,
    /// onebit))`).
    pub fn name(&self, chunk: usize) -> &str {
        &self.chunks[chunk].name
    }

    /// Chunks.
    pub fn num_chunks(&self) -> usize {
        self.chunks.len()
    }

    /// The tensor's elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the tensor is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device.
    pub fn device(&self) -> &Arc<D> {
        &self.device
    }

    /// Device bytes this tensor's chains hold (residual, momentum, scratch; a batch's arena,
    /// table and staging are counted by [`super::Batch::bytes`]).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes of the tensor's region of a payload arena.
    pub fn region_bytes(&self) -> usize {
        self.region
    }

    pub(super) fn device_error(&self, chunk: usize, e: CudaError) -> KernelError {
        KernelError::Device {
            compressor: self.chunks[chunk].name.clone(),
            device: self.device.place().to_string(),
            detail: e.to_string(),
        }
    }

    /// Error feedback's factor on chunk `chunk`'s residual this round, and the learning rate
    /// to commit with it (corrected error feedback).
    pub(super) fn ef_factor(
        &self,
        chunk: usize,
        lr: Option<f32>,
    ) -> Result<(f32, Option<f32>), KernelError> {
        let Some(ef) = &self.ef else {
            return Ok((1.0, None));
        };
        let name = || self.chunks[chunk].name.clone();
        let (factor, lr_used) = match ef.kind {
            EfKind::Vanilla => (1.0f32, None),
            EfKind::Corrected => {
                let lr = lr.ok_or_else(|| KernelError::Context {
                    compressor: name(),
                    detail: "corrected error feedback needs the learning rate of this round \
                             in RoundCtx::lr"
                        .into(),
                })?;
                if !(lr.is_finite() && lr > 0.0) {
                    return Err(KernelError::Context {
                        compressor: name(),
                        detail: format!(
                            "learning rate {lr} in RoundCtx::lr must be finite and > 0"
                        ),
                    });
                }
                let prev = self.chunks[chunk].prev_lr;
                (prev.map(|p| p / lr).unwrap_or(1.0), Some(lr))
            }
        };
        if !factor.is_finite() {
            return Err(KernelError::Context {
                compressor: name(),
                detail: format!("learning-rate ratio {factor} is not finite"),
            });
        }
        Ok((factor, lr_used))
    }

    /// Chunk `chunk`'s table entry for a round: `arena` is the device address of the tensor's
    /// region of the batch's payload arena.
    pub(super) fn entry(&self, chunk: usize, round: &BatchRound, factor: f32, arena: u64) -> Entry {
        let c = &self.chunks[chunk];
        let f32_at = |base: u64| base + 4 * c.offset as u64;
        let (code, param, mut opts) = c.scheme_code();
        let streams = c.streams(round.round);
        let (k, scale) = match c.scheme {
            Some(GpuScheme::RandomK { k, unbiased }) => {
                (k as u64, GpuScheme::randomk_scale(c.len, k, unbiased))
            }
            _ => (0, 1.0),
        };
        let g = f32_at(round.input);
        let mut e = Entry {
            g,
            x: g,
            y: f32_at(round.output),
            n: c.len as u64,
            payload: arena + c.slot as u64,
            flags: arena + (c.slot + super::flags_at(c.payload)) as u64,
            partials: self.scratch_at + c.partials as u64,
            spans: self.scratch_at + c.spans as u64,
            bucket: c.scheme.map_or(c.len, |s| s.bucket_len(c.len)) as u64,
            k,
            rounding: streams.rounding.base(),
            indices: streams.indices.base(),
            scheme: code,
            param,
            factor,
            scale,
            divisor: round.average_over.unwrap_or(1.0),
            ..Entry::default()
        };
        if round.average_over.is_some() {
            opts |= opt::AVERAGE;
        }
        if let Some(m) = &self.momentum {
            e.m = f32_at(m.at[c.m_half]);
            e.m_next = f32_at(m.at[1 - c.m_half]);
            e.mp = f32_at(m.at[2]);
            e.mu = m.mu;
            e.x = e.mp;
        }
        if let Some(ef) = &self.ef {
            e.e = f32_at(ef.at[c.ef_half]);
            e.d = f32_at(ef.at[1 - c.ef_half]);
            e.ep = f32_at(ef.at[2]);
            e.x = e.ep;
            if ef.kind == EfKind::Vanilla {
                opts |= opt::VANILLA;
            }
        }
        e.opts = opts;
        e
    }

    /// Commits chunk `chunk`'s round `round`: the new residual and momentum become the state
    /// (the old stay in the other halves until the next launch).
    pub(super) fn commit(&mut self, chunk: usize, round: u64, lr_used: Option<f32>) {
        let c = &mut self.chunks[chunk];
        c.committed = Some((round, c.prev_lr));
        if self.ef.is_some() {
            c.ef_half = 1 - c.ef_half;
            if lr_used.is_some() {
                c.prev_lr = lr_used;
            }
        }
        if self.momentum.is_some() {
            c.m_half = 1 - c.m_half;
        }
    }

    /// Undoes round `round` of chunk `chunk` if it committed it (as `Compressor::undo` does
    /// on the CPU): the residual and momentum before it become the state again. `round` must
    /// be the tensor's last launched round (a later launch overwrites the other halves).
    pub(super) fn undo_chunk(&mut self, chunk: usize, round: u64) {
        let c = &mut self.chunks[chunk];
        let Some((_, prev_lr)) = c.committed.take_if(|(r, _)| *r == round) else {
            return;
        };
        c.prev_lr = prev_lr;
        if self.ef.is_some() {
            c.ef_half = 1 - c.ef_half;
        }
        if self.momentum.is_some() {
            c.m_half = 1 - c.m_half;
        }
    }

    /// Undoes round `round` of every chunk that committed it (see
    /// [`pushpull_kernels::Compressor::undo`](crate::Compressor::undo)): for a round whose
    /// step was discarded. `round` must be the tensor's last launched round; any other does
    /// nothing useful and may do harm, so callers undo only the round they just ran (the
    /// worker: at the next round's start, or at a checkpoint before it, of its last sum round,
    /// the only kind of round that launches the chains).
    pub fn undo(&mut self, round: u64) {
        for chunk in 0..self.chunks.len() {
            self.undo_chunk(chunk, round);
        }
    }

    /// What the CPU decoders refuse in chunk `chunk`'s pulled `payload` (a wrong length, a bad
    /// header, non-zero padding, a level out of range), refused before anything reaches the
    /// device.
    pub(super) fn check_payload(&self, chunk: usize, payload: &[u8]) -> Result<(), KernelError> {
        let c = &self.chunks[chunk];
        if payload.len() != c.payload {
            return Err(KernelError::payload_exact(
                &c.name,
                c.payload,
                payload.len(),
            ));
        }
        match c.scheme.and_then(|s| s.payload_problem(c.len, payload)) {
            Some(problem) => Err(KernelError::Malformed {
                compressor: c.name.clone(),
                detail: problem,
            }),
            None => Ok(()),
        }
    }

    /// The error-feedback residual of chunk `chunk`, copied to the host (`None` without error
    /// feedback).
    pub fn residual(&self, chunk: usize) -> Result<Option<Vec<f32>>, KernelError> {
        let at = self.ef.as_ref().map(|ef| ef.at[self.chunks[chunk].ef_half]);
        self.read(chunk, at)
    }

    /// The momentum of chunk `chunk`, copied to the host (`None` without momentum).
    pub fn momentum(&self, chunk: usize) -> Result<Option<Vec<f32>>, KernelError> {
        let at = self
            .momentum
            .as_ref()
            .map(|m| m.at[self.chunks[chunk].m_half]);
        self.read(chunk, at)
    }

    /// Chunk `chunk`'s state as its CPU chain keeps it ([`crate::Compressor::state`]): the
    /// residual, the momentum and the learning rate of its last round, copied to the host (a
    /// checkpoint's).
    pub fn chain_state(&self, chunk: usize) -> Result<ChainState, KernelError> {
        Ok(ChainState {
            residual: self.residual(chunk)?,
            momentum: self.momentum(chunk)?,
            prev_lr: self.chunks[chunk].prev_lr,
        })
    }

    /// Makes `state` (a checkpoint's, as [`DeviceTensor::chain_state`] or the CPU chain gave
    /// it) chunk `chunk`'s state: the residual and momentum are copied into the current halves
    /// and the learning rate of the last round is set; nothing is left to undo. A state that
    /// lacks a buffer this chain keeps (or has one it does not), or of another length, is
    /// refused naming the chain, and nothing changes.
    pub fn set_chain_state(&mut self, chunk: usize, state: &ChainState) -> Result<(), KernelError> {
        let c = &self.chunks[chunk];
        let check = |what: &str, kept: bool, saved: &Option<Vec<f32>>| match (kept, saved) {
            (true, Some(v)) if v.len() == c.len => Ok(()),
            (true, Some(v)) => Err(KernelError::Context {
                compressor: c.name.clone(),
                detail: format!(
                    "the saved {what} has {} elements, the chunk {}",
                    v.len(),
                    c.len
                ),
            }),
            (false, None) => Ok(()),
            (kept, _) => Err(KernelError::Context {
                compressor: c.name.clone(),
                detail: format!(
                    "the saved state {} a {what}, which this chain {}",
                    if kept { "has no" } else { "has" },
                    if kept { "keeps" } else { "does not keep" }
                ),
            }),
        };
        check("residual", self.ef.is_some(), &state.residual)?;
        check("momentum", self.momentum.is_some(), &state.momentum)?;
        let f32_at = |base: u64| base + 4 * c.offset as u64;
        let copies = [
            (
                self.ef.as_ref().map(|ef| f32_at(ef.at[c.ef_half])),
                &state.residual,
            ),
            (
                self.momentum.as_ref().map(|m| f32_at(m.at[c.m_half])),
                &state.momentum,
            ),
        ];
        for (at, values) in copies {
            if let (Some(at), Some(values)) = (at, values) {
                // SAFETY: the buffer is the tensor's length; the chunk lies inside it, and
                // `values` has the chunk's length (checked above).
                unsafe { self.device.upload(values, at) }
                    .map_err(|e| self.device_error(chunk, e))?;
            }
        }
        let c = &mut self.chunks[chunk];
        c.prev_lr = state.prev_lr;
        c.committed = None;
        Ok(())
    }

    /// Chunk `chunk`'s part of the tensor-long buffer at `base`, copied to the host.
    fn read(&self, chunk: usize, base: Option<u64>) -> Result<Option<Vec<f32>>, KernelError> {
        let Some(base) = base else { return Ok(None) };
        let c = &self.chunks[chunk];
        let mut v = vec![0.0; c.len];
        let at = base + 4 * c.offset as u64;
        // SAFETY: `mem` is the tensor's length; the chunk lies inside it.
        unsafe { self.device.download(at, &mut v) }.map_err(|e| self.device_error(chunk, e))?;
        Ok(Some(v))
    }

    /// The first non-finite element of `len` f32 at `addr` (read back from the device) as
    /// chunk `chunk`'s error, else `overflow`.
    pub(super) fn not_finite(&self, chunk: usize, addr: u64, overflow: &str) -> KernelError {
        let c = &self.chunks[chunk];
        let mut host = vec![0.0; c.len];
        // SAFETY: `addr` is one of the round's chunk buffers (its entry's), `len` long.
        if let Err(e) = unsafe { self.device.download(addr, &mut host) } {
            return self.device_error(chunk, e);
        }
        match host.iter().position(|v| !v.is_finite()) {
            Some(index) => KernelError::NonFinite {
                compressor: c.name.clone(),
                what: "input",
                index,
                value: host[index],
            },
            None => KernelError::Overflow {
                compressor: c.name.clone(),
                detail: overflow.to_string(),
            },
        }
    }
}
