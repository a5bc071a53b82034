//! pushpull's node commands: the `pushpull-scheduler` and `pushpull-server` binaries, what
//! every node command shares, and what a node tells the process that started it. It links
//! neither the training job (candle, `pushpull_jobs`) nor the benchmarks' plots (plotters,
//! `pushpull_bench`); the worker command that runs the jobs and `pushpull` itself are the root
//! package's.
//!
//! | module | what it holds |
//! |---|---|
//! | [`cli`] | clap definitions of `pushpull-scheduler` and `pushpull-server`, their entry points, the exit codes (0 ok, 1 failed run, 2 bad input), the runtime a node runs on |
//! | [`commands`] | the flags every node takes ([`commands::NodeArgs`]: cluster file, scheduler address, TLS files, metrics address), loading them, the scheduler and server commands: bind, the `listening on` line, the metrics endpoint (`pushpull_metrics`) and its `metrics on` line, run |
//! | [`report`] | what a parent and the processes it starts tell each other on stdout: the `listening on` and `metrics on` lines, the benchmark's progress lines and [`report::JobReport`], the startup timeout (depends on nothing else here) |
//! | [`cpu`] | CPU seconds of this process |
//! | [`logging`] | tracing to stderr, `RUST_LOG` respected |
//! | [`error`] | [`error::CliError`]: bad input (exit 2) or a failed run (exit 1) |

#![warn(missing_docs)]

pub mod cli;
pub mod commands;
pub mod cpu;
pub mod error;
pub mod logging;
pub mod report;

pub use error::{CliError, CliResult};
