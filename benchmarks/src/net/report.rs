//! Turning a [`ClusterRun`] into a report row: seconds per round, the wire floor, CPU seconds
//! per process per round, wire bytes next to pushpull's payload bytes, and the verdict
//! (CPU-bound or network-bound); plus the text table.
//!
//! **Wire floor.** For every host, the payload bytes it must send and receive per round divided
//! by its measured link rate (upload and download separately: the links are full duplex); the
//! floor is the largest. Workers' bytes are what their reports say they pushed and pulled;
//! a server's are its share of the sum over workers. The scheduler places chunks in the order
//! the declarations complete, which varies from run to run, so the share is measured: the
//! server's fraction of all servers' interface bytes in that direction (without counters,
//! the fraction of fp32 bytes a replay of the placement with
//! [`pushpull_proto::placement::Placer`] in declaration order gives it: an approximation, since
//! the scheduler balances payload bytes).
//!
//! **CPU-bound.** The CPU seconds of all processes per timed round divided by the cores
//! (`nproc`) is the least wall time the CPU work needs; a run is CPU-bound when that is at least
//! half the floor.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use pushpull_proto::placement::Placer;
use serde::{Deserialize, Serialize};

use super::baseline::per_gb;
use super::cluster::ClusterRun;
use super::probe::LinkRate;
use pushpull_jobs::benchmark::tensor_set;
use pushpull_node::report::{median, JobReport};

/// Bytes of one host per timed round.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HostRow {
    /// The node on the host.
    pub host: String,
    /// Bytes its `eth0` sent per round (interface counters; all protocol overhead included).
    pub wire_tx_bytes: f64,
    /// Bytes its `eth0` received per round.
    pub wire_rx_bytes: f64,
    /// Payload bytes pushpull sent per round (workers: reported; servers: placement share).
    pub payload_tx_bytes: f64,
    /// Payload bytes pushpull received per round.
    pub payload_rx_bytes: f64,
    /// Seconds its link needs for its payload: max(tx / up rate, rx / down rate).
    pub link_seconds: f64,
    /// CPU seconds of its process per round.
    pub cpu_seconds: f64,
    /// Packets dropped by its two tbf queues during the run (warm-up and set-up included).
    pub tbf_drops: u64,
    /// Of those, the ones dropped on its download side (the bridge's queue toward it); absent
    /// from reports saved before it was counted (read as 0).
    #[serde(default)]
    pub tbf_drops_down: u64,
}

