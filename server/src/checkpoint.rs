//! The state frames of a checkpoint on the data plane: a worker's `StateGet` is answered with
//! the key's [`KeyState`] in a `State` frame (the key's last sum round undone first when the
//! `StateGet` is flagged undo-previous: a checkpoint after a discarded round), its `StatePut`
//! restores the key's state before its first round and is answered with an empty `State`
//! frame; a refusal is an `Abort` at round [`STATE_ROUND`] naming the key and why. The rules are
//! [`KeyRounds::save_state`](crate::rounds::KeyRounds::save_state) and
//! [`KeyRounds::load_state`](crate::rounds::KeyRounds::load_state); servers keep no file:
//! a key's state lands in the checkpoint of the worker that asked (rank 0), next to the
//! training code's own checkpoint.

use std::sync::Arc;

use bytes::Bytes;
use pushpull_proto::checkpoint::{KeyState, STATE_ROUND};
use pushpull_proto::protocol::{FrameFlags, FrameHeader, FrameKind};
use tracing::{debug, warn};

use crate::shared::{Shared, WorkerConn, ABORT_PRIORITY};

/// Answers one state frame (`StateGet` or `StatePut`) from worker `rank`; `bad` is why its
/// payload could not be read, if it could not.
pub(crate) fn handle_state_frame(
    shared: &Arc<Shared>,
    w: &WorkerConn,
    rank: u32,
    header: &FrameHeader,
    payload: &[u8],
    bad: Option<String>,
) {
    let key = header.key;
    let answer = answer(shared, header, payload, bad);
    let frame = match answer {
        Ok(state) => (
            (FrameKind::State, FrameFlags::default()),
            key,
            STATE_ROUND,
            state,
        ),
        Err(why) => {
            warn!(key, "state frame from {} refused: {why}", w.peer.name);
            let abort = (FrameKind::Abort, FrameFlags::default());
            (abort, key, STATE_ROUND, Bytes::from(why))
        }
    };
    debug!(key, kind = ?header.kind, "state frame from {} answered", w.peer.name);
    w.send(rank, frame, ABORT_PRIORITY);
}

fn answer(
    shared: &Arc<Shared>,
    header: &FrameHeader,
    payload: &[u8],
    bad: Option<String>,
) -> Result<Bytes, String> {
    let (key, kind) = (header.key, header.kind);
    let server = shared.id_str();
    if let Some(why) = bad {
        return Err(format!(
            "{server}: {kind:?} frame for key {key:#018x}: {why}"
        ));
    }
    if header.round != STATE_ROUND {
        return Err(format!(
            "{server}: {kind:?} frame for key {key:#018x} at round {}, but state frames carry round {STATE_ROUND}",
            header.round
        ));
    }
    let Some(k) = shared.keys.get(&key).map(|e| e.value().clone()) else {
        return Err(format!(
            "{server}: {kind:?} frame for key {key:#018x}, which this server does not hold (no tensor placed on it has this key)"
        ));
    };
    let mut k = k.lock().unwrap_or_else(|e| e.into_inner());
    match kind {
        FrameKind::StateGet if payload.is_empty() => {
            let state = k.save_state(header.flags.undo_previous)?;
            Ok(Bytes::from(state.encode()))
        }
        FrameKind::StateGet => Err(format!(
            "{server}: StateGet frame for key {key:#018x} carries {} bytes; it must be empty",
            payload.len()
        )),
        _ => {
            let state = KeyState::decode(payload)
                .map_err(|e| format!("{server}: StatePut frame for {}: {e}", k.info()))?;
            k.load_state(&state)?;
            Ok(Bytes::new())
        }
    }
}
