//! End-to-end tests of the worker against a minimal in-test scheduler and server that speak
//! the protocol of `pushpull_proto` over real QUIC with mutual TLS on loopback.
//!
//! The mocks are deliberately small (they trust their peers) so that the tests exercise the
//! worker: rendezvous, declares, push_pull/broadcast rounds with many keys in flight, barriers,
//! finish, and the failure paths (a lost server, a lost worker reported by the scheduler, a
//! silent scheduler, an aborted round, a refused registration, a cancelled call).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pushpull_kernels::{fp32_codec, RoundCtx};
use pushpull_net::tls::{generate_cluster, TlsIdentity};
use pushpull_net::transport::{read_frame, send_frame, ControlSender, ControlStream, Endpoint};
use pushpull_proto::placement::Placer;
use pushpull_proto::protocol::{
    ClusterMap, FrameHeader, FrameKind, FromScheduler, ReduceOp, TensorPlacement, ToScheduler,
};
use pushpull_proto::{Config, NodeName, NodeRole};
use pushpull_worker::{JoinOptions, ParamMap, Reduce, Tensor, Worker, WorkerError};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

mod common;
use common::{data, init_tracing, rank_order_sum, seed};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Certificates for a test cluster.
struct Certs {
    _dir: tempfile::TempDir,
    ids: Vec<TlsIdentity>,
}

fn certs(n: usize) -> Certs {
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..n).map(|i| format!("node{i}")).collect();
    let cfgs = generate_cluster(dir.path(), "pushpull.cluster", &names).unwrap();
    let ids = cfgs.iter().map(|c| TlsIdentity::load(c).unwrap()).collect();
    Certs { _dir: dir, ids }
}

fn config(workers: u32, servers: u32, partition_bytes: u64) -> Config {
    let mut c = Config::local(workers, servers);
    c.cluster.partition_bytes = partition_bytes;
    c.cluster.heartbeat_interval_ms = 200;
    c.cluster.heartbeat_timeout_ms = 3000;
    c.cluster.connect_timeout_ms = 10_000;
    c
}

// ------------------------------------------------------------------------------------------
// Mock server: sums pushes of each (key, round) in rank order with the fp32 codec.

struct MockServer {
    addr: SocketAddr,
    endpoint: Endpoint,
    tasks: Vec<JoinHandle<()>>,
}

impl MockServer {
    /// Kills the server: closes its connections.
    fn kill(&self) {
        for t in &self.tasks {
            t.abort();
        }
        self.endpoint.quinn.close(0u32.into(), b"killed");
    }
}

/// One round's pushes of a key, by rank.
type RoundPushes = BTreeMap<u32, (FrameHeader, Bytes)>;

struct Incoming {
    conn: quinn::Connection,
    header: FrameHeader,
    payload: Bytes,
}

async fn mock_server(
    config: &Config,
    identity: &TlsIdentity,
    workers: u32,
    abort_round: Option<u64>,
) -> MockServer {
    let endpoint = Endpoint::bind("127.0.0.1:0".parse().unwrap(), identity, config).unwrap();
    let addr = endpoint.local_addr();
    let (tx, mut rx) = mpsc::unbounded_channel::<Incoming>();
    let max = pushpull_proto::protocol::max_payload_len(config.cluster.partition_bytes);
    let ep = endpoint.clone();
    let accept = tokio::spawn(async move {
        while let Some(incoming) = ep.quinn.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                while let Ok(mut s) = conn.accept_uni().await {
                    let (tx, conn) = (tx.clone(), conn.clone());
                    tokio::spawn(async move {
                        if let Ok((header, payload)) = read_frame(&mut s, max, "worker").await {
                            let _ = tx.send(Incoming {
                                conn,
                                header,
                                payload,
                            });
                        }
                    });
                }
            });
        }
    });
    let central = tokio::spawn(async move {
        let mut conns: HashMap<u32, quinn::Connection> = HashMap::new();
        // key -> (current round, pushes of that round by rank)
        let mut keys: HashMap<u64, (u64, RoundPushes)> = HashMap::new();
        while let Some(Incoming {
            conn,
            header: h,
            payload,
        }) = rx.recv().await
        {
            conns.insert(h.rank, conn);
            if h.kind != FrameKind::Push {
                continue;
            }
            let st = keys.entry(h.key).or_insert((0, BTreeMap::new()));
            assert_eq!(
                h.round, st.0,
                "mock server: push for key {:#x} out of round",
                h.key
            );
            st.1.insert(h.rank, (h, payload));
            if st.1.len() < workers as usize {
                continue;
            }
            let pushes = std::mem::take(&mut st.1);
            let round = st.0;
            st.0 += 1;
            let (kind, payload) = if abort_round == Some(round) {
                (
                    FrameKind::Abort,
                    Bytes::from(format!("mock abort of key {:#x} round {round}", h.key)),
                )
            } else if h.op == ReduceOp::Broadcast {
                (FrameKind::Result, pushes[&h.aux].1.clone())
            } else {
                let len = pushes[&0].1.len() / 4;
                let mut codec = fp32_codec(len);
                let ctx = RoundCtx::new(round);
                let mut acc = vec![0f32; len];
                for (r, (_, p)) in &pushes {
                    if *r == 0 {
                        codec.decompress(p, &ctx, &mut acc).unwrap();
                    } else {
                        codec.decompress_add(p, &ctx, &mut acc).unwrap();
                    }
                }
                let mut out = Vec::new();
                codec.compress(&acc, &ctx, &mut out).unwrap();
                (FrameKind::Result, Bytes::from(out))
            };
            for r in 0..workers {
                let conn = conns[&r].clone();
                let header = FrameHeader {
                    kind,
                    op: h.op,
                    rank: r,
                    aux: h.aux,
                    key: h.key,
                    round,
                    payload_len: payload.len() as u64,
                };
                let payload = payload.clone();
                tokio::spawn(async move {
                    let _ = send_frame(&conn, &header, payload, "mock worker").await;
                });
            }
        }
    });
    MockServer {
        addr,
        endpoint,
        tasks: vec![accept, central],
    }
}

