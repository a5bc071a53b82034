//! Command-line interfaces (clap derive) of `pushpull` and `pushpull-worker` and their entry
//! points: `pushpull-worker` calls [`worker_main`], `pushpull` calls [`pushpull_main`], whose
//! `scheduler`, `server` and `worker` subcommands take the flags of `pushpull-scheduler`,
//! `pushpull-server` (`pushpull_node::cli`) and `pushpull-worker` and run the same functions.
//! Exit codes: 0 success, 1 a failed run, 2 bad input (clap's usage errors included).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use pushpull_node::cli::{exit, multi_thread, scheduler, server, SchedulerArgs, ServerArgs};
use pushpull_node::commands::NodeArgs;
use pushpull_proto::Config;

use crate::node::{run_worker, WorkerOptions};
use pushpull_bench::transport as bench;
use pushpull_jobs::JobConfig;
use pushpull_launch::local::{
    default_config, run_compare, run_local, CompareOptions, LocalOptions, RunSpec,
};
use pushpull_launch::procs::Programs;
use pushpull_launch::{certs, kube, multihost};
use pushpull_node::error::{CliError, CliResult};
use pushpull_node::logging;

/// `pushpull-worker`: runs the built-in benchmark job as one worker.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "pushpull-worker",
    version,
    about = "A pushpull worker running the built-in job ([job] in the cluster file): push_pull \
             of a ResNet-50-like tensor set on random data, every result checked bit for bit.",
    after_help = "Prints a report (or with --json one JSON object) on stdout. Exit code 0 when \
                  the job passed, 1 when it failed (a lost node, a failed check), 2 for bad input."
)]
pub struct WorkerArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub node: NodeArgs,
    /// Ask the scheduler for this rank (0-based; default: the lowest free one).
    #[arg(long, value_name = "N")]
    pub rank: Option<u32>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Print `pushpull-worker progress rank=R round=N total=T` after every round (what
    /// `pushpull local` reads).
    #[arg(long)]
    pub progress: bool,
}

/// `pushpull`: the launcher and tools.
#[derive(Debug, Parser)]
#[command(
    name = "pushpull",
    version,
    about = "pushpull: a parameter server for data-parallel training over QUIC with mutual TLS.",
    after_help = "Start with `pushpull local`: a whole cluster on this machine."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `pushpull`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a whole cluster on this machine (scheduler, servers and workers as separate
    /// processes on loopback, throw-away certificates): train an MLP with gradient compression
    /// and compare with the uncompressed run (or `--job benchmark`: the push_pull benchmark).
    Local(LocalArgs),
    /// Make a cluster CA and node certificates for a multi-host cluster.
    Certs(CertsArgs),
    /// Write a job folder for a multi-host job (Slurm, Kubernetes, by hand): the cluster file
    /// with the scheduler's address and a certificate for every node.
    Prepare(PrepareArgs),
    /// Run one node of a job folder made by `pushpull prepare`, its role and index from the
    /// flags or the cluster manager's environment (SLURM_PROCID, JOB_COMPLETION_INDEX, RANK).
    Node(NodeRunArgs),
    /// Benchmarks.
    Bench(BenchArgs),
    /// Run the scheduler (same as `pushpull-scheduler`).
    Scheduler(SchedulerArgs),
    /// Run a server (same as `pushpull-server`).
    Server(ServerArgs),
    /// Run a worker with the built-in job (same as `pushpull-worker`).
    Worker(WorkerArgs),
}

/// Overrides of the cluster file shared by `local` and `bench transport --compare-cluster`.
#[derive(Debug, Clone, Args)]
pub struct ClusterOverrides {
    /// The cluster file (default: configs/local.toml, built in).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Number of workers (overrides `cluster.num_workers`).
    #[arg(long, value_name = "N")]
    pub workers: Option<u32>,
    /// Number of servers (overrides `cluster.num_servers`).
    #[arg(long, value_name = "N")]
    pub servers: Option<u32>,
    /// Workers per host (overrides `cluster.local_size`): above 1 the workers form local
    /// groups of G that sum through shared memory and push once per group (BytePS's
    /// `BYTEPS_LOCAL_SIZE`); G must divide the number of workers.
    #[arg(long, value_name = "G")]
    pub local_size: Option<u32>,
    /// Timed rounds (overrides `job.rounds`).
    #[arg(long, value_name = "N")]
    pub rounds: Option<u32>,
    /// Warm-up rounds (overrides `job.warmup`).
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,
    /// Fraction of the ResNet-50 tensor set's size (overrides `job.scale`; 1.0 = 25.6 M
    /// elements).
    #[arg(long, value_name = "F")]
    pub scale: Option<f64>,
    /// Where the benchmark job's tensors live: host, device (a CUDA GPU) or emulated
    /// (overrides `job.buffers`).
    #[arg(long, value_name = "WHERE")]
    pub buffers: Option<String>,
}

