//! [`Worker::save_state`] and [`Worker::load_state`] (and their in-memory forms
//! [`Worker::checkpoint`] and [`Worker::restore`]): checkpoint and restart. The format and the
//! settings check are in `crate::checkpoint`; this is the shell that holds the tensors, runs
//! the barriers, asks the servers for their keys' state (rank 0) and reads or writes the file.
//!
//! Where a server's state goes: to rank 0's checkpoint, over the data connections (a `StateGet`
//! frame per key, answered with a `State` frame; `StatePut` on restore), not to a file on the
//! server's host. Servers may run on other hosts, with no file system the training code sees;
//! rank 0's checkpoint lands where the training code saves its model, and a restart needs
//! nothing from the old servers' hosts.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use pushpull_proto::checkpoint::{ChainState, KeyState, STATE_ROUND};
use pushpull_proto::protocol::{FrameFlags, FrameHeader, FrameKind, ReduceOp};

use super::{lock, Worker};
use crate::checkpoint::{results_only, Checkpoint, Settings, TensorSettings, TensorState};
use crate::core::SavedRounds;
use crate::dispatch::{Outcome, Waiter};
use crate::error::WorkerError;
use crate::tensor::Tensor;

/// The `path` of errors about a [`Checkpoint`] value rather than a file.
const IN_MEMORY: &str = "(in memory)";

fn refused(path: &str, message: impl Into<String>) -> WorkerError {
    WorkerError::Checkpoint {
        path: path.to_string(),
        message: message.into(),
    }
}

