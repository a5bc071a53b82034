//! [`DeviceChain`]: one chunk's compressor chain on a [`Device`] (the steps are listed in the
//! module docs of [`crate::device`]).

use std::ops::Range;
use std::sync::Arc;

use super::{flag, read_flags, staging_bytes, Device};
use crate::chunk::{chunk_codec, effective_spec, ChunkInfo};
use crate::cuda::{CudaError, GpuScheme, RoundStreams};
use crate::error::KernelError;
use crate::params::{CodecSpec, EfKind};
use crate::rng::Role;
use crate::RoundCtx;

/// Error feedback's state: the residual `e` and two scratch buffers of the chunk's length.
struct EfState<M> {
    kind: EfKind,
    e: M,
    p: M,
    d: M,
    prev_lr: Option<f32>,
}

/// Nesterov momentum's state: the momentum `m`, the compressor input `p`, and the next
/// momentum `next` (computed while the round runs, kept only if it succeeds).
struct MomentumState<M> {
    mu: f32,
    m: M,
    p: M,
    next: M,
}

/// A compression [`DeviceChain::start`]ed on the device: its staging (the payload and the
/// chunk's flags land there) and what [`DeviceChain::finish`] needs to judge and commit it.
#[derive(Debug)]
pub struct Started<S> {
    staging: S,
    /// Payload bytes.
    len: usize,
    /// The learning rate corrected error feedback used, committed with the round.
    lr_used: Option<f32>,
    range: Range<usize>,
}

impl<S> Started<S> {
    /// Gives the staging back without finishing (the caller will not use this compression).
    pub fn into_staging(self) -> S {
        self.staging
    }
}

/// What the codec compresses: error feedback's `p` if there is error feedback, else
/// momentum's `p` if there is momentum, else the gradient `x[range]`.
fn source<'a, M>(
    ef: Option<&'a EfState<M>>,
    momentum: Option<&'a MomentumState<M>>,
    x: &'a M,
    range: Range<usize>,
    n: usize,
) -> (&'a M, Range<usize>) {
    match (ef, momentum) {
        (Some(ef), _) => (&ef.p, 0..n),
        (None, Some(m)) => (&m.p, 0..n),
        (None, None) => (x, range),
    }
}

/// One chunk's `Momentum(ErrorFeedback(codec))` on a device: the same payload bytes, decoded
/// values and state as the CPU chain that [`chunk_codec`] builds for the same [`ChunkInfo`].
pub struct DeviceChain<D: Device> {
    device: Arc<D>,
    name: String,
    len: usize,
    /// `(seed, key, role, rank)` of the random streams (the per-tensor seed, if set, replaces
    /// the job seed, as on the CPU).
    who: (u64, u64, Role, u32),
    /// The kernels, or `None` for raw fp32 (a copy to the host).
    codec: Option<(GpuScheme, D::Codec)>,
    ef: Option<EfState<D::Mem>>,
    momentum: Option<MomentumState<D::Mem>>,
    /// The chunk's check results on the device.
    flags: D::Flags,
    /// Raw fp32 results' way to the device (made at the first one).
    upload: Option<D::Staging>,
}

impl<D: Device> std::fmt::Debug for DeviceChain<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceChain")
            .field("name", &self.name)
            .field("len", &self.len)
            .field("place", &self.device.place())
            .finish()
    }
}