/// One run of the benchmark.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RunRow {
    /// `compressors` or `scaling`.
    pub series: String,
    /// Compressor preset name.
    pub compressor: String,
    /// Its parameter map (`[tensors.default]`).
    pub params: BTreeMap<String, String>,
    /// The shaped rate, e.g. `100mbit`.
    pub rate: String,
    /// Workers.
    pub workers: u32,
    /// Servers.
    pub servers: u32,
    /// Workers per local group (`cluster.local_size`; 1: flat).
    #[serde(default = "super::one")]
    pub local_size: u32,
    /// Workers sharing one host and its link.
    #[serde(default = "super::one")]
    pub workers_per_host: u32,
    /// fp32 megabytes (1e6) each worker push_pulls per round.
    pub mb_per_worker: f64,
    /// Timed rounds.
    pub rounds: u32,
    /// Warm-up rounds.
    pub warmup: u32,
    /// Median seconds per round.
    pub median_seconds: f64,
    /// Fastest round.
    pub min_seconds: f64,
    /// Slowest round.
    pub max_seconds: f64,
    /// Where per-round times come from: `report` (the workers' push_pull times) or `progress`
    /// (spacing of worker 0's progress lines: push_pull plus data generation).
    pub round_source: String,
    /// Mean push_pull seconds per round as worker 0 reported it.
    pub mean_push_pull_seconds: f64,
    /// The wire floor, seconds per round.
    pub floor_seconds: f64,
    /// The host whose link sets the floor.
    pub floor_host: String,
    /// Median seconds / floor.
    pub ratio: f64,
    /// CPU seconds of all processes per round.
    pub cpu_seconds: f64,
    /// `cpu_seconds` / cores.
    pub cpu_wall_seconds: f64,
    /// `cpu` or `network`.
    pub bound: String,
    /// Network-bound and within [`TARGET_RATIO`] of the floor (None when CPU-bound).
    pub meets_target: Option<bool>,
    /// Median over the timed rounds of when the first tensor's (the highest priority's)
    /// result had arrived on the last worker to get it: when a next forward pass could start.
    #[serde(default)]
    pub first_layer_seconds: f64,
    /// CPU seconds of all processes per GB (1e9 bytes) of payload they sent plus received.
    #[serde(default)]
    pub cpu_seconds_per_gb: f64,
    /// Payload bytes pushed per round, the mean over workers (in local groups only a chunk's
    /// owner pushes: a host's pushes are one copy, shared among its workers).
    pub push_bytes_per_worker: f64,
    /// Payload bytes pushed per round, the mean over worker hosts (the same as per worker when
    /// each worker has its host).
    #[serde(default)]
    pub push_bytes_per_host: f64,
    /// fp32 bytes per worker per round / payload bytes pushed per worker host: the codec's
    /// compression (a host of a local group pushes one copy of its workers' sum).
    pub compression: f64,
    /// Every worker's check (`passed` or `skipped`).
    pub check: String,
    /// Per host, in process order.
    pub hosts: Vec<HostRow>,
    /// 1-minute load average when the run started.
    pub load_before: f64,
    /// Seconds from the first process start to the last exit.
    pub wall_seconds: f64,
}

/// A network-bound run meets its target when it takes at most this many times the floor.
pub const TARGET_RATIO: f64 = 1.15;

/// Fraction of the fp32 bytes the placement gives each server.
pub fn server_shares(scale: f64, num_servers: u32, partition_bytes: u64) -> Vec<f64> {
    let mut placer = Placer::new(num_servers.max(1), partition_bytes);
    for t in tensor_set(scale) {
        placer.place(&t.name, t.len, Default::default());
    }
    let total: u64 = placer.load_bytes().iter().sum();
    placer
        .load_bytes()
        .iter()
        .map(|&b| b as f64 / total.max(1) as f64)
        .collect()
}

/// What a row needs besides the run.
#[derive(Debug, Clone)]
pub struct RowContext {
    /// `compressors` or `scaling`.
    pub series: String,
    /// Preset name.
    pub compressor: String,
    /// Its parameter map.
    pub params: BTreeMap<String, String>,
    /// Rate label.
    pub rate: String,
    /// The job's `scale`.
    pub scale: f64,
    /// `cluster.local_size`.
    pub local_size: u32,
    /// `cluster.partition_bytes`.
    pub partition_bytes: u64,
    /// Measured link rates, by host name.
    pub links: Vec<LinkRate>,
    /// Cores of the machine.
    pub cores: usize,
    /// 1-minute load average before the run.
    pub load_before: f64,
}

/// Whether a host runs workers (`worker<w>`, or `host<h>` for a host of a local group).
fn is_worker_host(host: &str) -> bool {
    host.starts_with("worker") || host.starts_with("host")
}

/// `WxS`, and how the workers sit on hosts when several share one.
fn nodes_label(r: &RunRow) -> String {
    let mut s = format!("{}x{}", r.workers, r.servers);
    if r.local_size > 1 {
        let _ = write!(s, " groups of {}", r.local_size);
    } else if r.workers_per_host > 1 {
        let _ = write!(s, " flat, {} a host", r.workers_per_host);
    }
    s
}