impl ClusterOverrides {
    /// The cluster file with the overrides applied and validated.
    pub fn load(&self) -> CliResult<Config> {
        let (mut config, origin, text) = match &self.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| CliError::usage(format!("--config {}: {e}", p.display())))?;
                let c = Config::from_toml_str(&text, &p.display().to_string())
                    .map_err(CliError::usage)?;
                (c, p.display().to_string(), text)
            }
            None => (
                default_config(),
                "configs/local.toml (built in)".to_string(),
                // The built-in file's values are defaults, not the user's: variables win.
                String::new(),
            ),
        };
        // BytePS's tuning variables reach every node through the cluster file written here.
        let vars = pushpull_node::commands::environment();
        let explicit = pushpull_proto::config::env::explicit_keys(&text);
        for note in pushpull_proto::config::env::apply_tuning(&mut config, &explicit, &vars)
            .map_err(CliError::usage)?
        {
            eprintln!("pushpull: {note}");
        }
        let mut job = JobConfig::from_config(&config, &origin).map_err(CliError::usage)?;
        if let Some(w) = self.workers {
            config.cluster.num_workers = w;
        }
        if let Some(s) = self.servers {
            config.cluster.num_servers = s;
        }
        if let Some(g) = self.local_size {
            config.cluster.local_size = g;
        }
        if let Some(r) = self.rounds {
            job.rounds = r;
        }
        if let Some(r) = self.warmup {
            job.warmup = r;
        }
        if let Some(s) = self.scale {
            job.scale = s;
        }
        if let Some(b) = &self.buffers {
            job.buffers = b.clone();
        }
        job.store(&mut config);
        let origin = format!("{origin} with the command-line overrides");
        JobConfig::from_config(&config, &origin).map_err(CliError::usage)?;
        config.validate(&origin).map_err(CliError::usage)?;
        Ok(config)
    }
}

/// `pushpull local`.
#[derive(Debug, Clone, Args)]
pub struct LocalArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub cluster: ClusterOverrides,
    /// The built-in job: `train` (the default of configs/local.toml) or `benchmark`
    /// (overrides `job.kind`).
    #[arg(long, value_name = "KIND")]
    pub job: Option<String>,
    /// Train (or run the benchmark job) with this compressor preset: none, fp16, bf16, onebit,
    /// topk, randomk, dithering, dithering-elias, minmax, or decentralised SGD's dpsgd, moniqua,
    /// minmax-gossip, minmax-direct (sets `[tensors.default]`; see `--param`).
    #[arg(long, value_name = "NAME", conflicts_with = "compare")]
    pub compressor: Option<String>,
    /// Override one key of the compressor map, e.g. `--param k=0.05` (repeatable).
    #[arg(long = "param", value_name = "KEY=VALUE")]
    pub params: Vec<String>,
    /// Train once per item (fresh cluster each) and print a table, e.g.
    /// `none,onebit,topk,randomk,dithering,minmax,logistic` (`logistic`: the logistic-regression
    /// baseline). Default without --compressor: none,onebit.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub compare: Option<Vec<String>>,
    /// Seeds per run (cluster.seed, +1, ...); the table shows mean ± sd.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seeds: u32,
    /// Training steps (overrides `job.steps`).
    #[arg(long, value_name = "N")]
    pub steps: Option<u32>,
    /// Model: mlp or logistic (overrides `job.model`).
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Peak learning rate (overrides `job.lr`).
    #[arg(long, value_name = "LR")]
    pub lr: Option<f64>,
    /// Hidden widths, comma-separated (overrides `job.hidden`).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub hidden: Option<Vec<u32>>,
    /// Where the built-in training job computes: `cpu` (the default), or `cuda` / `cuda:N`,
    /// which needs a usable CUDA GPU and a build with the root package's `cuda` feature
    /// (candle's CUDA backend, which needs the CUDA toolkit to build); without either the
    /// command says which is missing and exits with status 2.
    #[arg(long, value_name = "DEVICE", default_value = "cpu")]
    pub device: String,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Show every process's log lines (stderr), prefixed with its name.
    #[arg(long)]
    pub logs: bool,
    /// Run this command as every worker instead of the built-in job, e.g.
    /// `pushpull local --workers 2 -- python train.py`: each copy gets the environment that
    /// `pushpull.torch.init()` reads (the cluster file, the scheduler's address, its rank and
    /// certificate), its output lines are prefixed with `[rank R]`, and the launcher exits
    /// with the first failure's exit status after stopping the others.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `pushpull certs`.
