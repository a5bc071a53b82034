//! Declared tensors, reduce operations and round kinds, and byte counters.

use pushpull_kernels::cuda::Device;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pushpull_kernels::Compressor;
use pushpull_proto::protocol::TensorPlacement;
use pushpull_proto::ParamMap;

use crate::core::TensorRounds;
use crate::gradient_bound::GradientBound;
use crate::round_times::{RoundClock, RoundTimes};

/// How [`crate::Worker::push_pull`] combines the workers' buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduce {
    /// The element-wise sum over all workers, added in rank order by the servers (so every
    /// worker gets the same bits, whatever order the pushes arrived in).
    #[default]
    Sum,
    /// The sum, then every element divided by the number of workers on this worker: exactly
    /// `sum / num_workers as f32` (an IEEE division, not a multiplication by the reciprocal),
    /// so every worker still gets the same bits.
    Average,
}

/// A declared tensor: a cheap `Clone` handle (an `Arc`) to its name, length, placement, codecs
/// and round counter.
///
/// Obtained from [`crate::Worker::declare`] (or [`crate::Worker::tensor`] by name) and valid
/// only with the `Worker` that declared it. Declaring the same name again on the same worker
/// returns a handle to the same tensor (the same round counter). Dropping a handle does
/// nothing; the worker keeps the tensor for the job's lifetime.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) inner: Arc<TensorInner>,
}

pub(crate) struct TensorInner {
    pub(crate) placement: TensorPlacement,
    /// The name as the timeline's events carry it (interned once per tensor).
    pub(crate) trace_name: pushpull_net::timeline::Name,
    /// Element range of each chunk, checked against the placement at declare time.
    pub(crate) ranges: Vec<Range<usize>>,
    /// One codec per chunk. Rounds of a tensor are serialised, so each is used by one task at
    /// a time; the mutex is never held across an await.
    pub(crate) codecs: Vec<Mutex<Compressor>>,
    /// Where the tensor's rounds run and its device state (see `crate::data`).
    pub(crate) residence: Mutex<Residence>,
    /// The tensor's rounds; holding this lock is holding the tensor.
    pub(crate) round: Arc<tokio::sync::Mutex<TensorRounds>>,
    pub(crate) rounds_started: AtomicU64,
    /// The first round this job runs (0, or a checkpoint's: [`crate::Worker::load_state`]):
    /// a local group's member 0 waits for the round before only after it.
    pub(crate) first_round: AtomicU64,
    pub(crate) bytes_pushed: AtomicU64,
    pub(crate) bytes_pulled: AtomicU64,
    /// Rounds (push_pull and broadcast calls) that completed without error.
    pub(crate) rounds_done: AtomicU64,
    /// push_pull rounds whose sum was not finite in some chunk.
    pub(crate) rounds_non_finite: AtomicU64,
    pub(crate) compress_nanos: AtomicU64,
    pub(crate) wait_nanos: AtomicU64,
    pub(crate) decompress_nanos: AtomicU64,
    /// Wall-clock times of the completed rounds.
    pub(crate) round_clock: RoundClock,
    /// A gossip tensor's neighbours of this worker and their weights `W[rank][j]`, ascending
    /// (`None`: a tensor summed by push_pull).
    pub(crate) gossip: Option<GossipRow>,
    /// The gradient bound of moniqua's `theta_schedule = bound` (gossip tensors).
    pub(crate) bound: GradientBound,
    /// A tensor PowerSGD compresses: its P and Q tensors and its state (`None` otherwise).
    pub(crate) low_rank: Option<LowRank>,
    /// A PowerSGD tensor's P or Q tensor: its counters are its owner's ([`Tensor::metrics`]),
    /// and [`crate::Worker::metrics`] lists only the owner.
    pub(crate) low_rank_part: bool,
}

/// A tensor PowerSGD compresses (`compressor = powersgd`; `crate::worker`'s `low_rank`
/// runs its steps): the tensors its `P` and `Q` are summed as (`compressor = none`, declared
/// with it), and its state. Holding the state's lock is holding the tensor's steps.
#[derive(Clone)]
pub(crate) struct LowRank {
    pub(crate) p: Tensor,
    pub(crate) q: Tensor,
    pub(crate) state: Arc<tokio::sync::Mutex<pushpull_kernels::PowerSgd>>,
}

/// A gossip tensor's row of the mixing matrix on this worker, and how it averages.
pub(crate) struct GossipRow {
    /// The neighbours `j` and weights `W[rank][j]`, ascending.
    pub(crate) neighbours: Vec<(u32, f64)>,
    /// `exchange = "gossip_direct"` (Moniqua's equation 4): the worker's own exact values
    /// stand where its own message's decoding stands in `gossip`.
    pub(crate) direct: bool,
}

