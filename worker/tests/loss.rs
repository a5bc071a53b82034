//! Packet loss, duplication and reordering (issue 12): every node of a 2-worker, 2-server job
//! sends through a `pushpull_net::lossy::LossySocket` (the kit's [`lossy_stack_with`]), and
//! the results of an uncompressed and a compressed job, several tensors over several rounds,
//! are bit-identical to the same job on a lossless network (itself checked against the
//! single-process [`Reference`]), each run within a time limit.

use std::time::{Duration, Instant};

use pushpull_net::lossy::{Impairments, LossStats};
use pushpull_worker::reference::{RefTensor, Reference};
use pushpull_worker::{ParamMap, Reduce, Tensor};

mod common;
use common::set::map;
use common::*;

const WORKERS: u32 = 2;
const SERVERS: u32 = 2;
const PARTITION_BYTES: u64 = 64 * 1024;
const ROUNDS: u64 = 6;
/// Ethernet-sized datagrams (the default allows jumbo ones): more datagrams, each a smaller
/// share of a frame, as on the networks users have.
const MAX_UDP_PAYLOAD: u16 = 1452;
/// One job on one network, from the first node's start to the last one's end. Loss of a
/// handshake datagram costs about a second (quinn's first probe timeout), so this is ample.
const RUN_LIMIT: Duration = Duration::from_secs(60);

