//! The test kit shared by this crate's integration tests: a cluster of the real scheduler and
//! servers on 127.0.0.1 (port 0) with certificates from `generate_cluster_with` (workers'
//! certificates grant any rank), workers of this crate, fault injection, seeded data and
//! independent references.
//!
//! Each scheduler and server runs as a [`Node`]: its own thread with its own single-threaded
//! tokio runtime, so a fault stops all of it at once, as it would stop a process:
//! * [`Node::kill`] drops the runtime with every task and socket in it (like SIGKILL: peers
//!   hear nothing more and notice by timeout);
//! * [`Node::freeze`] blocks the runtime's thread (like SIGSTOP: the socket stays open, nothing
//!   is answered, not even heartbeats).
//!
//! Worker faults need no kit: drop a [`Worker`] without `finish` (it vanishes), or give it a
//! codec factory that corrupts payloads (`Worker::set_codec_factory`).
//!
//! A lossy network: [`lossy_stack_with`] binds every node (scheduler, servers, workers)
//! under `pushpull_net::transport::with_socket_wrapper`, behind a
//! `pushpull_net::lossy::LossySocket` with the given impairments (a seed of its own per node);
//! [`Stack::loss_stats`] sums what the sockets did.
#![allow(dead_code)]

pub mod set;
pub mod trace;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use pushpull_net::certs::{generate_cluster_with, NodeCert};
use pushpull_net::lossy::{Impairments, LossCounters, LossStats};
use pushpull_net::tls::TlsIdentity;
use pushpull_net::transport::with_socket_wrapper;
use pushpull_proto::grant::Grant;
use pushpull_proto::protocol::NodeRole;
use pushpull_proto::Config;
use pushpull_scheduler::Scheduler;
use pushpull_server::Server;
use pushpull_worker::{JoinOptions, ParamMap, Tensor, Worker, WorkerError};

pub const TIMEOUT: Duration = Duration::from_secs(120);

/// Spare worker identities beyond `num_workers` (for workers that join a second time).
const SPARE_IDENTITIES: usize = 2;

/// What a node's thread runs: the node's `run`, as a boxed future.
type RunFuture = Pin<Box<dyn Future<Output = Result<(), String>>>>;

enum Fault {
    Kill,
    Freeze,
}

/// A scheduler or server on its own thread and runtime (see the module docs).
pub struct Node {
    /// E.g. "server 1".
    pub name: String,
    /// The address it listens on.
    pub addr: SocketAddr,
    faults: tokio::sync::mpsc::UnboundedSender<Fault>,
    thaw: std::sync::mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Node {
    /// Starts `start` (which binds the node and returns its address and run future) on a new
    /// thread with its own runtime.
    fn spawn<S, F>(name: String, start: S) -> Node
    where
        S: FnOnce() -> F + Send + 'static,
        F: Future<Output = (SocketAddr, RunFuture)>,
    {
        let (faults, mut fault_rx) = tokio::sync::mpsc::unbounded_channel();
        let (thaw, thaw_rx) = std::sync::mpsc::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let thread_name = name.clone();
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let result = rt.block_on(async move {
                    let (addr, mut run) = start().await;
                    addr_tx.send(addr).unwrap();
                    loop {
                        tokio::select! {
                            r = &mut run => return r,
                            fault = fault_rx.recv() => match fault {
                                // Blocks the runtime: nothing of this node runs until thawed.
                                Some(Fault::Freeze) => {
                                    let _ = thaw_rx.recv();
                                }
                                Some(Fault::Kill) | None => {
                                    return Err(format!("{thread_name} was killed"));
                                }
                            },
                        }
                    }
                });
                // Drops every task and socket of the node, without waiting for any of them.
                rt.shutdown_background();
                result
            })
            .unwrap();
        let addr = addr_rx.recv().expect("the node failed to start");
        Node {
            name,
            addr,
            faults,
            thaw,
            thread: Some(thread),
        }
    }

    /// Stops the node at once, as SIGKILL would (see the module docs).
    pub fn kill(&self) {
        let _ = self.faults.send(Fault::Kill);
        let _ = self.thaw.send(());
    }

    /// Stops the node from doing anything, as SIGSTOP would; it stays so until killed.
    pub fn freeze(&self) {
        let _ = self.faults.send(Fault::Freeze);
    }

    /// Waits for the node's end: its `run` result as text, or that it was killed.
    pub async fn join(mut self) -> Result<(), String> {
        let thread = self.thread.take().unwrap();
        tokio::task::spawn_blocking(move || thread.join().expect("the node's thread panicked"))
            .await
            .unwrap()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.kill();
        }
    }
}

/// A test cluster (see the module docs).
pub struct Stack {
    pub _dir: tempfile::TempDir,
    /// The job's config, with the scheduler's address.
    pub config: Config,
    pub scheduler: Node,
    pub servers: Vec<Node>,
    /// The joined workers, by rank.
    pub workers: Vec<Worker>,
    identities: Vec<TlsIdentity>,
    /// The impairments of a lossy stack, and what its sockets did.
    loss: Option<Loss>,
}

