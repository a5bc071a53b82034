//! One round of one tensor: the async shell of [`RoundCore`], the round's state machine.
//!
//! The shell carries out the core's actions and feeds it what they gave. Chunks run
//! concurrently in the round's task, sharing the caller's buffer (a [`RoundData`]: host
//! memory or a device's) behind a mutex that is held only to encode or decode one chunk, never
//! across an await. A chunk is encoded (into a pooled buffer; a device's chunks were all
//! launched with the call's other rounds, [`RoundData::launch`], and each is taken from the
//! batch's staging in turn) and queued on the worker's
//! [`FrameSender`](pushpull_net::sender::FrameSender) before the next one is encoded; the
//! sender sends in priority order within the worker's byte window, and frees a frame once its
//! server has received it, whatever the round is doing, so rounds of different tensors issued
//! in any order on different workers can never wait on each other. The push and its awaited
//! outcome are [`crate::push`]'s; in a local group each chunk's round is
//! [`crate::local::chunk_round`], which uses them too. What a round ends with (an abort, a
//! codec error, the job's loss) is the core's to decide.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use pushpull_net::sender::SendHold;

use crate::core::{Action, Encoded, Event, RoundCore, RoundKind};
use crate::data::{ChunkAt, RoundData};
use crate::error::{DataError, WorkerError};
use crate::local::Local;
use crate::push::{
    codec_phase, count_pulled, decompress_phase, send_push, Queued, QueuedMark, RoundCtx,
};
use crate::tensor::TensorInner;

/// Runs `round` of `tensor` over `data` (already checked to have the tensor's length, and
/// [`RoundData::begin`] called). `local` is this worker's local group, where the cluster has
/// them (`cluster.local_size` > 1): chunks then go through [`crate::local::chunk_round`].
/// `hold` (a group call's) is released once every chunk is queued for sending.
pub(crate) async fn run_round<R: RoundData>(
    ctx: RoundCtx,
    local: Option<&Local>,
    tensor: Arc<TensorInner>,
    round: u64,
    kind: RoundKind,
    data: &Mutex<R>,
    hold: Option<SendHold>,
) -> Result<(), WorkerError> {
    let started = Instant::now();
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
    // A local group's accumulator for the tensor, known once for all its chunks.
    let group = match local {
        Some(local) if !tensor.ranges.is_empty() => Some((local, local.place_of(&tensor).await?)),
        _ => None,
    };
    let queued = Queued::new(tensor.ranges.len(), hold);
    let mut marks: Vec<Option<QueuedMark<'_>>> =
        tensor.ranges.iter().map(|_| Some(queued.mark())).collect();
    let mut core = RoundCore::new(ctx.spec(&tensor, round, kind, group.is_some()));
    let shell = Shell {
        ctx: &ctx,
        tensor: &tensor,
        round,
        kind,
        data,
    };
    let mut waiting: FuturesUnordered<BoxFuture<'_, Event>> = FuturesUnordered::new();
    let mut state = ctx.shared.subscribe();
    let finished = 'round: loop {
        while let Some(action) = core.poll_action() {
            let now = Instant::now();
            match action {
                Action::Encode { chunk } => {
                    let result = shell.encode(chunk);
                    core.handle(now, Event::Encoded { chunk, result });
                }
                Action::Push {
                    chunk,
                    header,
                    payload,
                } => {
                    let mark = marks[chunk].take().expect("each chunk is pushed once");
                    match send_push(&ctx, &tensor, chunk, header, payload, mark) {
                        Ok(awaited) => waiting.push(Box::pin(async move {
                            match awaited.await {
                                Ok(outcome) => {
                                    count_pulled(shell.tensor, &outcome);
                                    Event::Outcome { chunk, outcome }
                                }
                                Err(e) => Event::Done {
                                    chunk,
                                    result: Err(e),
                                },
                            }
                        })),
                        Err(e) => core.handle(
                            now,
                            Event::Done {
                                chunk,
                                result: Err(e),
                            },
                        ),
                    }
                }
                Action::Decode { chunk, payload } => {
                    let result = shell.decode(chunk, &payload);
                    core.handle(Instant::now(), Event::Decoded { chunk, result });
                }
                Action::FillNonFinite { chunk } => {
                    let result = shell.non_finite(chunk);
                    core.handle(now, Event::Decoded { chunk, result });
                }
                Action::Delegate { chunk } => {
                    let (local, place) = group.expect("a delegated round has a local group");
                    let mark = marks[chunk].take().expect("each chunk is delegated once");
                    let (ctx, tensor) = (&ctx, &*tensor);
                    waiting.push(Box::pin(async move {
                        let at = (chunk, round, kind);
                        let result =
                            crate::local::chunk_round(ctx, local, place, tensor, at, data, mark)
                                .await;
                        Event::Done { chunk, result }
                    }));
                }
                Action::Finish(finished) => break 'round finished,
            }
        }
        let deadline = core.poll_timeout();
        let timeout = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            Some(event) = waiting.next(), if !waiting.is_empty() => {
                core.handle(Instant::now(), event);
            }
            // Only an abort's grace waits on the worker's state: every change of it (a round
            // starting or ending anywhere) wakes its waiters, and a chunk in flight hears of
            // the job's loss from the dispatch table anyway.
            lost = state.wait_for(|s| s.fatal.is_some()), if deadline.is_some() => {
                let lost = lost.ok().and_then(|s| s.fatal.clone());
                let lost = lost.unwrap_or_else(|| WorkerError::Internal("the worker's state ended".into()));
                core.handle(Instant::now(), Event::Lost(lost));
            }
            () = timeout => core.handle_timeout(Instant::now()),
        }
    };
    drop(waiting);
    if finished.non_finite {
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
    finished.result
}

/// What the shell's codec actions need: the round and the caller's data.
struct Shell<'a, R> {
    ctx: &'a RoundCtx,
    tensor: &'a TensorInner,
    round: u64,
    kind: RoundKind,
    data: &'a Mutex<R>,
}

impl<R: RoundData> Shell<'_, R> {
    fn lock(&self) -> std::sync::MutexGuard<'_, R> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn at(&self, index: usize) -> ChunkAt<'_> {
        self.ctx.at(self.tensor, index, self.round, self.kind)
    }

    /// Encodes `chunk` of this worker's data, timed as compression for a sum or gossip round.
    fn encode(&self, chunk: usize) -> Result<Encoded, DataError> {
        let (ctx, tensor) = (self.ctx, self.tensor);
        let counter = matches!(self.kind, RoundKind::Sum { .. } | RoundKind::Gossip)
            .then_some(&tensor.compress_nanos);
        codec_phase(
            ctx.rank,
            tensor,
            chunk,
            self.round,
            "compress",
            counter,
            || self.lock().encode(&self.at(chunk), &ctx.pool),
        )
    }

    /// Decodes `chunk`'s result into the caller's data, timed as decompression.
    fn decode(&self, chunk: usize, payload: &[u8]) -> Result<(), DataError> {
        decompress_phase(self.ctx.rank, self.tensor, chunk, self.round, || {
            self.lock().decode(&self.at(chunk), payload)
        })
    }

    /// The chunk's sum was not finite.
    fn non_finite(&self, chunk: usize) -> Result<(), DataError> {
        self.lock().non_finite(&self.at(chunk))
    }
}

pub(crate) fn add_nanos(counter: &std::sync::atomic::AtomicU64, since: std::time::Instant) {
    let n = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
    counter.fetch_add(n, Ordering::Relaxed);
}