/// Where a tensor's push_pull rounds run, and its state there (see `crate::data`).
/// A tensor's device state kept between its rounds (`crate::data`'s `DeviceState<D>`), with
/// what a checkpoint reads of it whatever the device.
pub(crate) trait KeptChains: Send {
    /// Each chunk's state as its CPU chain keeps it, copied from the device; `None` when the
    /// tensor has no device chains (its CPU chains hold the state).
    fn chain_states(&self) -> Option<Result<Vec<pushpull_kernels::ChainState>, String>>;
    /// Undoes `round` (the tensor's last) on the device chains, as
    /// [`crate::data::RoundData::undo`] does; `false` when the tensor has none (its CPU
    /// chains hold the state).
    fn undo(&mut self, round: u64) -> bool;
    /// For the device's round to take its own kind back.
    fn as_any(&self) -> &dyn std::any::Any;
    /// The same, by value.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send>;
}

pub(crate) struct Residence {
    /// Set by the first push_pull round: [`Device::Cpu`] for host buffers, else the device's.
    pub(crate) home: Option<Device>,
    /// The device state of `home` (`crate::data`'s `DeviceState<D>`), out while a round runs.
    pub(crate) chains: Option<Box<dyn KeptChains>>,
    /// Where the last push_pull round compressed (broadcasts carry raw fp32).
    pub(crate) compressed_on: Device,
    /// Where the last round's buffer lived.
    pub(crate) buffer_on: Device,
    /// Device and page-locked bytes its device state holds.
    pub(crate) device_bytes: u64,
    /// Its chains' state was restored from a checkpoint ([`crate::Worker::load_state`]) and
    /// is not empty: the host chains hold it, and device chains built later start from it.
    pub(crate) restored: bool,
    /// The host memory of a device buffer's copy (`HostCopy` of `data/device/host_copy.rs`:
    /// the page-locked staging of the device it was made for, or pageable memory), kept
    /// between rounds so that a round whose chunks go through the host does not allocate it
    /// again.
    pub(crate) host_copy: Option<KeptCopy>,
}

/// The host memory of a device buffer's copy, kept by its tensor ([`Residence::host_copy`]).
pub(crate) struct KeptCopy {
    /// The memory (`crate::data`'s `Held<D>`).
    pub(crate) held: Box<dyn std::any::Any + Send + Sync>,
    /// Its page-locked bytes.
    pub(crate) bytes: u64,
    /// The device it was made for: only its copies may use it.
    pub(crate) place: Device,
}

impl Residence {
    pub(crate) fn new() -> Residence {
        Residence {
            home: None,
            chains: None,
            compressed_on: Device::Cpu,
            buffer_on: Device::Cpu,
            device_bytes: 0,
            restored: false,
            host_copy: None,
        }
    }

    /// Records where a push_pull round compressed and where its buffer was.
    pub(crate) fn ran(&mut self, compressed_on: Device, buffer_on: Device) {
        self.compressed_on = compressed_on;
        self.buffer_on = buffer_on;
    }
}

