//! A self-contained throughput table: compress, decompress and decompress-add of every
//! compressor, in GB/s of fp32 input and as a ratio to a memcpy of the same buffer measured in
//! the same run.
//!
//! The example `codecs/examples/bench_compress.rs` prints it (build with `--release`); the
//! criterion benchmarks in `codecs/benches/compress.rs` measure the same operations. Threads: the table runs every operation inside a rayon pool of
//! [`BenchConfig::threads`] threads (1 = the serial path).

use crate::chain::Compressor;
use crate::codec::{NodeIdentity, RoundCtx};
use crate::registry::{build_from_spec, parse_params};
use crate::spec::{BuildOptions, Purpose};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// One compressor of the suite: a label and its parameter map.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchCase {
    /// The label printed in the table.
    pub label: String,
    /// The parameter map.
    pub params: BTreeMap<String, String>,
}

impl BenchCase {
    /// A case from `key=value` pairs.
    pub fn new(label: &str, kv: &[(&str, &str)]) -> BenchCase {
        BenchCase {
            label: label.to_string(),
            params: kv
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }
}

/// The default suite: every compressor with typical settings.
pub fn default_cases() -> Vec<BenchCase> {
    vec![
        BenchCase::new("none", &[("compressor", "none")]),
        BenchCase::new("fp16", &[("compressor", "fp16")]),
        BenchCase::new("bf16", &[("compressor", "bf16")]),
        BenchCase::new(
            "onebit scaling",
            &[("compressor", "onebit"), ("scaling", "true")],
        ),
        BenchCase::new(
            "onebit columns=1024",
            &[
                ("compressor", "onebit"),
                ("columns", "1024"),
                ("ef", "none"),
            ],
        ),
        BenchCase::new("topk k=0.01", &[("compressor", "topk"), ("k", "0.01")]),
        BenchCase::new(
            "randomk k=0.01",
            &[("compressor", "randomk"), ("k", "0.01")],
        ),
        BenchCase::new("minmax bits=8", &[("compressor", "minmax"), ("bits", "8")]),
        BenchCase::new(
            "minmax bits=4 bucket=512",
            &[("compressor", "minmax"), ("bits", "4"), ("bucket", "512")],
        ),
        BenchCase::new(
            "dithering k=7 linear max",
            &[("compressor", "dithering"), ("k", "7")],
        ),
        BenchCase::new(
            "dithering k=7 natural l2 bucket=512",
            &[
                ("compressor", "dithering"),
                ("k", "7"),
                ("partition", "natural"),
                ("normalize", "l2"),
                ("bucket", "512"),
            ],
        ),
        BenchCase::new(
            "dithering k=2 l2 bucket=512 elias",
            &[
                ("compressor", "dithering"),
                ("k", "2"),
                ("normalize", "l2"),
                ("bucket", "512"),
                ("encoding", "elias"),
            ],
        ),
        BenchCase::new(
            "moniqua bits=4",
            &[("compressor", "moniqua"), ("theta", "0.5"), ("bits", "4")],
        ),
        BenchCase::new(
            "ef vanilla + onebit",
            &[
                ("compressor", "onebit"),
                ("scaling", "true"),
                ("ef", "vanilla"),
            ],
        ),
        BenchCase::new(
            "nesterov + ef + onebit",
            &[
                ("compressor", "onebit"),
                ("scaling", "true"),
                ("ef", "vanilla"),
                ("momentum", "nesterov"),
            ],
        ),
        BenchCase::new(
            "nesterov + ef + topk k=0.01",
            &[
                ("compressor", "topk"),
                ("k", "0.01"),
                ("ef", "vanilla"),
                ("momentum", "nesterov"),
            ],
        ),
        BenchCase::new(
            "nesterov + ef + randomk k=0.1",
            &[
                ("compressor", "randomk"),
                ("k", "0.1"),
                ("ef", "vanilla"),
                ("momentum", "nesterov"),
            ],
        ),
    ]
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Chunk lengths in elements.
    pub sizes: Vec<usize>,
    /// Rayon threads (1 = serial).
    pub threads: usize,
    /// Minimum measuring time per operation (at least 3 repetitions are always made).
    pub min_time: Duration,
    /// The compressors.
    pub cases: Vec<BenchCase>,
}

impl Default for BenchConfig {
    /// 1 Mi and 25.6 Mi elements, one thread, 0.5 s per operation, [`default_cases`].
    fn default() -> Self {
        BenchConfig {
            sizes: vec![1 << 20, 26_843_546],
            threads: 1,
            min_time: Duration::from_millis(500),
            cases: default_cases(),
        }
    }
}

/// One line of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    /// The case's label (or `memcpy`).
    pub label: String,
    /// Elements.
    pub elements: usize,
    /// `compress`, `decompress`, `decompress_add` or `memcpy`.
    pub op: &'static str,
    /// Best (minimum) seconds per call over batches of calls ([`Clock::for_threads`]).
    pub secs: f64,
    /// GB/s of fp32 input (`4 * elements / secs / 1e9`).
    pub gbps: f64,
    /// `memcpy secs / secs`: above 1 is faster than copying the buffer.
    pub ratio_to_memcpy: f64,
    /// Payload size in bytes (the last compress).
    pub payload_bytes: usize,
}

