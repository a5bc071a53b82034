//! Tests of [`super::SchedulerState`]: registration orders, declare mismatches, barriers,
//! liveness and the clean finish, driven by events and a fake clock.

use super::*;
use pushpull_proto::placement::chunk_key;
use pushpull_proto::protocol::ChunkPlacement;

const SEED: u64 = 42;

/// A scheduler state with a fake clock and helpers to play nodes.
struct H {
    s: SchedulerState,
    now: Instant,
    cfg: Config,
}

fn waddr(conn: ConnId) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, conn as u8], 1000 + conn as u16))
}
fn saddr(conn: ConnId) -> SocketAddr {
    SocketAddr::from(([10, 1, 0, conn as u8], 7000 + conn as u16))
}

impl H {
    fn new(workers: u32, servers: u32) -> H {
        let mut cfg = Config::local(workers, servers);
        cfg.cluster.partition_bytes = 400; // 100 elements per chunk
        let now = Instant::now();
        H {
            s: SchedulerState::new(StateConfig::from_config(&cfg, SEED), now),
            now,
            cfg,
        }
    }
    fn ev(&mut self, e: Event) {
        self.s.handle(self.now, e);
    }
    fn msg(&mut self, conn: ConnId, msg: ToScheduler) {
        self.ev(Event::Message { conn, msg });
    }
    fn register(&mut self, conn: ConnId, role: NodeRole, requested: Option<u32>) {
        let digest = self.cfg.digest();
        self.register_with(conn, role, requested, digest);
    }
    fn register_with(
        &mut self,
        conn: ConnId,
        role: NodeRole,
        requested: Option<u32>,
        digest: ClusterDigest,
    ) {
        self.ev(Event::Connected {
            conn,
            addr: waddr(conn),
        });
        let listen_addr = (role == NodeRole::Server).then(|| saddr(conn));
        self.msg(
            conn,
            ToScheduler::Register {
                version: PROTOCOL_VERSION,
                role,
                requested_id: requested,
                listen_addr,
                digest,
            },
        );
    }
    fn advance(&mut self, ms: u64) {
        self.now += Duration::from_millis(ms);
        self.ev(Event::Tick);
    }
    fn take(&mut self) -> Vec<Action> {
        std::iter::from_fn(|| self.s.poll_action()).collect()
    }
    /// Registers servers on conns 100.. and workers on conns 0.., returns the conn of
    /// every server id and worker rank.
    fn start(workers: u32, servers: u32) -> (H, Vec<ConnId>, Vec<ConnId>) {
        let mut h = H::new(workers, servers);
        for s in 0..servers {
            h.register(100 + s as ConnId, NodeRole::Server, None);
        }
        for w in 0..workers {
            h.register(w as ConnId, NodeRole::Worker, None);
        }
        let acts = h.take();
        let ids = welcomes(&acts);
        let mut srv = vec![0; servers as usize];
        let mut wrk = vec![0; workers as usize];
        for (conn, id) in ids {
            if conn >= 100 {
                srv[id as usize] = conn;
            } else {
                wrk[id as usize] = conn;
            }
        }
        (h, srv, wrk)
    }
    fn declare(&mut self, conn: ConnId, name: &str, len: u64, params: &[(&str, &str)]) {
        self.declare_with_priority(conn, name, len, params, None)
    }
    fn declare_with_priority(
        &mut self,
        conn: ConnId,
        name: &str,
        len: u64,
        params: &[(&str, &str)],
        priority: Option<i32>,
    ) {
        let params = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.msg(
            conn,
            ToScheduler::Declare {
                name: name.into(),
                len,
                params,
                priority,
            },
        );
    }
    fn ack(&mut self, conn: ConnId, name: &str, error: Option<&str>) {
        self.msg(
            conn,
            ToScheduler::PlacementAck {
                name: name.into(),
                error: error.map(String::from),
            },
        );
    }
    fn heartbeat_all_but(&mut self, conns: &[ConnId], silent: ConnId) {
        for &c in conns {
            if c != silent {
                self.msg(c, ToScheduler::Heartbeat);
            }
        }
    }
}