impl TensorInner {
    pub(crate) fn residence(&self) -> std::sync::MutexGuard<'_, Residence> {
        self.residence.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Chunk `index`'s CPU codec (rounds of a tensor are serialised, so this never waits).
    pub(crate) fn codec(&self, index: usize) -> std::sync::MutexGuard<'_, Compressor> {
        self.codecs[index].lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Tensor {
    /// The tensor's name (its keys derive from it).
    pub fn name(&self) -> &str {
        &self.inner.placement.name
    }

    /// Number of f32 elements.
    pub fn len(&self) -> u64 {
        self.inner.placement.len
    }

    /// Whether the tensor has no elements (its push_pulls send nothing).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The agreed parameter map.
    pub fn params(&self) -> &ParamMap {
        &self.inner.placement.params
    }

    /// The agreed priority: this tensor's frames leave a connection before those of tensors
    /// with a lower one (see [`crate::Worker::declare_with_priority`]).
    pub fn priority(&self) -> i32 {
        self.inner.placement.priority
    }

    /// The chunks and the servers holding them, as the scheduler placed them.
    pub fn placement(&self) -> &TensorPlacement {
        &self.inner.placement
    }

    /// Number of chunks (keys).
    pub fn num_chunks(&self) -> usize {
        self.inner.placement.chunks.len()
    }

    /// How many push_pull/broadcast rounds of this tensor this worker has started; the next
    /// call uses this number as its round.
    pub fn rounds_started(&self) -> u64 {
        self.inner.rounds_started.load(Ordering::Relaxed)
    }

    /// The compressor chain of each chunk, e.g. `ef(vanilla, onebit(scaling))` (or `none`).
    pub fn codecs(&self) -> Vec<String> {
        self.inner
            .codecs
            .iter()
            .map(|c| {
                c.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .name()
                    .to_string()
            })
            .collect()
    }

    /// This tensor's counters (a PowerSGD tensor's include those of the rounds of its P and Q:
    /// their bytes and seconds are its steps').
    pub fn metrics(&self) -> TensorMetrics {
        let parts: &[&Tensor] = match &self.inner.low_rank {
            Some(low) => &[&low.p, &low.q],
            None => &[],
        };
        let sum = |f: fn(&TensorInner) -> &AtomicU64| {
            std::iter::once(self)
                .chain(parts.iter().copied())
                .map(|t| f(&t.inner).load(Ordering::Relaxed))
                .sum::<u64>()
        };
        let secs = |f: fn(&TensorInner) -> &AtomicU64| sum(f) as f64 * 1e-9;
        let done = self.inner.rounds_done.load(Ordering::Relaxed);
        let residence = self.inner.residence();
        TensorMetrics {
            len: self.len(),
            chunks: self.num_chunks(),
            rounds: self.rounds_started(),
            rounds_done: done,
            rounds_non_finite: self.inner.rounds_non_finite.load(Ordering::Relaxed),
            raw_bytes: done.saturating_mul(self.len()).saturating_mul(4),
            bytes_pushed: sum(|t| &t.bytes_pushed),
            bytes_pulled: sum(|t| &t.bytes_pulled),
            compress_seconds: secs(|t| &t.compress_nanos),
            wait_seconds: secs(|t| &t.wait_nanos),
            decompress_seconds: secs(|t| &t.decompress_nanos),
            device: residence.compressed_on,
            buffer_device: residence.buffer_on,
            device_bytes: residence.device_bytes
                + residence.host_copy.as_ref().map_or(0, |h| h.bytes),
            round_times: self.inner.round_clock.snapshot(),
        }
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("name", &self.name())
            .field("len", &self.len())
            .field("chunks", &self.num_chunks())
            .field("rounds_started", &self.rounds_started())
            .finish()
    }
}

/// Counters of one tensor on one worker. Bytes are payload bytes of data frames (the encoded
/// chunks a worker pushes and the results it pulls); the 40-byte frame headers and QUIC/TLS
/// overhead are not counted. Times are wall-clock seconds summed over rounds: compressing this
/// worker's chunks, decompressing the results, and the rest of each round (waiting for the
/// network, the servers and the other workers).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TensorMetrics {
    /// Elements.
    pub len: u64,
    /// Chunks (keys).
    pub chunks: usize,
    /// Rounds started (push_pull and broadcast calls that got past validation).
    pub rounds: u64,
    /// Rounds completed without error.
    pub rounds_done: u64,
    /// push_pull rounds whose sum was not finite in some chunk (some worker's gradient held
    /// inf or NaN there, or the sum overflowed): their result holds NaN in those chunks, as
    /// an all-reduce of the gradients would hold inf or NaN, and their state change was
    /// undone (see [`crate::Worker::discard_last_round`]).
    pub rounds_non_finite: u64,
    /// What the completed rounds would have pushed as raw fp32: `4 · len · rounds_done`
    /// (also what they would have pulled).
    pub raw_bytes: u64,
    /// Payload bytes pushed to servers.
    pub bytes_pushed: u64,
    /// Payload bytes of results pulled from servers.
    pub bytes_pulled: u64,
    /// Seconds spent compressing (encoding) this worker's chunks.
    pub compress_seconds: f64,
    /// Seconds of the rounds spent neither compressing nor decompressing.
    pub wait_seconds: f64,
    /// Seconds spent decompressing (decoding) results.
    pub decompress_seconds: f64,
    /// Where the last push_pull round compressed this tensor's chunks: [`Device::Cpu`] for host
    /// buffers, for device buffers under `worker.device = "cpu"`, and for compressors without
    /// a device kernel (top-k, column-wise onebit, Elias-coded dithering); the device's
    /// (`cuda:N`, or `emulated`) when its kernels did.
    pub device: Device,
    /// Where the last round's buffer lived (`cpu` for host buffers).
    pub buffer_device: Device,
    /// Device and page-locked host bytes the tensor's device state holds (residual, momentum,
    /// scratch, the staging of its pulled payloads, the host copy of a buffer whose chunks go
    /// through the host): 0 for host buffers.
    pub device_bytes: u64,
    /// How long the completed rounds took (a histogram).
    pub round_times: RoundTimes,
}

