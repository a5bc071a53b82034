//! `pushpull bench net`: the cluster on a real, shaped network. Every node (scheduler, S
//! servers, W workers) runs in its own network namespace, linked to a bridge by a veth pair
//! shaped with `tc ... tbf` on both ends; the benchmark push_pulls the ResNet-50-like tensor
//! set per compressor and at several sizes and server counts, and compares seconds per round
//! with the wire floor of the links. Needs root (it creates namespaces); cleans up after itself,
//! also on Ctrl-C and on failure.
//!
//! | module | what it holds |
//! |---|---|
//! | here | [`NetArgs`] (the command line), the compressor presets [`PRESETS`], the plan of runs and [`run`] (the command) |
//! | [`topo`] | [`topo::Topology`]: namespaces, bridge, veth pairs, tbf; teardown on drop; the signal flag; `ip`/`tc` command runner |
//! | [`probe`] | the once-per-network measurement of every link's achieved rate (timed TCP transfers from threads that `setns` into the hosts) |
//! | [`cluster`] | one cluster run of the real binaries via `ip netns exec`, with counters and CPU times read at the timed rounds' boundaries |
//! | [`report`] | [`report::RunRow`]: floor, ratio, CPU-bound verdict, first-layer time, CPU per GB, bytes per host; the text table |
//! | [`baseline`] | [`baseline::TransportCost`]: CPU per GB of raw quinn (the cluster's settings) and plain TCP on the same network |
//! | [`train`] | `--job train`: the training job per compressor and seed, next to the compute alone |
//! | [`plot`] | `--plot FILE.svg`: the tables as charts |
//! | `series` | the runs of one network: benchmark series, training runs, peers |
//! | [`peers`] | `--peers PYTHON`: gloo's all_reduce and a naive parameter server on gloo, on the same network |
//!
//! One run per (rate, compressor) in the compressor series, and per size and per server count
//! in the scaling series (at one rate and one compressor); with `--job train`, one training
//! run per (rate, compressor, seed) plus one without push_pull per seed. Each network (one per
//! rate) is created once, its links measured once (TCP rate and CPU), raw quinn's CPU per GB
//! measured once, and deleted before the next.

pub mod baseline;
pub mod cluster;
pub mod peers;
mod plan;
pub mod plot;
pub mod probe;
pub mod report;
mod series;
pub mod topo;
pub mod train;

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};

use baseline::{quinn_cost, TransportCost};
use cluster::RunLimits;
use peers::{peer_table, PeerRow, PeerScript};
use plan::setup;
use probe::{measure_links, LinkRate};
use pushpull_launch::procs::Programs;
use pushpull_node::error::{CliError, CliResult};
use report::{host_lines, table, RunRow};
use series::{run_benchmarks, run_peers, run_training, NetCtx};
use topo::{check_interrupted, Shaping, Topology};
use train::{train_table, TrainRow};

pub use plan::{run_config, scale_for_mb};

/// The compressor presets of the benchmark: name and `[tensors.default]` parameter map.
pub const PRESETS: &[(&str, &[(&str, &str)])] = &[
    ("none", &[("compressor", "none")]),
    ("fp16", &[("compressor", "fp16")]),
    ("onebit", &[("compressor", "onebit"), ("scaling", "true")]),
    ("topk", &[("compressor", "topk"), ("k", "0.01")]),
    ("randomk", &[("compressor", "randomk"), ("k", "0.01")]),
    (
        "dithering",
        &[
            ("compressor", "dithering"),
            ("k", "4"),
            ("encoding", "packed"),
        ],
    ),
    (
        "dithering-elias",
        &[
            ("compressor", "dithering"),
            ("k", "4"),
            ("encoding", "elias"),
        ],
    ),
    ("minmax", &[("compressor", "minmax"), ("bits", "8")]),
];

