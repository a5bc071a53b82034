//! The async shell around [`crate::rounds`]: sockets, tasks, timers.
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
//! Keys live in a [`DashMap`] of per-key mutexes: pushes to different keys proceed in
//! parallel; the decode/sum work of a push runs inline in its stream task while it holds only
//! its key's lock. That is the simple choice, and the measurements did not ask for more: a
//! whole W=2 round of a 4 MB fp32 chunk (decode, decode_add, encode) takes 17 ms in the
//! test profile (opt-level 1) on a 2-core machine under a load of 12, while QUIC is the slow part
//! there: the `throughput_*` tests in `tests/smoke.rs` (run with `--ignored`) moved 640 MB
//! through the server (pushes in, results out) in 9.1 s, ~70 MB/s, against 92 MB/s over a bare
//! quinn connection on the same machine at the same time,
//! so the summing is not the bottleneck and a hop to the blocking pool would only add latency.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::codec::ChunkCodec;
use common::config::{parse_addr, ConfigError};
use common::pool::BufPool;
use common::protocol::{
    max_payload_len, FrameHeader, FrameKind, FromScheduler, NodeName, NodeRole, ReduceOp,
    TensorPlacement, ToScheduler, FRAME_HEADER_LEN, PROTOCOL_VERSION,
};
use common::sender::{FrameSender, OnError, Peer};
use common::tls::TlsIdentity;
use common::transport::{ControlSender, ControlStream, Endpoint, TransportError};
use common::Config;
use dashmap::DashMap;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use crate::factory::{CodecContext, CodecFactory, KernelsFactory};
use crate::rounds::{Action, KeyInfo, KeyRounds};

/// How long the server waits, when it exits, for frames it is still sending (aborts, last
/// results) before it closes its endpoint.
const SEND_DRAIN: Duration = Duration::from_secs(2);

/// Idle capacity the pool of result payload buffers keeps.
const RESULT_POOL_BYTES: usize = 128 << 20;

/// After `NodeLost`, how long the server waits for the scheduler's `Shutdown` before it exits
/// on its own.
const LOST_GRACE: Duration = Duration::from_secs(5);

