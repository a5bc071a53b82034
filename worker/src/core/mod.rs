//! The worker's core without I/O: the kinds of round ([`RoundKind`]), a tensor's sequence of
//! rounds ([`TensorRounds`]), and one round of one tensor as a deterministic state machine,
//! [`RoundCore`], as the scheduler (`handle(now, Event)` / `poll_action`) and the servers'
//! `KeyRounds` are. It is driven by a thin async shell (`crate::round`), which carries out its
//! [`Action`]s (encode a chunk of the caller's buffer, push a frame, decode a result into the
//! buffer, run a local group's round of a chunk) and feeds back what they gave, the servers'
//! [`Outcome`]s and the job's loss as [`Event`]s. The core decides everything else: which
//! chunks this worker encodes, each push's frame, what an outcome means for the chunk, which
//! error a round ends with (a lost node at once; an abort waits a moment for the lost node
//! that usually causes it), and when the round is over. Its tests (`core/tests.rs`) drive it
//! without sockets or a runtime.
//!
//! | item | what it is |
//! |---|---|
//! | [`RoundKind`] | a sum (or average), a broadcast from a root, a gossip round |
//! | [`RoundCore`] | one round: chunks started in order (encode then push, each before the next is encoded), outcomes in any order, one [`Finished`] at the end |
//! | [`RoundSpec`] | what a round is: its tensor's placement, the servers' names, this worker's rank, the round's number, kind and learning rate; the errors that name one of its chunks (a codec's failure, a server's abort) |
//! | [`Event`], [`Action`] | what the shell feeds in and carries out |
//! | [`Encoded`], [`Pulled`] | what encoding a chunk gave; what a chunk's round pulled |
//! | [`push_frame`] | a chunk's push (header and payload) from what its encoding gave; a local group's owner pushes with it too |
//! | [`TensorRounds`] | a tensor's sequence of rounds (`core/tensor.rs`): the next round's number, the last push_pull round, a discarded one and its undo, what a checkpoint keeps of them |

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pushpull_proto::protocol::{FrameFlags, FrameHeader, FrameKind, ReduceOp, TensorPlacement};
use pushpull_proto::NodeName;

use crate::dispatch::Outcome;
use crate::error::{DataError, WorkerError};

mod tensor;
#[cfg(test)]
mod tests;

pub(crate) use tensor::{SavedRounds, TensorRounds, Undiscardable};

/// What kind of round a call runs (a push_pull's [`crate::Reduce`], a broadcast, a gossip
/// round).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RoundKind {
    /// Sum over workers, optionally divided by the number of workers.
    Sum {
        /// Divide by `num_workers` after decoding.
        average: bool,
    },
    /// Everyone gets the root's data.
    Broadcast {
        /// The root rank.
        root: u32,
    },
    /// Decentralised averaging with the graph neighbours (a tensor whose map says
    /// `exchange = "gossip"`; `crate::Worker::gossip`).
    Gossip,
}

impl RoundKind {
    /// The call's name in error messages.
    pub(crate) fn op_name(self) -> &'static str {
        match self {
            RoundKind::Sum { .. } => "push_pull",
            RoundKind::Broadcast { .. } => "broadcast",
            RoundKind::Gossip => "gossip",
        }
    }
}

/// What a round is (see [`RoundCore::new`]).
#[derive(Clone, Copy)]
pub(crate) struct RoundSpec<'a> {
    /// The tensor's placement: its name and chunks (key, server).
    pub(crate) placement: &'a TensorPlacement,
    /// Each server's name, by id, for the errors that name one.
    pub(crate) servers: &'a [NodeName],
    /// This worker's rank.
    pub(crate) rank: u32,
    /// The tensor's round.
    pub(crate) round: u64,
    pub(crate) kind: RoundKind,
    /// The round's learning rate as f32 bits (0: none), pushed in a sum's header `aux`.
    pub(crate) learning_rate: u32,
    /// The tensor's previous sum round was discarded here: a sum's pushes ask the servers to
    /// undo it too.
    pub(crate) undo_previous: bool,
    /// Each chunk's round is a local group's ([`Action::Delegate`]) instead of this worker's
    /// own push.
    pub(crate) delegated: bool,
    /// How long an abort waits for the job's loss before it is the round's error.
    pub(crate) grace: Duration,
}

/// What encoding a chunk gave: its payload, or the news that it is not finite.
#[derive(Debug)]
pub(crate) enum Encoded {
    /// The chunk's payload.
    Payload(Bytes),
    /// The chunk holds inf or NaN, or its compression overflows f32 (the kernels' message):
    /// the worker pushes it flagged non-finite, its compressor state unchanged (see
    /// `pushpull_proto::protocol`'s module docs).
    NonFinite(String),
}

