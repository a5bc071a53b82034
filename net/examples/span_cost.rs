//! What one timeline event costs the thread that records it (BENCHMARKS.md, "Observability"):
//! a chunk phase's span as the worker records it (`Span::begin` with the chunk's args,
//! dropped), a frame sent (`trace::frame_queued`, `frame_written`, `frame_acked`: one record),
//! a frame arrived (an instant with args), and a clock read; on one thread and on two at once
//! (the development machine's cores). Run with
//! `cargo run --release -p pushpull-net --example span_cost`.

use std::sync::OnceLock;
use std::time::Instant;

use pushpull_net::timeline::{self, Args, Name, Span};
use pushpull_net::trace;
use pushpull_proto::config::TraceConfig;
use pushpull_proto::protocol::{FrameFlags, FrameHeader, FrameKind, ReduceOp};

const N: u64 = 1_000_000;

/// What is measured, and one call of it.
type Case = (&'static str, fn(u64));

/// Nanoseconds per call of `f`, `N` calls on each of `threads` threads at once.
fn per_call(threads: usize, f: fn(u64)) -> f64 {
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(move || (0..N).for_each(f));
        }
    });
    t.elapsed().as_nanos() as f64 / N as f64
}

/// A chunk's args; the tensor's name interned once, as the worker does at declare.
fn chunk_args(i: u64) -> Args {
    static TENSOR: OnceLock<Name> = OnceLock::new();
    Args {
        tensor: Some(*TENSOR.get_or_init(|| Name::new("layer4.2.conv3.weight"))),
        chunk: Some((i % 8) as u32),
        key: Some(i % 1000),
        round: Some(i / 1000),
        rank: Some(0),
        ..Args::default()
    }
}

/// A push frame's header, as a worker sends it.
fn header(i: u64) -> FrameHeader {
    FrameHeader {
        kind: FrameKind::Push,
        op: ReduceOp::Sum,
        flags: FrameFlags::default(),
        rank: 0,
        aux: 0,
        key: i % 1000,
        round: i / 1000,
        payload_len: 4096,
    }
}

fn main() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let config = TraceConfig {
        dir: Some(dir.path().display().to_string()),
        ..TraceConfig::default()
    };
    assert!(timeline::start(&config, "span cost"));
    let cases: [Case; 4] = [
        ("clock read (timeline::now)", |_| {
            std::hint::black_box(timeline::now());
        }),
        ("chunk span (begin with args, drop)", |i| {
            drop(Span::begin("chunk", "compress", i, chunk_args(i)));
        }),
        ("frame sent (queued, written, acked: one record)", |i| {
            let h = header(i);
            let mut times = trace::frame_queued(&h, "server 1");
            trace::frame_written(&mut times, &h, "server 1");
            trace::frame_acked(times, &h, "server 1");
        }),
        ("frame arrived (an instant with args)", |i| {
            trace::frame_arrived(&header(i), "worker 0");
        }),
    ];
    println!(
        "{:<56} {:>12} {:>22}",
        "event", "ns, 1 thread", "ns, 2 threads at once"
    );
    for (what, f) in cases {
        let one = per_call(1, f);
        let two = per_call(2, f);
        println!("{what:<56} {one:>12.0} {two:>22.0}");
    }
}
