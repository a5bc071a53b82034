//! push_pull and broadcast of tensors in device memory through the real scheduler and servers,
//! on the [`EmulatedDevice`] (the CUDA kernels' host twin: what CI has instead of a GPU):
//! the whole device data path (chunk ranges, device chains with error feedback and momentum,
//! payloads to and from the host, the average on the device, the CPU fallback of top-k) must
//! give the single-process reference's bits, in a job where some workers hand in device
//! buffers and others host buffers (servers do not care where a worker compressed).
//!
//! The same on a real GPU is `gpu_device_buffers_give_the_reference_bits`, ignored without
//! one: `cargo test -p pushpull-worker --features cuda --test device -- --ignored`.

use std::sync::Arc;

use pushpull_worker::{Device, EmulatedDevice, Place, Reduce, Tensor, Worker, WorkerError};

mod common;
use common::set::*;
use common::*;

/// One worker's buffer for one call: on the host, or on `D`.
async fn call<D: Device>(
    w: &Worker,
    t: &Tensor,
    device: Option<&Arc<D>>,
    x: Vec<f32>,
    reduce: Reduce,
) -> Result<Vec<f32>, WorkerError> {
    let Some(device) = device else {
        return w.push_pull(t, x, reduce).await;
    };
    let mem = w
        .push_pull_device(t, device, to_device(device, &x), reduce)
        .await?;
    Ok(from_device(device, &mem))
}

/// `x` in a new buffer on `device`.
fn to_device<D: Device>(device: &Arc<D>, x: &[f32]) -> D::Mem {
    let mem = device.alloc_zeros(x.len()).unwrap();
    // SAFETY: `mem` holds x.len() elements.
    unsafe { device.upload(x, device.mem_addr(&mem)).unwrap() };
    mem
}

/// `mem`'s contents.
fn from_device<D: Device>(device: &Arc<D>, mem: &D::Mem) -> Vec<f32> {
    let mut out = vec![f32::NAN; device.mem_len(mem)];
    // SAFETY: `mem` holds out.len() elements.
    unsafe { device.download(device.mem_addr(mem), &mut out).unwrap() };
    out
}

