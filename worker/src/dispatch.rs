//! The table that matches incoming `Result`/`Abort` frames to waiting chunks.
//!
//! One [`Dispatch`] per server connection. A chunk [`register`](Dispatch::register)s its
//! `(key, round)` *before* sending its push, so its result can't arrive unseen. A frame can
//! still arrive before the registration: a server aborts a round for every worker as soon as
//! one worker's push is bad, possibly before this worker pushed. Such frames are kept
//! ([`Slot::Arrived`]) and handed over at registration. When the job fails,
//! [`poison`](Dispatch::poison) fails every waiting chunk at once and every later
//! registration, with the error that names the lost node. No I/O here: it is tested directly.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::oneshot;

use crate::error::WorkerError;

/// The most early frames (arrived with nobody waiting) kept per connection. Legitimately only
/// aborts of rounds this worker hasn't pushed yet arrive early; the cap only guards memory
/// against a misbehaving server.
pub(crate) const MAX_EARLY: usize = 1 << 16;

/// What a server answered for one `(key, round)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The aggregated, encoded chunk.
    Result(Bytes),
    /// The sum was not finite (some worker's chunk, or the sum, held inf or NaN).
    NonFinite,
    /// The round was aborted; the server's message.
    Abort(String),
}

/// What a waiting chunk receives: the outcome, or the error that ended the job.
pub(crate) type Delivery = Result<Outcome, WorkerError>;

enum Slot {
    Waiting(oneshot::Sender<Delivery>),
    Arrived(Outcome),
}

/// A registered chunk: either its outcome already arrived, or it will come through the
/// receiver.
pub(crate) enum Waiter {
    /// Arrived before the registration (typically an abort).
    Ready(Outcome),
    /// Await this.
    Pending(oneshot::Receiver<Delivery>),
}

/// How [`Dispatch::deliver`] placed a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivered {
    /// A waiting chunk got it.
    ToWaiter,
    /// Nobody waited; kept for a later registration.
    Stored,
    /// Dropped: a second frame for a (key, round) that already has one, the table is poisoned,
    /// or the early-frame cap was reached.
    Dropped,
}

#[derive(Default)]
struct Inner {
    slots: HashMap<(u64, u64), Slot>,
    early: usize,
    poisoned: Option<WorkerError>,
}

/// The `(key, round)` → waiting chunk table of one server connection.
#[derive(Default)]
pub(crate) struct Dispatch {
    inner: Mutex<Inner>,
}

