//! [`Worker`]: the handle and the collective operations; joining the cluster is in
//! [`join`], declaring tensors in [`declare`].

mod checkpoint;
mod close;
mod declare;
mod device;
mod discard;
mod gossip;
mod group;
mod join;
mod low_rank;

pub use group::RoundHandle;
pub use join::JoinOptions;

use pushpull_proto::departure::Departure;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pushpull_net::sender::{FrameSender, SendHold};
use pushpull_net::transport::Endpoint;
use pushpull_proto::pool::BufPool;
use pushpull_proto::protocol::{ClusterMap, ToScheduler};
use pushpull_proto::{Config, NodeName};
use tokio::task::JoinHandle;

use crate::core::{RoundKind, TensorRounds};
use crate::data::{Batches, HostData, HostInto, Launch, RoundData, Starting};
use crate::error::WorkerError;
use crate::local::Local;
use crate::push::{RoundCtx, ServerLinks};
use crate::round::run_round;
use crate::shared::{Phase, Shared};
use crate::tensor::{Metrics, Reduce, Tensor, TensorInner};
use pushpull_kernels::CodecFactory;

/// How long `finish` waits for the scheduler to confirm that it received `Finished` (by
/// closing the control stream's acknowledgement) before closing the connections anyway.
const CLOSE_CONTROL_BOUND: Duration = Duration::from_secs(2);
/// How long closing waits for the connections to be acknowledged closed.
const WAIT_IDLE_BOUND: Duration = Duration::from_secs(1);

/// A member of a pushpull job: the handle users' training code calls.
///
/// `Worker` is a cheap `Clone` handle (an `Arc`); clones share the connections, the declared
/// tensors and the round counters, and may be used from several tasks at once.
///
/// # Life cycle
/// 1. [`Worker::join`] registers with the scheduler, waits until every node of the job has
///    registered, and connects to every server.
/// 2. [`Worker::declare`] each tensor (a collective: every worker declares every tensor).
/// 3. [`Worker::push_pull`] / [`Worker::broadcast`] rounds, [`Worker::barrier`]s.
/// 4. [`Worker::finish`] once the last operation is done.
///
/// # Failures
/// If any node of the job is lost (the scheduler reports it, a connection to the scheduler or a
/// server fails, or the scheduler is silent for `cluster.heartbeat_timeout_ms`), every pending
/// and later call fails with a [`WorkerError::NodeLost`] naming that node. Nothing waits
/// forever for a dead node.
///
/// # Dropping
/// Dropping the last handle without [`Worker::finish`] closes every connection at once and
/// fails operations still running in the background with [`WorkerError::Dropped`]. The
/// scheduler sees this worker vanish without `Finished`, declares it lost, and the whole job
/// fails (the other nodes get an error naming this worker). Call `finish` for a clean end.
#[derive(Clone)]
pub struct Worker {
    inner: Arc<WorkerInner>,
}

struct WorkerInner {
    shared: Arc<Shared>,
    links: Arc<ServerLinks>,
    /// The connection to the scheduler (its control stream is `shared`'s).
    scheduler_conn: quinn::Connection,
    /// Sends every push, in priority order within `cluster.send_window_bytes`.
    sender: FrameSender,
    endpoint: Endpoint,
    rank: u32,
    map: ClusterMap,
    config: Config,
    tensors: Mutex<HashMap<String, Tensor>>,
    codec_factory: Mutex<Arc<dyn CodecFactory>>,
    /// `set_codec_factory` was called: device buffers use the CPU codecs it makes.
    custom_factory: AtomicBool,
    /// `worker.device`: where device buffers are reduced (`cpu`: on the host).
    device: pushpull_kernels::cuda::DevicePref,
    /// The device batches of the sets of tensors launched together so far.
    batches: Batches,
    /// Buffers for encoded pushes.
    pool: Arc<BufPool>,
    /// The learning rate of the next rounds as f32 bits (0: none set).
    learning_rate: AtomicU32,
    barrier_seq: AtomicU64,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// This worker's local group (`cluster.local_size` > 1; ARCHITECTURE.md, "Two levels").
    local: Option<Arc<Local>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Worker {
    /// This worker's rank, `0..num_workers`.
    pub fn rank(&self) -> u32 {
        self.inner.rank
    }

    /// Number of workers in the job.
    pub fn num_workers(&self) -> u32 {
        self.inner.config.cluster.num_workers
    }

    /// Number of servers in the job.
    pub fn num_servers(&self) -> u32 {
        self.inner.config.cluster.num_servers
    }

    /// The job seed: `cluster.seed`, or the one the scheduler picked (the same on every node).
    pub fn job_seed(&self) -> u64 {
        self.inner.map.job_seed
    }

    /// The cluster map the scheduler sent (server addresses by id, workers by rank, job seed).
    pub fn cluster_map(&self) -> &ClusterMap {
        &self.inner.map
    }

    /// The config this worker joined with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// This worker's local UDP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.endpoint.local_addr()
    }

