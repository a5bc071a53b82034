//! State shared by a worker's handles and its background tasks, and those tasks.
//!
//! Background tasks of one worker (all hold an `Arc<Shared>`, never the `Worker` itself, so
//! dropping the last `Worker` handle is noticed):
//! * **control writer**: the only writer of the control stream; every message to the scheduler
//!   goes through an unbounded channel, so a caller whose future is dropped can never leave a
//!   half-written message behind;
//! * **control reader**: feeds `FromScheduler` messages to the worker's
//!   [`Session`](pushpull_proto::session::Session) (the I/O-free session with the scheduler
//!   that servers run too) and carries out what it asks: Welcome, Declared, BarrierDone, and
//!   the end (Refused, NodeLost, Shutdown, a lost scheduler);
//! * **heartbeat**: wakes the session at its deadlines, so it sends `Heartbeat` every interval
//!   and ends when the scheduler has been silent longer than the heartbeat timeout;
//! * **server reader** (one per server connection): accepts every incoming unidirectional
//!   stream at once, reads its frame in a task of its own and hands `Result`/`Abort` frames to
//!   the [`Dispatch`] table by `(key, round)`.
//!
//! The first failure wins ([`Shared::fail`]): it is recorded, and every waiting declare,
//! barrier and chunk fails with it at once, as does every later call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pushpull_net::transport::{read_frame, TransportError};
use pushpull_proto::protocol::{
    check_control_len, decode_control, encode_control, ClusterMap, FrameHeader, FrameKind,
    FromScheduler, ProtocolError, ToScheduler,
};
use pushpull_proto::session::{End, Input, Output, Registration, Session, SessionConfig};
use pushpull_proto::NodeName;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, oneshot, watch};

use crate::control::ControlPending;
use crate::dispatch::{Delivered, Dispatch, Outcome};
use crate::error::{transport_reason, WorkerError};

/// Where the worker is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Phase {
    /// Registered, waiting for Welcome / connecting to servers.
    Joining,
    /// Normal operation.
    Running,
    /// `finish` was called: no new operations; waiting for running ones.
    Finishing,
    /// `Finished` was queued for the scheduler: connection losses are expected from now on.
    FinishedSent,
    /// Endpoints closed (finished or dropped).
    Closed,
}

/// The observable state; changes wake [`Shared::subscribe`]rs.
#[derive(Debug, Clone)]
pub(crate) struct State {
    pub(crate) phase: Phase,
    /// The error that ended the job, if one did (first one wins).
    pub(crate) fatal: Option<WorkerError>,
    /// The scheduler sent `Shutdown { error: None }`.
    pub(crate) shutdown: bool,
    /// The control stream or connection ended (after Finished: expected).
    pub(crate) scheduler_closed: bool,
    /// push_pull/broadcast calls submitted and not yet complete (detached ones included).
    pub(crate) inflight: usize,
}

/// Work for the control writer.
pub(crate) enum Outgoing {
    /// Write this message; acknowledge once it is written to the stream.
    Msg(Box<ToScheduler>, Option<oneshot::Sender<()>>),
    /// Finish the stream and acknowledge once the scheduler has received all of it.
    Close(oneshot::Sender<()>),
}

/// One worker's shared state.
pub(crate) struct Shared {
    /// The scheduler, for error messages.
    pub(crate) scheduler: NodeName,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) heartbeat_timeout: Duration,
    state: watch::Sender<State>,
    /// Declares and barriers waiting for the scheduler.
    pub(crate) pending: Mutex<ControlPending>,
    /// Dispatch table per server id.
    pub(crate) dispatch: Vec<Dispatch>,
    outgoing: mpsc::UnboundedSender<Outgoing>,
    /// The session with the scheduler (heartbeats, silence, the end).
    session: Mutex<Session>,
    /// The session's end was acted on.
    session_ended: AtomicBool,
    welcome: Mutex<Option<oneshot::Sender<(u32, ClusterMap)>>>,
}

/// Keeps a push_pull/broadcast counted in [`State::inflight`] until dropped.
pub(crate) struct OpGuard {
    shared: Arc<Shared>,
}

