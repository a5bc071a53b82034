//! One multi-host launch for cluster managers (Slurm, Kubernetes, or by hand): `pushpull
//! prepare` writes a job folder once (the cluster file with the scheduler's address, a CA and a
//! certificate per node, keys mode 0600), and `pushpull node` runs one node of it, taking its
//! role and index from flags or from the manager's environment, and replaces itself with the
//! node (the scheduler, a server, the built-in worker, or the user's command as a worker, with
//! the environment `pushpull.torch` reads). A node cannot outlive the process that started it
//! (`PR_SET_PDEATHSIG`), so nothing escapes a Slurm step or a container.
//!
//! The job folder (`pushpull prepare --out DIR`):
//!
//! ```text
//! DIR/cluster.toml          the cluster file (no [tls]: each node's files are found below)
//! DIR/ca/ca.pem, ca.key     the CA (keep ca.key where it is)
//! DIR/<node>/ca.pem, <node>.pem, <node>.key   per node: scheduler, server0.., worker0..
//! ```
//!
//! Which node a process is ([`which_node`]): `--role` and `--index`, else the index from the
//! first of `SLURM_PROCID` (the task in its `srun` step), `JOB_COMPLETION_INDEX` (a Kubernetes
//! indexed Job's pod) and `RANK` (torchrun's). With `--role auto` the index counts every node
//! of the job: 0 is the scheduler, 1..=S the servers, then the workers (one indexed Job or one
//! `srun` step for the whole job), and a command after `--` is the workers' ([`own_command`]).
//! `--tls-dir` takes the node's certificate from a folder of its own instead of the job
//! folder's `<node>/` (a Kubernetes pod mounts only its own; see [`crate::kube`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use pushpull_proto::config::{SchedulerAddr, TlsConfig};
use pushpull_proto::Config;

use crate::procs::Programs;
use pushpull_node::error::{CliError, CliResult};

/// The environment variables an index is read from, strongest first.
pub const INDEX_VARIABLES: [&str; 3] = ["SLURM_PROCID", "JOB_COMPLETION_INDEX", "RANK"];

/// A node's role in a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The scheduler.
    Scheduler,
    /// A server.
    Server,
    /// A worker.
    Worker,
}

/// `--role`: a role, or `auto` (the role follows from an index over the whole job).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RoleArg {
    /// The scheduler (index 0 only).
    Scheduler,
    /// Server `index`.
    Server,
    /// Worker `index` (its rank).
    Worker,
    /// Node `index` of the job: 0 the scheduler, 1..=S servers, then the workers.
    Auto,
}

/// Which node this process is: its role, its index within the role, and where the index came
/// from (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Which {
    /// The role.
    pub role: Role,
    /// Index within the role (a worker's rank).
    pub index: u32,
    /// `--index` or the variable it was read from.
    pub source: String,
}

impl Which {
    /// The node's name: `scheduler`, `server<i>`, `worker<i>` (its certificate folder).
    pub fn name(&self) -> String {
        match self.role {
            Role::Scheduler => "scheduler".to_string(),
            Role::Server => format!("server{}", self.index),
            Role::Worker => format!("worker{}", self.index),
        }
    }
}

