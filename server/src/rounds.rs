//! The per-key round logic as a pure state machine: no sockets, no clocks, no tasks.
//!
//! One [`KeyRounds`] holds one key (one chunk of one tensor). The async shell
//! ([`crate::service`]) feeds it pushes ([`KeyRounds::push`]), frames it rejected before they
//! got here ([`KeyRounds::reject`]) and lost-node events ([`KeyRounds::node_lost`]); each call
//! returns the [`Action`]s the shell must carry out (send a result or an abort to the ranks
//! the action names). Because nothing here touches I/O or time, arrival orders, duplicates,
//! missing workers and lost nodes are tested deterministically, the way quinn-proto tests QUIC.
//!
//! # Rules
//! * A key's rounds are pushed by **hosts** (ARCHITECTURE.md, "Two levels"): with
//!   `local_size` G (workers per host), host `h` runs ranks `h·G .. h·G + G − 1` and there are
//!   H = `num_workers / G` hosts. Each host's push of the key comes from its **owner** of the
//!   key, rank `h·G + chunk_owner(key, G)` ([`KeyInfo::owner_rank`]), and counts as
//!   participant `h`. With G = 1 every worker is a host and owns its own pushes: the
//!   participants are the ranks `0..num_workers`.
//! * Rounds are numbered from 0 and run one at a time. A round collects exactly one push per
//!   host `0..H`, each from that host's owner rank.
//! * **Sum** rounds are summed in host order ([`RankOrderSum`], the one definition the
//!   single-process reference shares, over participants): host 0's payload is decoded into
//!   the key's accumulator (kept between rounds), then hosts 1, 2, … are added
//!   (`decompress_add`) in turn. A payload that arrives before its turn is held (as the
//!   received `Bytes`, no copy) until every lower host is in, so the result is bit-identical
//!   whatever order pushes arrive in. When all hosts are in, the sum is encoded once and the
//!   same payload goes to every owner rank ([`Action::SendResult`]; the owners share it with
//!   their hosts' other members); the held payloads are gone by then and the key moves to the
//!   next round.
//! * A **non-finite** push (flagged, empty: the worker's chunk held inf or NaN, see
//!   `pushpull_proto::protocol`'s module docs) makes its sum round non-finite: nothing more is
//!   decoded, and when every host is in the round completes with
//!   [`Action::SendNonFinite`] to every owner rank, the key's codec untouched. So does a sum
//!   whose encoding fails because it is not finite or overflows.
//! * A push flagged **undo previous** (every push of its round must agree) undoes the key's
//!   codec state change of its previous sum round ([`Compressor::undo`]) when the round opens:
//!   its workers discarded that round (their optimizer skipped the step).
//! * **Broadcast** rounds (`aux` = root rank, a worker rank): the root's host is
//!   `aux / G`; that host's owner pushes the root's encoded chunk (checked by decoding it
//!   once), every other host's owner pushes an empty payload; the result is the root host's
//!   payload, unchanged.
//! * **Gossip** rounds (a key made with [`KeyRounds::with_gossip`]; `local_size` 1): every
//!   rank pushes its message (exactly the codec's `max_compressed_len` bytes, aux 0, no
//!   flags), which is held undecoded; when all are in, each rank gets its own result, its
//!   neighbours' messages concatenated in ascending rank order ([`Action::SendEach`]). A
//!   sum push to a gossip key, or a gossip push to a summed key, is rejected; broadcasts
//!   (the initial model) run on either.
//! * A **rejected** push (out-of-range rank, a rank that does not own its host's push of this
//!   key, payload too long or undecodable, op/aux that disagree with the round's first push, a
//!   second push from the same host, a round that is older than the current one and not a
//!   recently aborted one) **aborts the current round for every participant**
//!   ([`Action::SendAbort`] to every owner rank, and to the sender too when it is a worker
//!   that owns no push of this key) with a message naming the tensor, the chunk index, the
//!   key, the round, the offending rank and what was wrong (for a non-owner: the owner rank
//!   expected); the key then continues with the next round. When the rejected push was for
//!   another round than the current one, its sender also gets an abort for the round it
//!   pushed, so it never waits.
//! * A push for a **recently aborted** round (the last [`ABORT_MEMORY`] aborts are remembered)
//!   is answered, to its sender only, with that round's abort message.
//! * A push for a round **ahead** of the current one means its sender gave up on the current
//!   round without pushing it (e.g. its push_pull was cancelled part-way) and never will, so
//!   the current round can never complete. It is aborted for every owner rank (if anyone had
//!   pushed to it) and remembered as aborted, and the key skips ahead to the pushed round,
//!   which accepts the push. The contract lists such a push among the rejected ones;
//!   rejecting it would leave the next round waiting for the push that was rejected, so every
//!   later round would fail too, while skipping resynchronises the key at once. A push more
//!   than [`MAX_SKIP`] rounds ahead is rejected.
//! * [`KeyRounds::node_lost`] aborts the open round (if any) naming the lost node; from then on
//!   every push to this key is answered with an abort naming that node, since no round can
//!   complete without it (any lost node ends the job, owner of this key or not).
//! * [`KeyRounds::worker_left`]: a worker finished cleanly and closed its connection, so it
//!   will push nothing more. A worker that owns no host's push of this key changes nothing
//!   here (it pushes nothing to it). For an owner: an open round it has not pushed to is
//!   aborted for every owner rank naming it; an open round it has pushed to may still
//!   complete; every other push (a later round) is answered with an abort naming it. Without
//!   this, the other workers would wait for its pushes forever: a finished worker is not a
//!   lost node, so no loss is reported.

