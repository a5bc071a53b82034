//! The async shell around [`crate::rounds`]: sockets, tasks, timers. This file holds the
//! server and its scheduler session; the data-plane tasks (accept, streams) are in
//! `crate::data`, the state they share and the sends in `crate::shared`.
//!
//! # Tasks
//! * **Control** (inside [`Server::run`]): one QUIC connection to the scheduler with one
//!   bidirectional control stream. A reader task turns control frames into a channel (reads
//!   are not cancel-safe, so they never sit in a `select!`); the run loop registers, answers
//!   placements, sends a heartbeat every `heartbeat_interval` and fails when the scheduler has
//!   been silent for `heartbeat_timeout` or its connection is gone.
//! * **Accept**: one task per incoming worker connection. Its first unidirectional stream must
//!   carry a `Hello` frame (the worker's rank); then every further stream gets its own task that
//!   reads the frame to its end at once (so stream credit never runs out however many rounds
//!   wait for other workers) and feeds pushes to the key's state machine.
//! * **Sends**: every frame the server sends (a result or abort per worker) is its own task on
//!   its own unidirectional stream, so one slow worker never holds up the others.
//!
//! Keys live in a `DashMap` of per-key mutexes: pushes to different keys proceed in
//! parallel; the decode/sum work of a push runs inline in its stream task while it holds only
//! its key's lock. That is the simple choice, and the measurements did not ask for more: a
//! whole W=2 round of a 4 MB fp32 chunk (decode, decode_add, encode) takes 17 ms in the
//! test profile (opt-level 1) on a 2-core machine under a load of 12, while QUIC is the slow part
//! there: the `throughput_*` tests in `tests/smoke.rs` (run with `--ignored`) moved 640 MB
//! through the server (pushes in, results out) in 9.1 s, ~70 MB/s, against 92 MB/s over a bare
//! quinn connection on the same machine at the same time,
//! so the summing is not the bottleneck and a hop to the blocking pool would only add latency.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pushpull_codecs::{CodecContext, CodecFactory, Compressor, KernelsFactory, Node};
use pushpull_net::certs::peer_grant;
use pushpull_net::tls::TlsIdentity;
use pushpull_net::transport::{
    resolve_scheduler, ControlSender, ControlStream, Endpoint, TransportError,
};
use pushpull_proto::config::{parse_addr, ConfigError};
use pushpull_proto::departure::Departure;
use pushpull_proto::protocol::{FromScheduler, NodeName, NodeRole, TensorPlacement, ToScheduler};
use pushpull_proto::session::{End, Input, Output, Registration, Session, SessionConfig};
use pushpull_proto::Config;
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::data::accept_loop;
use crate::rounds::{KeyInfo, KeyRounds};
use crate::shared::Shared;
use crate::stats::{KeyStats, ServerStats};

/// How long the server waits, when it exits, for frames it is still sending (aborts, last
/// results) before it closes its endpoint.
const SEND_DRAIN: Duration = Duration::from_secs(2);

/// After `NodeLost`, how long the server waits for the scheduler's `Shutdown` before it exits
/// on its own.
const LOST_GRACE: Duration = Duration::from_secs(5);

/// Why a server failed. Each variant's message names the node or setting involved.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// `server.listen` or `server.advertise` is not usable.
    #[error("`server.{key}` = {value:?}: {message}")]
    Config {
        /// `listen` or `advertise`.
        key: &'static str,
        /// The value as written.
        value: String,
        /// What is wrong.
        message: String,
    },
    /// Another setting is invalid (names the key and the allowed values).
    #[error("server: {0}")]
    InvalidConfig(#[from] ConfigError),
    /// Binding the endpoint failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The scheduler could not be reached, went silent past the heartbeat timeout, or its
    /// connection was lost. `Display` starts with `scheduler (addr)`.
    #[error("{scheduler}: {message}")]
    Scheduler {
        /// The scheduler (`scheduler (addr)`).
        scheduler: NodeName,
        /// What happened.
        message: String,
    },
    /// The scheduler's name (`cluster.scheduler`) did not resolve within
    /// `cluster.connect_timeout_ms` (the message names it).
    #[error("{0}")]
    Resolve(String),
    /// The scheduler refused this server's registration.
    #[error("registration refused by the scheduler: {reason}")]
    Refused {
        /// The scheduler's reason (e.g. which setting differs, with both values).
        reason: String,
    },
    /// The scheduler reported another node lost; every open round was aborted naming it.
    #[error("{node} was lost: {reason}")]
    NodeLost {
        /// The lost node.
        node: NodeName,
        /// What the scheduler observed.
        reason: String,
    },
    /// The scheduler ended the job with an error.
    #[error("the scheduler ended the job: {error}")]
    Shutdown {
        /// The scheduler's message.
        error: String,
    },
}