#[derive(Debug, Clone, Args)]
pub struct CertsArgs {
    /// Folder to write into: the CA in DIR/ca/ (ca.pem, ca.key: keep it where it is), and
    /// for each node a folder DIR/NAME/ (ca.pem, NAME.pem, NAME.key) to copy to its host.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Node names, comma-separated (e.g. scheduler,server0,server1,worker0,worker1). The
    /// names `scheduler`, `serverN`, `workerN` get certificates that grant that role and id;
    /// other names get role-free certificates (usable only with `tls.check_roles = false`).
    #[arg(long, value_name = "LIST", value_delimiter = ',', conflicts_with_all = ["servers", "workers"])]
    pub nodes: Option<Vec<String>>,
    /// Without --nodes: certificates for `scheduler`, `server0..N-1` …
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub servers: u32,
    /// … and `worker0..N-1`.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub workers: u32,
    /// The DNS name every certificate carries and clients verify (`tls.server_name`).
    #[arg(long, value_name = "NAME", default_value = "pushpull.cluster")]
    pub server_name: String,
    /// Replace an existing CA in --out.
    #[arg(long)]
    pub force: bool,
    /// How long the certificates are valid, in days (from an hour ago).
    #[arg(long, value_name = "N", default_value_t = pushpull_net::certs::DEFAULT_VALIDITY_DAYS)]
    pub days: u32,
}

/// `pushpull prepare`.
#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Example (Slurm: the first node of the allocation runs the scheduler): pushpull \
                  prepare --out $JOB_DIR --scheduler $(scontrol show hostnames | head -n1):29500 \
                  --workers 8 --servers 2 --local-size 4. See deploy/slurm/pushpull.sbatch. \
                  Kubernetes: pushpull prepare --out job --kubernetes pp --image IMAGE --workers \
                  4 --servers 2 -- python train.py, then kubectl apply -f job/kubernetes.yaml; \
                  see deploy/k8s/README.md."
)]
pub struct PrepareArgs {
    /// The job folder to write (created if missing): cluster.toml, the CA in ca/, and a folder
    /// per node (scheduler, server0.., worker0..) with its certificate and key (mode 0600).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The scheduler's address every node dials, NAME:PORT or IP:PORT (sets
    /// `cluster.scheduler`; with a name the scheduler binds every address on the port). With
    /// --kubernetes NAME: the Service's name, NAME:PORT (default NAME:29500).
    #[arg(long, value_name = "ADDR", required_unless_present = "kubernetes")]
    pub scheduler: Option<String>,
    /// A cluster file to start from (default: configs/local.toml, built in).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Workers (overrides `cluster.num_workers`).
    #[arg(long, value_name = "N")]
    pub workers: Option<u32>,
    /// Servers (overrides `cluster.num_servers`).
    #[arg(long, value_name = "N")]
    pub servers: Option<u32>,
    /// Workers per host (overrides `cluster.local_size`; ranks h*G..h*G+G-1 on host h).
    #[arg(long, value_name = "G")]
    pub local_size: Option<u32>,
    /// Replace a CA the folder already holds (every node then needs the new files).
    #[arg(long)]
    pub force: bool,
    /// Also write DIR/kubernetes.yaml: the job as Kubernetes objects named NAME (a ConfigMap
    /// with the cluster file, a Secret with the certificates, a headless Service for the
    /// scheduler, one indexed Job of every node; see deploy/k8s/README.md).
    #[arg(long, value_name = "NAME")]
    pub kubernetes: Option<String>,
    /// With --kubernetes: the container image every pod runs (pushpull on its PATH, and the
    /// workers' COMMAND; deploy/k8s/Dockerfile builds one).
    #[arg(long, value_name = "IMAGE", default_value = pushpull_launch::kube::DEFAULT_IMAGE, requires = "kubernetes")]
    pub image: String,
    /// With --kubernetes: the workers' command (e.g. `python train.py`, run in the image with
    /// the variables pushpull.torch reads); without one the workers run the cluster file's
    /// built-in job.
    #[arg(last = true, value_name = "COMMAND", requires = "kubernetes")]
    pub command: Vec<String>,
}