use std::collections::VecDeque;
use std::fmt;

use std::sync::Arc;

use bytes::Bytes;
use pushpull_codecs::{fp32_codec, Compressor, RankOrderSum, RoundCtx};
use pushpull_proto::pool::BufPool;
use pushpull_proto::protocol::{FrameFlags, ReduceOp};

/// How many aborted rounds (or skipped ranges of rounds) a key remembers, so that late pushes
/// for them are answered with the same abort.
pub const ABORT_MEMORY: usize = 16;

/// How far ahead of the current round a push may be and still be taken as "its sender gave
/// up on the rounds in between" (see the module docs); a push further ahead is rejected.
pub const MAX_SKIP: u64 = 1024;

/// The round being collected.
struct OpenRound {
    /// Op and aux of the round's first push, and that push's rank.
    op: ReduceOp,
    aux: u32,
    first_rank: u32,
    /// Which hosts have pushed (indexed by host, `0..num_hosts`).
    received: Vec<bool>,
    count: u32,
    /// Payloads of hosts that arrived before their turn (Sum), or the root's payload
    /// (Broadcast, at the root's host `aux / local_size`).
    held: Vec<Option<Bytes>>,
    /// Sum: the hosts in the key's accumulator, in host order (none once `non_finite`).
    sum: RankOrderSum,
    /// Flags of the round's first push (`undo_previous` every push must share) and whether
    /// any push was non-finite.
    undo_previous: bool,
    non_finite: bool,
}

/// A remembered abort: rounds `first..=last` and the message they are answered with.
#[derive(Debug, Clone)]
struct Aborted {
    first: u64,
    last: u64,
    message: String,
}

/// Why a push was rejected before it joined the round.
type Rejection = (u32, String);

/// The round state machine of one key. See the [module docs](self) for the rules.
pub struct KeyRounds {
    info: KeyInfo,
    codec: Compressor,
    /// The sum of the round being collected: allocated at the first sum, then reused by every
    /// round (rank 0's decode overwrites it).
    acc: Vec<f32>,
    /// Buffers for encoded sums.
    pool: Arc<BufPool>,
    /// The round being collected (or the next one to open).
    current: u64,
    open: Option<OpenRound>,
    aborted: VecDeque<Aborted>,
    /// Set once a node was lost: every push is answered with this.
    failed: Option<String>,
    /// Set once a worker left: every push except to the open round is answered with this.
    departed: Option<String>,
    /// The last sum round that completed: what a push flagged undo-previous undoes.
    last_sum: Option<u64>,
    /// A gossip key's graph: each rank's neighbours, ascending ([`KeyRounds::with_gossip`]);
    /// `None` for a key summed by push_pull.
    gossip: Option<Arc<Vec<Vec<u32>>>>,
    /// Told of each phase of a round (the timeline), if set.
    observer: Option<Observer>,
}

