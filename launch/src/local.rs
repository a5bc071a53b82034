//! `pushpull local`: a whole cluster on this machine, as separate processes of the real
//! binaries on loopback.
//!
//! 1. Makes a throw-away cluster CA and node certificates in a temporary folder and writes the
//!    effective cluster file there ([`super::ClusterFiles`]).
//! 2. Starts the scheduler (it binds port 0 and prints `pushpull-scheduler listening on ADDR`),
//!    then S servers and W workers with `--scheduler ADDR`; every process binds port 0.
//! 3. Drives a progress bar from worker 0's `pushpull-worker progress ...` lines, collects every
//!    worker's JSON report and every process's CPU seconds, and returns a [`LocalSummary`].
//!
//! With `job.kind = "train"` each worker trains ([`pushpull_jobs::train`]) and [`run_compare`] runs the
//! same training once per compressor and seed, each on a fresh cluster, and tabulates the
//! runs ([`CompareReport`]).
//!
//! If any process fails, the others are killed and the error names the failed process with its
//! last stderr lines. Ctrl-C kills everything. See [`crate::procs`] for why children cannot
//! outlive the launcher.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use pushpull_proto::Config;
use serde::{Deserialize, Serialize};

use crate::procs::{Event, ProcGroup, Programs};
use pushpull_jobs::train::compare::{self, CompareReport, RunRow};
use pushpull_jobs::train::TrainReport;
use pushpull_jobs::JobConfig;
use pushpull_node::error::{CliError, CliResult};
use pushpull_node::report::{progress_value, JobReport, PROGRESS_PREFIX, SERVER_LISTENING};

/// The default cluster file of `pushpull local` (configs/local.toml, embedded at build time).
pub const LOCAL_TOML: &str = include_str!("../../configs/local.toml");

/// What to run.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// The cluster file (its `[tls]` is ignored: the launcher makes certificates).
    pub config: Config,
    /// Where the binaries are.
    pub programs: Programs,
    /// Draw a progress bar on stderr (only when stderr is a terminal).
    pub progress_bar: bool,
    /// Forward every child's stderr (logs) to ours, prefixed with its name.
    pub logs: bool,
    /// A name shown before the progress bar (e.g. the compressor of a comparison run).
    pub label: Option<String>,
}

/// What a successful local run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalSummary {
    /// Workers.
    pub num_workers: u32,
    /// Servers.
    pub num_servers: u32,
    /// The scheduler's address.
    pub scheduler: String,
    /// The servers' addresses, in start order.
    pub servers: Vec<String>,
    /// Seconds from the first process start to the last exit.
    pub wall_seconds: f64,
    /// Every worker's report, by rank (`job.kind = "benchmark"`).
    pub workers: Vec<JobReport>,
    /// Every worker's report, by rank (`job.kind = "train"`).
    #[serde(default)]
    pub train: Vec<TrainReport>,
    /// CPU seconds of every process (`scheduler`, `server 0`, …, `worker 0`, …).
    pub cpu_seconds: BTreeMap<String, f64>,
}

impl LocalSummary {
    /// Sum over workers of push + pull payload bytes per second (GB/s, 1e9 bytes).
    pub fn aggregate_payload_gb_per_second(&self) -> f64 {
        self.workers.iter().map(|w| w.payload_gb_per_second).sum()
    }

