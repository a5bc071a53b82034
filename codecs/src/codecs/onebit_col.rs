//! Column-wise `onebit` (`compressor=onebit` with `columns=C`): 1-bit SGD with two
//! reconstruction levels per column (the CNTK 1-bit SGD notes). CPU only.
//!
//! The chunk is read as a column-major matrix with `C` columns, as CNTK stores them: column
//! `j` is the `R = ⌈n / C⌉` contiguous elements `j·R .. (j+1)·R` (when `C` does not divide `n`
//! the last columns are shorter or empty; a cluster never builds such a chunk). In a
//! cluster, `columns` counts the tensor's columns and the scheduler cuts the tensor at column
//! boundaries, so each chunk holds whole columns (its own count, from the tensor's length in
//! [`crate::spec::BuildOptions::tensor_len`]) and each column's levels are the same however the tensor is chunked. (Wire
//! format 2: format 1, before protocol 7, read element `i` as column `i % C` of a row-major
//! chunk, which mixed a tensor's columns up across chunks.) Column `j` has two levels:
//! `pos_j`, the mean of its non-negative elements, and `neg_j`, the mean of its negative
//! elements (each 0.0 when there is none; sums in f64 in index order starting from +0.0, then
//! divided by the count and rounded to f32).
//! Element `i` sends its sign bit (set for `x < 0`) and decodes to `neg_j` if set, else `pos_j`.
//! Meant to run under error feedback (`ef=vanilla`), whose residual plays the notes' residual.
//!
//! Wire format: `min(C, n)` pairs of little-endian f32 `(pos_j, neg_j)`, then a bit stream of
//! `n` sign bits. Size `8 * min(C, n) + 4 * ceil(n / 32)`.

use std::sync::Arc;

use super::prepare;
use crate::chain::Body;
use crate::codec::{Codec, CodecInfo, RoundCtx};
use crate::elem;
use crate::error::{KernelError, Result};
use crate::simd::{put_words, stream_bytes};
use crate::spec::{BuildOptions, CodecSpec, Keys, Kind};
use pushpull_proto::placement::PayloadModel;

/// The column-wise variant's settings (`onebit` with `columns`): sign bits and two levels per
/// column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OneBitColumnsSpec {
    /// Column count: column-major, a column is `len / columns` contiguous elements.
    pub columns: usize,
}

/// `onebit` with `columns = (key, value)` (the registry's onebit entry hands it on).
pub(super) fn parse(keys: &Keys<'_>, (k, v): (&str, &str)) -> Result<Arc<dyn CodecSpec>> {
    let columns = keys
        .whole("columns", 1, u32::MAX as u64, "a column count")?
        .unwrap_or(1) as usize;
    if let Some((sk, sv)) = keys.get("scaling") {
        return Err(KernelError::NotApplicable {
            key: sk.to_string(),
            value: sv.to_string(),
            why: format!(
                "the column-wise onebit variant ({k}={v}) has its own per-column levels; \
                 remove \"{sk}\""
            ),
        });
    }
    if keys.get("ef").is_none() {
        // 1-bit SGD keeps its quantisation residual (CNTK's notes): a map must say whether it
        // wants it, so that no existing map changes its bits.
        return Err(KernelError::Missing {
            key: "ef".to_string(),
            needed_by: format!(
                "the column-wise onebit variant ({k}={v}), 1-bit SGD, whose residual is part \
                 of the method"
            ),
            allowed: "byteps_ef_type / byteps_error_feedback_type / ef: vanilla (1-bit SGD's \
                      residual), corrected, or none (say so to go without it)"
                .to_string(),
        });
    }
    Ok(Arc::new(OneBitColumnsSpec { columns }))
}

impl OneBitColumnsSpec {
    /// The columns of a chunk of `len` elements of a tensor of `tensor_len` (`None`: the chunk
    /// is the tensor), or why the tensor or the chunk is not whole columns.
    fn chunk_columns(&self, len: usize, tensor_len: Option<u64>) -> Result<usize, String> {
        let columns = self.columns;
        let Some(tensor_len) = tensor_len else {
            return Ok(columns);
        };
        let Some(col) = self.unit(tensor_len) else {
            return Err(format!(
                "onebit with columns={columns}: a tensor of {tensor_len} elements is not \
                 {columns} whole columns (column-major: columns must divide the element count)"
            ));
        };
        if len as u64 % col != 0 {
            return Err(format!(
                "onebit with columns={columns}: a chunk of {len} elements does not hold whole \
                 columns of {col} (the scheduler cuts such tensors at column boundaries)"
            ));
        }
        Ok((len as u64 / col) as usize)
    }
}