type Set = Vec<(&'static str, u64, ParamMap, Reduce)>;
/// `[round][tensor][rank]`.
type Results = Vec<Vec<Vec<Vec<f32>>>>;

/// Raw fp32: tensors of several chunks over both servers, and a tiny one.
fn uncompressed() -> Set {
    vec![
        ("big", 100_000, ParamMap::new(), Reduce::Sum),
        ("mid", 30_001, ParamMap::new(), Reduce::Average),
        ("tiny", 7, ParamMap::new(), Reduce::Sum),
    ]
}

/// Compressors whose state carries from round to round (error feedback, momentum), so a
/// round that went wrong would spoil every later one; a stochastic one (its draws depend on
/// the job seed, key and round); one below `min_compress_bytes`, sent raw.
fn compressed() -> Set {
    vec![
        (
            "onebit",
            400_001,
            map(&[
                ("compressor", "onebit"),
                ("scaling", "true"),
                ("ef", "vanilla"),
                ("momentum", "nesterov"),
            ]),
            Reduce::Average,
        ),
        (
            "topk",
            200_000,
            map(&[("compressor", "topk"), ("k", "0.01"), ("ef", "vanilla")]),
            Reduce::Sum,
        ),
        (
            "randomk",
            100_000,
            map(&[("compressor", "randomk"), ("k", "0.05"), ("ef", "vanilla")]),
            Reduce::Average,
        ),
        (
            "bias",
            100,
            map(&[("compressor", "onebit"), ("ef", "vanilla")]),
            Reduce::Sum,
        ),
    ]
}

fn input(seed: u64, round: u64, rank: u32, tensor: usize, len: usize) -> Vec<f32> {
    data(
        seed ^ round.wrapping_mul(0x1000_0001) ^ ((rank as u64) << 40) ^ ((tensor as u64) << 50),
        len,
    )
}

fn lr(round: u64) -> f32 {
    0.1 * 0.8f32.powi(round as i32)
}

/// The networks every job runs on besides the lossless one: (what it is, impairments).
fn networks(seed: u64) -> Vec<(&'static str, Impairments)> {
    let with = |drop, duplicate, reorder| Impairments {
        drop,
        duplicate,
        reorder,
        max_delay: Duration::from_millis(4),
        seed,
    };
    vec![
        ("0 % loss, 1 % dup, 2 % reorder", with(0.0, 0.01, 0.02)),
        ("1 % loss, 1 % dup, 2 % reorder", with(0.01, 0.01, 0.02)),
        ("5 % loss, 1 % dup, 2 % reorder", with(0.05, 0.01, 0.02)),
    ]
}

/// Runs `set` for [`ROUNDS`] rounds, every tensor of every worker at once, on a lossless
/// network (`None`) or a lossy one; returns the results and what the lossy sockets did.
async fn run(set: &Set, seed: u64, net: Option<Impairments>) -> (Results, Option<LossStats>) {
    let tweak = |c: &mut pushpull_proto::Config| {
        c.cluster.seed = Some(seed);
        c.cluster.max_udp_payload = MAX_UDP_PAYLOAD;
    };
    let s = match net {
        None => stack_with(WORKERS, SERVERS, PARTITION_BYTES, tweak).await,
        Some(imp) => lossy_stack_with(WORKERS, SERVERS, PARTITION_BYTES, imp, tweak).await,
    };
    let mut tensors: Vec<Vec<Tensor>> = Vec::new();
    for (name, len, params, _) in set {
        tensors.push(declare_all_with(&s, name, *len, params.clone()).await);
    }
    let mut out = Vec::new();
    for round in 0..ROUNDS {
        for w in &s.workers {
            w.set_learning_rate(lr(round));
        }
        let mut calls = Vec::new();
        for (i, (_, len, _, reduce)) in set.iter().enumerate() {
            for (r, w) in s.workers.iter().enumerate() {
                let (w, t, reduce) = (w.clone(), tensors[i][r].clone(), *reduce);
                let buf = input(seed, round, r as u32, i, *len as usize);
                calls.push(tokio::spawn(
                    async move { w.push_pull(&t, buf, reduce).await },
                ));
            }
        }
        let mut results = futures_util::future::join_all(calls).await.into_iter();
        let per_tensor = set
            .iter()
            .map(|_| {
                (0..s.workers.len())
                    .map(|_| results.next().unwrap().unwrap().unwrap())
                    .collect()
            })
            .collect();
        out.push(per_tensor);
    }
    let stats = s.loss_stats();
    drop(tensors);
    s.finish_all().await;
    (out, stats)
}

fn run_reference(set: &Set, seed: u64) -> Results {
    let mut config = pushpull_proto::Config::local(WORKERS, SERVERS);
    config.cluster.partition_bytes = PARTITION_BYTES;
    let mut reference = Reference::new(&config, seed);
    let handles: Vec<RefTensor> = set
        .iter()
        .map(|(name, len, params, _)| reference.declare(name, *len, params.clone()).unwrap())
        .collect();
    (0..ROUNDS)
        .map(|round| {
            reference.set_learning_rate(lr(round));
            set.iter()
                .enumerate()
                .map(|(i, (_, len, _, reduce))| {
                    let inputs: Vec<Vec<f32>> = (0..WORKERS)
                        .map(|r| input(seed, round, r, i, *len as usize))
                        .collect();
                    reference.push_pull(handles[i], &inputs, *reduce).unwrap()
                })
                .collect()
        })
        .collect()
}

fn first_difference(set: &Set, a: &Results, b: &Results) -> Option<String> {
    for (round, (ra, rb)) in a.iter().zip(b).enumerate() {
        for (t, (ta, tb)) in ra.iter().zip(rb).enumerate() {
            for (rank, (xa, xb)) in ta.iter().zip(tb).enumerate() {
                if !same_bits(xa, xb) {
                    let i = (0..xa.len().min(xb.len()))
                        .find(|&i| xa[i].to_bits() != xb[i].to_bits())
                        .unwrap_or(xa.len().min(xb.len()));
                    return Some(format!(
                        "round {round}, tensor {:?}, rank {rank}, element {i} of {}/{}",
                        set[t].0,
                        xa.len(),
                        xb.len()
                    ));
                }
            }
        }
    }
    None
}

/// The job on a lossless network matches the reference; on each lossy network it matches
/// the lossless run bit for bit, within [`RUN_LIMIT`], and the sockets really dropped,
/// duplicated and delayed datagrams.
async fn survives_loss(job: &str, set: Set) {
    let seed = seed();
    let reference = run_reference(&set, seed);
    let start = Instant::now();
    let (lossless, _) = tokio::time::timeout(RUN_LIMIT, run(&set, seed, None))
        .await
        .unwrap_or_else(|_| panic!("{job} job, lossless: no result in {RUN_LIMIT:?}"));
    println!("{job}, lossless: {:.1} s", start.elapsed().as_secs_f64());
    if let Some(d) = first_difference(&set, &lossless, &reference) {
        panic!("{job} job, lossless vs the reference (seed {seed}): {d}");
    }
    for (net, imp) in networks(seed) {
        let start = Instant::now();
        let (lossy, stats) = tokio::time::timeout(RUN_LIMIT, run(&set, seed, Some(imp)))
            .await
            .unwrap_or_else(|_| {
                panic!("{job} job, {net} (seed {seed}): no result in {RUN_LIMIT:?}")
            });
        let stats = stats.unwrap();
        println!(
            "{job}, {net}: {:.1} s; {stats}",
            start.elapsed().as_secs_f64()
        );
        if let Some(d) = first_difference(&set, &lossy, &lossless) {
            panic!("{job} job, {net} vs lossless (seed {seed}): {d}");
        }
        assert_eq!(stats.dropped > 0, imp.drop > 0.0, "{net}: {stats}");
        assert!(stats.duplicated > 0 && stats.delayed > 0, "{net}: {stats}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncompressed_job_is_bit_identical_under_loss_duplication_and_reordering() {
    survives_loss("uncompressed", uncompressed()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_job_is_bit_identical_under_loss_duplication_and_reordering() {
    survives_loss("compressed", compressed()).await;
}
