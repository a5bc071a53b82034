//! The opt-in Prometheus endpoints of a running cluster (`[metrics] listen`): the real
//! scheduler and server binaries as processes, two workers in process serving theirs as
//! `pushpull-worker --metrics` does (`pushpull_worker::prometheus::serve_worker`). Each node is
//! scraped over HTTP with a plain `GET /metrics`, and the numbers are checked against what the
//! job did: rounds, payload bytes (the workers' own counters, and servers' sums equal to the
//! workers' sums), the compression ratio, the round-time histogram, the nodes the scheduler
//! knows and the QUIC families per peer. A second test runs `pushpull-worker` processes and
//! checks the `metrics on` line each prints. A third runs the whole cluster in a network
//! namespace whose loopback is shaped by tbf, overflows the queue, and checks the scraped lost
//! packets against the datagrams the kernel dropped (root only; see `common::netns`).

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use pushpull::report::{SCHEDULER_METRICS, SERVER_METRICS, WORKER_METRICS};
use pushpull_proto::ParamMap;
use pushpull_worker::Reduce;

const ROUNDS: u64 = 4;

/// `GET path` over a plain TCP connection: (status code, body).
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    (status, body.to_string())
}

/// The samples of a scrape: `name{labels}` → value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("sample line");
            let v = match value {
                "+Inf" => f64::INFINITY,
                v => v.parse().unwrap_or_else(|_| panic!("bad value in {l:?}")),
            };
            (series.to_string(), v)
        })
        .collect()
}

/// The value of the one sample of `name` whose labels include every `labels` pair.
fn value(s: &BTreeMap<String, f64>, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = s
        .iter()
        .filter(|(series, _)| {
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, &v)| v)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{name} {labels:?}: {} samples in {:#?}",
        found.len(),
        s.keys().filter(|k| k.starts_with(name)).collect::<Vec<_>>()
    );
    found[0]
}

/// Serves `w`'s metrics on a free local port, as `pushpull-worker --metrics` does.
fn serve(w: &pushpull_worker::Worker) -> pushpull_metrics::MetricsEndpoint {
    pushpull_worker::prometheus::serve_worker("127.0.0.1:0".parse().unwrap(), w).unwrap()
}

fn scrape(addr: &str) -> BTreeMap<String, f64> {
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "{addr}: {body}");
    samples(&body)
}

