//! A key's state for a checkpoint, between rounds: [`KeyRounds::save_state`] (what a
//! `StateGet` frame asks for) and [`KeyRounds::load_state`] (a restarted job's `StatePut`,
//! before the key's first round). Pure, like the rest of [`KeyRounds`].

use pushpull_proto::checkpoint::KeyState;

use super::KeyRounds;

impl KeyRounds {
    /// The key's next round and its chain's state ([`pushpull_codecs::Compressor::state`]).
    /// With `undo_previous` (the workers discarded the key's last sum round and have not
    /// pushed since: a `StateGet` so flagged), that round's change of the state is undone
    /// first, as the next round's pushes would have it undone when it opens (which then does
    /// nothing more: an undo is taken once).
    ///
    /// # Errors
    /// A message naming the key when a round is open (ranks have pushed to it: a checkpoint is
    /// taken between rounds, at a barrier) or the key has failed; nothing is undone then.
    pub fn save_state(&mut self, undo_previous: bool) -> Result<KeyState, String> {
        self.check_quiet("save")?;
        if let Some(previous) = self.last_sum.filter(|_| undo_previous) {
            self.codec.undo(previous);
        }
        Ok(KeyState {
            round: self.current,
            chain: self.codec.state(),
        })
    }

    /// Restores a state [`KeyRounds::save_state`] gave, on a key that has run no round yet:
    /// the key continues at `state.round` with the chain's saved state. What a round could
    /// undo is gone: a first push of the key that asks to undo the round before it (a round
    /// discarded before the checkpoint, whose state was saved undone) undoes nothing here.
    ///
    /// # Errors
    /// A message naming the key and what is wrong, with nothing changed: the key has run or
    /// opened a round, has failed, or the chain refused the state (another shape or length).
    pub fn load_state(&mut self, state: &KeyState) -> Result<(), String> {
        self.check_quiet("restore")?;
        if self.current != 0 || self.last_sum.is_some() || !self.aborted.is_empty() {
            return Err(format!(
                "{}: cannot restore a saved state: the key has already run rounds here (it is at round {}); restore before the first round",
                self.info, self.current
            ));
        }
        self.codec
            .set_state(&state.chain)
            .map_err(|e| format!("{}: the saved state does not fit its chain: {e}", self.info))?;
        self.current = state.round;
        Ok(())
    }

