//! [`EmulatedDevice`]: the [`Device`] of CI. Its memory is host `Vec<f32>`s and every kernel is
//! the host-compiled twin of the CUDA source (`kernels/cuda/host_shim.cpp` through
//! [`crate::cuda::host`]), launch sequence for launch sequence. It is slow (serial) and exists
//! so that the device data path (chunk ranges, payload sizes, residual and momentum state, the
//! order of steps) runs and is checked bit for bit where there is no GPU.

use std::ops::Range;

use super::{check_range, same_len, Device};
use crate::cuda::{host, CudaError, Device as Place, GpuScheme, RoundStreams};

/// A device whose memory is host memory and whose kernels are the CUDA kernels' host twin.
#[derive(Debug, Default, Clone, Copy)]
pub struct EmulatedDevice;

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
    /// The scheme and the chunk length it was built for.
    type Codec = (GpuScheme, usize);

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

    fn codec(&self, scheme: GpuScheme, len: usize) -> Result<(GpuScheme, usize), CudaError> {
        scheme.validate(len)?;
        Ok((scheme, len))
    }

    fn compress(
        &self,
        codec: &mut (GpuScheme, usize),
        x: &Vec<f32>,
        range: Range<usize>,
        streams: RoundStreams,
        out: &mut Vec<u8>,
    ) -> Result<(), CudaError> {
        let x = span("compress", x, range)?;
        same_len("compress", x.len(), codec.1)?;
        host::compress(&codec.0, x, streams, out)
    }

    fn decode(
        &self,
        codec: &mut (GpuScheme, usize),
        payload: &[u8],
        streams: RoundStreams,
        y: &mut Vec<f32>,
        range: Range<usize>,
        add: bool,
    ) -> Result<(), CudaError> {
        let y = span_mut("decode", y, range)?;
        same_len("decode", y.len(), codec.1)?;
        if add {
            host::decompress_add(&codec.0, payload, streams, y)
        } else {
            host::decompress(&codec.0, payload, streams, y)
        }
    }

    fn ef_input(
        &self,
        (g, range): (&Vec<f32>, Range<usize>),
        e: &Vec<f32>,
        factor: f32,
        vanilla: bool,
        p: &mut Vec<f32>,
    ) -> Result<bool, CudaError> {
        let g = span("ef_input", g, range)?;
        same_len("ef_input", g.len(), e.len())?;
        same_len("ef_input", g.len(), p.len())?;
        Ok(host::ef_input(g, e, factor, vanilla, p))
    }

    fn ef_residual(&self, p: &Vec<f32>, d: &mut Vec<f32>) -> Result<bool, CudaError> {
        same_len("ef_residual", p.len(), d.len())?;
        Ok(host::ef_residual(p, d))
    }

    fn nesterov(
        &self,
        (g, range): (&Vec<f32>, Range<usize>),
        m: &Vec<f32>,
        mu: f32,
        p: &mut Vec<f32>,
    ) -> Result<bool, CudaError> {
        let g = span("nesterov", g, range)?;
        same_len("nesterov", g.len(), m.len())?;
        same_len("nesterov", g.len(), p.len())?;
        Ok(host::nesterov(g, m, mu, p))
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
