//! [`PowerSgd`]: one worker's PowerSGD steps of one tensor, without I/O (the module docs of
//! `powersgd` give the step). The caller sums what it hands out over the workers (the servers'
//! rank-order float32 sum) and hands the sums back; every product and Gram-Schmidt sum is
//! accumulated in f64 in a fixed order and rounded to f32 once, so a step's bits do not depend
//! on the number of threads.

use super::products::{times, times_transpose, transpose_times};
use super::{Layout, Part, PowerSgdSpec};
use crate::reduce;
use crate::rng::{uniform_from_bits, Stream};

/// What a checkpoint keeps of a [`PowerSgd`]: its step, its error and its warm-start `Q`
/// (each empty when there is none yet).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PowerSgdState {
    /// Steps taken (torch's `iter`).
    pub step: u64,
    /// The local error added to the next step's gradient.
    pub error: Vec<f32>,
    /// The previous step's averaged `Q`.
    pub q: Vec<f32>,
}

/// Where a step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Between steps.
    Idle,
    /// `P` handed out, awaiting its sum.
    AwaitP,
    /// `Q` handed out, awaiting its sum.
    AwaitQ,
}

/// One worker's PowerSGD state of one tensor, and its steps: [`PowerSgd::begin`] hands out
/// the local `P`, [`PowerSgd::middle`] takes the sum of the `P`s and hands out the local `Q`,
/// [`PowerSgd::finish`] takes the sum of the `Q`s and writes the result. Steps before
/// `start_iter` are plain sums the caller runs, counted with [`PowerSgd::plain_step`]. The
/// tensor's parts ([`Layout`]) are laid out one after another in the tensor, in `P` (a
/// matrix's `P`, a plain part's elements) and in `Q` (a matrix's `Q`); the error covers the
/// whole tensor (zero on the plain parts).
#[derive(Debug, Clone)]
pub struct PowerSgd {
    spec: PowerSgdSpec,
    layout: Layout,
    /// Seed and key of the random starting matrices.
    seed: u64,
    key: u64,
    state: PowerSgdState,
    /// The state before the last step, for [`PowerSgd::discard`].
    before: Option<PowerSgdState>,
    phase: Phase,
    /// This step's `M` (gradient + error).
    m: Vec<f32>,
    /// This step's `ΣP`, each matrix's orthogonalised.
    p: Vec<f32>,
}

/// Offsets of each part of a [`Layout`] in the tensor, in `P` and in `Q`, with the part.
fn spans(layout: &Layout) -> impl Iterator<Item = (Part, usize, usize, usize)> + '_ {
    let (mut at, mut p, mut q) = (0, 0, 0);
    layout.parts().iter().map(move |&part| {
        let here = (part, at, p, q);
        at += part.tensor_len();
        p += part.p_len();
        q += part.q_len();
        here
    })
}

impl PowerSgd {
    /// The state of a tensor laid out as `layout` (its [`super::Plan::LowRank`]), whose
    /// random starting matrices are drawn with `seed` and `key` (the tensor's first chunk's).
    pub fn new(spec: PowerSgdSpec, layout: Layout, seed: u64, key: u64) -> PowerSgd {
        PowerSgd {
            spec,
            layout,
            seed,
            key,
            state: PowerSgdState::default(),
            before: None,
            phase: Phase::Idle,
            m: Vec::new(),
            p: Vec::new(),
        }
    }

    /// Whether the next step is low-rank (`start_iter` steps have been taken).
    pub fn compressing(&self) -> bool {
        self.state.step >= self.spec.start_iter
    }

    /// Whether the last step taken was low-rank (not one of the first `start_iter`).
    pub fn last_step_compressed(&self) -> bool {
        self.state.step > self.spec.start_iter
    }

    /// Counts a step the caller summed uncompressed (before `start_iter`).
    pub fn plain_step(&mut self) {
        assert_eq!(
            self.phase,
            Phase::Idle,
            "a plain step in the middle of a step"
        );
        self.before = Some(self.state.clone());
        self.state.step += 1;
    }