/// `pushpull node`.
#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Replaces itself with the node, which dies with its parent (so nothing outlives a \
                  Slurm step or a container). Examples: pushpull node --job-dir DIR --role \
                  server (index from SLURM_PROCID); pushpull node --job-dir DIR --role worker -- \
                  python train.py; pushpull node --job-dir DIR --role auto (0 the scheduler, \
                  1..S servers, then workers; a command after `--` is the workers')."
)]
pub struct NodeRunArgs {
    /// The job folder written by `pushpull prepare` (or one with cluster.toml and this node's
    /// folder of certificates, as a Kubernetes pod mounts it).
    #[arg(long, value_name = "DIR")]
    pub job_dir: PathBuf,
    /// The node's role; `auto`: the index counts every node of the job.
    #[arg(long, value_enum)]
    pub role: pushpull_launch::multihost::RoleArg,
    /// The node's index within its role (a worker's rank); default: SLURM_PROCID,
    /// JOB_COMPLETION_INDEX or RANK, the first that is set.
    #[arg(long, value_name = "N")]
    pub index: Option<u32>,
    /// A folder holding only this node's ca.pem, NODE.pem and NODE.key (default:
    /// JOB_DIR/NODE/), e.g. where a Kubernetes pod mounts its own certificate.
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// A worker's command (e.g. `python train.py`), run with the environment pushpull.torch
    /// reads; without one a worker runs the cluster file's built-in job. With `--role auto`
    /// the scheduler and the servers ignore it.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `pushpull bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Which benchmark.
    #[command(subcommand)]
    pub which: BenchCommand,
}

/// `pushpull bench` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum BenchCommand {
    /// Raw quinn throughput with the cluster's transport settings and TLS (separate sender and
    /// sink processes, like workers and servers), optionally next to the local cluster.
    Transport(TransportArgs),
    /// (internal) The receiving side of `bench transport`.
    #[command(hide = true)]
    Sink(SinkArgs),
    /// (internal) The sending side of `bench transport`.
    #[command(hide = true)]
    Send(SendArgs),
    /// The cluster on a shaped network: every node in its own network namespace, links shaped
    /// with tc tbf (needs root); seconds per round against the wire floor, per compressor.
    Net(Box<pushpull_bench::net::NetArgs>),
    /// Time to accuracy on a shaped network (needs root): bench/tta/train.py per worker host
    /// through pushpull (servers on hosts of their own and colocated) and torch DDP on gloo
    /// (fp32, fp16, PowerSGD); validation bits per byte against training seconds, bytes and CPU
    /// seconds per step, time and steps to the target.
    Train(Box<pushpull_bench::tta::TrainArgs>),
}

/// `pushpull bench transport`.
#[derive(Debug, Clone, Args)]
pub struct TransportArgs {
    /// Connections in all (default 4: a 2-worker x 2-server cluster).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub connections: u32,
    /// Sink processes (the servers' role); senders = ceil(connections / sinks).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub sinks: u32,
    /// Bytes sent over each connection, in frames of `partition_bytes`.
    #[arg(long, value_name = "B", default_value_t = 256 << 20)]
    pub bytes: u64,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Then run the local cluster benchmark and print the ratio of its push+pull payload
    /// throughput (summed over workers) to the raw number.
    #[arg(long)]
    pub compare_cluster: bool,
    /// With --compare-cluster: show the cluster processes' logs.
    #[arg(long)]
    pub logs: bool,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub cluster: ClusterOverrides,
}