/// Non-heartbeat messages sent to `conn`.
fn to(acts: &[Action], conn: ConnId) -> Vec<FromScheduler> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Send(c, m) if *c == conn && *m != FromScheduler::Heartbeat => Some(m.clone()),
            _ => None,
        })
        .collect()
}

/// (conn, id) of every Welcome.
fn welcomes(acts: &[Action]) -> Vec<(ConnId, u32)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Send(c, FromScheduler::Welcome { id, .. }) => Some((*c, *id)),
            _ => None,
        })
        .collect()
}

fn refusal(acts: &[Action], conn: ConnId) -> String {
    assert!(acts.contains(&Action::Close(conn)), "{acts:?}");
    match to(acts, conn).as_slice() {
        [FromScheduler::Refused { reason }] => reason.clone(),
        other => panic!("expected one refusal, got {other:?}"),
    }
}

fn declared(acts: &[Action], conn: ConnId) -> Vec<(String, Result<TensorPlacement, String>)> {
    to(acts, conn)
        .into_iter()
        .filter_map(|m| match m {
            FromScheduler::Declared { name, result } => Some((name, result)),
            _ => None,
        })
        .collect()
}

fn placements(acts: &[Action], conn: ConnId) -> Vec<TensorPlacement> {
    to(acts, conn)
        .into_iter()
        .filter_map(|m| match m {
            FromScheduler::Placement(p) => Some(p),
            _ => None,
        })
        .collect()
}

fn finish_of(acts: &[Action]) -> Option<Result<(), JobFailure>> {
    acts.iter().find_map(|a| match a {
        Action::Finish(r) => Some(r.clone()),
        _ => None,
    })
}

// ----------------------------------------------------------- registration

#[test]
fn everyone_is_welcomed_once_the_cluster_is_complete_in_any_order() {
    // (conn, role) in several registration orders.
    let nodes: Vec<(ConnId, NodeRole)> = vec![
        (100, NodeRole::Server),
        (101, NodeRole::Server),
        (0, NodeRole::Worker),
        (1, NodeRole::Worker),
        (2, NodeRole::Worker),
    ];
    let orders: [[usize; 5]; 4] = [
        [0, 1, 2, 3, 4],
        [4, 3, 2, 1, 0],
        [2, 0, 3, 1, 4],
        [3, 4, 1, 2, 0],
    ];
    for order in orders {
        let mut h = H::new(3, 2);
        for (i, &n) in order.iter().enumerate() {
            let (conn, role) = nodes[n];
            h.register(conn, role, None);
            let acts = h.take();
            if i < 4 {
                assert!(welcomes(&acts).is_empty(), "welcome before everyone is in");
                assert!(!h.s.is_running());
            } else {
                let w = welcomes(&acts);
                assert_eq!(w.len(), 5);
                assert!(h.s.is_running());
                // One map for everyone; server ids and ranks fill 0..n.
                let maps: Vec<&ClusterMap> = acts
                    .iter()
                    .filter_map(|a| match a {
                        Action::Send(_, FromScheduler::Welcome { map, .. }) => Some(map),
                        _ => None,
                    })
                    .collect();
                assert!(maps.windows(2).all(|p| p[0] == p[1]));
                let map = maps[0];
                assert_eq!(map.job_seed, SEED);
                assert_eq!(map.servers.len(), 2);
                assert_eq!(map.workers.len(), 3);
                for (conn, id) in w {
                    if conn >= 100 {
                        assert_eq!(map.servers[id as usize], saddr(conn));
                        assert_eq!(h.s.node_name(conn).unwrap().role, NodeRole::Server);
                    } else {
                        assert_eq!(map.workers[id as usize], waddr(conn));
                        assert_eq!(
                            h.s.node_name(conn).unwrap().to_string(),
                            format!("worker {id} ({})", waddr(conn))
                        );
                    }
                }
                // Free ids go lowest-first in registration order.
                let workers_in_order: Vec<ConnId> = order
                    .iter()
                    .map(|&n| nodes[n])
                    .filter(|n| n.1 == NodeRole::Worker)
                    .map(|n| n.0)
                    .collect();
                for (rank, conn) in workers_in_order.iter().enumerate() {
                    assert_eq!(map.workers[rank], waddr(*conn));
                }
            }
        }
    }
}

