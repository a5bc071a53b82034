//! Two-level jobs (`cluster.local_size` > 1) through the real scheduler, servers and local
//! groups (shared memory and notes between the workers of a group, here tasks of one process),
//! checked against the single-process reference bit for bit.

mod common;
use common::set::*;
use common::*;

/// Two hosts of two workers: each host's sum in local-rank order, pushed once per host by each
/// chunk's owner; every compressor of the set, error feedback, momentum, mixed precision's
/// discarded steps, half the calls out of place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_groups_of_two_give_the_references_bits() {
    tokio::time::timeout(TIMEOUT * 2, async {
        let seed = seed();
        let reference = run_reference_of(seed, 4, 2);
        let (got, bytes) = run_set_cluster(seed, 4, 2, true).await;
        if let Some(d) = first_difference(&got, &reference) {
            panic!("two-level cluster vs reference (seed {seed}): {d}");
        }
        // Not the flat job's bits: the groups changed the order of the sum.
        let flat = run_reference_of(seed, 4, 1);
        assert!(first_difference(&got, &flat).is_some());
        // The owners pushed: bytes went to the servers.
        assert!(bytes.iter().map(|b| b.0).sum::<u64>() > 0, "{bytes:?}");
    })
    .await
    .expect("timed out");
}

/// One host of three: the reduction ends on the host (no push at all), unless forced through
/// the servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_group_reduces_on_its_host() {
    tokio::time::timeout(TIMEOUT * 2, async {
        let seed = seed();
        let reference = run_reference_of(seed, 3, 3);
        let (got, bytes) = run_set_cluster(seed, 3, 3, false).await;
        if let Some(d) = first_difference(&got, &reference) {
            panic!("one-group cluster vs reference (seed {seed}): {d}");
        }
        assert!(bytes.iter().all(|&(pushed, _)| pushed == 0), "{bytes:?}");
    })
    .await
    .expect("timed out");
}
