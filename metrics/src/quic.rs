//! The `pushpull_quic_*` families: quinn's counters of each of a node's connections, labelled
//! by `peer` (`scheduler`, `server 0`, `worker 1`). Lost packets are the ones quinn declared
//! lost; their frames are sent again, so they count the retransmissions too.

use crate::families::{Families, Labels};

/// A family: its name, help and the value of one connection's counters.
type Family = (
    &'static str,
    &'static str,
    fn(&quinn::ConnectionStats) -> f64,
);

/// The counters: quinn's totals of each connection.
const COUNTERS: &[Family] = &[
    (
        "pushpull_quic_lost_packets_total",
        "QUIC packets declared lost on the connection to the peer (their frames are retransmitted).",
        |s| s.path.lost_packets as f64,
    ),
    (
        "pushpull_quic_lost_bytes_total",
        "Bytes of the QUIC packets declared lost on the connection to the peer.",
        |s| s.path.lost_bytes as f64,
    ),
    (
        "pushpull_quic_sent_packets_total",
        "QUIC packets sent to the peer.",
        |s| s.path.sent_packets as f64,
    ),
    (
        "pushpull_quic_congestion_events_total",
        "Congestion events (window reductions) on the connection to the peer.",
        |s| s.path.congestion_events as f64,
    ),
    (
        "pushpull_quic_sent_datagrams_total",
        "UDP datagrams sent to the peer.",
        |s| s.udp_tx.datagrams as f64,
    ),
    (
        "pushpull_quic_received_datagrams_total",
        "UDP datagrams received from the peer.",
        |s| s.udp_rx.datagrams as f64,
    ),
    (
        "pushpull_quic_sent_bytes_total",
        "UDP payload bytes sent to the peer (QUIC and TLS overhead included).",
        |s| s.udp_tx.bytes as f64,
    ),
    (
        "pushpull_quic_received_bytes_total",
        "UDP payload bytes received from the peer.",
        |s| s.udp_rx.bytes as f64,
    ),
];

/// The gauges: quinn's current estimates of each connection.
const GAUGES: &[Family] = &[
    (
        "pushpull_quic_rtt_seconds",
        "quinn's current round-trip time estimate to the peer.",
        |s| s.path.rtt.as_secs_f64(),
    ),
    (
        "pushpull_quic_congestion_window_bytes",
        "The congestion window of the connection to the peer.",
        |s| s.path.cwnd as f64,
    ),
];

/// Adds the QUIC families of `conns` (peer name, quinn's counters) to `out`.
pub fn add_connections(out: &mut Families, conns: &[(String, quinn::ConnectionStats)]) {
    let per = |f: fn(&quinn::ConnectionStats) -> f64| -> Vec<(Labels, f64)> {
        conns
            .iter()
            .map(|(peer, s)| (vec![("peer", peer.clone())], f(s)))
            .collect()
    };
    for &(name, help, value) in COUNTERS {
        out.counter(name, help, per(value));
    }
    for &(name, help, value) in GAUGES {
        out.gauge(name, help, per(value));
    }
}