/// A lossy stack's impairments and counters.
#[derive(Clone)]
struct Loss {
    impairments: Impairments,
    counters: Arc<LossCounters>,
}

/// Node numbers for `Impairments::for_node`: the scheduler, then servers, then workers.
const SCHEDULER_NODE: u64 = 0;
const FIRST_SERVER_NODE: u64 = 1;
const FIRST_WORKER_NODE: u64 = 1000;

impl Loss {
    /// Runs `fut` (which binds node `node`'s endpoint) behind its lossy socket, if any.
    async fn bind<F: Future>(loss: Option<Loss>, node: u64, fut: F) -> F::Output {
        match loss {
            Some(l) => {
                let wrap = l.impairments.for_node(node).wrapper(l.counters);
                with_socket_wrapper(wrap, fut).await
            }
            None => fut.await,
        }
    }
}

impl Stack {
    /// What the lossy sockets of every node did so far (`None` for a lossless stack).
    pub fn loss_stats(&self) -> Option<LossStats> {
        self.loss.as_ref().map(|l| l.counters.snapshot())
    }

    /// The TLS identity for the `w`-th worker to join (`num_workers + 2` exist).
    pub fn identity(&self, w: usize) -> TlsIdentity {
        self.identities[w].clone()
    }

    /// The TLS identity of node `name` (`scheduler`, `server0`, `worker1`, ...).
    pub fn node_identity(&self, name: &str) -> TlsIdentity {
        let dir = self._dir.path().join(name);
        TlsIdentity::load(&pushpull_proto::config::TlsConfig {
            ca: Some(dir.join("ca.pem")),
            cert: Some(dir.join(format!("{name}.pem"))),
            key: Some(dir.join(format!("{name}.key"))),
            ..Default::default()
        })
        .unwrap()
    }

    /// Joins one worker per entry of `requested` (the rank it asks for) concurrently, with
    /// identities `0..`; returns the results in that order.
    pub async fn join(&self, requested: &[Option<u32>]) -> Vec<Result<Worker, WorkerError>> {
        let joins: Vec<_> = requested
            .iter()
            .enumerate()
            .map(|(w, &requested_rank)| {
                let (config, id) = (self.config.clone(), self.identity(w));
                let (loss, node) = (self.loss.clone(), FIRST_WORKER_NODE + w as u64);
                tokio::spawn(async move {
                    let join = Worker::join(&config, id, JoinOptions { requested_rank });
                    Loss::bind(loss, node, join).await
                })
            })
            .collect();
        let mut out = Vec::new();
        for j in joins {
            out.push(j.await.unwrap());
        }
        out
    }

