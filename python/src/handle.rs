//! [`Handle`] (`pushpull._native.Handle`): one round in flight, polled or waited for from
//! Python; [`order_after`]: another stream of a device ordered after rounds on it, without
//! the host waiting.

use std::sync::{Arc, Mutex};

use pushpull_worker::{Device, WorkerError};
use pyo3::prelude::*;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::{NodeLostError, PushPullError};

pub(crate) enum HandleState {
    Running(JoinHandle<Result<(), WorkerError>>),
    /// A thread is in `wait()` with the task.
    Waiting,
    /// The outcome: the error's message and whether it was a lost node.
    Done(Result<(), (String, bool)>),
}

/// One round in flight (`pushpull._native.Handle`).
#[pyclass(module = "pushpull._native", frozen)]
pub struct Handle {
    pub(crate) runtime: Arc<Runtime>,
    /// Never held while waiting: a thread that holds the GIL may ask for it (`poll`).
    pub(crate) state: Mutex<HandleState>,
}

impl Handle {
    fn lock(&self) -> std::sync::MutexGuard<'_, HandleState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The round's task, to be awaited elsewhere: the handle resolves to what is sent on the
    /// returned sender instead. `None` when the round has ended or a thread is waiting for it.
    fn hand_over(&self) -> Option<(TaskOf, oneshot::Sender<Result<(), WorkerError>>)> {
        let mut state = self.lock();
        if !matches!(*state, HandleState::Running(_)) {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        let relay = self.runtime.spawn(async move {
            rx.await.unwrap_or_else(|_| {
                Err(WorkerError::Internal(
                    "the task ordering a stream after the round ended without its outcome".into(),
                ))
            })
        });
        match std::mem::replace(&mut *state, HandleState::Running(relay)) {
            HandleState::Running(task) => Some((task, tx)),
            _ => unreachable!("matched above, under the same lock"),
        }
    }

    /// Whether the round has ended (its outcome is kept).
    fn ended(&self) -> bool {
        matches!(*self.lock(), HandleState::Done(_))
    }
}

type TaskOf = JoinHandle<Result<(), WorkerError>>;

/// A ticket to signal: when dropped unsignalled too (the task holding it cancelled, e.g. the
/// runtime shutting down), since a stream waiting for it must never wait forever.
struct Release<D: Device> {
    device: Arc<D>,
    ticket: u32,
    done: bool,
}

impl<D: Device> Release<D> {
    fn now(mut self) -> Result<(), pushpull_worker::CudaError> {
        self.done = true;
        self.device.signal(self.ticket)
    }
}

impl<D: Device> Drop for Release<D> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.device.signal(self.ticket);
        }
    }
}

/// Orders later work on `stream` (a stream of `device`; 0 on the emulated device: the calling
/// thread) after the rounds of `handles`, all on `device`, without the host waiting: the
/// stream waits for a ticket ([`Device::wait_ticket`]) that the device's stream passes once
/// every round has ended (their decodes queued before it), or has failed. The handles still
/// resolve to their rounds' outcomes, and `wait()` raises their errors; a stream released by a
/// failed round runs on whatever its buffer holds, so the caller must look at the outcomes
/// before trusting what that stream computed.
///
/// # Safety
/// `stream` is a live stream of `device`'s context.
pub(crate) unsafe fn order_after<D: Device>(
    py: Python<'_>,
    runtime: &Runtime,
    handles: &[Py<Handle>],
    device: Arc<D>,
    stream: u64,
) -> Result<(), String> {
    let ticket = device.ticket().map_err(|e| e.to_string())?;
    let mut tasks = Vec::new();
    let mut watched = Vec::new();
    for h in handles {
        match h.get().hand_over() {
            Some(task) => tasks.push(task),
            None if h.get().ended() => {}
            // A thread is in `wait()` with the task: watch for its outcome.
            None => watched.push(h.clone_ref(py)),
        }
    }
    let release = Release {
        device: device.clone(),
        ticket,
        done: false,
    };
    runtime.spawn(async move {
        let mut outcomes = Vec::with_capacity(tasks.len());
        for (task, tx) in tasks {
            let outcome = task.await.unwrap_or_else(|e| {
                Err(WorkerError::Internal(format!(
                    "the round's task failed: {e}"
                )))
            });
            outcomes.push((outcome, tx));
        }
        for h in watched {
            while !h.get().ended() {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        }
        let released = release.now();
        for (outcome, tx) in outcomes {
            // The streams were released from the host, maybe before the results were written.
            let outcome = match (&released, outcome) {
                (Err(e), Ok(())) => Err(WorkerError::Internal(format!(
                    "the round ended, but its device could not release the streams ordered \
                     after it ({e}); they went on without waiting for the result"
                ))),
                (_, outcome) => outcome,
            };
            let _ = tx.send(outcome);
        }
    });
    // SAFETY: the caller vouches for `stream`; the task above signals the ticket whatever
    // becomes of the rounds.
    py.detach(|| unsafe { device.wait_ticket(stream, ticket) })
        .map_err(|e| e.to_string())
}

#[pymethods]
impl Handle {
    /// Whether the round has finished (`wait()` then returns at once).
    fn poll(&self) -> bool {
        match &*self.lock() {
            HandleState::Running(task) => task.is_finished(),
            HandleState::Waiting => false,
            HandleState::Done(_) => true,
        }
    }

    /// Waits for the round (releasing the GIL) and raises its error, if any; the buffer then
    /// holds the result. Waiting again, or from several threads, returns (or raises) the same.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        let task = {
            let mut state = self.lock();
            match std::mem::replace(&mut *state, HandleState::Waiting) {
                HandleState::Running(task) => Some(task),
                other => {
                    *state = other;
                    None
                }
            }
        };
        if let Some(task) = task {
            let outcome = match py.detach(|| self.runtime.block_on(task)) {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => {
                    let lost = matches!(
                        e,
                        WorkerError::NodeLost { .. } | WorkerError::JobFailed { .. }
                    );
                    Err((e.to_string(), lost))
                }
                Err(e) => Err((format!("the round's task failed: {e}"), false)),
            };
            *self.lock() = HandleState::Done(outcome);
        }
        loop {
            match &*self.lock() {
                HandleState::Done(Ok(())) => return Ok(()),
                HandleState::Done(Err((m, true))) => return Err(NodeLostError::new_err(m.clone())),
                HandleState::Done(Err((m, false))) => {
                    return Err(PushPullError::new_err(m.clone()))
                }
                HandleState::Running(_) | HandleState::Waiting => {}
            }
            // Another thread is waiting for the task: wait for its outcome without the GIL.
            py.detach(|| std::thread::sleep(std::time::Duration::from_millis(1)));
        }
    }
}
