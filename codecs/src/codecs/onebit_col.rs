//! Column-wise `onebit` (`compressor=onebit` with `columns=C`): 1-bit SGD with two
//! reconstruction levels per column (the CNTK 1-bit SGD notes). CPU only.
//!
//! The chunk is read as a column-major matrix with `C` columns, as CNTK stores them: column
//! `j` is the `R = ⌈n / C⌉` contiguous elements `j·R .. (j+1)·R` (when `C` does not divide `n`
//! the last columns are shorter or empty; a cluster never builds such a chunk). In a
//! cluster, `columns` counts the tensor's columns and the scheduler cuts the tensor at column
//! boundaries, so each chunk holds whole columns (its own count, [`crate::CompressorSpec::
//! for_chunk`]) and each column's levels are the same however the tensor is chunked. (Wire
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

use super::prepare;
use crate::elem;
use crate::error::{KernelError, Result};
use crate::simd::{put_words, stream_bytes};
use crate::{Codec, CodecInfo, RoundCtx};

/// The column-wise onebit compressor.
pub(crate) struct OneBitColumns {
    base: CodecInfo,
    columns: usize,
}

impl OneBitColumns {
    pub fn new(base: CodecInfo, columns: usize) -> OneBitColumns {
        assert!(columns >= 1);
        let mut c = OneBitColumns { base, columns };
        c.base = c
            .base
            .clone()
            .sized(8 * c.cols() + stream_bytes(c.base.n, 1), false);
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