// ------------------------------------------------------------------------------------------
// Mock scheduler: rendezvous, declares (with the real Placer), barriers, finish, heartbeats.

enum Event {
    Registered(usize, Option<u32>, ControlSender),
    Msg(usize, ToScheduler),
    Gone(usize),
}

struct MockScheduler {
    addr: SocketAddr,
    /// Messages to send to every worker.
    inject: mpsc::UnboundedSender<FromScheduler>,
    /// Clear to stop heartbeats (the scheduler goes silent).
    heartbeats: Arc<AtomicBool>,
    /// Ok(()) when every worker finished.
    done: JoinHandle<Result<(), String>>,
}

async fn mock_scheduler(
    config: &Config,
    identity: &TlsIdentity,
    servers: Vec<SocketAddr>,
) -> MockScheduler {
    let endpoint = Endpoint::bind("127.0.0.1:0".parse().unwrap(), identity, config).unwrap();
    let addr = endpoint.local_addr();
    let workers = config.cluster.num_workers;
    let partition = config.cluster.partition_bytes;
    let interval = config.heartbeat_interval();
    let (ev_tx, mut ev) = mpsc::unbounded_channel::<Event>();
    let ep = endpoint.clone();
    tokio::spawn(async move {
        let mut next_id = 0;
        while let Some(incoming) = ep.quinn.accept().await {
            let ev_tx = ev_tx.clone();
            let id = next_id;
            next_id += 1;
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                let Ok((send, recv)) = conn.accept_bi().await else {
                    return;
                };
                let (tx, mut rx) = ControlStream::new(send, recv, "worker").split();
                match rx.recv::<ToScheduler>().await {
                    Ok(Some(ToScheduler::Register { requested_id, .. })) => {
                        let _ = ev_tx.send(Event::Registered(id, requested_id, tx));
                    }
                    _ => return,
                }
                loop {
                    match rx.recv::<ToScheduler>().await {
                        Ok(Some(m)) => {
                            let _ = ev_tx.send(Event::Msg(id, m));
                        }
                        _ => {
                            let _ = ev_tx.send(Event::Gone(id));
                            // Keep the connection object alive until the worker closes it.
                            let _ = conn.closed().await;
                            return;
                        }
                    }
                }
            });
        }
    });
    let (inject, mut inject_rx) = mpsc::unbounded_channel::<FromScheduler>();
    let heartbeats = Arc::new(AtomicBool::new(true));
    let hb = heartbeats.clone();
    let done = tokio::spawn(async move {
        let _endpoint = endpoint;
        let mut pending: Vec<(usize, Option<u32>, ControlSender)> = Vec::new();
        let mut senders: BTreeMap<u32, ControlSender> = BTreeMap::new();
        let mut rank_of: HashMap<usize, u32> = HashMap::new();
        let mut declares: HashMap<String, BTreeMap<u32, (u64, ParamMap)>> = HashMap::new();
        let mut placed: HashMap<String, TensorPlacement> = HashMap::new();
        let mut placer = Placer::new(servers.len() as u32, partition);
        let mut barriers: HashMap<u64, BTreeSet<u32>> = HashMap::new();
        let mut finished: BTreeSet<u32> = BTreeSet::new();
        let mut tick = tokio::time::interval(interval);
        macro_rules! to_all {
            ($msg:expr) => {{
                let msg = $msg;
                for s in senders.values_mut() {
                    let _ = s.send(&msg).await;
                }
            }};
        }
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if hb.load(Ordering::Relaxed) {
                        to_all!(FromScheduler::Heartbeat);
                        for (_, _, s) in pending.iter_mut() {
                            let _ = s.send(&FromScheduler::Heartbeat).await;
                        }
                    }
                }
                Some(msg) = inject_rx.recv() => to_all!(msg),
                Some(e) = ev.recv() => match e {
                    Event::Registered(id, req, mut tx) => {
                        eprintln!("mock scheduler: connection {id} registered (requested {req:?})");
                        let taken = req.is_some_and(|r| {
                            r >= workers || pending.iter().any(|(_, q, _)| *q == Some(r))
                        });
                        if taken || pending.len() == workers as usize {
                            let reason = format!("requested rank {req:?} is taken or out of range");
                            let _ = tx.send(&FromScheduler::Refused { reason }).await;
                            continue;
                        }
                        pending.push((id, req, tx));
                        if pending.len() == workers as usize {
                            let mut free: Vec<u32> = (0..workers)
                                .filter(|r| !pending.iter().any(|(_, q, _)| *q == Some(*r)))
                                .collect();
                            free.reverse();
                            for (id, req, tx) in pending.drain(..) {
                                let rank = req.unwrap_or_else(|| free.pop().unwrap());
                                rank_of.insert(id, rank);
                                senders.insert(rank, tx);
                            }
                            let map = ClusterMap {
                                servers: servers.clone(),
                                workers: vec!["127.0.0.1:1".parse().unwrap(); workers as usize],
                                job_seed: 7,
                            };
                            for (rank, s) in senders.iter_mut() {
                                let _ = s.send(&FromScheduler::Welcome { id: *rank, map: map.clone() }).await;
                            }
                        }
                    }
                    Event::Msg(id, msg) => {
                        let Some(&rank) = rank_of.get(&id) else { continue };
                        match msg {
                            ToScheduler::Declare {
                                name, len, params, ..
                            } => {
                                if let Some(p) = placed.get(&name) {
                                    let result = if p.len == len && p.params == params {
                                        Ok(p.clone())
                                    } else {
                                        Err(format!("tensor {name:?} redeclared differently"))
                                    };
                                    let s = senders.get_mut(&rank).unwrap();
                                    let _ = s.send(&FromScheduler::Declared { name, result }).await;
                                    continue;
                                }
                                let d = declares.entry(name.clone()).or_default();
                                d.insert(rank, (len, params));
                                if d.len() < workers as usize {
                                    continue;
                                }
                                let d = declares.remove(&name).unwrap();
                                let (l0, p0) = d[&0].clone();
                                let mut result = None;
                                for (r, (l, p)) in &d {
                                    if *l != l0 {
                                        result = Some(Err(format!(
                                            "tensor {name:?}: worker 0 declared {l0} elements, worker {r} declared {l}"
                                        )));
                                        break;
                                    }
                                    if *p != p0 {
                                        result = Some(Err(format!("tensor {name:?}: parameters differ")));
                                        break;
                                    }
                                }
                                let result = result.unwrap_or_else(|| {
                                    let p = placer.place(&name, l0, p0);
                                    placed.insert(name.clone(), p.clone());
                                    Ok(p)
                                });
                                to_all!(FromScheduler::Declared { name, result });
                            }
                            ToScheduler::Barrier { id } => {
                                let b = barriers.entry(id).or_default();
                                b.insert(rank);
                                if b.len() == workers as usize {
                                    barriers.remove(&id);
                                    to_all!(FromScheduler::BarrierDone { id });
                                }
                            }
                            ToScheduler::Finished => {
                                finished.insert(rank);
                                if finished.len() == workers as usize {
                                    to_all!(FromScheduler::Shutdown { error: None });
                                    tokio::time::sleep(Duration::from_millis(500)).await;
                                    return Ok(());
                                }
                            }
                            _ => {}
                        }
                    }
                    Event::Gone(id) => {
                        let Some(&rank) = rank_of.get(&id) else { continue };
                        if finished.contains(&rank) {
                            continue;
                        }
                        senders.remove(&rank);
                        let node = NodeName {
                            role: NodeRole::Worker,
                            id: rank,
                            addr: "127.0.0.1:1".parse().unwrap(),
                        };
                        to_all!(FromScheduler::NodeLost { node: node.clone(), reason: "connection closed".into() });
                        to_all!(FromScheduler::Shutdown { error: Some(format!("{node} lost")) });
                        return Err(format!("{node} lost"));
                    }
                },
            }
        }
    });
    MockScheduler {
        addr,
        inject,
        heartbeats,
        done,
    }
}