    /// The human-readable summary.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let w0 = self.workers.first();
        if let Some(w) = w0 {
            s.push_str(&format!(
                "pushpull local: {} workers x {} servers on loopback; {} tensors, {} elements \
                 ({:.1} MB fp32 per worker per round); {} rounds after {} warm-up; seed {}\n",
                self.num_workers,
                self.num_servers,
                w.tensors,
                w.elements,
                w.gradient_bytes_per_round as f64 / 1e6,
                w.rounds,
                w.warmup,
                w.seed
            ));
        }
        for w in &self.workers {
            s.push_str(&format!(
                "  worker {}: {:.3} rounds/s, gradient {:.3} GB/s, push+pull payload {:.3} GB/s, \
                 check {}; {} buffers, compressed on {}{}; codec s/round: compress {:.4}, \
                 decompress {:.4}\n",
                w.rank,
                w.rounds_per_second,
                w.gradient_gb_per_second,
                w.payload_gb_per_second,
                w.check,
                w.buffers,
                w.compressed_on,
                if w.buffers == "host" {
                    String::new()
                } else {
                    format!(", {:.0} driver calls/round", w.driver_calls_per_round)
                },
                w.compress_seconds / f64::from(w.rounds.max(1)),
                w.decompress_seconds / f64::from(w.rounds.max(1)),
            ));
        }
        s.push_str(&format!(
            "  all workers: push+pull payload {:.3} GB/s\n",
            self.aggregate_payload_gb_per_second()
        ));
        s.push_str("  CPU seconds:");
        for (name, cpu) in &self.cpu_seconds {
            s.push_str(&format!(" {name} {cpu:.2};"));
        }
        s.pop();
        s.push('\n');
        s.push_str(&format!(
            "all {} processes exited 0 in {:.1} s",
            1 + self.num_servers + self.num_workers,
            self.wall_seconds
        ));
        s
    }
}

/// The embedded default cluster file, parsed.
pub fn default_config() -> Config {
    Config::from_toml_str(LOCAL_TOML, "configs/local.toml (built in)")
        .expect("configs/local.toml is a valid cluster file")
}

/// Runs the cluster to the end. Must be called on a runtime whose thread outlives the run
/// (see [`crate::procs`]); the CLI uses a current-thread runtime.
pub async fn run_local(opts: &LocalOptions) -> CliResult<LocalSummary> {
    let config = &opts.config;
    let (nw, ns) = (config.cluster.num_workers, config.cluster.num_servers);
    let names = crate::certs::default_node_names(ns, nw);
    let files = super::ClusterFiles::new("pushpull-local-", config, &names)?;

    let job = JobConfig::of(config).map_err(CliError::usage)?;
    let training = job.kind == "train";
    let total_rounds = if training {
        job.steps
    } else {
        job.warmup + job.rounds
    };
    let bar = if opts.progress_bar {
        ProgressBar::new(total_rounds as u64)
    } else {
        ProgressBar::hidden()
    };
    let template = format!(
        "{{spinner}} [{{elapsed_precise}}] {}{{bar:30}} {{pos}}/{{len}} {} {{msg}}",
        opts.label
            .as_deref()
            .map(|l| format!("{l:<10} "))
            .unwrap_or_default(),
        if training { "steps" } else { "rounds" }
    );
    bar.set_style(ProgressStyle::with_template(&template).expect("valid template"));
    bar.enable_steady_tick(Duration::from_millis(200));

    let mut group = ProcGroup::new();
    if opts.logs {
        let bar = bar.clone();
        group.forward_stderr(Arc::new(move |name: &str, line: &str| {
            bar.suspend(|| eprintln!("[{name}] {line}"));
        }));
    }
    let start = Instant::now();
    let result = run_group(opts, training, &mut group, &bar, &files).await;
    bar.finish_and_clear();
    let (scheduler, servers, (workers, train), cpu) = match result {
        Ok(r) => r,
        Err(e) => {
            group.kill_all();
            return Err(e);
        }
    };
    Ok(LocalSummary {
        num_workers: nw,
        num_servers: ns,
        scheduler,
        servers,
        wall_seconds: start.elapsed().as_secs_f64(),
        workers,
        train,
        cpu_seconds: cpu,
    })
}

type GroupResult = (
    String,
    Vec<String>,
    (Vec<JobReport>, Vec<TrainReport>),
    BTreeMap<String, f64>,
);

