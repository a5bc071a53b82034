//! [`BlockingWorker`]: the worker API for synchronous code.

use std::path::Path;

use pushpull_net::tls::TlsIdentity;
use pushpull_proto::{Config, ParamMap};

use crate::error::WorkerError;
use crate::tensor::{Metrics, Reduce, Tensor};
use crate::worker::{JoinOptions, Worker};

/// A [`Worker`] with its own tokio runtime, for training code that isn't async.
///
/// Every method blocks the calling thread until the operation completes. Don't call them from
/// inside an async runtime (tokio panics on a nested `block_on`); use [`Worker`] there.
///
/// The buffer methods take `&mut [f32]` and work in it in place: the round reads the
/// caller's data and writes each chunk's result over it, with no copy of the slice (the slice
/// is lent to the round's task for the duration of the call, which blocks until the task has
/// ended).
///
/// Dropping a `BlockingWorker` without [`finish`](BlockingWorker::finish) is like dropping a
/// `Worker`: connections close at once and the scheduler reports this worker lost, failing
/// the job. The runtime is shut down after the worker.
pub struct BlockingWorker {
    worker: Option<Worker>,
    runtime: tokio::runtime::Runtime,
}

impl BlockingWorker {
    /// Starts a multi-threaded runtime and [`Worker::join`]s on it.
    ///
    /// # Errors
    /// As [`Worker::join`]; [`WorkerError::Internal`] if the runtime can't start.
    pub fn join(
        config: &Config,
        identity: TlsIdentity,
        opts: JoinOptions,
    ) -> Result<BlockingWorker, WorkerError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("pushpull-worker")
            .build()
            .map_err(|e| WorkerError::Internal(format!("cannot start a tokio runtime: {e}")))?;
        let worker = runtime.block_on(Worker::join(config, identity, opts))?;
        Ok(BlockingWorker {
            worker: Some(worker),
            runtime,
        })
    }

    /// Reads the cluster file, loads the TLS identity its `[tls]` section names and joins (see
    /// [`Worker::join_with_config_file`]).
    pub fn join_with_config_file(
        path: impl AsRef<Path>,
        opts: JoinOptions,
    ) -> Result<BlockingWorker, WorkerError> {
        let config = Config::from_file(path).map_err(|e| WorkerError::Config(e.to_string()))?;
        let identity =
            TlsIdentity::load(&config.tls).map_err(|e| WorkerError::Config(e.to_string()))?;
        BlockingWorker::join(&config, identity, opts)
    }

    /// The async handle (usable on [`BlockingWorker::runtime`]).
    pub fn worker(&self) -> &Worker {
        self.worker.as_ref().expect("present until drop or finish")
    }

    /// The runtime the worker runs on.
    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        &self.runtime
    }

    /// See [`Worker::rank`].
    pub fn rank(&self) -> u32 {
        self.worker().rank()
    }

    /// See [`Worker::num_workers`].
    pub fn num_workers(&self) -> u32 {
        self.worker().num_workers()
    }

    /// See [`Worker::num_servers`].
    pub fn num_servers(&self) -> u32 {
        self.worker().num_servers()
    }

    /// See [`Worker::job_seed`].
    pub fn job_seed(&self) -> u64 {
        self.worker().job_seed()
    }

    /// See [`Worker::set_learning_rate`].
    pub fn set_learning_rate(&self, lr: f32) {
        self.worker().set_learning_rate(lr)
    }

    /// See [`Worker::track_gradient`].
    pub fn track_gradient(&self, tensor: &Tensor, gradient: &[f32]) -> Result<(), WorkerError> {
        self.worker().track_gradient(tensor, gradient)
    }

    /// See [`Worker::metrics`].
    pub fn metrics(&self) -> Metrics {
        self.worker().metrics()
    }

    /// See [`Worker::tensor`].
    pub fn tensor(&self, name: &str) -> Result<Tensor, WorkerError> {
        self.worker().tensor(name)
    }

    /// Blocking [`Worker::declare`].
    pub fn declare(&self, name: &str, len: u64, params: ParamMap) -> Result<Tensor, WorkerError> {
        self.runtime
            .block_on(self.worker().declare(name, len, params))
    }

    /// Blocking [`Worker::push_pull`]: `buf` is replaced by the sum (or average) over all
    /// workers, in place. Errors as `Worker::push_pull`; on error `buf` holds the results of
    /// the chunks that completed and this worker's data elsewhere.
    pub fn push_pull(
        &self,
        tensor: &Tensor,
        buf: &mut [f32],
        op: Reduce,
    ) -> Result<(), WorkerError> {
        let lent = Lent::new(buf);
        self.runtime
            .block_on(self.worker().push_pull(tensor, lent, op))
            .map(drop)
    }

    /// Blocking [`Worker::broadcast`]: `buf` is replaced by the root's data, in place. Errors
    /// as `Worker::broadcast`; on error `buf` holds the root's data for the chunks that
    /// completed.
    pub fn broadcast(
        &self,
        tensor: &Tensor,
        buf: &mut [f32],
        root: u32,
    ) -> Result<(), WorkerError> {
        let lent = Lent::new(buf);
        self.runtime
            .block_on(self.worker().broadcast(tensor, lent, root))
            .map(drop)
    }

    /// Blocking [`Worker::gossip`]: `buf` (this worker's model) is replaced by its average with
    /// the graph neighbours', in place. Errors as `Worker::gossip`; on error `buf` holds the
    /// average for the chunks that completed.
    pub fn gossip(&self, tensor: &Tensor, buf: &mut [f32]) -> Result<(), WorkerError> {
        let lent = Lent::new(buf);
        self.runtime
            .block_on(self.worker().gossip(tensor, lent))
            .map(drop)
    }

    /// Blocking [`Worker::discard_last_round`].
    pub fn discard_last_round(&self, tensors: &[Tensor]) -> Result<(), WorkerError> {
        self.runtime
            .block_on(self.worker().discard_last_round(tensors))
    }

    /// Blocking [`Worker::barrier`].
    pub fn barrier(&self) -> Result<(), WorkerError> {
        self.runtime.block_on(self.worker().barrier())
    }

    /// Blocking [`Worker::save_state`].
    pub fn save_state(&self, path: impl AsRef<std::path::Path>) -> Result<(), WorkerError> {
        self.runtime.block_on(self.worker().save_state(path))
    }

    /// Blocking [`Worker::load_state`].
    pub fn load_state(&self, path: impl AsRef<std::path::Path>) -> Result<(), WorkerError> {
        self.runtime.block_on(self.worker().load_state(path))
    }

    /// Blocking [`Worker::finish`], then shuts the runtime down.
    pub fn finish(mut self) -> Result<(), WorkerError> {
        let worker = self.worker.take().expect("present until drop or finish");
        self.runtime.block_on(worker.finish())
    }
}