/// The parameter map of preset `name`.
pub fn preset(name: &str) -> CliResult<BTreeMap<String, String>> {
    PRESETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, kv)| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .ok_or_else(|| {
            CliError::usage(format!(
                "unknown compressor preset {name:?}; known: {}",
                PRESETS
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// `pushpull bench net`.
#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Needs root. Example, a quick run: pushpull bench net --rates 100mbit \
                  --compressors none,onebit --scale 0.1 --rounds 2 --skip-scaling"
)]
pub struct NetArgs {
    /// Link rates to run at, comma-separated (tc units: kbit, mbit, gbit); one network each.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "100mbit,1gbit"
    )]
    pub rates: Vec<String>,
    /// Workers, each on its own host (or G to a host with --local-size G).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub workers: u32,
    /// Workers per host: groups of G workers share one namespace and its one link, and run as
    /// local groups (`cluster.local_size`: summed on the host, one push per host per chunk).
    #[arg(long, value_name = "G", default_value_t = 1)]
    pub local_size: u32,
    /// With --local-size: after each compressor's run, run it again on the same hosts with every
    /// worker pushing on its own (`local_size = 1`, flat), for the ratio in one sitting.
    #[arg(long)]
    pub compare_flat: bool,
    /// Servers of the compressor series, each on its own host.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub servers: u32,
    /// Compressor presets, comma-separated. Benchmark (default none,fp16,onebit,topk,randomk,
    /// dithering,minmax): onebit, topk = 1 %, randomk = 1 %, dithering = s 4 packed, minmax =
    /// 8 bit. Training (default none,onebit,topk): the presets of `pushpull local
    /// --compressor` (error feedback and Nesterov momentum where they help).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub compressors: Option<Vec<String>>,
    /// What runs: `benchmark` (push_pull of the ResNet-50 tensor set) or `train` (the MLP
    /// training job per compressor and seed, and once per seed without push_pull).
    #[arg(long, value_name = "JOB", default_value = "benchmark", value_parser = ["benchmark", "train"])]
    pub job: String,
    /// Training: job seeds, one run per compressor and seed.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "42,43,44"
    )]
    pub seeds: Vec<u64>,
    /// Training: hidden widths of the MLP.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "1024,1024"
    )]
    pub hidden: Vec<u32>,
    /// Training: samples per worker per step.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub batch_size: u32,
    /// Training: SGD steps per run.
    #[arg(long, value_name = "N", default_value_t = 300)]
    pub steps: u32,
    /// MTU of every shaped link, bytes (1500: Ethernet; 9000: jumbo frames).
    #[arg(long, value_name = "BYTES", default_value_t = topo::DEFAULT_MTU)]
    pub mtu: u32,
    /// Seconds of raw quinn per network (every worker host sending to every server host with
    /// the cluster's transport settings), for CPU per GB next to pushpull's; 0 skips it.
    #[arg(long, value_name = "S", default_value_t = 5.0)]
    pub baseline_seconds: f64,
    /// A Python interpreter with PyTorch (e.g. a virtual environment's `bin/python`): after the
    /// compressor series of each network, run on the same hosts gloo's all_reduce among the
    /// workers and a naive parameter server on gloo (4 MB pieces), uncompressed and moving each
    /// compressed run's pushed bytes, and print them next to pushpull (bench/gloo_peers.py).
    #[arg(long, value_name = "PYTHON")]
    pub peers: Option<std::path::PathBuf>,
    /// Also draw the results as charts into this SVG file.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<std::path::PathBuf>,
    /// Fraction of the ResNet-50 tensor set (1.0 = 25.6 M fp32 = 102 MB per worker per round)
    /// of the compressor series and the server-count runs.
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    pub scale: f64,
    /// Timed rounds per run.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub rounds: u32,
    /// Warm-up rounds per run (at least 1: its end is where the counters start).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub warmup: u32,
    /// Skip the compressor series.
    #[arg(long)]
    pub skip_compressors: bool,
    /// Skip the scaling series.
    #[arg(long)]
    pub skip_scaling: bool,
    /// Compressor preset of the scaling series.
    #[arg(long, value_name = "NAME", default_value = "onebit")]
    pub scaling_compressor: String,
    /// Sizes of the scaling series, MB (1e6 bytes) of fp32 per worker per round.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "1,10,100,400"
    )]
    pub scaling_sizes: Vec<f64>,
    /// Server counts of the scaling series (at --scale).
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "1,2,4"
    )]
    pub scaling_servers: Vec<u32>,
    /// The rate of the scaling series (one of --rates; default the first).
    #[arg(long, value_name = "RATE")]
    pub scaling_rate: Option<String>,
    /// Seconds of each link-rate probe (one TCP transfer per host; 0: assume the nominal rate).
    #[arg(long, value_name = "S", default_value_t = 1.0)]
    pub probe_seconds: f64,
    /// Check every result bit for bit against the single-process reference (costs CPU on
    /// every worker).
    #[arg(long)]
    pub check: bool,
    /// A cluster file to start from (default: configs/local.toml, built in); the benchmark sets
    /// the addresses, node counts, `[job]` and `[tensors.default]`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// Longest one run may take, seconds.
    #[arg(long, value_name = "S", default_value_t = 900)]
    pub run_timeout: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Run nothing: read a report saved with `--json` from this file and print its tables (and
    /// draw `--plot`) again. Needs no root.
    #[arg(long, value_name = "FILE")]
    pub from_json: Option<std::path::PathBuf>,
    /// Show every process's log lines (stderr), prefixed with its name.
    #[arg(long)]
    pub logs: bool,
}

