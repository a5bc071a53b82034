//! Device batches ([`Batch`], [`DeviceTensor`]) on the [`EmulatedDevice`] (the CUDA kernels'
//! host-compiled twin, table step by table step) against the CPU chains of [`chunk_codec`],
//! chunk for chunk: over several rounds with fresh random gradients, the payload bytes, the
//! decoded (and averaged) values, the error-feedback residual and the momentum must agree bit
//! for bit, both must refuse the same chunks (a refused chunk changes neither's state, and
//! leaves its neighbours in the batch alone), a chunk whose result did not arrive leaves
//! its part of the output untouched, a non-finite sum decodes as NaN and undoes the chunk's
//! round, and an undone round leaves both chains as if it never ran. Every fixed-width encoding and raw fp32, with and without
//! error feedback (vanilla and corrected) and Nesterov momentum, tensors of one tiny chunk, of
//! odd chunks, of exactly full chunks and of full chunks with a shorter last one, batches of
//! one to five tensors, in place and into another buffer.
//!
//! Runs everywhere; the seed is printed (set `PUSHPULL_TEST_SEED` to replay). The same
//! comparison on a real GPU (`CudaDevice`) is `gpu_batches_match_the_cpu_chains`, ignored
//! without one: `cargo test -p pushpull-kernels --features cuda --test device_batch --
//! --ignored` on a GPU machine (it fails, saying so, where there is none).

mod cuda_common;

use std::collections::BTreeMap;
use std::sync::Arc;

use cuda_common::*;
use pushpull_kernels::chunk::{chunk_codec, ChunkInfo, Node};
use pushpull_kernels::device::{Batch, BatchRound, Device, DeviceTensor, EmulatedDevice};
use pushpull_kernels::{Compressor, KernelError, RoundCtx};

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

/// One tensor under test: its CPU chains (one per chunk) and its device chains.
struct Under<D: Device> {
    what: String,
    chunks: Vec<std::ops::Range<usize>>,
    cpu: Vec<Box<dyn Compressor>>,
    dev: DeviceTensor<D>,
}

impl<D: Device> Under<D> {
    fn len(&self) -> usize {
        self.chunks.last().map_or(0, |c| c.end)
    }
}

/// A tensor with map `params` cut into chunks of `lens`, on `node`; `None` when its codec has
/// no device kernel.
fn under<D: Device>(
    r: &mut Rng,
    device: &Arc<D>,
    params: &BTreeMap<String, String>,
    lens: &[usize],
    node: Node,
    min_compress_bytes: u64,
) -> Option<Under<D>> {
    let total: usize = lens.iter().sum();
    let job_seed = r.u64();
    let keys: Vec<u64> = lens.iter().map(|_| r.u64()).collect();
    let infos: Vec<ChunkInfo<'_>> = lens
        .iter()
        .zip(&keys)
        .map(|(&n, &key)| ChunkInfo {
            params,
            tensor_len: total as u64,
            chunk_len: n as u64,
            full_chunk_len: lens[0] as u64,
            key,
            job_seed,
            node,
            min_compress_bytes,
        })
        .collect();
    // A map the CPU refuses for these chunks (random-k's count k above a tiny chunk) is no
    // case: the device must refuse it too.
    let cpu: Vec<_> = match infos.iter().map(chunk_codec).collect::<Result<Vec<_>, _>>() {
        Ok(cpu) => cpu,
        Err(e) => {
            let dev = DeviceTensor::build(device, &infos).map(|_| ());
            assert_eq!(dev, Err(e), "{params:?}: the device's refusal");
            return None;
        }
    };
    let dev = DeviceTensor::build(device, &infos).unwrap_or_else(|e| panic!("{params:?}: {e}"))?;
    for (c, chain) in cpu.iter().enumerate() {
        assert_eq!(dev.name(c), chain.name(), "{params:?}: chain names");
    }
    let mut at = 0;
    let chunks = lens
        .iter()
        .map(|&n| {
            at += n;
            at - n..at
        })
        .collect();
    let shape = match lens {
        [] | [_] | [_, _] | [_, _, _] => format!("{lens:?}"),
        [first, .., last] => format!("{} chunks: {first}, ..., {last}", lens.len()),
    };
    Some(Under {
        what: format!("{} (chunks {shape}, {node:?})", cpu[0].name()),
        chunks,
        cpu,
        dev,
    })
}