/// A caller's slice lent to a round task for the duration of one blocking call.
///
/// The round runs in a spawned task, which needs an owned (`'static`) buffer. `Lent` carries
/// the slice's pointer instead. This is sound because the blocking methods hold the `&mut`
/// borrow until `block_on` returns, and `block_on` of `push_pull`/`broadcast` returns only
/// after the round's task has ended (`Worker::submit` awaits it; nothing aborts it, and the
/// runtime it runs on lives as long as this `BlockingWorker`), so no access outlives the
/// borrow, and nothing else touches the slice meanwhile.
struct Lent {
    ptr: *mut f32,
    len: usize,
}

impl Lent {
    fn new(buf: &mut [f32]) -> Lent {
        Lent {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        }
    }
}

// SAFETY: `Lent` is a `&mut [f32]` in disguise (see its docs); `&mut [f32]` is `Send`.
unsafe impl Send for Lent {}

impl AsMut<[f32]> for Lent {
    fn as_mut(&mut self) -> &mut [f32] {
        // SAFETY: the pointer and length come from a live `&mut [f32]` that the blocking call
        // holds for as long as the `Lent` exists (see its docs).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for BlockingWorker {
    fn drop(&mut self) {
        // Drop the worker (closing its connections) inside the runtime, before the runtime.
        let _guard = self.runtime.enter();
        self.worker.take();
    }
}

impl std::fmt::Debug for BlockingWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockingWorker")
            .field("worker", &self.worker)
            .finish()
    }
}
