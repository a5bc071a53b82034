//! Decentralised averaging (`exchange = "gossip"`, Moniqua's Algorithm 1) through the real
//! scheduler and servers, which relay each worker's neighbours' messages: bit for bit against
//! the single-process reference ([`Reference::gossip`]) for full precision, Moniqua and naive
//! min-max messages, and the direct form of Moniqua's equation 4 (`gossip_direct`); full
//! precision also against a plain f64 average written here. Calls that
//! do not fit a tensor's exchange are refused, and a vanished neighbour is named.

use std::time::Duration;

use pushpull_proto::Config;
use pushpull_worker::reference::Reference;
use pushpull_worker::{Reduce, Tensor, WorkerError};

mod common;
use common::set::map;
use common::*;

const WORKERS: u32 = 5;
const LEN: usize = 40_000;

/// The maps gossiped here: full precision, Moniqua at 2 bits (θ fixed, θ = 5 × a learning
/// rate that changes every round, and θ = the paper's Theorem 2 bound from that rate and
/// each worker's own tracked gradient bound), naive min-max at 2 bits.
fn maps() -> Vec<(&'static str, Vec<(&'static str, &'static str)>)> {
    vec![
        ("none", vec![("compressor", "none"), ("exchange", "gossip")]),
        (
            "moniqua",
            vec![
                ("compressor", "moniqua"),
                ("theta", "0.5"),
                ("bits", "2"),
                ("exchange", "gossip"),
            ],
        ),
        (
            "moniqua-lr",
            vec![
                ("compressor", "moniqua"),
                ("theta", "5"),
                ("bits", "2"),
                ("theta_schedule", "lr"),
                ("exchange", "gossip"),
            ],
        ),
        (
            "moniqua-bound",
            vec![
                ("compressor", "moniqua"),
                ("theta", "1"),
                ("bits", "2"),
                ("theta_schedule", "bound"),
                ("exchange", "gossip"),
            ],
        ),
        (
            "minmax",
            vec![
                ("compressor", "minmax"),
                ("bits", "2"),
                ("bucket", "512"),
                ("exchange", "gossip"),
            ],
        ),
        // Moniqua's equation 4, the direct (naive) form: the same messages, each worker's own
        // exact values in place of its own message's decoding.
        (
            "none-direct",
            vec![("compressor", "none"), ("exchange", "gossip_direct")],
        ),
        (
            "minmax-direct",
            vec![
                ("compressor", "minmax"),
                ("bits", "2"),
                ("bucket", "512"),
                ("exchange", "gossip_direct"),
            ],
        ),
    ]
}

/// Models close to each other (within θ = 0.5 of one another: a shared base in [−50, 50]
/// plus per-rank noise in [−0.1, 0.1]).
fn models(seed: u64) -> Vec<Vec<f32>> {
    let base = data(seed, LEN);
    (0..WORKERS as u64)
        .map(|r| {
            let noise = data(seed ^ ((r + 1) << 40), LEN);
            base.iter().zip(noise).map(|(b, n)| b + 0.002 * n).collect()
        })
        .collect()
}

/// The largest difference between any worker's model and worker 0's.
fn spread(xs: &[Vec<f32>]) -> f32 {
    xs.iter()
        .map(|x| {
            x.iter()
                .zip(&xs[0])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max)
        })
        .fold(0.0, f32::max)
}

/// What tensor `name` pushed (worker 0) of the list `(name, bytes, chunks)`.
fn bytes_of(pushed: &[(&str, u64, u64)], name: &str) -> u64 {
    pushed.iter().find(|p| p.0 == name).map(|p| p.1).unwrap()
}

fn tweak(c: &mut Config) {
    c.cluster.min_compress_bytes = 0;
}

/// Metropolis weights of a ring of five with a chord 0–2 (degrees 3, 2, 3, 2, 2):
/// `1 / (1 + max(d_i, d_j))` on each edge, the rest on the diagonal. Unequal weights and
/// three neighbours make the order the neighbours are summed in show in the bits.
fn mixing() -> Vec<Vec<f64>> {
    let (q, t) = (0.25, 1.0 / 3.0);
    vec![
        vec![0.25, q, q, 0.0, q],
        vec![q, 0.5, q, 0.0, 0.0],
        vec![q, q, 0.25, q, 0.0],
        vec![0.0, 0.0, q, 1.0 - q - t, t],
        vec![q, 0.0, 0.0, t, 1.0 - q - t],
    ]
}

/// Five workers on [`mixing`]'s graph and two servers, with 64 KiB partitions: every tensor
/// spans several chunks on both servers.
async fn irregular_stack() -> Stack {
    stack_with(WORKERS, 2, 64 * 1024, |c| {
        tweak(c);
        c.gossip.mixing = Some(mixing());
    })
    .await
}

