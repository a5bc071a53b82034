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
mod device_common;

use std::sync::Arc;

use cuda_common::*;
use device_common::*;
use pushpull_kernels::chunk::{ChunkInfo, Node};
use pushpull_kernels::device::{Batch, BatchRound, Device, DeviceTensor, EmulatedDevice};
use pushpull_kernels::{KernelError, RoundCtx};

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
                    let t = run_batch(r, device, &mut batch, 0..3);
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
            run_batch(r, device, &mut pending, 0..3);
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

/// Another stream ordered after a ticket (`Device::wait_ticket`) runs nothing until the
/// device's stream has passed the ticket's signal, and then sees everything that stream wrote
/// before it: the signal is queued right behind an asynchronous 256 MiB upload (no host wait
/// in between), 0.3 s after the other stream's wait and its copy of the buffer were queued.
/// Without the wait the copy reads the zeros that were there, and without the write's ordering
/// after the upload (its memory barrier) part of the upload. The emulated device's twin is in
/// `device/ticket.rs`.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run with --features cuda -- --ignored on a GPU machine"]
fn gpu_a_stream_waits_for_its_ticket() {
    let d = gpu_device();
    let other = d.gpu().context().new_stream().expect("another stream");
    let n = 1 << 26;
    let buf = d.alloc_zeros(n).expect("device memory");
    let addr = d.mem_addr(&buf);
    let ticket = d.ticket().expect("a ticket");
    // SAFETY: `other` is a live stream of the device's context; the ticket is signalled below.
    unsafe { d.wait_ticket(other.cu_stream() as u64, ticket) }.expect("cuStreamWaitValue32");
    let writer = {
        let d = d.clone();
        std::thread::spawn(move || {
            let mut staging = d.alloc_staging(4 * n).expect("page-locked memory");
            for w in staging.as_mut().chunks_exact_mut(4) {
                w.copy_from_slice(&1.0f32.to_le_bytes());
            }
            std::thread::sleep(std::time::Duration::from_millis(300));
            // SAFETY: `addr` is `buf`'s n f32, alive until the thread is joined.
            unsafe { d.upload_staged(&mut staging, 0..4 * n, addr) }.expect("upload");
            d.signal(ticket).expect("cuStreamWriteValue32");
            d.wait_staged(&mut staging).expect("the upload");
        })
    };
    let read = other.clone_dtoh(&buf).expect("the other stream's copy");
    writer.join().unwrap();
    let wrong = read.iter().filter(|&&x| x != 1.0).count();
    assert_eq!(
        wrong, 0,
        "the other stream read {wrong} of {n} elements before the signal"
    );
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
        let tally = run_batch(&mut r, &device, &mut [t], 0..4);
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
        vec![("compressor", "onebit"), ("columns", "100"), ("ef", "none")],
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
        run_batch(&mut r, &device, &mut ts, 0..1);
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
                // The first round's extreme inputs can leave a residual that overflows before
                // the bad element is reached: both chains must say so.
                KernelError::Overflow { .. } => {
                    assert_eq!(cpu.to_string(), dev.to_string(), "{}: overflow", ts[0].what)
                }
                other => panic!("{}: {other}", ts[0].what),
            }
        }
        // The neighbours compress as their CPU chains do.
        for (t, c, x) in [(0, 0, &g[..500]), (0, 2, &g[1000..]), (1, 0, &g2[..])] {
            let mut want = Vec::new();
            assert_same_outcome(
                &format!("{} chunk {c} beside a refused chunk", ts[t].what),
                ts[t].cpu[c].compress(x, &ctx, &mut want),
                &want,
                started.finish(t, &mut ts[t].dev, c),
            );
        }
        drop(started);
        // The refused chunk's state is untouched: the next rounds still agree bit for bit.
        let tally = run_batch(&mut r, &device, &mut ts, 2..4);
        assert!(tally.same >= 4, "{}", ts[0].what);
    }
}

/// A checkpoint's state in and out of device chains: what goes in comes out (residual,
/// momentum, the last learning rate), and a state that does not fit the chain is refused by
/// name, changing nothing.
#[test]
fn chain_state_round_trips_and_misfits_are_refused() {
    use pushpull_kernels::ChainState;
    let device = Arc::new(EmulatedDevice::new());
    let params = map(&[
        ("compressor", "onebit"),
        ("ef", "corrected"),
        ("momentum", "nesterov"),
    ]);
    let info = |len| ChunkInfo {
        params: &params,
        tensor_len: 2 * len as u64,
        chunk_len: len as u64,
        full_chunk_len: len as u64,
        key: 7,
        job_seed: 3,
        node: Node::Worker { rank: 0 },
        min_compress_bytes: 0,
    };
    let mut t = DeviceTensor::build(&device, &[info(500), info(500)])
        .unwrap()
        .expect("onebit has device chains");
    let zero = t.chain_state(1).unwrap();
    assert_eq!(zero.residual.as_deref(), Some(&[0.0f32; 500][..]));
    let mut r = Rng::new(seed("chain_state_round_trips_and_misfits_are_refused"));
    let state = ChainState {
        residual: Some((0..500).map(|_| r.unit() * 2.0 - 1.0).collect()),
        momentum: Some((0..500).map(|_| r.unit() * 2.0 - 1.0).collect()),
        prev_lr: Some(0.05),
    };
    t.set_chain_state(1, &state).unwrap();
    assert_eq!(t.chain_state(1).unwrap(), state);
    assert_eq!(
        t.chain_state(0).unwrap(),
        zero,
        "the other chunk is untouched"
    );
    let misfits = [
        ChainState {
            momentum: None,
            ..state.clone()
        },
        ChainState {
            residual: Some(vec![1.0; 499]),
            ..state.clone()
        },
    ];
    for bad in misfits {
        let e = t.set_chain_state(0, &bad).unwrap_err().to_string();
        assert!(e.contains("nesterov") && e.contains("saved"), "{e}");
        assert_eq!(t.chain_state(0).unwrap(), zero, "a refusal changes nothing");
    }
}
