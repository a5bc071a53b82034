//! The server's spans in the timeline ([`pushpull_net::timeline`], `[trace] dir`): per key and
//! round one track (`cat` `key`) with `receive` (the round's first push taken up to its last),
//! `sum (host H)` (decoding or adding host H's push) and `encode` (the sum). The
//! result frames' own spans (`cat` `frame`, named `result`, queued to acknowledged, per
//! worker) are the round's send. Off, each site costs one relaxed load.

use pushpull_net::timeline::{self, Args, Label, Name, Ph};

use crate::rounds::{Action, KeyInfo, Observer, Phase};

const CAT: &str = "key";

/// The track of `key`'s `round` on server `server`.
fn key_id(server: u32, key: u64, round: u64) -> u64 {
    timeline::id(&[0x5e4, u64::from(server), key, round])
}

fn args(server: u32, tensor: Name, chunk: u32, key: u64, round: u64) -> Args {
    Args {
        tensor: Some(tensor),
        chunk: Some(chunk),
        key: Some(key),
        round: Some(round),
        server: Some(server),
        ..Args::default()
    }
}

/// The name of a `sum` span: `sum (host H)`, a literal for the first hosts.
fn sum_name(host: u32) -> Label {
    const NAMES: [&str; 8] = [
        "sum (host 0)",
        "sum (host 1)",
        "sum (host 2)",
        "sum (host 3)",
        "sum (host 4)",
        "sum (host 5)",
        "sum (host 6)",
        "sum (host 7)",
    ];
    match NAMES.get(host as usize) {
        Some(n) => Label::Static(n),
        None => format!("sum (host {host})").into(),
    }
}

/// The observer that records a key's `sum` and `encode` spans (see
/// [`crate::rounds::KeyRounds::with_observer`]): each recorded whole at its end.
pub(crate) fn observer(server: u32, info: &KeyInfo) -> Observer {
    let tensor = Name::new(&info.tensor);
    let (chunk, key) = (info.chunk, info.key);
    let mut began = 0;
    Box::new(move |round, phase, start| {
        if !timeline::traced(round) {
            return;
        }
        let ts = timeline::now();
        if start {
            began = ts;
            return;
        }
        let mut a = args(server, tensor, chunk, key, round);
        let name = match phase {
            Phase::Add { host } => {
                a.host = Some(host);
                sum_name(host)
            }
            Phase::Encode => Label::Static("encode"),
        };
        timeline::span(began, ts, CAT, name, key_id(server, key, round), a);
    })
}

/// A push for `round` of the key `info` names, taken up at `taken` (under the key's lock, so a
/// round's pushes are taken up in time order): begins the round's `receive` if it opened the
/// round (`was`: whether a round was open before it, and which) and ends it if `actions`
/// complete the round.
pub(crate) fn receive(
    server: u32,
    info: &KeyInfo,
    round: u64,
    taken: u64,
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
        let a = args(server, Name::new(&info.tensor), info.chunk, info.key, round);
        timeline::record(Ph::Begin, taken, CAT, "receive", id, Some(a));
    }
    if completed {
        timeline::record(Ph::End, taken, CAT, "receive", id, None);
    }
}
