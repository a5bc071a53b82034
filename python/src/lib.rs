//! `pushpull._native`: the worker library ([`pushpull_worker`]) bound to Python with PyO3.
//! It is the only Rust in the `pushpull` Python package; everything the package does goes
//! through the worker API, nothing is implemented twice.
//!
//! # Map of the crate
//! | item | what it is |
//! |---|---|
//! | [`Worker`] (`pushpull._native.Worker`) | a joined worker: its own tokio runtime and a [`pushpull_worker::Worker`], and its Prometheus endpoint when `PUSHPULL_METRICS=ADDR` or `[metrics] listen` asks for one (`metrics_address`; `pushpull_metrics`); `declare`, `push_pull`, `push_pull_group`, `push_pull_group_device` (device memory: CUDA, or the emulated device), `cuda_route`, `device_stream`, `order_after`, `broadcast`, `barrier`, `save_state` / `load_state` (checkpoint and restart), `metrics`, `finish` |
//! | [`Handle`] (`handle.rs`) | one round in flight: `poll()`, `wait()`; `Worker.order_after` orders a stream after rounds on the device, without the host waiting |
//! | `config.rs`, `devices.rs` | the join settings (cluster file, BytePS's variables, overrides); the emulated and CUDA devices of device rounds |
//! | [`Reference`] (`reference.rs`) | the single-process reference ([`pushpull_worker::reference::Reference`]), for tests that compare a job's bits with it |
//! | `PushPullError`, `NodeLostError` | the exceptions: every [`WorkerError`] becomes one, with its message (which names the tensor, key or node) |
//!
//! The Python side (`pushpull/torch/`) turns torch tensors into the pointer, length and owner
//! that `Worker.push_pull` takes, and reads the BytePS environment.
//!
//! # Device memory
//! `push_pull_group_device` takes buffers in a device's memory by address, as `push_pull`
//! takes host buffers, and hands them to [`pushpull_worker::Worker::push_pull_group_borrowed`]:
//! on `cuda:N` (torch's CUDA tensors, compressed on their GPU by the worker's [`CudaDevice`](pushpull_worker::CudaDevice)
//! for that GPU, on a stream of its own whose handle `device_stream` gives, so that the Python
//! side can order torch's streams with it), or on `emulated` (host memory run through the
//! device path's host twin: how the binding's device logic is tested without a GPU).
//!
//! # Buffers and the GIL
//! A push_pull works in the caller's memory in place: Python hands over the address and length
//! of a contiguous float32 buffer together with the object that owns it. The round keeps a
//! reference to that object (`PyBuf`) until it has finished writing, even when Python drops
//! the handle early, so the memory can never be freed under it. Every call that waits
//! (join, declare, wait, barrier, finish) releases the GIL while it waits.

#![warn(missing_docs)]

mod config;
mod devices;
mod handle;
mod reference;

pub use handle::Handle;
pub use reference::Reference;

use config::join_config;
use devices::{Devices, Route};
use handle::HandleState;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pushpull_net::tls::TlsIdentity;
use pushpull_proto::ParamMap;
use pushpull_worker::{JoinOptions, Place, Reduce, RoundHandle, WorkerError};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

create_exception!(
    _native,
    PushPullError,
    PyRuntimeError,
    "A pushpull operation failed; the message names the tensor, key or node. A RuntimeError, \
     as Horovod's HorovodInternalError is."
);
create_exception!(
    _native,
    NodeLostError,
    PushPullError,
    "The job is over: a node was lost (the message names it) or the job failed."
);

/// The Python exception for a worker error: [`NodeLostError`] when the job is over because a
/// node was lost or the job failed, [`PushPullError`] otherwise.
fn to_py(e: WorkerError) -> PyErr {
    match e {
        WorkerError::NodeLost { .. } | WorkerError::JobFailed { .. } => {
            NodeLostError::new_err(e.to_string())
        }
        e => PushPullError::new_err(e.to_string()),
    }
}

/// The reduce op of a call's `average` flag.
fn reduce(average: bool) -> Reduce {
    if average {
        Reduce::Average
    } else {
        Reduce::Sum
    }
}

