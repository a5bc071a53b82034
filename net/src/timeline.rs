//! The timeline: one Chrome trace file per process (issue 34), for seeing where a round's time
//! goes, tensor by tensor and chunk by chunk.
//!
//! Turned on by `[trace] dir` in the cluster file or `PUSHPULL_TRACE=DIR` (which wins), every
//! node that [`start`]s records spans into memory and writes, when it ends normally (a worker's
//! `finish`, a server's or scheduler's shutdown; [`write`]), `DIR/<node>-<pid>.json`: the Trace
//! Event format that chrome://tracing and ui.perfetto.dev load, `{"traceEvents": [...]}`. The
//! nodes of one process (the in-process clusters of the tests) share one file, named after the
//! first; each write rewrites the whole file, so it is valid JSON after every node's end.
//!
//! Spans are async events (`"ph": "b"` / `"e"`, matched by `cat`, `id` and `name`) because a
//! tensor's chunks are pipelined and their phases overlap. Times (`ts`) are microseconds since
//! the Unix epoch, read from one monotonic clock anchored to the system clock once per process
//! (like [`crate::trace`]'s lines), so the files of the processes of one host merge. Tracks:
//!
//! | `cat` | where | spans (`name`) |
//! |---|---|---|
//! | `round` | worker | one per push_pull/broadcast call of a tensor: the tensor's name |
//! | `chunk` | worker | per chunk and round, in order: `compress`, `wait` (queued to the result handed over), inside it `pull` (the result frame's stream accepted to read), `decompress` |
//! | `key` | server | per key and round: `receive` (the first push of the round to the last), `sum` (one per decompress/add, per host), `encode` |
//! | `frame` | all | one per data frame sent: its kind (`push`, `result`, ...) from queued to acknowledged by the peer, with `written` (handed to QUIC in full) as an instant; `arrived` instants on the receiving side |
//!
//! Args name the tensor, chunk, key, round, rank (worker) or server, bytes and peer.
//!
//! **One mechanism with the frame trace.** [`crate::trace`] (`PUSHPULL_FRAME_TRACE`) keeps its
//! text lines, which `bench/wire_idle.py` reads together with the sender's `window` lines; its
//! frame events (queued, written, acked, arrived) are the same calls that feed the `frame`
//! tracks here, so a frame is recorded once, at one site, for both outputs.
//!
//! **The step window** (BytePS's `BYTEPS_TRACE_START_STEP` / `BYTEPS_TRACE_END_STEP`): BytePS
//! counts steps per tensor (its `step_cnt`, the number of times that tensor was synchronised)
//! and traces steps `start..=end`. Here a tensor's round `r` (from 0; the same number on its
//! keys on the servers and in its frames) is step `r + 1`, so every node decides from the round
//! number alone ([`traced`]): workers and servers record the same rounds.
//!
//! **Cost.** Off (the default), an event site is one relaxed load ([`on`]). On, an event is
//! pushed onto its thread's buffer in memory (a mutex only the thread itself and [`write`]
//! take); nothing is written until the node ends. A frame span still open when the file is
//! written (its peer's acknowledgement had not been seen) is closed at that moment with
//! `"unacknowledged": true`; no other span is closed for it.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use pushpull_proto::config::TraceConfig;

/// The environment variable naming the trace folder (it overrides `[trace] dir`).
pub const ENV: &str = "PUSHPULL_TRACE";

static ON: AtomicBool = AtomicBool::new(false);
static START_STEP: AtomicU64 = AtomicU64::new(1);
static END_STEP: AtomicU64 = AtomicU64::new(u64::MAX);
static STATE: OnceLock<State> = OnceLock::new();

/// The process's recorder: where to write, the nodes it holds, every thread's buffer.
struct State {
    dir: PathBuf,
    /// The folder exists (else the process records nothing).
    usable: bool,
    nodes: Mutex<Vec<String>>,
    buffers: Mutex<Vec<Arc<Buffer>>>,
    /// Serialises [`write`]s.
    writing: Mutex<()>,
}

/// One thread's events.
struct Buffer {
    tid: u64,
    events: Mutex<Vec<Event>>,
}

