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
//! ([`crate::timeline`], `PUSHPULL_TRACE=DIR`): [`frame`] is the one site of each event for
//! both outputs, except a worker's result `arrived` ([`frame_line`]), which the timeline has
//! as the end of the chunk's `pull` span. The text lines stay, for `bench/wire_idle.py` and the `window` lines, which
//! describe the sender rather than a frame.

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

/// Records one event of frame `h` (see the [module docs](self)); `peer` names the other end.
/// The same call feeds the timeline's `frame` tracks ([`crate::timeline`]) when that is on.
pub fn frame(event: &str, h: &FrameHeader, peer: &str) {
    if crate::timeline::traced(h.round) {
        frame_span(event, h, peer);
    }
    frame_line(event, h, peer);
}

/// [`frame`]'s line of the text trace only, for an event the timeline already has in another
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

/// The timeline's side of [`frame`]: a span per frame sent, from `queued` to `acked`, with
/// `written` as an instant; `arrived` as an instant on the receiver's own track.
fn frame_span(event: &str, h: &FrameHeader, peer: &str) {
    use crate::timeline::{self, Args, Ph, FRAME};
    let ts = timeline::now();
    let kind = match h.kind {
        FrameKind::Push => "push",
        FrameKind::Result => "result",
        FrameKind::Abort => "abort",
        FrameKind::Hello => "hello",
        FrameKind::StateGet => "state get",
        FrameKind::StatePut => "state put",
        FrameKind::State => "state",
    };
    let side = u64::from(event == "arrived");
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
    let args = || Args {
        key: Some(h.key),
        round: Some(h.round),
        rank: Some(h.rank),
        bytes: Some(h.payload_len),
        peer: Some(peer),
        ..Args::default()
    };
    match event {
        "queued" => timeline::record(Ph::Begin, ts, FRAME, kind, id, Some(args())),
        "acked" => timeline::record(Ph::End, ts, FRAME, kind, id, None),
        "written" => timeline::record(Ph::Instant, ts, FRAME, "written", id, None),
        _ => {
            let name: timeline::Label = match (h.kind, event) {
                (FrameKind::Push, "arrived") => "push arrived".into(),
                (FrameKind::Result, "arrived") => "result arrived".into(),
                _ => format!("{kind} {event}").into(),
            };
            timeline::record(Ph::Instant, ts, FRAME, name, id, Some(args()))
        }
    }
}