async fn run_group(
    opts: &LocalOptions,
    training: bool,
    group: &mut ProcGroup,
    bar: &ProgressBar,
    files: &super::ClusterFiles,
) -> CliResult<GroupResult> {
    let config = &opts.config;
    let (nw, ns) = (config.cluster.num_workers, config.cluster.num_servers);
    bar.set_message("starting the scheduler");
    let started = super::nodes::start(group, &opts.programs, files, ns, nw, &[]).await?;
    let (sched_addr, server_idx, worker_idx) =
        (started.scheduler_addr, started.servers, started.workers);
    bar.set_message(format!(
        "waiting for {ns} servers and {nw} workers to register and declare"
    ));

    let mut servers = vec![String::new(); ns as usize];
    let mut reports: Vec<Option<JobReport>> = vec![None; nw as usize];
    let mut train_reports: Vec<Option<TrainReport>> = vec![None; nw as usize];
    let mut cpu = BTreeMap::new();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let ev = tokio::select! {
            ev = group.next_event() => ev,
            _ = &mut ctrl_c => {
                group.kill_all();
                return Err(CliError::failed("interrupted (Ctrl-C): killed every process of the cluster"));
            }
        };
        let Some(ev) = ev else { break };
        match ev {
            Event::Line { proc, line } => {
                if let Some(addr) = line.strip_prefix(SERVER_LISTENING) {
                    if let Some(s) = server_idx.iter().position(|&i| i == proc) {
                        servers[s] = addr.trim().to_string();
                    }
                } else if let Some(rest) = line.strip_prefix(PROGRESS_PREFIX) {
                    if worker_idx.first() == Some(&proc) {
                        if let Some(done) = progress_value(rest, "round") {
                            bar.set_message("");
                            bar.set_position(done);
                        }
                    }
                } else if let Some(rest) = line
                    .strip_prefix("pushpull-scheduler cpu_seconds ")
                    .or_else(|| line.strip_prefix("pushpull-server cpu_seconds "))
                {
                    if let Ok(c) = rest.trim().parse::<f64>() {
                        cpu.insert(group.name(proc).to_string(), c);
                    }
                } else if line.starts_with('{') {
                    if let Some(w) = worker_idx.iter().position(|&i| i == proc) {
                        let unreadable = |e: serde_json::Error| {
                            CliError::failed(format!(
                                "worker {w} printed an unreadable report: {e}"
                            ))
                        };
                        if training {
                            let report: TrainReport =
                                serde_json::from_str(&line).map_err(unreadable)?;
                            cpu.insert(group.name(proc).to_string(), report.cpu_seconds);
                            train_reports[w] = Some(report);
                        } else {
                            let report: JobReport =
                                serde_json::from_str(&line).map_err(unreadable)?;
                            cpu.insert(group.name(proc).to_string(), report.cpu_seconds);
                            reports[w] = Some(report);
                        }
                    }
                }
            }
            Event::Exit { proc, status } => {
                if !status.success() {
                    let msg = group.failure_message(proc, status);
                    group.kill_all();
                    return Err(CliError::failed(format!("pushpull local: {msg}")));
                }
            }
        }
    }
    fn all<T>(reports: Vec<Option<T>>) -> CliResult<Vec<T>> {
        reports
            .into_iter()
            .enumerate()
            .map(|(w, r)| {
                r.ok_or_else(|| CliError::failed(format!("worker {w} exited 0 without a report")))
            })
            .collect()
    }
    let reports = if training {
        (Vec::new(), all(train_reports)?)
    } else {
        (all(reports)?, Vec::new())
    };
    Ok((sched_addr, servers, reports, cpu))
}

/// One run of a training comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunSpec {
    /// A compressor preset ([`pushpull_jobs::train::compare::preset`]) with the `--param` overrides.
    Preset(String),
    /// The logistic-regression baseline, uncompressed.
    Baseline,
    /// The cluster file's own `[tensors]` maps (with the `--param` overrides), named by its
    /// `compressor`.
    AsConfigured,
}

impl RunSpec {
    /// Parses a `--compare` item: a preset name or `logistic`.
    ///
    /// # Errors
    /// An unknown name, naming it and what is allowed.
    pub fn parse(name: &str) -> CliResult<RunSpec> {
        let name = name.trim();
        if name == compare::BASELINE {
            return Ok(RunSpec::Baseline);
        }
        compare::preset(name)
            .map(|_| RunSpec::Preset(name.to_string()))
            .map_err(|e| CliError::usage(format!("{e}, or {}", compare::BASELINE)))
    }

