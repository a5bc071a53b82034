//! pushpull's opt-in Prometheus endpoint: each node (scheduler, server, worker) may serve its
//! counters as Prometheus text over HTTP (`GET /metrics`) at `[metrics] listen` or the
//! node's `--metrics ADDR` (`PUSHPULL_METRICS` for a Python worker). Nothing is counted for
//! it: a scrape reads the counters the roles keep anyway and quinn's counters of each
//! connection, and renders them with the `prometheus` crate's text encoder. The HTTP side is
//! hyper's. This crate knows no role: each role's crate turns its counters into families
//! (`pushpull_worker::prometheus`, `pushpull_server::prometheus`,
//! `pushpull_scheduler::prometheus`, each a [`Source`]), so a node links only its own.
//!
//! | module | what it holds |
//! |---|---|
//! | [`families`] | [`Families`]: the metric families of one scrape, built from plain numbers (counters, gauges, histograms from cumulative buckets), and their text rendering |
//! | [`http`] | [`serve`]: the HTTP listener ([`MetricsEndpoint`]), what a request gets (`/metrics` or `/`: the text; anything else: 404) |
//! | [`quic`] | the `pushpull_quic_*` families from quinn's `ConnectionStats`, per peer |
//!
//! Metric names and labels are listed in docs/observability.md ("Metrics").

#![warn(missing_docs)]

pub mod families;
pub mod http;
pub mod quic;

pub use families::{Families, Labels};
pub use http::{serve, MetricsEndpoint, Source};

/// The line prefix a node prints once its endpoint is bound: `pushpull-ROLE metrics on
/// ADDR` (the address a scrape should use; the real port when the configured one was 0).
pub fn metrics_line(program: &str, addr: std::net::SocketAddr) -> String {
    format!("{program} metrics on {addr}")
}

/// The address to serve on: `flag` (a node's `--metrics ADDR` or `PUSHPULL_METRICS`) over
/// `[metrics] listen`; None when neither is set. The error names `what` (the flag, the
/// variable or the key) and the value.
pub fn listen_addr(
    flag: Option<(&str, &str)>,
    config: &pushpull_proto::Config,
) -> Result<Option<std::net::SocketAddr>, String> {
    let (what, value) = match (flag, &config.metrics.listen) {
        (Some((what, v)), _) => (what, v),
        (None, Some(v)) => ("metrics.listen", v.as_str()),
        (None, None) => return Ok(None),
    };
    pushpull_proto::config::parse_addr(value)
        .map(Some)
        .map_err(|allowed| format!("{what} {value:?}: {allowed}"))
}

/// A node's `peer` label: `scheduler`, `server 0`, `worker 1` (no address: it may change
/// when a node rejoins).
pub fn peer_label(name: &pushpull_proto::NodeName) -> String {
    match name.role {
        pushpull_proto::NodeRole::Scheduler => "scheduler".to_string(),
        role => format!("{role} {}", name.id),
    }
}