/// Works out which node this is from `role`, `index` (the flag) and `env` (see the module
/// docs), checked against the job's `servers` and `workers`. Errors name the flag or variable
/// and what is allowed.
pub fn which_node(
    role: RoleArg,
    index: Option<u32>,
    env: &dyn Fn(&str) -> Option<String>,
    (servers, workers): (u32, u32),
) -> CliResult<Which> {
    let (index, source) = match index {
        Some(i) => (i, "--index".to_string()),
        None => {
            let found = INDEX_VARIABLES
                .iter()
                .find_map(|v| env(v).filter(|s| !s.is_empty()).map(|s| (*v, s)));
            match (found, role) {
                (Some((var, value)), _) => {
                    let i = value.trim().parse::<u32>().map_err(|_| {
                        CliError::usage(format!(
                            "{var}={value:?}: expected a non-negative integer (the node's index)"
                        ))
                    })?;
                    (i, var.to_string())
                }
                (None, RoleArg::Scheduler) => (0, "the scheduler's".to_string()),
                (None, _) => {
                    return Err(CliError::usage(format!(
                        "no index for this node: pass --index N or set one of {}",
                        INDEX_VARIABLES.join(", ")
                    )))
                }
            }
        }
    };
    let (role, index) = match role {
        RoleArg::Scheduler => (Role::Scheduler, index),
        RoleArg::Server => (Role::Server, index),
        RoleArg::Worker => (Role::Worker, index),
        RoleArg::Auto if index == 0 => (Role::Scheduler, 0),
        RoleArg::Auto if index <= servers => (Role::Server, index - 1),
        RoleArg::Auto => (Role::Worker, index - 1 - servers),
    };
    let (count, what) = match role {
        Role::Scheduler => (1, "the scheduler's index must be 0"),
        Role::Server => (servers, "cluster.num_servers"),
        Role::Worker => (workers, "cluster.num_workers"),
    };
    if index >= count {
        let total = if matches!(role, Role::Scheduler) {
            String::new()
        } else {
            format!(" = {count}")
        };
        return Err(CliError::usage(format!(
            "{source} gives {} index {index}, out of range ({what}{total}{})",
            match role {
                Role::Scheduler => "the scheduler",
                Role::Server => "server",
                Role::Worker => "worker",
            },
            if matches!(role, Role::Worker) && source != "--index" {
                format!("; with --role auto the job has 1 + {servers} + {workers} nodes")
            } else {
                String::new()
            }
        )));
    }
    Ok(Which {
        role,
        index,
        source,
    })
}

/// `pushpull prepare`: writes `config` with `cluster.scheduler = scheduler` to
/// `out/cluster.toml` and a CA and certificates for every node into `out` (see the module
/// docs). Refuses a folder that already holds a CA unless `force`. Returns the text to print.
pub fn prepare(out: &Path, mut config: Config, scheduler: &str, force: bool) -> CliResult<String> {
    let addr = SchedulerAddr::parse(scheduler)
        .map_err(|allowed| CliError::usage(format!("--scheduler {scheduler:?}: {allowed}")))?;
    if addr.port() == 0 {
        return Err(CliError::usage(format!(
            "--scheduler {scheduler:?}: give the port the scheduler will bind (every node dials \
             it), not 0"
        )));
    }
    config.cluster.scheduler = addr.to_string();
    config
        .validate("the job's cluster file")
        .map_err(CliError::usage)?;
    std::fs::create_dir_all(out)
        .map_err(|e| CliError::usage(format!("--out {}: {e}", out.display())))?;
    let (ns, nw) = (config.cluster.num_servers, config.cluster.num_workers);
    let names = crate::certs::default_node_names(ns, nw);
    let days = pushpull_net::certs::DEFAULT_VALIDITY_DAYS;
    crate::certs::make_certs(out, &names, &config.tls.server_name, force, days)?;
    let path = crate::write_config(&config, out)?;
    Ok(format!(
        "wrote {} (scheduler {addr}, {nw} workers, {ns} servers, local groups of {}) and \
         certificates for {} nodes in {}; start each node with `pushpull node --job-dir {} \
         --role ...`",
        path.display(),
        config.cluster.local_size,
        names.len(),
        out.display(),
        out.display()
    ))
}

/// What node `which` runs of `command` (the words after `--`): with `--role auto` every node
/// of the job has the same command line (one Kubernetes indexed Job, one `srun` step), so the
/// command is the workers' and the scheduler and servers run themselves; with an explicit role
/// it is returned as given (and [`node_command`] refuses it for a scheduler or a server).
pub fn own_command<'a>(role: RoleArg, which: &Which, command: &'a [String]) -> &'a [String] {
    if role == RoleArg::Auto && which.role != Role::Worker {
        &[]
    } else {
        command
    }
}