impl Drop for OpGuard {
    fn drop(&mut self) {
        self.shared.state.send_modify(|s| s.inflight -= 1);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Shared state for a worker registering with `scheduler` as `registration` says; the
    /// `Register` message is queued on the outgoing channel already. Returns the receiving
    /// ends of that channel (for the writer task) and of the Welcome.
    #[allow(clippy::type_complexity)]
    pub(crate) fn new(
        scheduler: NodeName,
        config: &pushpull_proto::Config,
        registration: Registration,
    ) -> (
        Arc<Shared>,
        mpsc::UnboundedReceiver<Outgoing>,
        oneshot::Receiver<(u32, ClusterMap)>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (welcome_tx, welcome_rx) = oneshot::channel();
        let (state, _) = watch::channel(State {
            phase: Phase::Joining,
            fatal: None,
            shutdown: false,
            scheduler_closed: false,
            inflight: 0,
        });
        let shared = Arc::new(Shared {
            scheduler,
            heartbeat_interval: config.heartbeat_interval(),
            heartbeat_timeout: config.heartbeat_timeout(),
            state,
            pending: Mutex::new(ControlPending::default()),
            dispatch: (0..config.cluster.num_servers)
                .map(|_| Dispatch::new())
                .collect(),
            outgoing: tx,
            // Workers end at once on NodeLost: there is nothing to wind down.
            session: Mutex::new(Session::new(
                SessionConfig::from_config(config, None),
                Instant::now(),
                registration,
            )),
            session_ended: AtomicBool::new(false),
            welcome: Mutex::new(Some(welcome_tx)),
        });
        shared.carry_out(&mut lock(&shared.session));
        (shared, rx, welcome_rx)
    }

    /// A receiver of state changes.
    pub(crate) fn subscribe(&self) -> watch::Receiver<State> {
        self.state.subscribe()
    }

    /// A snapshot of the state.
    pub(crate) fn state(&self) -> State {
        self.state.borrow().clone()
    }

    /// Moves to `phase` (never backwards). From [`Phase::FinishedSent`] on, the scheduler
    /// going away is the expected end of the session.
    pub(crate) fn set_phase(&self, phase: Phase) {
        if phase >= Phase::FinishedSent {
            lock(&self.session).finished();
        }
        self.state.send_modify(|s| {
            if phase > s.phase {
                s.phase = phase
            }
        });
    }

    /// Moves to [`Phase::Finishing`]; false if `finish` was already called (or the worker
    /// is closed).
    pub(crate) fn begin_finish(&self) -> bool {
        let mut first = false;
        self.state.send_if_modified(|s| {
            first = s.phase < Phase::Finishing;
            if first {
                s.phase = Phase::Finishing;
            }
            first
        });
        first
    }

    /// Ok while operations may start: no failure recorded and `finish` not called.
    pub(crate) fn check(&self) -> Result<(), WorkerError> {
        let s = self.state.borrow();
        if let Some(e) = &s.fatal {
            return Err(e.clone());
        }
        if s.phase >= Phase::Finishing {
            return Err(WorkerError::Finished);
        }
        Ok(())
    }

    /// Counts a push_pull/broadcast as in flight (checked like [`Shared::check`], atomically).
    pub(crate) fn op_guard(self: &Arc<Self>) -> Result<OpGuard, WorkerError> {
        let mut result = Ok(());
        self.state.send_if_modified(|s| {
            if let Some(e) = &s.fatal {
                result = Err(e.clone());
                false
            } else if s.phase >= Phase::Finishing {
                result = Err(WorkerError::Finished);
                false
            } else {
                s.inflight += 1;
                true
            }
        });
        result.map(|()| OpGuard {
            shared: self.clone(),
        })
    }

    /// Records the failure that ends the job (unless one is recorded already) and fails every
    /// waiting declare, barrier and chunk with it.
    pub(crate) fn fail(&self, error: WorkerError) {
        let mut first = false;
        self.state.send_if_modified(|s| {
            if s.fatal.is_none() && s.phase < Phase::Closed {
                s.fatal = Some(error.clone());
                first = true;
                true
            } else {
                false
            }
        });
        let error = match self.state.borrow().fatal.clone() {
            Some(e) => e,
            None => error,
        };
        if first {
            if matches!(
                error,
                WorkerError::Dropped | WorkerError::Finished | WorkerError::Abandoned { .. }
            ) {
                tracing::debug!("worker: {error}");
            } else {
                tracing::error!("worker: {error}");
            }
        }
        lock(&self.pending).poison(&error);
        for d in &self.dispatch {
            d.poison(&error);
        }
    }

    /// The control stream or the connection to the scheduler ended, with why.
    pub(crate) fn scheduler_gone(&self, reason: String) {
        self.state.send_modify(|s| s.scheduler_closed = true);
        self.session_input(Input::StreamEnded(reason));
    }

    /// Feeds the session one input and carries out what it asks.
    fn session_input(&self, input: Input) {
        let mut session = lock(&self.session);
        session.handle(Instant::now(), input);
        self.carry_out(&mut session);
    }

    /// Heartbeats and silence as of now; returns the session's next deadline (`None` once it
    /// has ended).
    fn session_timeout(&self) -> Option<Instant> {
        let mut session = lock(&self.session);
        session.handle_timeout(Instant::now());
        self.carry_out(&mut session);
        session.poll_timeout()
    }

    fn carry_out(&self, session: &mut Session) {
        while let Some(out) = session.poll_output() {
            match out {
                Output::Send(msg) => {
                    // A closed writer means the job is over; its cause is recorded already.
                    let _ = self.send(msg);
                }
                Output::Welcomed { id, map } => {
                    if let Some(tx) = lock(&self.welcome).take() {
                        let _ = tx.send((id, map));
                    }
                }
                // Workers have no grace: the session's end names the node at once.
                Output::NodeLost { .. } => {}
                Output::Role(FromScheduler::Declared { name, result }) => {
                    if lock(&self.pending).declared(&name, result) == 0 {
                        tracing::debug!(
                            "worker: answer to declare of {name:?} arrived with nobody waiting"
                        );
                    }
                }
                Output::Role(FromScheduler::BarrierDone { id }) => {
                    if !lock(&self.pending).barrier_done(id) {
                        tracing::debug!("worker: barrier {id} done with nobody waiting");
                    }
                }
                Output::Role(other) => {
                    tracing::warn!("worker: ignoring {other:?} (meant for servers)");
                }
            }
        }
        if let Some(end) = session.end() {
            if !self.session_ended.swap(true, Ordering::SeqCst) {
                self.on_session_end(end.clone());
            }
        }
    }

    /// The session with the scheduler is over: the end of the job, or its fatal error.
    fn on_session_end(&self, end: End) {
        match end {
            End::Shutdown { after_finish } => {
                self.state.send_modify(|s| s.shutdown = true);
                if after_finish {
                    tracing::debug!("worker: the session with {} ended", self.scheduler);
                } else {
                    self.fail(WorkerError::ShutDown);
                }
            }
            End::Refused { reason } => self.fail(WorkerError::Refused { reason }),
            End::NodeLost { node, reason } => self.fail(WorkerError::NodeLost { node, reason }),
            End::JobFailed { reason } => self.fail(WorkerError::JobFailed { reason }),
            End::SchedulerLost { reason } => {
                self.state.send_modify(|s| s.scheduler_closed = true);
                self.fail(WorkerError::NodeLost {
                    node: self.scheduler.clone(),
                    reason,
                });
            }
        }
    }

    /// A server connection failed: fatal (naming it) unless the job is ending.
    pub(crate) fn server_gone(&self, server: &NodeName, error: WorkerError) {
        let s = self.state();
        if s.phase >= Phase::FinishedSent || s.shutdown {
            tracing::debug!("worker: {server} closed: {error}");
        } else {
            self.fail(error);
        }
    }

    /// Queues a message for the scheduler (cancel-safe: the writer task writes it whole).
    pub(crate) fn send(&self, msg: ToScheduler) -> Result<(), WorkerError> {
        self.outgoing
            .send(Outgoing::Msg(Box::new(msg), None))
            .map_err(|_| self.closed_error())
    }

    /// Queues a message and waits until it was written to the control stream.
    pub(crate) async fn send_flushed(&self, msg: ToScheduler) -> Result<(), WorkerError> {
        let (tx, rx) = oneshot::channel();
        self.outgoing
            .send(Outgoing::Msg(Box::new(msg), Some(tx)))
            .map_err(|_| self.closed_error())?;
        rx.await.map_err(|_| self.closed_error())
    }

    /// Finishes the control stream and waits (at most `bound`) until the scheduler has
    /// received everything written to it.
    pub(crate) async fn close_control(&self, bound: Duration) {
        let (tx, rx) = oneshot::channel();
        if self.outgoing.send(Outgoing::Close(tx)).is_ok() {
            let _ = tokio::time::timeout(bound, rx).await;
        }
    }

    fn closed_error(&self) -> WorkerError {
        self.state().fatal.unwrap_or(WorkerError::NodeLost {
            node: self.scheduler.clone(),
            reason: "control stream closed".into(),
        })
    }

    /// Hands one frame from `server` to the chunk waiting for it.
    pub(crate) fn on_server_frame(
        &self,
        server: &NodeName,
        rank: u32,
        h: FrameHeader,
        payload: Bytes,
    ) {
        if pushpull_net::trace::enabled() {
            // The timeline has this moment as the end of the chunk's `pull` span.
            pushpull_net::trace::set_node(format!("worker{rank}"));
            pushpull_net::trace::frame_line("arrived", &h, &server.to_string());
        }
        let Some(dispatch) = self.dispatch.get(server.id as usize) else {
            return;
        };
        let outcome = match h.kind {
            FrameKind::Result if h.rank == rank && h.flags.non_finite => Outcome::NonFinite,
            FrameKind::Result if h.rank == rank => Outcome::Result(payload),
            // The answer to a checkpoint's state frame (at round `STATE_ROUND`).
            FrameKind::State if h.rank == rank => Outcome::Result(payload),
            FrameKind::Abort => Outcome::Abort(String::from_utf8_lossy(&payload).into_owned()),
            FrameKind::Result | FrameKind::State => Outcome::Abort(format!(
                "{server} sent rank {rank} a result addressed to rank {}",
                h.rank
            )),
            kind @ (FrameKind::Hello
            | FrameKind::Push
            | FrameKind::StateGet
            | FrameKind::StatePut) => Outcome::Abort(format!(
                "{server} sent a worker an unexpected {kind:?} frame"
            )),
        };
        if dispatch.deliver(h.key, h.round, outcome) == Delivered::Dropped {
            tracing::debug!(
                "worker: dropped a frame from {server} for key {:#018x} round {}",
                h.key,
                h.round
            );
        }
    }
}

/// Writes queued messages to the control stream, in order.
pub(crate) async fn control_writer(
    shared: Arc<Shared>,
    mut send: quinn::SendStream,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
) {
    while let Some(out) = rx.recv().await {
        match out {
            Outgoing::Msg(msg, ack) => {
                let frame = match encode_control(&msg) {
                    Ok(f) => f,
                    Err(e) => {
                        shared.fail(WorkerError::Internal(format!("cannot encode {msg:?}: {e}")));
                        return;
                    }
                };
                if let Err(e) = send.write_all(&frame).await {
                    shared.scheduler_gone(format!("sending failed ({e})"));
                    return;
                }
                if let Some(ack) = ack {
                    let _ = ack.send(());
                }
            }
            Outgoing::Close(ack) => {
                let _ = send.finish();
                let _ = send.stopped().await;
                let _ = ack.send(());
                return;
            }
        }
    }
}

/// Reads one control frame (u32 LE length + bincode body); `Ok(None)` when the peer finished
/// the stream between messages. Not cancel-safe: only the control reader task calls it.
async fn recv_control<T: DeserializeOwned>(
    recv: &mut quinn::RecvStream,
    peer: &str,
) -> Result<Option<T>, TransportError> {
    let proto = |source| TransportError::Protocol {
        peer: peer.to_string(),
        source,
    };
    let read_err = |e: quinn::ReadError| match e {
        quinn::ReadError::ConnectionLost(source) => TransportError::Connection {
            peer: peer.to_string(),
            source,
        },
        other => TransportError::Stream {
            peer: peer.to_string(),
            message: other.to_string(),
        },
    };
    let mut len = [0u8; 4];
    match recv.read_exact(&mut len).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(quinn::ReadExactError::FinishedEarly(n)) => {
            return Err(proto(ProtocolError::Malformed(format!(
                "truncated length prefix ({n} of 4 bytes)"
            ))))
        }
        Err(quinn::ReadExactError::ReadError(e)) => return Err(read_err(e)),
    }
    let len = check_control_len(u32::from_le_bytes(len)).map_err(proto)?;
    let mut body = vec![0u8; len];
    match recv.read_exact(&mut body).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(n)) => {
            return Err(proto(ProtocolError::Malformed(format!(
                "truncated control message ({n} of {len} bytes)"
            ))))
        }
        Err(quinn::ReadExactError::ReadError(e)) => return Err(read_err(e)),
    }
    decode_control(&body).map(Some).map_err(proto)
}