    /// Sets the learning rate η_t of the rounds started from now on (call it every step
    /// before the step's push_pulls, with the same value on every worker). Corrected error
    /// feedback (`ef = "corrected"`) needs it on workers and servers: each push carries it, and
    /// a server sums a round only if every worker pushed the same value. Other compressors
    /// ignore it. `lr` must be finite and > 0; anything else unsets it.
    pub fn set_learning_rate(&self, lr: f32) {
        let bits = if lr.is_finite() && lr > 0.0 {
            lr.to_bits()
        } else {
            0
        };
        self.inner.learning_rate.store(bits, Ordering::Relaxed);
    }

    /// The learning rate last set with [`Worker::set_learning_rate`], if any.
    pub fn learning_rate(&self) -> Option<f32> {
        match self.inner.learning_rate.load(Ordering::Relaxed) {
            0 => None,
            bits => Some(f32::from_bits(bits)),
        }
    }

    /// Replaces the factory that builds each chunk's codec (default: [`KernelsFactory`](pushpull_kernels::KernelsFactory), the
    /// compressor chain the tensor's parameter map asks for): the
    /// plug-in point for compressors. Applies to tensors declared after this call; workers and
    /// servers must build matching codecs for a key.
    pub fn set_codec_factory(&self, factory: impl CodecFactory + 'static) {
        *lock(&self.inner.codec_factory) = Arc::new(factory);
        self.inner.custom_factory.store(true, Ordering::Relaxed);
    }

    /// Byte counters: totals and per tensor.
    pub fn metrics(&self) -> Metrics {
        let tensors = lock(&self.inner.tensors);
        let mut m = Metrics::from_tensors(tensors.values());
        m.device_bytes += self.inner.batches.bytes();
        m
    }

    /// QUIC's counters of this worker's connections, the scheduler's first, then each
    /// server's, each with the peer's name: lost packets, datagrams and bytes sent and
    /// received, congestion events, the RTT estimate. Read from quinn at the time of the call.
    pub fn connection_stats(&self) -> Vec<(NodeName, quinn::ConnectionStats)> {
        let mut v = vec![(
            self.inner.shared.scheduler.clone(),
            self.inner.scheduler_conn.stats(),
        )];
        v.extend(
            self.inner
                .links
                .names
                .iter()
                .zip(&self.inner.links.peers)
                .map(|(name, peer)| (name.clone(), peer.conn.stats())),
        );
        v
    }

