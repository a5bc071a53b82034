//! The built-in benchmark job (`[job] kind = "benchmark"`), run by every worker of
//! `pushpull-worker` and `pushpull local`.
//!
//! 1. Declares the ResNet-50 parameter set ([`crate::resnet`]: 161 tensors, 25.6 M elements),
//!    each tensor scaled by `job.scale` (at least one element), tensor i with priority -i
//!    (`job.priority = "forward"`: the first layers first, as the next forward pass needs
//!    them) or all with priority 0 (`"none"`).
//! 2. Rank 0 broadcasts every tensor once (its data for the pseudo-round
//!    [`BROADCAST_ROUND`]); everyone checks it received rank 0's bytes.
//! 3. Every worker generates its data once ([`crate::data`], a pure function of the job seed,
//!    rank and tensor index: generating it is not pushpull's cost, so it stays out of every
//!    round) and keeps it where `job.buffers` says ([`crate::buffers`]): in host memory,
//!    reduced every round out of place (`push_pull_into`, no copy per round), or on a device
//!    (a GPU, or the emulated device), copied there into a work buffer before each round and
//!    reduced in place (`push_pull_device`).
//! 4. `job.warmup` + `job.rounds` rounds: every worker starts a `push_pull_into(Sum)` of every
//!    tensor, all in flight together, and waits for all of them: by default in one group call
//!    (`Worker::push_pull_group_into`, `job.issue = "group"`: sent in priority order), or as
//!    separate calls, the last tensor first (`"backward"`, the order a backward pass produces
//!    gradients in) or the first tensor first (`"forward"`). Only this part is timed: the round's seconds, and when the first tensor's
//!    result arrived (time to first layer). Then (with
//!    `job.check`) each result is checked bit for bit: raw fp32 tensors against the
//!    rank-order f32 sum, compressed ones (`[tensors]` maps) against the single-process
//!    reference of the whole job ([`pushpull_worker::reference`]: every rank's and the
//!    server's compressor chains, same seeds), which costs every worker W compressions per
//!    tensor and round.
//!
//! Throughput is reported per worker: rounds/s; gradient GB/s (raw fp32 bytes of all tensors
//! per round / seconds; GB = 1e9 bytes); and push + pull QUIC payload bytes per second (the
//! encoded chunk bytes this worker sent and received, frame headers excluded).

use std::sync::Arc;
use std::time::Instant;

use crate::JobConfig;
use pushpull_kernels::chunk::effective_spec;
use pushpull_kernels::IntraCodec;
use pushpull_proto::Config;
use pushpull_worker::reference::{RefTensor, Reference};
use pushpull_worker::{CudaDevice, EmulatedDevice, GpuContext, Reduce, Tensor, Worker};

use crate::buffers::{DeviceRounds, HostRounds, RoundPlan, Rounds};
use crate::data;
use crate::resnet;
use pushpull_node::cpu::process_cpu_seconds;
use pushpull_node::error::{CliError, CliResult};
use pushpull_node::report::JobReport;

/// The data round used for the initial broadcast (distinct from [`DATA_ROUND`]).
pub const BROADCAST_ROUND: u64 = u64::MAX;

/// The data round of every push_pull round's input (the same data every round).
pub const DATA_ROUND: u64 = 0;

/// One tensor of the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobTensor {
    /// Its name (torchvision's).
    pub name: String,
    /// Elements after scaling.
    pub len: u64,
}

/// The ResNet-50 tensor set with every tensor's element count multiplied by `scale` (rounded,
/// at least 1).
pub fn tensor_set(scale: f64) -> Vec<JobTensor> {
    resnet::resnet50()
        .into_iter()
        .map(|p| JobTensor {
            len: ((p.numel() as f64 * scale).round() as u64).max(1),
            name: p.name,
        })
        .collect()
}

fn op_err(what: &str, name: &str, e: impl std::fmt::Display) -> CliError {
    CliError::failed(format!("{what} of tensor {name:?} failed: {e}"))
}

