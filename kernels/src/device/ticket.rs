//! [`Tickets`]: which point of a device's stream other streams may pass, when the work they
//! wait for finishes in any order.
//!
//! Another stream (torch's, say) is ordered after a set of rounds without the host waiting:
//! it is handed a ticket and waits, on the device, until a word in memory reaches the ticket;
//! the device's own stream writes the word once the rounds are decoded ([`crate::device::Device::signal`]).
//! Rounds of different calls finish in any order, so the word may only advance over tickets
//! that have *all* finished: ticket 5 finishing before ticket 4 must not release ticket 4's
//! waiter. [`Tickets`] keeps that prefix; the devices write what it says.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};

/// Tickets handed out in order and finished in any order, and the word a waiter compares with
/// its ticket: the last ticket of the finished prefix (every ticket up to it has finished).
///
/// Tickets are `u32` (the width of a stream's wait on a word) counted from 1; a waiter's
/// comparison is cyclic ([`Tickets::passed`]), as CUDA's `CU_STREAM_WAIT_VALUE_GEQ` is, so the
/// count may wrap as long as fewer than 2³¹ tickets are outstanding.
#[derive(Debug, Default)]
pub struct Tickets {
    /// Tickets handed out so far (the last one's number).
    issued: u64,
    /// Every ticket up to this one has finished: the word's value.
    released: u64,
    /// Finished tickets above `released`.
    finished: BTreeSet<u64>,
}

impl Tickets {
    /// No ticket yet (the word starts at 0).
    pub fn new() -> Tickets {
        Tickets::default()
    }

    /// A new ticket, after every one handed out before.
    pub fn issue(&mut self) -> u32 {
        self.issued += 1;
        self.issued as u32
    }

    /// The tickets behind a device's lock (a poisoned lock's tickets are still consistent:
    /// every method leaves them so).
    pub fn locked(m: &Mutex<Tickets>) -> MutexGuard<'_, Tickets> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks `ticket` finished. Returns the word's new value when the finished prefix grew
    /// (the device then writes it), `None` otherwise: a ticket finished out of order, one
    /// finished twice, or one never handed out.
    pub fn finish(&mut self, ticket: u32) -> Option<u32> {
        let ahead = ticket.wrapping_sub(self.released as u32) as u64;
        let t = self.released + ahead;
        if ahead == 0 || t > self.issued {
            return None;
        }
        self.finished.insert(t);
        let before = self.released;
        while self.finished.remove(&(self.released + 1)) {
            self.released += 1;
        }
        (self.released != before).then_some(self.released as u32)
    }

    /// The word's value now (0 before any ticket finished).
    pub fn word(&self) -> u32 {
        self.released as u32
    }

    /// Whether a waiter for `ticket` may pass a word holding `word`: `word ≥ ticket`,
    /// cyclically (`(word − ticket) as i32 ≥ 0`, CUDA's `CU_STREAM_WAIT_VALUE_GEQ`).
    pub fn passed(word: u32, ticket: u32) -> bool {
        word.wrapping_sub(ticket) as i32 >= 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tickets finished in a shuffled order release exactly the finished prefix, every time;
    /// a plain model (a list of finished flags) is the reference.
    #[test]
    fn the_word_advances_over_the_finished_prefix_only() {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        println!("seed {seed}");
        let mut rng = seed | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut t = Tickets::new();
        let n = 200;
        let tickets: Vec<u32> = (0..n).map(|_| t.issue()).collect();
        assert_eq!(tickets, (1..=n as u32).collect::<Vec<_>>());
        let mut order = tickets.clone();
        for i in (1..order.len()).rev() {
            order.swap(i, (next() % (i as u64 + 1)) as usize);
        }
        let mut done = vec![false; n + 1];
        for &k in &order {
            let word_before = t.word();
            let got = t.finish(k);
            done[k as usize] = true;
            let prefix = (1..=n).take_while(|&i| done[i]).count() as u32;
            assert_eq!(t.word(), prefix, "seed {seed}: after finishing {k}");
            assert_eq!(got, (prefix != word_before).then_some(prefix));
            for &w in &tickets {
                assert_eq!(Tickets::passed(t.word(), w), w <= prefix);
            }
            assert_eq!(t.finish(k), None, "finishing {k} twice changes nothing");
        }
        assert_eq!(t.finish(n as u32 + 1), None, "a ticket never handed out");
    }

    /// On the emulated device the waiter is the calling thread: it passes once its ticket and
    /// every earlier one are signalled, whatever order they are signalled in.
    #[test]
    fn an_emulated_wait_passes_once_the_prefix_is_signalled() {
        use crate::device::{Device, EmulatedDevice};
        use std::sync::mpsc;
        use std::time::Duration;

        let d = std::sync::Arc::new(EmulatedDevice::new());
        let (a, b) = (d.ticket().unwrap(), d.ticket().unwrap());
        // SAFETY: stream 0 is the emulated device's only stream.
        assert!(
            unsafe { d.wait_ticket(7, a) }.is_err(),
            "the emulated device has no streams"
        );
        let (tx, rx) = mpsc::channel();
        let waiter = {
            let d = d.clone();
            std::thread::spawn(move || {
                // SAFETY: as above.
                unsafe { d.wait_ticket(0, b) }.unwrap();
                tx.send(()).unwrap();
            })
        };
        d.signal(b).unwrap();
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "released before the earlier ticket was signalled"
        );
        d.signal(a).unwrap();
        rx.recv_timeout(Duration::from_secs(10))
            .expect("not released once both were signalled");
        waiter.join().unwrap();
        // SAFETY: as above. A ticket already passed returns at once.
        unsafe { d.wait_ticket(0, a) }.unwrap();
    }

    #[test]
    fn the_comparison_is_cyclic() {
        assert!(Tickets::passed(0, 0));
        assert!(!Tickets::passed(0, 1));
        assert!(Tickets::passed(5, u32::MAX)); // 5 is 6 tickets after u32::MAX
        assert!(!Tickets::passed(u32::MAX, 5));
        let mut t = Tickets {
            issued: u32::MAX as u64,
            released: u32::MAX as u64,
            finished: BTreeSet::new(),
        };
        let (a, b) = (t.issue(), t.issue());
        assert_eq!((a, b), (0, 1), "the numbers wrap");
        assert_eq!(t.finish(b), None);
        assert_eq!(t.finish(a), Some(1));
        assert!(Tickets::passed(t.word(), b) && Tickets::passed(t.word(), u32::MAX));
    }
}
