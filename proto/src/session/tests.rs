//! Tests of [`super::Session`], driven by messages and a fake clock.

use super::*;
use crate::protocol::NodeRole;

const INTERVAL: Duration = Duration::from_millis(1000);
const TIMEOUT: Duration = Duration::from_millis(3000);
const JOIN: Duration = Duration::from_millis(10_000);
const GRACE: Duration = Duration::from_millis(5000);

fn cfg(lost_grace: Option<Duration>) -> SessionConfig {
    SessionConfig {
        heartbeat_interval: INTERVAL,
        heartbeat_timeout: TIMEOUT,
        join_timeout: JOIN,
        lost_grace,
    }
}

fn registration() -> Registration {
    Registration {
        role: NodeRole::Worker,
        requested_id: Some(1),
        listen_addr: None,
        digest: Config::local(2, 1).digest(),
    }
}

/// A new session whose `Register` went out (the first output, checked here).
fn start(cfg: SessionConfig, t0: Instant) -> Session {
    let mut s = Session::new(cfg, t0, registration());
    let first = s.poll_output();
    assert!(
        matches!(first, Some(Output::Send(ToScheduler::Register { .. }))),
        "{first:?}"
    );
    s
}

fn ms(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

fn outputs(s: &mut Session) -> Vec<Output> {
    std::iter::from_fn(|| s.poll_output()).collect()
}

fn node(role: NodeRole, id: u32) -> NodeName {
    NodeName {
        role,
        id,
        addr: format!("127.0.0.1:{}", 9000 + id).parse().unwrap(),
    }
}

fn welcome() -> FromScheduler {
    FromScheduler::Welcome {
        id: 1,
        map: ClusterMap {
            servers: vec![],
            workers: vec![],
            job_seed: 42,
        },
    }
}

/// Drives the session with `handle_timeout` at every `poll_timeout` until `until`, as a shell
/// would; returns how many heartbeats it sent.
fn run_until(s: &mut Session, until: Instant) -> usize {
    let mut beats = 0;
    while let Some(t) = s.poll_timeout() {
        if t > until {
            break;
        }
        s.handle_timeout(t);
        beats += outputs(s)
            .iter()
            .filter(|o| **o == Output::Send(ToScheduler::Heartbeat))
            .count();
    }
    beats
}

#[test]
fn the_first_message_is_the_registration() {
    let reg = registration();
    let mut s = Session::new(cfg(None), Instant::now(), reg.clone());
    assert_eq!(
        outputs(&mut s),
        vec![Output::Send(ToScheduler::Register {
            version: PROTOCOL_VERSION,
            role: reg.role,
            requested_id: reg.requested_id,
            listen_addr: reg.listen_addr,
            digest: reg.digest,
        })]
    );
}

#[test]
fn heartbeats_go_out_every_interval_while_the_scheduler_speaks() {
    let t0 = Instant::now();
    let mut s = start(cfg(None), t0);
    s.handle(t0, Input::Message(welcome()));
    assert!(matches!(
        &outputs(&mut s)[..],
        [Output::Welcomed { id: 1, .. }]
    ));
    let mut beats = 0;
    // The scheduler speaks every 900 ms for 20 s: 20 heartbeats, no end.
    for k in 1..=22 {
        beats += run_until(&mut s, ms(t0, 900 * k));
        s.handle(ms(t0, 900 * k), Input::Message(FromScheduler::Heartbeat));
    }
    assert_eq!(beats, 19, "one heartbeat per interval over 19.8 s");
    assert_eq!(s.end(), None);
}

#[test]
fn silence_past_the_timeout_ends_naming_the_bound() {
    let t0 = Instant::now();
    let mut s = start(cfg(None), t0);
    s.handle(t0, Input::Message(welcome()));
    run_until(&mut s, ms(t0, 60_000));
    match s.end() {
        Some(End::SchedulerLost { reason }) => {
            assert!(
                reason.contains("3.0 s (heartbeat timeout 3.0 s)"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.poll_timeout(), None);
}

#[test]
fn before_welcome_the_join_timeout_applies() {
    let t0 = Instant::now();
    let mut s = start(cfg(None), t0);
    run_until(&mut s, ms(t0, 9_999));
    assert_eq!(s.end(), None, "silent for 9.999 s while joining is fine");
    run_until(&mut s, ms(t0, 10_000));
    assert!(matches!(s.end(), Some(End::SchedulerLost { .. })));
}

#[test]
fn the_role_gets_what_the_session_does_not_handle() {
    let t0 = Instant::now();
    let mut s = start(cfg(None), t0);
    let declared = FromScheduler::Declared {
        name: "w".into(),
        result: Err("no".into()),
    };
    let barrier = FromScheduler::BarrierDone { id: 3 };
    s.handle(t0, Input::Message(declared.clone()));
    s.handle(t0, Input::Message(barrier.clone()));
    s.handle(t0, Input::Message(welcome()));
    s.handle(t0, Input::Message(welcome()));
    let out = outputs(&mut s);
    assert_eq!(out[0], Output::Role(declared));
    assert_eq!(out[1], Output::Role(barrier));
    assert!(matches!(out[2], Output::Welcomed { .. }));
    assert_eq!(out.len(), 3, "a second Welcome is dropped: {out:?}");
}

#[test]
fn without_grace_a_lost_node_ends_at_once_and_stays_the_cause() {
    let t0 = Instant::now();
    let mut s = start(cfg(None), t0);
    let lost = node(NodeRole::Server, 1);
    s.handle(
        t0,
        Input::Message(FromScheduler::NodeLost {
            node: lost.clone(),
            reason: "killed".into(),
        }),
    );
    // What follows (the scheduler's Shutdown naming something else, its stream ending) does
    // not replace the first cause.
    s.handle(
        t0,
        Input::Message(FromScheduler::Shutdown {
            error: Some("server 0 was lost".into()),
        }),
    );
    s.handle(t0, Input::StreamEnded("closed".into()));
    assert_eq!(
        s.end(),
        Some(&End::NodeLost {
            node: lost.clone(),
            reason: "killed".into()
        })
    );
    assert_eq!(
        outputs(&mut s),
        vec![Output::NodeLost {
            node: lost,
            reason: "killed".into()
        }]
    );
}

#[test]
fn with_grace_a_lost_node_waits_for_shutdown_then_ends_by_itself() {
    let t0 = Instant::now();
    let lost = node(NodeRole::Worker, 2);
    let msg = FromScheduler::NodeLost {
        node: lost.clone(),
        reason: "silent".into(),
    };
    // Shutdown within the grace: the end names the lost node, not the Shutdown's error.
    let mut s = start(cfg(Some(GRACE)), t0);
    s.handle(t0, Input::Message(welcome()));
    s.handle(ms(t0, 100), Input::Message(msg.clone()));
    assert_eq!(s.end(), None);
    s.handle(
        ms(t0, 200),
        Input::Message(FromScheduler::Shutdown {
            error: Some("something else".into()),
        }),
    );
    assert!(matches!(s.end(), Some(End::NodeLost { node, .. }) if *node == lost));
    // No Shutdown: the session ends at the end of the grace, still naming the lost node, even
    // though the scheduler went silent meanwhile.
    let mut s = start(cfg(Some(GRACE)), t0);
    s.handle(t0, Input::Message(welcome()));
    s.handle(ms(t0, 100), Input::Message(msg));
    run_until(&mut s, ms(t0, 60_000));
    assert!(matches!(s.end(), Some(End::NodeLost { node, .. }) if *node == lost));
}

#[test]
fn the_stream_ending_is_expected_only_after_finishing() {
    let t0 = Instant::now();
    let mut s = start(cfg(None), t0);
    s.handle(t0, Input::Message(welcome()));
    s.handle(t0, Input::StreamEnded("connection lost".into()));
    assert_eq!(
        s.end(),
        Some(&End::SchedulerLost {
            reason: "connection lost".into()
        })
    );
    let mut s = start(cfg(None), t0);
    s.handle(t0, Input::Message(welcome()));
    s.finished();
    s.handle(t0, Input::StreamEnded("closed".into()));
    assert_eq!(s.end(), Some(&End::Shutdown { after_finish: true }));
}

#[test]
fn shutdown_says_whether_this_node_had_finished() {
    let t0 = Instant::now();
    let clean = FromScheduler::Shutdown { error: None };
    let mut s = start(cfg(None), t0);
    s.handle(t0, Input::Message(clean.clone()));
    assert_eq!(
        s.end(),
        Some(&End::Shutdown {
            after_finish: false
        })
    );
    let mut s = start(cfg(None), t0);
    s.finished();
    s.handle(t0, Input::Message(clean));
    assert_eq!(s.end(), Some(&End::Shutdown { after_finish: true }));
    let mut s = start(cfg(None), t0);
    s.handle(
        t0,
        Input::Message(FromScheduler::Shutdown {
            error: Some("bad".into()),
        }),
    );
    assert_eq!(
        s.end(),
        Some(&End::JobFailed {
            reason: "bad".into()
        })
    );
}

#[test]
fn refused_ends_and_nothing_is_sent_after_the_end() {
    let t0 = Instant::now();
    let mut s = start(cfg(None), t0);
    s.handle(
        t0,
        Input::Message(FromScheduler::Refused {
            reason: "full".into(),
        }),
    );
    assert_eq!(
        s.end(),
        Some(&End::Refused {
            reason: "full".into()
        })
    );
    s.handle_timeout(ms(t0, 5000));
    s.handle(t0, Input::Message(FromScheduler::BarrierDone { id: 1 }));
    assert_eq!(outputs(&mut s), vec![]);
    assert_eq!(s.poll_timeout(), None);
}
