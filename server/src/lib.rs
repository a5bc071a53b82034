//! The pushpull server: holds a shard of the keys, sums each round's pushes in rank order and
//! sends every worker the (re-encoded) sum.
//!
//! | module | what it holds |
//! |---|---|
//! | [`rounds`] | the per-key round logic as a pure state machine ([`rounds::KeyRounds`]: pushes in, [`rounds::Action`]s out; no I/O, no clock), with the rules of SPINE-CONTRACT §7 and their tests |
//! | [`factory`] | [`CodecFactory`]: where each key's [`common::codec::ChunkCodec`] comes from, the plug-in point for compressors; [`KernelsFactory`] (the tensor's compressor chain) is the default |
//! | [`service`] | the async shell: [`Server::bind`] / [`Server::run`], registration and heartbeats with the scheduler, worker connections, one task per incoming stream and per outgoing frame |
//!
//! # Life of a server
//! 1. [`Server::bind`] binds a QUIC endpoint at `server.listen`.
//! 2. [`Server::run`] dials the scheduler (retrying for `cluster.connect_timeout_ms`), sends
//!    `Register` with the address workers should dial ([`service::advertised_addr`]), and
//!    waits for `Welcome` (or fails with the scheduler's `Refused` reason).
//! 3. For each `Placement`, it builds a [`rounds::KeyRounds`] per chunk placed on it (codec from
//!    the [`CodecFactory`]) and answers `PlacementAck`.
//! 4. Workers connect, say `Hello` (their rank), and push chunks; each completed round's result
//!    goes to every worker, each rejected push aborts that key's round for every worker with a
//!    message naming the tensor, chunk, key, round and rank.
//! 5. `Shutdown` without error: `run` returns `Ok(())`. Scheduler silence past the heartbeat
//!    timeout, a lost scheduler connection or a `NodeLost` report: open rounds are aborted
//!    naming the cause and `run` returns a [`ServerError`] naming it.

#![warn(missing_docs)]

// The shared crate under the short name the whole workspace uses in prose.
extern crate pushpull_common as common;

pub mod factory;
pub mod rounds;
pub mod service;

pub use factory::{CodecContext, CodecFactory, Fp32Factory, KernelsFactory};
pub use service::{Server, ServerError};