/// One worker's round of every tensor of `set` as group calls, one per reduce op (a group has
/// one): its device's batch when `device` is given. Results by tensor.
async fn group_round<D: Device>(
    w: &Worker,
    ts: &[Tensor],
    set: &[(&'static str, u64, pushpull_worker::ParamMap, Reduce)],
    device: Option<&Arc<D>>,
    xs: Vec<Vec<f32>>,
) -> Vec<Vec<f32>> {
    let mut out: Vec<Option<Vec<f32>>> = vec![None; set.len()];
    for op in [Reduce::Average, Reduce::Sum] {
        let which: Vec<usize> = (0..set.len()).filter(|&i| set[i].3 == op).collect();
        match device {
            Some(d) => {
                let calls = which
                    .iter()
                    .map(|&i| (ts[i].clone(), to_device(d, &xs[i])))
                    .collect();
                let handles = w.push_pull_group_device(calls, d, op).await;
                for (&i, h) in which.iter().zip(handles) {
                    out[i] = Some(from_device(d, &h.await.unwrap()));
                }
            }
            None => {
                let calls = which
                    .iter()
                    .map(|&i| (ts[i].clone(), xs[i].clone()))
                    .collect();
                let handles = w.push_pull_group(calls, op).await;
                for (&i, h) in which.iter().zip(handles) {
                    out[i] = Some(h.await.unwrap());
                }
            }
        }
    }
    out.into_iter().map(Option::unwrap).collect()
}

/// The tensor set for [`ROUNDS`] rounds of `workers` in local groups of `local_size`, with
/// ranks in `on_device` handing in buffers on `device` (with one call per tensor, or
/// `grouped`: one group call per reduce op, every rank), then a broadcast of every tensor from
/// rank 0 (checked against rank 0's data); returns `[round][tensor][rank]` and every tensor's
/// metrics on the first device rank.
async fn run_mixed<D: Device>(
    seed: u64,
    device: Arc<D>,
    (workers, local_size): (u32, u32),
    on_device: &[usize],
    grouped: bool,
) -> (Vec<Vec<Vec<Vec<f32>>>>, Vec<pushpull_worker::TensorMetrics>) {
    let s = stack_with(workers, SERVERS, PARTITION_BYTES, |c| {
        set_config(c, seed);
        c.cluster.local_size = local_size;
    })
    .await;
    let set = tensor_set();
    let mut tensors: Vec<Vec<Tensor>> = Vec::new();
    for (name, len, params, _) in &set {
        tensors.push(declare_all_with(&s, name, *len, params.clone()).await);
    }
    let dev = |r: usize| on_device.contains(&r).then_some(&device);
    let mut out = Vec::new();
    for round in 0..ROUNDS {
        for (r, w) in s.workers.iter().enumerate() {
            if round > 0 && discarded(round - 1) {
                let mine: Vec<Tensor> = tensors.iter().map(|t| t[r].clone()).collect();
                w.discard_last_round(&mine).await.unwrap();
            }
            w.set_learning_rate(lr(round));
        }
        if grouped {
            let rounds = s.workers.iter().enumerate().map(|(r, w)| {
                let xs = (0..set.len())
                    .map(|i| step_input(seed, round, r as u32, i, set[i].1 as usize))
                    .collect();
                let ts: Vec<Tensor> = tensors.iter().map(|t| t[r].clone()).collect();
                let set = &set;
                async move { group_round(w, &ts, set, dev(r), xs).await }
            });
            let by_rank = futures_util::future::join_all(rounds).await;
            out.push(
                (0..set.len())
                    .map(|i| by_rank.iter().map(|r| r[i].clone()).collect())
                    .collect(),
            );
            continue;
        }
        let mut per_tensor = Vec::new();
        for (i, (_, len, _, reduce)) in set.iter().enumerate() {
            let calls = s.workers.iter().enumerate().map(|(r, w)| {
                let x = step_input(seed, round, r as u32, i, *len as usize);
                call(w, &tensors[i][r], dev(r), x, *reduce)
            });
            let ranks: Vec<Vec<f32>> = futures_util::future::join_all(calls)
                .await
                .into_iter()
                .map(|r| r.unwrap())
                .collect();
            per_tensor.push(ranks);
        }
        out.push(per_tensor);
    }
    // Broadcasts from device memory and from the host, mixed: everyone gets rank 0's bits.
    // (After the push_pull rounds, whose round numbers then match the reference's.)
    for (i, (_, len, _, _)) in set.iter().enumerate() {
        let root_data = input(seed ^ 0xb0, 0, 0, i, *len as usize);
        let calls = s.workers.iter().enumerate().map(|(r, w)| {
            let t = &tensors[i][r];
            let x = if r == 0 {
                root_data.clone()
            } else {
                vec![0.0; *len as usize]
            };
            async move {
                match dev(r) {
                    Some(d) => {
                        let mem = w.broadcast_device(t, d, to_device(d, &x), 0).await.unwrap();
                        from_device(d, &mem)
                    }
                    None => w.broadcast(t, x, 0).await.unwrap(),
                }
            }
        });
        for got in futures_util::future::join_all(calls).await {
            assert!(same_bits(&got, &root_data), "broadcast of tensor {i}");
        }
    }
    let first = on_device.first().copied().unwrap_or(0);
    let metrics = tensors.iter().map(|ts| ts[first].metrics()).collect();
    s.finish_all().await;
    (out, metrics)
}

fn check_against_reference(
    seed: u64,
    got: &[Vec<Vec<Vec<f32>>>],
    metrics: &[pushpull_worker::TensorMetrics],
    place: Place,
) {
    check_groups_against_reference(seed, (WORKERS, 1), got, metrics, place);
}

/// [`check_against_reference`] for a job of `workers` in local groups of `local_size`.
fn check_groups_against_reference(
    seed: u64,
    (workers, local_size): (u32, u32),
    got: &[Vec<Vec<Vec<f32>>>],
    metrics: &[pushpull_worker::TensorMetrics],
    place: Place,
) {
    let reference = run_reference_of(seed, workers, local_size);
    if let Some(d) = first_difference(got, &reference) {
        panic!("device buffers vs reference (seed {seed}, groups of {local_size}): {d}");
    }
    // Where each tensor was compressed: top-k, Elias-coded dithering and column-wise onebit
    // have no device kernel (the CPU fallback), and PowerSGD runs on the host (its steps copy
    // the tensor there and back); the others ran on the device, the small raw tensor included.
    // In local groups every chunk is compressed by its owner on the host's sum.
    let on_host = [
        "topk",
        "dithering elias",
        "onebit columns",
        "powersgd",
        "powersgd sum",
        "powersgd bucket",
    ];
    for (i, ((name, ..), m)) in tensor_set().iter().zip(metrics).enumerate() {
        let want = if local_size > 1 || on_host.contains(name) {
            Place::Cpu
        } else {
            place
        };
        assert_eq!(m.device, want, "{name}: compressed on");
        assert_eq!(m.buffer_device, place, "{name}: buffer on");
        assert_eq!(m.rounds_done, ROUNDS + 1, "{name}: rounds");
        assert_eq!(
            m.rounds_non_finite,
            non_finite_rounds(i),
            "{name}: non-finite rounds"
        );
    }
}

/// A job on the emulated device for the ranks `on_device` (with separate or group calls)
/// against the reference.
async fn emulated_job_gives_the_reference_bits(on_device: &[usize], grouped: bool) {
    tokio::time::timeout(TIMEOUT * 2, async {
        let seed = seed();
        let device = Arc::new(EmulatedDevice::new());
        let (got, metrics) = run_mixed(seed, device, (WORKERS, 1), on_device, grouped).await;
        check_against_reference(seed, &got, &metrics, Place::Emulated);
    })
    .await
    .expect("timed out");
}

/// Local groups with device and host buffers mixed in each group (two hosts of two; ranks 0
/// and 3 on the device): a device member's chunks are copied to the host's sum and the
/// result back, and the job gives the two-level reference's bits, with one call per tensor
/// and with group calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_buffers_in_local_groups_give_the_reference_bits() {
    tokio::time::timeout(TIMEOUT * 4, async {
        for grouped in [false, true] {
            let seed = seed();
            let device = Arc::new(EmulatedDevice::new());
            let (got, metrics) = run_mixed(seed, device, (4, 2), &[0, 3], grouped).await;
            check_groups_against_reference(seed, (4, 2), &got, &metrics, Place::Emulated);
        }
    })
    .await
    .expect("timed out");
}

/// A host with no page-locked memory to give: the host copies of device buffers in local
/// groups go through pageable memory, and the job still gives the reference's bits (a member
/// whose copy failed would have made every round's host sum NaN).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_page_locked_memory_host_copies_are_pageable() {
    tokio::time::timeout(TIMEOUT * 2, async {
        let seed = seed();
        let device = Arc::new(EmulatedDevice::with_staging_limit(0));
        let (got, metrics) = run_mixed(seed, device, (4, 2), &[0, 3], false).await;
        check_groups_against_reference(seed, (4, 2), &got, &metrics, Place::Emulated);
    })
    .await
    .expect("timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_buffers_give_the_reference_bits() {
    // Ranks 0 and 2 on the device, rank 1 on the host.
    emulated_job_gives_the_reference_bits(&[0, 2], false).await;
}

/// The same with group calls: a device rank's tensors of one call are one batch (top-k's
/// chunks, which have no kernel, compressed on the host beside it), decoded together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_device_buffers_give_the_reference_bits() {
    emulated_job_gives_the_reference_bits(&[0, 1], true).await;
}