#[test]
fn every_node_serves_metrics_that_match_the_job() {
    let _g = cluster_lock();
    let mut config = test_config(2, 2);
    config.metrics.listen = Some("127.0.0.1:0".into());
    // 16 Ki elements per chunk: "big" spans 13 chunks over both servers.
    config.cluster.partition_bytes = 64 * 1024;
    let mut cluster = ProcCluster::start(config);
    let scheduler_metrics = cluster.scheduler.wait_line(SCHEDULER_METRICS, GENEROUS);
    let server_metrics: Vec<String> = cluster
        .servers
        .iter_mut()
        .map(|(p, _)| p.wait_line(SERVER_METRICS, GENEROUS))
        .collect();
    let specs: [(&str, u64, &str); 2] = [("big", 200_000, "onebit"), ("small", 1000, "none")];
    let chunks: u64 = specs
        .iter()
        .map(|&(_, len, _)| len.div_ceil(16 * 1024))
        .sum();
    run_async(async {
        let workers = cluster.join_all().await;
        let endpoints: Vec<_> = workers.iter().map(serve).collect();
        let mut set = tokio::task::JoinSet::new();
        for w in &workers {
            for &(name, len, compressor) in &specs {
                let w = w.clone();
                set.spawn(async move {
                    let mut params = ParamMap::new();
                    params.insert("compressor".into(), compressor.into());
                    let t = w.declare(name, len, params).await.unwrap();
                    let mut buf = vec![0.5f32; len as usize];
                    for _ in 0..ROUNDS {
                        buf = w.push_pull(&t, buf, Reduce::Average).await.unwrap();
                    }
                });
            }
        }
        while let Some(r) = set.join_next().await {
            r.unwrap();
        }
        let (mut pushed, mut pulled) = (0.0, 0.0);
        for (w, ep) in workers.iter().zip(&endpoints) {
            let addr = ep.local_addr().to_string();
            let m = w.metrics();
            let s = tokio::task::spawn_blocking(move || scrape(&addr))
                .await
                .unwrap();
            let rank = w.rank().to_string();
            let me = [("role", "worker"), ("rank", rank.as_str())];
            let rounds = (ROUNDS * specs.len() as u64) as f64;
            assert_eq!(value(&s, "pushpull_rounds_total", &me), rounds);
            assert_eq!(
                value(&s, "pushpull_round_duration_seconds_count", &me),
                rounds
            );
            assert_eq!(
                value(
                    &s,
                    "pushpull_round_duration_seconds_bucket",
                    &[("le", "+Inf")]
                ),
                rounds
            );
            assert!(value(&s, "pushpull_round_duration_seconds_sum", &me) > 0.0);
            assert_eq!(
                value(&s, "pushpull_pushed_bytes_total", &me),
                m.bytes_pushed as f64
            );
            assert_eq!(
                value(&s, "pushpull_pulled_bytes_total", &me),
                m.bytes_pulled as f64
            );
            let mut per_tensor = 0.0;
            for &(name, len, _) in &specs {
                let t = [("tensor", name)];
                assert_eq!(value(&s, "pushpull_tensor_rounds_total", &t), ROUNDS as f64);
                assert_eq!(
                    value(&s, "pushpull_tensor_round_duration_seconds_count", &t),
                    ROUNDS as f64
                );
                let tm = &m.tensors[name];
                assert_eq!(
                    value(&s, "pushpull_tensor_pushed_bytes_total", &t),
                    tm.bytes_pushed as f64
                );
                assert_eq!(tm.raw_bytes, ROUNDS * len * 4);
                per_tensor += value(&s, "pushpull_tensor_pushed_bytes_total", &t);
            }
            assert_eq!(per_tensor, m.bytes_pushed as f64);
            // onebit: a bit per element and a scale per chunk; none: the raw bytes.
            let big = value(
                &s,
                "pushpull_tensor_compression_ratio",
                &[("tensor", "big")],
            );
            assert!(big > 20.0, "onebit compression ratio {big}");
            assert_eq!(
                value(
                    &s,
                    "pushpull_tensor_compression_ratio",
                    &[("tensor", "small")]
                ),
                1.0
            );
            for peer in ["scheduler", "server 0", "server 1"] {
                let p = [("peer", peer)];
                assert!(value(&s, "pushpull_quic_sent_packets_total", &p) > 0.0);
                assert!(value(&s, "pushpull_quic_lost_packets_total", &p) >= 0.0);
            }
            pushed += m.bytes_pushed as f64;
            pulled += m.bytes_pulled as f64;
        }
        // The servers received what the workers pushed and sent what they pulled.
        let (mut s_pushed, mut s_pulled, mut key_rounds) = (0.0, 0.0, 0.0);
        for addr in &server_metrics {
            let a = addr.clone();
            let s = tokio::task::spawn_blocking(move || scrape(&a))
                .await
                .unwrap();
            s_pushed += value(&s, "pushpull_pushed_bytes_total", &[("role", "server")]);
            s_pulled += value(&s, "pushpull_pulled_bytes_total", &[("role", "server")]);
            key_rounds += value(&s, "pushpull_key_rounds_total", &[]);
            for w in ["worker 0", "worker 1"] {
                assert!(value(&s, "pushpull_quic_sent_packets_total", &[("peer", w)]) > 0.0);
            }
        }
        assert_eq!(s_pushed, pushed);
        assert_eq!(s_pulled, pulled);
        assert_eq!(key_rounds, (ROUNDS * chunks) as f64);
        // The scheduler knows four nodes, all up, and counts their missed heartbeats.
        let a = scheduler_metrics.clone();
        let s = tokio::task::spawn_blocking(move || scrape(&a))
            .await
            .unwrap();
        assert_eq!(value(&s, "pushpull_nodes", &[("role", "scheduler")]), 4.0);
        for peer in ["server 0", "server 1", "worker 0", "worker 1"] {
            let p = [("peer", peer)];
            assert_eq!(value(&s, "pushpull_peer_up", &p), 1.0, "{peer}");
            assert!(value(&s, "pushpull_missed_heartbeats_total", &p) >= 0.0);
            assert!(value(&s, "pushpull_peer_silence_seconds", &p) < 2.0);
            assert!(value(&s, "pushpull_quic_received_datagrams_total", &p) > 0.0);
        }
        // Only /metrics (and /) are served.
        let a = scheduler_metrics.clone();
        let (status, _) = tokio::task::spawn_blocking(move || get(&a, "/nope"))
            .await
            .unwrap();
        assert_eq!(status, 404);
        let mut set = tokio::task::JoinSet::new();
        for w in workers {
            set.spawn(async move { w.finish().await });
        }
        while let Some(r) = set.join_next().await {
            r.unwrap().expect("finish");
        }
        // A worker's counters stay readable after finish.
        let a = endpoints[0].local_addr().to_string();
        let s = tokio::task::spawn_blocking(move || scrape(&a))
            .await
            .unwrap();
        assert_eq!(
            value(&s, "pushpull_rounds_total", &[]),
            (ROUNDS * specs.len() as u64) as f64
        );
    });
    cluster.expect_clean_exit();
}

