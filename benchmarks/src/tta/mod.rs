//! `pushpull bench train`: time to accuracy on a shaped network. The same training script
//! (`bench/tta/train.py`: the same seeds, data order, initial model, one thread and optimizer
//! settings for every system) runs once per worker host, once per system, in one sitting:
//! pushpull with its presets, with the scheduler and servers on hosts of their own and also
//! colocated in the workers' namespaces, and torch DDP on gloo with its hooks. Rank 0 records
//! validation bits per byte against the training clock; the harness adds each worker host's
//! veth bytes and every process's CPU seconds, and reports time and steps to the target and the
//! speed-up over DDP fp32. Needs root (namespaces, as `bench net`); `--from-json` needs none.
//!
//! | module | what it holds |
//! |---|---|
//! | here | [`TrainArgs`] (the command line) and [`run()`] (the sitting: per rate a network, per seed the reference first, then every system) |
//! | [`plan`] | the flags checked, the systems checked against the script's own list ([`plan::Catalog`]), `--quick`, the order of the runs |
//! | [`script`] | `train.py` and its modules embedded and written out, `--list-systems` and `--check` before anything starts, a run's arguments |
//! | [`run`](mod@run) | one run of one system in the namespaces: the processes, the counters, rank 0's JSON lines |
//! | [`report`] | the records ([`report::TtaRun`], [`report::TtaFailure`]), what is derived from them, the tables, the JSON report |
//! | [`plot`] | `--plot FILE.svg`: validation bpb against training seconds and against steps, per rate |
//!
//! The target: `--target-bpb`, else the final validation bpb of the first `ddp:none` run at
//! the same rate and seed (which therefore runs first), plus `--target-slack` percent (0.5).
//! On a shaped link, without `--no-stop`,
//! every run stops at the first evaluation at or below the target, and every run but
//! `ddp:none` also at the first evaluation past 1.5x `ddp:none`'s training seconds (recorded as
//! not reached). Unshaped runs (`--rates none`) train every step: they give the final quality.
//! A run that fails is recorded as failed, naming the process and its last stderr lines, and
//! the sitting goes on (the exit status is then 1).

pub mod plan;
pub mod plot;
pub mod report;
pub mod run;
pub mod script;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::net::topo::{self, check_interrupted, Shaping, Topology};
use crate::net::{host_names, load_average, Machine};
use plan::{Kind, Setup, REFERENCE, TIME_LIMIT_FACTOR};
use pushpull_launch::procs::Programs;
use pushpull_node::error::{CliError, CliResult};
use report::{fill_speedups, Network, Settings, TtaFailure, TtaReport, TtaRun};
use run::{run_one, RunAsk, RunCtx};
use script::Script;

fn parse_slack(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!("{text:?}: a percent from 0 to 100")),
    }
}

/// The systems a sitting runs unless told otherwise.
pub const DEFAULT_SYSTEMS: &str = "pushpull:none,pushpull:fp16,pushpull:dithering,\
                                   pushpull:onebit,pushpull:topk,pushpull:powersgd:1,\
                                   pushpull:powersgd:2,pushpull:powersgd:4,ddp:none,ddp:fp16,\
                                   ddp:powersgd:1,ddp:powersgd:2,ddp:powersgd:4";