/// A group call's tensors cost one batch's driver calls a round (a dozen or so, and the same
/// for two tensors as for twenty); one call per tensor costs that many per tensor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_call_costs_one_batch_of_driver_calls() {
    tokio::time::timeout(TIMEOUT, async {
        let s = stack(1, 1, 64 * 1024).await;
        let w = &s.workers[0];
        let p = map(&[
            ("compressor", "onebit"),
            ("ef", "vanilla"),
            ("momentum", "nesterov"),
        ]);
        let mut ts = Vec::new();
        for i in 0..20 {
            ts.push(
                w.declare(&format!("t{i}"), 40_000, p.clone())
                    .await
                    .unwrap(),
            );
        }
        let device = Arc::new(EmulatedDevice::new());
        let per_round = |n: usize| {
            let (device, ts) = (device.clone(), ts[..n].to_vec());
            async move {
                let mut calls = Vec::new();
                for round in 0..3 {
                    let before = device.driver_calls();
                    let group = ts
                        .iter()
                        .map(|t| (t.clone(), to_device(&device, &data(round, 40_000))))
                        .collect();
                    let uploads = device.driver_calls() - before;
                    for h in w.push_pull_group_device(group, &device, Reduce::Sum).await {
                        h.await.unwrap();
                    }
                    calls.push(device.driver_calls() - before - uploads);
                }
                calls
            }
        };
        let (two, twenty) = (per_round(2).await, per_round(20).await);
        println!("driver calls per round: 2 tensors {two:?}, 20 tensors {twenty:?}");
        // After the first rounds (which allocate), a round is one batch either way.
        assert_eq!(two[2], twenty[2], "two tensors {two:?}, twenty {twenty:?}");
        assert!(two[2] <= 16, "{two:?}");
        s.finish_all().await;
    })
    .await
    .expect("timed out");
}

