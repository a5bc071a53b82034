//! The device compressor chain ([`DeviceChain`]) on the [`EmulatedDevice`] (the CUDA kernels'
//! host-compiled twin) against the CPU chain of [`chunk_codec`], for the same chunk: over
//! several rounds with fresh random gradients, the payload bytes, the decoded (and averaged)
//! values, the error-feedback residual and the momentum must agree bit for bit, and both must
//! refuse the same rounds (a refused round changes neither's state). Every fixed-width
//! encoding, with and without error feedback (vanilla and corrected) and Nesterov momentum, on
//! workers and servers, chunks that are a tensor's shorter last chunk, and raw fp32.
//!
//! Runs everywhere; the seed is printed (set `PUSHPULL_TEST_SEED` to replay). The same
//! comparison on a real GPU (`CudaDevice`) is `gpu_device_chain_matches_the_cpu_chain`, ignored
//! without one: `cargo test -p pushpull-kernels --features cuda --test device_chain --
//! --ignored` on a GPU machine (it fails, saying so, where there is none).

mod cuda_common;

use std::collections::BTreeMap;
use std::sync::Arc;

use cuda_common::*;
use pushpull_kernels::chunk::{chunk_codec, ChunkInfo, Node};
use pushpull_kernels::device::{Device, DeviceChain, EmulatedDevice};
use pushpull_kernels::{Compressor, RoundCtx};

/// The decorator settings every case is tried with.
const DECORATIONS: &[&[(&str, &str)]] = &[
    &[],
    &[("ef", "vanilla")],
    &[("ef", "vanilla"), ("momentum", "nesterov")],
    &[("momentum", "nesterov"), ("mu", "0.85")],
    &[("ef", "corrected"), ("momentum", "nesterov")],
];

fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

struct Pair<D: Device> {
    what: String,
    cpu: Box<dyn Compressor>,
    dev: DeviceChain<D>,
}

fn pair<D: Device>(
    params: &BTreeMap<String, String>,
    info: ChunkInfo<'_>,
    device: &Arc<D>,
) -> Option<Pair<D>> {
    let cpu = chunk_codec(&info).unwrap_or_else(|e| panic!("{params:?}: {e}"));
    let dev = DeviceChain::build(device, &info)
        .unwrap_or_else(|e| panic!("{params:?}: {e}"))
        .unwrap_or_else(|| panic!("{params:?}: no device chain"));
    assert_eq!(dev.name(), cpu.name(), "{params:?}: chain names");
    Some(Pair {
        what: format!("{} (n = {}, {:?})", cpu.name(), info.chunk_len, info.node),
        cpu,
        dev,
    })
}

/// Runs `rounds` rounds of one pair: compress on both, compare, decode both (with an average
/// over 3 workers on the device, applied by hand on the CPU), compare state.
fn run_rounds<D: Device>(r: &mut Rng, p: &mut Pair<D>, rounds: u64, device: &D) -> (u32, u32) {
    let n = p.cpu.len();
    let (mut same, mut refused) = (0, 0);
    // The chunk sits at an offset of a larger device tensor, as in the worker.
    let offset = r.below(5) as usize;
    for round in 0..rounds {
        let lr = 0.05 + r.unit() * 0.1;
        let ctx = RoundCtx::new(round).with_lr(lr);
        // Mostly gradients, now and then extreme values that some encodings refuse.
        let g: Vec<f32> = if r.below(6) == 0 {
            input(r, n)
        } else {
            (0..n).map(|_| r.grad()).collect()
        };
        let mut tensor = device.alloc_zeros(offset + n + 3).unwrap();
        device.upload(&g, &mut tensor, offset).unwrap();
        let range = offset..offset + n;
        let (mut want, mut got) = (Vec::new(), Vec::new());
        let cpu = p.cpu.compress(&g, &ctx, &mut want);
        let dev = p.dev.compress(&tensor, range.clone(), &ctx, &mut got);
        match (&cpu, &dev) {
            (Ok(()), Ok(())) => {}
            (Err(_), Err(_)) => {
                refused += 1;
                continue;
            }
            _ => panic!("{} round {round}: cpu {cpu:?}, device {dev:?}", p.what),
        }
        assert_same_bytes(&format!("{} round {round}: payload", p.what), &got, &want);
        let mut cpu_out = vec![f32::NAN; n];
        p.cpu.decompress(&want, &ctx, &mut cpu_out).unwrap();
        for v in &mut cpu_out {
            *v /= 3.0;
        }
        let mut out = device.alloc_zeros(offset + n + 3).unwrap();
        p.dev
            .decompress(&got, &ctx, &mut out, range.clone(), Some(3.0))
            .unwrap();
        let mut dev_out = vec![f32::NAN; n];
        device.download(&out, range, &mut dev_out).unwrap();
        assert_same_bits(
            &format!("{} round {round}: decoded average", p.what),
            &dev_out,
            &cpu_out,
        );
        let states = [
            ("residual", p.cpu.residual(), p.dev.residual().unwrap()),
            ("momentum", p.cpu.momentum(), p.dev.momentum().unwrap()),
        ];
        for (what, cpu, dev) in states {
            let what = format!("{} round {round}: {what}", p.what);
            match (cpu, dev) {
                (Some(a), Some(b)) => assert_same_bits(&what, &b, a),
                (None, None) => {}
                (a, b) => panic!("{what}: cpu has it {}, device {}", a.is_some(), b.is_some()),
            }
        }
        same += 1;
    }
    (same, refused)
}