impl fmt::Debug for KeyRounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRounds")
            .field("info", &self.info)
            .field("current", &self.current)
            .field("open_ranks", &self.open_ranks())
            .field("failed", &self.failed)
            .finish()
    }
}

impl KeyRounds {
    /// A key at round 0, nothing received. `codec.len()` should equal `info.len` (the codec
    /// decides what payload lengths are valid).
    pub fn new(info: KeyInfo, codec: Compressor) -> KeyRounds {
        KeyRounds {
            info,
            codec,
            acc: Vec::new(),
            pool: BufPool::new(0),
            current: 0,
            open: None,
            aborted: VecDeque::new(),
            failed: None,
            departed: None,
            last_sum: None,
            gossip: None,
            observer: None,
        }
    }

    /// Makes this a gossip key (`exchange = "gossip"`): its rounds are [`ReduceOp::Gossip`],
    /// relayed to each rank's `neighbours[rank]` (ascending, self excluded; every rank of
    /// `0..num_workers` has a list). Gossip runs without local groups (`local_size` 1).
    pub fn with_gossip(mut self, neighbours: Arc<Vec<Vec<u32>>>) -> KeyRounds {
        self.gossip = Some(neighbours);
        self
    }

    /// Tells `observer` when each round's adds and encode start and end (the shell's
    /// timeline); nothing else changes.
    pub fn with_observer(mut self, observer: Observer) -> KeyRounds {
        self.observer = Some(observer);
        self
    }

    /// Encodes sums into buffers of `pool` (shared by a server's keys), which get them back
    /// once every result frame is delivered. Without one, each sum is a fresh buffer.
    pub fn with_pool(mut self, pool: Arc<BufPool>) -> KeyRounds {
        self.pool = pool;
        self
    }

    /// Who this key is.
    pub fn info(&self) -> &KeyInfo {
        &self.info
    }

    /// The round being collected (or the next one to open).
    pub fn current_round(&self) -> u64 {
        self.current
    }

    /// Whether some rank has pushed to the current round and it is not complete.
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// The ranks that have pushed to the current round, ascending (empty when not open).
    pub fn open_ranks(&self) -> Vec<u32> {
        match &self.open {
            Some(o) => (0..self.info.num_hosts())
                .filter(|&h| o.received[h as usize])
                .map(|h| self.info.owner_rank(h))
                .collect(),
            None => Vec::new(),
        }
    }

    /// Whether a lost node made this key fail for good.
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// The ranks told of a round's result or abort: the owner ranks.
    fn all_ranks(&self) -> Vec<u32> {
        self.info.owner_ranks().collect()
    }

    fn context(&self, round: u64) -> String {
        format!("{} round {round}", self.info)
    }

    fn remember_abort(&mut self, first: u64, last: u64, message: String) {
        if self.aborted.len() == ABORT_MEMORY {
            self.aborted.pop_front();
        }
        self.aborted.push_back(Aborted {
            first,
            last,
            message,
        });
    }

    fn aborted_message(&self, round: u64) -> Option<&str> {
        self.aborted
            .iter()
            .rev()
            .find(|a| a.first <= round && round <= a.last)
            .map(|a| a.message.as_str())
    }

    /// Aborts the current round for every owner rank with `message`, remembers it, frees its
    /// memory and moves to the next round.
    fn abort_current(&mut self, message: String, out: &mut Vec<Action>) {
        self.abort_current_telling(None, message, out);
    }

    /// [`KeyRounds::abort_current`], also telling `sender` (a rejected push's rank) when it
    /// is a worker of the job but not an owner rank (a member that pushed a chunk its host's
    /// owner pushes), so that it does not wait for a result that never comes to it.
    fn abort_current_telling(
        &mut self,
        sender: Option<u32>,
        message: String,
        out: &mut Vec<Action>,
    ) {
        let round = self.current;
        self.open = None;
        self.remember_abort(round, round, message.clone());
        let mut ranks = self.all_ranks();
        if let Some(r) = sender {
            if r < self.info.num_workers && self.info.owner_host(r).is_none() {
                let at = ranks.partition_point(|&o| o < r);
                ranks.insert(at, r);
            }
        }
        out.push(Action::SendAbort {
            round,
            ranks,
            message,
        });
        self.current = self.current.wrapping_add(1);
    }

