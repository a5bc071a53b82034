//! [`RoundCore`] driven by hand: no sockets, no runtime, time passed in.

use super::*;
use pushpull_proto::placement::mix64;
use pushpull_proto::protocol::{ChunkPlacement, TensorPlacement};
use pushpull_proto::{NodeName, NodeRole, ParamMap};

/// SplitMix64, seeded from the clock unless `PUSHPULL_TEST_SEED` is set; the seed is printed.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let seed = std::env::var("PUSHPULL_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
                now.map_or(1, |d| d.as_nanos() as u64)
            });
        println!("seed {seed} (set PUSHPULL_TEST_SEED to repeat)");
        Rng(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

fn placement(chunks: usize, servers: u32) -> TensorPlacement {
    TensorPlacement {
        name: "w".into(),
        len: 10 * chunks as u64,
        params: ParamMap::new(),
        priority: 0,
        chunks: (0..chunks as u64)
            .map(|i| ChunkPlacement {
                key: 0x1000 + i,
                offset: 10 * i,
                len: 10,
                server: (i % u64::from(servers)) as u32,
            })
            .collect(),
    }
}

fn names(servers: u32) -> Vec<NodeName> {
    (0..servers)
        .map(|id| NodeName {
            role: NodeRole::Server,
            id,
            addr: ([10, 0, 0, 1], 9100 + id as u16).into(),
        })
        .collect()
}

const GRACE: Duration = Duration::from_millis(500);

fn spec<'a>(p: &'a TensorPlacement, servers: &'a [NodeName], kind: RoundKind) -> RoundSpec<'a> {
    RoundSpec {
        placement: p,
        servers,
        rank: 1,
        round: 7,
        kind,
        learning_rate: 0.5f32.to_bits(),
        undo_previous: false,
        delegated: false,
        grace: GRACE,
    }
}

const SUM: RoundKind = RoundKind::Sum { average: true };

fn lost() -> WorkerError {
    WorkerError::NodeLost {
        node: NodeName {
            role: NodeRole::Worker,
            id: 0,
            addr: ([10, 0, 0, 2], 5000).into(),
        },
        reason: "connection lost".into(),
    }
}

fn payload(chunk: usize) -> Bytes {
    Bytes::from(vec![chunk as u8; 3])
}

/// Drains the core's actions, answering each encode with a payload of the chunk's byte;
/// returns every action that asks for something outside (pushes, decodes, delegations, the
/// end).
fn drain(core: &mut RoundCore<'_>, now: Instant) -> Vec<Action> {
    let mut out = Vec::new();
    while let Some(action) = core.poll_action() {
        match action {
            Action::Encode { chunk } => {
                let result = Ok(Encoded::Payload(payload(chunk)));
                core.handle(now, Event::Encoded { chunk, result });
            }
            other => out.push(other),
        }
    }
    out
}

fn finished(actions: Vec<Action>) -> Finished {
    match actions.into_iter().last() {
        Some(Action::Finish(f)) => f,
        other => panic!("expected the round's end, got {other:?}"),
    }
}

#[test]
fn chunks_are_encoded_and_pushed_one_after_another() {
    let (p, s) = (placement(3, 2), names(2));
    let mut core = RoundCore::new(RoundSpec {
        undo_previous: true,
        ..spec(&p, &s, SUM)
    });
    let mut order = Vec::new();
    while let Some(action) = core.poll_action() {
        match action {
            Action::Encode { chunk } => {
                order.push(format!("encode {chunk}"));
                let result = Ok(Encoded::Payload(payload(chunk)));
                core.handle(Instant::now(), Event::Encoded { chunk, result });
            }
            Action::Push {
                chunk,
                header,
                payload: bytes,
            } => {
                order.push(format!("push {chunk}"));
                assert_eq!(header.kind, FrameKind::Push);
                assert_eq!(header.op, ReduceOp::Sum);
                assert_eq!(
                    header.aux,
                    0.5f32.to_bits(),
                    "a sum carries the learning rate"
                );
                assert_eq!((header.rank, header.round), (1, 7));
                assert_eq!(header.key, 0x1000 + chunk as u64);
                assert!(header.flags.undo_previous && !header.flags.non_finite);
                assert_eq!(bytes, payload(chunk));
                assert_eq!(header.payload_len, 3);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        order,
        ["encode 0", "push 0", "encode 1", "push 1", "encode 2", "push 2"]
    );
}

#[test]
fn a_broadcasts_non_root_pushes_empty_and_decodes_in_any_order() {
    let mut rng = Rng::seeded();
    let n = 2 + rng.below(30);
    let (p, s) = (placement(n, 3), names(3));
    let kind = RoundKind::Broadcast { root: 0 };
    let mut core = RoundCore::new(spec(&p, &s, kind));
    let now = Instant::now();
    let pushes = drain(&mut core, now);
    assert_eq!(pushes.len(), n, "one push per chunk, nothing encoded");
    for action in &pushes {
        let Action::Push {
            header, payload, ..
        } = action
        else {
            panic!("unexpected {action:?}");
        };
        assert!(payload.is_empty());
        assert_eq!((header.op, header.aux), (ReduceOp::Broadcast, 0));
        assert!(!header.flags.undo_previous, "only a sum carries an undo");
    }
    let mut order: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut order);
    for (i, &chunk) in order.iter().enumerate() {
        let outcome = Outcome::Result(payload(chunk));
        core.handle(now, Event::Outcome { chunk, outcome });
        let actions = drain(&mut core, now);
        match &actions[..] {
            [Action::Decode {
                chunk: c,
                payload: b,
            }] => {
                assert_eq!((*c, b), (chunk, &payload(chunk)))
            }
            other => panic!("expected the decode of {chunk}, got {other:?}"),
        }
        core.handle(
            now,
            Event::Decoded {
                chunk,
                result: Ok(()),
            },
        );
        let actions = drain(&mut core, now);
        if i + 1 < n {
            assert!(actions.is_empty(), "{actions:?}");
        } else {
            let f = finished(actions);
            assert!(f.result.is_ok() && !f.non_finite);
        }
    }
}

#[test]
fn an_empty_tensor_finishes_at_once() {
    let (p, s) = (placement(0, 1), names(1));
    let f = finished(drain(
        &mut RoundCore::new(spec(&p, &s, SUM)),
        Instant::now(),
    ));
    assert!(f.result.is_ok());
}

#[test]
fn an_abort_waits_for_the_jobs_loss_then_is_the_error() {
    let (p, s) = (placement(2, 2), names(2));
    let t0 = Instant::now();
    for lost_in_time in [false, true] {
        let mut core = RoundCore::new(spec(&p, &s, SUM));
        drain(&mut core, t0);
        let outcome = Outcome::Abort("rank 0 pushed 3 bytes".into());
        core.handle(t0, Event::Outcome { chunk: 1, outcome });
        assert!(drain(&mut core, t0).is_empty(), "chunk 0 is still open");
        assert_eq!(core.poll_timeout(), None);
        let outcome = Outcome::Result(payload(0));
        core.handle(t0, Event::Outcome { chunk: 0, outcome });
        drain(&mut core, t0);
        core.handle(
            t0,
            Event::Decoded {
                chunk: 0,
                result: Ok(()),
            },
        );
        assert!(drain(&mut core, t0).is_empty(), "the abort waits");
        assert_eq!(core.poll_timeout(), Some(t0 + GRACE));
        core.handle_timeout(t0 + GRACE - Duration::from_millis(1));
        assert!(drain(&mut core, t0).is_empty(), "not yet due");
        let f = if lost_in_time {
            core.handle(t0 + GRACE / 2, Event::Lost(lost()));
            finished(drain(&mut core, t0))
        } else {
            core.handle_timeout(t0 + GRACE);
            finished(drain(&mut core, t0))
        };
        let e = f.result.unwrap_err();
        if lost_in_time {
            assert_eq!(e, lost());
        } else {
            let text = e.to_string();
            assert!(
                matches!(
                    e,
                    WorkerError::Aborted {
                        chunk: 1,
                        round: 7,
                        ..
                    }
                ),
                "{e}"
            );
            assert!(text.contains("server 1 (10.0.0.1:9101)"), "{text}");
            assert!(text.contains("rank 0 pushed 3 bytes"), "{text}");
        }
        assert_eq!(core.poll_timeout(), None);
    }
}

#[test]
fn without_a_grace_an_abort_ends_the_round_with_its_last_chunk() {
    let (p, s) = (placement(1, 1), names(1));
    let mut core = RoundCore::new(RoundSpec {
        grace: Duration::ZERO,
        ..spec(&p, &s, SUM)
    });
    let now = Instant::now();
    drain(&mut core, now);
    let outcome = Outcome::Abort("bad".into());
    core.handle(now, Event::Outcome { chunk: 0, outcome });
    let e = finished(drain(&mut core, now)).result.unwrap_err();
    assert!(matches!(e, WorkerError::Aborted { .. }), "{e}");
}

#[test]
fn the_jobs_loss_ends_the_round_at_once_and_later_events_change_nothing() {
    let (p, s) = (placement(4, 2), names(2));
    let mut core = RoundCore::new(spec(&p, &s, SUM));
    let now = Instant::now();
    drain(&mut core, now);
    core.handle(now, Event::Lost(lost()));
    let f = finished(drain(&mut core, now));
    assert_eq!(f.result.unwrap_err(), lost());
    let outcome = Outcome::Result(payload(0));
    core.handle(now, Event::Outcome { chunk: 0, outcome });
    core.handle_timeout(now + GRACE * 10);
    assert!(core.poll_action().is_none());
}

#[test]
fn a_failed_encoding_is_pushed_empty_and_reported_after_the_outcome() {
    let (p, s) = (placement(2, 1), names(1));
    let mut core = RoundCore::new(spec(&p, &s, SUM));
    let now = Instant::now();
    let Some(Action::Encode { chunk: 0 }) = core.poll_action() else {
        panic!("chunk 0 is encoded first");
    };
    let bad = DataError::Mismatch("wrong shape".into());
    core.handle(
        now,
        Event::Encoded {
            chunk: 0,
            result: Err(bad),
        },
    );
    match core.poll_action() {
        Some(Action::Push {
            header, payload, ..
        }) => {
            assert!(payload.is_empty() && header.payload_len == 0);
            assert!(!header.flags.non_finite);
        }
        other => panic!("expected chunk 0's empty push, got {other:?}"),
    }
    drain(&mut core, now);
    // Even a result (a server would abort) does not hide this worker's own failure.
    for chunk in [0, 1] {
        let outcome = Outcome::Result(payload(chunk));
        core.handle(now, Event::Outcome { chunk, outcome });
    }
    let decodes = drain(&mut core, now);
    assert!(
        matches!(&decodes[..], [Action::Decode { chunk: 1, .. }]),
        "{decodes:?}"
    );
    core.handle(
        now,
        Event::Decoded {
            chunk: 1,
            result: Ok(()),
        },
    );
    let e = finished(drain(&mut core, now)).result.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, WorkerError::Codec { chunk: 0, .. }), "{text}");
    assert!(
        text.contains("encoding this worker's data: wrong shape"),
        "{text}"
    );
}

