//! pushpull's benchmarks, each a `pushpull bench` subcommand, each reporting ratios measured in
//! the same run (BENCHMARKS.md records their numbers with the commands).
//!
//! | module | what it holds |
//! |---|---|
//! | [`transport`] | `pushpull bench transport`: raw quinn throughput with the cluster's settings (sinks and senders as child processes), and its comparison with the cluster's push_pull (`--compare`) |
//! | [`net`] | `pushpull bench net`: the cluster on a shaped network (a namespace per node, tbf), against the wire floor, raw quinn and gloo; series, tables and plots |
//!
//! Both start their processes through `pushpull_launch` and read the workers' reports of
//! `pushpull_jobs`.

#![warn(missing_docs)]

pub mod net;
pub mod transport;
