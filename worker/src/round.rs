//! One round of one tensor: push every chunk, wait for its result, decode into the buffer.
//!
//! Chunks run concurrently as futures of the round's task, sharing the caller's buffer (a
//! [`RoundData`]: host memory or a device's) behind a mutex that is held only to encode or
//! decode one chunk, never across an await. Every chunk is encoded at once (into a
//! pooled buffer; a device's chunks were all launched with the call's other rounds,
//! [`RoundData::launch`], and each is taken from the batch's staging in turn) and queued on
//! the worker's [`FrameSender`], which sends it in priority
//! order within the worker's byte window; the window frees a frame once its server has
//! received it, whatever the round is doing, so rounds of different tensors issued in any
//! order on different workers can never wait on each other.
//!
//! A server's abort, or a codec error, fails the call but not the round: the other chunks are
//! still pushed and awaited, so the tensor's round counter stays in step with the other
//! workers and the servers. A fatal error (a lost node) ends the call at once.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use pushpull_net::sender::{FrameSender, Peer, SendHold};
use pushpull_proto::pool::BufPool;
use pushpull_proto::protocol::{FrameFlags, FrameHeader, FrameKind, ReduceOp};
use pushpull_proto::NodeName;

use crate::data::{Encoded, RoundData};
pub(crate) use crate::dispatch::Outcome;
use crate::dispatch::Waiter;
use crate::error::WorkerError;
use crate::shared::Shared;
use crate::tensor::{RoundKind, TensorInner};

/// A worker's connection to one server.
pub(crate) struct ServerLink {
    pub(crate) name: NodeName,
    pub(crate) peer: Peer,
}

/// What a round needs from its worker.
#[derive(Clone)]
pub(crate) struct RoundCtx {
    pub(crate) shared: Arc<Shared>,
    pub(crate) links: Arc<Vec<ServerLink>>,
    /// Sends the pushes (one queue and window for every server connection).
    pub(crate) sender: FrameSender,
    pub(crate) rank: u32,
    pub(crate) num_workers: u32,
    /// Buffers for encoded pushes.
    pub(crate) pool: Arc<BufPool>,
    /// The round's learning rate as f32 bits (0: none), pushed in the header's `aux`.
    pub(crate) learning_rate: u32,
    /// The tensor's previous sum round, discarded and undone here (see
    /// [`crate::Worker::discard_last_round`]): the pushes ask the servers to undo it too.
    pub(crate) undone: Option<u64>,
    /// This worker's local group, where the cluster has them (`cluster.local_size` > 1):
    /// chunks then go through [`crate::local::chunk_round`].
    pub(crate) local: Option<Arc<crate::local::Local>>,
}

impl RoundCtx {
    /// The round's learning rate (it travels as f32 bits, 0 when the training loop set none).
    pub(crate) fn lr(&self) -> Option<f32> {
        (self.learning_rate != 0).then(|| f32::from_bits(self.learning_rate))
    }
}

/// Whether this worker (`rank`) encodes its data in a round of `kind`: always for a sum, only
/// the root for a broadcast.
fn encodes(kind: RoundKind, rank: u32) -> bool {
    match kind {
        RoundKind::Sum { .. } | RoundKind::Gossip => true,
        RoundKind::Broadcast { root } => root == rank,
    }
}