/// A run that failed or was skipped.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunFailure {
    /// `compressors` or `scaling`.
    pub series: String,
    /// Preset.
    pub compressor: String,
    /// Rate label.
    pub rate: String,
    /// Workers x servers.
    pub workers: u32,
    /// Servers.
    pub servers: u32,
    /// Workers per local group (1: flat).
    #[serde(default = "one")]
    pub local_size: u32,
    /// fp32 MB per worker per round.
    pub mb_per_worker: f64,
    /// Why.
    pub error: String,
}

/// One shaped network and its measured links.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Network {
    /// Rate label as given.
    pub rate: String,
    /// MTU of every link, bytes.
    pub mtu: u32,
    /// What plain TCP cost in CPU during the link-rate probes (when they ran).
    pub tcp: Option<TransportCost>,
    /// What raw quinn with the cluster's settings cost (`--baseline-seconds`).
    pub quinn: Option<TransportCost>,
    /// tbf rate, bits/s.
    pub rate_bits: u64,
    /// tbf burst, bytes.
    pub burst_bytes: u64,
    /// tbf queue limit, bytes.
    pub limit_bytes: u64,
    /// Whether `links` was measured (else nominal).
    pub measured: bool,
    /// Every host's achieved rate.
    pub links: Vec<LinkRate>,
}

/// The machine the benchmark ran on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    /// Cores (`nproc`).
    pub cores: usize,
    /// `uname -r`.
    pub kernel: String,
    /// Available memory at the start, bytes.
    pub mem_available_bytes: u64,
    /// 1-, 5-, 15-minute load averages at the start.
    pub load_start: [f64; 3],
    /// ... and at the end.
    pub load_end: [f64; 3],
    /// How the harness (and so the scheduler and servers it starts) was compiled: `release`,
    /// or `debug`, whose nodes compress several times slower. Empty in reports saved before
    /// it was recorded.
    #[serde(default)]
    pub build_profile: String,
}

impl Machine {
    /// The machine now, as a benchmark starts (`load_end` is the same as `load_start` until
    /// [`Machine::finish`]); warns on stderr, naming `bench`, when this is a debug build.
    pub fn at_start(bench: &str) -> Machine {
        let load = load_average();
        let build_profile = if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        };
        if cfg!(debug_assertions) {
            eprintln!(
                "pushpull bench {bench}: warning: a debug build (its nodes compress several \
                 times slower); measure with `cargo build --release`"
            );
        }
        Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_string(),
            mem_available_bytes: mem_available(),
            load_start: load,
            load_end: load,
            build_profile: build_profile.to_string(),
        }
    }

    /// Records the load average at the end.
    pub fn finish(&mut self) {
        self.load_end = load_average();
    }
}