/// Reads and acts on messages from the scheduler until the stream ends.
pub(crate) async fn control_reader(shared: Arc<Shared>, mut recv: quinn::RecvStream) {
    let peer = shared.scheduler.to_string();
    loop {
        match recv_control::<FromScheduler>(&mut recv, &peer).await {
            Ok(Some(msg)) => shared.session_input(Input::Message(msg)),
            Ok(None) => {
                shared.scheduler_gone("it closed the control stream".into());
                return;
            }
            Err(e @ TransportError::Protocol { .. }) => {
                let s = shared.state();
                if s.phase < Phase::FinishedSent && !s.shutdown {
                    shared.fail(WorkerError::Protocol {
                        peer: peer.clone(),
                        message: e.to_string(),
                    });
                }
                return;
            }
            Err(e) => {
                shared.scheduler_gone(transport_reason(&e));
                return;
            }
        }
    }
}

/// Wakes the session at each of its deadlines (heartbeats; the scheduler's silence) until it
/// ends or the job does.
pub(crate) async fn heartbeat(shared: Arc<Shared>) {
    while let Some(next) = shared.session_timeout() {
        tokio::time::sleep_until(tokio::time::Instant::from_std(next)).await;
        let s = shared.state();
        if s.fatal.is_some() || s.phase >= Phase::Closed || s.scheduler_closed {
            return;
        }
    }
}

