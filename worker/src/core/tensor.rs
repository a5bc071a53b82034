//! [`TensorRounds`]: a tensor's sequence of rounds on this worker, without I/O.

use super::RoundKind;

/// A tensor's rounds on this worker: the next round's number, its last push_pull round, a
/// discarded one whose undoing the next push_pull round carries to the servers, and the
/// checkpoint the last push_pull round came from. It lives under the tensor's round lock
/// (holding the lock is holding the tensor: calls on one tensor are serialised, each call is
/// one round).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct TensorRounds {
    next: u64,
    /// The last push_pull round started: what a discard discards.
    last_sum: Option<u64>,
    /// The checkpoint (its path) this tensor's compressor state was restored from, while
    /// `last_sum` is a round of the job that saved it: the state before that round is not
    /// here, so it cannot be discarded unless it was before the checkpoint was saved.
    saved_in: Option<String>,
    /// A discarded round (always `last_sum`), undone when the next push_pull round begins or
    /// by a checkpoint before it; that round's pushes ask the servers to undo it too (an undo
    /// is taken once: the second does nothing).
    discarded: Option<u64>,
}

/// What a checkpoint keeps of a tensor's rounds ([`TensorRounds::saved`],
/// [`TensorRounds::restore`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SavedRounds {
    pub(crate) next: u64,
    pub(crate) last_sum: Option<u64>,
    pub(crate) discarded: Option<u64>,
}

/// Why a discard was refused: the last push_pull round ran in the job that saved the
/// checkpoint at `path`, which keeps no state before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Undiscardable {
    pub(crate) round: u64,
    pub(crate) path: String,
}

impl TensorRounds {
    /// The next round's number.
    pub(crate) fn next(&self) -> u64 {
        self.next
    }

    /// No round has run (or been restored) here.
    pub(crate) fn fresh(&self) -> bool {
        self.next == 0 && self.last_sum.is_none()
    }

    /// The discarded round awaiting its undo, if any.
    pub(crate) fn discarded(&self) -> Option<u64> {
        self.discarded
    }

    /// The round a round of `kind` undoes before it starts, if any (a sum's: the discarded
    /// round; it stays discarded until a round carries the news to the servers, so undoing
    /// it again, should this round not run, does nothing).
    pub(crate) fn undo_before(&self, kind: RoundKind) -> Option<u64> {
        match kind {
            RoundKind::Sum { .. } => self.discarded,
            RoundKind::Broadcast { .. } | RoundKind::Gossip => None,
        }
    }

    /// Starts the next round, of `kind`: returns its number. A sum becomes the last sum round,
    /// and its pushes carry the discard.
    pub(crate) fn start(&mut self, kind: RoundKind) -> u64 {
        let round = self.next;
        self.next += 1;
        if let RoundKind::Sum { .. } = kind {
            self.last_sum = Some(round);
            self.saved_in = None;
            self.discarded = None;
        }
        round
    }

    /// Discards the last push_pull round (nothing, if none ran); refused for a round the
    /// checkpoint this tensor was restored from ran and did not discard.
    pub(crate) fn discard(&mut self) -> Result<(), Undiscardable> {
        if let (Some(path), Some(round)) = (&self.saved_in, self.last_sum) {
            if self.discarded != Some(round) {
                return Err(Undiscardable {
                    round,
                    path: path.clone(),
                });
            }
        }
        self.discarded = self.last_sum;
        Ok(())
    }

    /// What a checkpoint keeps.
    pub(crate) fn saved(&self) -> SavedRounds {
        SavedRounds {
            next: self.next,
            last_sum: self.last_sum,
            discarded: self.discarded,
        }
    }

    /// Restores what a checkpoint at `path` kept: the next round, and its last sum round and
    /// discard, which the next push asks the servers to undo, as the saving job's would (the
    /// state was saved undone). `stateful`: the checkpoint holds compressor state for the
    /// tensor; without it, discarding the saved round would change nothing, so it may be.
    pub(crate) fn restore(&mut self, saved: SavedRounds, stateful: bool, path: &str) {
        *self = TensorRounds {
            next: saved.next,
            last_sum: saved.last_sum,
            saved_in: saved
                .last_sum
                .filter(|_| stateful)
                .map(|_| path.to_string()),
            discarded: saved.discarded,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUM: RoundKind = RoundKind::Sum { average: false };
    const BROADCAST: RoundKind = RoundKind::Broadcast { root: 0 };

    #[test]
    fn rounds_count_every_kind_and_a_sum_is_the_last_sum() {
        let mut t = TensorRounds::default();
        assert!(t.fresh());
        assert_eq!(t.start(BROADCAST), 0);
        assert!(!t.fresh());
        assert_eq!(t.start(SUM), 1);
        assert_eq!(t.start(BROADCAST), 2);
        assert_eq!(t.next(), 3);
        // The broadcast left the last sum round as it was.
        t.discard().unwrap();
        assert_eq!(t.discarded(), Some(1));
        assert_eq!(t.undo_before(SUM), Some(1));
        assert_eq!(
            t.undo_before(BROADCAST),
            None,
            "a broadcast touches no state"
        );
        assert_eq!(t.undo_before(RoundKind::Gossip), None);
        // Undoing before a round that then does not run changes nothing: still discarded.
        assert_eq!(t.undo_before(SUM), Some(1));
        assert_eq!(t.start(SUM), 3);
        assert_eq!(
            t.discarded(),
            None,
            "the round's pushes carried the discard"
        );
    }

    #[test]
    fn a_discard_before_any_sum_discards_nothing() {
        let mut t = TensorRounds::default();
        t.discard().unwrap();
        assert_eq!(t.discarded(), None);
        t.start(BROADCAST);
        t.discard().unwrap();
        assert_eq!(t.undo_before(SUM), None);
    }

    #[test]
    fn a_restored_round_is_discardable_only_if_the_saving_job_discarded_it() {
        let saved = SavedRounds {
            next: 8,
            last_sum: Some(7),
            discarded: None,
        };
        let mut t = TensorRounds::default();
        t.restore(saved, true, "ck.bin");
        assert!(!t.fresh());
        assert_eq!(
            t.discard(),
            Err(Undiscardable {
                round: 7,
                path: "ck.bin".into()
            })
        );
        // Without compressor state there is nothing to keep: the discard is allowed.
        t.restore(saved, false, "ck.bin");
        t.discard().unwrap();
        assert_eq!(t.discarded(), Some(7));
        // Discarded when saved: discarding again is allowed (and changes nothing).
        let saved = SavedRounds {
            discarded: Some(7),
            ..saved
        };
        t.restore(saved, true, "ck.bin");
        t.discard().unwrap();
        assert_eq!(t.saved(), saved);
        // A new sum round is this job's own: discardable.
        assert_eq!(t.start(SUM), 8);
        t.discard().unwrap();
        assert_eq!(t.discarded(), Some(8));
    }
}
