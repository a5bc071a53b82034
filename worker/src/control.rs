//! Waiters for the scheduler's answers to declares and barriers (pure; no I/O).
//!
//! A declare of a name that is already being declared by this worker joins the pending one
//! instead of sending a second `Declare` (the scheduler counts one declare per worker and
//! name). When the job fails, [`ControlPending::poison`] fails every waiter and every later
//! wait with the error naming the lost node.

use std::collections::HashMap;

use pushpull_proto::protocol::TensorPlacement;
use tokio::sync::oneshot;

use crate::error::WorkerError;

/// The scheduler's answer to a declare, or the error that ended the job.
pub(crate) type DeclareAnswer = Result<Result<TensorPlacement, String>, WorkerError>;
/// A barrier's completion, or the error that ended the job.
pub(crate) type BarrierAnswer = Result<(), WorkerError>;

/// Declares and barriers waiting for the scheduler.
#[derive(Default)]
pub(crate) struct ControlPending {
    declares: HashMap<String, Vec<oneshot::Sender<DeclareAnswer>>>,
    barriers: HashMap<u64, oneshot::Sender<BarrierAnswer>>,
    poisoned: Option<WorkerError>,
}

impl ControlPending {
    /// Waits for the answer to declaring `name`. The `bool` is true when no declare of that
    /// name is pending yet, i.e. the caller must send the `Declare` message.
    pub(crate) fn wait_declare(
        &mut self,
        name: &str,
    ) -> Result<(oneshot::Receiver<DeclareAnswer>, bool), WorkerError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let (tx, rx) = oneshot::channel();
        let waiters = self.declares.entry(name.to_string()).or_default();
        let first = waiters.is_empty();
        waiters.push(tx);
        Ok((rx, first))
    }

    /// The scheduler answered the declare of `name`; returns how many waiters got it (0 when
    /// every waiter was cancelled, or for an answer nobody asked for).
    pub(crate) fn declared(
        &mut self,
        name: &str,
        result: Result<TensorPlacement, String>,
    ) -> usize {
        let mut woken = 0;
        for tx in self.declares.remove(name).unwrap_or_default() {
            if tx.send(Ok(result.clone())).is_ok() {
                woken += 1;
            }
        }
        woken
    }

    /// Waits for barrier `id`.
    pub(crate) fn wait_barrier(
        &mut self,
        id: u64,
    ) -> Result<oneshot::Receiver<BarrierAnswer>, WorkerError> {
        if let Some(e) = &self.poisoned {
            return Err(e.clone());
        }
        let (tx, rx) = oneshot::channel();
        if self.barriers.insert(id, tx).is_some() {
            return Err(WorkerError::Internal(format!("barrier {id} entered twice")));
        }
        Ok(rx)
    }

    /// Barrier `id` is complete; false if nobody waited for it.
    pub(crate) fn barrier_done(&mut self, id: u64) -> bool {
        match self.barriers.remove(&id) {
            Some(tx) => tx.send(Ok(())).is_ok(),
            None => false,
        }
    }

    /// Fails every waiter and every later wait with `error` (the first poison wins).
    pub(crate) fn poison(&mut self, error: &WorkerError) {
        if self.poisoned.is_none() {
            self.poisoned = Some(error.clone());
        }
        let error = self.poisoned.clone().expect("just set");
        for (_, waiters) in self.declares.drain() {
            for tx in waiters {
                let _ = tx.send(Err(error.clone()));
            }
        }
        for (_, tx) in self.barriers.drain() {
            let _ = tx.send(Err(error.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pushpull_proto::ParamMap;

    fn placement(name: &str, len: u64) -> TensorPlacement {
        pushpull_proto::placement::Placer::new(1, 4096).place(name, len, ParamMap::new())
    }

    #[test]
    fn concurrent_declares_of_one_name_send_once_and_share_the_answer() {
        let mut p = ControlPending::default();
        let (mut a, first_a) = p.wait_declare("w").unwrap();
        let (mut b, first_b) = p.wait_declare("w").unwrap();
        let (mut c, first_c) = p.wait_declare("other").unwrap();
        assert!(first_a && !first_b && first_c);
        assert_eq!(p.declared("w", Ok(placement("w", 10))), 2);
        assert_eq!(a.try_recv().unwrap().unwrap().unwrap().len, 10);
        assert_eq!(b.try_recv().unwrap().unwrap().unwrap().len, 10);
        assert!(c.try_recv().is_err());
        // The next declare of "w" is a new exchange.
        let (_d, first_d) = p.wait_declare("w").unwrap();
        assert!(first_d);
    }

    #[test]
    fn declare_errors_reach_every_waiter() {
        let mut p = ControlPending::default();
        let (mut a, _) = p.wait_declare("fc1.weight").unwrap();
        let msg = "tensor \"fc1.weight\": worker 0 declared 1000 elements, worker 1 declared 999";
        p.declared("fc1.weight", Err(msg.into()));
        assert_eq!(a.try_recv().unwrap().unwrap().unwrap_err(), msg);
    }

    #[test]
    fn cancelled_declare_is_not_resent_while_the_answer_is_pending() {
        let mut p = ControlPending::default();
        let (a, first) = p.wait_declare("w").unwrap();
        assert!(first);
        drop(a); // the caller's future was dropped after sending Declare
        let (mut b, first) = p.wait_declare("w").unwrap();
        assert!(!first, "the scheduler still owes an answer");
        assert_eq!(p.declared("w", Ok(placement("w", 3))), 1);
        assert!(b.try_recv().unwrap().is_ok());
        assert_eq!(p.declared("unasked", Ok(placement("unasked", 1))), 0);
    }

    #[test]
    fn barriers_complete_by_id() {
        let mut p = ControlPending::default();
        let mut b0 = p.wait_barrier(0).unwrap();
        let mut b1 = p.wait_barrier(1).unwrap();
        assert!(p.barrier_done(1));
        assert!(b1.try_recv().unwrap().is_ok());
        assert!(b0.try_recv().is_err());
        assert!(!p.barrier_done(7));
        assert!(p.wait_barrier(0).is_err(), "barrier 0 is already awaited");
    }

    #[test]
    fn poison_fails_everything_pending_and_later() {
        let mut p = ControlPending::default();
        let (mut d, _) = p.wait_declare("w").unwrap();
        let mut b = p.wait_barrier(0).unwrap();
        let lost = WorkerError::JobFailed {
            reason: "worker 1 (127.0.0.1:1) lost".into(),
        };
        p.poison(&lost);
        assert_eq!(d.try_recv().unwrap().unwrap_err(), lost);
        assert_eq!(b.try_recv().unwrap().unwrap_err(), lost);
        assert_eq!(p.wait_barrier(1).err().unwrap(), lost);
        assert_eq!(p.wait_declare("x").err().unwrap(), lost);
        p.poison(&WorkerError::Finished);
        assert_eq!(p.wait_barrier(2).err().unwrap(), lost, "first poison wins");
    }
}
