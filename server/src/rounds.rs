//! The per-key round logic as a pure state machine: no sockets, no clocks, no tasks.
//!
//! One [`KeyRounds`] holds one key (one chunk of one tensor). The async shell
//! ([`crate::service`]) feeds it pushes ([`KeyRounds::push`]), frames it rejected before they
//! got here ([`KeyRounds::reject`]) and lost-node events ([`KeyRounds::node_lost`]); each call
//! returns the [`Action`]s the shell must carry out (send a result to every worker, send an
//! abort to some ranks). Because nothing here touches I/O or time, arrival orders, duplicates,
//! missing workers and lost nodes are tested deterministically, the way quinn-proto tests QUIC.
//!
//! # Rules (SPINE-CONTRACT §7)
//! * Rounds are numbered from 0 and run one at a time. A round collects exactly one push per
//!   worker rank `0..num_workers`.
//! * **Sum** rounds are summed in rank order: rank 0's payload is decoded into a fresh
//!   accumulator, then ranks 1, 2, … are `decode_add`ed in turn. A payload that arrives before
//!   its turn is held (as the received `Bytes`, no copy) until every lower rank is in, so the
//!   result is bit-identical whatever order pushes arrive in. When all ranks are in, the sum is
//!   encoded once and the same payload goes to every worker ([`Action::SendResult`]); the
//!   round's memory is freed and the key moves to the next round.
//! * **Broadcast** rounds (`aux` = root rank): non-root ranks push an empty payload, the root
//!   pushes the encoded chunk (checked by decoding it once); the result is the root's payload,
//!   unchanged.
//! * A **rejected** push (out-of-range rank, payload too long or undecodable, op/aux that
//!   disagree with the round's first push, a second push from the same rank, a round that is
//!   older than the current one and not a recently aborted one) **aborts the current round for
//!   every worker** ([`Action::SendAbort`] to all ranks) with a message naming the tensor, the
//!   chunk index, the key, the round, the offending rank and what was wrong; the key then
//!   continues with the next round. When the rejected push was for another round than the
//!   current one, its sender also gets an abort for the round it pushed, so it never waits.
//! * A push for a **recently aborted** round (the last [`ABORT_MEMORY`] aborts are remembered)
//!   is answered, to its sender only, with that round's abort message.
//! * A push for a round **ahead** of the current one means its sender gave up on the current
//!   round without pushing it (e.g. its push_pull was cancelled part-way) and never will, so
//!   the current round can never complete. It is aborted for every worker (if anyone had pushed
//!   to it) and remembered as aborted, and the key skips ahead to the pushed round, which
//!   accepts the push. The contract lists such a push among the rejected ones; rejecting it
//!   would leave the next round waiting for the push that was rejected, so every later round
//!   would fail too, while skipping resynchronises the key at once. A push more than
//!   [`MAX_SKIP`] rounds ahead is rejected.
//! * [`KeyRounds::node_lost`] aborts the open round (if any) naming the lost node; from then on
//!   every push to this key is answered with an abort naming that node, since no round can
//!   complete without it.

use std::collections::VecDeque;
use std::fmt;

use std::sync::Arc;

use bytes::Bytes;
use common::codec::ChunkCodec;
use common::pool::BufPool;
use common::protocol::ReduceOp;

/// How many aborted rounds (or skipped ranges of rounds) a key remembers, so that late pushes
/// for them are answered with the same abort.
pub const ABORT_MEMORY: usize = 16;

/// How far ahead of the current round a push may be and still be taken as "its sender gave
/// up on the rounds in between" (see the module docs); a push further ahead is rejected.
pub const MAX_SKIP: u64 = 1024;

/// Who a key is: used in every message it produces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    /// The tensor's name.
    pub tensor: String,
    /// The chunk's index within the tensor.
    pub chunk: u32,
    /// The key.
    pub key: u64,
    /// Elements in the chunk.
    pub len: usize,
    /// Workers in the job (ranks `0..num_workers`).
    pub num_workers: u32,
    /// The tensor's priority: results of keys with a higher one are sent first (see
    /// `TensorPlacement::priority`).
    pub priority: i32,
}