/// A tensor's chunk lengths: one tiny chunk, one odd chunk, exactly full chunks, or full
/// chunks and a shorter last one (now and then an empty tensor).
fn chunking(r: &mut Rng, full: usize) -> Vec<usize> {
    match r.below(9) {
        0 => vec![1 + r.below(4) as usize],
        1 => vec![1 + 2 * r.below(1500) as usize],
        2 | 3 => vec![full; 1 + r.below(4) as usize],
        4 if r.below(4) == 0 => vec![0],
        _ => {
            let mut v = vec![full; 1 + r.below(3) as usize];
            v.push(1 + r.below(full as u64 - 1) as usize);
            v
        }
    }
}

/// What one round of a batch compared.
#[derive(Default)]
struct Tally {
    same: u32,
    refused: u32,
    untouched: u32,
    non_finite: u32,
    undone: u32,
}

/// Runs `rounds` rounds of `tensors` as one batch on `device`: compress on both, compare,
/// receive a random subset of the payloads on the device, decode, compare the output and the
/// state.
fn run_batch<D: Device>(
    r: &mut Rng,
    device: &Arc<D>,
    tensors: &mut [Under<D>],
    rounds: u64,
) -> Tally {
    let mut tally = Tally::default();
    let batch = {
        let refs: Vec<&DeviceTensor<D>> = tensors.iter().map(|t| &t.dev).collect();
        Arc::new(Batch::new(device, &refs).unwrap())
    };
    for round in 0..rounds {
        let lr = 0.05 + r.unit() * 0.1;
        let ctx = RoundCtx::new(round).with_lr(lr);
        // An average over 1 to 5 workers: the device's formula against `reduce::average`.
        let average = if r.bool() {
            Some(1 + r.below(5) as u32)
        } else {
            None
        };
        // Each tensor sits at an offset of a larger device buffer; its result goes back in
        // place, or into another buffer holding a sentinel.
        let mut bufs = Vec::new();
        for t in tensors.iter() {
            let n = t.len();
            // Mostly gradients, now and then extreme values that some encodings refuse.
            let g: Vec<f32> = if r.below(6) == 0 {
                input(r, n)
            } else {
                (0..n).map(|_| r.grad()).collect()
            };
            let offset = r.below(5) as usize;
            let input_mem = device.alloc_zeros(offset + n + 3).unwrap();
            let in_place = r.bool();
            let sentinel: Vec<f32> = (0..n).map(|i| i as f32 + 0.25).collect();
            // SAFETY: the buffer holds offset + n + 3 elements.
            unsafe {
                device
                    .upload(&g, device.mem_addr(&input_mem) + 4 * offset as u64)
                    .unwrap()
            };
            let output_mem = if in_place {
                None
            } else {
                let m = device.alloc_zeros(n + 1).unwrap();
                // SAFETY: the buffer holds n + 1 elements.
                unsafe { device.upload(&sentinel, device.mem_addr(&m)).unwrap() };
                Some(m)
            };
            let input = device.mem_addr(&input_mem) + 4 * offset as u64;
            let output = output_mem.as_ref().map_or(input, |m| device.mem_addr(m));
            bufs.push((g, input_mem, output_mem, input, output, sentinel));
        }
        let rounds_of: Vec<BatchRound> = bufs
            .iter()
            .map(|b| BatchRound {
                input: b.3,
                output: b.4,
                round,
                lr: Some(lr),
                average_over: average.map(|w| w as f32),
            })
            .collect();
        let started = {
            let refs: Vec<&DeviceTensor<D>> = tensors.iter().map(|t| &t.dev).collect();
            assert!(batch.fits(&refs));
            // SAFETY: every buffer is alive until the round's decode has been downloaded.
            unsafe { batch.start(&refs, &rounds_of) }.unwrap()
        };
        let mut wants = Vec::new();
        for (part, (t, b)) in tensors.iter_mut().zip(&bufs).enumerate() {
            let (g, _, _, _, _, sentinel) = b;
            // What the output must hold: where a chunk's result is not received, what was
            // there (the gradient in place, else the sentinel).
            let mut want_out: Vec<f32> = if b.2.is_none() {
                g.clone()
            } else {
                sentinel.clone()
            };
            // Chunks finish in a random order, as the worker's pushes do.
            let mut order: Vec<usize> = (0..t.chunks.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, r.below(i as u64 + 1) as usize);
            }
            for c in order {
                let range = t.chunks[c].clone();
                let mut want = Vec::new();
                let cpu = t.cpu[c].compress(&g[range.clone()], &ctx, &mut want);
                let dev = started.finish(part, &mut t.dev, c);
                let what = format!("{} chunk {c} round {round}", t.what);
                let got = match (&cpu, dev) {
                    (Ok(()), Ok(got)) => got,
                    (Err(_), Err(_)) => {
                        tally.refused += 1;
                        // Its sum comes back non-finite (or not at all): nothing to undo.
                        if r.bool() {
                            started.receive_non_finite(part, &mut t.dev, c);
                            t.cpu[c].undo(round);
                            want_out[range].fill(f32::NAN);
                        }
                        continue;
                    }
                    (cpu, dev) => panic!("{what}: cpu {cpu:?}, device {dev:?}"),
                };
                assert_same_bytes(&format!("{what}: payload"), &got, &want);
                if r.below(5) == 0 {
                    tally.untouched += 1;
                    continue;
                }
                // Another worker's chunk (or the sum) was not finite: this round is undone
                // and the chunk decodes as NaN.
                if r.below(6) == 0 {
                    tally.non_finite += 1;
                    started.receive_non_finite(part, &mut t.dev, c);
                    t.cpu[c].undo(round);
                    want_out[range].fill(f32::NAN);
                    continue;
                }
                started.receive(part, &t.dev, c, &got).unwrap();
                let out = &mut want_out[range];
                t.cpu[c].decompress(&want, &ctx, out).unwrap();
                if let Some(w) = average {
                    pushpull_kernels::average(out, w);
                }
            }
            wants.push(want_out);
        }
        // One decode for every tensor of the batch.
        started.decode().unwrap();
        // Now and then a tensor's step is discarded (a loss scaler skipped it).
        for t in tensors.iter_mut().filter(|_| r.below(4) == 0) {
            tally.undone += 1;
            t.dev.undo(round);
            t.cpu.iter_mut().for_each(|c| c.undo(round));
        }
        for ((t, b), want_out) in tensors.iter().zip(&bufs).zip(wants) {
            let output = &b.4;
            let n = t.len();
            let mut got_out = vec![0.0; n];
            // SAFETY: the output holds n elements.
            unsafe { device.download(*output, &mut got_out).unwrap() };
            assert_same_bits(
                &format!("{} round {round}: output", t.what),
                &got_out,
                &want_out,
            );
            for c in 0..t.chunks.len() {
                let what = format!("{} chunk {c} round {round}", t.what);
                let states = [
                    ("residual", t.cpu[c].residual(), t.dev.residual(c).unwrap()),
                    ("momentum", t.cpu[c].momentum(), t.dev.momentum(c).unwrap()),
                ];
                for (which, cpu, dev) in states {
                    match (cpu, dev) {
                        (Some(a), Some(b)) => assert_same_bits(&format!("{what}: {which}"), &b, a),
                        (None, None) => {}
                        (a, b) => panic!(
                            "{what}: {which}: cpu {}, device {}",
                            a.is_some(),
                            b.is_some()
                        ),
                    }
                }
                tally.same += 1;
            }
        }
    }
    tally
}