/// Chunks that go through the host (a local group's sum, a compressor without a kernel, a
/// broadcast) cost one copy of the tensor each way a round, not one per chunk: the driver
/// calls of a round are the same for a tensor of 4 chunks and of 32, and the host copy (the
/// device's staging, kept by the tensor) is in its metrics' `device_bytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_through_the_host_cost_one_copy_of_the_tensor_each_way() {
    tokio::time::timeout(TIMEOUT * 2, async {
        const CHUNK: u64 = 4096;
        // (workers, local group size, compressor): a group's sum, top-k's CPU chain.
        let cases = [
            (4, 2, map(&[("compressor", "onebit"), ("ef", "vanilla")])),
            (
                1,
                1,
                map(&[("compressor", "topk"), ("k", "0.25"), ("ef", "vanilla")]),
            ),
        ];
        for (workers, local_size, p) in cases {
            let compressor = p["compressor"].clone();
            let s = stack_with(workers, 1, CHUNK * 4, |c| c.cluster.local_size = local_size).await;
            let mut per_round = Vec::new();
            for chunks in [4u64, 32] {
                let len = chunks * CHUNK;
                let ts = declare_all_with(&s, &format!("t{chunks}"), len, p.clone()).await;
                let devices: Vec<_> = (0..workers)
                    .map(|_| Arc::new(EmulatedDevice::new()))
                    .collect();
                let mut calls = Vec::new();
                for round in 0..3 {
                    let mems: Vec<_> = devices
                        .iter()
                        .enumerate()
                        .map(|(r, d)| to_device(d, &data(round * 10 + r as u64, len as usize)))
                        .collect();
                    let before: u64 = devices.iter().map(|d| d.driver_calls()).sum();
                    let rounds = s.workers.iter().zip(&ts).zip(&devices).zip(mems).map(
                        |(((w, t), d), mem)| async move {
                            w.push_pull_device(t, d, mem, Reduce::Average)
                                .await
                                .unwrap()
                        },
                    );
                    let _mems = futures_util::future::join_all(rounds).await;
                    calls.push(devices.iter().map(|d| d.driver_calls()).sum::<u64>() - before);
                }
                // The host copy (the device's staging) stays with the tensor, and counts.
                let held = ts[0].metrics().device_bytes;
                assert!(held >= 4 * len, "{compressor}: {held} bytes held");
                per_round.push((chunks, calls));
            }
            println!("{compressor}, groups of {local_size}: driver calls per round {per_round:?}");
            let [(_, four), (_, many)] = &per_round[..] else {
                unreachable!()
            };
            assert_eq!(four[2], many[2], "{compressor}: {per_round:?}");
            // Each way: a copy through staging and its wait (3 calls on the emulated device).
            assert!(four[2] <= 6 * workers as u64, "{compressor}: {per_round:?}");
            s.finish_all().await;
        }
    })
    .await
    .expect("timed out");
}