    /// Sums `buf` element-wise over every worker of the job and hands the buffer back holding
    /// the result ([`Reduce::Sum`]), or the sum divided by the number of workers
    /// ([`Reduce::Average`]: each element becomes exactly `sum / num_workers as f32`).
    ///
    /// Every worker must call `push_pull` on the tensor as many times as the others (the n-th
    /// call of every worker forms round n). Results are bit-identical on every worker: servers
    /// add the workers' chunks in rank order. Works for any length the machine can hold
    /// (offsets are 64-bit throughout); the tensor is cut into chunks that travel concurrently.
    ///
    /// `buf` is any owned buffer of f32 that can move to another thread: a `Vec<f32>`, a
    /// `Box<[f32]>`, or a type of your own that keeps foreign memory alive (e.g. a framework's
    /// tensor) and lends it through `AsMut<[f32]>`. The round works in it in place (no copy
    /// of the data is made for raw fp32 tensors beyond the encoded payloads) and hands it back.
    ///
    /// # Scheduling
    /// Each chunk is encoded as soon as the call starts and queued on its server's connection.
    /// Frames leave a connection in priority order ([`Tensor::priority`]), FIFO within a
    /// priority, while at most `cluster.send_window_bytes` are unacknowledged; a frame leaves
    /// the window once the server has it, not when its round completes, so calls of several
    /// tensors, issued in any order on any worker, never wait on each other.
    ///
    /// Calls on *different* tensors may run concurrently. Calls on the *same* tensor are
    /// serialised: each waits for the tensor's previous call to finish, and the tensor's round
    /// counter advances by one per call.
    ///
    /// # Cancellation
    /// The call is safe to cancel. Once the call holds the tensor (after any earlier call on
    /// it finished), it runs in a spawned task that owns `buf` and the tensor: dropping the
    /// returned future detaches that task, the round still completes in the background (so the
    /// tensor's rounds stay in step with the other workers and the servers), and `buf` is
    /// dropped when it finishes. Dropping the future while it still waits for the tensor
    /// cancels the call: no round is used and `buf` is dropped. [`Worker::finish`] waits for
    /// detached rounds.
    ///
    /// # Errors
    /// * [`WorkerError::Undeclared`], [`WorkerError::LengthMismatch`]: nothing was sent and no
    ///   round was used;
    /// * [`WorkerError::Aborted`] (a server rejected some worker's push for a chunk) or
    ///   [`WorkerError::Codec`]: the round completed for the other chunks, the call failed, the
    ///   next call may succeed. (Servers also abort open rounds when a node is lost; the call
    ///   then waits up to half a second for the scheduler's report and fails with
    ///   `NodeLost`, or, if that report is slower, with the server's abort, which names the
    ///   lost node too);
    /// * [`WorkerError::NodeLost`] and the other fatal errors ([`WorkerError::is_fatal`]): the
    ///   job is over.
    ///
    /// On error, `buf` is dropped.
    pub async fn push_pull<B>(&self, tensor: &Tensor, buf: B, op: Reduce) -> Result<B, WorkerError>
    where
        B: AsMut<[f32]> + Send + 'static,
    {
        let average = op == Reduce::Average;
        self.submit(tensor, HostData(buf), RoundKind::Sum { average })
            .await
            .map(|d| d.0)
    }

    /// [`Worker::push_pull`] out of place: reads `input` and writes the sum (or average) over
    /// all workers into `output`, handing both back; `input` is not modified, and `output`'s
    /// contents before the call do not matter. BytePS's `push_pull` takes an output tensor the
    /// same way. Use it when the gradient must be kept, or when the same input is reduced
    /// again (a benchmark): it saves the copy an in-place call would need first.
    ///
    /// The tensor's rounds, compressor state, serialisation and cancellation are those of
    /// `push_pull`: a round of `push_pull_into` is a round of the tensor like any other.
    ///
    /// # Errors
    /// As [`Worker::push_pull`]; [`WorkerError::LengthMismatch`] if `input` or `output` is not
    /// the tensor's length (nothing sent). On error both buffers are dropped.
    pub async fn push_pull_into<I, O>(
        &self,
        tensor: &Tensor,
        input: I,
        output: O,
        op: Reduce,
    ) -> Result<(I, O), WorkerError>
    where
        I: AsRef<[f32]> + Send + 'static,
        O: AsMut<[f32]> + Send + 'static,
    {
        let average = op == Reduce::Average;
        let data = HostInto { input, output };
        self.submit(tensor, data, RoundKind::Sum { average })
            .await
            .map(|d| (d.input, d.output))
    }

    /// Makes every worker's `buf` equal to the `root` worker's, bit for bit: a round of op
    /// `Broadcast` in which the root pushes its data as raw fp32 (whatever the tensor's
    /// compressor; its state, e.g. error feedback, is untouched) and the others push empty
    /// payloads; every worker (the root included) gets the root's payload back.
    ///
    /// Uses one round of the tensor like [`Worker::push_pull`], with the same serialisation,
    /// cancellation behaviour and errors, plus [`WorkerError::BadRoot`] for a root that is not
    /// a rank (nothing sent). Non-root buffers must still have the tensor's length; their
    /// contents are ignored.
    pub async fn broadcast<B>(&self, tensor: &Tensor, buf: B, root: u32) -> Result<B, WorkerError>
    where
        B: AsMut<[f32]> + Send + 'static,
    {
        self.check_root(tensor, root)?;
        self.submit(tensor, HostData(buf), RoundKind::Broadcast { root })
            .await
            .map(|d| d.0)
    }

