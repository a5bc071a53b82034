//! One round of one tensor: push every chunk, wait for its result, decode into the buffer.
//!
//! Chunks run concurrently as futures of the round's task, sharing the caller's buffer (a
//! [`RoundData`]: host memory or a device's) behind a mutex that is held only to encode or
//! decode one chunk, never across an await. Every chunk is encoded at once (into a
//! pooled buffer; a device's chunks were all launched with the call's other rounds,
//! [`RoundData::launch`], and each is taken from the batch's staging in turn) and queued on
//! the worker's [`FrameSender`](pushpull_net::sender::FrameSender), which sends it in priority
//! order within the worker's byte window; the window frees a frame once its server has
//! received it, whatever the round is doing, so rounds of different tensors issued in any
//! order on different workers can never wait on each other. The push and its awaited outcome
//! are [`crate::push`]'s; in a local group each chunk goes through
//! [`crate::local::chunk_round`] instead, which uses them too.
//!
//! A server's abort, or a codec error, fails the call but not the round: the other chunks are
//! still pushed and awaited, so the tensor's round counter stays in step with the other
//! workers and the servers. A fatal error (a lost node) ends the call at once.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use futures_util::stream::{FuturesUnordered, StreamExt};
use pushpull_net::sender::SendHold;

use crate::data::RoundData;
use crate::dispatch::Outcome;
use crate::error::WorkerError;
use crate::local::Local;
use crate::push::{
    aborted, codec_error, codec_phase, decompress_phase, push_await, Pulled, Queued, QueuedMark,
    RoundCtx,
};
use crate::shared::Shared;
use crate::tensor::{RoundKind, TensorInner};

/// Whether this worker (`rank`) encodes its data in a round of `kind`: always for a sum, only
/// the root for a broadcast.
fn encodes(kind: RoundKind, rank: u32) -> bool {
    match kind {
        RoundKind::Sum { .. } | RoundKind::Gossip => true,
        RoundKind::Broadcast { root } => root == rank,
    }
}

