//! Declare: placement, priorities, mismatches, refusals, collisions.

use super::*;
use pushpull_proto::config::ParamMap;

#[test]
fn declares_in_different_orders_are_placed_once_every_server_acked() {
    let (mut h, srv, wrk) = H::start(2, 2);
    h.declare(wrk[0], "a", 250, &[("compressor", "onebit")]);
    h.declare(wrk[0], "b", 50, &[]);
    assert!(h.take().is_empty());
    h.declare(wrk[1], "b", 50, &[]);
    let acts = h.take();
    for &s in &srv {
        let p = placements(&acts, s);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].name, "b");
    }
    assert!(
        declared(&acts, wrk[0]).is_empty(),
        "declared before the acks"
    );
    h.declare(wrk[1], "a", 250, &[("compressor", "onebit")]);
    let acts = h.take();
    let pa = placements(&acts, srv[0]).remove(0);
    assert_eq!(placements(&acts, srv[1]), vec![pa.clone()]);
    assert_eq!(pa.chunks.len(), 3); // 250 elements, 100 per chunk
    assert_eq!(
        pa.chunks.iter().map(|c| c.len).collect::<Vec<_>>(),
        vec![84, 83, 83]
    );
    assert_eq!(pa.params["compressor"], "onebit");
    for (i, c) in pa.chunks.iter().enumerate() {
        assert_eq!(c.key, chunk_key("a", i as u64));
    }
    // Acks for a arrive before acks for b, interleaved.
    h.ack(srv[1], "a", None);
    h.ack(srv[0], "b", None);
    assert!(declared(&h.take(), wrk[0]).is_empty());
    h.ack(srv[0], "a", None);
    let acts = h.take();
    for &w in &wrk {
        assert_eq!(declared(&acts, w), vec![("a".to_string(), Ok(pa.clone()))]);
    }
    h.ack(srv[1], "b", None);
    let acts = h.take();
    for &w in &wrk {
        let d = declared(&acts, w);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].0, "b");
        assert_eq!(d[0].1.as_ref().unwrap().len, 50);
    }
    // A stray ack is ignored.
    h.ack(srv[1], "b", None);
    assert!(h.take().is_empty());
}

#[test]
fn priorities_default_to_declaration_order_and_must_agree() {
    let (mut h, srv, wrk) = H::start(2, 1);
    // "b" completes first (both workers declared it), then "a": b gets 0, a gets -1,
    // whatever order each worker started its declares in.
    h.declare(wrk[0], "a", 10, &[]);
    h.declare(wrk[0], "b", 10, &[]);
    h.declare(wrk[1], "b", 10, &[]);
    let pb = placements(&h.take(), srv[0]).remove(0);
    h.declare(wrk[1], "a", 10, &[]);
    let pa = placements(&h.take(), srv[0]).remove(0);
    assert_eq!((pb.name.as_str(), pb.priority), ("b", 0));
    assert_eq!((pa.name.as_str(), pa.priority), ("a", -1));
    // An explicit priority wins over the order, and every worker must ask for the same.
    h.declare_with_priority(wrk[0], "c", 10, &[], Some(7));
    h.declare_with_priority(wrk[1], "c", 10, &[], Some(7));
    let pc = placements(&h.take(), srv[0]).remove(0);
    assert_eq!(pc.priority, 7);
    h.declare_with_priority(wrk[0], "d", 10, &[], Some(3));
    h.declare(wrk[1], "d", 10, &[]);
    let acts = h.take();
    assert!(placements(&acts, srv[0]).is_empty());
    for &w in &wrk {
        let e = declared(&acts, w).remove(0).1.unwrap_err();
        assert_eq!(
            e,
            "tensor \"d\": worker 0 declared priority 3, worker 1 declared priority (default)"
        );
    }
    // Declaring a placed tensor again must ask for the same priority as before.
    for (name, p) in [("a", None), ("b", None), ("c", Some(7))] {
        h.ack(srv[0], name, None);
        let _ = h.take();
        h.declare_with_priority(wrk[0], name, 10, &[], p);
        let d = declared(&h.take(), wrk[0]).remove(0);
        assert!(d.1.is_ok(), "{name}: {d:?}");
    }
    h.declare_with_priority(wrk[0], "c", 10, &[], Some(8));
    let e = declared(&h.take(), wrk[0]).remove(0).1.unwrap_err();
    assert!(e.contains("priority 7") && e.contains("priority 8"), "{e}");
}

