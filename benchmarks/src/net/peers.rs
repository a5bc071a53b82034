//! `--peers PYTHON`: the same exchange without pushpull, on the same shaped network and in the
//! same sitting, so that pushpull's seconds per round have a peer measured beside them.
//!
//! The peers are `bench/gloo_peers.py` (embedded here, written to a temporary file), run with
//! the given Python interpreter (it needs PyTorch), one process per rank, each in its host's
//! namespace with `ip netns exec`:
//!
//! * **gloo all_reduce**: the W worker hosts all-reduce one fp32 tensor of the benchmark's size.
//! * **naive PS on gloo**: W workers and S servers; 4 MB pieces, summed on the servers as soon as
//!   every worker's copy arrived and sent back. Run uncompressed at the benchmark's size, and,
//!   for every compressed run of the series, moving the bytes that run pushed per worker, in as
//!   many pieces as uncompressed (each piece shrunk by the run's compression ratio, as if each
//!   4 MB piece were compressed on its own).
//!
//! The slowest worker of each timed round counts; the row reports the median over rounds.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use super::report::RunRow;
use super::topo::Topology;
use pushpull_node::error::{CliError, CliResult};
use pushpull_node::report::median;

/// The peers' script (see its docstring).
const SCRIPT: &str = include_str!("../../../bench/gloo_peers.py");

/// Piece size of the naive parameter server (the issue's: 4 MB).
const PS_PARTITION_BYTES: u64 = 4_000_000;

/// One peer run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PeerRow {
    /// Rate label.
    pub rate: String,
    /// `gloo all_reduce` or `naive PS on gloo`.
    pub peer: String,
    /// The pushpull run whose bytes it moves (compressor preset).
    pub compressor: String,
    /// Workers.
    pub workers: u32,
    /// Servers (0 for all_reduce).
    pub servers: u32,
    /// fp32 bytes each worker sends per round.
    pub bytes_per_worker: u64,
    /// Bytes per piece (naive PS).
    pub piece_bytes: u64,
    /// Median over timed rounds of the slowest worker's seconds.
    pub median_seconds: f64,
    /// pushpull's seconds per round of the same compressor on the same network.
    pub pushpull_seconds: Option<f64>,
}

/// Which peer job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerJob {
    /// gloo's ring all_reduce among the workers.
    AllReduce,
    /// The naive parameter server.
    Ps,
}

impl PeerJob {
    fn arg(self) -> &'static str {
        match self {
            PeerJob::AllReduce => "allreduce",
            PeerJob::Ps => "ps",
        }
    }

    /// The row's label.
    pub fn label(self) -> &'static str {
        match self {
            PeerJob::AllReduce => "gloo all_reduce",
            PeerJob::Ps => "naive PS on gloo",
        }
    }
}

/// The peers' script written to a temporary file for the benchmark's lifetime.
pub struct PeerScript {
    python: std::path::PathBuf,
    file: tempfile::NamedTempFile,
    port: u16,
}

impl PeerScript {
    /// Writes the script and checks that `python` imports torch with gloo.
    pub fn new(python: &Path) -> CliResult<PeerScript> {
        let check = std::process::Command::new(python)
            .args([
                "-c",
                "import torch.distributed as d; assert d.is_gloo_available()",
            ])
            .output()
            .map_err(|e| {
                CliError::usage(format!("--peers {}: cannot run it: {e}", python.display()))
            })?;
        if !check.status.success() {
            return Err(CliError::usage(format!(
                "--peers {}: this Python cannot import torch with gloo: {}",
                python.display(),
                String::from_utf8_lossy(&check.stderr).trim()
            )));
        }
        let mut file = tempfile::Builder::new()
            .prefix("pushpull-gloo-peers-")
            .suffix(".py")
            .tempfile()
            .map_err(|e| CliError::failed(format!("cannot write the peers' script: {e}")))?;
        std::io::Write::write_all(&mut file, SCRIPT.as_bytes())
            .map_err(|e| CliError::failed(format!("cannot write the peers' script: {e}")))?;
        Ok(PeerScript {
            python: python.to_path_buf(),
            file,
            port: 29500,
        })
    }

