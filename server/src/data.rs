//! The data plane of a server: worker connections, incoming push streams, the key table and
//! the one send queue for results and aborts. The scheduler session that places keys and
//! watches liveness is in [`crate::service`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use dashmap::DashMap;
use pushpull_net::sender::{FrameSender, OnError, Peer};
use pushpull_net::transport::{Endpoint, TransportError};
use pushpull_proto::pool::BufPool;

use crate::stats::KeyStats;
use pushpull_proto::protocol::{
    max_payload_len, FrameFlags, FrameHeader, FrameKind, ReduceOp, FRAME_HEADER_LEN,
};
use pushpull_proto::sendq::Flow;
use pushpull_proto::Config;
use tracing::{debug, info, warn};

use crate::rounds::{Action, KeyRounds};
use pushpull_net::certs::peer_grant;
use pushpull_proto::departure::Departure;
use pushpull_proto::protocol::NodeRole;

/// Idle capacity the pool of result payload buffers keeps.
pub(crate) const RESULT_POOL_BYTES: usize = 128 << 20;

/// A frame to send: kind and flags, key, round, payload.
pub(crate) type OutFrame = ((FrameKind, FrameFlags), u64, u64, Bytes);

/// Priority of abort frames: before any result.
pub(crate) const ABORT_PRIORITY: i32 = i32::MAX;

/// A worker's data connection.
#[derive(Clone)]
pub(crate) struct WorkerConn {
    /// The connection and `worker R (addr)`.
    pub(crate) peer: Peer,
    /// Sends results and aborts, the server's one queue for every worker.
    pub(crate) sender: FrameSender,
}

impl WorkerConn {
    /// Queues one frame for worker `rank`.
    pub(crate) fn send(
        &self,
        rank: u32,
        ((kind, flags), key, round, payload): OutFrame,
        priority: i32,
    ) {
        let header = FrameHeader {
            kind,
            op: ReduceOp::Sum,
            flags,
            rank,
            aux: 0,
            key,
            round,
            payload_len: payload.len() as u64,
        };
        self.sender.send(&self.peer, header, payload, priority);
    }
}

/// A result frame's kind and flags (non-finite or not).
fn result(non_finite: bool) -> (FrameKind, FrameFlags) {
    let flags = FrameFlags {
        non_finite,
        ..FrameFlags::default()
    };
    (FrameKind::Result, flags)
}

/// An abort frame's kind and flags.
fn abort() -> (FrameKind, FrameFlags) {
    (FrameKind::Abort, FrameFlags::default())
}

/// State shared by every task of a running server.
pub(crate) struct Shared {
    pub(crate) num_workers: u32,
    /// `cluster.local_size`: workers per host (see [`crate::rounds::KeyInfo::local_size`]).
    pub(crate) local_size: u32,
    pub(crate) max_payload: u64,
    pub(crate) heartbeat_timeout: Duration,
    /// `tls.check_roles`: a worker's certificate must grant the rank its `Hello` claims.
    pub(crate) check_roles: bool,
    /// Connections that have not sent their `Hello` yet (capped, see [`serve_worker`]).
    pub(crate) awaiting_hello: AtomicUsize,
    pub(crate) server_id: OnceLock<u32>,
    pub(crate) keys: DashMap<u64, Arc<Mutex<KeyRounds>>>,
    /// Each key's counters (`crate::stats`), inserted with the key.
    pub(crate) key_stats: DashMap<u64, Arc<KeyStats>>,
    /// Data connections by rank.
    pub(crate) workers: RwLock<Vec<Option<WorkerConn>>>,
    /// Sends every result and abort in priority order within `cluster.send_window_bytes`.
    pub(crate) sender: FrameSender,
    /// Buffers for encoded results.
    pub(crate) pool: Arc<BufPool>,
}

impl Shared {
    /// The state and the driver of its [`FrameSender`] (spawn it).
    pub(crate) fn new(
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
        let (sender, driver) = FrameSender::new(
            config.cluster.send_window_bytes,
            Flow::Reply,
            None,
            on_error,
        );
        let shared = Shared {
            num_workers: w,
            local_size: config.cluster.local_size,
            max_payload: max_payload_len(config.cluster.partition_bytes),
            heartbeat_timeout: config.heartbeat_timeout(),
            check_roles: config.tls.check_roles,
            awaiting_hello: AtomicUsize::new(0),
            server_id: OnceLock::new(),
            keys: DashMap::new(),
            key_stats: DashMap::new(),
            workers: RwLock::new(vec![None; w as usize]),
            sender,
            pool: BufPool::new(RESULT_POOL_BYTES),
        };
        (shared, driver)
    }