/// Runs the job on a joined worker. `progress(done, total)` is called after every round.
/// A result that differs from the expected sum is an error naming the tensor, round and
/// element.
pub async fn run_benchmark(
    worker: &Worker,
    config: &Config,
    job: &JobConfig,
    mut progress: impl FnMut(u32, u32),
) -> CliResult<JobReport> {
    let rank = worker.rank();
    let num_workers = worker.num_workers();
    let seed = worker.job_seed();
    let specs = tensor_set(job.scale);
    let elements: u64 = specs.iter().map(|t| t.len).sum();
    // A missing GPU is said before anything is declared.
    let gpu = match job.buffers.as_str() {
        "device" => Some(Arc::new(open_gpu(config)?)),
        _ => None,
    };

    // Declare every tensor (collectives, all at once), the first layers first.
    let forward = job.priority == "forward";
    let mut set = tokio::task::JoinSet::new();
    for (i, t) in specs.iter().enumerate() {
        let (w, name, len) = (worker.clone(), t.name.clone(), t.len);
        let priority = if forward { -(i as i32) } else { 0 };
        set.spawn(async move {
            let r = w
                .declare_with_priority(&name, len, Default::default(), priority)
                .await;
            (i, name, r)
        });
    }
    let mut tensors: Vec<Option<Tensor>> = vec![None; specs.len()];
    while let Some(joined) = set.join_next().await {
        let (i, name, r) = joined.map_err(|e| CliError::failed(format!("declare task: {e}")))?;
        tensors[i] = Some(r.map_err(|e| op_err("declare", &name, e))?);
    }
    let tensors: Vec<Tensor> = tensors.into_iter().map(|t| t.expect("declared")).collect();

    // Broadcast from rank 0 once.
    let mut set = tokio::task::JoinSet::new();
    for (i, t) in tensors.iter().enumerate() {
        let (w, t) = (worker.clone(), t.clone());
        let len = specs[i].len as usize;
        let buf = if rank == 0 {
            data::generate(seed, BROADCAST_ROUND, 0, i as u32, len)
        } else {
            vec![0.0; len]
        };
        set.spawn(async move { (i, w.broadcast(&t, buf, 0).await) });
    }
    while let Some(joined) = set.join_next().await {
        let (i, r) = joined.map_err(|e| CliError::failed(format!("broadcast task: {e}")))?;
        let out = r.map_err(|e| op_err("broadcast", &specs[i].name, e))?;
        if job.check {
            data::check_equal(data::stream(seed, BROADCAST_ROUND, 0, i as u32), &out).map_err(
                |m| {
                    CliError::failed(format!(
                        "check failed: broadcast of tensor {:?} from rank 0: {m}",
                        specs[i].name
                    ))
                },
            )?;
        }
    }

    // Compressed tensors are checked against the single-process reference of the whole job
    // (every rank's compressor chain and the servers', same seeds); raw fp32 ones against
    // the rank-order sum directly (the same bits, much cheaper).
    let mut reference = Reference::new(config, seed);
    let mut ref_tensors: Vec<Option<RefTensor>> = vec![None; specs.len()];
    if job.check {
        for (i, t) in tensors.iter().enumerate() {
            let spec = effective_spec(t.params(), t.len(), config.cluster.min_compress_bytes)
                .map_err(|e| op_err("check setup", &specs[i].name, e))?;
            let rounded = spec.intra != IntraCodec::None && config.cluster.local_size > 1;
            if spec.codec.kind().name != "none"
                || spec.ef.is_some()
                || spec.momentum_mu.is_some()
                || rounded
            {
                let r = reference
                    .declare(&specs[i].name, specs[i].len, Default::default())
                    .map_err(|e| op_err("check setup", &specs[i].name, e))?;
                // The broadcast above used the tensor's first round.
                reference.broadcast(r);
                ref_tensors[i] = Some(r);
            }
        }
    }

    // Every round reduces the same inputs (no copy of the data per round on the host, a copy
    // on the device before the round's timer starts for in-place device rounds): generating
    // the data is the benchmark's cost, not pushpull's.
    let inputs: Vec<Arc<[f32]>> = specs
        .iter()
        .enumerate()
        .map(|(i, t)| data::generate(seed, DATA_ROUND, rank, i as u32, t.len as usize).into())
        .collect();
    let ctx = RoundCtx {
        worker,
        job,
        local_size: config.cluster.local_size,
        specs: &specs,
        tensors: &tensors,
        reference: &mut reference,
        ref_tensors: &ref_tensors,
    };
    let timed = match (gpu, job.buffers.as_str()) {
        (Some(gpu), _) => {
            timed_rounds(ctx, DeviceRounds::new(gpu, &inputs)?, &mut progress).await?
        }
        (None, "emulated") => {
            let device = Arc::new(EmulatedDevice::new());
            timed_rounds(ctx, DeviceRounds::new(device, &inputs)?, &mut progress).await?
        }
        (None, _) => timed_rounds(ctx, HostRounds::new(inputs), &mut progress).await?,
    };
    let Timed {
        seconds,
        round_seconds,
        first_tensor_seconds,
        cpu_push_pull,
        timed_start_metrics,
        checked,
        driver_calls,
    } = timed;
    let m1 = worker.metrics();
    let push = m1
        .bytes_pushed
        .saturating_sub(timed_start_metrics.bytes_pushed);
    let pull = m1
        .bytes_pulled
        .saturating_sub(timed_start_metrics.bytes_pulled);
    let gradient_bytes = elements * 4;
    let per_s = |x: f64| if seconds > 0.0 { x / seconds } else { 0.0 };
    Ok(JobReport {
        rank,
        num_workers,
        num_servers: worker.num_servers(),
        tensors: specs.len(),
        elements,
        scale: job.scale,
        warmup: job.warmup,
        rounds: job.rounds,
        seed,
        seconds,
        round_seconds,
        first_tensor_seconds,
        rounds_per_second: per_s(job.rounds as f64),
        gradient_bytes_per_round: gradient_bytes,
        gradient_gb_per_second: per_s(gradient_bytes as f64 * job.rounds as f64) / 1e9,
        push_payload_bytes: push,
        pull_payload_bytes: pull,
        payload_gb_per_second: per_s((push + pull) as f64) / 1e9,
        check: if job.check { "passed" } else { "skipped" }.to_string(),
        checked_rounds: checked,
        cpu_seconds_push_pull: cpu_push_pull,
        cpu_seconds: process_cpu_seconds(),
        compress_seconds: m1.compress_seconds - timed_start_metrics.compress_seconds,
        decompress_seconds: m1.decompress_seconds - timed_start_metrics.decompress_seconds,
        buffers: job.buffers.clone(),
        compressed_on: compressed_where(&tensors),
        driver_calls_per_round: driver_calls as f64 / f64::from(job.rounds.max(1)),
    })
}

