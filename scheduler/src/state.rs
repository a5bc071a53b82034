//! The scheduler as a pure, deterministic state machine (quinn-proto style).
//!
//! [`SchedulerState`] owns no sockets and reads no clock: the shell ([`crate::Scheduler`])
//! feeds it [`Event`]s together with the current [`Instant`] through
//! [`SchedulerState::handle`], and drains the resulting [`Action`]s with
//! [`SchedulerState::poll_action`]. Every rule of the spine contract lives here, so
//! registration orders, declare mismatches, barriers, lost nodes and the clean finish are
//! tested without a network (see the tests at the bottom of this file).
//!
//! # Life cycle
//! 1. **Registration.** A connection ([`Event::Connected`]) must first send
//!    [`ToScheduler::Register`]. It is refused at once ([`FromScheduler::Refused`], then
//!    [`Action::Close`]) on a protocol version mismatch, a config digest difference (the
//!    reason names the setting and both values), a requested id out of range or already
//!    taken, a server without a dialable listen address (or one another server already
//!    advertises), or a full cluster. Accepted nodes wait (receiving scheduler heartbeats);
//!    when `num_servers` servers and `num_workers` workers are in, requested ids are
//!    honoured, the others filled lowest-free-first in registration order, and every node gets
//!    [`FromScheduler::Welcome`]. A node that disconnects or goes silent *before* that moment
//!    only withdraws its registration (its slot becomes free again): nobody depends on it yet.
//! 2. **Declare** (a collective): once every worker declared a name, lengths and parameter
//!    maps are compared (an error names the tensor, the two ranks and both values), a tensor
//!    of more than [`MAX_CHUNKS_PER_TENSOR`] chunks is refused, the tensor
//!    is placed with the job's one [`Placer`], its chunk keys are checked against every other
//!    tensor's, the placement goes to every server, and once every server acknowledged it the
//!    workers get [`FromScheduler::Declared`]. A placed name declared again is answered at once.
//! 3. **Barriers**: barrier `id` completes when every worker entered it.
//! 4. **Heartbeats**: [`Event::Tick`] sends the scheduler's own heartbeat to every registered
//!    node each interval and declares a welcomed node lost when it has been silent for the
//!    heartbeat timeout; [`Event::Disconnected`] of a welcomed node is a loss too, except for
//!    a worker that already sent `Finished`. A loss sends [`FromScheduler::NodeLost`] and
//!    `Shutdown{error}` to every other node and finishes with [`JobFailure::NodeLost`].
//! 5. **Finish**: when every worker sent `Finished`, every node still connected gets
//!    `Shutdown{error: None}` and the machine finishes with `Ok(())`.
//!
//! A job that could never finish because a worker finished without taking part in a barrier
//! the others wait in ends with [`JobFailure::Stuck`]; a declare that a finished worker never
//! joined fails for the others with a [`FromScheduler::Declared`] error instead.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pushpull_common::config::{ClusterDigest, Config, ParamMap};
use pushpull_common::placement::{num_chunks, Placer};
use pushpull_common::protocol::{
    ClusterMap, FromScheduler, NodeName, NodeRole, TensorPlacement, ToScheduler, PROTOCOL_VERSION,
};

/// Identifies one accepted connection (assigned by the shell, never reused).
pub type ConnId = u64;

