//! The order in which a node sends data frames on one connection: a pure state machine.
//!
//! Every data frame a worker pushes and every result a server sends goes through its node's
//! [`SendQueue`] (one for all the node's connections). Frames leave in **priority order** (higher first), **FIFO
//! within a priority** (the order they became ready), and only while the bytes *in flight*
//! (handed to QUIC and not yet acknowledged by the peer) stay within a byte **window**. A frame
//! leaves the window when the peer has acknowledged all of it ([`SendQueue::delivered`]), not
//! when its round completes: receivers read every stream to its end at once, so delivery never
//! waits for another worker, and two workers that issue tensors in different orders can never
//! wait on each other (the window of one can always drain).
//!
//! The async shell (`pushpull_net::sender::FrameSender`) pops frames, writes each on its own
//! QUIC stream with the same priority (quinn sends higher-priority streams first and, with
//! `send_fairness(false)`, finishes one stream before starting the next of the same priority),
//! and reports deliveries. No I/O and no clock here, so the order is tested directly.
//!
//! A frame may leave while the bytes in flight plus its own stay within the window, or, where
//! the window is to count whole frames ([`SendQueue::set_whole_frames`]), while the bytes in
//! flight are below it, as TCP's congestion window counts segments: the last frame may then
//! overshoot it by less than its own size. Whole frames are for a window that is the measured
//! rate times the round trip itself (a reply's, see [`rate`]): one that had to hold
//! every frame in full would carry only the whole frames that fit, measure that smaller rate,
//! and shrink frame by frame down to its floor (BENCHMARKS.md at 60710fe, "The window spans
//! the round trip": the 2 × 1 cluster's server, 128 KiB results against a window of 3.5 of
//! them).
//!
//! The window always has room for [`SendQueue::set_min_frames`] frames (at least two): a frame
//! may also leave while fewer frames than that are in flight, or while the bytes in flight
//! plus its own stay within that many times its size. So a window smaller than the frames (a
//! slow path's congestion window against large chunks) still keeps frames going out while
//! earlier ones are acknowledged, and no frame ever waits for good. The count matters where
//! sizes mix: a tiny frame (a bias's chunk) behind one large frame in flight that fills the
//! window would otherwise wait for that frame's acknowledgement, and the frames behind it
//! with it, while the link idles (BENCHMARKS.md at 60710fe, "Small frames behind a large one":
//! 10 Mbit/s, a worker's uplink idle a quarter of the time). The shell asks for a few per node
//! ([`rate::Flow::min_frames`]: two for a source, four for a reply), not per connection: a
//! floor that grows with the connections would let a node with four of them put eight large
//! frames in flight whatever window it was given.
//!
//! **Holds.** A frame also waits while a *hold* of higher priority is registered
//! ([`SendQueue::hold`]): a caller that is about to queue the frames of several tensors at once
//! holds each tensor's priority until that tensor's frames are queued, so that a
//! lower-priority tensor that happens to be encoded first does not leave first. Without it,
//! which frames a node sends first depends on how its calls interleave with its sender, and
//! two workers given the same calls may start in different orders: a chunk one of them sends
//! first and another last has its sum ready only at the end (BENCHMARKS.md at 60710fe, "The
//! order of simultaneous calls"). A hold only ever holds back frames of strictly lower
//! priority, and must be released without waiting for any peer, so holds cannot deadlock.
//!
//! How large the window should be is the shell's choice; [`rate::DeliveryRate`] measures the
//! node's delivery rate while busy and sizes the window from it ([`rate::Flow`]).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};

pub mod rate;

pub use rate::{DeliveryRate, Flow, RoundTrip, Window};

/// A frame waiting in a [`SendQueue`].
#[derive(Debug)]
struct Entry<T> {
    priority: i32,
    seq: u64,
    bytes: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.priority == other.priority && self.seq == other.seq
    }
}

impl<T> Eq for Entry<T> {}

impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Entry<T> {
    /// The heap's maximum is the next frame to send: the highest priority, then the oldest.
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority
            .cmp(&other.priority)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// Frames ready to send from one node, and the bytes in flight. See the [module
/// docs](self).
#[derive(Debug)]
pub struct SendQueue<T> {
    heap: BinaryHeap<Entry<T>>,
    next_seq: u64,
    window: u64,
    whole_frames: bool,
    min_frames: u64,
    in_flight: u64,
    /// Frames popped and not yet delivered.
    frames_in_flight: u64,
    queued_bytes: u64,
    /// Registered holds: priority → how many.
    holds: BTreeMap<i32, usize>,
}

impl<T> SendQueue<T> {
    /// An empty queue that keeps at most `window` bytes in flight (at least 1).
    pub fn new(window: u64) -> SendQueue<T> {
        SendQueue {
            heap: BinaryHeap::new(),
            next_seq: 0,
            window: window.max(1),
            whole_frames: false,
            min_frames: 2,
            in_flight: 0,
            frames_in_flight: 0,
            queued_bytes: 0,
            holds: BTreeMap::new(),
        }
    }

    /// Queues `item` of `bytes` bytes (what it occupies in the window) at `priority`.
    pub fn push(&mut self, item: T, priority: i32, bytes: u64) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queued_bytes = self.queued_bytes.saturating_add(bytes);
        self.heap.push(Entry {
            priority,
            seq,
            bytes,
            item,
        });
    }

    /// The next frame to send, if the window has room for it (see the [module docs](self)):
    /// `(item, priority, bytes)`. Its bytes count as in flight until [`SendQueue::delivered`].
    pub fn pop(&mut self) -> Option<(T, i32, u64)> {
        let head = self.heap.peek()?;
        if self
            .holds
            .last_key_value()
            .is_some_and(|(&p, _)| head.priority < p)
        {
            return None;
        }
        let after = self.in_flight.saturating_add(head.bytes);
        let in_window = if self.whole_frames {
            self.in_flight < self.window
        } else {
            after <= self.window
        };
        let fits = in_window
            || self.frames_in_flight < self.min_frames
            || after <= head.bytes.saturating_mul(self.min_frames);
        if !fits {
            return None;
        }
        let e = self.heap.pop()?;
        self.in_flight = self.in_flight.saturating_add(e.bytes);
        self.frames_in_flight += 1;
        self.queued_bytes -= e.bytes;
        Some((e.item, e.priority, e.bytes))
    }

    /// A popped frame of `bytes` bytes was acknowledged by the peer (or will never be: its
    /// stream or connection failed), freeing that much of the window. Once per popped frame.
    pub fn delivered(&mut self, bytes: u64) {
        debug_assert!(
            bytes <= self.in_flight && self.frames_in_flight > 0,
            "{bytes} > {} in flight, or no frame in flight",
            self.in_flight
        );
        self.in_flight = self.in_flight.saturating_sub(bytes);
        self.frames_in_flight = self.frames_in_flight.saturating_sub(1);
    }

    /// Holds back every frame of lower priority than `priority` until a matching
    /// [`SendQueue::release`] (see the [module docs](self)). Holds nest: each counts.
    pub fn hold(&mut self, priority: i32) {
        *self.holds.entry(priority).or_insert(0) += 1;
    }

    /// Releases one [`SendQueue::hold`] of `priority` (a release without a hold does nothing).
    pub fn release(&mut self, priority: i32) {
        if let Some(n) = self.holds.get_mut(&priority) {
            *n -= 1;
            if *n == 0 {
                self.holds.remove(&priority);
            }
        }
    }

    /// Takes every queued frame out (e.g. to fail them when the connection is lost), highest
    /// priority first.
    pub fn drain(&mut self) -> Vec<T> {
        let mut out = Vec::with_capacity(self.heap.len());
        while let Some(e) = self.heap.pop() {
            out.push(e.item);
        }
        self.queued_bytes = 0;
        out
    }

    /// Frames waiting to be sent.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether no frame waits.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Bytes handed out by [`SendQueue::pop`] and not yet [`SendQueue::delivered`].
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Bytes of the frames waiting to be sent.
    pub fn queued_bytes(&self) -> u64 {
        self.queued_bytes
    }

    /// The window, bytes.
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Changes the window (at least 1) for the frames popped from now on; frames in flight
    /// stay in flight.
    pub fn set_window(&mut self, window: u64) {
        self.window = window.max(1);
    }

    /// Whether the window counts whole frames: a frame may leave while the bytes in flight are
    /// below the window (`true`), or only if it fits in it in full (`false`, the default). See
    /// the [module docs](self).
    pub fn set_whole_frames(&mut self, whole: bool) {
        self.whole_frames = whole;
    }

    /// Lets `n` frames (at least 2) be in flight whatever the window, or `n` of the next
    /// frame's size (see the [module docs](self)).
    pub fn set_min_frames(&mut self, n: u64) {
        self.min_frames = n.max(2);
    }
}

#[cfg(test)]
mod tests;