/// A pushpull server: holds the keys the scheduler places on it, sums each round's pushes in
/// rank order (host order with local groups) and sends the result to the ranks that pushed.
///
/// ```no_run
/// # async fn demo(config: pushpull_proto::Config, identity: pushpull_net::tls::TlsIdentity)
/// # -> Result<(), pushpull_server::ServerError> {
/// let server = pushpull_server::Server::bind(config, identity).await?;
/// println!("listening on {}", server.local_addr());
/// server.run().await // Ok after the scheduler's clean Shutdown
/// # }
/// ```
pub struct Server {
    config: Config,
    endpoint: Endpoint,
    factory: Arc<dyn CodecFactory>,
    requested_id: Option<u32>,
    stats: ServerStats,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr())
            .field("scheduler", &self.config.cluster.scheduler)
            .field("requested_id", &self.requested_id)
            .finish()
    }
}

impl Server {
    /// Binds a QUIC endpoint at `server.listen` (port 0 picks a free port) with this node's TLS
    /// identity, after validating `config` ([`Config::validate`]). Nothing is sent until
    /// [`Server::run`].
    pub async fn bind(config: Config, identity: TlsIdentity) -> Result<Server, ServerError> {
        let listen = parse_addr(&config.server.listen).map_err(|message| ServerError::Config {
            key: "listen",
            value: config.server.listen.clone(),
            message,
        })?;
        if let Some(adv) = &config.server.advertise {
            parse_addr(adv).map_err(|message| ServerError::Config {
                key: "advertise",
                value: adv.clone(),
                message,
            })?;
        }
        // The rest (the scheduler address `run` dials, counts, timeouts) must hold too.
        config.validate("server config")?;
        let endpoint = Endpoint::bind(listen, &identity, &config)?;
        info!(addr = %endpoint.local_addr(), "server bound");
        Ok(Server {
            config,
            endpoint,
            factory: Arc::new(KernelsFactory),
            requested_id: None,
            stats: ServerStats::default(),
        })
    }

    /// Uses `factory` to build each key's codec instead of [`KernelsFactory`] (see
    /// `pushpull_codecs::chunk`): the plug-in point for compressors.
    pub fn with_codec_factory(mut self, factory: impl CodecFactory + 'static) -> Server {
        self.factory = Arc::new(factory);
        self
    }

    /// Asks the scheduler for server id `id` (default: any free id).
    pub fn with_requested_id(mut self, id: Option<u32>) -> Server {
        self.requested_id = id;
        self
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.endpoint.local_addr()
    }

    /// A handle to this server's counters (per-tensor rounds and bytes, QUIC's counters of
    /// its connections), filled once [`Server::run`] runs; take it before `run`.
    pub fn stats(&self) -> ServerStats {
        self.stats.clone()
    }

