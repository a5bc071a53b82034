//! Decentralised averaging (`pushpull_codecs::gossip`, Moniqua's Algorithm 1) as pure
//! functions: exact messages keep the workers' mean and contract the spread by the spectral
//! gap; Moniqua's messages (the `moniqua` codec, decoded against the receiver's own model)
//! stay within the recovery bound of the exact step; the direct scheme of equation 4 stalls
//! at Theorem 1's floor where Moniqua converges.

mod common;

use common::*;
use proptest::prelude::*;
use pushpull_codecs::gossip::{average_step, Mixing};
use pushpull_codecs::RoundCtx;

/// Every worker's step with exact messages (`x̂ = x`).
fn exact_round(w: &Mixing, xs: &[Vec<f32>]) -> Vec<Vec<f32>> {
    (0..w.len())
        .map(|i| {
            let nb: Vec<(f64, &[f32])> = w
                .neighbours(i)
                .into_iter()
                .map(|(j, wt)| (wt, xs[j].as_slice()))
                .collect();
            let mut out = vec![0f32; xs[i].len()];
            average_step(&xs[i], &xs[i], &nb, &mut out);
            out
        })
        .collect()
}

fn spread(xs: &[Vec<f32>]) -> f64 {
    let n = xs.len() as f64;
    (0..xs[0].len())
        .map(|e| {
            let mean = xs.iter().map(|x| x[e] as f64).sum::<f64>() / n;
            xs.iter().map(|x| (x[e] as f64 - mean).powi(2)).sum::<f64>()
        })
        .sum::<f64>()
        .sqrt()
}

#[test]
fn exact_messages_keep_the_mean_and_reach_consensus_at_the_gap() {
    proptest!(prop_config("exact_messages_keep_the_mean", 64), |(n in 2usize..9, len in 1usize..50, seed in any::<u64>())| {
        let w = Mixing::ring(n);
        let mut rng = TestRng::new(seed);
        let mut xs: Vec<Vec<f32>> = (0..n).map(|_| rng.gradient(len, 1.0)).collect();
        let mean0: Vec<f64> = (0..len).map(|e| xs.iter().map(|x| x[e] as f64).sum::<f64>() / n as f64).collect();
        let s0 = spread(&xs);
        for _ in 0..5 {
            xs = exact_round(&w, &xs);
        }
        for e in 0..len {
            let mean = xs.iter().map(|x| x[e] as f64).sum::<f64>() / n as f64;
            prop_assert!((mean - mean0[e]).abs() <= 1e-5 * (1.0 + mean0[e].abs()), "element {}: mean {} -> {}", e, mean0[e], mean);
        }
        // W's symmetric part on the mean-free subspace contracts by at most ρ per step.
        prop_assert!(spread(&xs) <= w.rho().powi(5) * s0 * (1.0 + 1e-4) + 1e-5, "spread {} -> {} (ρ = {})", s0, spread(&xs), w.rho());
    });
}