    pub(crate) fn id_str(&self) -> String {
        match self.server_id.get() {
            Some(id) => format!("server {id}"),
            None => "this server".to_string(),
        }
    }

    pub(crate) fn worker(&self, rank: u32) -> Option<WorkerConn> {
        let w = self.workers.read().unwrap_or_else(|e| e.into_inner());
        w.get(rank as usize).cloned().flatten()
    }

    /// Aborts every open round naming `node`; every later push is refused naming it.
    pub(crate) fn node_lost(self: &Arc<Self>, node: &str, reason: &str) {
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

    /// Worker `rank` finished and closed its connection: rounds that need its pushes fail,
    /// naming it ([`KeyRounds::worker_left`]).
    pub(crate) fn worker_left(self: &Arc<Self>, rank: u32, node: &str) {
        let keys: Vec<(u64, Arc<Mutex<KeyRounds>>)> = self
            .keys
            .iter()
            .map(|e| (*e.key(), e.value().clone()))
            .collect();
        for (key, k) in keys {
            let (priority, actions) = {
                let mut k = k.lock().unwrap_or_else(|e| e.into_inner());
                (k.info().priority, k.worker_left(rank, node))
            };
            self.execute(key, priority, actions);
        }
    }

    /// Carries out a state machine's actions for `key`, each to the ranks it names, whose
    /// results go out at `priority` (aborts, small and urgent, always at the highest).
    pub(crate) fn execute(self: &Arc<Self>, key: u64, priority: i32, actions: Vec<Action>) {
        let stats = || self.key_stats.get(&key).map(|e| e.value().clone());
        for action in actions {
            match action {
                Action::SendResult {
                    round,
                    ranks,
                    payload,
                } => {
                    if let Some(s) = stats() {
                        KeyStats::add(&s.rounds, 1);
                        KeyStats::add(&s.bytes_sent, payload.len() as u64 * ranks.len() as u64);
                    }
                    for rank in ranks {
                        let frame = (result(false), key, round, payload.clone());
                        self.send_to_rank(rank, frame, priority);
                    }
                }
                Action::SendEach { round, results } => {
                    if let Some(s) = stats() {
                        KeyStats::add(&s.rounds, 1);
                        let sent = results.iter().map(|(_, p)| p.len() as u64).sum();
                        KeyStats::add(&s.bytes_sent, sent);
                    }
                    for (rank, payload) in results {
                        self.send_to_rank(rank, (result(false), key, round, payload), priority);
                    }
                }
                Action::SendNonFinite { round, ranks } => {
                    if let Some(s) = stats() {
                        KeyStats::add(&s.rounds, 1);
                    }
                    debug!(key, round, "non-finite sum");
                    for rank in ranks {
                        self.send_to_rank(rank, (result(true), key, round, Bytes::new()), priority);
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
                        let frame = (abort(), key, round, payload.clone());
                        self.send_to_rank(rank, frame, ABORT_PRIORITY);
                    }
                }
            }
        }
    }

    pub(crate) fn send_to_rank(self: &Arc<Self>, rank: u32, frame: OutFrame, priority: i32) {
        match self.worker(rank) {
            Some(w) => w.send(rank, frame, priority),
            None => debug!(
                rank,
                key = frame.1,
                round = frame.2,
                kind = ?frame.0 .0,
                "worker not connected; frame dropped"
            ),
        }
    }

    /// Waits (at most `limit`) until every frame queued for a worker was handed to QUIC.
    pub(crate) async fn flush(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, self.sender.flushed()).await;
    }
}