    /// Registers with the scheduler at `cluster.scheduler` (retrying for `connect_timeout`),
    /// then serves workers until the job ends. `Ok(())` after a clean `Shutdown`; an error
    /// naming the scheduler, the lost node or the refusal otherwise. Open rounds are aborted
    /// (workers get an `Abort` naming the cause) before an error is returned.
    pub async fn run(self) -> Result<(), ServerError> {
        let Server {
            config,
            endpoint,
            factory,
            requested_id,
            stats,
        } = self;
        let scheduler_addr = resolve_scheduler(&config.scheduler_addr(), config.connect_timeout())
            .await
            .map_err(ServerError::Resolve)?;
        let (shared, sender) = Shared::new(&config);
        let shared = Arc::new(shared);
        stats.attach(&shared);
        let sender = tokio::spawn(sender);
        let accept = tokio::spawn(accept_loop(endpoint.clone(), shared.clone()));
        let mut control = Control {
            config: &config,
            endpoint: &endpoint,
            shared: &shared,
            factory,
            scheduler: NodeName {
                role: NodeRole::Scheduler,
                id: 0,
                addr: scheduler_addr,
            },
            sender: None,
            conn: None,
            job_seed: None,
            stats: &stats,
        };
        let result = control.run(requested_id).await;
        if let Err(e) = &result {
            // Nobody may wait for a round this server will never finish.
            let (node, reason) = match e {
                ServerError::NodeLost { .. } => (String::new(), String::new()),
                ServerError::Scheduler { scheduler, message } => {
                    (scheduler.to_string(), message.clone())
                }
                other => (shared.id_str(), format!("it stopped: {other}")),
            };
            if !node.is_empty() {
                shared.node_lost(&node, &reason);
            }
            error!("{e}");
        } else {
            info!("clean shutdown");
        }
        shared.flush(SEND_DRAIN).await;
        if let Some(mut s) = control.sender.take() {
            s.finish();
        }
        // Workers read the close: when another node's loss ended this server it names that
        // node, so a worker that sees this connection close first still reports the node
        // that was really lost rather than this server.
        let departure = departure(&result);
        let (code, reason) = (
            quinn::VarInt::from_u32(departure.code()),
            departure.reason(),
        );
        if let Some(conn) = control.conn.take() {
            conn.close(code, &reason);
        }
        // The counters as the job left them, for a scrape after the end.
        let _ = stats.snapshot();
        accept.abort();
        endpoint.quinn.close(code, &reason);
        let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.quinn.wait_idle()).await;
        sender.abort();
        pushpull_net::timeline::write();
        result
    }
}

/// Why this server closes its connections, given how it ended.
fn departure(result: &Result<(), ServerError>) -> Departure {
    match result {
        Ok(()) => Departure::Done("server exiting".into()),
        Err(ServerError::NodeLost { node, reason }) => Departure::NodeLost {
            node: node.clone(),
            reason: reason.clone(),
        },
        Err(ServerError::Scheduler { scheduler, message }) => Departure::NodeLost {
            node: scheduler.clone(),
            reason: message.clone(),
        },
        Err(ServerError::Shutdown { error }) => Departure::JobFailed(error.clone()),
        Err(other) => Departure::Failed(format!("server exiting: {other}")),
    }
}

/// The address workers should dial: `advertise` if set; else the bound address, with an
/// unspecified IP (`0.0.0.0`, `::`) replaced by `local_ip`, the local address of the connection
/// to the scheduler.
pub fn advertised_addr(
    advertise: Option<&str>,
    bound: SocketAddr,
    local_ip: Option<IpAddr>,
) -> Result<SocketAddr, String> {
    if let Some(adv) = advertise {
        return parse_addr(adv);
    }
    if !bound.ip().is_unspecified() {
        return Ok(bound);
    }
    match local_ip {
        Some(ip) => Ok(SocketAddr::new(ip.to_canonical(), bound.port())),
        None => Err(format!(
            "bound to {bound}, and the local address that reaches the scheduler is unknown; set \
             `server.advertise`"
        )),
    }
}

/// The control side of a running server.
struct Control<'a> {
    config: &'a Config,
    endpoint: &'a Endpoint,
    shared: &'a Arc<Shared>,
    factory: Arc<dyn CodecFactory>,
    scheduler: NodeName,
    sender: Option<ControlSender>,
    conn: Option<quinn::Connection>,
    job_seed: Option<u64>,
    stats: &'a ServerStats,
}