/// A caller's float32 buffer, lent to a round: address, length, and a reference to the Python
/// object that owns the memory, held until the round drops the buffer.
struct PyBuf {
    ptr: *mut f32,
    len: usize,
    /// Keeps the memory alive. Dropped on whatever thread ends the round; PyO3 defers the
    /// reference count decrement until a thread holds the GIL.
    _owner: Py<PyAny>,
}

// SAFETY: the memory behind `ptr` is owned by `_owner`, which lives as long as the `PyBuf`;
// the Python side hands it over for the round's exclusive use (documented on
// `Worker.push_pull`), so moving the pointer to the round's thread is like moving a
// `&mut [f32]`.
unsafe impl Send for PyBuf {}

impl AsMut<[f32]> for PyBuf {
    fn as_mut(&mut self) -> &mut [f32] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: see `unsafe impl Send`: `ptr` addresses `len` f32 that stay valid and
        // unaliased while the round holds the buffer.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// A joined worker (`pushpull._native.Worker`).
///
/// `Worker(config=None, *, scheduler=None, num_workers=None, num_servers=None, rank=None,
/// tls_ca=None, tls_cert=None, tls_key=None, server_name=None, local_size=None)` reads the
/// cluster file
/// `config` (or starts from a loopback cluster's defaults), applies the overrides, loads the
/// TLS identity and joins the job, asking for `rank` if given. Raises `PushPullError` naming
/// the setting that is wrong, or the node that refused.
#[pyclass(module = "pushpull._native", frozen)]
pub struct Worker {
    runtime: Arc<Runtime>,
    worker: Mutex<Option<pushpull_worker::Worker>>,
    devices: Devices,
    /// The Prometheus endpoint (`PUSHPULL_METRICS` or `[metrics] listen`), while the worker
    /// lives.
    metrics: Option<pushpull_metrics::MetricsEndpoint>,
}

impl Worker {
    fn get(&self) -> PyResult<pushpull_worker::Worker> {
        self.worker
            .lock()
            .expect("not poisoned")
            .clone()
            .ok_or_else(|| to_py(WorkerError::Finished))
    }

    fn tensor(&self, name: &str) -> PyResult<(pushpull_worker::Worker, pushpull_worker::Tensor)> {
        let w = self.get()?;
        let t = w.tensor(name).map_err(to_py)?;
        Ok((w, t))
    }

    /// The buffer of tensor `name` at `ptr` (`len` float32 owned by `owner`), checked.
    fn buffer(name: &str, owner: Py<PyAny>, ptr: usize, len: usize) -> PyResult<PyBuf> {
        if ptr == 0 && len != 0 {
            return Err(PyValueError::new_err(format!(
                "tensor {name:?}: a null buffer address for {len} elements"
            )));
        }
        if ptr % std::mem::align_of::<f32>() != 0 {
            return Err(PyValueError::new_err(format!(
                "tensor {name:?}: buffer address {ptr:#x} is not aligned for float32"
            )));
        }
        Ok(PyBuf {
            ptr: ptr as *mut f32,
            len,
            _owner: owner,
        })
    }

    /// The tensors and buffers of a group call's `(name, owner, address, length)` entries, or
    /// the error of the first undeclared name or bad address.
    fn calls(
        w: &pushpull_worker::Worker,
        entries: Vec<(String, Py<PyAny>, usize, usize)>,
    ) -> PyResult<Vec<(pushpull_worker::Tensor, PyBuf)>> {
        entries
            .into_iter()
            .map(|(name, owner, ptr, len)| {
                let t = w.tensor(&name).map_err(to_py)?;
                Ok((t, Self::buffer(&name, owner, ptr, len)?))
            })
            .collect()
    }

    /// A handle of a round running as `task` in the worker's runtime.
    fn handle(&self, task: JoinHandle<Result<(), WorkerError>>) -> Handle {
        Handle {
            runtime: self.runtime.clone(),
            state: Mutex::new(HandleState::Running(task)),
        }
    }