    /// Runs `job` with `workers` worker ranks on hosts `worker0..` (and `servers` server ranks on
    /// `server0..`), `bytes` of fp32 per worker in pieces of `piece` bytes (naive PS), `rounds`
    /// timed rounds after one warm-up; returns the median over rounds of the slowest worker's
    /// seconds.
    #[allow(clippy::too_many_arguments)]
    pub async fn run(
        &mut self,
        topo: &Topology,
        job: PeerJob,
        (workers, servers): (u32, u32),
        (bytes, piece): (u64, u64),
        rounds: u32,
        timeout: Duration,
    ) -> CliResult<f64> {
        // A fresh port per run: the previous run's listening socket may linger in TIME_WAIT.
        self.port = self.port.wrapping_add(1).max(29500);
        let master = topo.host("worker0")?.ip;
        let servers = if job == PeerJob::Ps { servers } else { 0 };
        let mut children = Vec::new();
        for rank in 0..workers + servers {
            let host = if rank < workers {
                format!("worker{rank}")
            } else {
                format!("server{}", rank - workers)
            };
            let ns = &topo.host(&host)?.ns;
            let child = tokio::process::Command::new("ip")
                .args(["netns", "exec", ns])
                .arg(&self.python)
                .arg(self.file.path())
                .args(["--job", job.arg()])
                .args(["--rank", &rank.to_string()])
                .args(["--workers", &workers.to_string()])
                .args(["--servers", &servers.to_string()])
                .args(["--master", &format!("tcp://{master}:{}", self.port)])
                .args(["--bytes", &(bytes / 4 * 4).max(4).to_string()])
                .args(["--partition", &(piece / 4 * 4).max(4).to_string()])
                .args(["--rounds", &rounds.to_string()])
                .env("GLOO_SOCKET_IFNAME", "eth0")
                .env("OMP_NUM_THREADS", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| CliError::failed(format!("cannot start peer rank {rank}: {e}")))?;
            children.push((rank, child));
        }
        let wait_all = async {
            let mut per_round: Vec<f64> = Vec::new();
            for (rank, child) in &mut children {
                let (mut out, mut err) = (String::new(), String::new());
                let mut so = child.stdout.take().expect("piped");
                let mut se = child.stderr.take().expect("piped");
                let (_, _, status) = tokio::join!(
                    so.read_to_string(&mut out),
                    se.read_to_string(&mut err),
                    child.wait()
                );
                let status =
                    status.map_err(|e| CliError::failed(format!("peer rank {rank}: {e}")))?;
                if !status.success() {
                    let tail: Vec<&str> = err.lines().rev().take(5).collect();
                    return Err(CliError::failed(format!(
                        "peer rank {rank} ({}) exited with {status}: {}",
                        job.label(),
                        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                    )));
                }
                if let Some(line) = out.lines().find(|l| l.starts_with('{')) {
                    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
                        CliError::failed(format!("peer rank {rank} printed {line:?}: {e}"))
                    })?;
                    let secs: Vec<f64> = v["seconds"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|x| x.as_f64())
                        .collect();
                    per_round.resize(per_round.len().max(secs.len()), 0.0);
                    for (slot, s) in per_round.iter_mut().zip(secs) {
                        *slot = slot.max(s);
                    }
                }
            }
            if per_round.is_empty() {
                return Err(CliError::failed(format!(
                    "{}: no worker reported its rounds",
                    job.label()
                )));
            }
            Ok(median(&per_round))
        };
        match tokio::time::timeout(timeout, wait_all).await {
            Ok(r) => r,
            Err(_) => Err(CliError::failed(format!(
                "{} did not finish within {} s",
                job.label(),
                timeout.as_secs()
            ))),
        }
    }
}