/// What the timed rounds need from the job.
struct RoundCtx<'a> {
    worker: &'a Worker,
    job: &'a JobConfig,
    /// `cluster.local_size`: how the uncompressed sums are ordered.
    local_size: u32,
    specs: &'a [JobTensor],
    tensors: &'a [Tensor],
    reference: &'a mut Reference,
    ref_tensors: &'a [Option<RefTensor>],
}

/// What the timed rounds measured.
struct Timed {
    seconds: f64,
    round_seconds: Vec<f64>,
    first_tensor_seconds: Vec<f64>,
    cpu_push_pull: f64,
    timed_start_metrics: pushpull_worker::Metrics,
    checked: u32,
    /// Device driver calls in the timed rounds' push_pulls.
    driver_calls: u64,
}

/// `job.warmup` + `job.rounds` rounds over `rounds`' buffers, each result checked (with
/// `job.check`); only the push_pulls are timed.
async fn timed_rounds<R: Rounds>(
    ctx: RoundCtx<'_>,
    mut rounds: R,
    progress: &mut impl FnMut(u32, u32),
) -> CliResult<Timed> {
    let RoundCtx {
        worker,
        job,
        local_size,
        specs,
        tensors,
        reference,
        ref_tensors,
    } = ctx;
    let (rank, num_workers, seed) = (worker.rank(), worker.num_workers(), worker.job_seed());
    let total = job.warmup + job.rounds;
    let mut t = Timed {
        seconds: 0.0,
        round_seconds: Vec::new(),
        first_tensor_seconds: Vec::new(),
        cpu_push_pull: 0.0,
        timed_start_metrics: worker.metrics(),
        checked: 0,
        driver_calls: 0,
    };
    // `group` and `backward` list the last layer first, as a backward pass produces the
    // gradients; a group call sends in priority order whatever the list's order.
    let order: Vec<usize> = if job.issue == "forward" {
        (0..specs.len()).collect()
    } else {
        (0..specs.len()).rev().collect()
    };
    for round in 0..total {
        if round == job.warmup {
            t.timed_start_metrics = worker.metrics();
        }
        rounds.prepare()?;
        let cpu0 = process_cpu_seconds();
        let calls0 = rounds.driver_calls();
        let start = Instant::now();
        let plan = RoundPlan {
            tensors,
            order: &order,
            group: job.issue == "group",
            start,
        };
        let first_tensor = rounds.round(worker, plan).await.map_err(|(i, e)| {
            CliError::failed(match i {
                Some(i) => format!(
                    "push_pull of tensor {:?} (round {round}) failed: {e}",
                    specs[i].name
                ),
                None => format!("push_pull (round {round}) failed: {e}"),
            })
        })?;
        let elapsed = start.elapsed().as_secs_f64();
        if round >= job.warmup {
            t.seconds += elapsed;
            t.round_seconds.push(elapsed);
            t.first_tensor_seconds.push(first_tensor);
            t.cpu_push_pull += process_cpu_seconds() - cpu0;
            t.driver_calls += rounds.driver_calls() - calls0;
        }
        if job.check {
            for (i, spec) in specs.iter().enumerate() {
                let out = rounds.result(i)?;
                if let Some(r) = ref_tensors[i] {
                    let all: Vec<Vec<f32>> = (0..num_workers)
                        .map(|w| data::generate(seed, DATA_ROUND, w, i as u32, spec.len as usize))
                        .collect();
                    let expected = reference
                        .push_pull(r, &all, Reduce::Sum)
                        .map_err(|e| op_err("reference push_pull", &spec.name, e))?;
                    let want = &expected[rank as usize];
                    if let Some(j) = (0..out.len()).find(|&j| out[j].to_bits() != want[j].to_bits())
                    {
                        return Err(CliError::failed(format!(
                            "check failed: tensor {:?} (index {i}), round {round}, rank {rank}: \
                             element {j} is {} but the single-process reference of the \
                             compressed job gives {}",
                            spec.name, out[j], want[j]
                        )));
                    }
                    continue;
                }
                let workers = (num_workers, local_size);
                data::check_sum(seed, DATA_ROUND, workers, i as u32, &out).map_err(|m| {
                    CliError::failed(format!(
                        "check failed: tensor {:?} (index {i}), round {round}, rank {rank}: {m} \
                         (expected the rank-order f32 sum of {num_workers} workers' data in \
                         local groups of {local_size})",
                        spec.name
                    ))
                })?;
            }
            t.checked += 1;
        }
        progress(round + 1, total);
    }
    Ok(t)
}