/// The most chunks one tensor may have (about 4.3 TB of fp32 at the default 4,096,000-byte
/// partition).
/// A declare beyond it fails naming the tensor: its placement (about 28 bytes per chunk at most)
/// must fit a control frame ([`pushpull_common::protocol::MAX_CONTROL_FRAME`]), and a mistyped
/// length must not make the scheduler build billions of chunks.
pub const MAX_CHUNKS_PER_TENSOR: u64 = 1 << 20;

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
    /// `cluster.partition_bytes`.
    pub partition_bytes: u64,
    /// How often the scheduler sends heartbeats.
    pub heartbeat_interval: Duration,
    /// Silence after which a node is lost.
    pub heartbeat_timeout: Duration,
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
            partition_bytes: config.cluster.partition_bytes,
            heartbeat_interval: config.heartbeat_interval(),
            heartbeat_timeout: config.heartbeat_timeout(),
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
    phase: Phase,
    last_heard: Instant,
    /// Workers: sent `Finished`.
    finished: bool,
    /// The transport reported the connection gone.
    disconnected: bool,
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
        let placer = Placer::new(cfg.num_servers, cfg.partition_bytes);
        SchedulerState {
            cfg,
            conns: BTreeMap::new(),
            next_seq: 0,
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
        Some(silent.map_or(self.next_heartbeat, |s| s.min(self.next_heartbeat)))
    }

    /// Feeds one event that happened at `now`.
    pub fn handle(&mut self, now: Instant, event: Event) {
        if self.done {
            return;
        }
        match event {
            Event::Connected { conn, addr } => {
                self.conns.insert(
                    conn,
                    Conn {
                        addr,
                        phase: Phase::Connected,
                        last_heard: now,
                        finished: false,
                        disconnected: false,
                    },
                );
            }
            Event::Message { conn, msg } => self.on_message(now, conn, msg),
            Event::Disconnected { conn, reason } => self.on_disconnected(conn, reason),
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
            (_, ToScheduler::Heartbeat) => {}
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

    fn on_register(
        &mut self,
        conn: ConnId,
        version: u32,
        role: NodeRole,
        requested: Option<u32>,
        listen: Option<SocketAddr>,
        digest: ClusterDigest,
    ) {
        if version != PROTOCOL_VERSION {
            return self.refuse(
                conn,
                format!(
                    "protocol version mismatch: this node speaks version {version}, the \
                     scheduler speaks version {PROTOCOL_VERSION}"
                ),
            );
        }
        let (count, what, plural, idname) = match role {
            NodeRole::Server => (self.cfg.num_servers, "server", "servers", "server id"),
            NodeRole::Worker => (self.cfg.num_workers, "worker", "workers", "worker rank"),
            NodeRole::Scheduler => {
                return self.refuse(conn, "a scheduler cannot register with a scheduler".into())
            }
        };
        if let Some((key, ours, theirs)) = self.cfg.digest.first_difference(&digest) {
            return self.refuse(
                conn,
                format!(
                    "config mismatch: `{key}` is {ours} on the scheduler but {theirs} on this \
                     {what}"
                ),
            );
        }
        if self.running {
            return self.refuse(
                conn,
                format!(
                    "the cluster is full: all {count} {plural} registered and the job is running"
                ),
            );
        }
        let listen = match role {
            NodeRole::Server => match listen {
                None => {
                    return self.refuse(
                        conn,
                        "a server must send the address workers dial (listen_addr)".into(),
                    )
                }
                Some(a) if a.port() == 0 => {
                    return self.refuse(
                        conn,
                        format!("server listen address {a} has port 0, which workers cannot dial"),
                    )
                }
                Some(a) => Some(a),
            },
            _ => None,
        };
        // Everyone registered with this role so far.
        let pending: Vec<(ConnId, Option<u32>, Option<SocketAddr>)> = self
            .conns
            .iter()
            .filter_map(|(&k, c)| match &c.phase {
                Phase::Pending {
                    role: r,
                    requested,
                    listen,
                    ..
                } if *r == role => Some((k, *requested, *listen)),
                _ => None,
            })
            .collect();
        if let Some(id) = requested {
            if id >= count {
                return self.refuse(
                    conn,
                    format!(
                        "requested {idname} {id} is out of range: the cluster has {count} \
                         {plural} ({idname}s 0..={})",
                        count - 1
                    ),
                );
            }
            if let Some((other, _, _)) = pending.iter().find(|p| p.1 == Some(id)) {
                let other_addr = self.conns[other].addr;
                return self.refuse(
                    conn,
                    format!(
                        "requested {idname} {id} is already taken by the {what} at {other_addr}"
                    ),
                );
            }
        }
        if pending.len() as u32 >= count {
            return self.refuse(
                conn,
                format!("the cluster is full: {count} of {count} {plural} have already registered"),
            );
        }
        if let Some(a) = listen {
            if let Some((other, _, _)) = pending.iter().find(|p| p.2 == Some(a)) {
                let other_addr = self.conns[other].addr;
                return self.refuse(
                    conn,
                    format!(
                        "server listen address {a} is already advertised by the server \
                         registered from {other_addr}"
                    ),
                );
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let c = self.conns.get_mut(&conn).expect("registering connection");
        c.phase = Phase::Pending {
            role,
            requested,
            listen,
            seq,
        };
        tracing::info!(
            peer = %c.addr,
            "{what} registered ({} of {count}{})",
            pending.len() + 1,
            requested.map_or(String::new(), |id| format!(", requested {idname} {id}"))
        );
        self.maybe_start();
    }

    /// Assigns ids: requested ones honoured, the rest lowest-free-first in registration order.
    fn assign(&self, role: NodeRole, count: u32) -> Vec<ConnId> {
        let mut regs: Vec<(u64, ConnId, Option<u32>)> = self
            .conns
            .iter()
            .filter_map(|(&k, c)| match &c.phase {
                Phase::Pending {
                    role: r,
                    requested,
                    seq,
                    ..
                } if *r == role => Some((*seq, k, *requested)),
                _ => None,
            })
            .collect();
        regs.sort();
        let mut slots: Vec<Option<ConnId>> = vec![None; count as usize];
        for &(_, k, req) in &regs {
            if let Some(id) = req {
                slots[id as usize] = Some(k);
            }
        }
        let mut free = (0..count as usize)
            .filter(|&i| slots[i].is_none())
            .collect::<Vec<_>>();
        free.reverse();
        for &(_, k, req) in &regs {
            if req.is_none() {
                let i = free.pop().expect("as many registrations as slots");
                slots[i] = Some(k);
            }
        }
        slots
            .into_iter()
            .map(|s| s.expect("every slot filled"))
            .collect()
    }

    fn maybe_start(&mut self) {
        let count = |role| {
            self.conns
                .values()
                .filter(|c| matches!(&c.phase, Phase::Pending { role: r, .. } if *r == role))
                .count() as u32
        };
        if count(NodeRole::Server) < self.cfg.num_servers
            || count(NodeRole::Worker) < self.cfg.num_workers
        {
            return;
        }
        let servers = self.assign(NodeRole::Server, self.cfg.num_servers);
        let workers = self.assign(NodeRole::Worker, self.cfg.num_workers);
        let mut server_addrs = Vec::new();
        for (id, &conn) in servers.iter().enumerate() {
            let Phase::Pending { listen, .. } = &self.conns[&conn].phase else {
                unreachable!("assigned a pending server")
            };
            let addr = listen.expect("servers register with a listen address");
            server_addrs.push(addr);
            self.servers.push(Member {
                conn,
                name: NodeName {
                    role: NodeRole::Server,
                    id: id as u32,
                    addr,
                },
            });
        }
        let mut worker_addrs = Vec::new();
        for (rank, &conn) in workers.iter().enumerate() {
            let addr = self.conns[&conn].addr;
            worker_addrs.push(addr);
            self.workers.push(Member {
                conn,
                name: NodeName {
                    role: NodeRole::Worker,
                    id: rank as u32,
                    addr,
                },
            });
        }
        let map = ClusterMap {
            servers: server_addrs,
            workers: worker_addrs,
            job_seed: self.cfg.job_seed,
        };
        for (role, list) in [(NodeRole::Server, servers), (NodeRole::Worker, workers)] {
            for (id, conn) in list.into_iter().enumerate() {
                let id = id as u32;
                self.conns.get_mut(&conn).expect("member").phase = Phase::Member { role, id };
                self.send(
                    conn,
                    FromScheduler::Welcome {
                        id,
                        map: map.clone(),
                    },
                );
            }
        }
        self.running = true;
        tracing::info!(
            servers = ?map.servers,
            workers = ?map.workers,
            job_seed = map.job_seed,
            "cluster complete: {} servers, {} workers welcomed",
            self.cfg.num_servers,
            self.cfg.num_workers
        );
    }

    // ---------------------------------------------------------------- declare

    fn on_declare(&mut self, rank: u32, name: String, decl: Decl) {
        match self.tensors.get_mut(&name) {
            Some(TensorState::Placed(p, requested)) => {
                let result = match Decl::of_placement(p, *requested).diff(&decl) {
                    None => Ok(p.clone()),
                    Some(d) => Err(describe(
                        &name,
                        "it is already declared with",
                        &format!("worker {rank} declared"),
                        &d,
                    )),
                };
                return self.send_workers([rank], &FromScheduler::Declared { name, result });
            }
            Some(TensorState::Placing {
                placement,
                requested,
                waiting,
                ..
            }) => {
                match Decl::of_placement(placement, *requested).diff(&decl) {
                    None => {
                        waiting.insert(rank);
                    }
                    Some(d) => {
                        let result = Err(describe(
                            &name,
                            "it is already declared with",
                            &format!("worker {rank} declared"),
                            &d,
                        ));
                        self.send_workers([rank], &FromScheduler::Declared { name, result });
                    }
                }
                return;
            }
            Some(TensorState::Collecting(decls)) => {
                if let Some(first) = decls.get(&rank) {
                    if let Some(d) = first.diff(&decl) {
                        let result = Err(format!(
                            "{} (declared twice before every worker declared it)",
                            describe(&name, &format!("worker {rank} first declared"), "then", &d)
                        ));
                        self.send_workers([rank], &FromScheduler::Declared { name, result });
                    }
                    return;
                }
                decls.insert(rank, decl);
            }
            None => {
                self.tensors.insert(
                    name.clone(),
                    TensorState::Collecting(BTreeMap::from([(rank, decl)])),
                );
            }
        }
        // A worker that already finished will never declare it.
        if let Some(f) = self.finished_without(|_, r| {
            matches!(self.tensors.get(&name), Some(TensorState::Collecting(d)) if d.contains_key(&r))
        }) {
            let Some(TensorState::Collecting(decls)) = self.tensors.remove(&name) else {
                unreachable!()
            };
            let msg = FromScheduler::Declared {
                result: Err(format!(
                    "tensor {name:?}: worker {f} finished without declaring it"
                )),
                name,
            };
            return self.send_workers(decls.into_keys(), &msg);
        }
        let complete = matches!(self.tensors.get(&name),
            Some(TensorState::Collecting(d)) if d.len() as u32 == self.cfg.num_workers);
        if complete {
            self.collective_complete(name);
        }
    }

    /// The lowest finished worker rank for which `took_part(self, rank)` is false.
    fn finished_without(&self, took_part: impl Fn(&Self, u32) -> bool) -> Option<u32> {
        self.all_ranks()
            .find(|&r| self.conns[&self.workers[r as usize].conn].finished && !took_part(self, r))
    }

    fn collective_complete(&mut self, name: String) {
        let Some(TensorState::Collecting(decls)) = self.tensors.remove(&name) else {
            unreachable!("collective_complete on a collecting tensor")
        };
        let (&r0, decl0) = decls.iter().next().expect("at least one declaration");
        let first = decls.iter().find_map(|(&r, decl)| {
            decl0.diff(decl).map(|d| {
                describe(
                    &name,
                    &format!("worker {r0} declared"),
                    &format!("worker {r} declared"),
                    &d,
                )
            })
        });
        if let Some(msg) = first {
            tracing::warn!("declare failed: {msg}");
            let msg = FromScheduler::Declared {
                name,
                result: Err(msg),
            };
            return self.send_workers(self.all_ranks(), &msg);
        }
        let Decl {
            len,
            params,
            priority,
        } = decl0.clone();
        let chunks = num_chunks(len, self.cfg.partition_bytes);
        if chunks > MAX_CHUNKS_PER_TENSOR {
            let msg = format!(
                "tensor {name:?}: {len} elements make {chunks} chunks of at most {} bytes, more \
                 than the limit of {MAX_CHUNKS_PER_TENSOR} chunks per tensor (split the tensor \
                 or raise cluster.partition_bytes)",
                self.cfg.partition_bytes
            );
            tracing::warn!("declare failed: {msg}");
            let msg = FromScheduler::Declared {
                name,
                result: Err(msg),
            };
            return self.send_workers(self.all_ranks(), &msg);
        }
        let mut trial = self.placer.clone();
        let mut placement = trial.place(&name, len, params);
        // The default: declaration order, earliest first.
        placement.priority = priority.unwrap_or_else(|| {
            i32::try_from(self.placed_count)
                .map(|n| -n)
                .unwrap_or(-i32::MAX)
        });
        if let Some(msg) = self.collision(&placement) {
            tracing::warn!("declare failed: {msg}");
            let msg = FromScheduler::Declared {
                name,
                result: Err(msg),
            };
            return self.send_workers(self.all_ranks(), &msg);
        }
        self.placer = trial;
        self.placed_count += 1;
        for (i, c) in placement.chunks.iter().enumerate() {
            self.key_owner.insert(c.key, (name.clone(), i));
        }
        tracing::info!(
            "tensor {name:?} declared: {} elements in {} chunks; asking {} servers to set it up",
            placement.len,
            placement.chunks.len(),
            self.cfg.num_servers
        );
        for s in 0..self.servers.len() {
            let conn = self.servers[s].conn;
            self.send(conn, FromScheduler::Placement(placement.clone()));
        }
        self.tensors.insert(
            name,
            TensorState::Placing {
                placement,
                requested: priority,
                acked: BTreeSet::new(),
                error: None,
                waiting: self.all_ranks().collect(),
            },
        );
    }

    /// An error naming both tensors if a chunk key of `p` is already used.
    fn collision(&self, p: &TensorPlacement) -> Option<String> {
        let mut own: BTreeMap<u64, usize> = BTreeMap::new();
        for (i, c) in p.chunks.iter().enumerate() {
            if let Some((other, j)) = self.key_owner.get(&c.key) {
                return Some(format!(
                    "tensor {:?}: chunk {i} has key {:#018x}, which chunk {j} of tensor {other:?} \
                     already uses; rename one of the tensors",
                    p.name, c.key
                ));
            }
            if let Some(j) = own.insert(c.key, i) {
                return Some(format!(
                    "tensor {:?}: chunks {j} and {i} have the same key {:#018x}; rename the tensor",
                    p.name, c.key
                ));
            }
        }
        None
    }

    fn on_ack(&mut self, server: u32, name: String, error: Option<String>) {
        let who = self.servers[server as usize].name.clone();
        let Some(TensorState::Placing {
            acked,
            error: first_error,
            ..
        }) = self.tensors.get_mut(&name)
        else {
            tracing::warn!(
                "{who} acknowledged tensor {name:?}, which is not being placed; ignored"
            );
            return;
        };
        acked.insert(server);
        if let (Some(e), None) = (error, &first_error) {
            tracing::warn!("{who} refused tensor {name:?}: {e}");
            *first_error = Some(format!("tensor {name:?}: {who} refused it: {e}"));
        }
        if acked.len() as u32 != self.cfg.num_servers {
            return;
        }
        let Some(TensorState::Placing {
            placement,
            requested,
            error,
            waiting,
            ..
        }) = self.tensors.remove(&name)
        else {
            unreachable!()
        };
        let result = match error {
            None => {
                self.tensors.insert(
                    name.clone(),
                    TensorState::Placed(placement.clone(), requested),
                );
                Ok(placement)
            }
            Some(e) => {
                for c in &placement.chunks {
                    self.key_owner.remove(&c.key);
                }
                Err(e)
            }
        };
        self.send_workers(waiting, &FromScheduler::Declared { name, result });
    }

    // ---------------------------------------------------------------- barrier

    fn on_barrier(&mut self, rank: u32, id: u64) {
        self.barriers.entry(id).or_default().insert(rank);
        if self.barriers[&id].len() as u32 == self.cfg.num_workers {
            self.barriers.remove(&id);
            return self.send_workers(self.all_ranks(), &FromScheduler::BarrierDone { id });
        }
        self.check_stuck_barriers();
    }

    /// Fails the job if a pending barrier lacks a worker that already finished.
    fn check_stuck_barriers(&mut self) {
        let stuck = self.barriers.iter().find_map(|(&id, ranks)| {
            self.finished_without(|_, r| ranks.contains(&r))
                .map(|f| (id, ranks.iter().next().copied().unwrap_or(0), f))
        });
        if let Some((id, waiter, f)) = stuck {
            let msg = format!(
                "barrier {id} can never complete: worker {f} finished without entering it while \
                 worker {waiter} waits in it"
            );
            tracing::warn!("{msg}");
            for conn in self.live_members(None) {
                self.send(
                    conn,
                    FromScheduler::Shutdown {
                        error: Some(msg.clone()),
                    },
                );
            }
            self.finish(Err(JobFailure::Stuck(msg)));
        }
    }

    // ----------------------------------------------------------------- finish

    fn on_finished(&mut self, rank: u32) {
        let conn = self.workers[rank as usize].conn;
        let c = self.conns.get_mut(&conn).expect("member connection");
        if c.finished {
            return;
        }
        c.finished = true;
        tracing::info!("{} finished", self.workers[rank as usize].name);
        // Declares this worker will never join fail for the others.
        let orphaned: Vec<String> = self
            .tensors
            .iter()
            .filter_map(|(n, t)| match t {
                TensorState::Collecting(d) if !d.contains_key(&rank) => Some(n.clone()),
                _ => None,
            })
            .collect();
        for name in orphaned {
            let Some(TensorState::Collecting(decls)) = self.tensors.remove(&name) else {
                unreachable!()
            };
            let msg = FromScheduler::Declared {
                result: Err(format!(
                    "tensor {name:?}: worker {rank} finished without declaring it"
                )),
                name,
            };
            self.send_workers(decls.into_keys(), &msg);
        }
        self.check_stuck_barriers();
        if self.done {
            return;
        }
        let all = self.workers.iter().all(|w| self.conns[&w.conn].finished);
        if all {
            tracing::info!("every worker finished; telling every node to shut down");
            for conn in self.live_members(None) {
                self.send(conn, FromScheduler::Shutdown { error: None });
            }
            self.finish(Ok(()));
        }
    }

    // ---------------------------------------------------------- loss and time

    fn on_disconnected(&mut self, conn: ConnId, reason: String) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.disconnected = true;
        match c.phase.clone() {
            Phase::Member { role, id } => {
                if !c.finished {
                    self.lose(role, id, format!("connection lost: {reason}"));
                }
            }
            Phase::Pending { role, .. } => {
                tracing::warn!(
                    peer = %c.addr,
                    "{role} left before the cluster was complete ({reason}); its slot is free again"
                );
                c.phase = Phase::Gone;
            }
            Phase::Connected | Phase::Gone => c.phase = Phase::Gone,
        }
    }

    fn on_tick(&mut self, now: Instant) {
        if now >= self.next_heartbeat {
            let targets: Vec<ConnId> = self
                .conns
                .iter()
                .filter(|(_, c)| {
                    !c.disconnected
                        && matches!(c.phase, Phase::Pending { .. } | Phase::Member { .. })
                })
                .map(|(&k, _)| k)
                .collect();
            for conn in targets {
                self.send(conn, FromScheduler::Heartbeat);
            }
            self.next_heartbeat = now + self.cfg.heartbeat_interval;
        }
        let timeout = self.cfg.heartbeat_timeout;
        let silent: Vec<(ConnId, Duration)> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                !c.finished && !matches!(c.phase, Phase::Gone) && now >= c.last_heard + timeout
            })
            .map(|(&k, c)| (k, now - c.last_heard))
            .collect();
        for (conn, quiet) in silent {
            if self.done {
                return;
            }
            let c = self.conns.get_mut(&conn).expect("silent connection");
            let reason = format!(
                "no heartbeat for {:.1} s (timeout {:.1} s)",
                quiet.as_secs_f64(),
                timeout.as_secs_f64()
            );
            match c.phase.clone() {
                Phase::Member { role, id } => self.lose(role, id, reason),
                Phase::Pending { role, .. } => {
                    tracing::warn!(
                        peer = %c.addr,
                        "{role} dropped before the cluster was complete: {reason}; its slot is \
                         free again"
                    );
                    c.phase = Phase::Gone;
                    let reason = format!(
                        "dropped while waiting for the rest of the cluster: {reason} (a waiting \
                         node must keep sending heartbeats)"
                    );
                    self.send(conn, FromScheduler::Refused { reason });
                    self.actions.push_back(Action::Close(conn));
                }
                Phase::Connected => {
                    tracing::warn!(peer = %c.addr, "connection never registered: {reason}");
                    c.phase = Phase::Gone;
                    let reason = format!("no Register message: {reason}");
                    self.send(conn, FromScheduler::Refused { reason });
                    self.actions.push_back(Action::Close(conn));
                }
                Phase::Gone => {}
            }
        }
    }

    fn lose(&mut self, role: NodeRole, id: u32, reason: String) {
        let m = self.member(role, id).clone();
        tracing::warn!("{} lost: {reason}; shutting the job down", m.name);
        let lost = FromScheduler::NodeLost {
            node: m.name.clone(),
            reason: reason.clone(),
        };
        let shutdown = FromScheduler::Shutdown {
            error: Some(format!("{} lost: {reason}", m.name)),
        };
        let others = self.live_members(Some(m.conn));
        for &conn in &others {
            self.send(conn, lost.clone());
        }
        for &conn in &others {
            self.send(conn, shutdown.clone());
        }
        // The lost node itself, if it can still hear us, learns why the job ended.
        if !self.conns[&m.conn].disconnected {
            self.send(m.conn, shutdown);
        }
        self.finish(Err(JobFailure::NodeLost {
            node: m.name,
            reason,
        }));
    }
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

/// What one worker's declare asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Decl {
    len: u64,
    params: ParamMap,
    /// `None`: the default (declaration order).
    priority: Option<i32>,
}

