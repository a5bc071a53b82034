//! [`Worker::push_pull_group_into`]: the tensors of a step reduced together, sent in priority
//! order whatever order they are listed in.
//!
//! Separate calls made at the same moment race with the worker's sender: whichever call is
//! encoded first has its chunks sent first while the window has room, even if a
//! higher-priority call follows a moment later. Two workers making the same calls may so start
//! a round in different orders, and a chunk one of them sends first and another last has its
//! sum ready only at the end (BENCHMARKS.md at 60710fe, "The order of simultaneous calls"). A
//! group call knows all its tensors before any is encoded: it takes every tensor's round lock (highest
//! priority first, then by name, one order for every group), launches a device's batch and
//! waits (off the async threads) until its payloads are on the host, then takes a
//! [`SendHold`] of every tensor's priority, then starts the rounds highest priority first (a
//! hold taken while the device is busy would stop an earlier call's lower-priority frames for
//! as long as the device takes); each round releases its
//! hold once its chunks are queued, so the sender lets a chunk go only when every
//! higher-priority chunk of the group is queued. No hold
//! is taken while a lock is awaited (a lock waits for the tensor's previous round, which needs
//! the other workers), so holds never wait for a peer ([`pushpull_proto::sendq`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pushpull_net::sender::SendHold;

use super::{join_round, Prepared, Worker};
use crate::core::RoundKind;
use crate::data::{HostData, HostInto, RoundData};
use crate::error::WorkerError;
use crate::tensor::{Reduce, Tensor};

/// One call of a [`Worker::push_pull_group_into`]: a future of its result. Its round runs in
/// the background whether or not the handle is polled or kept.
pub struct RoundHandle<T>(Pin<Box<dyn Future<Output = Result<T, WorkerError>> + Send>>);

impl<T> RoundHandle<T> {
    /// The handle of a round's outcome.
    pub(super) fn new(f: impl Future<Output = Result<T, WorkerError>> + Send + 'static) -> Self {
        RoundHandle(Box::pin(f))
    }

    /// A handle of `f`'s output mapped by `g`.
    pub(super) fn map<U>(
        self,
        g: impl FnOnce(T) -> Result<U, WorkerError> + Send + 'static,
    ) -> RoundHandle<U>
    where
        T: 'static,
    {
        RoundHandle::new(async move { self.await.and_then(g) })
    }
}

impl<T> Future for RoundHandle<T> {
    type Output = Result<T, WorkerError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl<T> std::fmt::Debug for RoundHandle<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoundHandle")
    }
}

impl Worker {
    /// [`Worker::push_pull`] of every `(tensor, buffer)` of `calls`, in place, started
    /// together: as [`Worker::push_pull_group_into`], with one buffer per tensor read and
    /// overwritten with the result. Each handle resolves to its call's buffer or error.
    ///
    /// # Errors
    /// Per handle, as [`Worker::push_pull_group_into`].
    pub async fn push_pull_group<B>(
        &self,
        calls: Vec<(Tensor, B)>,
        op: Reduce,
    ) -> Vec<RoundHandle<B>>
    where
        B: AsMut<[f32]> + Send + 'static,
    {
        let calls = calls.into_iter().map(|(t, b)| (t, HostData(b))).collect();
        self.group(calls, op)
            .await
            .into_iter()
            .map(|h| RoundHandle(Box::pin(async move { h.await.map(|d| d.0) })))
            .collect()
    }

    /// [`Worker::push_pull_into`] of every `(tensor, input, output)` of `calls`, started
    /// together: the chunks leave in the tensors' priority order (FIFO within a priority)
    /// whatever order `calls` lists them in, which separate calls made at the same moment do
    /// not guarantee (docs/shaped-network.md, "Scheduling on the wire"). Use it for the
    /// gradients of a step that are ready together, as Horovod's `grouped_allreduce` is used.
    ///
    /// Returns once every round has started (after waiting for the previous round of any of
    /// the tensors), with one [`RoundHandle`] per call, in the order of `calls`; each resolves
    /// to that call's `(input, output)` or error, as `push_pull_into` would. Rounds run to their
    /// end in the background even if their handles are dropped; dropping this future before it
    /// returns starts none of them (nothing is sent, no round number is used).
    ///
    /// # Errors
    /// Per handle, those of [`Worker::push_pull_into`], plus [`WorkerError::TwiceInGroup`] for
    /// a second entry of the same tensor (the first is reduced). An entry that fails before
    /// its round starts (a wrong length, an undeclared tensor) does not stop the others.
    pub async fn push_pull_group_into<I, O>(
        &self,
        calls: Vec<(Tensor, I, O)>,
        op: Reduce,
    ) -> Vec<RoundHandle<(I, O)>>
    where
        I: AsRef<[f32]> + Send + 'static,
        O: AsMut<[f32]> + Send + 'static,
    {
        let calls = calls
            .into_iter()
            .map(|(t, input, output)| (t, HostInto { input, output }))
            .collect();
        self.group(calls, op)
            .await
            .into_iter()
            .map(|h| {
                RoundHandle(Box::pin(
                    async move { h.await.map(|d| (d.input, d.output)) },
                ))
            })
            .collect()
    }