/// Builds the row of a finished run.
pub fn make_row(ctx: &RowContext, run: &ClusterRun) -> RunRow {
    let r0 = &run.reports[0];
    let (nw, ns) = (r0.num_workers, r0.num_servers);
    let rounds = r0.rounds.max(1) as f64;
    let shares = server_shares(ctx.scale, ns, ctx.partition_bytes);
    let push_sum: f64 = run
        .reports
        .iter()
        .map(|r| r.push_payload_bytes as f64)
        .sum::<f64>()
        / rounds;
    let pull_sum: f64 = run
        .reports
        .iter()
        .map(|r| r.pull_payload_bytes as f64)
        .sum::<f64>()
        / rounds;
    let rate = |host: &str| {
        ctx.links
            .iter()
            .find(|l| l.host == host)
            .map(|l| (l.up_bits_per_second, l.down_bits_per_second))
            .unwrap_or((f64::INFINITY, f64::INFINITY))
    };
    let timed_rounds = r0.rounds.max(1) as f64;
    // Per process: wire bytes and CPU seconds per timed round.
    let measured: Vec<(f64, f64, f64)> = (0..run.processes.len())
        .map(|i| match &run.window {
            Some((a, b)) => (
                b.bytes[i].0.saturating_sub(a.bytes[i].0) as f64 / timed_rounds,
                b.bytes[i].1.saturating_sub(a.bytes[i].1) as f64 / timed_rounds,
                (b.cpu[i] - a.cpu[i]).max(0.0) / timed_rounds,
            ),
            None => (f64::NAN, f64::NAN, f64::NAN),
        })
        .collect();
    let is_server = |i: usize| run.processes[i].starts_with("server");
    let server_wire = |f: fn(&(f64, f64, f64)) -> f64| -> f64 {
        (0..measured.len())
            .filter(|&i| is_server(i))
            .map(|i| f(&measured[i]))
            .sum()
    };
    let (srv_tx, srv_rx) = (server_wire(|m| m.0), server_wire(|m| m.1));
    // Per process: payload bytes sent and received per round.
    let payload: Vec<(f64, f64)> = run
        .processes
        .iter()
        .enumerate()
        .map(|(i, name)| {
            if let Some(w) = name.strip_prefix("worker") {
                let w: usize = w.parse().unwrap_or(0);
                let r = &run.reports[w.min(run.reports.len() - 1)];
                (
                    r.push_payload_bytes as f64 / rounds,
                    r.pull_payload_bytes as f64 / rounds,
                )
            } else if let Some(s) = name.strip_prefix("server") {
                let placed = s
                    .parse::<usize>()
                    .ok()
                    .and_then(|s| shares.get(s))
                    .copied()
                    .unwrap_or(0.0);
                let share = |wire: f64, all: f64| {
                    if wire.is_finite() && all > 0.0 {
                        wire / all
                    } else {
                        placed
                    }
                };
                (
                    pull_sum * share(measured[i].0, srv_tx),
                    push_sum * share(measured[i].1, srv_rx),
                )
            } else {
                (0.0, 0.0)
            }
        })
        .collect();
    // Per host, in the order its first process appears: the host's counters (shared by its
    // processes), the sum of its processes' payload and CPU.
    let host_of = |i: usize| run.hosts.get(i).unwrap_or(&run.processes[i]).clone();
    let mut hosts: Vec<HostRow> = Vec::new();
    for i in 0..run.processes.len() {
        let name = host_of(i);
        let (ptx, prx) = payload[i];
        let (wtx, wrx, cpu) = measured[i];
        match hosts.iter_mut().find(|h| h.host == name) {
            Some(h) => {
                h.payload_tx_bytes += ptx;
                h.payload_rx_bytes += prx;
                h.cpu_seconds += cpu;
            }
            None => hosts.push(HostRow {
                host: name,
                wire_tx_bytes: wtx,
                wire_rx_bytes: wrx,
                payload_tx_bytes: ptx,
                payload_rx_bytes: prx,
                link_seconds: 0.0,
                cpu_seconds: cpu,
                tbf_drops: run.tbf_drops.get(i).map_or(0, |d| d[0] + d[1]),
                tbf_drops_down: run.tbf_drops.get(i).map_or(0, |d| d[1]),
            }),
        }
    }
    for h in &mut hosts {
        let (up, down) = rate(&h.host);
        h.link_seconds = (h.payload_tx_bytes * 8.0 / up).max(h.payload_rx_bytes * 8.0 / down);
    }
    let (floor_host, floor) = hosts.iter().map(|h| (h.host.clone(), h.link_seconds)).fold(
        (String::new(), 0.0),
        |acc, x| if x.1 > acc.1 { x } else { acc },
    );
    let med = median(&run.round_seconds);
    let (min, max) = run
        .round_seconds
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
    let cpu: f64 = hosts.iter().map(|h| h.cpu_seconds).sum();
    let cpu_wall = cpu / ctx.cores.max(1) as f64;
    let cpu_bound = cpu_wall >= floor / 2.0;
    let ratio = if floor > 0.0 { med / floor } else { f64::NAN };
    let push0 = push_sum / nw.max(1) as f64;
    let worker_hosts = hosts.iter().filter(|h| is_worker_host(&h.host)).count();
    let push_host = push_sum / worker_hosts.max(1) as f64;
    let raw = r0.gradient_bytes_per_round as f64;
    let checks: Vec<&str> = run.reports.iter().map(|r| r.check.as_str()).collect();
    RunRow {
        series: ctx.series.clone(),
        compressor: ctx.compressor.clone(),
        params: ctx.params.clone(),
        rate: ctx.rate.clone(),
        workers: nw,
        servers: ns,
        local_size: ctx.local_size,
        workers_per_host: (nw as usize / worker_hosts.max(1)) as u32,
        mb_per_worker: raw / 1e6,
        rounds: r0.rounds,
        warmup: r0.warmup,
        median_seconds: med,
        min_seconds: if min.is_finite() { min } else { 0.0 },
        max_seconds: max,
        round_source: run.round_source.clone(),
        mean_push_pull_seconds: r0.seconds / rounds,
        floor_seconds: floor,
        floor_host,
        ratio,
        cpu_seconds: cpu,
        cpu_wall_seconds: cpu_wall,
        bound: if cpu_bound { "cpu" } else { "network" }.to_string(),
        meets_target: (!cpu_bound).then_some(ratio <= TARGET_RATIO),
        first_layer_seconds: first_layer_seconds(&run.reports),
        cpu_seconds_per_gb: per_gb(
            cpu,
            hosts
                .iter()
                .map(|h| h.payload_tx_bytes + h.payload_rx_bytes)
                .sum::<f64>() as u64,
        ),
        push_bytes_per_worker: push0,
        push_bytes_per_host: push_host,
        compression: if push_host > 0.0 {
            raw / push_host
        } else {
            0.0
        },
        check: if checks.iter().all(|c| *c == checks[0]) {
            checks[0].to_string()
        } else {
            checks.join(",")
        },
        hosts,
        load_before: ctx.load_before,
        wall_seconds: run.wall_seconds,
    }
}

