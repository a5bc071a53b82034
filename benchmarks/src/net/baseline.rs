//! What moving bytes costs without pushpull, on the same shaped network: the CPU per gigabyte
//! of raw quinn with the cluster's exact transport settings (the fair baseline: same TLS, same
//! streams, same [`pushpull_net::sender::FrameSender`]), and of plain TCP as context.
//!
//! * **Raw quinn**: `pushpull bench transport` ([`crate::transport::run_transport`]) with its sinks
//!   on the server hosts and its senders on the worker hosts, every worker connected to every
//!   server as in the cluster, one direction only.
//! * **TCP**: the link-rate probe's transfers ([`super::probe::measure_links`]), timed with the
//!   sending and receiving threads' own CPU clocks.
//!
//! Both are reported as CPU-seconds per GB of payload **sent plus received** (every byte counts
//! once at its sender and once at its receiver), the unit a cluster run's row uses too (the
//! CPU of all its processes over the payload all of them sent and received), so the two are
//! compared directly.

use serde::{Deserialize, Serialize};

use super::topo::Topology;
use crate::transport::{run_transport, NetnsPlacement, TransportOptions};
use pushpull_launch::procs::Programs;
use pushpull_node::error::CliResult;
use pushpull_proto::Config;

/// What one transport cost.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TransportCost {
    /// `quinn` (raw quinn, the cluster's settings) or `tcp`.
    pub transport: String,
    /// Payload bytes moved (each counted once).
    pub bytes: u64,
    /// Seconds the transfers took (summed when they ran one after another).
    pub seconds: f64,
    /// CPU seconds of every sender and receiver.
    pub cpu_seconds: f64,
    /// `cpu_seconds / (2 · bytes / 1e9)`: per GB sent plus received.
    pub cpu_seconds_per_gb: f64,
}

impl TransportCost {
    /// Nothing measured yet.
    pub fn new(transport: &str) -> TransportCost {
        TransportCost {
            transport: transport.to_string(),
            bytes: 0,
            seconds: 0.0,
            cpu_seconds: 0.0,
            cpu_seconds_per_gb: 0.0,
        }
    }

    /// Adds one transfer of `bytes` that took `seconds` and `cpu_seconds` of CPU on both sides.
    pub fn add(&mut self, bytes: u64, seconds: f64, cpu_seconds: f64) {
        self.bytes += bytes;
        self.seconds += seconds;
        self.cpu_seconds += cpu_seconds;
        self.cpu_seconds_per_gb = per_gb(self.cpu_seconds, 2 * self.bytes);
    }
}

/// `cpu` seconds per GB (1e9 bytes) of `bytes` (0 for no bytes).
pub fn per_gb(cpu: f64, bytes: u64) -> f64 {
    if bytes == 0 {
        0.0
    } else {
        cpu / (bytes as f64 / 1e9)
    }
}

/// Raw quinn between the hosts `server0..S` (sinks) and `worker0..W` (senders) of `topo`,
/// every sender to every sink, about `seconds` at `rate_bits` per host link.
pub async fn quinn_cost(
    topo: &Topology,
    config: &Config,
    programs: &Programs,
    (workers, servers): (u32, u32),
    rate_bits: u64,
    seconds: f64,
) -> CliResult<TransportCost> {
    let host = |name: String| topo.host(&name).cloned();
    let sinks = (0..servers)
        .map(|s| host(format!("server{s}")).map(|h| (h.ns, h.ip.into())))
        .collect::<CliResult<Vec<_>>>()?;
    let senders = (0..workers)
        .map(|w| host(format!("worker{w}")).map(|h| h.ns))
        .collect::<CliResult<Vec<_>>>()?;
    // Each worker's uplink is shared by its S connections.
    let per_host = (rate_bits as f64 / 8.0 * seconds) as u64;
    let bytes = (per_host / u64::from(servers.max(1))).max(config.cluster.partition_bytes);
    let opts = TransportOptions {
        config: config.clone(),
        connections: workers * servers,
        sinks: servers,
        bytes,
        programs: programs.clone(),
        netns: Some(NetnsPlacement { sinks, senders }),
    };
    let report = run_transport(&opts).await?;
    let mut cost = TransportCost::new("quinn");
    cost.add(
        report.bytes,
        report.seconds,
        report.cpu_seconds.values().sum(),
    );
    Ok(cost)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_counts_every_byte_at_both_ends() {
        let mut c = TransportCost::new("tcp");
        c.add(500_000_000, 4.0, 1.0);
        c.add(500_000_000, 4.0, 2.0);
        // 3 CPU-s over 1 GB sent and 1 GB received.
        assert!((c.cpu_seconds_per_gb - 1.5).abs() < 1e-12);
        assert_eq!(per_gb(1.0, 0), 0.0);
    }
}