/// What `pushpull node` runs: program, arguments and the extra environment.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeCommand {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables to set (a user command's worker: what `pushpull.torch` reads).
    pub env: Vec<(String, OsString)>,
}

/// The TLS files of node `name`: in `tls_dir` when given (a folder holding only this node's
/// `ca.pem`, `<name>.pem` and `<name>.key`, as a Kubernetes pod mounts it), else in the job
/// folder's `dir/<name>/`.
pub fn node_tls(dir: &Path, tls_dir: Option<&Path>, name: &str) -> TlsConfig {
    let own = tls_dir.map_or_else(|| dir.join(name), Path::to_path_buf);
    TlsConfig {
        ca: Some(own.join("ca.pem")),
        cert: Some(own.join(format!("{name}.pem"))),
        key: Some(own.join(format!("{name}.key"))),
        ..TlsConfig::default()
    }
}

/// The command of node `which` of the job in `dir` (its cluster file `config`, read from
/// `config_path`; its TLS files from `tls_dir` if given, see [`node_tls`]): the scheduler, a
/// server, or a worker running `command` (or the built-in job when `command` is empty). Checks
/// that the node's certificate files exist, naming the missing one.
pub fn node_command(
    dir: &Path,
    tls_dir: Option<&Path>,
    config_path: &Path,
    config: &Config,
    which: &Which,
    programs: &Programs,
    command: &[String],
) -> CliResult<NodeCommand> {
    let name = which.name();
    let tls = node_tls(dir, tls_dir, &name);
    for f in [&tls.ca, &tls.cert, &tls.key].into_iter().flatten() {
        if !f.is_file() {
            let whence = match tls_dir {
                Some(t) => format!(
                    "--tls-dir {} must hold this node's ca.pem, {name}.pem and {name}.key",
                    t.display()
                ),
                None => format!(
                    "made by `pushpull prepare --out {}`; each node needs its own folder {name}/",
                    dir.display()
                ),
            };
            return Err(CliError::usage(format!(
                "{name}: {} is missing ({whence})",
                f.display()
            )));
        }
    }
    if !command.is_empty() && which.role != Role::Worker {
        return Err(CliError::usage(format!(
            "a command after `--` runs as a worker; this node is {name} ({})",
            which.source
        )));
    }
    let scheduler = config.cluster.scheduler.clone();
    let with = |(program, lead): &(PathBuf, Vec<String>), rest: Vec<String>| NodeCommand {
        program: program.clone(),
        args: lead.iter().cloned().chain(rest).collect(),
        env: Vec::new(),
    };
    Ok(match which.role {
        Role::Scheduler => with(
            &programs.scheduler,
            crate::nodes::scheduler_args(config_path, &tls),
        ),
        Role::Server => with(
            &programs.server,
            crate::nodes::server_args(config_path, &tls, &scheduler, None),
        ),
        Role::Worker if command.is_empty() => {
            let mut args = crate::nodes::worker_args(config_path, &tls, &scheduler, which.index);
            // A person reads this worker's output: the report as text, no progress lines.
            args.retain(|a| a != "--json" && a != "--progress");
            with(&programs.worker, args)
        }
        Role::Worker => {
            let c = &config.cluster;
            NodeCommand {
                program: PathBuf::from(&command[0]),
                args: command[1..].to_vec(),
                env: crate::script::worker_env(
                    config_path,
                    &scheduler,
                    c.num_workers,
                    c.local_size,
                    c.num_servers,
                    which.index,
                    &tls,
                ),
            }
        }
    })
}

