//! One cluster run inside a [`Topology`]: the real `pushpull-scheduler`, `pushpull-server` and
//! `pushpull-worker` binaries, each started with `ip netns exec NS ...` in its own host's
//! namespace, with a throw-away CA like `pushpull local`.
//!
//! While the job runs, worker 0's progress lines mark the round boundaries: when it finishes
//! the warm-up and the last timed round, every host's `eth0` byte counters and every process's
//! CPU time (`/proc/PID/stat`) are read, which gives per-round wire bytes and CPU seconds of
//! exactly the timed rounds.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pushpull_proto::Config;

use super::topo::{interrupted, Host, Topology};
use pushpull_jobs::train::TrainReport;
use pushpull_jobs::JobConfig;
use pushpull_launch::nodes::{self, Place};
use pushpull_launch::procs::{Event, ProcGroup, Programs};
use pushpull_launch::ClusterFiles;
use pushpull_node::error::{CliError, CliResult};
use pushpull_node::report::{progress_value, JobReport, PROGRESS_PREFIX};

/// Counters read at one round boundary.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// When.
    pub at: Instant,
    /// `(tx, rx)` bytes of every process's host, in process order.
    pub bytes: Vec<(u64, u64)>,
    /// CPU seconds of every process so far, in process order.
    pub cpu: Vec<f64>,
}

/// What one cluster run gave.
#[derive(Debug, Clone)]
pub struct ClusterRun {
    /// Process names in order: `scheduler`, `server0`, ..., `worker0`, ...
    pub processes: Vec<String>,
    /// The host of each process, in process order (workers of a local group share one).
    pub hosts: Vec<String>,
    /// Every worker's report, by rank (the benchmark job).
    pub reports: Vec<JobReport>,
    /// Every worker's report, by rank (the training job, `job.kind = "train"`).
    pub train_reports: Vec<TrainReport>,
    /// Per timed round, seconds: the workers' own push_pull times if their report has
    /// `round_seconds` (the slowest worker per round), else the spacing of worker 0's progress
    /// lines (push_pull plus generating the round's data).
    pub round_seconds: Vec<f64>,
    /// Where `round_seconds` came from: `report` or `progress`.
    pub round_source: String,
    /// Counters when worker 0 finished the warm-up and the last round (absent without
    /// warm-up rounds).
    pub window: Option<(Snapshot, Snapshot)>,
    /// Packets dropped by tbf on each process's host link during this run: `[upload,
    /// download]`.
    pub tbf_drops: Vec<[u64; 2]>,
    /// Seconds from the first start to the last exit.
    pub wall_seconds: f64,
}

/// How long one run may take in all.
#[derive(Debug, Clone)]
pub struct RunLimits {
    /// Wall-clock limit of the whole run.
    pub timeout: Duration,
    /// Forward children's stderr to ours.
    pub logs: bool,
}

/// CPU seconds (user + system, all threads) of process `pid` from `/proc/PID/stat`.
pub fn proc_cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime 15.
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((utime + stime) / hz)
}

