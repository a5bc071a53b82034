//! The CUDA kernels' throughput on a GPU: GB/s of fp32 input for compress, decompress and
//! decompress-add of every compressor that has a kernel, against a device-to-device copy of the
//! same buffer measured in the same run; then a worker's whole path for a tensor's chunks as
//! one batch (momentum, error feedback, the codec, the checks and the copy of the payloads into
//! page-locked staging: `Batch::start` and `Started::finish` as the worker calls them) for the
//! default presets, next to the same chains on one CPU core, with the driver calls a round
//! took.
//!
//! ```text
//! cargo run --release -p pushpull-kernels --features cuda --example bench_gpu -- \
//!     [--elements 26843546] [--chunk 1048576] [--reps 20] [--filter SUBSTRING]
//! ```
//!
//! Needs a CUDA GPU (the kernels are the PTX shipped with the crate); without one it says so and
//! exits 2.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use pushpull_kernels::bench::{default_cases, test_data};
use pushpull_kernels::chunk::{chunk_codec, ChunkInfo, Node};
use pushpull_kernels::cuda::{
    gpu_available, nvrtc_requested, ptx_arch, CudaDevice, GpuCodec, GpuContext, GpuScheme,
    RoundStreams,
};
use pushpull_kernels::device::{Batch, BatchRound, Device, DeviceTensor};
use pushpull_kernels::{parse_params, Role, RoundCtx};

const USAGE: &str = "usage: bench_gpu [--elements N] [--chunk N] [--reps N] [--filter SUBSTRING]";

