//! `pushpull local` (the README's first command) and `pushpull bench transport`, as a user
//! runs them.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn pushpull_local_runs_a_tiny_job() {
    let _g = cluster_lock();
    let (code, out, err) = run_bin(
        PUSHPULL,
        &["local", "--scale", "0.001", "--rounds", "2"],
        Duration::from_secs(240),
    );
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("check passed"), "{out}");
    assert!(out.contains("all 5 processes exited 0"), "{out}");

    let (code, out, err) = run_bin(
        PUSHPULL,
        &[
            "local",
            "--scale",
            "0.001",
            "--rounds",
            "1",
            "--workers",
            "3",
            "--servers",
            "1",
            "--json",
        ],
        Duration::from_secs(240),
    );
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let summary: pushpull::local::LocalSummary = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary.workers.len(), 3);
    assert!(summary
        .workers
        .iter()
        .all(|w| w.check == "passed" && w.tensors == 161));
    assert_eq!(summary.cpu_seconds.len(), 5, "{:?}", summary.cpu_seconds);
}

#[test]
fn pushpull_local_reports_a_failed_process() {
    let _g = cluster_lock();
    // The scheduler cannot bind its port: the launcher names it and shows its stderr.
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = pushpull::local::default_config();
    config.cluster.scheduler = taken.local_addr().unwrap().to_string();
    config.job.scale = 0.001;
    let path = write_config(&config, dir.path());
    let (code, out, err) = run_bin(
        PUSHPULL,
        &["local", "--config", &path.display().to_string()],
        Duration::from_secs(120),
    );
    assert_eq!(code, Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.contains("scheduler (pid"),
        "names the failed process: {err}"
    );
    assert!(
        err.contains(&taken.local_addr().unwrap().to_string()),
        "shows its stderr: {err}"
    );
}

#[test]
fn bench_transport_reports_throughput() {
    let _g = cluster_lock();
    let (code, out, err) = run_bin(
        PUSHPULL,
        &["bench", "transport", "--bytes", "8000000", "--json"],
        Duration::from_secs(240),
    );
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let r: pushpull::bench::TransportReport = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(r.connections, 4);
    assert_eq!(r.bytes, 4 * 8_000_000);
    assert!(r.gb_per_second > 0.0);
    assert_eq!(r.cpu_seconds.len(), 4, "{:?}", r.cpu_seconds);
}
