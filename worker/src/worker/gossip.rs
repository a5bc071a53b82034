//! The calls of decentralised averaging on a tensor declared with `exchange = "gossip"`:
//! [`Worker::gossip`] (one round: how it averages is in `crate::gossip`'s module docs) and the
//! reports of Moniqua's gradient bound `G` ([`Worker::track_gradient`],
//! [`Worker::report_gradient_bound`]; kept in `crate::gradient_bound`).

use super::Worker;
use crate::core::RoundKind;
use crate::data::HostData;
use crate::error::WorkerError;
use crate::tensor::Tensor;

impl Worker {
    /// One step of decentralised averaging of `tensor` (declared with `exchange = "gossip"`
    /// in its map): `buf` holds this worker's values (its model's parameters) and is replaced
    /// by `x + Σ_j W_ij (x̂_j − x̂_i)` over this worker's neighbours `j` in the cluster's
    /// mixing matrix (`[gossip]`; by default a ring with ⅓ each), where `x̂` are the messages
    /// as decoded against `x` (exact for `compressor = "none"`; within `δ·B_θ` for
    /// `moniqua` while neighbours stay within θ). Each call is one round of the tensor, like a
    /// push_pull; every worker must call it.
    ///
    /// Moniqua's Algorithm 1 is: compute the gradient at `x`, `gossip` the model, then apply
    /// `−α·g` to the result. Start every worker from the same model ([`Worker::broadcast`]).
    ///
    /// # Errors
    /// [`WorkerError::WrongExchange`] for a tensor that is summed (nothing sent); otherwise as
    /// [`Worker::push_pull`] (a lost neighbour, or any lost node, ends the job naming it).
    pub async fn gossip<B>(&self, tensor: &Tensor, buf: B) -> Result<B, WorkerError>
    where
        B: AsMut<[f32]> + Send + 'static,
    {
        self.submit(tensor, HostData(buf), RoundKind::Gossip)
            .await
            .map(|d| d.0)
    }

    /// Reports a gradient (or the step's update divided by the learning rate) of `tensor`:
    /// the largest magnitude reported so far is the `G` of Moniqua's Theorem 2, which a map
    /// with `theta_schedule = "bound"` needs (θ = `theta` · 2·α·G·ln(16n)/(1 − ρ) in each
    /// round; the paper tracks the gradients' ∞-norm over the first steps, and gradients
    /// shrink as training goes, so the running maximum settles early). Call it every step,
    /// before [`Worker::gossip`]; a round uses the `G` reported before it started. Other maps
    /// ignore it.
    ///
    /// # Errors
    /// [`WorkerError::LengthMismatch`] when `gradient` does not have the tensor's length, and
    /// [`WorkerError::BadGradient`] naming the element when it holds a value that is not
    /// finite; nothing is recorded then.
    pub fn track_gradient(&self, tensor: &Tensor, gradient: &[f32]) -> Result<(), WorkerError> {
        if gradient.len() as u64 != tensor.len() {
            return Err(WorkerError::LengthMismatch {
                name: tensor.name().to_string(),
                declared: tensor.len(),
                got: gradient.len() as u64,
            });
        }
        let mut g = 0.0f32;
        for (index, &value) in gradient.iter().enumerate() {
            if !value.is_finite() {
                return Err(WorkerError::BadGradient {
                    name: tensor.name().to_string(),
                    message: format!("track_gradient: element {index} is {value}, not finite"),
                });
            }
            g = g.max(value.abs());
        }
        self.report_gradient_bound(tensor, g)
    }

    /// [`Worker::track_gradient`] for a caller that has the gradient's largest magnitude
    /// already (e.g. a framework's `grad.abs().max()`): `g` raises the tensor's `G` if larger.
    ///
    /// # Errors
    /// [`WorkerError::BadGradient`] when `g` is not a finite number ≥ 0 (nothing recorded).
    pub fn report_gradient_bound(&self, tensor: &Tensor, g: f32) -> Result<(), WorkerError> {
        if !(g.is_finite() && g >= 0.0) {
            return Err(WorkerError::BadGradient {
                name: tensor.name().to_string(),
                message: format!("gradient bound {g}: must be a finite number >= 0"),
            });
        }
        // +0.0: -0.0's bits would be the largest.
        tensor.inner.bound.track(g + 0.0);
        Ok(())
    }

    /// The `G` tracked for `tensor` so far ([`Worker::track_gradient`]), `None` before any.
    pub fn gradient_bound(&self, tensor: &Tensor) -> Option<f32> {
        tensor.inner.bound.get()
    }
}
