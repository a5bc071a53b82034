//! How a worker ends: its connections closed saying why (`Departure`), its background tasks
//! stopped; on drop without `finish`, the error that ended it decides what its peers are told.

use pushpull_proto::departure::Departure;

use super::{lock, WorkerInner};
use crate::error::WorkerError;
use crate::shared::Phase;

impl WorkerInner {
    /// Closes every connection, saying why (servers fail the rounds that need this worker
    /// when it has finished: `Departure::Done`), and stops the background tasks.
    pub(super) fn close(&self, why: &Departure) {
        self.shared.set_phase(Phase::Closed);
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        let (code, reason) = (why.code().into(), why.reason());
        for link in self.links.iter() {
            link.peer.conn.close(code, &reason);
        }
        self.endpoint.quinn.close(code, &reason);
    }
}

impl Drop for WorkerInner {
    fn drop(&mut self) {
        let state = self.shared.state();
        if state.phase < Phase::Closed {
            if state.fatal.is_none() {
                tracing::warn!(
                    "worker {} dropped without finish(): closing its connections; the scheduler will report it lost",
                    self.rank
                );
            }
            self.shared.fail(WorkerError::Dropped);
            // A member of this worker's local group was lost: say so, so that the scheduler
            // names it (it may not have noticed yet), not this worker.
            let fatal = self.shared.state().fatal;
            let why = fatal
                .and_then(|e| crate::local::departure(&e, &self.map.workers))
                .unwrap_or_else(|| Departure::Failed("worker dropped without finish()".into()));
            self.close(&why);
        }
    }
}
