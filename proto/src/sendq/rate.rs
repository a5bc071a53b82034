//! [`DeliveryRate`]: how fast a node's frames are delivered while it has some in flight, and
//! the send window that follows from it ([`DeliveryRate::window`]).
//!
//! The window of a [`super::SendQueue`] decides how much of a node's round leaves the priority
//! order: everything inside it drains through quinn at the pace of each connection. Twice the
//! congestion windows is too much on a link with a deep queue (a tc tbf, a switch buffer):
//! loss-based congestion control fills that queue before it backs off, so the congestion
//! windows grow to hold it, and half a round leaves in arbitrary order at its start
//! (BENCHMARKS.md at 60710fe, "Per-frame timelines"). The window is sized instead by what the
//! node's frames are ([`Flow`]):
//!
//! * **A source** (a worker's pushes) keeps what the bare path holds, its rate times twice the
//!   path's minimum round trip, plus a fixed [`SOURCE_QUEUE`] bytes (at most [`SOURCE_DELAY`]
//!   of its rate, for slow links; at least [`SOURCE_FAST_QUEUE`] of it, for fast paths, see
//!   below): the bytes it may keep queued at its bottleneck, as Vegas and FAST TCP do. Sources
//!   that share a link (every worker pushing into one server) then hold equal windows and get
//!   equal shares of it, whatever their history: in a FIFO queue a sender's share is its share
//!   of the bytes queued. A window proportional to the sender's own measured rate has no such
//!   pull: every split is a fixed point, and the windowed maximum holds a lucky sample (one
//!   taken while the other sender was idle, or inflated by acknowledgements that arrived in a
//!   burst; such samples read up to 1.8× the link rate in a traced run) long enough to lock it
//!   in. Workers that finish their pushes seconds apart leave the server's link for results
//!   idle while the slower one catches up (BENCHMARKS.md at 60710fe, "Equal windows for
//!   sources": 2 × 1 at 100 Mbit/s went from 1.08–1.32× the wire floor to 1.03–1.04×). Nor
//!   does a source's window follow its own queue: its round trip never enters it beyond the
//!   path's minimum.
//!
//!   Sources that push through one link together (the workers of one host: a local group's
//!   members, `cluster.local_size`, or flat workers the scheduler saw at one IP address,
//!   `ClusterMap::workers_on_host`) split that queue: each keeps [`SOURCE_QUEUE`] divided by
//!   their number ([`Flow::Source`]'s `sharers`), so a host of four queues what a host of one
//!   does. Four full queues overflowed `bench net`'s tbf queue (756 kB at 100 Mbit/s): 100–390
//!   packets dropped on each host a run, each halving a congestion window, and rounds of
//!   1.09–1.18× the wire floor (five runs of six over 1.15×) against 1.08–1.11× with the queue
//!   split; flat, four workers a host, 1.53× against 1.04× (BENCHMARKS.md at 60710fe, "A
//!   host's members split one queue").
//!
//!   On a fast path (loopback, a data centre) a fixed 256 KiB is a fraction of a millisecond
//!   and smaller than one frame of a large partition, while a frame's bytes stay in flight
//!   until its last one is acknowledged, which takes its own transmission plus the receiving
//!   process's delay (0.3–2.5 ms per frame on an H100 machine's loopback, with the training
//!   job sharing its cores). The window then held two frames for all the node's connections,
//!   each connection idled while the other sent, and its rate stayed where two frames at a
//!   time put it (a fixed point: the window followed the rate it allowed). So the queue is
//!   also at least [`SOURCE_FAST_QUEUE`] of the rate: longer than a frame's acknowledgement
//!   there, so the window has margin and the estimate climbs to what the path carries. Below
//!   ~420 Mbit/s per node the fixed bytes are more and nothing changes; above, sources hold
//!   queues in proportion to their rates, not equal ones.
//! * **A reply** (a server's results, sent as the pushes they answer arrive) spans the round
//!   trip its frames see: the measured rate times the shortest smoothed RTT of the node's
//!   connections ([`RoundTrip::shared`]), kept between [`REPLY_SPAN`]'s bounds, or twice the
//!   path's minimum RTT where that is longer (a long path), counting whole frames. Its frames
//!   are acknowledged through the queue of the pushes it receives, which it does not fill: a
//!   window of `rate × delay` carries only `delay / RTT` of the rate whenever the round trip
//!   is longer than the delay, measures that smaller rate, shrinks with it, and spirals down
//!   to its floor (the 2 × 1 cluster's server sent its results at half the link that way,
//!   BENCHMARKS.md at 60710fe, "The window spans the round trip"). With no margin over the
//!   round trip, the window must count whole frames (`SendQueue::set_whole_frames`), or it
//!   shrinks to the next whole frame at every measurement. The shortest RTT of the node's
//!   connections is a queue that every one of them waits in, as a server's own downlink full
//!   of pushes is, not one peer's; and since a reply only sends what its sources' pushes made
//!   ready, following its own queue cannot run away from them.
//!
//! The rate is measured, not configured. A *busy period* starts when a frame is sent with none
//! in flight and ends when none is left; it is cut into samples of at least
//! [`SAMPLE_PERIOD`], each `bytes delivered / time`, and the rate is the largest sample of the
//! last [`MEMORY`] (a windowed maximum, as BBR keeps its bottleneck bandwidth). Time with
//! nothing in flight never counts, so a round's pauses don't lower it. A sample
//! under-estimates what the path carried while the window limited the sender, and a window
//! with margin over the round trip lets the sender go faster than the estimate, so the
//! estimate climbs to the link's rate within a few samples.
//!
//! No clock here: the shell passes the time in.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The shortest span of a rate sample.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(50);