/// The phase of one event (`ph`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ph {
    /// An async span begins (`b`).
    Begin,
    /// An async span ends (`e`).
    End,
    /// An async instant (`n`).
    Instant,
}

impl Ph {
    fn letter(self) -> char {
        match self {
            Ph::Begin => 'b',
            Ph::End => 'e',
            Ph::Instant => 'n',
        }
    }
}

/// What an event says about itself (its `args`); unset fields are left out.
#[derive(Debug, Clone, Default)]
pub struct Args {
    /// The tensor's name.
    pub tensor: Option<Arc<str>>,
    /// The chunk's index in its tensor.
    pub chunk: Option<u32>,
    /// The chunk's key.
    pub key: Option<u64>,
    /// The round.
    pub round: Option<u64>,
    /// The worker's rank.
    pub rank: Option<u32>,
    /// The server's id.
    pub server: Option<u32>,
    /// The host (participant) of a server's `sum`.
    pub host: Option<u32>,
    /// Payload bytes.
    pub bytes: Option<u64>,
    /// The other end of a frame.
    pub peer: Option<Arc<str>>,
}

/// One recorded event.
#[derive(Debug, Clone)]
struct Event {
    ph: Ph,
    ts: u64,
    cat: &'static str,
    name: Cow<'static, str>,
    id: u64,
    args: Option<Box<Args>>,
}

thread_local! {
    static LOCAL: Option<Arc<Buffer>> = STATE.get().map(|s| {
        let mut buffers = s.buffers.lock().unwrap_or_else(|p| p.into_inner());
        let b = Arc::new(Buffer {
            tid: buffers.len() as u64 + 1,
            events: Mutex::new(Vec::new()),
        });
        buffers.push(b.clone());
        b
    });
}

/// Whether this process records a timeline: one relaxed load, for every event site.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Whether round `round` (from 0) of a tensor or key is recorded: the timeline is on and step
/// `round + 1` is inside the window (see the [module docs](self)).
#[inline]
pub fn traced(round: u64) -> bool {
    on() && {
        let step = round.saturating_add(1);
        step >= START_STEP.load(Ordering::Relaxed) && step <= END_STEP.load(Ordering::Relaxed)
    }
}

/// Starts recording for `node` (e.g. `worker 0`, `server 1`, `scheduler`) when `config` or
/// [`ENV`] names a folder; returns whether this process records. The first node of a process
/// decides the folder and the window; later ones add their name. A folder that cannot be made
/// is logged (naming it and where it came from) and the process records nothing.
pub fn start(config: &TraceConfig, node: &str) -> bool {
    let from_env = std::env::var_os(ENV).filter(|v| !v.is_empty());
    let (dir, origin) = match (&from_env, &config.dir) {
        (Some(d), _) => (PathBuf::from(d), ENV),
        (None, Some(d)) => (PathBuf::from(d), "trace.dir"),
        (None, None) => return on(),
    };
    let state = STATE.get_or_init(|| {
        let usable = match std::fs::create_dir_all(&dir) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(
                    "{origin} = {}: cannot make the trace folder ({e}); no timeline",
                    dir.display()
                );
                false
            }
        };
        START_STEP.store(config.start_step.max(1), Ordering::Relaxed);
        END_STEP.store(config.end_step.unwrap_or(u64::MAX), Ordering::Relaxed);
        State {
            dir,
            usable,
            nodes: Mutex::new(Vec::new()),
            buffers: Mutex::new(Vec::new()),
            writing: Mutex::new(()),
        }
    });
    // On only once the state is there: a thread's buffer is made from it at its first event.
    if state.usable {
        ON.store(true, Ordering::Relaxed);
        lock(&state.nodes).push(node.to_string());
    }
    on()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Microseconds since the Unix epoch, from a monotonic clock anchored once per process.
pub fn now() -> u64 {
    static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
    let (at, unix) = ANCHOR.get_or_init(|| {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        (Instant::now(), unix)
    });
    unix + at.elapsed().as_micros() as u64
}

/// An id for a track from a few numbers (FNV-1a, 52 bits: exact in JavaScript's numbers).
pub fn id(parts: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h & ((1 << 52) - 1)
}

