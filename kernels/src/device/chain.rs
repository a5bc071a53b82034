//! [`DeviceChain`]: one chunk's compressor chain on a [`Device`] (the steps are listed in the
//! module docs of [`crate::device`]).

use std::ops::Range;
use std::sync::Arc;

use super::Device;
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

/// Nesterov momentum's state: the momentum `m` and the compressor input `p`.
struct MomentumState<M> {
    mu: f32,
    m: M,
    p: M,
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
    /// Host staging of the raw fp32 encoding.
    host: Vec<f32>,
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
            }),
            _ => None,
        };
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
            host: Vec::new(),
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

    /// Compresses `x[range]` (the chunk's gradient, `len` elements) for `ctx.round` into `out`
    /// (replacing its contents). Error feedback and momentum change only when this succeeds.
    pub fn compress(
        &mut self,
        x: &D::Mem,
        range: Range<usize>,
        ctx: &RoundCtx<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), KernelError> {
        out.clear();
        if range.len() != self.len {
            return Err(KernelError::LengthMismatch {
                compressor: self.name.clone(),
                what: "input",
                expected: self.len,
                actual: range.len(),
            });
        }
        let n = self.len;
        let dev = self.device.clone();
        let name = self.name.clone();
        let place = dev.place();
        let de = |e: CudaError| KernelError::Device {
            compressor: name.clone(),
            device: place.to_string(),
            detail: e.to_string(),
        };
        // 1. Momentum: p = g + mu * (mu * m + g).
        if let Some(m) = &mut self.momentum {
            if !dev
                .nesterov((x, range.clone()), &m.m, m.mu, &mut m.p)
                .map_err(de)?
            {
                return Err(self.not_finite(x, range, "the momentum update overflows f32"));
            }
        }
        // 2. Error feedback: p = input + factor * e.
        let mut lr_used = None;
        if let Some(ef) = &mut self.ef {
            let factor = match ef.kind {
                EfKind::Vanilla => 1.0f32,
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
                    lr_used = Some(lr);
                    ef.prev_lr.map(|p| p / lr).unwrap_or(1.0)
                }
            };
            if !factor.is_finite() {
                return Err(KernelError::Context {
                    compressor: self.name.clone(),
                    detail: format!("learning-rate ratio {factor} is not finite"),
                });
            }
            let input = match &self.momentum {
                Some(m) => (&m.p, 0..n),
                None => (x, range.clone()),
            };
            let vanilla = ef.kind == EfKind::Vanilla;
            if !dev
                .ef_input(input.clone(), &ef.e, factor, vanilla, &mut ef.p)
                .map_err(de)?
            {
                let (mem, r) = input;
                return Err(self.not_finite(
                    mem,
                    r,
                    "the gradient plus the error-feedback residual overflows f32",
                ));
            }
        }
        // 3. The codec, on whatever the decorators left.
        let (src, src_range) = match (&self.ef, &self.momentum) {
            (Some(ef), _) => (&ef.p, 0..n),
            (None, Some(m)) => (&m.p, 0..n),
            (None, None) => (x, range.clone()),
        };
        let streams = self.streams(ctx.round);
        match &mut self.codec {
            Some((scheme, codec)) => {
                let compressed = dev.compress(codec, src, src_range.clone(), streams, out);
                if let Err(e) = compressed {
                    return Err(match e {
                        // Non-finite input (only possible without decorators, which check
                        // their own results): the CPU's error, naming the element.
                        CudaError::Invalid(m) if m.contains("not finite") => {
                            self.not_finite(src, src_range, &m)
                        }
                        e => de(e),
                    });
                }
                if let Some(problem) = scheme.header_problem(n, out) {
                    out.clear();
                    return Err(KernelError::Overflow {
                        compressor: self.name.clone(),
                        detail: problem,
                    });
                }
            }
            None => {
                self.host.resize(n, 0.0);
                dev.download(src, src_range.clone(), &mut self.host)
                    .map_err(de)?;
                if let Some(index) = self.host.iter().position(|v| !v.is_finite()) {
                    return Err(KernelError::NonFinite {
                        compressor: self.name.clone(),
                        what: "input",
                        index,
                        value: self.host[index],
                    });
                }
                out.reserve(4 * n);
                for v in &self.host {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        // 4. The new residual from the bytes actually sent: d = p - D(C(p)).
        if let Some(ef) = &mut self.ef {
            match &mut self.codec {
                Some((_, codec)) => dev.decode(codec, out, streams, &mut ef.d, 0..n, false),
                None => dev.upload(&self.host, &mut ef.d, 0),
            }
            .map_err(de)?;
            if !dev.ef_residual(&ef.p, &mut ef.d).map_err(de)? {
                out.clear();
                return Err(KernelError::Overflow {
                    compressor: self.name.clone(),
                    detail: "the new residual p - D(C(p)) overflows f32".into(),
                });
            }
        }
        // 5. Commit.
        if let Some(ef) = &mut self.ef {
            std::mem::swap(&mut ef.e, &mut ef.d);
            if lr_used.is_some() {
                ef.prev_lr = lr_used;
            }
        }
        if let Some(m) = &mut self.momentum {
            dev.momentum_update((x, range), &mut m.m, m.mu)
                .map_err(de)?;
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
                self.host.clear();
                self.host.extend(
                    payload
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                );
                dev.upload(&self.host, y, range.start)
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