impl fmt::Display for KeyInfo {
    /// `tensor "fc1.weight" chunk 3 (key 0x00000000000004d2)`: keys in hex, as the scheduler
    /// and the workers print them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tensor {:?} chunk {} (key {:#018x})",
            self.tensor, self.chunk, self.key
        )
    }
}

/// Something the shell must do on the key's behalf. Frames carry the key of the
/// [`KeyRounds`] that produced the action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send a `Result` frame for `round` with this payload to every worker rank
    /// `0..num_workers` (the same bytes to everyone).
    SendResult {
        /// The completed round.
        round: u64,
        /// The encoded sum (or the broadcast root's payload).
        payload: Bytes,
    },
    /// Send an `Abort` frame for `round` whose payload is `message` (UTF-8) to each of `ranks`.
    SendAbort {
        /// The aborted round.
        round: u64,
        /// The ranks to tell: every rank when a round is aborted, the sender alone when a push
        /// is answered for an already aborted round.
        ranks: Vec<u32>,
        /// Names the tensor, chunk index, key, round, the offending rank or lost node, and what
        /// was wrong.
        message: String,
    },
}

/// The round being collected.
struct OpenRound {
    /// Op and aux of the round's first push, and that push's rank.
    op: ReduceOp,
    aux: u32,
    first_rank: u32,
    /// Which ranks have pushed.
    received: Vec<bool>,
    count: u32,
    /// Payloads of ranks that arrived before their turn (Sum), or the root's payload
    /// (Broadcast, at index `aux`).
    held: Vec<Option<Bytes>>,
    /// Sum: ranks `0..next_rank` are in the key's accumulator.
    next_rank: u32,
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
    codec: Box<dyn ChunkCodec>,
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
    pub fn new(info: KeyInfo, codec: Box<dyn ChunkCodec>) -> KeyRounds {
        KeyRounds {
            info,
            codec,
            acc: Vec::new(),
            pool: BufPool::new(0),
            current: 0,
            open: None,
            aborted: VecDeque::new(),
            failed: None,
        }
    }