/// A number for a name, to put in an [`id`].
pub fn name_hash(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Records one event at `ts` (from [`now`]). Callers check [`on`] or [`traced`] first.
pub fn record(
    ph: Ph,
    ts: u64,
    cat: &'static str,
    name: impl Into<Cow<'static, str>>,
    id: u64,
    args: Option<Args>,
) {
    let event = Event {
        ph,
        ts,
        cat,
        name: name.into(),
        id,
        args: args.map(Box::new),
    };
    // `try_with`: a span dropped while its thread is being torn down is lost, not a panic.
    let _ = LOCAL.try_with(|b| {
        if let Some(b) = b {
            lock(&b.events).push(event);
        }
    });
}

/// An open span: records its end when dropped (so a span ends on every path, errors
/// included), or at [`Span::end_at`].
pub struct Span {
    cat: &'static str,
    name: Cow<'static, str>,
    id: u64,
    open: bool,
}

impl Span {
    /// Begins a span now.
    pub fn begin(
        cat: &'static str,
        name: impl Into<Cow<'static, str>>,
        id: u64,
        args: Args,
    ) -> Span {
        Span::begin_at(now(), cat, name, id, args)
    }

    /// Begins a span at `ts`.
    pub fn begin_at(
        ts: u64,
        cat: &'static str,
        name: impl Into<Cow<'static, str>>,
        id: u64,
        args: Args,
    ) -> Span {
        let name = name.into();
        record(Ph::Begin, ts, cat, name.clone(), id, Some(args));
        Span {
            cat,
            name,
            id,
            open: true,
        }
    }

    /// Ends the span at `ts`.
    pub fn end_at(mut self, ts: u64) {
        self.finish(ts);
    }

    fn finish(&mut self, ts: u64) {
        if std::mem::take(&mut self.open) {
            let name = std::mem::take(&mut self.name);
            record(Ph::End, ts, self.cat, name, self.id, None);
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        self.finish(now());
    }
}

/// Begins a span now if `yes` (the caller's [`traced`]).
pub fn span_if(
    yes: bool,
    cat: &'static str,
    name: impl Into<Cow<'static, str>>,
    id: u64,
    args: impl FnOnce() -> Args,
) -> Option<Span> {
    yes.then(|| Span::begin(cat, name, id, args()))
}

/// Writes this process's file now (every event so far; see the [module docs](self)); nodes
/// call it when they end. Does nothing when off; a failure is logged.
pub fn write() {
    let Some(state) = STATE.get().filter(|_| on()) else {
        return;
    };
    let _writing = lock(&state.writing);
    let mut events: Vec<(u64, Event)> = Vec::new();
    for b in lock(&state.buffers).iter() {
        events.extend(lock(&b.events).iter().map(|e| (b.tid, e.clone())));
    }
    // A stable sort: a thread's own events keep their order at equal times.
    events.sort_by_key(|(_, e)| e.ts);
    let nodes = lock(&state.nodes).clone();
    let pid = std::process::id();
    let text = render(&events, &nodes, pid, now());
    let first = nodes.first().map(String::as_str).unwrap_or("node");
    let stem: String = first
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let path = state.dir.join(format!("{stem}-{pid}.json"));
    let tmp = state.dir.join(format!(".{stem}-{pid}.json.tmp"));
    let done = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path));
    match done {
        Ok(()) => tracing::info!("timeline written to {}", path.display()),
        Err(e) => tracing::warn!("writing the timeline {}: {e}", path.display()),
    }
}