    /// The row name.
    pub fn name(&self, config: &Config) -> String {
        match self {
            RunSpec::Preset(p) => p.clone(),
            RunSpec::Baseline => compare::BASELINE.to_string(),
            RunSpec::AsConfigured => config
                .tensors
                .tables
                .get("default")
                .and_then(|t| {
                    t.get("compressor")
                        .or_else(|| t.get("byteps_compressor_type"))
                })
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| "none".to_string()),
        }
    }

    /// The cluster file of this run: `base` with the run's `[tensors.default]` (the preset with
    /// `params` on top; the baseline also switches `job.model` to `logistic`), validated.
    ///
    /// # Errors
    /// A map or value the config validation refuses (exit code 2).
    pub fn config(&self, base: &Config, params: &[(String, String)]) -> CliResult<Config> {
        let mut c = base.clone();
        let mut map: std::collections::BTreeMap<String, String> = match self {
            RunSpec::Preset(p) => compare::preset(p).map_err(CliError::usage)?,
            RunSpec::Baseline => {
                JobConfig::edit(&mut c, |j| j.model = "logistic".to_string())
                    .map_err(CliError::usage)?;
                compare::preset("none").map_err(CliError::usage)?
            }
            RunSpec::AsConfigured => c
                .tensors
                .tables
                .get("default")
                .map(|t| {
                    t.iter()
                        .map(|(k, v)| {
                            let v = match v {
                                toml::Value::String(s) => s.clone(),
                                other => other.to_string(),
                            };
                            (k.clone(), v)
                        })
                        .collect()
                })
                .unwrap_or_default(),
        };
        if *self != RunSpec::Baseline {
            for (k, v) in params {
                map.insert(k.clone(), v.clone());
            }
        }
        compare::set_default_map(&mut c, &map);
        c.validate(&format!("the cluster file of run {:?}", self.name(base)))
            .map_err(CliError::usage)?;
        Ok(c)
    }
}

/// A training comparison: every run × seed on a fresh local cluster.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// The cluster file (`job.kind = "train"`), programs, progress bar and logs.
    pub local: LocalOptions,
    /// The runs, in table order.
    pub runs: Vec<RunSpec>,
    /// Seeds per run: `cluster.seed` (42 when unset), +1, +2, ...
    pub seeds: u32,
    /// `--param` overrides of every compressed run's map.
    pub params: Vec<(String, String)>,
}

/// Runs every run of `opts` for every seed, one fresh local cluster each, and tabulates them.
///
/// # Errors
/// A bad map (exit 2) or a failed run (its error, naming the run and seed).
pub async fn run_compare(opts: &CompareOptions) -> CliResult<CompareReport> {
    let base = &opts.local.config;
    let first_seed = base.cluster.seed.unwrap_or(42);
    // Check every run's map before starting anything.
    let configs = opts
        .runs
        .iter()
        .map(|r| r.config(base, &opts.params).map(|c| (r.name(base), c)))
        .collect::<CliResult<Vec<_>>>()?;
    let mut rows = Vec::new();
    let (mut widths, mut params) = (Vec::new(), 0u64);
    for (name, config) in &configs {
        for s in 0..opts.seeds.max(1) {
            let seed = first_seed.wrapping_add(s as u64);
            let mut local = opts.local.clone();
            local.config = config.clone();
            local.config.cluster.seed = Some(seed);
            local.label = Some(name.clone());
            let summary = run_local(&local).await.map_err(|e| match e {
                CliError::Failed(m) => {
                    CliError::failed(format!("run {name:?} with seed {seed}: {m}"))
                }
                other => other,
            })?;
            if let Some(r) = summary.train.first() {
                if r.model == "mlp" && widths.is_empty() {
                    widths = r.widths.clone();
                    params = r.params;
                }
            }
            rows.push(RunRow::from_reports(
                name,
                &summary.train,
                summary.wall_seconds,
            ));
        }
    }
    Ok(CompareReport::new(
        base.cluster.num_workers,
        base.cluster.num_servers,
        widths,
        params,
        rows,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_config_parses_and_round_trips() {
        let c = default_config();
        assert_eq!(c.cluster.scheduler, "127.0.0.1:0");
        let dir = tempfile::tempdir().unwrap();
        let path = crate::write_config(&c, dir.path()).unwrap();
        let back = Config::from_file(&path).unwrap();
        assert_eq!(back, c);
    }
}
