//! How a worker ends: its connections closed saying why (`Departure`), its background tasks
//! stopped; on drop without `finish`, the error that ended it decides what its peers are told.

use pushpull_proto::departure::Departure;

use super::{lock, WorkerInner};
use crate::error::WorkerError;
use crate::shared::Phase;

impl WorkerInner {
    /// Closes every connection, saying why (servers fail the rounds that need this worker
    /// when it has finished: `Departure::Done`), and stops the background tasks. When the job's
    /// error is a lost node or member of this worker's local group, or the scheduler's end of
    /// the job, the connections say that instead, whatever `why` says
    /// (`WorkerError::departure`), so that the scheduler and the servers
    /// blame the lost one (it may not have noticed yet), not this worker: whichever closes
    /// first, the group's loss callback or this, says the same.
    pub(super) fn close(&self, why: &Departure) {
        let fatal = self.shared.state().fatal;
        let passed_on = fatal.and_then(|e| e.departure(&self.map.workers));
        let why = passed_on.as_ref().unwrap_or(why);
        self.shared.set_phase(Phase::Closed);
        for t in lock(&self.tasks).drain(..) {
            t.abort();
        }
        let (code, reason) = (why.code().into(), why.reason());
        for peer in &self.links.peers {
            peer.conn.close(code, &reason);
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
            self.close(&Departure::Failed("worker dropped without finish()".into()));
        }
    }
}
