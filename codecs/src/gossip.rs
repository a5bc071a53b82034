//! Decentralised averaging, the pure part of Moniqua's Algorithm 1 (Lu and De Sa, "Moniqua:
//! Modulo Quantized Communication in Decentralized SGD", ICML 2020): the mixing matrix `W` of
//! the workers' graph and its checks ([`Mixing`], from `pushpull_proto::gossip`), and one
//! worker's averaging step from the recovered models of its neighbours ([`average_step`]).
//! Messages themselves are the `moniqua` codec's (its payload decoded against the receiver's
//! own model recovers the sender's within `δ·B_θ`, Lemma 2).
//! No transport here: the servers relay the messages (`ReduceOp::Gossip` in
//! `pushpull_proto::protocol`) and the worker decodes and averages them.
//!
//! Worker `i`'s step `k` (Algorithm 1, lines 3–5): send `q_i = Q_δ((x_i / B_θ) mod 1)`;
//! recover each neighbour's `x̂_j = (q_j·B_θ − x_i) mod B_θ + x_i` and its own
//! `x̂_i = (q_i·B_θ − x_i) mod B_θ + x_i` (the codec's decode with `x_i` as the reference);
//! then `x_i ← x_i + Σ_{j≠i} W_ij (x̂_j − x̂_i)` ([`average_step`]) and apply `−α·g_i`.

pub use pushpull_proto::gossip::{Mixing, TOLERANCE};

/// One worker's averaging step (Algorithm 1, line 5), into `out`: `x + Σ_j w_j (x̂_j − x̂_i)`
/// over `neighbours` `(w_j, x̂_j)` in the order given (ascending worker index,
/// [`Mixing::neighbours`]), `own` its own recovered model `x̂_i`. Per element in f64: the sum
/// starts at +0.0 and adds `w_j · (x̂_j − x̂_i)` in order, then `x + sum` is rounded to f32
/// once; the single-process reference follows the same rule.
///
/// # Panics
/// When the slices' lengths differ (a caller's bug, not input).
pub fn average_step(x: &[f32], own: &[f32], neighbours: &[(f64, &[f32])], out: &mut [f32]) {
    assert!(own.len() == x.len() && out.len() == x.len());
    assert!(neighbours.iter().all(|(_, v)| v.len() == x.len()));
    for (e, o) in out.iter_mut().enumerate() {
        let mine = own[e] as f64;
        let mut sum = 0.0f64;
        for (w, v) in neighbours {
            sum += w * (v[e] as f64 - mine);
        }
        *o = (x[e] as f64 + sum) as f32;
    }
}

/// Moniqua's Theorem 2 bound `θ_k = 2·α_k·G·C_α·ln(16n)/(1 − ηρ)` with `C_α = η = 1`: `lr`
/// the round's learning rate, `g` the bound of the gradients' magnitudes, `n` workers, `ρ`
/// the mixing matrix's spectral gap (what `theta_schedule = bound` scales by `theta`).
pub fn theorem2_theta(lr: f64, g: f64, n: usize, rho: f64) -> f64 {
    2.0 * lr * g * (16.0 * n.max(1) as f64).ln() / (1.0 - rho)
}