impl<D: Device> DeviceChain<D> {
    /// The chain of the chunk `info` describes on `device`, or `Ok(None)` when its compressor
    /// has no device kernel (top-k, column-wise onebit, Elias-coded dithering, Moniqua: the
    /// caller compresses that chunk with the CPU chain). Errors are those of [`chunk_codec`]
    /// (a bad parameter map, named), or the device's.
    pub fn build(device: &Arc<D>, info: &ChunkInfo<'_>) -> Result<Option<DeviceChain<D>>, String> {
        // The CPU chain validates the map exactly as every other node does and names the chain.
        let name = chunk_codec(info)?.name().to_string();
        let spec = effective_spec(info.params, info.tensor_len, info.min_compress_bytes)?;
        let len = usize::try_from(info.chunk_len)
            .map_err(|_| format!("chunk of {} elements is too large", info.chunk_len))?;
        let full = usize::try_from(info.full_chunk_len.max(info.chunk_len))
            .map_err(|_| format!("chunk of {} elements is too large", info.full_chunk_len))?;
        let role = info.node.role();
        let scheme = match spec.codec {
            CodecSpec::None => None,
            _ => match GpuScheme::from_spec(&spec, len, (full != len).then_some(full), role)
                .map_err(|e| e.to_string())?
            {
                Some(s) => Some(s),
                None => return Ok(None),
            },
        };
        let dev_err = |e: CudaError| format!("{name} on {}: {e}", device.place());
        let codec = match scheme {
            Some(s) => Some((s, device.codec(s, len).map_err(dev_err)?)),
            None => None,
        };
        let zeros = || device.alloc_zeros(len).map_err(dev_err);
        let ef = match spec.ef {
            Some(kind) => Some(EfState {
                kind,
                e: zeros()?,
                p: zeros()?,
                d: zeros()?,
                prev_lr: None,
            }),
            None => None,
        };
        let momentum = match (spec.momentum_mu, role) {
            (Some(mu), Role::Worker) => Some(MomentumState {
                mu,
                m: zeros()?,
                p: zeros()?,
                next: zeros()?,
            }),
            _ => None,
        };
        let flags = device.alloc_flags().map_err(dev_err)?;
        Ok(Some(DeviceChain {
            device: device.clone(),
            name,
            len,
            who: (
                spec.seed.unwrap_or(info.job_seed),
                info.key,
                role,
                info.node.draw_rank(),
            ),
            codec,
            ef,
            momentum,
            flags,
            upload: None,
        }))
    }

    /// The chain's name, as the CPU chain's (e.g. `nesterov(mu=0.9, ef(vanilla, onebit))`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The chunk length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the chunk is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device.
    pub fn device(&self) -> &Arc<D> {
        &self.device
    }

    fn streams(&self, round: u64) -> RoundStreams {
        let (seed, key, role, rank) = self.who;
        RoundStreams::new(seed, key, round, role, rank)
    }

    fn device_error(&self, e: CudaError) -> KernelError {
        KernelError::Device {
            compressor: self.name.clone(),
            device: self.device.place().to_string(),
            detail: e.to_string(),
        }
    }

    /// The error for a step whose result was not finite: the first non-finite element of the
    /// input if there is one (read back from the device), else `overflow`.
    fn not_finite(&self, x: &D::Mem, range: Range<usize>, overflow: &str) -> KernelError {
        let mut host = vec![0.0; range.len()];
        if let Err(e) = self.device.download(x, range, &mut host) {
            return self.device_error(e);
        }
        match host.iter().position(|v| !v.is_finite()) {
            Some(index) => KernelError::NonFinite {
                compressor: self.name.clone(),
                what: "input",
                index,
                value: host[index],
            },
            None => KernelError::Overflow {
                compressor: self.name.clone(),
                detail: overflow.to_string(),
            },
        }
    }

    /// Bytes of staging [`DeviceChain::start`] needs.
    pub fn staging_bytes(&self) -> usize {
        staging_bytes(match &self.codec {
            Some((scheme, _)) => scheme.compressed_len(self.len),
            None => 4 * self.len,
        })
    }

    /// Compresses `x[range]` (the chunk's gradient, `len` elements) for `ctx.round` into `out`
    /// (replacing its contents): [`DeviceChain::start`] and [`DeviceChain::finish`] at once,
    /// through staging of its own. Error feedback and momentum change only when this succeeds.
    pub fn compress(
        &mut self,
        x: &D::Mem,
        range: Range<usize>,
        ctx: &RoundCtx<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), KernelError> {
        out.clear();
        let staging = self
            .device
            .alloc_staging(self.staging_bytes())
            .map_err(|e| self.device_error(e))?;
        let started = self.start(x, range, ctx, staging).map_err(|(e, _)| e)?;
        let (staging, len) = self.finish(x, started);
        out.extend_from_slice(&staging.as_ref()[..len?]);
        Ok(())
    }

