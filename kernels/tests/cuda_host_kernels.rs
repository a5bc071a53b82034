//! The CUDA kernels compiled for the host (kernels/cuda/host_shim.cpp, built by build.rs): the
//! serial emulation of every kernel launch sequence against the CPU compressors of the
//! registry, bit for bit: compressed bytes, decompress and decompress_add, for many chunk
//! lengths, on fresh random inputs (the seed is printed; set `PUSHPULL_TEST_SEED` to replay a
//! run). The element functions are compared one by one in `cuda_host.rs`.
//!
//! Runs everywhere (no GPU, no CUDA toolkit needed).

mod cuda_common;

use cuda_common::*;
use pushpull_kernels::cuda::host;
use pushpull_kernels::cuda::{GpuScheme, RoundStreams};
use pushpull_kernels::rng::Role;
use pushpull_kernels::{parse_params, NodeIdentity, RoundCtx};

/// One whole-chunk trial: a configuration, a role, a round and an input.
struct Trial {
    what: String,
    scheme: GpuScheme,
    params: std::collections::BTreeMap<String, String>,
    who: NodeIdentity,
    round: u64,
    streams: RoundStreams,
    x: Vec<f32>,
    acc: Vec<f32>,
}

/// Every configuration of `cases` for every length of `LENGTHS` (and a random one), twice, on
/// workers and servers, with fresh inputs.
fn trials(r: &mut Rng) -> Vec<Trial> {
    let mut lengths = LENGTHS.to_vec();
    lengths.push(1 + r.below(6000) as usize);
    trials_of(r, &lengths, |_| true)
}

/// Chunks whose single bucket the GPU reduces with a CUDA block per bucket (more than 256
/// reduction blocks, or more than 256 min/max spans): onebit's mean, and the unbucketed
/// min/max and dithering norms, at lengths past each threshold (one of them random).
fn wide_trials(r: &mut Rng) -> Vec<Trial> {
    let lengths = [256 * 256 + 1, 256 * 2048 + 1 + r.below(100_000) as usize];
    trials_of(r, &lengths, |s| match s {
        GpuScheme::OneBit { scaling } => *scaling,
        GpuScheme::MinMax { bucket, .. } | GpuScheme::Dithering { bucket, .. } => bucket.is_none(),
        _ => false,
    })
}

/// The trials of the `cases` that `keep` accepts, for each length.
fn trials_of(r: &mut Rng, lengths: &[usize], keep: impl Fn(&GpuScheme) -> bool) -> Vec<Trial> {
    let mut v = Vec::new();
    for &n in lengths {
        for case in cases(r, n).into_iter().filter(|c| keep(&c.scheme)) {
            for t in 0..2 {
                let round = Round::random(r);
                let role = if t == 1 && r.bool() {
                    Role::Server
                } else {
                    Role::Worker
                };
                let who = NodeIdentity {
                    role,
                    ..round.who()
                };
                let streams =
                    RoundStreams::new(round.job_seed, round.key, round.round, role, round.rank);
                let spec = parse_params(&case.params).unwrap();
                let scheme = GpuScheme::from_spec(&spec, n, None, role)
                    .unwrap()
                    .unwrap_or_else(|| panic!("{:?}: from_spec found no GPU scheme", case.params));
                let want_scheme = match case.scheme {
                    GpuScheme::RandomK { k, unbiased } => GpuScheme::RandomK {
                        k,
                        unbiased: unbiased && role == Role::Worker,
                    },
                    s => s,
                };
                assert_eq!(scheme, want_scheme, "{:?}: from_spec", case.params);
                v.push(Trial {
                    what: format!("{:?} n = {n} ({role:?})", case.params),
                    scheme,
                    params: case.params.clone(),
                    who,
                    round: round.round,
                    streams,
                    x: input(r, n),
                    acc: (0..n).map(|_| r.mixed()).collect(),
                });
            }
        }
    }
    v
}

