//! The worker's spans in the timeline ([`pushpull_net::timeline`], `[trace] dir`): one per
//! round of a tensor (`cat` `round`, named after the tensor) and, per chunk and round, its
//! phases on one track (`cat` `chunk`): `compress`, `wait` (from queuing the push to the
//! result handed to the chunk), inside it `pull` (the result's stream, accepted to read;
//! recorded by the connection's reader) and `decompress`. In a local group a chunk's track
//! holds, in order, `turn`, `add`, on the owner `others add` (waiting for the rest of the
//! host's sum, unless it is the last member) and the push's phases, on the others `outcome`,
//! then `copy` ([`crate::local::chunk_round`]). A call's device batch has its own track (`cat`
//! `batch`, [`BatchTrack`]): `launch` (the batch found or made and its steps issued, before its
//! rounds begin), `staged` (waiting for its payloads in host staging) and `decode` (by the last
//! of its rounds to end, before the others hear of it). Each is a [`Span`] that ends when
//! dropped, so a span ends on every path; off, each site costs one relaxed load.

use std::time::Instant;

use pushpull_net::timeline::{self, Args, Label, Span};

use crate::core::RoundKind;
use crate::tensor::TensorInner;

/// The track of one round of a tensor on worker `rank`.
fn round_id(rank: u32, tensor: &TensorInner, round: u64) -> u64 {
    timeline::id(&[0x20d, u64::from(rank), tensor.trace_name.number(), round])
}

/// The track of chunk `key`'s phases in `round` on worker `rank`.
pub(crate) fn chunk_id(rank: u32, key: u64, round: u64) -> u64 {
    timeline::id(&[0xc4a, u64::from(rank), key, round])
}

/// The span of `round` of `tensor` (a push_pull or broadcast call), when traced.
pub(crate) fn round(rank: u32, tensor: &TensorInner, round: u64, kind: RoundKind) -> Option<Span> {
    if !timeline::traced(round) {
        return None;
    }
    let name = &tensor.placement.name;
    let args = Args {
        tensor: Some(tensor.trace_name),
        round: Some(round),
        rank: Some(rank),
        ..Args::default()
    };
    let name: Label = match kind {
        RoundKind::Sum { .. } => tensor.trace_name.into(),
        RoundKind::Broadcast { .. } => format!("{name} (broadcast)").into(),
        RoundKind::Gossip => format!("{name} (gossip)").into(),
    };
    Some(Span::begin(
        "round",
        name,
        round_id(rank, tensor, round),
        args,
    ))
}

/// A phase (`compress`, `wait`, `decompress`; in a local group also `turn`, `add`, `others
/// add`, `outcome`, `copy`) of chunk `index` of `tensor` in `round`, when traced.
pub(crate) fn chunk(
    phase: &'static str,
    rank: u32,
    tensor: &TensorInner,
    index: usize,
    round: u64,
) -> Option<Span> {
    if !timeline::traced(round) {
        return None;
    }
    chunk_at(phase, rank, tensor, index, round, Instant::now())
}

/// [`chunk`], begun at `at` (a clock read the caller made for its own use).
pub(crate) fn chunk_at(
    phase: &'static str,
    rank: u32,
    tensor: &TensorInner,
    index: usize,
    round: u64,
    at: Instant,
) -> Option<Span> {
    if !timeline::traced(round) {
        return None;
    }
    let key = tensor.placement.chunks[index].key;
    let args = Args {
        tensor: Some(tensor.trace_name),
        chunk: Some(index as u32),
        key: Some(key),
        round: Some(round),
        rank: Some(rank),
        ..Args::default()
    };
    Some(Span::begin_at(
        timeline::stamp(at),
        "chunk",
        phase,
        chunk_id(rank, key, round),
        args,
    ))
}

/// The track of a device batch's round on worker `rank` (the id of [`BatchTrack`]).
fn batch_id(rank: u32, tensor: &TensorInner, round: u64) -> u64 {
    timeline::id(&[0xba7, u64::from(rank), tensor.trace_name.number(), round])
}

/// The track of a device batch's round: named after the first of its tensors whose round is
/// traced, and that round (its tensors may be at different rounds).
pub(crate) struct BatchTrack {
    id: u64,
    args: Args,
}

impl BatchTrack {
    /// The track of a batch of `rounds` (each tensor and its round) on worker `rank`, when
    /// one of them is traced.
    pub(crate) fn of<'a>(
        rank: u32,
        mut rounds: impl Iterator<Item = (&'a TensorInner, u64)>,
    ) -> Option<BatchTrack> {
        if !timeline::on() {
            return None;
        }
        let (tensor, round) = rounds.find(|&(_, round)| timeline::traced(round))?;
        let args = Args {
            tensor: Some(tensor.trace_name),
            round: Some(round),
            rank: Some(rank),
            ..Args::default()
        };
        Some(BatchTrack {
            id: batch_id(rank, tensor, round),
            args,
        })
    }

    /// A phase (`launch`, `staged`, `decode`) of the batch's round.
    pub(crate) fn span(&self, phase: &'static str) -> Span {
        Span::begin("batch", phase, self.id, self.args)
    }
}

/// A result frame of `key` and `round` that reached worker `rank`: its `pull`, from `accepted`
/// (its stream accepted) to now.
pub(crate) fn pull(rank: u32, key: u64, round: u64, accepted: u64, bytes: u64) {
    if !timeline::traced(round) {
        return;
    }
    let id = chunk_id(rank, key, round);
    let args = Args {
        key: Some(key),
        round: Some(round),
        rank: Some(rank),
        bytes: Some(bytes),
        ..Args::default()
    };
    timeline::span(accepted, timeline::now(), "chunk", "pull", id, args);
}