/// QUIC application error code for a clean close.
const CLOSE_OK: u32 = 0;
/// QUIC application error code for a refused worker connection.
const CLOSE_REFUSED: u32 = 1;
/// Close code when the server stops because of a failure; the reason names it.
const CLOSE_FAILED: u32 = 2;

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
/// rank order and sends every worker the result.
///
/// ```no_run
/// # async fn demo(config: pushpull_common::Config, identity: pushpull_common::tls::TlsIdentity)
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
        })
    }

    /// Uses `factory` to build each key's codec instead of [`KernelsFactory`] (see
    /// [`crate::factory`]): the plug-in point for compressors.
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
        } = self;
        let (shared, sender) = Shared::new(&config);
        let shared = Arc::new(shared);
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
                addr: config.scheduler_addr(),
            },
            sender: None,
            conn: None,
            job_seed: None,
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
        // Workers read the close reason: on failure it names the cause (e.g. the lost
        // scheduler), so a worker that sees this connection close first still reports the node
        // that was really lost rather than just this server.
        let (code, reason) = match &result {
            Ok(()) => (CLOSE_OK, "server exiting".to_string()),
            Err(e) => (CLOSE_FAILED, format!("server exiting: {e}")),
        };
        if let Some(conn) = control.conn.take() {
            conn.close(quinn::VarInt::from_u32(code), reason.as_bytes());
        }
        accept.abort();
        endpoint
            .quinn
            .close(quinn::VarInt::from_u32(code), reason.as_bytes());
        let _ = tokio::time::timeout(Duration::from_secs(1), endpoint.quinn.wait_idle()).await;
        sender.abort();
        result
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
        self.conn = Some(conn.clone());
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
        self.send(&ToScheduler::Register {
            version: PROTOCOL_VERSION,
            role: NodeRole::Server,
            requested_id,
            listen_addr: Some(listen_addr),
            digest: self.config.digest(),
        })
        .await?;

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
        let result = self.serve(&mut rx).await;
        reader.abort();
        result
    }

    async fn serve(
        &mut self,
        rx: &mut mpsc::Receiver<Result<Option<FromScheduler>, TransportError>>,
    ) -> Result<(), ServerError> {
        let timeout = self.config.heartbeat_timeout();
        let mut ticker = tokio::time::interval(self.config.heartbeat_interval());
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_heard = tokio::time::Instant::now();
        let mut lost: Option<(NodeName, String, tokio::time::Instant)> = None;
        loop {
            let lost_deadline = lost.as_ref().map(|l| l.2);
            tokio::select! {
                msg = rx.recv() => {
                    let msg = match msg {
                        Some(Ok(Some(msg))) => msg,
                        Some(Ok(None)) | None => {
                            return Err(self.sched_err("the scheduler closed the control stream"))
                        }
                        Some(Err(e)) => return Err(self.sched_err(format!("control stream failed: {e}"))),
                    };
                    last_heard = tokio::time::Instant::now();
                    match msg {
                        FromScheduler::Heartbeat => {}
                        FromScheduler::Welcome { id, map } => {
                            if self.shared.server_id.set(id).is_err() {
                                warn!(id, "second Welcome ignored");
                                continue;
                            }
                            self.job_seed = Some(map.job_seed);
                            info!(id, job_seed = map.job_seed, servers = ?map.servers, "welcomed");
                        }
                        FromScheduler::Refused { reason } => return Err(ServerError::Refused { reason }),
                        FromScheduler::Placement(p) => {
                            let error = self.place(&p).err();
                            if let Some(e) = &error {
                                warn!(tensor = %p.name, "placement refused: {e}");
                            }
                            self.send(&ToScheduler::PlacementAck { name: p.name.clone(), error }).await?;
                        }
                        FromScheduler::NodeLost { node, reason } => {
                            warn!(%node, %reason, "node lost; aborting open rounds");
                            self.shared.node_lost(&node.to_string(), &reason);
                            if lost.is_none() {
                                lost = Some((node, reason, tokio::time::Instant::now() + LOST_GRACE));
                            }
                        }
                        FromScheduler::Shutdown { error } => {
                            return match (lost.take(), error) {
                                (Some((node, reason, _)), _) => Err(ServerError::NodeLost { node, reason }),
                                (None, Some(error)) => Err(ServerError::Shutdown { error }),
                                (None, None) => Ok(()),
                            };
                        }
                        other @ (FromScheduler::Declared { .. } | FromScheduler::BarrierDone { .. }) => {
                            warn!(msg = ?other, "unexpected worker message from the scheduler ignored");
                        }
                    }
                }
                _ = ticker.tick() => self.send(&ToScheduler::Heartbeat).await?,
                _ = tokio::time::sleep_until(last_heard + timeout) => {
                    return Err(self.sched_err(format!(
                        "no message for {:.1} s (heartbeat timeout)",
                        timeout.as_secs_f64()
                    )));
                }
                _ = sleep_until_opt(lost_deadline) => {
                    if let Some((node, reason, _)) = lost.take() {
                        return Err(ServerError::NodeLost { node, reason });
                    }
                }
            }
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
            server_id,
            config,
        };
        let codec: Box<dyn ChunkCodec> = factory.make(&ctx).map_err(|e| {
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
            priority: p.priority,
        };
        new.push((
            chunk.key,
            KeyRounds::new(info, codec).with_pool(shared.pool.clone()),
        ));
    }
    let n = new.len();
    for (key, rounds) in new {
        shared.keys.insert(key, Arc::new(Mutex::new(rounds)));
    }
    info!(tensor = %p.name, keys = n, "placed");
    Ok(())
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// A frame to send: kind, key, round, payload.
type OutFrame = (FrameKind, u64, u64, Bytes);

/// Priority of abort frames: before any result.
const ABORT_PRIORITY: i32 = i32::MAX;

/// A worker's data connection.
#[derive(Clone)]
struct WorkerConn {
    /// The connection and `worker R (addr)`.
    peer: Peer,
    /// Sends results and aborts, the server's one queue for every worker.
    sender: FrameSender,
}

impl WorkerConn {
    /// Queues one frame for worker `rank`.
    fn send(&self, rank: u32, (kind, key, round, payload): OutFrame, priority: i32) {
        let header = FrameHeader {
            kind,
            op: ReduceOp::Sum,
            rank,
            aux: 0,
            key,
            round,
            payload_len: payload.len() as u64,
        };
        self.sender.send(&self.peer, header, payload, priority);
    }
}

/// State shared by every task of a running server.
struct Shared {
    num_workers: u32,
    max_payload: u64,
    heartbeat_timeout: Duration,
    server_id: OnceLock<u32>,
    keys: DashMap<u64, Arc<Mutex<KeyRounds>>>,
    /// Data connections by rank.
    workers: RwLock<Vec<Option<WorkerConn>>>,
    /// Sends every result and abort in priority order within `cluster.send_window_bytes`.
    sender: FrameSender,
    /// Buffers for encoded results.
    pool: Arc<BufPool>,
}

impl Shared {
    /// The state and the driver of its [`FrameSender`] (spawn it).
    fn new(
        config: &Config,
    ) -> (
        Shared,
        impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let w = config.cluster.num_workers;
        let on_error: OnError = Box::new(|peer: &Peer, e: TransportError| {
            // The worker's connection failed: the scheduler reports the worker lost.
            debug!("sending to {} failed: {e}", peer.name);
        });
        let (sender, driver) = FrameSender::new(config.cluster.send_window_bytes, on_error);
        let shared = Shared {
            num_workers: w,
            max_payload: max_payload_len(config.cluster.partition_bytes),
            heartbeat_timeout: config.heartbeat_timeout(),
            server_id: OnceLock::new(),
            keys: DashMap::new(),
            workers: RwLock::new(vec![None; w as usize]),
            sender,
            pool: BufPool::new(RESULT_POOL_BYTES),
        };
        (shared, driver)
    }

    fn id_str(&self) -> String {
        match self.server_id.get() {
            Some(id) => format!("server {id}"),
            None => "this server".to_string(),
        }
    }

    fn worker(&self, rank: u32) -> Option<WorkerConn> {
        let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
        w.get(rank as usize).cloned().flatten()
    }

    /// Aborts every open round naming `node`; every later push is refused naming it.
    fn node_lost(self: &Arc<Self>, node: &str, reason: &str) {
        let keys: Vec<(u64, Arc<Mutex<KeyRounds>>)> = self
            .keys
            .iter()
            .map(|e| (*e.key(), e.value().clone()))
            .collect();
        for (key, k) in keys {
            let (priority, actions) = {
                let mut k = k.lock().unwrap_or_else(|e| e.into_inner());
                (k.info().priority, k.node_lost(node, reason))
            };
            self.execute(key, priority, actions);
        }
    }

    /// Carries out a state machine's actions for `key`, whose results go out at `priority`
    /// (aborts, small and urgent, always at the highest).
    fn execute(self: &Arc<Self>, key: u64, priority: i32, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::SendResult { round, payload } => {
                    for rank in 0..self.num_workers {
                        let frame = (FrameKind::Result, key, round, payload.clone());
                        self.send_to_rank(rank, frame, priority);
                    }
                }
                Action::SendAbort {
                    round,
                    ranks,
                    message,
                } => {
                    debug!(key, round, ?ranks, "abort: {message}");
                    let payload = Bytes::from(message);
                    for rank in ranks {
                        let frame = (FrameKind::Abort, key, round, payload.clone());
                        self.send_to_rank(rank, frame, ABORT_PRIORITY);
                    }
                }
            }
        }
    }

    fn send_to_rank(self: &Arc<Self>, rank: u32, frame: OutFrame, priority: i32) {
        match self.worker(rank) {
            Some(w) => w.send(rank, frame, priority),
            None => debug!(
                rank,
                key = frame.1,
                round = frame.2,
                kind = ?frame.0,
                "worker not connected; frame dropped"
            ),
        }
    }

    /// Waits (at most `limit`) until every frame queued for a worker was handed to QUIC.
    async fn flush(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, self.sender.flushed()).await;
    }
}