/// Per timed round, the latest any worker got the first tensor's result; their median.
fn first_layer_seconds(reports: &[JobReport]) -> f64 {
    let rounds = reports
        .iter()
        .map(|r| r.first_tensor_seconds.len())
        .min()
        .unwrap_or(0);
    let per_round: Vec<f64> = (0..rounds)
        .map(|i| {
            reports
                .iter()
                .map(|r| r.first_tensor_seconds[i])
                .fold(0.0, f64::max)
        })
        .collect();
    median(&per_round)
}

fn mb(b: f64) -> String {
    if b.is_nan() {
        "-".into()
    } else if b >= 1e7 {
        format!("{:.1}", b / 1e6)
    } else {
        format!("{:.2}", b / 1e6)
    }
}

/// The summary table, one line per run. `quinn_per_gb(rate)` is raw quinn's CPU-seconds per
/// GB on that rate's network, when it was measured.
pub fn table(rows: &[RunRow], quinn_per_gb: &dyn Fn(&str) -> Option<f64>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| rate | compressor | W x S | MB/worker | s/round median (min-max) | first layer s | \
         floor s | ratio | CPU-s/round (/cores) | bound | target | CPU-s/GB (x raw quinn) | \
         pushed MB/worker (x) | wire tx MB worker/server | pushpull tx MB worker/server | \
         tbf drops |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---:|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|"
    );
    for r in rows {
        let role = |p: &str, f: &dyn Fn(&HostRow) -> f64| {
            let v: Vec<f64> = r
                .hosts
                .iter()
                .filter(|h| {
                    if p == "worker" {
                        is_worker_host(&h.host)
                    } else {
                        h.host.starts_with(p)
                    }
                })
                .map(f)
                .collect();
            if v.is_empty() {
                f64::NAN
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
        };
        let vs_quinn = match quinn_per_gb(&r.rate) {
            Some(q) if q > 0.0 => format!(" ({:.2}x)", r.cpu_seconds_per_gb / q),
            _ => String::new(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1} | {:.3} ({:.3}-{:.3}) | {:.3} | {:.3} | {:.2} | {:.2} ({:.2}) | {} | {} | {:.2}{} | {} ({:.1}x) | {} / {} | {} / {} | {} |",
            r.rate,
            r.compressor,
            nodes_label(r),
            r.mb_per_worker,
            r.median_seconds,
            r.min_seconds,
            r.max_seconds,
            r.first_layer_seconds,
            r.floor_seconds,
            r.ratio,
            r.cpu_seconds,
            r.cpu_wall_seconds,
            r.bound,
            match r.meets_target {
                Some(true) => "met",
                Some(false) => "MISSED",
                None => "n/a",
            },
            r.cpu_seconds_per_gb,
            vs_quinn,
            mb(if r.push_bytes_per_host > 0.0 {
                r.push_bytes_per_host
            } else {
                r.push_bytes_per_worker
            }),
            r.compression,
            mb(role("worker", &|h| h.wire_tx_bytes)),
            mb(role("server", &|h| h.wire_tx_bytes)),
            mb(role("worker", &|h| h.payload_tx_bytes)),
            mb(role("server", &|h| h.payload_tx_bytes)),
            r.hosts.iter().map(|h| h.tbf_drops).sum::<u64>(),
        );
    }
    s
}