/// `pushpull bench train`.
#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Needs root. A quick run (CI's smoke test, about a minute on 2 cores): \
                  pushpull bench train --quick --python .venv/bin/python. Final quality: \
                  --rates none --seeds 0,1,2."
)]
pub struct TrainArgs {
    /// The Python interpreter that runs train.py: it needs torch (with gloo) and, for pushpull's
    /// systems, the pushpull package (e.g. a virtual environment's `bin/python`).
    #[arg(long, value_name = "PYTHON", default_value = "python3")]
    pub python: PathBuf,
    /// Link rates, comma-separated (tc units: kbit, mbit, gbit; one network each), or `none`:
    /// no tbf (runs then train every step, for the final quality).
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "100mbit"
    )]
    pub rates: Vec<String>,
    /// Workers, each on a host of its own.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub workers: u32,
    /// Servers of the pushpull runs.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub servers: u32,
    /// Where pushpull's scheduler and servers run, comma-separated: `separate` (hosts of their
    /// own) and/or `colocated` (server s in worker s mod W's namespace, the scheduler in
    /// worker 0's: no links beyond the workers', as DDP has). Each pushpull system runs once
    /// per placement.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "separate,colocated"
    )]
    pub placement: Vec<String>,
    /// Systems, comma-separated: `pushpull:PRESET` and `ddp:HOOK` (`ddp:powersgd:R` with
    /// PowerSGD's rank R); the presets and hooks are train.py's (`train.py --list-systems`).
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = DEFAULT_SYSTEMS)]
    pub systems: Vec<String>,
    /// The workload: transformer or conv (bench/tta/models.py).
    #[arg(long, value_name = "NAME", default_value = "transformer")]
    pub workload: String,
    /// The workload's named size (default, tiny).
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub size: String,
    /// Override one field of the size, passed to train.py (repeatable), e.g. `--set d_model=192`.
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    pub set: Vec<String>,
    /// Training steps at most (the learning-rate schedule's length). Default: the workload's
    /// budget, where DDP fp32 has flattened after about 3 minutes at 100 Mbit/s here (360 for
    /// the transformer, 260 for the conv LM: bench/tta/README.md, "Sizing").
    #[arg(long, value_name = "N")]
    pub steps: Option<u32>,
    /// Steps between evaluations (off the clock).
    #[arg(long, value_name = "N", default_value_t = 30)]
    pub eval_every: u32,
    /// Seeds (model initialisation and data order), comma-separated: every run once per seed.
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "0")]
    pub seeds: Vec<u64>,
    /// The target, validation bits per byte (default: the final value of ddp:none's run at the
    /// same rate and seed).
    #[arg(long, value_name = "X")]
    pub target_bpb: Option<f64>,
    /// Percent over ddp:none's final validation bpb that the derived target allows (not
    /// `--target-bpb`), so that a system of the same quality is not refused for a difference
    /// in the last digits (fp16 ended 0.00001 bpb above fp32 once).
    #[arg(long, value_name = "PCT", default_value_t = 0.5, value_parser = parse_slack)]
    pub target_slack: f64,
    /// Train every system every step, also on shaped links (no stop at the target or at 1.5x
    /// DDP fp32's time); times to the target are still read from the evaluations.
    #[arg(long)]
    pub no_stop: bool,
    /// MTU of every link, bytes.
    #[arg(long, value_name = "BYTES", default_value_t = topo::DEFAULT_MTU)]
    pub mtu: u32,
    /// Write the report as JSON to this file (after every run, so an interrupted sitting keeps
    /// what finished).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also draw validation bpb against training seconds and against steps into this SVG file.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Run nothing: read a report written by `--json` and print its tables (and draw `--plot`)
    /// again. Needs no root.
    #[arg(long, value_name = "FILE")]
    pub from_json: Option<PathBuf>,
    /// One tiny workload (conv, tiny with d_model=64, 200 steps, evaluated every 25), 2
    /// workers, 1 server, pushpull:onebit and ddp:none at 100mbit: the smoke test.
    #[arg(long, conflicts_with_all = [
        "rates", "workers", "servers", "systems", "workload", "size", "set", "steps", "eval_every"
    ])]
    pub quick: bool,
    /// Longest one run may take, seconds (start-up included).
    #[arg(long, value_name = "S", default_value_t = 1800)]
    pub run_timeout: u64,
    /// Show every process's stderr and the ranks' stdout, prefixed with its name.
    #[arg(long)]
    pub logs: bool,
}

fn settings(args: &TrainArgs, setup: &Setup) -> Settings {
    Settings {
        python: args.python.display().to_string(),
        workload: setup.workload.clone(),
        size: setup.size.clone(),
        set: setup.set.clone(),
        steps: setup.steps,
        eval_every: setup.eval_every,
        workers: setup.workers,
        servers: setup.servers,
        systems: setup.systems.iter().map(|s| s.label()).collect(),
        placements: setup
            .placements
            .iter()
            .map(|p| p.flag().to_string())
            .collect(),
        seeds: setup.seeds.clone(),
        target_bpb: setup.target_bpb,
        no_stop: setup.no_stop,
        time_limit_factor: TIME_LIMIT_FACTOR,
        quick: args.quick,
    }
}

fn write_json(path: &std::path::Path, report: &TtaReport) -> CliResult<()> {
    let text = serde_json::to_string_pretty(report).expect("the report serializes");
    std::fs::write(path, text)
        .map_err(|e| CliError::failed(format!("--json {}: {e}", path.display())))
}