impl CodecSpec for OneBitColumnsSpec {
    fn kind(&self) -> Kind {
        Kind::new("onebit", false, false)
    }
    fn build(&self, base: CodecInfo, opts: &BuildOptions) -> Result<Body> {
        let columns =
            self.chunk_columns(base.n, opts.tensor_len)
                .map_err(|why| KernelError::Refused {
                    compressor: base.name.clone(),
                    why,
                })?;
        Ok(Body::Plain(Box::new(OneBitColumns::new(base, columns))))
    }
    fn payload(&self, tensor_len: u64) -> PayloadModel {
        // A tensor that is not whole columns is refused when built; until then it weighs as
        // fp32.
        match self.unit(tensor_len) {
            Some(column) => PayloadModel {
                per_bucket: 8,
                bucket: Some(column),
                stream_bits: 1,
                ..PayloadModel::default()
            },
            None => PayloadModel::FP32,
        }
    }
    fn display_name(&self) -> String {
        format!("onebit(columns={})", self.columns)
    }
    fn params(&self, put: &mut dyn FnMut(&'static str, String)) {
        put("columns", self.columns.to_string());
        // The map must say whether it goes without 1-bit SGD's residual; error feedback, when
        // the chain has it, replaces this.
        put("ef", "none".to_string());
    }
    fn unit(&self, tensor_len: u64) -> Option<u64> {
        let c = self.columns as u64;
        (c > 0 && tensor_len > 0 && tensor_len % c == 0).then(|| tensor_len / c)
    }
}

/// The column-wise onebit compressor.
pub(crate) struct OneBitColumns {
    base: CodecInfo,
    columns: usize,
}

impl OneBitColumns {
    pub fn new(base: CodecInfo, columns: usize) -> OneBitColumns {
        assert!(columns >= 1);
        let mut c = OneBitColumns { base, columns };
        c.base.payload = 8 * c.cols() + stream_bytes(c.base.n, 1);
        c
    }

    fn cols(&self) -> usize {
        self.columns.min(self.base.n)
    }

    /// Elements per column (`⌈n / C⌉`; at least 1, so an empty chunk has no rows to walk).
    fn rows(&self) -> usize {
        self.base.n.div_ceil(self.cols().max(1)).max(1)
    }

    fn levels(&self, payload: &[u8]) -> Result<Vec<(f32, f32)>, KernelError> {
        self.base.check_payload(payload.len())?;
        let c = self.cols();
        let mut lv = Vec::with_capacity(c);
        for j in 0..c {
            let p = crate::simd::get_f32(payload, 2 * j);
            let q = crate::simd::get_f32(payload, 2 * j + 1);
            if !(p.is_finite() && q.is_finite() && p >= 0.0 && q <= 0.0) {
                return Err(KernelError::malformed(
                    &self.base.name,
                    format!("column {j}: levels ({p}, {q}) are not finite with pos >= 0 >= neg"),
                ));
            }
            lv.push((p, q));
        }
        if !super::tail_bits_zero(&payload[8 * c..], self.base.n, 1) {
            return Err(KernelError::malformed(
                &self.base.name,
                "padding bits after the last sign bit are not zero",
            ));
        }
        Ok(lv)
    }
}

impl Codec for OneBitColumns {
    fn info(&self) -> &CodecInfo {
        &self.base
    }
    fn encode(&mut self, input: &[f32], _ctx: &RoundCtx, out: &mut Vec<u8>) -> Result<()> {
        self.base.require_finite(input)?;
        let c = self.cols();
        let mut ps = vec![0f64; c];
        let mut pc = vec![0u64; c];
        let mut ns = vec![0f64; c];
        let mut nc = vec![0u64; c];
        // Branch-free (and so vectorisable) but the same sums: adding +0.0 to a sum that is
        // never -0.0 changes nothing. Column j is the contiguous run j·R .. (j+1)·R.
        for (j, column) in input.chunks(self.rows()).enumerate().take(c) {
            for &x in column {
                let neg = x < 0.0;
                let v = x as f64;
                ns[j] += if neg { v } else { 0.0 };
                ps[j] += if neg { 0.0 } else { v };
                nc[j] += neg as u64;
                pc[j] += (!neg) as u64;
            }
        }
        let mean = |s: f64, k: u64| {
            if k == 0 {
                0.0f32
            } else {
                (s / k as f64) as f32
            }
        };
        let dst = prepare(out, self.base.payload);
        let (head, bits) = dst.split_at_mut(8 * c);
        super::put_f32s(
            head,
            (0..c).flat_map(|j| [mean(ps[j], pc[j]), mean(ns[j], nc[j])]),
        );
        let mut words = [0u32; 1];
        for (d, xs) in bits.chunks_mut(4).zip(input.chunks(32)) {
            let mut w = 0u32;
            for (t, &x) in xs.iter().enumerate() {
                w |= elem::sign_bit(x) << t;
            }
            words[0] = w;
            put_words(d, &words);
        }
        Ok(())
    }
    fn decode(&self, payload: &[u8], _ctx: &RoundCtx, out: &mut [f32], add: bool) -> Result<()> {
        let lv = self.levels(payload)?;
        let bits = &payload[8 * self.cols()..];
        let rows = self.rows();
        for (wi, chunk) in out.chunks_mut(32).enumerate() {
            let w = crate::simd::get_u32(bits, wi);
            for (t, o) in chunk.iter_mut().enumerate() {
                let (p, q) = lv[((wi * 32 + t) / rows).min(lv.len().saturating_sub(1))];
                let v = if (w >> t) & 1 != 0 { q } else { p };
                if add {
                    *o += v;
                } else {
                    *o = v;
                }
            }
        }
        Ok(())
    }
}
