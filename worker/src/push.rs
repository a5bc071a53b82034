//! One chunk's push and the outcome it awaits, and the rest of a chunk's round that a flat
//! round (`crate::round`) and a local group's round (`crate::local`) share: what a round needs
//! from its worker ([`RoundCtx`], its connections to the servers [`ServerLink`]), the push itself
//! ([`push_await`]: queued on the worker's [`FrameSender`], which sends it in priority order
//! within the worker's byte window, then the server's [`Outcome`] awaited), the chunk's codec
//! work timed and traced ([`codec_phase`], [`decompress_phase`]), the errors that name the
//! chunk ([`codec_error`], [`aborted`]), the count of a round's chunks still to be queued
//! ([`Queued`]) and what a chunk's round pulled ([`Pulled`]). A local group, where the cluster
//! has one, is not part of [`RoundCtx`]: the round hands it to `crate::local::chunk_round`,
//! which calls back down here, never the other way round.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use pushpull_net::sender::{FrameSender, Peer, SendHold};
use pushpull_proto::pool::BufPool;
use pushpull_proto::protocol::{FrameFlags, FrameHeader, FrameKind, ReduceOp};
use pushpull_proto::NodeName;

use crate::data::Encoded;
use crate::dispatch::{Outcome, Waiter};
use crate::error::WorkerError;
use crate::shared::Shared;
use crate::tensor::{RoundKind, TensorInner};

/// A worker's connection to one server.
pub(crate) struct ServerLink {
    pub(crate) name: NodeName,
    pub(crate) peer: Peer,
}

/// What a round needs from its worker to push its chunks and decode their results (not its
/// local group: see the module docs).
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
}

impl RoundCtx {
    /// The round's learning rate (it travels as f32 bits, 0 when the training loop set none).
    pub(crate) fn lr(&self) -> Option<f32> {
        (self.learning_rate != 0).then(|| f32::from_bits(self.learning_rate))
    }
}

/// Counts the chunks of a round not yet queued for sending, and holds the round's
/// [`SendHold`] (if any) until none is left.
pub(crate) struct Queued {
    left: std::sync::atomic::AtomicUsize,
    hold: Mutex<Option<SendHold>>,
}

impl Queued {
    /// A round of `chunks` chunks, holding `hold` until every one is queued.
    pub(crate) fn new(chunks: usize, hold: Option<SendHold>) -> Queued {
        Queued {
            left: std::sync::atomic::AtomicUsize::new(chunks),
            hold: Mutex::new(hold),
        }
    }

    /// The mark of one of the round's chunks.
    pub(crate) fn mark(&self) -> QueuedMark<'_> {
        QueuedMark(self)
    }
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