    /// A push from `rank` for `round` that is rejected because of `what` (also the entry point
    /// for frames the shell rejected before they reached the state machine, e.g. a truncated
    /// payload or a rank that differs from the connection's `Hello`). Aborts the current round
    /// for every owner rank (and the sender, if it is not one); if `round` is another round,
    /// its sender also gets an abort for it.
    pub fn reject(&mut self, rank: u32, round: u64, what: &str) -> Vec<Action> {
        let mut out = Vec::new();
        if let Some(msg) = self.answer_without_round(rank, round) {
            out.push(msg);
            return out;
        }
        self.reject_into(rank, round, what, &mut out);
        out
    }

    fn reject_into(&mut self, rank: u32, round: u64, what: &str, out: &mut Vec<Action>) {
        let current = self.current;
        let message = if round == current {
            format!(
                "{}: push from rank {rank} rejected: {what}; the round is aborted for every worker",
                self.context(current)
            )
        } else {
            format!(
                "{}: push from rank {rank} for round {round} rejected: {what}; round {current} \
                 is aborted for every worker",
                self.context(current)
            )
        };
        if round != current {
            out.push(Action::SendAbort {
                round,
                ranks: vec![rank],
                message: message.clone(),
            });
            self.abort_current(message, out);
        } else {
            self.abort_current_telling(Some(rank), message, out);
        }
    }

    /// Answers pushes that never join a round: to a failed key, to a key a worker left (but
    /// for its open round), or to an aborted round.
    fn answer_without_round(&self, rank: u32, round: u64) -> Option<Action> {
        let to_open_round = self.open.is_some() && round == self.current;
        let message = if let Some(reason) = &self.failed {
            format!("{}: {reason}", self.context(round))
        } else if let (Some(reason), false) = (&self.departed, to_open_round) {
            format!("{}: {reason}", self.context(round))
        } else {
            self.aborted_message(round)?.to_string()
        };
        Some(Action::SendAbort {
            round,
            ranks: vec![rank],
            message,
        })
    }

    /// A worker's push of `payload` for `round` (`op` and `aux` from the frame header). Returns
    /// what to send: nothing while the round waits for other ranks, one
    /// [`Action::SendResult`] when it completes, [`Action::SendAbort`]s when something was
    /// rejected.
    pub fn push(
        &mut self,
        rank: u32,
        round: u64,
        op: ReduceOp,
        aux: u32,
        payload: Bytes,
    ) -> Vec<Action> {
        self.push_flagged(rank, round, op, aux, FrameFlags::default(), payload)
    }

    /// [`KeyRounds::push`] of a frame with `flags` (non-finite, undo previous; the frame
    /// header's decoder checked that they fit the frame).
    pub fn push_flagged(
        &mut self,
        rank: u32,
        round: u64,
        op: ReduceOp,
        aux: u32,
        flags: FrameFlags,
        payload: Bytes,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        let w = self.info.num_workers;
        if let Some(a) = self.answer_without_round(rank, round) {
            out.push(a);
            return out;
        }
        if rank >= w {
            let what = format!("rank {rank} is out of range (the job has {w} workers)");
            self.reject_into(rank, round, &what, &mut out);
            return out;
        }
        if self.info.owner_host(rank).is_none() {
            let what = self.not_an_owner(rank);
            self.reject_into(rank, round, &what, &mut out);
            return out;
        }
        if round > self.current.saturating_add(MAX_SKIP) {
            let what = format!(
                "round {round} is more than {MAX_SKIP} rounds ahead of the current round {}",
                self.current
            );
            self.reject_into(rank, round, &what, &mut out);
            return out;
        }
        if round > self.current {
            self.skip_to(rank, round, &mut out);
        } else if round < self.current {
            let what = format!(
                "round {round} is over (the key is at round {}) and was not aborted",
                self.current
            );
            self.reject_into(rank, round, &what, &mut out);
            return out;
        }
        if let Err((bad_rank, what)) = self.accept(rank, op, aux, flags, payload) {
            self.reject_into(bad_rank, self.current, &what, &mut out);
            return out;
        }
        self.try_complete(&mut out);
        out
    }