/// One peer run to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerPlan {
    /// Which job.
    pub job: PeerJob,
    /// The pushpull run whose bytes it moves.
    pub compressor: String,
    /// Bytes per worker per round.
    pub bytes: u64,
    /// Bytes per piece (naive PS).
    pub piece: u64,
}

/// The peer runs of one network: all_reduce and the naive PS uncompressed at `bytes`, and the
/// naive PS with each compressed run's pushed bytes in as many pieces (`rows`: this network's
/// compressor series).
pub fn plan(rows: &[&RunRow], bytes: u64) -> Vec<PeerPlan> {
    let run = |job, compressor: &str, moved: u64| PeerPlan {
        job,
        compressor: compressor.to_string(),
        bytes: moved,
        piece: ((PS_PARTITION_BYTES as f64 * moved as f64 / bytes.max(1) as f64).round() as u64)
            .clamp(4, PS_PARTITION_BYTES),
    };
    let mut v = vec![
        run(PeerJob::AllReduce, "none", bytes),
        run(PeerJob::Ps, "none", bytes),
    ];
    for r in rows {
        if r.compressor != "none" && r.push_bytes_per_worker > 0.0 {
            v.push(run(
                PeerJob::Ps,
                &r.compressor,
                r.push_bytes_per_worker.round() as u64,
            ));
        }
    }
    v
}

/// The peers' table: each peer next to pushpull on the same network.
pub fn peer_table(rows: &[PeerRow]) -> String {
    let mut s = String::from(
        "peers on the same network (no pushpull code; bench/gloo_peers.py)\n\
         rate     peer               moves (pushpull run)    W x S   MB/worker  piece MB   s/round   \
         pushpull s/round   pushpull / peer\n",
    );
    for r in rows {
        let (pp, ratio) = match r.pushpull_seconds {
            Some(p) => (format!("{p:.3}"), format!("{:.2}x", p / r.median_seconds)),
            None => ("-".into(), "-".into()),
        };
        s.push_str(&format!(
            "{:<8} {:<18} {:<23} {:>2} x {:<2} {:>10.2} {:>9.3} {:>9.3} {:>18} {:>17}\n",
            r.rate,
            r.peer,
            r.compressor,
            r.workers,
            r.servers,
            r.bytes_per_worker as f64 / 1e6,
            r.piece_bytes as f64 / 1e6,
            r.median_seconds,
            pp,
            ratio
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_has_both_peers_and_one_ps_per_compressed_run() {
        let none = RunRow {
            compressor: "none".into(),
            push_bytes_per_worker: 1e8,
            ..RunRow::default()
        };
        let onebit = RunRow {
            compressor: "onebit".into(),
            push_bytes_per_worker: 3.2e6,
            ..RunRow::default()
        };
        let p = plan(&[&none, &onebit], 102_000_000);
        assert_eq!(p.len(), 3);
        assert_eq!(p[0].job, PeerJob::AllReduce);
        assert_eq!(
            (p[1].job, p[1].bytes, p[1].piece),
            (PeerJob::Ps, 102_000_000, 4_000_000)
        );
        // 32x fewer bytes in as many pieces: each piece 32x smaller.
        assert_eq!(
            (p[2].job, p[2].compressor.as_str(), p[2].bytes, p[2].piece),
            (PeerJob::Ps, "onebit", 3_200_000, 125_490)
        );
    }

    #[test]
    fn the_script_parses_its_arguments() {
        // The embedded script is the file in bench/ (a stale copy would be a build error only
        // if the path moved; this keeps the two argument lists in step).
        for flag in [
            "--job",
            "--rank",
            "--workers",
            "--servers",
            "--master",
            "--bytes",
            "--partition",
            "--rounds",
        ] {
            assert!(SCRIPT.contains(&format!("\"{flag}\"")), "{flag}");
        }
    }
}
