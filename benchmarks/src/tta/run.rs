//! One run of one system on the shaped network: `train.py` once per worker, each in its worker
//! host's namespace (`ip netns exec`), and for pushpull the real `pushpull-scheduler` and
//! `pushpull-server` binaries where the placement puts them.
//!
//! * pushpull: a throw-away CA and cluster file ([`ClusterFiles`]), the scheduler and servers
//!   started by [`pushpull_launch::nodes::start`], the ranks by
//!   [`pushpull_launch::script::spawn_ranks`] with the environment `pushpull.torch` reads
//!   ([`pushpull_launch::script::worker_env`]): the same pieces as `pushpull local -- COMMAND`,
//!   in namespaces.
//! * DDP: the ranks with torch's environment (`RANK`, `WORLD_SIZE`, `MASTER_ADDR` = worker 0's
//!   address, a fresh `MASTER_PORT`) and `GLOO_SOCKET_IFNAME=eth0`, as `bench net --peers`
//!   starts gloo.
//!
//! Every process gets `OMP_NUM_THREADS=1` (train.py also sets `torch.set_num_threads(1)`).
//! The hosts' veth counters are read before the first process starts and after the last one
//! exits; each process's CPU time is read from `/proc` every 0.1 s while it runs. The run
//! waits with [`pushpull_launch::script::wait_ranks`]: the first process to fail ends it,
//! named, with its last stderr lines; so do `--run-timeout` and a signal.

use std::cell::RefCell;
use std::ffi::OsString;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pushpull_proto::Config;

use super::plan::{Kind, Placement, RunPlan, Setup};
use super::report::{End, Eval, HostBytes, ProcCpu};
use super::script::{train_args, Script};
use crate::net::cluster::proc_cpu_seconds;
use crate::net::topo::{interrupted, Host, Topology};
use pushpull_launch::nodes::{self, spawn_at, Place};
use pushpull_launch::procs::{Event, ProcGroup, Programs};
use pushpull_launch::script::{spawn_ranks, wait_ranks, Stop};
use pushpull_launch::ClusterFiles;
use pushpull_node::error::{CliError, CliResult};

/// What every run of a network shares.
pub struct RunCtx<'a> {
    /// The network.
    pub topo: &'a Topology,
    /// The script and its interpreter.
    pub script: &'a Script,
    /// The node binaries.
    pub programs: &'a Programs,
    /// The sitting's settings.
    pub setup: &'a Setup,
    /// `--run-timeout`.
    pub timeout: Duration,
    /// `--logs`.
    pub logs: bool,
}

/// What one run asks of the script beyond the sitting's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunAsk {
    /// Seed.
    pub seed: u64,
    /// `--target-bpb` (stop there).
    pub target_bpb: Option<f64>,
    /// `--time-limit` (stop at the first evaluation past it).
    pub time_limit: Option<f64>,
    /// DDP's `MASTER_PORT`.
    pub port: u16,
}

/// A run that failed.
#[derive(Debug, Clone, PartialEq)]
pub struct RunError {
    /// The process that failed first (`rank 1`, `server 0`), when one did.
    pub process: Option<String>,
    /// Why.
    pub message: String,
}

impl RunError {
    fn new(message: impl std::fmt::Display) -> RunError {
        RunError {
            process: None,
            message: message.to_string(),
        }
    }
}

/// Rank 0's JSON lines.
#[derive(Debug, Clone, PartialEq)]
pub struct Lines {
    /// The `run` line.
    pub run: serde_json::Value,
    /// The `eval` lines.
    pub evals: Vec<Eval>,
    /// The `end` line.
    pub end: End,
}

/// What a run that finished gave.
#[derive(Debug, Clone)]
pub struct Finished {
    /// Rank 0's lines.
    pub lines: Lines,
    /// Every host a process ran on, with its bytes over the run.
    pub hosts: Vec<HostBytes>,
    /// Every process with its CPU seconds.
    pub processes: Vec<ProcCpu>,
    /// Packets tbf dropped on the worker hosts' links during the run.
    pub tbf_drops: u64,
    /// First start to last exit, seconds.
    pub wall_seconds: f64,
}