struct Args {
    elements: usize,
    chunk: usize,
    reps: usize,
    filter: Option<String>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        elements: 26_843_546,
        chunk: 1 << 20,
        reps: 20,
        filter: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| {
            v.parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or(format!("{flag}: {v:?} is not a positive integer"))
        };
        match flag.as_str() {
            "--elements" => a.elements = number(value()?)?,
            "--chunk" => a.chunk = number(value()?)?,
            "--reps" => a.reps = number(value()?)?,
            "--filter" => a.filter = Some(value()?),
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    Ok(a)
}

/// Mean seconds of `f` over `reps` runs after two warm-ups, the GPU drained before and after.
fn time(gpu: &GpuContext, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    f();
    gpu.synchronize().expect("synchronize");
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    gpu.synchronize().expect("synchronize");
    t.elapsed().as_secs_f64() / reps as f64
}

fn main() {
    let args = parse().unwrap_or_else(|e| {
        eprintln!("bench_gpu: {e}\n{USAGE}");
        std::process::exit(2)
    });
    if !gpu_available() {
        eprintln!("bench_gpu: needs a CUDA GPU, and none is usable here");
        std::process::exit(2);
    }
    let gpu = GpuContext::new(0).unwrap_or_else(|e| {
        eprintln!("bench_gpu: cannot open GPU 0: {e}");
        std::process::exit(2)
    });
    let name = gpu.context().name().unwrap_or_else(|_| "?".into());
    let n = args.elements;
    let wanted = |label: &str| args.filter.as_ref().is_none_or(|f| label.contains(f));
    let kernels = if nvrtc_requested() {
        format!("compiled by NVRTC for {}", ptx_arch())
    } else {
        "the shipped PTX (compute_70), or NVRTC's if the driver refused it".to_string()
    };
    println!(
        "GPU 0: {name}; kernels: {kernels}; {n} elements ({:.1} MB fp32), {} reps",
        4.0 * n as f64 / 1e6,
        args.reps
    );

    let stream = gpu.stream().clone();
    let x_host = test_data(n, 0x5eed);
    let x = stream.clone_htod(&x_host).expect("upload");
    let mut y = stream.alloc_zeros::<f32>(n).expect("alloc");
    let copy = time(&gpu, args.reps, || {
        stream.memcpy_dtod(&x, &mut y).expect("copy")
    });
    let gbs = |s: f64| 4.0 * n as f64 / s / 1e9;
    println!(
        "\n## Kernels on one buffer (GB/s of fp32 input; ratio to the device-to-device copy)\n"
    );
    println!("| compressor | compress | decompress | decompress-add |");
    println!("|---|---|---|---|");
    println!(
        "| copy (device to device) | {:.0} GB/s (1.00×) | | |",
        gbs(copy)
    );
    let cell = |s: f64| format!("{:.0} GB/s ({:.2}×)", gbs(s), copy / s);
    for case in default_cases() {
        if !wanted(&case.label) {
            continue;
        }
        let spec = parse_params(&case.params).expect("bench case");
        let scheme = match GpuScheme::from_spec(&spec, n, None, Role::Worker) {
            Ok(Some(s)) => s,
            Ok(None) => {
                println!("| {} | CPU only | | |", case.label);
                continue;
            }
            Err(e) => {
                println!("| {} | refused: {e} | | |", case.label);
                continue;
            }
        };
        let mut codec = GpuCodec::new(gpu.clone(), scheme, n).expect("codec");
        let mut out = stream
            .alloc_zeros::<u8>(codec.compressed_len())
            .expect("alloc");
        let mut round = 0u64;
        let c = time(&gpu, args.reps, || {
            round += 1;
            let s = RoundStreams::new(42, 7, round, Role::Worker, 0);
            codec.compress(&x, s, &mut out).expect("compress");
        });
        let s = RoundStreams::new(42, 7, round, Role::Worker, 0);
        let d = time(&gpu, args.reps, || {
            codec.decompress(&out, s, &mut y).expect("decompress")
        });
        let a = time(&gpu, args.reps, || {
            codec
                .decompress_add(&out, s, &mut y)
                .expect("decompress_add")
        });
        println!(
            "| {} | {} | {} | {} |",
            case.label,
            cell(c),
            cell(d),
            cell(a)
        );
    }

    chains(&gpu, &args, &x_host);
}

/// A worker's compression of a tensor's chunks as one batch (`Batch::start`, then
/// `Started::finish` of every chunk, as a round does) against the CPU chain of the same chunks
/// on one core.
fn chains(gpu: &Arc<GpuContext>, args: &Args, x_host: &[f32]) {
    let device = Arc::new(CudaDevice::new(gpu.clone()));
    let n = args.elements;
    let chunk = args.chunk.min(n);
    let chunks = n.div_ceil(chunk);
    let x = device.alloc_zeros(n).expect("alloc");
    let x_at = device.mem_addr(&x);
    // SAFETY: `x` holds n elements.
    unsafe { device.upload(x_host, x_at) }.expect("upload");
    println!(
        "\n## A worker's chunks ({chunks} of {chunk} elements) as one batch: GPU chains \
         (payloads in host staging) against the CPU chain on one core (GB/s of fp32 input)\n"
    );
    println!("| preset | GPU | CPU, one core | GPU / CPU | driver calls a round |");
    println!("|---|---|---|---|---|");
    let presets: [(&str, &[(&str, &str)]); 5] = [
        (
            "onebit + ef + nesterov",
            &[
                ("compressor", "onebit"),
                ("ef", "vanilla"),
                ("momentum", "nesterov"),
            ],
        ),
        (
            "minmax 8 bits + ef",
            &[("compressor", "minmax"), ("bits", "8"), ("ef", "vanilla")],
        ),
        (
            "dithering k=127 + ef",
            &[("compressor", "dithering"), ("k", "127"), ("ef", "vanilla")],
        ),
        (
            "randomk 1 % + ef",
            &[("compressor", "randomk"), ("k", "0.01"), ("ef", "vanilla")],
        ),
        ("fp16", &[("compressor", "fp16")]),
    ];
    for (label, kv) in presets {
        if args.filter.as_ref().is_some_and(|f| !label.contains(f)) {
            continue;
        }
        let params: BTreeMap<String, String> = kv
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let infos: Vec<ChunkInfo> = (0..chunks)
            .map(|c| ChunkInfo {
                params: &params,
                tensor_len: n as u64,
                chunk_len: (chunk.min(n - c * chunk)) as u64,
                full_chunk_len: chunk as u64,
                key: c as u64,
                job_seed: 42,
                node: Node::Worker { rank: 0 },
                min_compress_bytes: 0,
            })
            .collect();
        let mut tensor = match DeviceTensor::build(&device, &infos) {
            Ok(Some(t)) => t,
            Ok(None) => {
                println!("| {label} | CPU only | | | |");
                continue;
            }
            Err(e) => {
                println!("| {label} | refused: {e} | | | |");
                continue;
            }
        };
        let batch = Arc::new(Batch::new(&device, &[&tensor]).expect("batch"));
        let mut round = 0u64;
        let mut calls = 0;
        let t_gpu = time(gpu, args.reps, || {
            round += 1;
            let before = device.driver_calls();
            let r = BatchRound {
                input: x_at,
                output: x_at,
                round,
                lr: None,
                average_over: None,
            };
            // SAFETY: `x` outlives the round; nothing is decoded into it.
            let started = unsafe { batch.start(&[&tensor], &[r]) }.expect("start");
            for c in 0..chunks {
                started.finish(0, &mut tensor, c).expect("finish");
            }
            calls = device.driver_calls() - before;
        });
        // The CPU chain of the first chunk, timed on its own and scaled to all chunks.
        let mut cpu = chunk_codec(&infos[0]).expect("cpu chain");
        let first = &x_host[..infos[0].chunk_len as usize];
        let mut out = Vec::new();
        let reps = args.reps.min(5);
        let mut r = 0u64;
        let t0 = Instant::now();
        for _ in 0..reps {
            r += 1;
            cpu.compress(first, &RoundCtx::new(r), &mut out)
                .expect("cpu compress");
        }
        let t_cpu = t0.elapsed().as_secs_f64() / reps as f64 * n as f64 / first.len() as f64;
        let gbs = |s: f64| 4.0 * n as f64 / s / 1e9;
        println!(
            "| {label} | {:.1} GB/s | {:.2} GB/s | {:.0}× | {calls} |",
            gbs(t_gpu),
            gbs(t_cpu),
            t_cpu / t_gpu
        );
    }
}
