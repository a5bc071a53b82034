//! pushpull's I/O-free core, shared by every node: what a cluster file says, what nodes say to
//! each other, where each chunk lives and in which order frames leave. Nothing here opens a
//! socket, reads a clock or spawns a task, so every rule is tested without a network (the
//! networking shell is the `pushpull-net` crate; the compression plug-in is in
//! `pushpull-codecs`). The one exception is a convenience: [`Config::from_file`] reads the
//! cluster file it is given, and hands the text to [`Config::from_toml_str`], which every
//! rule goes through.
//!
//! | module | what it holds |
//! |---|---|
//! | [`checkpoint`] | the compressor state a checkpoint carries: a chain's ([`checkpoint::ChainState`]) and a server key's ([`checkpoint::KeyState`]), which travels in the state frames |
//! | [`config`] | the TOML cluster file ([`config::Config`]), validation with errors that name the key, the digest of settings that must agree across nodes |
//! | [`protocol`] | control messages (node ↔ scheduler, bincode 2) and the fixed 40-byte data-frame header (worker ↔ server), with the rules that keep stream credit from running out |
//! | [`placement`] | pure arithmetic: equal-size chunks, each tensor's cut ([`placement::TensorCut`], from the rules of [`config::CutRules`] and its codec's [`placement::PayloadModel`]: fp32 and fp16 tensors finer), keys from names, least-loaded-by-bytes placement (balanced within each parameter map); [`placement::mix64`] |
//! | [`sendq`] | [`sendq::SendQueue`]: the order data frames leave a node (priority, FIFO within one, a byte window freed on delivery) and [`sendq::DeliveryRate`] (the delivery rate that sizes the window), as pure state machines |
//! | [`session`] | [`session::Session`]: a node's session with the scheduler (`Register`, heartbeats, silence, `Welcome`, `NodeLost`, `Shutdown`), shared by servers and workers |
//! | [`gossip`] | [`gossip::Mixing`]: the mixing matrix of a decentralised (gossip) exchange, checked (symmetric, doubly stochastic, spectral gap below 1) |
//! | [`grant`] | [`grant::Grant`]: the role (and id) a node's certificate lets it play, as a `pushpull://ROLE/ID` URI, and the checks every node makes |
//! | [`departure`] | [`departure::Departure`]: why a node closed its connections (the QUIC close code and reason), so peers name the node really at fault |
//! | [`pool`] | [`pool::Pool`] (and [`pool::BufPool`] of `Vec<u8>`s): reused buffers for encoded payloads, returned when the last `Bytes` handle drops |
//!
//! The crate graph: `pushpull-proto` ← `pushpull-codecs` (compression on the CPU) ←
//! `pushpull-kernels` (on a device), and `pushpull-net` (TLS, quinn); the scheduler and the
//! server use the codecs, the worker the kernels ← `pushpull` (the CLI)
//! and `pushpull-python` (the Python package's binding, on the worker).

pub mod checkpoint;
pub mod config;
pub mod departure;
pub mod gossip;
pub mod grant;
pub mod placement;
pub mod pool;
pub mod protocol;
pub mod sendq;
pub mod session;

pub use config::{Config, ConfigError, ParamMap};
pub use protocol::{NodeName, NodeRole};
