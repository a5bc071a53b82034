//! Malformed, truncated and oversized data frames from a client holding a valid cluster
//! certificate are rejected with an error, and the server keeps serving other keys.
//!
//! Worker 0 is the real worker library; "worker 1" is this test speaking the protocol by hand
//! (register, heartbeats, declares, a data connection) so that it can send bad frames.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use common::*;
use pushpull_net::transport::{read_frame, send_frame, ControlSender, ControlStream, Endpoint};
use pushpull_proto::protocol::{
    max_payload_len, ClusterMap, FrameFlags, FrameHeader, FrameKind, FromScheduler, ReduceOp,
    ToScheduler, PROTOCOL_VERSION,
};
use pushpull_proto::{Config, NodeRole, ParamMap};
use pushpull_worker::{Reduce, WorkerError};
use tokio::sync::{mpsc, Mutex};

struct FakeWorker {
    endpoint: Endpoint,
    sender: Arc<Mutex<ControlSender>>,
    from_scheduler: mpsc::UnboundedReceiver<FromScheduler>,
    map: ClusterMap,
}

impl FakeWorker {
    async fn join(config: &Config, certs: &Certs, rank: u32) -> FakeWorker {
        let endpoint = Endpoint::bind(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            &certs.identity(&format!("worker{rank}")),
            config,
        )
        .unwrap();
        let conn = endpoint
            .connect_with_retry(
                config.scheduler_addr().bind_addr(),
                config.connect_timeout(),
            )
            .await
            .unwrap();
        let (send, recv) = conn.open_bi().await.unwrap();
        let (mut sender, mut receiver) = ControlStream::new(send, recv, "scheduler").split();
        sender
            .send(&ToScheduler::Register {
                version: PROTOCOL_VERSION,
                role: NodeRole::Worker,
                requested_id: Some(rank),
                listen_addr: None,
                digest: config.digest(),
            })
            .await
            .unwrap();
        let sender = Arc::new(Mutex::new(sender));
        let (tx, mut from_scheduler) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(m)) = receiver.recv::<FromScheduler>().await {
                if tx.send(m).is_err() {
                    break;
                }
            }
        });
        let hb = sender.clone();
        let interval = config.heartbeat_interval();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                if hb.lock().await.send(&ToScheduler::Heartbeat).await.is_err() {
                    break;
                }
            }
        });
        let map = loop {
            match from_scheduler
                .recv()
                .await
                .expect("scheduler closed before Welcome")
            {
                FromScheduler::Welcome { id, map } => {
                    assert_eq!(id, rank);
                    break map;
                }
                FromScheduler::Heartbeat => {}
                other => panic!("unexpected before Welcome: {other:?}"),
            }
        };
        FakeWorker {
            endpoint,
            sender,
            from_scheduler,
            map,
        }
    }

    async fn send(&self, msg: ToScheduler) {
        self.sender.lock().await.send(&msg).await.unwrap();
    }

    /// Declares every name (len `len`, no parameters) and returns each tensor's single key.
    async fn declare(&mut self, names: &[&str], len: u64) -> HashMap<String, u64> {
        for n in names {
            self.send(ToScheduler::Declare {
                name: n.to_string(),
                len,
                params: ParamMap::new(),
                priority: None,
            })
            .await;
        }
        let mut keys = HashMap::new();
        while keys.len() < names.len() {
            match self.from_scheduler.recv().await.expect("scheduler closed") {
                FromScheduler::Declared { name, result } => {
                    let p = result.unwrap_or_else(|e| panic!("declare {name}: {e}"));
                    assert_eq!(p.chunks.len(), 1);
                    keys.insert(name, p.chunks[0].key);
                }
                FromScheduler::Heartbeat => {}
                other => panic!("unexpected: {other:?}"),
            }
        }
        keys
    }
}

type Frame = (FrameHeader, Bytes);

async fn next_frame(frames: &mut mpsc::UnboundedReceiver<Frame>, server: &Proc) -> Frame {
    match tokio::time::timeout(Duration::from_secs(30), frames.recv()).await {
        Ok(Some(f)) => f,
        Ok(None) => panic!("server connection closed; server log:\n{}", server.stderr()),
        Err(_) => panic!(
            "no frame from the server within 30 s; server log:\n{}",
            server.stderr()
        ),
    }
}

fn push_header(key: u64, round: u64, payload_len: u64) -> FrameHeader {
    FrameHeader {
        kind: FrameKind::Push,
        op: ReduceOp::Sum,
        flags: FrameFlags::default(),
        rank: 1,
        aux: 0,
        key,
        round,
        payload_len,
    }
}

fn f32_bytes(v: &[f32]) -> Bytes {
    let mut b = BytesMut::with_capacity(v.len() * 4);
    for x in v {
        b.put_f32_le(*x);
    }
    b.freeze()
}

/// Writes raw bytes on a new uni stream and finishes it.
async fn send_raw(conn: &quinn::Connection, bytes: &[u8]) {
    let mut s = conn.open_uni().await.unwrap();
    s.write_all(bytes).await.unwrap();
    let _ = s.finish();
}