async fn accept_loop(endpoint: Endpoint, shared: Arc<Shared>) {
    while let Some(incoming) = endpoint.quinn.accept().await {
        let shared = shared.clone();
        tokio::spawn(async move {
            match incoming.await {
                Ok(conn) => serve_worker(shared, conn).await,
                Err(e) => debug!("incoming connection failed: {e}"),
            }
        });
    }
}

/// What reading one incoming stream gave.
enum Incoming {
    /// A well-formed frame.
    Frame(FrameHeader, Bytes),
    /// The header was readable but the rest was not (payload too long, truncated, extra
    /// bytes, stream reset).
    Bad(FrameHeader, String),
    /// Not even a header.
    Unreadable(String),
}

/// Reads one data frame to the end of its stream. Like [`common::transport::read_frame`], but
/// keeps the header when the payload is bad, so the sender can be answered with an `Abort`.
async fn read_incoming(recv: &mut quinn::RecvStream, max_payload: u64) -> Incoming {
    let mut head = [0u8; FRAME_HEADER_LEN];
    match recv.read_exact(&mut head).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(n)) => {
            return Incoming::Unreadable(format!(
                "truncated frame header: {n} of {FRAME_HEADER_LEN} bytes"
            ))
        }
        Err(quinn::ReadExactError::ReadError(e)) => return Incoming::Unreadable(e.to_string()),
    }
    let header = match FrameHeader::decode(&head, u64::MAX) {
        Ok(h) => h,
        Err(e) => {
            let _ = recv.stop(quinn::VarInt::from_u32(1));
            return Incoming::Unreadable(e.to_string());
        }
    };
    if header.payload_len > max_payload {
        let _ = recv.stop(quinn::VarInt::from_u32(1));
        return Incoming::Bad(
            header,
            format!(
                "frame payload of {} bytes exceeds the limit of {max_payload} bytes",
                header.payload_len
            ),
        );
    }
    let want = header.payload_len as usize;
    let mut single: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    let mut got = 0usize;
    loop {
        match recv.read_chunk(usize::MAX, true).await {
            Ok(Some(chunk)) => {
                got += chunk.bytes.len();
                if got > want {
                    let _ = recv.stop(quinn::VarInt::from_u32(1));
                    return Incoming::Bad(
                        header,
                        format!("more bytes than the declared payload of {want} bytes"),
                    );
                }
                if single.is_none() && buf.is_empty() {
                    single = Some(chunk.bytes);
                } else {
                    if let Some(first) = single.take() {
                        buf.reserve(want);
                        buf.extend_from_slice(&first);
                    }
                    buf.extend_from_slice(&chunk.bytes);
                }
            }
            Ok(None) => break,
            Err(quinn::ReadError::ConnectionLost(e)) => {
                return Incoming::Unreadable(format!("connection lost: {e}"))
            }
            Err(e) => return Incoming::Bad(header, format!("stream failed: {e}")),
        }
    }
    if got < want {
        return Incoming::Bad(
            header,
            format!("truncated frame payload: {got} of {want} bytes"),
        );
    }
    let payload = single.unwrap_or_else(|| buf.freeze());
    Incoming::Frame(header, payload)
}

