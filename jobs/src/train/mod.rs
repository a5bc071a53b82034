//! The training job (`[job] kind = "train"`): data-parallel SGD of a candle model on a
//! synthetic classification task, every gradient push_pulled (averaged) through the cluster
//! with the compressor its parameter map names, so the accuracy and the bytes saved by each
//! compressor can be compared (`pushpull local --compare ...`).
//!
//! # Map of the module
//! | item | what it is |
//! |---|---|
//! | [`data`] | the task: Gaussian inputs, labels from a fixed random teacher network (even in x, so not linearly separable) plus label noise, a clean held-out test set, the training set sharded by rank; all from the job seed |
//! | [`model`] | the candle models: an MLP (`fc1.weight`, `fc1.bias`, ...; ReLU) or logistic regression, seeded He init; evaluation |
//! | [`exchange`] | [`Exchange`]: declare / set_learning_rate / push_pull of a step's gradients / metrics, for a `BlockingWorker` or an async `Worker` |
//! | [`compare`] | compressor presets (`--compressor`), `--param` overrides, the comparison table over compressors and seeds (mean ± sd) |
//! | [`check`] | the convergence check the tests use: a compressed run must get the loss below a threshold derived from the uncompressed run |
//! | [`rng`] | SplitMix64 with uniform and Gaussian draws |
//! | [`TrainOptions`], [`run_train`], [`TrainReport`] | the worker-side loop and what it measured |
//!
//! # One step, on every worker
//! 1. Draw `batch_size` samples from this worker's shard (a fresh permutation per epoch,
//!    seeded by the job seed and the rank).
//! 2. Forward, cross-entropy loss, backward (candle).
//! 3. [`Exchange::set_learning_rate`] with this step's rate, then push_pull every gradient
//!    tensor with `Reduce::Average`, all in flight at once. Each tensor travels with its
//!    parameter map's compressor (`[tensors.default]`, `[tensors."fc1.weight"]`); tensors below
//!    `cluster.min_compress_bytes` (the biases) travel uncompressed.
//! 4. SGD with momentum on the averaged gradient: `v ← μ·v + g; w ← w − η·v`, except for
//!    tensors whose map says `momentum = "nesterov"`: the compressor's momentum decorator owns
//!    momentum then, and the loop's μ is 0 for them (as BytePS requires).
//!
//! Every worker starts from the same weights (the same seeded init), pulls the same averages
//! and applies the same update, so all workers hold the same model throughout; the test
//! accuracy is the same on every rank.
//!
//! # Decentralised SGD (the maps say `exchange = "gossip"`)
//! When every parameter's map says `exchange = "gossip"` or `"gossip_direct"` (the presets
//! `dpsgd`, `moniqua`, `minmax-gossip`, `minmax-direct`), the loop is D-PSGD in the order of Moniqua's Algorithm 1: each worker
//! keeps its own model `x_i`; rank 0's initial model is broadcast; each step computes the
//! gradient `g_i` at `x_i` on the worker's own batch, gossips the model
//! (`x_i ← x_i + Σ_j W_ij (x̂_j − x̂_i)` with the neighbours of the cluster's `[gossip]` mixing
//! matrix, [`pushpull_worker::Worker::gossip`]) and then applies the local update
//! `v ← μ·v + g_i; x_i ← x_i − η·v` to the average. Gradients are never exchanged. What is
//! evaluated (test and train loss, accuracy) is the average of the workers' models, as the
//! paper reports, gathered with one broadcast per rank (its bytes are not counted in the
//! report's).

pub mod check;
pub mod compare;
pub mod data;
pub mod exchange;
pub mod model;
pub mod rng;

use std::time::Instant;

use crate::JobConfig;
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

pub use exchange::{Exchange, InRuntime, Op};

use data::TaskSpec;
use model::Model;
use pushpull_node::error::{CliError, CliResult};

/// At most this many rows of the worker's shard are used for the final training loss.
pub const TRAIN_LOSS_ROWS: usize = 2048;

/// Rows per forward pass in evaluation.
const EVAL_BATCH: usize = 1024;