#[cfg(feature = "cuda")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU: run with --features cuda -- --ignored on a GPU machine"]
async fn gpu_device_buffers_give_the_reference_bits() {
    use pushpull_worker::{CudaDevice, GpuContext};
    let gpu = GpuContext::new(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"));
    let ordinal = gpu.context().ordinal();
    let seed = seed();
    let device = Arc::new(CudaDevice::new(gpu));
    let (got, metrics) = run_mixed(seed, device.clone(), (WORKERS, 1), &[0, 2], false).await;
    check_against_reference(seed, &got, &metrics, Place::Cuda { ordinal });
    let (got, metrics) = run_mixed(seed, device.clone(), (WORKERS, 1), &[0, 1], true).await;
    check_against_reference(seed, &got, &metrics, Place::Cuda { ordinal });
    // Local groups: the device members' host copies in page-locked staging.
    let on = Place::Cuda { ordinal };
    let (got, metrics) = run_mixed(seed, device, (4, 2), &[0, 3], true).await;
    check_groups_against_reference(seed, (4, 2), &got, &metrics, on);
}

/// A tensor's push_pull rounds stay where the first ran (its error feedback lives there): a
/// device buffer after host rounds, or the other way round, is refused by name before any
/// round is used, and the job goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tensor_stays_where_its_rounds_ran() {
    tokio::time::timeout(TIMEOUT, async {
        let s = stack(1, 1, 64 * 1024).await;
        let w = &s.workers[0];
        let ef = map(&[("compressor", "onebit"), ("ef", "vanilla")]);
        let host_t = w.declare("host", 50_000, ef.clone()).await.unwrap();
        let dev_t = w.declare("dev", 50_000, ef).await.unwrap();
        let device = Arc::new(EmulatedDevice::new());
        let x = data(7, 50_000);
        call::<EmulatedDevice>(w, &host_t, None, x.clone(), Reduce::Sum)
            .await
            .unwrap();
        call(w, &dev_t, Some(&device), x.clone(), Reduce::Sum)
            .await
            .unwrap();
        let e = call(w, &host_t, Some(&device), x.clone(), Reduce::Sum)
            .await
            .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, WorkerError::Device { .. }), "{text}");
        assert!(
            text.contains("\"host\"") && text.contains("run on cpu") && text.contains("emulated"),
            "{text}"
        );
        let e = call::<EmulatedDevice>(w, &dev_t, None, x.clone(), Reduce::Sum)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("run on emulated"), "{e}");
        // No round was used: both tensors go on where they are.
        assert_eq!((host_t.rounds_started(), dev_t.rounds_started()), (1, 1));
        call::<EmulatedDevice>(w, &host_t, None, x.clone(), Reduce::Sum)
            .await
            .unwrap();
        call(w, &dev_t, Some(&device), x, Reduce::Sum)
            .await
            .unwrap();
        // Broadcasts touch no state: any buffer will do.
        let mem = device.alloc_zeros(50_000).unwrap();
        w.broadcast_device(&host_t, &device, mem, 0).await.unwrap();
        s.finish_all().await;
    })
    .await
    .expect("timed out");
}

