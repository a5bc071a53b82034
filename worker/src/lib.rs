//! The pushpull worker library: what training code calls to sum gradients over a job.
//!
//! ```no_run
//! use pushpull_worker::{JoinOptions, ParamMap, Reduce, Worker};
//! # async fn train() -> Result<(), pushpull_worker::WorkerError> {
//! let worker = Worker::join_with_config_file("configs/local.toml", JoinOptions::default()).await?;
//! let grad = worker.declare("fc1.weight", 1_000_000, ParamMap::new()).await?;
//! let mut buf = vec![0.0f32; 1_000_000];
//! for _step in 0..10 {
//!     // ... fill buf with this worker's gradient ...
//!     buf = worker.push_pull(&grad, buf, Reduce::Average).await?;
//! }
//! worker.finish().await?;
//! # Ok(()) }
//! ```
//!
//! # Map of the crate
//! | item | what it is |
//! |---|---|
//! | [`Worker`] | the async API: [`Worker::join`], [`Worker::declare`], [`Worker::push_pull`] (in place) and [`Worker::push_pull_into`] (out of place), [`Worker::push_pull_group`] and [`Worker::push_pull_group_into`] (a step's tensors together, sent in priority order, each call a [`RoundHandle`]), [`Worker::broadcast`], [`Worker::gossip`] (decentralised averaging of a tensor declared with `exchange = "gossip"`), [`Worker::barrier`], [`Worker::finish`] (or [`Worker::abort`] after a failure), [`Worker::metrics`], [`Worker::discard_last_round`] (a step a loss scaler skipped); [`Worker::push_pull_device`], [`Worker::push_pull_group_device`] (a step's tensors as one batch on the device: a dozen driver calls), [`Worker::push_pull_group_borrowed`] (device memory lent by address, e.g. torch's), [`Worker::broadcast_device`] and [`Worker::cuda_route`] for tensors in device memory |
//! | [`Device`], [`EmulatedDevice`], `CudaDevice` and `GpuContext` (feature `cuda`), [`Place`] | re-exported from `pushpull_kernels`: where device buffers live and are compressed |
//! | [`Worker::save_state`], [`Worker::load_state`], [`Checkpoint`] | checkpoint and restart (`checkpoint`, `worker/checkpoint`): at a barrier each worker saves its chains' state (error-feedback residuals, momentum, the previous learning rate), each tensor's round, the learning rate, the job seed and the settings that change results; rank 0's file also the servers' keys, fetched over the data connections; a fresh job with the same settings loads them and continues bit for bit, and a setting that differs is refused by name; device chains' state is copied from the device, and reaches them again when they are built |
//! | [`BlockingWorker`] | the same for synchronous code (owns a tokio runtime; `&mut [f32]` buffers) |
//! | [`Tensor`] | a declared tensor: name, length, placement, round counter (cheap `Clone`) |
//! | [`Reduce`] | `Sum` or `Average` (sum divided by the number of workers on the worker) |
//! | [`WorkerError`] | every failure; names the tensor (chunk, key, round) or the lost node |
//! | [`Metrics`], [`TensorMetrics`], [`RoundTimes`] | raw and payload bytes pushed and pulled, compression ratio, seconds compressing, waiting, decompressing, a histogram of round times; per tensor and in total; [`Worker::connection_stats`]: QUIC's counters (lost packets, datagrams) per connection |
//! | [`CodecFactory`], [`CodecContext`], [`KernelsFactory`], [`Fp32Factory`] | re-exported from `pushpull_codecs::chunk` (through `pushpull_kernels`), the one codec plug-in of workers and servers: what builds each chunk's [`Compressor`] (by default the chain of the tensor's parameter map, worker role) |
//! | [`prometheus`] | the worker's Prometheus families (rounds, bytes, compression ratio, round-time histogram per tensor and in total) from [`Worker::metrics`], served with `pushpull_metrics` |
//! | [`reference`](mod@reference) | [`reference::Reference`]: the whole job's push_pull in one process, the bit-exact reference for tests and the benchmark's check |
//!
//! Internals: `shared` (state shared with the background tasks: the control writer and
//! reader, heartbeats, one reader per server connection), `dispatch` (matches `Result`/`Abort`
//! frames to waiting chunks by `(key, round)`), `control` (waiters for declares and barriers),
//! `core` (the worker's rules without I/O, tested without sockets or a runtime: one round of
//! one tensor as a state machine, `RoundCore`, events in and actions out; a tensor's sequence
//! of rounds, `TensorRounds`: numbers, the last push_pull round, a discard and its undo; the
//! kinds of round), `round` (the round's async shell: encodes and decodes in the caller's
//! buffer, pushes and awaits), `push` (one chunk's push and the outcome
//! it awaits, what `round` and `local` share: the round's context, the timed codec phases),
//! `data` (the round's buffer behind one interface: host memory, or a device's memory with the
//! device chains launched in batches and a host view of it for everything else, and where a
//! tensor's rounds live),
//! `gossip` (a gossip tensor's row of the mixing matrix, the check that a call fits how a
//! tensor is exchanged, and the average a gossip round's result is decoded into),
//! `gradient_bound` (Moniqua's gradient bound `G` of `theta_schedule = bound`, one per tensor),
//! `tensor` (the declared tensor's state, reduce operations, byte counters),
//! `chunks` (u64 placement ↔ buffer slices), `spans` (the worker's spans in the timeline,
//! `[trace] dir`: a tensor's rounds and each chunk's phases), `checkpoint` (the [`Checkpoint`]
//! file format and the settings a restart must share; `worker/checkpoint.rs` is the shell that
//! saves and loads), `local` (a local group's rounds when
//! `cluster.local_size` > 1: the notes between a host's workers, their shared memory, the
//! chunk's turn, the owner's push; ARCHITECTURE.md "Two levels"). The protocol itself is
//! documented in [`pushpull_proto::protocol`].
//!
//! The modules import one another in one direction only, from the façade down (each imports
//! only modules further down this list; `error` is used by most):
//! `blocking` and `prometheus` (wrappers of [`Worker`]); `worker` (the façade, `worker.rs` and
//! `worker/`); `round`; `local`; `push`; `shared`; `data`; `gossip`; `spans`; `reference`;
//! `tensor`; `core`; `gradient_bound`, `round_times`, `checkpoint`, `chunks`, `control`,
//! `dispatch`, `error`. A module below the façade that needs something of it gets it passed
//! in; nothing there names [`Worker`] except in documentation.
//!
//! # How a push_pull travels
//! The tensor was cut into chunks by the scheduler at declare time; each chunk is a key held
//! by one server. A call takes the tensor's lock (calls on one tensor are serialised, and
//! each call is one round), then in a spawned task encodes (compresses) each chunk with its
//! codec, pushes it to its server on a QUIC stream of its own, and awaits the `Result` frame
//! that the connection's reader task hands over once every worker has pushed that chunk.
//! Results are decoded (decompressed) straight into the caller's buffer, which is handed back.
//! What to do next and how the round ends is decided by the round's state machine (`core`);
//! the task only carries it out.
//!
//! # Compression
//! Each chunk's codec is the compressor chain of the tensor's parameter map
//! ([`KernelsFactory`]: `compressor`, `k`, `ef`, `momentum`, ... or the BytePS keys; see
//! `pushpull_kernels`), built once at declare time and kept for every round, so error
//! feedback and momentum state live with the chunk. Servers build theirs from the same map.
//! Tensors below `cluster.min_compress_bytes` travel as raw fp32 (keeping momentum).
//! [`Worker::set_learning_rate`] feeds corrected error feedback; [`Worker::metrics`] reports
//! raw and compressed bytes and the time spent compressing, waiting and decompressing; and
//! [`reference::Reference`] computes what a job must produce, bit for bit.
//!
//! PowerSGD (`compressor = "powersgd"`, docs/compression.md) is not a per-chunk codec: a
//! tensor's step is a round of its P and then of its Q, two more tensors of `compressor = none`
//! declared with it (`NAME#powersgd.p`, `NAME#powersgd.q`), with the math between them done by
//! the tensor's `pushpull_kernels::PowerSgd` on the host (`worker/low_rank.rs`); its metrics
//! include theirs, and [`Worker::metrics`] lists it alone.
//!
//! # Mixed precision
//! A chunk that holds inf or NaN on some worker is pushed flagged non-finite (its compressor
//! state unchanged), and its sum comes back to every worker as NaN, every chain's round of it
//! undone: every worker's loss scaler then skips the same step, as after an all-reduce. The
//! step's finite chunks changed state; [`Worker::discard_last_round`] undoes that, here and on
//! the servers ([`TensorMetrics::rounds_non_finite`] counts such rounds).
//!
//! # Failures
//! Every wait is bounded by failure detection: when the scheduler reports a lost node, when a
//! connection to the scheduler or a server fails, or when the scheduler is silent for
//! `cluster.heartbeat_timeout_ms`, every pending and later call fails with
//! [`WorkerError::NodeLost`] naming the node (`worker 1 (10.0.0.2:50312)`,
//! `server 0 (10.0.0.3:9100)`, `scheduler (10.0.0.1:9000)`); in a local group, a member that
//! is gone fails every member's calls with [`WorkerError::MemberLost`] naming it.
//!
//! # Running a job
//! Start a scheduler (`pushpull-scheduler --config FILE`) and the servers
//! (`pushpull-server --config FILE`), or a whole local cluster with `pushpull local`; then
//! run training processes that join with the same cluster file. See `examples/basic.rs`.
//!
//! [`Compressor`]: pushpull_kernels::Compressor

#![warn(missing_docs)]

mod blocking;
mod checkpoint;
mod chunks;
mod control;
mod core;
mod data;
mod dispatch;
mod error;
mod gossip;
mod gradient_bound;
mod local;
pub mod prometheus;
mod push;
pub mod reference;
mod round;
mod round_times;
mod shared;
mod spans;
mod tensor;
mod worker;

pub use blocking::BlockingWorker;
pub use checkpoint::{Checkpoint, CHECKPOINT_VERSION};
pub use error::WorkerError;
pub use pushpull_kernels::cuda::Device as Place;
#[cfg(feature = "cuda")]
pub use pushpull_kernels::cuda::{CudaDevice, CudaError, GpuContext};
pub use pushpull_kernels::device::{Device, EmulatedDevice};
pub use pushpull_kernels::{CodecContext, CodecFactory, Fp32Factory, KernelsFactory, Node};
pub use round_times::{RoundTimes, ROUND_SECONDS_BUCKETS};
pub use tensor::{Metrics, Reduce, Tensor, TensorMetrics};
pub use worker::{JoinOptions, RoundHandle, Worker};

pub use pushpull_net::tls::TlsIdentity;
pub use pushpull_proto::{Config, NodeName, NodeRole, ParamMap};
