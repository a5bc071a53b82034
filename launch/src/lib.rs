//! pushpull's launcher: a cluster of this machine's binaries as child processes, and the files
//! every node needs (a throw-away CA and certificates, the effective cluster file). The
//! `pushpull local`, `pushpull certs`, `pushpull prepare` / `pushpull node` and the benchmarks'
//! clusters start here.
//!
//! | module | what it holds |
//! |---|---|
//! | here | [`ClusterFiles`]: a temporary folder with certificates for the given node names and the cluster file, used by `pushpull local`, `bench transport` and `bench net`; [`write_config`] |
//! | [`nodes`] | the nodes of one cluster as child processes: each node's command line, the start order, where each runs (here or in a network namespace) |
//! | [`local`] | `pushpull local`: a whole cluster as child processes on loopback, and `--compare` (the training job per compressor and seed) |
//! | [`script`] | `pushpull local -- COMMAND`: a scheduler and servers, and the user's command as every worker, with the environment `pushpull.torch` reads; its two halves (`spawn_ranks`, `wait_ranks`) also run `bench train`'s script in network namespaces |
//! | [`procs`] | child processes: spawning, stdout lines, stderr tails, kill on drop / failure / Ctrl-C |
//! | [`certs`] | `pushpull certs`: a cluster CA and node certificates, the default node names |
//! | [`multihost`] | `pushpull prepare` (a job folder: cluster file, CA, a certificate per node) and `pushpull node` (one node of it, its role and index from flags or Slurm's, Kubernetes' or torchrun's variables), for cluster managers |
//! | [`kube`] | `pushpull prepare --kubernetes NAME`: the job folder as Kubernetes manifests (a ConfigMap, a Secret, a headless Service for the scheduler, one indexed Job in which each pod mounts only its own certificate) |
//!
//! What the children print is read through `pushpull_node::report` (the `listening on` lines,
//! the benchmark's report) and `pushpull_jobs` (the training job's report).

#![warn(missing_docs)]

pub mod certs;
pub mod kube;
pub mod local;
pub mod multihost;
pub mod nodes;
pub mod procs;
pub mod script;

use std::path::{Path, PathBuf};

use pushpull_net::certs::generate_cluster;
use pushpull_proto::config::TlsConfig;
use pushpull_proto::Config;

use pushpull_node::error::{CliError, CliResult};

/// What the nodes of one launched cluster read: certificates and the cluster file, in a
/// temporary folder deleted on drop.
#[derive(Debug)]
pub struct ClusterFiles {
    dir: tempfile::TempDir,
    /// Each node's TLS files, in the order of the names given.
    pub tls: Vec<TlsConfig>,
    /// The cluster file.
    pub config_path: PathBuf,
}

impl ClusterFiles {
    /// A folder named `PREFIX…` with a fresh CA, a certificate per name of `nodes`, and
    /// `config` written as `cluster.toml`.
    pub fn new(prefix: &str, config: &Config, nodes: &[String]) -> CliResult<ClusterFiles> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .map_err(|e| CliError::failed(format!("cannot make a temporary folder: {e}")))?;
        let tls = generate_cluster(dir.path(), &config.tls.server_name, nodes)
            .map_err(|e| CliError::failed(format!("cannot make throw-away certificates: {e}")))?;
        let config_path = write_config(config, dir.path())?;
        Ok(ClusterFiles {
            dir,
            tls,
            config_path,
        })
    }

    /// The folder (logs may go there too).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// Writes `config` (without `[tls]`) to `dir/cluster.toml`.
pub fn write_config(config: &Config, dir: &Path) -> CliResult<PathBuf> {
    let mut c = config.clone();
    c.tls.ca = None;
    c.tls.cert = None;
    c.tls.key = None;
    let text = toml::to_string(&c)
        .map_err(|e| CliError::failed(format!("cannot write the cluster file: {e}")))?;
    let path = dir.join("cluster.toml");
    std::fs::write(&path, text)
        .map_err(|e| CliError::failed(format!("cannot write {}: {e}", path.display())))?;
    Ok(path)
}