impl Control<'_> {
    fn sched_err(&self, message: impl Into<String>) -> ServerError {
        ServerError::Scheduler {
            scheduler: self.scheduler.clone(),
            message: message.into(),
        }
    }

    async fn send(&mut self, msg: &ToScheduler) -> Result<(), ServerError> {
        let Some(sender) = self.sender.as_mut() else {
            return Err(self.sched_err("no control stream"));
        };
        match sender.send(msg).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.sched_err(format!("cannot send to the scheduler: {e}"))),
        }
    }

    async fn run(&mut self, requested_id: Option<u32>) -> Result<(), ServerError> {
        let addr = self.scheduler.addr;
        let conn = self
            .endpoint
            .connect_with_retry(addr, self.config.connect_timeout())
            .await
            .map_err(|e| self.sched_err(e.to_string()))?;
        peer_grant(&conn, self.config.tls.check_roles)
            .allows(NodeRole::Scheduler, None)
            .map_err(|why| self.sched_err(format!("refused: {why}")))?;
        self.conn = Some(conn.clone());
        self.stats.set_scheduler(&conn);
        let (send, recv) = conn
            .open_bi()
            .await
            .map_err(|e| self.sched_err(format!("cannot open the control stream: {e}")))?;
        let (sender, mut receiver) =
            ControlStream::new(send, recv, self.scheduler.to_string()).split();
        self.sender = Some(sender);

        let listen_addr = advertised_addr(
            self.config.server.advertise.as_deref(),
            self.endpoint.local_addr(),
            conn.local_ip(),
        )
        .map_err(|message| match &self.config.server.advertise {
            Some(adv) => ServerError::Config {
                key: "advertise",
                value: adv.clone(),
                message,
            },
            None => ServerError::Config {
                key: "listen",
                value: self.config.server.listen.clone(),
                message,
            },
        })?;
        info!(scheduler = %self.scheduler, %listen_addr, "registering");
        let registration = Registration {
            role: NodeRole::Server,
            requested_id,
            listen_addr: Some(listen_addr),
            digest: self.config.digest(),
        };

        // Control frames arrive through a channel: `recv` is not cancel-safe.
        let (tx, mut rx) = mpsc::channel(64);
        let reader = tokio::spawn(async move {
            loop {
                let r = receiver.recv::<FromScheduler>().await;
                let last = !matches!(r, Ok(Some(_)));
                if tx.send(r).await.is_err() || last {
                    break;
                }
            }
        });
        let result = self.serve(registration, &mut rx).await;
        reader.abort();
        result
    }

    async fn serve(
        &mut self,
        registration: Registration,
        rx: &mut mpsc::Receiver<Result<Option<FromScheduler>, TransportError>>,
    ) -> Result<(), ServerError> {
        let cfg = SessionConfig::from_config(self.config, Some(LOST_GRACE));
        let mut session = Session::new(cfg, Instant::now(), registration);
        loop {
            while let Some(out) = session.poll_output() {
                self.carry_out(out).await?;
            }
            if let Some(end) = session.end() {
                return self.ended(end);
            }
            let deadline = session.poll_timeout();
            tokio::select! {
                msg = rx.recv() => {
                    let input = match msg {
                        Some(Ok(Some(msg))) => Input::Message(msg),
                        Some(Ok(None)) | None => {
                            Input::StreamEnded("the scheduler closed the control stream".into())
                        }
                        Some(Err(e)) => Input::StreamEnded(format!("control stream failed: {e}")),
                    };
                    session.handle(Instant::now(), input);
                }
                _ = sleep_until_opt(deadline.map(tokio::time::Instant::from_std)) => {
                    session.handle_timeout(Instant::now());
                }
            }
        }
    }

    /// Does what the session asks.
    async fn carry_out(&mut self, out: Output) -> Result<(), ServerError> {
        match out {
            Output::Send(msg) => self.send(&msg).await?,
            Output::Welcomed { id, map } => {
                // The session passes on only the first Welcome.
                let _ = self.shared.server_id.set(id);
                // The timeline (`[trace] dir`, `PUSHPULL_TRACE`), written when `run` ends.
                pushpull_net::timeline::start(&self.config.trace, &format!("server {id}"));
                self.job_seed = Some(map.job_seed);
                info!(id, job_seed = map.job_seed, servers = ?map.servers, "welcomed");
            }
            Output::NodeLost { node, reason } => {
                warn!(%node, %reason, "node lost; aborting open rounds");
                self.shared.node_lost(&node.to_string(), &reason);
            }
            Output::Role(FromScheduler::Placement(p)) => {
                let error = self.place(&p).err();
                if let Some(e) = &error {
                    warn!(tensor = %p.name, "placement refused: {e}");
                }
                self.send(&ToScheduler::PlacementAck {
                    name: p.name.clone(),
                    error,
                })
                .await?;
            }
            Output::Role(other) => {
                warn!(msg = ?other, "unexpected worker message from the scheduler ignored");
            }
        }
        Ok(())
    }

    /// What the session's end means for [`Server::run`].
    fn ended(&self, end: &End) -> Result<(), ServerError> {
        match end {
            End::Shutdown { .. } => Ok(()),
            End::Refused { reason } => Err(ServerError::Refused {
                reason: reason.clone(),
            }),
            End::NodeLost { node, reason } => Err(ServerError::NodeLost {
                node: node.clone(),
                reason: reason.clone(),
            }),
            End::JobFailed { reason } => Err(ServerError::Shutdown {
                error: reason.clone(),
            }),
            End::SchedulerLost { reason } => Err(self.sched_err(reason.clone())),
        }
    }

    /// Sets up this server's keys of a placed tensor (all or none).
    fn place(&self, p: &TensorPlacement) -> Result<(), String> {
        let Some(&server_id) = self.shared.server_id.get() else {
            return Err(format!(
                "tensor {:?}: placement arrived before this server was welcomed",
                p.name
            ));
        };
        let job_seed = self.job_seed.unwrap_or_default();
        place_keys(
            self.shared,
            &*self.factory,
            self.config,
            server_id,
            job_seed,
            p,
        )
    }
}

