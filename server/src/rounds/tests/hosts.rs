//! Local groups (ARCHITECTURE.md, "Two levels"): `local_size` G workers per host, one push per
//! host from the key's owner, rank `h·G + key % G`.

use super::*;

/// A key of a job of `w` workers, `g` per host.
fn grouped_key(k: u64, w: u32, g: u32, len: usize) -> KeyRounds {
    KeyRounds::new(
        KeyInfo {
            tensor: "fc1.weight".into(),
            chunk: 3,
            key: k,
            len,
            num_workers: w,
            local_size: g,
            priority: 0,
        },
        fp32_codec(len),
    )
}

fn expect_result(acts: &[Action], round: u64, ranks: &[u32]) -> Bytes {
    match acts {
        [Action::SendResult {
            round: r,
            ranks: rs,
            payload,
        }] => {
            assert_eq!((*r, rs.as_slice()), (round, ranks));
            payload.clone()
        }
        other => panic!("expected one result for round {round}, got {other:?}"),
    }
}

/// Pushes the hosts' `data` for `round` in `order` (host indices) from their owner ranks;
/// returns the result payload, checking that it goes to the owners and nothing is emitted
/// before the last push.
fn run_host_round(k: &mut KeyRounds, round: u64, data: &[Vec<f32>], order: &[usize]) -> Bytes {
    let owners: Vec<u32> = k.info().owner_ranks().collect();
    let mut acts = Vec::new();
    for (i, &h) in order.iter().enumerate() {
        assert!(acts.is_empty(), "emitted early: {acts:?}");
        let rank = k.info().owner_rank(h as u32);
        acts = k.push(rank, round, ReduceOp::Sum, 0, enc(&data[h]));
        assert!(i + 1 == order.len() || acts.is_empty(), "early: {acts:?}");
    }
    expect_result(&acts, round, &owners)
}

#[test]
fn owners_are_one_rank_per_host_and_every_rank_without_groups() {
    // G = 1: every rank is its own host's owner.
    let k = key(5, 1);
    assert_eq!(k.info().num_hosts(), 5);
    assert_eq!(k.info().owner_ranks().collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    assert!((0..5).all(|r| k.info().owner_host(r) == Some(r)));
    assert_eq!(k.info().owner_host(5), None);
    // G = 2, H = 3: key 77 is owned by local rank 1 (77 % 2), key 76 by local rank 0.
    let k = grouped_key(77, 6, 2, 1);
    assert_eq!(k.info().num_hosts(), 3);
    assert_eq!(k.info().owner_local_rank(), 1);
    assert_eq!(k.info().owner_ranks().collect::<Vec<_>>(), [1, 3, 5]);
    let hosts: Vec<_> = (0..7).map(|r| k.info().owner_host(r)).collect();
    assert_eq!(hosts, [None, Some(0), None, Some(1), None, Some(2), None]);
    let k = grouped_key(76, 6, 2, 1);
    assert_eq!(k.info().owner_ranks().collect::<Vec<_>>(), [0, 2, 4]);
    // G = 4, H = 1: one host, its owner alone pushes.
    let k = grouped_key(78, 4, 4, 1);
    assert_eq!(k.info().owner_ranks().collect::<Vec<_>>(), [2]);
}

#[test]
fn two_hosts_of_two_sum_in_host_order_whatever_the_arrival_order() {
    let mut rng = Rng(seed());
    let len = 257;
    // G = 2, H = 2 (4 workers), for an owner of local rank 1 (key 77) and of 0 (key 76).
    for (k, owners) in [(77u64, [1u32, 3]), (76, [0, 2])] {
        let mut key = grouped_key(k, 4, 2, len);
        assert_eq!(key.info().owner_ranks().collect::<Vec<_>>(), owners);
        for round in 0..8u64 {
            let data = random_data(&mut rng, 2, len);
            let expected = bits(&reference_sum(&data));
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            // The first push is held or summed; the round stays open until the second.
            let first = key.info().owner_rank(order[0] as u32);
            assert!(key
                .push(first, round, ReduceOp::Sum, 0, enc(&data[order[0]]))
                .is_empty());
            assert_eq!(key.open_ranks(), [first]);
            let last = key.info().owner_rank(order[1] as u32);
            let acts = key.push(last, round, ReduceOp::Sum, 0, enc(&data[order[1]]));
            let got = expect_result(&acts, round, &owners);
            assert_eq!(bits(&dec(&got)), expected, "key {k} round {round}");
        }
    }
}

#[test]
fn many_hosts_sum_in_host_order_whatever_the_arrival_order() {
    // With three or more hosts the summation order shows in the bits: G = 2, H = 4 and
    // G = 3, H = 3, random arrival orders, against the plain host-order sum.
    let mut rng = Rng(seed());
    let len = 301;
    for (w, g) in [(8u32, 2u32), (9, 3)] {
        let hosts = (w / g) as usize;
        let mut k = grouped_key(1000 + u64::from(w), w, g, len);
        for round in 0..20u64 {
            let data = random_data(&mut rng, hosts, len);
            let expected = bits(&reference_sum(&data));
            if round == 0 {
                let mut reversed = data.clone();
                reversed.reverse();
                assert_ne!(
                    bits(&reference_sum(&reversed)),
                    expected,
                    "data too tame to show summation order"
                );
            }
            let mut order: Vec<usize> = (0..hosts).collect();
            for i in (1..hosts).rev() {
                order.swap(i, rng.below(i + 1));
            }
            let got = run_host_round(&mut k, round, &data, &order);
            assert_eq!(
                bits(&dec(&got)),
                expected,
                "w {w} g {g} round {round} order {order:?}"
            );
        }
    }
}

#[test]
fn a_push_from_a_member_that_does_not_own_the_key_is_rejected_naming_it() {
    // Key 77, G = 2, 4 workers: host 0 pushes from rank 1, host 1 from rank 3.
    let mut k = grouped_key(77, 4, 2, 2);
    assert!(k.push(1, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0])).is_empty());
    // Rank 2 (host 1's local rank 0) pushes: the round is aborted for the owners and for it.
    let acts = k.push(2, 0, ReduceOp::Sum, 0, enc(&[1.0, 1.0]));
    let msg = expect_abort(&acts, 0, &[1, 2, 3]);
    for part in [
        "push from rank 2",
        "rank 2 does not own key 0x000000000000004d",
        "host 1 (ranks 2..=3) pushes it from rank 3",
        "chunk 3",
        "round 0",
    ] {
        assert!(msg.contains(part), "{part} missing: {msg}");
    }
    assert!(!k.is_open());
    assert_eq!(k.current_round(), 1);
    // Rank 0 pushes round 1 first: aborted for the owners and it.
    let msg = expect_abort(
        &k.push(0, 1, ReduceOp::Sum, 0, enc(&[1.0, 1.0])),
        1,
        &[0, 1, 3],
    );
    assert!(
        msg.contains("push from rank 0") && msg.contains("pushes it from rank 1"),
        "{msg}"
    );
    // A non-owner's push for a later round tells it about that round and aborts the current
    // one, without skipping to its round.
    assert!(k.push(3, 2, ReduceOp::Sum, 0, enc(&[1.0, 1.0])).is_empty());
    let acts = k.push(0, 5, ReduceOp::Sum, 0, enc(&[1.0, 1.0]));
    assert_eq!(acts.len(), 2, "{acts:?}");
    let msg = expect_abort(&acts[..1], 5, &[0]);
    assert!(msg.contains("rank 0 for round 5 rejected"), "{msg}");
    expect_abort(&acts[1..], 2, &[1, 3]);
    assert_eq!(k.current_round(), 3);
    // The owners' next round works.
    let got = run_host_round(&mut k, 3, &[vec![1.0, 2.0], vec![3.0, 4.0]], &[1, 0]);
    assert_eq!(dec(&got), vec![4.0, 6.0]);
}