#[test]
fn moniqua_messages_stay_within_the_recovery_bound_of_the_exact_step() {
    proptest!(prop_config("moniqua_messages_recovery_bound", 64), |(n in 3usize..8, len in 1usize..200, bits in 2u32..6, seed in any::<u64>())| {
        let theta = 0.5f64;
        let w = Mixing::ring(n);
        let mut rng = TestRng::new(seed);
        // Models near consensus (within θ of each other), far from 0.
        let base = rng.gradient(len, 100.0);
        let xs: Vec<Vec<f32>> = (0..n)
            .map(|_| base.iter().map(|&b| (b as f64 + (rng.unit() - 0.5) * theta * 0.9) as f32).collect())
            .collect();
        let (ts, bs) = (theta.to_string(), bits.to_string());
        let kv = [("compressor", "moniqua"), ("theta", ts.as_str()), ("bits", bs.as_str()), ("rounding", "nearest")];
        let mut codecs: Vec<_> = (0..n).map(|_| build(&kv, len)).collect();
        let ctx = RoundCtx::new(3);
        let payloads: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                let mut out = Vec::new();
                codecs[i].compress(&xs[i], &ctx, &mut out).unwrap();
                out
            })
            .collect();
        let exact = exact_round(&w, &xs);
        let delta = 0.5f64.powi(bits as i32 + 1);
        let bound = delta * 2.0 * theta / (1.0 - 2.0 * delta);
        for i in 0..n {
            // Recover the neighbours' and its own message against its own model.
            let recover = |j: usize| {
                let mut v = vec![0f32; len];
                codecs[i].decompress(&payloads[j], &RoundCtx::new(3).with_reference(&xs[i]), &mut v).unwrap();
                v
            };
            let own = recover(i);
            let nbs: Vec<(f64, Vec<f32>)> = w.neighbours(i).into_iter().map(|(j, wt)| (wt, recover(j))).collect();
            let nb: Vec<(f64, &[f32])> = nbs.iter().map(|(wt, v)| (*wt, v.as_slice())).collect();
            let mut out = vec![0f32; len];
            average_step(&xs[i], &own, &nb, &mut out);
            let weight: f64 = nb.iter().map(|(wt, _)| wt).sum();
            for e in 0..len {
                let err = (out[e] as f64 - exact[i][e] as f64).abs();
                let tol = 2.0 * bound * weight + 4.0 * (exact[i][e].abs() as f64 + 1.0) * 2f64.powi(-23);
                prop_assert!(err <= tol, "worker {} element {}: {} vs exact {} (err {} > {})", i, e, out[e], exact[i][e], err, tol);
            }
        }
    });
}

