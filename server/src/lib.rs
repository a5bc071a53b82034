//! The pushpull server: holds a shard of the keys, sums each round's pushes in rank order (one
//! push per host with local groups, summed in host order) and sends the (re-encoded) sum to
//! every worker that pushed it.
//!
//! | module | what it holds |
//! |---|---|
//! | [`rounds`] | the per-key round logic as a pure state machine ([`rounds::KeyRounds`]: pushes in, [`rounds::Action`]s out; no I/O, no clock), with its rules and their tests |
//! | `shared` | what every task of a running server shares (`Shared`: settings, the key table, each key's counters, the worker connections, the one send queue for results and aborts) and the sending half of the data plane: a key's [`rounds::Action`]s carried out as frames to workers |
//! | `data` | the receiving half of the data plane: worker connections (`Hello` first), one task per incoming stream, each frame fed to its key |
//! | `spans` | the server's spans in the timeline (`[trace] dir`): per key and round `receive`, `sum (host H)`, `encode` |
//! | `checkpoint` | the state frames: a key's [`rounds::KeyRounds::save_state`] to the worker that asks (`StateGet`), a restarted job's [`rounds::KeyRounds::load_state`] (`StatePut`); servers write no file, their state lands in rank 0's checkpoint |
//! | [`stats`] | [`ServerStats`]: per-tensor rounds and bytes and each connection's QUIC counters, read at any time (the metrics endpoint's source) |
//! | [`prometheus`] | the server's Prometheus families (key rounds and bytes per tensor and in total) from [`ServerStats`], served with `pushpull_metrics` |
//! | [`service`] | the async shell: [`Server::bind`] / [`Server::run`], the scheduler session (registration, placements, heartbeats, shutdown) |
//!
//! # Life of a server
//! 1. [`Server::bind`] binds a QUIC endpoint at `server.listen`.
//! 2. [`Server::run`] dials the scheduler (retrying for `cluster.connect_timeout_ms`), sends
//!    `Register` with the address workers should dial ([`service::advertised_addr`]), and
//!    waits for `Welcome` (or fails with the scheduler's `Refused` reason).
//! 3. For each `Placement`, it builds a [`rounds::KeyRounds`] per chunk placed on it and answers
//!    `PlacementAck`. Each key's codec comes from a [`CodecFactory`], the codec plug-in that
//!    workers use too (`pushpull_codecs::chunk`, re-exported here): by default
//!    [`KernelsFactory`], the tensor's compressor chain in the server role; another plugs in
//!    with [`Server::with_codec_factory`]. A factory error goes back to the scheduler in
//!    `PlacementAck { error }` and fails every worker's declare of that tensor.
//! 4. Workers connect, say `Hello` (their rank), and push chunks; each completed round's result
//!    goes to every worker that pushes the key (every worker, or with `cluster.local_size` > 1
//!    each host's owner of the chunk: [`rounds::KeyInfo::owner_ranks`]), each rejected push
//!    aborts that key's round for them with a message naming the tensor, chunk, key, round and
//!    rank.
//! 5. `Shutdown` without error: `run` returns `Ok(())`. Scheduler silence past the heartbeat
//!    timeout, a lost scheduler connection or a `NodeLost` report: open rounds are aborted
//!    naming the cause and `run` returns a [`ServerError`] naming it.

#![warn(missing_docs)]

mod checkpoint;
mod data;
pub mod prometheus;
pub mod rounds;
pub mod service;
mod shared;
mod spans;
pub mod stats;

pub use pushpull_codecs::{CodecContext, CodecFactory, Fp32Factory, KernelsFactory, Node};
pub use service::{Server, ServerError};
pub use stats::{ServerSnapshot, ServerStats, ServerTensorStats};
