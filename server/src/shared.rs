//! The state every task of a running server shares ([`Shared`]: its settings, the key table,
//! each key's counters, the worker connections by rank, the one send queue for results and
//! aborts) and the sending half of the data plane: a worker's connection ([`WorkerConn`]) and
//! the carrying out of a key's [`Action`]s as frames to the ranks they name
//! ([`Shared::execute`]). The receiving half (connections, streams, incoming frames) is
//! `crate::data`; the state frames of a checkpoint are `crate::checkpoint`.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use pushpull_net::sender::{FrameSender, OnError, Peer};
use pushpull_net::transport::TransportError;
use pushpull_proto::pool::BufPool;
use pushpull_proto::protocol::{max_payload_len, FrameFlags, FrameHeader, FrameKind, ReduceOp};
use pushpull_proto::sendq::Flow;
use pushpull_proto::Config;
use tracing::debug;

use crate::rounds::{Action, KeyRounds};
use crate::stats::{KeyStats, RunningServer};

/// Idle capacity the pool of result payload buffers keeps.
pub(crate) const RESULT_POOL_BYTES: usize = 128 << 20;

/// A frame to send: kind and flags, key, round, payload.
pub(crate) type OutFrame = ((FrameKind, FrameFlags), u64, u64, Bytes);

/// Priority of abort frames: before any result.
pub(crate) const ABORT_PRIORITY: i32 = i32::MAX;

/// A worker's data connection.
#[derive(Clone)]
pub(crate) struct WorkerConn {
    /// The connection and `worker R (addr)`.
    pub(crate) peer: Peer,
    /// Sends results and aborts, the server's one queue for every worker.
    pub(crate) sender: FrameSender,
}

impl WorkerConn {
    /// Queues one frame for worker `rank`.
    pub(crate) fn send(
        &self,
        rank: u32,
        ((kind, flags), key, round, payload): OutFrame,
        priority: i32,
    ) {
        let header = FrameHeader {
            kind,
            op: ReduceOp::Sum,
            flags,
            rank,
            aux: 0,
            key,
            round,
            payload_len: payload.len() as u64,
        };
        self.sender.send(&self.peer, header, payload, priority);
    }
}

/// A result frame's kind and flags (non-finite or not).
fn result(non_finite: bool) -> (FrameKind, FrameFlags) {
    let flags = FrameFlags {
        non_finite,
        ..FrameFlags::default()
    };
    (FrameKind::Result, flags)
}

/// An abort frame's kind and flags.
pub(crate) fn abort() -> (FrameKind, FrameFlags) {
    (FrameKind::Abort, FrameFlags::default())
}

/// State shared by every task of a running server.
pub(crate) struct Shared {
    pub(crate) num_workers: u32,
    /// `cluster.local_size`: workers per host (see [`crate::rounds::KeyInfo::local_size`]).
    pub(crate) local_size: u32,
    pub(crate) max_payload: u64,
    pub(crate) heartbeat_timeout: Duration,
    /// `tls.check_roles`: a worker's certificate must grant the rank its `Hello` claims.
    pub(crate) check_roles: bool,
    /// Connections that have not sent their `Hello` yet (capped, see
    /// [`serve_worker`](crate::data::serve_worker)).
    pub(crate) awaiting_hello: AtomicUsize,
    pub(crate) server_id: OnceLock<u32>,
    pub(crate) keys: DashMap<u64, Arc<Mutex<KeyRounds>>>,
    /// Each key's counters (`crate::stats`), inserted with the key.
    pub(crate) key_stats: DashMap<u64, Arc<KeyStats>>,
    /// Data connections by rank.
    pub(crate) workers: RwLock<Vec<Option<WorkerConn>>>,
    /// Sends every result and abort in priority order within `cluster.send_window_bytes`.
    pub(crate) sender: FrameSender,
    /// Buffers for encoded results.
    pub(crate) pool: Arc<BufPool>,
}

impl Shared {
    /// The state and the driver of its [`FrameSender`] (spawn it).
    pub(crate) fn new(
        config: &Config,
    ) -> (
        Shared,
        impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let w = config.cluster.num_workers;
        let on_error: OnError = Box::new(|peer: &Peer, e: TransportError| {
            // The worker's connection failed: the scheduler reports the worker lost.
            debug!("sending to {} failed: {e}", peer.name);
        });
        let (sender, driver) = FrameSender::new(
            config.cluster.send_window_bytes,
            Flow::Reply,
            None,
            on_error,
        );
        let shared = Shared {
            num_workers: w,
            local_size: config.cluster.local_size,
            max_payload: max_payload_len(config.cluster.partition_bytes),
            heartbeat_timeout: config.heartbeat_timeout(),
            check_roles: config.tls.check_roles,
            awaiting_hello: AtomicUsize::new(0),
            server_id: OnceLock::new(),
            keys: DashMap::new(),
            key_stats: DashMap::new(),
            workers: RwLock::new(vec![None; w as usize]),
            sender,
            pool: BufPool::new(RESULT_POOL_BYTES),
        };
        (shared, driver)
    }

