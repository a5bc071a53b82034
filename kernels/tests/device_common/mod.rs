//! The harness of the device-batch tests (`device_batch.rs`, `device_rounds.rs`): tensors
//! under test on a device beside their CPU chains, and rounds of a batch of them compared bit
//! for bit (see `device_batch.rs` for what is compared).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::cuda_common::*;
use pushpull_kernels::chunk::{chunk_codec, ChunkInfo, Node};
use pushpull_kernels::device::{Batch, BatchRound, Device, DeviceTensor};
use pushpull_kernels::{Compressor, KernelError, RoundCtx};

/// The decorator settings every case is tried with.
pub const DECORATIONS: &[&[(&str, &str)]] = &[
    &[],
    &[("ef", "vanilla")],
    &[("ef", "vanilla"), ("momentum", "nesterov")],
    &[("momentum", "nesterov"), ("mu", "0.85")],
    &[("ef", "corrected"), ("momentum", "nesterov")],
];

pub fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One tensor under test: its CPU chains (one per chunk) and its device chains.
pub struct Under<D: Device> {
    pub what: String,
    pub chunks: Vec<std::ops::Range<usize>>,
    pub cpu: Vec<Compressor>,
    pub dev: DeviceTensor<D>,
}

impl<D: Device> Under<D> {
    pub fn len(&self) -> usize {
        self.chunks.last().map_or(0, |c| c.end)
    }
}

/// A tensor with map `params` cut into chunks of `lens`, on `node`; `None` when its codec has
/// no device kernel.
pub fn under<D: Device>(
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
pub fn chunking(r: &mut Rng, full: usize) -> Vec<usize> {
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
pub struct Tally {
    pub same: u32,
    pub refused: u32,
    pub untouched: u32,
    pub non_finite: u32,
    pub undone: u32,
}

/// A chunk compressed on both chains outside `run_batch`: the same payload, or a refusal by
/// both (earlier rounds' extreme inputs can leave a residual or momentum that overflows with
/// any gradient).
pub fn assert_same_outcome<B: AsRef<[u8]> + std::fmt::Debug>(
    what: &str,
    cpu: Result<(), KernelError>,
    want: &[u8],
    dev: Result<B, KernelError>,
) {
    match (cpu, dev) {
        (Ok(()), Ok(got)) => assert_same_bytes(what, got.as_ref(), want),
        (Err(_), Err(_)) => {}
        (cpu, dev) => panic!("{what}: cpu {cpu:?}, device {dev:?}"),
    }
}

/// Runs rounds `rounds` of `tensors` as one batch on `device`: compress on both, compare,
/// receive a random subset of the payloads on the device, decode, compare the output and the
/// state. Rounds only increase, as a worker's do: an undo matches the last committed round by
/// its number, so a tensor's later batch continues where its earlier one stopped.
pub fn run_batch<D: Device>(
    r: &mut Rng,
    device: &Arc<D>,
    tensors: &mut [Under<D>],
    rounds: std::ops::Range<u64>,
) -> Tally {
    let mut tally = Tally::default();
    let batch = {
        let refs: Vec<&DeviceTensor<D>> = tensors.iter().map(|t| &t.dev).collect();
        Arc::new(Batch::new(device, &refs).unwrap())
    };
    for round in rounds {
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