/// What the training loop does (the `[job]` training keys, parsed).
#[derive(Debug, Clone, PartialEq)]
pub struct TrainOptions {
    /// `mlp` or `logistic`.
    pub model: String,
    /// Hidden widths (mlp only).
    pub hidden: Vec<usize>,
    /// SGD steps.
    pub steps: u32,
    /// Samples per worker per step.
    pub batch_size: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// `cosine` or `constant`.
    pub lr_schedule: String,
    /// SGD momentum (0 for tensors with `momentum = "nesterov"` in their map).
    pub momentum: f64,
    /// Test-set evaluation every this many steps (0: only at the end).
    pub eval_every: u32,
    /// Skip every push_pull: each worker trains alone on its shard (`job.skip_push_pull`, for
    /// timing the compute alone).
    pub skip_push_pull: bool,
    /// The task.
    pub task: TaskSpec,
}

impl TrainOptions {
    /// The training keys of `[job]` (checked by [`JobConfig::from_config`]).
    pub fn from_job(job: &JobConfig) -> TrainOptions {
        TrainOptions {
            model: job.model.clone(),
            hidden: job.hidden.iter().map(|&h| h as usize).collect(),
            steps: job.steps,
            batch_size: job.batch_size as usize,
            lr: job.lr,
            lr_schedule: job.lr_schedule.clone(),
            momentum: job.momentum,
            eval_every: job.eval_every,
            skip_push_pull: job.skip_push_pull,
            task: TaskSpec {
                input_dim: job.input_dim as usize,
                classes: job.classes as usize,
                teacher_hidden: job.teacher_hidden as usize,
                train_samples: job.train_samples as usize,
                test_samples: job.test_samples as usize,
                label_noise: job.label_noise,
            },
        }
    }

    /// Layer widths: input, hidden (mlp), classes.
    pub fn widths(&self) -> Vec<usize> {
        let mut w = vec![self.task.input_dim];
        if self.model == "mlp" {
            w.extend(&self.hidden);
        }
        w.push(self.task.classes);
        w
    }

    /// The learning rate of step `step` (0-based): `lr`, or with `cosine`
    /// `lr · (1 + cos(π · step / steps)) / 2`.
    pub fn lr_at(&self, step: u32) -> f64 {
        match self.lr_schedule.as_str() {
            "cosine" => {
                let t = step as f64 / self.steps.max(1) as f64;
                self.lr * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
            }
            _ => self.lr,
        }
    }
}

/// A test-set evaluation during training.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct EvalPoint {
    /// Steps done.
    pub step: u32,
    /// Mean cross-entropy on the test set.
    pub test_loss: f64,
    /// Fraction of the test set classified right.
    pub test_accuracy: f64,
}

/// What one worker's training run measured; `pushpull-worker --json` prints it as one JSON
/// object.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrainReport {
    /// This worker's rank.
    pub rank: u32,
    /// Workers in the job.
    pub num_workers: u32,
    /// `mlp` or `logistic`.
    pub model: String,
    /// Layer widths, input to output.
    pub widths: Vec<usize>,
    /// Parameters (elements of all tensors).
    pub params: u64,
    /// Parameter tensors (each push_pulled every step).
    pub tensors: usize,
    /// The parameter map of the largest tensor, as `key=value` pairs (what compressed it).
    pub compression: String,
    /// The job seed (data, init and batch order).
    pub seed: u64,
    /// Steps run.
    pub steps: u32,
    /// Samples per worker per step.
    pub batch_size: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Rows of this worker's shard.
    pub shard_samples: usize,
    /// Loss of this worker's first minibatch (≈ ln(classes) at a fresh init).
    pub initial_loss: f64,
    /// Mean cross-entropy on (up to [`TRAIN_LOSS_ROWS`] rows of) this worker's shard after
    /// training, noisy labels included.
    pub train_loss: f64,
    /// Mean cross-entropy on the test set after training.
    pub test_loss: f64,
    /// Test accuracy after training (clean teacher labels).
    pub test_accuracy: f64,
    /// Evaluations during training (`eval_every`).
    pub history: Vec<EvalPoint>,
    /// What the push_pulls would have pushed as raw fp32.
    pub raw_bytes: u64,
    /// Payload bytes this worker pushed.
    pub bytes_pushed: u64,
    /// Payload bytes this worker pulled.
    pub bytes_pulled: u64,
    /// `raw_bytes / bytes_pushed`.
    pub compression_ratio: f64,
    /// Seconds compressing (all tensors; concurrent tensors add up).
    pub compress_seconds: f64,
    /// Seconds of the rounds spent neither compressing nor decompressing.
    pub wait_seconds: f64,
    /// Seconds decompressing.
    pub decompress_seconds: f64,
    /// Wall seconds in forward, backward and the optimizer.
    pub compute_seconds: f64,
    /// Wall seconds in the push_pulls (all tensors of a step at once).
    pub exchange_seconds: f64,
    /// Wall seconds of the whole run (data generation and evaluation included).
    pub wall_seconds: f64,
    /// CPU seconds of this process at the time of the report.
    pub cpu_seconds: f64,
    /// Decentralised SGD: how far the workers' models are from their mean at the end, the
    /// largest over workers of the root mean square of `x_i − x̄` over all parameters (0 for
    /// data-parallel SGD, whose workers hold one model).
    #[serde(default)]
    pub consensus_distance: f64,
}