/// How long a rate sample is remembered.
pub const MEMORY: Duration = Duration::from_secs(2);

/// The bytes a [`Flow::Source`] keeps queued at its bottleneck, over what the bare path holds:
/// two frames of the default 128 KiB chunk, 21 ms of a 100 Mbit/s link. At most
/// [`SOURCE_DELAY`] of the node's own rate.
pub const SOURCE_QUEUE: u64 = 256 << 10;

/// The shortest a [`Flow::Source`]'s queue may last at the node's own rate (see the
/// [module docs](self)): longer than a large frame takes to be acknowledged on a fast path,
/// so the window there is not a fixed point at two frames. At rates under
/// `SOURCE_QUEUE / SOURCE_FAST_QUEUE` (52 MB/s, ~420 Mbit/s) [`SOURCE_QUEUE`] is the larger.
pub const SOURCE_FAST_QUEUE: Duration = Duration::from_millis(5);

/// The longest a [`Flow::Source`]'s queue may last at the node's own rate: on a slow link a
/// fixed [`SOURCE_QUEUE`] would hold a round's last pushes, and the results behind them, for
/// long (at 10 Mbit/s, 210 ms of a 1 s compressed round).
pub const SOURCE_DELAY: Duration = Duration::from_millis(50);

/// The least and the most a [`Flow::Reply`]'s window spans (see the [module docs](self)). A
/// round trip of more than 100 ms is a queue no window should follow further.
pub const REPLY_SPAN: (Duration, Duration) =
    (Duration::from_millis(25), Duration::from_millis(100));

/// What a node's frames are, which decides how its window is sized. See the [module
/// docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Frames the node starts (a worker's pushes): the bare path's bytes plus its queue
    /// ([`source_queue`]). `sharers`: the sources (this one included, at least 1) that push
    /// through the same link and split [`SOURCE_QUEUE`] between them (the workers of one
    /// host).
    Source {
        /// Sources sharing the node's link, this one included.
        sharers: u32,
    },
    /// Frames that answer its peers' (a server's results): the rate times the round trip.
    Reply,
}

impl Flow {
    /// A source alone on its link.
    pub const SOURCE: Flow = Flow::Source { sharers: 1 };

    /// Frames the window always has room for, whatever its size
    /// (`SendQueue::set_min_frames`): two for a source, so the next frame goes out while the
    /// last is acknowledged; [`REPLY_FRAMES`] for a reply.
    pub fn min_frames(self) -> u64 {
        match self {
            Flow::Source { .. } => 2,
            Flow::Reply => REPLY_FRAMES,
        }
    }
}

/// Frames a [`Flow::Reply`] always has room for. A reply's frames are acknowledged through the
/// queue of the pushes its node receives, which may hold more than one frame's time of its own
/// link (at 10 Mbit/s a 128 KiB frame is 105 ms; `bench net`'s tbf queue holds 155 ms): with
/// two frames in flight the link then idles until the first one's acknowledgement arrives,
/// with four it does not (`rate/tests.rs`; BENCHMARKS.md at 60710fe, "A ceiling on the
/// congestion window").
pub const REPLY_FRAMES: u64 = 4;

/// A send window: its bytes, and whether it counts whole frames (`SendQueue::set_whole_frames`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Bytes in flight the window allows.
    pub bytes: u64,
    /// Whether a frame may leave while the bytes in flight are below `bytes`, rather than only
    /// if it fits in full.
    pub whole_frames: bool,
}

/// What a node's connections say of the round trip, for [`DeliveryRate::window`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundTrip {
    /// The longest of the connections' minimum round trips: the path's, with empty queues.
    pub path: Duration,
    /// The shortest of the connections' smoothed round trips: what a queue that every one of
    /// them waits in adds to the path.
    pub shared: Duration,
}