/// Theorem 1's problem (Moniqua, section 3): `f(x) = (x − δ/2)²/2` per coordinate, whose
/// minimum lies halfway between the points `{δn}` of an unbiased linear quantiser `Q_δ`, on a
/// ring of four (`W` ⅓ everywhere it is not 0, so `φ = ⅓`), the workers starting apart, the
/// exact gradient and a step size decaying to 0. The direct scheme of equation 4 (each
/// worker's own exact model, its neighbours' quantised: `exchange = "gossip_direct"`'s
/// average, [`average_step`] with `x̂_i = x_i`) keeps `E|∇f|²` above the theorem's floor
/// `φ²δ²/(8(1+φ²))` however small the step; Moniqua's messages (the `moniqua` codec at 2 bits,
/// θ = 5 × the step size, Theorem 2's θ ∝ α) and exact ones go below it. Returns the mean of
/// `|∇f|²` over coordinates, workers and the last 200 of `steps` steps, for each scheme.
fn theorem1(seed: u64, steps: u64) -> (f64, f64, f64) {
    const N: usize = 4;
    const D: usize = 1000;
    const DELTA: f64 = 0.1;
    let w = Mixing::ring(N);
    let mut rng = TestRng::new(seed);
    // Every scheme starts from the same models, each worker's its own (within ±0.5).
    let start: Vec<Vec<f32>> = (0..N)
        .map(|_| (0..D).map(|_| (rng.unit() - 0.5) as f32).collect())
        .collect();
    // Q_δ: x rounded to a multiple of δ, up with probability its fraction (unbiased).
    let mut quantise = |x: &[f32]| -> Vec<f32> {
        x.iter()
            .map(|&v| {
                let t = v as f64 / DELTA;
                let lo = t.floor();
                ((lo + f64::from(rng.unit() < t - lo)) * DELTA) as f32
            })
            .collect()
    };
    let kv = [
        ("compressor", "moniqua"),
        ("theta", "5"),
        ("bits", "2"),
        ("theta_schedule", "lr"),
    ];
    let mut codecs: Vec<_> = (0..N).map(|_| build(&kv, D)).collect();
    let grad2 = |x: &[f32]| {
        x.iter()
            .map(|&v| (v as f64 - DELTA / 2.0).powi(2))
            .sum::<f64>()
    };
    let mut xs = [start.clone(), start.clone(), start];
    let mut tail = [0.0f64; 3];
    for k in 0..steps {
        let lr = 0.5 / (1.0 + k as f64 / 20.0);
        // Equation 4: W_ii x_i + Σ_j W_ij Q(x_j).
        let q: Vec<Vec<f32>> = xs[0].iter().map(|x| quantise(x)).collect();
        // Moniqua: every worker's message decoded against the receiver's own model.
        let ctx = RoundCtx {
            lr: Some(lr as f32),
            ..RoundCtx::new(k)
        };
        let payloads: Vec<Vec<u8>> = (0..N)
            .map(|i| {
                let mut out = Vec::new();
                codecs[i].compress(&xs[1][i], &ctx, &mut out).unwrap();
                out
            })
            .collect();
        let mut next = xs.clone();
        for i in 0..N {
            let step = |out: &mut Vec<f32>, x: &[f32], own: &[f32], theirs: &[(f64, Vec<f32>)]| {
                let nb: Vec<(f64, &[f32])> =
                    theirs.iter().map(|(wt, v)| (*wt, v.as_slice())).collect();
                average_step(x, own, &nb, out);
                for (o, &v) in out.iter_mut().zip(x) {
                    *o -= (lr * (v as f64 - DELTA / 2.0)) as f32;
                }
            };
            let direct: Vec<(f64, Vec<f32>)> = w
                .neighbours(i)
                .into_iter()
                .map(|(j, wt)| (wt, q[j].clone()))
                .collect();
            step(&mut next[0][i], &xs[0][i], &xs[0][i], &direct);
            let recover = |j: usize| {
                let mut v = vec![0f32; D];
                let at = RoundCtx {
                    lr: Some(lr as f32),
                    ..RoundCtx::new(k)
                }
                .with_reference(&xs[1][i]);
                codecs[i].decompress(&payloads[j], &at, &mut v).unwrap();
                v
            };
            let moniqua: Vec<(f64, Vec<f32>)> = w
                .neighbours(i)
                .into_iter()
                .map(|(j, wt)| (wt, recover(j)))
                .collect();
            step(&mut next[1][i], &xs[1][i], &recover(i), &moniqua);
            let exact: Vec<(f64, Vec<f32>)> = w
                .neighbours(i)
                .into_iter()
                .map(|(j, wt)| (wt, xs[2][j].clone()))
                .collect();
            step(&mut next[2][i], &xs[2][i], &xs[2][i], &exact);
        }
        xs = next;
        if k >= steps - 200 {
            for (t, x) in tail.iter_mut().zip(&xs) {
                *t += x.iter().map(|m| grad2(m)).sum::<f64>() / (200 * N * D) as f64;
            }
        }
    }
    (tail[0], tail[1], tail[2])
}

#[test]
fn equation_4_stalls_at_theorem_1s_floor_where_moniqua_converges() {
    let seed = seed("equation_4_stalls_at_theorem_1s_floor");
    let phi = 1.0f64 / 3.0;
    let floor = phi * phi * 0.1f64.powi(2) / (8.0 * (1.0 + phi * phi));
    let mut last = Vec::new();
    for steps in [1200, 4800] {
        let (direct, moniqua, exact) = theorem1(seed, steps);
        println!(
            "{steps} steps: E|∇f|² per coordinate: equation 4 {direct:.3e}, Moniqua {moniqua:.3e}, \
             exact {exact:.3e}; Theorem 1's floor {floor:.3e}"
        );
        assert!(
            direct >= floor,
            "equation 4 went below Theorem 1's floor: {direct:e} < {floor:e}"
        );
        assert!(
            moniqua < floor,
            "Moniqua is not below the floor: {moniqua:e}"
        );
        assert!(exact < 1e-10, "exact averaging did not converge: {exact:e}");
        last.push((direct, moniqua));
    }
    // Four times the steps: Moniqua's error shrinks with the step size (θ ∝ α), equation 4's
    // does not.
    assert!(last[1].1 < last[0].1 / 2.0, "Moniqua stalled: {last:?}");
    assert!(
        last[1].0 > last[0].0 / 2.0,
        "equation 4 did not stall: {last:?}"
    );
}
