//! `pushpull local --workers N -- COMMAND ARGS…`: a scheduler and servers on loopback, and N
//! copies of the user's command as the workers (as `bpslaunch` or `torchrun` do). Each copy
//! gets the environment that `pushpull.torch.init()` reads ([`worker_env`]); its stdout and
//! stderr lines are printed prefixed with `[rank R] `. The launcher exits 0 once every copy has
//! exited 0 and the scheduler and servers have ended the job, or with the first failure's exit
//! status, after killing the rest. [`spawn_ranks`] and [`wait_ranks`] are its two halves, which
//! `pushpull bench train` uses with the ranks in network namespaces.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pushpull_proto::config::TlsConfig;
use pushpull_proto::Config;

use crate::nodes::{spawn_at, Place};
use crate::procs::{Event, ProcGroup, Programs};
use pushpull_node::error::{CliError, CliResult};

/// How long the scheduler and servers may take to exit after the last worker exited 0.
const WIND_DOWN: Duration = Duration::from_secs(30);

/// The environment of the copy of rank `rank`: the cluster file, the scheduler's address, the
/// job's size in BytePS's variables and the rank's own certificate, in hosts of `per_host`
/// workers (`DMLC_NUM_WORKER` hosts, this rank's host `DMLC_WORKER_ID`, its index there
/// `BYTEPS_LOCAL_RANK`). `pushpull local` runs every worker on one host (`per_host` =
/// `cluster.local_size` when it groups them, else every worker); `pushpull node` runs
/// `cluster.local_size` workers a host.
#[allow(clippy::too_many_arguments)]
pub fn worker_env(
    config_path: &std::path::Path,
    scheduler: &str,
    num_workers: u32,
    per_host: u32,
    num_servers: u32,
    rank: u32,
    tls: &TlsConfig,
) -> Vec<(String, OsString)> {
    let g = per_host.max(1);
    let (host, port) = scheduler.rsplit_once(':').unwrap_or((scheduler, ""));
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let path = |p: &Option<PathBuf>| p.clone().unwrap_or_default().into_os_string();
    let s = |v: &str| OsString::from(v);
    vec![
        ("PUSHPULL_CONFIG".into(), config_path.as_os_str().to_owned()),
        ("PUSHPULL_TLS_CA".into(), path(&tls.ca)),
        ("PUSHPULL_TLS_CERT".into(), path(&tls.cert)),
        ("PUSHPULL_TLS_KEY".into(), path(&tls.key)),
        ("DMLC_ROLE".into(), s("worker")),
        ("DMLC_PS_ROOT_URI".into(), s(host)),
        ("DMLC_PS_ROOT_PORT".into(), s(port)),
        ("DMLC_NUM_WORKER".into(), s(&(num_workers / g).to_string())),
        ("DMLC_NUM_SERVER".into(), s(&num_servers.to_string())),
        ("DMLC_WORKER_ID".into(), s(&(rank / g).to_string())),
        ("BYTEPS_LOCAL_RANK".into(), s(&(rank % g).to_string())),
        ("BYTEPS_LOCAL_SIZE".into(), s(&g.to_string())),
    ]
}

/// Runs the job (see the module docs). Returns `Ok` when every copy exited 0; otherwise an
/// error whose exit code is the failed copy's (or 1 when a scheduler or server failed).
pub async fn run_script(
    config: &Config,
    programs: &Programs,
    command: &[String],
    logs: bool,
) -> CliResult<()> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| CliError::usage("no command after `--`"))?;
    let (nw, ns) = (config.cluster.num_workers, config.cluster.num_servers);
    let names = crate::certs::default_node_names(ns, nw);
    let files = super::ClusterFiles::new("pushpull-script-", config, &names)?;
    let mut group = ProcGroup::new();
    group.forward_stderr(Arc::new(move |name: &str, line: &str| {
        // The ranks' stderr always; the scheduler's and servers' logs with --logs.
        if logs || name.starts_with("rank ") {
            eprintln!("[{name}] {line}");
        }
    }));
    let result = drive(&mut group, config, programs, &files, program, args).await;
    if result.is_err() {
        group.kill_all();
    }
    result
}

