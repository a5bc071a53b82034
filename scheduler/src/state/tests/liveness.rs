//! Barriers, heartbeats, lost nodes and the clean finish.

use super::*;

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

#[test]
fn liveness_counts_the_heartbeats_a_silent_node_missed() {
    let (mut h, srv, wrk) = H::start(2, 2);
    let everyone: Vec<ConnId> = srv.iter().chain(&wrk).copied().collect();
    let silent = wrk[1];
    // 6 s of heartbeats every 500 ms from everyone but `silent`; the scheduler's go out every
    // second, and from the one at which `silent` has been quiet for more than two intervals
    // (at 3 s) on, each counts one missed heartbeat: 3, 4, 5 and 6 s.
    for _ in 0..12 {
        h.heartbeat_all_but(&everyone, silent);
        h.advance(500);
    }
    let live = h.s.liveness(h.now);
    assert_eq!(live.len(), 4);
    let silent_name = h.s.node_name(silent).unwrap();
    for l in &live {
        if l.name == silent_name {
            assert_eq!(l.missed_heartbeats, 4, "{l:?}");
            assert_eq!(l.silent, Duration::from_millis(6000));
        } else {
            assert_eq!(l.missed_heartbeats, 0, "{l:?}");
            assert!(l.silent <= Duration::from_millis(500), "{l:?}");
        }
        assert!(!l.finished && !l.disconnected);
    }
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

#[test]
fn a_node_closing_blames_the_node_it_names() {
    // Worker 2 saw its local group lose worker 1 before the scheduler's heartbeats did: its
    // close names worker 1, who is then the one lost (the messenger only reported it).
    let (mut h, _srv, wrk) = H::start(3, 1);
    let blamed = h.s.node_name(wrk[1]).unwrap();
    h.ev(Event::Blamed {
        conn: wrk[2],
        node: blamed.clone(),
        reason: "its process ended".into(),
    });
    h.ev(Event::Disconnected {
        conn: wrk[2],
        reason: "closed".into(),
    });
    let acts = h.take();
    let Some(Err(JobFailure::NodeLost { node, reason })) = finish_of(&acts) else {
        panic!("{acts:?}")
    };
    assert_eq!(node, blamed);
    assert!(
        reason.contains("its process ended") && reason.contains("reported by worker 2"),
        "{reason}"
    );
    // A node blamed by a stranger, or a name that is no member, changes nothing.
    let (mut h, _srv, wrk) = H::start(2, 1);
    let mut nobody = h.s.node_name(wrk[1]).unwrap();
    nobody.id = 7;
    h.ev(Event::Blamed {
        conn: wrk[0],
        node: nobody,
        reason: "?".into(),
    });
    assert!(finish_of(&h.take()).is_none());
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