/// Per-host lines of one run.
pub fn host_lines(r: &RunRow) -> String {
    let mut s = format!(
        "{} {} {} {:.1} MB/worker: floor set by {}; per round times from {}; mean push_pull \
         {:.3} s; check {}; load {:.2}; wall {:.1} s\n",
        r.rate,
        r.compressor,
        nodes_label(r),
        r.mb_per_worker,
        r.floor_host,
        r.round_source,
        r.mean_push_pull_seconds,
        r.check,
        r.load_before,
        r.wall_seconds
    );
    for h in &r.hosts {
        let _ = writeln!(
            s,
            "  {:<10} wire tx {:>8} rx {:>8} MB/round | pushpull tx {:>8} rx {:>8} | link {:.3} s | CPU {:.3} s/round | tbf drops {} ({} down)",
            h.host,
            mb(h.wire_tx_bytes),
            mb(h.wire_rx_bytes),
            mb(h.payload_tx_bytes),
            mb(h.payload_rx_bytes),
            h.link_seconds,
            h.cpu_seconds,
            h.tbf_drops,
            h.tbf_drops_down
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn shares_cover_everything() {
        let s = server_shares(1.0, 4, 4_096_000);
        assert_eq!(s.len(), 4);
        assert!((s.iter().sum::<f64>() - 1.0).abs() < 1e-9);
        assert!(s.iter().all(|&x| x > 0.15 && x < 0.35), "{s:?}");
        assert_eq!(server_shares(0.01, 1, 4_096_000), vec![1.0]);
    }
}