#[test]
fn worker_processes_serve_their_metrics_while_the_job_runs() {
    let _g = cluster_lock();
    let mut config = test_config(2, 1);
    config.metrics.listen = Some("127.0.0.1:0".into());
    pushpull::jobs::JobConfig::edit(&mut config, |j| {
        j.scale = 0.001;
        j.rounds = 1_000_000;
        j.warmup = 0;
    })
    .unwrap();
    let cluster = ProcCluster::start(config);
    let mut workers: Vec<Proc> = (0..2)
        .map(|i| {
            start_worker_process(
                &cluster.config_path,
                &cluster.certs,
                i,
                cluster.scheduler_addr,
            )
        })
        .collect();
    for (rank, w) in workers.iter_mut().enumerate() {
        let addr = w.wait_line(WORKER_METRICS, GENEROUS);
        let line = w.wait_line("pushpull-worker progress ", GENEROUS);
        let done: f64 = line
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix("round="))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no round in {line:?}"));
        let s = scrape(&addr);
        let rank = rank.to_string();
        let me = [("role", "worker"), ("rank", rank.as_str())];
        let tensors: Vec<&String> = s
            .keys()
            .filter(|k| k.starts_with("pushpull_tensor_rounds_total{"))
            .collect();
        assert!(tensors.len() > 1, "{tensors:?}");
        for t in tensors {
            assert!(s[t] >= done, "{t} = {} after round {done}", s[t]);
        }
        assert!(value(&s, "pushpull_pushed_bytes_total", &me) > 0.0);
        assert!(
            value(
                &s,
                "pushpull_quic_lost_packets_total",
                &[("peer", "server 0")]
            ) >= 0.0
        );
    }
    // The processes are killed on drop; the job never ends by itself.
    drop(workers);
    drop(cluster);
}

/// Every `pushpull_quic_lost_packets_total` sample of a scrape, summed (all of a node's peers).
fn lost_packets(s: &BTreeMap<String, f64>) -> f64 {
    s.iter()
        .filter(|(k, _)| k.starts_with("pushpull_quic_lost_packets_total{"))
        .map(|(_, v)| v)
        .sum()
}

