//! `powersgd`: its map, its plan (which tensors it compresses, torch's `_should_compress`), and
//! its steps against a plain f64 reimplementation of torch's hook and against the
//! mathematical properties of the method (fresh random inputs, seeds printed).

mod common;

use common::{map, seed, TestRng};
use pushpull_codecs::rng::Stream;
use pushpull_codecs::{
    parse_params, PowerSgd, PowerSgdLayout, PowerSgdPart, PowerSgdPlan, PowerSgdShape, PowerSgdSpec,
};

fn spec(kv: &[(&str, &str)]) -> PowerSgdSpec {
    let mut all = vec![("compressor", "powersgd")];
    all.extend_from_slice(kv);
    let s = parse_params(&map(&all)).unwrap_or_else(|e| panic!("{kv:?}: {e}"));
    s.codec
        .downcast::<PowerSgdSpec>()
        .expect("a powersgd spec")
        .clone()
}

fn refused(kv: &[(&str, &str)]) -> String {
    let mut all = vec![("compressor", "powersgd")];
    all.extend_from_slice(kv);
    parse_params(&map(&all)).unwrap_err().to_string()
}

#[test]
fn the_map_takes_torchs_names_and_defaults_and_refuses_what_powersgd_implies() {
    let s = spec(&[("rows", "8")]);
    assert_eq!(
        (s.rank, s.start_iter, s.min_compression_rate, s.warm_start),
        (1, 1000, 2.0, true)
    );
    assert!(s.use_error_feedback);
    assert_eq!(s.orthogonalization_epsilon, 0.0);
    let s = spec(&[
        ("rows", "8"),
        ("matrix_approximation_rank", "4"),
        ("start_powerSGD_iter", "10"),
        ("warm_start", "false"),
    ]);
    assert_eq!((s.rank, s.start_iter, s.warm_start), (4, 10, false));
    let canonical = parse_params(&map(&[
        ("compressor", "powersgd"),
        ("rows", "8"),
        ("rank", "4"),
    ]))
    .unwrap();
    assert_eq!(
        parse_params(&canonical.to_params()).unwrap(),
        canonical,
        "the canonical map parses to the same spec"
    );

    let e = refused(&[]);
    assert!(
        e.contains("\"rows\"")
            && e.contains("shape[0]")
            && e.contains("pieces")
            && !e.contains("  "),
        "{e}"
    );
    for (k, v, why) in [
        ("ef", "vanilla", "its own error feedback"),
        ("byteps_ef_type", "vanilla", "its own error feedback"),
        ("momentum", "nesterov", "optimizer"),
        ("intra_compressor", "fp16", "float32"),
        ("exchange", "gossip", "servers"),
        ("rank", "0", "1..="),
        ("min_compression_rate", "-1", "> 0"),
        ("orthogonalization_epsilon", "nan", ">= 0"),
        ("warm_start", "yes", "true or false"),
    ] {
        let e = refused(&[("rows", "8"), (k, v)]);
        assert!(e.contains(k) && e.contains(why), "{k}={v}: {e}");
    }
    // The chain's keys at their "off" values are not refused.
    spec(&[("rows", "8"), ("ef", "none"), ("momentum", "none")]);
}