// ------------------------------------------------------------------------------------------

struct Cluster {
    certs: Certs,
    config: Config,
    scheduler: MockScheduler,
    servers: Vec<MockServer>,
    workers: Vec<Worker>,
}

impl Cluster {
    /// The TLS identity of worker `w` (by join order).
    fn worker_identity(&self, w: usize) -> TlsIdentity {
        self.certs.ids[1 + self.servers.len() + w].clone()
    }
}

/// A mock scheduler and servers, no workers yet.
async fn env(workers: u32, servers: u32, partition: u64, abort_round: Option<u64>) -> Cluster {
    init_tracing();
    // Spare identities for extra workers.
    let certs = certs(1 + servers as usize + workers as usize + 2);
    let mut config = config(workers, servers, partition);
    let mut srv = Vec::new();
    for s in 0..servers as usize {
        srv.push(mock_server(&config, &certs.ids[1 + s], workers, abort_round).await);
    }
    let scheduler =
        mock_scheduler(&config, &certs.ids[0], srv.iter().map(|s| s.addr).collect()).await;
    config.cluster.scheduler = scheduler.addr.to_string();
    Cluster {
        certs,
        config,
        scheduler,
        servers: srv,
        workers: Vec::new(),
    }
}

/// Joins `requested.len()` workers concurrently; returns the join results in that order.
async fn join_workers(c: &Cluster, requested: &[Option<u32>]) -> Vec<Result<Worker, WorkerError>> {
    let joins: Vec<_> = requested
        .iter()
        .enumerate()
        .map(|(w, &requested_rank)| {
            let id = c.worker_identity(w);
            let config = c.config.clone();
            tokio::spawn(
                async move { Worker::join(&config, id, JoinOptions { requested_rank }).await },
            )
        })
        .collect();
    let mut out = Vec::new();
    for j in joins {
        out.push(j.await.unwrap());
    }
    out
}