    /// One handle per name, each resolving to its round's outcome from the handles `group`
    /// (a group call, started in a task of the worker's runtime) returns.
    fn group_handles<K: Send + 'static>(
        &self,
        names: Vec<String>,
        group: impl std::future::Future<Output = Vec<RoundHandle<K>>> + Send + 'static,
    ) -> Vec<Handle> {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..names.len())
            .map(|_| tokio::sync::oneshot::channel::<Result<(), WorkerError>>())
            .unzip();
        self.runtime.spawn(async move {
            let rounds = group.await;
            for (round, tx) in rounds.into_iter().zip(txs) {
                tokio::spawn(async move {
                    let _ = tx.send(round.await.map(drop));
                });
            }
        });
        rxs.into_iter()
            .zip(names)
            .map(|(rx, name)| {
                self.handle(self.runtime.spawn(async move {
                    rx.await.unwrap_or_else(|_| {
                        Err(WorkerError::Internal(format!(
                            "the group call ended before starting the round of tensor {name:?}"
                        )))
                    })
                }))
            })
            .collect()
    }

    /// Starts a round of `kind` over the buffer in a task of the worker's runtime.
    fn start(
        &self,
        name: &str,
        owner: Py<PyAny>,
        ptr: usize,
        len: usize,
        kind: Kind,
    ) -> PyResult<Handle> {
        let (w, t) = self.tensor(name)?;
        let buf = Self::buffer(name, owner, ptr, len)?;
        let task = self.runtime.spawn(async move {
            match kind {
                Kind::Sum(op) => w.push_pull(&t, buf, op).await.map(drop),
                Kind::Broadcast(root) => w.broadcast(&t, buf, root).await.map(drop),
                Kind::Gossip => w.gossip(&t, buf).await.map(drop),
            }
        });
        Ok(self.handle(task))
    }
}

enum Kind {
    Sum(Reduce),
    Broadcast(u32),
    Gossip,
}