#[test]
fn placement_balances_bytes_over_servers_across_tensors() {
    let (mut h, srv, wrk) = H::start(1, 2);
    h.declare(wrk[0], "big", 100, &[]);
    let p1 = placements(&h.take(), srv[0]).remove(0);
    assert_eq!(p1.chunks[0].server, 0);
    h.declare(wrk[0], "small", 10, &[]);
    let p2 = placements(&h.take(), srv[0]).remove(0);
    assert_eq!(p2.chunks[0].server, 1);
}

#[test]
fn placement_balances_payload_bytes_when_some_tensors_are_not_compressed() {
    // 400-byte partitions (100 elements per chunk), tensors of 400 bytes or more compressed.
    let (mut h, srv, wrk) = H::start_with(1, 2, |c| c.cluster.min_compress_bytes = 400);
    let onebit = [("compressor", "onebit")];
    // "big": 7 onebit chunks of 100 elements, 20 bytes each (fp32: 400): 4 on one server.
    h.declare(wrk[0], "big", 700, &onebit);
    // Two 90-element biases, below min_compress_bytes: one fp32 chunk of 360 bytes each.
    h.declare(wrk[0], "bias", 90, &onebit);
    h.declare(wrk[0], "bias2", 90, &onebit);
    let placed = placements(&h.take(), srv[0]);
    assert_eq!(placed.len(), 3);
    // An independent tally of each server's payload bytes per push.
    let mut load = [0u64; 2];
    for p in &placed {
        for c in &p.chunks {
            load[c.server as usize] += if p.len * 4 < 400 {
                c.len * 4
            } else {
                4 + 4 * c.len.div_ceil(32)
            };
        }
    }
    // Weighed by fp32 bytes (big: 1600 + 1200) both biases would go to the lighter server;
    // weighed by payload they split.
    assert_ne!(
        placed[1].chunks[0].server, placed[2].chunks[0].server,
        "{placed:?}"
    );
    assert!(load[0].abs_diff(load[1]) <= 360, "{load:?}");
}

#[test]
fn fp32_and_fp16_tensors_are_cut_to_the_payload_bound_compressed_ones_are_not() {
    // 4000-byte partitions (1000 elements), at most 1024 bytes of payload per chunk, every
    // tensor of 4000 bytes or more compressed.
    let (mut h, srv, wrk) = H::start_with(1, 2, |c| {
        c.cluster.partition_bytes = 4000;
        c.cluster.max_chunk_payload_bytes = Some(1024);
        c.cluster.min_compress_bytes = 4000;
    });
    let len = 10_000;
    h.declare(wrk[0], "raw", len, &[]);
    h.declare(wrk[0], "half", len, &[("compressor", "fp16")]);
    h.declare(wrk[0], "signs", len, &[("compressor", "onebit")]);
    // Below min_compress_bytes: fp32 whatever its map says.
    h.declare(wrk[0], "bias", 900, &[("compressor", "onebit")]);
    let placed = placements(&h.take(), srv[0]);
    let longest = |name: &str| {
        let p = placed.iter().find(|p| p.name == name).unwrap();
        assert_eq!(p.chunks.iter().map(|c| c.len).sum::<u64>(), p.len, "{name}");
        (
            p.chunks.len(),
            p.chunks.iter().map(|c| c.len).max().unwrap(),
        )
    };
    // fp32: 1000 elements (4000 bytes) halved twice to 250 (1000 bytes).
    assert_eq!(longest("raw"), (40, 250));
    // fp16: 2 bytes per element, halved once to 500 elements (1000 bytes).
    assert_eq!(longest("half"), (20, 500));
    // onebit: 4 + 1000 / 8 bytes fit: the partition stands.
    assert_eq!(longest("signs"), (10, 1000));
    // 900 fp32 elements, 3600 bytes: halved twice, four chunks of 225.
    assert_eq!(longest("bias"), (4, 225));
}

