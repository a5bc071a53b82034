//! Gossip rounds ([`KeyRounds::with_gossip`]): the relay and its refusals.

use super::*;

/// A gossip key relays each rank its neighbours' messages, in ascending rank order, whatever
/// order they arrive in; nothing is decoded; a sum push, a message of the wrong length or a
/// second push is refused.
#[test]
fn gossip_relays_each_rank_its_neighbours_messages() {
    let seed = seed();
    let mut rng = Rng(seed);
    // Ranks 0..4; 0 neighbours 1, 2 and 3; the others 0 (a star).
    let graph = Arc::new(vec![vec![1, 2, 3], vec![0], vec![0], vec![0]]);
    let mut k = key(4, 3).with_gossip(graph);
    let msgs: Vec<Bytes> = (0..4)
        .map(|_| enc(&[rng.f32(), rng.f32(), rng.f32()]))
        .collect();
    let mut order: Vec<u32> = (0..4).collect();
    for i in (1..4).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let mut acts = Vec::new();
    for &r in &order {
        acts = k.push(r, 0, ReduceOp::Gossip, 0, msgs[r as usize].clone());
    }
    let [Action::SendEach { round: 0, results }] = acts.as_slice() else {
        panic!("seed {seed}: {acts:?}");
    };
    let cat = |rs: &[usize]| -> Bytes { rs.iter().flat_map(|&r| msgs[r].to_vec()).collect() };
    assert_eq!(results[0], (0, cat(&[1, 2, 3])), "seed {seed}");
    for (r, result) in results.iter().enumerate().skip(1) {
        assert_eq!(*result, (r as u32, cat(&[0])), "seed {seed}");
    }
    // Round 1: the wrong op, the wrong length and a second push are each refused.
    let refused = |acts: Vec<Action>, what: &str| {
        assert!(
            matches!(&acts[..], [Action::SendAbort { message, .. }, ..] if message.contains(what)),
            "{what}: {acts:?}"
        );
    };
    refused(
        k.push(0, 1, ReduceOp::Sum, 0, msgs[0].clone()),
        "a sum push to a gossip key",
    );
    refused(
        k.push(1, 2, ReduceOp::Gossip, 0, enc(&[1.0])),
        "12-byte message",
    );
    assert!(k
        .push(1, 3, ReduceOp::Gossip, 0, msgs[1].clone())
        .is_empty());
    refused(
        k.push(1, 3, ReduceOp::Gossip, 0, msgs[1].clone()),
        "pushed twice",
    );
    // A summed key refuses a gossip push.
    refused(
        key(2, 3).push(0, 0, ReduceOp::Gossip, 0, msgs[0].clone()),
        "a gossip push to a key that is summed",
    );
}
