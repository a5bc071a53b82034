//! pushpull's root package: the four binaries, the local launcher, the built-in benchmark job,
//! certificate generation and the transport benchmark. The binaries are thin: each `main` calls
//! one function of [`cli`], so tests and other programs can call the same code.
//!
//! | module | what it holds |
//! |---|---|
//! | [`cli`] | clap definitions of `pushpull`, `pushpull-scheduler`, `pushpull-server`, `pushpull-worker`; entry points; exit codes (0 ok, 1 failed run, 2 bad input) |
//! | [`node`] | the scheduler, server and worker commands: config + overrides, TLS identity, bind, the `listening on` lines, run |
//! | [`job`] | the built-in benchmark job: ResNet-50 tensor set, broadcast, timed push_pull rounds, bit-exact checks, [`job::JobReport`] |
//! | [`data`] | reproducible per-(seed, round, rank, tensor) data and the rank-order sums to check against |
//! | [`resnet`] | ResNet-50's 161 parameter shapes |
//! | [`local`] | `pushpull local`: a whole cluster as child processes on loopback |
//! | [`procs`] | child processes: spawning, stdout lines, stderr tails, kill on drop / failure / Ctrl-C |
//! | [`bench`](mod@bench) | `pushpull bench transport`: raw quinn throughput with the cluster's settings, and the comparison with the cluster |
//! | [`certs`] | `pushpull certs`: a cluster CA and node certificates |
//! | [`cpu`] | CPU seconds of this process |
//! | [`logging`] | tracing to stderr, `RUST_LOG` respected |
//! | [`error`] | [`error::CliError`]: bad input (exit 2) or a failed run (exit 1) |
//!
//! The library crates do the work: `pushpull_scheduler::Scheduler`, `pushpull_server::Server`,
//! `pushpull_worker::Worker`, all on `pushpull_proto` (config, protocol, placement) and `pushpull_net` (TLS, transport).

#![warn(missing_docs)]

pub mod bench;
pub mod certs;
pub mod cli;
pub mod cpu;
pub mod data;
pub mod error;
pub mod job;
pub mod local;
pub mod logging;
pub mod netbench;
pub mod node;
pub mod procs;
pub mod resnet;
pub mod train;

pub use error::{CliError, CliResult};
