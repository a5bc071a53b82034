//! The async shell around [`SchedulerState`]: sockets, tasks and the clock.
//!
//! * [`Scheduler::bind`] binds a [`common::transport::Endpoint`](Endpoint) at
//!   `cluster.scheduler` and fixes the job seed (the configured one, or one picked from the
//!   time, the process id and std's randomly keyed hasher, and logged).
//! * [`Scheduler::run`] accepts connections. Each connection gets a task that completes the
//!   TLS handshake, accepts ONE bidirectional control stream, then reads control messages and
//!   forwards them to the main loop over an mpsc channel; and a writer task that sends what the
//!   state machine asks for, in order. The main loop feeds the state machine (connections,
//!   messages, disconnections, and a tick at the next heartbeat/timeout deadline, at least
//!   every heartbeat interval / 4) and executes its [`Action`]s.
//! * When the state machine finishes, every connection's control stream is finished after its
//!   queued messages (the `Shutdown`s); the shell waits until the peers closed their
//!   connections or [`SHUTDOWN_GRACE`] passed, closes the endpoint and waits at most
//!   [`IDLE_WAIT`] for it to drain.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use pushpull_net::certs::peer_grant;
use pushpull_net::tls::TlsIdentity;
use pushpull_net::transport::{ControlSender, ControlStream, Endpoint, TransportError};
use pushpull_proto::config::{Config, ConfigError};
use pushpull_proto::departure::Departure;
use pushpull_proto::grant::PeerGrant;
use pushpull_proto::protocol::{FromScheduler, ToScheduler};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

use crate::state::{Action, ConnId, Event, JobFailure, SchedulerState, StateConfig};
use crate::stats::{Published, SchedulerStats};

/// How long the scheduler waits, after the job is over, for nodes to close their connections
/// (so that the final `Shutdown` messages are delivered) before closing them itself. A refused
/// connection gets the same grace after its `Refused` message.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// How long [`Scheduler::run`] waits for the closed endpoint to drain before returning.
pub const IDLE_WAIT: Duration = Duration::from_secs(1);

