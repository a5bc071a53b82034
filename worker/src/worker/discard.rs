//! [`Worker::discard_last_round`]: mixed precision's skipped steps.
//!
//! With a loss scaler (`torch.amp.GradScaler`), a step whose gradients hold inf or NaN is
//! skipped and the scale lowered. Through pushpull, a chunk that is not finite on any worker
//! makes that chunk's sum non-finite on every worker (NaN in the result, so every worker's
//! scaler skips the same step, as after an all-reduce) and leaves the chunk's compressor state
//! as it was everywhere (see `pushpull_proto::protocol`'s module docs). The step's other
//! chunks and tensors had finite sums, and their error feedback and momentum took in
//! gradients that were never applied; discarding the step's rounds undoes that too.

use super::Worker;
use crate::core::Undiscardable;
use crate::error::WorkerError;
use crate::tensor::Tensor;

impl Worker {
    /// Discards the last push_pull round of each of `tensors`: their compressor state (error
    /// feedback's residual, momentum, the previous learning rate), on this worker and on the
    /// servers, returns to what it was before that round, as if the round had never run. Call
    /// it, on every worker alike, for the tensors of an optimizer step that was skipped (a
    /// loss scaler found inf or NaN), before their next push_pull. Round numbers still count
    /// the discarded round.
    ///
    /// The worker's state is undone when the tensor's next push_pull round begins, and that
    /// round's pushes tell the servers, which undo their own before summing it; every worker
    /// must discard the same rounds, or that round is aborted naming the ranks that disagree.
    /// A round whose sum was not finite changed no state ([`crate::TensorMetrics::rounds_non_finite`]),
    /// so discarding it does nothing, as does discarding twice or a tensor that has not run a
    /// push_pull round. A PowerSGD tensor's error, Q and step count go back at once. Waits for
    /// each tensor's round in flight, if any. A checkpoint may be
    /// saved between a discard and the next round ([`Worker::save_state`] keeps the discard).
    ///
    /// # Errors
    /// [`WorkerError::Undeclared`] for a tensor this worker did not declare;
    /// [`WorkerError::Checkpoint`] for a tensor with compressor state restored from a
    /// checkpoint ([`Worker::load_state`]) that has run no push_pull round since, whose last
    /// round was not discarded before the checkpoint was saved (the state before it is not in
    /// the checkpoint); the job's fatal error, if it failed. The tensors before the one refused
    /// are discarded.
    pub async fn discard_last_round(&self, tensors: &[Tensor]) -> Result<(), WorkerError> {
        for tensor in tensors {
            self.check_tensor(tensor)?;
            if let Some(low) = &tensor.inner.low_rank {
                // A PowerSGD step's error, Q and count; its rounds of P and Q keep no state,
                // and a low-rank step ran no round of the tensor itself.
                let mut state = low.state.lock().await;
                let low_rank = state.last_step_compressed();
                state.discard();
                if low_rank {
                    continue;
                }
            }
            let mut rounds = tensor.inner.round.lock().await;
            self.inner.shared.check()?;
            rounds
                .discard()
                .map_err(|Undiscardable { round, path }| WorkerError::Checkpoint {
                    path,
                    message: format!(
                        "tensor {:?}: round {round}, its last push_pull round, ran before this checkpoint was saved and was not discarded then; the checkpoint keeps no state to undo it with (discard a skipped step's rounds before saving)",
                        tensor.name()
                    ),
                })?;
        }
        Ok(())
    }
}