impl Decl {
    /// The declaration that produced `p`, with the priority it asked for.
    fn of_placement(p: &TensorPlacement, requested: Option<i32>) -> Decl {
        Decl {
            len: p.len,
            params: p.params.clone(),
            priority: requested,
        }
    }

    /// The first difference from `other` (length, then parameters in key order, then the
    /// priority); `None` if they agree.
    fn diff(&self, other: &Decl) -> Option<Diff> {
        if self.len != other.len {
            return Some(Diff::Len(self.len, other.len));
        }
        let keys: BTreeSet<&String> = self.params.keys().chain(other.params.keys()).collect();
        let param = keys.into_iter().find_map(|k| {
            let (a, b) = (self.params.get(k), other.params.get(k));
            (a != b).then(|| Diff::Param(k.clone(), a.cloned(), b.cloned()))
        });
        param.or_else(|| {
            (self.priority != other.priority)
                .then_some(Diff::Priority(self.priority, other.priority))
        })
    }
}

/// How two declarations of one tensor differ.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Diff {
    /// Element counts.
    Len(u64, u64),
    /// A parameter (absent = `None`).
    Param(String, Option<String>, Option<String>),
    /// The requested priority (`None`: the default).
    Priority(Option<i32>, Option<i32>),
}

/// Describes a difference of tensor `name`: `a` and `b` say who declared what, e.g.
/// `tensor "fc1.weight": worker 0 declared 1000 elements, worker 1 declared 999`.
fn describe(name: &str, a: &str, b: &str, d: &Diff) -> String {
    match d {
        Diff::Len(la, lb) => format!("tensor {name:?}: {a} {la} elements, {b} {lb}"),
        Diff::Param(k, va, vb) => format!(
            "tensor {name:?}: {a} parameter {k} = {}, {b} {k} = {}",
            Shown(va.as_ref()),
            Shown(vb.as_ref())
        ),
        Diff::Priority(pa, pb) => {
            let shown = |p: &Option<i32>| p.map_or("(default)".to_string(), |p| p.to_string());
            format!(
                "tensor {name:?}: {a} priority {}, {b} priority {}",
                shown(pa),
                shown(pb)
            )
        }
    }
}