/// Runs `round` of `tensor` over `data` (already checked to have the tensor's length, and
/// [`RoundData::begin`] called). `local` is this worker's local group, where the cluster has
/// them (`cluster.local_size` > 1): chunks then go through [`crate::local::chunk_round`].
pub(crate) async fn run_round<R: RoundData>(
    ctx: RoundCtx,
    local: Option<&Local>,
    tensor: Arc<TensorInner>,
    round: u64,
    kind: RoundKind,
    data: &Mutex<R>,
    hold: Option<SendHold>,
) -> Result<(), WorkerError> {
    let queued = Queued::new(tensor.ranges.len(), hold);
    let started = std::time::Instant::now();
    // A device's payloads may still be on their way to host staging: wait for them here, not
    // in an encode under the data's lock (that would block a runtime thread on the device).
    let ready = data.lock().unwrap_or_else(|p| p.into_inner()).ready();
    if let Some(ready) = ready {
        ready.await;
    }
    let codec_nanos = (
        tensor.compress_nanos.load(Ordering::Relaxed),
        tensor.decompress_nanos.load(Ordering::Relaxed),
    );
    let mut first_error: Option<WorkerError> = None;
    let mut non_finite = false;
    {
        // A local group's accumulator for the tensor, known once for all its chunks.
        let place = match local {
            Some(local) if !tensor.ranges.is_empty() => Some(local.place_of(&tensor).await?),
            _ => None,
        };
        let mut running: FuturesUnordered<_> = (0..tensor.ranges.len())
            .map(|i| {
                let (ctx, tensor, queued) = (&ctx, &tensor, &queued);
                async move {
                    let mark = queued.mark();
                    match (local, place) {
                        (Some(local), Some(place)) => {
                            let at = (i, round, kind);
                            crate::local::chunk_round(ctx, local, place, tensor, at, data, mark)
                                .await
                        }
                        _ => chunk_round(ctx, tensor, i, round, kind, data, mark).await,
                    }
                }
            })
            .collect();
        while let Some(result) = running.next().await {
            match result {
                Ok(Pulled::Sum) => {}
                Ok(Pulled::NonFinite) => non_finite = true,
                Err(e) if e.is_fatal() => return Err(e),
                Err(e) => {
                    tracing::debug!("worker {}: {e}", ctx.rank);
                    first_error.get_or_insert(e);
                }
            }
        }
    }
    if non_finite {
        tensor.rounds_non_finite.fetch_add(1, Ordering::Relaxed);
    }
    // Wait = the round's wall time minus this round's compress and decompress time (chunks
    // run as futures of this one task, so their codec work does not overlap).
    let codec = (tensor.compress_nanos.load(Ordering::Relaxed) - codec_nanos.0)
        + (tensor.decompress_nanos.load(Ordering::Relaxed) - codec_nanos.1);
    let wall = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
    tensor
        .wait_nanos
        .fetch_add(wall.saturating_sub(codec), Ordering::Relaxed);
    match first_error {
        Some(e @ WorkerError::Aborted { .. }) => Err(prefer_fatal(&ctx.shared, e).await),
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// When a node is lost, servers abort their open rounds (naming the node) at about the moment
/// the scheduler's `NodeLost` reaches this worker; the abort may win the race. So an abort
/// waits a moment ([`ABORT_GRACE`] at most, less with a shorter heartbeat interval) for the
/// job's fatal error and returns that instead, so that a call pending when a node is lost fails
/// with [`WorkerError::NodeLost`] like every later call. A genuine abort (a bad push) is
/// reported that much later.
async fn prefer_fatal(shared: &Shared, abort: WorkerError) -> WorkerError {
    let grace = ABORT_GRACE.min(shared.heartbeat_interval);
    let mut rx = shared.subscribe();
    let fatal = tokio::time::timeout(grace, async {
        match rx.wait_for(|s| s.fatal.is_some()).await {
            Ok(s) => s.fatal.clone(),
            Err(_) => None,
        }
    })
    .await;
    match fatal {
        Ok(Some(fatal)) => fatal,
        _ => abort,
    }
}

/// Longest wait of [`prefer_fatal`].
const ABORT_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// One chunk of one round: encode, push, await the result, decode into the buffer. `data` is
/// locked only for encoding and decoding, never across an await.
async fn chunk_round<R: RoundData>(
    ctx: &RoundCtx,
    tensor: &TensorInner,
    index: usize,
    round: u64,
    kind: RoundKind,
    data: &Mutex<R>,
    mark: QueuedMark<'_>,
) -> Result<Pulled, WorkerError> {
    let lock = || data.lock().unwrap_or_else(|p| p.into_inner());
    let encoded = encodes(kind, ctx.rank).then(|| {
        let counter = matches!(kind, RoundKind::Sum { .. } | RoundKind::Gossip)
            .then_some(&tensor.compress_nanos);
        codec_phase(ctx.rank, tensor, index, round, "compress", counter, || {
            lock().encode(tensor, index, round, kind, ctx.lr(), &ctx.pool)
        })
    });
    let outcome = push_await(ctx, tensor, index, round, kind, encoded, mark).await?;
    let chunk = tensor.placement.chunks[index];
    let link = &ctx.links[chunk.server as usize];
    let codec_error = |message: String| codec_error(tensor, index, round, message);
    match outcome {
        Outcome::Result(payload) => {
            let decoded = decompress_phase(ctx.rank, tensor, index, round, || {
                let lr = ctx.lr();
                lock().decode(tensor, index, round, kind, lr, ctx.num_workers, &payload)
            });
            decoded
                .map(|()| Pulled::Sum)
                .map_err(|e| codec_error(format!("decoding the result from {}: {e}", link.name)))
        }
        Outcome::NonFinite if matches!(kind, RoundKind::Sum { .. }) => lock()
            .non_finite(tensor, index, round)
            .map(|()| Pulled::NonFinite)
            .map_err(|e| codec_error(format!("filling the chunk with NaN: {e}"))),
        Outcome::NonFinite => Err(codec_error(format!(
            "{} sent a non-finite result for a {}",
            link.name,
            kind.op_name()
        ))),
        Outcome::Abort(message) => Err(aborted(ctx, tensor, index, round, kind, message)),
    }
}

pub(crate) fn add_nanos(counter: &std::sync::atomic::AtomicU64, since: std::time::Instant) {
    let n = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
    counter.fetch_add(n, Ordering::Relaxed);
}
