//! Helpers shared by the integration tests: certificates, cluster files, the real binaries as
//! child processes (each binds port 0 and reports its address on stdout; their command lines
//! come from `pushpull::launch::nodes`, as `pushpull local`'s do), in-process workers, and a
//! global lock so cluster tests run one at a time.

#![allow(dead_code)]

pub mod netns;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pushpull::launch::nodes;
use pushpull::report::{SCHEDULER_LISTENING, SERVER_LISTENING};
use pushpull_net::certs::generate_cluster;
use pushpull_net::tls::TlsIdentity;
use pushpull_proto::config::TlsConfig;
use pushpull_proto::Config;
use pushpull_worker::{JoinOptions, Worker};

/// The commands the tests run, each a program and its leading arguments. `pushpull-scheduler`
/// and `pushpull-server` are the `pushpull-node` package's binaries, which this package's
/// tests cannot name (`CARGO_BIN_EXE_*` names only this package's): `pushpull scheduler` and
/// `pushpull server` take the same flags and run the same code (`node/tests/` runs the
/// binaries themselves).
pub const PUSHPULL: &[&str] = &[env!("CARGO_BIN_EXE_pushpull")];
pub const SCHEDULER: &[&str] = &[env!("CARGO_BIN_EXE_pushpull"), "scheduler"];
pub const SERVER: &[&str] = &[env!("CARGO_BIN_EXE_pushpull"), "server"];
pub const WORKER: &[&str] = &[env!("CARGO_BIN_EXE_pushpull-worker")];

/// Heartbeat settings of test clusters: short, but robust on a busy 2-core machine.
pub const HEARTBEAT_INTERVAL_MS: u64 = 200;
pub const HEARTBEAT_TIMEOUT_MS: u64 = 2000;

/// How long anything may take before a test gives up (never hit unless something hangs).
pub const GENEROUS: Duration = Duration::from_secs(120);

static CLUSTER: Mutex<()> = Mutex::new(());

/// Cluster tests run one at a time (tests in one file run on threads).
pub fn cluster_lock() -> MutexGuard<'static, ()> {
    CLUSTER.lock().unwrap_or_else(|e| e.into_inner())
}

/// The test seed: `PUSHPULL_TEST_SEED` if set, else fresh; printed so a failure can be
/// replayed.
pub fn test_seed() -> u64 {
    let seed = match std::env::var("PUSHPULL_TEST_SEED") {
        Ok(s) => s.trim().parse().expect("PUSHPULL_TEST_SEED must be a u64"),
        Err(_) => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            pushpull::jobs::data::mix64(t.as_nanos() as u64 ^ std::process::id() as u64)
        }
    };
    eprintln!("test seed: {seed} (set PUSHPULL_TEST_SEED={seed} to replay)");
    seed
}

/// A throw-away CA and node certificates.
pub struct Certs {
    pub dir: tempfile::TempDir,
    pub nodes: Vec<(String, TlsConfig)>,
}

impl Certs {
    pub fn new(names: &[&str]) -> Certs {
        let dir = tempfile::tempdir().unwrap();
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let cfgs = generate_cluster(dir.path(), "pushpull.cluster", &names).unwrap();
        Certs {
            dir,
            nodes: names.into_iter().zip(cfgs).collect(),
        }
    }

    /// scheduler, server0.., worker0..
    pub fn cluster(servers: u32, workers: u32) -> Certs {
        let names = pushpull::launch::certs::default_node_names(servers, workers);
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        Certs::new(&refs)
    }

    pub fn tls(&self, name: &str) -> &TlsConfig {
        &self
            .nodes
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no certificate for {name}"))
            .1
    }

    pub fn identity(&self, name: &str) -> TlsIdentity {
        TlsIdentity::load(self.tls(name)).unwrap()
    }