impl RoundTrip {
    /// How long a [`Flow::Reply`]'s window lasts at the measured rate: [`RoundTrip::shared`]
    /// kept within [`REPLY_SPAN`], or twice [`RoundTrip::path`] if that is longer.
    pub fn reply_span(&self) -> Duration {
        self.shared
            .clamp(REPLY_SPAN.0, REPLY_SPAN.1)
            .max(self.path.saturating_mul(2))
    }
}

/// The bytes a [`Flow::Source`] delivering `rate` bytes per second, one of `sharers` sources
/// on its link, keeps queued at its bottleneck: its share of [`SOURCE_QUEUE`], at least
/// [`SOURCE_FAST_QUEUE`] of the rate and at most [`SOURCE_DELAY`] of it (see the
/// [module docs](self)).
pub fn source_queue(rate: f64, sharers: u32) -> u64 {
    let fast = (rate * SOURCE_FAST_QUEUE.as_secs_f64()) as u64;
    (SOURCE_QUEUE / u64::from(sharers.max(1)))
        .max(fast)
        .min((rate * SOURCE_DELAY.as_secs_f64()) as u64)
}

/// Measures a node's delivery rate over its busy periods. See the [module docs](self).
#[derive(Debug, Default)]
pub struct DeliveryRate {
    /// The start of the current sample, while frames are in flight.
    since: Option<Instant>,
    /// Bytes delivered since `since`.
    bytes: u64,
    /// Whether `since` is the start of a busy period (every byte delivered since was sent
    /// since), not the end of the previous sample (bytes sent before it may arrive just after).
    fresh: bool,
    /// `(when, bytes per second)`, oldest first, each larger than every later one (so the
    /// front is the windowed maximum).
    samples: VecDeque<(Instant, f64)>,
}

impl DeliveryRate {
    /// Nothing measured yet.
    pub fn new() -> DeliveryRate {
        DeliveryRate::default()
    }

    /// A frame was handed to the transport at `now`, with `in_flight_before` bytes in flight
    /// before it.
    pub fn sent(&mut self, now: Instant, in_flight_before: u64) {
        if in_flight_before == 0 || self.since.is_none() {
            self.since = Some(now);
            self.bytes = 0;
            self.fresh = true;
        }
    }

    /// `bytes` were delivered at `now`, leaving `in_flight_after` bytes in flight.
    pub fn delivered(&mut self, now: Instant, bytes: u64, in_flight_after: u64) {
        let Some(since) = self.since else {
            return;
        };
        self.bytes = self.bytes.saturating_add(bytes);
        let span = now.saturating_duration_since(since);
        if span >= SAMPLE_PERIOD {
            self.record(now, self.bytes as f64 / span.as_secs_f64());
            self.since = Some(now);
            self.bytes = 0;
            self.fresh = false;
        }
        if in_flight_after == 0 {
            // The busy period ends. A short one is a sample too: all its bytes were sent within
            // it, so it can only under-estimate. A short tail after a sample is not: bytes sent
            // before the tail began may be acknowledged just after it did.
            if self.fresh && self.bytes > 0 && !span.is_zero() {
                self.record(now, self.bytes as f64 / span.as_secs_f64());
            }
            self.since = None;
            self.bytes = 0;
        }
    }

    fn record(&mut self, now: Instant, rate: f64) {
        while self.samples.back().is_some_and(|&(_, r)| r <= rate) {
            self.samples.pop_back();
        }
        self.samples.push_back((now, rate));
    }

    /// The largest rate sampled in the last [`MEMORY`] before `now`, bytes per second.
    pub fn rate(&mut self, now: Instant) -> Option<f64> {
        while self
            .samples
            .front()
            .is_some_and(|&(t, _)| now.saturating_duration_since(t) > MEMORY)
        {
            self.samples.pop_front();
        }
        self.samples.front().map(|&(_, r)| r)
    }

    /// The window for `flow` at `now` (see the [module docs](self)): a source's always, a
    /// reply's from the first sample on (`None` before it).
    pub fn window(&mut self, now: Instant, flow: Flow, rtt: RoundTrip) -> Option<Window> {
        let rate = self.rate(now);
        match flow {
            Flow::Source { sharers } => {
                let (path, queue) = match rate {
                    Some(r) => (
                        r * rtt.path.saturating_mul(2).as_secs_f64(),
                        source_queue(r, sharers),
                    ),
                    None => (0.0, SOURCE_QUEUE / u64::from(sharers.max(1))),
                };
                Some(Window {
                    bytes: queue.saturating_add(path as u64),
                    whole_frames: false,
                })
            }
            Flow::Reply => rate.map(|r| Window {
                bytes: (r * rtt.reply_span().as_secs_f64()) as u64,
                whole_frames: true,
            }),
        }
    }
}

#[cfg(test)]
mod tests;