impl TrainReport {
    /// The human-readable report.
    pub fn to_text(&self) -> String {
        format!(
            "pushpull-worker rank {} of {}: trained {} {:?} ({} parameters in {} tensors; {}) \
             for {} steps of {} samples, seed {}\n  \
             test accuracy {:.2}%, test loss {:.4}, train loss {:.4} (initial {:.4})\n  \
             bytes: raw {}, pushed {}, pulled {}, compression {:.1}x\n  \
             seconds: wall {:.2}, compute {:.2}, push_pull {:.2} (compress {:.2}, wait {:.2}, \
             decompress {:.2})",
            self.rank,
            self.num_workers,
            self.model,
            self.widths,
            self.params,
            self.tensors,
            self.compression,
            self.steps,
            self.batch_size,
            self.seed,
            100.0 * self.test_accuracy,
            self.test_loss,
            self.train_loss,
            self.initial_loss,
            self.raw_bytes,
            self.bytes_pushed,
            self.bytes_pulled,
            self.compression_ratio,
            self.wall_seconds,
            self.compute_seconds,
            self.exchange_seconds,
            self.compress_seconds,
            self.wait_seconds,
            self.decompress_seconds,
        )
    }
}

fn candle_err(what: &str) -> impl Fn(candle_core::Error) -> CliError + '_ {
    move |e| CliError::failed(format!("training: {what}: {e}"))
}

/// Whether a parameter map hands momentum to the compressor (`momentum` or
/// `byteps_momentum_type` = `nesterov`).
pub fn map_owns_momentum(params: &pushpull_worker::ParamMap) -> bool {
    ["momentum", "byteps_momentum_type"]
        .iter()
        .any(|k| params.get(*k).is_some_and(|v| v.trim() == "nesterov"))
}

/// The device candle computes on: the first CUDA GPU with the `cuda` feature when there is
/// one, else the CPU.
pub fn device() -> Device {
    #[cfg(feature = "cuda")]
    {
        if let Ok(d) = Device::cuda_if_available(0) {
            return d;
        }
    }
    Device::Cpu
}

/// Whether the tensors are gossiped (every map says `exchange = "gossip"`) or summed (none
/// does); a mix is refused, naming one of each.
fn gossiped(tensors: &[pushpull_worker::Tensor]) -> CliResult<bool> {
    let is = |t: &pushpull_worker::Tensor| pushpull_kernels::is_gossip(t.params());
    match (
        tensors.iter().find(|t| is(t)),
        tensors.iter().find(|t| !is(t)),
    ) {
        (Some(g), Some(p)) => Err(CliError::failed(format!(
            "training: tensor {:?} is gossiped (exchange = \"gossip\") but {:?} is summed: \
             the loop runs decentralised SGD or data-parallel SGD, so give every parameter the \
             same exchange",
            g.name(),
            p.name()
        ))),
        (g, _) => Ok(g.is_some()),
    }
}

/// Sets the model's variables to `weights`.
fn set_vars(model: &Model, weights: &[Vec<f32>], dev: &Device) -> CliResult<()> {
    for (p, w) in model.params.iter().zip(weights) {
        let t = Tensor::from_slice(w, p.shape.as_slice(), dev).map_err(candle_err("update"))?;
        p.var.set(&t).map_err(candle_err("update"))?;
    }
    Ok(())
}

