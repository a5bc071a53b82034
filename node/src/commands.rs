//! The commands of the scheduler and server roles, and what every node command shares: the
//! cluster-file and TLS flags ([`NodeArgs`]), loading them ([`load_config`],
//! [`load_identity`]), and the machine-readable lines on stdout ([`print_line`]).
//!
//! Bad input (config, flag values, certificates, a port in use) is a [`CliError::Usage`] (exit
//! code 2); a run that fails (a lost node, a refused registration) is a [`CliError::Failed`]
//! (1). Machine-readable stdout lines (each flushed at once):
//! * `pushpull-scheduler listening on ADDR` and `pushpull-server listening on ADDR` once bound;
//! * `pushpull-scheduler metrics on ADDR` and `pushpull-server metrics on ADDR` just after,
//!   when the node serves Prometheus metrics (`--metrics ADDR` or `[metrics] listen`);
//! * `pushpull-scheduler cpu_seconds S` / `pushpull-server cpu_seconds S` just before exit.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use pushpull_metrics::MetricsEndpoint;
use pushpull_net::tls::TlsIdentity;
use pushpull_proto::config::env::{self, NodeRole};
use pushpull_proto::config::{parse_addr, ConfigError, SchedulerAddr};
use pushpull_proto::Config;
use pushpull_scheduler::Scheduler;
use pushpull_server::Server;

use crate::cpu::cpu_line;
use crate::error::{CliError, CliResult};
use crate::report::{SCHEDULER_LISTENING, SERVER_LISTENING};

/// Flags every node takes: the cluster file and the overrides of its `[cluster] scheduler` and
/// `[tls]` settings.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// The cluster file (TOML; see configs/local.toml and configs/multi-host.toml).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// The scheduler's address, IP:PORT or NAME:PORT (overrides `cluster.scheduler`; the
    /// scheduler binds it, or every address for a name; port 0 picks a free port).
    #[arg(long, value_name = "ADDR")]
    pub scheduler: Option<String>,
    /// The cluster CA certificate, PEM (overrides `tls.ca`).
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// This node's certificate chain, PEM (overrides `tls.cert`).
    #[arg(long, value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// This node's private key, PEM PKCS#8 (overrides `tls.key`).
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP at this address, IP:PORT (overrides `metrics.listen`;
    /// port 0 picks a free port, printed as `pushpull-ROLE metrics on ADDR`).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
}

/// Parses an `IP:PORT` flag value; the error names the flag and the value.
pub fn parse_addr_flag(flag: &str, value: &str) -> CliResult<SocketAddr> {
    parse_addr(value).map_err(|allowed| CliError::usage(format!("{flag} {value:?}: {allowed}")))
}

/// The environment's variables, for [`pushpull_proto::config::env`].
pub fn environment() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// Reads the cluster file and applies, weakest first: BytePS's launch variables (which
/// override the file, as flags do), BytePS's tuning variables (unless the file sets their key)
/// and the flags; every `BYTEPS_*`/`DMLC_*` variable is checked for a binary of `role` (see
/// `pushpull_proto::config::env`), and each variable that changed or lost to the file is
/// logged. Returns the config and the rank the launch variables give (a worker's). Errors name
/// the file and the key, or the variable.
pub fn load_config(args: &NodeArgs, role: NodeRole) -> CliResult<(Config, Option<u32>)> {
    let text = std::fs::read_to_string(&args.config).map_err(|source| {
        CliError::usage(ConfigError::Read {
            path: args.config.clone(),
            source,
        })
    })?;
    let mut config = Config::from_toml_str(&text, &args.config.display().to_string())
        .map_err(CliError::usage)?;
    let vars = environment();
    let launch = env::launch_settings(role, &vars).map_err(CliError::usage)?;
    let mut notes = launch.apply(&mut config);
    notes.extend(
        env::apply_tuning(&mut config, &env::explicit_keys(&text), &vars)
            .map_err(CliError::usage)?,
    );
    for note in notes {
        tracing::info!("{note}");
    }
    if let Some(s) = &args.scheduler {
        SchedulerAddr::parse(s)
            .map_err(|allowed| CliError::usage(format!("--scheduler {s:?}: {allowed}")))?;
        config.cluster.scheduler = s.clone();
    }
    if let Some(p) = &args.ca {
        config.tls.ca = Some(p.clone());
    }
    if let Some(p) = &args.cert {
        config.tls.cert = Some(p.clone());
    }
    if let Some(p) = &args.key {
        config.tls.key = Some(p.clone());
    }
    config
        .validate(&args.config.display().to_string())
        .map_err(CliError::usage)?;
    Ok((config, launch.rank))
}