#[test]
fn requested_ids_are_honoured_and_the_rest_filled_lowest_first() {
    let mut h = H::new(3, 2);
    h.register(0, NodeRole::Worker, Some(2));
    h.register(1, NodeRole::Worker, None);
    h.register(100, NodeRole::Server, Some(1));
    h.register(101, NodeRole::Server, None);
    h.register(2, NodeRole::Worker, Some(0));
    let mut w = welcomes(&h.take());
    w.sort();
    assert_eq!(w, vec![(0, 2), (1, 1), (2, 0), (100, 1), (101, 0)]);
}

#[test]
fn taken_out_of_range_and_surplus_ids_are_refused_by_name() {
    let mut h = H::new(2, 1);
    h.register(0, NodeRole::Worker, Some(1));
    assert!(h.take().is_empty());
    h.register(1, NodeRole::Worker, Some(1));
    let r = refusal(&h.take(), 1);
    assert!(
        r.contains("worker rank 1")
            && r.contains("already taken")
            && r.contains(&waddr(0).to_string()),
        "{r}"
    );
    h.register(2, NodeRole::Worker, Some(2));
    let r = refusal(&h.take(), 2);
    assert!(
        r.contains("worker rank 2 is out of range") && r.contains("0..=1"),
        "{r}"
    );
    h.register(103, NodeRole::Server, Some(5));
    let r = refusal(&h.take(), 103);
    assert!(r.contains("server id 5 is out of range"), "{r}");
    h.register(3, NodeRole::Worker, None);
    assert!(h.take().is_empty());
    h.register(4, NodeRole::Worker, None);
    let r = refusal(&h.take(), 4);
    assert!(
        r.contains("cluster is full") && r.contains("2 of 2 workers"),
        "{r}"
    );
    // The refused connections are ignored from now on.
    h.msg(4, ToScheduler::Finished);
    assert!(h.take().is_empty());
    h.register(100, NodeRole::Server, None);
    assert_eq!(welcomes(&h.take()).len(), 3);
    // Too late: the job is running.
    h.register(5, NodeRole::Worker, None);
    let r = refusal(&h.take(), 5);
    assert!(
        r.contains("cluster is full") && r.contains("job is running"),
        "{r}"
    );
    h.register(104, NodeRole::Server, None);
    let r = refusal(&h.take(), 104);
    assert!(r.contains("all 1 servers"), "{r}");
}

#[test]
fn digest_and_version_mismatches_name_the_setting_and_both_values() {
    let mut h = H::new(1, 1);
    let mut other = h.cfg.clone();
    other.cluster.partition_bytes = 1024;
    h.register_with(0, NodeRole::Worker, None, other.digest());
    let r = refusal(&h.take(), 0);
    assert!(
        r.contains("cluster.partition_bytes")
            && r.contains("400")
            && r.contains("1024")
            && r.contains("worker"),
        "{r}"
    );
    let mut other = h.cfg.clone();
    other.cluster.seed = Some(7);
    h.register_with(1, NodeRole::Server, None, other.digest());
    let r = refusal(&h.take(), 1);
    assert!(
        r.contains("cluster.seed") && r.contains("None") && r.contains("Some(7)"),
        "{r}"
    );

    h.ev(Event::Connected {
        conn: 2,
        addr: waddr(2),
    });
    let digest = h.cfg.digest();
    h.msg(
        2,
        ToScheduler::Register {
            version: PROTOCOL_VERSION + 1,
            role: NodeRole::Worker,
            requested_id: None,
            listen_addr: None,
            digest,
        },
    );
    let r = refusal(&h.take(), 2);
    let (theirs, ours) = (PROTOCOL_VERSION + 1, PROTOCOL_VERSION);
    assert!(
        r.contains(&format!("version {theirs}")) && r.contains(&format!("version {ours}")),
        "{r}"
    );
    // A node whose first message is not Register.
    h.ev(Event::Connected {
        conn: 3,
        addr: waddr(3),
    });
    h.msg(3, ToScheduler::Barrier { id: 0 });
    let r = refusal(&h.take(), 3);
    assert!(
        r.contains("first message must be Register") && r.contains("Barrier"),
        "{r}"
    );
}