/// Runs `config`'s job on the topology's hosts `scheduler`, `server0..S`, `worker0..W` and
/// waits for every process to exit. `config.cluster.scheduler` and each server's `--listen`
/// (its host's address) are set here. Fails naming the process (with its last stderr lines) if any exits non-zero; kills
/// everything on failure, timeout or a signal.
pub async fn run_cluster(
    topo: &Topology,
    config: &Config,
    programs: &Programs,
    limits: &RunLimits,
) -> CliResult<ClusterRun> {
    let (nw, ns) = (config.cluster.num_workers, config.cluster.num_servers);
    let mut processes = vec!["scheduler".to_string()];
    processes.extend((0..ns).map(|s| format!("server{s}")));
    processes.extend((0..nw).map(|w| format!("worker{w}")));
    let hosts: Vec<&Host> = processes
        .iter()
        .map(|p| topo.host(p))
        .collect::<CliResult<_>>()?;

    let mut config = config.clone();
    config.cluster.scheduler = format!("{}:0", hosts[0].ip);
    config.server.listen = "0.0.0.0:0".to_string();
    config.server.advertise = None;
    let files = ClusterFiles::new("pushpull-netbench-", &config, &processes)?;

    let mut group = ProcGroup::new();
    if limits.logs {
        group.forward_stderr(Arc::new(|name: &str, line: &str| {
            eprintln!("[{name}] {line}");
        }));
    }
    // tbf counters live as long as the network: count this run's drops only.
    let drops_before: Vec<[u64; 2]> = hosts
        .iter()
        .map(|h| topo.tbf_drops(h).unwrap_or_default())
        .collect();
    let start = Instant::now();
    let run = tokio::time::timeout(
        limits.timeout,
        drive(topo, &config, programs, &mut group, &hosts, &files),
    )
    .await;
    let result = match run {
        Ok(r) => r,
        Err(_) => Err(CliError::failed(format!(
            "the run did not finish within {:.0} s (--run-timeout)",
            limits.timeout.as_secs_f64()
        ))),
    };
    let drops = hosts
        .iter()
        .zip(&drops_before)
        .map(|(h, b)| {
            let d = topo.tbf_drops(h).unwrap_or_default();
            [d[0].saturating_sub(b[0]), d[1].saturating_sub(b[1])]
        })
        .collect();
    let driven = match result {
        Ok(r) => r,
        Err(e) => {
            // The children die before the namespaces go.
            group.kill_and_reap(Duration::from_secs(5)).await;
            return Err(e);
        }
    };
    Ok(ClusterRun {
        hosts: hosts.iter().map(|h| h.name.clone()).collect(),
        processes,
        reports: driven.reports,
        train_reports: driven.train_reports,
        round_seconds: driven.round_seconds,
        round_source: driven.round_source,
        window: driven.window,
        tbf_drops: drops,
        wall_seconds: start.elapsed().as_secs_f64(),
    })
}

/// What [`drive`] returns: the reports (benchmark or training), the per-round seconds and
/// their source, and the counters at the timed rounds' boundaries.
struct Driven {
    reports: Vec<JobReport>,
    train_reports: Vec<TrainReport>,
    round_seconds: Vec<f64>,
    round_source: String,
    window: Option<(Snapshot, Snapshot)>,
}

fn snapshot(topo: &Topology, hosts: &[&Host], pids: &[u32]) -> CliResult<Snapshot> {
    let at = Instant::now();
    let all = topo.counters()?;
    let bytes = hosts
        .iter()
        .map(|h| {
            let i = topo.hosts.iter().position(|t| t.ns == h.ns).unwrap_or(0);
            all[i]
        })
        .collect();
    let cpu = pids
        .iter()
        .map(|&p| proc_cpu_seconds(p).unwrap_or(0.0))
        .collect();
    Ok(Snapshot { at, bytes, cpu })
}

