//! Tensors PowerSGD compresses (`compressor = powersgd`, `pushpull_kernels::PowerSgd`): a
//! step is a sequence of rounds of other tensors, as in torch's `powerSGD_hook`.
//!
//! Declaring such a tensor declares two more with it, `NAME#powersgd.p` (each matrix's
//! `rows × rank` elements, and a bucket's uncompressed parts: `pushpull_kernels::PowerSgdLayout`)
//! and `NAME#powersgd.q` (each matrix's `cols × rank`), of `compressor = none` whatever the
//! cluster file's defaults, at the tensor's priority: the servers only ever sum float32. A
//! push_pull of the tensor is then a task that holds the tensor's PowerSGD state (so calls on
//! it are serialised) and runs, before `start_iter`, a plain round of the tensor itself (its
//! chunks are `none` codecs), and from then on: the local P (`PowerSgd::begin`) summed as a
//! round of the P tensor, the local Q (`PowerSgd::middle`) as a round of the Q tensor, and the
//! result (`PowerSgd::finish`). Every worker runs the same rounds in the same order, and sums
//! are the servers' rank-order sums, so every worker gets the same bits, the bits of
//! `crate::reference::Reference`. A device's buffer is copied to the host and its result back;
//! the copies and the products run on the blocking pool, off the runtime's threads.

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
            // The copies (a device's waits for it) and the products run on the blocking pool.
            let (held, begun) = off_runtime((state, data), |(state, data)| {
                let input = data.whole_input()?;
                let p = state.begin(&input);
                Ok::<_, DataError>((input, p))
            })
            .await?;
            let (input, p) = begun.map_err(device)?;
            let sum = RoundKind::Sum { average: false };
            let p = worker.submit_round(&low.p, HostData(p), sum).await?.0;
            let (state, data) = held;
            let (state, q) = off_runtime(state, move |state| state.middle(&p)).await?;
            let q = worker.submit_round(&low.q, HostData(q), sum).await?.0;
            let workers = worker.num_workers();
            let ((_, data), finished) = off_runtime((state, data), move |(state, data)| {
                let mut out = input;
                let finite = state.finish(&q, workers, average, &mut out);
                data.set_whole_output(&out).map(|()| finite)
            })
            .await?;
            let t = &tensor.inner;
            if !finished.map_err(device)? {
                t.rounds_non_finite.fetch_add(1, Ordering::Relaxed);
            }
            t.rounds_done.fetch_add(1, Ordering::Relaxed);
            t.round_clock.observe(started.elapsed());
            Ok(data)
        });
        RoundHandle::new(async move { join_round(task, &name).await })
    }
}

/// `f(&mut value)` on the blocking pool (a device's copy waits for the device; the products
/// take milliseconds): `value` back and what `f` gave.
async fn off_runtime<V: Send + 'static, T: Send + 'static>(
    mut value: V,
    f: impl FnOnce(&mut V) -> T + Send + 'static,
) -> Result<(V, T), WorkerError> {
    tokio::task::spawn_blocking(move || {
        let t = f(&mut value);
        (value, t)
    })
    .await
    .map_err(|e| WorkerError::Internal(format!("a PowerSGD step's work failed: {e}")))
}