    /// Launches the compression of `x[range]` for `ctx.round` on the device, with the payload
    /// and the chunk's check results copied into `staging` (at least
    /// [`DeviceChain::staging_bytes`]) as the device gets there; the host does not wait
    /// (except for raw fp32 under error feedback, whose residual needs the host copy). Errors
    /// found before anything is launched give the staging back.
    ///
    /// Nothing of the chain's state changes until [`DeviceChain::finish`] judges the round.
    /// Until then the chunk's range of `x` must not change, and no other compression of this
    /// chain may start.
    #[allow(clippy::type_complexity)]
    pub fn start(
        &mut self,
        x: &D::Mem,
        range: Range<usize>,
        ctx: &RoundCtx<'_>,
        mut staging: D::Staging,
    ) -> Result<Started<D::Staging>, (KernelError, D::Staging)> {
        if range.len() != self.len {
            return Err((
                KernelError::LengthMismatch {
                    compressor: self.name.clone(),
                    what: "input",
                    expected: self.len,
                    actual: range.len(),
                },
                staging,
            ));
        }
        if staging.as_ref().len() < self.staging_bytes() {
            let e = self.device_error(CudaError::Invalid(format!(
                "staging of {} bytes for a chunk that needs {}",
                staging.as_ref().len(),
                self.staging_bytes()
            )));
            return Err((e, staging));
        }
        let (factor, lr_used) = match self.ef_factor(ctx) {
            Ok(v) => v,
            Err(e) => return Err((e, staging)),
        };
        let streams = self.streams(ctx.round);
        match self.launch(x, range.clone(), streams, factor, &mut staging) {
            Ok(len) => Ok(Started {
                staging,
                len,
                lr_used,
                range,
            }),
            Err(e) => Err((self.device_error(e), staging)),
        }
    }

    /// Error feedback's factor on the residual for this round, and the learning rate to
    /// commit with it (corrected error feedback).
    fn ef_factor(&self, ctx: &RoundCtx<'_>) -> Result<(f32, Option<f32>), KernelError> {
        let Some(ef) = &self.ef else {
            return Ok((1.0, None));
        };
        let (factor, lr_used) = match ef.kind {
            EfKind::Vanilla => (1.0f32, None),
            EfKind::Corrected => {
                let lr = ctx.lr.ok_or_else(|| KernelError::Context {
                    compressor: self.name.clone(),
                    detail: "corrected error feedback needs the learning rate of this round \
                             in RoundCtx::lr"
                        .into(),
                })?;
                if !(lr.is_finite() && lr > 0.0) {
                    return Err(KernelError::Context {
                        compressor: self.name.clone(),
                        detail: format!(
                            "learning rate {lr} in RoundCtx::lr must be finite and > 0"
                        ),
                    });
                }
                (ef.prev_lr.map(|p| p / lr).unwrap_or(1.0), Some(lr))
            }
        };
        if !factor.is_finite() {
            return Err(KernelError::Context {
                compressor: self.name.clone(),
                detail: format!("learning-rate ratio {factor} is not finite"),
            });
        }
        Ok((factor, lr_used))
    }