/// What a chunk's round pulled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pulled {
    /// Its sum (or the broadcast root's data), decoded into the buffer.
    Sum,
    /// A non-finite sum: the buffer's chunk holds NaN.
    NonFinite,
}

/// What the shell feeds into a [`RoundCore`].
#[derive(Debug)]
pub(crate) enum Event {
    /// What [`Action::Encode`] of `chunk` gave.
    Encoded {
        chunk: usize,
        result: Result<Encoded, DataError>,
    },
    /// The server's answer for `chunk` (pushed by [`Action::Push`]).
    Outcome { chunk: usize, outcome: Outcome },
    /// What [`Action::Decode`] or [`Action::FillNonFinite`] of `chunk` gave.
    Decoded {
        chunk: usize,
        result: Result<(), DataError>,
    },
    /// `chunk`'s round ended elsewhere: a local group's round ([`Action::Delegate`]), or a push
    /// that could not be awaited (the job failed before it was registered).
    Done {
        chunk: usize,
        result: Result<Pulled, WorkerError>,
    },
    /// The job failed: the error that names the lost node.
    Lost(WorkerError),
}

/// What a [`RoundCore`] asks the shell to do.
#[derive(Debug)]
pub(crate) enum Action {
    /// Encode `chunk` of this worker's data, then feed [`Event::Encoded`].
    Encode { chunk: usize },
    /// Send this push to the chunk's server and await its outcome ([`Event::Outcome`]).
    Push {
        chunk: usize,
        header: FrameHeader,
        payload: Bytes,
    },
    /// Decode the chunk's result into the buffer (and average it, for an average), then feed
    /// [`Event::Decoded`].
    Decode { chunk: usize, payload: Bytes },
    /// The chunk's sum was not finite: undo its round and fill it with NaN, then feed
    /// [`Event::Decoded`].
    FillNonFinite { chunk: usize },
    /// Run the local group's round of `chunk`, then feed [`Event::Done`].
    Delegate { chunk: usize },
    /// The round is over; the core takes no further events.
    Finish(Finished),
}

/// How a round ended.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) result: Result<(), WorkerError>,
    /// Some chunk's sum was not finite (counted only for a round whose every chunk ended).
    pub(crate) non_finite: bool,
}

/// Where a chunk is in its round.
#[derive(Debug)]
enum Chunk {
    /// Not started.
    Idle,
    /// [`Action::Encode`] is out.
    Encoding,
    /// Pushed; awaiting the outcome. `failed`: the encoding failed (pushed empty so that the
    /// server aborts the round for every worker), the error to report once the outcome is in.
    Pushed { failed: Option<WorkerError> },
    /// [`Action::Decode`] is out.
    Decoding,
    /// [`Action::FillNonFinite`] is out.
    Filling,
    /// [`Action::Delegate`] is out.
    Delegated,
    /// Ended.
    Done,
}

impl RoundSpec<'_> {
    // The errors that name a chunk of the round: its tensor, the chunk's index and key, the
    // round, and the server that holds it.

    /// The name of chunk `index`'s server (its id, should the placement name one unknown).
    pub(crate) fn server(&self, index: usize) -> String {
        let id = self.placement.chunks[index].server;
        match self.servers.get(id as usize) {
            Some(name) => name.to_string(),
            None => format!("server {id}"),
        }
    }

    /// A codec's failure on chunk `index`.
    pub(crate) fn codec(&self, index: usize, message: String) -> WorkerError {
        WorkerError::Codec {
            name: self.placement.name.clone(),
            chunk: index as u32,
            key: self.placement.chunks[index].key,
            round: self.round,
            message,
        }
    }

    /// Chunk `index`'s round, aborted by its server with `message`.
    pub(crate) fn aborted(&self, index: usize, message: String) -> WorkerError {
        WorkerError::Aborted {
            op: self.kind.op_name(),
            name: self.placement.name.clone(),
            chunk: index as u32,
            key: self.placement.chunks[index].key,
            round: self.round,
            server: self.server(index),
            message,
        }
    }
}

/// Whether worker `rank` encodes its data in a round of `kind`: always for a sum or a gossip
/// round, only the root for a broadcast.
pub(crate) fn encodes(kind: RoundKind, rank: u32) -> bool {
    match kind {
        RoundKind::Sum { .. } | RoundKind::Gossip => true,
        RoundKind::Broadcast { root } => root == rank,
    }
}

