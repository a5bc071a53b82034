//! The server's families, read from [`ServerStats::snapshot`] at scrape time. "Pushed" bytes
//! are what workers pushed to this server, "pulled" what they pulled from it (results, one
//! copy per worker), so that the sums over servers match the sums over workers.

use std::sync::Arc;

use crate::{ServerStats, ServerTensorStats};

use pushpull_metrics::families::{Families, Labels};
use pushpull_metrics::http::{serve, MetricsEndpoint, Source};

/// A server as a metrics [`Source`].
#[derive(Debug, Clone)]
pub struct ServerSource {
    stats: ServerStats,
}

/// Serves the metrics of the server whose counters are `stats` at `addr` (see [`serve`]).
pub fn serve_server(
    addr: std::net::SocketAddr,
    stats: ServerStats,
) -> std::io::Result<MetricsEndpoint> {
    serve(addr, Arc::new(ServerSource { stats }))
}

impl Source for ServerSource {
    fn node_labels(&self) -> Vec<(&'static str, String)> {
        let id = self.stats.snapshot().id;
        vec![
            ("role", "server".into()),
            ("id", id.map_or_else(String::new, |i| i.to_string())),
        ]
    }

    fn collect(&self, out: &mut Families) {
        let s = self.stats.snapshot();
        let per = |f: &dyn Fn(&ServerTensorStats) -> u64| -> Vec<(Labels, f64)> {
            s.tensors
                .iter()
                .map(|(name, t)| (vec![("tensor", name.clone())], f(t) as f64))
                .collect()
        };
        let total = |f: &dyn Fn(&ServerTensorStats) -> u64| -> Vec<(Labels, f64)> {
            vec![(vec![], s.tensors.values().map(f).sum::<u64>() as f64)]
        };
        out.gauge(
            "pushpull_tensor_keys",
            "Keys (chunks) of the tensor held by this server.",
            per(&|t| t.keys),
        );
        out.counter(
            "pushpull_key_rounds_total",
            "Rounds completed, summed over the keys held (a round of a tensor with two keys here counts twice).",
            total(&|t| t.key_rounds),
        );
        out.counter(
            "pushpull_tensor_key_rounds_total",
            "Rounds of the tensor completed, summed over its keys held here.",
            per(&|t| t.key_rounds),
        );
        out.counter(
            "pushpull_pushed_bytes_total",
            "Payload bytes the workers pushed to this server, all tensors.",
            total(&|t| t.bytes_received),
        );
        out.counter(
            "pushpull_tensor_pushed_bytes_total",
            "Payload bytes of the tensor the workers pushed to this server.",
            per(&|t| t.bytes_received),
        );
        out.counter(
            "pushpull_pulled_bytes_total",
            "Payload bytes of results this server sent to the workers, all tensors.",
            total(&|t| t.bytes_sent),
        );
        out.counter(
            "pushpull_tensor_pulled_bytes_total",
            "Payload bytes of the tensor's results this server sent to the workers.",
            per(&|t| t.bytes_sent),
        );
        pushpull_metrics::quic::add_connections(out, &s.connections);
    }
}
