//! [`FrameSender`]: the async shell around [`pushpull_proto::sendq::SendQueue`] for one node.
//!
//! A node has one sender for all its data connections (a worker's to every server, a server's
//! to every worker): callers [`send`](FrameSender::send) a frame to a [`Peer`] with a priority
//! and return at once; the driver future ([`FrameSender::new`] returns it, the owner spawns it)
//! pops frames in the queue's order, one order for the whole node, while the node's byte
//! window has room, writes each on a new unidirectional stream of its peer's connection with
//! the same QUIC priority, finishes the stream, and frees the frame's bytes when the peer has
//! acknowledged all of it (`SendStream::stopped`). Payload `Bytes` go to quinn without a copy.
//!
//! A caller about to queue several tensors at once can [`hold`](FrameSender::hold) each
//! tensor's priority until that tensor's frames are queued ([`SendHold`]): frames of lower
//! priority wait, so the tensors leave in priority order whatever order they were encoded in
//! (the worker's group calls do this).
//!
//! One window for every connection of the node keeps all of a node's connections at the same
//! place in the agreed order: every worker pushes the same few chunks at a time, so each
//! server receives a chunk from every worker at about the same moment and can send its result
//! at once, instead of holding chunks that only some workers pushed.
//!
//! The window follows the network ([`pushpull_proto::sendq::rate`] has the rule and why): a
//! source's (a worker's pushes) is what the bare path holds at the node's delivery rate plus a
//! fixed number of bytes queued ([`SOURCE_QUEUE`](pushpull_proto::sendq::rate::SOURCE_QUEUE)),
//! so workers sharing a link share it equally (the workers of one host, which push through
//! its one link, split those bytes: `Flow::Source`'s `sharers`; on a fast
//! path, at least 5 ms of the rate:
//! [`source_queue`](pushpull_proto::sendq::rate::source_queue)); a reply's (a server's results) is the delivery
//! rate times the round trip its frames see (the shortest smoothed RTT of its connections,
//! 25–100 ms), counting whole frames. Either is at most [`WINDOW_CWNDS`] times the sum of the
//! congestion windows (quinn sends no more than those anyway) and `cluster.send_window_bytes`,
//! at least [`MIN_WINDOW`], and it always has room for a few frames ([`Flow::min_frames`]: two
//! for a source, four for a reply). Before a reply's first rate sample it is the
//! congestion-window bound alone. A window much larger than what the link needs would only
//! queue frames inside quinn and in the network's buffers, where each connection drains at its
//! own pace and the workers drift apart in the order (on a link with a deep queue, loss-based
//! congestion windows grow to fill it); one much smaller would leave the link idle.
//!
//! The floor of frames is per node, not per connection: with two per connection, a node with
//! four connections let eight frames of the next one's size out, so a window set below that
//! (`cluster.send_window_bytes`) did not bound large frames at all (BENCHMARKS.md at 60710fe,
//! "Per-frame timelines": 64 KiB window at 10 Mbit/s, onebit 1.33× → 1.20× the floor). Where
//! the floor lets more bytes out than a source's window (128 KiB frames on a slow link), the
//! window still bounds what is on the wire: a source sets it as the ceiling of its connections'
//! congestion windows ([`WindowCap`]), so quinn holds the rest. A reply sets no ceiling: its
//! frames are acknowledged through its peers' pushes, and a ceiling at its window left a
//! server's results waiting (BENCHMARKS.md at 60710fe, "A ceiling on the congestion window").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Notify;

use crate::cap::WindowCap;
use crate::transport::TransportError;
use pushpull_proto::protocol::{FrameHeader, FRAME_HEADER_LEN};
use pushpull_proto::sendq::{DeliveryRate, Flow, RoundTrip, SendQueue};

/// A connection frames can be sent on, and its name in errors.
#[derive(Clone, Debug)]
pub struct Peer {
    /// The connection.
    pub conn: quinn::Connection,
    /// E.g. `server 1 (10.0.0.3:9100)`.
    pub name: Arc<str>,
}

struct Frame {
    to: Peer,
    header: FrameHeader,
    payload: Bytes,
    /// Its times for the timeline (`crate::trace::frame_queued`).
    times: crate::trace::FrameTimes,
}

/// The window is at most this many times the sum of the connections' congestion windows.
pub const WINDOW_CWNDS: u64 = 2;

/// The smallest window (bytes), whatever the congestion windows say.
pub const MIN_WINDOW: u64 = 64 << 10;

/// How often the congestion windows are read.
const WINDOW_REFRESH: Duration = Duration::from_millis(5);