#[test]
fn servers_must_advertise_a_distinct_dialable_address() {
    let mut h = H::new(1, 2);
    let digest = h.cfg.digest();
    for (conn, listen) in [
        (100, None),
        (101, Some(SocketAddr::from(([10, 1, 0, 1], 0)))),
    ] {
        h.ev(Event::Connected {
            conn,
            addr: waddr(conn),
        });
        h.msg(
            conn,
            ToScheduler::Register {
                version: PROTOCOL_VERSION,
                role: NodeRole::Server,
                requested_id: None,
                listen_addr: listen,
                digest: digest.clone(),
            },
        );
    }
    let acts = h.take();
    assert!(refusal(&acts, 100).contains("listen_addr"));
    assert!(refusal(&acts, 101).contains("port 0"));
    h.register(102, NodeRole::Server, None);
    h.ev(Event::Connected {
        conn: 103,
        addr: waddr(103),
    });
    h.msg(
        103,
        ToScheduler::Register {
            version: PROTOCOL_VERSION,
            role: NodeRole::Server,
            requested_id: None,
            listen_addr: Some(saddr(102)),
            digest,
        },
    );
    let r = refusal(&h.take(), 103);
    assert!(
        r.contains("already advertised") && r.contains(&saddr(102).to_string()),
        "{r}"
    );
}

#[test]
fn a_node_leaving_before_the_start_frees_its_slot() {
    let mut h = H::new(2, 1);
    h.register(0, NodeRole::Worker, Some(0));
    h.ev(Event::Disconnected {
        conn: 0,
        reason: "gone".into(),
    });
    h.register(1, NodeRole::Worker, Some(0));
    h.register(2, NodeRole::Worker, None);
    h.register(100, NodeRole::Server, None);
    let acts = h.take();
    assert!(finish_of(&acts).is_none());
    let mut w = welcomes(&acts);
    w.sort();
    assert_eq!(w, vec![(1, 0), (2, 1), (100, 0)]);
}

#[test]
fn silent_registrations_and_unregistered_connections_are_dropped_before_the_start() {
    let mut h = H::new(2, 1);
    h.register(0, NodeRole::Worker, Some(1));
    h.ev(Event::Connected {
        conn: 1,
        addr: waddr(1),
    });
    h.advance(5_000);
    // Both still alive; the registered one gets the scheduler's heartbeats.
    let acts = h.take();
    assert!(acts.contains(&Action::Send(0, FromScheduler::Heartbeat)));
    assert!(!acts.iter().any(|a| matches!(a, Action::Send(1, _))));
    h.advance(5_000);
    let acts = h.take();
    let r = refusal(&acts, 0);
    assert!(
        r.contains("no heartbeat for 10.0 s") && r.contains("waiting for the rest"),
        "{r}"
    );
    let r = refusal(&acts, 1);
    assert!(r.contains("no Register message"), "{r}");
    assert!(finish_of(&acts).is_none());
    // Rank 1 is free again.
    h.register(2, NodeRole::Worker, Some(1));
    h.register(3, NodeRole::Worker, None);
    h.register(100, NodeRole::Server, None);
    let mut w = welcomes(&h.take());
    w.sort();
    assert_eq!(w, vec![(2, 1), (3, 0), (100, 0)]);
}

// ---------------------------------------------------------------- declare

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