#[pymethods]
impl Worker {
    #[new]
    #[pyo3(signature = (config=None, *, scheduler=None, num_workers=None, num_servers=None, rank=None, tls_ca=None, tls_cert=None, tls_key=None, server_name=None, local_size=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        config: Option<PathBuf>,
        scheduler: Option<String>,
        num_workers: Option<u32>,
        num_servers: Option<u32>,
        rank: Option<u32>,
        tls_ca: Option<PathBuf>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
        server_name: Option<String>,
        local_size: Option<u32>,
    ) -> PyResult<Worker> {
        let config = join_config(
            config,
            scheduler,
            (num_workers, num_servers, local_size),
            tls_ca,
            tls_cert,
            tls_key,
            server_name,
        )
        .map_err(to_py)?;
        let identity = TlsIdentity::load(&config.tls)
            .map_err(|e| to_py(WorkerError::Config(e.to_string())))?;
        let metrics_env = std::env::var("PUSHPULL_METRICS").ok();
        let metrics_addr = pushpull_metrics::listen_addr(
            metrics_env.as_deref().map(|v| ("PUSHPULL_METRICS", v)),
            &config,
        )
        .map_err(|e| to_py(WorkerError::Config(e)))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("pushpull-worker")
            .build()
            .map_err(|e| PushPullError::new_err(format!("cannot start a tokio runtime: {e}")))?;
        let opts = JoinOptions {
            requested_rank: rank,
        };
        let worker = py
            .detach(|| runtime.block_on(pushpull_worker::Worker::join(&config, identity, opts)))
            .map_err(to_py)?;
        let metrics = match metrics_addr {
            Some(addr) => {
                let _in_runtime = runtime.enter();
                let endpoint =
                    pushpull_worker::prometheus::serve_worker(addr, &worker).map_err(|e| {
                        PushPullError::new_err(format!("cannot serve metrics on {addr}: {e}"))
                    })?;
                eprintln!(
                    "{}",
                    pushpull_metrics::metrics_line("pushpull-worker", endpoint.local_addr())
                );
                Some(endpoint)
            }
            None => None,
        };
        Ok(Worker {
            runtime: Arc::new(runtime),
            worker: Mutex::new(Some(worker)),
            devices: Devices::default(),
            metrics,
        })
    }

    /// The address of this worker's Prometheus endpoint (`PUSHPULL_METRICS=ADDR` or the cluster
    /// file's `[metrics] listen`), `"IP:PORT"`, or None when it serves none.
    #[getter]
    fn metrics_address(&self) -> Option<String> {
        self.metrics.as_ref().map(|m| m.local_addr().to_string())
    }

    /// This worker's rank, `0..num_workers`.
    #[getter]
    fn rank(&self) -> PyResult<u32> {
        Ok(self.get()?.rank())
    }

    /// The number of workers of the job.
    #[getter]
    fn num_workers(&self) -> PyResult<u32> {
        Ok(self.get()?.num_workers())
    }

    /// The number of servers of the job.
    #[getter]
    fn num_servers(&self) -> PyResult<u32> {
        Ok(self.get()?.num_servers())
    }

    /// The job's seed (what the single-process reference needs to reproduce the job).
    #[getter]
    fn job_seed(&self) -> PyResult<u64> {
        Ok(self.get()?.job_seed())
    }

    /// Declares tensor `name` of `length` float32 elements with the parameter map `params`
    /// (overlaid on the cluster file's `[tensors]`), and `priority` if given (default:
    /// declaration order). A collective: every worker declares the same name, length, map and
    /// priority. Returns `(priority, codecs)`: the agreed priority and each chunk's codec.
    #[pyo3(signature = (name, length, params=None, priority=None))]
    fn declare(
        &self,
        py: Python<'_>,
        name: &str,
        length: u64,
        params: Option<BTreeMap<String, String>>,
        priority: Option<i32>,
    ) -> PyResult<(i32, Vec<String>)> {
        let w = self.get()?;
        let params: ParamMap = params.unwrap_or_default();
        let t = py
            .detach(|| {
                self.runtime.block_on(async {
                    match priority {
                        Some(p) => w.declare_with_priority(name, length, params, p).await,
                        None => w.declare(name, length, params).await,
                    }
                })
            })
            .map_err(to_py)?;
        Ok((t.priority(), t.codecs()))
    }

    /// Whether `name` is declared on this worker.
    fn is_declared(&self, name: &str) -> PyResult<bool> {
        Ok(self.get()?.tensor(name).is_ok())
    }

    /// Whether tensor `name` of `length` elements with the map `params` would be summed as
    /// plain float32 (no codec, error feedback, momentum, intra-host rounding or gossip; the
    /// Rust `Worker::is_plain`). Declares nothing.
    #[pyo3(signature = (name, length, params=None))]
    fn is_plain(
        &self,
        name: &str,
        length: u64,
        params: Option<BTreeMap<String, String>>,
    ) -> PyResult<bool> {
        Ok(self
            .get()?
            .is_plain(name, length, &params.unwrap_or_default()))
    }

    /// The compressor tensor `name` of `length` elements would run with the map `params`, as
    /// its canonical map (short keys, defaults filled in; the Rust `Worker::effective_params`),
    /// or None for a map the codecs refuse. Declares nothing.
    #[pyo3(signature = (name, length, params=None))]
    fn effective_params(
        &self,
        name: &str,
        length: u64,
        params: Option<BTreeMap<String, String>>,
    ) -> PyResult<Option<BTreeMap<String, String>>> {
        Ok(self
            .get()?
            .effective_params(name, length, &params.unwrap_or_default()))
    }

    /// Whether a tensor of `length` elements is under `cluster.min_compress_bytes`, so that it
    /// travels uncompressed (the Rust `Worker::is_small`).
    fn is_small(&self, length: u64) -> PyResult<bool> {
        Ok(self.get()?.is_small(length))
    }

    /// Starts one round of `name` over the float32 buffer at address `ptr` (`length` elements,
    /// owned by `owner`, which is kept alive until the round has finished writing): the buffer
    /// becomes the sum over all workers, or the average. The buffer must not be read or written
    /// until the returned handle's `wait()` has returned.
    #[pyo3(signature = (name, owner, ptr, length, average))]
    fn push_pull(
        &self,
        name: &str,
        owner: Py<PyAny>,
        ptr: usize,
        length: usize,
        average: bool,
    ) -> PyResult<Handle> {
        self.start(name, owner, ptr, length, Kind::Sum(reduce(average)))
    }

    /// Starts one round of every `(name, owner, ptr, length)` of `entries` together, each
    /// buffer as in `push_pull` (`Worker::push_pull_group`): the chunks leave in the tensors'
    /// priority order whatever order `entries` lists them in. Returns one handle per entry, in
    /// order; an entry's own error (e.g. a buffer of the wrong length) is raised by its
    /// handle's `wait()`. An undeclared name or a bad address raises here, starting nothing.
    #[pyo3(signature = (entries, average))]
    fn push_pull_group(
        &self,
        entries: Vec<(String, Py<PyAny>, usize, usize)>,
        average: bool,
    ) -> PyResult<Vec<Handle>> {
        let op = reduce(average);
        let w = self.get()?;
        let calls = Self::calls(&w, entries)?;
        let names: Vec<String> = calls.iter().map(|(t, _)| t.name().to_string()).collect();
        Ok(self.group_handles(names, async move { w.push_pull_group(calls, op).await }))
    }

    /// Starts one round of every `(name, owner, address, length)` of `entries` together in
    /// the memory of `device` (`"cuda:N"`, or `"emulated"`: host memory through the device
    /// path), each buffer as in `push_pull`, as one batch on the device
    /// (`Worker::push_pull_group_device`): the sum or average replaces each buffer in place,
    /// written by the device's stream (`device_stream`) before the handle's `wait()` returns
    /// and ordered before later work on that stream. The owner (e.g. a torch tensor) is kept
    /// until the round has ended; the caller must not read or write the memory, nor let its
    /// allocator reuse it, before the device's work on it is done. Returns one handle per
    /// entry; raises here for an undeclared name, a bad address or an unusable device.
    #[pyo3(signature = (entries, average, device))]
    fn push_pull_group_device(
        &self,
        entries: Vec<(String, Py<PyAny>, usize, usize)>,
        average: bool,
        device: &str,
    ) -> PyResult<Vec<Handle>> {
        let op = reduce(average);
        let w = self.get()?;
        let route = self.devices.get(device).map_err(to_py)?;
        let calls: Vec<_> = Self::calls(&w, entries)?
            .into_iter()
            .map(|(t, buf)| (t, buf.ptr as u64, buf.len, buf))
            .collect();
        let names: Vec<String> = calls.iter().map(|c| c.0.name().to_string()).collect();
        Ok(match route {
            // SAFETY: each address is the start of `len` f32 of the device's memory (a CPU
            // tensor's for the emulated device) owned by the entry's owner, which the round
            // keeps; the caller lends it to the round (see the method's docs).
            Route::Emulated(d) => self.group_handles(names, async move {
                unsafe { w.push_pull_group_borrowed(calls, &d, op).await }
            }),
            Route::Cuda(d) => self.group_handles(names, async move {
                unsafe { w.push_pull_group_borrowed(calls, &d, op).await }
            }),
        })
    }

    /// Where a round over a CUDA tensor on GPU `ordinal` is reduced, as `worker.device` says:
    /// `"cuda:N"` (compressed on that GPU) or `None` (`worker.device = "cpu"`: through a host
    /// copy). Raises `PushPullError` when `worker.device` names another GPU.
    fn cuda_route(&self, ordinal: usize) -> PyResult<Option<String>> {
        let route = self.get()?.cuda_route(ordinal).map_err(to_py)?;
        Ok(route.map(|p: Place| p.to_string()))
    }

    /// The handle (`CUstream`, as an int) of the stream the worker's device rounds on `device`
    /// (`"cuda:N"`) run on, for `torch.cuda.ExternalStream`; 0 for `"emulated"`.
    fn device_stream(&self, device: &str) -> PyResult<u64> {
        match self.devices.get(device).map_err(to_py)? {
            Route::Emulated(_) => Ok(0),
            Route::Cuda(d) => Ok(d.stream()),
        }
    }

    /// Orders later work on `stream` (the driver's handle of a stream of `device`, as an int:
    /// torch's `current_stream().cuda_stream`; 0 for `"emulated"`, whose stream is the calling
    /// thread, which then waits) after the rounds of `handles`, all on `device`, without
    /// waiting here: the stream waits, on the GPU, until the worker's stream has decoded every
    /// one of them (`cuStreamWaitValue32` on a word the worker's stream writes). The handles
    /// resolve as before, and their `wait()` raises a round's error: a failed round releases
    /// the stream too (no stream waits forever), which then runs on what the buffer holds.
    /// Raises `PushPullError` when the device cannot order streams this way (nothing was
    /// ordered then: wait for the handles instead).
    fn order_after(
        &self,
        py: Python<'_>,
        handles: Vec<Py<Handle>>,
        device: &str,
        stream: u64,
    ) -> PyResult<()> {
        let route = self.devices.get(device).map_err(to_py)?;
        // SAFETY: the caller hands a live stream of the device (documented above); the
        // emulated device refuses any but 0.
        let ordered = match route {
            Route::Emulated(d) => unsafe {
                handle::order_after(py, &self.runtime, &handles, d, stream)
            },
            Route::Cuda(d) => unsafe {
                handle::order_after(py, &self.runtime, &handles, d, stream)
            },
        };
        ordered.map_err(|e| {
            PushPullError::new_err(format!("ordering a stream of {device} after rounds: {e}"))
        })
    }

    /// As `push_pull`, but one step of decentralised averaging of a tensor declared with
    /// `exchange = "gossip"` (`Worker::gossip`): the buffer, this worker's parameters, becomes
    /// their average with its graph neighbours' (the cluster's `[gossip]` mixing matrix).
    fn gossip(&self, name: &str, owner: Py<PyAny>, ptr: usize, length: usize) -> PyResult<Handle> {
        self.start(name, owner, ptr, length, Kind::Gossip)
    }

    /// As `push_pull`, but the buffer becomes the `root` worker's, bit for bit.
    fn broadcast(
        &self,
        name: &str,
        owner: Py<PyAny>,
        ptr: usize,
        length: usize,
        root: u32,
    ) -> PyResult<Handle> {
        self.start(name, owner, ptr, length, Kind::Broadcast(root))
    }

    /// Discards the last push_pull round of each tensor of `names` (`Worker::discard_last_round`:
    /// their compressor state, here and on the servers, returns to what it was before it), for
    /// an optimizer step a loss scaler skipped. Every worker must discard the same rounds.
    fn discard_last_round(&self, py: Python<'_>, names: Vec<String>) -> PyResult<()> {
        let w = self.get()?;
        let tensors = names
            .iter()
            .map(|n| w.tensor(n))
            .collect::<Result<Vec<_>, _>>()
            .map_err(to_py)?;
        py.detach(|| self.runtime.block_on(w.discard_last_round(&tensors)))
            .map_err(to_py)
    }

    /// How many push_pull rounds of the tensors of `names` had a sum that was not finite in
    /// some chunk (`metrics()`'s `rounds_non_finite`, without building the whole dict).
    fn rounds_non_finite(&self, names: Vec<String>) -> PyResult<u64> {
        let mut n = 0;
        for name in &names {
            n += self.tensor(name)?.1.metrics().rounds_non_finite;
        }
        Ok(n)
    }

    /// Waits until every worker has entered the same barrier.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let w = self.get()?;
        py.detach(|| self.runtime.block_on(w.barrier()))
            .map_err(to_py)
    }

    /// Saves this worker's compressor state to `path` (`Worker::save_state`), a collective:
    /// every worker at the same point between steps, each with its own file; rank 0's also
    /// carries the servers' state. Raises `PushPullError` naming the file and why.
    fn save_state(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let w = self.get()?;
        py.detach(|| self.runtime.block_on(w.save_state(path)))
            .map_err(to_py)
    }

    /// Restores the state `save_state` wrote to `path` (`Worker::load_state`), a collective of
    /// a fresh job, after every tensor of the checkpoint is declared and before any round.
    /// Raises `PushPullError` naming the file and the setting that differs, or the damage.
    fn load_state(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let w = self.get()?;
        py.detach(|| self.runtime.block_on(w.load_state(path)))
            .map_err(to_py)
    }

    /// The learning rate that corrected error feedback (`ef = "corrected"`) uses from the
    /// next round on.
    fn set_learning_rate(&self, lr: f32) -> PyResult<()> {
        self.get()?.set_learning_rate(lr);
        Ok(())
    }

    /// Raises the gradient bound `G` of tensor `name` to `g` (the largest |gradient| of a
    /// step) if larger: moniqua's `theta_schedule = "bound"` reads it (see
    /// `Worker::report_gradient_bound`). Raises `PushPullError` naming the tensor when `g` is
    /// not a finite number >= 0 or the tensor is not declared.
    fn report_gradient_bound(&self, name: &str, g: f32) -> PyResult<()> {
        let (w, t) = self.tensor(name)?;
        w.report_gradient_bound(&t, g).map_err(to_py)
    }

    /// Counters: `{"raw_bytes", "bytes_pushed", "bytes_pulled", "rounds", "rounds_non_finite", "compress_seconds",
    /// "wait_seconds", "decompress_seconds", "device_bytes", "driver_calls", "tensors": {name:
    /// {... "device", "buffer_device", "device_bytes", "codecs"}}}`: `device` says where the
    /// tensor was compressed (`"cpu"`, `"cuda:N"`, `"emulated"`), `buffer_device` where its
    /// buffer was, `device_bytes` the device and page-locked memory its state (and, in the
    /// totals, the batches) holds, `driver_calls` the device driver calls made so far.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let w = self.get()?;
        let m = w.metrics();
        let d = PyDict::new(py);
        d.set_item("raw_bytes", m.raw_bytes)?;
        d.set_item("bytes_pushed", m.bytes_pushed)?;
        d.set_item("bytes_pulled", m.bytes_pulled)?;
        d.set_item("rounds", m.rounds)?;
        d.set_item("rounds_non_finite", m.rounds_non_finite)?;
        d.set_item("compress_seconds", m.compress_seconds)?;
        d.set_item("wait_seconds", m.wait_seconds)?;
        d.set_item("decompress_seconds", m.decompress_seconds)?;
        d.set_item("compression_ratio", m.compression_ratio())?;
        d.set_item("device_bytes", m.device_bytes)?;
        d.set_item("driver_calls", self.devices.driver_calls())?;
        let tensors = PyDict::new(py);
        for (name, t) in &m.tensors {
            let e = PyDict::new(py);
            e.set_item("len", t.len)?;
            e.set_item("chunks", t.chunks)?;
            e.set_item("rounds", t.rounds_done)?;
            e.set_item("rounds_non_finite", t.rounds_non_finite)?;
            e.set_item("raw_bytes", t.raw_bytes)?;
            e.set_item("bytes_pushed", t.bytes_pushed)?;
            e.set_item("bytes_pulled", t.bytes_pulled)?;
            e.set_item("compress_seconds", t.compress_seconds)?;
            e.set_item("wait_seconds", t.wait_seconds)?;
            e.set_item("decompress_seconds", t.decompress_seconds)?;
            e.set_item("device", t.device.to_string())?;
            e.set_item("buffer_device", t.buffer_device.to_string())?;
            e.set_item("device_bytes", t.device_bytes)?;
            if let Ok(tensor) = w.tensor(name) {
                e.set_item("codecs", tensor.codecs())?;
                e.set_item("priority", tensor.priority())?;
            }
            tensors.set_item(name, e)?;
        }
        d.set_item("tensors", tensors)?;
        Ok(d)
    }

    /// Ends this worker cleanly (waits for running rounds, tells the scheduler, waits for the
    /// job's shutdown). Later calls raise `PushPullError` ("finished").
    fn finish(&self, py: Python<'_>) -> PyResult<()> {
        let w = self
            .worker
            .lock()
            .expect("not poisoned")
            .take()
            .ok_or_else(|| to_py(WorkerError::Finished))?;
        py.detach(|| self.runtime.block_on(w.finish()))
            .map_err(to_py)
    }

    /// Ends this worker at once after a failure (instead of `finish`, which waits for running
    /// rounds): they fail, every connection closes telling the other nodes `reason` (or the
    /// job's own error, naming a lost node), and this waits at most a second for that to
    /// leave. Later calls raise `PushPullError` ("finished"); a second `abort` does nothing.
    fn abort(&self, py: Python<'_>, reason: &str) {
        let w = self.worker.lock().expect("not poisoned").take();
        if let Some(w) = w {
            py.detach(|| self.runtime.block_on(w.abort(reason)));
        }
    }
}

/// How this extension was compiled: `"release"`, or `"debug"` for a build with debug assertions
/// (maturin's `--profile dev`), whose codecs run several times slower: benchmarks record it.
const BUILD_PROFILE: &str = if cfg!(debug_assertions) {
    "debug"
} else {
    "release"
};

/// The module `pushpull._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Worker>()?;
    m.add_class::<Handle>()?;
    m.add_class::<Reference>()?;
    m.add("PushPullError", m.py().get_type::<PushPullError>())?;
    m.add("NodeLostError", m.py().get_type::<NodeLostError>())?;
    m.add("BUILD_PROFILE", BUILD_PROFILE)?;
    Ok(())
}
