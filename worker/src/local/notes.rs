//! The table that matches the notes a local group's members send each other to the chunks
//! waiting for them (the local twin of [`crate::dispatch`]), and the notes themselves.
//!
//! A chunk's round waits for one thing at a time on one [`Channel`]: its turn to add to the
//! host sum (from the member before it), the host sum complete (the owner, from the last
//! member), the outcome (from the owner), every other member's copy of the last result (member
//! 0, before it overwrites the accumulator), or where a tensor's accumulator lives (from member
//! 0, once per tensor). A chunk [`register`](NoteTable::register)s before it can need the note;
//! a note that arrives first is counted and kept. When a member is lost or the job fails,
//! [`poison`](NoteTable::poison) fails every waiting chunk and every later registration with
//! the error naming it. No I/O here: it is tested directly.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::oneshot;

use crate::error::WorkerError;

/// What one member tells another about one chunk's round (or, for [`NoteKind::Placed`], one
/// tensor: `key` is its first chunk's key, `round` the accumulator's offset in elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum NoteKind {
    /// "I added my part": the next member's turn.
    Added,
    /// "The host sum is complete": to the owner, from the last member.
    Summed,
    /// The owner decoded the result into the accumulator.
    Result,
    /// The round's sum was not finite: the accumulator holds NaN.
    NonFinite,
    /// A server aborted the round (the owner's error has the server's message).
    Aborted,
    /// "I copied the result out": to member 0, which may then write the next round.
    Copied,
    /// Where a tensor's accumulator lives (from member 0, after its declare).
    Placed,
    /// Local rank 0 saw member `key` go (its process ended): never reaches a table, the
    /// transport poisons it instead.
    Lost,
}

impl NoteKind {
    /// Every kind, in wire order.
    pub(crate) const ALL: [NoteKind; 8] = [
        NoteKind::Added,
        NoteKind::Summed,
        NoteKind::Result,
        NoteKind::NonFinite,
        NoteKind::Aborted,
        NoteKind::Copied,
        NoteKind::Placed,
        NoteKind::Lost,
    ];

    /// The channel a note of this kind arrives on.
    pub(crate) fn channel(self) -> Channel {
        match self {
            NoteKind::Added | NoteKind::Summed => Channel::Turn,
            NoteKind::Result | NoteKind::NonFinite | NoteKind::Aborted => Channel::Outcome,
            NoteKind::Copied => Channel::Copied,
            NoteKind::Placed => Channel::Placed,
            // Handled by the transport (see the kind); its channel is never waited on.
            NoteKind::Lost => Channel::Outcome,
        }
    }
}

/// One note: its kind, the chunk's key and the round (see [`NoteKind::Placed`] for the one
/// exception).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Note {
    /// What happened.
    pub(crate) kind: NoteKind,
    /// The chunk's key.
    pub(crate) key: u64,
    /// The round.
    pub(crate) round: u64,
}

/// What a chunk waits on (one note of several kinds may answer it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Channel {
    /// [`NoteKind::Added`] or [`NoteKind::Summed`].
    Turn,
    /// [`NoteKind::Result`], [`NoteKind::NonFinite`] or [`NoteKind::Aborted`].
    Outcome,
    /// [`NoteKind::Copied`] (one from each other member).
    Copied,
    /// [`NoteKind::Placed`].
    Placed,
}

/// What a waiting chunk receives: the last note, or the error that ended the group.
pub(crate) type Arrival = Result<Note, WorkerError>;

/// A registration: either the notes already arrived, or await them.
pub(crate) enum Waiter {
    /// Every note needed is in (the last one).
    Ready(Note),
    /// Await this.
    Pending(oneshot::Receiver<Arrival>),
}

/// The most notes kept with nobody waiting: a member runs at most a few rounds ahead of
/// another per tensor, so legitimately far fewer; the cap guards memory against a bug.
const MAX_EARLY: usize = 1 << 20;

enum Slot {
    /// `got` notes of the `need` are in; `tx` fires when the last arrives.
    Waiting {
        need: u32,
        got: u32,
        tx: oneshot::Sender<Arrival>,
    },
    /// `got` notes arrived with nobody waiting; the last was `last`.
    Early { got: u32, last: Note },
}

#[derive(Default)]
struct Inner {
    slots: HashMap<(Channel, u64, u64), Slot>,
    early: usize,
    poisoned: Option<WorkerError>,
}

/// The `(channel, key, round)` → waiting chunk table of one member (see the module docs).
#[derive(Default)]
pub(crate) struct NoteTable {
    inner: Mutex<Inner>,
}

