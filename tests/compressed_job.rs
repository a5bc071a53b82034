//! The built-in benchmark job with compressed tensors, through `pushpull local` (real
//! processes): every worker checks every round bit for bit against the single-process
//! reference of the compressed job, and pushes far fewer bytes than fp32.

mod common;

use std::time::Duration;

use common::*;
use pushpull::jobs::JobConfig;

#[test]
fn compressed_benchmark_job_matches_the_reference_in_every_process() {
    let _g = cluster_lock();
    let seed = test_seed();
    let dir = tempfile::tempdir().unwrap();
    let mut config = pushpull::launch::local::default_config();
    config.cluster.seed = Some(seed);
    // At scale 0.01 most ResNet tensors are small: compress everything from 1 KiB up.
    config.cluster.min_compress_bytes = 1024;
    JobConfig::edit(&mut config, |j| {
        j.kind = "benchmark".into();
        j.scale = 0.01;
        j.rounds = 2;
        j.warmup = 1;
        j.check = true;
    })
    .unwrap();
    let params = [
        ("compressor", "onebit"),
        ("scaling", "true"),
        ("ef", "vanilla"),
        ("momentum", "nesterov"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), toml::Value::String(v.to_string())))
    .collect();
    config.tensors.tables.insert("default".into(), params);
    let path = write_config(&config, dir.path());
    let (code, out, err) = run_bin(
        PUSHPULL,
        &["local", "--config", &path.display().to_string(), "--json"],
        Duration::from_secs(300),
    );
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    let summary: pushpull::launch::local::LocalSummary = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary.workers.len(), 2);
    for w in &summary.workers {
        assert_eq!(w.check, "passed", "{w:?}");
        assert_eq!(w.checked_rounds, 3, "{w:?}");
        // Nearly all bytes are in tensors above min_compress_bytes: onebit cuts them ~30x.
        let raw = w.gradient_bytes_per_round * u64::from(w.rounds);
        assert!(
            w.push_payload_bytes * 8 < raw,
            "pushed {} of {raw} raw bytes",
            w.push_payload_bytes
        );
    }
}