fn print_report(args: &TrainArgs, report: &TtaReport) -> CliResult<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", report::to_text(report));
    let _ = out.flush();
    if let Some(path) = &args.plot {
        let rates: Vec<String> = report.networks.iter().map(|n| n.rate.clone()).collect();
        plot::draw(path, &rates, &report.runs)?;
        eprintln!("pushpull bench train: plot written to {}", path.display());
    }
    Ok(())
}

/// `pushpull bench train` (see the module docs): checks everything, then per rate builds the
/// network and runs every system per seed, recording each run or its failure; prints the
/// tables, writes `--json` and `--plot`. Exit code 1 if any run failed.
pub fn run(args: TrainArgs) -> CliResult<()> {
    if let Some(path) = &args.from_json {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::usage(format!("--from-json {}: {e}", path.display())))?;
        let report: TtaReport = serde_json::from_str(&text).map_err(|e| {
            CliError::usage(format!(
                "--from-json {}: not a `bench train --json` report: {e}",
                path.display()
            ))
        })?;
        return print_report(&args, &report);
    }
    let mut setup = plan::check_flags(&args)?;
    if !(576..=65_535).contains(&args.mtu) {
        return Err(CliError::usage(format!(
            "--mtu {}: a link MTU from 576 to 65535 bytes",
            args.mtu
        )));
    }
    let script = Script::new(&args.python)?;
    let catalog = script.catalog()?;
    setup.systems = plan::systems(&args, &catalog)?;
    for kind in [Kind::PushPull, Kind::Ddp] {
        if let Some(s) = setup.systems.iter().find(|s| s.kind == kind) {
            script.check(&setup, s)?;
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(CliError::usage(
            "pushpull bench train needs root: it creates network namespaces, veth pairs and tc \
             qdiscs (nothing outside its own namespaces is changed); --from-json FILE needs none",
        ));
    }
    topo::install_signal_handlers();
    for ns in topo::remove_stale()? {
        eprintln!("pushpull bench train: deleted namespace {ns} left behind by a killed run");
    }
    let programs = Programs::from_current_exe()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::failed(format!("cannot start a tokio runtime: {e}")))?;
    let mut report = TtaReport {
        machine: Machine::at_start("train"),
        settings: settings(&args, &setup),
        networks: Vec::new(),
        runs: Vec::new(),
        failures: Vec::new(),
    };
    let workers: Vec<String> = (0..setup.workers).map(|w| format!("worker{w}")).collect();
    let mut port: u16 = 29500;
    for (rate, bits) in setup.rates.clone() {
        let hosts: Vec<(String, Vec<String>)> = if setup.needs_server_hosts() {
            host_names(setup.servers, setup.workers, 1)
        } else {
            workers
                .iter()
                .map(|w| (w.clone(), vec![w.clone()]))
                .collect()
        };
        let shaping = Shaping {
            rate_bits: bits,
            mtu: args.mtu,
        };
        let tbf = (bits > 0).then(|| shaping.tbf_args().join(" "));
        eprintln!(
            "pushpull bench train: {rate}: {} hosts, {}, MTU {}",
            hosts.len(),
            tbf.as_deref().unwrap_or("no tbf"),
            shaping.mtu
        );
        let mut topo = Topology::with_nodes(&hosts, shaping)?;
        report.networks.push(Network {
            rate: rate.clone(),
            rate_bits: bits,
            tbf,
            mtu: args.mtu,
        });
        let ctx = RunCtx {
            topo: &topo,
            script: &script,
            programs: &programs,
            setup: &setup,
            timeout: Duration::from_secs(args.run_timeout),
            logs: args.logs,
        };
        let stops = setup.stops_early(bits);
        for &seed in &setup.seeds {
            // ddp:none's final val bpb and training seconds at this rate and seed.
            let mut reference: Option<(Option<f64>, f64)> = None;
            for plan in setup.runs() {
                check_interrupted()?;
                let is_ref = plan.system.is_reference();
                let (target, source) = match (setup.target_bpb, reference) {
                    (Some(t), _) => (Some(t), "--target-bpb"),
                    (None, Some((Some(t), _))) => (Some(t), "ddp:none's final"),
                    _ => (None, "none"),
                };
                let time_limit = match reference {
                    Some((_, secs)) if stops && !is_ref => Some(secs * TIME_LIMIT_FACTOR),
                    _ => None,
                };
                let ask = RunAsk {
                    seed,
                    target_bpb: target.filter(|_| stops),
                    time_limit,
                    port,
                };
                port = if port >= 29999 { 29500 } else { port + 1 };
                let label = format!(
                    "{rate} seed {seed} {} ({})",
                    plan.system.label(),
                    plan.placement_label()
                );
                eprintln!(
                    "pushpull bench train: {label}: running{}{} (load {:.2})",
                    ask.target_bpb
                        .map_or_else(String::new, |t| format!(", to {t:.4} bpb")),
                    time_limit.map_or_else(String::new, |t| format!(", at most {t:.1} training s")),
                    load_average()[0]
                );
                match rt.block_on(run_one(&ctx, &plan, ask)) {
                    Ok(done) => {
                        let end = &done.lines.end;
                        let mut row = TtaRun {
                            rate: rate.clone(),
                            system: plan.system.label(),
                            placement: plan.placement_label().to_string(),
                            seed,
                            workers: setup.workers,
                            servers: if plan.system.kind == Kind::Ddp {
                                0
                            } else {
                                setup.servers
                            },
                            target_bpb: target,
                            target_source: source.to_string(),
                            stopped_early: ask.target_bpb.is_some() || time_limit.is_some(),
                            time_limit_s: time_limit,
                            run: done.lines.run.clone(),
                            evals: done.lines.evals.clone(),
                            end: end.clone(),
                            hosts: done.hosts,
                            processes: done.processes,
                            tbf_drops: done.tbf_drops,
                            wall_seconds: done.wall_seconds,
                            outcome: Default::default(),
                        };
                        if is_ref && reference.is_none() {
                            let slack = 1.0 + args.target_slack / 100.0;
                            let target = end.val_bpb.map(|v| v * slack);
                            reference = Some((target, end.wall_s));
                            if setup.target_bpb.is_none() {
                                row.target_bpb = target;
                                row.target_source = "ddp:none's final".to_string();
                            }
                        }
                        row.derive(&workers);
                        let o = &row.outcome;
                        eprintln!(
                            "pushpull bench train:   {} steps, {:.1} training s, final {} bpb; \
                             {}; {:.1} s in all",
                            end.step,
                            end.wall_s,
                            o.final_val_bpb
                                .map_or_else(|| "-".to_string(), |v| format!("{v:.4}")),
                            match (row.target_bpb, o.steps_to_target, o.seconds_to_target) {
                                (None, ..) => "no target".to_string(),
                                (Some(_), Some(n), Some(s)) =>
                                    format!("target at step {n}, {s:.1} training s"),
                                _ if end.stopped.as_deref() == Some("time_limit") =>
                                    "stopped at the time limit".to_string(),
                                _ => "target not reached".to_string(),
                            },
                            row.wall_seconds
                        );
                        report.runs.push(row);
                    }
                    Err(e) => {
                        check_interrupted()?;
                        eprintln!("pushpull bench train:   FAILED: {}", e.message);
                        if is_ref && setup.target_bpb.is_none() {
                            eprintln!(
                                "pushpull bench train:   {REFERENCE} failed: the other runs of \
                                 {rate} seed {seed} have no target and no time limit"
                            );
                        }
                        report.failures.push(TtaFailure {
                            rate: rate.clone(),
                            system: plan.system.label(),
                            placement: plan.placement_label().to_string(),
                            seed,
                            process: e.process,
                            error: e.message,
                        });
                    }
                }
                fill_speedups(&mut report.runs);
                if let Some(path) = &args.json {
                    report.machine.finish();
                    write_json(path, &report)?;
                }
            }
        }
        let errors = topo.teardown();
        if !errors.is_empty() {
            return Err(CliError::failed(format!(
                "could not delete every namespace: {}",
                errors.join("; ")
            )));
        }
    }
    report.machine.finish();
    if let Some(path) = &args.json {
        write_json(path, &report)?;
        eprintln!("pushpull bench train: report written to {}", path.display());
    }
    print_report(&args, &report)?;
    if !report.failures.is_empty() {
        return Err(CliError::failed(format!(
            "{} of {} runs failed (see above); the others are reported",
            report.failures.len(),
            report.failures.len() + report.runs.len()
        )));
    }
    Ok(())
}
