//! An optional per-frame timeline, for finding where a round's time goes on the wire.
//!
//! When the environment variable `PUSHPULL_FRAME_TRACE` names a folder, every process writes
//! `<folder>/<pid>.trace`, one line per event of a data frame:
//!
//! ```text
//! <µs since the Unix epoch> <node> <event> <kind> <key> <round> <rank> <bytes> <peer>
//! ```
//!
//! Events: `queued` (handed to the node's `FrameSender`), `written` (handed to quinn in
//! full), `acked` (the peer acknowledged all of it) on the sending side; `arrived` (read to
//! the end of its stream) on the receiving side. The sender also writes a `window` line
//! whenever it recomputes its window while it has frames in flight ([`window`]):
//!
//! ```text
//! <µs> <node> window <window> <rate B/s> <in flight> <queued> <peer>:<srtt µs>/<min rtt µs>/<cwnd> ...
//! ```
//! Timestamps come from one clock, so the
//! files of all the processes of one machine (e.g. `pushpull bench net`'s namespaces) merge
//! into one timeline. Unset (the default), each call is one relaxed load.
//!
//! The frame events are also the `frame` tracks of the Chrome-trace timeline
//! ([`crate::timeline`], `PUSHPULL_TRACE=DIR`): each event has one site for both outputs. A
//! frame sent is [`frame_queued`], [`frame_written`] and [`frame_acked`], whose
//! [`FrameTimes`] its sender keeps, so the timeline records it once, at the end, as one span
//! with `written` inside (three records of a frame, each looking its peer up, were two thirds of
//! the timeline's cost: BENCHMARKS.md at 60710fe, "Within each job"); a frame received is
//! [`frame_arrived`], except a worker's result ([`frame_line`]), which the timeline has as the
//! end of the chunk's `pull` span. The text lines stay, for `bench/wire_idle.py` and the
//! `window` lines, which describe the sender rather than a frame.

use std::fs::File;
use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use pushpull_proto::protocol::{FrameHeader, FrameKind};

/// The environment variable naming the trace folder.
pub const ENV: &str = "PUSHPULL_FRAME_TRACE";

static FILE: OnceLock<Option<Mutex<File>>> = OnceLock::new();
static NODE: OnceLock<String> = OnceLock::new();

fn file() -> Option<&'static Mutex<File>> {
    FILE.get_or_init(|| {
        let dir = std::env::var_os(ENV)?;
        let path = std::path::Path::new(&dir).join(format!("{}.trace", std::process::id()));
        File::create(path).ok().map(Mutex::new)
    })
    .as_ref()
}

/// Whether tracing is on.
pub fn enabled() -> bool {
    file().is_some()
}

/// Names this process in its trace lines (e.g. `server0`, `worker3`); the first call wins.
pub fn set_node(name: impl Into<String>) {
    if enabled() {
        let _ = NODE.set(name.into());
    }
}

fn write_line(line: &str) {
    let Some(f) = file() else {
        return;
    };
    let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
    let _ = f.write_all(line.as_bytes());
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// Records the sender's window (see the [module docs](self)): `paths` is one
/// `peer:srtt/min_rtt/cwnd` entry per connection.
pub fn window(window: u64, rate: Option<f64>, in_flight: u64, queued: u64, paths: &str) {
    if !enabled() {
        return;
    }
    let node = NODE.get().map(String::as_str).unwrap_or("-");
    let rate = rate.map_or(0, |r| r as u64);
    write_line(&format!(
        "{} {node} window {window} {rate} {in_flight} {queued} {paths}\n",
        now_us()
    ));
}

/// Records a frame's `arrived` (read to the end of its stream; see the [module docs](self));
/// `peer` names the other end. The same call feeds the timeline's `frame` tracks
/// ([`crate::timeline`]) when that is on, as an instant.
pub fn frame_arrived(h: &FrameHeader, peer: &str) {
    if crate::timeline::traced(h.round) {
        use crate::timeline::{self, Ph, FRAME};
        let name: timeline::Label = match h.kind {
            FrameKind::Push => "push arrived".into(),
            FrameKind::Result => "result arrived".into(),
            kind => format!("{} arrived", kind_name(kind)).into(),
        };
        let (id, args) = frame_track(1, h, peer);
        timeline::record(Ph::Instant, timeline::now(), FRAME, name, id, Some(args));
    }
    frame_line("arrived", h, peer);
}

/// A frame event's line of the text trace only, for an event the timeline already has in another
/// form (a worker's result `arrived` is the end of its chunk's `pull` span).
pub fn frame_line(event: &str, h: &FrameHeader, peer: &str) {
    if !enabled() {
        return;
    }
    let us = now_us();
    let node = NODE.get().map(String::as_str).unwrap_or("-");
    let peer: String = peer.split_whitespace().take(2).collect::<Vec<_>>().join("");
    let line = format!(
        "{us} {node} {event} {:?} {:#x} {} {} {} {peer}\n",
        h.kind, h.key, h.round, h.rank, h.payload_len
    );
    write_line(&line);
}

/// A frame's times on the timeline while its sender holds it, from [`frame_queued`] to
/// [`frame_acked`] ([`crate::timeline::now`]'s clock; all 0 when its round is not traced).
#[derive(Debug, Clone, Copy, Default)]
pub struct FrameTimes {
    queued: u64,
    written: u64,
}

/// A frame was handed to the node's `FrameSender`: its `queued` line, and its times.
pub fn frame_queued(h: &FrameHeader, peer: &str) -> FrameTimes {
    frame_line("queued", h, peer);
    let traced = crate::timeline::traced(h.round);
    FrameTimes {
        queued: if traced { crate::timeline::now() } else { 0 },
        written: 0,
    }
}

/// The frame was handed to quinn in full: its `written` line, and the time kept.
pub fn frame_written(times: &mut FrameTimes, h: &FrameHeader, peer: &str) {
    frame_line("written", h, peer);
    if times.queued != 0 {
        times.written = crate::timeline::now();
    }
}

/// The peer acknowledged all of the frame (or stopped its stream, or the connection is gone):
/// its `acked` line, and, when its round is traced, its one span on the timeline, from queued
/// to now, with `written` inside.
pub fn frame_acked(times: FrameTimes, h: &FrameHeader, peer: &str) {
    frame_line("acked", h, peer);
    if times.queued != 0 {
        let (id, args) = frame_track(0, h, peer);
        let at = (times.queued, times.written, crate::timeline::now());
        crate::timeline::frame_span(at, kind_name(h.kind), id, args);
    }
}

/// A frame kind's name on the timeline.
fn kind_name(kind: FrameKind) -> &'static str {
    match kind {
        FrameKind::Push => "push",
        FrameKind::Result => "result",
        FrameKind::Abort => "abort",
        FrameKind::Hello => "hello",
        FrameKind::StateGet => "state get",
        FrameKind::StatePut => "state put",
        FrameKind::State => "state",
    }
}

/// The timeline id and args of frame `h` on one side (`side`: 0 sent, 1 received).
fn frame_track(side: u64, h: &FrameHeader, peer: &str) -> (u64, crate::timeline::Args) {
    use crate::timeline::{self, Args};
    let peer = timeline::Name::new(peer);
    let id = timeline::id(&[
        0xf4a3e,
        side,
        h.kind as u64,
        h.key,
        h.round,
        u64::from(h.rank),
        peer.number(),
    ]);
    let args = Args {
        key: Some(h.key),
        round: Some(h.round),
        rank: Some(h.rank),
        bytes: Some(h.payload_len),
        peer: Some(peer),
        ..Args::default()
    };
    (id, args)
}