/// Random batches of every case and decoration, three rounds each.
fn compare_batches<D: Device>(r: &mut Rng, device: &Arc<D>, fulls: &[usize]) {
    let mut total = Tally::default();
    let mut batches = 0;
    for &full in fulls {
        let mut pending: Vec<Under<D>> = Vec::new();
        for case in cases(r, full) {
            for deco in DECORATIONS {
                let mut params = case.params.clone();
                for (k, v) in *deco {
                    params.insert(k.to_string(), v.to_string());
                }
                let node = Node::Worker {
                    rank: r.below(4) as u32,
                };
                let lens = chunking(r, full);
                let Some(t) = under(r, device, &params, &lens, node, 0) else {
                    continue;
                };
                pending.push(t);
                // Batches of one to five tensors of different maps.
                if r.below(3) == 0 {
                    let mut batch = std::mem::take(&mut pending);
                    let t = run_batch(r, device, &mut batch, 3);
                    total.same += t.same;
                    total.refused += t.refused;
                    total.untouched += t.untouched;
                    total.non_finite += t.non_finite;
                    total.undone += t.undone;
                    batches += 1;
                }
            }
        }
        if !pending.is_empty() {
            run_batch(r, device, &mut pending, 3);
            batches += 1;
        }
    }
    println!(
        "{batches} batches: {} chunk rounds identical, {} refused by both, {} results not \
         received left their output alone, {} non-finite sums decoded as NaN, {} tensor \
         rounds undone",
        total.same, total.refused, total.untouched, total.non_finite, total.undone
    );
    assert!(total.same > 1000, "too few comparisons: {}", total.same);
    assert!(total.refused > 0 && total.untouched > 0);
    assert!(total.non_finite > 0 && total.undone > 0);
}

