//! The timeline: one Chrome trace file per process (issue 34), for seeing where a round's time
//! goes, tensor by tensor and chunk by chunk.
//!
//! Turned on by `[trace] dir` in the cluster file or `PUSHPULL_TRACE=DIR` (which wins), every
//! node that [`start`]s records spans into memory and writes, when it ends normally (a worker's
//! `finish`, a server's or scheduler's shutdown; [`write`](fn@write)),
//! `DIR/<node>-<pid>.json`: the Trace Event format that chrome://tracing and ui.perfetto.dev
//! load, `{"traceEvents": [...]}`. The nodes of one process (the in-process clusters of the
//! tests) share one file, named after the first; each write rewrites the whole file, so it is
//! valid JSON after every node's end.
//!
//! Spans are async events (`"ph": "b"` / `"e"`, matched by `cat`, `id` and `name`) because a
//! tensor's chunks are pipelined and their phases overlap. Times (`ts`) are microseconds since
//! the Unix epoch, read from one monotonic clock anchored to the system clock once per process
//! (like [`crate::trace`]'s lines), so the files of the processes of one host merge. Tracks:
//!
//! | `cat` | where | spans (`name`) |
//! |---|---|---|
//! | `round` | worker | one per push_pull/broadcast call of a tensor: the tensor's name |
//! | `chunk` | worker | per chunk and round, in order: `compress`, `wait` (queued to the result handed over), inside it `pull` (the result frame's stream accepted to read), `decompress`; in a local group, in order: `turn`, `add`, on the chunk's owner `others add` (unless it is the last member) and the push's phases, on the others `outcome`, then `copy` |
//! | `batch` | worker | per device batch (a call's tensors compressed on the GPU) and round, named after its first traced tensor and round: `launch`, `staged` (its payloads in host staging), `decode` |
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
//! pushed onto its thread's buffer in memory (a mutex only the thread itself and
//! [`write`](fn@write) take); nothing is written until the node ends. An event allocates nothing: its [`Args`] are
//! plain numbers, tensor and peer names included ([`Name`]: interned once per process), and a
//! [`Span`] is recorded once, when it ends, with both its times (written out as its `b` and
//! `e`). A [`Span`] still open when the file is written is left out of it (the next write has
//! it). A frame sent is one record too, made when its peer acknowledged it (or stopped its
//! stream, or the connection went; [`frame_span`]), its `written` instant inside it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use pushpull_proto::config::TraceConfig;
use pushpull_proto::placement::mix64;
use rustc_hash::FxHashMap;

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
    /// Serialises [`write`](fn@write)s.
    writing: Mutex<()>,
}

/// One thread's events, in blocks of [`BLOCK`] that never move (a growing `Vec` would copy
/// every event recorded so far each time it doubles).
struct Buffer {
    tid: u64,
    events: Mutex<Vec<Vec<Event>>>,
}

/// Events per block of a [`Buffer`] (about 450 KB).
const BLOCK: usize = 4096;

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

/// A name events refer to (a tensor's, a peer's), interned once per process so that an event
/// carries four bytes for it: [`Name::new`] of the same text gives the same name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Name(u32);

/// Every [`Name`]'s text, by number, and the numbers by text.
#[derive(Default)]
struct Names {
    texts: Vec<Arc<str>>,
    numbers: HashMap<Arc<str>, u32>,
}

static NAMES: LazyLock<Mutex<Names>> = LazyLock::new(Default::default);

impl Name {
    /// The name's number in this process (the same text, the same number), e.g. for an [`id`].
    pub fn number(self) -> u64 {
        u64::from(self.0)
    }

    /// The name of `text` (a lookup in the thread's own cache; the first time on a thread, in
    /// the process's table).
    pub fn new(text: &str) -> Name {
        thread_local! {
            // Fx, not SipHash: the texts are the process's own (tensor and peer names), and
            // each of a frame's events looks its peer up.
            static SEEN: RefCell<FxHashMap<Box<str>, Name>> = RefCell::new(FxHashMap::default());
        }
        let cached = SEEN.try_with(|seen| seen.borrow().get(text).copied());
        if let Ok(Some(name)) = cached {
            return name;
        }
        let mut names = lock(&NAMES);
        let name = match names.numbers.get(text) {
            Some(&n) => Name(n),
            None => {
                let n = names.texts.len() as u32;
                let t: Arc<str> = text.into();
                names.texts.push(t.clone());
                names.numbers.insert(t, n);
                Name(n)
            }
        };
        drop(names);
        let _ = SEEN.try_with(|seen| seen.borrow_mut().insert(text.into(), name));
        name
    }
}

