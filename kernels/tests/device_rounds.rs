//! Device batches on the [`EmulatedDevice`] over their rounds' lifetimes: staging lands only
//! when waited for, an abandoned round changes nothing, a round keeps its batch alive, and a
//! round's driver calls do not grow with its chunks. Runs everywhere; the seed is printed (set
//! `PUSHPULL_TEST_SEED` to replay).

mod cuda_common;
mod device_common;

use std::sync::Arc;

use cuda_common::*;
use device_common::*;
use pushpull_kernels::chunk::Node;
use pushpull_kernels::device::{Batch, BatchRound, Device, EmulatedDevice};
use pushpull_kernels::RoundCtx;

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
    run_batch(&mut r, &device, &mut ts, 0..2);
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
    assert_same_outcome(
        "the finished chunk",
        ts[0].cpu[1].compress(&g[300..600], &RoundCtx::new(2), &mut want),
        &want,
        started.finish(0, &mut ts[0].dev, 1),
    );
    drop(started);
    // The CPU chains of chunks 0 and 2 never saw round 2; the device's must not have either.
    let tally = run_batch(&mut r, &device, &mut ts, 3..5);
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
