//! A node's session with the scheduler as a pure state machine: what a server and a worker
//! both do on their control stream once they have registered. Heartbeats go out every
//! interval; silence past the timeout ends the session naming the scheduler; `Welcome`,
//! `NodeLost` and `Shutdown` are interpreted the same way for both roles; everything else is
//! handed to the role (`Placement` to servers, `Declared` and `BarrierDone` to workers).
//!
//! Like the scheduler's own state machine it owns no socket and reads no clock: the shell
//! feeds it [`Input`]s and the current [`Instant`], calls [`Session::handle_timeout`] at
//! [`Session::poll_timeout`], and carries out the [`Output`]s from [`Session::poll_output`]
//! until [`Session::end`] says why the session is over.
//!
//! # Rules
//! * **Registration**: the first output of a new session is the node's
//!   [`ToScheduler::Register`], built from its [`Registration`] (so both roles register
//!   the same way, with this crate's `PROTOCOL_VERSION`).
//! * **Heartbeats**: one [`ToScheduler::Heartbeat`] per `heartbeat_interval`, the first one
//!   interval after the start.
//! * **Silence**: any message from the scheduler counts as a sign of life. Before `Welcome`
//!   the scheduler may be waiting for slow nodes, so the bound is `join_timeout`; after it,
//!   `heartbeat_timeout`. Past the bound the session ends with [`End::SchedulerLost`].
//! * **`NodeLost`**: reported at once ([`Output::NodeLost`], so the role aborts what depends
//!   on that node). With a `lost_grace` (servers) the session then waits that long for the
//!   scheduler's `Shutdown` before it ends by itself; without one (workers) it ends at once.
//!   Either way the end is [`End::NodeLost`] naming the first lost node: a later `Shutdown`
//!   with an error, or the scheduler going away, does not replace the true cause.
//! * **`Shutdown`**: with an error, [`End::JobFailed`]; without, [`End::Shutdown`], saying
//!   whether this node had finished ([`Session::finished`]) before it came.
//! * **The stream ends** (closed, reset, connection lost): after this node finished or after
//!   a clean `Shutdown`, that is the expected end ([`End::Shutdown`]); otherwise
//!   [`End::SchedulerLost`].
//! * **`Refused`**: [`End::Refused`].
//!
//! After the end, inputs are ignored and nothing more is sent.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::config::{ClusterDigest, Config};
use crate::protocol::{
    ClusterMap, FromScheduler, NodeName, NodeRole, ToScheduler, PROTOCOL_VERSION,
};

/// Who a node says it is when it registers: everything of [`ToScheduler::Register`] but the
/// protocol version, which the session fills in.
#[derive(Debug, Clone, PartialEq)]
pub struct Registration {
    /// `Server` or `Worker`.
    pub role: NodeRole,
    /// The rank (worker) or id (server) asked for, if any.
    pub requested_id: Option<u32>,
    /// Servers: the address workers dial.
    pub listen_addr: Option<SocketAddr>,
    /// The node's cluster-relevant settings ([`Config::digest`]).
    pub digest: ClusterDigest,
}

/// The session's timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionConfig {
    /// Between two heartbeats.
    pub heartbeat_interval: Duration,
    /// Longest silence of the scheduler once welcomed.
    pub heartbeat_timeout: Duration,
    /// Longest silence before `Welcome`.
    pub join_timeout: Duration,
    /// After `NodeLost`: how long to wait for `Shutdown` before ending anyway (`None`: end at
    /// once).
    pub lost_grace: Option<Duration>,
}

impl SessionConfig {
    /// The cluster file's timing: heartbeat interval and timeout, and before `Welcome` the
    /// larger of the heartbeat and connect timeouts.
    pub fn from_config(config: &Config, lost_grace: Option<Duration>) -> SessionConfig {
        SessionConfig {
            heartbeat_interval: config.heartbeat_interval(),
            heartbeat_timeout: config.heartbeat_timeout(),
            join_timeout: config.heartbeat_timeout().max(config.connect_timeout()),
            lost_grace,
        }
    }
}

/// What the shell tells the session.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// A message from the scheduler.
    Message(FromScheduler),
    /// The control stream or the connection ended (closed, reset, lost), with why.
    StreamEnded(String),
}

/// What the session asks the shell to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Send this to the scheduler.
    Send(ToScheduler),
    /// The scheduler welcomed this node (only the first `Welcome`; later ones are dropped).
    Welcomed {
        /// This node's id (server id or worker rank).
        id: u32,
        /// The cluster.
        map: ClusterMap,
    },
    /// A node was lost: abort everything that waits for it.
    NodeLost {
        /// Which.
        node: NodeName,
        /// Why, as the scheduler said.
        reason: String,
    },
    /// A message only the role knows what to do with (`Placement`, `Declared`,
    /// `BarrierDone`).
    Role(FromScheduler),
}

/// Why a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// `Shutdown` without an error (or the stream ended after one, or after this node
    /// finished).
    Shutdown {
        /// Whether this node had finished ([`Session::finished`]) by then.
        after_finish: bool,
    },
    /// The scheduler refused the registration.
    Refused {
        /// Its reason.
        reason: String,
    },
    /// A node was lost (the first one reported).
    NodeLost {
        /// Which.
        node: NodeName,
        /// Why.
        reason: String,
    },
    /// `Shutdown` with an error.
    JobFailed {
        /// The scheduler's error.
        reason: String,
    },
    /// The scheduler went silent or its stream ended before the job did.
    SchedulerLost {
        /// What happened, e.g. `no message for 3.1 s (heartbeat timeout 3.0 s)`.
        reason: String,
    },
}