/// Serves one worker's data connection: `Hello` first, then one task per stream.
async fn serve_worker(shared: Arc<Shared>, conn: quinn::Connection) {
    let addr = conn.remote_address();
    let refuse = |why: String| {
        warn!(%addr, "worker connection refused: {why}");
        conn.close(quinn::VarInt::from_u32(CLOSE_REFUSED), why.as_bytes());
    };
    // The first stream and its whole frame, within the bound: a peer that opens the stream
    // and stalls must not hold this task forever.
    let hello = async {
        let mut first = conn.accept_uni().await?;
        Ok::<_, quinn::ConnectionError>(read_incoming(&mut first, 0).await)
    };
    let hello = match tokio::time::timeout(shared.heartbeat_timeout, hello).await {
        Ok(Ok(frame)) => frame,
        Ok(Err(e)) => return debug!(%addr, "connection closed before Hello: {e}"),
        Err(_) => return refuse("no Hello within the heartbeat timeout".into()),
    };
    let rank = match hello {
        Incoming::Frame(h, _) if h.kind == FrameKind::Hello => h.rank,
        Incoming::Frame(h, _) | Incoming::Bad(h, _) => {
            return refuse(format!("the first frame must be Hello, got {:?}", h.kind))
        }
        Incoming::Unreadable(e) => return refuse(format!("bad Hello frame: {e}")),
    };
    if rank >= shared.num_workers {
        return refuse(format!(
            "Hello from rank {rank}, but the job has {} workers",
            shared.num_workers
        ));
    }
    let w = WorkerConn {
        peer: Peer {
            conn: conn.clone(),
            name: format!("worker {rank} ({addr})").into(),
        },
        sender: shared.sender.clone(),
    };
    {
        let mut workers = shared.workers.write().unwrap_or_else(|e| e.into_inner());
        let slot = &mut workers[rank as usize];
        if let Some(old) = slot {
            if old.peer.conn.close_reason().is_none() {
                let why = format!("rank {rank} is already connected as {}", old.peer.name);
                drop(workers);
                return refuse(why);
            }
        }
        *slot = Some(w.clone());
    }
    info!("{} connected", w.peer.name);
    loop {
        match conn.accept_uni().await {
            Ok(mut stream) => {
                let shared = shared.clone();
                let w = w.clone();
                tokio::spawn(async move {
                    let frame = read_incoming(&mut stream, shared.max_payload).await;
                    handle_frame(&shared, &w, rank, frame);
                });
            }
            Err(e) => {
                info!("{} disconnected: {e}", w.peer.name);
                break;
            }
        }
    }
}

