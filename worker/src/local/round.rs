//! One chunk's round in a local group (the order is in the module docs of [`super`]).

use std::sync::Mutex;

use pushpull_proto::placement::chunk_owner;

use super::{Channel, Local, NoteKind, Place};
use crate::core::{push_frame, Pulled, RoundKind};
use crate::data::{decode_host, encode_host, ChunkAt, RoundData};
use crate::dispatch::Outcome;
use crate::error::WorkerError;
use crate::push::{codec_phase, count_pulled, decompress_phase, send_push, QueuedMark, RoundCtx};
use crate::tensor::TensorInner;

/// Chunk `index` of `tensor`'s `round` on this member of `local` (see [`super`]'s docs). Every
/// member sends its notes whatever happens to the round (an abort, a codec error), so that
/// no other member waits for them; only a lost member or node ends a round without them.
pub(crate) async fn chunk_round<R: RoundData>(
    ctx: &RoundCtx,
    local: &Local,
    place: Place,
    tensor: &TensorInner,
    (index, round, kind): (usize, u64, RoundKind),
    data: &Mutex<R>,
    mark: QueuedMark<'_>,
) -> Result<Pulled, WorkerError> {
    let (l, g) = (local.local_rank, local.local_size);
    let key = tensor.placement.chunks[index].key;
    let owner = chunk_owner(key, g);
    let range = tensor.ranges[index].clone();
    let lock = || data.lock().unwrap_or_else(|p| p.into_inner());
    let spec = ctx.spec(tensor, round, kind, true);
    let at = ctx.at(tensor, index, round, kind);
    // The chunk's phases in the timeline (each span ends when dropped, on every path).
    let span = |phase| crate::spans::chunk(phase, ctx.rank, tensor, index, round);

    // 1. The turn: member 0 once everyone copied the last round out, the others after the
    // member before them.
    let turn = span("turn");
    if l == 0 {
        if round
            > tensor
                .first_round
                .load(std::sync::atomic::Ordering::Relaxed)
        {
            local.wait(Channel::Copied, key, round - 1, g - 1).await?;
        }
    } else {
        local.wait(Channel::Turn, key, round, 1).await?;
    }
    drop(turn);

    // 2. This member's part of the host sum.
    let added = {
        let _add = span("add");
        // SAFETY: this member holds the chunk's turn until its next note.
        let acc = unsafe { local.acc(place, range.clone()) };
        let added = lock().contribute(&at, l == 0, place.intra, acc);
        if added.is_err() {
            // This member's part is missing: the host sum must not look whole. NaN makes the
            // round non-finite for every worker; this member reports why.
            acc.fill(f32::NAN);
        }
        added
    };
    let next = if l + 1 < g {
        Some((l + 1, NoteKind::Added))
    } else {
        (owner != l).then_some((owner, NoteKind::Summed))
    };
    if let Some((to, note)) = next {
        local.send(to, note, key, round)?;
    }

    // 3. The owner pushes the host's sum and shares the outcome; the others wait for it.
    let mut failure = added.err().map(|e| spec.codec(index, e.to_string()));
    let outcome = if l == owner {
        if owner + 1 != g {
            let _others = span("others add");
            local.wait(Channel::Turn, key, round, 1).await?;
        }
        let (note, error) = owner_round(ctx, local, &at, place, mark).await?;
        for to in (0..g).filter(|&to| to != l) {
            local.send(to, note, key, round)?;
        }
        if let Some(e) = error {
            failure.get_or_insert(e);
        }
        note
    } else {
        drop(mark);
        let _outcome = span("outcome");
        local.wait(Channel::Outcome, key, round, 1).await?.kind
    };

    // 4. Every member copies the result out and tells member 0.
    let pulled = match outcome {
        NoteKind::Result | NoteKind::NonFinite => {
            let _copy = span("copy");
            // SAFETY: the owner's note hands every member the accumulator to read until they
            // all said Copied.
            let acc = unsafe { local.acc(place, range.clone()) };
            lock()
                .take_result(&at, acc)
                .map_err(|e| spec.codec(index, e.to_string()))
                .map(|()| match outcome {
                    NoteKind::NonFinite => Pulled::NonFinite,
                    _ => Pulled::Sum,
                })
        }
        _ => Err(failure.take().unwrap_or_else(|| {
            let message = format!(
                "the round was aborted (local rank {owner}, which pushes this chunk for the \
                 host, has the server's message)"
            );
            spec.aborted(index, message)
        })),
    };
    if l != 0 {
        local.send(0, NoteKind::Copied, key, round)?;
    }
    match failure {
        Some(e) => Err(e),
        None => pulled,
    }
}