#[test]
fn a_barrier_completes_only_when_every_worker_arrived() {
    let (mut h, srv, wrk) = H::start(3, 1);
    h.msg(wrk[2], ToScheduler::Barrier { id: 0 });
    h.msg(wrk[0], ToScheduler::Barrier { id: 0 });
    h.msg(wrk[0], ToScheduler::Barrier { id: 0 }); // duplicate: not counted twice
    assert!(h.take().is_empty());
    h.msg(wrk[1], ToScheduler::Barrier { id: 0 });
    let acts = h.take();
    for &w in &wrk {
        assert_eq!(to(&acts, w), vec![FromScheduler::BarrierDone { id: 0 }]);
    }
    assert!(to(&acts, srv[0]).is_empty());
    // Barriers 1 and 2 overlap (a fast worker runs ahead).
    h.msg(wrk[0], ToScheduler::Barrier { id: 1 });
    h.msg(wrk[1], ToScheduler::Barrier { id: 1 });
    h.msg(wrk[0], ToScheduler::Barrier { id: 2 });
    h.msg(wrk[1], ToScheduler::Barrier { id: 2 });
    h.msg(wrk[2], ToScheduler::Barrier { id: 2 });
    let acts = h.take();
    assert_eq!(
        to(&acts, wrk[0]),
        vec![FromScheduler::BarrierDone { id: 2 }]
    );
    h.msg(wrk[2], ToScheduler::Barrier { id: 1 });
    assert_eq!(
        to(&h.take(), wrk[1]),
        vec![FromScheduler::BarrierDone { id: 1 }]
    );
}

#[test]
fn a_worker_finishing_outside_a_barrier_others_wait_in_fails_the_job() {
    let (mut h, srv, wrk) = H::start(2, 1);
    h.msg(wrk[0], ToScheduler::Barrier { id: 0 });
    h.msg(wrk[1], ToScheduler::Finished);
    let acts = h.take();
    let Some(Err(JobFailure::Stuck(msg))) = finish_of(&acts) else {
        panic!("{acts:?}")
    };
    assert!(
        msg.contains("barrier 0") && msg.contains("worker 1 finished"),
        "{msg}"
    );
    for c in [srv[0], wrk[0]] {
        assert_eq!(
            to(&acts, c),
            vec![FromScheduler::Shutdown {
                error: Some(msg.clone())
            }]
        );
    }
    assert!(h.s.is_done());
}

// ------------------------------------------------------------ heartbeats

#[test]
fn the_scheduler_sends_heartbeats_every_interval_to_every_registered_node() {
    let (mut h, srv, wrk) = H::start(2, 1);
    let everyone: Vec<ConnId> = srv.iter().chain(&wrk).copied().collect();
    let beats = |acts: &[Action]| {
        let mut c: Vec<ConnId> = acts
            .iter()
            .filter_map(|a| match a {
                Action::Send(c, FromScheduler::Heartbeat) => Some(*c),
                _ => None,
            })
            .collect();
        c.sort();
        c
    };
    let mut sorted = everyone.clone();
    sorted.sort();
    h.advance(0);
    assert_eq!(beats(&h.take()), sorted);
    h.advance(500);
    assert!(beats(&h.take()).is_empty());
    h.heartbeat_all_but(&everyone, u64::MAX);
    h.advance(500);
    assert_eq!(beats(&h.take()), sorted);
    assert!(h.s.next_timeout().unwrap() <= h.now + Duration::from_millis(1000));
}