impl Dispatch {
    /// An empty table.
    pub(crate) fn new() -> Dispatch {
        Dispatch::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock can only come from a bug; the data stays usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers interest in `(key, round)`. Fails with the job's error once poisoned, or with
    /// an internal error if the same `(key, round)` is already awaited (a bug: a tensor's
    /// rounds are serialised).
    pub(crate) fn register(&self, key: u64, round: u64) -> Result<Waiter, WorkerError> {
        let mut inner = self.lock();
        if let Some(e) = &inner.poisoned {
            return Err(e.clone());
        }
        match inner.slots.remove(&(key, round)) {
            Some(Slot::Arrived(outcome)) => {
                inner.early -= 1;
                Ok(Waiter::Ready(outcome))
            }
            Some(Slot::Waiting(tx)) if !tx.is_closed() => {
                inner.slots.insert((key, round), Slot::Waiting(tx));
                Err(WorkerError::Internal(format!(
                    "key {key:#018x} round {round} is awaited twice"
                )))
            }
            Some(Slot::Waiting(_)) | None => {
                let (tx, rx) = oneshot::channel();
                inner.slots.insert((key, round), Slot::Waiting(tx));
                Ok(Waiter::Pending(rx))
            }
        }
    }

    /// Hands a frame's outcome to the chunk waiting for `(key, round)`, or keeps it.
    pub(crate) fn deliver(&self, key: u64, round: u64, outcome: Outcome) -> Delivered {
        let mut inner = self.lock();
        if inner.poisoned.is_some() {
            return Delivered::Dropped;
        }
        match inner.slots.remove(&(key, round)) {
            Some(Slot::Waiting(tx)) => {
                // A closed receiver means the chunk's task was cancelled: nothing to do.
                let _ = tx.send(Ok(outcome));
                Delivered::ToWaiter
            }
            Some(arrived @ Slot::Arrived(_)) => {
                inner.slots.insert((key, round), arrived);
                Delivered::Dropped
            }
            None if inner.early >= MAX_EARLY => Delivered::Dropped,
            None => {
                inner.early += 1;
                inner.slots.insert((key, round), Slot::Arrived(outcome));
                Delivered::Stored
            }
        }
    }

    /// Fails every waiting chunk and every later registration with `error` (the first poison
    /// wins). Returns how many waiting chunks were failed.
    pub(crate) fn poison(&self, error: &WorkerError) -> usize {
        let mut inner = self.lock();
        if inner.poisoned.is_none() {
            inner.poisoned = Some(error.clone());
        }
        let error = inner.poisoned.clone().expect("just set");
        let mut failed = 0;
        for (_, slot) in inner.slots.drain() {
            if let Slot::Waiting(tx) = slot {
                if tx.send(Err(error.clone())).is_ok() {
                    failed += 1;
                }
            }
        }
        inner.early = 0;
        failed
    }

    /// Entries currently held (waiting or arrived early), for tests and diagnostics.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pushpull_proto::{NodeName, NodeRole};

    fn pending(w: Waiter) -> oneshot::Receiver<Delivery> {
        match w {
            Waiter::Pending(rx) => rx,
            Waiter::Ready(o) => panic!("unexpected ready outcome {o:?}"),
        }
    }

    fn lost() -> WorkerError {
        WorkerError::NodeLost {
            node: NodeName {
                role: NodeRole::Server,
                id: 1,
                addr: ([127, 0, 0, 1], 9101).into(),
            },
            reason: "connection lost".into(),
        }
    }

    #[test]
    fn result_reaches_the_registered_chunk_only() {
        let d = Dispatch::new();
        let mut a = pending(d.register(1, 0).unwrap());
        let mut b = pending(d.register(2, 0).unwrap());
        let payload = Bytes::from_static(b"abcd");
        assert_eq!(
            d.deliver(1, 0, Outcome::Result(payload.clone())),
            Delivered::ToWaiter
        );
        assert_eq!(a.try_recv().unwrap(), Ok(Outcome::Result(payload)));
        assert!(b.try_recv().is_err(), "key 2 must still wait");
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn same_key_different_rounds_are_distinct() {
        let d = Dispatch::new();
        let mut r0 = pending(d.register(7, 0).unwrap());
        assert_eq!(
            d.deliver(7, 1, Outcome::Abort("later round".into())),
            Delivered::Stored
        );
        assert!(r0.try_recv().is_err());
        match d.register(7, 1).unwrap() {
            Waiter::Ready(Outcome::Abort(m)) => assert_eq!(m, "later round"),
            _ => panic!("expected the stored abort"),
        }
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn early_abort_is_kept_until_registration() {
        let d = Dispatch::new();
        assert_eq!(
            d.deliver(5, 3, Outcome::Abort("rank 1 bad".into())),
            Delivered::Stored
        );
        // A duplicate early frame for the same (key, round) is dropped, the first one kept.
        assert_eq!(
            d.deliver(5, 3, Outcome::Abort("again".into())),
            Delivered::Dropped
        );
        match d.register(5, 3).unwrap() {
            Waiter::Ready(Outcome::Abort(m)) => assert_eq!(m, "rank 1 bad"),
            _ => panic!("expected the early abort"),
        }
        assert_eq!(d.len(), 0);
    }

    #[test]
    fn double_registration_is_a_bug_not_a_hang() {
        let d = Dispatch::new();
        let _rx = d.register(9, 0).unwrap();
        let e = d.register(9, 0).err().unwrap();
        assert!(e.to_string().contains("awaited twice"), "{e}");
    }

    #[test]
    fn a_cancelled_waiter_can_be_replaced() {
        let d = Dispatch::new();
        drop(d.register(9, 0).unwrap());
        let mut rx = pending(d.register(9, 0).unwrap());
        d.deliver(9, 0, Outcome::Result(Bytes::new()));
        assert!(rx.try_recv().unwrap().is_ok());
        assert_eq!(d.len(), 0);
    }

    #[test]
    fn poison_fails_pending_and_future_chunks() {
        let d = Dispatch::new();
        let mut a = pending(d.register(1, 0).unwrap());
        let mut b = pending(d.register(2, 5).unwrap());
        d.deliver(3, 0, Outcome::Abort("early".into()));
        assert_eq!(d.poison(&lost()), 2);
        for rx in [&mut a, &mut b] {
            let e = rx.try_recv().unwrap().unwrap_err();
            assert!(
                e.to_string().contains("server 1 (127.0.0.1:9101) was lost"),
                "{e}"
            );
        }
        let e = d.register(3, 0).err().unwrap();
        assert_eq!(e, lost());
        // The first poison wins.
        d.poison(&WorkerError::Dropped);
        assert_eq!(d.register(8, 0).err().unwrap(), lost());
        assert_eq!(
            d.deliver(1, 0, Outcome::Result(Bytes::new())),
            Delivered::Dropped
        );
    }

    #[test]
    fn early_frames_are_capped() {
        let d = Dispatch::new();
        for k in 0..MAX_EARLY as u64 {
            assert_eq!(
                d.deliver(k, 0, Outcome::Abort(String::new())),
                Delivered::Stored
            );
        }
        assert_eq!(
            d.deliver(u64::MAX, 0, Outcome::Abort(String::new())),
            Delivered::Dropped
        );
        let _ = d.register(0, 0).unwrap();
        assert_eq!(
            d.deliver(u64::MAX, 0, Outcome::Abort(String::new())),
            Delivered::Stored
        );
    }
}