/// What an event says about itself (its `args`); unset fields are left out.
#[derive(Debug, Clone, Copy, Default)]
pub struct Args {
    /// The tensor's name.
    pub tensor: Option<Name>,
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
    pub peer: Option<Name>,
}

/// An event's name: a literal, or a [`Name`] (a `String` given as a name is interned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Label {
    /// A name written in the code.
    Static(&'static str),
    /// An interned name.
    Name(Name),
}

impl From<&'static str> for Label {
    fn from(s: &'static str) -> Label {
        Label::Static(s)
    }
}

impl From<Name> for Label {
    fn from(n: Name) -> Label {
        Label::Name(n)
    }
}

impl From<String> for Label {
    fn from(s: String) -> Label {
        Label::Name(Name::new(&s))
    }
}

impl Label {
    /// The label as a [`Name`], what an event keeps (4 bytes rather than 16).
    fn name(self) -> Name {
        match self {
            Label::Static(s) => Name::of_static(s),
            Label::Name(n) => n,
        }
    }
}

impl Name {
    /// [`Name::new`] of a literal, looked up by its address in the thread's own cache rather
    /// than by its text.
    fn of_static(text: &'static str) -> Name {
        thread_local! {
            static STATICS: RefCell<FxHashMap<(usize, usize), Name>> =
                RefCell::new(FxHashMap::default());
        }
        let key = (text.as_ptr() as usize, text.len());
        let cached = STATICS.try_with(|seen| seen.borrow().get(&key).copied());
        if let Ok(Some(name)) = cached {
            return name;
        }
        let name = Name::new(text);
        let _ = STATICS.try_with(|seen| seen.borrow_mut().insert(key, name));
        name
    }

    /// The name's text in `names` (the process's table, copied for a write).
    fn text(self, names: &[Arc<str>]) -> &str {
        names.get(self.0 as usize).map_or("?", |t| t.as_ref())
    }
}

/// [`Args`] as an event keeps them: their values (which are set is the event's `set`).
#[derive(Debug, Clone, Copy, Default)]
struct Packed {
    /// tensor, chunk, rank, server, host, peer.
    small: [u32; 6],
    /// key, round, bytes.
    big: [u64; 3],
}

const SMALL: [&str; 6] = ["tensor", "chunk", "rank", "server", "host", "peer"];
const BIG: [&str; 3] = ["key", "round", "bytes"];

impl Packed {
    /// The values of `a`, and which of them are set (bit `i` for `SMALL[i]`, `6 + i` for
    /// `BIG[i]`).
    fn of(a: &Args) -> (Packed, u16) {
        let mut p = Packed::default();
        let mut set = 0u16;
        let small = [
            a.tensor.map(|n| n.0),
            a.chunk,
            a.rank,
            a.server,
            a.host,
            a.peer.map(|n| n.0),
        ];
        for (i, v) in small.into_iter().enumerate() {
            if let Some(v) = v {
                set |= 1 << i;
                p.small[i] = v;
            }
        }
        for (i, v) in [a.key, a.round, a.bytes].into_iter().enumerate() {
            if let Some(v) = v {
                set |= 1 << (6 + i);
                p.big[i] = v;
            }
        }
        (p, set)
    }
}

/// One recorded event (no allocation, 88 bytes: each is memory the thread touches for the
/// first time): `ph` at `ts`, or, `whole`, a span from `ts` to `ts + dur` (written as its `b`
/// and `e`), with an instant inside it when `mark` is set (a frame's `written`).
#[derive(Debug, Clone, Copy)]
struct Event {
    ts: u64,
    id: u64,
    args: Packed,
    cat: Name,
    name: Name,
    dur: u32,
    /// A whole span's instant ([`MARK`]), microseconds after `ts` plus one; 0: none.
    mark: u32,
    /// Which of `args` are set ([`Packed::of`]).
    set: u16,
    ph: Ph,
    whole: bool,
}

/// The name of a whole span's instant (`Event::mark`): a frame's, handed to QUIC in full.
const MARK: &str = "written";