    pub(crate) fn id_str(&self) -> String {
        match self.server_id.get() {
            Some(id) => format!("server {id}"),
            None => "this server".to_string(),
        }
    }

    pub(crate) fn worker(&self, rank: u32) -> Option<WorkerConn> {
        let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
        w.get(rank as usize).cloned().flatten()
    }

    /// Aborts every open round naming `node`; every later push is refused naming it.
    pub(crate) fn node_lost(self: &Arc<Self>, node: &str, reason: &str) {
        self.for_each_key(|k| k.node_lost(node, reason));
    }

    /// Worker `rank` finished and closed its connection: rounds that need its pushes fail,
    /// naming it ([`KeyRounds::worker_left`]).
    pub(crate) fn worker_left(self: &Arc<Self>, rank: u32, node: &str) {
        self.for_each_key(|k| k.worker_left(rank, node));
    }

    /// Runs `event` on every key's state machine, one key locked at a time, and carries out
    /// the actions each returns.
    fn for_each_key(self: &Arc<Self>, event: impl Fn(&mut KeyRounds) -> Vec<Action>) {
        let keys: Vec<(u64, Arc<Mutex<KeyRounds>>)> = self
            .keys
            .iter()
            .map(|e| (*e.key(), e.value().clone()))
            .collect();
        for (key, k) in keys {
            let (priority, actions) = {
                let mut k = k.lock().unwrap_or_else(|e| e.into_inner());
                (k.info().priority, event(&mut k))
            };
            self.execute(key, priority, actions);
        }
    }

    /// Carries out a state machine's actions for `key`, each to the ranks it names, whose
    /// results go out at `priority` (aborts, small and urgent, always at the highest).
    pub(crate) fn execute(self: &Arc<Self>, key: u64, priority: i32, actions: Vec<Action>) {
        let stats = || self.key_stats.get(&key).map(|e| e.value().clone());
        for action in actions {
            match action {
                Action::SendResult {
                    round,
                    ranks,
                    payload,
                } => {
                    if let Some(s) = stats() {
                        KeyStats::add(&s.rounds, 1);
                        KeyStats::add(&s.bytes_sent, payload.len() as u64 * ranks.len() as u64);
                    }
                    for rank in ranks {
                        let frame = (result(false), key, round, payload.clone());
                        self.send_to_rank(rank, frame, priority);
                    }
                }
                Action::SendEach { round, results } => {
                    if let Some(s) = stats() {
                        KeyStats::add(&s.rounds, 1);
                        let sent = results.iter().map(|(_, p)| p.len() as u64).sum();
                        KeyStats::add(&s.bytes_sent, sent);
                    }
                    for (rank, payload) in results {
                        self.send_to_rank(rank, (result(false), key, round, payload), priority);
                    }
                }
                Action::SendNonFinite { round, ranks } => {
                    if let Some(s) = stats() {
                        KeyStats::add(&s.rounds, 1);
                    }
                    debug!(key, round, "non-finite sum");
                    for rank in ranks {
                        self.send_to_rank(rank, (result(true), key, round, Bytes::new()), priority);
                    }
                }
                Action::SendAbort {
                    round,
                    ranks,
                    message,
                } => {
                    debug!(key, round, ?ranks, "abort: {message}");
                    let payload = Bytes::from(message);
                    for rank in ranks {
                        let frame = (abort(), key, round, payload.clone());
                        self.send_to_rank(rank, frame, ABORT_PRIORITY);
                    }
                }
            }
        }
    }

    pub(crate) fn send_to_rank(self: &Arc<Self>, rank: u32, frame: OutFrame, priority: i32) {
        match self.worker(rank) {
            Some(w) => w.send(rank, frame, priority),
            None => debug!(
                rank,
                key = frame.1,
                round = frame.2,
                kind = ?frame.0 .0,
                "worker not connected; frame dropped"
            ),
        }
    }

    /// Waits (at most `limit`) until every frame queued for a worker was handed to QUIC.
    pub(crate) async fn flush(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, self.sender.flushed()).await;
    }
}

impl RunningServer for Shared {
    fn server_id(&self) -> Option<u32> {
        self.server_id.get().copied()
    }

    fn key_stats(&self) -> &DashMap<u64, Arc<KeyStats>> {
        &self.key_stats
    }

    fn worker_connections(&self) -> Vec<(String, quinn::ConnectionStats)> {
        let workers = self.workers.read().unwrap_or_else(|e| e.into_inner());
        let mut connections = Vec::new();
        for (rank, w) in workers.iter().enumerate() {
            if let Some(w) = w {
                connections.push((format!("worker {rank}"), w.peer.conn.stats()));
            }
        }
        connections
    }
}