#[test]
fn batches_match_the_cpu_chains_round_after_round() {
    let mut r = Rng::new(seed("batches_match_the_cpu_chains_round_after_round"));
    compare_batches(&mut r, &Arc::new(EmulatedDevice::new()), &[33, 257, 2049]);
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run with --features cuda -- --ignored on a GPU machine"]
fn gpu_batches_match_the_cpu_chains() {
    let mut r = Rng::new(seed("gpu_batches_match_the_cpu_chains"));
    compare_batches(&mut r, &gpu_device(), &[33, 257, 2049, 100_003]);
}

/// GPU 0 as a device; fails, saying so, where there is none.
#[cfg(feature = "cuda")]
fn gpu_device() -> Arc<pushpull_kernels::cuda::CudaDevice> {
    use pushpull_kernels::cuda::{gpu_available, CudaDevice, GpuContext};
    assert!(
        gpu_available(),
        "this test needs a CUDA GPU, and this machine has none"
    );
    let gpu = GpuContext::new(0).unwrap_or_else(|e| panic!("cannot open GPU 0: {e}"));
    Arc::new(CudaDevice::new(gpu))
}

/// Raw fp32 (a tensor below `min_compress_bytes`, and `compressor = none`) is copied through
/// the device, keeping momentum; error feedback on raw fp32 keeps a zero residual.
#[test]
fn raw_fp32_on_the_device_keeps_momentum() {
    let mut r = Rng::new(seed("raw_fp32_on_the_device_keeps_momentum"));
    let device = Arc::new(EmulatedDevice::new());
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
        // 1000 elements are below 65536 bytes: raw fp32 (momentum kept, no error feedback).
        let t = under(
            &mut r,
            &device,
            &params,
            &[600, 400],
            Node::Worker { rank: 1 },
            65536,
        )
        .unwrap();
        let what = t.what.clone();
        let tally = run_batch(&mut r, &device, &mut [t], 4);
        assert!(tally.same >= 2, "{what}: no round compared");
    }
}

/// Compressors without a device kernel have no device chains; a bad map is refused by name.
#[test]
fn cpu_only_compressors_and_bad_maps() {
    let device = Arc::new(EmulatedDevice::new());
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
        DeviceTensor::build(&device, &[info]).map(|t| t.map(|t| t.name(0).to_string()))
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
        assert_eq!(build(&kv).unwrap(), None, "{kv:?} has device chains");
    }
    // Moniqua is refused for gradients on every path, with the CPU's words.
    let e = build(&[("compressor", "moniqua"), ("bits", "4"), ("theta", "1")]).unwrap_err();
    assert!(e.contains("moniqua cannot compress gradients"), "{e}");
    let e = build(&[("compressor", "minmax"), ("bits", "9")]).unwrap_err();
    assert!(e.contains("bits") && e.contains('9'), "{e}");
}

