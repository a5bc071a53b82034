//! The test cluster shared by this crate's integration tests: the real scheduler and servers
//! as tokio tasks on 127.0.0.1 (port 0), certificates from `generate_cluster`, workers of this
//! crate; plus seeded data and independent references.
#![allow(dead_code)]

use std::time::Duration;

use pushpull_net::tls::{generate_cluster, TlsIdentity};
use pushpull_proto::Config;
use pushpull_scheduler::Scheduler;
use pushpull_server::Server;
use pushpull_worker::{JoinOptions, ParamMap, Tensor, Worker};
use tokio::task::JoinHandle;

pub const TIMEOUT: Duration = Duration::from_secs(120);

pub struct Stack {
    pub _dir: tempfile::TempDir,
    pub config: Config,
    pub scheduler: JoinHandle<Result<(), pushpull_scheduler::SchedulerError>>,
    pub servers: Vec<JoinHandle<Result<(), pushpull_server::ServerError>>>,
    pub workers: Vec<Worker>,
}

impl Stack {
    /// Finishes every worker (concurrently, as separate processes would) and waits for the
    /// scheduler's clean end; panics naming the first failure.
    pub async fn finish_all(mut self) {
        let fin: Vec<_> = self
            .workers
            .drain(..)
            .map(|w| tokio::spawn(w.finish()))
            .collect();
        for f in fin {
            f.await.unwrap().unwrap();
        }
        self.scheduler.await.unwrap().unwrap();
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

/// A stack whose config `tweak` may change (before any node starts).
pub async fn stack_with(
    workers: u32,
    servers: u32,
    partition_bytes: u64,
    tweak: impl FnOnce(&mut Config),
) -> Stack {
    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = std::iter::once("scheduler".to_string())
        .chain((0..servers).map(|s| format!("server{s}")))
        .chain((0..workers).map(|w| format!("worker{w}")))
        .collect();
    let ids: Vec<TlsIdentity> = generate_cluster(dir.path(), "pushpull.cluster", &names)
        .unwrap()
        .iter()
        .map(|c| TlsIdentity::load(c).unwrap())
        .collect();
    let mut config = Config::local(workers, servers);
    config.cluster.partition_bytes = partition_bytes;
    config.cluster.heartbeat_interval_ms = 200;
    // Generous: this machine may be heavily loaded; no test here relies on timeouts.
    config.cluster.heartbeat_timeout_ms = 10_000;
    config.cluster.connect_timeout_ms = 10_000;
    tweak(&mut config);
    let scheduler = Scheduler::bind(config.clone(), ids[0].clone())
        .await
        .unwrap();
    config.cluster.scheduler = scheduler.local_addr().to_string();
    let scheduler = tokio::spawn(scheduler.run());
    let mut server_tasks = Vec::new();
    for s in 0..servers as usize {
        let server = Server::bind(config.clone(), ids[1 + s].clone())
            .await
            .unwrap();
        server_tasks.push(tokio::spawn(server.run()));
    }
    let joins: Vec<_> = (0..workers as usize)
        .map(|w| {
            let (config, id) = (config.clone(), ids[1 + servers as usize + w].clone());
            tokio::spawn(async move { Worker::join(&config, id, JoinOptions::default()).await })
        })
        .collect();
    let mut ws = Vec::new();
    for j in joins {
        ws.push(j.await.unwrap().unwrap());
    }
    ws.sort_by_key(|w| w.rank());
    Stack {
        _dir: dir,
        config,
        scheduler,
        servers: server_tasks,
        workers: ws,
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
