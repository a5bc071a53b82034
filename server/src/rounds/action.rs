//! [`Action`]: what a key's state machine asks its shell to send; [`Phase`] and [`Observer`]:
//! what it tells the shell's timeline.

use bytes::Bytes;

/// Something the shell must do on the key's behalf: send a frame to each of `ranks`. Frames
/// carry the key of the [`KeyRounds`](super::KeyRounds) that produced the action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send a `Result` frame for `round` with this payload to each of `ranks` (the same bytes
    /// to everyone).
    SendResult {
        /// The completed round.
        round: u64,
        /// The key's owner ranks ([`KeyInfo::owner_ranks`](super::KeyInfo::owner_ranks): every worker rank
        /// `0..num_workers` when `local_size` is 1).
        ranks: Vec<u32>,
        /// The encoded sum (or the broadcast root's payload).
        payload: Bytes,
    },
    /// Send a `Result` frame for `round` to each rank with its own payload: a gossip round's
    /// relay, each worker's neighbours' pushes concatenated in ascending rank order.
    SendEach {
        /// The completed round.
        round: u64,
        /// `(rank, payload)` for every worker, ascending.
        results: Vec<(u32, Bytes)>,
    },
    /// Send an empty `Result` frame for `round` flagged non-finite to each of `ranks`: a push
    /// or the sum was not finite (see the module docs).
    SendNonFinite {
        /// The completed round.
        round: u64,
        /// The key's owner ranks, as for [`Action::SendResult`].
        ranks: Vec<u32>,
    },
    /// Send an `Abort` frame for `round` whose payload is `message` (UTF-8) to each of `ranks`.
    SendAbort {
        /// The aborted round.
        round: u64,
        /// The ranks to tell: every owner rank ([`KeyInfo::owner_ranks`](super::KeyInfo::owner_ranks)) when a round is
        /// aborted (with a rejected push's sender if it is not one of them), the sender alone
        /// when a push is answered for an already aborted round.
        ranks: Vec<u32>,
        /// Names the tensor, chunk index, key, round, the offending rank or lost node, and what
        /// was wrong.
        message: String,
    },
}

/// A phase of a key's round, for the shell's timeline ([`KeyRounds::with_observer`](super::KeyRounds::with_observer)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Decoding host `host`'s push into the sum (host 0's) or adding it (the others').
    Add {
        /// The host (participant) whose push it is.
        host: u32,
    },
    /// Encoding the round's sum.
    Encode,
}

/// Told of each [`Phase`] of a round: the round, the phase, and `true` at its start, `false`
/// at its end. The shell reads the clock; the state machine only says when.
pub type Observer = Box<dyn FnMut(u64, Phase, bool) + Send>;