/// What `pushpull bench net --json` prints.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct NetReport {
    /// The machine.
    pub machine: Machine,
    /// The networks, one per rate.
    pub networks: Vec<Network>,
    /// Every finished benchmark run.
    pub runs: Vec<RunRow>,
    /// Every finished training run (`--job train`).
    #[serde(default)]
    pub train_runs: Vec<TrainRow>,
    /// Every finished peer run (`--peers`).
    #[serde(default)]
    pub peer_runs: Vec<PeerRow>,
    /// Runs that failed or were skipped.
    pub failures: Vec<RunFailure>,
}

/// Serde's default of a missing `local_size` (reports saved before groups existed: flat).
pub(crate) fn one() -> u32 {
    1
}

/// 1-, 5-, 15-minute load averages.
pub fn load_average() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut it = text
        .split_whitespace()
        .map(|x| x.parse::<f64>().unwrap_or(0.0));
    [
        it.next().unwrap_or(0.0),
        it.next().unwrap_or(0.0),
        it.next().unwrap_or(0.0),
    ]
}

/// `MemAvailable` in bytes.
pub fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The hosts of a network and the nodes each runs: the scheduler's, one per server, and one
/// per worker (`worker<w>`) or, with `local_size` G > 1, one per G workers (`host<h>` running
/// `worker<hG>`..`worker<hG+G-1>`).
pub fn host_names(servers: u32, workers: u32, local_size: u32) -> Vec<(String, Vec<String>)> {
    let one = |n: String| (n.clone(), vec![n]);
    let mut hosts = vec![one("scheduler".to_string())];
    hosts.extend((0..servers).map(|s| one(format!("server{s}"))));
    let g = local_size.max(1);
    if g == 1 {
        hosts.extend((0..workers).map(|w| one(format!("worker{w}"))));
    } else {
        hosts.extend((0..workers / g).map(|h| {
            let nodes = (h * g..(h + 1) * g).map(|w| format!("worker{w}")).collect();
            (format!("host{h}"), nodes)
        }));
    }
    hosts
}

