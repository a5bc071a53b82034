//! pushpull's benchmarks, each a `pushpull bench` subcommand, each reporting ratios measured in
//! the same run (BENCHMARKS.md records their numbers with the commands).
//!
//! | module | what it holds |
//! |---|---|
//! | [`transport`] | `pushpull bench transport`: raw quinn throughput with the cluster's settings (sinks and senders as child processes), and its comparison with the cluster's push_pull (`--compare`) |
//! | [`net`] | `pushpull bench net`: the cluster on a shaped network (a namespace per node, tbf), against the wire floor, raw quinn and gloo; series, tables and plots |
//! | [`tta`] | `pushpull bench train`: time to accuracy on the same shaped network, `bench/tta/train.py` per worker host through pushpull (separate and colocated servers) and torch DDP on gloo; tables, JSON and plots |
//!
//! All start their processes through `pushpull_launch`; `transport` and `net` read the workers'
//! reports of `pushpull_jobs`, `tta` the JSON lines of its Python script.

#![warn(missing_docs)]

pub mod net;
pub mod transport;
pub mod tta;