/// Reads rank 0's `--out` file.
pub fn read_lines(text: &str) -> Result<Lines, String> {
    let (mut run, mut evals, mut end) = (None, Vec::new(), None);
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        let parse_err = |e: serde_json::Error| format!("line {}: {e}", i + 1);
        match v["kind"].as_str() {
            Some("run") => run = Some(v),
            Some("eval") => evals.push(serde_json::from_value(v).map_err(parse_err)?),
            Some("end") => end = Some(serde_json::from_value(v).map_err(parse_err)?),
            _ => return Err(format!("line {}: no known \"kind\"", i + 1)),
        }
    }
    match (run, end) {
        (Some(run), Some(end)) => Ok(Lines { run, evals, end }),
        (None, _) => Err("no \"run\" line".into()),
        (_, None) => Err("no \"end\" line".into()),
    }
}

/// The cluster file of a pushpull run: the built-in `configs/local.toml` with the node counts,
/// the scheduler at `scheduler_ip`, the servers listening on every address (each gets
/// `--listen HOST_IP:0`). `[tensors.default]` stays `none`: train.py passes its preset's map.
pub fn cluster_config(
    workers: u32,
    servers: u32,
    scheduler_ip: std::net::Ipv4Addr,
) -> CliResult<Config> {
    let mut c = pushpull_launch::local::default_config();
    c.cluster.num_workers = workers;
    c.cluster.num_servers = servers;
    c.cluster.local_size = 1;
    c.cluster.scheduler = format!("{scheduler_ip}:0");
    c.server.listen = "0.0.0.0:0".to_string();
    c.server.advertise = None;
    c.validate("bench train's cluster file")
        .map_err(CliError::usage)?;
    Ok(c)
}

/// The hosts of a pushpull run's scheduler and servers (in that order) for `placement`.
pub fn node_hosts(
    topo: &Topology,
    placement: Placement,
    workers: u32,
    servers: u32,
) -> CliResult<Vec<&Host>> {
    let mut names = Vec::new();
    match placement {
        Placement::Separate => {
            names.push("scheduler".to_string());
            names.extend((0..servers).map(|s| format!("server{s}")));
        }
        Placement::Colocated => {
            names.push("worker0".to_string());
            names.extend((0..servers).map(|s| format!("worker{}", s % workers.max(1))));
        }
    }
    names.iter().map(|n| topo.host(n)).collect()
}

fn place(h: &Host) -> Place {
    Place::Netns {
        ns: h.ns.clone(),
        ip: h.ip.into(),
    }
}