struct State {
    queue: SendQueue<Frame>,
    /// Popped and still being written to quinn.
    writing: usize,
    /// Every connection frames were queued for, by `stable_id`.
    conns: HashMap<usize, quinn::Connection>,
    /// The node's delivery rate while frames are in flight.
    rate: DeliveryRate,
    /// What the node's frames are, for the window's size.
    flow: Flow,
    /// The ceiling on the connections' congestion windows, set to the window (sources).
    cap: Option<WindowCap>,
}

struct Shared {
    state: Mutex<State>,
    notify: Notify,
    /// Woken whenever the queue and the writes run dry.
    idle: Notify,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the driver calls when writing to a peer fails (the frame is dropped).
pub type OnError = Box<dyn Fn(&Peer, TransportError) + Send + Sync>;

/// Sends a node's data frames in priority order within one byte window (see the [module
/// docs](self) and [`pushpull_proto::sendq`]). Cheap to clone; every clone feeds the same queue.
#[derive(Clone)]
pub struct FrameSender {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FrameSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.shared.lock();
        f.debug_struct("FrameSender")
            .field("queued", &s.queue.len())
            .field("in_flight", &s.queue.in_flight())
            .field("window", &s.queue.window())
            .finish()
    }
}

impl FrameSender {
    /// A sender of `flow` frames (a worker's pushes are [`Flow::Source`], a server's results
    /// [`Flow::Reply`]) keeping at most `max_window` bytes in flight over all peers, and the
    /// driver future that does the sending: spawn it (it runs until aborted). When writing to a
    /// peer fails, `on_error` is called with the peer and the error, and that frame is dropped.
    /// `cap`, the ceiling of the endpoint's connections
    /// ([`crate::transport::Endpoint::window_cap`]), is kept at the window: a source's, not a
    /// reply's (`None`; see the [module docs](self)).
    pub fn new(
        max_window: u64,
        flow: Flow,
        cap: Option<WindowCap>,
        on_error: OnError,
    ) -> (
        FrameSender,
        impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let mut queue = SendQueue::new(MIN_WINDOW.min(max_window));
        queue.set_min_frames(flow.min_frames());
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue,
                writing: 0,
                conns: HashMap::new(),
                rate: DeliveryRate::new(),
                flow,
                cap,
            }),
            notify: Notify::new(),
            idle: Notify::new(),
        });
        let driver = drive(shared.clone(), max_window, on_error);
        (FrameSender { shared }, driver)
    }

    /// Queues one frame for `to` (its header's `payload_len` must be `payload.len()`) at
    /// `priority` (higher first).
    pub fn send(&self, to: &Peer, header: FrameHeader, payload: Bytes, priority: i32) {
        debug_assert_eq!(header.payload_len, payload.len() as u64);
        let bytes = (FRAME_HEADER_LEN + payload.len()) as u64;
        let times = crate::trace::frame_queued(&header, &to.name);
        let frame = Frame {
            to: to.clone(),
            header,
            payload,
            times,
        };
        {
            let mut s = self.shared.lock();
            s.conns
                .entry(to.conn.stable_id())
                .or_insert_with(|| to.conn.clone());
            s.queue.push(frame, priority, bytes);
        }
        self.shared.notify.notify_one();
    }

    /// Holds back this node's frames of lower priority than `priority` until the returned
    /// guard is dropped ([`SendQueue::hold`]): take one per tensor before encoding several at
    /// once, and drop it once that tensor's frames are queued. Never keep one across a wait for
    /// a peer (see [`pushpull_proto::sendq`]).
    pub fn hold(&self, priority: i32) -> SendHold {
        self.shared.lock().queue.hold(priority);
        SendHold {
            shared: self.shared.clone(),
            priority,
        }
    }

    /// Frames queued or being written (not yet handed to quinn in full).
    pub fn unsent(&self) -> usize {
        let s = self.shared.lock();
        s.queue.len() + s.writing
    }

    /// Waits until every queued frame was handed to quinn.
    pub async fn flushed(&self) {
        loop {
            let idle = self.shared.idle.notified();
            if self.unsent() == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// A hold on a [`FrameSender`]'s lower-priority frames ([`FrameSender::hold`]); dropping it
/// releases them.
pub struct SendHold {
    shared: Arc<Shared>,
    priority: i32,
}

impl std::fmt::Debug for SendHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendHold")
            .field("priority", &self.priority)
            .finish()
    }
}

impl Drop for SendHold {
    fn drop(&mut self) {
        self.shared.lock().queue.release(self.priority);
        self.shared.notify.notify_one();
    }
}

