//! Moniqua's `theta_schedule = bound` (Lu and De Sa, ICML 2020): a gossip tensor's gradient
//! bound `G` (the paper's Theorem 2), which training code reports through
//! [`crate::Worker::track_gradient`], and the θ bound each round's codec is handed
//! ([`GradientBound::theta_bound`]: Theorem 2's, with the round's learning rate and the `G`
//! fixed when the round started). Every declared tensor holds one (`TensorInner::bound`).

use std::sync::atomic::{AtomicU32, Ordering};

use pushpull_kernels::gossip::theorem2_theta;
use pushpull_proto::Config;

/// Moniqua's `theta_schedule = bound` on one tensor: the largest |gradient| reported for it
/// ([`crate::Worker::track_gradient`], the `G` of the paper's Theorem 2) and the `G` each round
/// uses, fixed when the round starts (the message this worker sends and its own copy of it,
/// which it encodes again to average, must agree).
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