impl NoteTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slot of a note or a wait: [`Channel::Placed`] is per tensor, whatever the round
    /// (which carries the offset).
    fn id(channel: Channel, key: u64, round: u64) -> (Channel, u64, u64) {
        match channel {
            Channel::Placed => (channel, key, 0),
            _ => (channel, key, round),
        }
    }

    /// Waits for `need` notes (at least 1) on `channel` for `(key, round)` (`round` is
    /// ignored for [`Channel::Placed`]).
    pub(crate) fn register(
        &self,
        channel: Channel,
        key: u64,
        round: u64,
        need: u32,
    ) -> Result<Waiter, WorkerError> {
        let need = need.max(1);
        let mut inner = self.lock();
        if let Some(e) = &inner.poisoned {
            return Err(e.clone());
        }
        let id = Self::id(channel, key, round);
        let got = match inner.slots.remove(&id) {
            Some(Slot::Early { got, last }) => {
                inner.early -= got as usize;
                if got >= need {
                    return Ok(Waiter::Ready(last));
                }
                got
            }
            Some(Slot::Waiting { tx, need, got }) if !tx.is_closed() => {
                inner.slots.insert(id, Slot::Waiting { need, got, tx });
                return Err(WorkerError::Internal(format!(
                    "local notes {channel:?} of key {key:#018x} round {round} awaited twice"
                )));
            }
            Some(Slot::Waiting { .. }) | None => 0,
        };
        let (tx, rx) = oneshot::channel();
        inner.slots.insert(id, Slot::Waiting { need, got, tx });
        Ok(Waiter::Pending(rx))
    }

    /// Counts a note that arrived: hands it to its waiter once the waiter has all it needs, or
    /// keeps it. Returns false where it was dropped (poisoned table, too many early notes).
    pub(crate) fn deliver(&self, note: Note) -> bool {
        let mut inner = self.lock();
        if inner.poisoned.is_some() {
            return false;
        }
        let id = Self::id(note.kind.channel(), note.key, note.round);
        match inner.slots.remove(&id) {
            Some(Slot::Waiting { need, got, tx }) => {
                if got + 1 >= need {
                    // A waiter that gave up (its call was dropped) is gone: nothing to do.
                    let _ = tx.send(Ok(note));
                } else {
                    inner.slots.insert(
                        id,
                        Slot::Waiting {
                            need,
                            got: got + 1,
                            tx,
                        },
                    );
                }
                true
            }
            Some(Slot::Early { got, .. }) => {
                inner.early += 1;
                let slot = Slot::Early {
                    got: got + 1,
                    last: note,
                };
                inner.slots.insert(id, slot);
                true
            }
            None if inner.early >= MAX_EARLY => false,
            None => {
                inner.early += 1;
                inner.slots.insert(id, Slot::Early { got: 1, last: note });
                true
            }
        }
    }

    /// Fails every waiting chunk, and every later registration, with `error`.
    pub(crate) fn poison(&self, error: WorkerError) {
        let mut inner = self.lock();
        if inner.poisoned.is_some() {
            return;
        }
        for (_, slot) in inner.slots.drain() {
            if let Slot::Waiting { tx, .. } = slot {
                let _ = tx.send(Err(error.clone()));
            }
        }
        inner.early = 0;
        inner.poisoned = Some(error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(kind: NoteKind, key: u64, round: u64) -> Note {
        Note { kind, key, round }
    }

    fn ready(w: Waiter) -> NoteKind {
        match w {
            Waiter::Ready(n) => n.kind,
            Waiter::Pending(_) => panic!("expected the notes to be in"),
        }
    }

    #[test]
    fn a_note_before_or_after_its_registration_reaches_the_chunk() {
        let t = NoteTable::default();
        assert!(t.deliver(note(NoteKind::Added, 7, 0)));
        assert_eq!(
            ready(t.register(Channel::Turn, 7, 0, 1).unwrap()),
            NoteKind::Added
        );
        let Waiter::Pending(mut rx) = t.register(Channel::Outcome, 7, 0, 1).unwrap() else {
            panic!("nothing arrived yet")
        };
        assert!(rx.try_recv().is_err());
        assert!(t.deliver(note(NoteKind::NonFinite, 7, 0)));
        assert_eq!(rx.try_recv().unwrap().unwrap().kind, NoteKind::NonFinite);
        // A tensor's place arrives whatever its "round" (the offset).
        t.deliver(note(NoteKind::Placed, 7, 4096));
        let Waiter::Ready(n) = t.register(Channel::Placed, 7, 0, 1).unwrap() else {
            panic!("placed")
        };
        assert_eq!(n.round, 4096);
    }

    #[test]
    fn copies_are_counted_in_any_order_of_arrival_and_registration() {
        for early in 0..=3u32 {
            let t = NoteTable::default();
            for _ in 0..early {
                t.deliver(note(NoteKind::Copied, 1, 4));
            }
            // Another round's and another key's copies do not count.
            t.deliver(note(NoteKind::Copied, 1, 5));
            t.deliver(note(NoteKind::Copied, 2, 4));
            match t.register(Channel::Copied, 1, 4, 3).unwrap() {
                Waiter::Ready(_) => assert_eq!(early, 3),
                Waiter::Pending(mut rx) => {
                    for _ in early..2 {
                        t.deliver(note(NoteKind::Copied, 1, 4));
                        assert!(rx.try_recv().is_err(), "early {early}");
                    }
                    t.deliver(note(NoteKind::Copied, 1, 4));
                    assert_eq!(rx.try_recv().unwrap().unwrap().kind, NoteKind::Copied);
                }
            }
        }
    }

    #[test]
    fn a_lost_member_fails_waiters_and_later_registrations() {
        let t = NoteTable::default();
        let Waiter::Pending(mut rx) = t.register(Channel::Turn, 1, 0, 1).unwrap() else {
            panic!()
        };
        let lost = WorkerError::Internal("local rank 2 lost".into());
        t.poison(lost.clone());
        assert_eq!(
            rx.try_recv().unwrap().unwrap_err().to_string(),
            lost.to_string()
        );
        assert!(t.register(Channel::Turn, 1, 1, 1).is_err());
        assert!(!t.deliver(note(NoteKind::Added, 1, 1)));
    }

    #[test]
    fn a_second_registration_of_one_wait_is_a_bug_named() {
        let t = NoteTable::default();
        let _w = t.register(Channel::Turn, 9, 3, 1).unwrap();
        let e = t.register(Channel::Turn, 9, 3, 1).err().unwrap();
        assert!(e.to_string().contains("awaited twice"), "{e}");
    }
}
