//! The worker role as a command: join the cluster, run the built-in job of the cluster file
//! (`job.kind`: the benchmark or the training), print its report. The scheduler and server
//! roles, and the flags every node takes, are `pushpull_node`'s.
//!
//! With `--progress`, `pushpull-worker progress rank=R round=N total=T` after each round (each
//! training step for `job.kind = "train"`). With `--metrics ADDR` (or `[metrics] listen`),
//! `pushpull-worker metrics on ADDR` once joined, and Prometheus metrics there while the job
//! runs.

use pushpull_node::commands::{
    load_config, load_identity, metrics_addr, print_line, start_metrics, NodeArgs,
};
use pushpull_proto::config::env::NodeRole;
use pushpull_worker::{JoinOptions, Worker, WorkerError};

use pushpull_jobs::train::{self, InRuntime, TrainOptions};
use pushpull_jobs::{benchmark, JobConfig};
use pushpull_node::error::{CliError, CliResult};
use pushpull_node::report::progress_line;

/// Options of `pushpull-worker` beyond the node flags.
#[derive(Debug, Clone, Default)]
pub struct WorkerOptions {
    /// Ask the scheduler for this rank.
    pub rank: Option<u32>,
    /// Print the report as one JSON object.
    pub json: bool,
    /// Print a progress line after every round.
    pub progress: bool,
}

/// `pushpull-worker`: joins the cluster, runs the built-in job (`job.kind`: the benchmark of
/// [`pushpull_jobs::benchmark`] or the training of [`pushpull_jobs::train`]), says it is finished and prints the
/// report ([`pushpull_node::report::JobReport`] or [`pushpull_jobs::train::TrainReport`]).
pub async fn run_worker(args: &NodeArgs, opts: &WorkerOptions) -> CliResult<()> {
    let (config, env_rank) = load_config(args, NodeRole::Worker)?;
    // The nodes leave `[job]` to the job: checked here, before joining, naming the file.
    let job = JobConfig::from_config(&config, &args.config.display().to_string())
        .map_err(CliError::usage)?;
    let metrics = metrics_addr(args, &config)?;
    let identity = load_identity(&config)?;
    let worker = Worker::join(
        &config,
        identity,
        JoinOptions {
            requested_rank: opts.rank.or(env_rank),
        },
    )
    .await
    .map_err(|e| match e {
        // Bad input (e.g. a scheduler address with port 0): exit code 2.
        WorkerError::Config(_) => CliError::usage(format!("pushpull-worker: {e}")),
        e => CliError::failed(format!("pushpull-worker: {e}")),
    })?;
    let rank = worker.rank();
    let _metrics = start_metrics("pushpull-worker", metrics, |a| {
        pushpull_worker::prometheus::serve_worker(a, &worker)
    })?;
    let progress = opts.progress;
    let show = move |done: u32, total: u32| {
        if progress {
            print_line(&progress_line(rank, done, total));
        }
    };
    if job.kind == "train" {
        let topts = TrainOptions::from_job(&job);
        let ex = InRuntime {
            worker: &worker,
            handle: tokio::runtime::Handle::current(),
        };
        let report = tokio::task::block_in_place(|| train::run_train(&ex, &topts, show));
        let (text, json) = finish_report(worker, rank, report, |mut r| {
            r.cpu_seconds = pushpull_node::cpu::process_cpu_seconds();
            (r.to_text(), serde_json::to_string(&r))
        })
        .await?;
        print_line(if opts.json { &json } else { &text });
        return Ok(());
    }
    let report = benchmark::run_benchmark(&worker, &config, &job, show).await;
    let (text, json) = finish_report(worker, rank, report, |mut r| {
        r.cpu_seconds = pushpull_node::cpu::process_cpu_seconds();
        (r.to_text(), serde_json::to_string(&r))
    })
    .await?;
    print_line(if opts.json { &json } else { &text });
    Ok(())
}

/// Ends the worker's part of the job (`finish` after a successful job, `abort` after a failed
/// one, so that the other nodes hear why before this process exits) and renders its report
/// as text and JSON (with the process's CPU seconds filled in by `render`).
async fn finish_report<R>(
    worker: pushpull_worker::Worker,
    rank: u32,
    report: CliResult<R>,
    render: impl FnOnce(R) -> (String, serde_json::Result<String>),
) -> CliResult<(String, String)> {
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            let e = CliError::failed(format!("pushpull-worker rank {rank}: {e}"));
            worker.abort(&e.to_string()).await;
            return Err(e);
        }
    };
    worker
        .finish()
        .await
        .map_err(|e| CliError::failed(format!("pushpull-worker rank {rank}: finish: {e}")))?;
    let (text, json) = render(report);
    let json = json.map_err(|e| CliError::failed(format!("report as JSON: {e}")))?;
    Ok((text, json))
}
