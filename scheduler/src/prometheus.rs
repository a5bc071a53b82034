//! The scheduler's families, read from [`SchedulerStats::snapshot`] at scrape time (liveness
//! as the scheduler last published it, at most a quarter heartbeat interval ago while it runs).

use std::sync::Arc;

use crate::SchedulerStats;

use pushpull_metrics::families::{Families, Labels};
use pushpull_metrics::http::{serve, MetricsEndpoint, Source};

/// A scheduler as a metrics [`Source`].
#[derive(Debug, Clone)]
pub struct SchedulerSource {
    stats: SchedulerStats,
}

/// Serves the metrics of the scheduler whose counters are `stats` at `addr` (see [`serve`]).
pub fn serve_scheduler(
    addr: std::net::SocketAddr,
    stats: SchedulerStats,
) -> std::io::Result<MetricsEndpoint> {
    serve(addr, Arc::new(SchedulerSource { stats }))
}

impl Source for SchedulerSource {
    fn node_labels(&self) -> Vec<(&'static str, String)> {
        vec![("role", "scheduler".into())]
    }

    fn collect(&self, out: &mut Families) {
        let s = self.stats.snapshot();
        let per = |f: &dyn Fn(&crate::Liveness) -> f64| -> Vec<(Labels, f64)> {
            s.nodes
                .iter()
                .map(|n| (vec![("peer", pushpull_metrics::peer_label(&n.name))], f(n)))
                .collect()
        };
        out.gauge(
            "pushpull_nodes",
            "Nodes welcomed into the job (servers and workers).",
            [(vec![], s.nodes.len() as f64)],
        );
        out.counter(
            "pushpull_missed_heartbeats_total",
            "Heartbeat ticks at which the node had been silent for more than two heartbeat intervals.",
            per(&|n| n.missed_heartbeats as f64),
        );
        out.gauge(
            "pushpull_peer_silence_seconds",
            "Seconds since the scheduler last heard from the node (as last published).",
            per(&|n| n.silent.as_secs_f64()),
        );
        out.gauge(
            "pushpull_peer_up",
            "1 while the node's connection is open and it has not finished, else 0.",
            per(&|n| f64::from(u8::from(!n.disconnected && !n.finished))),
        );
        pushpull_metrics::quic::add_connections(out, &s.connections);
    }
}