    /// Encodes sums into buffers of `pool` (shared by a server's keys), which get them back
    /// once every worker's result frame is delivered. Without one, each sum is a fresh buffer.
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
            Some(o) => (0..self.info.num_workers)
                .filter(|&r| o.received[r as usize])
                .collect(),
            None => Vec::new(),
        }
    }

    /// Whether a lost node made this key fail for good.
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    fn all_ranks(&self) -> Vec<u32> {
        (0..self.info.num_workers).collect()
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

    /// Aborts the current round for every worker with `message`, remembers it, frees its
    /// memory and moves to the next round.
    fn abort_current(&mut self, message: String, out: &mut Vec<Action>) {
        let round = self.current;
        self.open = None;
        self.remember_abort(round, round, message.clone());
        out.push(Action::SendAbort {
            round,
            ranks: self.all_ranks(),
            message,
        });
        self.current = self.current.wrapping_add(1);
    }

    /// A push from `rank` for `round` that is rejected because of `what` (also the entry point
    /// for frames the shell rejected before they reached the state machine, e.g. a truncated
    /// payload or a rank that differs from the connection's `Hello`). Aborts the current round
    /// for every worker; if `round` is another round, its sender also gets an abort for it.
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
        }
        self.abort_current(message, out);
    }

    /// Answers pushes that never join a round: to a failed key or to an aborted round.
    fn answer_without_round(&self, rank: u32, round: u64) -> Option<Action> {
        let message = if let Some(reason) = &self.failed {
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
        if let Err((bad_rank, what)) = self.accept(rank, op, aux, payload) {
            self.reject_into(bad_rank, self.current, &what, &mut out);
            return out;
        }
        self.try_complete(&mut out);
        out
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
        payload: Bytes,
    ) -> Result<(), Rejection> {
        let w = self.info.num_workers;
        if let Some(o) = &self.open {
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
            if o.received[rank as usize] {
                return Err((rank, format!("rank {rank} pushed twice in this round")));
            }
        }
        match op {
            ReduceOp::Sum => {
                let max = self.codec.max_encoded_len();
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
                if rank != aux && !payload.is_empty() {
                    return Err((
                        rank,
                        format!(
                            "a non-root rank of a broadcast (root {aux}) must push an empty \
                             payload, not {} bytes",
                            payload.len()
                        ),
                    ));
                }
                if rank == aux {
                    // Check the root's payload once, so a bad one is named here rather than
                    // failing W decodes on the workers.
                    // (A temporary: broadcasts are rare, and keeping a buffer per key would
                    // double the server's memory.)
                    // Broadcasts carry raw fp32 whatever the key's compressor.
                    let mut check = vec![0.0f32; self.info.len];
                    let fp32 = common::codec::Fp32Codec::new(self.info.len);
                    if let Err(e) = fp32.decode(&payload, self.current, &mut check) {
                        return Err((rank, format!("undecodable broadcast payload: {e}")));
                    }
                }
            }
        }
        let o = self.open.get_or_insert_with(|| OpenRound {
            op,
            aux,
            first_rank: rank,
            received: vec![false; w as usize],
            count: 0,
            held: vec![None; w as usize],
            next_rank: 0,
        });
        o.received[rank as usize] = true;
        o.count += 1;
        o.held[rank as usize] = Some(payload);
        if op == ReduceOp::Sum {
            self.sum_prefix()?;
        }
        Ok(())
    }

    /// Sums every held payload whose turn has come (the contiguous prefix of ranks).
    fn sum_prefix(&mut self) -> Result<(), Rejection> {
        let round = self.current;
        let len = self.info.len;
        let Some(o) = self.open.as_mut() else {
            return Ok(());
        };
        while (o.next_rank as usize) < o.held.len() {
            let r = o.next_rank as usize;
            let Some(payload) = o.held[r].take() else {
                break;
            };
            let res = if r == 0 {
                // Every element is overwritten by the decode: no need to zero.
                self.acc.resize(len, 0.0);
                self.codec.decode(&payload, round, &mut self.acc)
            } else {
                self.codec.decode_add(&payload, round, &mut self.acc)
            };
            if let Err(e) = res {
                return Err((
                    r as u32,
                    format!("undecodable payload of {} bytes: {e}", payload.len()),
                ));
            }
            o.next_rank += 1;
        }
        Ok(())
    }

    fn try_complete(&mut self, out: &mut Vec<Action>) {
        let w = self.info.num_workers;
        let complete = matches!(&self.open, Some(o) if o.count == w);
        if !complete {
            return;
        }
        let round = self.current;
        let Some(mut o) = self.open.take() else {
            return;
        };
        let payload = match o.op {
            ReduceOp::Broadcast => o.held[o.aux as usize].take().unwrap_or_default(),
            ReduceOp::Sum => {
                debug_assert_eq!(o.next_rank, w);
                if o.aux != 0 {
                    // Sum pushes carry the round's learning rate (f32 bits; 0 = none set),
                    // which corrected error feedback on the sum needs.
                    self.codec.set_learning_rate(f32::from_bits(o.aux));
                }
                let mut bytes = self.pool.take();
                if let Err(e) = self.codec.encode(&self.acc, round, &mut bytes) {
                    let message = format!(
                        "{}: encoding the sum failed: {e}; the round is aborted for every worker",
                        self.context(round)
                    );
                    self.pool.give_back(bytes);
                    self.abort_current(message, out);
                    return;
                }
                self.pool.freeze(bytes)
            }
        };
        drop(o);
        self.current = self.current.wrapping_add(1);
        out.push(Action::SendResult { round, payload });
    }

    /// A node was lost (`node` is its description, e.g. `worker 2 (10.0.0.5:4000)`, `reason`
    /// what the scheduler observed). Aborts the open round, if any, for every worker naming the
    /// node; every later push to this key is answered with an abort naming it too.
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
}