/// The error of a run whose process `first` failed first. A scheduler or server that fails
/// because a worker left is not the cause: when a rank fails within 5 s after it, the rank is
/// named, and the node's exit is added.
async fn blame(
    group: &mut ProcGroup,
    ranks: &[usize],
    hosts: &[&Host],
    first: (usize, ExitStatus),
) -> RunError {
    let on = |i: usize| hosts.get(i).map_or("?", |h| h.name.as_str()).to_string();
    let message = |group: &ProcGroup, (i, status): (usize, ExitStatus)| {
        format!("on {}: {}", on(i), group.failure_message(i, status))
    };
    let mut rank = None;
    if !ranks.contains(&first.0) {
        rank = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(ev) = group.next_event().await {
                if let Event::Exit { proc, status } = ev {
                    if ranks.contains(&proc) && !status.success() {
                        return Some((proc, status));
                    }
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
    }
    match rank {
        Some(r) => {
            let node_tail = group.stderr_tail(first.0).pop().unwrap_or_default();
            RunError {
                process: Some(group.name(r.0).to_string()),
                message: format!(
                    "{}\n(before it, {} on {} exited ({}): {node_tail})",
                    message(group, r),
                    group.name(first.0),
                    on(first.0),
                    first.1
                ),
            }
        }
        None => RunError {
            process: Some(group.name(first.0).to_string()),
            message: message(group, first),
        },
    }
}

/// Runs `plan` once (see the module docs).
pub async fn run_one(ctx: &RunCtx<'_>, plan: &RunPlan, ask: RunAsk) -> Result<Finished, RunError> {
    let setup = ctx.setup;
    let (nw, ns) = (setup.workers, setup.servers);
    let out_dir = tempfile::Builder::new()
        .prefix("pushpull-tta-run-")
        .tempdir()
        .map_err(|e| RunError::new(format!("cannot make a temporary folder: {e}")))?;
    let out = out_dir.path().join("rank0.jsonl");
    let mut args = vec![ctx.script.train_py().display().to_string()];
    args.extend(train_args(
        setup,
        &plan.system,
        ask.seed,
        &out,
        ask.target_bpb,
        ask.time_limit,
    ));
    let worker_hosts: Vec<&Host> = (0..nw)
        .map(|w| ctx.topo.host(&format!("worker{w}")))
        .collect::<CliResult<_>>()
        .map_err(RunError::new)?;
    let worker_places: Vec<Place> = worker_hosts.iter().map(|h| place(h)).collect();
    let common: Vec<(String, OsString)> = vec![
        ("OMP_NUM_THREADS".into(), "1".into()),
        ("PYTHONUNBUFFERED".into(), "1".into()),
    ];

    let mut group = ProcGroup::new();
    if ctx.logs {
        group.forward_stderr(Arc::new(|name: &str, line: &str| {
            eprintln!("[{name}] {line}");
        }));
    }
    let counters_before = ctx.topo.counters().map_err(RunError::new)?;
    let drops = |topo: &Topology| -> u64 {
        worker_hosts
            .iter()
            .map(|h| topo.tbf_drops(h).unwrap_or_default().iter().sum::<u64>())
            .sum()
    };
    let drops_before = drops(ctx.topo);
    let start = Instant::now();
    // The host of every process of the group, by index.
    let mut proc_hosts: Vec<&Host> = Vec::new();
    let mut files: Option<ClusterFiles> = None;
    let python = ctx.script.python();
    let started = async {
        match plan.system.kind {
            Kind::Ddp => {
                let mut ranks = Vec::new();
                for (r, p) in worker_places.iter().enumerate() {
                    let mut env = common.clone();
                    env.extend([
                        ("RANK".to_string(), OsString::from(r.to_string())),
                        ("WORLD_SIZE".to_string(), nw.to_string().into()),
                        (
                            "MASTER_ADDR".to_string(),
                            worker_hosts[0].ip.to_string().into(),
                        ),
                        ("MASTER_PORT".to_string(), ask.port.to_string().into()),
                        ("GLOO_SOCKET_IFNAME".to_string(), "eth0".into()),
                    ]);
                    ranks.push(spawn_at(
                        &mut group,
                        &format!("rank {r}"),
                        p,
                        python,
                        &args,
                        &env,
                    )?);
                    proc_hosts.push(worker_hosts[r]);
                }
                Ok(ranks)
            }
            Kind::PushPull => {
                let placement = plan.placement.unwrap_or(Placement::Separate);
                let hosts = node_hosts(ctx.topo, placement, nw, ns)?;
                let config = cluster_config(nw, ns, hosts[0].ip)?;
                let names = pushpull_launch::certs::default_node_names(ns, nw);
                let f = files.insert(ClusterFiles::new("pushpull-tta-", &config, &names)?);
                let places: Vec<Place> = hosts.iter().map(|h| place(h)).collect();
                let s = nodes::start(&mut group, ctx.programs, f, ns, 0, &places).await?;
                proc_hosts.extend(&hosts);
                let ranks = spawn_ranks(
                    &mut group,
                    f,
                    &s.scheduler_addr,
                    (nw, 1, ns),
                    (Path::new(python), &args),
                    &worker_places,
                    &common,
                )?;
                proc_hosts.extend(&worker_hosts);
                Ok::<_, CliError>(ranks)
            }
        }
    };
    let deadline = tokio::time::Instant::now() + ctx.timeout;
    let timed_out = || {
        RunError::new(format!(
            "the run did not finish within {} s (--run-timeout)",
            ctx.timeout.as_secs()
        ))
    };
    let result = match tokio::time::timeout_at(deadline, started).await {
        Err(_) => Err(timed_out()),
        Ok(Err(e)) => Err(RunError::new(e)),
        Ok(Ok(ranks)) => {
            let pids: Vec<u32> = (0..group.len()).map(|i| group.pid(i)).collect();
            let cpu = RefCell::new(vec![0.0f64; pids.len()]);
            let stop = async {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                loop {
                    tick.tick().await;
                    if interrupted() {
                        return CliError::failed("interrupted by a signal: killed every process");
                    }
                    let mut c = cpu.borrow_mut();
                    for (slot, &pid) in c.iter_mut().zip(&pids) {
                        if let Some(s) = proc_cpu_seconds(pid) {
                            *slot = s;
                        }
                    }
                }
            };
            let logs = ctx.logs;
            let on_line = |r: usize, line: &str| {
                if logs {
                    eprintln!("[rank {r}] {line}");
                }
            };
            let waited =
                tokio::time::timeout_at(deadline, wait_ranks(&mut group, &ranks, on_line, stop))
                    .await;
            match waited {
                Err(_) => Err(timed_out()),
                Ok(Ok(())) => Ok(cpu.into_inner()),
                Ok(Err(Stop::Failed { proc, status })) => {
                    Err(blame(&mut group, &ranks, &proc_hosts, (proc, status)).await)
                }
                Ok(Err(Stop::WindDown)) => Err(RunError::new(
                    "every rank exited 0, but the scheduler or a server was still running 30 s \
                     later",
                )),
                Ok(Err(Stop::Stopped(e))) => Err(RunError::new(e)),
            }
        }
    };
    let cpu = match result {
        Ok(cpu) => cpu,
        Err(e) => {
            // The children die before the next run.
            group.kill_and_reap(Duration::from_secs(5)).await;
            return Err(e);
        }
    };
    let wall_seconds = start.elapsed().as_secs_f64();
    let counters_after = ctx.topo.counters().map_err(RunError::new)?;
    let tbf_drops = drops(ctx.topo).saturating_sub(drops_before);
    drop(files);

    let text = std::fs::read_to_string(&out).map_err(|e| RunError {
        process: Some("rank 0".into()),
        message: format!("exited 0 but its --out file cannot be read: {e}"),
    })?;
    let lines = read_lines(&text).map_err(|e| RunError {
        process: Some("rank 0".into()),
        message: format!("exited 0 but its --out file is incomplete: {e}"),
    })?;
    let mut hosts: Vec<HostBytes> = Vec::new();
    for (i, h) in ctx.topo.hosts.iter().enumerate() {
        if proc_hosts.iter().any(|p| p.ns == h.ns) {
            let (b, a) = (counters_before[i], counters_after[i]);
            hosts.push(HostBytes {
                host: h.name.clone(),
                tx: a.0.saturating_sub(b.0),
                rx: a.1.saturating_sub(b.1),
            });
        }
    }
    let processes = proc_hosts
        .iter()
        .enumerate()
        .map(|(i, h)| ProcCpu {
            process: group.name(i).to_string(),
            host: h.name.clone(),
            cpu_seconds: cpu.get(i).copied().unwrap_or(0.0),
        })
        .collect();
    Ok(Finished {
        lines,
        hosts,
        processes,
        tbf_drops,
        wall_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_0_s_lines_are_read() {
        let text = concat!(
            r#"{"kind": "run", "system": "ddp:none", "world": 2}"#,
            "\n",
            r#"{"kind": "eval", "step": 0, "wall_s": 0.0, "val_bpb": 7.9, "cpu_s_per_step": null, "bytes_per_step": null}"#,
            "\n",
            r#"{"kind": "eval", "step": 10, "wall_s": 1.5, "val_bpb": 5.0, "cpu_s_per_step": 0.1, "bytes_per_step": 4.0}"#,
            "\n",
            r#"{"kind": "end", "reached": false, "step": 10, "wall_s": 1.5, "val_bpb": 5.0, "target_bpb": null, "stopped": "steps", "time_limit_s": null}"#,
            "\n"
        );
        let l = read_lines(text).unwrap();
        assert_eq!(l.run["world"], 2);
        assert_eq!(l.evals.len(), 2);
        assert_eq!(l.end.stopped.as_deref(), Some("steps"));
        assert_eq!(l.end.other["target_bpb"], serde_json::Value::Null);
        let cut = text.lines().take(2).collect::<Vec<_>>().join("\n");
        assert_eq!(read_lines(&cut).unwrap_err(), "no \"end\" line");
        assert!(read_lines("{oops").unwrap_err().starts_with("line 1"));
    }

    #[test]
    fn the_cluster_file_is_valid() {
        let c = cluster_config(4, 4, std::net::Ipv4Addr::new(198, 18, 0, 1)).unwrap();
        assert_eq!(c.cluster.scheduler, "198.18.0.1:0");
        assert_eq!(
            c.tensors.tables["default"]["compressor"].as_str(),
            Some("none")
        );
    }
}
