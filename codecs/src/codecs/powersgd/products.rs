//! The three matrix products of a PowerSGD step, on row-major `f32` matrices: every product
//! of two `f32`s is exact in `f64`, and every sum is accumulated in `f64` in an order fixed by
//! the shapes alone (not by the threads or the machine) and rounded to `f32` once. The loops
//! are written so that the compiler vectorises them: `M·Q` sums each dot product in
//! [`LANES`] interleaved partial sums, the other two add whole rows at a time.

use rayon::prelude::*;

use super::Shape;

/// Rows (of `P` or the result) or columns (of `M`, for `Q`) one parallel task computes.
const PER_TASK: usize = 64;

/// Partial sums of a dot product: element `j` goes to sum `j % LANES`, and the sums are
/// added pairwise at the end.
const LANES: usize = 4;

/// `Σ a[j]·b[j]` in `f64` ([`LANES`] partial sums).
fn dot(a: &[f32], b: &[f32]) -> f64 {
    let whole = a.len() / LANES * LANES;
    let mut s = [0.0f64; LANES];
    for (x, y) in a[..whole]
        .chunks_exact(LANES)
        .zip(b[..whole].chunks_exact(LANES))
    {
        for l in 0..LANES {
            s[l] += f64::from(x[l]) * f64::from(y[l]);
        }
    }
    let tail: f64 = a[whole..]
        .iter()
        .zip(&b[whole..])
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    ((s[0] + s[1]) + (s[2] + s[3])) + tail
}

/// `f(t, block)` for each block `t` of `block` elements of `out`: on rayon's pool where
/// `work` (the elements of `M`) is large enough ([`crate::par::enabled`]), else in turn.
fn for_blocks(out: &mut [f32], block: usize, work: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if crate::par::enabled(work) {
        out.par_chunks_mut(block)
            .enumerate()
            .for_each(|(t, b)| f(t, b));
    } else {
        out.chunks_mut(block).enumerate().for_each(|(t, b)| f(t, b));
    }
}

/// `Q` (`cols × rank`) as `rank` rows of `cols`.
fn transposed(q: &[f32], cols: usize, rank: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; q.len()];
    for j in 0..cols {
        for k in 0..rank {
            t[k * cols + j] = q[j * rank + k];
        }
    }
    t
}

/// `M·Q` into `p` (`rows × rank`), from `M` (`rows × cols`) and `Q` (`cols × rank`).
pub(super) fn times(m: &[f32], q: &[f32], shape: Shape, p: &mut [f32]) {
    let Shape { cols, rank, .. } = shape;
    let qt = transposed(q, cols, rank);
    for_blocks(p, PER_TASK * rank, m.len(), |t, block| {
        for (r, out) in block.chunks_mut(rank).enumerate() {
            let i = t * PER_TASK + r;
            let row = &m[i * cols..(i + 1) * cols];
            for (k, o) in out.iter_mut().enumerate() {
                *o = dot(row, &qt[k * cols..(k + 1) * cols]) as f32;
            }
        }
    });
}

/// `Mᵀ·P` into `q` (`cols × rank`), from `M` (`rows × cols`) and `P` (`rows × rank`): each
/// element the sum over the rows in order.
pub(super) fn transpose_times(m: &[f32], p: &[f32], shape: Shape, q: &mut [f32]) {
    let Shape { rows, cols, rank } = shape;
    for_blocks(q, PER_TASK * rank, m.len(), |t, block| {
        let j0 = t * PER_TASK;
        let width = block.len() / rank;
        // acc[k·width + jj]: column j0 + jj of Mᵀ·P's column k.
        let mut acc = vec![0.0f64; block.len()];
        for i in 0..rows {
            let mrow = &m[i * cols + j0..i * cols + j0 + width];
            for k in 0..rank {
                let y = f64::from(p[i * rank + k]);
                for (a, &x) in acc[k * width..(k + 1) * width].iter_mut().zip(mrow) {
                    *a += f64::from(x) * y;
                }
            }
        }
        for (jj, out) in block.chunks_mut(rank).enumerate() {
            for (k, o) in out.iter_mut().enumerate() {
                *o = acc[k * width + jj] as f32;
            }
        }
    });
}

/// `P·Qᵀ` into `out` (`rows × cols`), from `P` (`rows × rank`) and `Q` (`cols × rank`): each
/// element the sum over the rank in order.
pub(super) fn times_transpose(p: &[f32], q: &[f32], shape: Shape, out: &mut [f32]) {
    let Shape { cols, rank, .. } = shape;
    let qt = transposed(q, cols, rank);
    let work = out.len();
    for_blocks(out, PER_TASK * cols, work, |t, block| {
        let mut acc = vec![0.0f64; cols];
        for (r, row) in block.chunks_mut(cols).enumerate() {
            let i = t * PER_TASK + r;
            acc.fill(0.0);
            for k in 0..rank {
                let x = f64::from(p[i * rank + k]);
                for (a, &y) in acc.iter_mut().zip(&qt[k * cols..(k + 1) * cols]) {
                    *a += x * f64::from(y);
                }
            }
            for (o, a) in row.iter_mut().zip(&acc) {
                *o = *a as f32;
            }
        }
    });
}