/// Accepts every unidirectional stream `server` opens and dispatches its frame.
pub(crate) async fn server_reader(
    shared: Arc<Shared>,
    server: NodeName,
    conn: quinn::Connection,
    rank: u32,
    max_payload: u64,
) {
    let peer = server.to_string();
    loop {
        let mut stream = match conn.accept_uni().await {
            Ok(s) => s,
            Err(e) => {
                shared.server_gone(&server, WorkerError::server_connection_lost(&server, &e));
                return;
            }
        };
        let (shared, server, peer) = (shared.clone(), server.clone(), peer.clone());
        let accepted = pushpull_net::timeline::on().then(pushpull_net::timeline::now);
        tokio::spawn(async move {
            match read_frame(&mut stream, max_payload, &peer).await {
                Ok((header, payload)) => {
                    if let Some(at) = accepted {
                        let bytes = header.payload_len;
                        crate::spans::pull(rank, header.key, header.round, at, bytes);
                    }
                    shared.on_server_frame(&server, rank, header, payload)
                }
                Err(e @ TransportError::Connection { .. }) => {
                    shared.server_gone(&server, WorkerError::server_lost(&server, &e))
                }
                Err(e) => shared.server_gone(
                    &server,
                    WorkerError::Protocol {
                        peer: peer.clone(),
                        message: e.to_string(),
                    },
                ),
            }
        });
    }
}