#[test]
fn length_mismatch_names_the_tensor_and_both_values_and_others_keep_working() {
    let (mut h, srv, wrk) = H::start(3, 1);
    h.declare(wrk[0], "fc1.weight", 1000, &[]);
    h.declare(wrk[2], "fc1.weight", 1000, &[]);
    h.declare(wrk[1], "fc1.weight", 999, &[]);
    let acts = h.take();
    assert!(placements(&acts, srv[0]).is_empty());
    for &w in &wrk {
        assert_eq!(
            declared(&acts, w),
            vec![(
                "fc1.weight".to_string(),
                Err(
                    "tensor \"fc1.weight\": worker 0 declared 1000 elements, worker 1 \
                     declared 999"
                        .to_string()
                )
            )]
        );
    }
    // Another tensor works, and the failed name can be declared again consistently.
    for &w in &wrk {
        h.declare(w, "fc2", 10, &[]);
        h.declare(w, "fc1.weight", 1000, &[]);
    }
    let acts = h.take();
    assert_eq!(placements(&acts, srv[0]).len(), 2);
    h.ack(srv[0], "fc2", None);
    h.ack(srv[0], "fc1.weight", None);
    let acts = h.take();
    for &w in &wrk {
        assert!(declared(&acts, w).iter().all(|d| d.1.is_ok()));
        assert_eq!(declared(&acts, w).len(), 2);
    }
}

#[test]
fn params_mismatch_names_the_parameter_and_both_values() {
    let (mut h, _srv, wrk) = H::start(2, 1);
    h.declare(wrk[0], "t", 10, &[("compressor", "topk"), ("k", "0.01")]);
    h.declare(wrk[1], "t", 10, &[("compressor", "topk")]);
    let acts = h.take();
    let (_, r) = declared(&acts, wrk[1]).remove(0);
    assert_eq!(
        r.unwrap_err(),
        "tensor \"t\": worker 0 declared parameter k = \"0.01\", worker 1 declared k = (unset)"
    );
    h.declare(wrk[0], "u", 10, &[("compressor", "onebit")]);
    h.declare(wrk[1], "u", 10, &[("compressor", "topk")]);
    let (_, r) = declared(&h.take(), wrk[0]).remove(0);
    assert_eq!(
        r.unwrap_err(),
        "tensor \"u\": worker 0 declared parameter compressor = \"onebit\", worker 1 \
         declared compressor = \"topk\""
    );
}

#[test]
fn redeclaring_a_placed_tensor_is_answered_at_once() {
    let (mut h, srv, wrk) = H::start(2, 1);
    for &w in &wrk {
        h.declare(w, "t", 10, &[]);
    }
    h.take();
    // While the servers set it up: same → answered with the others; different → error.
    h.declare(wrk[0], "t", 10, &[]);
    h.declare(wrk[1], "t", 11, &[]);
    let acts = h.take();
    let (_, r) = declared(&acts, wrk[1]).remove(0);
    assert_eq!(
        r.unwrap_err(),
        "tensor \"t\": it is already declared with 10 elements, worker 1 declared 11"
    );
    assert!(declared(&acts, wrk[0]).is_empty());
    h.ack(srv[0], "t", None);
    let acts = h.take();
    assert_eq!(declared(&acts, wrk[0]).len(), 1);
    let p = declared(&acts, wrk[1]).remove(0).1.unwrap();
    // Placed: same → Ok at once, no new placement; different → error.
    h.declare(wrk[1], "t", 10, &[]);
    let acts = h.take();
    assert!(placements(&acts, srv[0]).is_empty());
    assert_eq!(declared(&acts, wrk[1]), vec![("t".to_string(), Ok(p))]);
    h.declare(wrk[0], "t", 10, &[("ef", "vanilla")]);
    let (_, r) = declared(&h.take(), wrk[0]).remove(0);
    assert_eq!(
        r.unwrap_err(),
        "tensor \"t\": it is already declared with parameter ef = (unset), worker 0 \
         declared ef = \"vanilla\""
    );
}

#[test]
fn a_changed_duplicate_declare_from_one_worker_is_refused_to_it() {
    let (mut h, srv, wrk) = H::start(2, 1);
    h.declare(wrk[0], "t", 10, &[]);
    h.declare(wrk[0], "t", 10, &[]); // identical: idempotent
    assert!(h.take().is_empty());
    h.declare(wrk[0], "t", 12, &[]);
    let (_, r) = declared(&h.take(), wrk[0]).remove(0);
    let e = r.unwrap_err();
    assert!(
        e.contains("worker 0 first declared 10 elements, then 12"),
        "{e}"
    );
    h.declare(wrk[1], "t", 10, &[]);
    assert_eq!(placements(&h.take(), srv[0]).len(), 1);
}