#[test]
fn a_non_finite_chunk_is_flagged_and_a_non_finite_sum_fills_with_nan() {
    let (p, s) = (placement(2, 1), names(1));
    let mut core = RoundCore::new(spec(&p, &s, SUM));
    let now = Instant::now();
    core.poll_action();
    let result = Ok(Encoded::NonFinite("inf at element 3".into()));
    core.handle(now, Event::Encoded { chunk: 0, result });
    match core.poll_action() {
        Some(Action::Push {
            header, payload, ..
        }) => assert!(header.flags.non_finite && payload.is_empty()),
        other => panic!("expected chunk 0's flagged push, got {other:?}"),
    }
    drain(&mut core, now);
    for chunk in [1, 0] {
        core.handle(
            now,
            Event::Outcome {
                chunk,
                outcome: Outcome::NonFinite,
            },
        );
        let fills = drain(&mut core, now);
        assert!(
            matches!(&fills[..], [Action::FillNonFinite { chunk: c }] if *c == chunk),
            "{fills:?}"
        );
        core.handle(
            now,
            Event::Decoded {
                chunk,
                result: Ok(()),
            },
        );
    }
    let f = finished(drain(&mut core, now));
    assert!(f.result.is_ok() && f.non_finite);
}

#[test]
fn a_non_finite_broadcast_names_its_server() {
    let (p, s) = (placement(1, 1), names(1));
    let kind = RoundKind::Broadcast { root: 1 };
    let mut core = RoundCore::new(spec(&p, &s, kind));
    let now = Instant::now();
    let pushes = drain(&mut core, now);
    assert!(matches!(&pushes[..], [Action::Push { payload: b, .. }] if b == &payload(0)));
    core.handle(
        now,
        Event::Outcome {
            chunk: 0,
            outcome: Outcome::NonFinite,
        },
    );
    let e = finished(drain(&mut core, now)).result.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("server 0 (10.0.0.1:9100) sent a non-finite result for a broadcast"),
        "{text}"
    );
}