/// `worker.device = "cpu"`: device buffers are copied to the host and reduced there (the
/// metrics say so), with the same bits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_device_cpu_reduces_device_buffers_on_the_host() {
    tokio::time::timeout(TIMEOUT, async {
        let s = stack_with(2, 1, 64 * 1024, |c| c.worker.device = "cpu".into()).await;
        let p = map(&[("compressor", "minmax"), ("bits", "4"), ("ef", "vanilla")]);
        let ts = declare_all_with(&s, "t", 30_000, p).await;
        let device = Arc::new(EmulatedDevice::new());
        let xs: Vec<Vec<f32>> = (0..2).map(|r| data(100 + r, 30_000)).collect();
        let (a, b) = tokio::join!(
            call(
                &s.workers[0],
                &ts[0],
                Some(&device),
                xs[0].clone(),
                Reduce::Sum
            ),
            call::<EmulatedDevice>(&s.workers[1], &ts[1], None, xs[1].clone(), Reduce::Sum),
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(same_bits(&a, &b));
        let m = ts[0].metrics();
        assert_eq!((m.device, m.buffer_device), (Place::Cpu, Place::Emulated));
        // Memory lent by address is refused by name (the caller copies to the host).
        let x = vec![0f32; 30_000];
        let lent = vec![(ts[0].clone(), x.as_ptr() as u64, x.len(), ())];
        // SAFETY: `x` outlives the call, which refuses without touching it.
        let handles = unsafe {
            s.workers[0]
                .push_pull_group_borrowed(lent, &device, Reduce::Sum)
                .await
        };
        let e = handles.into_iter().next().unwrap().await.unwrap_err();
        assert!(
            e.to_string().contains("\"t\"") && e.to_string().contains("worker.device"),
            "{e}"
        );
        assert_eq!(ts[0].rounds_started(), 1);
        s.finish_all().await;
    })
    .await
    .expect("timed out");
}

/// A device out of memory: a tensor whose state does not fit is refused by name (the bytes
/// asked for) before its round, and so is a call whose batch does not fit; neither uses a
/// round number nor disturbs the other worker, which waits, and the next call (on a device
/// with room) completes the round with the same bits as the host path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_out_of_memory_is_named_and_costs_no_round() {
    tokio::time::timeout(TIMEOUT, async {
        let s = stack(2, 1, 64 * 1024).await;
        let p = map(&[
            ("compressor", "onebit"),
            ("ef", "vanilla"),
            ("momentum", "nesterov"),
        ]);
        let ts = declare_all_with(&s, "g", 50_000, p).await;
        let xs: Vec<Vec<f32>> = (0..2).map(|r| data(300 + r, 50_000)).collect();
        let roomy = Arc::new(EmulatedDevice::new());
        // Worker 0's round of "g" on a device.
        let worker0 = |d: Arc<EmulatedDevice>| {
            let (w, t, x) = (&s.workers[0], &ts[0], xs[0].clone());
            async move { call(w, t, Some(&d), x, Reduce::Sum).await }
        };
        // Worker 1 pushes round 0 from the host and waits for worker 0.
        let (w1, t1, x1) = (s.workers[1].clone(), ts[1].clone(), xs[1].clone());
        let other = tokio::spawn(async move {
            let a = w1.push_pull(&t1, x1.clone(), Reduce::Sum).await.unwrap();
            let b = w1.push_pull(&t1, x1, Reduce::Sum).await.unwrap();
            (a, b)
        });
        // The tensor's state (residual, momentum: 1.2 MB) does not fit beside the 200 kB
        // buffer on a device of 300 kB.
        let tiny = Arc::new(EmulatedDevice::with_limit(300_000));
        let e = worker0(tiny.clone()).await.unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, WorkerError::Device { .. }), "{text}");
        assert!(
            text.contains("\"g\"") && text.contains("out of memory") && text.contains("bytes"),
            "{text}"
        );
        assert_eq!(ts[0].rounds_started(), 0);
        // With room: round 0.
        let a = worker0(roomy.clone()).await.unwrap();
        // The state exists now, but a new batch (arena, table, staging: some 15 kB) does not
        // fit beside the buffer on a device of 210 kB.
        let tiny = Arc::new(EmulatedDevice::with_limit(210_000));
        let e = worker0(tiny.clone()).await.unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("\"g\"")
                && text.contains("out of memory")
                && text.contains("no round was used"),
            "{text}"
        );
        assert_eq!(ts[0].rounds_started(), 1);
        // Round 1 on the device with room: the other worker was only kept waiting.
        let b = worker0(roomy.clone()).await.unwrap();
        let (a1, b1) = other.await.unwrap();
        assert!(
            same_bits(&a, &a1) && same_bits(&b, &b1),
            "both workers got the same sums"
        );
        assert_eq!(ts[0].rounds_started(), 2);
        s.finish_all().await;
    })
    .await
    .expect("timed out");
}

