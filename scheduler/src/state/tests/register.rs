//! Registration: orders, ids, refusals, leaving before the start.

use super::*;

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
        grant: PeerGrant::Unchecked,
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
        grant: PeerGrant::Unchecked,
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
            grant: PeerGrant::Unchecked,
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
        grant: PeerGrant::Unchecked,
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
        grant: PeerGrant::Unchecked,
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

#[test]
fn certificates_decide_roles_and_ids() {
    use pushpull_proto::grant::Grant;
    let g = |name: &str| PeerGrant::Grants(Grant::of_node_name(name).unwrap());
    let mut h = H::new(2, 1);
    let d = h.cfg.digest();
    // A worker's certificate cannot register a server, nor another rank; a certificate
    // without a grant registers nothing.
    h.register_granted(1, NodeRole::Server, None, d.clone(), g("worker1"));
    h.register_granted(2, NodeRole::Worker, Some(0), d.clone(), g("worker1"));
    h.register_granted(3, NodeRole::Worker, None, d.clone(), PeerGrant::None);
    h.register_granted(4, NodeRole::Server, None, d.clone(), g("scheduler"));
    let acts = h.take();
    assert_eq!(
        refusal(&acts, 1),
        "certificate of worker 1 cannot act as a server"
    );
    assert_eq!(
        refusal(&acts, 2),
        "certificate of worker 1 cannot act as worker 0"
    );
    assert!(refusal(&acts, 3).contains("grants no pushpull role"));
    assert_eq!(
        refusal(&acts, 4),
        "certificate of the scheduler cannot act as a server"
    );
    // Worker 1's certificate gets rank 1 without asking; a second node with the same
    // certificate is refused while the first is registered.
    h.register_granted(5, NodeRole::Worker, None, d.clone(), g("worker1"));
    h.register_granted(6, NodeRole::Worker, None, d.clone(), g("worker1"));
    assert!(refusal(&h.take(), 6).contains("worker rank 1 is already taken"));
    let any = PeerGrant::Grants(Grant {
        role: NodeRole::Worker,
        id: None,
    });
    h.register_granted(7, NodeRole::Worker, None, d.clone(), any);
    h.register_granted(100, NodeRole::Server, None, d, g("server0"));
    let mut w = welcomes(&h.take());
    w.sort();
    assert_eq!(w, vec![(5, 1), (7, 0), (100, 0)]);
}

#[test]
fn an_incomplete_cluster_fails_at_the_rendezvous_timeout_naming_who_is_missing() {
    let mut h = H::new_with(3, 2, |c| c.cluster.rendezvous_timeout_ms = 60_000);
    let deadline = h.now + Duration::from_millis(60_000);
    h.register(100, NodeRole::Server, None);
    h.register(0, NodeRole::Worker, Some(0));
    h.register(1, NodeRole::Worker, Some(2));
    h.take();
    // The waiting nodes keep sending heartbeats: only the rendezvous can end the wait.
    for _ in 0..59 {
        for conn in [100, 0, 1] {
            h.msg(conn, ToScheduler::Heartbeat);
        }
        h.advance(1_000);
        assert!(h.s.next_timeout().unwrap() <= deadline);
    }
    h.advance(999);
    assert!(finish_of(&h.take()).is_none(), "not before the deadline");
    h.advance(1);
    let acts = h.take();
    let want = "rendezvous timed out after 60.0 s (cluster.rendezvous_timeout_ms): \
                2 of 3 workers registered (missing ranks [1]); \
                1 of 2 servers registered (1 missing)";
    assert_eq!(
        finish_of(&acts),
        Some(Err(JobFailure::Rendezvous(want.into())))
    );
    for conn in [100, 0, 1] {
        assert!(
            acts.contains(&Action::Send(
                conn,
                FromScheduler::Shutdown {
                    error: Some(want.into())
                }
            )),
            "{conn}: {acts:?}"
        );
        assert!(acts.contains(&Action::Close(conn)));
    }
}

#[test]
fn without_requested_ids_the_rendezvous_error_counts_the_missing() {
    let mut h = H::new_with(2, 1, |c| c.cluster.rendezvous_timeout_ms = 500);
    h.register(0, NodeRole::Worker, None);
    h.advance(500);
    let Some(Err(JobFailure::Rendezvous(msg))) = finish_of(&h.take()) else {
        panic!("no rendezvous failure")
    };
    assert!(
        msg.ends_with(
            "1 of 2 workers registered (1 missing); 0 of 1 servers registered (missing ids [0])"
        ),
        "{msg}"
    );
}

// ---------------------------------------------------------------- declare

#[test]
fn a_flood_of_bad_connections_leaves_only_the_live_nodes() {
    let (mut h, srv, wrk) = H::start(1, 1);
    h.take();
    // 400 connections that each send something other than Register (refused and closed) or
    // a frame the shell cannot read (it reports the connection gone), then end.
    for i in 0..400u64 {
        let conn = 1000 + i;
        h.ev(Event::Connected {
            conn,
            addr: waddr(7),
            grant: PeerGrant::Unchecked,
        });
        if i % 2 == 0 {
            h.msg(conn, ToScheduler::Barrier { id: i });
            assert!(refusal(&h.take(), conn).contains("first message must be Register"));
        }
        h.ev(Event::Disconnected {
            conn,
            reason: "closed".into(),
        });
        assert!(!h.s.tracks(conn), "connection {conn} kept");
    }
    assert_eq!(h.s.connection_count(), 2);
    assert!(h.s.tracks(srv[0]) && h.s.tracks(wrk[0]));
    // The job goes on.
    h.msg(wrk[0], ToScheduler::Barrier { id: 1 });
    assert!(h
        .take()
        .contains(&Action::Send(wrk[0], FromScheduler::BarrierDone { id: 1 })));
}

#[test]
fn connections_waiting_to_register_are_capped_and_must_register_first() {
    let mut h = H::new(1, 1);
    let cap = 2 * 2 + SPARE_UNREGISTERED;
    for conn in 0..cap as u64 + 3 {
        h.ev(Event::Connected {
            conn,
            addr: waddr(conn),
            grant: PeerGrant::Unchecked,
        });
    }
    let acts = h.take();
    for conn in 0..cap as u64 {
        assert!(!acts.contains(&Action::Close(conn)), "{conn} refused");
    }
    for conn in cap as u64..cap as u64 + 3 {
        assert!(
            refusal(&acts, conn).contains(&format!("{cap} connections are already waiting")),
            "{conn}"
        );
    }
    // A heartbeat before Register is refused at once; silence until the heartbeat timeout.
    h.msg(0, ToScheduler::Heartbeat);
    let r = refusal(&h.take(), 0);
    assert!(
        r.contains("first message must be Register, got Heartbeat"),
        "{r}"
    );
    h.advance(10_000);
    let r = refusal(&h.take(), 1);
    assert!(r.contains("no Register message"), "{r}");
}