    /// Why `rank` (in range) may not push this key: another member of its host owns it.
    fn not_an_owner(&self, rank: u32) -> String {
        let g = self.info.group();
        let host = rank / g;
        let first = host * g;
        format!(
            "rank {rank} does not own key {:#018x} on its host: host {host} (ranks \
             {first}..={}) pushes it from rank {} (local rank {} = key % {g})",
            self.info.key,
            first + g - 1,
            self.info.owner_rank(host),
            self.info.owner_local_rank(),
        )
    }

    /// `rank` pushed `round` > current: the current round can never complete. Abort it (if
    /// open) and remember every skipped round as aborted.
    fn skip_to(&mut self, rank: u32, round: u64, out: &mut Vec<Action>) {
        let first = self.current;
        let last = round - 1;
        let message = format!(
            "{}: rank {rank} pushed round {round} before round {first} completed, so it will \
             never push round {first}{}; round {first} is aborted for every worker",
            self.context(first),
            if last > first {
                format!(" (rounds {first}..={last} are skipped)")
            } else {
                String::new()
            },
        );
        if self.open.take().is_some() {
            out.push(Action::SendAbort {
                round: first,
                ranks: self.all_ranks(),
                message: message.clone(),
            });
        }
        self.remember_abort(first, last, message);
        self.current = round;
    }

    /// Adds a push to the current round (opening it if needed). `Err((rank, what))` names the
    /// rank whose push is rejected (a held payload may fail to decode later than its arrival).
    fn accept(
        &mut self,
        rank: u32,
        op: ReduceOp,
        aux: u32,
        flags: FrameFlags,
        payload: Bytes,
    ) -> Result<(), Rejection> {
        let w = self.info.num_workers;
        let hosts = self.info.num_hosts();
        // The caller checked that `rank` owns its host's push of this key.
        let host = rank / self.info.group();
        if let Some(o) = &self.open {
            if o.undo_previous != flags.undo_previous {
                let says = |undo: bool| if undo { "undoes" } else { "keeps" };
                return Err((
                    rank,
                    format!(
                        "it {} the previous round but rank {} {} it",
                        says(flags.undo_previous),
                        o.first_rank,
                        says(o.undo_previous)
                    ),
                ));
            }
            if o.op != op || o.aux != aux {
                return Err((
                    rank,
                    format!(
                        "it has {} but rank {} pushed {} to this round",
                        describe_op(op, aux),
                        o.first_rank,
                        describe_op(o.op, o.aux)
                    ),
                ));
            }
            if o.received[host as usize] {
                return Err((rank, format!("rank {rank} pushed twice in this round")));
            }
        }
        if self.gossip.is_some() != (op == ReduceOp::Gossip) && op != ReduceOp::Broadcast {
            let what = if op == ReduceOp::Gossip {
                "a gossip push to a key that is summed (its tensor's map has no exchange = \
                 \"gossip\")"
            } else {
                "a sum push to a gossip key (its tensor's map says exchange = \"gossip\")"
            };
            return Err((rank, what.to_string()));
        }
        match op {
            ReduceOp::Gossip => {
                let want = self.codec.max_compressed_len();
                if payload.len() != want || aux != 0 || flags != FrameFlags::default() {
                    return Err((
                        rank,
                        format!(
                            "a gossip push carries the codec's {want}-byte message, aux 0 and \
                             no flags; got {} bytes, aux {aux}, flags {:#06x}",
                            payload.len(),
                            flags.bits()
                        ),
                    ));
                }
            }
            ReduceOp::Sum => {
                let max = self.codec.max_compressed_len();
                if payload.len() > max {
                    return Err((
                        rank,
                        format!(
                            "payload of {} bytes exceeds the codec's largest encoding of {max} \
                             bytes for {} elements",
                            payload.len(),
                            self.info.len
                        ),
                    ));
                }
            }
            ReduceOp::Broadcast => {
                if aux >= w {
                    return Err((
                        rank,
                        format!("broadcast root {aux} is out of range (the job has {w} workers)"),
                    ));
                }
                let root_host = aux / self.info.group();
                if host != root_host && !payload.is_empty() {
                    let what = if self.info.group() == 1 {
                        format!(
                            "a non-root rank of a broadcast (root {aux}) must push an empty \
                             payload, not {} bytes",
                            payload.len()
                        )
                    } else {
                        format!(
                            "a non-root host of a broadcast (root {aux}, on host {root_host}) \
                             must push an empty payload, not {} bytes (rank {rank} pushes for \
                             host {host})",
                            payload.len()
                        )
                    };
                    return Err((rank, what));
                }
                if host == root_host {
                    // Check the root's payload once, so a bad one is named here rather than
                    // failing W decodes on the workers.
                    // (A temporary: broadcasts are rare, and keeping a buffer per key would
                    // double the server's memory.)
                    // Broadcasts carry raw fp32 whatever the key's compressor.
                    let mut check = vec![0.0f32; self.info.len];
                    let fp32 = fp32_codec(self.info.len);
                    let ctx = RoundCtx::new(self.current);
                    if let Err(e) = fp32.decompress(&payload, &ctx, &mut check) {
                        return Err((rank, format!("undecodable broadcast payload: {e}")));
                    }
                }
            }
        }
        if self.open.is_none() && flags.undo_previous {
            if let Some(previous) = self.last_sum {
                self.codec.undo(previous);
            }
        }
        let o = self.open.get_or_insert_with(|| OpenRound {
            op,
            aux,
            first_rank: rank,
            received: vec![false; hosts as usize],
            count: 0,
            held: vec![None; hosts as usize],
            sum: RankOrderSum::new(),
            undo_previous: flags.undo_previous,
            non_finite: false,
        });
        o.received[host as usize] = true;
        o.count += 1;
        o.non_finite |= flags.non_finite;
        o.held[host as usize] = Some(payload);
        if op == ReduceOp::Sum {
            self.sum_prefix()?;
        }
        Ok(())
    }

