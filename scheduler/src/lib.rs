//! The pushpull scheduler: rendezvous, ranks, tensor placement, barriers, heartbeats and
//! shutdown for a cluster of servers and workers (the rules are in [`state`] and in
//! [`pushpull_proto::protocol`]).
//!
//! | module | what it holds |
//! |---|---|
//! | [`state`] | [`SchedulerState`]: the whole scheduler as a pure, deterministic state machine (no sockets, no clock): [`Event`]s in, [`Action`]s out; registration and refusals, ids, Welcome, declare collectives and placement, barriers, heartbeat loss, clean finish. Tested without a network. |
//! | [`stats`] | [`SchedulerStats`]: the nodes' liveness (missed heartbeats, silence) and QUIC's counters of their connections, published a few times per heartbeat interval (the metrics endpoint's source) |
//! | [`prometheus`] | the scheduler's Prometheus families (missed heartbeats and silence per node) from [`SchedulerStats`], served with `pushpull_metrics` |
//! | [`service`] | [`Scheduler`]: the thin async shell: binds the QUIC endpoint, one task per connection (control stream reader + writer), the timer, executes actions, shuts down with a bounded grace period. |
//!
//! Entry points (used by the `pushpull` binaries):
//!
//! ```no_run
//! # async fn f(config: pushpull_proto::Config,
//! #            identity: pushpull_net::tls::TlsIdentity) -> Result<(), pushpull_scheduler::SchedulerError> {
//! let scheduler = pushpull_scheduler::Scheduler::bind(config, identity).await?;
//! println!("scheduler at {}", scheduler.local_addr());
//! scheduler.run().await // Ok once every worker finished; Err naming a lost node
//! # }
//! ```

pub mod prometheus;
pub mod service;
pub mod state;
pub mod stats;

pub use service::{Scheduler, SchedulerError};
pub use state::{Action, ConnId, Event, JobFailure, Liveness, SchedulerState, StateConfig};
pub use stats::{SchedulerSnapshot, SchedulerStats};