#[test]
fn device_chain_matches_the_cpu_chain_round_after_round() {
    let mut r = Rng::new(seed("device_chain_matches_the_cpu_chain_round_after_round"));
    compare_chains(&mut r, &Arc::new(EmulatedDevice), &[1, 33, 257, 2049]);
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run with --features cuda -- --ignored on a GPU machine"]
fn gpu_device_chain_matches_the_cpu_chain() {
    let mut r = Rng::new(seed("gpu_device_chain_matches_the_cpu_chain"));
    compare_chains(&mut r, &gpu_device(), &[1, 33, 257, 2049, 100_003]);
}

/// Every case of [`cases`] with every [`DECORATIONS`] for chunks of `lengths` (and a random
/// one), on random nodes, three rounds each.
fn compare_chains<D: Device>(r: &mut Rng, device: &Arc<D>, lengths: &[usize]) {
    let (mut same, mut refused, mut chains) = (0, 0, 0);
    let mut lengths = lengths.to_vec();
    lengths.push(1 + r.below(5000) as usize);
    for &n in &lengths {
        for case in cases(r, n) {
            for deco in DECORATIONS {
                let mut params = case.params.clone();
                for (k, v) in *deco {
                    params.insert(k.to_string(), v.to_string());
                }
                let node = if r.below(4) == 0 {
                    Node::Server { id: 1 }
                } else {
                    Node::Worker {
                        rank: r.below(4) as u32,
                    }
                };
                // Now and then the shorter last chunk of a tensor (random-k's k refers to the
                // full chunk).
                let full = if r.bool() { n } else { n + 1 };
                let info = ChunkInfo {
                    params: &params,
                    tensor_len: (4 * n) as u64,
                    chunk_len: n as u64,
                    full_chunk_len: full as u64,
                    key: r.u64(),
                    job_seed: r.u64(),
                    node,
                    min_compress_bytes: 0,
                };
                let Some(mut p) = pair(&params, info, device) else {
                    continue;
                };
                let (s, f) = run_rounds(r, &mut p, 3, device);
                same += s;
                refused += f;
                chains += 1;
            }
        }
    }
    println!("{chains} chains: {same} rounds identical, {refused} refused by both");
    assert!(same > 1000, "too few comparisons: {same}");
}

/// Raw fp32 (a tensor below `min_compress_bytes`, and `compressor = none`) goes through the
/// device as a plain copy, keeping momentum; error feedback on raw fp32 keeps a zero residual.
#[test]
fn raw_fp32_on_the_device_keeps_momentum() {
    let mut r = Rng::new(seed("raw_fp32_on_the_device_keeps_momentum"));
    let device = Arc::new(EmulatedDevice);
    for kv in [
        vec![
            ("compressor", "onebit"),
            ("ef", "vanilla"),
            ("momentum", "nesterov"),
        ],
        vec![("compressor", "none"), ("ef", "vanilla")],
        vec![("compressor", "none")],
    ] {
        let params = map(kv.as_slice());
        let n = 1000;
        let info = ChunkInfo {
            params: &params,
            tensor_len: n,
            chunk_len: n,
            full_chunk_len: n,
            key: 9,
            job_seed: 3,
            node: Node::Worker { rank: 1 },
            // 1000 elements are below this: raw fp32 (momentum kept, no error feedback).
            min_compress_bytes: 65536,
        };
        let mut p = pair(&params, info, &device).unwrap();
        let (same, _) = run_rounds(&mut r, &mut p, 4, &*device);
        assert!(same >= 1, "{}: no round compared", p.what);
    }
}

/// Compressors without a device kernel have no device chain; a bad map is refused by name.
#[test]
fn cpu_only_compressors_and_bad_maps() {
    let device = Arc::new(EmulatedDevice);
    let build = |kv: &[(&str, &str)]| {
        let params = map(kv);
        let info = ChunkInfo {
            params: &params,
            tensor_len: 100_000,
            chunk_len: 100_000,
            full_chunk_len: 100_000,
            key: 1,
            job_seed: 2,
            node: Node::Worker { rank: 0 },
            min_compress_bytes: 0,
        };
        DeviceChain::build(&device, &info).map(|c| c.map(|c| c.name().to_string()))
    };
    for kv in [
        vec![("compressor", "topk"), ("k", "0.01")],
        vec![("compressor", "onebit"), ("columns", "100")],
        vec![
            ("compressor", "dithering"),
            ("k", "4"),
            ("encoding", "elias"),
        ],
    ] {
        assert_eq!(build(&kv).unwrap(), None, "{kv:?} has a device chain");
    }
    // Moniqua is refused for gradients on every path, with the CPU's words.
    let e = build(&[("compressor", "moniqua"), ("bits", "4"), ("theta", "1")]).unwrap_err();
    assert!(e.contains("moniqua cannot compress gradients"), "{e}");
    let e = build(&[("compressor", "minmax"), ("bits", "9")]).unwrap_err();
    assert!(e.contains("bits") && e.contains('9'), "{e}");
}

/// Corrupted payloads (random bit flips, in headers and codes alike) are refused by the device
/// chain exactly when the CPU chain refuses them, and when both accept one they decode it to
/// the same bits: the CUDA decoders check nothing themselves, so `GpuScheme::payload_problem`
/// must say what the CPU's decompress says.
#[test]
fn corrupted_payloads_are_refused_as_on_the_cpu() {
    let mut r = Rng::new(seed("corrupted_payloads_are_refused_as_on_the_cpu"));
    let device = Arc::new(EmulatedDevice);
    let (mut refused, mut accepted) = (0, 0);
    for &n in &[33usize, 257, 1 + r.below(3000) as usize] {
        for case in cases(&mut r, n) {
            let info = ChunkInfo {
                params: &case.params,
                tensor_len: n as u64,
                chunk_len: n as u64,
                full_chunk_len: n as u64,
                key: r.u64(),
                job_seed: r.u64(),
                node: Node::Worker { rank: 0 },
                min_compress_bytes: 0,
            };
            let mut p = pair(&case.params, info, &device).unwrap();
            let ctx = RoundCtx::new(r.below(100));
            let g: Vec<f32> = (0..n).map(|_| r.grad()).collect();
            let mut payload = Vec::new();
            if p.cpu.compress(&g, &ctx, &mut payload).is_err() {
                continue;
            }
            for _ in 0..30 {
                let mut bad = payload.clone();
                for _ in 0..1 + r.below(3) {
                    let bit = r.below(8 * bad.len() as u64) as usize;
                    bad[bit / 8] ^= 1 << (bit % 8);
                }
                let mut want = vec![0.0; n];
                let cpu = p.cpu.decompress(&bad, &ctx, &mut want);
                let mut mem = device.alloc_zeros(n).unwrap();
                let dev = p.dev.decompress(&bad, &ctx, &mut mem, 0..n, None);
                match (cpu, dev) {
                    (Err(_), Err(_)) => refused += 1,
                    (Ok(()), Ok(())) => {
                        let mut got = vec![0.0; n];
                        device.download(&mem, 0..n, &mut got).unwrap();
                        assert_same_bits(&format!("{}: accepted corruption", p.what), &got, &want);
                        accepted += 1;
                    }
                    (cpu, dev) => panic!(
                        "{}: a corrupted payload: cpu {cpu:?}, device {dev:?}",
                        p.what
                    ),
                }
            }
        }
    }
    println!("{refused} corrupted payloads refused by both, {accepted} accepted by both");
    assert!(
        refused > 50 && accepted > 50,
        "{refused} refused, {accepted} accepted"
    );
}

/// Non-finite gradients are refused with the CPU's error (naming the element), with and
/// without decorators, and the refused round leaves the state as it was.
#[test]
fn non_finite_gradients_are_named_as_on_the_cpu() {
    let mut r = Rng::new(seed("non_finite_gradients_are_named_as_on_the_cpu"));
    let device = Arc::new(EmulatedDevice);
    let n = 1000;
    for kv in [
        vec![("compressor", "fp16")],
        vec![("compressor", "minmax"), ("bits", "4")],
        vec![
            ("compressor", "onebit"),
            ("ef", "vanilla"),
            ("momentum", "nesterov"),
        ],
    ] {
        let params = map(kv.as_slice());
        let info = ChunkInfo {
            params: &params,
            tensor_len: n,
            chunk_len: n,
            full_chunk_len: n,
            key: 5,
            job_seed: 6,
            node: Node::Worker { rank: 0 },
            min_compress_bytes: 0,
        };
        let mut p = pair(&params, info, &device).unwrap();
        // One good round first, so there is state to keep.
        run_rounds(&mut r, &mut p, 1, &*device);
        let bad_at = r.below(n) as usize;
        let mut g: Vec<f32> = (0..n).map(|_| r.grad()).collect();
        g[bad_at] = if r.bool() {
            f32::NAN
        } else {
            f32::NEG_INFINITY
        };
        let mut mem = device.alloc_zeros(n as usize).unwrap();
        device.upload(&g, &mut mem, 0).unwrap();
        let ctx = RoundCtx::new(1);
        let cpu = p.cpu.compress(&g, &ctx, &mut Vec::new()).unwrap_err();
        let dev = p
            .dev
            .compress(&mem, 0..n as usize, &ctx, &mut Vec::new())
            .unwrap_err();
        for e in [&cpu, &dev] {
            match e {
                pushpull_kernels::KernelError::NonFinite { index, .. } => {
                    assert_eq!(*index, bad_at, "{}: {e}", p.what)
                }
                other => panic!("{}: {other}", p.what),
            }
        }
        // The state is untouched: the next good round still agrees bit for bit.
        let (same, _) = run_rounds(&mut r, &mut p, 2, &*device);
        assert!(same >= 1, "{}", p.what);
    }
}

/// The emulated device's copies into staging land when they are waited for, not before (as on
/// a GPU, where reading staging early reads stale bytes), so the worker's order (launch every
/// chunk, then wait for each) is what the tests exercise.
#[test]
fn emulated_staging_lands_only_when_waited_for() {
    use pushpull_kernels::cuda::{GpuScheme, RoundStreams};
    use pushpull_kernels::device::{read_flags, staging_bytes};
    use pushpull_kernels::rng::Role;
    let device = EmulatedDevice;
    let n = 64;
    let x: Vec<f32> = (0..n).map(|i| i as f32 - 20.5).collect();
    let mut codec = device
        .codec(GpuScheme::OneBit { scaling: true }, n)
        .unwrap();
    let mut flags = device.alloc_flags().unwrap();
    let streams = RoundStreams::new(1, 2, 0, Role::Worker, 0);
    let len = device
        .compress(&mut codec, &x, 0..n, streams, &mut flags)
        .unwrap();
    let mut staging = device.alloc_staging(staging_bytes(len)).unwrap();
    device.stage(&codec, len, &flags, &mut staging).unwrap();
    assert!(
        staging.as_ref().iter().all(|&b| b == 0),
        "staging changed before it was waited for"
    );
    device.wait_staged(&mut staging).unwrap();
    let mut want = Vec::new();
    pushpull_kernels::cuda::host::compress(
        &GpuScheme::OneBit { scaling: true },
        &x,
        streams,
        &mut want,
    )
    .unwrap();
    assert_eq!(&staging.as_ref()[..len], &want[..]);
    let f = read_flags(staging.as_ref(), len).unwrap();
    assert_eq!(f[4..6], [u32::MAX, u32::MAX], "no non-finite element");
    assert_eq!(f[..4], [0, 0, 0, 0]);
}

/// A worker launches every chunk of a tensor before it waits for any: chunks started together
/// and finished in another order give the CPU chains' bytes and state, and a launch that is
/// never finished (its round ended early) changes no state.
#[test]
fn launched_chunks_finish_in_any_order_and_an_abandoned_launch_changes_nothing() {
    let mut r = Rng::new(seed(
        "launched_chunks_finish_in_any_order_and_an_abandoned_launch_changes_nothing",
    ));
    launched_in_any_order(&mut r, &Arc::new(EmulatedDevice));
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run with --features cuda -- --ignored on a GPU machine"]
fn gpu_launched_chunks_finish_in_any_order() {
    let mut r = Rng::new(seed("gpu_launched_chunks_finish_in_any_order"));
    launched_in_any_order(&mut r, &gpu_device());
}

/// GPU 0 as a device; fails, saying so, where there is none.
#[cfg(feature = "cuda")]
fn gpu_device() -> Arc<pushpull_kernels::cuda::CudaDevice> {
    use pushpull_kernels::cuda::{gpu_available, nvrtc_available, CudaDevice, GpuContext};
    assert!(
        gpu_available() && nvrtc_available(),
        "this test needs a CUDA GPU and libnvrtc, and this machine lacks one of them"
    );
    let gpu = GpuContext::new(0).unwrap_or_else(|e| panic!("cannot open GPU 0: {e}"));
    Arc::new(CudaDevice::new(gpu))
}

/// Three chunks of one tensor launched together and finished last first, for three rounds,
/// against three CPU chains; then a launch abandoned each round.
fn launched_in_any_order<D: Device>(r: &mut Rng, device: &Arc<D>) {
    let params = map(&[
        ("compressor", "onebit"),
        ("ef", "vanilla"),
        ("momentum", "nesterov"),
    ]);
    let n = 300;
    let chunks = 3;
    let mut pairs: Vec<Pair<D>> = (0..chunks)
        .map(|c| {
            let info = ChunkInfo {
                params: &params,
                tensor_len: (chunks * n) as u64,
                chunk_len: n as u64,
                full_chunk_len: n as u64,
                key: 100 + c as u64,
                job_seed: 7,
                node: Node::Worker { rank: 2 },
                min_compress_bytes: 0,
            };
            pair(&params, info, device).unwrap()
        })
        .collect();
    let mut tensor = device.alloc_zeros(chunks * n).unwrap();
    let range = |c: usize| c * n..(c + 1) * n;
    for round in 0..3u64 {
        let ctx = RoundCtx::new(round);
        let g: Vec<f32> = (0..chunks * n).map(|_| r.grad()).collect();
        device.upload(&g, &mut tensor, 0).unwrap();
        // Launch every chunk, then finish them last first.
        let started: Vec<_> = pairs
            .iter_mut()
            .enumerate()
            .map(|(c, p)| {
                let staging = device.alloc_staging(p.dev.staging_bytes()).unwrap();
                p.dev.start(&tensor, range(c), &ctx, staging).unwrap()
            })
            .collect();
        for (c, s) in started.into_iter().enumerate().rev() {
            let p = &mut pairs[c];
            let (staging, len) = p.dev.finish(&tensor, s);
            let len = len.unwrap();
            let mut want = Vec::new();
            p.cpu.compress(&g[range(c)], &ctx, &mut want).unwrap();
            let what = format!("{} chunk {c} round {round}", p.what);
            assert_same_bytes(&what, &staging.as_ref()[..len], &want);
            assert_same_bits(
                &format!("{what}: residual"),
                &p.dev.residual().unwrap().unwrap(),
                p.cpu.residual().unwrap(),
            );
            assert_same_bits(
                &format!("{what}: momentum"),
                &p.dev.momentum().unwrap().unwrap(),
                p.cpu.momentum().unwrap(),
            );
        }
        // A launch of chunk 0 that is abandoned: the next compression starts from the same
        // state as the CPU chain, which never saw it.
        let staging = device.alloc_staging(pairs[0].dev.staging_bytes()).unwrap();
        let abandoned = pairs[0]
            .dev
            .start(&tensor, range(0), &ctx, staging)
            .unwrap();
        drop(abandoned.into_staging());
    }
    let ctx = RoundCtx::new(3);
    let g: Vec<f32> = (0..n).map(|_| r.grad()).collect();
    device.upload(&g, &mut tensor, 0).unwrap();
    let (mut want, mut got) = (Vec::new(), Vec::new());
    pairs[0].cpu.compress(&g, &ctx, &mut want).unwrap();
    pairs[0]
        .dev
        .compress(&tensor, range(0), &ctx, &mut got)
        .unwrap();
    assert_same_bytes("after abandoned launches", &got, &want);
}
