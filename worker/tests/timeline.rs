//! The timeline (`[trace] dir`): a small job with tracing on and a step window, then every
//! trace file read back with serde_json: spans well formed, each chunk's phases inside its
//! round on the worker, every phase of every node present for the rounds in the window and
//! nothing recorded outside it; two tensors pushed from device buffers (the emulated device) in
//! one group call, one batch, whose track holds its launch, staging and decode. One cluster
//! test per binary (the recorder is the process's); the checks themselves are tried on events
//! made here (`the_checks`).

use std::collections::{BTreeSet, HashMap};

use std::sync::Arc;

use pushpull_worker::{Device, EmulatedDevice, Reduce};
use serde_json::Value;

mod common;
use common::trace::{self, Span};
use common::*;

/// Steps 2..=3: rounds 1 and 2 of each tensor (rounds count from 0).
const START_STEP: u64 = 2;
const END_STEP: u64 = 3;
const ROUNDS: u64 = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_writes_a_well_formed_timeline_within_its_step_window() {
    // 64-byte partitions: 16 elements per chunk, so "a" has 3 chunks and "b" 2.
    let (dir, s) = trace::traced_stack((2, 2, 64), (START_STEP, END_STEP), |_| {}).await;
    let a = declare_all(&s, "a", 40).await;
    let b = declare_all(&s, "b", 20).await;
    // "c" and "d" are pushed from device buffers (the emulated device) in one group call:
    // their chunks go as one batch.
    let c = declare_all(&s, "c", 24).await;
    let d = declare_all(&s, "d", 16).await;
    assert_eq!((a[0].num_chunks(), b[0].num_chunks()), (3, 2));
    let device = Arc::new(EmulatedDevice::new());
    let mut tensor_of_key = HashMap::new();
    for t in [&a[0], &b[0], &c[0], &d[0]] {
        for c in &t.placement().chunks {
            tensor_of_key.insert(c.key, t.name().to_string());
        }
    }
    tokio::time::timeout(TIMEOUT, async {
        for round in 0..ROUNDS {
            let calls = (0..2usize).flat_map(|r| {
                [(&a, 40usize), (&b, 20)].map(|(t, len)| {
                    let (w, t) = (s.workers[r].clone(), t[r].clone());
                    async move {
                        w.push_pull(&t, data(round ^ r as u64, len), Reduce::Sum)
                            .await
                    }
                })
            });
            for result in futures_util::future::join_all(calls).await {
                result.unwrap();
            }
            let on_device = (0..2usize).map(|r| {
                let (w, device) = (s.workers[r].clone(), device.clone());
                let calls: Vec<_> = [(&c, 24), (&d, 16)]
                    .map(|(t, len)| {
                        let mem = device.alloc_zeros(len).unwrap();
                        // SAFETY: `mem` holds `len` elements.
                        unsafe { device.upload(&data(round, len), device.mem_addr(&mem)) }.unwrap();
                        (t[r].clone(), mem)
                    })
                    .into();
                async move {
                    let handles = w.push_pull_group_device(calls, &device, Reduce::Sum).await;
                    for h in handles {
                        h.await.unwrap();
                    }
                }
            });
            futures_util::future::join_all(on_device).await;
        }
    })
    .await
    .unwrap();
    s.finish_all().await;

    let nodes = ["scheduler", "server 0", "server 1", "worker 0", "worker 1"];
    let events = trace::read_events(dir.path(), &nodes);
    check(&events, &tensor_of_key);
}

