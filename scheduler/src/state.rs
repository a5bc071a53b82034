//! The scheduler as a pure, deterministic state machine (quinn-proto style).
//!
//! [`SchedulerState`] owns no sockets and reads no clock: the shell ([`crate::Scheduler`])
//! feeds it [`Event`]s together with the current [`Instant`] through
//! [`SchedulerState::handle`], and drains the resulting [`Action`]s with
//! [`SchedulerState::poll_action`]. Every rule of the scheduler lives here, so
//! registration orders, declare mismatches, barriers, lost nodes and the clean finish are
//! tested without a network (`state/tests/`).
//!
//! The rules live by concern: `register` (step 1 below), `declare` (step 2), `liveness`
//! (steps 3 to 5); this file holds the types, the event loop and the helpers they share.
//!
//! # Life cycle
//! 1. **Registration.** A connection ([`Event::Connected`]) must first send
//!    [`ToScheduler::Register`]. It is refused at once ([`FromScheduler::Refused`], then
//!    [`Action::Close`]) on a protocol version mismatch, a certificate that does not grant the
//!    role (or the requested id) ([`pushpull_proto::grant`]; a certificate that fixes an id
//!    gets that id), a config digest difference (the
//!    reason names the setting and both values), a requested id out of range or already
//!    taken, a server without a dialable listen address (or one another server already
//!    advertises), or a full cluster. Accepted nodes wait (receiving scheduler heartbeats);
//!    when `num_servers` servers and `num_workers` workers are in, requested ids are
//!    honoured, the others filled lowest-free-first in registration order, and every node gets
//!    [`FromScheduler::Welcome`]. A node that disconnects or goes silent *before* that moment
//!    only withdraws its registration (its slot becomes free again): nobody depends on it yet.
//!    A connection must register first (anything else, a heartbeat too, is refused) and
//!    within the heartbeat timeout, at most `2 × (servers + workers) +` [`SPARE_UNREGISTERED`] may wait to
//!    register at once, and the state of a connection that ended is dropped unless it was a
//!    member of the running job ([`SchedulerState::connection_count`]).
//!    Meanwhile the scheduler logs who it waits for every [`RENDEZVOUS_LOG_INTERVAL`]; if the
//!    cluster is not complete `rendezvous_timeout` after the scheduler's start, every waiting
//!    node gets `Shutdown{error}` saying who registered and who is missing, and the machine
//!    finishes with [`JobFailure::Rendezvous`].
//! 2. **Declare** (a collective): once every worker declared a name, lengths and parameter
//!    maps are compared (an error names the tensor, the two ranks and both values), a tensor
//!    of more than [`MAX_CHUNKS_PER_TENSOR`] chunks is refused, the tensor is placed with the
//!    job's one [`Placer`] (each chunk weighed by its payload bytes), its chunk keys are checked
//!    against every other tensor's, the placement goes to every server, and once every server
//!    acknowledged it the workers get [`FromScheduler::Declared`]. A placed name declared again
//!    is answered at once.
//! 3. **Barriers**: barrier `id` completes when every worker entered it.
//! 4. **Heartbeats**: [`Event::Tick`] sends the scheduler's own heartbeat to every registered
//!    node each interval and declares a welcomed node lost when it has been silent for the
//!    heartbeat timeout; [`Event::Disconnected`] of a welcomed node is a loss too, except for
//!    a worker that already sent `Finished`; [`Event::Blamed`] (a node's close naming another
//!    node's loss, e.g. a local group's member) is the named node's loss. A loss sends [`FromScheduler::NodeLost`] and
//!    `Shutdown{error}` to every other node and finishes with [`JobFailure::NodeLost`].
//! 5. **Finish**: when every worker sent `Finished`, every node still connected gets
//!    `Shutdown{error: None}` and the machine finishes with `Ok(())`.
//!
//! A job that could never finish because a worker finished without taking part in a barrier
//! the others wait in ends with [`JobFailure::Stuck`]; a declare that a finished worker never
//! joined fails for the others with a [`FromScheduler::Declared`] error instead.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pushpull_proto::config::{ClusterDigest, Config, CutRules};
use pushpull_proto::grant::PeerGrant;
use pushpull_proto::placement::{num_chunks, Placer};
use pushpull_proto::protocol::{
    ClusterMap, FromScheduler, NodeName, NodeRole, TensorPlacement, ToScheduler, PROTOCOL_VERSION,
};

