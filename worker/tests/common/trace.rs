//! Reading a timeline back (`[trace] dir`): the one file an in-process job writes, its events,
//! and the spans they pair into, checked well formed and within the step window.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use pushpull_proto::Config;
use serde_json::Value;

use super::{stack_with, Stack, TIMEOUT};

/// One span: begin and end times and the begin's args.
#[derive(Debug)]
pub struct Span {
    pub cat: String,
    pub name: String,
    pub b: u64,
    pub e: u64,
    pub args: Value,
}

/// A stack of `workers` and `servers` (chunks of `partition_bytes`) whose nodes trace steps
/// `start..=end` into a fresh folder, returned with it; `tweak` sets the rest of the config.
pub async fn traced_stack(
    (workers, servers, partition_bytes): (u32, u32, u64),
    (start, end): (u64, u64),
    tweak: impl FnOnce(&mut Config),
) -> (tempfile::TempDir, Stack) {
    let dir = tempfile::tempdir().unwrap();
    let trace_dir = dir.path().to_string_lossy().into_owned();
    let stack = tokio::time::timeout(TIMEOUT, async {
        stack_with(workers, servers, partition_bytes, |c| {
            c.trace.dir = Some(trace_dir);
            c.trace.start_step = start;
            c.trace.end_step = Some(end);
            tweak(c);
        })
        .await
    })
    .await
    .unwrap();
    (dir, stack)
}

/// The events (metadata left out) of the one trace file in `dir`, whose process names
/// `nodes`. In-process nodes share one file (named after the first node, the scheduler).
pub fn read_events(dir: &Path, nodes: &[&str]) -> Vec<Value> {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let f = &files[0];
    let v: Value = serde_json::from_slice(&std::fs::read(f).unwrap())
        .unwrap_or_else(|e| panic!("{}: not JSON: {e}", f.display()));
    let list = v["traceEvents"].as_array().expect("traceEvents").clone();
    let names = list
        .iter()
        .find(|e| e["ph"] == "M" && e["name"] == "process_name")
        .expect("process_name metadata");
    let names = names["args"]["name"].as_str().unwrap();
    for node in nodes {
        assert!(names.contains(node), "{names}");
    }
    list.into_iter().filter(|e| e["ph"] != "M").collect()
}

/// The round in a span's args.
pub fn round_of(s: &Span) -> u64 {
    s.args["round"].as_u64().expect("round in args")
}

/// The rounds of steps `start..=end` (a tensor's round `r` is step `r + 1`).
pub fn window(start: u64, end: u64) -> BTreeSet<u64> {
    (start - 1..end).collect()
}

/// The spans of `events`, checked well formed (every `b` has exactly one `e` of the same cat,
/// id and name after it, with no twin open between them, and every `e` a `b`; events in time
/// order) and of the rounds in `window` only (spans and instants alike).
pub fn spans(events: &[Value], window: &BTreeSet<u64>) -> Vec<Span> {
    let mut open: HashMap<(String, String, String), Vec<(u64, Value)>> = HashMap::new();
    let mut spans = Vec::new();
    let mut last_ts = 0;
    for e in events {
        let ph = e["ph"].as_str().unwrap();
        let ts = e["ts"].as_u64().expect("ts in µs");
        assert!(ts >= last_ts, "events out of time order: {e}");
        last_ts = ts;
        for field in ["pid", "tid"] {
            assert!(e[field].is_u64(), "{field}: {e}");
        }
        let cat = e["cat"].as_str().expect("cat").to_string();
        let id = e["id"].as_str().expect("id").to_string();
        let name = e["name"].as_str().expect("name").to_string();
        assert!(id.starts_with("0x"), "{e}");
        let track = (cat.clone(), id, name.clone());
        match ph {
            "b" => {
                // Two spans of one track and name open at once would mis-pair in a viewer.
                let list = open.entry(track).or_default();
                assert!(list.is_empty(), "a span begins while its twin is open: {e}");
                list.push((ts, e["args"].clone()));
            }
            "e" => {
                let Some((b, args)) = open.get_mut(&track).and_then(|v| v.pop()) else {
                    panic!("an end without a begin: {e}");
                };
                assert!(ts >= b, "ends before it begins: {e}");
                spans.push(Span {
                    cat,
                    name,
                    b,
                    e: ts,
                    args,
                });
            }
            "n" => {}
            other => panic!("unexpected ph {other}: {e}"),
        }
    }
    let orphans: Vec<_> = open.iter().filter(|(_, v)| !v.is_empty()).collect();
    assert!(orphans.is_empty(), "begins without an end: {orphans:?}");
    for s in &spans {
        assert!(
            window.contains(&round_of(s)),
            "outside the step window: {s:?}"
        );
    }
    for e in events.iter().filter(|e| e["ph"] == "n") {
        if let Some(r) = e["args"]["round"].as_u64() {
            assert!(window.contains(&r), "outside the step window: {e}");
        }
    }
    spans
}