#[test]
fn the_plan_follows_torchs_should_compress_and_refuses_an_impossible_rank() {
    let s = |rows: &str, rank: &str| spec(&[("rows", rows), ("rank", rank)]);
    let low = |rows, cols, rank| {
        PowerSgdPlan::LowRank(PowerSgdLayout::matrix(PowerSgdShape { rows, cols, rank }))
    };
    // A vector (a bias: rows = len, or one row) is never compressed, whatever the rank.
    assert_eq!(s("1000", "4").plan(1000).unwrap(), PowerSgdPlan::Plain);
    assert_eq!(s("1", "4").plan(1000).unwrap(), PowerSgdPlan::Plain);
    assert_eq!(s("7", "1").plan(0).unwrap(), PowerSgdPlan::Plain);
    // 64 × 64 at rank r: 4096 > 2·128·r for r < 16.
    assert_eq!(s("64", "15").plan(4096).unwrap(), low(64, 64, 15));
    assert_eq!(s("64", "16").plan(4096).unwrap(), PowerSgdPlan::Plain);
    // A conv weight 16 × (3·3·3).
    assert_eq!(s("16", "1").plan(432).unwrap(), low(16, 27, 1));
    // 432 > 2·43·5 = 430, but not 2·43·6.
    assert_eq!(s("16", "5").plan(432).unwrap(), low(16, 27, 5));
    assert_eq!(s("16", "6").plan(432).unwrap(), PowerSgdPlan::Plain);
    // The rate is a setting.
    let r = spec(&[
        ("rows", "64"),
        ("rank", "15"),
        ("min_compression_rate", "3"),
    ]);
    assert_eq!(r.plan(4096).unwrap(), PowerSgdPlan::Plain);
    let e = s("16", "17").plan(432).unwrap_err().to_string();
    assert!(
        e.contains("\"rank\"") && e.contains("16 × 27") && e.contains("at most 16"),
        "{e}"
    );
    let e = s("10", "1").plan(432).unwrap_err().to_string();
    assert!(e.contains("\"rows\"") && e.contains("432"), "{e}");
}

/// The starting Q a step draws, reimplemented from the module docs: four 16-bit uniforms of
/// one draw, centred, times √3.
fn start_q(seed: u64, key: u64, step: u64, n: usize) -> Vec<f64> {
    let s = Stream::low_rank(seed, key, step);
    (0..n as u64)
        .map(|t| {
            let d = s.draw(t);
            let u: f32 = (0..4)
                .map(|l| ((d >> (16 * l)) as u16) as f32 / 65536.0)
                .sum();
            f64::from((u - 2.0) * 3f32.sqrt())
        })
        .collect()
}

/// Classical Gram-Schmidt in f64 (the textbook form, not the crate's).
fn gram_schmidt(a: &mut [f64], rank: usize) {
    let rows = a.len() / rank;
    for c in 0..rank {
        for prev in 0..c {
            let dot: f64 = (0..rows)
                .map(|i| a[i * rank + c] * a[i * rank + prev])
                .sum();
            for i in 0..rows {
                a[i * rank + c] -= dot * a[i * rank + prev];
            }
        }
        let norm = (0..rows)
            .map(|i| a[i * rank + c].powi(2))
            .sum::<f64>()
            .sqrt();
        for i in 0..rows {
            a[i * rank + c] /= norm;
        }
    }
}

/// One step of torch's hook for every worker, in f64: the average and each worker's new error.
fn reference_step(
    ms: &[Vec<f64>],
    q: &[f64],
    shape: PowerSgdShape,
) -> (Vec<f64>, Vec<Vec<f64>>, Vec<f64>) {
    let PowerSgdShape { rows, cols, rank } = shape;
    let mut q = q.to_vec();
    gram_schmidt(&mut q, rank);
    let mut p = vec![0.0; rows * rank];
    for m in ms {
        for i in 0..rows {
            for k in 0..rank {
                p[i * rank + k] += (0..cols)
                    .map(|j| m[i * cols + j] * q[j * rank + k])
                    .sum::<f64>();
            }
        }
    }
    gram_schmidt(&mut p, rank);
    let mut qs = vec![0.0; cols * rank];
    for m in ms {
        for j in 0..cols {
            for k in 0..rank {
                qs[j * rank + k] += (0..rows)
                    .map(|i| m[i * cols + j] * p[i * rank + k])
                    .sum::<f64>();
            }
        }
    }
    let w = ms.len() as f64;
    let q_avg: Vec<f64> = qs.iter().map(|x| x / w).collect();
    let out: Vec<f64> = (0..rows * cols)
        .map(|t| {
            let (i, j) = (t / cols, t % cols);
            (0..rank)
                .map(|k| p[i * rank + k] * q_avg[j * rank + k])
                .sum()
        })
        .collect();
    let errors = ms
        .iter()
        .map(|m| m.iter().zip(&out).map(|(a, b)| a - b).collect())
        .collect();
    (out, errors, q_avg)
}

