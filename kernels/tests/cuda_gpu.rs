//! The CUDA kernels on a real GPU against the CPU compressors (and the documented format), on
//! fresh random inputs: every fixed-width compressor, every direction.
//!
//! These tests need the `cuda` feature, a CUDA GPU with a 12.4+ driver and libnvrtc on
//! `LD_LIBRARY_PATH`, and are ignored by default:
//!
//! ```text
//! source .ci/nvrtc.sh    # NVRTC from PyPI, if the machine has no CUDA toolkit
//! cargo test -p pushpull-kernels --features cuda --test cuda_gpu -- --ignored
//! ```
//!
//! Run with `--ignored` on a machine without a GPU they fail, saying so, rather than pass.
#![cfg(feature = "cuda")]

mod cuda_common;

use std::sync::Arc;
use std::time::Instant;

use cuda_common::*;
use pushpull_kernels::cuda::{gpu_available, host, GpuCodec, GpuContext, GpuScheme, RoundStreams};
use pushpull_kernels::{build_compressor, NodeIdentity, Role, RoundCtx};

/// The GPU context, or a panic explaining what is missing.
fn gpu() -> Arc<GpuContext> {
    assert!(
        gpu_available(),
        "these tests need a CUDA GPU and none is usable here (no libcuda, no device, or cuInit \
         failed): run them on a GPU machine"
    );
    GpuContext::new(0).unwrap_or_else(|e| panic!("cannot open GPU 0: {e}"))
}

