//! Decentralised averaging of a tensor declared with `exchange = "gossip"` (Moniqua's
//! Algorithm 1, lines 3–5; Lu and De Sa, ICML 2020): [`Worker::gossip`] encodes
//! each chunk of this worker's model with the chunk's codec and pushes it; the chunk's server
//! relays the pushes of this worker's graph neighbours (the cluster's `[gossip]` mixing
//! matrix) undecoded; [`average_gossip`] decodes each against this worker's own values (the
//! moniqua codec's reference), decodes this worker's own message the same way (the paper's
//! `x̂_i`, re-encoded here: encoding is deterministic in the round, and shared rounding draws
//! make it the same on every worker), and writes
//! `x + Σ_j W_ij (x̂_j − x̂_i)` ([`pushpull_kernels::gossip::average_step`]).

use std::sync::atomic::AtomicU32;

use pushpull_kernels::gossip::{average_step, theorem2_theta};
use pushpull_kernels::RoundCtx as CodecRound;
use pushpull_proto::protocol::split_gossip_result;

use super::*;

/// A tensor's gossip row on worker `rank`: its neighbours `j` and weights `W[rank][j]`,
/// ascending, when its map says `exchange = "gossip"`; `None` for a summed tensor.
pub(crate) fn row(
    config: &Config,
    rank: u32,
    params: &ParamMap,
) -> Result<Option<Vec<(u32, f64)>>, String> {
    if !pushpull_kernels::is_gossip(params) {
        return Ok(None);
    }
    let graph = config.gossip.graph(&config.cluster)?;
    graph
        .into_iter()
        .nth(rank as usize)
        .map(Some)
        .ok_or_else(|| format!("rank {rank} is not a worker of the gossip graph"))
}

/// Moniqua's `theta_schedule = bound` on one tensor: the largest |gradient| reported for it
/// ([`Worker::track_gradient`], the `G` of the paper's Theorem 2) and the `G` each round uses,
/// fixed when the round starts (the message this worker sends and its own copy of it, which
/// it encodes again to average, must agree).
pub(crate) struct GradientBound {
    /// Workers, and the spectral gap `ρ` of the job's mixing matrix.
    n: usize,
    rho: f64,
    /// `G` so far, as f32 bits (non-negative floats order as their bits); 0: none reported.
    tracked: AtomicU32,
    /// `(round, G)` of the round in progress.
    fixed: std::sync::Mutex<(u64, f32)>,
}

impl GradientBound {
    pub(crate) fn new(n: usize, rho: f64) -> GradientBound {
        GradientBound {
            n,
            rho,
            tracked: AtomicU32::new(0),
            fixed: std::sync::Mutex::new((u64::MAX, 0.0)),
        }
    }

    /// Raises `G` to `g` (finite, ≥ 0) if it is larger.
    pub(crate) fn track(&self, g: f32) {
        self.tracked.fetch_max(g.to_bits(), Ordering::Relaxed);
    }

    /// `G` so far (`None` before any gradient was reported, or while all were 0).
    pub(crate) fn get(&self) -> Option<f32> {
        match self.tracked.load(Ordering::Relaxed) {
            0 => None,
            bits => Some(f32::from_bits(bits)),
        }
    }

    /// Fixes `G` for `round`, which is starting.
    pub(crate) fn fix(&self, round: u64) {
        let g = self.get().unwrap_or(0.0);
        *self.fixed.lock().unwrap_or_else(|p| p.into_inner()) = (round, g);
    }

    /// Theorem 2's bound for `round` ([`theorem2_theta`]) with the round's `lr` and the `G`
    /// fixed for it; `None` without a rate or a `G` (the codec then says what is missing).
    pub(crate) fn theta_bound(&self, round: u64, lr: Option<f32>) -> Option<f64> {
        let (fixed_round, g) = *self.fixed.lock().unwrap_or_else(|p| p.into_inner());
        let lr = lr?;
        (fixed_round == round && g > 0.0)
            .then(|| theorem2_theta(f64::from(lr), f64::from(g), self.n, self.rho))
    }
}

/// The gradient bound of a tensor of the job of `config`: with the job's mixing matrix when the
/// tensor is gossiped, unused otherwise.
pub(crate) fn bound(config: &Config, gossiped: bool) -> Result<GradientBound, String> {
    let n = config.cluster.num_workers;
    let rho = if gossiped {
        config.gossip.matrix(n)?.rho()
    } else {
        0.0
    };
    Ok(GradientBound::new(n as usize, rho))
}

/// Chunk `index` of a gossip round: `slice` holds this worker's values `x` and receives the
/// average with the neighbours' messages in `payload` (see the module docs); `lr` is the
/// round's learning rate, which the codec reads with `theta_schedule = "lr"` (the pushes were
/// encoded with it).
pub(crate) fn average_gossip(
    tensor: &TensorInner,
    index: usize,
    slice: &mut [f32],
    round: u64,
    lr: Option<f32>,
    payload: &[u8],
) -> Result<(), String> {
    let Some(row) = &tensor.gossip else {
        return Err("a gossip result for a tensor that is summed".into());
    };
    let mut codec = tensor.codec(index);
    let x = slice.to_vec();
    let mut mine = Vec::new();
    let ctx = CodecRound {
        lr,
        theta_bound: tensor.bound.theta_bound(round, lr),
        ..CodecRound::new(round)
    };
    codec
        .compress(&x, &ctx, &mut mine)
        .map_err(|e| format!("encoding this worker's own message: {e}"))?;
    let parts = split_gossip_result(payload, row.len(), mine.len())?;
    let ctx = ctx.with_reference(&x);
    let decode = |bytes: &[u8], from: String| -> Result<Vec<f32>, String> {
        let mut v = vec![0.0f32; x.len()];
        codec
            .decompress(bytes, &ctx, &mut v)
            .map_err(|e| format!("decoding {from}'s message: {e}"))?;
        Ok(v)
    };
    let own = decode(&mine, "this worker".into())?;
    let theirs = row
        .iter()
        .zip(parts)
        .map(|(&(j, _), bytes)| decode(bytes, format!("worker {j}")))
        .collect::<Result<Vec<_>, _>>()?;
    let neighbours: Vec<(f64, &[f32])> = row
        .iter()
        .zip(&theirs)
        .map(|(&(_, w), v)| (w, &v[..]))
        .collect();
    average_step(&x, &own, &neighbours, slice);
    Ok(())
}