/// One step of `workers` through [`PowerSgd`], the sums in rank order in f32 as the servers
/// add them.
fn step(workers: &mut [PowerSgd], grads: &[Vec<f32>], average: bool) -> Vec<Vec<f32>> {
    let ps: Vec<Vec<f32>> = workers
        .iter_mut()
        .zip(grads)
        .map(|(w, g)| w.begin(g))
        .collect();
    let sum = |v: &[Vec<f32>]| {
        let mut s = vec![0.0f32; v[0].len()];
        for x in v {
            for (a, b) in s.iter_mut().zip(x) {
                *a += b;
            }
        }
        s
    };
    let p_sum = sum(&ps);
    let qs: Vec<Vec<f32>> = workers.iter_mut().map(|w| w.middle(&p_sum)).collect();
    let q_sum = sum(&qs);
    let n = workers.len() as u32;
    workers
        .iter_mut()
        .map(|w| {
            let mut out = vec![0.0f32; grads[0].len()];
            w.finish(&q_sum, n, average, &mut out);
            out
        })
        .collect()
}

fn max_diff(a: &[f32], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - y).abs())
        .fold(0.0, f64::max)
}

fn new_workers(s: PowerSgdSpec, shape: PowerSgdShape, n: usize) -> Vec<PowerSgd> {
    let layout = PowerSgdLayout::matrix(shape);
    (0..n)
        .map(|_| PowerSgd::new(s.clone(), layout.clone(), 99, 7))
        .collect()
}

#[test]
fn steps_match_a_plain_f64_reimplementation_of_torchs_hook() {
    let mut rng = TestRng::new(seed(
        "steps_match_a_plain_f64_reimplementation_of_torchs_hook",
    ));
    for (rows, cols, rank, warm) in [(37, 150, 1, true), (130, 70, 4, true), (65, 66, 3, false)] {
        let shape = PowerSgdShape { rows, cols, rank };
        let s = spec(&[
            ("rows", &rows.to_string()),
            ("rank", &rank.to_string()),
            ("start_iter", "0"),
            ("warm_start", if warm { "true" } else { "false" }),
        ]);
        let mut workers = new_workers(s, shape, 3);
        let mut errors = vec![vec![0.0f64; rows * cols]; 3];
        let mut q_prev: Option<Vec<f64>> = None;
        for t in 0..3u64 {
            let grads: Vec<Vec<f32>> = (0..3).map(|_| rng.gradient(rows * cols, 1.0)).collect();
            let ms: Vec<Vec<f64>> = grads
                .iter()
                .zip(&errors)
                .map(|(g, e)| g.iter().zip(e).map(|(&a, b)| f64::from(a) + b).collect())
                .collect();
            let q0 = match (&q_prev, warm) {
                (Some(q), true) => q.clone(),
                _ => start_q(99, 7, t, cols * rank),
            };
            let (want, errs, q_avg) = reference_step(&ms, &q0, shape);
            let got = step(&mut workers, &grads, true);
            let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
            for (w, out) in got.iter().enumerate() {
                let d = max_diff(out, &want);
                assert!(
                    d <= 1e-4 * scale,
                    "{rows}×{cols} rank {rank}, step {t}, worker {w}: off by {d} (scale {scale})"
                );
                assert_eq!(out, &got[0], "every worker gets the same bits");
            }
            for (w, e) in errs.iter().enumerate() {
                let mine = &workers[w].saved().error;
                let d = max_diff(mine, e);
                assert!(
                    d <= 1e-4 * scale,
                    "error of worker {w}, step {t}: off by {d}"
                );
            }
            // Carry the reference's state on from the crate's (f32) state, so steps do not drift.
            errors = workers
                .iter()
                .map(|w| w.saved().error.iter().map(|&x| f64::from(x)).collect())
                .collect();
            q_prev = Some(workers[0].saved().q.iter().map(|&x| f64::from(x)).collect());
            if warm {
                let d = max_diff(&workers[0].saved().q, &q_avg);
                assert!(d <= 1e-4 * q_avg.iter().fold(1.0f64, |m, x| m.max(x.abs())));
            }
        }
    }
}