    fn check_quiet(&self, what: &str) -> Result<(), String> {
        if let Some(why) = &self.failed {
            return Err(format!("{}: cannot {what} its state: {why}", self.info));
        }
        if self.open.is_some() {
            return Err(format!(
                "{}: cannot {what} its state while round {} is open (ranks {:?} pushed to it); checkpoints are taken between rounds",
                self.info,
                self.current,
                self.open_ranks()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rounds::{Action, KeyInfo};
    use bytes::Bytes;
    use pushpull_codecs::{build_compressor, NodeIdentity};
    use pushpull_proto::protocol::{FrameFlags, ReduceOp};

    fn key(num_workers: u32) -> KeyRounds {
        let params = [("compressor", "onebit"), ("ef", "vanilla")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let n = 16;
        let codec = build_compressor(&params, n, &NodeIdentity::server(7, 3, 0)).unwrap();
        let info = KeyInfo {
            tensor: "w".into(),
            chunk: 0,
            key: 3,
            len: n,
            num_workers,
            local_size: 1,
            priority: 0,
        };
        KeyRounds::new(info, codec)
    }

    fn push(k: &mut KeyRounds, rank: u32, round: u64, x: &[f32]) -> Vec<Action> {
        push_flagged(k, rank, round, x, FrameFlags::default())
    }

    fn push_flagged(
        k: &mut KeyRounds,
        rank: u32,
        round: u64,
        x: &[f32],
        flags: FrameFlags,
    ) -> Vec<Action> {
        let mut payload = Vec::new();
        let params = [("compressor", "onebit")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut c = build_compressor(&params, x.len(), &NodeIdentity::worker(7, 3, rank)).unwrap();
        c.compress(x, &pushpull_codecs::RoundCtx::new(round), &mut payload)
            .unwrap();
        k.push_flagged(rank, round, ReduceOp::Sum, 0, flags, Bytes::from(payload))
    }

    fn results(actions: &[Action]) -> Vec<Bytes> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::SendResult { payload, .. } => Some(payload.clone()),
                _ => None,
            })
            .collect()
    }

    /// Six gradients of 16 elements, none alike.
    fn inputs() -> Vec<Vec<f32>> {
        (0..6)
            .map(|i| {
                (0..16)
                    .map(|j| ((i * 16 + j) as f32 * 0.37).sin())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_restored_key_continues_as_the_one_saved() {
        let mut a = key(2);
        let x = inputs();
        for r in 0..3u64 {
            push(&mut a, 0, r, &x[r as usize]);
            push(&mut a, 1, r, &x[r as usize + 1]);
        }
        let saved = KeyState::decode(&a.save_state(false).unwrap().encode()).unwrap();
        assert_eq!(saved.round, 3);
        let mut b = key(2);
        b.load_state(&saved).unwrap();
        assert_eq!(b.current_round(), 3);
        for r in 3..5u64 {
            let mut ra = push(&mut a, 0, r, &x[r as usize]);
            ra.extend(push(&mut a, 1, r, &x[r as usize + 1]));
            let mut rb = push(&mut b, 0, r, &x[r as usize]);
            rb.extend(push(&mut b, 1, r, &x[r as usize + 1]));
            assert_eq!(results(&ra), results(&rb), "round {r}");
            assert_eq!(results(&ra).len(), 1);
        }
    }

    /// A checkpoint after a discarded round (a `StateGet` flagged undo previous) saves the
    /// state with that round undone; the job that saved it and the one restored from it then
    /// run the next round (its pushes flagged undo previous) as a job that never saved does.
    #[test]
    fn a_state_saved_after_a_discarded_round_has_it_undone() {
        let x = inputs();
        let first_rounds = |k: &mut KeyRounds| {
            for r in 0..3u64 {
                push(k, 0, r, &x[r as usize]);
                push(k, 1, r, &x[r as usize + 1]);
            }
        };
        let undo = FrameFlags {
            undo_previous: true,
            ..FrameFlags::default()
        };
        let round_3 = |k: &mut KeyRounds, flags: FrameFlags| {
            let mut out = push_flagged(k, 0, 3, &x[3], flags);
            out.extend(push_flagged(k, 1, 3, &x[4], flags));
            results(&out)
        };
        // Never saved: round 3 undoes round 2 when it opens; and without the discard.
        let (mut never, mut kept) = (key(2), key(2));
        first_rounds(&mut never);
        first_rounds(&mut kept);
        let expected = round_3(&mut never, undo);
        assert_eq!(expected.len(), 1);
        assert_ne!(expected, round_3(&mut kept, FrameFlags::default()));

        let mut saving = key(2);
        first_rounds(&mut saving);
        let before = saving.save_state(false).unwrap();
        let saved = saving.save_state(true).unwrap();
        assert_eq!(saved.round, 3);
        assert_ne!(saved.chain, before.chain, "round 2's change undone");
        assert_eq!(saving.save_state(true).unwrap(), saved, "undone once");
        let mut restored = key(2);
        restored.load_state(&saved).unwrap();
        assert_eq!(round_3(&mut saving, undo), expected, "the job that saved");
        assert_eq!(round_3(&mut restored, undo), expected, "the restored job");
    }

    #[test]
    fn open_rounds_used_keys_and_other_shapes_are_refused() {
        let mut a = key(2);
        push(&mut a, 0, 0, &[1.0; 16]);
        let e = a.save_state(true).unwrap_err();
        assert!(e.contains("round 0 is open") && e.contains("[0]"), "{e}");
        push(&mut a, 1, 0, &[1.0; 16]);
        let saved = a.save_state(false).unwrap();
        let e = a.load_state(&saved).unwrap_err();
        assert!(e.contains("already run rounds"), "{e}");
        let mut b = key(2);
        let mut wrong = saved.clone();
        wrong.chain.residual = Some(vec![0.0; 15]);
        let e = b.load_state(&wrong).unwrap_err();
        assert!(e.contains("residual") && e.contains("16"), "{e}");
        assert_eq!(b.current_round(), 0);
    }
}
