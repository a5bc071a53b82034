//! [`SchedulerStats`]: what the scheduler knows of its nodes' liveness and QUIC's counters of
//! its connections, published by the shell when nodes connect, leave or are welcomed, else at
//! most every heartbeat interval / 4 (its tick), for a reader such as a Prometheus endpoint.
//! The state machine knows nothing of it.

use std::sync::{Arc, Mutex};

use crate::state::Liveness;

/// A handle to a scheduler's published counters ([`crate::Scheduler::stats`]); a cheap
/// `Clone`.
#[derive(Clone, Default)]
pub struct SchedulerStats {
    inner: Arc<Mutex<Published>>,
}

/// What the shell published last.
#[derive(Default)]
pub(crate) struct Published {
    pub(crate) nodes: Vec<Liveness>,
    /// Each welcomed node's open connection.
    pub(crate) conns: Vec<(String, quinn::Connection)>,
}

impl std::fmt::Debug for SchedulerStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerStats").finish_non_exhaustive()
    }
}

/// What [`SchedulerStats::snapshot`] returns.
#[derive(Debug, Clone, Default)]
pub struct SchedulerSnapshot {
    /// Each welcomed node's heartbeat record, as last published.
    pub nodes: Vec<Liveness>,
    /// The open connections of welcomed nodes (`server 0`, `worker 1`) and QUIC's counters of
    /// each, read at the time of the snapshot.
    pub connections: Vec<(String, quinn::ConnectionStats)>,
}

impl SchedulerStats {
    /// The last published record, with each connection's counters read now.
    pub fn snapshot(&self) -> SchedulerSnapshot {
        let g = lock(&self.inner);
        SchedulerSnapshot {
            nodes: g.nodes.clone(),
            connections: g
                .conns
                .iter()
                .map(|(n, c)| (n.clone(), c.stats()))
                .collect(),
        }
    }

    pub(crate) fn publish(&self, p: Published) {
        *lock(&self.inner) = p;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