#[test]
fn at_full_rank_one_worker_gets_its_gradient_back_and_errors_telescope() {
    let mut rng = TestRng::new(seed("at_full_rank_one_worker_gets_its_gradient_back"));
    // Full rank: P̂ spans M's columns, so P̂·(MᵀP̂)ᵀ = M.
    let shape = PowerSgdShape {
        rows: 12,
        cols: 40,
        rank: 12,
    };
    let s = spec(&[
        ("rows", "12"),
        ("rank", "12"),
        ("start_iter", "0"),
        ("min_compression_rate", "0.1"),
    ]);
    assert_eq!(
        s.plan(480).unwrap(),
        PowerSgdPlan::LowRank(PowerSgdLayout::matrix(shape))
    );
    let mut w = new_workers(s, shape, 1);
    let g = rng.gradient(480, 1.0);
    let out = &step(&mut w, std::slice::from_ref(&g), true)[0];
    let want: Vec<f64> = g.iter().map(|&x| f64::from(x)).collect();
    // Within float32 rounding of the largest value (the data has outliers of 30 σ), times the
    // condition of the 12 × 12 P that Gram-Schmidt orthogonalises.
    let scale = want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    let d = max_diff(out, &want);
    assert!(d < 1e-4 * scale, "{d} (scale {scale})");

    // Rank 1 of a 30 × 50 matrix: the outputs of T steps plus the last error add up to the
    // gradients (out_t = g_t + e_t − e_{t+1}).
    let shape = PowerSgdShape {
        rows: 30,
        cols: 50,
        rank: 1,
    };
    let s = spec(&[("rows", "30"), ("start_iter", "0")]);
    let mut w = new_workers(s, shape, 1);
    let mut total_in = vec![0.0f64; 1500];
    let mut total_out = vec![0.0f64; 1500];
    for _ in 0..20 {
        let g = rng.gradient(1500, 1.0);
        let out = &step(&mut w, std::slice::from_ref(&g), true)[0];
        for i in 0..1500 {
            total_in[i] += f64::from(g[i]);
            total_out[i] += f64::from(out[i]);
        }
    }
    let e = &w[0].saved().error;
    let d = (0..1500)
        .map(|i| (total_out[i] + f64::from(e[i]) - total_in[i]).abs())
        .fold(0.0, f64::max);
    assert!(d < 1e-3, "the error feedback lost {d}");
}

#[test]
fn a_low_rank_matrix_is_recovered_by_warm_started_power_iteration() {
    let mut rng = TestRng::new(seed("a_low_rank_matrix_is_recovered"));
    // M = a·bᵀ + c·dᵀ, rank 2; the same M every step, no error feedback: warm-started power
    // iteration converges to it.
    let (rows, cols) = (40, 60);
    let v = |rng: &mut TestRng, n| (0..n).map(|_| rng.normal()).collect::<Vec<f64>>();
    let (a, b, c, d) = (
        v(&mut rng, rows),
        v(&mut rng, cols),
        v(&mut rng, rows),
        v(&mut rng, cols),
    );
    let m: Vec<f32> = (0..rows * cols)
        .map(|t| (a[t / cols] * b[t % cols] + 0.5 * c[t / cols] * d[t % cols]) as f32)
        .collect();
    let s = spec(&[
        ("rows", "40"),
        ("rank", "2"),
        ("start_iter", "0"),
        ("use_error_feedback", "false"),
    ]);
    let mut w = new_workers(
        s,
        PowerSgdShape {
            rows,
            cols,
            rank: 2,
        },
        2,
    );
    let half: Vec<f32> = m.iter().map(|x| x / 2.0).collect();
    let mut out = Vec::new();
    for _ in 0..30 {
        out = step(&mut w, &[half.clone(), half.clone()], false).remove(0);
    }
    let want: Vec<f64> = m.iter().map(|&x| f64::from(x)).collect();
    let scale = want.iter().fold(0.0f64, |s, x| s.max(x.abs()));
    assert!(
        max_diff(&out, &want) < 1e-4 * scale,
        "{}",
        max_diff(&out, &want)
    );
    assert!(
        w[0].saved().error.is_empty(),
        "no error kept without error feedback"
    );
}