impl Worker {
    /// One step of decentralised averaging of `tensor` (declared with `exchange = "gossip"`
    /// in its map): `buf` holds this worker's values (its model's parameters) and is replaced
    /// by `x + Σ_j W_ij (x̂_j − x̂_i)` over this worker's neighbours `j` in the cluster's
    /// mixing matrix (`[gossip]`; by default a ring with ⅓ each), where `x̂` are the messages
    /// as decoded against `x` (exact for `compressor = "none"`; within `δ·B_θ` for
    /// `moniqua` while neighbours stay within θ). Each call is one round of the tensor, like a
    /// push_pull; every worker must call it.
    ///
    /// Moniqua's Algorithm 1 is: compute the gradient at `x`, `gossip` the model, then apply
    /// `−α·g` to the result. Start every worker from the same model ([`Worker::broadcast`]).
    ///
    /// # Errors
    /// [`WorkerError::WrongExchange`] for a tensor that is summed (nothing sent); otherwise as
    /// [`Worker::push_pull`] (a lost neighbour, or any lost node, ends the job naming it).
    pub async fn gossip<B>(&self, tensor: &Tensor, buf: B) -> Result<B, WorkerError>
    where
        B: AsMut<[f32]> + Send + 'static,
    {
        self.submit(tensor, HostData(buf), RoundKind::Gossip)
            .await
            .map(|d| d.0)
    }

    /// Reports a gradient (or the step's update divided by the learning rate) of `tensor`:
    /// the largest magnitude reported so far is the `G` of Moniqua's Theorem 2, which a map
    /// with `theta_schedule = "bound"` needs (θ = `theta` · 2·α·G·ln(16n)/(1 − ρ) in each
    /// round; the paper tracks the gradients' ∞-norm over the first steps, and gradients
    /// shrink as training goes, so the running maximum settles early). Call it every step,
    /// before [`Worker::gossip`]; a round uses the `G` reported before it started. Other maps
    /// ignore it.
    ///
    /// # Errors
    /// [`WorkerError::LengthMismatch`] when `gradient` does not have the tensor's length, and
    /// [`WorkerError::BadGradient`] naming the element when it holds a value that is not
    /// finite; nothing is recorded then.
    pub fn track_gradient(&self, tensor: &Tensor, gradient: &[f32]) -> Result<(), WorkerError> {
        if gradient.len() as u64 != tensor.len() {
            return Err(WorkerError::LengthMismatch {
                name: tensor.name().to_string(),
                declared: tensor.len(),
                got: gradient.len() as u64,
            });
        }
        let mut g = 0.0f32;
        for (index, &value) in gradient.iter().enumerate() {
            if !value.is_finite() {
                return Err(WorkerError::BadGradient {
                    name: tensor.name().to_string(),
                    message: format!("track_gradient: element {index} is {value}, not finite"),
                });
            }
            g = g.max(value.abs());
        }
        self.report_gradient_bound(tensor, g)
    }

    /// [`Worker::track_gradient`] for a caller that has the gradient's largest magnitude
    /// already (e.g. a framework's `grad.abs().max()`): `g` raises the tensor's `G` if larger.
    ///
    /// # Errors
    /// [`WorkerError::BadGradient`] when `g` is not a finite number ≥ 0 (nothing recorded).
    pub fn report_gradient_bound(&self, tensor: &Tensor, g: f32) -> Result<(), WorkerError> {
        if !(g.is_finite() && g >= 0.0) {
            return Err(WorkerError::BadGradient {
                name: tensor.name().to_string(),
                message: format!("gradient bound {g}: must be a finite number >= 0"),
            });
        }
        // +0.0: -0.0's bits would be the largest.
        tensor.inner.bound.track(g + 0.0);
        Ok(())
    }

    /// The `G` tracked for `tensor` so far ([`Worker::track_gradient`]), `None` before any.
    pub fn gradient_bound(&self, tensor: &Tensor) -> Option<f32> {
        tensor.inner.bound.get()
    }
}

/// Refuses a call whose kind does not fit how `tensor` is exchanged (before anything is sent).
pub(crate) fn check_exchange(tensor: &TensorInner, kind: RoundKind) -> Result<(), WorkerError> {
    let wrong = |message: &str| {
        Err(WorkerError::WrongExchange {
            op: kind.op_name(),
            name: tensor.placement.name.clone(),
            message: message.to_string(),
        })
    };
    match (kind, tensor.gossip.is_some()) {
        (RoundKind::Sum { .. }, true) => wrong(
            "its map says exchange = \"gossip\": its rounds average models with the graph \
             neighbours (call gossip), they are not summed",
        ),
        (RoundKind::Gossip, false) => wrong(
            "it is summed by push_pull; declare it with exchange = \"gossip\" in its map to \
             average it with the graph neighbours",
        ),
        _ => Ok(()),
    }
}