async fn cluster(workers: u32, servers: u32, partition: u64, abort_round: Option<u64>) -> Cluster {
    let mut c = env(workers, servers, partition, abort_round).await;
    // Worker w asks for rank (workers - 1 - w), to exercise requested ranks.
    let requested: Vec<_> = (0..workers).map(|w| Some(workers - 1 - w)).collect();
    let mut ws: Vec<Worker> = join_workers(&c, &requested)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    ws.sort_by_key(|w| w.rank());
    c.workers = ws;
    c
}

/// Declares `name` on every worker of `c` (a collective, so concurrently).
async fn declare_all(c: &Cluster, name: &str, len: u64) -> Vec<Tensor> {
    futures_util::future::join_all(
        c.workers
            .iter()
            .map(|w| w.declare(name, len, ParamMap::new())),
    )
    .await
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

async fn finish_all(c: Cluster) {
    let fin: Vec<_> = c
        .workers
        .into_iter()
        .map(|w| tokio::spawn(w.finish()))
        .collect();
    for f in fin {
        f.await.unwrap().unwrap();
    }
    assert_eq!(c.scheduler.done.await.unwrap(), Ok(()));
    drop(c.servers);
    drop(c.config);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sums_are_bit_identical_to_the_rank_order_sum() {
    tokio::time::timeout(TIMEOUT, async {
        let seed = seed();
        // 64-byte partitions: 16 elements per chunk, so the 10_007-element tensor has 626
        // chunks spread over 2 servers.
        let c = cluster(2, 2, 64, None).await;
        let w = &c.workers;
        assert_eq!((w[0].rank(), w[1].rank()), (0, 1));
        assert_eq!(w[0].num_workers(), 2);
        assert_eq!(w[0].num_servers(), 2);
        assert_eq!(w[0].job_seed(), 7);
        let len = 10_007usize;
        // Declares are collectives: run them concurrently.
        let (a, b) = tokio::join!(
            w[0].declare("big", len as u64, ParamMap::new()),
            w[1].declare("big", len as u64, ParamMap::new())
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a.num_chunks(), 626);
        assert_eq!(a.placement(), b.placement());

        for round in 0..3u64 {
            let bufs: Vec<Vec<f32>> = (0..2)
                .map(|r| data(seed ^ (r << 32) ^ round, len))
                .collect();
            let expected = rank_order_sum(&bufs);
            let op = if round == 2 {
                Reduce::Average
            } else {
                Reduce::Sum
            };
            let (ra, rb) = tokio::join!(
                w[0].push_pull(&a, bufs[0].clone(), op),
                w[1].push_pull(&b, bufs[1].clone(), op)
            );
            let (ra, rb) = (ra.unwrap(), rb.unwrap());
            let expected: Vec<f32> = match op {
                Reduce::Sum => expected,
                Reduce::Average => expected.iter().map(|x| x / 2.0).collect(),
            };
            assert!(
                ra.iter()
                    .zip(&expected)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "round {round}: worker 0 differs from the rank-order sum (seed {seed})"
            );
            assert!(ra.iter().zip(&rb).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
        assert_eq!(a.rounds_started(), 3);

        // Broadcast from rank 1.
        let mine = |r: u64| data(seed ^ 0xb0 ^ r, len);
        let (ra, rb) = tokio::join!(
            w[0].broadcast(&a, mine(0), 1),
            w[1].broadcast(&b, mine(1), 1)
        );
        assert_eq!(ra.unwrap(), mine(1));
        assert_eq!(rb.unwrap(), mine(1));

        let m = w[0].metrics();
        assert_eq!(m.tensors["big"].rounds, 4);
        assert_eq!(m.bytes_pushed, 3 * 4 * len as u64); // the non-root broadcast pushes nothing
        assert_eq!(m.bytes_pulled, 4 * 4 * len as u64);
        println!("{m}");

        let (x, y) = tokio::join!(w[0].barrier(), w[1].barrier());
        x.unwrap();
        y.unwrap();
        finish_all(c).await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_issued_in_opposite_orders() {
    tokio::time::timeout(TIMEOUT, async {
        let seed = seed();
        // 16-byte partitions: 4 elements per chunk. 150 one-chunk tensors issued in opposite
        // orders by the two workers, plus a 250-chunk tensor, with a send window of 8 frames
        // (56 bytes each).
        let mut c = env(2, 1, 16, None).await;
        c.config.cluster.send_window_bytes = 8 * 56;
        let mut ws: Vec<Worker> = join_workers(&c, &[None, None])
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        ws.sort_by_key(|w| w.rank());
        c.workers = ws;
        let n = 150;
        let mut small = Vec::new();
        for i in 0..n {
            small.push(declare_all(&c, &format!("t{i:03}"), 3).await);
        }
        let long = declare_all(&c, "long", 1000).await;
        assert_eq!(long[0].num_chunks(), 250);

        let input =
            |r: usize, i: usize, len: usize| data(seed ^ ((r as u64) << 40) ^ i as u64, len);
        let run = |r: usize| {
            let w = c.workers[r].clone();
            let mut order: Vec<usize> = (0..n).collect();
            if r == 1 {
                order.reverse();
            }
            let calls: Vec<_> = order
                .into_iter()
                .map(|i| {
                    let (w, t) = (w.clone(), small[i][r].clone());
                    let buf = input(r, i, 3);
                    async move { (i, w.push_pull(&t, buf, Reduce::Sum).await.unwrap()) }
                })
                .collect();
            let (w, t) = (w.clone(), long[r].clone());
            let long_buf = input(r, 9999, 1000);
            async move {
                let (results, long_result) = tokio::join!(
                    futures_util::future::join_all(calls),
                    w.push_pull(&t, long_buf, Reduce::Sum)
                );
                (results, long_result.unwrap())
            }
        };
        let (a, b) = tokio::join!(run(0), run(1));
        for (i, got) in a.0.iter().chain(&b.0) {
            let expected = rank_order_sum(&[input(0, *i, 3), input(1, *i, 3)]);
            assert_eq!(got, &expected, "tensor t{i:03} (seed {seed})");
        }
        let expected = rank_order_sum(&[input(0, 9999, 1000), input(1, 9999, 1000)]);
        assert_eq!(a.1, expected);
        assert_eq!(b.1, expected);
        assert_eq!(c.workers[0].metrics().tensors.len(), n + 1);
        finish_all(c).await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn call_errors_name_the_tensor_and_values() {
    tokio::time::timeout(TIMEOUT, async {
        let c = cluster(2, 1, 4096, None).await;
        let w = &c.workers;
        let t = declare_all(&c, "fc1.weight", 10).await;
        let e = w[0]
            .push_pull(&t[0], vec![0.0; 9], Reduce::Sum)
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "tensor \"fc1.weight\" was declared with 10 elements, but the buffer has 9"
        );
        // A handle from another worker is refused, even with the same name.
        let e = w[0]
            .push_pull(&t[1], vec![0.0; 10], Reduce::Sum)
            .await
            .unwrap_err();
        assert!(matches!(e, WorkerError::Undeclared { .. }), "{e}");
        assert!(e.to_string().contains("\"fc1.weight\""), "{e}");
        let e = w[0].tensor("nope").unwrap_err();
        assert!(
            e.to_string().contains("tensor \"nope\" is not declared"),
            "{e}"
        );
        let e = w[0].broadcast(&t[0], vec![0.0; 10], 2).await.unwrap_err();
        assert!(e.to_string().contains("root 2 is not a rank"), "{e}");
        assert_eq!(t[0].rounds_started(), 0, "rejected calls use no round");
        assert_eq!(w[0].tensor("fc1.weight").unwrap().rounds_started(), 0);

        // Lengths that differ between workers: both get an error naming both values; other
        // tensors keep working.
        let (a, b) = tokio::join!(
            w[0].declare("mismatch", 1000, ParamMap::new()),
            w[1].declare("mismatch", 999, ParamMap::new())
        );
        for e in [a.unwrap_err(), b.unwrap_err()] {
            let s = e.to_string();
            assert!(
                s.contains("\"mismatch\"") && s.contains("1000") && s.contains("999"),
                "{s}"
            );
        }
        // Parameters overlay: declare params win over the config's [tensors.default].
        let mut p = ParamMap::new();
        p.insert("compressor".into(), "none".into());
        let (a, b) = tokio::join!(
            w[0].declare("with_params", 5, p.clone()),
            w[1].declare("with_params", 5, p.clone())
        );
        assert_eq!(a.unwrap().params(), b.unwrap().params());
        // Declaring again returns the same tensor (same round counter).
        let (x, y) = tokio::join!(
            w[0].push_pull(&t[0], vec![1.0; 10], Reduce::Average),
            w[1].push_pull(&t[1], vec![3.0; 10], Reduce::Average)
        );
        assert_eq!(x.unwrap(), vec![2.0; 10]);
        assert_eq!(y.unwrap(), vec![2.0; 10]);
        let again = w[0]
            .declare("fc1.weight", 10, ParamMap::new())
            .await
            .unwrap();
        assert_eq!(again.rounds_started(), 1);
        finish_all(c).await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_round_fails_that_call_only() {
    tokio::time::timeout(TIMEOUT, async {
        // The mock server aborts round 0 of every key.
        let c = cluster(2, 1, 16, Some(0)).await;
        let w = &c.workers;
        let t = declare_all(&c, "grad", 10).await;
        let (a, b) = tokio::join!(
            w[0].push_pull(&t[0], vec![1.0; 10], Reduce::Sum),
            w[1].push_pull(&t[1], vec![2.0; 10], Reduce::Sum)
        );
        for e in [a.unwrap_err(), b.unwrap_err()] {
            let s = e.to_string();
            assert!(matches!(e, WorkerError::Aborted { round: 0, .. }), "{s}");
            assert!(
                s.contains("\"grad\"") && s.contains("server 0 (") && s.contains("mock abort"),
                "{s}"
            );
        }
        // Round 1 works: the rounds stayed in step.
        let (a, b) = tokio::join!(
            w[0].push_pull(&t[0], vec![1.0; 10], Reduce::Sum),
            w[1].push_pull(&t[1], vec![2.0; 10], Reduce::Sum)
        );
        assert_eq!(a.unwrap(), vec![3.0; 10]);
        assert_eq!(b.unwrap(), vec![3.0; 10]);
        finish_all(c).await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_push_pull_completes_in_the_background() {
    tokio::time::timeout(TIMEOUT, async {
        let c = cluster(2, 1, 16, None).await;
        let w = &c.workers;
        let t = declare_all(&c, "grad", 10).await;
        // Worker 0 gives up waiting for worker 1: its round 0 is detached, not cancelled.
        let r = tokio::time::timeout(
            Duration::from_millis(200),
            w[0].push_pull(&t[0], vec![1.0; 10], Reduce::Sum),
        )
        .await;
        assert!(r.is_err(), "worker 1 has not pushed yet");
        assert_eq!(t[0].rounds_started(), 1);
        let b = w[1]
            .push_pull(&t[1], vec![2.0; 10], Reduce::Sum)
            .await
            .unwrap();
        assert_eq!(b, vec![3.0; 10], "worker 0's detached round completed");
        // The next round pairs up correctly.
        let (a, b) = tokio::join!(
            w[0].push_pull(&t[0], vec![5.0; 10], Reduce::Sum),
            w[1].push_pull(&t[1], vec![6.0; 10], Reduce::Sum)
        );
        assert_eq!(a.unwrap(), vec![11.0; 10]);
        assert_eq!(b.unwrap(), vec![11.0; 10]);
        finish_all(c).await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_server_fails_pending_and_later_calls_naming_it() {
    tokio::time::timeout(TIMEOUT, async {
        let c = cluster(2, 1, 16, None).await;
        let w = &c.workers;
        let t = declare_all(&c, "grad", 10).await;
        let server = format!("server 0 ({})", c.servers[0].addr);
        let pending = {
            let (w, t) = (w[0].clone(), t[0].clone());
            tokio::spawn(async move { w.push_pull(&t, vec![1.0; 10], Reduce::Sum).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        c.servers[0].kill();
        let e = pending.await.unwrap().unwrap_err();
        assert!(
            e.to_string().starts_with(&format!("{server} was lost")),
            "{e}"
        );
        assert!(e.is_fatal());
        let e = w[0].barrier().await.unwrap_err();
        assert!(e.to_string().starts_with(&server), "{e}");
        let e = w[1]
            .push_pull(&t[1], vec![1.0; 10], Reduce::Sum)
            .await
            .unwrap_err();
        assert!(e.to_string().starts_with(&server), "{e}");
        let e = c.workers[0].clone().finish().await.unwrap_err();
        assert!(e.to_string().starts_with(&server), "{e}");
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_lost_reported_by_the_scheduler_fails_everything() {
    tokio::time::timeout(TIMEOUT, async {
        let c = cluster(2, 1, 16, None).await;
        let w = &c.workers;
        let t = declare_all(&c, "grad", 10).await;
        let pending = {
            let (w, t) = (w[0].clone(), t[0].clone());
            tokio::spawn(async move { w.push_pull(&t, vec![1.0; 10], Reduce::Sum).await })
        };
        let barrier = {
            let w = w[0].clone();
            tokio::spawn(async move { w.barrier().await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Worker 1 "vanishes": dropping it without finish makes the scheduler report it.
        let mut workers = c.workers.clone();
        let w1 = workers.pop().unwrap();
        drop(t);
        drop(w1);
        let mut c = c;
        c.workers.pop();
        for e in [
            pending.await.unwrap().unwrap_err(),
            barrier.await.unwrap().unwrap_err(),
        ] {
            assert!(
                e.to_string()
                    .starts_with("worker 1 (127.0.0.1:1) was lost: connection closed"),
                "{e}"
            );
        }
        assert_eq!(
            c.scheduler.done.await.unwrap(),
            Err("worker 1 (127.0.0.1:1) lost".to_string())
        );
        let e = workers[0].barrier().await.unwrap_err();
        assert!(e.to_string().starts_with("worker 1"), "{e}");
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_node_lost_and_job_failure() {
    tokio::time::timeout(TIMEOUT, async {
        let c = cluster(2, 1, 16, None).await;
        let t = declare_all(&c, "grad", 10).await;
        let pending = {
            let (w, t) = (c.workers[0].clone(), t[0].clone());
            tokio::spawn(async move { w.push_pull(&t, vec![1.0; 10], Reduce::Sum).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let node = NodeName {
            role: NodeRole::Server,
            id: 3,
            addr: "10.1.2.3:4".parse().unwrap(),
        };
        c.scheduler
            .inject
            .send(FromScheduler::NodeLost {
                node,
                reason: "no heartbeat for 10.0 s".into(),
            })
            .unwrap();
        c.scheduler
            .inject
            .send(FromScheduler::Shutdown {
                error: Some("server 3 lost".into()),
            })
            .unwrap();
        let e = pending.await.unwrap().unwrap_err();
        assert_eq!(
            e.to_string(),
            "server 3 (10.1.2.3:4) was lost: no heartbeat for 10.0 s"
        );
        // The first failure wins over the Shutdown that followed.
        let e = c.workers[1].barrier().await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "server 3 (10.1.2.3:4) was lost: no heartbeat for 10.0 s"
        );
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_scheduler_is_detected() {
    tokio::time::timeout(TIMEOUT, async {
        let c = cluster(2, 1, 16, None).await;
        let t = declare_all(&c, "grad", 10).await;
        c.scheduler.heartbeats.store(false, Ordering::Relaxed);
        let start = std::time::Instant::now();
        let e = c.workers[0]
            .push_pull(&t[0], vec![1.0; 10], Reduce::Sum)
            .await
            .unwrap_err();
        let s = e.to_string();
        assert!(
            s.starts_with(&format!(
                "scheduler ({}) was lost: no message for",
                c.scheduler.addr
            )),
            "{s}"
        );
        let waited = start.elapsed();
        assert!(waited < Duration::from_secs(10), "took {waited:?}");
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_registration_reports_the_reason() {
    tokio::time::timeout(TIMEOUT, async {
        let c = env(2, 1, 16, None).await;
        let first = {
            let (config, id) = (c.config.clone(), c.worker_identity(0));
            tokio::spawn(async move {
                Worker::join(
                    &config,
                    id,
                    JoinOptions {
                        requested_rank: Some(1),
                    },
                )
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let e = Worker::join(
            &c.config,
            c.worker_identity(1),
            JoinOptions {
                requested_rank: Some(1),
            },
        )
        .await
        .unwrap_err();
        assert!(matches!(e, WorkerError::Refused { .. }), "{e}");
        assert!(
            e.to_string().contains("requested rank Some(1) is taken"),
            "{e}"
        );
        // A rank out of range is refused before dialling.
        let e = Worker::join(
            &c.config,
            c.worker_identity(1),
            JoinOptions {
                requested_rank: Some(2),
            },
        )
        .await
        .unwrap_err();
        assert!(
            e.to_string().contains("requested rank 2 is out of range"),
            "{e}"
        );
        let second = Worker::join(&c.config, c.worker_identity(2), JoinOptions::default())
            .await
            .unwrap();
        assert_eq!(second.rank(), 0);
        let first = first.await.unwrap().unwrap();
        assert_eq!(first.rank(), 1);
        let (a, b) = tokio::join!(first.finish(), second.finish());
        a.unwrap();
        b.unwrap();
    })
    .await
    .expect("test timed out");
}

#[test]
fn blocking_workers_in_threads() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let c = rt.block_on(env(2, 2, 64, None));
    let threads: Vec<_> = (0..2)
        .map(|w| {
            let (config, id) = (c.config.clone(), c.worker_identity(w));
            std::thread::spawn(move || {
                let bw = pushpull_worker::BlockingWorker::join(&config, id, JoinOptions::default())
                    .unwrap();
                let t = bw.declare("p", 1000, ParamMap::new()).unwrap();
                let mut buf: Vec<f32> = (0..1000).map(|i| (i * (bw.rank() + 1)) as f32).collect();
                bw.push_pull(&t, &mut buf, Reduce::Sum).unwrap();
                assert!(buf.iter().enumerate().all(|(i, v)| *v == (3 * i) as f32));
                let mut b = vec![bw.rank() as f32; 1000];
                bw.broadcast(&t, &mut b, 1).unwrap();
                assert_eq!(b, vec![1.0; 1000]);
                let mut wrong = vec![0.0; 3];
                let e = bw.push_pull(&t, &mut wrong, Reduce::Sum).unwrap_err();
                assert!(e
                    .to_string()
                    .contains("1000 elements, but the buffer has 3"));
                assert_eq!(wrong, vec![0.0; 3], "unchanged on error");
                bw.barrier().unwrap();
                assert_eq!(bw.metrics().tensors["p"].rounds, 2);
                bw.finish().unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(rt.block_on(c.scheduler.done).unwrap(), Ok(()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_another_ca_is_refused_at_the_handshake() {
    tokio::time::timeout(TIMEOUT, async {
        let mut c = env(1, 1, 16, None).await;
        c.config.cluster.connect_timeout_ms = 2000;
        let stranger = certs(1);
        let e = Worker::join(&c.config, stranger.ids[0].clone(), JoinOptions::default())
            .await
            .unwrap_err();
        assert!(matches!(e, WorkerError::Connect { .. }), "{e}");
        assert!(
            e.to_string().starts_with(&format!(
                "cannot connect to scheduler ({})",
                c.scheduler.addr
            )),
            "{e}"
        );
        println!("{e}");
    })
    .await
    .expect("test timed out");
}