#[test]
fn a_discarded_step_is_undone_and_a_non_finite_one_changes_nothing_but_the_count() {
    let mut rng = TestRng::new(seed("a_discarded_step_is_undone"));
    let shape = PowerSgdShape {
        rows: 20,
        cols: 30,
        rank: 2,
    };
    let s = spec(&[("rows", "20"), ("rank", "2"), ("start_iter", "1")]);
    let mut w = new_workers(s.clone(), shape, 2);
    assert!(!w[0].compressing());
    for x in w.iter_mut() {
        x.plain_step();
    }
    assert!(w[0].compressing());
    let g: Vec<Vec<f32>> = (0..2).map(|_| rng.gradient(600, 1.0)).collect();
    step(&mut w, &g, true);
    let kept = w.clone();
    let h: Vec<Vec<f32>> = (0..2).map(|_| rng.gradient(600, 1.0)).collect();
    let first = step(&mut w, &h, true);
    for x in w.iter_mut() {
        x.discard();
    }
    assert_eq!(
        w[0].saved(),
        kept[0].saved(),
        "the discard restored the state"
    );
    assert_eq!(
        step(&mut w, &h, true),
        first,
        "and the step again gives the same bits"
    );

    // A gradient with a NaN: every worker gets NaN, and the state is the one before but for
    // the step count.
    let before = w.clone();
    let mut bad = h.clone();
    bad[1][3] = f32::NAN;
    let out = step(&mut w, &bad, true);
    assert!(out.iter().all(|o| o.iter().all(|x| x.is_nan())));
    assert_eq!(w[0].saved().error, before[0].saved().error);
    assert_eq!(w[0].saved().q, before[0].saved().q);
    assert_eq!(w[0].saved().step, before[0].saved().step + 1);
    // The state restores from what a checkpoint keeps.
    let mut r = new_workers(s, shape, 1).remove(0);
    r.restore(w[0].saved().clone()).unwrap();
    assert_eq!(r.saved(), w[0].saved());
    let mut wrong = w[0].saved().clone();
    wrong.q.pop();
    assert!(r.restore(wrong).unwrap_err().contains("Q"));
}

#[test]
fn pieces_lay_out_a_bucket_as_torchs_hook_takes_it() {
    let s = spec(&[("pieces", "16x27, 27,64x64,2x768,0"), ("rank", "4")]);
    let plan = s.plan(432 + 27 + 4096 + 1536).unwrap();
    let shape = |rows, cols, rank| PowerSgdPart::Matrix(PowerSgdShape { rows, cols, rank });
    let PowerSgdPlan::LowRank(layout) = plan else {
        panic!("{plan:?}")
    };
    // The 2 × 768 matrix takes rank min(4, 2) = 2, below the rate: summed as it is.
    assert_eq!(
        layout.parts(),
        [
            shape(16, 27, 4),
            PowerSgdPart::Plain(27),
            shape(64, 64, 4),
            PowerSgdPart::Plain(1536),
            PowerSgdPart::Plain(0),
        ]
    );
    assert_eq!(layout.p_len(), 16 * 4 + 27 + 64 * 4 + 1536);
    assert_eq!(layout.q_len(), 27 * 4 + 64 * 4);
    // Vectors and small matrices only: every step a plain sum.
    let s = spec(&[("pieces", "100,2x3"), ("rank", "1")]);
    assert_eq!(s.plan(106).unwrap(), PowerSgdPlan::Plain);
    // The canonical map round-trips.
    let canonical = parse_params(&map(&[("compressor", "powersgd"), ("pieces", "3x4,5")])).unwrap();
    assert_eq!(parse_params(&canonical.to_params()).unwrap(), canonical);
    assert_eq!(canonical.to_params()["pieces"], "3x4,5");

    let e = spec(&[("pieces", "3x4,5")])
        .plan(18)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"pieces\"") && e.contains("17") && e.contains("18"),
        "{e}"
    );
    for (v, why) in [
        ("3x4,x5", "piece 1"),
        ("3x4,,5", "piece 1"),
        ("-1", "piece 0"),
    ] {
        let e = refused(&[("pieces", v)]);
        assert!(e.contains("pieces") && e.contains(why), "{v}: {e}");
    }
    let e = refused(&[("pieces", "3x4"), ("rows", "3")]);
    assert!(
        e.contains("\"pieces\"") && e.contains("rows is given too") && !e.contains("  "),
        "{e}"
    );
}