/// Feeds one frame from worker `rank` to its key and carries out the actions.
fn handle_frame(shared: &Arc<Shared>, w: &WorkerConn, rank: u32, frame: Incoming) {
    let (header, payload, bad) = match frame {
        Incoming::Frame(h, p) => (h, p, None),
        Incoming::Bad(h, why) => (h, Bytes::new(), Some(why)),
        Incoming::Unreadable(why) => {
            warn!("unreadable frame from {}: {why}", w.peer.name);
            return;
        }
    };
    let key = header.key;
    let round = header.round;
    if header.kind != FrameKind::Push {
        let why = format!(
            "{} expected a Push frame from {}, got {:?}{}",
            shared.id_str(),
            w.peer.name,
            header.kind,
            bad.as_deref()
                .map(|b| format!(" ({b})"))
                .unwrap_or_default()
        );
        warn!(key, round, "{why}");
        if header.kind != FrameKind::Hello {
            let frame = (FrameKind::Abort, key, round, Bytes::from(why));
            w.send(rank, frame, ABORT_PRIORITY);
        }
        return;
    }
    let Some(k) = shared.keys.get(&key).map(|e| e.value().clone()) else {
        let why =
            format!(
            "key {key:#018x} round {round}: push from rank {rank} for a key that {} does not hold (no \
             tensor placed on it has this key){}",
            shared.id_str(),
            bad.as_deref().map(|b| format!("; also: {b}")).unwrap_or_default()
        );
        warn!("{why}");
        let frame = (FrameKind::Abort, key, round, Bytes::from(why));
        w.send(rank, frame, ABORT_PRIORITY);
        return;
    };
    let (priority, actions) = {
        let mut k = k.lock().unwrap_or_else(|e| e.into_inner());
        let actions = if let Some(why) = bad {
            k.reject(rank, round, &why)
        } else if header.rank != rank {
            let why = format!(
                "its header says rank {} but the connection said Hello as rank {rank}",
                header.rank
            );
            k.reject(rank, round, &why)
        } else {
            k.push(rank, round, header.op, header.aux, payload)
        };
        (k.info().priority, actions)
    };
    shared.execute(key, priority, actions);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A factory that records the parameter `k` of every codec it builds.
    fn recording_factory(seen: Arc<Mutex<Vec<String>>>) -> impl CodecFactory {
        move |ctx: &CodecContext<'_>| -> Result<Box<dyn ChunkCodec>, String> {
            let k = ctx.tensor.params.get("k").cloned().unwrap_or_default();
            seen.lock().unwrap().push(k);
            Ok(Box::new(common::codec::Fp32Codec::new(
                ctx.chunk.len as usize,
            )))
        }
    }

    fn two_chunk_placement(name: &str, len: u64, k: &str) -> TensorPlacement {
        let mut placer = common::placement::Placer::new(2, 400);
        let mut params = common::config::ParamMap::new();
        params.insert("k".into(), k.into());
        let p = placer.place(name, len, params);
        assert_eq!(p.chunks.len(), 2);
        assert_eq!(p.chunks[0].server, 0);
        p
    }

    #[test]
    fn a_tensor_placed_again_after_a_failed_declare_gets_fresh_keys() {
        // Server 0 accepted "t" but server 1 refused it, so the declare failed; the workers
        // declare "t" again with other parameters (or another length). Server 0 must build
        // its key from the new placement, not keep the codec of the failed one, nor refuse
        // the key it still holds.
        let mut config = Config::local(2, 2);
        config.cluster.partition_bytes = 400;
        let (shared, _sender) = Shared::new(&config);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let factory = recording_factory(seen.clone());
        let first = two_chunk_placement("t", 150, "1");
        place_keys(&shared, &factory, &config, 0, 7, &first).unwrap();
        assert_eq!(*seen.lock().unwrap(), ["1"]);
        let again = two_chunk_placement("t", 150, "2");
        place_keys(&shared, &factory, &config, 0, 7, &again).unwrap();
        assert_eq!(*seen.lock().unwrap(), ["1", "2"]);
        let longer = two_chunk_placement("t", 180, "2");
        place_keys(&shared, &factory, &config, 0, 7, &longer).unwrap();
        let key = longer.chunks[0].key;
        let k = shared.keys.get(&key).unwrap().value().clone();
        assert_eq!(k.lock().unwrap().info().len, 90);
        // A key in use is never replaced: the same chunk keeps its state, another length is
        // refused; another tensor's key is refused by name.
        let acts = k
            .lock()
            .unwrap()
            .push(0, 0, ReduceOp::Sum, 0, Bytes::from(vec![0u8; 360]));
        assert!(acts.is_empty());
        let n = seen.lock().unwrap().len();
        place_keys(&shared, &factory, &config, 0, 7, &longer).unwrap();
        assert_eq!(seen.lock().unwrap().len(), n);
        assert!(k.lock().unwrap().is_open());
        let e = place_keys(&shared, &factory, &config, 0, 7, &again).unwrap_err();
        assert!(
            e.contains("already held") && e.contains("tensor \"t\" chunk 0"),
            "{e}"
        );
        assert!(k.lock().unwrap().is_open());
        let mut other = two_chunk_placement("u", 150, "2");
        other.chunks[0].key = key;
        let e = place_keys(&shared, &factory, &config, 0, 7, &other).unwrap_err();
        assert!(
            e.contains("tensor \"u\" chunk 0") && e.contains("tensor \"t\""),
            "{e}"
        );
    }

    #[test]
    fn advertised_address_rules() {
        let bound: SocketAddr = "0.0.0.0:4000".parse().unwrap();
        let local: IpAddr = "10.0.0.7".parse().unwrap();
        assert_eq!(
            advertised_addr(Some("192.168.1.2:5000"), bound, Some(local)).unwrap(),
            "192.168.1.2:5000".parse().unwrap()
        );
        assert_eq!(
            advertised_addr(None, "127.0.0.1:4000".parse().unwrap(), Some(local)).unwrap(),
            "127.0.0.1:4000".parse().unwrap()
        );
        assert_eq!(
            advertised_addr(None, bound, Some(local)).unwrap(),
            "10.0.0.7:4000".parse().unwrap()
        );
        // An IPv4-mapped local address of a dual-stack socket is advertised as IPv4.
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        assert_eq!(
            advertised_addr(None, "[::]:4000".parse().unwrap(), Some(mapped)).unwrap(),
            "10.0.0.7:4000".parse().unwrap()
        );
        let e = advertised_addr(None, bound, None).unwrap_err();
        assert!(e.contains("server.advertise"), "{e}");
        let e = advertised_addr(Some("nope"), bound, None).unwrap_err();
        assert!(e.contains("IP address and port"), "{e}");
    }
}