async fn drive(
    group: &mut ProcGroup,
    config: &Config,
    programs: &Programs,
    files: &super::ClusterFiles,
    program: &str,
    args: &[String],
) -> CliResult<()> {
    let (nw, ns) = (config.cluster.num_workers, config.cluster.num_servers);
    // The scheduler and the servers; the workers are the user's command.
    let started = super::nodes::start(group, programs, files, ns, 0, &[]).await?;
    // One machine: its workers are one host, grouped or not.
    let per_host = match config.cluster.local_size {
        g if g > 1 => g,
        _ => nw,
    };
    let ranks = spawn_ranks(
        group,
        files,
        &started.scheduler_addr,
        (nw, per_host, ns),
        (std::path::Path::new(program), args),
        &[],
        &[],
    )?;
    let print = |r: usize, line: &str| println!("[rank {r}] {line}");
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
        CliError::failed("interrupted (Ctrl-C): killed every process of the job")
    };
    let (proc, status) = match wait_ranks(group, &ranks, print, ctrl_c).await {
        Ok(()) => return Ok(()),
        Err(Stop::Stopped(e)) => return Err(e),
        Err(Stop::WindDown) => {
            return Err(CliError::failed(format!(
                "every rank exited 0, but the scheduler or a server was still running {} s later",
                WIND_DOWN.as_secs()
            )))
        }
        Err(Stop::Failed { proc, status }) => (proc, status),
    };
    group.kill_all();
    let err = if ranks.contains(&proc) {
        // Its stderr was printed as it came.
        let how = match status.code() {
            Some(c) => format!("exited with code {c}"),
            None => format!("ended with {status}"),
        };
        CliError::status(
            exit_code(status),
            format!(
                "{} {how}; stopped the other processes of the job",
                group.name(proc)
            ),
        )
    } else {
        CliError::failed(format!(
            "{}; stopped the other processes of the job",
            group.failure_message(proc, status)
        ))
    };
    // Print what the others wrote before they were stopped.
    let drain = async {
        while let Some(ev) = group.next_event().await {
            if let Event::Line { proc, line } = ev {
                if let Some(r) = ranks.iter().position(|&i| i == proc) {
                    println!("[rank {r}] {line}");
                }
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), drain).await;
    Err(err)
}

/// Spawns `program args` once per worker rank into `group`, as `rank R`, each with its
/// [`worker_env`] (`workers` ranks in hosts of `per_host`, `servers` servers, the scheduler at
/// `scheduler`, rank R's certificate `files.tls[1 + servers + R]`) and `extra_env`, rank R at
/// `places[R]` (here where missing). Returns their indexes in `group`, by rank.
pub fn spawn_ranks(
    group: &mut ProcGroup,
    files: &super::ClusterFiles,
    scheduler: &str,
    (workers, per_host, servers): (u32, u32, u32),
    (program, args): (&std::path::Path, &[String]),
    places: &[Place],
    extra_env: &[(String, OsString)],
) -> CliResult<Vec<usize>> {
    let mut ranks = Vec::with_capacity(workers as usize);
    for r in 0..workers {
        let tls = &files.tls[1 + servers as usize + r as usize];
        let mut env = worker_env(
            &files.config_path,
            scheduler,
            workers,
            per_host,
            servers,
            r,
            tls,
        );
        env.extend(extra_env.iter().cloned());
        let place = places.get(r as usize).unwrap_or(&Place::Here);
        ranks.push(spawn_at(
            group,
            &format!("rank {r}"),
            place,
            program,
            args,
            &env,
        )?);
    }
    Ok(ranks)
}

/// Why [`wait_ranks`] returned before every child exited 0.
#[derive(Debug)]
pub enum Stop {
    /// Child `proc` exited with `status`, not 0 (the others still run: the caller kills them).
    Failed {
        /// Its index in the group.
        proc: usize,
        /// How it exited.
        status: std::process::ExitStatus,
    },
    /// Every rank exited 0, but another child (the scheduler or a server) was still running
    /// 30 s later.
    WindDown,
    /// `stop` came first, with this error.
    Stopped(CliError),
}

/// Waits until every child of `group` has exited 0, handing each stdout line of a child of
/// `ranks` to `on_line(rank, line)` (other children's lines are dropped). Returns early when a
/// child fails, when the other children outlive the ranks by 30 s, or when `stop` resolves
/// (Ctrl-C for `pushpull local`, a signal flag for the benchmarks).
pub async fn wait_ranks(
    group: &mut ProcGroup,
    ranks: &[usize],
    mut on_line: impl FnMut(usize, &str),
    stop: impl std::future::Future<Output = CliError>,
) -> Result<(), Stop> {
    let mut ok_ranks = 0;
    tokio::pin!(stop);
    let wind_down = tokio::time::sleep(Duration::MAX);
    tokio::pin!(wind_down);
    loop {
        let ev = tokio::select! {
            ev = group.next_event() => ev,
            e = &mut stop => return Err(Stop::Stopped(e)),
            _ = &mut wind_down => return Err(Stop::WindDown),
        };
        let Some(ev) = ev else { return Ok(()) };
        match ev {
            Event::Line { proc, line } => {
                if let Some(r) = ranks.iter().position(|&i| i == proc) {
                    on_line(r, &line);
                }
            }
            Event::Exit { proc, status } => {
                if !status.success() {
                    return Err(Stop::Failed { proc, status });
                }
                if ranks.contains(&proc) {
                    ok_ranks += 1;
                    if ok_ranks == ranks.len() {
                        wind_down
                            .as_mut()
                            .reset(tokio::time::Instant::now() + WIND_DOWN);
                    }
                }
            }
        }
    }
}

/// A child's exit status as a process exit code: its code, or 128 + the signal that killed it
/// (as shells report it).
fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1).max(1),
        (None, Some(s)) => u8::try_from(128 + s).unwrap_or(1),
        _ => 1,
    }
}