/// The emulated kernels against the documented format (a serial reference written from
/// `elem` and `rng`): same bytes, same refusals, same decoded values.
#[test]
fn emulated_kernels_match_the_reference() {
    let mut r = Rng::new(seed("emulated_kernels_match_the_reference"));
    let (compared, refused) = against_reference(trials(&mut r));
    println!("{compared} chunks identical, {refused} refused by both");
    assert!(compared > 300, "too few comparisons: {compared}");
}

/// Buckets wide enough for the GPU's block-per-bucket reductions (two-level f64 sums, min/max
/// trees): the emulation against the reference and the CPU compressors.
#[test]
fn wide_buckets_match_the_reference_and_the_cpu() {
    let mut r = Rng::new(seed("wide_buckets_match_the_reference_and_the_cpu"));
    // Random chunks may overflow a scheme (both refuse them): those count as checked, but
    // most trials must compress.
    let (compared, refused) = against_reference(wide_trials(&mut r));
    assert!(
        compared >= 8 && compared + refused >= 12,
        "too few comparisons: {compared} compared, {refused} refused by both"
    );
    let trials = wide_trials(&mut r);
    let n = trials.len();
    let compared = against_cpu(trials);
    assert!(
        compared >= 8 && 3 * compared >= 2 * n,
        "too few comparisons: {compared} of {n} trials"
    );
}

/// Checks every trial's emulated compress, decompress and decompress_add against the reference;
/// returns how many were compared and how many both refused.
fn against_reference(trials: Vec<Trial>) -> (usize, usize) {
    let (mut compared, mut refused) = (0, 0);
    for t in trials {
        let what = &t.what;
        let want = reference_compress(&t.scheme, &t.x, t.streams);
        let mut got = Vec::new();
        let res = host::compress(&t.scheme, &t.x, t.streams, &mut got);
        let want = match (want, res) {
            (None, Err(_)) => {
                refused += 1;
                continue;
            }
            (Some(w), Ok(())) => w,
            (w, res) => panic!(
                "{what}: reference {} but emulated kernels {res:?}",
                if w.is_some() { "compresses" } else { "refuses" }
            ),
        };
        assert_same_bytes(&format!("{what}: compress"), &got, &want);
        let n = t.x.len();
        let dec = reference_decompress(&t.scheme, &got, n, t.streams);
        let mut out = vec![f32::NAN; n];
        host::decompress(&t.scheme, &got, t.streams, &mut out).unwrap();
        assert_same_bits(&format!("{what}: decompress"), &out, &dec);
        let mut acc = t.acc.clone();
        host::decompress_add(&t.scheme, &got, t.streams, &mut acc).unwrap();
        let sum: Vec<f32> = t.acc.iter().zip(&dec).map(|(a, d)| a + d).collect();
        assert_same_bits(&format!("{what}: decompress_add"), &acc, &sum);
        compared += 1;
    }
    (compared, refused)
}

/// The emulated kernels against the CPU compressors of the registry
/// (`build_compressor` + `Compressor::compress/decompress/decompress_add`): same bytes, same
/// refusals, same decoded values. Every mismatch is listed (with whether the CPU or the
/// emulation agrees with the reference) before the test fails.
#[test]
fn cpu_compressors_match_the_emulated_kernels() {
    let mut r = Rng::new(seed("cpu_compressors_match_the_emulated_kernels"));
    let compared = against_cpu(trials(&mut r));
    println!("{compared} chunks identical on the CPU and in the emulated kernels");
    assert!(compared > 300, "too few comparisons: {compared}");
}