/// The owner's part: encode the host sum, push it, decode the outcome into the accumulator.
/// Returns the note for the other members and this member's error, if any. With one host and
/// no servers the host sum is the result.
async fn owner_round(
    ctx: &RoundCtx,
    local: &Local,
    at: &ChunkAt<'_>,
    place: Place,
    mark: QueuedMark<'_>,
) -> Result<(NoteKind, Option<WorkerError>), WorkerError> {
    let (tensor, index, round, kind) = (at.tensor, at.index, at.round, at.kind);
    if !local.uses_servers {
        drop(mark);
        return Ok((NoteKind::Result, None));
    }
    let range = tensor.ranges[index].clone();
    let host = ctx.rank / local.local_size;
    let encodes = match kind {
        RoundKind::Sum { .. } | RoundKind::Gossip => true,
        RoundKind::Broadcast { root } => root / local.local_size == host,
    };
    let encoded = encodes.then(|| {
        let counter = matches!(kind, RoundKind::Sum { .. }).then_some(&tensor.compress_nanos);
        codec_phase(ctx.rank, tensor, index, round, "compress", counter, || {
            // SAFETY: the owner holds the turn from the host sum's last note to its own.
            let acc = unsafe { local.acc(place, range.clone()) };
            encode_host(at, acc, &ctx.pool)
        })
    });
    let spec = ctx.spec(tensor, round, kind, true);
    let (header, payload, failed) = push_frame(&spec, index, encoded);
    let outcome = match send_push(ctx, tensor, index, header, payload, mark) {
        Ok(awaited) => awaited.await,
        Err(e) => Err(e),
    };
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) if e.is_fatal() => return Err(e),
        Err(e) => return Ok((NoteKind::Aborted, Some(e))),
    };
    count_pulled(tensor, &outcome);
    if let Some(e) = failed {
        // The encoding failed: the server aborted the round for every host.
        return Ok((NoteKind::Aborted, Some(e)));
    }
    // SAFETY: as above, until the note this returns is sent.
    let acc = unsafe { local.acc(place, range) };
    Ok(match outcome {
        Outcome::Result(payload) => {
            // Decoded as a sum (no average): each member averages its own copy.
            let plain = match kind {
                RoundKind::Sum { .. } => RoundKind::Sum { average: false },
                broadcast => broadcast,
            };
            let at = ctx.at(tensor, index, round, plain);
            let decoded = decompress_phase(ctx.rank, tensor, index, round, || {
                decode_host(&at, acc, &payload)
            });
            match decoded {
                Ok(()) => (NoteKind::Result, None),
                Err(e) => {
                    let message = format!("decoding the result: {e}");
                    acc.fill(f32::NAN);
                    (NoteKind::Aborted, Some(spec.codec(index, message)))
                }
            }
        }
        Outcome::NonFinite if matches!(kind, RoundKind::Sum { .. }) => {
            tensor.codec(index).undo(round);
            acc.fill(f32::NAN);
            (NoteKind::NonFinite, None)
        }
        Outcome::NonFinite => {
            let message = "a non-finite result for a broadcast".to_string();
            (NoteKind::Aborted, Some(spec.codec(index, message)))
        }
        Outcome::Abort(message) => (NoteKind::Aborted, Some(spec.aborted(index, message))),
    })
}