    /// `--ca F --cert F --key F` for node `name`.
    pub fn args(&self, name: &str) -> Vec<String> {
        self.tls(name).to_args()
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A loopback cluster file for tests: short heartbeats, the given seed.
pub fn test_config(workers: u32, servers: u32) -> Config {
    let mut c = Config::local(workers, servers);
    c.cluster.heartbeat_interval_ms = HEARTBEAT_INTERVAL_MS;
    c.cluster.heartbeat_timeout_ms = HEARTBEAT_TIMEOUT_MS;
    c.cluster.connect_timeout_ms = 30_000;
    c.cluster.seed = Some(7);
    c
}

/// Writes `config` to `dir/cluster.toml`.
pub fn write_config(config: &Config, dir: &Path) -> PathBuf {
    pushpull::launch::write_config(config, dir).unwrap()
}

/// A child process of a real binary with its stdout lines in a channel and its stderr
/// collected. Killed on drop.
pub struct Proc {
    pub name: String,
    pub child: Child,
    lines: mpsc::Receiver<String>,
    stdout_seen: Vec<String>,
    stderr: Arc<Mutex<String>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Proc {
    pub fn spawn(name: &str, command: &[&str], args: &[String]) -> Proc {
        let program = command.join(" ");
        let mut child = Command::new(command[0])
            .args(&command[1..])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("RUST_BACKTRACE", "1")
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let stdout_thread = std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let err = child.stderr.take().unwrap();
        let sink = stderr.clone();
        let stderr_thread = std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Proc {
            name: name.to_string(),
            child,
            lines,
            stdout_seen: Vec::new(),
            stderr,
            threads: vec![stdout_thread, stderr_thread],
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a stdout line starting with `prefix`; returns the rest, trimmed.
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.stdout_seen.push(line.clone());
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_string();
                    }
                }
                Err(_) => panic!(
                    "{} did not print {prefix:?} within {timeout:?}; stdout so far: {:?}; stderr:\n{}",
                    self.name,
                    self.stdout_seen,
                    self.stderr()
                ),
            }
        }
    }

    /// Every stdout line so far (drains the channel).
    pub fn stdout(&mut self) -> Vec<String> {
        while let Ok(line) = self.lines.try_recv() {
            self.stdout_seen.push(line);
        }
        self.stdout_seen.clone()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits for the process to exit (kills it after `timeout` and panics). Returns the
    /// status; stderr is complete afterwards.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                for t in self.threads.drain(..) {
                    let _ = t.join();
                }
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} did not exit within {timeout:?}; stderr:\n{}",
                    self.name,
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `pushpull-scheduler` and returns it with its address.
pub fn start_scheduler(config: &Path, certs: &Certs) -> (Proc, SocketAddr) {
    let args = nodes::scheduler_args(config, certs.tls("scheduler"));
    let mut p = Proc::spawn("scheduler", SCHEDULER, &args);
    let addr = p.wait_line(SCHEDULER_LISTENING, GENEROUS);
    (p, addr.parse().unwrap())
}

/// Starts `pushpull-server` number `id` and returns it with its address.
pub fn start_server(
    config: &Path,
    certs: &Certs,
    id: u32,
    scheduler: SocketAddr,
) -> (Proc, SocketAddr) {
    let tls = certs.tls(&format!("server{id}"));
    let args = nodes::server_args(config, tls, &scheduler.to_string(), None);
    let mut p = Proc::spawn(&format!("server {id}"), SERVER, &args);
    let addr = p.wait_line(SERVER_LISTENING, GENEROUS);
    (p, addr.parse().unwrap())
}

/// Starts `pushpull-worker` running the cluster file's job as rank `id`, as `pushpull
/// local` does (`--progress --json`).
pub fn start_worker_process(config: &Path, certs: &Certs, id: u32, scheduler: SocketAddr) -> Proc {
    let tls = certs.tls(&format!("worker{id}"));
    let args = nodes::worker_args(config, tls, &scheduler.to_string(), id);
    Proc::spawn(&format!("worker {id}"), WORKER, &args)
}