impl TensorMetrics {
    /// `raw_bytes / bytes_pushed`: how many times smaller the pushes were than raw fp32
    /// (1 when nothing was pushed).
    pub fn compression_ratio(&self) -> f64 {
        ratio(self.raw_bytes, self.bytes_pushed)
    }
}

fn ratio(raw: u64, sent: u64) -> f64 {
    if sent == 0 {
        1.0
    } else {
        raw as f64 / sent as f64
    }
}

/// A worker's counters: totals and per tensor (see [`TensorMetrics`] for what counts).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Metrics {
    /// Raw fp32 bytes of the completed rounds, all tensors.
    pub raw_bytes: u64,
    /// Payload bytes pushed, all tensors.
    pub bytes_pushed: u64,
    /// Payload bytes pulled, all tensors.
    pub bytes_pulled: u64,
    /// Rounds started, all tensors.
    pub rounds: u64,
    /// Rounds with a non-finite sum, all tensors.
    pub rounds_non_finite: u64,
    /// Seconds compressing, all tensors.
    pub compress_seconds: f64,
    /// Seconds waiting, all tensors (rounds of different tensors may overlap, so this can
    /// exceed the wall time).
    pub wait_seconds: f64,
    /// Seconds decompressing, all tensors.
    pub decompress_seconds: f64,
    /// Device and page-locked host bytes the worker holds for device buffers: every tensor's
    /// [`TensorMetrics::device_bytes`] and the batches' tables, payload arenas and staging.
    pub device_bytes: u64,
    /// Per tensor, by name.
    pub tensors: BTreeMap<String, TensorMetrics>,
}

impl Metrics {
    /// Totals over a set of tensors.
    pub(crate) fn from_tensors<'a>(tensors: impl IntoIterator<Item = &'a Tensor>) -> Metrics {
        let mut m = Metrics::default();
        for t in tensors.into_iter().filter(|t| !t.inner.low_rank_part) {
            let tm = t.metrics();
            m.raw_bytes += tm.raw_bytes;
            m.bytes_pushed += tm.bytes_pushed;
            m.bytes_pulled += tm.bytes_pulled;
            m.rounds += tm.rounds;
            m.rounds_non_finite += tm.rounds_non_finite;
            m.compress_seconds += tm.compress_seconds;
            m.wait_seconds += tm.wait_seconds;
            m.decompress_seconds += tm.decompress_seconds;
            m.device_bytes += tm.device_bytes;
            m.tensors.insert(t.name().to_string(), tm);
        }
        m
    }

    /// `raw_bytes / bytes_pushed` over all tensors (1 when nothing was pushed).
    pub fn compression_ratio(&self) -> f64 {
        ratio(self.raw_bytes, self.bytes_pushed)
    }
}

impl std::fmt::Display for Metrics {
    /// One line of totals, e.g. `161 tensors, 1771 rounds: pushed 1.130 GB (1130364096 B),
    /// pulled 1.130 GB (1130364096 B), 1.0x smaller than fp32; compress 0.810 s, wait 3.200 s,
    /// decompress 0.400 s`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} tensors, {} rounds: pushed {} ({} B), pulled {} ({} B), {:.1}x smaller than \
             fp32; compress {:.3} s, wait {:.3} s, decompress {:.3} s",
            self.tensors.len(),
            self.rounds,
            human_bytes(self.bytes_pushed),
            self.bytes_pushed,
            human_bytes(self.bytes_pulled),
            self.bytes_pulled,
            self.compression_ratio(),
            self.compress_seconds,
            self.wait_seconds,
            self.decompress_seconds,
        )
    }
}

/// `1234567` -> `1.235 MB` (decimal units).
fn human_bytes(b: u64) -> String {
    let b = b as f64;
    if b >= 1e9 {
        format!("{:.3} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.3} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.3} kB", b / 1e3)
    } else {
        format!("{b} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_line_names_totals() {
        let mut m = Metrics {
            raw_bytes: 2_260_728_192,
            bytes_pushed: 1_130_364_096,
            bytes_pulled: 999,
            rounds: 1771,
            compress_seconds: 0.25,
            ..Metrics::default()
        };
        m.tensors.insert("a".into(), TensorMetrics::default());
        assert_eq!(
            m.to_string(),
            "1 tensors, 1771 rounds: pushed 1.130 GB (1130364096 B), pulled 999 B (999 B), \
             2.0x smaller than fp32; compress 0.250 s, wait 0.000 s, decompress 0.000 s"
        );
        assert_eq!(human_bytes(40_040), "40.040 kB");
        assert_eq!(human_bytes(4_096_000), "4.096 MB");
    }
}
