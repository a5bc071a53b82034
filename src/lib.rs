//! pushpull's root package: `pushpull` (the launcher and tools) and `pushpull-worker` (the
//! worker running the built-in jobs), and what they run. The binaries are thin: each `main`
//! calls one function of [`cli`], so tests and other programs can call the same code. The
//! scheduler and server binaries, and what every node command shares, are
//! [`pushpull_node`]'s, which links neither candle nor plotters; its [`cpu`], [`error`],
//! [`logging`] and [`report`] are re-exported here.
//!
//! | module | what it holds |
//! |---|---|
//! | [`cli`] | clap definitions of `pushpull` and `pushpull-worker`; entry points |
//! | [`node`] | the worker command: join, run the cluster file's job, print its report |
//! | [`launch`] | a cluster of this machine's binaries: certificates and cluster file ([`launch::ClusterFiles`]), child processes, `pushpull local` |
//! | [`jobs`] | the built-in jobs: the benchmark (ResNet-50 tensor set) and MLP training, their data |
//! | [`bench`](mod@bench) | `pushpull bench transport`: raw quinn throughput with the cluster's settings, and the comparison with the cluster |
//! | [`netbench`] | `pushpull bench net`: the cluster on a shaped network (namespaces, tbf) |
//! | [`certs`] | `pushpull certs`: a cluster CA and node certificates |
//!
//! The library crates do the work: `pushpull_scheduler::Scheduler`, `pushpull_server::Server`,
//! `pushpull_worker::Worker`, all on `pushpull_proto` (config, protocol, placement, session) and
//! `pushpull_net` (TLS, transport).

#![warn(missing_docs)]

pub mod bench;
pub mod certs;
pub mod cli;
pub mod jobs;
pub mod launch;
pub mod netbench;
pub mod node;

pub use pushpull_node::{cpu, error, logging, report};

pub use error::{CliError, CliResult};