impl Event {
    fn new(ph: Ph, ts: u64, cat: &'static str, name: Label, id: u64, args: Option<&Args>) -> Event {
        let (args, set) = args.map(Packed::of).unwrap_or_default();
        Event {
            ts,
            id,
            args,
            cat: Name::of_static(cat),
            name: name.name(),
            dur: 0,
            mark: 0,
            set,
            ph,
            whole: false,
        }
    }
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
    stamp(Instant::now())
}

/// `at` on [`now`]'s clock, for a caller that read the clock for its own use already (one read
/// serving both). An instant before the first one stamped reads as that first one.
pub fn stamp(at: Instant) -> u64 {
    static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
    let (anchor, unix) = ANCHOR.get_or_init(|| {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        (at, unix)
    });
    unix + at.saturating_duration_since(*anchor).as_micros() as u64
}

/// An id for a track from a few numbers (each mixed in whole by SplitMix64's finaliser,
/// [`pushpull_proto::placement::mix64`]; 52 bits: exact in JavaScript's numbers).
pub fn id(parts: &[u64]) -> u64 {
    let h = parts
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, &p| mix64(h ^ p));
    h & ((1 << 52) - 1)
}

/// Records one event at `ts` (from [`now`]). Callers check [`on`] or [`traced`] first.
pub fn record(
    ph: Ph,
    ts: u64,
    cat: &'static str,
    name: impl Into<Label>,
    id: u64,
    args: Option<Args>,
) {
    push(Event::new(ph, ts, cat, name.into(), id, args.as_ref()));
}

/// Records a whole span, from `begin` to `end` (both from [`now`]). Callers check [`on`] or
/// [`traced`] first.
pub fn span(begin: u64, end: u64, cat: &'static str, name: impl Into<Label>, id: u64, args: Args) {
    push(Event {
        dur: end.saturating_sub(begin).min(u64::from(u32::MAX)) as u32,
        whole: true,
        ..Event::new(Ph::Begin, begin, cat, name.into(), id, Some(&args))
    });
}

/// Records a frame sent (category [`FRAME`], named after its kind) as one whole span, from
/// `queued` to `acked`, with its `written` instant inside it (all from [`now`]; a `written` of
/// 0: none). Callers check [`traced`] first.
pub fn frame_span(
    (queued, written, acked): (u64, u64, u64),
    name: &'static str,
    id: u64,
    args: Args,
) {
    // At most u32::MAX - 1 µs, so that the mark (an offset within it, plus one) fits too.
    let dur = acked.saturating_sub(queued).min(u64::from(u32::MAX - 1));
    let mark = if written == 0 {
        0
    } else {
        written.clamp(queued, queued + dur) - queued + 1
    };
    push(Event {
        dur: dur as u32,
        mark: mark as u32,
        whole: true,
        ..Event::new(Ph::Begin, queued, FRAME, name.into(), id, Some(&args))
    });
}

fn push(event: Event) {
    // `try_with`: a span dropped while its thread is being torn down is lost, not a panic.
    let _ = LOCAL.try_with(|b| {
        if let Some(b) = b {
            let mut blocks = lock(&b.events);
            match blocks.last_mut() {
                Some(block) if block.len() < BLOCK => block.push(event),
                _ => {
                    let mut block = new_block();
                    block.push(event);
                    blocks.push(block);
                }
            }
        }
    });
}

/// An empty block of [`BLOCK`] events whose memory is already mapped: one
/// `madvise(MADV_POPULATE_WRITE)` (Linux 5.14 and later) maps the block's pages at once instead
/// of taking one page fault per 4 KiB as its events are written, which was about a third of
/// what recording cost. Where the kernel refuses it, the pages fault in as before.
fn new_block() -> Vec<Event> {
    let block: Vec<Event> = Vec::with_capacity(BLOCK);
    #[cfg(target_os = "linux")]
    {
        let page = 4096;
        let start = block.as_ptr() as usize;
        let aligned = start.next_multiple_of(page);
        let end = start + BLOCK * std::mem::size_of::<Event>();
        if end > aligned + page {
            // SAFETY: the range lies inside the block's allocation, which this function owns;
            // MADV_POPULATE_WRITE only maps its pages (writing nothing visible: they read as
            // they did, zero or what the allocator left), and its failure changes nothing.
            unsafe {
                libc::madvise(
                    aligned as *mut libc::c_void,
                    (end - aligned) / page * page,
                    libc::MADV_POPULATE_WRITE,
                );
            }
        }
    }
    block
}