impl Worker {
    /// Saves this worker's compressor state to `path`, a collective: every worker calls it at
    /// the same point of training (between steps: no push_pull of its own in flight), and
    /// each writes its own file (e.g. `ckpt-rank{rank}.bin`, next to the model's checkpoint).
    ///
    /// What is saved: every declared tensor's next round and each chunk's error-feedback
    /// residual, momentum and corrected error feedback's previous learning rate (after a
    /// discarded round, [`Worker::discard_last_round`], with that round undone here and on
    /// the servers, and the discard kept: the next push asks the servers to undo it, in this
    /// job and in a job restored from it, and does nothing more there); the learning
    /// rate last set ([`Worker::set_learning_rate`]); the settings that change results (this
    /// rank, the job seed, workers, servers, chunking, `local_size`, every tensor's length,
    /// parameter map and chunks); and in rank 0's file every server key's state (its residual
    /// and its next round), which rank 0 asks the servers for. [`Worker::load_state`] in a
    /// fresh job with the same settings then continues bit for bit.
    ///
    /// Runs two barriers: one once this worker's rounds are done (so every worker's are, and
    /// every server's), one after rank 0 read the servers' state (so that nobody starts the
    /// next round before). Holds every tensor meanwhile: push_pulls started on other tasks
    /// wait.
    ///
    /// # Errors
    /// [`WorkerError::Checkpoint`] naming the file and why (it cannot be written; a device
    /// could not be read; a server refused), and the job's fatal errors.
    pub async fn save_state(&self, path: impl AsRef<std::path::Path>) -> Result<(), WorkerError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let checkpoint = self.checkpoint_at(&shown).await?;
        write_atomically(path, &checkpoint.to_bytes()).map_err(|e| refused(&shown, e))
    }

    /// Restores the compressor state [`Worker::save_state`] saved in `path`, a collective:
    /// every worker of a freshly started job calls it with its own file, after declaring every
    /// tensor of the checkpoint (and no other) and before any round. The job then continues
    /// bit for bit as the one that saved it: the same rounds, residuals, momentum and random
    /// draws (they are functions of the job seed and the round).
    ///
    /// Refused, naming the setting and both values, when a setting that changes results
    /// differs: the rank, the job seed (without `cluster.seed`, the scheduler picks a new one:
    /// set `cluster.seed` to the saved one, which the message names), `cluster.num_workers`,
    /// `num_servers`, `partition_bytes`, `max_chunk_payload_bytes`, `min_compress_bytes`,
    /// `local_size`, `force_distributed`, and each tensor's length, parameter map and chunks.
    /// Timeouts, windows, metrics and priorities may differ. Rank 0 restores the servers' keys;
    /// then every worker meets at a barrier, so no round starts before they are restored. A
    /// tensor that has already run rounds in this job (the parameters' broadcast at start,
    /// say) is left as it is if the checkpoint holds no compressor state for it (no chain
    /// state, here or on its servers), and refused otherwise.
    ///
    /// # Errors
    /// [`WorkerError::Checkpoint`] naming the file and why: unreadable, not a checkpoint,
    /// truncated or corrupted, another format version, a setting that differs, a tensor that
    /// has already run rounds, a state that does not fit a chain, a server that refused; and
    /// the job's fatal errors. Nothing of this worker's state changes when the file or its
    /// settings are refused.
    pub async fn load_state(&self, path: impl AsRef<std::path::Path>) -> Result<(), WorkerError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| refused(&shown, format!("reading: {e}")))?;
        let checkpoint = Checkpoint::from_bytes(&bytes).map_err(|e| refused(&shown, e))?;
        self.restore_at(&checkpoint, &shown).await
    }

    /// [`Worker::save_state`] without the file: the checkpoint as a value
    /// ([`Checkpoint::to_bytes`] is the file's content).
    ///
    /// # Errors
    /// As [`Worker::save_state`].
    pub async fn checkpoint(&self) -> Result<Checkpoint, WorkerError> {
        self.checkpoint_at(IN_MEMORY).await
    }

    /// [`Worker::load_state`] from a value.
    ///
    /// # Errors
    /// As [`Worker::load_state`].
    pub async fn restore(&self, checkpoint: &Checkpoint) -> Result<(), WorkerError> {
        self.restore_at(checkpoint, IN_MEMORY).await
    }

    /// Every declared tensor, by name.
    fn tensors_by_name(&self) -> BTreeMap<String, Tensor> {
        lock(&self.inner.tensors)
            .iter()
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect()
    }

    /// This job's settings as a checkpoint compares them.
    fn settings(&self, tensors: &BTreeMap<String, Tensor>) -> Settings {
        Settings {
            rank: self.rank(),
            job_seed: self.job_seed(),
            cluster: results_only(self.inner.config.digest()),
            tensors: tensors
                .iter()
                .map(|(n, t)| {
                    let p = t.placement();
                    let s = TensorSettings {
                        len: p.len,
                        params: p.params.clone(),
                        chunks: p.chunks.clone(),
                    };
                    (n.clone(), s)
                })
                .collect(),
        }
    }

    async fn checkpoint_at(&self, path: &str) -> Result<Checkpoint, WorkerError> {
        self.inner.shared.check()?;
        let tensors = self.tensors_by_name();
        // PowerSGD's states first: a step in flight holds its state and then takes the
        // rounds of its P and Q.
        let low_rank = hold_low_rank(&tensors).await;
        // Hold every tensor (in name order, as every caller does): waits for this worker's
        // rounds in flight, and keeps new ones out until the state is read.
        let mut held = Vec::with_capacity(tensors.len());
        for t in tensors.values() {
            held.push(t.inner.round.clone().lock_owned().await);
        }
        // A discarded round is undone now, as the tensor's next round would at its start
        // (which then does nothing more), wherever the state lives; on the servers, rank 0's
        // state requests below ask for it undone.
        // Chains on a device: their state copied from it (before the barrier, so a failure
        // leaves nobody waiting); the others' is read from the host chains below.
        let mut on_device = BTreeMap::new();
        for ((name, t), rounds) in tensors.iter().zip(&held) {
            let mut res = t.inner.residence();
            if let Some(round) = rounds.discarded() {
                let undone_on_device = match res.chains.as_mut() {
                    Some(chains) => chains.undo(round),
                    None => false,
                };
                if !undone_on_device {
                    crate::data::undo_host(&t.inner, round);
                }
            }
            if let Some(states) = res.chains.as_ref().and_then(|c| c.chain_states()) {
                let states = states.map_err(|e| {
                    refused(
                        path,
                        format!("tensor {name:?}: reading its device state: {e}"),
                    )
                })?;
                on_device.insert(name.clone(), states);
            }
        }
        self.barrier().await?;
        let mut states = BTreeMap::new();
        for ((name, t), rounds) in tensors.iter().zip(&held) {
            let chains = on_device.remove(name).unwrap_or_else(|| {
                (0..t.inner.codecs.len())
                    .map(|i| t.inner.codec(i).state())
                    .collect()
            });
            let saved = rounds.saved();
            let state = TensorState {
                next_round: saved.next,
                chains,
                gradient_bound: t.inner.bound.get().unwrap_or(0.0),
                last_sum: saved.last_sum,
                discarded: saved.discarded,
                low_rank: low_rank.get(name).map(|s| s.saved().into()),
            };
            states.insert(name.clone(), state);
        }
        let servers = if self.rank() == 0 && self.inner.config.cluster.uses_servers() {
            self.server_states(&tensors, &states, path).await
        } else {
            Ok(BTreeMap::new())
        };
        // Met even when reading the servers failed: the others are not left waiting.
        self.barrier().await?;
        let servers = servers?;
        let learning_rate = self.inner.learning_rate.load(Ordering::Relaxed);
        Ok(Checkpoint {
            settings: self.settings(&tensors),
            learning_rate,
            tensors: states,
            servers,
        })
    }

    /// Every server key's state (rank 0, between the barriers of a checkpoint).
    async fn server_states(
        &self,
        tensors: &BTreeMap<String, Tensor>,
        states: &BTreeMap<String, TensorState>,
        path: &str,
    ) -> Result<BTreeMap<u64, KeyState>, WorkerError> {
        // A tensor whose last round this worker discarded: its servers undo that round's
        // change before answering (every worker discarded it, or its next round, in this job
        // or a restored one, is aborted naming the ranks that did not).
        let mut asks = Vec::new();
        for (name, t) in tensors {
            let flags = FrameFlags {
                undo_previous: states.get(name).is_some_and(|s| s.discarded.is_some()),
                ..FrameFlags::default()
            };
            let chunks = t.placement().chunks.iter();
            asks.extend(chunks.map(|c| (c.server, c.key, flags, Bytes::new())));
        }
        let mut servers = BTreeMap::new();
        let answers = self.exchange(FrameKind::StateGet, asks.into_iter(), path);
        for (key, payload) in answers.await? {
            let state = KeyState::decode(&payload).map_err(|e| {
                refused(
                    path,
                    format!("the state of key {key:#018x} from its server: {e}"),
                )
            })?;
            servers.insert(key, state);
        }
        Ok(servers)
    }

    async fn restore_at(&self, checkpoint: &Checkpoint, path: &str) -> Result<(), WorkerError> {
        self.inner.shared.check()?;
        let tensors = self.tensors_by_name();
        if let Some(why) = checkpoint
            .settings
            .first_difference(&self.settings(&tensors))
        {
            return Err(refused(path, format!("refused: {why}")));
        }
        let mut low_rank = hold_low_rank(&tensors).await;
        let mut held = Vec::with_capacity(tensors.len());
        for t in tensors.values() {
            held.push(t.inner.round.clone().lock_owned().await);
        }
        // A tensor that has already run rounds here (a broadcast of the parameters before
        // loading, say) is kept as it is when the checkpoint has no state for it, here or on
        // its servers; with state, it is refused.
        let empty = ChainState::default();
        let mut restored = Vec::with_capacity(tensors.len());
        for ((name, t), rounds) in tensors.iter().zip(held) {
            let chunks = t.inner.codecs.len();
            let saved = checkpoint.tensors.get(name).map_or(0, |s| s.chains.len());
            let steps = low_rank.get(name).map_or(0, |s| s.saved().step);
            if !rounds.fresh() || steps > 0 {
                let stateless = checkpoint
                    .tensors
                    .get(name)
                    .is_some_and(|s| s.chains.iter().all(|c| *c == empty))
                    && t.placement().chunks.iter().all(|c| {
                        checkpoint
                            .servers
                            .get(&c.key)
                            .is_none_or(|k| k.chain == empty)
                    });
                if stateless {
                    continue;
                }
                return Err(refused(
                    path,
                    format!(
                        "tensor {name:?} has already run {} rounds in this job, and the checkpoint holds compressor state for it; load the checkpoint before its first round",
                        rounds.next().max(steps)
                    ),
                ));
            }
            if saved != chunks {
                return Err(refused(
                    path,
                    format!("tensor {name:?}: {saved} chunk states saved, {chunks} chunks here"),
                ));
            }
            restored.push((name.clone(), t.clone(), rounds));
        }
        let keys: Vec<(u32, u64)> = restored
            .iter()
            .flat_map(|(_, t, _)| t.placement().chunks.iter())
            .map(|c| (c.server, c.key))
            .collect();
        let restores_servers = self.rank() == 0 && self.inner.config.cluster.uses_servers();
        if restores_servers {
            if let Some((_, key)) = keys
                .iter()
                .find(|(_, k)| !checkpoint.servers.contains_key(k))
            {
                return Err(refused(
                    path,
                    format!("refused: the state of server key {key:#018x} is missing (rank 0's checkpoint carries every key's)"),
                ));
            }
        } else if !checkpoint.servers.is_empty() {
            return Err(refused(
                path,
                "refused: it carries server state, which only rank 0's checkpoint does in a job with servers",
            ));
        }
        let restoring: BTreeMap<String, Tensor> = restored
            .iter()
            .map(|(name, t, _)| (name.clone(), t.clone()))
            .collect();
        // PowerSGD's states, all checked before any chain is set.
        let mut steps = Vec::new();
        for (name, _, _) in &restored {
            let (Some(state), Some(saved)) = (low_rank.get(name), checkpoint.tensors.get(name))
            else {
                continue;
            };
            let mut next = (**state).clone();
            let kept = saved.low_rank.clone().unwrap_or_default();
            next.restore(kept.into()).map_err(|e| {
                refused(
                    path,
                    format!("tensor {name:?}: the saved state does not fit: {e}"),
                )
            })?;
            steps.push((name.clone(), next));
        }
        self.restore_chains(checkpoint, &restoring, path)?;
        for (name, next) in steps {
            if let Some(state) = low_rank.get_mut(&name) {
                **state = next;
            }
        }
        for (name, t, rounds) in restored.iter_mut() {
            let saved = checkpoint.tensors.get(name);
            let round = saved.map_or(0, |s| s.next_round);
            let kept = SavedRounds {
                next: round,
                last_sum: saved.and_then(|s| s.last_sum),
                discarded: saved.and_then(|s| s.discarded),
            };
            rounds.restore(kept, saved.is_some_and(TensorState::stateful), path);
            t.inner.rounds_started.store(round, Ordering::Relaxed);
            t.inner.first_round.store(round, Ordering::Relaxed);
        }
        self.inner
            .learning_rate
            .store(checkpoint.learning_rate, Ordering::Relaxed);
        drop(restored);
        if restores_servers {
            let puts = keys.iter().map(|(server, key)| {
                let state = checkpoint.servers.get(key).cloned().unwrap_or_default();
                let flags = FrameFlags::default();
                (*server, *key, flags, Bytes::from(state.encode()))
            });
            self.exchange(FrameKind::StatePut, puts, path).await?;
        }
        self.barrier().await
    }

    /// Sets every chunk's chain to the checkpoint's state, all or nothing: a chain that
    /// refuses its state puts back the ones set before it.
    fn restore_chains(
        &self,
        checkpoint: &Checkpoint,
        tensors: &BTreeMap<String, Tensor>,
        path: &str,
    ) -> Result<(), WorkerError> {
        let mut done: Vec<(&Tensor, usize, ChainState)> = Vec::new();
        let mut failure = None;
        'all: for (name, t) in tensors {
            let Some(saved) = checkpoint.tensors.get(name) else {
                continue;
            };
            for (i, state) in saved.chains.iter().enumerate() {
                let mut codec = t.inner.codec(i);
                let before = codec.state();
                if let Err(e) = codec.set_state(state) {
                    failure = Some(refused(
                        path,
                        format!("tensor {name:?} chunk {i}: the saved state does not fit: {e}"),
                    ));
                    break 'all;
                }
                done.push((t, i, before));
            }
        }
        match failure {
            Some(e) => {
                for (t, i, before) in done {
                    let _ = t.inner.codec(i).set_state(&before);
                }
                Err(e)
            }
            None => {
                for (name, t) in tensors {
                    let saved = checkpoint.tensors.get(name);
                    t.inner.residence().restored = saved.is_some_and(TensorState::stateful);
                    if let Some(s) =
                        saved.filter(|s| s.gradient_bound.is_finite() && s.gradient_bound > 0.0)
                    {
                        t.inner.bound.track(s.gradient_bound);
                    }
                }
                Ok(())
            }
        }
    }

    /// Sends one state frame of `kind` per `(server, key, flags, payload)`, all at once, and
    /// waits for every answer: the `State` frames' payloads by key.
    ///
    /// # Errors
    /// [`WorkerError::Checkpoint`] with the server's refusal (an `Abort` naming the key and
    /// why), or the job's fatal error.
    async fn exchange(
        &self,
        kind: FrameKind,
        frames: impl Iterator<Item = (u32, u64, FrameFlags, Bytes)>,
        path: &str,
    ) -> Result<Vec<(u64, Bytes)>, WorkerError> {
        let shared = &self.inner.shared;
        let mut waiting = Vec::new();
        for (server, key, flags, payload) in frames {
            let (Some(dispatch), Some(peer)) = (
                shared.dispatch.get(server as usize),
                self.inner.links.peers.get(server as usize),
            ) else {
                return Err(refused(
                    path,
                    format!("key {key:#018x}: no server {server}"),
                ));
            };
            let waiter = dispatch.register(key, STATE_ROUND)?;
            let header = FrameHeader {
                kind,
                op: ReduceOp::Sum,
                flags,
                rank: self.rank(),
                aux: 0,
                key,
                round: STATE_ROUND,
                payload_len: payload.len() as u64,
            };
            self.inner.sender.send(peer, header, payload, i32::MAX);
            waiting.push((key, waiter));
        }
        let mut answers = Vec::with_capacity(waiting.len());
        for (key, waiter) in waiting {
            let outcome = match waiter {
                Waiter::Ready(outcome) => outcome,
                Waiter::Pending(rx) => match rx.await {
                    Ok(delivery) => delivery?,
                    Err(_) => {
                        return Err(shared.state().fatal.unwrap_or_else(|| {
                            WorkerError::Internal(format!(
                                "the dispatch table dropped the state of key {key:#018x}"
                            ))
                        }))
                    }
                },
            };
            match outcome {
                Outcome::Result(payload) => answers.push((key, payload)),
                Outcome::Abort(why) => return Err(refused(path, why)),
                Outcome::NonFinite => {
                    return Err(refused(
                        path,
                        format!("key {key:#018x}: its server answered a state frame with a non-finite result"),
                    ))
                }
            }
        }
        Ok(answers)
    }
}

/// Writes `bytes` to a temporary file beside `path` and renames it over `path`: a crash while
/// saving leaves the previous checkpoint whole.
fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("renaming {} to it: {e}", tmp.display()))
}

/// Every PowerSGD tensor's state, held (in name order): waits for its step in flight.
async fn hold_low_rank(
    tensors: &BTreeMap<String, Tensor>,
) -> BTreeMap<String, tokio::sync::OwnedMutexGuard<pushpull_kernels::PowerSgd>> {
    let mut held = BTreeMap::new();
    for (name, t) in tensors {
        if let Some(low) = &t.inner.low_rank {
            held.insert(name.clone(), low.state.clone().lock_owned().await);
        }
    }
    held
}