    /// Starts a low-rank step on this worker's gradient `input` (the tensor's elements): what
    /// to sum over the workers as `P` (each matrix's `M·Q`, `rows × rank` row-major, and each
    /// plain part as it is).
    pub fn begin(&mut self, input: &[f32]) -> Vec<f32> {
        assert_eq!(
            input.len(),
            self.layout.len(),
            "a PowerSGD step's input length"
        );
        // A step that did not finish (its sums failed) leaves the state as it was.
        self.phase = Phase::AwaitP;
        let mut m = std::mem::take(&mut self.m);
        m.clear();
        m.extend_from_slice(input);
        let error = &self.state.error;
        let mut q = if self.spec.warm_start && !self.state.q.is_empty() {
            self.state.q.clone()
        } else {
            random_matrix(
                Stream::low_rank(self.seed, self.key, self.state.step),
                self.layout.q_len(),
            )
        };
        let mut p = vec![0.0f32; self.layout.p_len()];
        for (part, at, p_at, q_at) in spans(&self.layout) {
            let len = part.tensor_len();
            let m = &mut m[at..at + len];
            let Part::Matrix(shape) = part else {
                p[p_at..p_at + len].copy_from_slice(m);
                continue;
            };
            if self.spec.use_error_feedback && !error.is_empty() {
                for (x, e) in m.iter_mut().zip(&error[at..at + len]) {
                    *x += e;
                }
            }
            let q = &mut q[q_at..q_at + shape.q_len()];
            orthogonalise(q, shape.rank, self.spec.orthogonalization_epsilon);
            times(m, q, shape, &mut p[p_at..p_at + shape.p_len()]);
        }
        self.m = m;
        p
    }

    /// Takes the sum of the workers' `P`s: the local `Q`s (each matrix's `Mᵀ·P̂`,
    /// `cols × rank`) to sum.
    pub fn middle(&mut self, p_sum: &[f32]) -> Vec<f32> {
        assert_eq!(self.phase, Phase::AwaitP, "PowerSgd::middle before begin");
        assert_eq!(p_sum.len(), self.layout.p_len(), "the length of ΣP");
        self.phase = Phase::AwaitQ;
        let mut p = std::mem::take(&mut self.p);
        p.clear();
        p.extend_from_slice(p_sum);
        let mut q = vec![0.0f32; self.layout.q_len()];
        for (part, at, p_at, q_at) in spans(&self.layout) {
            if let Part::Matrix(shape) = part {
                let p = &mut p[p_at..p_at + shape.p_len()];
                orthogonalise(p, shape.rank, self.spec.orthogonalization_epsilon);
                let m = &self.m[at..at + part.tensor_len()];
                transpose_times(m, p, shape, &mut q[q_at..q_at + shape.q_len()]);
            }
        }
        self.p = p;
        q
    }

    /// Takes the sum of the workers' `Q`s and writes the step's result into `out`: the
    /// average over `num_workers` (`average`) or the sum; returns whether it is finite. Where
    /// either sum is not finite the result is NaN and the error and `Q` stay as they were (the
    /// step still counts).
    pub fn finish(
        &mut self,
        q_sum: &[f32],
        num_workers: u32,
        average: bool,
        out: &mut [f32],
    ) -> bool {
        assert_eq!(self.phase, Phase::AwaitQ, "PowerSgd::finish before middle");
        assert_eq!(q_sum.len(), self.layout.q_len(), "the length of ΣQ");
        assert_eq!(out.len(), self.m.len(), "a PowerSGD step's output length");
        self.phase = Phase::Idle;
        let before = PowerSgdState {
            step: self.state.step,
            ..PowerSgdState::default()
        };
        self.state.step += 1;
        let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
        if !finite(&self.p) || !finite(q_sum) {
            out.fill(f32::NAN);
            self.before = Some(PowerSgdState {
                error: self.state.error.clone(),
                q: self.state.q.clone(),
                ..before
            });
            return false;
        }
        let mut q_avg = q_sum.to_vec();
        reduce::average(&mut q_avg, num_workers);
        let ef = self.spec.use_error_feedback;
        let mut m = std::mem::take(&mut self.m);
        for (part, at, p_at, q_at) in spans(&self.layout) {
            let len = part.tensor_len();
            let (out, m) = (&mut out[at..at + len], &mut m[at..at + len]);
            let Part::Matrix(shape) = part else {
                out.copy_from_slice(&self.p[p_at..p_at + len]);
                if average {
                    reduce::average(out, num_workers);
                }
                if ef {
                    m.fill(0.0);
                }
                continue;
            };
            let p = &self.p[p_at..p_at + shape.p_len()];
            let q = q_at..q_at + shape.q_len();
            times_transpose(p, &q_avg[q.clone()], shape, out);
            if ef {
                // The new error (M minus the averaged approximation) in M's buffer.
                for (x, a) in m.iter_mut().zip(out.iter()) {
                    *x -= a;
                }
            }
            if !average {
                times_transpose(p, &q_sum[q], shape, out);
            }
        }
        let error = if ef {
            // The old error becomes the undo's, and the undo's before it the next step's M
            // (a buffer of the tensor's length, reused rather than allocated again).
            if let Some(spare) = self.before.take() {
                self.m = spare.error;
            }
            std::mem::replace(&mut self.state.error, m)
        } else {
            self.m = m;
            Vec::new()
        };
        let q = if self.spec.warm_start {
            std::mem::replace(&mut self.state.q, q_avg)
        } else {
            Vec::new()
        };
        self.before = Some(PowerSgdState { error, q, ..before });
        true
    }

