//! Every instruction-set level the kernels are compiled for gives the same bits: each
//! compressor of the benchmark suite (plus momentum and corrected error feedback) compresses,
//! decompresses and decompress-adds fresh random inputs at the widest level this CPU has and at
//! every narrower one, for three rounds, and every payload, output and accumulator must agree
//! bit for bit. (A single test: the level cap is process-wide.)

mod common;
use common::*;

use pushpull_codecs::bench::{default_cases, BenchCase};
use pushpull_codecs::{
    build_from_spec, parse_params, set_max_simd_level, simd_level, BuildOptions, Compressor,
    NodeIdentity, Purpose, RoundCtx, SimdLevel,
};

/// Payloads, decompressed outputs and accumulators of `rounds` rounds of `case` on `x`.
fn run(
    case: &BenchCase,
    x: &[f32],
    acc0: &[f32],
    rounds: u64,
) -> Vec<(Vec<u8>, Vec<u32>, Vec<u32>)> {
    let spec = parse_params(&case.params).unwrap_or_else(|e| panic!("{}: {e}", case.label));
    let opts = BuildOptions {
        purpose: Purpose::ModelAveraging,
        ..BuildOptions::default()
    };
    let who = NodeIdentity::worker(7, 42, 1);
    let mut c: Compressor = build_from_spec(&spec, x.len(), &who, opts)
        .unwrap_or_else(|e| panic!("{}: {e}", case.label));
    let reference: Vec<f32> = x.iter().map(|v| v * 0.5 + 0.01).collect();
    let mut out = Vec::new();
    (0..rounds)
        .map(|round| {
            let ctx = RoundCtx::new(round)
                .with_reference(&reference)
                .with_lr(0.1 / (round + 1) as f32);
            c.compress(x, &ctx, &mut out)
                .unwrap_or_else(|e| panic!("{}: {e}", case.label));
            let mut y = vec![0.0f32; x.len()];
            c.decompress(&out, &ctx, &mut y).unwrap();
            let mut acc = acc0.to_vec();
            c.decompress_add(&out, &ctx, &mut acc).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
            (out.clone(), bits(&y), bits(&acc))
        })
        .collect()
}

#[test]
fn every_simd_level_gives_the_same_bits() {
    let seed = seed("every_simd_level_gives_the_same_bits");
    let mut rng = TestRng::new(seed);
    let widest = simd_level();
    let levels: Vec<SimdLevel> = [SimdLevel::Baseline, SimdLevel::Avx2, SimdLevel::Avx512]
        .into_iter()
        .filter(|&l| l < widest)
        .collect();
    eprintln!("widest level {widest:?}; also checked: {levels:?}");
    if levels.is_empty() {
        eprintln!("only the baseline level exists on this CPU: nothing to compare");
        return;
    }
    let mut cases = default_cases();
    cases.push(BenchCase::new(
        "corrected ef + nesterov + minmax",
        &[
            ("compressor", "minmax"),
            ("bits", "6"),
            ("ef", "corrected"),
            ("momentum", "nesterov"),
        ],
    ));
    for n in [1usize, 37, 4103, 50_001] {
        let x = rng.gradient(n, 1.0);
        let acc0 = rng.gradient(n, 0.3);
        for case in &cases {
            set_max_simd_level(widest);
            let want = run(case, &x, &acc0, 3);
            for &level in &levels {
                set_max_simd_level(level);
                let got = run(case, &x, &acc0, 3);
                for (round, (w, g)) in want.iter().zip(&got).enumerate() {
                    let what = format!(
                        "{}, n = {n}, round {round}, {level:?} against {widest:?} (seed {seed})",
                        case.label
                    );
                    assert!(w.0 == g.0, "payload differs: {what}");
                    assert!(w.1 == g.1, "decompressed output differs: {what}");
                    assert!(w.2 == g.2, "decompress_add accumulator differs: {what}");
                }
            }
        }
    }
    set_max_simd_level(widest);
}