fn check_loss(lost_is_server: bool) {
    let (mut h, srv, wrk) = H::start(2, 2);
    let everyone: Vec<ConnId> = srv.iter().chain(&wrk).copied().collect();
    let lost = if lost_is_server { srv[1] } else { wrk[1] };
    let lost_name = h.s.node_name(lost).unwrap();
    // 9.5 s of heartbeats from everyone but `lost`: nobody is lost yet.
    for _ in 0..19 {
        h.heartbeat_all_but(&everyone, lost);
        h.advance(500);
    }
    assert!(finish_of(&h.take()).is_none());
    h.heartbeat_all_but(&everyone, lost);
    h.advance(500);
    let acts = h.take();
    let Some(Err(JobFailure::NodeLost { node, reason })) = finish_of(&acts) else {
        panic!("{acts:?}")
    };
    assert_eq!(node, lost_name);
    assert!(reason.contains("no heartbeat for 10.0 s"), "{reason}");
    let err = JobFailure::NodeLost {
        node: node.clone(),
        reason: reason.clone(),
    }
    .to_string();
    let expected_role = if lost_is_server {
        "server 1 ("
    } else {
        "worker 1 ("
    };
    assert!(err.starts_with(expected_role), "{err}");
    for &c in &everyone {
        if c == lost {
            // The lost node, if it still hears us, gets only the Shutdown.
            assert!(matches!(
                to(&acts, c).as_slice(),
                [FromScheduler::Shutdown { error: Some(_) }]
            ));
            continue;
        }
        let got = to(&acts, c);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(
            got[0],
            FromScheduler::NodeLost {
                node: node.clone(),
                reason: reason.clone()
            }
        );
        let FromScheduler::Shutdown { error: Some(e) } = &got[1] else {
            panic!("{got:?}")
        };
        assert!(e.contains(&node.to_string()), "{e}");
    }
    // Finish is the last action and later events are ignored.
    assert!(matches!(acts.last(), Some(Action::Finish(_))));
    h.advance(20_000);
    h.msg(wrk[0], ToScheduler::Finished);
    assert!(h.take().is_empty());
    assert!(h.s.next_timeout().is_none());
}

#[test]
fn a_silent_worker_is_lost_and_everyone_else_is_told() {
    check_loss(false);
}

#[test]
fn a_silent_server_is_lost_and_everyone_else_is_told() {
    check_loss(true);
}

#[test]
fn a_dropped_connection_is_a_loss_at_once() {
    let (mut h, srv, wrk) = H::start(2, 1);
    h.ev(Event::Disconnected {
        conn: srv[0],
        reason: "timed out".into(),
    });
    let acts = h.take();
    let Some(Err(JobFailure::NodeLost { node, reason })) = finish_of(&acts) else {
        panic!("{acts:?}")
    };
    assert_eq!(node.role, NodeRole::Server);
    assert_eq!(reason, "connection lost: timed out");
    // The dropped connection gets nothing.
    assert!(to(&acts, srv[0]).is_empty());
    for &w in &wrk {
        assert!(matches!(to(&acts, w)[0], FromScheduler::NodeLost { .. }));
    }
}

// ----------------------------------------------------------------- finish

#[test]
fn every_worker_finishing_shuts_everyone_down_cleanly() {
    let (mut h, srv, wrk) = H::start(3, 2);
    h.msg(wrk[1], ToScheduler::Finished);
    // A finished worker may hang up and go silent: not a loss.
    h.ev(Event::Disconnected {
        conn: wrk[1],
        reason: "closed".into(),
    });
    h.msg(wrk[1], ToScheduler::Finished);
    h.msg(wrk[0], ToScheduler::Finished);
    for _ in 0..30 {
        h.heartbeat_all_but(&[srv[0], srv[1], wrk[2]], u64::MAX);
        h.advance(500);
    }
    let acts = h.take();
    assert!(finish_of(&acts).is_none(), "{acts:?}");
    h.msg(wrk[2], ToScheduler::Finished);
    let acts = h.take();
    assert_eq!(finish_of(&acts), Some(Ok(())));
    for c in [srv[0], srv[1], wrk[0], wrk[2]] {
        assert_eq!(to(&acts, c), vec![FromScheduler::Shutdown { error: None }]);
    }
    assert!(
        to(&acts, wrk[1]).is_empty(),
        "the hung-up worker gets nothing"
    );
    assert!(h.s.is_done());
}

#[test]
fn messages_in_the_wrong_role_are_ignored() {
    let (mut h, srv, wrk) = H::start(1, 1);
    h.msg(srv[0], ToScheduler::Finished);
    h.msg(srv[0], ToScheduler::Barrier { id: 0 });
    h.msg(
        wrk[0],
        ToScheduler::PlacementAck {
            name: "t".into(),
            error: None,
        },
    );
    h.msg(wrk[0], ToScheduler::Heartbeat);
    assert!(h.take().is_empty());
    assert!(!h.s.is_done());
}
