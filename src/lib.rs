//! pushpull's root package: the four binaries, and what they run. The binaries are thin: each
//! `main` calls one function of [`cli`], so tests and other programs can call the same code.
//!
//! | module | what it holds |
//! |---|---|
//! | [`cli`] | clap definitions of `pushpull`, `pushpull-scheduler`, `pushpull-server`, `pushpull-worker`; entry points; exit codes (0 ok, 1 failed run, 2 bad input) |
//! | [`node`] | the scheduler, server and worker commands: config + overrides, TLS identity, bind, the `listening on` lines, run |
//! | [`report`] | what a parent and the processes it starts tell each other on stdout: the `listening on` lines, the benchmark's progress lines and [`report::JobReport`], the startup timeout (depends on nothing else here) |
//! | [`launch`] | a cluster of this machine's binaries: certificates and cluster file ([`launch::ClusterFiles`]), child processes, `pushpull local` |
//! | [`jobs`] | the built-in jobs: the benchmark (ResNet-50 tensor set) and MLP training, their data |
//! | [`bench`](mod@bench) | `pushpull bench transport`: raw quinn throughput with the cluster's settings, and the comparison with the cluster |
//! | [`netbench`] | `pushpull bench net`: the cluster on a shaped network (namespaces, tbf) |
//! | [`certs`] | `pushpull certs`: a cluster CA and node certificates |
//! | [`cpu`] | CPU seconds of this process |
//! | [`logging`] | tracing to stderr, `RUST_LOG` respected |
//! | [`error`] | [`error::CliError`]: bad input (exit 2) or a failed run (exit 1) |
//!
//! The library crates do the work: `pushpull_scheduler::Scheduler`, `pushpull_server::Server`,
//! `pushpull_worker::Worker`, all on `pushpull_proto` (config, protocol, placement, session) and
//! `pushpull_net` (TLS, transport).

#![warn(missing_docs)]

pub mod bench;
pub mod certs;
pub mod cli;
pub mod cpu;
pub mod error;
pub mod jobs;
pub mod launch;
pub mod logging;
pub mod netbench;
pub mod node;
pub mod report;

pub use error::{CliError, CliResult};