/// `pushpull bench net`: validates the flags, then for every rate builds the network, measures
/// its links and raw quinn's cost, runs the plan (benchmark or training), deletes the network;
/// prints the tables (or JSON) and draws the plot. Exit code 1 if any run failed (the others
/// are still reported).
pub fn run(args: NetArgs) -> CliResult<()> {
    if let Some(path) = &args.from_json {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::usage(format!("--from-json {}: {e}", path.display())))?;
        let report: NetReport = serde_json::from_str(&text).map_err(|e| {
            CliError::usage(format!(
                "--from-json {}: not a `bench net --json` report: {e}",
                path.display()
            ))
        })?;
        return print_report(&args, &report);
    }
    let setup = setup(&args)?;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(CliError::usage(
            "pushpull bench net needs root: it creates network namespaces, veth pairs and tc \
             qdiscs (nothing outside its own namespaces is changed)",
        ));
    }
    topo::install_signal_handlers();
    for ns in topo::remove_stale()? {
        eprintln!("pushpull bench net: deleted namespace {ns} left behind by a killed run");
    }
    let programs = Programs::from_current_exe()?;
    let mut machine = Machine::at_start("net");
    let cores = machine.cores;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::failed(format!("cannot start a tokio runtime: {e}")))?;
    let limits = RunLimits {
        timeout: Duration::from_secs(args.run_timeout.max(1)),
        logs: args.logs,
    };

    let mut networks = Vec::new();
    let mut rows: Vec<RunRow> = Vec::new();
    let mut train_rows: Vec<TrainRow> = Vec::new();
    let mut peer_runs: Vec<PeerRow> = Vec::new();
    let mut failures = Vec::new();
    let mut peer_script = match (&args.peers, &setup.train) {
        (Some(python), None) => Some(PeerScript::new(python)?),
        (Some(_), Some(_)) => {
            return Err(CliError::usage(
                "--peers runs next to the benchmark job, not --job train",
            ))
        }
        (None, _) => None,
    };
    for (rate, bits) in &setup.rates {
        let plans = setup.plans.get(rate).map_or(0, Vec::len);
        if plans == 0 && setup.train.is_none() {
            continue;
        }
        let max_servers = setup
            .plans
            .get(rate)
            .into_iter()
            .flatten()
            .map(|p| p.servers)
            .max()
            .unwrap_or(args.servers)
            .max(args.servers);
        let hosts = host_names(max_servers, args.workers, args.local_size);
        let shaping = Shaping {
            rate_bits: *bits,
            mtu: args.mtu,
        };
        eprintln!(
            "pushpull bench net: {rate}: {} hosts, {}, MTU {}",
            hosts.len(),
            shaping.tbf_args().join(" "),
            shaping.mtu
        );
        let mut topo = Topology::with_nodes(&hosts, shaping)?;
        let (links, tcp) = if args.probe_seconds > 0.0 {
            eprintln!(
                "pushpull bench net: {rate}: measuring every link ({:.1} s each)",
                args.probe_seconds
            );
            let (links, tcp) = measure_links(&topo, args.probe_seconds)?;
            (links, Some(tcp))
        } else {
            let nominal = topo
                .hosts
                .iter()
                .map(|h| LinkRate {
                    host: h.name.clone(),
                    up_bits_per_second: *bits as f64,
                    down_bits_per_second: *bits as f64,
                })
                .collect();
            (nominal, None)
        };
        eprintln!("pushpull bench net: {rate}: {}", links_summary(&links));
        let quinn = if args.baseline_seconds > 0.0 {
            eprintln!(
                "pushpull bench net: {rate}: raw quinn, {} workers to {} servers, about {:.0} s",
                args.workers, args.servers, args.baseline_seconds
            );
            let cost = rt.block_on(quinn_cost(
                &topo,
                &setup.base,
                &programs,
                (args.workers, args.servers),
                *bits,
                args.baseline_seconds,
            ));
            match cost {
                Ok(c) => {
                    eprintln!(
                        "pushpull bench net: {rate}: raw quinn {:.2} CPU-s per GB sent + received",
                        c.cpu_seconds_per_gb
                    );
                    Some(c)
                }
                Err(e) => {
                    check_interrupted()?;
                    eprintln!("pushpull bench net: {rate}: raw quinn failed: {e}");
                    failures.push(RunFailure {
                        series: "baseline".into(),
                        compressor: "raw quinn".into(),
                        rate: rate.clone(),
                        workers: args.workers,
                        servers: args.servers,
                        local_size: args.local_size,
                        mb_per_worker: 0.0,
                        error: e.to_string(),
                    });
                    None
                }
            }
        } else {
            None
        };
        networks.push(Network {
            rate: rate.clone(),
            mtu: args.mtu,
            tcp,
            quinn,
            rate_bits: *bits,
            burst_bytes: shaping.burst_bytes(),
            limit_bytes: shaping.limit_bytes(),
            measured: args.probe_seconds > 0.0,
            links: links.clone(),
        });
        let ctx = NetCtx {
            args: &args,
            topo: &topo,
            rate,
            links: &links,
            programs: &programs,
            limits: &limits,
            cores,
        };
        match &setup.train {
            Some(plan) => run_training(&ctx, &rt, &setup, plan, &mut train_rows, &mut failures)?,
            None => run_benchmarks(&ctx, &rt, &setup, &mut rows, &mut failures)?,
        }
        if let Some(script) = &mut peer_script {
            run_peers(&ctx, &rt, script, &rows, &mut peer_runs, &mut failures)?;
        }
        let errors = topo.teardown();
        if !errors.is_empty() {
            return Err(CliError::failed(format!(
                "could not delete every namespace: {}",
                errors.join("; ")
            )));
        }
    }
    let report = NetReport {
        machine: {
            machine.finish();
            machine
        },
        networks,
        runs: rows,
        train_runs: train_rows,
        peer_runs,
        failures,
    };
    print_report(&args, &report)?;
    if report
        .failures
        .iter()
        .any(|f| !f.error.starts_with("skipped"))
    {
        return Err(CliError::failed(format!(
            "{} of the runs failed (see above)",
            report.failures.len()
        )));
    }
    Ok(())
}