/// A scheduler and `servers` servers as processes, with the cluster file and certificates.
pub struct ProcCluster {
    pub config: Config,
    pub config_path: PathBuf,
    pub certs: Certs,
    pub scheduler: Proc,
    pub scheduler_addr: SocketAddr,
    pub servers: Vec<(Proc, SocketAddr)>,
}

impl ProcCluster {
    /// Starts the scheduler and the servers of `config` (workers are up to the test).
    pub fn start(mut config: Config) -> ProcCluster {
        let certs = Certs::cluster(config.cluster.num_servers, config.cluster.num_workers);
        let config_path = write_config(&config, certs.path());
        let (scheduler, scheduler_addr) = start_scheduler(&config_path, &certs);
        let servers = (0..config.cluster.num_servers)
            .map(|i| start_server(&config_path, &certs, i, scheduler_addr))
            .collect();
        config.cluster.scheduler = scheduler_addr.to_string();
        ProcCluster {
            config,
            config_path,
            certs,
            scheduler,
            scheduler_addr,
            servers,
        }
    }

    /// Joins in-process worker `rank`.
    pub async fn join(&self, rank: u32) -> Worker {
        let identity = self.certs.identity(&format!("worker{rank}"));
        Worker::join(
            &self.config,
            identity,
            JoinOptions {
                requested_rank: Some(rank),
            },
        )
        .await
        .unwrap_or_else(|e| panic!("worker {rank} could not join: {e}"))
    }

    /// Joins every worker of the job concurrently, returned by rank.
    pub async fn join_all(&self) -> Vec<Worker> {
        let mut set = tokio::task::JoinSet::new();
        for rank in 0..self.config.cluster.num_workers {
            let config = self.config.clone();
            let identity = self.certs.identity(&format!("worker{rank}"));
            set.spawn(async move {
                let w = Worker::join(
                    &config,
                    identity,
                    JoinOptions {
                        requested_rank: Some(rank),
                    },
                )
                .await
                .unwrap_or_else(|e| panic!("worker {rank} could not join: {e}"));
                (rank, w)
            });
        }
        let mut out: Vec<Option<Worker>> = vec![None; self.config.cluster.num_workers as usize];
        while let Some(r) = set.join_next().await {
            let (rank, w) = r.unwrap();
            out[rank as usize] = Some(w);
        }
        out.into_iter().map(Option::unwrap).collect()
    }

    /// Waits for the scheduler and every server to exit 0 (after the workers finished).
    pub fn expect_clean_exit(&mut self) {
        let st = self.scheduler.wait_exit(GENEROUS);
        assert!(
            st.success(),
            "scheduler exited with {st}; stderr:\n{}",
            self.scheduler.stderr()
        );
        for (p, _) in &mut self.servers {
            let st = p.wait_exit(GENEROUS);
            assert!(
                st.success(),
                "{} exited with {st}; stderr:\n{}",
                p.name,
                p.stderr()
            );
        }
    }
}

/// Runs `f` on a fresh multi-thread runtime with a generous overall timeout.
pub fn run_async<F: std::future::Future<Output = ()>>(f: F) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(300), f)
            .await
            .expect("test timed out after 300 s");
    });
}

/// The rank-order f32 sum, computed here independently of the library: rank 0's buffer, then
/// `+=` rank 1's, rank 2's, ...
pub fn rank_order_sum(bufs: &[Vec<f32>]) -> Vec<f32> {
    let mut acc = bufs[0].clone();
    for b in &bufs[1..] {
        for (a, x) in acc.iter_mut().zip(b) {
            *a += *x;
        }
    }
    acc
}

/// Asserts bit equality, naming the first differing element.
pub fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: element {i} differs: got {} ({:#x}), want {} ({:#x})",
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

/// Runs a command to completion with a timeout; returns (exit code, stdout, stderr).
pub fn run_bin(
    command: &[&str],
    args: &[&str],
    timeout: Duration,
) -> (Option<i32>, String, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let mut p = Proc::spawn(&command.join(" "), command, &args);
    let st = p.wait_exit(timeout);
    let out = p.stdout().join("\n");
    (st.code(), out, p.stderr())
}