fn describe_op(op: ReduceOp, aux: u32) -> String {
    match op {
        ReduceOp::Sum if aux == 0 => "op Sum".to_string(),
        ReduceOp::Sum => format!("op Sum (learning rate {})", f32::from_bits(aux)),
        ReduceOp::Broadcast => format!("op Broadcast (root {aux})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::codec::{CodecError, Fp32Codec};

    /// SplitMix64: a tiny deterministic generator, so tests need no extra crate.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        /// Values spread over many magnitudes, so the summation order shows in the bits.
        fn f32(&mut self) -> f32 {
            let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            let e = (self.next() % 16) as i32 - 8;
            (u * 2.0 - 1.0) * 2f32.powi(e)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn seed() -> u64 {
        let s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        println!("seed {s}");
        s
    }

    fn key(w: u32, len: usize) -> KeyRounds {
        key_named("fc1.weight", 3, 77, w, len)
    }

    fn key_named(name: &str, chunk: u32, k: u64, w: u32, len: usize) -> KeyRounds {
        KeyRounds::new(
            KeyInfo {
                tensor: name.into(),
                chunk,
                key: k,
                len,
                num_workers: w,
                priority: 0,
            },
            Box::new(Fp32Codec::new(len)),
        )
    }

    fn enc(x: &[f32]) -> Bytes {
        let mut out = Vec::new();
        Fp32Codec::new(x.len()).encode(x, 0, &mut out).unwrap();
        Bytes::from(out)
    }

    fn dec(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// Rank-order sum computed independently of the codec and the state machine.
    fn reference_sum(data: &[Vec<f32>]) -> Vec<f32> {
        let mut acc = data[0].clone();
        for d in &data[1..] {
            for (a, v) in acc.iter_mut().zip(d) {
                *a += *v;
            }
        }
        acc
    }

    fn random_data(rng: &mut Rng, w: usize, len: usize) -> Vec<Vec<f32>> {
        (0..w)
            .map(|_| (0..len).map(|_| rng.f32()).collect())
            .collect()
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    /// Pushes `data` for `round` in `order`; returns the result payload, checking nothing is
    /// emitted before the last push.
    fn run_round(k: &mut KeyRounds, round: u64, data: &[Vec<f32>], order: &[usize]) -> Bytes {
        for (i, &r) in order.iter().enumerate() {
            let acts = k.push(r as u32, round, ReduceOp::Sum, 0, enc(&data[r]));
            if i + 1 < order.len() {
                assert!(acts.is_empty(), "emitted early: {acts:?}");
            } else {
                match acts.as_slice() {
                    [Action::SendResult {
                        round: got,
                        payload,
                    }] => {
                        assert_eq!(*got, round);
                        return payload.clone();
                    }
                    other => panic!("expected one result, got {other:?}"),
                }
            }
        }
        unreachable!()
    }

    fn permutations(n: usize) -> Vec<Vec<usize>> {
        if n == 0 {
            return vec![vec![]];
        }
        let mut out = Vec::new();
        for p in permutations(n - 1) {
            for i in 0..=p.len() {
                let mut q = p.clone();
                q.insert(i, n - 1);
                out.push(q);
            }
        }
        out
    }

    #[test]
    fn every_arrival_order_of_three_gives_the_rank_order_sum() {
        let mut rng = Rng(seed());
        let len = 1000;
        let data = random_data(&mut rng, 3, len);
        let expected = bits(&reference_sum(&data));
        // Sanity: another summation order differs somewhere, so the test can tell.
        let mut other = data[2].clone();
        for d in [&data[1], &data[0]] {
            for (a, v) in other.iter_mut().zip(d) {
                *a += *v;
            }
        }
        assert_ne!(
            bits(&other),
            expected,
            "data too tame to show summation order"
        );
        let mut k = key(3, len);
        let perms = permutations(3);
        assert_eq!(perms.len(), 6);
        for (round, order) in perms.iter().enumerate() {
            let got = run_round(&mut k, round as u64, &data, order);
            assert_eq!(bits(&dec(&got)), expected, "order {order:?}");
            assert!(!k.is_open());
        }
        assert_eq!(k.current_round(), 6);
    }

    #[test]
    fn random_arrival_orders_of_eight_give_the_rank_order_sum() {
        let mut rng = Rng(seed());
        let len = 513;
        let mut k = key(8, len);
        for round in 0..40u64 {
            let data = random_data(&mut rng, 8, len);
            let expected = bits(&reference_sum(&data));
            let mut order: Vec<usize> = (0..8).collect();
            for i in (1..8).rev() {
                order.swap(i, rng.below(i + 1));
            }
            let got = run_round(&mut k, round, &data, &order);
            assert_eq!(bits(&dec(&got)), expected, "round {round} order {order:?}");
        }
    }

    #[test]
    fn one_worker_completes_at_once() {
        let mut k = key(1, 4);
        let got = run_round(&mut k, 0, &[vec![1.0, 2.0, 3.0, 4.0]], &[0]);
        assert_eq!(dec(&got), vec![1.0, 2.0, 3.0, 4.0]);
    }

    fn expect_abort(acts: &[Action], round: u64, ranks: &[u32]) -> String {
        match acts {
            [Action::SendAbort {
                round: r,
                ranks: rs,
                message,
            }] => {
                assert_eq!(*r, round, "{message}");
                assert_eq!(rs, ranks, "{message}");
                message.clone()
            }
            other => panic!("expected one abort, got {other:?}"),
        }
    }

    #[test]
    fn duplicate_push_aborts_for_everyone_and_late_pushes_get_the_same_abort() {
        let mut k = key(3, 2);
        assert!(k.push(1, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0])).is_empty());
        let acts = k.push(1, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0]));
        let msg = expect_abort(&acts, 0, &[0, 1, 2]);
        for part in [
            "\"fc1.weight\"",
            "chunk 3",
            "key 0x000000000000004d",
            "round 0",
            "rank 1",
            "twice",
        ] {
            assert!(msg.contains(part), "{part} missing: {msg}");
        }
        // Late pushes for round 0 get the same message, only to their sender.
        let late = k.push(2, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0]));
        assert_eq!(expect_abort(&late, 0, &[2]), msg);
        let late = k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0]));
        assert_eq!(expect_abort(&late, 0, &[0]), msg);
        // Round 1 works.
        let data = vec![vec![1.0, 2.0], vec![3.0, 4.0], vec![5.0, 6.0]];
        let got = run_round(&mut k, 1, &data, &[2, 0, 1]);
        assert_eq!(dec(&got), vec![9.0, 12.0]);
    }

    #[test]
    fn a_missing_worker_keeps_the_round_open_until_its_loss_is_reported() {
        let mut k = key(3, 2);
        assert!(k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0])).is_empty());
        assert!(k.push(2, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0])).is_empty());
        assert!(k.is_open());
        assert_eq!(k.open_ranks(), vec![0, 2]);
        let acts = k.node_lost("worker 1 (127.0.0.1:4000)", "no heartbeat for 10.0 s");
        let msg = expect_abort(&acts, 0, &[0, 1, 2]);
        for part in [
            "worker 1 (127.0.0.1:4000)",
            "no heartbeat",
            "key 0x000000000000004d",
            "round 0",
            "chunk 3",
        ] {
            assert!(msg.contains(part), "{part} missing: {msg}");
        }
        assert!(!k.is_open() && k.is_failed());
        // Every later push is answered at once, naming the node.
        let acts = k.push(0, 1, ReduceOp::Sum, 0, enc(&[1.0, 1.0]));
        let msg = expect_abort(&acts, 1, &[0]);
        assert!(
            msg.contains("worker 1 (127.0.0.1:4000)") && msg.contains("round 1"),
            "{msg}"
        );
        // A second report changes nothing.
        assert!(k.node_lost("worker 1 (127.0.0.1:4000)", "again").is_empty());
    }

    #[test]
    fn node_lost_without_an_open_round_emits_nothing() {
        let mut k = key(2, 1);
        assert!(k
            .node_lost("server 1 (127.0.0.1:5)", "connection closed")
            .is_empty());
        let msg = expect_abort(&k.push(1, 0, ReduceOp::Sum, 0, enc(&[1.0])), 0, &[1]);
        assert!(msg.contains("server 1"), "{msg}");
    }

    #[test]
    fn wrong_length_aborts_for_everyone_and_the_next_round_works() {
        for bad_rank in 0..3u32 {
            let mut k = key(3, 4);
            let good = enc(&[1.0; 4]);
            let bad = enc(&[1.0; 3]);
            let mut last = Vec::new();
            // The other ranks push first (held, or summed), then the bad one.
            for r in 0..3u32 {
                if r != bad_rank {
                    assert!(k.push(r, 0, ReduceOp::Sum, 0, good.clone()).is_empty());
                }
            }
            last.extend(k.push(bad_rank, 0, ReduceOp::Sum, 0, bad));
            let msg = expect_abort(&last, 0, &[0, 1, 2]);
            for part in [
                format!("rank {bad_rank}"),
                "12 bytes".to_string(),
                "key 0x000000000000004d".into(),
                "round 0".into(),
                "chunk 3".into(),
                "fc1.weight".into(),
            ] {
                assert!(msg.contains(&part), "{part} missing: {msg}");
            }
            let data = vec![vec![1.0; 4], vec![2.0; 4], vec![3.0; 4]];
            let got = run_round(&mut k, 1, &data, &[1, 2, 0]);
            assert_eq!(dec(&got), vec![6.0; 4]);
        }
    }

    #[test]
    fn a_held_payload_that_fails_to_decode_is_named_when_its_turn_comes() {
        let mut k = key(3, 4);
        // Rank 2's payload is short but arrives first: held until ranks 0 and 1 are in.
        assert!(k.push(2, 0, ReduceOp::Sum, 0, enc(&[1.0; 3])).is_empty());
        assert!(k.push(1, 0, ReduceOp::Sum, 0, enc(&[1.0; 4])).is_empty());
        let acts = k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0; 4]));
        let msg = expect_abort(&acts, 0, &[0, 1, 2]);
        assert!(
            msg.contains("rank 2") && msg.contains("undecodable"),
            "{msg}"
        );
        assert_eq!(k.current_round(), 1);
    }

    #[test]
    fn too_long_payload_is_rejected_on_arrival() {
        let mut k = key(2, 4);
        let acts = k.push(1, 0, ReduceOp::Sum, 0, enc(&[1.0; 5]));
        let msg = expect_abort(&acts, 0, &[0, 1]);
        assert!(msg.contains("20 bytes") && msg.contains("rank 1"), "{msg}");
    }

    #[test]
    fn out_of_range_rank_and_op_mismatch_abort() {
        let mut k = key(2, 1);
        let msg = expect_abort(&k.push(5, 0, ReduceOp::Sum, 0, enc(&[1.0])), 0, &[0, 1]);
        assert!(msg.contains("rank 5 is out of range"), "{msg}");
        assert!(k.push(0, 1, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
        let acts = k.push(1, 1, ReduceOp::Broadcast, 0, Bytes::new());
        let msg = expect_abort(&acts, 1, &[0, 1]);
        assert!(
            msg.contains("rank 1") && msg.contains("Broadcast") && msg.contains("op Sum"),
            "{msg}"
        );
        let got = run_round(&mut k, 2, &[vec![1.0], vec![2.0]], &[1, 0]);
        assert_eq!(dec(&got), vec![3.0]);
    }

    #[test]
    fn broadcast_returns_the_roots_payload() {
        let mut k = key(3, 3);
        let root = enc(&[1.5, -2.0, 7.0]);
        assert!(k
            .push(0, 0, ReduceOp::Broadcast, 1, Bytes::new())
            .is_empty());
        assert!(k
            .push(1, 0, ReduceOp::Broadcast, 1, root.clone())
            .is_empty());
        match k
            .push(2, 0, ReduceOp::Broadcast, 1, Bytes::new())
            .as_slice()
        {
            [Action::SendResult { round: 0, payload }] => assert_eq!(payload, &root),
            other => panic!("{other:?}"),
        }
        // A root mismatch, a non-empty non-root payload and a bad root payload all abort.
        assert!(k
            .push(0, 1, ReduceOp::Broadcast, 1, Bytes::new())
            .is_empty());
        let msg = expect_abort(
            &k.push(2, 1, ReduceOp::Broadcast, 0, Bytes::new()),
            1,
            &[0, 1, 2],
        );
        assert!(msg.contains("root 0") && msg.contains("root 1"), "{msg}");
        let msg = expect_abort(
            &k.push(2, 2, ReduceOp::Broadcast, 0, root.clone()),
            2,
            &[0, 1, 2],
        );
        assert!(msg.contains("non-root") && msg.contains("rank 2"), "{msg}");
        let msg = expect_abort(
            &k.push(0, 3, ReduceOp::Broadcast, 0, enc(&[1.0])),
            3,
            &[0, 1, 2],
        );
        assert!(msg.contains("undecodable broadcast payload"), "{msg}");
        let msg = expect_abort(
            &k.push(0, 4, ReduceOp::Broadcast, 3, Bytes::new()),
            4,
            &[0, 1, 2],
        );
        assert!(msg.contains("root 3 is out of range"), "{msg}");
        // Then sums work again.
        let got = run_round(
            &mut k,
            5,
            &[vec![1.0; 3], vec![1.0; 3], vec![1.0; 3]],
            &[0, 1, 2],
        );
        assert_eq!(dec(&got), vec![3.0; 3]);
    }

    #[test]
    fn many_keys_are_independent() {
        let mut rng = Rng(seed());
        let mut keys: Vec<KeyRounds> = (0..20)
            .map(|i| key_named(&format!("t{i}"), i, 1000 + i as u64, 4, 8 + i as usize))
            .collect();
        let data: Vec<Vec<Vec<f32>>> = keys
            .iter()
            .map(|k| random_data(&mut rng, 4, k.info().len))
            .collect();
        // Abort key 7's round 0 with a duplicate; every other key completes round 0, pushes
        // interleaved across keys in random rank orders.
        let mut schedule: Vec<(usize, u32)> = (0..20)
            .flat_map(|k| (0..4u32).map(move |r| (k, r)))
            .collect();
        for i in (1..schedule.len()).rev() {
            schedule.swap(i, rng.below(i + 1));
        }
        let mut results = vec![None; 20];
        let mut aborted = false;
        for (ki, r) in schedule {
            let mut acts = keys[ki].push(r, 0, ReduceOp::Sum, 0, enc(&data[ki][r as usize]));
            if ki == 7 && !aborted {
                acts = keys[ki].push(r, 0, ReduceOp::Sum, 0, enc(&data[ki][r as usize]));
                aborted = true;
                expect_abort(&acts, 0, &[0, 1, 2, 3]);
                continue;
            }
            for a in acts {
                match a {
                    Action::SendResult { round: 0, payload } => results[ki] = Some(payload),
                    Action::SendAbort { ranks, .. } => {
                        assert!(ki == 7 && ranks.len() == 1, "key {ki}: {ranks:?}")
                    }
                    other => panic!("key {ki}: {other:?}"),
                }
            }
        }
        for (ki, res) in results.iter().enumerate() {
            if ki == 7 {
                assert!(res.is_none());
            } else {
                let got = res
                    .as_ref()
                    .unwrap_or_else(|| panic!("key {ki} incomplete"));
                assert_eq!(bits(&dec(got)), bits(&reference_sum(&data[ki])));
            }
            assert_eq!(keys[ki].current_round(), 1);
        }
    }

    #[test]
    fn a_push_ahead_skips_the_round_it_abandons() {
        let mut k = key(3, 1);
        // Ranks 0 and 1 push round 0; rank 2 gave up on round 0 and pushes round 1.
        assert!(k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
        assert!(k.push(1, 0, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
        let acts = k.push(2, 1, ReduceOp::Sum, 0, enc(&[3.0]));
        let msg = expect_abort(&acts, 0, &[0, 1, 2]);
        assert!(
            msg.contains("rank 2 pushed round 1") && msg.contains("round 0"),
            "{msg}"
        );
        assert_eq!(k.current_round(), 1);
        assert_eq!(k.open_ranks(), vec![2]);
        // Round 1 completes with the held push.
        assert!(k.push(1, 1, ReduceOp::Sum, 0, enc(&[2.0])).is_empty());
        match k.push(0, 1, ReduceOp::Sum, 0, enc(&[1.0])).as_slice() {
            [Action::SendResult { round: 1, payload }] => assert_eq!(dec(payload), vec![6.0]),
            other => panic!("{other:?}"),
        }
        // Skipping several rounds remembers all of them.
        assert!(k.push(0, 5, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
        for round in 2..5 {
            let late = k.push(1, round, ReduceOp::Sum, 0, enc(&[1.0]));
            let msg = expect_abort(&late, round, &[1]);
            assert!(msg.contains("rounds 2..=4 are skipped"), "{msg}");
        }
    }

    #[test]
    fn a_push_far_ahead_is_rejected() {
        let mut k = key(2, 1);
        let acts = k.push(1, u64::MAX, ReduceOp::Sum, 0, enc(&[1.0]));
        assert_eq!(acts.len(), 2, "{acts:?}");
        match &acts[0] {
            Action::SendAbort {
                round,
                ranks,
                message,
            } => {
                assert_eq!((*round, ranks.as_slice()), (u64::MAX, &[1][..]));
                assert!(message.contains("rounds ahead"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        expect_abort(&acts[1..], 0, &[0, 1]);
        let got = run_round(&mut k, 1, &[vec![1.0], vec![2.0]], &[0, 1]);
        assert_eq!(dec(&got), vec![3.0]);
    }

    #[test]
    fn a_stale_round_is_rejected_and_its_sender_told() {
        let mut k = key(2, 1);
        run_round(&mut k, 0, &[vec![1.0], vec![1.0]], &[0, 1]);
        assert!(k.push(1, 1, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
        let acts = k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0]));
        assert_eq!(acts.len(), 2, "{acts:?}");
        match &acts[0] {
            Action::SendAbort {
                round: 0,
                ranks,
                message,
            } => {
                assert_eq!(ranks, &[0]);
                assert!(message.contains("round 0 is over"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        expect_abort(&acts[1..], 1, &[0, 1]);
        assert_eq!(k.current_round(), 2);
    }

    #[test]
    fn shell_rejections_abort_like_bad_pushes() {
        let mut k = key(2, 1);
        assert!(k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
        let msg = expect_abort(
            &k.reject(1, 0, "truncated frame payload: 2 of 4 bytes"),
            0,
            &[0, 1],
        );
        assert!(msg.contains("rank 1") && msg.contains("truncated"), "{msg}");
        // Rejecting a push for an aborted round just repeats the abort.
        assert_eq!(expect_abort(&k.reject(0, 0, "whatever"), 0, &[0]), msg);
    }

    /// A codec whose encode fails: the round is aborted, not lost.
    struct FailingEncode(Fp32Codec);
    impl ChunkCodec for FailingEncode {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn max_encoded_len(&self) -> usize {
            self.0.max_encoded_len()
        }
        fn encode(&mut self, _: &[f32], _: u64, _: &mut Vec<u8>) -> Result<(), CodecError> {
            Err(CodecError("out of ideas".into()))
        }
        fn decode(&self, p: &[u8], r: u64, o: &mut [f32]) -> Result<(), CodecError> {
            self.0.decode(p, r, o)
        }
        fn decode_add(&self, p: &[u8], r: u64, a: &mut [f32]) -> Result<(), CodecError> {
            self.0.decode_add(p, r, a)
        }
    }

    #[test]
    fn an_encode_failure_aborts_the_round() {
        let info = KeyInfo {
            tensor: "t".into(),
            chunk: 0,
            key: 9,
            len: 1,
            num_workers: 1,
            priority: 0,
        };
        let mut k = KeyRounds::new(info, Box::new(FailingEncode(Fp32Codec::new(1))));
        let msg = expect_abort(&k.push(0, 0, ReduceOp::Sum, 0, enc(&[1.0])), 0, &[0]);
        assert!(
            msg.contains("out of ideas") && msg.contains("key 0x0000000000000009"),
            "{msg}"
        );
        assert_eq!(k.current_round(), 1);
    }
}
#[cfg(test)]
mod perf {
    use super::*;
    use common::codec::Fp32Codec;

    /// Time of one W=2 round of a 4 MB chunk through the state machine (run with
    /// `--ignored --nocapture`; the numbers depend on the profile).
    #[test]
    #[ignore]
    fn state_machine_round_time() {
        let len = 1_024_000;
        let mut k = KeyRounds::new(
            KeyInfo {
                tensor: "t".into(),
                chunk: 0,
                key: 1,
                len,
                num_workers: 2,
                priority: 0,
            },
            Box::new(Fp32Codec::new(len)),
        );
        let mut p = Vec::new();
        Fp32Codec::new(len)
            .encode(&vec![1.5f32; len], 0, &mut p)
            .unwrap();
        let p = Bytes::from(p);
        let n = 20;
        let start = std::time::Instant::now();
        for round in 0..n {
            assert!(k.push(1, round, ReduceOp::Sum, 0, p.clone()).is_empty());
            assert_eq!(k.push(0, round, ReduceOp::Sum, 0, p.clone()).len(), 1);
        }
        println!(
            "{:.2} ms per round",
            start.elapsed().as_secs_f64() * 1e3 / n as f64
        );
    }
}