    /// The group call over any round data (see [`Worker::push_pull_group_into`]).
    pub(super) async fn group<R: RoundData>(
        &self,
        calls: Vec<(Tensor, R)>,
        op: Reduce,
    ) -> Vec<RoundHandle<R>> {
        let kind = RoundKind::Sum {
            average: op == Reduce::Average,
        };
        let n = calls.len();
        // Locks are taken highest priority first, then by name: one order for every group
        // call, so two groups listing tensors of one priority in different orders cannot each
        // hold a lock the other waits for.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| {
            let key = |i: usize| (std::cmp::Reverse(calls[i].0.priority()), calls[i].0.name());
            key(a).cmp(&key(b)).then(a.cmp(&b))
        });
        let mut slots: Vec<Option<(Tensor, R)>> = calls.into_iter().map(Some).collect();
        let mut failed: Vec<Option<WorkerError>> = (0..n).map(|_| None).collect();
        let mut prepared: Vec<(usize, Prepared<R>)> = Vec::with_capacity(n);
        let mut low_rank: Vec<Option<RoundHandle<R>>> = (0..n).map(|_| None).collect();
        let mut seen = std::collections::HashSet::new();
        for &i in &order {
            let Some((tensor, data)) = slots[i].take() else {
                continue;
            };
            // By address (a `usize`, so the future stays `Send`).
            if !seen.insert(std::sync::Arc::as_ptr(&tensor.inner) as usize) {
                failed[i] = Some(WorkerError::TwiceInGroup {
                    name: tensor.name().to_string(),
                });
                continue;
            }
            if let (Some(_), RoundKind::Sum { average }) = (&tensor.inner.low_rank, kind) {
                // A PowerSGD step is a sequence of rounds of its own, in a task of its own.
                low_rank[i] = Some(self.low_rank_step(&tensor, data, average));
                continue;
            }
            // Checks the buffers' lengths before it waits for the tensor's lock.
            match self.prepare(&tensor, data, kind).await {
                Ok(p) => prepared.push((i, p)),
                Err(e) => failed[i] = Some(e),
            }
        }
        // Every lock is held. A device's rounds start as one batch; once its payloads are in
        // host staging (the device may first finish work queued before them: a training's
        // kernels), hold every priority before any round is encoded, then start the rounds
        // highest priority first, in the order of `calls` within a priority. Holding the
        // sender while the device is still busy would hold back lower-priority frames
        // already queued (an earlier bucket's) for nothing.
        prepared.sort_by_key(|(i, p)| (std::cmp::Reverse(p.tensor.placement.priority), *i));
        let mut all: Vec<&mut Prepared<R>> = prepared.iter_mut().map(|(_, p)| p).collect();
        self.launch(&mut all);
        // Every round's copies start (in `ready`) before any is waited for, so that they
        // overlap on the device; waited for in turn, one blocking thread at a time (they land
        // in that order).
        let readies: Vec<_> = prepared
            .iter_mut()
            .filter_map(|(_, p)| p.data.ready())
            .collect();
        for ready in readies {
            ready.await;
        }
        let holds: Vec<SendHold> = prepared
            .iter()
            .map(|(_, p)| self.inner.sender.hold(p.tensor.placement.priority))
            .collect();
        let mut handles = low_rank;
        for ((i, p), hold) in prepared.into_iter().zip(holds) {
            let name = p.tensor.placement.name.clone();
            let p = match p.unless_refused() {
                Ok(p) => p,
                Err(e) => {
                    handles[i] = Some(RoundHandle(Box::pin(async move { Err(e) })));
                    continue;
                }
            };
            let task = p.spawn(Some(hold));
            handles[i] = Some(RoundHandle(Box::pin(async move {
                join_round(task, &name).await
            })));
        }
        handles
            .into_iter()
            .zip(failed)
            .map(|(h, e)| match (h, e) {
                (Some(h), _) => h,
                (None, e) => {
                    let e = e.unwrap_or_else(|| {
                        WorkerError::Internal("a group call's entry was lost".into())
                    });
                    RoundHandle(Box::pin(async move { Err(e) }))
                }
            })
            .collect()
    }
}
