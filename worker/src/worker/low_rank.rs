//! Tensors PowerSGD compresses (`compressor = powersgd`, `pushpull_kernels::PowerSgd`): a
//! step is a sequence of rounds of other tensors, as in torch's `powerSGD_hook`.
//!
//! Declaring such a tensor declares two more with it, `NAME#powersgd.p` (`rows × rank`
//! elements) and `NAME#powersgd.q` (`cols × rank`), of `compressor = none` whatever the
//! cluster file's defaults, at the tensor's priority: the servers only ever sum float32. A
//! push_pull of the tensor is then a task that holds the tensor's PowerSGD state (so calls on
//! it are serialised) and runs, before `start_iter`, a plain round of the tensor itself (its
//! chunks are `none` codecs), and from then on: the local P (`PowerSgd::begin`) summed as a
//! round of the P tensor, the local Q (`PowerSgd::middle`) as a round of the Q tensor, and the
//! result (`PowerSgd::finish`). Every worker runs the same rounds in the same order, and sums
//! are the servers' rank-order sums, so every worker gets the same bits, the bits of
//! `crate::reference::Reference`. The buffers must be host memory.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use pushpull_kernels::chunk::LowRankPlan;
use pushpull_proto::protocol::TensorPlacement;

use super::{join_round, RoundHandle, Worker};
use crate::core::RoundKind;
use crate::data::{HostData, RoundData};
use crate::error::{DataError, WorkerError};
use crate::tensor::{LowRank, Tensor};

impl Worker {
    /// Declares the P and Q tensors of `placement`'s tensor, which `plan` compresses, and
    /// starts its state.
    pub(super) async fn declare_low_rank(
        &self,
        placement: &TensorPlacement,
        plan: LowRankPlan,
    ) -> Result<LowRank, WorkerError> {
        let mut sub = Vec::with_capacity(2);
        for (name, len) in plan.sum_tensors(&placement.name) {
            let priority = Some(placement.priority);
            let p = self
                .place(&name, len, LowRankPlan::sum_map(), priority)
                .await?;
            sub.push(self.register_tensor(p, None, true)?);
        }
        let key = placement.chunks.first().map_or(0, |c| c.key);
        let q = sub.pop().expect("two tensors");
        let p = sub.pop().expect("two tensors");
        Ok(LowRank {
            p,
            q,
            state: Arc::new(tokio::sync::Mutex::new(
                plan.start(self.inner.map.job_seed, key),
            )),
        })
    }

    /// A push_pull step of `tensor`, which PowerSGD compresses (see the module docs), in a task
    /// of its own: its handle. Runs to its end whether or not the handle is awaited.
    pub(super) fn low_rank_step<R: RoundData>(
        &self,
        tensor: &Tensor,
        mut data: R,
        average: bool,
    ) -> RoundHandle<R> {
        let refused = |e: WorkerError| RoundHandle::new(async move { Err(e) });
        if let Err(e) = self.check_tensor(tensor) {
            return refused(e);
        }
        if let Some(got) = data.wrong_len(tensor.len()) {
            return refused(WorkerError::LengthMismatch {
                name: tensor.name().to_string(),
                declared: tensor.len(),
                got,
            });
        }
        let low = tensor.inner.low_rank.clone().expect("a PowerSGD tensor");
        let (worker, tensor) = (self.clone(), tensor.clone());
        let name = tensor.name().to_string();
        let task = tokio::spawn(async move {
            let mut state = low.state.clone().lock_owned().await;
            if !state.compressing() {
                let kind = RoundKind::Sum { average };
                let data = worker.submit_round(&tensor, data, kind).await?;
                state.plain_step();
                return Ok(data);
            }
            let started = std::time::Instant::now();
            tensor.inner.rounds_started.fetch_add(1, Ordering::Relaxed);
            let device = |e: DataError| WorkerError::Device {
                name: tensor.name().to_string(),
                message: e.to_string(),
            };
            let (data, input) = off_runtime(data, |d| d.whole_input()).await?;
            let input = input.map_err(device)?;
            let p = state.begin(&input);
            let sum = RoundKind::Sum { average: false };
            let p = worker.submit_round(&low.p, HostData(p), sum).await?.0;
            let q = state.middle(&p);
            let q = worker.submit_round(&low.q, HostData(q), sum).await?.0;
            let mut out = input;
            let t = &tensor.inner;
            if !state.finish(&q, worker.num_workers(), average, &mut out) {
                t.rounds_non_finite.fetch_add(1, Ordering::Relaxed);
            }
            let (data, written) = off_runtime(data, move |d| d.set_whole_output(&out)).await?;
            written.map_err(device)?;
            t.rounds_done.fetch_add(1, Ordering::Relaxed);
            t.round_clock.observe(started.elapsed());
            Ok(data)
        });
        RoundHandle::new(async move { join_round(task, &name).await })
    }
}

/// `f(data)` on the blocking pool (a device's copy waits for the device): `data` and what `f`
/// gave.
async fn off_runtime<R: RoundData, T: Send + 'static>(
    mut data: R,
    f: impl FnOnce(&mut R) -> T + Send + 'static,
) -> Result<(R, T), WorkerError> {
    tokio::task::spawn_blocking(move || {
        let t = f(&mut data);
        (data, t)
    })
    .await
    .map_err(|e| WorkerError::Internal(format!("a PowerSGD copy failed: {e}")))
}