/// The file's text: metadata naming the process, the events, and an end for every frame span
/// still open at `now`.
fn render(events: &[(u64, Event)], nodes: &[String], pid: u32, now: u64) -> String {
    let mut out = String::with_capacity(64 + events.len() * 160);
    out.push_str("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    let _ = write!(
        out,
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":{}}}}}",
        json_str(&nodes.join(", "))
    );
    let mut open_frames: std::collections::HashMap<(u64, &str), (u64, &Event)> =
        std::collections::HashMap::new();
    for (tid, e) in events {
        out.push_str(",\n");
        event_json(&mut out, e, pid, *tid, None);
        if e.cat == FRAME {
            match e.ph {
                Ph::Begin => {
                    open_frames.insert((e.id, &e.name), (*tid, e));
                }
                Ph::End => {
                    open_frames.remove(&(e.id, e.name.as_ref()));
                }
                Ph::Instant => {}
            }
        }
    }
    let mut left: Vec<_> = open_frames.into_values().collect();
    left.sort_by_key(|(_, e)| (e.ts, e.id));
    for (tid, e) in left {
        let end = Event {
            ph: Ph::End,
            ts: now.max(e.ts),
            cat: e.cat,
            name: e.name.clone(),
            id: e.id,
            args: None,
        };
        out.push_str(",\n");
        event_json(&mut out, &end, pid, tid, Some("\"unacknowledged\":true"));
    }
    out.push_str("\n]}\n");
    out
}

/// The `cat` of frame spans ([`crate::trace::frame`] records them).
pub const FRAME: &str = "frame";

fn event_json(out: &mut String, e: &Event, pid: u32, tid: u64, extra: Option<&str>) {
    let _ = write!(
        out,
        "{{\"ph\":\"{}\",\"cat\":\"{}\",\"name\":{},\"id\":\"{:#x}\",\"ts\":{},\"pid\":{pid},\"tid\":{tid}",
        e.ph.letter(),
        e.cat,
        json_str(&e.name),
        e.id,
        e.ts
    );
    let mut fields: Vec<String> = Vec::new();
    if let Some(a) = &e.args {
        if let Some(t) = &a.tensor {
            fields.push(format!("\"tensor\":{}", json_str(t)));
        }
        let nums = [
            ("chunk", a.chunk.map(u64::from)),
            ("key", a.key),
            ("round", a.round),
            ("rank", a.rank.map(u64::from)),
            ("server", a.server.map(u64::from)),
            ("host", a.host.map(u64::from)),
            ("bytes", a.bytes),
        ];
        for (k, v) in nums {
            if let Some(v) = v {
                fields.push(format!("\"{k}\":{v}"));
            }
        }
        if let Some(p) = &a.peer {
            fields.push(format!("\"peer\":{}", json_str(p)));
        }
    }
    if let Some(x) = extra {
        fields.push(x.to_string());
    }
    if !fields.is_empty() {
        let _ = write!(out, ",\"args\":{{{}}}", fields.join(","));
    }
    out.push('}');
}

/// `s` as a JSON string.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(ph: Ph, ts: u64, cat: &'static str, name: &'static str, id: u64) -> (u64, Event) {
        let args = Args {
            tensor: Some("a \"b\"\n".into()),
            round: Some(3),
            ..Args::default()
        };
        (
            1,
            Event {
                ph,
                ts,
                cat,
                name: name.into(),
                id,
                args: Some(Box::new(args)),
            },
        )
    }

    #[test]
    fn open_frames_are_closed_and_names_escaped() {
        let events = [
            ev(Ph::Begin, 10, "chunk", "compress", 7),
            ev(Ph::End, 12, "chunk", "compress", 7),
            ev(Ph::Begin, 13, FRAME, "push", 8),
            ev(Ph::Instant, 14, FRAME, "written", 8),
            ev(Ph::Begin, 15, FRAME, "push", 9),
            ev(Ph::End, 16, FRAME, "push", 9),
        ];
        let text = render(&events, &["worker 0".into()], 42, 20);
        assert!(text.contains("\"a \\\"b\\\"\\n\""), "{text}");
        assert!(text.contains("\"ph\":\"n\""), "{text}");
        // Frame 8 was never acknowledged: closed at 20, marked; frame 9 and the chunk are not.
        assert_eq!(text.matches("unacknowledged").count(), 1, "{text}");
        assert!(text.contains("\"id\":\"0x8\",\"ts\":20"), "{text}");
        assert!(text.starts_with("{\"displayTimeUnit\""));
        assert!(text.trim_end().ends_with("]}"));
    }

    #[test]
    fn ids_fit_javascript_numbers() {
        assert!(id(&[u64::MAX, 1, 2]) < 1 << 52);
        assert_ne!(id(&[1, 2]), id(&[2, 1]));
    }
}
