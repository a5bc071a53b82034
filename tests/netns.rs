//! Smoke test of `pushpull bench net`'s machinery on a real shaped network: 2 workers and 1
//! server (plus the scheduler), each the real binary in its own network namespace, links shaped
//! to 100 Mbit/s with tbf on both ends; one round of a 10 MB tensor set with onebit, checked bit
//! for bit by the benchmark job (`job.check = true`: every result is compared with the
//! single-process reference); afterwards no namespace of the run may be left.
//!
//! A second test puts two workers on each of two hosts, once as local groups and once flat,
//! and checks that a host of a group sends one copy of its workers' sum.
//!
//! Needs root and working `ip netns`; otherwise it prints why it is skipped, unless
//! `PUSHPULL_REQUIRE_NETNS=1` (set by `.ci/run` where CI has the capability), which turns a
//! missing capability into a failure.

mod common;

use std::time::Duration;

use pushpull::bench::net::cluster::{run_cluster, RunLimits};
use pushpull::bench::net::probe::transfer;
use pushpull::bench::net::topo::{list_namespaces, Shaping, Topology, DEFAULT_MTU};
use pushpull::bench::net::{preset, run_config, scale_for_mb};
use pushpull::launch::procs::Programs;

const RATE: u64 = 100_000_000;

fn hosts() -> Vec<String> {
    ["scheduler", "server0", "worker0", "worker1"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The shaped network of `hosts` (name, nodes), `None` when it cannot be built here (see
/// [`common::netns::build_or_skip`]).
fn network_or_skip(hosts: &[(String, Vec<String>)], test: &str) -> Option<Topology> {
    let shaping = Shaping {
        rate_bits: RATE,
        mtu: DEFAULT_MTU,
    };
    common::netns::build_or_skip(test, || {
        Topology::with_nodes(hosts, shaping).map_err(|e| e.to_string())
    })
}

fn programs() -> Programs {
    Programs::explicit(
        env!("CARGO_BIN_EXE_pushpull").as_ref(),
        env!("CARGO_BIN_EXE_pushpull-worker").as_ref(),
    )
}

/// Asserts no namespace of the run is left, whatever happened.
fn assert_deleted(prefix: &str, names: &[String]) {
    let left: Vec<String> = list_namespaces()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
    for n in names {
        assert!(
            !std::path::Path::new(&format!("/var/run/netns/{n}")).exists(),
            "{n} still exists"
        );
    }
}

#[test]
fn onebit_round_on_a_shaped_network() {
    let hosts: Vec<_> = hosts().into_iter().map(|h| (h.clone(), vec![h])).collect();
    let Some(topo) = network_or_skip(&hosts, "shaped-network smoke test") else {
        return;
    };
    let prefix = topo.prefix.clone();
    let names: Vec<String> = topo.namespaces().to_vec();
    assert_eq!(names.len(), 5, "{names:?}");

    // The shaping works: a TCP transfer worker0 -> server0 gets close to 100 Mbit/s, no more.
    let w0 = topo.hosts.iter().position(|h| h.name == "worker0").unwrap();
    let s0 = topo.hosts.iter().position(|h| h.name == "server0").unwrap();
    let rate = transfer(&topo, w0, s0, 0.5)
        .expect("rate probe")
        .bits_per_second;
    eprintln!("worker0 -> server0: {:.1} Mbit/s", rate / 1e6);
    assert!(
        rate > 0.5 * RATE as f64 && rate < 1.1 * RATE as f64,
        "{rate} bit/s on a 100 Mbit/s link"
    );

    let config = run_config(
        &pushpull::launch::local::default_config(),
        (2, 1, 1),
        scale_for_mb(10.0),
        (1, 0, true),
        &preset("onebit").unwrap(),
    )
    .unwrap();
    let programs = programs();
    let limits = RunLimits {
        timeout: Duration::from_secs(120),
        logs: false,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let result = rt.block_on(run_cluster(&topo, &config, &programs, &limits));
    drop(topo);
    assert_deleted(&prefix, &names);

    let run = result.expect("the cluster run on the shaped network");
    assert_eq!(run.reports.len(), 2);
    for r in &run.reports {
        assert_eq!(r.check, "passed", "rank {}", r.rank);
        assert_eq!(r.checked_rounds, 1, "rank {}", r.rank);
        assert_eq!(r.rounds, 1);
        let raw = r.gradient_bytes_per_round as f64;
        assert!((raw - 10e6).abs() < 0.01e6, "{raw} bytes per round");
        eprintln!(
            "rank {}: pushed {} bytes, pulled {} bytes of {raw} fp32 bytes in {:.3} s",
            r.rank, r.push_payload_bytes, r.pull_payload_bytes, r.seconds
        );
        // onebit really travels (tensors under `min_compress_bytes` stay fp32 at this size).
        assert!(
            (r.push_payload_bytes as f64) * 4.0 < raw,
            "rank {} pushed {} bytes of {raw} fp32 bytes: not compressed",
            r.rank,
            r.push_payload_bytes
        );
    }
}

/// Two hosts of two workers each (`bench net --local-size 2`'s placement), uncompressed, one
/// warm-up and one timed round of 4 MB per worker, checked bit for bit against the reference:
/// in local groups each host's link carries one copy of its workers' sum (the pushes of a
/// host's two workers add up to one worker's flat pushes, and its wire bytes are about half
/// the flat run's on the same hosts).
#[test]
fn local_groups_send_one_copy_per_host() {
    let hosts = pushpull::bench::net::host_names(1, 4, 2);
    assert_eq!(hosts[2].0, "host0");
    assert_eq!(
        hosts[3].1,
        vec!["worker2".to_string(), "worker3".to_string()]
    );
    let Some(topo) = network_or_skip(&hosts, "local groups on a shaped network") else {
        return;
    };
    let (prefix, names) = (topo.prefix.clone(), topo.namespaces().to_vec());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let limits = RunLimits {
        timeout: Duration::from_secs(120),
        logs: false,
    };
    let mut runs = Vec::new();
    for local_size in [2, 1] {
        let config = run_config(
            &pushpull::launch::local::default_config(),
            (4, 1, local_size),
            scale_for_mb(4.0),
            (1, 1, true),
            &preset("none").unwrap(),
        )
        .unwrap();
        runs.push(rt.block_on(run_cluster(&topo, &config, &programs(), &limits)));
    }
    drop(topo);
    assert_deleted(&prefix, &names);

    let flat = runs.pop().unwrap().expect("the flat run");
    let grouped = runs.pop().unwrap().expect("the run in local groups");
    assert_eq!(grouped.hosts[2..], ["host0", "host0", "host1", "host1"]);
    for r in grouped.reports.iter().chain(&flat.reports) {
        assert_eq!(r.check, "passed", "rank {}", r.rank);
    }
    let pushed = |run: &pushpull::bench::net::cluster::ClusterRun, ranks: &[usize]| -> u64 {
        ranks
            .iter()
            .map(|&w| run.reports[w].push_payload_bytes)
            .sum()
    };
    for host in [[0, 1], [2, 3]] {
        let (g, f) = (pushed(&grouped, &host), pushed(&flat, &host[..1]));
        eprintln!(
            "workers {host:?}: pushed {g} bytes in a group, worker {} {f} flat",
            host[0]
        );
        assert!(
            (g as f64 - f as f64).abs() <= 0.01 * f as f64,
            "host of workers {host:?} pushed {g} bytes in a group, one flat worker {f}"
        );
    }
    // The timed round's wire bytes sent by host0 (process 2 is worker0, on host0).
    let sent = |run: &pushpull::bench::net::cluster::ClusterRun| {
        let (a, b) = run.window.as_ref().expect("counters of the timed round");
        b.bytes[2].0 - a.bytes[2].0
    };
    let (g, f) = (sent(&grouped), sent(&flat));
    eprintln!("host0 sent {g} bytes in groups, {f} flat");
    assert!(
        (g as f64) < 0.6 * f as f64,
        "host0 sent {g} bytes in local groups and {f} flat: not one copy per host"
    );
}