/// `pushpull bench sink` (internal).
#[derive(Debug, Clone, Args)]
pub struct SinkArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub node: NodeArgs,
    /// Connections to accept.
    #[arg(long)]
    pub connections: u32,
    /// Bytes to expect per connection.
    #[arg(long)]
    pub bytes: u64,
    /// Address to bind, IP:PORT.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen: String,
}

/// `pushpull bench send` (internal).
#[derive(Debug, Clone, Args)]
pub struct SendArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub node: NodeArgs,
    /// Sink addresses, comma-separated.
    #[arg(long)]
    pub to: String,
    /// Bytes per connection.
    #[arg(long)]
    pub bytes: u64,
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs a worker (`pushpull-worker`, `pushpull worker`).
pub fn worker(args: WorkerArgs) -> CliResult<()> {
    let opts = WorkerOptions {
        rank: args.rank,
        json: args.json,
        progress: args.progress,
    };
    multi_thread().block_on(run_worker(&args.node, &opts))
}

fn print(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
    let _ = out.flush();
}

/// `pushpull local --device`: `cpu`, or a CUDA device that is usable and that this build can
/// train on (see [`LocalArgs::device`]).
fn check_train_device(device: &str) -> CliResult<()> {
    use pushpull_kernels::cuda::{select_device, DevicePref};
    let pref: DevicePref = device
        .parse()
        .map_err(|e| CliError::usage(format!("--device: {e}")))?;
    match pref {
        DevicePref::Cpu => Ok(()),
        DevicePref::Auto => Err(CliError::usage(
            "--device auto: choose cpu, cuda or cuda:N for the training job",
        )),
        DevicePref::Cuda | DevicePref::CudaOrdinal(_) => {
            let gpu = select_device(pref).map_err(|e| CliError::usage(format!("--device: {e}")))?;
            if cfg!(feature = "cuda") {
                Ok(())
            } else {
                Err(CliError::usage(format!(
                    "--device {device}: {gpu} is usable, but this pushpull was built without \
                     the `cuda` feature (candle's CUDA backend): rebuild with `cargo build \
                     --release --features cuda` on a machine with the CUDA toolkit (nvcc and \
                     the CUDA libraries, which this build links)"
                )))
            }
        }
    }
}