#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine"]
fn gpu_kernels_match_cpu_compressors() {
    let g = gpu();
    let mut r = Rng::new(seed("gpu_kernels_match_cpu_compressors"));
    let mut lengths = LENGTHS.to_vec();
    lengths.extend([65_537, 1 + r.below(300_000) as usize]);
    let mut mismatches: Vec<String> = Vec::new();
    let mut compared = 0usize;
    for &n in &lengths {
        for case in cases(&mut r, n) {
            let round = Round::random(&mut r);
            let role = if r.bool() { Role::Worker } else { Role::Server };
            let who = NodeIdentity {
                role,
                ..round.who()
            };
            let streams =
                RoundStreams::new(round.job_seed, round.key, round.round, role, round.rank);
            let spec = pushpull_kernels::parse_params(&case.params).unwrap();
            let scheme = GpuScheme::from_spec(&spec, n, None, role).unwrap().unwrap();
            let what = format!("{:?} n = {n} ({role:?})", case.params);
            let x = input(&mut r, n);
            let acc: Vec<f32> = (0..n).map(|_| r.mixed()).collect();

            let mut codec = GpuCodec::new(g.clone(), scheme, n).unwrap();
            let mut gpu_bytes = Vec::new();
            let gpu_res = codec.compress_host(&x, streams, &mut gpu_bytes);
            let reference = reference_compress(&scheme, &x, streams);
            let mut cpu = build_compressor(&case.params, n, &who).unwrap();
            let ctx = RoundCtx::new(round.round);
            let mut cpu_bytes = Vec::new();
            let cpu_res = cpu.compress(&x, &ctx, &mut cpu_bytes);
            match (&gpu_res, &reference) {
                (Err(_), None) => {
                    if cpu_res.is_ok() {
                        mismatches.push(format!("{what}: the GPU refuses, the CPU compresses"));
                    }
                    continue;
                }
                (Ok(()), Some(want)) => {
                    if &gpu_bytes != want {
                        let i = (0..want.len())
                            .find(|&i| gpu_bytes.get(i) != want.get(i))
                            .unwrap_or(0);
                        panic!("{what}: GPU bytes differ from the reference from byte {i}");
                    }
                }
                _ => panic!(
                    "{what}: GPU compress {gpu_res:?}, reference {}",
                    if reference.is_some() {
                        "compresses"
                    } else {
                        "refuses"
                    }
                ),
            }
            if cpu_res.is_err() || cpu_bytes != gpu_bytes {
                mismatches.push(format!(
                    "{what}: CPU compress {cpu_res:?}, bytes {} the GPU's",
                    if cpu_bytes == gpu_bytes {
                        "equal"
                    } else {
                        "differ from"
                    }
                ));
                continue;
            }

            let mut d_gpu = vec![f32::NAN; n];
            codec
                .decompress_host(&gpu_bytes, streams, &mut d_gpu)
                .unwrap();
            let d_ref = reference_decompress(&scheme, &gpu_bytes, n, streams);
            assert_same_bits(&format!("{what}: GPU decompress"), &d_gpu, &d_ref);
            let mut a_gpu = acc.clone();
            codec
                .decompress_add_host(&gpu_bytes, streams, &mut a_gpu)
                .unwrap();
            let sum: Vec<f32> = acc.iter().zip(&d_ref).map(|(a, d)| a + d).collect();
            assert_same_bits(&format!("{what}: GPU decompress_add"), &a_gpu, &sum);

            let mut d_cpu = vec![f32::NAN; n];
            let mut a_cpu = acc.clone();
            let ok = cpu.decompress(&cpu_bytes, &ctx, &mut d_cpu).is_ok()
                && cpu.decompress_add(&cpu_bytes, &ctx, &mut a_cpu).is_ok();
            let same =
                |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(p, q)| p.to_bits() == q.to_bits());
            if !ok || !same(&d_cpu, &d_gpu) || !same(&a_cpu, &a_gpu) {
                mismatches.push(format!(
                    "{what}: CPU decompress/decompress_add differ from the GPU's (or fail)"
                ));
                continue;
            }
            compared += 1;
        }
    }
    println!("{compared} chunks identical on the GPU and the CPU");
    assert!(
        mismatches.is_empty(),
        "{} mismatches between the GPU and the CPU compressors:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

/// The device-buffer API: payloads written into a larger buffer at an offset, outputs in views,
/// the codec reused across rounds, against the host emulation; errors for bad buffers.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine"]
fn gpu_device_buffers_and_errors() {
    let g = gpu();
    let stream = g.stream().clone();
    let mut r = Rng::new(seed("gpu_device_buffers_and_errors"));
    let n = 10_000 + r.below(5000) as usize;
    let scheme = GpuScheme::Dithering {
        levels: 15,
        natural: false,
        l2: true,
        bucket: Some(512),
    };
    let mut codec = GpuCodec::new(g.clone(), scheme, n).unwrap();
    let len = codec.compressed_len();
    let mut payload = stream.alloc_zeros::<u8>(len + 64).unwrap();
    let mut out = stream.alloc_zeros::<f32>(n + 8).unwrap();
    let mut compared = 0;
    for round in 0..10u64 {
        if compared == 3 {
            break;
        }
        let x = input(&mut r, n);
        let streams = RoundStreams::new(7, 11, round, Role::Worker, 2);
        let mut want = Vec::new();
        if let Err(e) = host::compress(&scheme, &x, streams, &mut want) {
            // Inputs with huge values overflow the l2 norm; the host refuses them (a device
            // chain's flags do), the bare kernels do not check.
            println!("round {round}: the host refuses this input ({e}); next round");
            continue;
        }
        compared += 1;
        let dx = stream.clone_htod(&x).unwrap();
        let mut view = payload.slice_mut(16..16 + len);
        assert_eq!(codec.compress(&dx, streams, &mut view).unwrap(), len);
        let bytes = stream.clone_dtoh(&payload.slice(16..16 + len)).unwrap();
        g.synchronize().unwrap();
        assert_same_bytes(
            &format!("round {round}: compress at an offset"),
            &bytes,
            &want,
        );

        let mut ov = out.slice_mut(4..4 + n);
        codec
            .decompress(&payload.slice(16..16 + len), streams, &mut ov)
            .unwrap();
        let got = stream.clone_dtoh(&out.slice(4..4 + n)).unwrap();
        g.synchronize().unwrap();
        let mut dec = vec![0.0f32; n];
        host::decompress(&scheme, &want, streams, &mut dec).unwrap();
        assert_same_bits(
            &format!("round {round}: decompress into a view"),
            &got,
            &dec,
        );
    }
    assert_eq!(compared, 3, "too many inputs refused");
    // Wrong sizes and misaligned buffers are errors, not corrupted memory.
    let streams = RoundStreams::new(1, 2, 3, Role::Worker, 0);
    let short = stream.alloc_zeros::<f32>(n - 1).unwrap();
    assert!(codec.compress(&short, streams, &mut payload).is_err());
    let dx = stream.alloc_zeros::<f32>(n).unwrap();
    let mut small = stream.alloc_zeros::<u8>(len - 1).unwrap();
    assert!(codec.compress(&dx, streams, &mut small).is_err());
    let mut misaligned = payload.slice_mut(1..1 + len);
    let err = codec.compress(&dx, streams, &mut misaligned).unwrap_err();
    assert!(err.to_string().contains("aligned"), "{err}");
    // Non-finite input is found and refused by compress_host.
    let mut x = input(&mut r, n);
    let bad = r.below(n as u64) as usize;
    x[bad] = f32::NAN;
    let dx = stream.clone_htod(&x).unwrap();
    assert_eq!(codec.find_non_finite(&dx).unwrap(), Some(bad));
    assert!(codec.compress_host(&x, streams, &mut Vec::new()).is_err());
}

/// Large chunks (grids smaller than the work, so every grid-stride loop runs several times)
/// against the host emulation; prints the throughput.
#[test]
#[ignore = "needs a CUDA GPU: run with --ignored on a GPU machine"]
fn gpu_large_chunks_match_and_report_throughput() {
    let g = gpu();
    let stream = g.stream().clone();
    let mut r = Rng::new(seed("gpu_large_chunks_match_and_report_throughput"));
    let n = (1 << 24) + 17;
    let x: Vec<f32> = (0..n).map(|_| r.grad()).collect();
    let dx = stream.clone_htod(&x).unwrap();
    let streams = RoundStreams::new(r.u64(), r.u64(), 5, Role::Worker, 1);
    for scheme in [
        GpuScheme::Fp16,
        GpuScheme::Bf16,
        GpuScheme::OneBit { scaling: true },
        GpuScheme::MinMax {
            bits: 8,
            bucket: None,
        },
        GpuScheme::MinMax {
            bits: 3,
            bucket: Some(4096),
        },
        GpuScheme::Dithering {
            levels: 7,
            natural: true,
            l2: false,
            bucket: Some(512),
        },
        GpuScheme::Dithering {
            levels: 127,
            natural: false,
            l2: true,
            bucket: None,
        },
        GpuScheme::RandomK {
            k: n / 100,
            unbiased: true,
        },
    ] {
        let mut codec = GpuCodec::new(g.clone(), scheme, n).unwrap();
        let mut dout = stream.alloc_zeros::<u8>(codec.compressed_len()).unwrap();
        codec.compress(&dx, streams, &mut dout).unwrap(); // warm-up
        g.synchronize().unwrap();
        let reps = 20;
        let t = Instant::now();
        for _ in 0..reps {
            codec.compress(&dx, streams, &mut dout).unwrap();
        }
        g.synchronize().unwrap();
        let secs = t.elapsed().as_secs_f64() / reps as f64;
        let got = stream.clone_dtoh(&dout).unwrap();
        g.synchronize().unwrap();
        let mut want = Vec::new();
        host::compress(&scheme, &x, streams, &mut want).unwrap();
        assert_same_bytes(&format!("{scheme:?} n = {n}"), &got, &want);
        println!(
            "{scheme:?}: compress {:.1} GB/s of f32 input ({:.3} ms)",
            4.0 * n as f64 / secs / 1e9,
            secs * 1e3
        );
    }
}