/// Checks every trial's emulated kernels against the CPU compressor; fails listing every
/// mismatch, else returns how many were compared.
fn against_cpu(trials: Vec<Trial>) -> usize {
    let mut mismatches: Vec<String> = Vec::new();
    let mut compared = 0;
    for t in trials {
        let what = &t.what;
        let n = t.x.len();
        let mut cpu = pushpull_kernels::build_compressor(&t.params, n, &t.who)
            .unwrap_or_else(|e| panic!("{what}: the registry refused: {e}"));
        assert_eq!(
            cpu.max_compressed_len(),
            t.scheme.compressed_len(n),
            "{what}: payload size"
        );
        let ctx = RoundCtx::new(t.round);
        let mut want = Vec::new();
        let cpu_res = cpu.compress(&t.x, &ctx, &mut want);
        let mut got = Vec::new();
        let emu_res = host::compress(&t.scheme, &t.x, t.streams, &mut got);
        match (&cpu_res, &emu_res) {
            (Ok(()), Ok(())) => {}
            (Err(_), Err(_)) => continue,
            _ => {
                mismatches.push(format!(
                    "{what}: CPU compress {cpu_res:?}, emulated kernels {emu_res:?}"
                ));
                continue;
            }
        }
        let reference = reference_compress(&t.scheme, &t.x, t.streams);
        if let Some(i) = (0..got.len().max(want.len())).find(|&i| got.get(i) != want.get(i)) {
            mismatches.push(format!(
                "{what}: compress differs from byte {i} of {} (CPU {} the reference, emulation {})",
                got.len(),
                if reference.as_deref() == Some(&want[..]) {
                    "matches"
                } else {
                    "differs from"
                },
                if reference.as_deref() == Some(&got[..]) {
                    "matches"
                } else {
                    "differs"
                },
            ));
            continue;
        }
        let mut d_cpu = vec![f32::NAN; n];
        if let Err(e) = cpu.decompress(&want, &ctx, &mut d_cpu) {
            mismatches.push(format!(
                "{what}: the CPU refuses to decompress its payload: {e}"
            ));
            continue;
        }
        let mut d_emu = vec![f32::NAN; n];
        host::decompress(&t.scheme, &got, t.streams, &mut d_emu).unwrap();
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        if let Some(i) = (0..n).find(|&i| d_cpu[i].to_bits() != d_emu[i].to_bits()) {
            mismatches.push(format!(
                "{what}: decompress element {i}: CPU {:e}, emulation {:e}",
                d_cpu[i], d_emu[i]
            ));
            continue;
        }
        let mut a_cpu = t.acc.clone();
        if let Err(e) = cpu.decompress_add(&want, &ctx, &mut a_cpu) {
            mismatches.push(format!("{what}: the CPU refuses to decompress_add: {e}"));
            continue;
        }
        let mut a_emu = t.acc.clone();
        host::decompress_add(&t.scheme, &got, t.streams, &mut a_emu).unwrap();
        if bits(&a_cpu) != bits(&a_emu) {
            let i = (0..n)
                .find(|&i| a_cpu[i].to_bits() != a_emu[i].to_bits())
                .unwrap();
            mismatches.push(format!(
                "{what}: decompress_add element {i}: CPU {:e}, emulation {:e} (acc {:e})",
                a_cpu[i], a_emu[i], t.acc[i]
            ));
            continue;
        }
        compared += 1;
    }
    assert!(
        mismatches.is_empty(),
        "{} mismatches between the CPU compressors and the emulated CUDA kernels:\n{}",
        mismatches.len(),
        mismatches
            .iter()
            .take(400)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    compared
}

/// The emulation refuses bad sizes instead of writing past buffers.
#[test]
fn emulation_rejects_wrong_sizes() {
    let scheme = GpuScheme::MinMax {
        bits: 4,
        bucket: Some(10),
    };
    let streams = RoundStreams::new(1, 2, 3, Role::Worker, 0);
    let x = vec![1.0f32; 25];
    let mut out = Vec::new();
    host::compress(&scheme, &x, streams, &mut out).unwrap();
    assert_eq!(out.len(), scheme.compressed_len(25));
    let mut dec = vec![0.0; 25];
    let err = host::decompress(&scheme, &out[..out.len() - 1], streams, &mut dec).unwrap_err();
    assert!(err.to_string().contains("expected"), "{err}");
    let bad = GpuScheme::MinMax {
        bits: 9,
        bucket: None,
    };
    assert!(host::compress(&bad, &x, streams, &mut out).is_err());
    let nan = vec![f32::NAN; 3];
    let err = host::compress(&GpuScheme::Fp16, &nan, streams, &mut out).unwrap_err();
    assert!(err.to_string().contains("element 0"), "{err}");
}