#[test]
fn a_bucket_steps_each_matrix_as_torchs_hook_and_sums_the_rest() {
    let mut rng = TestRng::new(seed(
        "a_bucket_steps_each_matrix_as_torchs_hook_and_sums_the_rest",
    ));
    // Two matrices at rank 4, a vector and a 5 × 3 matrix at rank 3 (below the rate) between.
    let s = spec(&[
        ("pieces", "37x150,150,130x70,5x3"),
        ("rank", "4"),
        ("start_iter", "0"),
    ]);
    let PowerSgdPlan::LowRank(layout) = s.plan(5550 + 150 + 9100 + 15).unwrap() else {
        panic!("not low-rank")
    };
    let len = layout.len();
    let mut workers: Vec<PowerSgd> = (0..3)
        .map(|_| PowerSgd::new(s.clone(), layout.clone(), 99, 7))
        .collect();
    let mut errors = vec![vec![0.0f64; len]; 3];
    let mut q_prev: Option<Vec<f64>> = None;
    for t in 0..3u64 {
        let grads: Vec<Vec<f32>> = (0..3).map(|_| rng.gradient(len, 1.0)).collect();
        let got = step(&mut workers, &grads, true);
        let q0 = q_prev
            .clone()
            .unwrap_or_else(|| start_q(99, 7, t, layout.q_len()));
        let (mut at, mut q_at) = (0, 0);
        for part in layout.parts() {
            let n = part.tensor_len();
            let here = at..at + n;
            match *part {
                PowerSgdPart::Plain(_) => {
                    // Summed in rank order in float32, divided by the workers.
                    for i in here.clone() {
                        let want = (grads[0][i] + grads[1][i] + grads[2][i]) / 3.0;
                        assert_eq!(got[0][i].to_bits(), want.to_bits(), "step {t}, element {i}");
                    }
                    assert!(workers[0].saved().error[here].iter().all(|&e| e == 0.0));
                }
                PowerSgdPart::Matrix(shape) => {
                    let ms: Vec<Vec<f64>> = (0..3)
                        .map(|w| {
                            here.clone()
                                .map(|i| f64::from(grads[w][i]) + errors[w][i])
                                .collect()
                        })
                        .collect();
                    let q = &q0[q_at..q_at + shape.q_len()];
                    let (want, errs, _) = reference_step(&ms, q, shape);
                    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                    let d = max_diff(&got[0][here.clone()], &want);
                    assert!(d <= 1e-4 * scale, "{shape:?}, step {t}: off by {d}");
                    let d = max_diff(&workers[1].saved().error[here], &errs[1]);
                    assert!(d <= 1e-4 * scale, "{shape:?}, step {t}: error off by {d}");
                    q_at += shape.q_len();
                }
            }
            at += n;
        }
        assert!(
            got.iter().all(|o| o == &got[0]),
            "every worker gets the same bits"
        );
        errors = workers
            .iter()
            .map(|w| w.saved().error.iter().map(|&x| f64::from(x)).collect())
            .collect();
        q_prev = Some(workers[0].saved().q.iter().map(|&x| f64::from(x)).collect());
    }
}
