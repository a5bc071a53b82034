//! [`EmulatedDevice`]: the [`Device`] of CI. Its memory is host `Vec<f32>`s and every kernel is
//! the host-compiled twin of the CUDA source (`kernels/cuda/host_shim.cpp` through
//! [`crate::cuda::host`]), launch sequence for launch sequence. It is slow (serial) and exists
//! so that the device data path (chunk ranges, payload sizes, residual and momentum state, the
//! order of steps) runs and is checked bit for bit where there is no GPU.
//!
//! Copies into [`EmulatedStaging`] are asynchronous as on a GPU: [`Device::stage`] only notes
//! them, and the staging's bytes change when [`Device::wait_staged`] is called, so a caller
//! that reads staging before waiting reads stale bytes here too (and the tests see it).

use std::ops::Range;

use super::{check_range, f32s_from_le, flag, flags_at, same_len, whole_f32s, Device};
use crate::cuda::{host, CudaError, Device as Place, GpuScheme, RoundStreams};

/// A device whose memory is host memory and whose kernels are the CUDA kernels' host twin.
#[derive(Debug, Default, Clone, Copy)]
pub struct EmulatedDevice;

/// The emulated device's codec: the scheme, the chunk length it was built for, and its
/// "device" payload buffer.
#[derive(Debug)]
pub struct EmulatedCodec {
    scheme: GpuScheme,
    len: usize,
    payload: Vec<u8>,
}

/// The emulated device's staging: host bytes, and the copies started into them but not yet
/// waited for.
#[derive(Debug, Default)]
pub struct EmulatedStaging {
    bytes: Vec<u8>,
    pending: Vec<(usize, Vec<u8>)>,
}

impl AsRef<[u8]> for EmulatedStaging {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl EmulatedStaging {
    fn start_copy(&mut self, at: usize, bytes: Vec<u8>) -> Result<(), CudaError> {
        check_range("stage", &(at..at + bytes.len()), self.bytes.len()).map_err(|_| {
            CudaError::Invalid(format!(
                "stage: {} bytes at {at} into staging of {}",
                bytes.len(),
                self.bytes.len()
            ))
        })?;
        self.pending.push((at, bytes));
        Ok(())
    }
}

fn flag_bytes(flags: &[u32; flag::WORDS]) -> Vec<u8> {
    flags.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn set_first_bad(flags: &mut [u32; flag::WORDS], x: &[f32]) {
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        let i = i as u64;
        flags[flag::FIRST_BAD] = i as u32;
        flags[flag::FIRST_BAD + 1] = (i >> 32) as u32;
    }
}

fn span<'a>(what: &str, mem: &'a [f32], range: Range<usize>) -> Result<&'a [f32], CudaError> {
    check_range(what, &range, mem.len())?;
    Ok(&mem[range])
}

fn span_mut<'a>(
    what: &str,
    mem: &'a mut [f32],
    range: Range<usize>,
) -> Result<&'a mut [f32], CudaError> {
    check_range(what, &range, mem.len())?;
    Ok(&mut mem[range])
}

impl Device for EmulatedDevice {
    type Mem = Vec<f32>;
    type Codec = EmulatedCodec;
    type Flags = [u32; flag::WORDS];
    type Staging = EmulatedStaging;

    fn place(&self) -> Place {
        Place::Emulated
    }

    fn alloc_zeros(&self, len: usize) -> Result<Vec<f32>, CudaError> {
        Ok(vec![0.0; len])
    }

    fn mem_len(&self, mem: &Vec<f32>) -> usize {
        mem.len()
    }

    fn upload(&self, src: &[f32], dst: &mut Vec<f32>, at: usize) -> Result<(), CudaError> {
        let end = at.saturating_add(src.len());
        span_mut("upload", dst, at..end)?.copy_from_slice(src);
        Ok(())
    }

    fn upload_staged(
        &self,
        bytes: &[u8],
        _staging: &mut EmulatedStaging,
        dst: &mut Vec<f32>,
        at: usize,
    ) -> Result<(), CudaError> {
        let n = whole_f32s("upload_staged", bytes)?;
        f32s_from_le(
            bytes,
            span_mut("upload_staged", dst, at..at.saturating_add(n))?,
        );
        Ok(())
    }

    fn download(
        &self,
        src: &Vec<f32>,
        range: Range<usize>,
        dst: &mut [f32],
    ) -> Result<(), CudaError> {
        let s = span("download", src, range)?;
        same_len("download", s.len(), dst.len())?;
        dst.copy_from_slice(s);
        Ok(())
    }

    fn copy(&self, src: &Vec<f32>, dst: &mut Vec<f32>) -> Result<(), CudaError> {
        same_len("copy", src.len(), dst.len())?;
        dst.copy_from_slice(src);
        Ok(())
    }

    fn codec(&self, scheme: GpuScheme, len: usize) -> Result<EmulatedCodec, CudaError> {
        scheme.validate(len)?;
        Ok(EmulatedCodec {
            scheme,
            len,
            payload: Vec::new(),
        })
    }

    fn alloc_flags(&self) -> Result<[u32; flag::WORDS], CudaError> {
        let mut flags = [0; flag::WORDS];
        self.clear_flags(&mut flags)?;
        Ok(flags)
    }

    fn clear_flags(&self, flags: &mut [u32; flag::WORDS]) -> Result<(), CudaError> {
        *flags = [0; flag::WORDS];
        flags[flag::FIRST_BAD] = u32::MAX;
        flags[flag::FIRST_BAD + 1] = u32::MAX;
        Ok(())
    }

