//! What every pushpull node shares: configuration, the wire protocol, chunk placement, TLS and
//! the QUIC transport.
//!
//! | module | what it holds |
//! |---|---|
//! | [`config`] | the TOML cluster file ([`config::Config`]), validation with errors that name the key, the digest of settings that must agree across nodes |
//! | [`protocol`] | control messages (node ↔ scheduler, bincode 2) and the fixed 40-byte data-frame header (worker ↔ server), with the rules that keep stream credit from running out |
//! | [`placement`] | pure arithmetic: equal-size chunks, keys from names, least-loaded-by-bytes placement |
//! | [`codec`] | [`codec::ChunkCodec`], the plug-in point where compression enters the data path, and the fp32 codec |
//! | [`pool`] | [`pool::BufPool`]: reused byte buffers for encoded payloads, returned when QUIC drops the `Bytes` |
//! | [`sendq`] | [`sendq::SendQueue`]: the order data frames leave a connection (priority, FIFO within one, a byte window freed on delivery), as a pure state machine |
//! | [`sender`] | [`sender::FrameSender`]: the async shell that drives a `SendQueue` over one QUIC connection |
//! | [`tls`] | mutual TLS 1.3 with a cluster CA: loading PEM files, rustls configs, generating a CA and node certificates |
//! | [`transport`] | quinn endpoints with the measured settings, control streams, one data frame per unidirectional stream |
//!
//! Everything here except [`transport`] and [`sender`] is free of I/O, so ordering and failure cases are
//! tested without sockets.

pub mod codec;
pub mod config;
pub mod placement;
pub mod pool;
pub mod protocol;
pub mod sender;
pub mod sendq;
pub mod tls;
pub mod transport;

pub use config::{Config, ConfigError, ParamMap};
pub use protocol::{NodeName, NodeRole};