    fn check_root(&self, tensor: &Tensor, root: u32) -> Result<(), WorkerError> {
        if root >= self.num_workers() {
            return Err(WorkerError::BadRoot {
                name: tensor.name().to_string(),
                root,
                num_workers: self.num_workers(),
            });
        }
        Ok(())
    }

    /// Runs one round of `tensor` over `data` in a task of its own and waits for it. The task
    /// always runs to its end: `submit` returns only once it has (or before spawning it), which
    /// [`crate::BlockingWorker`] relies on when it lends the caller's slice.
    async fn submit<R: RoundData>(
        &self,
        tensor: &Tensor,
        data: R,
        kind: RoundKind,
    ) -> Result<R, WorkerError> {
        if let (Some(_), RoundKind::Sum { average }) = (&tensor.inner.low_rank, kind) {
            return self.low_rank_step(tensor, data, average).await;
        }
        self.submit_round(tensor, data, kind).await
    }

    /// [`Worker::submit`] of one round of `tensor` itself (a PowerSGD tensor's steps are
    /// rounds of other tensors too).
    async fn submit_round<R: RoundData>(
        &self,
        tensor: &Tensor,
        data: R,
        kind: RoundKind,
    ) -> Result<R, WorkerError> {
        let mut prepared = self.prepare(tensor, data, kind).await?;
        self.launch(&mut [&mut prepared]);
        join_round(prepared.unless_refused()?.spawn(None), tensor.name()).await
    }