    /// The device work of one compression (the steps of the module docs, 1 to 4, and the
    /// next momentum), ending with the copies into `staging`; the payload's length.
    fn launch(
        &mut self,
        x: &D::Mem,
        range: Range<usize>,
        streams: RoundStreams,
        factor: f32,
        staging: &mut D::Staging,
    ) -> Result<usize, CudaError> {
        let n = self.len;
        let dev = self.device.clone();
        let flags = &mut self.flags;
        dev.clear_flags(flags)?;
        // 1. Momentum: p = g + mu * (mu * m + g), and next = mu * m + g (kept on success).
        if let Some(m) = &mut self.momentum {
            dev.nesterov((x, range.clone()), &m.m, m.mu, &mut m.p, flags)?;
            dev.copy(&m.m, &mut m.next)?;
            dev.momentum_update((x, range.clone()), &mut m.next, m.mu)?;
        }
        // 2. Error feedback: p = input + factor * e.
        if let Some(ef) = &mut self.ef {
            let input = match &self.momentum {
                Some(m) => (&m.p, 0..n),
                None => (x, range.clone()),
            };
            let vanilla = ef.kind == EfKind::Vanilla;
            dev.ef_input(input, &ef.e, factor, vanilla, &mut ef.p, flags)?;
        }
        // 3. The codec, on whatever the decorators left.
        let len = match &mut self.codec {
            Some((_, codec)) => {
                let (src, r) = source(self.ef.as_ref(), self.momentum.as_ref(), x, range, n);
                let len = dev.compress(codec, src, r, streams, flags)?;
                // 4. The new residual from the bytes actually sent: d = p - D(C(p)).
                if let Some(ef) = &mut self.ef {
                    dev.decode_own(codec, streams, &mut ef.d, 0..n)?;
                    dev.ef_residual(&ef.p, &mut ef.d, flags)?;
                }
                dev.stage(codec, len, flags, staging)?;
                len
            }
            None => {
                if let Some(ef) = &mut self.ef {
                    // Raw fp32 sends p exactly (its bytes, NaN payloads too): D(C(p)) is a copy
                    // of p, made on the device.
                    dev.copy(&ef.p, &mut ef.d)?;
                    dev.ef_residual(&ef.p, &mut ef.d, flags)?;
                }
                let (src, r) = source(self.ef.as_ref(), self.momentum.as_ref(), x, range, n);
                dev.stage_raw(src, r, flags, staging)?;
                4 * n
            }
        };
        Ok(len)
    }

    /// Waits for a [`DeviceChain::start`]ed compression of `x` (the same buffer), judges it
    /// (the first failed check, in the order of the steps, is the error, as on the CPU) and,
    /// if it succeeded, commits error feedback's and momentum's new state. Gives back the
    /// staging, whose first bytes are the payload, and the payload's length.
    pub fn finish(
        &mut self,
        x: &D::Mem,
        started: Started<D::Staging>,
    ) -> (D::Staging, Result<usize, KernelError>) {
        let Started {
            mut staging,
            len,
            lr_used,
            range,
        } = started;
        if let Err(e) = self.device.wait_staged(&mut staging) {
            return (staging, Err(self.device_error(e)));
        }
        let verdict = self.judge(x, range, staging.as_ref(), len);
        if verdict.is_ok() {
            if let Some(ef) = &mut self.ef {
                std::mem::swap(&mut ef.e, &mut ef.d);
                if lr_used.is_some() {
                    ef.prev_lr = lr_used;
                }
            }
            if let Some(m) = &mut self.momentum {
                std::mem::swap(&mut m.m, &mut m.next);
            }
        }
        (staging, verdict.map(|()| len))
    }

