//! The timeline of `pushpull local` (`[trace] dir` and the step window in the cluster file):
//! every process, of every role, writes one complete Chrome trace file, and only the window's
//! round is in it.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use serde_json::Value;

#[test]
fn every_process_of_pushpull_local_writes_its_timeline() {
    let _g = cluster_lock();
    let dir = tempfile::tempdir().unwrap();
    let traces = dir.path().join("traces");
    let config = dir.path().join("cluster.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nscheduler = \"127.0.0.1:0\"\nnum_workers = 2\nnum_servers = 2\n\n\
             [server]\nlisten = \"127.0.0.1:0\"\n\n\
             [trace]\ndir = {:?}\nstart_step = 2\nend_step = 2\n",
            traces.display().to_string()
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let args = [
        "local",
        "--config",
        &config,
        "--job",
        "benchmark",
        "--scale",
        "0.001",
        "--rounds",
        "2",
    ];
    let (code, out, err) = run_bin(PUSHPULL, &args, Duration::from_secs(240));
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");

    let mut roles = Vec::new();
    for entry in std::fs::read_dir(&traces).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap())
            .unwrap_or_else(|e| panic!("{name}: not complete JSON: {e}"));
        let events = v["traceEvents"].as_array().expect("traceEvents");
        let meta = events
            .iter()
            .find(|e| e["ph"] == "M")
            .expect("process_name");
        let node = meta["args"]["name"].as_str().unwrap().to_string();
        // Every begin has its end; only round 1 (step 2) is recorded.
        let mut open: HashMap<(String, String, String), u64> = HashMap::new();
        let mut cats: HashMap<String, usize> = HashMap::new();
        for e in events.iter().filter(|e| e["ph"] != "M") {
            let track = (
                e["cat"].as_str().unwrap().to_string(),
                e["id"].as_str().unwrap().to_string(),
                e["name"].as_str().unwrap().to_string(),
            );
            if let Some(r) = e["args"]["round"].as_u64() {
                assert_eq!(r, 1, "{name}: outside the window: {e}");
            }
            match e["ph"].as_str().unwrap() {
                "b" => *open.entry(track).or_default() += 1,
                "e" => {
                    let n = open.get_mut(&track).expect("an end without a begin");
                    *n -= 1;
                    *cats.entry(track.0).or_default() += 1;
                }
                _ => {}
            }
        }
        assert!(
            open.values().all(|&n| n == 0),
            "{name}: begins without an end"
        );
        let want: &[&str] = match node.as_str() {
            "scheduler" => &[],
            n if n.starts_with("server") => &["key", "frame"],
            n if n.starts_with("worker") => &["round", "chunk", "frame"],
            other => panic!("{name}: process named {other:?}"),
        };
        for cat in want {
            assert!(
                cats.get(*cat).is_some_and(|&n| n > 0),
                "{name}: no {cat} spans"
            );
        }
        roles.push(node);
    }
    roles.sort();
    assert_eq!(
        roles,
        ["scheduler", "server 0", "server 1", "worker 0", "worker 1"],
        "one file per process"
    );
}