/// A device still busy with work queued before a group call's batch (on a GPU: the training's
/// kernels) holds up that call's rounds and nothing else: neither the runtime's threads (the
/// group, and the single calls beside it, have more tensors than the runtime has threads, and
/// a wait for the device blocks; top-k's calls wait for the copy of their buffer to the host)
/// nor the frames of a lower-priority tensor (the group's send holds wait for its payloads). A
/// round of host buffers goes through while the device is held; a thread releases it after
/// 20 s whatever happens, so that the old behaviour fails the test instead of hanging it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_device_holds_up_its_own_rounds_only() {
    tokio::time::timeout(TIMEOUT, async {
        let s = stack(1, 1, 64 * 1024).await;
        let w = s.workers[0].clone();
        let p = map(&[("compressor", "onebit"), ("ef", "vanilla")]);
        let mut ts = Vec::new();
        for i in 0..6 {
            ts.push(
                w.declare_with_priority(&format!("d{i}"), 40_000, p.clone(), 10)
                    .await
                    .unwrap(),
            );
        }
        let mut single = Vec::new();
        let topk = map(&[("compressor", "topk"), ("k", "0.1")]);
        for i in 0..7 {
            let p = if i < 3 { p.clone() } else { topk.clone() };
            single.push(w.declare(&format!("s{i}"), 40_000, p).await.unwrap());
        }
        let host = w
            .declare_with_priority("h", 5_000, map(&[]), -10)
            .await
            .unwrap();
        // The last two top-k calls on a device without page-locked memory: their copies are
        // blocking ones.
        let device = Arc::new(EmulatedDevice::new());
        let paged = Arc::new(EmulatedDevice::with_staging_limit(0));
        let on = |i: usize| if i < 5 { &device } else { &paged };
        let group_mems: Vec<_> = (0..ts.len())
            .map(|i| to_device(&device, &data(i as u64, 40_000)))
            .collect();
        let single_mems: Vec<_> = (0..single.len())
            .map(|i| to_device(on(i), &data(10 + i as u64, 40_000)))
            .collect();
        device.hold_staging();
        paged.hold_staging();
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let release = {
            let (device, paged) = (device.clone(), paged.clone());
            std::thread::spawn(move || {
                let _ = finished.recv_timeout(std::time::Duration::from_secs(20));
                device.release_staging();
                paged.release_staging();
            })
        };
        let group = {
            let (w, device) = (w.clone(), device.clone());
            let calls: Vec<_> = ts.iter().cloned().zip(group_mems).collect();
            tokio::spawn(async move {
                let handles = w.push_pull_group_device(calls, &device, Reduce::Sum).await;
                for h in handles {
                    h.await.unwrap();
                }
            })
        };
        let singles: Vec<_> = single
            .iter()
            .zip(single_mems)
            .enumerate()
            .map(|(i, (t, mem))| {
                let (w, device, t) = (w.clone(), on(i).clone(), t.clone());
                tokio::spawn(async move {
                    w.push_pull_device(&t, &device, mem, Reduce::Sum)
                        .await
                        .unwrap()
                })
            })
            .collect();
        // Until every call waits for its device: the group's batch, the onebit calls' own,
        // the top-k calls' copies of their buffers (staged, and blocking ones).
        let waits = |d: &EmulatedDevice| d.held_waits();
        let want = (1 + 5, 2);
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while (waits(&device), waits(&paged)) != want && std::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(
            (waits(&device), waits(&paged)),
            want,
            "the calls that wait for the devices"
        );
        let x = data(99, 5_000);
        let got = w.push_pull(&host, x.clone(), Reduce::Sum).await.unwrap();
        assert!(
            device.staging_held() && paged.staging_held(),
            "the host round finished only after the devices were released"
        );
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&x), "one worker's sum is its own data");
        drop(done);
        group.await.unwrap();
        for call in singles {
            call.await.unwrap();
        }
        release.join().unwrap();
        s.finish_all().await;
    })
    .await
    .expect("timed out");
}