    /// Sums every held payload whose turn has come (the contiguous prefix of hosts).
    fn sum_prefix(&mut self) -> Result<(), Rejection> {
        let round = self.current;
        let len = self.info.len;
        let Some(o) = self.open.as_mut() else {
            return Ok(());
        };
        if o.non_finite {
            // The round's sum is not finite whatever the others pushed: nothing to decode.
            o.held.iter_mut().for_each(|h| *h = None);
            return Ok(());
        }
        // Host 0's decode overwrites every element: no need to zero.
        self.acc.resize(len, 0.0);
        // The sum's "ranks" are hosts: `next_rank` is the next host's index.
        while let Some(payload) = o
            .held
            .get_mut(o.sum.next_rank() as usize)
            .and_then(Option::take)
        {
            let host = o.sum.next_rank();
            let ctx = RoundCtx::new(round);
            if let Some(f) = self.observer.as_mut() {
                f(round, Phase::Add { host }, true);
            }
            let added = o.sum.add(&self.codec, &payload, &ctx, &mut self.acc);
            if let Some(f) = self.observer.as_mut() {
                f(round, Phase::Add { host }, false);
            }
            if let Err(e) = added {
                return Err((
                    self.info.owner_rank(host),
                    format!("undecodable payload of {} bytes: {e}", payload.len()),
                ));
            }
        }
        Ok(())
    }

