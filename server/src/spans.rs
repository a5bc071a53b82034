//! The server's spans in the timeline ([`pushpull_net::timeline`], `[trace] dir`): per key and
//! round one track (`cat` `key`) with `receive` (the round's first push arriving to its
//! last), `sum (host H)` (decoding or adding host H's push) and `encode` (the sum). The
//! result frames' own spans (`cat` `frame`, named `result`, queued to acknowledged, per
//! worker) are the round's send. Off, each site costs one relaxed load.

use std::sync::Arc;

use pushpull_net::timeline::{self, Args, Ph};

use crate::rounds::{Action, KeyInfo, Observer, Phase};

const CAT: &str = "key";

/// The track of `key`'s `round` on server `server`.
fn key_id(server: u32, key: u64, round: u64) -> u64 {
    timeline::id(&[0x5e4, u64::from(server), key, round])
}

fn args(server: u32, tensor: &Arc<str>, chunk: u32, key: u64, round: u64) -> Args {
    Args {
        tensor: Some(tensor.clone()),
        chunk: Some(chunk),
        key: Some(key),
        round: Some(round),
        server: Some(server),
        ..Args::default()
    }
}

/// The observer that records a key's `sum` and `encode` spans (see
/// [`crate::rounds::KeyRounds::with_observer`]).
pub(crate) fn observer(server: u32, info: &KeyInfo) -> Observer {
    let tensor: Arc<str> = info.tensor.as_str().into();
    let (chunk, key) = (info.chunk, info.key);
    Box::new(move |round, phase, start| {
        if !timeline::traced(round) {
            return;
        }
        let name = match phase {
            Phase::Add { host } => format!("sum (host {host})"),
            Phase::Encode => "encode".to_string(),
        };
        let id = key_id(server, key, round);
        let ts = timeline::now();
        if start {
            let mut a = args(server, &tensor, chunk, key, round);
            if let Phase::Add { host } = phase {
                a.host = Some(host);
            }
            timeline::record(Ph::Begin, ts, CAT, name, id, Some(a));
        } else {
            timeline::record(Ph::End, ts, CAT, name, id, None);
        }
    })
}

/// A push for `round` of the key `info` names, which arrived at `arrived`: begins the round's
/// `receive` if it opened the round (`was_open`: a round of `was_current` was open before it)
/// and ends it if `actions` complete the round.
pub(crate) fn receive(
    server: u32,
    info: &KeyInfo,
    round: u64,
    arrived: u64,
    was: (bool, u64),
    actions: &[Action],
) {
    if !timeline::traced(round) {
        return;
    }
    let id = key_id(server, info.key, round);
    let opened = !(was.0 && was.1 == round);
    let completed = actions.iter().any(|a| match a {
        Action::SendResult { round: r, .. }
        | Action::SendEach { round: r, .. }
        | Action::SendNonFinite { round: r, .. } => *r == round,
        Action::SendAbort { .. } => false,
    });
    if opened && (completed || actions.is_empty()) {
        let tensor: Arc<str> = info.tensor.as_str().into();
        let a = args(server, &tensor, info.chunk, info.key, round);
        timeline::record(Ph::Begin, arrived, CAT, "receive", id, Some(a));
    }
    if completed {
        timeline::record(Ph::End, arrived, CAT, "receive", id, None);
    }
}
