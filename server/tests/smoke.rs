//! The server with real sockets: a fake scheduler (built from `common::transport`) and fake
//! workers around one real `Server`.

mod common;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sums_aborts_and_clean_shutdown() {
    let mut cfg = Config::local(2, 1);
    cfg.cluster.partition_bytes = 400; // 100 elements per chunk
    let mut s = setup(cfg, true, true).await;
    let mut placer = Placer::new(1, 400);
    let a = placement(&mut placer, "a", 250, ParamMap::new());
    let b = placement(&mut placer, "b", 10, ParamMap::new());
    let mut params = ParamMap::new();
    params.insert("compressor".into(), "nope".into());
    let bad = placement(&mut placer, "bad", 10, params);
    assert_eq!(a.chunks.len(), 3);
    assert_eq!(s.sched.place(&a).await, None);
    assert_eq!(s.sched.place(&b).await, None);
    let err = s.sched.place(&bad).await.expect("the factory refuses");
    assert!(
        err.contains("unknown compressor \"nope\"") && err.contains("bad"),
        "{err}"
    );

    let mut w0 = FakeWorker::connect(&s.certs.workers[0], &s.cfg, s.server_addr, 0).await;
    let mut w1 = FakeWorker::connect(&s.certs.workers[1], &s.cfg, s.server_addr, 1).await;
    let chunks: Vec<_> = a.chunks.iter().chain(&b.chunks).copied().collect();

    // Round 0: every chunk, the two workers in opposite orders.
    let inputs: Vec<[Vec<f32>; 2]> = chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            [
                data(i as u64, c.len as usize),
                data(100 + i as u64, c.len as usize),
            ]
        })
        .collect();
    for (i, c) in chunks.iter().enumerate() {
        w0.push(c.key, 0, ReduceOp::Sum, 0, enc(&inputs[i][0]))
            .await;
    }
    for (i, c) in chunks.iter().enumerate().rev() {
        w1.push(c.key, 0, ReduceOp::Sum, 0, enc(&inputs[i][1]))
            .await;
    }
    for (i, c) in chunks.iter().enumerate() {
        let expected: Vec<f32> = inputs[i][0]
            .iter()
            .zip(&inputs[i][1])
            .map(|(x, y)| x + y)
            .collect();
        assert_eq!(bits(&w0.expect_result(c.key, 0).await), bits(&expected));
        assert_eq!(bits(&w1.expect_result(c.key, 0).await), bits(&expected));
    }

    // Round 1: rank 1 pushes a wrong length for chunk 1 of "a"; everything else works.
    let bad_key = a.chunks[1].key;
    for c in &chunks {
        let x = vec![1.0f32; c.len as usize];
        w0.push(c.key, 1, ReduceOp::Sum, 0, enc(&x)).await;
        let y = if c.key == bad_key {
            vec![1.0f32; c.len as usize - 1]
        } else {
            x
        };
        w1.push(c.key, 1, ReduceOp::Sum, 0, enc(&y)).await;
    }
    for c in &chunks {
        if c.key == bad_key {
            let m0 = w0.expect_abort(bad_key, 1).await;
            let m1 = w1.expect_abort(bad_key, 1).await;
            assert_eq!(m0, m1);
            for part in [
                "tensor \"a\"",
                "chunk 1",
                &format!("key {bad_key:#018x}"),
                "round 1",
                "rank 1",
                "328 bytes",
            ] {
                assert!(m0.contains(part), "{part} missing: {m0}");
            }
        } else {
            assert_eq!(w0.expect_result(c.key, 1).await, vec![2.0; c.len as usize]);
            assert_eq!(w1.expect_result(c.key, 1).await, vec![2.0; c.len as usize]);
        }
    }

    // Round 2 of "b": rank 0 sends a truncated frame (header says 40 bytes, 12 follow).
    let bk = b.chunks[0].key;
    let h = FrameHeader {
        kind: FrameKind::Push,
        op: ReduceOp::Sum,
        flags: FrameFlags::default(),
        rank: 0,
        aux: 0,
        key: bk,
        round: 2,
        payload_len: 40,
    };
    w0.raw(&[&h.to_bytes(), &[0u8; 12]]).await;
    for w in [&mut w0, &mut w1] {
        let m = w.expect_abort(bk, 2).await;
        assert!(
            m.contains(&format!("key {bk:#018x}"))
                && m.contains("rank 0")
                && m.contains("truncated"),
            "{m}"
        );
    }
    // Garbage that isn't even a header is logged and ignored; the key keeps working.
    w1.raw(&[b"not a frame"]).await;
    w0.push(bk, 3, ReduceOp::Sum, 0, enc(&[1.0; 10])).await;
    w1.push(bk, 3, ReduceOp::Sum, 0, enc(&[2.0; 10])).await;
    assert_eq!(w0.expect_result(bk, 3).await, vec![3.0; 10]);
    assert_eq!(w1.expect_result(bk, 3).await, vec![3.0; 10]);

    // A key the server doesn't hold: an abort to the sender alone.
    w1.push(12345, 0, ReduceOp::Sum, 0, enc(&[1.0])).await;
    let m = w1.expect_abort(12345, 0).await;
    assert!(
        m.contains("key 0x0000000000003039") && m.contains("does not hold"),
        "{m}"
    );

    // Broadcast from rank 1.
    let root = enc(&data(7, 10));
    w0.push(bk, 4, ReduceOp::Broadcast, 1, Bytes::new()).await;
    w1.push(bk, 4, ReduceOp::Broadcast, 1, root.clone()).await;
    assert_eq!(bits(&w0.expect_result(bk, 4).await), bits(&dec(&root)));
    assert_eq!(bits(&w1.expect_result(bk, 4).await), bits(&dec(&root)));

    s.sched.send(FromScheduler::Shutdown { error: None }).await;
    finished(s.run).await.unwrap();
}