/// Identifies one accepted connection (assigned by the shell, never reused).
pub type ConnId = u64;

/// The most chunks one tensor may have (about 4.3 TB of fp32 at the default 4,096,000-byte
/// partition).
/// A declare beyond it fails naming the tensor: its placement (about 28 bytes per chunk at most)
/// must fit a control frame ([`pushpull_proto::protocol::MAX_CONTROL_FRAME`]), and a mistyped
/// length must not make the scheduler build billions of chunks.
pub const MAX_CHUNKS_PER_TENSOR: u64 = 1 << 20;

/// The most connections that may wait to register at once beyond twice the cluster's size;
/// more are refused at once, so a flood of connections cannot exhaust the scheduler.
pub const SPARE_UNREGISTERED: usize = 32;

/// While the cluster is incomplete, how often the scheduler logs who it still waits for.
pub const RENDEZVOUS_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// An input to the state machine. The time of the event is passed to
/// [`SchedulerState::handle`] alongside it.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A node connected and opened its control stream; `addr` is its remote address.
    Connected {
        /// The connection.
        conn: ConnId,
        /// The peer's address as the scheduler sees it.
        addr: SocketAddr,
        /// What the peer's certificate grants (checked at `Register`).
        grant: PeerGrant,
    },
    /// A control message arrived on `conn`.
    Message {
        /// The connection.
        conn: ConnId,
        /// The message.
        msg: ToScheduler,
    },
    /// The control stream or connection of `conn` ended (cleanly or not).
    Disconnected {
        /// The connection.
        conn: ConnId,
        /// What the shell observed, e.g. quinn's error.
        reason: String,
    },
    /// A node closed its connection saying `node` was lost (`Departure::NodeLost`): e.g. a
    /// local group's member whose group lost a member, which it saw first.
    Blamed {
        /// The connection of the node that said so.
        conn: ConnId,
        /// The node it names.
        node: NodeName,
        /// Why, as that node learnt it.
        reason: String,
    },
    /// Time passed: send due heartbeats and check for silent nodes.
    Tick,
}

/// An output of the state machine, executed by the shell in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send a control message on `conn`.
    Send(ConnId, FromScheduler),
    /// Finish the control stream of `conn` after the messages queued before this action, and
    /// close the connection once the peer did (or after a grace period).
    Close(ConnId),
    /// The job is over: `Ok` after a clean finish, or why it failed. Always the last action;
    /// the machine ignores every later event.
    Finish(Result<(), JobFailure>),
}

/// Why a job failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobFailure {
    /// A node was lost (silent past the heartbeat timeout, or its connection failed).
    #[error("{node} lost: {reason}")]
    NodeLost {
        /// The lost node.
        node: NodeName,
        /// What the scheduler observed.
        reason: String,
    },
    /// Not every node registered within `cluster.rendezvous_timeout_ms`; says who is
    /// missing.
    #[error("{0}")]
    Rendezvous(String),
    /// The job can never finish (e.g. a worker finished without entering a barrier the others
    /// wait in).
    #[error("{0}")]
    Stuck(String),
}

/// The settings the state machine needs, taken from the cluster [`Config`].
#[derive(Debug, Clone, PartialEq)]
pub struct StateConfig {
    /// The scheduler's own digest; every registering node must match it.
    pub digest: ClusterDigest,
    /// `cluster.num_workers`.
    pub num_workers: u32,
    /// `cluster.num_servers`.
    pub num_servers: u32,
    /// How tensors are cut (`cluster.partition_bytes`, `cluster.max_chunk_payload_bytes`:
    /// tensors with larger chunks are cut finer; `cluster.min_compress_bytes`: smaller tensors
    /// travel as fp32, and placement weighs them so).
    pub cut: CutRules,
    /// How often the scheduler sends heartbeats.
    pub heartbeat_interval: Duration,
    /// Silence after which a node is lost.
    pub heartbeat_timeout: Duration,
    /// From the scheduler's start, how long every node has to register.
    pub rendezvous_timeout: Duration,
    /// The job seed every node receives in its [`ClusterMap`].
    pub job_seed: u64,
}