/// `pushpull local`: the benchmark job once, or the training job once per compressor and seed
/// (a comparison table).
pub fn local(args: LocalArgs) -> CliResult<()> {
    let mut config = args.cluster.load()?;
    let mut job = JobConfig::of(&config).map_err(CliError::usage)?;
    if let Some(kind) = &args.job {
        job.kind = kind.clone();
    }
    if let Some(s) = args.steps {
        job.steps = s;
    }
    if let Some(m) = &args.model {
        job.model = m.clone();
    }
    if let Some(lr) = args.lr {
        job.lr = lr;
    }
    if let Some(h) = &args.hidden {
        job.hidden = h.clone();
    }
    job.store(&mut config);
    let job = JobConfig::from_config(&config, "the cluster file with the command-line overrides")
        .map_err(CliError::usage)?;
    check_train_device(&args.device)?;
    if job.kind == "benchmark" && job.buffers == "device" {
        // Say a missing GPU before starting any process.
        pushpull_jobs::benchmark::gpu_ordinal(&config)?;
    }
    if !args.command.is_empty() {
        let job_flags = [
            ("--rounds", args.cluster.rounds.is_some()),
            ("--warmup", args.cluster.warmup.is_some()),
            ("--scale", args.cluster.scale.is_some()),
            ("--buffers", args.cluster.buffers.is_some()),
            ("--seeds", args.seeds != 1),
            ("--job", args.job.is_some()),
            ("--compressor", args.compressor.is_some()),
            ("--param", !args.params.is_empty()),
            ("--compare", args.compare.is_some()),
            ("--steps", args.steps.is_some()),
            ("--model", args.model.is_some()),
            ("--lr", args.lr.is_some()),
            ("--hidden", args.hidden.is_some()),
            ("--json", args.json),
        ];
        if let Some((flag, _)) = job_flags.iter().find(|(_, set)| *set) {
            return Err(CliError::usage(format!(
                "{flag} configures the built-in job, which does not run when a command is given \
                 after `--`; the command's job sets its own compression (e.g. \
                 pushpull.torch.DistributedOptimizer(..., compression_params=...)) or reads \
                 [tensors] from --config"
            )));
        }
        let programs = Programs::from_current_exe()?;
        return current_thread().block_on(pushpull_launch::script::run_script(
            &config,
            &programs,
            &args.command,
            args.logs,
        ));
    }
    let params = args
        .params
        .iter()
        .map(|p| pushpull_jobs::train::compare::parse_param(p).map_err(CliError::usage))
        .collect::<CliResult<Vec<_>>>()?;
    let mut opts = LocalOptions {
        config,
        programs: Programs::from_current_exe()?,
        progress_bar: !args.json,
        logs: args.logs,
        label: None,
    };
    if job.kind != "train" {
        // The benchmark job runs once, with --compressor's preset (or the file's maps) and the
        // --param overrides.
        if args.compare.is_some() || args.seeds != 1 {
            return Err(CliError::usage(
                "--compare and --seeds run the training job several times; the benchmark job \
                 runs once: give it one --compressor (and --param)",
            ));
        }
        let run = match &args.compressor {
            Some(c) => Some(RunSpec::parse(c)?),
            None if !params.is_empty() => Some(RunSpec::AsConfigured),
            None => None,
        };
        if let Some(run) = run {
            opts.config = run.config(&opts.config, &params)?;
        }
        let summary = current_thread().block_on(run_local(&opts))?;
        if args.json {
            print(&serde_json::to_string(&summary).expect("summary serializes"));
        } else {
            print(&summary.to_text());
        }
        return Ok(());
    }
    if args.seeds == 0 {
        return Err(CliError::usage("--seeds 0: must be at least 1"));
    }
    let runs = match (&args.compare, &args.compressor) {
        (Some(list), _) => list
            .iter()
            .filter(|n| !n.trim().is_empty())
            .map(|n| RunSpec::parse(n))
            .collect::<CliResult<Vec<_>>>()?,
        (None, Some(c)) => vec![RunSpec::parse(c)?],
        // A cluster file of one's own: train with its maps as they are.
        (None, None) if args.cluster.config.is_some() => vec![RunSpec::AsConfigured],
        (None, None) => vec![
            RunSpec::Preset("none".to_string()),
            RunSpec::Preset("onebit".to_string()),
        ],
    };
    if runs.is_empty() {
        return Err(CliError::usage("--compare: the list is empty"));
    }
    let copts = CompareOptions {
        local: opts,
        runs,
        seeds: args.seeds,
        params,
    };
    let report = current_thread().block_on(run_compare(&copts))?;
    if args.json {
        print(&serde_json::to_string(&report).expect("report serializes"));
    } else {
        print(&report.to_text());
    }
    Ok(())
}

/// `pushpull certs`.
pub fn certs(args: CertsArgs) -> CliResult<()> {
    let nodes = match args.nodes {
        Some(n) => n.into_iter().map(|s| s.trim().to_string()).collect(),
        None => certs::default_node_names(args.servers, args.workers),
    };
    let text = certs::make_certs(&args.out, &nodes, &args.server_name, args.force, args.days)?;
    print(text.trim_end());
    Ok(())
}

/// `pushpull prepare`.
pub fn prepare(args: PrepareArgs) -> CliResult<()> {
    let mut config = match &args.config {
        Some(p) => Config::from_file(p).map_err(CliError::usage)?,
        None => default_config(),
    };
    if let Some(n) = args.workers {
        config.cluster.num_workers = n;
    }
    if let Some(n) = args.servers {
        config.cluster.num_servers = n;
    }
    if let Some(g) = args.local_size {
        config.cluster.local_size = g;
    }
    let scheduler = match &args.kubernetes {
        Some(name) => {
            kube::check(name, &args.image, &config)?;
            kube::scheduler_addr(name, args.scheduler.as_deref())?
        }
        None => args.scheduler.clone().ok_or_else(|| {
            CliError::usage("--scheduler ADDR is required (or --kubernetes NAME)")
        })?,
    };
    let text = multihost::prepare(&args.out, config, &scheduler, args.force)?;
    print(&text);
    if let Some(name) = &args.kubernetes {
        let text = kube::write(&args.out, name, &args.image, &args.command)?;
        print(&text);
    }
    Ok(())
}