/// One gossip round of every worker, worker `r` averaging `xs[r]`.
async fn gossip_all(
    s: &Stack,
    ts: &[Tensor],
    xs: &[Vec<f32>],
) -> Vec<Result<Vec<f32>, WorkerError>> {
    let calls = s
        .workers
        .iter()
        .zip(ts)
        .zip(xs)
        .map(|((w, t), x)| w.gossip(t, x.clone()));
    futures_util::future::join_all(calls).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_gossips_bit_for_bit_like_the_reference() {
    tokio::time::timeout(TIMEOUT, async {
        let seed = seed();
        let s = irregular_stack().await;
        let w = mixing();
        let mut reference = Reference::new(&s.config, s.workers[0].job_seed());
        let mut pushed = Vec::new();
        for (name, kv) in maps() {
            let ts = declare_all_with(&s, name, LEN as u64, map(&kv)).await;
            assert!(
                ts[0].num_chunks() > 1,
                "{name}: {} chunk",
                ts[0].num_chunks()
            );
            let rt = reference.declare(name, LEN as u64, map(&kv)).unwrap();
            let mut xs = models(seed ^ name.len() as u64);
            let before = spread(&xs);
            for round in 0..3u64 {
                if name == "moniqua-lr" || name == "moniqua-bound" {
                    // θ = 0.5, 0.25, 0.1667: the codec reads the rate of each round.
                    let lr = 0.1 / (round + 1) as f32;
                    s.workers.iter().for_each(|w| w.set_learning_rate(lr));
                    reference.set_learning_rate(lr);
                }
                if name == "moniqua-bound" {
                    // Worker r's gradients reach (r + 1): each worker's G, hence its θ and its
                    // messages' B_θ, differ, and each receiver decodes with the sender's.
                    for (r, (w, t)) in s.workers.iter().zip(&ts).enumerate() {
                        let scale = 0.02 * (r + 1) as f32;
                        let g: Vec<f32> = data(seed ^ round ^ ((r as u64 + 7) << 30), LEN)
                            .iter()
                            .map(|v| v * scale)
                            .collect();
                        w.track_gradient(t, &g).unwrap();
                        reference.track_gradient(rt, r as u32, &g);
                    }
                    let g0 = s.workers[0].gradient_bound(&ts[0]).unwrap();
                    assert!(g0 > 0.5 && g0 <= 1.0, "seed {seed}: worker 0's G {g0}");
                }
                let got: Vec<Vec<f32>> = gossip_all(&s, &ts, &xs)
                    .await
                    .into_iter()
                    .map(Result::unwrap)
                    .collect();
                let want = reference.gossip(rt, &xs).unwrap();
                if name == "minmax-direct" && round == 0 {
                    // The difference form of the same messages gives other bits.
                    let twin = maps().into_iter().find(|m| m.0 == "minmax").unwrap().1;
                    let mut other = Reference::new(&s.config, s.workers[0].job_seed());
                    let t = other.declare("minmax", LEN as u64, map(&twin)).unwrap();
                    let diff = other.gossip(t, &xs).unwrap();
                    assert!(
                        !same_bits(&diff[0], &want[0]),
                        "seed {seed}: the forms agree"
                    );
                }
                for (r, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        same_bits(g, w),
                        "seed {seed}: {name} round {round} rank {r} differs from the reference"
                    );
                }
                if name.starts_with("none") {
                    // x_i + Σ_j W_ij (x_j − x_i), in f64 (both forms, messages exact).
                    for (i, g) in got.iter().enumerate() {
                        for e in (0..LEN).step_by(97) {
                            let xi = xs[i][e] as f64;
                            let sum: f64 = (0..WORKERS as usize)
                                .map(|j| w[i][j] * (xs[j][e] as f64 - xi))
                                .sum();
                            let plain = (xi + sum) as f32;
                            assert!(
                                (g[e] - plain).abs() <= 1e-6 * plain.abs().max(1.0),
                                "seed {seed}: rank {i} element {e}: {} against {plain}",
                                g[e]
                            );
                        }
                    }
                }
                // The next round starts from the averages moved by a step of "gradient".
                xs = got
                    .into_iter()
                    .enumerate()
                    .map(|(r, x)| {
                        let g = data(seed ^ round ^ ((r as u64) << 20), LEN);
                        x.iter().zip(g).map(|(a, b)| a - 0.0002 * b).collect()
                    })
                    .collect();
            }
            // Full-precision averaging contracts the models towards each other. (2-bit
            // messages carry errors up to δ·B_θ = 0.5 for Moniqua, more for min-max of values
            // in [−50, 50]: more than these models differ by, so they need not contract.)
            let after = spread(&xs);
            println!("{name}: spread {before} -> {after} after 3 rounds");
            if name.starts_with("none") {
                assert!(
                    after < 0.5 * before,
                    "seed {seed}: {name}: {before} -> {after}"
                );
            }
            // Bytes: each worker pushed one message per chunk and round and pulled one from
            // each neighbour (worker 0 has three, worker 1 two).
            let (m0, m1) = (ts[0].metrics(), ts[1].metrics());
            assert_eq!(m0.bytes_pulled, 3 * m0.bytes_pushed, "{name}: {m0:?}");
            assert_eq!(m1.bytes_pulled, 2 * m1.bytes_pushed, "{name}: {m1:?}");
            pushed.push((name, m0.bytes_pushed, ts[0].num_chunks() as u64));
        }
        // The direct form pushed what the difference form did (the same messages).
        assert_eq!(
            bytes_of(&pushed, "minmax-direct"),
            bytes_of(&pushed, "minmax")
        );
        // With θ from the bound each message carries its sender's B_θ: 8 bytes a chunk more.
        let bytes = |n: &str| pushed.iter().find(|p| p.0 == n).copied().unwrap();
        let ((_, fixed, chunks), (_, bound, _)) = (bytes("moniqua"), bytes("moniqua-bound"));
        assert_eq!(bound, fixed + 3 * 8 * chunks, "3 rounds of {chunks} chunks");
        s.finish_all().await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_do_not_fit_the_exchange_are_refused_before_sending() {
    tokio::time::timeout(TIMEOUT, async {
        let s = stack_with(3, 1, 64 * 1024, tweak).await;
        let gossiped = declare_all_with(&s, "model", 1000, map(&maps()[1].1)).await;
        let summed = declare_all(&s, "grad", 1000).await;
        let e = s.workers[0]
            .push_pull(&gossiped[0], vec![0.0; 1000], Reduce::Sum)
            .await
            .unwrap_err();
        assert!(matches!(e, WorkerError::WrongExchange { .. }), "{e}");
        assert!(e.to_string().contains("exchange = \"gossip\""), "{e}");
        let e = s.workers[0]
            .gossip(&summed[0], vec![0.0; 1000])
            .await
            .unwrap_err();
        assert!(e.to_string().contains("summed by push_pull"), "{e}");
        // Nothing was sent: both tensors still work, and a broadcast of the gossiped one too.
        assert_eq!(gossiped[0].rounds_started(), 0);
        let calls = s.workers.iter().zip(&gossiped).map(|(w, t)| {
            let root = if w.rank() == 0 {
                vec![0.25; 1000]
            } else {
                vec![0.0; 1000]
            };
            w.broadcast(t, root, 0)
        });
        for got in futures_util::future::join_all(calls).await {
            assert_eq!(got.unwrap(), vec![0.25; 1000]);
        }
        s.finish_all().await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_neighbour_is_named_by_every_worker() {
    tokio::time::timeout(TIMEOUT, async {
        let mut s = stack_with(3, 1, 64 * 1024, |c| {
            tweak(c);
            c.cluster.heartbeat_timeout_ms = 3000;
        })
        .await;
        let mut ts = declare_all_with(&s, "model", 1000, map(&maps()[1].1)).await;
        let pending: Vec<_> = s.workers[..2]
            .iter()
            .zip(&ts)
            .map(|(w, t)| {
                let (w, t) = (w.clone(), t.clone());
                tokio::spawn(async move { w.gossip(&t, vec![0.5; 1000]).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        ts.pop();
        drop(s.workers.pop()); // worker 2 vanishes without finish
        for (r, p) in pending.into_iter().enumerate() {
            let e = p.await.unwrap().unwrap_err();
            println!("worker {r} got: {e}");
            assert!(e.to_string().contains("worker 2 ("), "worker {r}: {e}");
        }
    })
    .await
    .expect("test timed out");
}

/// Moniqua's hash check in a cluster: a worker whose model is far (more than θ) from its
/// neighbours' gets its round refused by each of them, naming it as the message's sender, and
/// refuses theirs; workers that do not neighbour it average as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_beyond_theta_is_named_by_its_neighbours() {
    tokio::time::timeout(TIMEOUT, async {
        let seed = seed();
        let s = irregular_stack().await;
        let kv = [
            ("compressor", "moniqua"),
            ("theta", "0.5"),
            ("bits", "2"),
            ("hash", "true"),
            ("exchange", "gossip"),
        ];
        let ts = declare_all_with(&s, "model", LEN as u64, map(&kv)).await;
        let mut xs = models(seed);
        // Worker 3 (neighbours 2 and 4) drifted 5 away: many wraps of B_θ = 2.
        xs[3].iter_mut().for_each(|v| *v += 5.0);
        let got = gossip_all(&s, &ts, &xs).await;
        for (r, g) in got.iter().enumerate() {
            match (r, g) {
                (0 | 1, Ok(_)) => {}
                (2 | 4, Err(e)) => {
                    assert!(
                        e.to_string().contains("worker 3's message"),
                        "seed {seed}: {e}"
                    );
                    assert!(
                        e.to_string().contains("hash check failed"),
                        "seed {seed}: {e}"
                    );
                }
                (3, Err(e)) => assert!(e.to_string().contains("hash check failed"), "{e}"),
                (r, g) => panic!("seed {seed}: worker {r}: {g:?}"),
            }
        }
        s.finish_all().await;
    })
    .await
    .expect("test timed out");
}