impl StateConfig {
    /// Settings from a validated config, with the job seed the shell chose.
    pub fn from_config(config: &Config, job_seed: u64) -> StateConfig {
        StateConfig {
            digest: config.digest(),
            num_workers: config.cluster.num_workers,
            num_servers: config.cluster.num_servers,
            cut: config.cluster.cut(),
            heartbeat_interval: config.heartbeat_interval(),
            heartbeat_timeout: config.heartbeat_timeout(),
            rendezvous_timeout: config.rendezvous_timeout(),
            job_seed,
        }
    }
}

/// Where a connection is in its life.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Connected, no Register yet.
    Connected,
    /// Registered, waiting for the rest of the cluster.
    Pending {
        role: NodeRole,
        requested: Option<u32>,
        /// Servers: the advertised address.
        listen: Option<SocketAddr>,
        /// Registration order, for filling free ids.
        seq: u64,
    },
    /// Welcomed with `id`.
    Member { role: NodeRole, id: u32 },
    /// Refused or dropped; ignore everything from it.
    Gone,
}

#[derive(Debug, Clone)]
struct Conn {
    addr: SocketAddr,
    grant: PeerGrant,
    phase: Phase,
    last_heard: Instant,
    /// Workers: sent `Finished`.
    finished: bool,
    /// The transport reported the connection gone.
    disconnected: bool,
    /// Heartbeat ticks at which the node had been silent for more than two heartbeat
    /// intervals.
    missed_heartbeats: u64,
}

/// How a welcomed node's heartbeats look to the scheduler ([`SchedulerState::liveness`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Liveness {
    /// The node.
    pub name: NodeName,
    /// Time since anything was heard from it.
    pub silent: Duration,
    /// Heartbeat ticks at which it had been silent for more than two heartbeat intervals
    /// (a heartbeat, or more, missed; the node is lost past `cluster.heartbeat_timeout_ms`).
    pub missed_heartbeats: u64,
    /// A worker that sent `Finished`.
    pub finished: bool,
    /// Its connection is gone (after finishing, or lost).
    pub disconnected: bool,
}

/// A member of the running cluster.
#[derive(Debug, Clone)]
struct Member {
    conn: ConnId,
    name: NodeName,
}

/// The state of one tensor name.
#[derive(Debug, Clone)]
enum TensorState {
    /// Waiting for every worker's declaration, by rank.
    Collecting(BTreeMap<u32, Decl>),
    /// Placement sent to the servers; waiting for their acks.
    Placing {
        placement: TensorPlacement,
        /// The priority the declares asked for.
        requested: Option<i32>,
        acked: BTreeSet<u32>,
        error: Option<String>,
        /// Workers to answer (every rank, plus re-declarers while placing).
        waiting: BTreeSet<u32>,
    },
    /// Placed and acknowledged by every server; the priority the declares asked for.
    Placed(TensorPlacement, Option<i32>),
}

/// The scheduler's state machine. See the [module docs](self) for the rules.
#[derive(Debug)]
pub struct SchedulerState {
    cfg: StateConfig,
    conns: BTreeMap<ConnId, Conn>,
    next_seq: u64,
    /// Past this, a cluster that is not complete fails ([`JobFailure::Rendezvous`]).
    rendezvous_deadline: Instant,
    /// When to log who the rendezvous still waits for.
    next_rendezvous_log: Instant,
    /// Filled at Welcome: index = server id / worker rank.
    servers: Vec<Member>,
    workers: Vec<Member>,
    running: bool,
    placer: Placer,
    /// Tensors placed so far (failed placements included): the default priority's counter.
    placed_count: u64,
    tensors: BTreeMap<String, TensorState>,
    /// Chunk key → (tensor, chunk index) of every placed or placing tensor.
    key_owner: BTreeMap<u64, (String, usize)>,
    /// Barrier id → ranks that entered it.
    barriers: BTreeMap<u64, BTreeSet<u32>>,
    next_heartbeat: Instant,
    actions: VecDeque<Action>,
    done: bool,
}

impl SchedulerState {
    /// A scheduler with no connections; `now` starts the heartbeat clock (the first
    /// scheduler heartbeats go out at the first [`Event::Tick`] at or after `now`).
    pub fn new(cfg: StateConfig, now: Instant) -> SchedulerState {
        let placer = Placer::new(cfg.num_servers, cfg.cut.partition_bytes);
        let rendezvous_deadline = now + cfg.rendezvous_timeout;
        SchedulerState {
            cfg,
            conns: BTreeMap::new(),
            next_seq: 0,
            rendezvous_deadline,
            next_rendezvous_log: now + RENDEZVOUS_LOG_INTERVAL,
            servers: Vec::new(),
            workers: Vec::new(),
            running: false,
            placer,
            placed_count: 0,
            tensors: BTreeMap::new(),
            key_owner: BTreeMap::new(),
            barriers: BTreeMap::new(),
            next_heartbeat: now,
            actions: VecDeque::new(),
            done: false,
        }
    }

