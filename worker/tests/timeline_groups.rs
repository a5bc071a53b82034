//! The timeline of a two-level job (`cluster.local_size` 2, two hosts of two workers): every
//! member's chunk track holds the group's phases, in order, inside the member's round: `turn`
//! (waiting for the member before it, or for every member's copy of the last round), `add`
//! (its part of the host's sum), then on the chunk's owner `others add` (waiting for the rest
//! of the host, unless it is the last member) and the push's `compress`, `wait`, `pull` and
//! `decompress`, on the others `outcome` (waiting for the owner's note), and `copy` (the
//! result out). One cluster test per binary: the recorder is the process's.

use std::collections::{BTreeSet, HashMap};

use pushpull_proto::placement::chunk_owner;
use pushpull_worker::Reduce;

mod common;
use common::trace::{self, Span};
use common::*;

/// Steps 2..=3: rounds 1 and 2 (rounds count from 0).
const START_STEP: u64 = 2;
const END_STEP: u64 = 3;
const ROUNDS: u64 = 4;
const WORKERS: u32 = 4;
const LOCAL_SIZE: u32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_level_job_traces_its_group_phases() {
    // 64-byte partitions: 16 elements per chunk, so "a" has 3 chunks.
    let (dir, s) = trace::traced_stack((WORKERS, 2, 64), (START_STEP, END_STEP), |c| {
        c.cluster.local_size = LOCAL_SIZE;
    })
    .await;
    let a = declare_all(&s, "a", 40).await;
    let keys: Vec<u64> = a[0].placement().chunks.iter().map(|c| c.key).collect();
    assert_eq!(keys.len(), 3);
    tokio::time::timeout(TIMEOUT, async {
        for round in 0..ROUNDS {
            let calls = (0..WORKERS as usize).map(|r| {
                let (w, t) = (s.workers[r].clone(), a[r].clone());
                async move {
                    w.push_pull(&t, data(round ^ r as u64, 40), Reduce::Sum)
                        .await
                }
            });
            for result in futures_util::future::join_all(calls).await {
                result.unwrap();
            }
        }
    })
    .await
    .unwrap();
    s.finish_all().await;

    let nodes = ["scheduler", "server 0", "server 1", "worker 0", "worker 3"];
    let events = trace::read_events(dir.path(), &nodes);
    let window = trace::window(START_STEP, END_STEP);
    check(&trace::spans(&events, &window), &keys, &window);
}

/// The phases of each member's chunk tracks, against the order of a group's round.
fn check(spans: &[Span], keys: &[u64], window: &BTreeSet<u64>) {
    let mut rounds: HashMap<(u64, u64), &Span> = HashMap::new();
    for s in spans.iter().filter(|s| s.cat == "round") {
        let rank = s.args["rank"].as_u64().unwrap();
        assert!(rounds.insert((rank, trace::round_of(s)), s).is_none());
    }
    assert_eq!(rounds.len(), WORKERS as usize * window.len());
    let mut tracks: HashMap<(u64, u64, u64), Vec<&Span>> = HashMap::new();
    for s in spans.iter().filter(|s| s.cat == "chunk") {
        let (rank, key) = (s.args["rank"].as_u64(), s.args["key"].as_u64());
        let at = (rank.unwrap(), key.unwrap(), trace::round_of(s));
        tracks.entry(at).or_default().push(s);
    }
    assert_eq!(tracks.len(), WORKERS as usize * keys.len() * window.len());
    for ((rank, key, round), track) in &tracks {
        let what = format!("worker {rank}, key {key:#x}, round {round}");
        let (l, g) = (*rank as u32 % LOCAL_SIZE, LOCAL_SIZE);
        let owner = chunk_owner(*key, g) == l;
        let mut want = vec!["turn", "add", "copy"];
        if owner {
            want.extend(["compress", "wait", "pull", "decompress"]);
            if l + 1 != g {
                want.push("others add");
            }
        } else {
            want.push("outcome");
        }
        let got: BTreeSet<&str> = track.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(got, want.into_iter().collect(), "{what}");
        assert_eq!(track.len(), got.len(), "{what}: a phase twice");
        let r = rounds[&(*rank, *round)];
        let phase = |name: &str| *track.iter().find(|s| s.name == name).unwrap();
        for s in track {
            assert!(
                r.b <= s.b && s.e <= r.e,
                "{what}: {} outside its round",
                s.name
            );
        }
        // The order of a member's round: its turn, its add, what it waits for, the copy.
        let order: &[&str] = match (owner, l + 1 != g) {
            (true, true) => &[
                "turn",
                "add",
                "others add",
                "compress",
                "wait",
                "decompress",
                "copy",
            ],
            (true, false) => &["turn", "add", "compress", "wait", "decompress", "copy"],
            (false, _) => &["turn", "add", "outcome", "copy"],
        };
        for pair in order.windows(2) {
            assert!(
                phase(pair[0]).e <= phase(pair[1]).b,
                "{what}: {} ends after {} begins",
                pair[0],
                pair[1]
            );
        }
        // Across the host: a member's turn ends once the member before it added its part.
        if l > 0 {
            let before = &tracks[&(rank - 1, *key, *round)];
            let add = before.iter().find(|s| s.name == "add").unwrap();
            assert!(
                add.e <= phase("turn").e,
                "{what}: its turn before the add of {l} - 1"
            );
        }
    }
}