/// The GPU for `job.buffers = "device"`, opened.
fn open_gpu(config: &Config) -> CliResult<CudaDevice> {
    let ordinal = gpu_ordinal(config)?;
    let gpu = GpuContext::new(ordinal).map_err(|e| no_gpu(e.to_string()))?;
    Ok(CudaDevice::new(gpu))
}

fn no_gpu(why: String) -> CliError {
    CliError::usage(format!(
        "job.buffers = \"device\" keeps the tensors on a CUDA GPU, which cannot be used here: \
         {why} (job.buffers = \"host\" or \"emulated\" run without one)"
    ))
}

/// The GPU for `job.buffers = "device"`: `worker.device`'s (`cuda:N`), else GPU 0, if it is
/// usable; else an error naming `job.buffers` and what is missing.
pub fn gpu_ordinal(config: &Config) -> CliResult<usize> {
    use pushpull_kernels::cuda::{select_device, Device as Place, DevicePref};
    let pref: DevicePref = config
        .worker
        .device
        .parse()
        .map_err(|e| CliError::usage(format!("worker.device: {e}")))?;
    let want = match pref {
        DevicePref::CudaOrdinal(n) => DevicePref::CudaOrdinal(n),
        _ => DevicePref::Cuda,
    };
    let ordinal = match select_device(want).map_err(|e| no_gpu(e.to_string()))? {
        Place::Cuda { ordinal } => ordinal,
        other => return Err(no_gpu(format!("{other} was chosen"))),
    };
    Ok(ordinal)
}

/// Where each tensor's last round compressed, e.g. `cuda:0 (148 tensors), cpu (13)`.
fn compressed_where(tensors: &[Tensor]) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for t in tensors {
        let place = t.metrics().device.to_string();
        match counts.iter_mut().find(|(p, _)| *p == place) {
            Some((_, c)) => *c += 1,
            None => counts.push((place, 1)),
        }
    }
    counts
        .iter()
        .enumerate()
        .map(|(k, (p, c))| {
            let unit = if k == 0 { " tensors" } else { "" };
            format!("{p} ({c}{unit})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_sets_keep_every_tensor() {
        let full = tensor_set(1.0);
        assert_eq!(full.len(), 161);
        assert_eq!(
            full.iter().map(|t| t.len).sum::<u64>(),
            resnet::RESNET50_ELEMENTS
        );
        let tiny = tensor_set(0.001);
        assert_eq!(tiny.len(), 161);
        assert!(tiny.iter().all(|t| t.len >= 1));
        assert!(tiny.iter().map(|t| t.len).sum::<u64>() < 30_000);
    }
}