    fn try_complete(&mut self, out: &mut Vec<Action>) {
        let hosts = self.info.num_hosts();
        let complete = matches!(&self.open, Some(o) if o.count == hosts);
        if !complete {
            return;
        }
        let round = self.current;
        let Some(mut o) = self.open.take() else {
            return;
        };
        let payload = match o.op {
            ReduceOp::Gossip => {
                let graph = self.gossip.clone().unwrap_or_default();
                let results = relay(&graph, &o.held, self.info.num_workers);
                self.current = self.current.wrapping_add(1);
                out.push(Action::SendEach { round, results });
                return;
            }
            ReduceOp::Broadcast => {
                let root_host = o.aux / self.info.group();
                o.held[root_host as usize].take().unwrap_or_default()
            }
            ReduceOp::Sum if o.non_finite => {
                self.last_sum = Some(round);
                self.current = self.current.wrapping_add(1);
                let ranks = self.all_ranks();
                out.push(Action::SendNonFinite { round, ranks });
                return;
            }
            ReduceOp::Sum => {
                debug_assert_eq!(o.sum.next_rank(), hosts);
                self.last_sum = Some(round);
                // Sum pushes carry the round's learning rate (f32 bits; 0 = none set),
                // which corrected error feedback on the sum needs.
                let ctx = RoundCtx {
                    lr: (o.aux != 0).then(|| f32::from_bits(o.aux)),
                    ..RoundCtx::new(round)
                };
                let mut bytes = self.pool.take();
                if let Some(f) = self.observer.as_mut() {
                    f(round, Phase::Encode, true);
                }
                let encoded = self.codec.compress(&self.acc, &ctx, &mut bytes);
                if let Some(f) = self.observer.as_mut() {
                    f(round, Phase::Encode, false);
                }
                if let Err(e) = encoded {
                    self.pool.give_back(bytes);
                    if e.is_non_finite() {
                        // Finite pushes whose sum overflows: as if one was not finite.
                        self.current = self.current.wrapping_add(1);
                        let ranks = self.all_ranks();
                        out.push(Action::SendNonFinite { round, ranks });
                        return;
                    }
                    let message = format!(
                        "{}: encoding the sum failed: {e}; the round is aborted for every worker",
                        self.context(round)
                    );
                    self.abort_current(message, out);
                    return;
                }
                self.pool.freeze(bytes)
            }
        };
        drop(o);
        self.current = self.current.wrapping_add(1);
        let ranks = self.all_ranks();
        out.push(Action::SendResult {
            round,
            ranks,
            payload,
        });
    }

    /// A node was lost (`node` is its description, e.g. `worker 2 (10.0.0.5:4000)`, `reason`
    /// what the scheduler observed). Aborts the open round, if any, for every owner rank naming
    /// the node (whichever node it is: any lost node ends the job); every later push to this key is answered with an abort naming it too.
    pub fn node_lost(&mut self, node: &str, reason: &str) -> Vec<Action> {
        let mut out = Vec::new();
        if self.failed.is_some() {
            return out;
        }
        let failed = format!("{node} was lost ({reason}); no round of this key can complete");
        if self.open.is_some() {
            let message = format!("{}: {failed}", self.context(self.current));
            self.abort_current(message, &mut out);
        }
        self.failed = Some(failed);
        out
    }

    /// Worker `rank` (`node` is its description) finished and closed its connection (see the
    /// module docs). Returns the abort of the open round when it lacks that worker's push.
    /// A worker that owns no host's push of this key changes nothing here.
    pub fn worker_left(&mut self, rank: u32, node: &str) -> Vec<Action> {
        let mut out = Vec::new();
        if self.failed.is_some() || self.departed.is_some() {
            return out;
        }
        let Some(host) = self.info.owner_host(rank) else {
            return out;
        };
        let why = format!(
            "{node} finished (left the job) and will push no more rounds; no later round of this \
             key can complete (did the workers make different numbers of calls?)"
        );
        let pushed = matches!(&self.open, Some(o) if o.received[host as usize]);
        if self.open.is_some() && !pushed {
            let message = format!(
                "{}: {why}; the round is aborted for every worker",
                self.context(self.current)
            );
            self.abort_current(message, &mut out);
        }
        self.departed = Some(why);
        out
    }
}

fn describe_op(op: ReduceOp, aux: u32) -> String {
    match op {
        ReduceOp::Sum if aux == 0 => "op Sum".to_string(),
        ReduceOp::Sum => format!("op Sum (learning rate {})", f32::from_bits(aux)),
        ReduceOp::Broadcast => format!("op Broadcast (root {aux})"),
        ReduceOp::Gossip => "op Gossip".to_string(),
    }
}

mod action;
mod info;
mod relay;
mod state;
pub use action::{Action, Observer, Phase};
pub use info::KeyInfo;
use relay::relay;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod perf;