/// Why the scheduler could not start or the job failed.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// The config is invalid (names the key).
    #[error("scheduler: {0}")]
    Config(#[from] ConfigError),
    /// Binding the endpoint or TLS setup failed.
    #[error("scheduler: {0}")]
    Transport(#[from] TransportError),
    /// The job failed: a node was lost (named), or it could never finish.
    #[error("job failed: {0}")]
    Job(#[from] JobFailure),
    /// The endpoint stopped accepting connections while the job was running.
    #[error("scheduler: the endpoint stopped accepting connections before the job ended")]
    EndpointClosed,
}

/// A bound scheduler, ready to [`run`](Scheduler::run).
#[derive(Debug)]
pub struct Scheduler {
    config: Config,
    endpoint: Endpoint,
    job_seed: u64,
    stats: SchedulerStats,
}

impl Scheduler {
    /// Validates `config`, binds `cluster.scheduler` (port 0 picks a free port) with mutual TLS
    /// and chooses the job seed (`cluster.seed`, or a random one, logged).
    pub async fn bind(config: Config, identity: TlsIdentity) -> Result<Scheduler, SchedulerError> {
        config.validate("scheduler config")?;
        let addr = config.scheduler_addr().bind_addr();
        let endpoint = Endpoint::bind(addr, &identity, &config)?;
        let job_seed = match config.cluster.seed {
            Some(seed) => {
                tracing::info!(job_seed = seed, "job seed {seed} (cluster.seed)");
                seed
            }
            None => {
                let seed = random_seed();
                tracing::info!(
                    job_seed = seed,
                    "job seed {seed} (picked at random; set cluster.seed = {seed} to repeat \
                     this job)"
                );
                seed
            }
        };
        tracing::info!(
            "scheduler listening on {} for {} servers and {} workers",
            endpoint.local_addr(),
            config.cluster.num_servers,
            config.cluster.num_workers
        );
        Ok(Scheduler {
            config,
            endpoint,
            job_seed,
            stats: SchedulerStats::default(),
        })
    }

    /// The bound address (with the real port when `cluster.scheduler` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.endpoint.local_addr()
    }

    /// The QUIC endpoint (e.g. to count its open connections).
    pub fn quinn_endpoint(&self) -> quinn::Endpoint {
        self.endpoint.quinn.clone()
    }

    /// A handle to the liveness and connection counters [`Scheduler::run`] publishes (when
    /// nodes connect, leave or are welcomed, else at most every heartbeat interval / 4, and at
    /// the end); take it before `run`.
    pub fn stats(&self) -> SchedulerStats {
        self.stats.clone()
    }

    /// The job seed every node will receive in its cluster map.
    pub fn job_seed(&self) -> u64 {
        self.job_seed
    }

    /// Runs the job: registration, declares, barriers, heartbeats, until every worker finished
    /// (`Ok`, after servers and workers were sent `Shutdown{error: None}`) or the job failed
    /// (`Err` naming the lost node or what went wrong; every node was sent `NodeLost` and
    /// `Shutdown{error}`).
    pub async fn run(self) -> Result<(), SchedulerError> {
        let Scheduler {
            config,
            endpoint,
            job_seed,
            stats,
        } = self;
        // The timeline (`[trace] dir`, `PUSHPULL_TRACE`): the scheduler records no spans, but
        // its process writes a file like every node's, at the end of `run`.
        pushpull_net::timeline::start(&config.trace, "scheduler");
        let timeout = config.heartbeat_timeout();
        let tick = (config.heartbeat_interval() / 4).max(Duration::from_millis(5));
        let mut state = SchedulerState::new(StateConfig::from_config(&config, job_seed), now());

        let (tx, mut rx) = mpsc::channel::<Inbound>(1024);
        let check_roles = config.tls.check_roles;
        let accept = tokio::spawn(accept_loop(
            endpoint.quinn.clone(),
            tx,
            timeout,
            check_roles,
        ));
        let mut conns: HashMap<ConnId, ConnHandle> = HashMap::new();
        // When the stats were last published, and the members then.
        let mut published = (now(), (0, false));

        let result = 'main: loop {
            let deadline = state
                .next_timeout()
                .map_or(now() + tick, |t| t.min(now() + tick));
            tokio::select! {
                inbound = rx.recv() => match inbound {
                    Some(Inbound::Accepted { conn, addr, grant, handle }) => {
                        conns.insert(conn, handle);
                        state.handle(now(), Event::Connected { conn, addr, grant });
                    }
                    Some(Inbound::Message(conn, msg)) => {
                        state.handle(now(), Event::Message { conn, msg });
                    }
                    Some(Inbound::Blamed(conn, node, reason)) => {
                        state.handle(now(), Event::Blamed { conn, node, reason });
                    }
                    Some(Inbound::Closed(conn, reason)) => {
                        state.handle(now(), Event::Disconnected { conn, reason });
                        // Once the state forgot the connection, so does the shell: dropping
                        // the handle ends its writer (after what is queued) and the
                        // connection with it.
                        if !state.tracks(conn) {
                            conns.remove(&conn);
                        }
                    }
                    None => break 'main Err(SchedulerError::EndpointClosed),
                },
                _ = tokio::time::sleep_until(deadline.into()) => state.handle(now(), Event::Tick),
            }
            // For the metrics endpoint: when the members change, else at most once a tick
            // (messages may keep the timer from firing).
            let members = (state.connection_count(), state.is_running());
            if members != published.1 || now() >= published.0 + tick {
                publish(&stats, &state, &conns);
                published = (now(), members);
            }
            while let Some(action) = state.poll_action() {
                match action {
                    Action::Send(conn, msg) => {
                        if let Some(h) = conns.get(&conn) {
                            let _ = h.tx.send(WriterCmd::Send(msg));
                        }
                    }
                    Action::Close(conn) => {
                        if let Some(h) = conns.get(&conn) {
                            let _ = h.tx.send(WriterCmd::Close);
                        }
                    }
                    Action::Finish(r) => break 'main r.map_err(SchedulerError::Job),
                }
            }
        };
        // No action follows Finish: it is always the last one.
        publish(&stats, &state, &conns);

        match &result {
            Ok(()) => tracing::info!("job finished: every worker finished cleanly"),
            Err(e) => tracing::error!("{e}"),
        }
        // Deliver the queued Shutdowns, then finish every control stream and wait for the
        // peers to hang up (bounded). The readers stay alive meanwhile: dropping a receive
        // stream would tell the peer to stop sending, which it might take for a failure
        // before it has read its Shutdown.
        for h in conns.values() {
            let _ = h.tx.send(WriterCmd::Close);
        }
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        for (_, h) in conns.drain() {
            let _ = tokio::time::timeout_at(deadline, h.writer).await;
        }
        accept.abort();
        endpoint.quinn.close(0u32.into(), b"job over");
        let _ = tokio::time::timeout(IDLE_WAIT, endpoint.quinn.wait_idle()).await;
        pushpull_net::timeline::write();
        result
    }
}

