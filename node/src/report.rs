//! What a parent process and the nodes and jobs it starts tell each other on their standard
//! output: the lines a node prints once it listens, the progress lines of the benchmark job and
//! its report, and how long a parent waits for a line. The launcher (`pushpull_launch`) and the
//! benchmarks (`pushpull_bench`) read them; the node commands (here and the root package's
//! worker) and the jobs (`pushpull_jobs`) write them. It depends on nothing else here.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The line prefix a scheduler prints once bound: `pushpull-scheduler listening on ADDR`.
pub const SCHEDULER_LISTENING: &str = "pushpull-scheduler listening on ";
/// The line prefix a server prints once bound: `pushpull-server listening on ADDR`.
pub const SERVER_LISTENING: &str = "pushpull-server listening on ";

/// The line prefix a scheduler prints once its metrics endpoint is bound: `pushpull-scheduler
/// metrics on ADDR` (after its `listening on` line; `--metrics` or `[metrics] listen`).
pub const SCHEDULER_METRICS: &str = "pushpull-scheduler metrics on ";
/// The line prefix a server prints once its metrics endpoint is bound.
pub const SERVER_METRICS: &str = "pushpull-server metrics on ";
/// The line prefix a worker (`pushpull-worker`) prints once its metrics endpoint is bound
/// (after joining, when its rank is known).
pub const WORKER_METRICS: &str = "pushpull-worker metrics on ";

/// How long a process may take to print its `listening on` line.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Prefix of the progress lines `pushpull-worker --progress` prints on stdout after each round:
/// `pushpull-worker progress rank=R round=N total=T`.
pub const PROGRESS_PREFIX: &str = "pushpull-worker progress ";

/// The progress line of worker `rank` after round `done` of `total`.
pub fn progress_line(rank: u32, done: u32, total: u32) -> String {
    format!("{PROGRESS_PREFIX}rank={rank} round={done} total={total}")
}

/// The value of `key=N` in the rest of a progress line (after [`PROGRESS_PREFIX`]).
pub fn progress_value(rest: &str, key: &str) -> Option<u64> {
    rest.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// What one worker measured; printed as text or (`--json`) as one JSON object.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobReport {
    /// This worker's rank.
    pub rank: u32,
    /// Workers in the job.
    pub num_workers: u32,
    /// Servers in the job.
    pub num_servers: u32,
    /// Tensors declared.
    pub tensors: usize,
    /// Elements of all tensors.
    pub elements: u64,
    /// `job.scale`.
    pub scale: f64,
    /// Warm-up rounds (not timed).
    pub warmup: u32,
    /// Timed rounds.
    pub rounds: u32,
    /// The job seed the data was generated from.
    pub seed: u64,
    /// Seconds spent in the timed push_pull rounds.
    pub seconds: f64,
    /// Seconds of each timed round (push_pulls only).
    #[serde(default)]
    pub round_seconds: Vec<f64>,
    /// Seconds from the start of each timed round until the first tensor's (the highest
    /// priority's) result had arrived: when a next forward pass could start.
    #[serde(default)]
    pub first_tensor_seconds: Vec<f64>,
    /// Timed rounds per second.
    pub rounds_per_second: f64,
    /// Raw fp32 bytes of all tensors (one round's gradient).
    pub gradient_bytes_per_round: u64,
    /// Gradient GB/s: `gradient_bytes_per_round * rounds / seconds / 1e9`.
    pub gradient_gb_per_second: f64,
    /// Payload bytes this worker pushed in the timed rounds.
    pub push_payload_bytes: u64,
    /// Payload bytes this worker pulled (results) in the timed rounds.
    pub pull_payload_bytes: u64,
    /// Push + pull payload GB/s.
    pub payload_gb_per_second: f64,
    /// `passed`, or `skipped` when `job.check` is false.
    pub check: String,
    /// Rounds whose every result was checked (plus the broadcast).
    pub checked_rounds: u32,
    /// CPU seconds of this process during the timed push_pulls (all threads).
    pub cpu_seconds_push_pull: f64,
    /// CPU seconds of this process in total, at the time of the report.
    pub cpu_seconds: f64,
    /// Seconds spent compressing in the timed rounds, summed over tensors (whose rounds run
    /// concurrently, so this can exceed the rounds' wall time); for device buffers, the
    /// launches and the waits for each chunk's payload.
    #[serde(default)]
    pub compress_seconds: f64,
    /// Seconds spent decoding results in the timed rounds, summed over tensors.
    #[serde(default)]
    pub decompress_seconds: f64,
    /// `job.buffers`: where the tensors lived (`host`, `device`, `emulated`).
    #[serde(default)]
    pub buffers: String,
    /// Where the last round compressed the tensors, with counts, e.g. `cuda:0 (148 tensors),
    /// cpu (13)` (a compressor without a device kernel compresses on the CPU).
    #[serde(default)]
    pub compressed_on: String,
    /// Device driver calls per timed round (allocations, copies, launches, event records and
    /// waits; 0 for host buffers), counted by the device: the cost a batch keeps flat.
    #[serde(default)]
    pub driver_calls_per_round: f64,
}

impl JobReport {
    /// The human-readable report.
    pub fn to_text(&self) -> String {
        format!(
            "pushpull-worker rank {} of {} ({} servers): {} tensors, {} elements ({:.1} MB fp32), \
             {} rounds after {} warm-up, seed {}\n  \
             rounds/s: {:.3}\n  \
             time to first layer: {:.3} s (median over rounds)\n  \
             gradient GB/s per worker: {:.3}\n  \
             push+pull payload GB/s: {:.3} ({} bytes pushed, {} pulled)\n  \
             check: {} ({} rounds + broadcast, bit-exact against rank-order f32 sums)\n  \
             buffers: {}; compressed on {}; {:.1} device driver calls per round\n  \
             codec seconds per round, summed over tensors: compress {:.4}, decompress {:.4}\n  \
             CPU seconds: {:.2} total, {:.2} during push_pull",
            self.rank,
            self.num_workers,
            self.num_servers,
            self.tensors,
            self.elements,
            self.gradient_bytes_per_round as f64 / 1e6,
            self.rounds,
            self.warmup,
            self.seed,
            self.rounds_per_second,
            median(&self.first_tensor_seconds),
            self.gradient_gb_per_second,
            self.payload_gb_per_second,
            self.push_payload_bytes,
            self.pull_payload_bytes,
            self.check,
            self.checked_rounds,
            self.buffers,
            self.compressed_on,
            self.driver_calls_per_round,
            self.compress_seconds / f64::from(self.rounds.max(1)),
            self.decompress_seconds / f64::from(self.rounds.max(1)),
            self.cpu_seconds,
            self.cpu_seconds_push_pull,
        )
    }
}

/// The median of `v` (0 when empty).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_parse() {
        let line = progress_line(0, 3, 12);
        let rest = line.strip_prefix(PROGRESS_PREFIX).unwrap();
        assert_eq!(progress_value(rest, "round"), Some(3));
        assert_eq!(progress_value(rest, "total"), Some(12));
        assert_eq!(progress_value("rank=0 total=12", "round"), None);
    }
}
