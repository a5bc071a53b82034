//! The server in a job of local groups (ARCHITECTURE.md, "Two levels"), with real sockets:
//! pushes from each host's owner of a key, results to the owners only.

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_groups_push_and_receive_through_the_chunk_owners() {
    use pushpull_proto::placement::chunk_owner;
    let mut cfg = Config::local(4, 1);
    cfg.cluster.local_size = 2;
    cfg.cluster.partition_bytes = 40; // 10 elements per chunk
    let mut s = setup(cfg, true, true).await;
    let mut placer = Placer::new(1, 40);
    let t = placement(&mut placer, "t", 80, ParamMap::new());
    assert_eq!(s.sched.place(&t).await, None);
    let mut w = Vec::new();
    for rank in 0..4u32 {
        let c = &s.certs.workers[rank as usize];
        w.push(FakeWorker::connect(c, &s.cfg, s.server_addr, rank).await);
    }
    let owners = |key: u64| [chunk_owner(key, 2), 2 + chunk_owner(key, 2)];
    let keys: Vec<u64> = t.chunks.iter().map(|c| c.key).collect();
    assert!(
        keys.iter().any(|&k| k % 2 == 0) && keys.iter().any(|&k| k % 2 == 1),
        "both local ranks should own some chunk: {keys:x?}"
    );
    // Round 0: host 1's owner pushes first, then host 0's; the sum is host 0 + host 1.
    for (i, &key) in keys.iter().enumerate() {
        let [o0, o1] = owners(key);
        w[o1 as usize]
            .push(key, 0, ReduceOp::Sum, 0, enc(&data(100 + i as u64, 10)))
            .await;
        w[o0 as usize]
            .push(key, 0, ReduceOp::Sum, 0, enc(&data(i as u64, 10)))
            .await;
    }
    for (i, &key) in keys.iter().enumerate() {
        let expected: Vec<f32> = data(i as u64, 10)
            .iter()
            .zip(&data(100 + i as u64, 10))
            .map(|(x, y)| x + y)
            .collect();
        for o in owners(key) {
            assert_eq!(
                bits(&w[o as usize].expect_result(key, 0).await),
                bits(&expected)
            );
        }
    }
    // The other members got nothing.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (rank, wk) in w.iter_mut().enumerate() {
        while let Ok((h, _)) = wk.rx.try_recv() {
            let key = h.key;
            assert!(
                owners(key).contains(&(rank as u32)) && h.round == 0,
                "rank {rank} got {h:?}"
            );
        }
    }
    // Round 1 of the first chunk: its host-0 non-owner pushes; the owners and it are told.
    let key = keys[0];
    let [o0, o1] = owners(key);
    let other = 1 - o0;
    w[other as usize]
        .push(key, 1, ReduceOp::Sum, 0, enc(&[1.0; 10]))
        .await;
    for r in [other, o0, o1] {
        let m = w[r as usize].expect_abort(key, 1).await;
        assert!(
            m.contains(&format!("rank {other} does not own key {key:#018x}"))
                && m.contains(&format!("pushes it from rank {o0}")),
            "{m}"
        );
    }
    // Round 2: a broadcast from rank 3 (host 1): host 1's owner pushes its payload.
    let root = enc(&data(7, 10));
    w[o0 as usize]
        .push(key, 2, ReduceOp::Broadcast, 3, Bytes::new())
        .await;
    w[o1 as usize]
        .push(key, 2, ReduceOp::Broadcast, 3, root.clone())
        .await;
    for o in [o0, o1] {
        assert_eq!(
            bits(&w[o as usize].expect_result(key, 2).await),
            bits(&dec(&root))
        );
    }
    s.sched.send(FromScheduler::Shutdown { error: None }).await;
    finished(s.run).await.unwrap();
}