    fn alloc_staging(&self, bytes: usize) -> Result<EmulatedStaging, CudaError> {
        Ok(EmulatedStaging {
            bytes: vec![0; bytes],
            pending: Vec::new(),
        })
    }

    fn compress(
        &self,
        codec: &mut EmulatedCodec,
        x: &Vec<f32>,
        range: Range<usize>,
        streams: RoundStreams,
        flags: &mut [u32; flag::WORDS],
    ) -> Result<usize, CudaError> {
        let x = span("compress", x, range)?;
        same_len("compress", x.len(), codec.len)?;
        set_first_bad(flags, x);
        if x.iter().all(|v| v.is_finite()) {
            host::compress(&codec.scheme, x, streams, &mut codec.payload)?;
        } else {
            // A GPU's kernels run on whatever they are given and the flag is what the host
            // reads; the host twin refuses non-finite input, so it gets zeros there instead
            // (the payload is discarded either way, and stays decodable for error feedback).
            let finite: Vec<f32> = x
                .iter()
                .map(|&v| if v.is_finite() { v } else { 0.0 })
                .collect();
            host::compress(&codec.scheme, &finite, streams, &mut codec.payload)?;
        }
        Ok(codec.payload.len())
    }

    fn decode_own(
        &self,
        codec: &mut EmulatedCodec,
        streams: RoundStreams,
        y: &mut Vec<f32>,
        range: Range<usize>,
    ) -> Result<(), CudaError> {
        let y = span_mut("decode_own", y, range)?;
        same_len("decode_own", y.len(), codec.len)?;
        host::decompress(&codec.scheme, &codec.payload, streams, y)
    }

    fn stage(
        &self,
        codec: &EmulatedCodec,
        len: usize,
        flags: &[u32; flag::WORDS],
        staging: &mut EmulatedStaging,
    ) -> Result<(), CudaError> {
        let payload = codec.payload.get(..len).ok_or_else(|| {
            CudaError::Invalid(format!(
                "stage: {len} bytes of a payload of {}",
                codec.payload.len()
            ))
        })?;
        staging.start_copy(0, payload.to_vec())?;
        staging.start_copy(flags_at(len), flag_bytes(flags))
    }

    fn stage_raw(
        &self,
        src: &Vec<f32>,
        range: Range<usize>,
        flags: &mut [u32; flag::WORDS],
        staging: &mut EmulatedStaging,
    ) -> Result<(), CudaError> {
        let x = span("stage_raw", src, range)?;
        set_first_bad(flags, x);
        let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let len = bytes.len();
        staging.start_copy(0, bytes)?;
        staging.start_copy(flags_at(len), flag_bytes(flags))
    }

    fn wait_staged(&self, staging: &mut EmulatedStaging) -> Result<(), CudaError> {
        for (at, bytes) in std::mem::take(&mut staging.pending) {
            staging.bytes[at..at + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(())
    }

    fn decode(
        &self,
        codec: &mut EmulatedCodec,
        payload: &[u8],
        streams: RoundStreams,
        y: &mut Vec<f32>,
        range: Range<usize>,
        add: bool,
    ) -> Result<(), CudaError> {
        let y = span_mut("decode", y, range)?;
        same_len("decode", y.len(), codec.len)?;
        if add {
            host::decompress_add(&codec.scheme, payload, streams, y)
        } else {
            host::decompress(&codec.scheme, payload, streams, y)
        }
    }

    fn ef_input(
        &self,
        (g, range): (&Vec<f32>, Range<usize>),
        e: &Vec<f32>,
        factor: f32,
        vanilla: bool,
        p: &mut Vec<f32>,
        flags: &mut [u32; flag::WORDS],
    ) -> Result<(), CudaError> {
        let g = span("ef_input", g, range)?;
        same_len("ef_input", g.len(), e.len())?;
        same_len("ef_input", g.len(), p.len())?;
        if !host::ef_input(g, e, factor, vanilla, p) {
            flags[flag::EF_INPUT] = 1;
        }
        Ok(())
    }

    fn ef_residual(
        &self,
        p: &Vec<f32>,
        d: &mut Vec<f32>,
        flags: &mut [u32; flag::WORDS],
    ) -> Result<(), CudaError> {
        same_len("ef_residual", p.len(), d.len())?;
        if !host::ef_residual(p, d) {
            flags[flag::EF_RESIDUAL] = 1;
        }
        Ok(())
    }

    fn nesterov(
        &self,
        (g, range): (&Vec<f32>, Range<usize>),
        m: &Vec<f32>,
        mu: f32,
        p: &mut Vec<f32>,
        flags: &mut [u32; flag::WORDS],
    ) -> Result<(), CudaError> {
        let g = span("nesterov", g, range)?;
        same_len("nesterov", g.len(), m.len())?;
        same_len("nesterov", g.len(), p.len())?;
        if !host::nesterov(g, m, mu, p) {
            flags[flag::NESTEROV] = 1;
        }
        Ok(())
    }

    fn momentum_update(
        &self,
        (g, range): (&Vec<f32>, Range<usize>),
        m: &mut Vec<f32>,
        mu: f32,
    ) -> Result<(), CudaError> {
        let g = span("momentum_update", g, range)?;
        same_len("momentum_update", g.len(), m.len())?;
        host::momentum_update(g, m, mu);
        Ok(())
    }

    fn divide(&self, y: &mut Vec<f32>, range: Range<usize>, w: f32) -> Result<(), CudaError> {
        host::divide(span_mut("divide", y, range)?, w);
        Ok(())
    }
}
