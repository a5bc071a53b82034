//! The worker's families, read from [`Worker::metrics`] and [`Worker::connection_stats`] at
//! scrape time. Bytes are payload bytes of data frames (pushed: encoded chunks sent to the
//! servers; pulled: results received), as in the worker's report.

use std::sync::Arc;

use crate::{RoundTimes, Worker};

use pushpull_metrics::families::{Families, HistogramSample, Labels};
use pushpull_metrics::http::{serve, MetricsEndpoint, Source};

/// A worker as a metrics [`Source`] (holds a handle: the worker's counters stay readable after
/// [`Worker::finish`]).
#[derive(Debug, Clone)]
pub struct WorkerSource {
    worker: Worker,
}

impl WorkerSource {
    /// `worker`'s counters.
    pub fn new(worker: Worker) -> WorkerSource {
        WorkerSource { worker }
    }
}

/// Serves `worker`'s metrics at `addr` (see [`serve`]).
pub fn serve_worker(
    addr: std::net::SocketAddr,
    worker: &Worker,
) -> std::io::Result<MetricsEndpoint> {
    serve(addr, Arc::new(WorkerSource::new(worker.clone())))
}

fn histogram(t: &RoundTimes) -> HistogramSample {
    HistogramSample {
        buckets: t.cumulative(),
        count: t.count(),
        sum: t.sum_seconds,
    }
}

impl Source for WorkerSource {
    fn node_labels(&self) -> Vec<(&'static str, String)> {
        vec![
            ("role", "worker".into()),
            ("rank", self.worker.rank().to_string()),
        ]
    }

    fn collect(&self, out: &mut Families) {
        let m = self.worker.metrics();
        let per = |f: &dyn Fn(&crate::TensorMetrics) -> f64| -> Vec<(Labels, f64)> {
            m.tensors
                .iter()
                .map(|(name, t)| (vec![("tensor", name.clone())], f(t)))
                .collect()
        };
        let rounds: u64 = m.tensors.values().map(|t| t.rounds_done).sum();
        let mut times = RoundTimes::default();
        for t in m.tensors.values() {
            times.add(&t.round_times);
        }
        out.counter(
            "pushpull_rounds_total",
            "Rounds (push_pull and broadcast calls) completed, summed over tensors.",
            [(vec![], rounds as f64)],
        );
        out.counter(
            "pushpull_tensor_rounds_total",
            "Rounds of the tensor completed.",
            per(&|t| t.rounds_done as f64),
        );
        out.counter(
            "pushpull_rounds_non_finite_total",
            "push_pull rounds whose sum was not finite in some chunk, summed over tensors.",
            [(vec![], m.rounds_non_finite as f64)],
        );
        out.counter(
            "pushpull_pushed_bytes_total",
            "Payload bytes pushed to the servers, all tensors.",
            [(vec![], m.bytes_pushed as f64)],
        );
        out.counter(
            "pushpull_tensor_pushed_bytes_total",
            "Payload bytes of the tensor pushed to the servers.",
            per(&|t| t.bytes_pushed as f64),
        );
        out.counter(
            "pushpull_pulled_bytes_total",
            "Payload bytes of results pulled from the servers, all tensors.",
            [(vec![], m.bytes_pulled as f64)],
        );
        out.counter(
            "pushpull_tensor_pulled_bytes_total",
            "Payload bytes of the tensor's results pulled from the servers.",
            per(&|t| t.bytes_pulled as f64),
        );
        out.counter(
            "pushpull_raw_bytes_total",
            "What the completed rounds would have pushed as raw fp32, all tensors.",
            [(vec![], m.raw_bytes as f64)],
        );
        out.gauge(
            "pushpull_compression_ratio",
            "Raw fp32 bytes over payload bytes pushed, all tensors (1 before any push).",
            [(vec![], m.compression_ratio())],
        );
        out.gauge(
            "pushpull_tensor_compression_ratio",
            "Raw fp32 bytes over payload bytes pushed, for the tensor.",
            per(&|t| t.compression_ratio()),
        );
        for (name, help, v) in [
            (
                "pushpull_compress_seconds_total",
                "Seconds spent compressing, summed over tensors.",
                m.compress_seconds,
            ),
            (
                "pushpull_decompress_seconds_total",
                "Seconds spent decompressing results, summed over tensors.",
                m.decompress_seconds,
            ),
            (
                "pushpull_wait_seconds_total",
                "Seconds of rounds spent waiting (network, servers, other workers), summed over tensors.",
                m.wait_seconds,
            ),
        ] {
            out.counter(name, help, [(vec![], v)]);
        }
        out.histogram(
            "pushpull_round_duration_seconds",
            "Wall-clock time of a round (start to result), all tensors.",
            [(vec![], histogram(&times))],
        );
        out.histogram(
            "pushpull_tensor_round_duration_seconds",
            "Wall-clock time of a round of the tensor (start to result).",
            m.tensors
                .iter()
                .map(|(name, t)| (vec![("tensor", name.clone())], histogram(&t.round_times))),
        );
        let conns: Vec<(String, quinn::ConnectionStats)> = self
            .worker
            .connection_stats()
            .into_iter()
            .map(|(n, s)| (pushpull_metrics::peer_label(&n), s))
            .collect();
        pushpull_metrics::quic::add_connections(out, &conns);
    }
}
