//! [`Worker::join`]: registering with the scheduler, waiting for the cluster map, connecting
//! to every server; and everything a failed or cancelled join must close again.

use pushpull_kernels::cuda::{select_device, CudaError, DevicePref};
use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use pushpull_kernels::KernelsFactory;
use pushpull_net::certs::peer_grant;
use pushpull_net::sender::{FrameSender, OnError, Peer};
use pushpull_net::tls::TlsIdentity;
use pushpull_net::transport::{resolve_scheduler, send_frame, Endpoint, TransportError};
use pushpull_proto::pool::BufPool;
use pushpull_proto::protocol::{max_payload_len, FrameFlags, FrameHeader, FrameKind, ReduceOp};
use pushpull_proto::sendq::Flow;
use pushpull_proto::session::Registration;
use pushpull_proto::{Config, NodeName, NodeRole};
use tokio::task::JoinHandle;

use super::{Worker, WorkerInner};
use crate::error::WorkerError;
use crate::push::ServerLinks;
use crate::shared::{control_reader, control_writer, heartbeat, server_reader, Phase, Shared};

/// Idle capacity the pool of push payload buffers keeps (about one ResNet-50 round of fp32).
const PAYLOAD_POOL_BYTES: usize = 128 << 20;

/// Options for [`Worker::join`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JoinOptions {
    /// Ask the scheduler for this rank (`0..num_workers`). The scheduler refuses the worker if
    /// the rank is out of range or already taken; `None` takes the lowest free rank once every
    /// node has registered.
    pub requested_rank: Option<u32>,
}

