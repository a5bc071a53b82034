//! [`ServerStats`]: what a running server has done, read at any time (e.g. by a Prometheus
//! endpoint at scrape time) from the counters the data plane keeps per key and from quinn's
//! counters of the server's connections. Counting is a few relaxed atomic adds per frame; the
//! per-key state machines ([`crate::rounds`]) know nothing of it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use dashmap::DashMap;

/// One key's counters, kept by the data plane.
#[derive(Debug)]
pub(crate) struct KeyStats {
    /// The tensor the key is a chunk of.
    pub(crate) tensor: Arc<str>,
    /// Payload bytes of the pushes received for the key.
    pub(crate) bytes_received: AtomicU64,
    /// Payload bytes of the results sent for the key (once per rank sent to).
    pub(crate) bytes_sent: AtomicU64,
    /// Rounds of the key completed (a result, finite or not, sent).
    pub(crate) rounds: AtomicU64,
}

impl KeyStats {
    pub(crate) fn new(tensor: &str) -> KeyStats {
        KeyStats {
            tensor: tensor.into(),
            bytes_received: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
        }
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// What [`ServerStats::snapshot`] reads from a running server. The server's shared state
/// (`Shared`, in `crate::shared`, which holds the key table of [`KeyStats`]) implements it, so
/// this file needs nothing of that state's type.
pub(crate) trait RunningServer: Send + Sync {
    /// The id the scheduler gave the server (None before its `Welcome`).
    fn server_id(&self) -> Option<u32>;
    /// Each key's counters, by key.
    fn key_stats(&self) -> &DashMap<u64, Arc<KeyStats>>;
    /// QUIC's counters of each worker's open data connection, named `worker R`, by rank.
    fn worker_connections(&self) -> Vec<(String, quinn::ConnectionStats)>;
}

/// A handle to a server's counters ([`crate::Server::stats`]); a cheap `Clone`, valid before,
/// during and after [`crate::Server::run`] (empty before it, frozen after it).
#[derive(Clone, Default)]
pub struct ServerStats {
    inner: Arc<StatsInner>,
}

#[derive(Default)]
struct StatsInner {
    /// The running server's state, set by `run`.
    running: OnceLock<Weak<dyn RunningServer>>,
    /// The last snapshot taken while the server ran (kept once it has stopped).
    last: Mutex<Option<ServerSnapshot>>,
    /// The connection to the scheduler, once dialled.
    scheduler: Mutex<Option<quinn::Connection>>,
}

impl std::fmt::Debug for ServerStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerStats").finish_non_exhaustive()
    }
}

/// One tensor's counters on one server: the sums over the tensor's keys (chunks) it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerTensorStats {
    /// Keys (chunks) of the tensor held here.
    pub keys: u64,
    /// Rounds completed, summed over the keys (a round of a tensor of two chunks held here
    /// counts twice).
    pub key_rounds: u64,
    /// Payload bytes of the workers' pushes received.
    pub bytes_received: u64,
    /// Payload bytes of the results sent to workers.
    pub bytes_sent: u64,
}

/// What [`ServerStats::snapshot`] returns.
#[derive(Debug, Clone, Default)]
pub struct ServerSnapshot {
    /// The id the scheduler gave this server (None before its Welcome).
    pub id: Option<u32>,
    /// Per tensor, by name.
    pub tensors: BTreeMap<String, ServerTensorStats>,
    /// QUIC's counters of each open connection: the scheduler's (`scheduler`) and each
    /// worker's (`worker R`).
    pub connections: Vec<(String, quinn::ConnectionStats)>,
}

impl ServerStats {
    /// Attaches the running server's state (by `run`).
    pub(crate) fn attach<R: RunningServer + 'static>(&self, running: &Arc<R>) {
        let running: Weak<R> = Arc::downgrade(running);
        let _ = self.inner.running.set(running);
    }

    /// Records the connection to the scheduler (by `run`).
    pub(crate) fn set_scheduler(&self, conn: &quinn::Connection) {
        *lock(&self.inner.scheduler) = Some(conn.clone());
    }

    /// The counters now: per tensor, and each connection's QUIC counters. After the server
    /// stopped, the last snapshot taken while it ran, with the connections' final counters.
    pub fn snapshot(&self) -> ServerSnapshot {
        let Some(running) = self.inner.running.get().and_then(Weak::upgrade) else {
            let mut last = lock(&self.inner.last).clone().unwrap_or_default();
            if let Some(c) = lock(&self.inner.scheduler).as_ref() {
                last.connections.retain(|(p, _)| p != "scheduler");
                last.connections.insert(0, ("scheduler".into(), c.stats()));
            }
            return last;
        };
        let mut tensors: BTreeMap<String, ServerTensorStats> = BTreeMap::new();
        for e in running.key_stats().iter() {
            let s = e.value();
            let t = tensors.entry(s.tensor.to_string()).or_default();
            t.keys += 1;
            t.key_rounds += s.rounds.load(Ordering::Relaxed);
            t.bytes_received += s.bytes_received.load(Ordering::Relaxed);
            t.bytes_sent += s.bytes_sent.load(Ordering::Relaxed);
        }
        let mut connections = Vec::new();
        if let Some(c) = lock(&self.inner.scheduler).as_ref() {
            connections.push(("scheduler".to_string(), c.stats()));
        }
        connections.extend(running.worker_connections());
        let snap = ServerSnapshot {
            id: running.server_id(),
            tensors,
            connections,
        };
        *lock(&self.inner.last) = Some(snap.clone());
        snap
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