/// Sets the model's variables to the mean of every worker's `weights` (decentralised SGD's
/// evaluated model): each rank's model broadcast in turn, summed in rank order in f64, the
/// same on every worker. Adds the bytes this moved (raw, pushed, pulled) to `bytes`; returns
/// the consensus distance ([`TrainReport::consensus_distance`]).
fn mean_model(
    ex: &impl Exchange,
    tensors: &[pushpull_worker::Tensor],
    weights: &[Vec<f32>],
    model: &Model,
    dev: &Device,
    bytes: &mut (u64, u64, u64),
) -> CliResult<f64> {
    let before = ex.metrics();
    let mut sum: Vec<Vec<f64>> = weights.iter().map(|w| vec![0.0; w.len()]).collect();
    let mut all = Vec::new();
    for root in 0..ex.num_workers() {
        let mut theirs = weights.to_vec();
        ex.all(Op::Broadcast(root), tensors, &mut theirs)
            .map_err(|e| CliError::failed(format!("gathering the mean model failed: {e}")))?;
        for (s, t) in sum.iter_mut().zip(&theirs) {
            s.iter_mut().zip(t).for_each(|(s, &t)| *s += t as f64);
        }
        all.push(theirs);
    }
    let n = ex.num_workers() as f64;
    let mean: Vec<Vec<f32>> = sum
        .iter()
        .map(|s| s.iter().map(|&v| (v / n) as f32).collect())
        .collect();
    let elements: usize = mean.iter().map(Vec::len).sum();
    let distance = all
        .iter()
        .map(|x| {
            let sq: f64 = x
                .iter()
                .zip(&mean)
                .flat_map(|(a, m)| a.iter().zip(m))
                .map(|(&a, &m)| (a as f64 - m as f64).powi(2))
                .sum();
            (sq / elements.max(1) as f64).sqrt()
        })
        .fold(0.0, f64::max);
    set_vars(model, &mean, dev)?;
    let after = ex.metrics();
    bytes.0 += after.raw_bytes - before.raw_bytes;
    bytes.1 += after.bytes_pushed - before.bytes_pushed;
    bytes.2 += after.bytes_pulled - before.bytes_pulled;
    Ok(distance)
}

fn shuffled(seed: u64, rank: u32, epoch: u64, n: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..n as u32).collect();
    let mut r = rng::Rng::new(
        seed ^ epoch.wrapping_mul(0x9E37_79B9),
        0x5EED_0000 + rank as u64,
    );
    r.shuffle(&mut idx);
    idx
}