/// Closes what a join attempt started if it fails or is cancelled.
struct JoinCleanup {
    endpoint: Option<Endpoint>,
    shared: Option<Arc<Shared>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for JoinCleanup {
    fn drop(&mut self) {
        if let Some(endpoint) = self.endpoint.take() {
            if let Some(shared) = &self.shared {
                shared.set_phase(Phase::Closed);
            }
            for t in &self.tasks {
                t.abort();
            }
            endpoint.quinn.close(0u32.into(), b"join failed");
        }
    }
}

fn connect_message(e: &TransportError) -> String {
    match e {
        TransportError::Connect { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// Resolves with the job's fatal error once one is recorded.
async fn until_fatal(shared: &Shared) -> WorkerError {
    let mut rx = shared.subscribe();
    let fatal = match rx.wait_for(|s| s.fatal.is_some()).await {
        Ok(s) => s.fatal.clone(),
        Err(_) => None,
    };
    fatal.unwrap_or_else(|| WorkerError::Internal("worker state dropped".into()))
}

impl Worker {
    /// Joins the job described by `config` with the TLS `identity` (this node's certificate
    /// and the cluster CA).
    ///
    /// Dials the scheduler at `cluster.scheduler`, retrying for `cluster.connect_timeout_ms`;
    /// registers (with `opts.requested_rank`, if any, and the digest of the cluster-relevant
    /// settings); waits until every server and worker of the job has registered and the
    /// scheduler sends the cluster map; then connects to every server. Must be called inside a
    /// tokio runtime (use [`crate::BlockingWorker`] from synchronous code).
    ///
    /// # Errors
    /// * [`WorkerError::Config`]: the config does not validate, or the scheduler's port is 0
    ///   (workers must dial the scheduler's real port), or `worker.device` asks for `cuda` /
    ///   `cuda:N` where there is no usable GPU (the error names what is missing) or this
    ///   library was built without its `cuda` feature;
    /// * [`WorkerError::Connect`]: the scheduler or a server could not be reached (names it);
    /// * [`WorkerError::Refused`]: the scheduler refused the registration; the reason names
    ///   what was wrong (a setting that differs, with both values; a rank taken or out of
    ///   range; the cluster full);
    /// * [`WorkerError::NodeLost`] / [`WorkerError::JobFailed`]: the job failed while joining.
    ///
    /// Dropping the returned future cancels the join and closes everything it opened.
    pub async fn join(
        config: &Config,
        identity: TlsIdentity,
        opts: JoinOptions,
    ) -> Result<Worker, WorkerError> {
        config
            .validate("(worker config)")
            .map_err(|e| WorkerError::Config(e.to_string()))?;
        let device = device_setting(&config.worker.device)?;
        let named = config.scheduler_addr();
        if named.port() == 0 {
            return Err(WorkerError::Config(format!(
                "`cluster.scheduler` = {named}: workers need the scheduler's actual port, not 0"
            )));
        }
        if let Some(r) = opts.requested_rank {
            if r >= config.cluster.num_workers {
                return Err(WorkerError::Config(format!(
                    "requested rank {r} is out of range: `cluster.num_workers` = {}",
                    config.cluster.num_workers
                )));
            }
        }
        let sched_addr = resolve_scheduler(&named, config.connect_timeout())
            .await
            .map_err(|message| WorkerError::Connect {
                node: format!("scheduler ({named})"),
                message,
            })?;
        let scheduler = NodeName {
            role: NodeRole::Scheduler,
            id: 0,
            addr: sched_addr,
        };
        let bind: SocketAddr = if sched_addr.is_ipv6() {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        };
        let endpoint = Endpoint::bind(bind, &identity, config).map_err(|e| match e {
            TransportError::Tls(t) => WorkerError::Config(t.to_string()),
            other => WorkerError::Internal(other.to_string()),
        })?;
        let mut cleanup = JoinCleanup {
            endpoint: Some(endpoint.clone()),
            shared: None,
            tasks: Vec::new(),
        };
        let connect_err = |node: &NodeName, message: String| WorkerError::Connect {
            node: node.to_string(),
            message,
        };

        // Register.
        let conn = endpoint
            .connect_with_retry(sched_addr, config.connect_timeout())
            .await
            .map_err(|e| connect_err(&scheduler, connect_message(&e)))?;
        peer_grant(&conn, config.tls.check_roles)
            .allows(NodeRole::Scheduler, None)
            .map_err(|why| connect_err(&scheduler, format!("refused: {why}")))?;
        tracing::debug!("worker: connected to {scheduler}");
        let (send, recv) = conn
            .open_bi()
            .await
            .map_err(|e| connect_err(&scheduler, format!("opening the control stream: {e}")))?;
        let registration = Registration {
            role: NodeRole::Worker,
            requested_id: opts.requested_rank,
            listen_addr: None,
            digest: config.digest(),
        };
        let (shared, outgoing, welcome) = Shared::new(scheduler.clone(), config, registration);
        cleanup.shared = Some(shared.clone());
        cleanup
            .tasks
            .push(tokio::spawn(control_writer(shared.clone(), send, outgoing)));
        cleanup
            .tasks
            .push(tokio::spawn(control_reader(shared.clone(), recv)));
        cleanup.tasks.push(tokio::spawn(heartbeat(shared.clone())));

        tracing::debug!("worker: registered with {scheduler}; waiting for the other nodes");
        // Wait for the cluster map.
        let (rank, map) = tokio::select! {
            w = welcome => w.map_err(|_| WorkerError::Internal("welcome channel dropped".into()))?,
            e = until_fatal(&shared) => return Err(e),
        };
        let (num_workers, num_servers) = (config.cluster.num_workers, config.cluster.num_servers);
        if map.servers.len() != num_servers as usize || rank >= num_workers {
            return Err(WorkerError::Protocol {
                peer: scheduler.to_string(),
                message: format!(
                    "Welcome with rank {rank} and {} server addresses for a job of {num_workers} workers and {num_servers} servers",
                    map.servers.len()
                ),
            });
        }

        // The timeline (`[trace] dir`, `PUSHPULL_TRACE`), written at `finish`.
        pushpull_net::timeline::start(&config.trace, &format!("worker {rank}"));
        tracing::debug!(
            "worker: welcomed as rank {rank}; connecting to {} servers",
            map.servers.len()
        );
        // Connect to every server and say hello.
        let timeout = config.connect_timeout();
        let check_roles = config.tls.check_roles;
        let connects = map.servers.iter().enumerate().map(|(id, &addr)| {
            let endpoint = endpoint.clone();
            async move {
                let name = NodeName {
                    role: NodeRole::Server,
                    id: id as u32,
                    addr,
                };
                let err = |message: String| WorkerError::Connect {
                    node: name.to_string(),
                    message,
                };
                let conn = endpoint
                    .connect_with_retry(addr, timeout)
                    .await
                    .map_err(|e| err(connect_message(&e)))?;
                peer_grant(&conn, check_roles)
                    .allows(NodeRole::Server, Some(id as u32))
                    .map_err(|why| err(format!("refused: {why}")))?;
                let hello = FrameHeader {
                    kind: FrameKind::Hello,
                    op: ReduceOp::Sum,
                    flags: FrameFlags::default(),
                    rank,
                    aux: 0,
                    key: 0,
                    round: 0,
                    payload_len: 0,
                };
                send_frame(&conn, &hello, Bytes::new(), &name.to_string())
                    .await
                    .map_err(|e| err(format!("sending Hello: {e}")))?;
                Ok::<_, WorkerError>((name, conn))
            }
        });
        let conns = tokio::select! {
            conns = futures_util::future::try_join_all(connects) => conns?,
            e = until_fatal(&shared) => return Err(e),
        };
        let servers: Vec<NodeName> = conns.iter().map(|(name, _)| name.clone()).collect();
        let on_error: OnError = {
            let shared = shared.clone();
            // A failed write to a server is that server's loss (or the loss its close names).
            Box::new(move |peer: &Peer, error: TransportError| {
                let Some(node) = servers.iter().find(|n| n.to_string() == *peer.name) else {
                    return;
                };
                shared.server_gone(node, WorkerError::server_lost(node, &error));
            })
        };
        let (sender, driver) = FrameSender::new(
            config.cluster.send_window_bytes,
            // The workers of one host (a local group's members, or flat workers the scheduler
            // saw at one address) push through its one link.
            Flow::Source {
                sharers: map.workers_on_host(rank).max(config.cluster.local_size),
            },
            Some(endpoint.window_cap().clone()),
            on_error,
        );
        cleanup.tasks.push(tokio::spawn(driver));
        let (names, peers) = conns
            .into_iter()
            .map(|(name, conn)| {
                let peer = Peer {
                    conn,
                    name: name.to_string().into(),
                };
                (name, peer)
            })
            .unzip();
        let links = ServerLinks { names, peers };
        // A gossip result carries a message from each of this worker's neighbours.
        let neighbours = config
            .gossip
            .matrix(config.cluster.num_workers)
            .map_or(1, |w| w.neighbours(rank as usize).len().max(1));
        let max_payload =
            max_payload_len(config.cluster.partition_bytes).saturating_mul(neighbours as u64);
        for (name, peer) in links.names.iter().zip(&links.peers) {
            cleanup.tasks.push(tokio::spawn(server_reader(
                shared.clone(),
                name.clone(),
                peer.conn.clone(),
                rank,
                max_payload,
            )));
        }
        shared.set_phase(Phase::Running);
        shared.check()?;
        tracing::info!(
            "worker {rank} of {num_workers} joined: {num_servers} servers, job seed {}",
            map.job_seed
        );

        let local = if config.cluster.local_size > 1 {
            let (c, sched, seed) = (config.clone(), scheduler.to_string(), map.job_seed);
            // A lost member is the job's fatal error, as a lost node is; the connections close
            // at once naming it, so that the scheduler and the servers blame it, not this
            // worker, whatever this process does next.
            let lost = {
                let (shared, quinn, workers) =
                    (shared.clone(), endpoint.quinn.clone(), map.workers.clone());
                move |e: WorkerError| {
                    // Recorded first: closing the endpoint ends the scheduler's connection,
                    // whose task would otherwise record "scheduler lost" as the job's error
                    // (seen in CI: this worker then named the scheduler, not the member). The
                    // error wakes `finish`, whose close names the member too (`close.rs`).
                    shared.fail(e.clone());
                    // A note this member could not send is its own failure.
                    let why = e.departure(&workers).unwrap_or_else(|| {
                        pushpull_proto::departure::Departure::Failed(e.to_string())
                    });
                    quinn.close(why.code().into(), &why.reason());
                }
            };
            let joined = tokio::task::spawn_blocking(move || {
                crate::local::join(&c, &sched, seed, rank, Arc::new(lost))
            });
            let joined = tokio::select! {
                j = joined => j.map_err(|e| WorkerError::Internal(format!("joining the local group: {e}")))??,
                e = until_fatal(&shared) => return Err(e),
            };
            // And the job's fatal error fails every chunk waiting for a member's note.
            let (notes, sh) = (joined.notes.clone(), shared.clone());
            cleanup.tasks.push(tokio::spawn(
                async move { notes.poison(until_fatal(&sh).await) },
            ));
            Some(Arc::new(joined))
        } else {
            None
        };
        cleanup.endpoint = None; // disarm
        let tasks = std::mem::take(&mut cleanup.tasks);
        Ok(Worker {
            inner: Arc::new(WorkerInner {
                shared,
                links: Arc::new(links),
                scheduler_conn: conn,
                sender,
                endpoint,
                rank,
                map,
                config: config.clone(),
                tensors: Mutex::new(HashMap::new()),
                codec_factory: Mutex::new(Arc::new(KernelsFactory)),
                custom_factory: AtomicBool::new(false),
                device,
                batches: Default::default(),
                pool: BufPool::new(PAYLOAD_POOL_BYTES),
                learning_rate: AtomicU32::new(0),
                barrier_seq: AtomicU64::new(0),
                tasks: Mutex::new(tasks),
                local,
            }),
        })
    }

    /// Reads the cluster file at `path`, loads the TLS identity its `[tls]` section names
    /// (`ca`, `cert`, `key`), and [`join`](Worker::join)s.
    ///
    /// # Errors
    /// [`WorkerError::Config`] naming the file and key, or the PEM file that could not be
    /// loaded; then as for `join`.
    pub async fn join_with_config_file(
        path: impl AsRef<Path>,
        opts: JoinOptions,
    ) -> Result<Worker, WorkerError> {
        let config = Config::from_file(path).map_err(|e| WorkerError::Config(e.to_string()))?;
        let identity =
            TlsIdentity::load(&config.tls).map_err(|e| WorkerError::Config(e.to_string()))?;
        Worker::join(&config, identity, opts).await
    }
}

/// Checks the `worker.device` setting: `cpu` (device buffers reduced on the host), `auto`
/// (device buffers compressed on their device, host buffers on the CPU), `cuda` and `cuda:N`
/// (a GPU: refused, naming what is missing, when there is no usable one (no libcuda, no
/// device) or when this library was built without its `cuda` feature, rather than ignored).
/// Host buffers are always compressed on the CPU.
fn device_setting(setting: &str) -> Result<DevicePref, WorkerError> {
    let bad = |m: String| WorkerError::Config(format!("worker.device = {setting:?}: {m}"));
    let pref: DevicePref = setting.parse().map_err(|e: CudaError| bad(e.to_string()))?;
    match pref {
        DevicePref::Cpu | DevicePref::Auto => Ok(pref),
        DevicePref::Cuda | DevicePref::CudaOrdinal(_) => {
            let device = select_device(pref).map_err(|e| bad(e.to_string()))?;
            if cfg!(feature = "cuda") {
                Ok(pref)
            } else {
                Err(bad(format!(
                    "{device} is usable, but this worker library was built without its `cuda` \
                     feature, so it cannot take CUDA buffers: build pushpull-worker with \
                     `--features cuda`, or use \"auto\" or \"cpu\""
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_device_is_resolved_or_refused_by_name() {
        assert_eq!(device_setting("cpu").unwrap(), DevicePref::Cpu);
        assert_eq!(device_setting("auto").unwrap(), DevicePref::Auto);
        for setting in ["cuda", "cuda:1"] {
            if cfg!(feature = "cuda") && device_setting(setting).is_ok() {
                continue; // a GPU, and the feature: accepted
            }
            let e = device_setting(setting).unwrap_err().to_string();
            assert!(e.contains(&format!("worker.device = \"{setting}\"")), "{e}");
            // Without a GPU the reason names what is missing; with one, the missing feature.
            let gpu = pushpull_kernels::cuda::gpu_available();
            assert!(
                e.contains(if gpu {
                    "without its `cuda`"
                } else {
                    "no usable CUDA GPU"
                }) || e.contains("CUDA devices"),
                "{e}"
            );
        }
        let e = device_setting("gpu").unwrap_err().to_string();
        assert!(e.contains("\"gpu\"") && e.contains("cuda:N"), "{e}");
    }
}