    /// The error of a finished compression whose checks failed, if any.
    fn judge(
        &self,
        x: &D::Mem,
        range: Range<usize>,
        staged: &[u8],
        len: usize,
    ) -> Result<(), KernelError> {
        let n = self.len;
        let flags = read_flags(staged, len).ok_or_else(|| {
            self.device_error(CudaError::Invalid(format!(
                "staging of {} bytes for a payload of {len}",
                staged.len()
            )))
        })?;
        if flags[flag::NESTEROV] != 0 {
            return Err(self.not_finite(x, range, "the momentum update overflows f32"));
        }
        if flags[flag::EF_INPUT] != 0 {
            let (mem, r) = match &self.momentum {
                Some(m) => (&m.p, 0..n),
                None => (x, range.clone()),
            };
            return Err(self.not_finite(
                mem,
                r,
                "the gradient plus the error-feedback residual overflows f32",
            ));
        }
        let first_bad =
            u64::from(flags[flag::FIRST_BAD]) | (u64::from(flags[flag::FIRST_BAD + 1]) << 32);
        if first_bad != u64::MAX {
            let (src, src_range) = source(self.ef.as_ref(), self.momentum.as_ref(), x, range, n);
            return Err(self.not_finite(
                src,
                src_range,
                &format!("input element {first_bad} is not finite"),
            ));
        }
        if let Some((scheme, _)) = &self.codec {
            if let Some(problem) = scheme.header_problem(n, &staged[..len]) {
                return Err(KernelError::Overflow {
                    compressor: self.name.clone(),
                    detail: problem,
                });
            }
        }
        if flags[flag::EF_RESIDUAL] != 0 {
            return Err(KernelError::Overflow {
                compressor: self.name.clone(),
                detail: "the new residual p - D(C(p)) overflows f32".into(),
            });
        }
        Ok(())
    }

    /// Decodes a pulled `payload` (the server's sum, in this chunk's encoding) into `y[range]`,
    /// then divides it by `average_over` when given (the number of workers of an average).
    pub fn decompress(
        &mut self,
        payload: &[u8],
        ctx: &RoundCtx<'_>,
        y: &mut D::Mem,
        range: Range<usize>,
        average_over: Option<f32>,
    ) -> Result<(), KernelError> {
        let n = self.len;
        if range.len() != n {
            return Err(KernelError::LengthMismatch {
                compressor: self.name.clone(),
                what: "output",
                expected: n,
                actual: range.len(),
            });
        }
        let streams = self.streams(ctx.round);
        let dev = self.device.clone();
        let expected = match &self.codec {
            Some((scheme, _)) => scheme.compressed_len(n),
            None => 4 * n,
        };
        if payload.len() != expected {
            return Err(KernelError::payload_exact(
                &self.name,
                expected,
                payload.len(),
            ));
        }
        // What the CPU decoders refuse, refused before anything reaches the device.
        if let Some(problem) = self
            .codec
            .as_ref()
            .and_then(|(scheme, _)| scheme.payload_problem(n, payload))
        {
            return Err(KernelError::Malformed {
                compressor: self.name.clone(),
                detail: problem,
            });
        }
        match &mut self.codec {
            Some((_, codec)) => dev.decode(codec, payload, streams, y, range.clone(), false),
            None => {
                let upload = match &mut self.upload {
                    Some(u) => u,
                    None => self.upload.insert(
                        dev.alloc_staging(payload.len())
                            .map_err(|e| self.device_error(e))?,
                    ),
                };
                dev.upload_staged(payload, upload, y, range.start)
            }
        }
        .map_err(|e| self.device_error(e))?;
        if let Some(w) = average_over {
            dev.divide(y, range, w).map_err(|e| self.device_error(e))?;
        }
        Ok(())
    }

    /// The error-feedback residual, copied to the host (`None` without error feedback).
    pub fn residual(&self) -> Result<Option<Vec<f32>>, KernelError> {
        self.read(self.ef.as_ref().map(|ef| &ef.e))
    }

    /// The momentum, copied to the host (`None` without momentum).
    pub fn momentum(&self) -> Result<Option<Vec<f32>>, KernelError> {
        self.read(self.momentum.as_ref().map(|m| &m.m))
    }

    fn read(&self, mem: Option<&D::Mem>) -> Result<Option<Vec<f32>>, KernelError> {
        let Some(mem) = mem else { return Ok(None) };
        let mut v = vec![0.0; self.len];
        self.device
            .download(mem, 0..self.len, &mut v)
            .map_err(|e| self.device_error(e))?;
        Ok(Some(v))
    }
}