/// The push of chunk `index` of `spec`'s round: its header and payload from what encoding gave
/// (`None`: this worker sends an empty push, a broadcast's non-root). An encoding that failed
/// is pushed empty, so that its server rejects it and aborts the round for every worker
/// instead of leaving the others waiting; its error is returned to be reported once the round
/// is over. A chunk that is not finite is pushed empty, flagged so.
pub(crate) fn push_frame(
    spec: &RoundSpec<'_>,
    index: usize,
    encoded: Option<Result<Encoded, DataError>>,
) -> (FrameHeader, Bytes, Option<WorkerError>) {
    let (op, aux) = match spec.kind {
        RoundKind::Sum { .. } => (ReduceOp::Sum, spec.learning_rate),
        RoundKind::Broadcast { root } => (ReduceOp::Broadcast, root),
        RoundKind::Gossip => (ReduceOp::Gossip, 0),
    };
    let mut flags = FrameFlags {
        non_finite: false,
        undo_previous: spec.undo_previous && matches!(spec.kind, RoundKind::Sum { .. }),
    };
    let mut failed = None;
    let payload = match encoded {
        Some(Ok(Encoded::Payload(payload))) => payload,
        Some(Ok(Encoded::NonFinite(why))) => {
            tracing::debug!(
                "worker {}: tensor {:?} chunk {index} round {} is not finite: {why}",
                spec.rank,
                spec.placement.name,
                spec.round
            );
            flags.non_finite = true;
            Bytes::new()
        }
        Some(Err(e)) => {
            let message = format!("encoding this worker's data: {e}");
            failed = Some(spec.codec(index, message));
            Bytes::new()
        }
        None => Bytes::new(),
    };
    let header = FrameHeader {
        kind: FrameKind::Push,
        op,
        flags,
        rank: spec.rank,
        aux,
        key: spec.placement.chunks[index].key,
        round: spec.round,
        payload_len: payload.len() as u64,
    };
    (header, payload, failed)
}

/// One round of one tensor (see the module docs).
///
/// Chunks start in order, one at a time: a chunk this worker encodes is encoded, then pushed,
/// before the next one is encoded, so the first push leaves while the others are encoded. A
/// server's abort or a codec's error fails the round but not at once: the other chunks are
/// still pushed and awaited, so that the tensor's round counter stays in step with the other
/// workers and the servers. The job's loss ends the round at once.
pub(crate) struct RoundCore<'a> {
    spec: RoundSpec<'a>,
    chunks: Vec<Chunk>,
    /// Chunks started so far (in order).
    started: usize,
    /// Chunks not yet ended.
    open: usize,
    actions: VecDeque<Action>,
    /// The round's first non-fatal error, in the order the chunks ended.
    first_error: Option<WorkerError>,
    non_finite: bool,
    /// Every chunk ended with an abort as the first error: the round waits until then for the
    /// job's loss.
    deadline: Option<Instant>,
    finished: bool,
}

impl<'a> RoundCore<'a> {
    /// A round as `spec` says; a round without chunks (an empty tensor) finishes at once.
    pub(crate) fn new(spec: RoundSpec<'a>) -> RoundCore<'a> {
        let n = spec.placement.chunks.len();
        let mut core = RoundCore {
            spec,
            chunks: (0..n).map(|_| Chunk::Idle).collect(),
            started: 0,
            open: n,
            actions: VecDeque::new(),
            first_error: None,
            non_finite: false,
            deadline: None,
            finished: false,
        };
        if n == 0 {
            core.finish(Ok(()));
        }
        core
    }

    /// The next thing to do, if any: what earlier events asked for first, then the next chunk
    /// to start. `None` until the next event (or [`RoundCore::poll_timeout`]).
    pub(crate) fn poll_action(&mut self) -> Option<Action> {
        if let Some(action) = self.actions.pop_front() {
            return Some(action);
        }
        if self.finished || self.started == self.chunks.len() {
            return None;
        }
        let chunk = self.started;
        self.started += 1;
        let spec = &self.spec;
        Some(if spec.delegated {
            self.chunks[chunk] = Chunk::Delegated;
            Action::Delegate { chunk }
        } else if encodes(spec.kind, spec.rank) {
            self.chunks[chunk] = Chunk::Encoding;
            Action::Encode { chunk }
        } else {
            self.push(chunk, None)
        })
    }

    /// When [`RoundCore::handle_timeout`] is due, if ever.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.deadline.filter(|_| !self.finished)
    }

