//! pushpull's built-in jobs, what `pushpull-worker` runs when the cluster file's `[job] kind` says
//! so (`pushpull local` starts it), and what they are made of. The training job is the only
//! user of candle in the house.
//!
//! | module | what it holds |
//! |---|---|
//! | [`settings`] | [`JobConfig`]: the `[job]` table, read and checked here (the nodes leave it to the job), and [`settings::load`] of a cluster file with it |
//! | [`benchmark`] | the benchmark job: ResNet-50 tensor set, broadcast, timed push_pull rounds, bit-exact checks; its report is [`pushpull_node::report::JobReport`] |
//! | [`buffers`] | where the benchmark's tensors live (`job.buffers`: host memory, a GPU, the emulated device) and how a round reduces them |
//! | [`train`] | the training job: an MLP in candle on a synthetic task, its gradients through push_pull, the comparison table of `pushpull local --compare` |
//! | [`data`] | reproducible per-(seed, round, rank, tensor) data and the rank-order sums to check against |
//! | [`resnet`] | ResNet-50's 161 parameter shapes |

#![warn(missing_docs)]

pub mod benchmark;
pub mod buffers;
pub mod data;
pub mod resnet;
pub mod settings;
pub mod train;

pub use settings::JobConfig;