/// Prints the report (table or `--json`) and draws `--plot`.
fn print_report(args: &NetArgs, report: &NetReport) -> CliResult<()> {
    if args.json {
        print_stdout(&serde_json::to_string(report).expect("report serializes"));
    } else {
        print_stdout(&to_text(report));
    }
    if let Some(path) = &args.plot {
        plot::draw(path, &report.runs, &report.train_runs)?;
        eprintln!("pushpull bench net: plot written to {}", path.display());
    }
    Ok(())
}

fn print_stdout(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

fn links_summary(links: &[LinkRate]) -> String {
    let mbit = |x: f64| x / 1e6;
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for l in links {
        for r in [l.up_bits_per_second, l.down_bits_per_second] {
            lo = lo.min(r);
            hi = hi.max(r);
        }
    }
    format!(
        "links achieve {:.1}-{:.1} Mbit/s of TCP payload ({} hosts, up and down)",
        mbit(lo),
        mbit(hi),
        links.len()
    )
}

/// The human-readable report: machine, networks, the table, per-host details, failures.
pub fn to_text(r: &NetReport) -> String {
    let m = &r.machine;
    let mut s = format!(
        "pushpull bench net: {} cores, kernel {}, {:.1} GB available; load average {:.2} {:.2} \
         {:.2} at the start, {:.2} {:.2} {:.2} at the end\n",
        m.cores,
        m.kernel,
        m.mem_available_bytes as f64 / 1e9,
        m.load_start[0],
        m.load_start[1],
        m.load_start[2],
        m.load_end[0],
        m.load_end[1],
        m.load_end[2]
    );
    for n in &r.networks {
        s.push_str(&format!(
            "network {}: tbf rate {} bit/s burst {} B limit {} B on both ends of every veth, MTU \
             {}; {}{}\n",
            n.rate,
            n.rate_bits,
            n.burst_bytes,
            n.limit_bytes,
            n.mtu,
            links_summary(&n.links),
            if n.measured {
                ""
            } else {
                " (nominal, not measured)"
            }
        ));
        for c in [&n.tcp, &n.quinn].into_iter().flatten() {
            s.push_str(&format!(
                "  {} transport: {:.1} MB in {:.1} s, {:.2} CPU-s, {:.2} CPU-s per GB sent + \
                 received\n",
                c.transport,
                c.bytes as f64 / 1e6,
                c.seconds,
                c.cpu_seconds,
                c.cpu_seconds_per_gb
            ));
        }
    }
    let quinn = |rate: &str| {
        r.networks
            .iter()
            .find(|n| n.rate == rate)
            .and_then(|n| n.quinn.as_ref())
            .map(|q| q.cpu_seconds_per_gb)
    };
    if !r.runs.is_empty() {
        s.push('\n');
        s.push_str(&table(&r.runs, &quinn));
        s.push('\n');
        for row in &r.runs {
            s.push_str(&host_lines(row));
        }
    }
    if !r.train_runs.is_empty() {
        s.push('\n');
        s.push_str(&train_table(&r.train_runs));
    }
    if !r.peer_runs.is_empty() {
        s.push('\n');
        s.push_str(&peer_table(&r.peer_runs));
    }
    for f in &r.failures {
        s.push_str(&format!(
            "FAILED {} {} {}x{} {:.1} MB/worker ({}): {}\n",
            f.rate, f.compressor, f.workers, f.servers, f.mb_per_worker, f.series, f.error
        ));
    }
    s.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_make_valid_cluster_files() {
        let base = pushpull_launch::local::default_config();
        for (name, _) in PRESETS {
            let c =
                run_config(&base, (4, 4, 1), 1.0, (5, 1, false), &preset(name).unwrap()).unwrap();
            assert_eq!(c.cluster.num_workers, 4);
            assert_eq!(
                c.tensors.tables["default"]["compressor"].as_str(),
                Some(name.split('-').next().unwrap())
            );
        }
        assert!(preset("zip").unwrap_err().to_string().contains("onebit"));
    }

    #[test]
    fn sizes_map_to_scales() {
        assert!((scale_for_mb(102.228128) - 1.0).abs() < 1e-6);
    }
}
