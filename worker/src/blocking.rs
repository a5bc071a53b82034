//! [`BlockingWorker`]: the worker API for synchronous code.

use std::path::Path;

use pushpull_common::tls::TlsIdentity;
use pushpull_common::{Config, ParamMap};

use crate::error::WorkerError;
use crate::tensor::{Metrics, Reduce, Tensor};
use crate::worker::{JoinOptions, Worker};

/// A [`Worker`] with its own tokio runtime, for training code that isn't async.
///
/// Every method blocks the calling thread until the operation completes. Don't call them from
/// inside an async runtime (tokio panics on a nested `block_on`); use [`Worker`] there.
///
/// The buffer methods take `&mut [f32]`: the slice is copied into an owned buffer, the
/// operation runs, and the result is copied back. On error the slice is left unchanged.
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
    /// workers. Errors as `Worker::push_pull`; on error `buf` is unchanged.
    pub fn push_pull(
        &self,
        tensor: &Tensor,
        buf: &mut [f32],
        op: Reduce,
    ) -> Result<(), WorkerError> {
        let out = self
            .runtime
            .block_on(self.worker().push_pull(tensor, buf.to_vec(), op))?;
        buf.copy_from_slice(&out);
        Ok(())
    }

    /// Blocking [`Worker::broadcast`]: `buf` is replaced by the root's data. Errors as
    /// `Worker::broadcast`; on error `buf` is unchanged.
    pub fn broadcast(
        &self,
        tensor: &Tensor,
        buf: &mut [f32],
        root: u32,
    ) -> Result<(), WorkerError> {
        let out = self
            .runtime
            .block_on(self.worker().broadcast(tensor, buf.to_vec(), root))?;
        buf.copy_from_slice(&out);
        Ok(())
    }

    /// Blocking [`Worker::barrier`].
    pub fn barrier(&self) -> Result<(), WorkerError> {
        self.runtime.block_on(self.worker().barrier())
    }

    /// Blocking [`Worker::finish`], then shuts the runtime down.
    pub fn finish(mut self) -> Result<(), WorkerError> {
        let worker = self.worker.take().expect("present until drop or finish");
        self.runtime.block_on(worker.finish())
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