/// A parameter value for messages: quoted, or `(unset)`.
struct Shown<'a>(Option<&'a String>);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(v) => write!(f, "{v:?}"),
            None => f.write_str("(unset)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pushpull_common::placement::chunk_key;
    use pushpull_common::protocol::ChunkPlacement;

    const SEED: u64 = 42;

    /// A scheduler state with a fake clock and helpers to play nodes.
    struct H {
        s: SchedulerState,
        now: Instant,
        cfg: Config,
    }

    fn waddr(conn: ConnId) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, conn as u8], 1000 + conn as u16))
    }
    fn saddr(conn: ConnId) -> SocketAddr {
        SocketAddr::from(([10, 1, 0, conn as u8], 7000 + conn as u16))
    }

    impl H {
        fn new(workers: u32, servers: u32) -> H {
            let mut cfg = Config::local(workers, servers);
            cfg.cluster.partition_bytes = 400; // 100 elements per chunk
            let now = Instant::now();
            H {
                s: SchedulerState::new(StateConfig::from_config(&cfg, SEED), now),
                now,
                cfg,
            }
        }
        fn ev(&mut self, e: Event) {
            self.s.handle(self.now, e);
        }
        fn msg(&mut self, conn: ConnId, msg: ToScheduler) {
            self.ev(Event::Message { conn, msg });
        }
        fn register(&mut self, conn: ConnId, role: NodeRole, requested: Option<u32>) {
            let digest = self.cfg.digest();
            self.register_with(conn, role, requested, digest);
        }
        fn register_with(
            &mut self,
            conn: ConnId,
            role: NodeRole,
            requested: Option<u32>,
            digest: ClusterDigest,
        ) {
            self.ev(Event::Connected {
                conn,
                addr: waddr(conn),
            });
            let listen_addr = (role == NodeRole::Server).then(|| saddr(conn));
            self.msg(
                conn,
                ToScheduler::Register {
                    version: PROTOCOL_VERSION,
                    role,
                    requested_id: requested,
                    listen_addr,
                    digest,
                },
            );
        }
        fn advance(&mut self, ms: u64) {
            self.now += Duration::from_millis(ms);
            self.ev(Event::Tick);
        }
        fn take(&mut self) -> Vec<Action> {
            std::iter::from_fn(|| self.s.poll_action()).collect()
        }
        /// Registers servers on conns 100.. and workers on conns 0.., returns the conn of
        /// every server id and worker rank.
        fn start(workers: u32, servers: u32) -> (H, Vec<ConnId>, Vec<ConnId>) {
            let mut h = H::new(workers, servers);
            for s in 0..servers {
                h.register(100 + s as ConnId, NodeRole::Server, None);
            }
            for w in 0..workers {
                h.register(w as ConnId, NodeRole::Worker, None);
            }
            let acts = h.take();
            let ids = welcomes(&acts);
            let mut srv = vec![0; servers as usize];
            let mut wrk = vec![0; workers as usize];
            for (conn, id) in ids {
                if conn >= 100 {
                    srv[id as usize] = conn;
                } else {
                    wrk[id as usize] = conn;
                }
            }
            (h, srv, wrk)
        }
        fn declare(&mut self, conn: ConnId, name: &str, len: u64, params: &[(&str, &str)]) {
            self.declare_with_priority(conn, name, len, params, None)
        }
        fn declare_with_priority(
            &mut self,
            conn: ConnId,
            name: &str,
            len: u64,
            params: &[(&str, &str)],
            priority: Option<i32>,
        ) {
            let params = params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            self.msg(
                conn,
                ToScheduler::Declare {
                    name: name.into(),
                    len,
                    params,
                    priority,
                },
            );
        }
        fn ack(&mut self, conn: ConnId, name: &str, error: Option<&str>) {
            self.msg(
                conn,
                ToScheduler::PlacementAck {
                    name: name.into(),
                    error: error.map(String::from),
                },
            );
        }
        fn heartbeat_all_but(&mut self, conns: &[ConnId], silent: ConnId) {
            for &c in conns {
                if c != silent {
                    self.msg(c, ToScheduler::Heartbeat);
                }
            }
        }
    }

    /// Non-heartbeat messages sent to `conn`.
    fn to(acts: &[Action], conn: ConnId) -> Vec<FromScheduler> {
        acts.iter()
            .filter_map(|a| match a {
                Action::Send(c, m) if *c == conn && *m != FromScheduler::Heartbeat => {
                    Some(m.clone())
                }
                _ => None,
            })
            .collect()
    }

    /// (conn, id) of every Welcome.
    fn welcomes(acts: &[Action]) -> Vec<(ConnId, u32)> {
        acts.iter()
            .filter_map(|a| match a {
                Action::Send(c, FromScheduler::Welcome { id, .. }) => Some((*c, *id)),
                _ => None,
            })
            .collect()
    }

    fn refusal(acts: &[Action], conn: ConnId) -> String {
        assert!(acts.contains(&Action::Close(conn)), "{acts:?}");
        match to(acts, conn).as_slice() {
            [FromScheduler::Refused { reason }] => reason.clone(),
            other => panic!("expected one refusal, got {other:?}"),
        }
    }

    fn declared(acts: &[Action], conn: ConnId) -> Vec<(String, Result<TensorPlacement, String>)> {
        to(acts, conn)
            .into_iter()
            .filter_map(|m| match m {
                FromScheduler::Declared { name, result } => Some((name, result)),
                _ => None,
            })
            .collect()
    }

    fn placements(acts: &[Action], conn: ConnId) -> Vec<TensorPlacement> {
        to(acts, conn)
            .into_iter()
            .filter_map(|m| match m {
                FromScheduler::Placement(p) => Some(p),
                _ => None,
            })
            .collect()
    }

    fn finish_of(acts: &[Action]) -> Option<Result<(), JobFailure>> {
        acts.iter().find_map(|a| match a {
            Action::Finish(r) => Some(r.clone()),
            _ => None,
        })
    }

    // ----------------------------------------------------------- registration

    #[test]
    fn everyone_is_welcomed_once_the_cluster_is_complete_in_any_order() {
        // (conn, role) in several registration orders.
        let nodes: Vec<(ConnId, NodeRole)> = vec![
            (100, NodeRole::Server),
            (101, NodeRole::Server),
            (0, NodeRole::Worker),
            (1, NodeRole::Worker),
            (2, NodeRole::Worker),
        ];
        let orders: [[usize; 5]; 4] = [
            [0, 1, 2, 3, 4],
            [4, 3, 2, 1, 0],
            [2, 0, 3, 1, 4],
            [3, 4, 1, 2, 0],
        ];
        for order in orders {
            let mut h = H::new(3, 2);
            for (i, &n) in order.iter().enumerate() {
                let (conn, role) = nodes[n];
                h.register(conn, role, None);
                let acts = h.take();
                if i < 4 {
                    assert!(welcomes(&acts).is_empty(), "welcome before everyone is in");
                    assert!(!h.s.is_running());
                } else {
                    let w = welcomes(&acts);
                    assert_eq!(w.len(), 5);
                    assert!(h.s.is_running());
                    // One map for everyone; server ids and ranks fill 0..n.
                    let maps: Vec<&ClusterMap> = acts
                        .iter()
                        .filter_map(|a| match a {
                            Action::Send(_, FromScheduler::Welcome { map, .. }) => Some(map),
                            _ => None,
                        })
                        .collect();
                    assert!(maps.windows(2).all(|p| p[0] == p[1]));
                    let map = maps[0];
                    assert_eq!(map.job_seed, SEED);
                    assert_eq!(map.servers.len(), 2);
                    assert_eq!(map.workers.len(), 3);
                    for (conn, id) in w {
                        if conn >= 100 {
                            assert_eq!(map.servers[id as usize], saddr(conn));
                            assert_eq!(h.s.node_name(conn).unwrap().role, NodeRole::Server);
                        } else {
                            assert_eq!(map.workers[id as usize], waddr(conn));
                            assert_eq!(
                                h.s.node_name(conn).unwrap().to_string(),
                                format!("worker {id} ({})", waddr(conn))
                            );
                        }
                    }
                    // Free ids go lowest-first in registration order.
                    let workers_in_order: Vec<ConnId> = order
                        .iter()
                        .map(|&n| nodes[n])
                        .filter(|n| n.1 == NodeRole::Worker)
                        .map(|n| n.0)
                        .collect();
                    for (rank, conn) in workers_in_order.iter().enumerate() {
                        assert_eq!(map.workers[rank], waddr(*conn));
                    }
                }
            }
        }
    }

    #[test]
    fn requested_ids_are_honoured_and_the_rest_filled_lowest_first() {
        let mut h = H::new(3, 2);
        h.register(0, NodeRole::Worker, Some(2));
        h.register(1, NodeRole::Worker, None);
        h.register(100, NodeRole::Server, Some(1));
        h.register(101, NodeRole::Server, None);
        h.register(2, NodeRole::Worker, Some(0));
        let mut w = welcomes(&h.take());
        w.sort();
        assert_eq!(w, vec![(0, 2), (1, 1), (2, 0), (100, 1), (101, 0)]);
    }

    #[test]
    fn taken_out_of_range_and_surplus_ids_are_refused_by_name() {
        let mut h = H::new(2, 1);
        h.register(0, NodeRole::Worker, Some(1));
        assert!(h.take().is_empty());
        h.register(1, NodeRole::Worker, Some(1));
        let r = refusal(&h.take(), 1);
        assert!(
            r.contains("worker rank 1")
                && r.contains("already taken")
                && r.contains(&waddr(0).to_string()),
            "{r}"
        );
        h.register(2, NodeRole::Worker, Some(2));
        let r = refusal(&h.take(), 2);
        assert!(
            r.contains("worker rank 2 is out of range") && r.contains("0..=1"),
            "{r}"
        );
        h.register(103, NodeRole::Server, Some(5));
        let r = refusal(&h.take(), 103);
        assert!(r.contains("server id 5 is out of range"), "{r}");
        h.register(3, NodeRole::Worker, None);
        assert!(h.take().is_empty());
        h.register(4, NodeRole::Worker, None);
        let r = refusal(&h.take(), 4);
        assert!(
            r.contains("cluster is full") && r.contains("2 of 2 workers"),
            "{r}"
        );
        // The refused connections are ignored from now on.
        h.msg(4, ToScheduler::Finished);
        assert!(h.take().is_empty());
        h.register(100, NodeRole::Server, None);
        assert_eq!(welcomes(&h.take()).len(), 3);
        // Too late: the job is running.
        h.register(5, NodeRole::Worker, None);
        let r = refusal(&h.take(), 5);
        assert!(
            r.contains("cluster is full") && r.contains("job is running"),
            "{r}"
        );
        h.register(104, NodeRole::Server, None);
        let r = refusal(&h.take(), 104);
        assert!(r.contains("all 1 servers"), "{r}");
    }

    #[test]
    fn digest_and_version_mismatches_name_the_setting_and_both_values() {
        let mut h = H::new(1, 1);
        let mut other = h.cfg.clone();
        other.cluster.partition_bytes = 1024;
        h.register_with(0, NodeRole::Worker, None, other.digest());
        let r = refusal(&h.take(), 0);
        assert!(
            r.contains("cluster.partition_bytes")
                && r.contains("400")
                && r.contains("1024")
                && r.contains("worker"),
            "{r}"
        );
        let mut other = h.cfg.clone();
        other.cluster.seed = Some(7);
        h.register_with(1, NodeRole::Server, None, other.digest());
        let r = refusal(&h.take(), 1);
        assert!(
            r.contains("cluster.seed") && r.contains("None") && r.contains("Some(7)"),
            "{r}"
        );

        h.ev(Event::Connected {
            conn: 2,
            addr: waddr(2),
        });
        let digest = h.cfg.digest();
        h.msg(
            2,
            ToScheduler::Register {
                version: PROTOCOL_VERSION + 1,
                role: NodeRole::Worker,
                requested_id: None,
                listen_addr: None,
                digest,
            },
        );
        let r = refusal(&h.take(), 2);
        let (theirs, ours) = (PROTOCOL_VERSION + 1, PROTOCOL_VERSION);
        assert!(
            r.contains(&format!("version {theirs}")) && r.contains(&format!("version {ours}")),
            "{r}"
        );
        // A node whose first message is not Register.
        h.ev(Event::Connected {
            conn: 3,
            addr: waddr(3),
        });
        h.msg(3, ToScheduler::Barrier { id: 0 });
        let r = refusal(&h.take(), 3);
        assert!(
            r.contains("first message must be Register") && r.contains("Barrier"),
            "{r}"
        );
    }

    #[test]
    fn servers_must_advertise_a_distinct_dialable_address() {
        let mut h = H::new(1, 2);
        let digest = h.cfg.digest();
        for (conn, listen) in [
            (100, None),
            (101, Some(SocketAddr::from(([10, 1, 0, 1], 0)))),
        ] {
            h.ev(Event::Connected {
                conn,
                addr: waddr(conn),
            });
            h.msg(
                conn,
                ToScheduler::Register {
                    version: PROTOCOL_VERSION,
                    role: NodeRole::Server,
                    requested_id: None,
                    listen_addr: listen,
                    digest: digest.clone(),
                },
            );
        }
        let acts = h.take();
        assert!(refusal(&acts, 100).contains("listen_addr"));
        assert!(refusal(&acts, 101).contains("port 0"));
        h.register(102, NodeRole::Server, None);
        h.ev(Event::Connected {
            conn: 103,
            addr: waddr(103),
        });
        h.msg(
            103,
            ToScheduler::Register {
                version: PROTOCOL_VERSION,
                role: NodeRole::Server,
                requested_id: None,
                listen_addr: Some(saddr(102)),
                digest,
            },
        );
        let r = refusal(&h.take(), 103);
        assert!(
            r.contains("already advertised") && r.contains(&saddr(102).to_string()),
            "{r}"
        );
    }

    #[test]
    fn a_node_leaving_before_the_start_frees_its_slot() {
        let mut h = H::new(2, 1);
        h.register(0, NodeRole::Worker, Some(0));
        h.ev(Event::Disconnected {
            conn: 0,
            reason: "gone".into(),
        });
        h.register(1, NodeRole::Worker, Some(0));
        h.register(2, NodeRole::Worker, None);
        h.register(100, NodeRole::Server, None);
        let acts = h.take();
        assert!(finish_of(&acts).is_none());
        let mut w = welcomes(&acts);
        w.sort();
        assert_eq!(w, vec![(1, 0), (2, 1), (100, 0)]);
    }

    #[test]
    fn silent_registrations_and_unregistered_connections_are_dropped_before_the_start() {
        let mut h = H::new(2, 1);
        h.register(0, NodeRole::Worker, Some(1));
        h.ev(Event::Connected {
            conn: 1,
            addr: waddr(1),
        });
        h.advance(5_000);
        // Both still alive; the registered one gets the scheduler's heartbeats.
        let acts = h.take();
        assert!(acts.contains(&Action::Send(0, FromScheduler::Heartbeat)));
        assert!(!acts.iter().any(|a| matches!(a, Action::Send(1, _))));
        h.advance(5_000);
        let acts = h.take();
        let r = refusal(&acts, 0);
        assert!(
            r.contains("no heartbeat for 10.0 s") && r.contains("waiting for the rest"),
            "{r}"
        );
        let r = refusal(&acts, 1);
        assert!(r.contains("no Register message"), "{r}");
        assert!(finish_of(&acts).is_none());
        // Rank 1 is free again.
        h.register(2, NodeRole::Worker, Some(1));
        h.register(3, NodeRole::Worker, None);
        h.register(100, NodeRole::Server, None);
        let mut w = welcomes(&h.take());
        w.sort();
        assert_eq!(w, vec![(2, 1), (3, 0), (100, 0)]);
    }

    // ---------------------------------------------------------------- declare

    #[test]
    fn declares_in_different_orders_are_placed_once_every_server_acked() {
        let (mut h, srv, wrk) = H::start(2, 2);
        h.declare(wrk[0], "a", 250, &[("compressor", "onebit")]);
        h.declare(wrk[0], "b", 50, &[]);
        assert!(h.take().is_empty());
        h.declare(wrk[1], "b", 50, &[]);
        let acts = h.take();
        for &s in &srv {
            let p = placements(&acts, s);
            assert_eq!(p.len(), 1);
            assert_eq!(p[0].name, "b");
        }
        assert!(
            declared(&acts, wrk[0]).is_empty(),
            "declared before the acks"
        );
        h.declare(wrk[1], "a", 250, &[("compressor", "onebit")]);
        let acts = h.take();
        let pa = placements(&acts, srv[0]).remove(0);
        assert_eq!(placements(&acts, srv[1]), vec![pa.clone()]);
        assert_eq!(pa.chunks.len(), 3); // 250 elements, 100 per chunk
        assert_eq!(
            pa.chunks.iter().map(|c| c.len).collect::<Vec<_>>(),
            vec![84, 83, 83]
        );
        assert_eq!(pa.params["compressor"], "onebit");
        for (i, c) in pa.chunks.iter().enumerate() {
            assert_eq!(c.key, chunk_key("a", i as u64));
        }
        // Acks for a arrive before acks for b, interleaved.
        h.ack(srv[1], "a", None);
        h.ack(srv[0], "b", None);
        assert!(declared(&h.take(), wrk[0]).is_empty());
        h.ack(srv[0], "a", None);
        let acts = h.take();
        for &w in &wrk {
            assert_eq!(declared(&acts, w), vec![("a".to_string(), Ok(pa.clone()))]);
        }
        h.ack(srv[1], "b", None);
        let acts = h.take();
        for &w in &wrk {
            let d = declared(&acts, w);
            assert_eq!(d.len(), 1);
            assert_eq!(d[0].0, "b");
            assert_eq!(d[0].1.as_ref().unwrap().len, 50);
        }
        // A stray ack is ignored.
        h.ack(srv[1], "b", None);
        assert!(h.take().is_empty());
    }

    #[test]
    fn priorities_default_to_declaration_order_and_must_agree() {
        let (mut h, srv, wrk) = H::start(2, 1);
        // "b" completes first (both workers declared it), then "a": b gets 0, a gets -1,
        // whatever order each worker started its declares in.
        h.declare(wrk[0], "a", 10, &[]);
        h.declare(wrk[0], "b", 10, &[]);
        h.declare(wrk[1], "b", 10, &[]);
        let pb = placements(&h.take(), srv[0]).remove(0);
        h.declare(wrk[1], "a", 10, &[]);
        let pa = placements(&h.take(), srv[0]).remove(0);
        assert_eq!((pb.name.as_str(), pb.priority), ("b", 0));
        assert_eq!((pa.name.as_str(), pa.priority), ("a", -1));
        // An explicit priority wins over the order, and every worker must ask for the same.
        h.declare_with_priority(wrk[0], "c", 10, &[], Some(7));
        h.declare_with_priority(wrk[1], "c", 10, &[], Some(7));
        let pc = placements(&h.take(), srv[0]).remove(0);
        assert_eq!(pc.priority, 7);
        h.declare_with_priority(wrk[0], "d", 10, &[], Some(3));
        h.declare(wrk[1], "d", 10, &[]);
        let acts = h.take();
        assert!(placements(&acts, srv[0]).is_empty());
        for &w in &wrk {
            let e = declared(&acts, w).remove(0).1.unwrap_err();
            assert_eq!(
                e,
                "tensor \"d\": worker 0 declared priority 3, worker 1 declared priority (default)"
            );
        }
        // Declaring a placed tensor again must ask for the same priority as before.
        for (name, p) in [("a", None), ("b", None), ("c", Some(7))] {
            h.ack(srv[0], name, None);
            let _ = h.take();
            h.declare_with_priority(wrk[0], name, 10, &[], p);
            let d = declared(&h.take(), wrk[0]).remove(0);
            assert!(d.1.is_ok(), "{name}: {d:?}");
        }
        h.declare_with_priority(wrk[0], "c", 10, &[], Some(8));
        let e = declared(&h.take(), wrk[0]).remove(0).1.unwrap_err();
        assert!(e.contains("priority 7") && e.contains("priority 8"), "{e}");
    }

    #[test]
    fn placement_balances_bytes_over_servers_across_tensors() {
        let (mut h, srv, wrk) = H::start(1, 2);
        h.declare(wrk[0], "big", 100, &[]);
        let p1 = placements(&h.take(), srv[0]).remove(0);
        assert_eq!(p1.chunks[0].server, 0);
        h.declare(wrk[0], "small", 10, &[]);
        let p2 = placements(&h.take(), srv[0]).remove(0);
        assert_eq!(p2.chunks[0].server, 1);
    }

    #[test]
    fn length_mismatch_names_the_tensor_and_both_values_and_others_keep_working() {
        let (mut h, srv, wrk) = H::start(3, 1);
        h.declare(wrk[0], "fc1.weight", 1000, &[]);
        h.declare(wrk[2], "fc1.weight", 1000, &[]);
        h.declare(wrk[1], "fc1.weight", 999, &[]);
        let acts = h.take();
        assert!(placements(&acts, srv[0]).is_empty());
        for &w in &wrk {
            assert_eq!(
                declared(&acts, w),
                vec![(
                    "fc1.weight".to_string(),
                    Err(
                        "tensor \"fc1.weight\": worker 0 declared 1000 elements, worker 1 \
                         declared 999"
                            .to_string()
                    )
                )]
            );
        }
        // Another tensor works, and the failed name can be declared again consistently.
        for &w in &wrk {
            h.declare(w, "fc2", 10, &[]);
            h.declare(w, "fc1.weight", 1000, &[]);
        }
        let acts = h.take();
        assert_eq!(placements(&acts, srv[0]).len(), 2);
        h.ack(srv[0], "fc2", None);
        h.ack(srv[0], "fc1.weight", None);
        let acts = h.take();
        for &w in &wrk {
            assert!(declared(&acts, w).iter().all(|d| d.1.is_ok()));
            assert_eq!(declared(&acts, w).len(), 2);
        }
    }

    #[test]
    fn params_mismatch_names_the_parameter_and_both_values() {
        let (mut h, _srv, wrk) = H::start(2, 1);
        h.declare(wrk[0], "t", 10, &[("compressor", "topk"), ("k", "0.01")]);
        h.declare(wrk[1], "t", 10, &[("compressor", "topk")]);
        let acts = h.take();
        let (_, r) = declared(&acts, wrk[1]).remove(0);
        assert_eq!(
            r.unwrap_err(),
            "tensor \"t\": worker 0 declared parameter k = \"0.01\", worker 1 declared k = (unset)"
        );
        h.declare(wrk[0], "u", 10, &[("compressor", "onebit")]);
        h.declare(wrk[1], "u", 10, &[("compressor", "topk")]);
        let (_, r) = declared(&h.take(), wrk[0]).remove(0);
        assert_eq!(
            r.unwrap_err(),
            "tensor \"u\": worker 0 declared parameter compressor = \"onebit\", worker 1 \
             declared compressor = \"topk\""
        );
    }

    #[test]
    fn redeclaring_a_placed_tensor_is_answered_at_once() {
        let (mut h, srv, wrk) = H::start(2, 1);
        for &w in &wrk {
            h.declare(w, "t", 10, &[]);
        }
        h.take();
        // While the servers set it up: same → answered with the others; different → error.
        h.declare(wrk[0], "t", 10, &[]);
        h.declare(wrk[1], "t", 11, &[]);
        let acts = h.take();
        let (_, r) = declared(&acts, wrk[1]).remove(0);
        assert_eq!(
            r.unwrap_err(),
            "tensor \"t\": it is already declared with 10 elements, worker 1 declared 11"
        );
        assert!(declared(&acts, wrk[0]).is_empty());
        h.ack(srv[0], "t", None);
        let acts = h.take();
        assert_eq!(declared(&acts, wrk[0]).len(), 1);
        let p = declared(&acts, wrk[1]).remove(0).1.unwrap();
        // Placed: same → Ok at once, no new placement; different → error.
        h.declare(wrk[1], "t", 10, &[]);
        let acts = h.take();
        assert!(placements(&acts, srv[0]).is_empty());
        assert_eq!(declared(&acts, wrk[1]), vec![("t".to_string(), Ok(p))]);
        h.declare(wrk[0], "t", 10, &[("ef", "vanilla")]);
        let (_, r) = declared(&h.take(), wrk[0]).remove(0);
        assert_eq!(
            r.unwrap_err(),
            "tensor \"t\": it is already declared with parameter ef = (unset), worker 0 \
             declared ef = \"vanilla\""
        );
    }

    #[test]
    fn a_changed_duplicate_declare_from_one_worker_is_refused_to_it() {
        let (mut h, srv, wrk) = H::start(2, 1);
        h.declare(wrk[0], "t", 10, &[]);
        h.declare(wrk[0], "t", 10, &[]); // identical: idempotent
        assert!(h.take().is_empty());
        h.declare(wrk[0], "t", 12, &[]);
        let (_, r) = declared(&h.take(), wrk[0]).remove(0);
        let e = r.unwrap_err();
        assert!(
            e.contains("worker 0 first declared 10 elements, then 12"),
            "{e}"
        );
        h.declare(wrk[1], "t", 10, &[]);
        assert_eq!(placements(&h.take(), srv[0]).len(), 1);
    }

    #[test]
    fn a_server_refusing_a_placement_fails_the_declare_naming_it() {
        let (mut h, srv, wrk) = H::start(2, 2);
        for &w in &wrk {
            h.declare(w, "t", 300, &[]);
        }
        h.take();
        h.ack(srv[0], "t", None);
        h.ack(srv[1], "t", Some("unknown compressor \"zip\""));
        let acts = h.take();
        for &w in &wrk {
            let (_, r) = declared(&acts, w).remove(0);
            let e = r.unwrap_err();
            assert!(
                e.contains("tensor \"t\"")
                    && e.contains("server 1")
                    && e.contains("unknown compressor"),
                "{e}"
            );
        }
        assert!(
            h.s.key_owner.is_empty(),
            "keys of a failed tensor are freed"
        );
    }

    #[test]
    fn a_tensor_with_too_many_chunks_fails_the_declare_naming_it() {
        // A mistyped length must not make the scheduler build (or send) billions of chunks.
        let (mut h, srv, wrk) = H::start(2, 1);
        for &w in &wrk {
            h.declare(w, "huge", u64::MAX, &[]);
        }
        let acts = h.take();
        assert!(placements(&acts, srv[0]).is_empty());
        for &w in &wrk {
            let (_, r) = declared(&acts, w).remove(0);
            let e = r.unwrap_err();
            assert!(
                e.contains("tensor \"huge\"")
                    && e.contains(&u64::MAX.to_string())
                    && e.contains(&MAX_CHUNKS_PER_TENSOR.to_string())
                    && e.contains("cluster.partition_bytes"),
                "{e}"
            );
        }
        assert_eq!(h.s.placer.load_bytes(), &[0]);
        // One chunk over the limit (100 elements per chunk here) fails too.
        for &w in &wrk {
            h.declare(w, "big", MAX_CHUNKS_PER_TENSOR * 100 + 1, &[]);
        }
        let acts = h.take();
        assert!(placements(&acts, srv[0]).is_empty());
        assert!(declared(&acts, wrk[0]).remove(0).1.is_err());
        // The largest allowed placement, with every field at its widest encoding, fits a
        // control frame.
        let widest = ChunkPlacement {
            key: u64::MAX,
            offset: u64::MAX,
            len: u64::MAX,
            server: u32::MAX,
        };
        let msg = FromScheduler::Declared {
            name: "big".into(),
            result: Ok(TensorPlacement {
                name: "big".into(),
                len: u64::MAX,
                params: ParamMap::new(),
                priority: i32::MIN,
                chunks: vec![widest; MAX_CHUNKS_PER_TENSOR as usize],
            }),
        };
        assert!(pushpull_common::protocol::encode_control(&msg).is_ok());
    }

    #[test]
    fn a_key_collision_names_both_tensors() {
        let (mut h, srv, wrk) = H::start(1, 1);
        // Pretend chunk 3 of "other" got the key of chunk 0 of "t".
        h.s.key_owner.insert(chunk_key("t", 0), ("other".into(), 3));
        h.declare(wrk[0], "t", 10, &[]);
        let acts = h.take();
        assert!(placements(&acts, srv[0]).is_empty());
        let (_, r) = declared(&acts, wrk[0]).remove(0);
        let e = r.unwrap_err();
        assert!(
            e.contains("tensor \"t\"")
                && e.contains("chunk 0")
                && e.contains("chunk 3 of tensor \"other\""),
            "{e}"
        );
        // The placer is unchanged: the next tensor still goes to an empty server.
        assert_eq!(h.s.placer.load_bytes(), &[0]);
    }

    #[test]
    fn a_declare_a_finished_worker_never_joins_fails_for_the_others() {
        let (mut h, _srv, wrk) = H::start(2, 1);
        h.declare(wrk[0], "t", 10, &[]);
        h.msg(wrk[1], ToScheduler::Finished);
        let acts = h.take();
        let (_, r) = declared(&acts, wrk[0]).remove(0);
        assert_eq!(
            r.unwrap_err(),
            "tensor \"t\": worker 1 finished without declaring it"
        );
        h.declare(wrk[0], "u", 10, &[]);
        let (_, r) = declared(&h.take(), wrk[0]).remove(0);
        assert_eq!(
            r.unwrap_err(),
            "tensor \"u\": worker 1 finished without declaring it"
        );
    }

    // ---------------------------------------------------------------- barrier

    #[test]
    fn a_barrier_completes_only_when_every_worker_arrived() {
        let (mut h, srv, wrk) = H::start(3, 1);
        h.msg(wrk[2], ToScheduler::Barrier { id: 0 });
        h.msg(wrk[0], ToScheduler::Barrier { id: 0 });
        h.msg(wrk[0], ToScheduler::Barrier { id: 0 }); // duplicate: not counted twice
        assert!(h.take().is_empty());
        h.msg(wrk[1], ToScheduler::Barrier { id: 0 });
        let acts = h.take();
        for &w in &wrk {
            assert_eq!(to(&acts, w), vec![FromScheduler::BarrierDone { id: 0 }]);
        }
        assert!(to(&acts, srv[0]).is_empty());
        // Barriers 1 and 2 overlap (a fast worker runs ahead).
        h.msg(wrk[0], ToScheduler::Barrier { id: 1 });
        h.msg(wrk[1], ToScheduler::Barrier { id: 1 });
        h.msg(wrk[0], ToScheduler::Barrier { id: 2 });
        h.msg(wrk[1], ToScheduler::Barrier { id: 2 });
        h.msg(wrk[2], ToScheduler::Barrier { id: 2 });
        let acts = h.take();
        assert_eq!(
            to(&acts, wrk[0]),
            vec![FromScheduler::BarrierDone { id: 2 }]
        );
        h.msg(wrk[2], ToScheduler::Barrier { id: 1 });
        assert_eq!(
            to(&h.take(), wrk[1]),
            vec![FromScheduler::BarrierDone { id: 1 }]
        );
    }

    #[test]
    fn a_worker_finishing_outside_a_barrier_others_wait_in_fails_the_job() {
        let (mut h, srv, wrk) = H::start(2, 1);
        h.msg(wrk[0], ToScheduler::Barrier { id: 0 });
        h.msg(wrk[1], ToScheduler::Finished);
        let acts = h.take();
        let Some(Err(JobFailure::Stuck(msg))) = finish_of(&acts) else {
            panic!("{acts:?}")
        };
        assert!(
            msg.contains("barrier 0") && msg.contains("worker 1 finished"),
            "{msg}"
        );
        for c in [srv[0], wrk[0]] {
            assert_eq!(
                to(&acts, c),
                vec![FromScheduler::Shutdown {
                    error: Some(msg.clone())
                }]
            );
        }
        assert!(h.s.is_done());
    }

    // ------------------------------------------------------------ heartbeats

    #[test]
    fn the_scheduler_sends_heartbeats_every_interval_to_every_registered_node() {
        let (mut h, srv, wrk) = H::start(2, 1);
        let everyone: Vec<ConnId> = srv.iter().chain(&wrk).copied().collect();
        let beats = |acts: &[Action]| {
            let mut c: Vec<ConnId> = acts
                .iter()
                .filter_map(|a| match a {
                    Action::Send(c, FromScheduler::Heartbeat) => Some(*c),
                    _ => None,
                })
                .collect();
            c.sort();
            c
        };
        let mut sorted = everyone.clone();
        sorted.sort();
        h.advance(0);
        assert_eq!(beats(&h.take()), sorted);
        h.advance(500);
        assert!(beats(&h.take()).is_empty());
        h.heartbeat_all_but(&everyone, u64::MAX);
        h.advance(500);
        assert_eq!(beats(&h.take()), sorted);
        assert!(h.s.next_timeout().unwrap() <= h.now + Duration::from_millis(1000));
    }

    fn check_loss(lost_is_server: bool) {
        let (mut h, srv, wrk) = H::start(2, 2);
        let everyone: Vec<ConnId> = srv.iter().chain(&wrk).copied().collect();
        let lost = if lost_is_server { srv[1] } else { wrk[1] };
        let lost_name = h.s.node_name(lost).unwrap();
        // 9.5 s of heartbeats from everyone but `lost`: nobody is lost yet.
        for _ in 0..19 {
            h.heartbeat_all_but(&everyone, lost);
            h.advance(500);
        }
        assert!(finish_of(&h.take()).is_none());
        h.heartbeat_all_but(&everyone, lost);
        h.advance(500);
        let acts = h.take();
        let Some(Err(JobFailure::NodeLost { node, reason })) = finish_of(&acts) else {
            panic!("{acts:?}")
        };
        assert_eq!(node, lost_name);
        assert!(reason.contains("no heartbeat for 10.0 s"), "{reason}");
        let err = JobFailure::NodeLost {
            node: node.clone(),
            reason: reason.clone(),
        }
        .to_string();
        let expected_role = if lost_is_server {
            "server 1 ("
        } else {
            "worker 1 ("
        };
        assert!(err.starts_with(expected_role), "{err}");
        for &c in &everyone {
            if c == lost {
                // The lost node, if it still hears us, gets only the Shutdown.
                assert!(matches!(
                    to(&acts, c).as_slice(),
                    [FromScheduler::Shutdown { error: Some(_) }]
                ));
                continue;
            }
            let got = to(&acts, c);
            assert_eq!(got.len(), 2, "{got:?}");
            assert_eq!(
                got[0],
                FromScheduler::NodeLost {
                    node: node.clone(),
                    reason: reason.clone()
                }
            );
            let FromScheduler::Shutdown { error: Some(e) } = &got[1] else {
                panic!("{got:?}")
            };
            assert!(e.contains(&node.to_string()), "{e}");
        }
        // Finish is the last action and later events are ignored.
        assert!(matches!(acts.last(), Some(Action::Finish(_))));
        h.advance(20_000);
        h.msg(wrk[0], ToScheduler::Finished);
        assert!(h.take().is_empty());
        assert!(h.s.next_timeout().is_none());
    }

    #[test]
    fn a_silent_worker_is_lost_and_everyone_else_is_told() {
        check_loss(false);
    }

    #[test]
    fn a_silent_server_is_lost_and_everyone_else_is_told() {
        check_loss(true);
    }

    #[test]
    fn a_dropped_connection_is_a_loss_at_once() {
        let (mut h, srv, wrk) = H::start(2, 1);
        h.ev(Event::Disconnected {
            conn: srv[0],
            reason: "timed out".into(),
        });
        let acts = h.take();
        let Some(Err(JobFailure::NodeLost { node, reason })) = finish_of(&acts) else {
            panic!("{acts:?}")
        };
        assert_eq!(node.role, NodeRole::Server);
        assert_eq!(reason, "connection lost: timed out");
        // The dropped connection gets nothing.
        assert!(to(&acts, srv[0]).is_empty());
        for &w in &wrk {
            assert!(matches!(to(&acts, w)[0], FromScheduler::NodeLost { .. }));
        }
    }

    // ----------------------------------------------------------------- finish

    #[test]
    fn every_worker_finishing_shuts_everyone_down_cleanly() {
        let (mut h, srv, wrk) = H::start(3, 2);
        h.msg(wrk[1], ToScheduler::Finished);
        // A finished worker may hang up and go silent: not a loss.
        h.ev(Event::Disconnected {
            conn: wrk[1],
            reason: "closed".into(),
        });
        h.msg(wrk[1], ToScheduler::Finished);
        h.msg(wrk[0], ToScheduler::Finished);
        for _ in 0..30 {
            h.heartbeat_all_but(&[srv[0], srv[1], wrk[2]], u64::MAX);
            h.advance(500);
        }
        let acts = h.take();
        assert!(finish_of(&acts).is_none(), "{acts:?}");
        h.msg(wrk[2], ToScheduler::Finished);
        let acts = h.take();
        assert_eq!(finish_of(&acts), Some(Ok(())));
        for c in [srv[0], srv[1], wrk[0], wrk[2]] {
            assert_eq!(to(&acts, c), vec![FromScheduler::Shutdown { error: None }]);
        }
        assert!(
            to(&acts, wrk[1]).is_empty(),
            "the hung-up worker gets nothing"
        );
        assert!(h.s.is_done());
    }

    #[test]
    fn messages_in_the_wrong_role_are_ignored() {
        let (mut h, srv, wrk) = H::start(1, 1);
        h.msg(srv[0], ToScheduler::Finished);
        h.msg(srv[0], ToScheduler::Barrier { id: 0 });
        h.msg(
            wrk[0],
            ToScheduler::PlacementAck {
                name: "t".into(),
                error: None,
            },
        );
        h.msg(wrk[0], ToScheduler::Heartbeat);
        assert!(h.take().is_empty());
        assert!(!h.s.is_done());
    }
}