/// One node's session (see the module docs).
#[derive(Debug)]
pub struct Session {
    cfg: SessionConfig,
    last_heard: Instant,
    next_heartbeat: Instant,
    welcomed: bool,
    finished: bool,
    /// The first lost node and when the grace ends.
    lost: Option<(NodeName, String, Instant)>,
    end: Option<End>,
    out: VecDeque<Output>,
}

impl Session {
    /// A session that starts at `now`, just after the control stream opened: its first
    /// output is the `Register` message for `registration`.
    pub fn new(cfg: SessionConfig, now: Instant, registration: Registration) -> Session {
        let Registration {
            role,
            requested_id,
            listen_addr,
            digest,
        } = registration;
        let register = ToScheduler::Register {
            version: PROTOCOL_VERSION,
            role,
            requested_id,
            listen_addr,
            digest,
        };
        Session {
            cfg,
            last_heard: now,
            next_heartbeat: now + cfg.heartbeat_interval,
            welcomed: false,
            finished: false,
            lost: None,
            end: None,
            out: VecDeque::from([Output::Send(register)]),
        }
    }

    /// Why the session ended, once it has.
    pub fn end(&self) -> Option<&End> {
        self.end.as_ref()
    }

    /// Whether the scheduler welcomed this node.
    pub fn is_welcomed(&self) -> bool {
        self.welcomed
    }

    /// This node has sent `Finished`: from now on the scheduler going away is the expected end.
    pub fn finished(&mut self) {
        self.finished = true;
    }

    /// The next output to carry out.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// When [`Session::handle_timeout`] must be called next (`None` once ended).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.end.is_some() {
            return None;
        }
        let mut t = self.next_heartbeat.min(self.silence_deadline());
        if let Some((_, _, grace_end)) = &self.lost {
            t = t.min(*grace_end);
        }
        Some(t)
    }

    fn silence_bound(&self) -> Duration {
        if self.welcomed {
            self.cfg.heartbeat_timeout
        } else {
            self.cfg.join_timeout
        }
    }

    fn silence_deadline(&self) -> Instant {
        self.last_heard + self.silence_bound()
    }

    fn finish(&mut self, end: End) {
        if self.end.is_none() {
            self.end = Some(end);
        }
    }

    /// The end a lost node makes, if one was reported.
    fn lost_end(&self) -> Option<End> {
        self.lost.as_ref().map(|(node, reason, _)| End::NodeLost {
            node: node.clone(),
            reason: reason.clone(),
        })
    }

    /// Heartbeats, silence and the lost-node grace, as of `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.end.is_some() {
            return;
        }
        if let Some((_, _, grace_end)) = &self.lost {
            if now >= *grace_end {
                let end = self.lost_end().expect("lost is set");
                self.finish(end);
                return;
            }
        }
        if now >= self.silence_deadline() {
            let silence = now.saturating_duration_since(self.last_heard);
            let end = self.lost_end().unwrap_or_else(|| End::SchedulerLost {
                reason: format!(
                    "no message for {:.1} s (heartbeat timeout {:.1} s)",
                    silence.as_secs_f64(),
                    self.silence_bound().as_secs_f64()
                ),
            });
            self.finish(end);
            return;
        }
        if now >= self.next_heartbeat {
            self.out.push_back(Output::Send(ToScheduler::Heartbeat));
            // One heartbeat however late the call: no burst after a stall.
            self.next_heartbeat = now + self.cfg.heartbeat_interval;
        }
    }

    /// One input at `now`.
    pub fn handle(&mut self, now: Instant, input: Input) {
        if self.end.is_some() {
            return;
        }
        match input {
            Input::StreamEnded(reason) => {
                let end = match self.lost_end() {
                    Some(lost) => lost,
                    None if self.finished => End::Shutdown { after_finish: true },
                    None => End::SchedulerLost { reason },
                };
                self.finish(end);
            }
            Input::Message(msg) => {
                self.last_heard = now;
                self.on_message(now, msg);
            }
        }
    }

    fn on_message(&mut self, now: Instant, msg: FromScheduler) {
        match msg {
            FromScheduler::Heartbeat => {}
            FromScheduler::Welcome { id, map } => {
                if !self.welcomed {
                    self.welcomed = true;
                    self.out.push_back(Output::Welcomed { id, map });
                }
            }
            FromScheduler::Refused { reason } => self.finish(End::Refused { reason }),
            FromScheduler::NodeLost { node, reason } => {
                self.out.push_back(Output::NodeLost {
                    node: node.clone(),
                    reason: reason.clone(),
                });
                if self.lost.is_none() {
                    match self.cfg.lost_grace {
                        Some(grace) => self.lost = Some((node, reason, now + grace)),
                        None => self.finish(End::NodeLost { node, reason }),
                    }
                }
            }
            FromScheduler::Shutdown { error } => {
                let end = match (self.lost_end(), error) {
                    (Some(lost), _) => lost,
                    (None, Some(reason)) => End::JobFailed { reason },
                    (None, None) => End::Shutdown {
                        after_finish: self.finished,
                    },
                };
                self.finish(end);
            }
            other @ (FromScheduler::Placement(_)
            | FromScheduler::Declared { .. }
            | FromScheduler::BarrierDone { .. }) => self.out.push_back(Output::Role(other)),
        }
    }
}

#[cfg(test)]
mod tests;