/// Replaces this process with `cmd`, which dies with its parent (`PR_SET_PDEATHSIG`).
/// Returns only on failure.
pub fn exec(cmd: &NodeCommand) -> CliError {
    use std::os::unix::process::CommandExt;
    let mut c = std::process::Command::new(&cmd.program);
    c.args(&cmd.args).envs(cmd.env.iter().map(|(k, v)| (k, v)));
    // SAFETY: prctl is async-signal-safe; the closure touches nothing else.
    unsafe {
        c.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let e = c.exec();
    CliError::failed(format!("cannot run {}: {e}", cmd.program.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_index_comes_from_the_flag_then_the_managers_variables() {
        let job = (2, 4);
        let w = |role, index, vars: &[(&str, &str)]| which_node(role, index, &env_of(vars), job);
        let got = w(RoleArg::Worker, Some(3), &[("SLURM_PROCID", "1")]).unwrap();
        assert_eq!(
            (got.role, got.index, got.name()),
            (Role::Worker, 3, "worker3".into())
        );
        let got = w(
            RoleArg::Server,
            None,
            &[("RANK", "0"), ("SLURM_PROCID", "1")],
        )
        .unwrap();
        assert_eq!(
            (got.name(), got.source.as_str()),
            ("server1".into(), "SLURM_PROCID")
        );
        let got = w(RoleArg::Worker, None, &[("JOB_COMPLETION_INDEX", "2")]).unwrap();
        assert_eq!(got.name(), "worker2");
        assert_eq!(
            w(RoleArg::Scheduler, None, &[]).unwrap().name(),
            "scheduler"
        );
        // --role auto: 0 the scheduler, 1..=2 the servers, 3..=6 the workers.
        let names: Vec<String> = (0..7)
            .map(|i| w(RoleArg::Auto, Some(i), &[]).unwrap().name())
            .collect();
        assert_eq!(
            names,
            [
                "scheduler",
                "server0",
                "server1",
                "worker0",
                "worker1",
                "worker2",
                "worker3"
            ]
        );
    }

    #[test]
    fn a_bad_or_missing_index_is_named() {
        let job = (2, 4);
        let err = |role, index, vars: &[(&str, &str)]| {
            which_node(role, index, &env_of(vars), job)
                .unwrap_err()
                .to_string()
        };
        let e = err(RoleArg::Worker, None, &[]);
        assert!(e.contains("--index") && e.contains("SLURM_PROCID"), "{e}");
        let e = err(RoleArg::Worker, None, &[("SLURM_PROCID", "x1")]);
        assert!(e.contains("SLURM_PROCID=\"x1\""), "{e}");
        let e = err(RoleArg::Worker, Some(4), &[]);
        assert!(
            e.contains("worker index 4") && e.contains("cluster.num_workers = 4"),
            "{e}"
        );
        let e = err(RoleArg::Server, None, &[("RANK", "2")]);
        assert!(e.contains("RANK gives server index 2"), "{e}");
        let e = err(RoleArg::Auto, None, &[("JOB_COMPLETION_INDEX", "7")]);
        assert!(e.contains("1 + 2 + 4 nodes"), "{e}");
        let e = err(RoleArg::Scheduler, Some(1), &[]);
        assert!(e.contains("must be 0"), "{e}");
    }

    #[test]
    fn prepare_writes_a_job_folder_every_node_can_start_from() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = crate::local::default_config();
        config.cluster.num_workers = 4;
        config.cluster.num_servers = 1;
        config.cluster.local_size = 2;
        let e = prepare(dir.path(), config.clone(), "node001:0", false).unwrap_err();
        assert!(e.to_string().contains("not 0"), "{e}");
        let e = prepare(dir.path(), config.clone(), "node_1:9000", false).unwrap_err();
        assert!(e.to_string().contains("DNS name"), "{e}");
        prepare(dir.path(), config.clone(), "node001:29500", false).unwrap();
        // Not twice without --force (the nodes' certificates would no longer match).
        assert!(prepare(dir.path(), config, "node001:29500", false).is_err());
        let path = dir.path().join("cluster.toml");
        let written = Config::from_file(&path).unwrap();
        assert_eq!(written.cluster.scheduler, "node001:29500");
        assert_eq!(written.cluster.local_size, 2);
        let programs = Programs::explicit(Path::new("/bin/pushpull"), Path::new("/bin/ppw"));
        let which = |role, index| which_node(role, Some(index), &|_| None, (1, 4)).unwrap();
        let user = ["python".to_string(), "train.py".to_string()];
        let cmd = node_command(
            dir.path(),
            None,
            &path,
            &written,
            &which(RoleArg::Worker, 3),
            &programs,
            &user,
        )
        .unwrap();
        assert_eq!(cmd.program, PathBuf::from("python"));
        let var = |k: &str| {
            cmd.env
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.to_string_lossy().to_string())
        };
        assert_eq!(var("DMLC_WORKER_ID").as_deref(), Some("1"));
        assert_eq!(var("BYTEPS_LOCAL_RANK").as_deref(), Some("1"));
        assert_eq!(var("DMLC_PS_ROOT_URI").as_deref(), Some("node001"));
        assert!(var("PUSHPULL_TLS_KEY")
            .unwrap()
            .ends_with("worker3/worker3.key"));
        // A flat job across hosts: one worker a host, each local rank 0 (pushpull.torch's
        // local_rank() picks the GPU), rank = host.
        let mut flat = written.clone();
        flat.cluster.local_size = 1;
        let cmd = node_command(
            dir.path(),
            None,
            &path,
            &flat,
            &which(RoleArg::Worker, 3),
            &programs,
            &user,
        )
        .unwrap();
        let var = |k: &str| {
            cmd.env
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.to_string_lossy().to_string())
        };
        assert_eq!(var("DMLC_WORKER_ID").as_deref(), Some("3"));
        assert_eq!(var("DMLC_NUM_WORKER").as_deref(), Some("4"));
        assert_eq!(var("BYTEPS_LOCAL_RANK").as_deref(), Some("0"));
        assert_eq!(var("BYTEPS_LOCAL_SIZE").as_deref(), Some("1"));
        let cmd = node_command(
            dir.path(),
            None,
            &path,
            &written,
            &which(RoleArg::Auto, 1),
            &programs,
            &[],
        )
        .unwrap();
        assert_eq!(cmd.args[0], "server");
        assert!(
            cmd.args.iter().any(|a| a.ends_with("server0/server0.pem")),
            "{cmd:?}"
        );
        // A command runs only as a worker; a node without its folder is named.
        let e = node_command(
            dir.path(),
            None,
            &path,
            &written,
            &which(RoleArg::Auto, 0),
            &programs,
            &user,
        )
        .unwrap_err();
        assert!(e.to_string().contains("runs as a worker"), "{e}");
        std::fs::remove_dir_all(dir.path().join("worker2")).unwrap();
        let e = node_command(
            dir.path(),
            None,
            &path,
            &written,
            &which(RoleArg::Worker, 2),
            &programs,
            &[],
        )
        .unwrap_err();
        assert!(e.to_string().contains("worker2/ca.pem is missing"), "{e}");
        // --tls-dir: the node's own folder wherever it is mounted; a wrong one is named.
        let cmd = node_command(
            dir.path(),
            Some(&dir.path().join("worker1")),
            &path,
            &written,
            &which(RoleArg::Worker, 1),
            &programs,
            &[],
        )
        .unwrap();
        assert!(
            cmd.args.iter().any(|a| a.ends_with("worker1/worker1.key")),
            "{cmd:?}"
        );
        let e = node_command(
            dir.path(),
            Some(&dir.path().join("worker1")),
            &path,
            &written,
            &which(RoleArg::Worker, 0),
            &programs,
            &[],
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("worker0.pem is missing (--tls-dir"),
            "{e}"
        );
    }

    #[test]
    fn with_role_auto_the_command_is_the_workers() {
        let job = (1, 2);
        let user = ["python".to_string(), "train.py".to_string()];
        let own = |role, index| {
            let which = which_node(role, Some(index), &|_| None, job).unwrap();
            own_command(role, &which, &user).len()
        };
        assert_eq!([own(RoleArg::Auto, 0), own(RoleArg::Auto, 1)], [0, 0]);
        assert_eq!([own(RoleArg::Auto, 2), own(RoleArg::Auto, 3)], [2, 2]);
        // An explicit role keeps it, for node_command to refuse on a scheduler or server.
        assert_eq!(own(RoleArg::Server, 0), 2);
    }
}