/// `pushpull node`: returns only when the node could not be started.
pub fn node(args: NodeRunArgs) -> CliResult<()> {
    let config_path = args.job_dir.join("cluster.toml");
    let config = Config::from_file(&config_path).map_err(CliError::usage)?;
    let c = &config.cluster;
    let env = |k: &str| std::env::var(k).ok();
    let which = multihost::which_node(args.role, args.index, &env, (c.num_servers, c.num_workers))?;
    let programs = Programs::from_current_exe()?;
    let cmd = multihost::node_command(
        &args.job_dir,
        args.tls_dir.as_deref(),
        &config_path,
        &config,
        &which,
        &programs,
        multihost::own_command(args.role, &which, &args.command),
    )?;
    eprintln!(
        "pushpull node: {} ({}): {} {}",
        which.name(),
        which.source,
        cmd.program.display(),
        cmd.args.join(" ")
    );
    Err(multihost::exec(&cmd))
}

/// `pushpull bench ...`.
pub fn bench(args: BenchArgs) -> CliResult<()> {
    match args.which {
        BenchCommand::Transport(t) => {
            let config = t.cluster.load()?;
            let programs = Programs::from_current_exe()?;
            let topts = bench::TransportOptions {
                config: config.clone(),
                connections: t.connections,
                sinks: t.sinks,
                bytes: t.bytes,
                programs: programs.clone(),
                netns: None,
            };
            let rt = current_thread();
            if t.compare_cluster {
                // The transport comparison measures push_pull throughput: the benchmark job,
                // whatever the cluster file's job is.
                let mut config = config;
                JobConfig::edit(&mut config, |j| j.kind = "benchmark".to_string())
                    .map_err(CliError::usage)?;
                let lopts = LocalOptions {
                    config,
                    programs,
                    progress_bar: !t.json,
                    logs: t.logs,
                    label: None,
                };
                let r = rt.block_on(bench::run_compare(&topts, &lopts))?;
                if t.json {
                    print(&serde_json::to_string(&r).expect("serializes"));
                } else {
                    print(&r.to_text());
                }
            } else {
                let r = rt.block_on(bench::run_transport(&topts))?;
                if t.json {
                    print(&serde_json::to_string(&r).expect("serializes"));
                } else {
                    print(&r.to_text());
                }
            }
            Ok(())
        }
        BenchCommand::Sink(s) => {
            let listen = pushpull_node::commands::parse_addr_flag("--listen", &s.listen)?;
            multi_thread().block_on(bench::run_sink(&s.node, listen, s.connections, s.bytes))
        }
        BenchCommand::Send(s) => {
            multi_thread().block_on(bench::run_sender(&s.node, &s.to, s.bytes))
        }
        BenchCommand::Net(n) => pushpull_bench::net::run(*n),
        BenchCommand::Train(t) => pushpull_bench::tta::run(*t),
    }
}

/// Entry point of `pushpull-worker`.
pub fn worker_main() -> ExitCode {
    let args = WorkerArgs::parse();
    logging::init();
    exit(worker(args))
}

/// Entry point of `pushpull`.
pub fn pushpull_main() -> ExitCode {
    let cli = Cli::parse();
    logging::init();
    exit(match cli.command {
        Command::Local(a) => local(a),
        Command::Certs(a) => certs(a),
        Command::Prepare(a) => prepare(a),
        Command::Node(a) => node(a),
        Command::Bench(a) => bench(a),
        Command::Scheduler(a) => scheduler(a),
        Command::Server(a) => server(a),
        Command::Worker(a) => worker(a),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clis_are_consistent() {
        Cli::command().debug_assert();
        SchedulerArgs::command().debug_assert();
        ServerArgs::command().debug_assert();
        WorkerArgs::command().debug_assert();
    }
}