    /// Undoes the last step (a training step the loss scaler skipped): the error, `Q` and
    /// step count become what they were before it. Nothing, if no step ran since the last
    /// discard or restore.
    pub fn discard(&mut self) {
        if let Some(before) = self.before.take() {
            self.state = before;
        }
        self.phase = Phase::Idle;
    }

    /// What a checkpoint keeps.
    pub fn saved(&self) -> &PowerSgdState {
        &self.state
    }

    /// Restores what a checkpoint kept, refused (naming what) where its error or `Q` is not
    /// this tensor's length.
    pub fn restore(&mut self, state: PowerSgdState) -> Result<(), String> {
        let (len, q_len) = (self.layout.len(), self.layout.q_len());
        if !state.error.is_empty() && state.error.len() != len {
            return Err(format!(
                "its PowerSGD error has {} elements, the tensor {len}",
                state.error.len(),
            ));
        }
        if !state.q.is_empty() && state.q.len() != q_len {
            return Err(format!(
                "its PowerSGD Q has {} elements, the tensor's matrices' Qs {q_len}",
                state.q.len(),
            ));
        }
        self.state = state;
        self.before = None;
        self.phase = Phase::Idle;
        Ok(())
    }
}

/// `n` standard-normal-like draws: element `t` takes draw `t` of `stream` and sums its four
/// 16-bit uniforms, centred and scaled to variance 1 (exact but for the last multiplication,
/// so the same on every machine).
fn random_matrix(stream: Stream, n: usize) -> Vec<f32> {
    (0..n as u64)
        .map(|t| {
            let d = stream.draw(t);
            let s: f32 = (0..4)
                .map(|l| uniform_from_bits((d >> (16 * l)) as u16))
                .sum();
            (s - 2.0) * 3f32.sqrt()
        })
        .collect()
}

/// Gram-Schmidt on the columns of `a`, a row-major matrix of `rank` columns, in place: each
/// column in turn divided by its norm plus `epsilon` (left as it is where that is 0), then
/// projected out of the columns after it. Done in f64 and rounded to f32 once at the end, so
/// that an ill-conditioned matrix keeps its columns orthogonal to f32's precision.
fn orthogonalise(a: &mut [f32], rank: usize, epsilon: f32) {
    if rank == 0 {
        return;
    }
    let rows = a.len() / rank;
    let mut m: Vec<f64> = a.iter().map(|&x| f64::from(x)).collect();
    for c in 0..rank {
        let norm = (0..rows)
            .map(|i| m[i * rank + c].powi(2))
            .sum::<f64>()
            .sqrt();
        let d = norm + f64::from(epsilon);
        if d != 0.0 {
            for i in 0..rows {
                m[i * rank + c] /= d;
            }
        }
        for c2 in c + 1..rank {
            let dot: f64 = (0..rows).map(|i| m[i * rank + c] * m[i * rank + c2]).sum();
            for i in 0..rows {
                m[i * rank + c2] -= dot * m[i * rank + c];
            }
        }
    }
    for (x, v) in a.iter_mut().zip(m) {
        *x = v as f32;
    }
}