/// Runs `round` of `tensor` over `data` (already checked to have the tensor's length, and
/// [`RoundData::begin`] called).
pub(crate) async fn run_round<R: RoundData>(
    ctx: RoundCtx,
    tensor: Arc<TensorInner>,
    round: u64,
    kind: RoundKind,
    data: &Mutex<R>,
    hold: Option<SendHold>,
) -> Result<(), WorkerError> {
    let queued = Queued {
        left: std::sync::atomic::AtomicUsize::new(tensor.ranges.len()),
        hold: Mutex::new(hold),
    };
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
        let place = match &ctx.local {
            Some(local) if !tensor.ranges.is_empty() => Some(local.place_of(&tensor).await?),
            _ => None,
        };
        let mut running: FuturesUnordered<_> = (0..tensor.ranges.len())
            .map(|i| {
                let (ctx, tensor, queued) = (&ctx, &tensor, &queued);
                async move {
                    let mark = QueuedMark(queued);
                    match (&ctx.local, place) {
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

/// Counts the chunks of a round not yet queued for sending, and holds the round's
/// [`SendHold`] (if any) until none is left.
struct Queued {
    left: std::sync::atomic::AtomicUsize,
    hold: Mutex<Option<SendHold>>,
}

/// One chunk's mark in [`Queued`]: dropped once the chunk is queued (or will never be).
pub(crate) struct QueuedMark<'a>(&'a Queued);

impl Drop for QueuedMark<'_> {
    fn drop(&mut self) {
        if self.0.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let hold = self.0.hold.lock().unwrap_or_else(|p| p.into_inner()).take();
            drop(hold);
        }
    }
}

/// What a chunk's round pulled.
pub(crate) enum Pulled {
    /// Its sum (or the broadcast root's data), decoded into the buffer.
    Sum,
    /// A non-finite sum: the buffer's chunk holds NaN.
    NonFinite,
}

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

/// A codec's failure on chunk `index` of `tensor` in `round`.
pub(crate) fn codec_error(
    tensor: &TensorInner,
    index: usize,
    round: u64,
    message: String,
) -> WorkerError {
    WorkerError::Codec {
        name: tensor.placement.name.clone(),
        chunk: index as u32,
        key: tensor.placement.chunks[index].key,
        round,
        message,
    }
}

/// A round of chunk `index` that its server aborted with `message`.
pub(crate) fn aborted(
    ctx: &RoundCtx,
    tensor: &TensorInner,
    index: usize,
    round: u64,
    kind: RoundKind,
    message: String,
) -> WorkerError {
    let chunk = tensor.placement.chunks[index];
    WorkerError::Aborted {
        op: kind.op_name(),
        name: tensor.placement.name.clone(),
        chunk: index as u32,
        key: chunk.key,
        round,
        server: ctx.links[chunk.server as usize].name.to_string(),
        message,
    }
}

/// Pushes chunk `index`'s `encoded` payload (`None`: this worker sends an empty push, a
/// broadcast's non-root) to its server and awaits the server's outcome; the mark is dropped
/// once the push is queued. An encoding that failed is still pushed, empty: the server
/// rejects it and aborts the round for every worker, instead of leaving the others waiting
/// for this push; the encoding's error is returned once the round is over. A chunk that is
/// not finite is pushed flagged so, and the round's sum will be too.
pub(crate) async fn push_await(
    ctx: &RoundCtx,
    tensor: &TensorInner,
    index: usize,
    round: u64,
    kind: RoundKind,
    encoded: Option<Result<Encoded, String>>,
    mark: QueuedMark<'_>,
) -> Result<Outcome, WorkerError> {
    let chunk = tensor.placement.chunks[index];
    let link = &ctx.links[chunk.server as usize];
    let dispatch = &ctx.shared.dispatch[chunk.server as usize];
    let (op, aux) = match kind {
        RoundKind::Sum { .. } => (ReduceOp::Sum, ctx.learning_rate),
        RoundKind::Broadcast { root } => (ReduceOp::Broadcast, root),
        RoundKind::Gossip => (ReduceOp::Gossip, 0),
    };
    let mut encode_error = None;
    let mut flags = FrameFlags {
        non_finite: false,
        undo_previous: ctx.undone.is_some() && matches!(kind, RoundKind::Sum { .. }),
    };
    let payload = if let Some(encoded) = encoded {
        match encoded {
            Ok(Encoded::Payload(payload)) => payload,
            Ok(Encoded::NonFinite(why)) => {
                tracing::debug!(
                    "worker {}: tensor {:?} chunk {index} round {round} is not finite: {why}",
                    ctx.rank,
                    tensor.placement.name
                );
                flags.non_finite = true;
                Bytes::new()
            }
            Err(e) => {
                let message = format!("encoding this worker's data: {e}");
                encode_error = Some(codec_error(tensor, index, round, message));
                Bytes::new()
            }
        }
    } else {
        Bytes::new()
    };

    let outcome = match dispatch.register(chunk.key, round)? {
        // The round was aborted before this worker pushed (another worker's push was bad).
        Waiter::Ready(outcome) => outcome,
        Waiter::Pending(rx) => {
            let header = FrameHeader {
                kind: FrameKind::Push,
                op,
                flags,
                rank: ctx.rank,
                aux,
                key: chunk.key,
                round,
                payload_len: payload.len() as u64,
            };
            let pushed = payload.len() as u64;
            // Until the result is handed over (or the chunk ends on another path).
            let _wait = crate::spans::chunk("wait", ctx.rank, tensor, index, round);
            // A failed write makes the server's loss the job's fatal error, which fails this
            // chunk's waiter.
            ctx.sender
                .send(&link.peer, header, payload, tensor.placement.priority);
            drop(mark);
            tensor.bytes_pushed.fetch_add(pushed, Ordering::Relaxed);
            match rx.await {
                Ok(Ok(outcome)) => outcome,
                Ok(Err(fatal)) => return Err(fatal),
                Err(_) => {
                    return Err(ctx.shared.state().fatal.unwrap_or_else(|| {
                        WorkerError::Internal(format!(
                            "the dispatch table dropped key {:#018x} round {round}",
                            chunk.key
                        ))
                    }))
                }
            }
        }
    };
    if let Some(e) = encode_error {
        return Err(e);
    }
    if let Outcome::Result(payload) = &outcome {
        tensor
            .bytes_pulled
            .fetch_add(payload.len() as u64, Ordering::Relaxed);
    }
    Ok(outcome)
}

/// Runs `f`, a codec call of chunk `index`'s `phase`, timed into `counter` and, when traced,
/// as the chunk's `phase` span: one clock read at each end serves both.
pub(crate) fn codec_phase<T>(
    rank: u32,
    tensor: &TensorInner,
    index: usize,
    round: u64,
    phase: &'static str,
    counter: Option<&std::sync::atomic::AtomicU64>,
    f: impl FnOnce() -> T,
) -> T {
    let t0 = std::time::Instant::now();
    let span = crate::spans::chunk_at(phase, rank, tensor, index, round, t0);
    let out = f();
    let t1 = std::time::Instant::now();
    if let Some(counter) = counter {
        let n = u64::try_from((t1 - t0).as_nanos()).unwrap_or(u64::MAX);
        counter.fetch_add(n, Ordering::Relaxed);
    }
    if let Some(span) = span {
        span.end_at(pushpull_net::timeline::stamp(t1));
    }
    out
}

/// [`codec_phase`] for a decode: the `decompress` span, timed into the tensor's decompress
/// seconds.
pub(crate) fn decompress_phase<T>(
    rank: u32,
    tensor: &TensorInner,
    index: usize,
    round: u64,
    f: impl FnOnce() -> T,
) -> T {
    let counter = Some(&tensor.decompress_nanos);
    codec_phase(rank, tensor, index, round, "decompress", counter, f)
}

pub(crate) fn add_nanos(counter: &std::sync::atomic::AtomicU64, since: std::time::Instant) {
    let n = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
    counter.fetch_add(n, Ordering::Relaxed);
}