/// Gradient-like test data: a deterministic mix of small normal-ish values and a few outliers.
pub fn test_data(n: usize, seed: u64) -> Vec<f32> {
    let s = crate::rng::Stream::from_base(seed);
    (0..n)
        .map(|i| {
            let d = s.draw(i as u64);
            // Sum of 4 uniforms ~ roughly normal.
            let mut a = 0.0f32;
            for k in 0..4 {
                a += ((d >> (16 * k)) & 0xffff) as f32 / 65536.0;
            }
            let v = (a - 2.0) * 1e-3;
            if d >> 60 == 0 {
                v * 50.0
            } else {
                v
            }
        })
        .collect()
}

/// Nanoseconds this thread has spent on a CPU (`CLOCK_THREAD_CPUTIME_ID`), or `None`.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn thread_cpu_ns() -> Option<u64> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec (64-bit Linux layout: two 64-bit fields).
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// Thread CPU time is only read on 64-bit Linux.
#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn thread_cpu_ns() -> Option<u64> {
    None
}

/// How the table measures time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// Wall-clock time.
    Wall,
    /// CPU time of the measuring thread (one thread only): immune to other processes taking
    /// the CPU away, which a shared machine does a lot.
    ThreadCpu,
}

impl Clock {
    fn now(self) -> f64 {
        match self {
            Clock::Wall => START.with(|s| s.elapsed().as_secs_f64()),
            Clock::ThreadCpu => thread_cpu_ns().map(|v| v as f64 * 1e-9).unwrap_or(0.0),
        }
    }

    /// The clock the table uses for `threads` threads.
    pub fn for_threads(threads: usize) -> Clock {
        if threads <= 1 && thread_cpu_ns().is_some() {
            Clock::ThreadCpu
        } else {
            Clock::Wall
        }
    }
}

thread_local! {
    static START: Instant = Instant::now();
}

/// Best per-call time over batches of calls (each batch >= 2 ms), for at least `min_time`
/// of wall time and 3 batches.
fn best_time(min_time: Duration, clock: Clock, mut f: impl FnMut()) -> f64 {
    f(); // warm-up: page faults, caches, lazily built state
    let t = clock.now();
    f();
    let one = (clock.now() - t).max(1e-7);
    let reps = ((2e-3 / one).ceil() as usize).clamp(1, 10_000);
    let start = Instant::now();
    let mut best = f64::INFINITY;
    let mut batches = 0;
    while batches < 3 || (start.elapsed() < min_time && batches < 500) {
        let t = clock.now();
        for _ in 0..reps {
            f();
        }
        best = best.min((clock.now() - t) / reps as f64);
        batches += 1;
    }
    best
}

/// Measures the table.
pub fn bench_table(cfg: &BenchConfig) -> Vec<BenchRow> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(cfg.threads.max(1))
        .build()
        .expect("thread pool");
    pool.install(|| run(cfg))
}