/// Local groups (`cluster.local_size` 2, 4 workers on 2 hosts): every rank connects, each
/// chunk is pushed by its owner on each host (rank `h·2 + key % 2`), summed in host order and
/// answered to the owners alone; a push from another member aborts the round naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opposite_key_orders_beyond_stream_limits_never_deadlock() {
    let mut cfg = Config::local(2, 1);
    cfg.cluster.partition_bytes = 8; // 2 elements per chunk
    let mut s = setup(cfg, true, true).await;
    let mut placer = Placer::new(1, 8);
    let t = placement(&mut placer, "many", 2 * 1200, ParamMap::new());
    assert_eq!(t.chunks.len(), 1200);
    assert_eq!(s.sched.place(&t).await, None);
    let mut w0 = FakeWorker::connect(&s.certs.workers[0], &s.cfg, s.server_addr, 0).await;
    let mut w1 = FakeWorker::connect(&s.certs.workers[1], &s.cfg, s.server_addr, 1).await;
    let keys: Vec<u64> = t.chunks.iter().map(|c| c.key).collect();
    let (c0, c1) = (w0.conn.clone(), w1.conn.clone());
    let (k0, k1) = (keys.clone(), keys.clone());
    let push_all = |conn: quinn::Connection, rank: u32, keys: Vec<u64>| async move {
        for key in keys {
            let p = enc(&[rank as f32 + 1.0, 0.5]);
            let h = FrameHeader {
                kind: FrameKind::Push,
                op: ReduceOp::Sum,
                flags: FrameFlags::default(),
                rank,
                aux: 0,
                key,
                round: 0,
                payload_len: p.len() as u64,
            };
            send_frame(&conn, &h, p, "server").await.unwrap();
        }
    };
    let a = tokio::spawn(push_all(c0, 0, k0));
    let b = tokio::spawn(push_all(c1, 1, k1.into_iter().rev().collect()));
    a.await.unwrap();
    b.await.unwrap();
    for &key in &keys {
        assert_eq!(w0.expect_result(key, 0).await, vec![3.0, 1.0]);
        assert_eq!(w1.expect_result(key, 0).await, vec![3.0, 1.0]);
    }
    s.sched.send(FromScheduler::Shutdown { error: None }).await;
    finished(s.run).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_lost_aborts_open_rounds_and_run_fails_naming_it() {
    let mut s = setup(Config::local(2, 1), true, true).await;
    let mut placer = Placer::new(1, s.cfg.cluster.partition_bytes);
    let t = placement(&mut placer, "w", 4, ParamMap::new());
    assert_eq!(s.sched.place(&t).await, None);
    let key = t.chunks[0].key;
    let mut w0 = FakeWorker::connect(&s.certs.workers[0], &s.cfg, s.server_addr, 0).await;
    w0.push(key, 0, ReduceOp::Sum, 0, enc(&[1.0; 4])).await;
    // Let the push land, so the round is open when the loss is reported.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let node = NodeName {
        role: NodeRole::Worker,
        id: 1,
        addr: "127.0.0.1:4999".parse().unwrap(),
    };
    s.sched
        .send(FromScheduler::NodeLost {
            node: node.clone(),
            reason: "no heartbeat for 10.0 s".into(),
        })
        .await;
    let m = w0.expect_abort(key, 0).await;
    assert!(
        m.contains("worker 1 (127.0.0.1:4999)") && m.contains(&format!("key {key:#018x}")),
        "{m}"
    );
    s.sched
        .send(FromScheduler::Shutdown {
            error: Some("worker 1 lost".into()),
        })
        .await;
    let e = finished(s.run).await.unwrap_err();
    assert!(matches!(e, ServerError::NodeLost { .. }), "{e}");
    assert!(e.to_string().contains("worker 1 (127.0.0.1:4999)"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_registration_is_an_error_with_the_reason() {
    let s = setup(Config::local(1, 1), true, false).await;
    s.sched
        .send(FromScheduler::Refused {
            reason: "cluster.partition_bytes differs: 4096000 vs 1024".into(),
        })
        .await;
    let e = finished(s.run).await.unwrap_err();
    assert!(
        e.to_string().contains("cluster.partition_bytes differs"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_scheduler_is_fatal_and_named() {
    let mut cfg = Config::local(1, 1);
    cfg.cluster.heartbeat_interval_ms = 100;
    cfg.cluster.heartbeat_timeout_ms = 600;
    let s = setup(cfg, false, true).await;
    let start = std::time::Instant::now();
    let e = finished(s.run).await.unwrap_err();
    let want = format!("scheduler ({})", s.sched.addr);
    assert!(
        e.to_string().contains(&want) && e.to_string().contains("heartbeat"),
        "{e}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_scheduler_is_named_after_the_connect_timeout() {
    let certs = certs(1);
    let mut cfg = Config::local(1, 1);
    cfg.cluster.connect_timeout_ms = 500;
    // A bound UDP port nobody answers on.
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    cfg.cluster.scheduler = sock.local_addr().unwrap().to_string();
    let server = Server::bind(cfg.clone(), certs.server.clone())
        .await
        .unwrap();
    let e = finished(tokio::spawn(server.run())).await.unwrap_err();
    let want = format!("scheduler ({})", cfg.cluster.scheduler);
    assert!(e.to_string().contains(&want), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_hello_is_refused_within_the_heartbeat_timeout() {
    // A peer that opens its first stream but never completes the Hello (while keeping the
    // connection alive) must not hold the server's connection task forever.
    let mut cfg = Config::local(1, 1);
    cfg.cluster.heartbeat_interval_ms = 100;
    cfg.cluster.heartbeat_timeout_ms = 600;
    let s = setup(cfg, true, true).await;
    let ep = Endpoint::bind("127.0.0.1:0".parse().unwrap(), &s.certs.workers[0], &s.cfg).unwrap();
    let conn = ep.connect(s.server_addr).await.unwrap();
    let mut stream = conn.open_uni().await.unwrap();
    stream.write_all(b"PPF1").await.unwrap(); // a third of a header, never finished
    let reason = tokio::time::timeout(Duration::from_secs(5), conn.closed())
        .await
        .expect("the server kept the stalled connection");
    assert!(reason.to_string().contains("Hello"), "{reason}");
    s.sched.send(FromScheduler::Shutdown { error: None }).await;
    finished(s.run).await.unwrap();
}

/// A Hello that carries a payload is refused naming that, not as "must be Hello, got Hello".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_with_a_payload_is_refused_naming_its_size() {
    let s = setup(Config::local(1, 1), true, true).await;
    let ep = Endpoint::bind("127.0.0.1:0".parse().unwrap(), &s.certs.workers[0], &s.cfg).unwrap();
    let hello = FrameHeader {
        kind: FrameKind::Hello,
        op: ReduceOp::Sum,
        flags: FrameFlags::default(),
        rank: 0,
        aux: 0,
        key: 0,
        round: 0,
        payload_len: 5,
    };
    // The server's close travels in one UDP packet; on a loaded machine (CI's two cores) it
    // may be dropped, and the client then learns of the close only as a stateless reset:
    // try again, a few times, until the close itself arrives.
    let mut reason = String::new();
    for _ in 0..3 {
        let conn = ep.connect(s.server_addr).await.unwrap();
        send_frame(&conn, &hello, Bytes::from_static(b"hello"), "server")
            .await
            .unwrap();
        reason = tokio::time::timeout(Duration::from_secs(5), conn.closed())
            .await
            .expect("the server kept the connection")
            .to_string();
        if !reason.contains("reset by peer") {
            break;
        }
    }
    assert!(
        reason.contains("a Hello frame carries no payload, got 5 bytes"),
        "{reason}"
    );
    assert!(!reason.contains("got Hello"), "{reason}");
    s.sched.send(FromScheduler::Shutdown { error: None }).await;
    finished(s.run).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_config_is_refused_at_bind_naming_the_key() {
    // `run` used to panic on an unparsable scheduler address (Config::scheduler_addr expects
    // a validated config); bind must refuse it instead, like every other invalid setting.
    let certs = certs(1);
    let mut cfg = Config::local(1, 1);
    // (A DNS name is a valid address since protocol 7; an underscore makes it none.)
    cfg.cluster.scheduler = "scheduler_example:9000".into();
    let e = Server::bind(cfg, certs.server.clone()).await.unwrap_err();
    assert!(e.to_string().contains("cluster.scheduler"), "{e}");
    let mut cfg = Config::local(1, 1);
    cfg.cluster.num_workers = 0;
    let e = Server::bind(cfg, certs.server.clone()).await.unwrap_err();
    assert!(e.to_string().contains("cluster.num_workers"), "{e}");
}

/// Rough end-to-end throughput with default 4 MB chunks (run with `--ignored --nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn throughput_of_large_chunks() {
    let mut s = setup(Config::local(2, 1), true, true).await;
    let mut placer = Placer::new(1, s.cfg.cluster.partition_bytes);
    let t = placement(&mut placer, "big", 8 * 1_024_000, ParamMap::new());
    assert_eq!(s.sched.place(&t).await, None);
    let mut w0 = FakeWorker::connect(&s.certs.workers[0], &s.cfg, s.server_addr, 0).await;
    let mut w1 = FakeWorker::connect(&s.certs.workers[1], &s.cfg, s.server_addr, 1).await;
    let payload = enc(&data(1, 1_024_000));
    let rounds = 5u64;
    let start = std::time::Instant::now();
    for round in 0..rounds {
        for c in &t.chunks {
            w0.push(c.key, round, ReduceOp::Sum, 0, payload.clone())
                .await;
            w1.push(c.key, round, ReduceOp::Sum, 0, payload.clone())
                .await;
        }
        for c in &t.chunks {
            w0.expect_result(c.key, round).await;
            w1.expect_result(c.key, round).await;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let bytes = (rounds * 2 * t.len * 4) as f64;
    println!(
        "{rounds} rounds of {} MB x 2 workers in {secs:.2} s: {:.0} MB/s pushed into the server",
        t.len * 4 / 1_000_000,
        bytes / secs / 1e6
    );
    s.sched.send(FromScheduler::Shutdown { error: None }).await;
    finished(s.run).await.unwrap();
}

/// Baseline for `throughput_of_large_chunks`: the same bytes over bare endpoints, no server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn throughput_baseline_bare_quinn() {
    let certs = certs(1);
    let cfg = Config::local(1, 1);
    let sink = Endpoint::bind("127.0.0.1:0".parse().unwrap(), &certs.server, &cfg).unwrap();
    let addr = sink.local_addr();
    let recv = tokio::spawn(async move {
        let conn = sink.quinn.accept().await.unwrap().await.unwrap();
        let mut n = 0u64;
        for _ in 0..80 {
            let mut s = conn.accept_uni().await.unwrap();
            n += read_frame(&mut s, 1 << 30, "w").await.unwrap().1.len() as u64;
        }
        n
    });
    let ep = Endpoint::bind("127.0.0.1:0".parse().unwrap(), &certs.workers[0], &cfg).unwrap();
    let conn = ep.connect(addr).await.unwrap();
    let payload = enc(&data(1, 1_024_000));
    let start = std::time::Instant::now();
    for i in 0..80 {
        let h = FrameHeader {
            kind: FrameKind::Push,
            op: ReduceOp::Sum,
            flags: FrameFlags::default(),
            rank: 0,
            aux: 0,
            key: i,
            round: 0,
            payload_len: payload.len() as u64,
        };
        send_frame(&conn, &h, payload.clone(), "sink")
            .await
            .unwrap();
    }
    let n = recv.await.unwrap();
    let secs = start.elapsed().as_secs_f64();
    println!(
        "bare quinn: {} MB in {secs:.2} s: {:.0} MB/s",
        n / 1_000_000,
        n as f64 / secs / 1e6
    );
}

/// Connections that never say Hello are capped (2 × workers + 32 may wait at once); the rest
/// are closed at once, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_waiting_for_hello_are_capped() {
    let s = setup(Config::local(1, 1), true, true).await;
    let cap = 2 + 32;
    let ep = Endpoint::bind("127.0.0.1:0".parse().unwrap(), &s.certs.workers[0], &s.cfg).unwrap();
    let mut conns = Vec::new();
    for _ in 0..cap + 5 {
        conns.push(ep.connect(s.server_addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut refused = 0;
    for c in &conns {
        if let Some(e) = c.close_reason() {
            let quinn::ConnectionError::ApplicationClosed(close) = e else {
                panic!("closed otherwise: {e}")
            };
            let why = String::from_utf8_lossy(&close.reason).into_owned();
            assert!(why.contains("already waiting to say Hello"), "{why}");
            refused += 1;
        }
    }
    assert_eq!(refused, 5);
    drop(conns);
    s.run.abort();
}
