//! `pushpull local` (the README's first command) and `pushpull bench transport`, as a user
//! runs them.

mod common;

use std::time::Duration;

use common::*;
use pushpull::jobs::JobConfig;

#[test]
fn pushpull_local_runs_a_tiny_job() {
    let _g = cluster_lock();
    let (code, out, err) = run_bin(
        PUSHPULL,
        &[
            "local",
            "--job",
            "benchmark",
            "--scale",
            "0.001",
            "--rounds",
            "2",
        ],
        Duration::from_secs(240),
    );
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("check passed"), "{out}");
    assert!(out.contains("all 5 processes exited 0"), "{out}");

    let (code, out, err) = run_bin(
        PUSHPULL,
        &[
            "local",
            "--job",
            "benchmark",
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
    let summary: pushpull::launch::local::LocalSummary = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary.workers.len(), 3);
    assert!(summary
        .workers
        .iter()
        .all(|w| w.check == "passed" && w.tensors == 161));
    assert_eq!(summary.cpu_seconds.len(), 5, "{:?}", summary.cpu_seconds);
}

/// The benchmark job on device buffers (`--buffers emulated`: the device data path with the
/// host-emulated device) gives the single-process reference's bits, with a compressor that has
/// device kernels and one that falls back to the CPU, and says where each compressed;
/// `--buffers device` without a GPU stops before starting anything, naming what is missing.
#[test]
fn pushpull_local_benchmark_on_device_buffers() {
    let _g = cluster_lock();
    // minmax has device kernels (and draws rounding noise from the round's streams, so the
    // check also needs the reference to count the job's broadcast round); top-k does not (its
    // tensors compress on the CPU), and tensors too small to compress go raw from the device.
    for (compressor, places) in [
        ("minmax", "compressed on emulated (161 tensors)"),
        ("topk", "compressed on emulated (143 tensors), cpu (18)"),
    ] {
        let (code, out, err) = run_bin(
            PUSHPULL,
            &[
                "local",
                "--job",
                "benchmark",
                "--buffers",
                "emulated",
                "--compressor",
                compressor,
                "--scale",
                "0.05",
                "--rounds",
                "2",
            ],
            Duration::from_secs(240),
        );
        assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
        for w in 0..2 {
            let line = out
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("worker {w}:")))
                .unwrap_or_else(|| panic!("no line for worker {w}:\n{out}"));
            assert!(
                line.contains("check passed") && line.contains("emulated buffers"),
                "{line}"
            );
            assert!(line.contains(places), "{compressor}: {line}");
        }
    }
    if pushpull_kernels::cuda::gpu_available() {
        println!("a GPU is usable here: --buffers device is not checked for its error");
        return;
    }
    let (code, _, err) = run_bin(
        PUSHPULL,
        &["local", "--job", "benchmark", "--buffers", "device"],
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("job.buffers = \"device\"") && err.contains("GPU"),
        "{err}"
    );
}

#[test]
fn pushpull_local_reports_a_failed_process() {
    let _g = cluster_lock();
    // The scheduler cannot bind its port: the launcher names it and shows its stderr.
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = pushpull::launch::local::default_config();
    config.cluster.scheduler = taken.local_addr().unwrap().to_string();
    JobConfig::edit(&mut config, |j| {
        j.kind = "benchmark".into();
        j.scale = 0.001;
    })
    .unwrap();
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
fn pushpull_local_trains_and_compares() {
    let _g = cluster_lock();
    // A tiny model: the default command's code path (two runs, a table) in seconds.
    let (code, out, err) = run_bin(
        PUSHPULL,
        &[
            "local",
            "--compare",
            "none,onebit,logistic",
            "--steps",
            "20",
            "--hidden",
            "32",
            "--json",
        ],
        Duration::from_secs(240),
    );
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let r: pushpull::jobs::train::compare::CompareReport =
        serde_json::from_str(out.trim()).unwrap();
    let names: Vec<&str> = r.summary.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["none", "onebit", "logistic"]);
    assert_eq!(r.runs.len(), 3);
    assert!(r
        .runs
        .iter()
        .all(|run| run.steps == 20 && run.raw_bytes > 0));
    assert_eq!(
        r.runs[0].bytes_pushed, r.runs[0].raw_bytes,
        "none pushes raw fp32"
    );
    assert!(
        r.runs[2].params < r.params,
        "the baseline is smaller than the MLP"
    );

    // Text output: the table and the comparison line.
    let (code, out, err) = run_bin(
        PUSHPULL,
        &[
            "local",
            "--compressor",
            "fp16",
            "--steps",
            "5",
            "--hidden",
            "16",
        ],
        Duration::from_secs(240),
    );
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("test acc %") && out.contains("fp16"), "{out}");
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
    let r: pushpull::bench::transport::TransportReport = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(r.connections, 4);
    assert_eq!(r.bytes, 4 * 8_000_000);
    assert!(r.gb_per_second > 0.0);
    assert_eq!(r.cpu_seconds.len(), 4, "{:?}", r.cpu_seconds);
}