#[test]
fn results_and_aborts_go_only_to_the_owner_ranks() {
    // Key 76, G = 2, H = 3 (6 workers): owners 0, 2, 4.
    let owners = [0u32, 2, 4];
    let mut k = grouped_key(76, 6, 2, 1);
    let data = [vec![1.0], vec![2.0], vec![4.0]];
    let got = run_host_round(&mut k, 0, &data, &[2, 0, 1]);
    assert_eq!(dec(&got), vec![7.0]);
    // A non-finite push: SendNonFinite to the owners.
    let nf = FrameFlags {
        non_finite: true,
        undo_previous: false,
    };
    assert!(k
        .push_flagged(4, 1, ReduceOp::Sum, 0, nf, Bytes::new())
        .is_empty());
    assert!(k.push(0, 1, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
    let acts = k.push(2, 1, ReduceOp::Sum, 0, enc(&[1.0]));
    assert_eq!(
        acts,
        [Action::SendNonFinite {
            round: 1,
            ranks: owners.to_vec()
        }]
    );
    // A duplicate push (an owner's own fault): the owners only.
    assert!(k.push(2, 2, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
    let msg = expect_abort(&k.push(2, 2, ReduceOp::Sum, 0, enc(&[1.0])), 2, &owners);
    assert!(msg.contains("rank 2 pushed twice"), "{msg}");
    // A held payload that fails to decode names its owner rank when its turn comes.
    let short = Bytes::from_static(&[0, 0, 0]);
    assert!(k.push(4, 3, ReduceOp::Sum, 0, short).is_empty());
    assert!(k.push(2, 3, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
    assert_eq!(k.open_ranks(), [2, 4]);
    let msg = expect_abort(&k.push(0, 3, ReduceOp::Sum, 0, enc(&[1.0])), 3, &owners);
    assert!(
        msg.contains("rank 4") && msg.contains("undecodable"),
        "{msg}"
    );
    // A push ahead: the abandoned round's abort goes to the owners.
    assert!(k.push(0, 4, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
    let msg = expect_abort(&k.push(4, 5, ReduceOp::Sum, 0, enc(&[1.0])), 4, &owners);
    assert!(msg.contains("rank 4 pushed round 5"), "{msg}");
    // A lost node (any node, owner of this key or not) aborts for the owners.
    let msg = expect_abort(
        &k.node_lost("worker 1 (127.0.0.1:4000)", "gone"),
        5,
        &owners,
    );
    assert!(msg.contains("worker 1 (127.0.0.1:4000) was lost"), "{msg}");
    assert!(k.is_failed());
    let msg = expect_abort(&k.push(0, 6, ReduceOp::Sum, 0, enc(&[1.0])), 6, &[0]);
    assert!(msg.contains("worker 1"), "{msg}");
}

#[test]
fn a_broadcast_from_a_root_in_host_1_returns_its_payload_through_its_owner() {
    // Key 77, G = 2, 4 workers: owners 1 (host 0) and 3 (host 1).
    let mut k = grouped_key(77, 4, 2, 3);
    let root = enc(&[1.5, -2.0, 7.0]);
    // Root 2 (host 1, not the owner): host 1's owner, rank 3, pushes its payload.
    for (round, root_rank) in [(0u64, 2u32), (1, 3)] {
        assert!(k
            .push(3, round, ReduceOp::Broadcast, root_rank, root.clone())
            .is_empty());
        let acts = k.push(1, round, ReduceOp::Broadcast, root_rank, Bytes::new());
        assert_eq!(expect_result(&acts, round, &[1, 3]), root);
    }
    // The owner of another host pushing a payload is rejected, naming it and the root's host.
    assert!(k
        .push(3, 2, ReduceOp::Broadcast, 2, root.clone())
        .is_empty());
    let msg = expect_abort(
        &k.push(1, 2, ReduceOp::Broadcast, 2, root.clone()),
        2,
        &[1, 3],
    );
    assert!(
        msg.contains("rank 1")
            && msg.contains("non-root host of a broadcast (root 2, on host 1)")
            && msg.contains("host 0"),
        "{msg}"
    );
    // The root's host's owner must push the root's payload.
    assert!(k
        .push(1, 3, ReduceOp::Broadcast, 3, Bytes::new())
        .is_empty());
    let msg = expect_abort(
        &k.push(3, 3, ReduceOp::Broadcast, 3, Bytes::new()),
        3,
        &[1, 3],
    );
    assert!(msg.contains("undecodable broadcast payload"), "{msg}");
    // A root beyond the job's workers is out of range.
    let msg = expect_abort(
        &k.push(1, 4, ReduceOp::Broadcast, 4, Bytes::new()),
        4,
        &[1, 3],
    );
    assert!(msg.contains("broadcast root 4 is out of range"), "{msg}");
    // A root in host 0 (rank 0): rank 1 pushes it; then sums work again.
    let host0 = enc(&[0.5, 0.25, -1.0]);
    assert!(k
        .push(3, 5, ReduceOp::Broadcast, 0, Bytes::new())
        .is_empty());
    let acts = k.push(1, 5, ReduceOp::Broadcast, 0, host0.clone());
    assert_eq!(expect_result(&acts, 5, &[1, 3]), host0);
    let got = run_host_round(&mut k, 6, &[vec![1.0; 3], vec![2.0; 3]], &[0, 1]);
    assert_eq!(dec(&got), vec![3.0; 3]);
}

#[test]
fn a_non_owner_leaving_leaves_the_key_working() {
    // Key 77, G = 2, 4 workers: owners 1 and 3; ranks 0 and 2 push nothing to this key.
    let mut k = grouped_key(77, 4, 2, 1);
    assert!(k.push(1, 0, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
    assert!(k.worker_left(0, "worker 0").is_empty());
    assert!(k.worker_left(2, "worker 2").is_empty());
    let acts = k.push(3, 0, ReduceOp::Sum, 0, enc(&[2.0]));
    assert_eq!(dec(&expect_result(&acts, 0, &[1, 3])), vec![3.0]);
    let got = run_host_round(&mut k, 1, &[vec![1.0], vec![4.0]], &[1, 0]);
    assert_eq!(dec(&got), vec![5.0]);
    // An owner leaving before it pushed fails the open round for the owners, naming it.
    assert!(k.push(1, 2, ReduceOp::Sum, 0, enc(&[1.0])).is_empty());
    let msg = expect_abort(&k.worker_left(3, "worker 3 (127.0.0.1:4003)"), 2, &[1, 3]);
    assert!(
        msg.contains("worker 3 (127.0.0.1:4003) finished") && msg.contains("round 2"),
        "{msg}"
    );
    let msg = expect_abort(&k.push(1, 3, ReduceOp::Sum, 0, enc(&[1.0])), 3, &[1]);
    assert!(msg.contains("worker 3"), "{msg}");
}