pub(crate) async fn accept_loop(endpoint: Endpoint, shared: Arc<Shared>) {
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
pub(crate) enum Incoming {
    /// A well-formed frame.
    Frame(FrameHeader, Bytes),
    /// The header was readable but the rest was not (payload too long, truncated, extra
    /// bytes, stream reset).
    Bad(FrameHeader, String),
    /// Not even a header.
    Unreadable(String),
}

/// Reads one data frame to the end of its stream. Like [`pushpull_net::transport::read_frame`], but
/// keeps the header when the payload is bad, so the sender can be answered with an `Abort`.
pub(crate) async fn read_incoming(recv: &mut quinn::RecvStream, max_payload: u64) -> Incoming {
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

/// Beyond twice the number of workers, how many connections may wait for their `Hello`.
const SPARE_AWAITING_HELLO: usize = 32;

/// Counts a connection in [`Shared::awaiting_hello`] until dropped.
struct HelloWait<'a>(&'a AtomicUsize);

impl Drop for HelloWait<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves one worker's data connection: `Hello` first, then one task per stream.
pub(crate) async fn serve_worker(shared: Arc<Shared>, conn: quinn::Connection) {
    let addr = conn.remote_address();
    let refuse = |why: String| {
        warn!(%addr, "worker connection refused: {why}");
        let refused = Departure::Refused(why);
        conn.close(quinn::VarInt::from_u32(refused.code()), &refused.reason());
    };
    // At most 2 × workers + SPARE_AWAITING_HELLO connections may wait for their Hello at
    // once: a flood of connections cannot pile up tasks.
    let cap = 2 * shared.num_workers as usize + SPARE_AWAITING_HELLO;
    let waiting = shared.awaiting_hello.fetch_add(1, Ordering::SeqCst);
    let hello_wait = HelloWait(&shared.awaiting_hello);
    if waiting >= cap {
        return refuse(format!(
            "{waiting} connections are already waiting to say Hello (at most {cap}); try again"
        ));
    }
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
    drop(hello_wait);
    let rank = match hello {
        Incoming::Frame(h, _) if h.kind == FrameKind::Hello => h.rank,
        // A Hello read with a payload limit of 0: say what was wrong with it, not its kind.
        Incoming::Bad(h, _) if h.kind == FrameKind::Hello && h.payload_len > 0 => {
            return refuse(format!(
                "a Hello frame carries no payload, got {} bytes",
                h.payload_len
            ))
        }
        Incoming::Bad(h, why) if h.kind == FrameKind::Hello => {
            return refuse(format!("bad Hello frame: {why}"))
        }
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
    if let Err(why) = peer_grant(&conn, shared.check_roles).allows(NodeRole::Worker, Some(rank)) {
        return refuse(format!("Hello from rank {rank}: {why}"));
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
                // A clean finish (a lost worker is reported by the scheduler instead).
                if let quinn::ConnectionError::ApplicationClosed(close) = &e {
                    let why = Departure::from_close(close.error_code.into_inner(), &close.reason);
                    if matches!(why, Departure::Done(_)) {
                        shared.worker_left(rank, &w.peer.name);
                    }
                }
                break;
            }
        }
    }
}

/// Feeds one frame from worker `rank` to its key and carries out the actions.
pub(crate) fn handle_frame(shared: &Arc<Shared>, w: &WorkerConn, rank: u32, frame: Incoming) {
    let arrived = pushpull_net::timeline::on().then(pushpull_net::timeline::now);
    if pushpull_net::trace::enabled() || arrived.is_some() {
        if let (Some(id), Incoming::Frame(h, _)) = (shared.server_id.get(), &frame) {
            if pushpull_net::trace::enabled() {
                pushpull_net::trace::set_node(format!("server{id}"));
            }
            pushpull_net::trace::frame_arrived(h, &w.peer.name);
        }
    }
    let (header, payload, bad) = match frame {
        Incoming::Frame(h, p) => (h, p, None),
        Incoming::Bad(h, why) => (h, Bytes::new(), Some(why)),
        Incoming::Unreadable(why) => {
            warn!("unreadable frame from {}: {why}", w.peer.name);
            return;
        }
    };
    if matches!(header.kind, FrameKind::StateGet | FrameKind::StatePut) {
        return crate::checkpoint::handle_state_frame(shared, w, rank, &header, &payload, bad);
    }
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
            let frame = (abort(), key, round, Bytes::from(why));
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
        let frame = (abort(), key, round, Bytes::from(why));
        w.send(rank, frame, ABORT_PRIORITY);
        return;
    };
    if let Some(s) = shared.key_stats.get(&key) {
        KeyStats::add(&s.bytes_received, payload.len() as u64);
    }
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
            let was = (k.is_open(), k.current_round());
            // Taken up now, under the key's lock: the pushes of a round are taken up in the
            // order their times are read (their arrival times, read before the lock, may be in
            // another order), so the round's `receive` never ends before it begins.
            let taken = arrived.map(|_| pushpull_net::timeline::now());
            let actions = k.push_flagged(rank, round, header.op, header.aux, header.flags, payload);
            if let (Some(at), Some(&id)) = (taken, shared.server_id.get()) {
                crate::spans::receive(id, k.info(), round, at, was, &actions);
            }
            actions
        };
        (k.info().priority, actions)
    };
    shared.execute(key, priority, actions);
}
