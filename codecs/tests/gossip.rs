//! Decentralised averaging (`pushpull_codecs::gossip`, Moniqua's Algorithm 1) as pure
//! functions: exact messages keep the workers' mean and contract the spread by the spectral
//! gap; Moniqua's messages (the `moniqua` codec, decoded against the receiver's own model)
//! stay within the recovery bound of the exact step.

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