async fn drive(
    topo: &Topology,
    config: &Config,
    programs: &Programs,
    group: &mut ProcGroup,
    hosts: &[&Host],
    files: &ClusterFiles,
) -> CliResult<Driven> {
    let (nw, ns) = (config.cluster.num_workers, config.cluster.num_servers);
    let places: Vec<Place> = hosts
        .iter()
        .map(|h| Place::Netns {
            ns: h.ns.clone(),
            ip: h.ip.into(),
        })
        .collect();
    let started = nodes::start(group, programs, files, ns, nw, &places).await?;
    let worker_idx = started.workers;
    let pids: Vec<u32> = std::iter::once(started.scheduler)
        .chain(started.servers)
        .chain(worker_idx.iter().copied())
        .map(|i| group.pid(i))
        .collect();

    let job = JobConfig::of(config).map_err(CliError::usage)?;
    let (warmup, total) = (job.warmup, job.warmup + job.rounds);
    let mut progress_at: BTreeMap<u64, Instant> = BTreeMap::new();
    let mut first: Option<Snapshot> = None;
    let mut window = None;
    let train = job.kind == "train";
    let mut reports: Vec<Option<serde_json::Value>> = vec![None; nw as usize];
    let mut report_rounds: Vec<Option<Vec<f64>>> = vec![None; nw as usize];
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        let ev = tokio::select! {
            ev = group.next_event() => ev,
            _ = tick.tick() => {
                if interrupted() {
                    return Err(CliError::failed("interrupted by a signal: killed every process of the cluster"));
                }
                continue;
            }
        };
        let Some(ev) = ev else { break };
        match ev {
            Event::Line { proc, line } => {
                if let Some(rest) = line.strip_prefix(PROGRESS_PREFIX) {
                    if worker_idx.first() == Some(&proc) {
                        let Some(done) = progress_value(rest, "round") else {
                            continue;
                        };
                        progress_at.insert(done, Instant::now());
                        if warmup > 0 && done == warmup as u64 {
                            first = Some(snapshot(topo, hosts, &pids)?);
                        }
                        if done == total as u64 {
                            if let Some(a) = first.take() {
                                window = Some((a, snapshot(topo, hosts, &pids)?));
                            }
                        }
                    }
                } else if line.starts_with('{') {
                    if let Some(w) = worker_idx.iter().position(|&i| i == proc) {
                        let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| {
                            CliError::failed(format!("worker{w} printed an unreadable report: {e}"))
                        })?;
                        // `round_seconds` is read when the job reports it.
                        report_rounds[w] = v["round_seconds"]
                            .as_array()
                            .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect());
                        reports[w] = Some(v);
                    }
                }
            }
            Event::Exit { proc, status } => {
                if !status.success() {
                    let msg = group.failure_message(proc, status);
                    return Err(CliError::failed(msg));
                }
            }
        }
    }
    let reports = reports
        .into_iter()
        .enumerate()
        .map(|(w, r)| {
            r.ok_or_else(|| CliError::failed(format!("worker{w} exited 0 without a report")))
        })
        .collect::<CliResult<Vec<_>>>()?;
    let parse = |w: usize, e: serde_json::Error| {
        CliError::failed(format!("worker{w} printed an unreadable report: {e}"))
    };
    let (train_reports, reports) = if train {
        let r = reports
            .into_iter()
            .enumerate()
            .map(|(w, v)| serde_json::from_value(v).map_err(|e| parse(w, e)))
            .collect::<CliResult<Vec<TrainReport>>>()?;
        (r, Vec::new())
    } else {
        let r = reports
            .into_iter()
            .enumerate()
            .map(|(w, v)| serde_json::from_value(v).map_err(|e| parse(w, e)))
            .collect::<CliResult<Vec<JobReport>>>()?;
        (Vec::new(), r)
    };
    let rounds = job.rounds as usize;
    let (round_seconds, source) = if report_rounds
        .iter()
        .all(|r| r.as_ref().is_some_and(|r| r.len() == rounds))
    {
        let per_round = (0..rounds)
            .map(|i| {
                report_rounds
                    .iter()
                    .flatten()
                    .map(|r| r[i])
                    .fold(0.0, f64::max)
            })
            .collect();
        (per_round, "report")
    } else {
        let per_round = (warmup as u64..total as u64)
            .filter_map(|r| {
                let a = progress_at.get(&r)?;
                let b = progress_at.get(&(r + 1))?;
                Some(b.duration_since(*a).as_secs_f64())
            })
            .collect();
        (per_round, "progress")
    };
    Ok(Driven {
        reports,
        train_reports,
        round_seconds,
        round_source: source.to_string(),
        window,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_time_reads() {
        let c = proc_cpu_seconds(std::process::id()).unwrap();
        assert!(c >= 0.0);
        assert_eq!(proc_cpu_seconds(u32::MAX), None);
    }
}