/// Runs the training loop on a joined worker (see the module docs for one step).
/// `progress(done, total)` is called after every step.
///
/// # Errors
/// A failed declare or push_pull (naming the tensor), a candle error, or a diverged run (a
/// non-finite loss: lower `job.lr`).
pub fn run_train(
    ex: &impl Exchange,
    opts: &TrainOptions,
    mut progress: impl FnMut(u32, u32),
) -> CliResult<TrainReport> {
    let start = Instant::now();
    let (rank, nw, seed) = (ex.rank(), ex.num_workers(), ex.job_seed());
    let task = data::build(seed, &opts.task, rank, nw);
    let dev = device();
    let widths = opts.widths();
    let model = Model::new(&widths, seed, &dev).map_err(candle_err("model"))?;
    let d = opts.task.input_dim;
    let n = task.train.len();
    let tx = Tensor::from_slice(&task.train.x, (n, d), &dev).map_err(candle_err("data"))?;
    let ty = Tensor::from_slice(&task.train.y, n, &dev).map_err(candle_err("data"))?;
    let nt = task.test.len();
    let sx = Tensor::from_slice(&task.test.x, (nt, d), &dev).map_err(candle_err("data"))?;
    let sy = Tensor::from_slice(&task.test.y, nt, &dev).map_err(candle_err("data"))?;

    // Declare every parameter's gradient (or, gossiped, the parameter itself), in the same
    // order on every worker.
    let mut tensors = Vec::new();
    for p in &model.params {
        let t = ex
            .declare(&p.name, p.len() as u64, Default::default())
            .map_err(|e| CliError::failed(format!("declare of tensor {:?} failed: {e}", p.name)))?;
        tensors.push(t);
    }
    let gossip = gossiped(&tensors)?;
    let mus: Vec<f32> = tensors
        .iter()
        .map(|t| {
            if map_owns_momentum(t.params()) {
                0.0
            } else {
                opts.momentum as f32
            }
        })
        .collect();
    let compression = tensors
        .iter()
        .max_by_key(|t| t.len())
        .map(|t| {
            let m = t.params();
            if m.is_empty() {
                "compressor=none".to_string()
            } else {
                m.iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        })
        .unwrap_or_default();
    let mut weights: Vec<Vec<f32>> = model
        .params
        .iter()
        .map(|p| p.var.as_tensor().flatten_all()?.to_vec1::<f32>())
        .collect::<candle_core::Result<_>>()
        .map_err(candle_err("weights"))?;
    let mut velocity: Vec<Vec<f32>> = weights.iter().map(|w| vec![0.0; w.len()]).collect();
    if gossip && !opts.skip_push_pull {
        // Identical initial models (the seeded init already is; the paper's assumption).
        ex.all(Op::Broadcast(0), &tensors, &mut weights)
            .map_err(|e| CliError::failed(format!("broadcast of the initial model failed: {e}")))?;
        set_vars(&model, &weights, &dev)?;
    }
    let m0 = ex.metrics();
    // Bytes of the evaluations' gathering of the mean model (gossip), left out of the report.
    let mut eval_bytes = (0u64, 0u64, 0u64);
    let mut consensus_distance = 0.0;

    let batch = opts.batch_size.min(n);
    let mut order = shuffled(seed, rank, 0, n);
    let (mut epoch, mut pos) = (0u64, 0usize);
    let (mut compute, mut exchange) = (0.0f64, 0.0f64);
    let mut initial_loss = f64::NAN;
    let mut history = Vec::new();
    for step in 0..opts.steps {
        let t0 = Instant::now();
        if pos + batch > n {
            epoch += 1;
            order = shuffled(seed, rank, epoch, n);
            pos = 0;
        }
        let idx = Tensor::from_slice(&order[pos..pos + batch], batch, &dev)
            .map_err(candle_err("batch"))?;
        pos += batch;
        let xb = tx.index_select(&idx, 0).map_err(candle_err("batch"))?;
        let yb = ty.index_select(&idx, 0).map_err(candle_err("batch"))?;
        let logits = model.forward(&xb).map_err(candle_err("forward"))?;
        let loss = candle_nn::loss::cross_entropy(&logits, &yb).map_err(candle_err("loss"))?;
        let loss_value = loss.to_scalar::<f32>().map_err(candle_err("loss"))? as f64;
        if !loss_value.is_finite() {
            return Err(CliError::failed(format!(
                "training diverged at step {step}: loss {loss_value} (lower job.lr, now {})",
                opts.lr
            )));
        }
        if step == 0 {
            initial_loss = loss_value;
        }
        let grads = loss.backward().map_err(candle_err("backward"))?;
        let mut bufs = model
            .params
            .iter()
            .map(|p| match grads.get(p.var.as_tensor()) {
                Some(g) => g.flatten_all()?.to_vec1::<f32>(),
                None => Ok(vec![0.0; p.len()]),
            })
            .collect::<candle_core::Result<Vec<_>>>()
            .map_err(candle_err("gradients"))?;
        drop(grads);
        compute += t0.elapsed().as_secs_f64();

        let lr = opts.lr_at(step) as f32;
        let t1 = Instant::now();
        // The step's rate: `ef = corrected` and moniqua's `theta_schedule = lr` read it.
        ex.set_learning_rate(lr);
        let gossiping = gossip && !opts.skip_push_pull;
        if gossiping {
            // The step's update over the rate, v = μ·v + g (it does not depend on the model,
            // so it is taken before the exchange): its magnitude is the G of moniqua's
            // `theta_schedule = bound`.
            momentum_step(&mus, &mut velocity, &bufs);
            for (t, v) in tensors.iter().zip(&velocity) {
                ex.track_gradient(t, v)
                    .map_err(|e| CliError::failed(format!("the update of step {step}: {e}")))?;
            }
            ex.all(Op::Gossip, &tensors, &mut weights).map_err(|e| {
                CliError::failed(format!("gossip of the model (step {step}) failed: {e}"))
            })?;
        } else if !opts.skip_push_pull {
            ex.push_pull_all(&tensors, &mut bufs).map_err(|e| {
                CliError::failed(format!(
                    "push_pull of the gradients (step {step}) failed: {e}"
                ))
            })?;
        }
        exchange += t1.elapsed().as_secs_f64();

        let t2 = Instant::now();
        if !gossiping {
            momentum_step(&mus, &mut velocity, &bufs);
        }
        for (w, v) in weights.iter_mut().zip(&velocity) {
            for (w, v) in w.iter_mut().zip(v) {
                *w -= lr * *v;
            }
        }
        set_vars(&model, &weights, &dev)?;
        compute += t2.elapsed().as_secs_f64();
        if opts.eval_every > 0 && (step + 1) % opts.eval_every == 0 && step + 1 < opts.steps {
            if gossip {
                mean_model(ex, &tensors, &weights, &model, &dev, &mut eval_bytes)?;
            }
            let (test_loss, test_accuracy) =
                model::evaluate(&model, &sx, &sy, EVAL_BATCH).map_err(candle_err("evaluate"))?;
            if gossip {
                set_vars(&model, &weights, &dev)?;
            }
            history.push(EvalPoint {
                step: step + 1,
                test_loss,
                test_accuracy,
            });
        }
        progress(step + 1, opts.steps);
    }

    if gossip && !opts.skip_push_pull {
        consensus_distance = mean_model(ex, &tensors, &weights, &model, &dev, &mut eval_bytes)?;
    }
    let (test_loss, test_accuracy) =
        model::evaluate(&model, &sx, &sy, EVAL_BATCH).map_err(candle_err("evaluate"))?;
    history.push(EvalPoint {
        step: opts.steps,
        test_loss,
        test_accuracy,
    });
    let rows = n.min(TRAIN_LOSS_ROWS);
    let (train_loss, _) = model::evaluate(
        &model,
        &tx.narrow(0, 0, rows).map_err(candle_err("evaluate"))?,
        &ty.narrow(0, 0, rows).map_err(candle_err("evaluate"))?,
        EVAL_BATCH,
    )
    .map_err(candle_err("evaluate"))?;
    let m = ex.metrics();
    let raw = m.raw_bytes.saturating_sub(m0.raw_bytes + eval_bytes.0);
    let pushed = m
        .bytes_pushed
        .saturating_sub(m0.bytes_pushed + eval_bytes.1);
    Ok(TrainReport {
        rank,
        num_workers: nw,
        model: opts.model.clone(),
        widths,
        params: model.num_params() as u64,
        tensors: tensors.len(),
        compression,
        seed,
        steps: opts.steps,
        batch_size: batch,
        lr: opts.lr,
        shard_samples: n,
        initial_loss,
        train_loss,
        test_loss,
        test_accuracy,
        history,
        raw_bytes: raw,
        bytes_pushed: pushed,
        bytes_pulled: m
            .bytes_pulled
            .saturating_sub(m0.bytes_pulled + eval_bytes.2),
        compression_ratio: if pushed == 0 {
            1.0
        } else {
            raw as f64 / pushed as f64
        },
        compress_seconds: m.compress_seconds - m0.compress_seconds,
        wait_seconds: m.wait_seconds - m0.wait_seconds,
        decompress_seconds: m.decompress_seconds - m0.decompress_seconds,
        compute_seconds: compute,
        exchange_seconds: exchange,
        wall_seconds: start.elapsed().as_secs_f64(),
        cpu_seconds: pushpull_node::cpu::process_cpu_seconds(),
        consensus_distance,
    })
}

/// Heavy-ball momentum of a step: `v ← μ·v + g` for every tensor (`mus[i]` its μ, `bufs[i]`
/// its gradient, averaged where the step push_pulled).
fn momentum_step(mus: &[f32], velocity: &mut [Vec<f32>], bufs: &[Vec<f32>]) {
    for ((mu, v), g) in mus.iter().zip(velocity.iter_mut()).zip(bufs) {
        for (v, g) in v.iter_mut().zip(g) {
            *v = mu * *v + g;
        }
    }
}