/// Sets up server `server_id`'s keys of a placed tensor (all or none): one [`KeyRounds`] per
/// chunk placed on it, with a codec from `factory`.
fn place_keys(
    shared: &Shared,
    factory: &dyn CodecFactory,
    config: &Config,
    server_id: u32,
    job_seed: u64,
    p: &TensorPlacement,
) -> Result<(), String> {
    let gossip = gossip_graph(config, p)?;
    let mut new = Vec::new();
    for (index, chunk) in p.chunks.iter().enumerate() {
        if chunk.server != server_id {
            continue;
        }
        let index = index as u32;
        if let Some(existing) = shared.keys.get(&chunk.key) {
            let k = existing.lock().unwrap_or_else(|e| e.into_inner());
            let info = k.info();
            // The scheduler places a name again only after its earlier placement failed on
            // some server: a key of that name that never saw a push is left over from it and
            // is rebuilt from the new placement (its parameters or length may differ).
            let leftover = info.tensor == p.name && k.current_round() == 0 && !k.is_open();
            if !leftover {
                if info.tensor == p.name && info.chunk == index && info.len as u64 == chunk.len {
                    continue; // placed again while in use: keep the running state
                }
                return Err(format!(
                    "tensor {:?} chunk {index}: key {:#018x} is already held by server \
                     {server_id} for {}",
                    p.name, chunk.key, info
                ));
            }
        }
        let ctx = CodecContext {
            tensor: p,
            chunk,
            chunk_index: index,
            job_seed,
            node: Node::Server { id: server_id },
            config,
        };
        let codec: Compressor = factory.make(&ctx).map_err(|e| {
            format!(
                "tensor {:?} chunk {index} (key {:#018x}): {e}",
                p.name, chunk.key
            )
        })?;
        if codec.len() as u64 != chunk.len {
            return Err(format!(
                "tensor {:?} chunk {index} (key {:#018x}): the codec is for {} elements, the chunk \
                 has {}",
                p.name,
                chunk.key,
                codec.len(),
                chunk.len
            ));
        }
        let info = KeyInfo {
            tensor: p.name.clone(),
            chunk: index,
            key: chunk.key,
            len: codec.len(),
            num_workers: shared.num_workers,
            local_size: shared.local_size,
            priority: p.priority,
        };
        let mut rounds = KeyRounds::new(info, codec).with_pool(shared.pool.clone());
        if let Some(graph) = &gossip {
            rounds = rounds.with_gossip(graph.clone());
        }
        if pushpull_net::timeline::on() {
            let observer = crate::spans::observer(server_id, rounds.info());
            rounds = rounds.with_observer(observer);
        }
        new.push((chunk.key, rounds));
    }
    let n = new.len();
    for (key, rounds) in new {
        let tensor = rounds.info().tensor.clone();
        shared.keys.insert(key, Arc::new(Mutex::new(rounds)));
        shared
            .key_stats
            .entry(key)
            .or_insert_with(|| Arc::new(KeyStats::new(&tensor)));
    }
    info!(tensor = %p.name, keys = n, "placed");
    Ok(())
}

/// A gossip tensor's graph (each rank's neighbours in the cluster's mixing matrix), or `None`
/// for a tensor summed by push_pull.
fn gossip_graph(
    config: &Config,
    p: &TensorPlacement,
) -> Result<Option<Arc<Vec<Vec<u32>>>>, String> {
    if !pushpull_codecs::is_gossip(&p.params) {
        return Ok(None);
    }
    let graph = config
        .gossip
        .graph(&config.cluster)
        .map_err(|e| format!("tensor {:?}: {e}", p.name))?;
    let ranks = graph
        .into_iter()
        .map(|row| row.into_iter().map(|(j, _)| j).collect())
        .collect();
    Ok(Some(Arc::new(ranks)))
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