    /// Starts what the prepared rounds of one call can run ahead together
    /// ([`RoundData::launch`]: a device's batch), timed as compression and split evenly over
    /// the rounds.
    fn launch<R: RoundData>(&self, prepared: &mut [&mut Prepared<R>]) {
        let Some(first) = prepared.first() else {
            return;
        };
        let call = Launch {
            kind: first.kind,
            lr: first.ctx.lr(),
            num_workers: self.num_workers(),
            batches: &self.inner.batches,
        };
        let t0 = std::time::Instant::now();
        let mut rounds: Vec<Starting<'_, R>> = prepared
            .iter_mut()
            .map(|p| {
                let Prepared {
                    tensor,
                    data,
                    rounds: held,
                    ..
                } = &mut **p;
                Starting {
                    tensor,
                    data,
                    round: held.next(),
                }
            })
            .collect();
        R::launch(&mut rounds, &call);
        drop(rounds);
        if let RoundKind::Sum { .. } = call.kind {
            let nanos =
                u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX) / prepared.len() as u64;
            for p in prepared.iter() {
                p.tensor.compress_nanos.fetch_add(nanos, Ordering::Relaxed);
            }
        }
    }

    /// Everything of a round up to its task: checks `data` against `tensor`, waits for the
    /// tensor's previous round (its round lock), and takes the tensor's state for the round.
    async fn prepare<R: RoundData>(
        &self,
        tensor: &Tensor,
        mut data: R,
        kind: RoundKind,
    ) -> Result<Prepared<R>, WorkerError> {
        self.check_tensor(tensor)?;
        crate::gossip::check_exchange(&tensor.inner, kind)?;
        if let Some(got) = data.wrong_len(tensor.len()) {
            return Err(WorkerError::LengthMismatch {
                name: tensor.name().to_string(),
                declared: tensor.len(),
                got,
            });
        }
        let shared = &self.inner.shared;
        let guard = shared.op_guard()?;
        let rounds = tensor.inner.round.clone().lock_owned().await;
        if let Some(e) = shared.state().fatal {
            return Err(e);
        }
        // Holding the tensor: claim its home and take its state, before a round is used; undo
        // a discarded round there, before anything is launched (again, should a round that
        // was prepared not run: undoing twice does nothing). It stays discarded until a round
        // carries the news to the servers.
        data.begin(&tensor.inner, kind)?;
        if let RoundKind::Gossip = kind {
            tensor.inner.bound.fix(rounds.next());
        }
        let undone = rounds.undo_before(kind);
        if let Some(round) = undone {
            data.undo(&tensor.inner, round);
        }
        let ctx = RoundCtx {
            shared: shared.clone(),
            links: self.inner.links.clone(),
            sender: self.inner.sender.clone(),
            rank: self.inner.rank,
            num_workers: self.num_workers(),
            pool: self.inner.pool.clone(),
            learning_rate: self.inner.learning_rate.load(Ordering::Relaxed),
            undone,
        };
        Ok(Prepared {
            ctx,
            local: self.inner.local.clone(),
            tensor: tensor.inner.clone(),
            rounds,
            guard,
            data,
            kind,
        })
    }

    /// Waits until every worker of the job has entered the same barrier (barriers are counted
    /// per worker: the n-th `barrier` call of every worker forms barrier n).
    ///
    /// Dropping the future after it was first polled still counts as entering the barrier.
    ///
    /// # Errors
    /// A fatal error if the job failed (names the lost node); [`WorkerError::Finished`] after
    /// `finish`.
    pub async fn barrier(&self) -> Result<(), WorkerError> {
        let shared = &self.inner.shared;
        shared.check()?;
        let id = self.inner.barrier_seq.fetch_add(1, Ordering::Relaxed);
        let rx = lock(&shared.pending).wait_barrier(id)?;
        shared.send(ToScheduler::Barrier { id })?;
        rx.await.map_err(|_| {
            shared
                .state()
                .fatal
                .unwrap_or_else(|| WorkerError::Internal("barrier waiter dropped".into()))
        })?
    }

    /// Ends a worker whose job failed, at once (instead of [`Worker::finish`], which waits for
    /// the operations still running): they fail with [`WorkerError::Abandoned`], every
    /// connection closes telling the other nodes why, and this waits (at most a second) for
    /// the closes to leave, so that a process that exits next does not leave its peers to
    /// notice by a missed heartbeat. Why: where the job already failed with a lost node or
    /// member of this worker's local group, that one is named (not this worker); where the
    /// scheduler ended it, its error is passed on; else `reason`.
    pub async fn abort(self, reason: &str) {
        let inner = &self.inner;
        if inner.shared.state().phase < Phase::Closed {
            inner.shared.fail(WorkerError::Abandoned {
                reason: reason.to_string(),
            });
            inner.close(&Departure::Failed(reason.to_string()));
        }
        let _ = tokio::time::timeout(WAIT_IDLE_BOUND, inner.endpoint.quinn.wait_idle()).await;
    }

    /// Ends this worker cleanly: stops new operations (on every clone), waits for running
    /// push_pulls/broadcasts (detached ones included) to complete (they complete when the other
    /// workers push their share, or fail when a node is lost), tells the scheduler
    /// `Finished`, waits for its `Shutdown` (sent once every worker has finished) for at most
    /// `cluster.heartbeat_timeout_ms`, and closes every connection. With a timeline
    /// (`[trace] dir`, `PUSHPULL_TRACE`), it then writes this process's trace file.
    ///
    /// Returns `Ok` when this worker's part ended cleanly, or the error that ended the job
    /// (e.g. another node was lost before the scheduler could shut the job down).
    /// Declares and barriers still waiting on other clones fail with
    /// [`WorkerError::Finished`]. Calling `finish` a second time (on a clone) returns
    /// `Err(WorkerError::Finished)`.
    pub async fn finish(self) -> Result<(), WorkerError> {
        let shared = self.inner.shared.clone();
        if !shared.begin_finish() {
            return Err(WorkerError::Finished);
        }
        let mut rx = shared.subscribe();
        let _ = rx.wait_for(|s| s.inflight == 0 || s.fatal.is_some()).await;
        if shared.state().fatal.is_none() {
            lock(&shared.pending).poison(&WorkerError::Finished);
            // From here on, connections closing are the expected end.
            shared.set_phase(Phase::FinishedSent);
            let bound = shared.heartbeat_timeout;
            match tokio::time::timeout(bound, shared.send_flushed(ToScheduler::Finished)).await {
                Ok(Ok(())) => {
                    let done = tokio::time::timeout(
                        bound,
                        rx.wait_for(|s| s.shutdown || s.fatal.is_some() || s.scheduler_closed),
                    )
                    .await;
                    if done.is_err() {
                        tracing::debug!(
                            "worker {}: no Shutdown within {:.1} s of Finished; closing",
                            self.inner.rank,
                            bound.as_secs_f64()
                        );
                    }
                }
                Ok(Err(e)) => tracing::warn!("worker {}: sending Finished: {e}", self.inner.rank),
                Err(_) => tracing::warn!(
                    "worker {}: Finished not sent within {:.1} s",
                    self.inner.rank,
                    bound.as_secs_f64()
                ),
            }
            shared.close_control(CLOSE_CONTROL_BOUND).await;
        }
        let result = match shared.state().fatal {
            Some(e) => Err(e),
            None => Ok(()),
        };
        self.inner.close(&Departure::Done("worker finished".into()));
        let _ = tokio::time::timeout(WAIT_IDLE_BOUND, self.inner.endpoint.quinn.wait_idle()).await;
        pushpull_net::timeline::write();
        result
    }
}