#[test]
fn a_server_refusing_a_placement_fails_the_declare_naming_it() {
    let (mut h, srv, wrk) = H::start(2, 2);
    for &w in &wrk {
        h.declare(w, "t", 300, &[]);
    }
    h.take();
    h.ack(srv[0], "t", None);
    h.ack(srv[1], "t", Some("unknown compressor \"zip\""));
    let acts = h.take();
    for &w in &wrk {
        let (_, r) = declared(&acts, w).remove(0);
        let e = r.unwrap_err();
        assert!(
            e.contains("tensor \"t\"")
                && e.contains("server 1")
                && e.contains("unknown compressor"),
            "{e}"
        );
    }
    assert!(
        h.s.key_owner.is_empty(),
        "keys of a failed tensor are freed"
    );
}

#[test]
fn a_tensor_with_too_many_chunks_fails_the_declare_naming_it() {
    // A mistyped length must not make the scheduler build (or send) billions of chunks.
    let (mut h, srv, wrk) = H::start(2, 1);
    for &w in &wrk {
        h.declare(w, "huge", u64::MAX, &[]);
    }
    let acts = h.take();
    assert!(placements(&acts, srv[0]).is_empty());
    for &w in &wrk {
        let (_, r) = declared(&acts, w).remove(0);
        let e = r.unwrap_err();
        assert!(
            e.contains("tensor \"huge\"")
                && e.contains(&u64::MAX.to_string())
                && e.contains(&MAX_CHUNKS_PER_TENSOR.to_string())
                && e.contains("cluster.partition_bytes"),
            "{e}"
        );
    }
    assert_eq!(h.s.placer.load_bytes(), &[0]);
    // One chunk over the limit (100 elements per chunk here) fails too.
    for &w in &wrk {
        h.declare(w, "big", MAX_CHUNKS_PER_TENSOR * 100 + 1, &[]);
    }
    let acts = h.take();
    assert!(placements(&acts, srv[0]).is_empty());
    assert!(declared(&acts, wrk[0]).remove(0).1.is_err());
    // The largest allowed placement, with every field at its widest encoding, fits a
    // control frame.
    let widest = ChunkPlacement {
        key: u64::MAX,
        offset: u64::MAX,
        len: u64::MAX,
        server: u32::MAX,
    };
    let msg = FromScheduler::Declared {
        name: "big".into(),
        result: Ok(TensorPlacement {
            name: "big".into(),
            len: u64::MAX,
            params: ParamMap::new(),
            priority: i32::MIN,
            chunks: vec![widest; MAX_CHUNKS_PER_TENSOR as usize],
        }),
    };
    assert!(pushpull_proto::protocol::encode_control(&msg).is_ok());
}

#[test]
fn a_key_collision_names_both_tensors() {
    let (mut h, srv, wrk) = H::start(1, 1);
    // Pretend chunk 3 of "other" got the key of chunk 0 of "t".
    h.s.key_owner.insert(chunk_key("t", 0), ("other".into(), 3));
    h.declare(wrk[0], "t", 10, &[]);
    let acts = h.take();
    assert!(placements(&acts, srv[0]).is_empty());
    let (_, r) = declared(&acts, wrk[0]).remove(0);
    let e = r.unwrap_err();
    assert!(
        e.contains("tensor \"t\"")
            && e.contains("chunk 0")
            && e.contains("chunk 3 of tensor \"other\""),
        "{e}"
    );
    // The placer is unchanged: the next tensor still goes to an empty server.
    assert_eq!(h.s.placer.load_bytes(), &[0]);
}

#[test]
fn a_declare_a_finished_worker_never_joins_fails_for_the_others() {
    let (mut h, _srv, wrk) = H::start(2, 1);
    h.declare(wrk[0], "t", 10, &[]);
    h.msg(wrk[1], ToScheduler::Finished);
    let acts = h.take();
    let (_, r) = declared(&acts, wrk[0]).remove(0);
    assert_eq!(
        r.unwrap_err(),
        "tensor \"t\": worker 1 finished without declaring it"
    );
    h.declare(wrk[0], "u", 10, &[]);
    let (_, r) = declared(&h.take(), wrk[0]).remove(0);
    assert_eq!(
        r.unwrap_err(),
        "tensor \"u\": worker 1 finished without declaring it"
    );
}

// ---------------------------------------------------------------- barrier