fn check(events: &[Value], tensor_of_key: &HashMap<u64, String>) {
    let window = trace::window(START_STEP, END_STEP);
    let spans = trace::spans(events, &window);
    let round_of = trace::round_of;

    // The worker: a round span per (rank, tensor, round), and each chunk's phases inside it.
    let mut rounds: HashMap<(u64, String, u64), &Span> = HashMap::new();
    for s in spans.iter().filter(|s| s.cat == "round") {
        let rank = s.args["rank"].as_u64().unwrap();
        let tensor = s.args["tensor"].as_str().unwrap().to_string();
        assert_eq!(s.name, tensor);
        let old = rounds.insert((rank, tensor, round_of(s)), s);
        assert!(old.is_none(), "two spans of one round: {s:?}");
    }
    let mut phases: HashMap<(u64, u64, u64), BTreeSet<String>> = HashMap::new();
    for s in spans.iter().filter(|s| s.cat == "chunk") {
        let rank = s.args["rank"].as_u64().unwrap();
        let key = s.args["key"].as_u64().unwrap();
        let round = round_of(s);
        let tensor = tensor_of_key[&key].clone();
        let r = rounds
            .get(&(rank, tensor, round))
            .unwrap_or_else(|| panic!("a chunk phase without its round: {s:?}"));
        assert!(
            r.b <= s.b && s.e <= r.e,
            "{} of key {key:#x} round {round} on worker {rank} ({}..{}) outside its round ({}..{})",
            s.name,
            s.b,
            s.e,
            r.b,
            r.e
        );
        phases
            .entry((rank, key, round))
            .or_default()
            .insert(s.name.clone());
    }
    assert_eq!(rounds.len(), 2 * 4 * window.len(), "{:?}", rounds.keys());
    let want: BTreeSet<String> = ["compress", "wait", "pull", "decompress"]
        .map(String::from)
        .into();
    assert_eq!(phases.len(), 2 * tensor_of_key.len() * window.len());
    for (at, got) in &phases {
        assert_eq!(got, &want, "{at:?}");
    }

    // The device tensors' batch: per worker and round, one track named after "c", the first
    // of its tensors: launch, staged and decode, in order; the launch comes before the batch's
    // rounds begin, the decode ends before either ends.
    let mut batches: HashMap<(u64, u64), Vec<&Span>> = HashMap::new();
    for s in spans.iter().filter(|s| s.cat == "batch") {
        assert_eq!(s.args["tensor"], "c", "{s:?}");
        let rank = s.args["rank"].as_u64().unwrap();
        batches.entry((rank, round_of(s))).or_default().push(s);
    }
    assert_eq!(batches.len(), 2 * window.len(), "{:?}", batches.keys());
    for ((rank, round), list) in &batches {
        let names: Vec<&str> = list.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names.len(), 3, "{names:?}");
        let phase = |name: &str| *list.iter().find(|s| s.name == name).unwrap();
        let (launch, staged, decode) = (phase("launch"), phase("staged"), phase("decode"));
        assert!(launch.e <= staged.b && staged.e <= decode.b, "{list:?}");
        let of = |t: &str| rounds[&(*rank, t.to_string(), *round)];
        let (c, d) = (of("c"), of("d"));
        assert!(launch.e <= c.b.min(d.b), "{list:?}, {c:?}, {d:?}");
        assert!(decode.e <= c.e.min(d.e), "{list:?}, {c:?}, {d:?}");
    }

    // The servers: per key and round, receive, a sum per worker and the encode, after them.
    let mut keyed: HashMap<(u64, u64), Vec<&Span>> = HashMap::new();
    for s in spans.iter().filter(|s| s.cat == "key") {
        keyed
            .entry((s.args["key"].as_u64().unwrap(), round_of(s)))
            .or_default()
            .push(s);
    }
    assert_eq!(keyed.len(), tensor_of_key.len() * window.len());
    for (at, list) in &keyed {
        let mut names: Vec<&str> = list.iter().map(|s| s.name.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            ["encode", "receive", "sum (host 0)", "sum (host 1)"],
            "{at:?}"
        );
        let encode = list.iter().find(|s| s.name == "encode").unwrap();
        for s in list.iter().filter(|s| s.name.starts_with("sum")) {
            assert!(s.e <= encode.b, "{at:?}: a sum after the encode");
        }
    }

    // Frames: every push and result of the window, from both sides.
    let count = |name: &str| {
        spans
            .iter()
            .filter(|s| s.cat == "frame" && s.name == name)
            .count()
    };
    let per = 2 * tensor_of_key.len() * window.len();
    assert_eq!((count("push"), count("result")), (per, per));
}

/// The checks fail on what they must catch (no cluster: events written here).
mod the_checks {
    use super::*;
    use serde_json::json;

    fn ev(ph: &str, ts: u64, cat: &str, name: &str, id: &str, round: u64) -> Value {
        json!({"ph": ph, "ts": ts, "cat": cat, "name": name, "id": id, "pid": 1, "tid": 1,
               "args": {"round": round, "rank": 0, "tensor": "a", "key": 7}})
    }

    #[test]
    #[should_panic(expected = "begins without an end")]
    fn an_orphan_begin_fails() {
        check(&[ev("b", 1, "chunk", "wait", "0x1", 1)], &HashMap::new());
    }

    #[test]
    #[should_panic(expected = "while its twin is open")]
    fn twins_open_at_once_fail() {
        let events = [
            ev("b", 1, "chunk", "wait", "0x1", 1),
            ev("b", 2, "chunk", "wait", "0x1", 1),
            ev("e", 3, "chunk", "wait", "0x1", 1),
            ev("e", 4, "chunk", "wait", "0x1", 1),
        ];
        check(&events, &HashMap::new());
    }

    #[test]
    #[should_panic(expected = "outside the step window")]
    fn a_round_outside_the_window_fails() {
        let events = [
            ev("b", 1, "round", "a", "0x1", 0),
            ev("e", 2, "round", "a", "0x1", 0),
        ];
        check(&events, &HashMap::new());
    }

    #[test]
    #[should_panic(expected = "outside its round")]
    fn a_phase_outside_its_round_fails() {
        let events = [
            ev("b", 1, "round", "a", "0x1", 1),
            ev("b", 2, "chunk", "compress", "0x2", 1),
            ev("e", 3, "round", "a", "0x1", 1),
            ev("e", 4, "chunk", "compress", "0x2", 1),
        ];
        check(&events, &HashMap::from([(7, "a".to_string())]));
    }
}
