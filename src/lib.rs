//! pushpull's root package: the `pushpull` command (the launcher and tools) and
//! `pushpull-worker` (the worker running the built-in jobs). The binaries are thin: each
//! `main` calls one function of [`cli`], so tests and other programs can call the same code.
//! What they run lives in crates of its own, re-exported here under the names the commands
//! use:
//!
//! | module | what it holds |
//! |---|---|
//! | [`cli`] | clap definitions of `pushpull` and `pushpull-worker`; entry points |
//! | [`node`] | the worker command: join, run the cluster file's job, print its report |
//! | [`jobs`] | `pushpull_jobs`: the built-in jobs (the benchmark of the ResNet-50 tensor set, MLP training in candle), their `[job]` settings and data |
//! | [`launch`] | `pushpull_launch`: a cluster of this machine's binaries as child processes (`pushpull local`, a user's script as every worker), certificates (`pushpull certs`) and the cluster file |
//! | [`bench`](mod@bench) | `pushpull_bench`: `pushpull bench transport` (raw quinn against the cluster), `pushpull bench net` (the cluster on a shaped network) and `pushpull bench train` (time to accuracy there, against torch DDP), with plots |
//! | [`cpu`], [`error`], [`logging`], [`report`] | `pushpull_node`'s: CPU seconds, [`CliError`], tracing, the parent–child report lines |
//!
//! The scheduler and server binaries are `pushpull_node`'s, which links neither candle nor
//! plotters. The library crates do the work: `pushpull_scheduler::Scheduler`,
//! `pushpull_server::Server`, `pushpull_worker::Worker`, all on `pushpull_proto` (config,
//! protocol, placement, session) and `pushpull_net` (TLS, transport).

#![warn(missing_docs)]

pub mod cli;
pub mod node;

pub use pushpull_bench as bench;
pub use pushpull_jobs as jobs;
pub use pushpull_launch as launch;
pub use pushpull_node::{cpu, error, logging, report};

pub use error::{CliError, CliResult};