fn run(cfg: &BenchConfig) -> Vec<BenchRow> {
    let clock = Clock::for_threads(cfg.threads);
    let mut rows = Vec::new();
    for &n in &cfg.sizes {
        let x = test_data(n, 0x5eed);
        let mut dst = vec![0f32; n];
        let mem = best_time(cfg.min_time, clock, || {
            dst.copy_from_slice(std::hint::black_box(&x))
        });
        let gb = 4.0 * n as f64 / 1e9;
        rows.push(BenchRow {
            label: "memcpy".into(),
            elements: n,
            op: "memcpy",
            secs: mem,
            gbps: gb / mem,
            ratio_to_memcpy: 1.0,
            payload_bytes: 4 * n,
        });
        for case in &cfg.cases {
            let spec = match parse_params(&case.params) {
                Ok(s) => s,
                Err(e) => panic!("bench case {}: {e}", case.label),
            };
            let who = NodeIdentity::worker(7, 42, 0);
            let opts = BuildOptions {
                purpose: Purpose::ModelAveraging,
                ..BuildOptions::default()
            };
            let mut c: Compressor = build_from_spec(&spec, n, &who, opts)
                .unwrap_or_else(|e| panic!("bench case {}: {e}", case.label));
            let reference: Vec<f32> = x.iter().map(|v| v + 0.1).collect();
            let mut out = Vec::with_capacity(c.max_compressed_len());
            let mut round = 0u64;
            let t = best_time(cfg.min_time, clock, || {
                round += 1;
                let ctx = RoundCtx::new(round).with_reference(&reference);
                c.compress(&x, &ctx, &mut out).expect("compress");
            });
            let ctx = RoundCtx::new(round).with_reference(&reference);
            let payload = out.clone();
            let mut push = |op: &'static str, secs: f64| {
                rows.push(BenchRow {
                    label: case.label.clone(),
                    elements: n,
                    op,
                    secs,
                    gbps: gb / secs,
                    ratio_to_memcpy: mem / secs,
                    payload_bytes: payload.len(),
                })
            };
            push("compress", t);
            let mut y = vec![0f32; n];
            let t = best_time(cfg.min_time, clock, || {
                c.decompress(&payload, &ctx, &mut y).expect("decompress")
            });
            push("decompress", t);
            let t = best_time(cfg.min_time, clock, || {
                c.decompress_add(&payload, &ctx, &mut y)
                    .expect("decompress_add")
            });
            push("decompress_add", t);
        }
    }
    rows
}

/// The table as Markdown: one line per compressor and size, GB/s and ratio to memcpy for each
/// operation.
pub fn format_table(rows: &[BenchRow], threads: usize) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let clock = match Clock::for_threads(threads) {
        Clock::ThreadCpu => "thread CPU time",
        Clock::Wall => "wall-clock time",
    };
    let _ = writeln!(
        s,
        "{threads} thread{}, best of batches, {clock}; GB/s of fp32 input (ratio to memcpy of the same buffer in the same run)\n",
        if threads == 1 { "" } else { "s" }
    );
    let _ = writeln!(
        s,
        "| compressor | elements | payload bytes | compress GB/s (× memcpy) | decompress GB/s (× memcpy) | decompress_add GB/s (× memcpy) |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.elements).collect();
    sizes.dedup();
    for n in sizes {
        let at = |label: &str, op: &str| {
            rows.iter()
                .find(|r| r.elements == n && r.label == label && r.op == op)
        };
        if let Some(m) = at("memcpy", "memcpy") {
            let _ = writeln!(
                s,
                "| memcpy ({threads} thread{}) | {n} | {} | {:.2} (1.00) | | |",
                if threads == 1 { "" } else { "s" },
                m.payload_bytes,
                m.gbps
            );
        }
        let mut labels: Vec<&str> = Vec::new();
        for r in rows.iter().filter(|r| r.elements == n && r.op != "memcpy") {
            if !labels.contains(&r.label.as_str()) {
                labels.push(&r.label);
            }
        }
        for l in labels {
            let cell = |op: &str| {
                at(l, op)
                    .map(|r| format!("{:.2} ({:.2})", r.gbps, r.ratio_to_memcpy))
                    .unwrap_or_default()
            };
            let bytes = at(l, "compress").map(|r| r.payload_bytes).unwrap_or(0);
            let _ = writeln!(
                s,
                "| {l} | {n} | {bytes} | {} | {} | {} |",
                cell("compress"),
                cell("decompress"),
                cell("decompress_add")
            );
        }
    }
    s
}