impl State {
    /// The window for `now` (see the [module docs](self)); forgets closed connections.
    fn window(&mut self, now: Instant, max_window: u64) -> u64 {
        self.conns.retain(|_, c| c.close_reason().is_none());
        let (mut cwnds, mut path, mut shared) = (0u64, Duration::ZERO, None::<Duration>);
        for c in self.conns.values() {
            let p = c.stats().path;
            cwnds = cwnds.saturating_add(p.cwnd);
            path = path.max(p.min_rtt);
            shared = Some(shared.map_or(p.rtt, |s| s.min(p.rtt)));
        }
        let rtt = RoundTrip {
            path,
            shared: shared.unwrap_or_default(),
        };
        let mut window = cwnds.saturating_mul(WINDOW_CWNDS);
        if let Some(w) = self.rate.window(now, self.flow, rtt) {
            window = window.min(w.bytes);
            self.queue.set_whole_frames(w.whole_frames);
        }
        let window = window.clamp(MIN_WINDOW.min(max_window), max_window);
        if let Some(cap) = &self.cap {
            // The congestion windows read above are under the last ceiling, so the bound of
            // WINDOW_CWNDS times them lets the window at most double per refresh.
            cap.set(window);
        }
        if crate::trace::enabled() && self.queue.in_flight() > 0 {
            self.trace_window(now, window);
        }
        window
    }

    /// A `window` line of the frame trace ([`crate::trace::window`]).
    fn trace_window(&mut self, now: Instant, window: u64) {
        let paths: Vec<String> = self
            .conns
            .values()
            .map(|c| {
                let p = c.stats().path;
                format!(
                    "{}:{}/{}/{}",
                    c.remote_address(),
                    p.rtt.as_micros(),
                    p.min_rtt.as_micros(),
                    p.cwnd
                )
            })
            .collect();
        let rate = self.rate.rate(now);
        let (in_flight, queued) = (self.queue.in_flight(), self.queue.queued_bytes());
        crate::trace::window(window, rate, in_flight, queued, &paths.join(" "));
    }

    /// Pops the next frame the window lets out.
    fn pop(&mut self, now: Instant) -> Option<(Frame, i32, u64)> {
        let in_flight = self.queue.in_flight();
        let next = self.queue.pop()?;
        self.rate.sent(now, in_flight);
        self.writing += 1;
        Some(next)
    }

    /// `bytes` of the window are free again; `delivered` if the peer has them.
    fn delivered(&mut self, now: Instant, bytes: u64, delivered: bool) {
        self.queue.delivered(bytes);
        let left = self.queue.in_flight();
        self.rate
            .delivered(now, if delivered { bytes } else { 0 }, left);
    }
}

async fn drive(shared: Arc<Shared>, max_window: u64, on_error: OnError) {
    let mut delivering = FuturesUnordered::new();
    let mut refreshed = Instant::now();
    loop {
        if refreshed.elapsed() >= WINDOW_REFRESH {
            refreshed = Instant::now();
            let mut s = shared.lock();
            let window = s.window(refreshed, max_window);
            s.queue.set_window(window);
        }
        loop {
            let next = {
                let mut s = shared.lock();
                let next = s.pop(Instant::now());
                if next.is_none() && s.writing == 0 && s.queue.is_empty() {
                    shared.idle.notify_waiters();
                }
                next
            };
            let Some((frame, priority, bytes)) = next else {
                break;
            };
            let to = frame.to.clone();
            let (header, mut times) = (frame.header, frame.times);
            let written = write(frame, priority).await;
            shared.lock().writing -= 1;
            match written {
                Ok(stopped) => {
                    crate::trace::frame_written(&mut times, &header, &to.name);
                    let name = to.name.clone();
                    delivering.push(async move {
                        // Acknowledged in full, stopped by the peer, or the connection is gone:
                        // either way the bytes no longer occupy the window; for the rate they
                        // count as delivered unless the connection is gone.
                        let acked = stopped.await.is_ok();
                        crate::trace::frame_acked(times, &header, &name);
                        (bytes, acked)
                    })
                }
                Err(e) => {
                    shared.lock().delivered(Instant::now(), bytes, false);
                    on_error(&to, e);
                }
            }
        }
        tokio::select! {
            _ = shared.notify.notified() => {}
            Some((bytes, acked)) = delivering.next() => {
                shared.lock().delivered(Instant::now(), bytes, acked);
            }
        }
    }
}

/// Writes one frame on a new stream and finishes it; returns the future of its delivery.
async fn write(
    frame: Frame,
    priority: i32,
) -> Result<
    impl std::future::Future<Output = Result<Option<quinn::VarInt>, quinn::StoppedError>>,
    TransportError,
> {
    let stream = crate::transport::write_frame(
        &frame.to.conn,
        &frame.header,
        frame.payload,
        &frame.to.name,
        Some(priority),
    )
    .await?;
    Ok(stream.stopped())
}