#[test]
fn delegated_chunks_start_together_and_a_lost_member_ends_the_round() {
    let (p, s) = (placement(3, 1), names(1));
    let now = Instant::now();
    let mut core = RoundCore::new(RoundSpec {
        delegated: true,
        ..spec(&p, &s, SUM)
    });
    let started = drain(&mut core, now);
    let chunks: Vec<usize> = started
        .iter()
        .map(|a| match a {
            Action::Delegate { chunk } => *chunk,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(chunks, [0, 1, 2]);
    core.handle(
        now,
        Event::Done {
            chunk: 2,
            result: Ok(Pulled::Sum),
        },
    );
    let member = WorkerError::MemberLost {
        rank: 0,
        local_rank: 0,
        host: 0,
        reason: "gone".into(),
    };
    core.handle(
        now,
        Event::Done {
            chunk: 0,
            result: Err(member.clone()),
        },
    );
    assert_eq!(finished(drain(&mut core, now)).result.unwrap_err(), member);
}

/// What a chunk's round does in [`random_rounds_end_as_a_plain_model_says`].
#[derive(Clone, Copy, Debug)]
enum Fate {
    Sum,
    NonFiniteSum,
    Abort,
    DecodeFails,
    EncodeFails,
}

/// Random rounds (chunks, fates, the order outcomes arrive in) against a plain model of how a
/// round ends: the first failure in the order the chunks end, an abort after the grace, the
/// non-finite flag only for a round whose every chunk ended.
#[test]
fn random_rounds_end_as_a_plain_model_says() {
    let mut rng = Rng::seeded();
    let fates = [
        Fate::Sum,
        Fate::NonFiniteSum,
        Fate::Abort,
        Fate::DecodeFails,
        Fate::EncodeFails,
    ];
    for _ in 0..500 {
        let n = 1 + rng.below(12);
        let (p, s) = (placement(n, 1 + rng.below(4) as u32), names(4));
        let fate: Vec<Fate> = (0..n)
            .map(|_| {
                if rng.below(3) == 0 {
                    fates[rng.below(fates.len())]
                } else {
                    Fate::Sum
                }
            })
            .collect();
        let now = Instant::now();
        let mut core = RoundCore::new(spec(&p, &s, SUM));
        while let Some(action) = core.poll_action() {
            match action {
                Action::Encode { chunk } => {
                    let result = match fate[chunk] {
                        Fate::EncodeFails => Err(DataError::Mismatch("no".into())),
                        _ => Ok(Encoded::Payload(payload(chunk))),
                    };
                    core.handle(now, Event::Encoded { chunk, result });
                }
                Action::Push { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        let mut order: Vec<usize> = (0..n).collect();
        rng.shuffle(&mut order);
        let mut end = None;
        let mut model_error: Option<&'static str> = None;
        for &chunk in &order {
            let outcome = match fate[chunk] {
                Fate::NonFiniteSum => Outcome::NonFinite,
                Fate::Abort => Outcome::Abort("bad push".into()),
                _ => Outcome::Result(payload(chunk)),
            };
            core.handle(now, Event::Outcome { chunk, outcome });
            while let Some(action) = core.poll_action() {
                match action {
                    Action::Decode { chunk, .. } => {
                        let result = match fate[chunk] {
                            Fate::DecodeFails => Err(DataError::Mismatch("short".into())),
                            _ => Ok(()),
                        };
                        core.handle(now, Event::Decoded { chunk, result });
                    }
                    Action::FillNonFinite { chunk } => core.handle(
                        now,
                        Event::Decoded {
                            chunk,
                            result: Ok(()),
                        },
                    ),
                    Action::Finish(f) => end = Some(f),
                    other => panic!("unexpected {other:?}"),
                }
            }
            let failed = match fate[chunk] {
                Fate::Abort => Some("aborted"),
                Fate::DecodeFails => Some("decoding the result from"),
                Fate::EncodeFails => Some("encoding this worker's data"),
                Fate::Sum | Fate::NonFiniteSum => None,
            };
            model_error = model_error.or(failed);
        }
        if model_error == Some("aborted") {
            assert!(end.is_none(), "an abort waits for the grace");
            core.handle_timeout(now + GRACE);
            end = match core.poll_action() {
                Some(Action::Finish(f)) => Some(f),
                other => panic!("expected the end after the grace, got {other:?}"),
            };
        }
        let end = end.expect("every chunk ended");
        match (model_error, end.result) {
            (None, Ok(())) => {}
            (Some(what), Err(e)) => assert!(e.to_string().contains(what), "{fate:?}: {e}"),
            (model, got) => panic!("{fate:?} in {order:?}: model {model:?}, got {got:?}"),
        }
        let any_non_finite = fate.iter().any(|f| matches!(f, Fate::NonFiniteSum));
        assert_eq!(end.non_finite, any_non_finite, "{fate:?}");
    }
}