/// Loads the node's certificate, key and CA; errors name the file (exit code 2).
pub fn load_identity(config: &Config) -> CliResult<TlsIdentity> {
    TlsIdentity::load(&config.tls).map_err(CliError::usage)
}

/// The metrics address of a node: `--metrics` over `metrics.listen`; None when neither is
/// set. Bad input names the flag or key and the value (exit code 2).
pub fn metrics_addr(args: &NodeArgs, config: &Config) -> CliResult<Option<SocketAddr>> {
    pushpull_metrics::listen_addr(args.metrics.as_deref().map(|v| ("--metrics", v)), config)
        .map_err(CliError::usage)
}

/// Starts a node's metrics endpoint at `addr` with `start` (e.g.
/// `pushpull_server::prometheus::serve_server`) and prints `PROGRAM metrics on ADDR`; the
/// endpoint serves until dropped. A bind failure is bad input naming the address.
pub fn start_metrics(
    program: &str,
    addr: Option<SocketAddr>,
    start: impl FnOnce(SocketAddr) -> std::io::Result<MetricsEndpoint>,
) -> CliResult<Option<MetricsEndpoint>> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let endpoint = start(addr)
        .map_err(|e| CliError::usage(format!("{program}: cannot serve metrics on {addr}: {e}")))?;
    print_line(&pushpull_metrics::metrics_line(
        program,
        endpoint.local_addr(),
    ));
    Ok(Some(endpoint))
}

/// Prints `line` on stdout and flushes it at once (the lines a parent reads).
pub fn print_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// `pushpull-scheduler`: binds `cluster.scheduler`, prints `pushpull-scheduler listening on
/// ADDR`, runs the job's rendezvous until every worker finished (Ok) or a node was lost (Err
/// naming it).
pub async fn run_scheduler(args: &NodeArgs) -> CliResult<()> {
    let (config, _) = load_config(args, NodeRole::Scheduler)?;
    let metrics = metrics_addr(args, &config)?;
    let identity = load_identity(&config)?;
    let addr = config.cluster.scheduler.clone();
    let scheduler = Scheduler::bind(config, identity).await.map_err(|e| {
        CliError::usage(format!("pushpull-scheduler: cannot listen on {addr}: {e}"))
    })?;
    print_line(&format!("{SCHEDULER_LISTENING}{}", scheduler.local_addr()));
    let stats = scheduler.stats();
    let _metrics = start_metrics("pushpull-scheduler", metrics, |a| {
        pushpull_scheduler::prometheus::serve_scheduler(a, stats)
    })?;
    let result = scheduler.run().await;
    print_line(&cpu_line("pushpull-scheduler"));
    result.map_err(|e| CliError::failed(format!("pushpull-scheduler: {e}")))
}

/// `pushpull-server`: binds `server.listen` (or `listen`), prints `pushpull-server listening on
/// ADDR`, registers with the scheduler and serves until the job ends.
pub async fn run_server(args: &NodeArgs, listen: Option<&str>) -> CliResult<()> {
    let (mut config, _) = load_config(args, NodeRole::Server)?;
    if let Some(l) = listen {
        parse_addr_flag("--listen", l)?;
        config.server.listen = l.to_string();
    }
    let metrics = metrics_addr(args, &config)?;
    let identity = load_identity(&config)?;
    let addr = config.server.listen.clone();
    let server = Server::bind(config, identity)
        .await
        .map_err(|e| CliError::usage(format!("pushpull-server: cannot listen on {addr}: {e}")))?;
    print_line(&format!("{SERVER_LISTENING}{}", server.local_addr()));
    let stats = server.stats();
    let _metrics = start_metrics("pushpull-server", metrics, |a| {
        pushpull_server::prometheus::serve_server(a, stats)
    })?;
    let result = server.run().await;
    print_line(&cpu_line("pushpull-server"));
    result.map_err(|e| CliError::failed(format!("pushpull-server: {e}")))
}
