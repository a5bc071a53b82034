//! [`Handle`] (`pushpull._native.Handle`): one round in flight, polled or waited for from
//! Python.

use std::sync::{Arc, Mutex};

use pushpull_worker::WorkerError;
use pyo3::prelude::*;
use tokio::runtime::Runtime;
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