    /// Finishes every worker (concurrently, as separate processes would) and waits for the
    /// clean end of the scheduler and every server; panics naming the first failure.
    pub async fn finish_all(mut self) {
        let fin: Vec<_> = self
            .workers
            .drain(..)
            .map(|w| tokio::spawn(w.finish()))
            .collect();
        for f in fin {
            f.await.unwrap().unwrap();
        }
        self.scheduler.join().await.unwrap();
        for s in self.servers {
            let name = s.name.clone();
            s.join().await.unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .try_init();
}

pub async fn stack(workers: u32, servers: u32, partition_bytes: u64) -> Stack {
    stack_with(workers, servers, partition_bytes, |_| {}).await
}

/// A stack whose config `tweak` may change (before any node starts), with every worker
/// joined (no requested ranks).
pub async fn stack_with(
    workers: u32,
    servers: u32,
    partition_bytes: u64,
    tweak: impl FnOnce(&mut Config),
) -> Stack {
    stack_over(workers, servers, partition_bytes, None, tweak).await
}

/// [`stack_with`] with every node behind a lossy socket with `impairments` (see the module
/// docs).
pub async fn lossy_stack_with(
    workers: u32,
    servers: u32,
    partition_bytes: u64,
    impairments: Impairments,
    tweak: impl FnOnce(&mut Config),
) -> Stack {
    stack_over(workers, servers, partition_bytes, Some(impairments), tweak).await
}

async fn stack_over(
    workers: u32,
    servers: u32,
    partition_bytes: u64,
    impairments: Option<Impairments>,
    tweak: impl FnOnce(&mut Config),
) -> Stack {
    let mut s = nodes_over(workers, servers, partition_bytes, impairments, tweak).await;
    let requested = vec![None; workers as usize];
    let mut ws: Vec<Worker> = s
        .join(&requested)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    ws.sort_by_key(|w| w.rank());
    s.workers = ws;
    s
}

/// The scheduler and servers of a stack, no workers yet ([`Stack::join`] adds them).
pub async fn nodes_with(
    workers: u32,
    servers: u32,
    partition_bytes: u64,
    tweak: impl FnOnce(&mut Config),
) -> Stack {
    nodes_over(workers, servers, partition_bytes, None, tweak).await
}

async fn nodes_over(
    workers: u32,
    servers: u32,
    partition_bytes: u64,
    impairments: Option<Impairments>,
    tweak: impl FnOnce(&mut Config),
) -> Stack {
    init_tracing();
    let loss = impairments.map(|impairments| Loss {
        impairments,
        counters: Arc::new(LossCounters::default()),
    });
    let dir = tempfile::tempdir().unwrap();
    // Worker certificates grant any rank, so tests choose ranks by asking for them.
    let any_worker = Grant {
        role: NodeRole::Worker,
        id: None,
    };
    let nodes: Vec<NodeCert> = std::iter::once(NodeCert::named("scheduler"))
        .chain((0..servers).map(|s| NodeCert::named(&format!("server{s}"))))
        .chain((0..workers as usize + SPARE_IDENTITIES).map(|w| NodeCert {
            name: format!("worker{w}"),
            grant: Some(any_worker),
        }))
        .collect();
    let mut ids: Vec<TlsIdentity> =
        generate_cluster_with(dir.path(), "pushpull.cluster", &nodes, 1)
            .unwrap()
            .iter()
            .map(|c| TlsIdentity::load(c).unwrap())
            .collect();
    let mut config = Config::local(workers, servers);
    config.cluster.partition_bytes = partition_bytes;
    config.cluster.heartbeat_interval_ms = 200;
    // Generous: this machine may be heavily loaded. Fault tests that wait for a timeout set
    // a shorter one.
    config.cluster.heartbeat_timeout_ms = 10_000;
    config.cluster.connect_timeout_ms = 10_000;
    tweak(&mut config);

    let worker_ids = ids.split_off(1 + servers as usize);
    let server_ids = ids.split_off(1);
    let scheduler = {
        let (config, id, loss) = (config.clone(), ids[0].clone(), loss.clone());
        Node::spawn("scheduler".into(), move || async move {
            let bind = Scheduler::bind(config, id);
            let s = Loss::bind(loss, SCHEDULER_NODE, bind).await.unwrap();
            let addr = s.local_addr();
            let run: RunFuture = Box::pin(async move { s.run().await.map_err(|e| e.to_string()) });
            (addr, run)
        })
    };
    config.cluster.scheduler = scheduler.addr.to_string();
    let servers = server_ids
        .into_iter()
        .enumerate()
        .map(|(i, id)| {
            let (config, loss) = (config.clone(), loss.clone());
            Node::spawn(format!("server {i}"), move || async move {
                let bind = Server::bind(config, id);
                let s = Loss::bind(loss, FIRST_SERVER_NODE + i as u64, bind)
                    .await
                    .unwrap();
                let addr = s.local_addr();
                let run: RunFuture =
                    Box::pin(async move { s.run().await.map_err(|e| e.to_string()) });
                (addr, run)
            })
        })
        .collect();
    Stack {
        _dir: dir,
        config,
        scheduler,
        servers,
        workers: Vec::new(),
        identities: worker_ids,
        loss,
    }
}

pub async fn declare_all(s: &Stack, name: &str, len: u64) -> Vec<Tensor> {
    declare_all_with(s, name, len, ParamMap::new()).await
}

/// Every worker declares `name` with `params`.
pub async fn declare_all_with(s: &Stack, name: &str, len: u64, params: ParamMap) -> Vec<Tensor> {
    futures_util::future::join_all(
        s.workers
            .iter()
            .map(|w| w.declare(name, len, params.clone())),
    )
    .await
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

/// Every worker declares `name` at `priority` (no parameters); checks the agreed priority.
pub async fn declare_all_at(s: &Stack, name: &str, len: u64, priority: i32) -> Vec<Tensor> {
    let ts: Vec<Tensor> = futures_util::future::join_all(
        s.workers
            .iter()
            .map(|w| w.declare_with_priority(name, len, Default::default(), priority)),
    )
    .await
    .into_iter()
    .map(|r| r.unwrap())
    .collect();
    assert_eq!(ts[0].priority(), priority);
    ts
}

/// Deterministic pseudo-random f32 data (SplitMix64).
pub fn data(seed: u64, len: usize) -> Vec<f32> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 100.0
        })
        .collect()
}

pub fn rank_order_sum(bufs: &[Vec<f32>]) -> Vec<f32> {
    let mut acc = bufs[0].clone();
    for b in &bufs[1..] {
        for (a, x) in acc.iter_mut().zip(b) {
            *a += x;
        }
    }
    acc
}

pub fn seed() -> u64 {
    let s = std::env::var("PUSHPULL_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("seed {s} (set PUSHPULL_TEST_SEED to repeat)");
    s
}

pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}