/// Publishes the nodes' liveness and their connections for [`SchedulerStats`].
fn publish(stats: &SchedulerStats, state: &SchedulerState, conns: &HashMap<ConnId, ConnHandle>) {
    let nodes = state.liveness(now());
    let mut conns: Vec<(String, quinn::Connection)> = conns
        .iter()
        .filter_map(|(&id, h)| {
            let n = state.node_name(id)?;
            Some((format!("{} {}", n.role, n.id), h.quic.clone()))
        })
        .collect();
    conns.sort_by(|a, b| a.0.cmp(&b.0));
    stats.publish(Published { nodes, conns });
}

/// The current time on tokio's clock (so paused-time tests work) as a std instant.
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// A job seed from std only: the time, the process id and a hasher that std keys randomly per
/// process.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
        .hash(&mut h);
    std::process::id().hash(&mut h);
    h.finish()
}

/// What connection tasks tell the main loop.
enum Inbound {
    /// A node completed the handshake and opened its control stream.
    Accepted {
        conn: ConnId,
        addr: SocketAddr,
        /// What the node's certificate grants.
        grant: PeerGrant,
        handle: ConnHandle,
    },
    /// A control message.
    Message(ConnId, ToScheduler),
    /// The control stream or connection ended.
    Closed(ConnId, String),
    /// The node closed its connection blaming another node's loss (`Departure::NodeLost`).
    Blamed(ConnId, pushpull_proto::protocol::NodeName, String),
}

/// How long a node's ended control stream waits for its connection's close (and its reason).
const CLOSE_GRACE: Duration = Duration::from_millis(200);

/// A node that ended because another was lost says which in its close (a local group's member
/// sees its group's loss before this scheduler's heartbeats do): the node it blames.
fn blamed(id: ConnId, close: &quinn::ConnectionError) -> Option<Inbound> {
    let quinn::ConnectionError::ApplicationClosed(close) = close else {
        return None;
    };
    match Departure::from_close(close.error_code.into_inner(), &close.reason) {
        Departure::NodeLost { node, reason } => Some(Inbound::Blamed(id, node, reason)),
        _ => None,
    }
}

/// The main loop's side of a connection.
struct ConnHandle {
    tx: mpsc::UnboundedSender<WriterCmd>,
    writer: JoinHandle<()>,
    /// The connection (for its QUIC counters).
    quic: quinn::Connection,
}

/// What a writer task does next.
enum WriterCmd {
    /// Send a message.
    Send(FromScheduler),
    /// Finish the stream, wait for the peer to close (bounded), close.
    Close,
}

/// Accepts connections until the endpoint closes; each gets a task in a set that is aborted
/// when this task is.
async fn accept_loop(
    ep: quinn::Endpoint,
    tx: mpsc::Sender<Inbound>,
    timeout: Duration,
    check_roles: bool,
) {
    let mut tasks = JoinSet::new();
    let mut next: ConnId = 0;
    while let Some(incoming) = ep.accept().await {
        let id = next;
        next += 1;
        tasks.spawn(serve_conn(incoming, id, tx.clone(), timeout, check_roles));
        // Reap finished connection tasks.
        while tasks.try_join_next().is_some() {}
    }
}

