//! The `pushpull_quic_*` families: quinn's counters of each of a node's connections, labelled
//! by `peer` (`scheduler`, `server 0`, `worker 1`). Lost packets are the ones quinn declared
//! lost; their frames are sent again, so they count the retransmissions too.

use crate::families::{Families, Labels};

/// Adds the QUIC families of `conns` (peer name, quinn's counters) to `out`.
pub fn add_connections(out: &mut Families, conns: &[(String, quinn::ConnectionStats)]) {
    let per = |f: &dyn Fn(&quinn::ConnectionStats) -> f64| -> Vec<(Labels, f64)> {
        conns
            .iter()
            .map(|(peer, s)| (vec![("peer", peer.clone())], f(s)))
            .collect()
    };
    out.counter(
        "pushpull_quic_lost_packets_total",
        "QUIC packets declared lost on the connection to the peer (their frames are retransmitted).",
        per(&|s| s.path.lost_packets as f64),
    );
    out.counter(
        "pushpull_quic_lost_bytes_total",
        "Bytes of the QUIC packets declared lost on the connection to the peer.",
        per(&|s| s.path.lost_bytes as f64),
    );
    out.counter(
        "pushpull_quic_sent_packets_total",
        "QUIC packets sent to the peer.",
        per(&|s| s.path.sent_packets as f64),
    );
    out.counter(
        "pushpull_quic_congestion_events_total",
        "Congestion events (window reductions) on the connection to the peer.",
        per(&|s| s.path.congestion_events as f64),
    );
    out.counter(
        "pushpull_quic_sent_datagrams_total",
        "UDP datagrams sent to the peer.",
        per(&|s| s.udp_tx.datagrams as f64),
    );
    out.counter(
        "pushpull_quic_received_datagrams_total",
        "UDP datagrams received from the peer.",
        per(&|s| s.udp_rx.datagrams as f64),
    );
    out.counter(
        "pushpull_quic_sent_bytes_total",
        "UDP payload bytes sent to the peer (QUIC and TLS overhead included).",
        per(&|s| s.udp_tx.bytes as f64),
    );
    out.counter(
        "pushpull_quic_received_bytes_total",
        "UDP payload bytes received from the peer.",
        per(&|s| s.udp_rx.bytes as f64),
    );
    out.gauge(
        "pushpull_quic_rtt_seconds",
        "quinn's current round-trip time estimate to the peer.",
        per(&|s| s.path.rtt.as_secs_f64()),
    );
    out.gauge(
        "pushpull_quic_congestion_window_bytes",
        "The congestion window of the connection to the peer.",
        per(&|s| s.path.cwnd as f64),
    );
}
