//! pushpull's networking shell: mutual TLS with a cluster CA and the QUIC transport every node
//! uses, driving the I/O-free pieces of `pushpull-proto` (frame headers, control messages, the
//! send queue) over quinn.
//!
//! | module | what it holds |
//! |---|---|
//! | [`tls`] | mutual TLS 1.3 with a cluster CA: loading PEM files (and checking a key's permissions), rustls configs |
//! | [`certs`] | generating a CA and node certificates (keys 0600, the CA key in its own folder, roles as `pushpull://` URIs), reading the role a peer's certificate grants |
//! | [`transport`] | quinn endpoints with the measured settings, control streams, one data frame per unidirectional stream, the socket-wrapper hook tests use |
//! | [`lossy`] | [`lossy::LossySocket`]: quinn's UDP socket behind seeded drops, duplicates and delays, for tests (no netem here) |
//! | [`trace`] | the optional per-frame timeline (`PUSHPULL_FRAME_TRACE=DIR`): when each frame was queued, handed to quinn, acknowledged, read |
//! | [`timeline`] | the optional Chrome trace of a process (`[trace] dir`, `PUSHPULL_TRACE=DIR`): async spans per tensor round, chunk phase, server key phase and frame, buffered in memory and written when the node ends |
//! | [`cap`] | [`cap::WindowCap`]: a ceiling on the congestion windows of an endpoint's connections (Cubic under it), set by the node's sender |
//! | [`sender`] | [`sender::FrameSender`]: the async shell that drives one `SendQueue` over all of a node's data connections |

pub mod cap;
pub mod certs;
pub mod lossy;
pub mod sender;
pub mod timeline;
pub mod tls;
pub mod trace;
pub mod transport;