    /// Time passed: an abort that waited long enough for the job's loss is the round's error.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if self.finished || self.deadline.is_none_or(|d| now < d) {
            return;
        }
        let error = self.first_error.take();
        self.finish(error.map_or(Ok(()), Err));
    }

    /// Feeds `event`, at `now`. Events about a chunk not in the phase they answer (a second
    /// outcome, say) are ignored, as is everything after the round finished.
    pub(crate) fn handle(&mut self, now: Instant, event: Event) {
        if self.finished {
            return;
        }
        let spec = self.spec;
        match event {
            Event::Lost(error) => self.finish(Err(error)),
            Event::Encoded { chunk, result } => {
                if let Some(Chunk::Encoding) = self.chunks.get(chunk) {
                    let action = self.push(chunk, Some(result));
                    self.actions.push_back(action);
                }
            }
            Event::Outcome { chunk, outcome } => {
                let Some(Chunk::Pushed { failed }) = self.chunks.get_mut(chunk) else {
                    return;
                };
                if let Some(error) = failed.take() {
                    return self.end_chunk(now, chunk, Err(error));
                }
                match outcome {
                    Outcome::Result(payload) => {
                        self.chunks[chunk] = Chunk::Decoding;
                        self.actions.push_back(Action::Decode { chunk, payload });
                    }
                    Outcome::NonFinite if matches!(self.spec.kind, RoundKind::Sum { .. }) => {
                        self.chunks[chunk] = Chunk::Filling;
                        self.actions.push_back(Action::FillNonFinite { chunk });
                    }
                    Outcome::NonFinite => {
                        let message = format!(
                            "{} sent a non-finite result for a {}",
                            spec.server(chunk),
                            self.spec.kind.op_name()
                        );
                        self.end_chunk(now, chunk, Err(spec.codec(chunk, message)));
                    }
                    Outcome::Abort(message) => {
                        self.end_chunk(now, chunk, Err(spec.aborted(chunk, message)))
                    }
                }
            }
            Event::Decoded { chunk, result } => {
                let (pulled, doing) = match self.chunks.get(chunk) {
                    Some(Chunk::Decoding) => (Pulled::Sum, "decoding the result from"),
                    Some(Chunk::Filling) => (Pulled::NonFinite, "filling the chunk with NaN"),
                    _ => return,
                };
                let result = result.map(|()| pulled).map_err(|e| {
                    let message = match pulled {
                        Pulled::Sum => format!("{doing} {}: {e}", spec.server(chunk)),
                        Pulled::NonFinite => format!("{doing}: {e}"),
                    };
                    spec.codec(chunk, message)
                });
                self.end_chunk(now, chunk, result);
            }
            Event::Done { chunk, result } => {
                let open = matches!(
                    self.chunks.get(chunk),
                    Some(Chunk::Delegated | Chunk::Pushed { .. })
                );
                if open {
                    self.end_chunk(now, chunk, result);
                }
            }
        }
    }

    /// Chunk `index`'s push from what its encoding gave.
    fn push(&mut self, chunk: usize, encoded: Option<Result<Encoded, DataError>>) -> Action {
        let (header, payload, failed) = push_frame(&self.spec, chunk, encoded);
        self.chunks[chunk] = Chunk::Pushed { failed };
        Action::Push {
            chunk,
            header,
            payload,
        }
    }

    fn end_chunk(&mut self, now: Instant, chunk: usize, result: Result<Pulled, WorkerError>) {
        self.chunks[chunk] = Chunk::Done;
        self.open -= 1;
        match result {
            Ok(Pulled::Sum) => {}
            Ok(Pulled::NonFinite) => self.non_finite = true,
            Err(e) if e.is_fatal() => return self.finish(Err(e)),
            Err(e) => {
                tracing::debug!("worker {}: {e}", self.spec.rank);
                self.first_error.get_or_insert(e);
            }
        }
        if self.open > 0 {
            return;
        }
        match self.first_error.take() {
            // When a node is lost, servers abort their open rounds (naming the node) at about
            // the moment the scheduler's news of it reaches this worker, and the abort may win
            // the race: it waits a moment for the job's loss, so that a round pending when a
            // node is lost fails naming it like every later call. A genuine abort (a bad push)
            // is reported that much later.
            Some(e @ WorkerError::Aborted { .. }) if !self.spec.grace.is_zero() => {
                self.first_error = Some(e);
                self.deadline = Some(now + self.spec.grace);
            }
            Some(e) => self.finish(Err(e)),
            None => self.finish(Ok(())),
        }
    }

    fn finish(&mut self, result: Result<(), WorkerError>) {
        self.finished = true;
        self.actions.clear();
        let non_finite = self.non_finite && self.open == 0;
        self.actions
            .push_back(Action::Finish(Finished { result, non_finite }));
    }
}
