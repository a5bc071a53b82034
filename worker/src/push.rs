//! One chunk's push and the outcome it awaits, and the rest of a chunk's round that a flat
//! round (`crate::round`, the shell of [`crate::core::RoundCore`]) and a local group's round
//! (`crate::local`) share: what a round needs from its worker ([`RoundCtx`], its connections to
//! the servers [`ServerLinks`], the round's [`RoundSpec`] for the core), the push itself
//! ([`send_push`]: registered with the connection's dispatch table, queued on the worker's
//! [`FrameSender`], which sends it in priority order within the worker's byte window, then the
//! server's [`Outcome`] awaited), the chunk's codec work timed and traced ([`codec_phase`],
//! [`decompress_phase`]) and the count of a round's chunks still to be queued ([`Queued`]). A
//! local group, where the cluster has one, is not part of [`RoundCtx`]: the round hands it to
//! `crate::local::chunk_round`, which calls back down here, never the other way round.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use pushpull_net::sender::{FrameSender, Peer, SendHold};
use pushpull_proto::pool::BufPool;
use pushpull_proto::protocol::FrameHeader;
use pushpull_proto::NodeName;

use crate::core::{RoundKind, RoundSpec};
use crate::data::ChunkAt;
use crate::dispatch::{Outcome, Waiter};
use crate::error::WorkerError;
use crate::shared::Shared;
use crate::tensor::TensorInner;

/// A worker's connections to the servers, by server id.
pub(crate) struct ServerLinks {
    /// Each server's name.
    pub(crate) names: Vec<NodeName>,
    /// Each server's connection.
    pub(crate) peers: Vec<Peer>,
}

/// What a round needs from its worker to push its chunks and decode their results (not its
/// local group: see the module docs).
#[derive(Clone)]
pub(crate) struct RoundCtx {
    pub(crate) shared: Arc<Shared>,
    pub(crate) links: Arc<ServerLinks>,
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

    /// Chunk `index` of `round` of `tensor`, for the round's data ([`crate::data::RoundData`]).
    pub(crate) fn at<'a>(
        &self,
        tensor: &'a TensorInner,
        index: usize,
        round: u64,
        kind: RoundKind,
    ) -> ChunkAt<'a> {
        ChunkAt {
            tensor,
            index,
            round,
            kind,
            lr: self.lr(),
            num_workers: self.num_workers,
            rank: self.rank,
        }
    }

    /// `round` of `tensor` as the core sees it; `delegated`: each chunk's round is a local
    /// group's.
    pub(crate) fn spec<'a>(
        &'a self,
        tensor: &'a TensorInner,
        round: u64,
        kind: RoundKind,
        delegated: bool,
    ) -> RoundSpec<'a> {
        RoundSpec {
            placement: &tensor.placement,
            servers: &self.links.names,
            rank: self.rank,
            round,
            kind,
            learning_rate: self.learning_rate,
            undo_previous: self.undone.is_some(),
            delegated,
            grace: ABORT_GRACE.min(self.shared.heartbeat_interval),
        }
    }
}

/// The longest an aborted round waits for the job's loss (less with a shorter heartbeat
/// interval; see [`crate::core::RoundCore`]).
const ABORT_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

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

/// What a pushed chunk awaits: its server's outcome (the dispatch table's), or the job's
/// loss.
pub(crate) type Awaited = futures_util::future::BoxFuture<'static, Result<Outcome, WorkerError>>;

/// Sends chunk `index`'s push (`header`, `payload`) to its server and returns what it awaits;
/// `mark` is dropped once the push is queued. The chunk is registered with the connection's
/// dispatch table before it is sent, so its outcome cannot arrive unseen; an outcome that
/// arrived before (the round was aborted by another worker's bad push) is what it awaits, and
/// nothing is sent. A failed write makes the server's loss the job's fatal error, which the
/// dispatch table hands to the waiting chunk. The chunk's `wait` span lasts until its outcome
/// is in.
pub(crate) fn send_push(
    ctx: &RoundCtx,
    tensor: &TensorInner,
    index: usize,
    header: FrameHeader,
    payload: Bytes,
    mark: QueuedMark<'_>,
) -> Result<Awaited, WorkerError> {
    let server = tensor.placement.chunks[index].server as usize;
    let waiter = ctx.shared.dispatch[server].register(header.key, header.round)?;
    let rx = match waiter {
        Waiter::Ready(outcome) => return Ok(Box::pin(std::future::ready(Ok(outcome)))),
        Waiter::Pending(rx) => rx,
    };
    let wait = crate::spans::chunk("wait", ctx.rank, tensor, index, header.round);
    let pushed = payload.len() as u64;
    ctx.sender.send(
        &ctx.links.peers[server],
        header,
        payload,
        tensor.placement.priority,
    );
    drop(mark);
    tensor.bytes_pushed.fetch_add(pushed, Ordering::Relaxed);
    let shared = ctx.shared.clone();
    let (key, round) = (header.key, header.round);
    Ok(Box::pin(async move {
        let _wait = wait;
        match rx.await {
            Ok(delivery) => delivery,
            Err(_) => Err(shared.state().fatal.unwrap_or_else(|| {
                WorkerError::Internal(format!(
                    "the dispatch table dropped key {key:#018x} round {round}"
                ))
            })),
        }
    }))
}

/// Counts a result's payload into the tensor's pulled bytes.
pub(crate) fn count_pulled(tensor: &TensorInner, outcome: &Outcome) {
    if let Outcome::Result(payload) = outcome {
        tensor
            .bytes_pulled
            .fetch_add(payload.len() as u64, Ordering::Relaxed);
    }
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