/// An open span: recorded when dropped (so a span ends on every path, errors included), or
/// at [`Span::end_at`].
pub struct Span {
    begin: u64,
    cat: &'static str,
    name: Label,
    id: u64,
    args: Args,
    open: bool,
}

impl Span {
    /// Begins a span now.
    pub fn begin(cat: &'static str, name: impl Into<Label>, id: u64, args: Args) -> Span {
        Span::begin_at(now(), cat, name, id, args)
    }

    /// Begins a span at `ts`.
    pub fn begin_at(
        ts: u64,
        cat: &'static str,
        name: impl Into<Label>,
        id: u64,
        args: Args,
    ) -> Span {
        Span {
            begin: ts,
            cat,
            name: name.into(),
            id,
            args,
            open: true,
        }
    }

    /// Ends the span at `ts`.
    pub fn end_at(mut self, ts: u64) {
        self.finish(ts);
    }

    fn finish(&mut self, ts: u64) {
        if std::mem::take(&mut self.open) {
            span(self.begin, ts, self.cat, self.name, self.id, self.args);
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
    name: impl Into<Label>,
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
        events.extend(lock(&b.events).iter().flatten().map(|e| (b.tid, *e)));
    }
    let nodes = lock(&state.nodes).clone();
    let pid = std::process::id();
    let text = render(&events, &nodes, pid);
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

/// The file's text: metadata naming the process, and the events (a whole span as its `b` and
/// `e`, and its mark as an instant between them) in time order.
fn render(events: &[(u64, Event)], nodes: &[String], pid: u32) -> String {
    let mark = Name::new(MARK); // before the copy of the names, which must hold it
    let names = lock(&NAMES).texts.clone();
    // (time, thread, event, which of its letters: `None` for its mark); a stable sort keeps a
    // thread's own events in their order at equal times.
    let mut out_events: Vec<(u64, u64, &Event, Option<Ph>)> = Vec::with_capacity(events.len() * 3);
    for (tid, e) in events {
        out_events.push((e.ts, *tid, e, Some(e.ph)));
        if e.whole {
            if e.mark != 0 {
                out_events.push((e.ts + u64::from(e.mark - 1), *tid, e, None));
            }
            out_events.push((e.ts + u64::from(e.dur), *tid, e, Some(Ph::End)));
        }
    }
    out_events.sort_by_key(|&(ts, ..)| ts);
    let mut out = String::with_capacity(64 + out_events.len() * 160);
    out.push_str("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    let _ = write!(
        out,
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"args\":{{\"name\":{}}}}}",
        json_str(&nodes.join(", "))
    );
    for &(ts, tid, e, ph) in &out_events {
        out.push_str(",\n");
        let Some(ph) = ph else {
            let instant = Event { name: mark, ..*e };
            event_json(
                &mut out,
                (Ph::Instant, ts, &instant),
                false,
                (pid, tid),
                &names,
            );
            continue;
        };
        event_json(&mut out, (ph, ts, e), ph != Ph::End, (pid, tid), &names);
    }
    out.push_str("\n]}\n");
    out
}

/// The `cat` of frame events (`crate::trace` records them: [`frame_span`] for a frame sent).
pub const FRAME: &str = "frame";

/// One event's JSON: letter `ph` of event `e` at `ts`, with its args if `args` (names resolved
/// in `names`).
fn event_json(
    out: &mut String,
    (ph, ts, e): (Ph, u64, &Event),
    args: bool,
    (pid, tid): (u32, u64),
    names: &[Arc<str>],
) {
    let _ = write!(
        out,
        "{{\"ph\":\"{}\",\"cat\":\"{}\",\"name\":{},\"id\":\"{:#x}\",\"ts\":{ts},\"pid\":{pid},\"tid\":{tid}",
        ph.letter(),
        e.cat.text(names),
        json_str(e.name.text(names)),
        e.id,
    );
    let mut fields: Vec<String> = Vec::new();
    if args {
        let a = &e.args;
        for (i, k) in SMALL.iter().enumerate() {
            if e.set & (1 << i) == 0 {
                continue;
            }
            let v = a.small[i];
            fields.push(match *k {
                "tensor" | "peer" => {
                    format!("\"{k}\":{}", json_str(Name(v).text(names)))
                }
                _ => format!("\"{k}\":{v}"),
            });
        }
        for (i, k) in BIG.iter().enumerate() {
            if e.set & (1 << (6 + i)) != 0 {
                fields.push(format!("\"{k}\":{}", a.big[i]));
            }
        }
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
mod tests;