/// Corrupted payloads (random bit flips, in headers and codes alike) are refused by
/// `DeviceTensor::receive` exactly when the CPU chain refuses them, and when both accept one
/// they decode it to the same bits: the CUDA decoders check nothing themselves, so
/// `GpuScheme::payload_problem` must say what the CPU's decompress says.
#[test]
fn corrupted_payloads_are_refused_as_on_the_cpu() {
    let mut r = Rng::new(seed("corrupted_payloads_are_refused_as_on_the_cpu"));
    let device = Arc::new(EmulatedDevice::new());
    let (mut refused, mut accepted) = (0, 0);
    for &n in &[33usize, 257, 1 + r.below(3000) as usize] {
        for case in cases(&mut r, n) {
            let mut t = under(
                &mut r,
                &device,
                &case.params,
                &[n],
                Node::Worker { rank: 0 },
                0,
            )
            .unwrap();
            let ctx = RoundCtx::new(0);
            let g: Vec<f32> = (0..n).map(|_| r.grad()).collect();
            let mut payload = Vec::new();
            if t.cpu[0].compress(&g, &ctx, &mut payload).is_err() {
                continue;
            }
            let out = device.alloc_zeros(n).unwrap();
            let batch = Arc::new(Batch::new(&device, &[&t.dev]).unwrap());
            let round = BatchRound {
                input: device.mem_addr(&out),
                output: device.mem_addr(&out),
                round: 0,
                lr: None,
                average_over: None,
            };
            for _ in 0..30 {
                let mut bad = payload.clone();
                for _ in 0..1 + r.below(3) {
                    let bit = r.below(8 * bad.len() as u64) as usize;
                    bad[bit / 8] ^= 1 << (bit % 8);
                }
                let mut want = vec![0.0; n];
                let cpu = t.cpu[0].decompress(&bad, &ctx, &mut want);
                // SAFETY: `out` outlives the round, decoded and downloaded below.
                let started = unsafe { batch.start(&[&t.dev], &[round]) }.unwrap();
                match (cpu, started.receive(0, &t.dev, 0, &bad)) {
                    (Err(_), Err(_)) => refused += 1,
                    (Ok(()), Ok(())) => {
                        started.decode().unwrap();
                        let mut got = vec![0.0; n];
                        // SAFETY: `out` holds n elements.
                        unsafe { device.download(device.mem_addr(&out), &mut got).unwrap() };
                        assert_same_bits(&format!("{}: accepted corruption", t.what), &got, &want);
                        accepted += 1;
                    }
                    (cpu, dev) => panic!(
                        "{}: a corrupted payload: cpu {cpu:?}, device {dev:?}",
                        t.what
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

/// A non-finite gradient element fails its chunk with the CPU's error (naming the element),
/// with and without decorators; the refused chunk keeps its state, and the other chunks of the
/// batch (of its tensor and of another) are not disturbed.
#[test]
fn non_finite_gradients_fail_their_chunk_alone() {
    let mut r = Rng::new(seed("non_finite_gradients_fail_their_chunk_alone"));
    let device = Arc::new(EmulatedDevice::new());
    for kv in [
        vec![("compressor", "fp16")],
        vec![("compressor", "minmax"), ("bits", "4")],
        vec![
            ("compressor", "onebit"),
            ("ef", "vanilla"),
            ("momentum", "nesterov"),
        ],
        vec![("compressor", "randomk"), ("k", "0.1"), ("ef", "vanilla")],
    ] {
        let params = map(kv.as_slice());
        let node = Node::Worker { rank: 0 };
        let mut ts = vec![
            under(&mut r, &device, &params, &[500, 500, 300], node, 0).unwrap(),
            under(
                &mut r,
                &device,
                &map(&[("compressor", "bf16")]),
                &[700],
                node,
                0,
            )
            .unwrap(),
        ];
        // One good round first, so there is state to keep.
        run_batch(&mut r, &device, &mut ts, 1);
        let bad_at = 500 + r.below(500) as usize;
        let mut g: Vec<f32> = (0..1300).map(|_| r.grad()).collect();
        g[bad_at] = if r.bool() {
            f32::NAN
        } else {
            f32::NEG_INFINITY
        };
        let g2: Vec<f32> = (0..700).map(|_| r.grad()).collect();
        let (m1, m2) = (
            device.alloc_zeros(1300).unwrap(),
            device.alloc_zeros(700).unwrap(),
        );
        let (a1, a2) = (device.mem_addr(&m1), device.mem_addr(&m2));
        // SAFETY: the buffers hold 1300 and 700 elements.
        unsafe {
            device.upload(&g, a1).unwrap();
            device.upload(&g2, a2).unwrap();
        }
        let round = |input| BatchRound {
            input,
            output: input,
            round: 1,
            lr: None,
            average_over: None,
        };
        let batch = Arc::new(Batch::new(&device, &[&ts[0].dev, &ts[1].dev]).unwrap());
        // SAFETY: the buffers outlive the round.
        let started =
            unsafe { batch.start(&[&ts[0].dev, &ts[1].dev], &[round(a1), round(a2)]) }.unwrap();
        let ctx = RoundCtx::new(1);
        let cpu = ts[0].cpu[1]
            .compress(&g[500..1000], &ctx, &mut Vec::new())
            .unwrap_err();
        let dev = started.finish(0, &mut ts[0].dev, 1).unwrap_err();
        for e in [&cpu, &dev] {
            match e {
                KernelError::NonFinite { index, .. } => {
                    assert_eq!(*index, bad_at - 500, "{}: {e}", ts[0].what)
                }
                other => panic!("{}: {other}", ts[0].what),
            }
        }
        // The neighbours compress as their CPU chains do.
        for (t, c, x) in [(0, 0, &g[..500]), (0, 2, &g[1000..]), (1, 0, &g2[..])] {
            let mut want = Vec::new();
            ts[t].cpu[c].compress(x, &ctx, &mut want).unwrap();
            let got = started.finish(t, &mut ts[t].dev, c).unwrap();
            assert_same_bytes(
                &format!("{} chunk {c} beside a refused chunk", ts[t].what),
                &got,
                &want,
            );
        }
        drop(started);
        // The refused chunk's state is untouched: the next rounds still agree bit for bit.
        let tally = run_batch(&mut r, &device, &mut ts, 2);
        assert!(tally.same >= 4, "{}", ts[0].what);
    }
}

/// The emulated device's copies into staging land when they are waited for, not before (as on
/// a GPU, where reading staging early reads stale bytes).
#[test]
fn emulated_staging_lands_only_when_waited_for() {
    let device = EmulatedDevice::new();
    let src: Vec<u64> = (1..=4).collect();
    let mut staging = device.alloc_staging(32).unwrap();
    // SAFETY: `src` holds 32 bytes.
    unsafe {
        device
            .stage(src.as_ptr() as u64, &mut staging, 0..32)
            .unwrap()
    };
    assert!(
        staging.as_ref().iter().all(|&b| b == 0),
        "staging changed before it was waited for"
    );
    device.wait_staged(&mut staging).unwrap();
    assert_eq!(&staging.as_ref()[..8], &1u64.to_le_bytes());
    assert_eq!(&staging.as_ref()[24..], &4u64.to_le_bytes());
}

/// A round launched and never finished (its round ended early) changes no state, and gives
/// its staging back.
#[test]
fn an_abandoned_round_changes_nothing() {
    let mut r = Rng::new(seed("an_abandoned_round_changes_nothing"));
    let device = Arc::new(EmulatedDevice::new());
    let params = map(&[
        ("compressor", "onebit"),
        ("ef", "vanilla"),
        ("momentum", "nesterov"),
    ]);
    let mut ts = vec![under(
        &mut r,
        &device,
        &params,
        &[300, 300, 77],
        Node::Worker { rank: 2 },
        0,
    )
    .unwrap()];
    run_batch(&mut r, &device, &mut ts, 2);
    let g: Vec<f32> = (0..677).map(|_| r.grad()).collect();
    let m = device.alloc_zeros(677).unwrap();
    let a = device.mem_addr(&m);
    // SAFETY: the buffer holds 677 elements and outlives the round.
    unsafe { device.upload(&g, a).unwrap() };
    let batch = Arc::new(Batch::new(&device, &[&ts[0].dev]).unwrap());
    let round = BatchRound {
        input: a,
        output: a,
        round: 2,
        lr: None,
        average_over: None,
    };
    // SAFETY: as above.
    let started = unsafe { batch.start(&[&ts[0].dev], &[round]) }.unwrap();
    // Only chunk 1 is finished (committed); 0 and 2 are abandoned with the round.
    let mut want = Vec::new();
    ts[0].cpu[1]
        .compress(&g[300..600], &RoundCtx::new(2), &mut want)
        .unwrap();
    assert_same_bytes(
        "the finished chunk",
        &started.finish(0, &mut ts[0].dev, 1).unwrap(),
        &want,
    );
    drop(started);
    // The CPU chains of chunks 0 and 2 never saw round 2; the device's must not have either.
    let tally = run_batch(&mut r, &device, &mut ts, 2);
    assert_eq!(tally.same, 6);
}

/// A round keeps its batch alive: a batch dropped by its owner (a worker's cache evicting it)
/// while a round of it is in flight still finishes and decodes that round.
#[test]
fn a_round_keeps_its_batch_alive() {
    let mut r = Rng::new(seed("a_round_keeps_its_batch_alive"));
    let device = Arc::new(EmulatedDevice::new());
    let params = map(&[("compressor", "minmax"), ("bits", "4"), ("ef", "vanilla")]);
    let mut t = under(
        &mut r,
        &device,
        &params,
        &[1000, 1000, 7],
        Node::Worker { rank: 1 },
        0,
    )
    .unwrap();
    let g: Vec<f32> = (0..2007).map(|_| r.grad()).collect();
    let m = device.alloc_zeros(2007).unwrap();
    let a = device.mem_addr(&m);
    // SAFETY: the buffer holds 2007 elements and outlives the round.
    unsafe { device.upload(&g, a).unwrap() };
    let batch = Arc::new(Batch::new(&device, &[&t.dev]).unwrap());
    let round = BatchRound {
        input: a,
        output: a,
        round: 0,
        lr: None,
        average_over: Some(2.0),
    };
    // SAFETY: as above.
    let started = unsafe { batch.start(&[&t.dev], &[round]) }.unwrap();
    drop(batch);
    let ctx = RoundCtx::new(0);
    let mut want_out = vec![0.0; 2007];
    for c in 0..3 {
        let range = t.chunks[c].clone();
        let mut want = Vec::new();
        t.cpu[c]
            .compress(&g[range.clone()], &ctx, &mut want)
            .unwrap();
        let got = started.finish(0, &mut t.dev, c).unwrap();
        assert_same_bytes(&format!("chunk {c}"), &got, &want);
        started.receive(0, &t.dev, c, &got).unwrap();
        t.cpu[c]
            .decompress(&want, &ctx, &mut want_out[range])
            .unwrap();
    }
    started.decode().unwrap();
    drop(started);
    for v in &mut want_out {
        *v /= 2.0;
    }
    let mut got = vec![0.0; 2007];
    // SAFETY: the buffer holds 2007 elements.
    unsafe { device.download(a, &mut got).unwrap() };
    assert_same_bits("decoded after the batch was dropped", &got, &want_out);
}

/// A round of a batch costs the same driver calls whatever its number of chunks: one table
/// copy, a launch per step, one staging copy and its wait; one copy and the decode launches.
#[test]
fn driver_calls_per_round_do_not_grow_with_chunks() {
    let mut r = Rng::new(seed("driver_calls_per_round_do_not_grow_with_chunks"));
    for kv in [
        vec![
            ("compressor", "onebit"),
            ("scaling", "true"),
            ("ef", "vanilla"),
            ("momentum", "nesterov"),
        ],
        vec![("compressor", "randomk"), ("k", "0.05"), ("ef", "vanilla")],
        vec![("compressor", "minmax"), ("bits", "3"), ("bucket", "100")],
        vec![("compressor", "none")],
    ] {
        let params = map(kv.as_slice());
        let mut per_round = Vec::new();
        for chunks in [1usize, 3, 300] {
            let device = Arc::new(EmulatedDevice::new());
            let node = Node::Worker { rank: 0 };
            let mut t = under(&mut r, &device, &params, &vec![40; chunks], node, 0).unwrap();
            let batch = Arc::new(Batch::new(&device, &[&t.dev]).unwrap());
            let m = device.alloc_zeros(40 * chunks).unwrap();
            let a = device.mem_addr(&m);
            let mut calls = Vec::new();
            for round in 1..4u64 {
                let g: Vec<f32> = (0..40 * chunks).map(|_| r.grad()).collect();
                // SAFETY: `m` holds g.len() elements.
                unsafe { device.upload(&g, a).unwrap() };
                let before = device.driver_calls();
                let br = BatchRound {
                    input: a,
                    output: a,
                    round,
                    lr: None,
                    average_over: Some(2.0),
                };
                // SAFETY: `m` outlives the round.
                let started = unsafe { batch.start(&[&t.dev], &[br]) }.unwrap();
                for c in 0..chunks {
                    let p = started.finish(0, &mut t.dev, c).unwrap();
                    started.receive(0, &t.dev, c, &p).unwrap();
                }
                started.decode().unwrap();
                drop(started);
                calls.push(device.driver_calls() - before);
            }
            println!("{kv:?}, {chunks} chunks: driver calls per round {calls:?}");
            // From the second round on, the table's copy of the round before is waited for.
            assert_eq!(calls[1], calls[2], "{kv:?}: steady state");
            per_round.push(calls[2]);
        }
        assert!(
            per_round.iter().all(|&c| c == per_round[0]),
            "{kv:?}: {per_round:?}"
        );
        assert!(
            per_round[0] <= 16,
            "{kv:?}: {per_round:?} driver calls a round"
        );
    }
}