/// One connection: handshake, one control stream, then read until it ends.
async fn serve_conn(
    incoming: quinn::Incoming,
    id: ConnId,
    tx: mpsc::Sender<Inbound>,
    timeout: Duration,
    check_roles: bool,
) {
    let addr = incoming.remote_address();
    let conn = match incoming.accept() {
        Ok(connecting) => match tokio::time::timeout(timeout, connecting).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                tracing::warn!(peer = %addr, "handshake failed: {e}");
                return;
            }
            Err(_) => {
                tracing::warn!(peer = %addr, "handshake timed out");
                return;
            }
        },
        Err(e) => {
            tracing::warn!(peer = %addr, "cannot accept connection: {e}");
            return;
        }
    };
    let (send, recv) = match tokio::time::timeout(timeout, conn.accept_bi()).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::warn!(peer = %addr, "connection ended before opening a control stream: {e}");
            return;
        }
        Err(_) => {
            tracing::warn!(peer = %addr, "no control stream within {timeout:?}; closing");
            conn.close(1u32.into(), b"no control stream");
            return;
        }
    };
    let (sender, mut receiver) = ControlStream::new(send, recv, format!("node at {addr}")).split();
    let (wtx, wrx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(writer(sender, conn.clone(), wrx));
    let handle = ConnHandle {
        tx: wtx,
        writer,
        quic: conn.clone(),
    };
    if tx
        .send(Inbound::Accepted {
            conn: id,
            addr,
            grant: peer_grant(&conn, check_roles),
            handle,
        })
        .await
        .is_err()
    {
        return;
    }
    loop {
        let event = match receiver.recv::<ToScheduler>().await {
            Ok(Some(msg)) => Inbound::Message(id, msg),
            Ok(None) => {
                // A node ending closes its stream, then its connection, saying why: give the
                // close a moment to arrive, and report it as the connection's end would be.
                match tokio::time::timeout(CLOSE_GRACE, conn.closed()).await {
                    Ok(source) => {
                        if let Some(blamed) = blamed(id, &source) {
                            if tx.send(blamed).await.is_err() {
                                return;
                            }
                        }
                        Inbound::Closed(id, source.to_string())
                    }
                    Err(_) => Inbound::Closed(id, "it closed its control stream".into()),
                }
            }
            Err(TransportError::Connection { source, .. }) => {
                if let Some(blamed) = blamed(id, &source) {
                    if tx.send(blamed).await.is_err() {
                        return;
                    }
                }
                Inbound::Closed(id, source.to_string())
            }
            Err(e @ TransportError::Protocol { .. }) => {
                // A malformed frame: nothing after it can be trusted. Close at once, saying why.
                let why = Departure::Refused(format!("malformed control frame: {e}"));
                tracing::warn!(peer = %addr, "{why}; closing the connection");
                conn.close(why.code().into(), &why.reason());
                Inbound::Closed(id, e.to_string())
            }
            Err(e) => Inbound::Closed(id, e.to_string()),
        };
        let last = matches!(event, Inbound::Closed(..));
        if tx.send(event).await.is_err() || last {
            return;
        }
    }
}

/// Sends a connection's messages in order; on `Close`, finishes the stream and waits (at most
/// [`SHUTDOWN_GRACE`]) for the peer to close the connection.
async fn writer(
    mut sender: ControlSender,
    conn: quinn::Connection,
    mut rx: mpsc::UnboundedReceiver<WriterCmd>,
) {
    while let Some(cmd) = rx.recv().await {
        match cmd {
            WriterCmd::Send(msg) => {
                if let Err(e) = sender.send(&msg).await {
                    tracing::debug!("cannot send to {}: {e}", conn.remote_address());
                    return;
                }
            }
            WriterCmd::Close => {
                sender.finish();
                let _ = tokio::time::timeout(SHUTDOWN_GRACE, conn.closed()).await;
                conn.close(0u32.into(), b"bye");
                return;
            }
        }
    }
}
