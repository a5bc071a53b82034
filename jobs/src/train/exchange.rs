//! [`Exchange`]: what the training loop needs from the worker library (declare, push_pull of a
//! step's gradients or gossip of its model, broadcast, the learning rate, the metrics), so
//! the same loop runs on a
//! [`BlockingWorker`], on an async [`Worker`] from inside its runtime, and in tests on a
//! wrapper that tampers with the results.

use pushpull_worker::{BlockingWorker, Metrics, ParamMap, Reduce, Tensor, Worker, WorkerError};

/// The worker operations the training loop uses.
pub trait Exchange {
    /// This worker's rank.
    fn rank(&self) -> u32;
    /// Workers in the job.
    fn num_workers(&self) -> u32;
    /// The job seed (the task, the initial weights and the batch order derive from it).
    fn job_seed(&self) -> u64;
    /// Declares a tensor with the cluster file's map for `name` overlaid with `params` (a
    /// collective: every worker, same order, same names).
    fn declare(&self, name: &str, len: u64, params: ParamMap) -> Result<Tensor, WorkerError>;
    /// Sets the learning rate of this step (for `ef = "corrected"`); called before the step's
    /// push_pulls.
    fn set_learning_rate(&self, lr: f32);
    /// Reports this step's gradient (or update over the rate) of `tensor`, whose largest
    /// magnitude so far moniqua's `theta_schedule = "bound"` reads
    /// ([`Worker::track_gradient`]); called before the step's gossip.
    fn track_gradient(&self, tensor: &Tensor, gradient: &[f32]) -> Result<(), WorkerError>;
    /// push_pulls every buffer with [`Reduce::Average`], all in flight at once; `bufs[i]`
    /// belongs to `tensors[i]` and is replaced by the average over all workers.
    fn push_pull_all(&self, tensors: &[Tensor], bufs: &mut [Vec<f32>]) -> Result<(), WorkerError> {
        self.all(Op::Average, tensors, bufs)
    }
    /// Runs `op` on every buffer, all in flight at once; `bufs[i]` belongs to `tensors[i]`.
    fn all(&self, op: Op, tensors: &[Tensor], bufs: &mut [Vec<f32>]) -> Result<(), WorkerError>;
    /// The worker's byte counters and timings.
    fn metrics(&self) -> Metrics;
}

/// What [`Exchange::all`] does with each buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// push_pull with [`Reduce::Average`].
    Average,
    /// One step of decentralised averaging (tensors declared with `exchange = "gossip"`).
    Gossip,
    /// Everyone gets rank `root`'s buffer.
    Broadcast(u32),
}

/// Runs `op` on every buffer concurrently on `worker`'s runtime (call inside `block_on`).
async fn concurrently(
    worker: &Worker,
    op: Op,
    tensors: &[Tensor],
    bufs: &mut [Vec<f32>],
) -> Result<(), WorkerError> {
    let mut set = tokio::task::JoinSet::new();
    for (i, (t, buf)) in tensors.iter().zip(bufs.iter_mut()).enumerate() {
        let (w, t, b) = (worker.clone(), t.clone(), std::mem::take(buf));
        set.spawn(async move {
            let out = match op {
                Op::Average => w.push_pull(&t, b, Reduce::Average).await,
                Op::Gossip => w.gossip(&t, b).await,
                Op::Broadcast(root) => w.broadcast(&t, b, root).await,
            };
            (i, out)
        });
    }
    let mut first_err = None;
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((i, Ok(out))) => bufs[i] = out,
            Ok((_, Err(e))) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err.get_or_insert(WorkerError::Internal(format!("push_pull task: {e}")));
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}

impl Exchange for BlockingWorker {
    fn rank(&self) -> u32 {
        BlockingWorker::rank(self)
    }
    fn num_workers(&self) -> u32 {
        BlockingWorker::num_workers(self)
    }
    fn job_seed(&self) -> u64 {
        BlockingWorker::job_seed(self)
    }
    fn declare(&self, name: &str, len: u64, params: ParamMap) -> Result<Tensor, WorkerError> {
        BlockingWorker::declare(self, name, len, params)
    }
    fn set_learning_rate(&self, lr: f32) {
        BlockingWorker::set_learning_rate(self, lr);
    }
    fn track_gradient(&self, tensor: &Tensor, gradient: &[f32]) -> Result<(), WorkerError> {
        BlockingWorker::track_gradient(self, tensor, gradient)
    }
    fn all(&self, op: Op, tensors: &[Tensor], bufs: &mut [Vec<f32>]) -> Result<(), WorkerError> {
        self.runtime()
            .block_on(concurrently(self.worker(), op, tensors, bufs))
    }
    fn metrics(&self) -> Metrics {
        BlockingWorker::metrics(self)
    }
}

/// An async [`Worker`] driven from synchronous code running on one of its own runtime's
/// threads (a multi-threaded tokio runtime): each call is `block_in_place` + `block_on`.
#[derive(Debug, Clone)]
pub struct InRuntime<'a> {
    /// The worker.
    pub worker: &'a Worker,
    /// The runtime it runs on (multi-threaded).
    pub handle: tokio::runtime::Handle,
}

impl InRuntime<'_> {
    fn block<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        tokio::task::block_in_place(|| self.handle.block_on(f))
    }
}

impl Exchange for InRuntime<'_> {
    fn rank(&self) -> u32 {
        self.worker.rank()
    }
    fn num_workers(&self) -> u32 {
        self.worker.num_workers()
    }
    fn job_seed(&self) -> u64 {
        self.worker.job_seed()
    }
    fn declare(&self, name: &str, len: u64, params: ParamMap) -> Result<Tensor, WorkerError> {
        self.block(self.worker.declare(name, len, params))
    }
    fn set_learning_rate(&self, lr: f32) {
        self.worker.set_learning_rate(lr);
    }
    fn track_gradient(&self, tensor: &Tensor, gradient: &[f32]) -> Result<(), WorkerError> {
        self.worker.track_gradient(tensor, gradient)
    }
    fn all(&self, op: Op, tensors: &[Tensor], bufs: &mut [Vec<f32>]) -> Result<(), WorkerError> {
        self.block(concurrently(self.worker, op, tensors, bufs))
    }
    fn metrics(&self) -> Metrics {
        self.worker.metrics()
    }
}
