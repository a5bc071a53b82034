//! The nodes of one launched cluster as child processes: the one place that knows each node's
//! command line and the order they start in. `pushpull local` runs them on this host,
//! `bench net` each in its own network namespace; the integration tests build their command
//! lines here too.
//!
//! [`spawn_at`] starts any program where a node would run (`pushpull local -- COMMAND`'s ranks
//! and `bench train`'s scripts go through it too).
//!
//! Start order: the scheduler first (it binds port 0 of its address and prints
//! `pushpull-scheduler listening on ADDR`), then every server and every worker with
//! `--scheduler ADDR`. Workers run the cluster file's job with `--rank R --json --progress`.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use pushpull_proto::config::TlsConfig;

use super::procs::{ProcGroup, Programs};
use super::ClusterFiles;
use pushpull_node::error::CliResult;
use pushpull_node::report::{SCHEDULER_LISTENING, STARTUP_TIMEOUT};

/// Where a node runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// On this host, in its network namespace.
    Here,
    /// In the network namespace `ns` (through `ip netns exec`), where it listens on `ip`.
    Netns {
        /// The namespace.
        ns: String,
        /// The node's address there.
        ip: IpAddr,
    },
}

/// `--config FILE` and the node's TLS files: what every node is started with.
fn common_args(config: &Path, tls: &TlsConfig) -> Vec<String> {
    let mut a = vec!["--config".to_string(), config.display().to_string()];
    a.extend(tls.to_args());
    a
}

/// The scheduler's arguments.
pub fn scheduler_args(config: &Path, tls: &TlsConfig) -> Vec<String> {
    common_args(config, tls)
}

/// A server's arguments; `listen` overrides the cluster file's `server.listen` address (the
/// port stays 0).
pub fn server_args(
    config: &Path,
    tls: &TlsConfig,
    scheduler: &str,
    listen: Option<IpAddr>,
) -> Vec<String> {
    let mut a = common_args(config, tls);
    a.extend(["--scheduler".to_string(), scheduler.to_string()]);
    if let Some(ip) = listen {
        a.extend([
            "--listen".to_string(),
            format!("{}", std::net::SocketAddr::new(ip, 0)),
        ]);
    }
    a
}

/// A worker's arguments: it runs the cluster file's job as rank `rank`, prints progress lines
/// and its report as one JSON line.
pub fn worker_args(config: &Path, tls: &TlsConfig, scheduler: &str, rank: u32) -> Vec<String> {
    let mut a = common_args(config, tls);
    a.extend([
        "--scheduler".to_string(),
        scheduler.to_string(),
        "--rank".to_string(),
        rank.to_string(),
        "--json".to_string(),
        "--progress".to_string(),
    ]);
    a
}

/// Starts `program args` as child `name` of `group` at `place` (in a namespace through `ip
/// netns exec NS PROGRAM ARGS`, which keeps the environment), with `env` added to the
/// launcher's environment; returns its index.
pub fn spawn_at(
    group: &mut ProcGroup,
    name: &str,
    place: &Place,
    program: &Path,
    args: &[String],
    env: &[(String, OsString)],
) -> CliResult<usize> {
    match place {
        Place::Here => group.spawn_with_env(name, program, args, env),
        Place::Netns { ns, .. } => {
            let mut a = vec![
                "netns".to_string(),
                "exec".to_string(),
                ns.clone(),
                program.display().to_string(),
            ];
            a.extend(args.iter().cloned());
            group.spawn_with_env(name, Path::new("ip"), &a, env)
        }
    }
}

/// The processes [`start`] spawned, as indexes into its [`ProcGroup`].
#[derive(Debug, Clone)]
pub struct Started {
    /// The scheduler.
    pub scheduler: usize,
    /// The address the scheduler printed.
    pub scheduler_addr: String,
    /// Server `s` is `servers[s]`.
    pub servers: Vec<usize>,
    /// Worker `w` is `workers[w]`.
    pub workers: Vec<usize>,
}

/// Spawns the cluster of `files` (certificates in the order scheduler, servers, workers)
/// into `group` as `scheduler`, `server S` and `worker W`, each where `places` says (same
/// order; missing entries run here), and waits for the scheduler's address (see the module
/// docs).
pub async fn start(
    group: &mut ProcGroup,
    programs: &Programs,
    files: &ClusterFiles,
    num_servers: u32,
    num_workers: u32,
    places: &[Place],
) -> CliResult<Started> {
    let config = files.config_path.as_path();
    let tls = &files.tls;
    let place = |i: usize| places.get(i).unwrap_or(&Place::Here);
    let label = |i: usize| match i {
        0 => "scheduler".to_string(),
        i if i <= num_servers as usize => format!("server {}", i - 1),
        i => format!("worker {}", i - 1 - num_servers as usize),
    };
    let spawn = |group: &mut ProcGroup,
                 i: usize,
                 prog: &(PathBuf, Vec<String>),
                 args: Vec<String>|
     -> CliResult<usize> {
        let mut full = prog.1.clone();
        full.extend(args);
        spawn_at(group, &label(i), place(i), &prog.0, &full, &[])
    };
    let scheduler = spawn(
        group,
        0,
        &programs.scheduler,
        scheduler_args(config, &tls[0]),
    )?;
    let scheduler_addr = group
        .wait_line(scheduler, SCHEDULER_LISTENING, STARTUP_TIMEOUT)
        .await?;
    let mut servers = Vec::new();
    for s in 0..num_servers as usize {
        let i = 1 + s;
        let listen = match place(i) {
            Place::Here => None,
            Place::Netns { ip, .. } => Some(*ip),
        };
        let args = server_args(config, &tls[i], &scheduler_addr, listen);
        servers.push(spawn(group, i, &programs.server, args)?);
    }
    let mut workers = Vec::new();
    for w in 0..num_workers {
        let i = 1 + num_servers as usize + w as usize;
        let args = worker_args(config, &tls[i], &scheduler_addr, w);
        workers.push(spawn(group, i, &programs.worker, args)?);
    }
    Ok(Started {
        scheduler,
        scheduler_addr,
        servers,
        workers,
    })
}