/// A round ready to run: its tensor's round lock taken, its data checked and begun
/// ([`Worker::prepare`]). Dropped without [`Prepared::spawn`], it gives the lock back without
/// using a round number; host data loses nothing (device data would lose the chains `begin`
/// took, so device rounds are spawned at once).
struct Prepared<R: RoundData> {
    ctx: RoundCtx,
    /// This worker's local group, where the cluster has them (`cluster.local_size` > 1):
    /// chunks then go through [`crate::local::chunk_round`].
    local: Option<Arc<Local>>,
    tensor: Arc<TensorInner>,
    rounds: tokio::sync::OwnedMutexGuard<TensorRounds>,
    guard: crate::shared::OpGuard,
    data: R,
    kind: RoundKind,
}

impl<R: RoundData> Prepared<R> {
    /// The round, or the error of a launch that refused it ([`RoundData::refused`]): then
    /// it is given up before it uses a round number (its state goes back to the tensor, its
    /// lock is released), so this worker's next call on the tensor takes the round the others
    /// are waiting in.
    fn unless_refused(mut self) -> Result<Prepared<R>, WorkerError> {
        let Some(message) = self.data.refused() else {
            return Ok(self);
        };
        // A refused round decodes nothing: there is nothing to wait for.
        let _ = self.data.end(&self.tensor);
        Err(WorkerError::Device {
            name: self.tensor.placement.name.clone(),
            message: format!("{message}; nothing was sent and no round was used"),
        })
    }

    /// Runs the round in a task of its own. `hold` (a group's, see [`Worker::push_pull_group_into`])
    /// is released once every chunk of the round is queued for sending.
    fn spawn(self, hold: Option<SendHold>) -> JoinHandle<Result<R, WorkerError>> {
        let Prepared {
            ctx,
            local,
            tensor: t,
            mut rounds,
            guard,
            data,
            kind,
        } = self;
        tokio::spawn(async move {
            let _guard = guard;
            let started = std::time::Instant::now();
            // A sum round's pushes carry a discard to the servers.
            let round = rounds.start(kind);
            t.rounds_started.store(rounds.next(), Ordering::Relaxed);
            let data = std::sync::Mutex::new(data);
            let span = crate::spans::round(ctx.rank, &t, round, kind);
            let mut result =
                run_round(ctx, local.as_deref(), t.clone(), round, kind, &data, hold).await;
            let mut data = data.into_inner().unwrap_or_else(|p| p.into_inner());
            let t0 = std::time::Instant::now();
            let settling = data.end(&t);
            crate::round::add_nanos(&t.decompress_nanos, t0);
            if let Some(settling) = settling {
                let settled = settling.await;
                result = result.and(settled);
            }
            drop(span);
            if result.is_ok() {
                t.rounds_done.fetch_add(1, Ordering::Relaxed);
                t.round_clock.observe(started.elapsed());
            }
            result.map(|()| data)
        })
    }
}

/// Waits for a round's task (a panic in it is an internal error naming the tensor).
async fn join_round<R>(
    task: JoinHandle<Result<R, WorkerError>>,
    name: &str,
) -> Result<R, WorkerError> {
    task.await.map_err(|e| {
        WorkerError::Internal(format!("the round task of tensor {name:?} failed: {e}"))
    })?
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("rank", &self.rank())
            .field("num_workers", &self.num_workers())
            .field("num_servers", &self.num_servers())
            .field("scheduler", &self.inner.shared.scheduler.addr)
            .finish()
    }
}