/// The only loss these machines can make: the whole cluster (scheduler and servers as
/// processes, two workers in process) runs in a namespace of its own whose loopback is shaped
/// by tbf. With a generous queue nothing is dropped and no node counts a lost packet (unless
/// the kernel dropped datagrams on receive, which are then counted); then the queue is cut to a
/// few packets, the qdisc drops, and the nodes' scraped `lost_packets` rise by what the kernel
/// dropped, within 1 % (quinn declares every dropped packet lost once a later one is
/// acknowledged, ACK-only ones included; tbf on loopback keeps order, so a packet that arrived
/// is called lost only by RFC 9002's time threshold, rarely); every round's sum stays bit-exact
/// through the retransmissions.
#[test]
fn lost_packets_are_counted_when_a_tbf_queue_overflows() {
    let _g = cluster_lock();
    let seed = test_seed();
    // 300 Mbit/s; a queue of 4 MB first, then of 4 packets.
    let roomy = ["tbf", "rate", "300mbit", "burst", "3000b", "limit", "4mb"];
    let tight = ["tbf", "rate", "300mbit", "burst", "3000b", "limit", "6000b"];
    let Some(ns) = common::netns::build_or_skip("the tbf loss test", || {
        common::netns::ShapedLoopback::new("loss", &roomy)
    }) else {
        return;
    };
    const LEN: usize = 1 << 20;
    let data = |rank: usize, round: usize| -> Vec<f32> {
        (0..LEN)
            .map(|i| {
                let r =
                    pushpull::jobs::data::mix64(seed ^ ((rank * 1000 + round) << 32 | i) as u64);
                (r >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    };
    let ns = &ns;
    ns.run(|| {
        let mut config = test_config(2, 2);
        config.metrics.listen = Some("127.0.0.1:0".into());
        let mut cluster = ProcCluster::start(config);
        let mut nodes: Vec<String> = vec![cluster.scheduler.wait_line(SCHEDULER_METRICS, GENEROUS)];
        for (p, _) in cluster.servers.iter_mut() {
            nodes.push(p.wait_line(SERVER_METRICS, GENEROUS));
        }
        run_async(async {
            let workers = cluster.join_all().await;
            let endpoints: Vec<_> = workers.iter().map(serve).collect();
            nodes.extend(endpoints.iter().map(|e| e.local_addr().to_string()));
            // Declaring waits for every worker: declare concurrently, keep rank order.
            let mut set = tokio::task::JoinSet::new();
            for (rank, w) in workers.iter().enumerate() {
                let w = w.clone();
                set.spawn(
                    async move { (rank, w.declare("grad", LEN as u64, ParamMap::new()).await) },
                );
            }
            let mut tensors = set.join_all().await;
            tensors.sort_by_key(|(rank, _)| *rank);
            let tensors: Vec<_> = tensors.into_iter().map(|(_, t)| t.unwrap()).collect();
            // The whole cluster's lost packets, scraped, and the datagrams the kernel dropped.
            let count = |nodes: Vec<String>| async move {
                let lost = tokio::task::spawn_blocking(move || {
                    nodes.iter().map(|a| lost_packets(&scrape(a))).sum::<f64>()
                })
                .await
                .unwrap();
                (lost, (ns.tbf_drops() + ns.udp_drops()) as f64)
            };
            let rounds = |these: std::ops::Range<usize>| {
                let (workers, tensors) = (&workers, &tensors);
                async move {
                    for round in these {
                        let bufs: Vec<Vec<f32>> = (0..2).map(|r| data(r, round)).collect();
                        let want = rank_order_sum(&bufs);
                        let mut set = tokio::task::JoinSet::new();
                        for ((w, t), b) in workers.iter().zip(tensors).zip(bufs) {
                            let (w, t) = (w.clone(), t.clone());
                            set.spawn(
                                async move { w.push_pull(&t, b, Reduce::Sum).await.unwrap() },
                            );
                        }
                        while let Some(got) = set.join_next().await {
                            assert_bits_eq(&got.unwrap(), &want, &format!("round {round}"));
                        }
                    }
                }
            };
            rounds(0..2).await;
            let (lost0, dropped0) = count(nodes.clone()).await;
            eprintln!("a roomy queue: {lost0} packets declared lost, {dropped0} dropped");
            assert_eq!(ns.tbf_drops(), 0, "the roomy queue dropped");
            // RFC 9002's time threshold can call a late packet lost on a loss-free link: rare.
            assert!(lost0 <= dropped0 + 10.0, "{lost0} lost, {dropped0} dropped");

            ns.reshape(&tight);
            rounds(2..6).await;
            let (lost1, dropped1) = count(nodes.clone()).await;
            let (lost, dropped) = (lost1 - lost0, dropped1 - dropped0);
            eprintln!("a queue of 4 packets: {lost} packets declared lost, {dropped} dropped");
            assert!(
                ns.tbf_drops() > 100,
                "the queue of 4 packets hardly overflowed"
            );
            // Each dropped datagram is one lost packet (measured: 6–16 more lost than dropped
            // in ~22,500, the time threshold's).
            assert!(
                (lost - dropped).abs() <= 0.01 * dropped + 20.0,
                "{lost} packets declared lost, {dropped} dropped by the kernel"
            );
            let mut set = tokio::task::JoinSet::new();
            for w in workers {
                set.spawn(async move { w.finish().await });
            }
            while let Some(r) = set.join_next().await {
                r.unwrap().expect("finish");
            }
            drop(endpoints);
        });
        cluster.expect_clean_exit();
    });
}