    /// The job seed sent in every Welcome.
    pub fn job_seed(&self) -> u64 {
        self.cfg.job_seed
    }

    /// Whether every node registered and was welcomed.
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// How many connections the machine keeps state for: every registered or welcomed node,
    /// connections waiting to register, and refused ones until their transport ends. A
    /// connection that ended is forgotten unless it was a member of the running job.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// Whether the machine keeps state for `conn` (the shell drops what it holds for a
    /// connection the machine forgot).
    pub fn tracks(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn)
    }

    /// Whether the machine emitted [`Action::Finish`].
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The name of the node on `conn` once it was welcomed.
    pub fn node_name(&self, conn: ConnId) -> Option<NodeName> {
        match self.conns.get(&conn)?.phase {
            Phase::Member { role, id } => Some(self.member(role, id).name.clone()),
            _ => None,
        }
    }

    /// Every welcomed node's heartbeat record at `now`, servers then workers, by id.
    pub fn liveness(&self, now: Instant) -> Vec<Liveness> {
        self.servers
            .iter()
            .chain(&self.workers)
            .filter_map(|m| {
                let c = self.conns.get(&m.conn)?;
                Some(Liveness {
                    name: m.name.clone(),
                    silent: now.saturating_duration_since(c.last_heard),
                    missed_heartbeats: c.missed_heartbeats,
                    finished: c.finished,
                    disconnected: c.disconnected,
                })
            })
            .collect()
    }

    /// The next action to execute, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The latest instant at which the shell should deliver an [`Event::Tick`]: the next
    /// scheduler heartbeat or the earliest node timeout. `None` once the job is over.
    pub fn next_timeout(&self) -> Option<Instant> {
        if self.done {
            return None;
        }
        let silent = self
            .conns
            .values()
            .filter(|c| !c.finished && !matches!(c.phase, Phase::Gone))
            .map(|c| c.last_heard + self.cfg.heartbeat_timeout)
            .min();
        let mut t = silent.map_or(self.next_heartbeat, |s| s.min(self.next_heartbeat));
        if !self.running {
            t = t
                .min(self.rendezvous_deadline)
                .min(self.next_rendezvous_log);
        }
        Some(t)
    }

    /// Feeds one event that happened at `now`.
    pub fn handle(&mut self, now: Instant, event: Event) {
        if self.done {
            return;
        }
        match event {
            Event::Connected { conn, addr, grant } => {
                let waiting = self
                    .conns
                    .values()
                    .filter(|c| c.phase == Phase::Connected)
                    .count();
                self.conns.insert(
                    conn,
                    Conn {
                        addr,
                        grant,
                        phase: Phase::Connected,
                        last_heard: now,
                        finished: false,
                        disconnected: false,
                        missed_heartbeats: 0,
                    },
                );
                let cap =
                    2 * (self.cfg.num_servers + self.cfg.num_workers) as usize + SPARE_UNREGISTERED;
                if waiting >= cap {
                    self.refuse(
                        conn,
                        format!(
                            "{waiting} connections are already waiting to register (at most \
                             {cap}); try again"
                        ),
                    );
                }
            }
            Event::Message { conn, msg } => self.on_message(now, conn, msg),
            Event::Disconnected { conn, reason } => self.on_disconnected(conn, reason),
            Event::Blamed { conn, node, reason } => self.on_blamed(conn, node, reason),
            Event::Tick => self.on_tick(now),
        }
    }

    // ---------------------------------------------------------------- helpers

    fn send(&mut self, conn: ConnId, msg: FromScheduler) {
        self.actions.push_back(Action::Send(conn, msg));
    }

    fn member(&self, role: NodeRole, id: u32) -> &Member {
        match role {
            NodeRole::Server => &self.servers[id as usize],
            _ => &self.workers[id as usize],
        }
    }

    fn send_workers(&mut self, ranks: impl IntoIterator<Item = u32>, msg: &FromScheduler) {
        for r in ranks {
            let conn = self.workers[r as usize].conn;
            if !self.conns[&conn].disconnected {
                self.send(conn, msg.clone());
            }
        }
    }

    fn all_ranks(&self) -> std::ops::Range<u32> {
        0..self.cfg.num_workers
    }

    /// Every member's connection that is still up, servers first, except `except`.
    fn live_members(&self, except: Option<ConnId>) -> Vec<ConnId> {
        self.servers
            .iter()
            .chain(&self.workers)
            .map(|m| m.conn)
            .filter(|c| Some(*c) != except && !self.conns[c].disconnected)
            .collect()
    }

    fn finish(&mut self, result: Result<(), JobFailure>) {
        self.actions.push_back(Action::Finish(result));
        self.done = true;
    }

    fn refuse(&mut self, conn: ConnId, reason: String) {
        let addr = self.conns[&conn].addr;
        tracing::warn!(peer = %addr, "registration refused: {reason}");
        self.send(conn, FromScheduler::Refused { reason });
        self.actions.push_back(Action::Close(conn));
        if let Some(c) = self.conns.get_mut(&conn) {
            c.phase = Phase::Gone;
        }
    }

    // --------------------------------------------------------------- messages

    fn on_message(&mut self, now: Instant, conn: ConnId, msg: ToScheduler) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.last_heard = now;
        match (c.phase.clone(), msg) {
            (Phase::Gone, _) => {}
            // Before Register, even a heartbeat is a protocol error (below): a connection
            // cannot linger without registering.
            (Phase::Pending { .. } | Phase::Member { .. }, ToScheduler::Heartbeat) => {}
            (
                Phase::Connected,
                ToScheduler::Register {
                    version,
                    role,
                    requested_id,
                    listen_addr,
                    digest,
                },
            ) => self.on_register(conn, version, role, requested_id, listen_addr, digest),
            (Phase::Connected, other) => self.refuse(
                conn,
                format!(
                    "protocol error: the first message must be Register, got {}",
                    msg_kind(&other)
                ),
            ),
            (Phase::Pending { .. }, other) => {
                let addr = self.conns[&conn].addr;
                tracing::warn!(
                    peer = %addr,
                    "ignoring {} sent before the cluster is complete",
                    msg_kind(&other)
                );
                if let ToScheduler::Declare { name, .. } = other {
                    self.send(
                        conn,
                        FromScheduler::Declared {
                            name,
                            result: Err("declare sent before the cluster is complete".into()),
                        },
                    );
                }
            }
            (Phase::Member { role, id }, msg) => self.on_member_message(role, id, msg),
        }
    }

    fn on_member_message(&mut self, role: NodeRole, id: u32, msg: ToScheduler) {
        match (role, msg) {
            (
                NodeRole::Worker,
                ToScheduler::Declare {
                    name,
                    len,
                    params,
                    priority,
                },
            ) => self.on_declare(
                id,
                name,
                Decl {
                    len,
                    params,
                    priority,
                },
            ),
            (NodeRole::Worker, ToScheduler::Barrier { id: barrier }) => {
                self.on_barrier(id, barrier)
            }
            (NodeRole::Worker, ToScheduler::Finished) => self.on_finished(id),
            (NodeRole::Server, ToScheduler::PlacementAck { name, error }) => {
                self.on_ack(id, name, error)
            }
            (_, msg) => {
                let who = self.member(role, id).name.clone();
                tracing::warn!("{who} sent an unexpected {}; ignored", msg_kind(&msg));
            }
        }
    }

    // ----------------------------------------------------------- registration

    // ---------------------------------------------------------------- declare

    // ---------------------------------------------------------------- barrier

    // ----------------------------------------------------------------- finish

    // ---------------------------------------------------------- loss and time
}

/// The kind of a message, for logs.
fn msg_kind(msg: &ToScheduler) -> &'static str {
    match msg {
        ToScheduler::Register { .. } => "Register",
        ToScheduler::Declare { .. } => "Declare",
        ToScheduler::PlacementAck { .. } => "PlacementAck",
        ToScheduler::Barrier { .. } => "Barrier",
        ToScheduler::Heartbeat => "Heartbeat",
        ToScheduler::Finished => "Finished",
    }
}

mod decl;
mod declare;
mod liveness;
mod register;

use decl::Decl;

#[cfg(test)]
mod tests;