#[test]
fn bad_frames_are_rejected_and_other_keys_keep_working() {
    let _g = cluster_lock();
    let seed = test_seed();
    let mut cluster = ProcCluster::start(test_config(2, 1));
    let server_addr = cluster.servers[0].1;
    run_async(async {
        let config = cluster.config.clone();
        let (w0, mut fake) = tokio::join!(
            cluster.join(0),
            FakeWorker::join(&config, &cluster.certs, 1)
        );
        assert_eq!(fake.map.servers, vec![server_addr]);
        const LEN: u64 = 100;
        let names = ["truncated", "oversized", "badlen", "good"];
        let decl = async {
            let mut ts = HashMap::new();
            for n in names {
                ts.insert(n, w0.declare(n, LEN, ParamMap::new()).await.unwrap());
            }
            ts
        };
        let (tensors, keys) = tokio::join!(decl, fake.declare(&names, LEN));

        // The fake worker's data connection: Hello, then a reader collecting frames.
        let conn = fake.endpoint.connect(server_addr).await.unwrap();
        let hello = FrameHeader {
            kind: FrameKind::Hello,
            op: ReduceOp::Sum,
            flags: FrameFlags::default(),
            rank: 1,
            aux: 0,
            key: 0,
            round: 0,
            payload_len: 0,
        };
        send_frame(&conn, &hello, Bytes::new(), "server 0")
            .await
            .unwrap();
        let (ftx, mut frames) = mpsc::unbounded_channel();
        let reader_conn = conn.clone();
        tokio::spawn(async move {
            while let Ok(mut s) = reader_conn.accept_uni().await {
                let ftx = ftx.clone();
                tokio::spawn(async move {
                    match read_frame(&mut s, max_payload_len(4_096_000), "server 0").await {
                        Ok(f) => {
                            let _ = ftx.send(f);
                        }
                        Err(e) => eprintln!("fake worker: unreadable frame from the server: {e}"),
                    }
                });
            }
        });

        // Garbage that is not a frame, and a frame cut inside its header: logged, no answer.
        send_raw(&conn, &[0xAB; 64]).await;
        send_raw(&conn, &push_header(keys["good"], 0, 400).to_bytes()[..10]).await;
        // A frame whose payload stops early.
        let mut truncated = push_header(keys["truncated"], 0, LEN * 4)
            .to_bytes()
            .to_vec();
        truncated.extend_from_slice(&[0u8; 10]);
        send_raw(&conn, &truncated).await;
        // A frame announcing more than the cluster's limit.
        let max = max_payload_len(config.cluster.partition_bytes);
        let mut oversized = push_header(keys["oversized"], 0, max + 1)
            .to_bytes()
            .to_vec();
        oversized.extend_from_slice(&[0u8; 64]);
        send_raw(&conn, &oversized).await;
        // A well-formed frame with a payload of the wrong length for the chunk.
        send_frame(
            &conn,
            &push_header(keys["badlen"], 0, 7),
            Bytes::from_static(&[1; 7]),
            "s",
        )
        .await
        .unwrap();

        // The truncated and the oversized frame abort their key's round at once ...
        let mut aborts = HashMap::new();
        for _ in 0..2 {
            let (h, payload) = next_frame(&mut frames, &cluster.servers[0].0).await;
            assert_eq!(h.kind, FrameKind::Abort, "{h:?}");
            aborts.insert(h.key, String::from_utf8(payload.to_vec()).unwrap());
        }
        let msg = |n: &str| {
            aborts
                .get(&keys[n])
                .unwrap_or_else(|| panic!("no abort for {n}: {aborts:?}"))
                .clone()
        };
        let m = msg("truncated");
        assert!(m.contains("truncated") && m.contains("rank 1"), "{m}");
        let m = msg("oversized");
        assert!(
            m.contains("exceeds the limit") && m.contains("rank 1"),
            "{m}"
        );

        // ... and the well-behaved worker gets an error naming the tensor and the culprit. (The
        // payload of the wrong length is found out when the round is summed, so its abort
        // comes once worker 0 has pushed.)
        for n in ["truncated", "oversized", "badlen"] {
            let e = w0
                .push_pull(&tensors[n], vec![1.0; LEN as usize], Reduce::Sum)
                .await
                .unwrap_err();
            assert!(matches!(e, WorkerError::Aborted { .. }), "{e}");
            let m = e.to_string();
            assert!(m.contains(n) && m.contains("rank 1"), "{m}");
        }
        let (h, payload) = next_frame(&mut frames, &cluster.servers[0].0).await;
        assert_eq!((h.kind, h.key), (FrameKind::Abort, keys["badlen"]), "{h:?}");
        let m = String::from_utf8(payload.to_vec()).unwrap();
        assert!(m.contains("7 bytes") && m.contains("rank 1"), "{m}");

        // The server keeps serving: the good key sums, and the aborted keys work next round.
        let d0 = pushpull::jobs::data::generate(seed, 0, 0, 0, LEN as usize);
        let d1 = pushpull::jobs::data::generate(seed, 0, 1, 0, LEN as usize);
        let want = rank_order_sum(&[d0.clone(), d1.clone()]);
        for (n, round) in [("good", 0), ("truncated", 1), ("badlen", 1)] {
            let payload = f32_bytes(&d1);
            let header = push_header(keys[n], round, payload.len() as u64);
            let (r0, _) = tokio::join!(
                w0.push_pull(&tensors[n], d0.clone(), Reduce::Sum),
                send_frame(&conn, &header, payload, "server 0")
            );
            assert_bits_eq(&r0.unwrap_or_else(|e| panic!("{n}: {e}")), &want, n);
            let (h, payload) = next_frame(&mut frames, &cluster.servers[0].0).await;
            assert_eq!(
                (h.kind, h.key, h.round),
                (FrameKind::Result, keys[n], round),
                "{n}"
            );
            assert_eq!(payload, f32_bytes(&want), "{n}: result payload");
        }

        fake.send(ToScheduler::Finished).await;
        w0.finish().await.unwrap();
        conn.close(0u32.into(), b"done");
    });
    cluster.expect_clean_exit();
    let err = cluster.servers[0].0.stderr();
    assert!(err.contains("bad frame magic"), "server log:\n{err}");
    assert!(err.contains("truncated frame header"), "server log:\n{err}");
}
