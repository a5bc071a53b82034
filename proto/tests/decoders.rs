//! Fuzzing every decoder of network bytes in this crate, over fresh random inputs (seed
//! printed; replay with PUSHPULL_TEST_SEED): the data-frame header ([`FrameHeader::decode`],
//! against a reference decoder written from the layout table in `protocol.rs`), control frames
//! ([`check_control_len`], [`decode_control`] of [`ToScheduler`] and [`FromScheduler`]) and
//! close reasons ([`Departure::from_close`]).
//!
//! Inputs: arbitrary bytes; valid encodings with bytes overwritten, cut or inserted; and length
//! fields claiming far more bytes than the frame holds (which once made bincode try to allocate
//! them, aborting the node). Checked: no panic or abort; a refused input is a named error (the
//! header's field, the message type); an accepted control message encodes back to a frame
//! that decodes to it; a close reason reads as its code says.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use pushpull_proto::config::ClusterDigest;
use pushpull_proto::departure::Departure;
use pushpull_proto::protocol::{
    check_control_len, decode_control, encode_control, ChunkPlacement, ClusterMap, FrameFlags,
    FrameHeader, FrameKind, FromScheduler, ProtocolError, ReduceOp, TensorPlacement, ToScheduler,
    FRAME_HEADER_LEN, MAX_CONTROL_FRAME,
};
use pushpull_proto::{NodeName, NodeRole};

/// The test seed: `PUSHPULL_TEST_SEED` if set, else the clock; printed so a failure can be
/// replayed with `PUSHPULL_TEST_SEED=<seed> cargo test ...`.
fn seed(test: &str) -> u64 {
    let s = match std::env::var("PUSHPULL_TEST_SEED") {
        Ok(v) => v.parse().expect("PUSHPULL_TEST_SEED must be a u64"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos() as u64,
    };
    eprintln!("{test}: seed = {s} (replay with PUSHPULL_TEST_SEED={s})");
    s
}

fn prop_config(test: &str, cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed(test)),
        failure_persistence: None,
        ..Config::default()
    }
}

/// SplitMix64, for the messages and mutations a case derives from its own seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
    fn text(&mut self) -> String {
        let len = self.below(12) as usize;
        (0..len)
            .map(|_| ['a', 'Z', '0', '.', ' ', 'é', '∑', '\0'][self.below(8) as usize])
            .collect()
    }
    fn addr(&mut self) -> SocketAddr {
        if self.below(2) == 0 {
            let [a, b, c, d, ..] = self.next().to_le_bytes();
            SocketAddr::from(([a, b, c, d], self.next() as u16))
        } else {
            SocketAddr::from((
                <[u8; 16]>::try_from(self.bytes(16)).unwrap(),
                self.next() as u16,
            ))
        }
    }
    fn params(&mut self) -> BTreeMap<String, String> {
        (0..self.below(3))
            .map(|_| (self.text(), self.text()))
            .collect()
    }
    fn node(&mut self) -> NodeName {
        NodeName {
            role: [NodeRole::Scheduler, NodeRole::Server, NodeRole::Worker][self.below(3) as usize],
            id: self.next() as u32,
            addr: self.addr(),
        }
    }
    fn opt<T>(&mut self, f: impl FnOnce(&mut Rng) -> T) -> Option<T> {
        (self.below(2) == 0).then(|| f(self))
    }
    fn placement(&mut self) -> TensorPlacement {
        TensorPlacement {
            name: self.text(),
            len: self.next(),
            params: self.params(),
            priority: self.next() as i32,
            chunks: (0..self.below(4))
                .map(|_| ChunkPlacement {
                    key: self.next(),
                    offset: self.next() >> self.below(64),
                    len: self.next() >> self.below(64),
                    server: self.below(8) as u32,
                })
                .collect(),
        }
    }
}

/// Every variant of [`ToScheduler`], with random fields.
fn to_scheduler(r: &mut Rng) -> ToScheduler {
    match r.below(6) {
        0 => ToScheduler::Register {
            version: r.next() as u32,
            role: r.node().role,
            requested_id: r.opt(|r| r.next() as u32),
            listen_addr: r.opt(Rng::addr),
            digest: ClusterDigest {
                num_workers: r.next() as u32,
                num_servers: r.next() as u32,
                partition_bytes: r.next(),
                max_chunk_payload_bytes: r.next(),
                min_compress_bytes: r.next(),
                seed: r.opt(Rng::next),
                heartbeat_interval_ms: r.next() >> 40,
                heartbeat_timeout_ms: r.next() >> 40,
                send_window_bytes: r.next(),
                max_udp_payload: r.next() as u16,
                local_size: r.next() as u32,
                force_distributed: r.next() % 2 == 1,
                server_name: r.text(),
                gossip_mixing: (0..r.below(3))
                    .map(|_| (0..r.below(3)).map(|_| r.next()).collect())
                    .collect(),
                gossip_gamma: r.next(),
                tensors: (0..r.below(3)).map(|_| (r.text(), r.params())).collect(),
            },
        },
        1 => ToScheduler::Declare {
            name: r.text(),
            len: r.next(),
            params: r.params(),
            priority: r.opt(|r| r.next() as i32),
        },
        2 => ToScheduler::PlacementAck {
            name: r.text(),
            error: r.opt(Rng::text),
        },
        3 => ToScheduler::Barrier { id: r.next() },
        4 => ToScheduler::Heartbeat,
        _ => ToScheduler::Finished,
    }
}

/// Every variant of [`FromScheduler`], with random fields.
fn from_scheduler(r: &mut Rng) -> FromScheduler {
    match r.below(8) {
        0 => FromScheduler::Welcome {
            id: r.next() as u32,
            map: ClusterMap {
                servers: (0..r.below(3)).map(|_| r.addr()).collect(),
                workers: (0..r.below(3)).map(|_| r.addr()).collect(),
                job_seed: r.next(),
            },
        },
        1 => FromScheduler::Refused { reason: r.text() },
        2 => FromScheduler::Placement(r.placement()),
        3 => FromScheduler::Declared {
            name: r.text(),
            result: if r.below(2) == 0 {
                Ok(r.placement())
            } else {
                Err(r.text())
            },
        },
        4 => FromScheduler::BarrierDone { id: r.next() },
        5 => FromScheduler::Heartbeat,
        6 => FromScheduler::NodeLost {
            node: r.node(),
            reason: r.text(),
        },
        _ => FromScheduler::Shutdown {
            error: r.opt(Rng::text),
        },
    }
}

/// A bincode varint claiming a huge length: the u64 marker (253) and 8 bytes.
fn huge_varint(r: &mut Rng) -> Vec<u8> {
    let claim = [
        u64::MAX,
        1 << 62,
        1 << 40,
        u64::from(MAX_CONTROL_FRAME) + 1,
        r.next(),
    ][r.below(5) as usize];
    let mut v = vec![253u8];
    v.extend_from_slice(&claim.to_le_bytes());
    v
}

/// `good` mutated in one of the ways the module docs list, or arbitrary bytes.
fn mutate(good: &[u8], r: &mut Rng) -> Vec<u8> {
    let mut p = good.to_vec();
    match r.below(5) {
        0 => {
            let len = r.below(300) as usize;
            r.bytes(len)
        }
        1 => {
            for _ in 0..1 + r.below(3) {
                if !p.is_empty() {
                    let i = r.below(p.len() as u64) as usize;
                    p[i] = [0x00, 0xff, 0x7f, 0x80, 251, 252, 253, r.next() as u8]
                        [r.below(8) as usize];
                }
            }
            p
        }
        2 => {
            p.truncate(r.below(p.len() as u64 + 1) as usize);
            p
        }
        3 => {
            let i = r.below(p.len() as u64 + 1) as usize;
            let len = 1 + r.below(8) as usize;
            let ins = r.bytes(len);
            p.splice(i..i, ins);
            p
        }
        // A huge length claim at a random position (over the byte there, or inserted).
        _ => {
            let i = r.below(p.len() as u64 + 1) as usize;
            let end = if r.below(2) == 0 {
                i
            } else {
                (i + 1).min(p.len())
            };
            p.splice(i..end, huge_varint(r));
            p
        }
    }
}

/// The layout table of `protocol.rs`, read directly.
fn reference_header(b: &[u8], max: u64) -> Result<FrameHeader, ProtocolError> {
    if b.len() < FRAME_HEADER_LEN {
        return Err(ProtocolError::TruncatedHeader { got: b.len() });
    }
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    if &b[..4] != b"PPF1" {
        return Err(ProtocolError::BadMagic {
            got: b[..4].try_into().unwrap(),
        });
    }
    let kind = [
        FrameKind::Hello,
        FrameKind::Push,
        FrameKind::Result,
        FrameKind::Abort,
        FrameKind::StateGet,
        FrameKind::StatePut,
        FrameKind::State,
    ]
    .into_iter()
    .find(|k| *k as u8 == b[4])
    .ok_or(ProtocolError::BadKind(b[4]))?;
    let op = [ReduceOp::Sum, ReduceOp::Broadcast, ReduceOp::Gossip]
        .into_iter()
        .find(|o| *o as u8 == b[5])
        .ok_or(ProtocolError::BadOp(b[5]))?;
    let payload_len = u64_at(32);
    if payload_len > max {
        return Err(ProtocolError::Oversized {
            len: payload_len,
            max,
        });
    }
    let bits = u16::from_le_bytes([b[6], b[7]]);
    let sum_push = kind == FrameKind::Push && op == ReduceOp::Sum;
    let (non_finite, undo_previous) = (bits & 1 != 0, bits & 2 != 0);
    let why = if bits > 3 {
        Some("unknown bits (known: 0x0001 non-finite, 0x0002 undo previous)")
    } else if non_finite && !(sum_push || kind == FrameKind::Result) {
        Some("only a sum push or a result can be non-finite")
    } else if non_finite && payload_len != 0 {
        Some("a non-finite frame carries no payload")
    } else if undo_previous && !(sum_push || kind == FrameKind::StateGet) {
        Some("only a sum push or a StateGet can undo the previous round")
    } else {
        None
    };
    if let Some(why) = why {
        return Err(ProtocolError::BadFlags { flags: bits, why });
    }
    Ok(FrameHeader {
        kind,
        op,
        flags: FrameFlags {
            non_finite,
            undo_previous,
        },
        rank: u32_at(8),
        aux: u32_at(12),
        key: u64_at(16),
        round: u64_at(24),
        payload_len,
    })
}

#[test]
fn frame_headers_decode_as_the_layout_says_and_refusals_name_the_field() {
    let strat = (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..64));
    let name = "frame_headers_decode_as_the_layout_says_and_refusals_name_the_field";
    proptest!(prop_config(name, 20_000), |((s, arbitrary) in strat)| {
        let mut r = Rng(s);
        let max = [0, 1 << 20, u64::MAX, r.next()][r.below(4) as usize];
        let bytes = if r.below(3) == 0 {
            arbitrary
        } else {
            // A valid header (kind and op drawn past the valid ones now and then), mutated.
            let mut h = FrameHeader {
                kind: [FrameKind::Hello, FrameKind::Push, FrameKind::Result, FrameKind::Abort, FrameKind::StateGet][r.below(5) as usize],
                op: [ReduceOp::Sum, ReduceOp::Broadcast, ReduceOp::Gossip][r.below(3) as usize],
                flags: FrameFlags::default(),
                rank: r.next() as u32,
                aux: r.next() as u32,
                key: r.next(),
                round: r.next(),
                payload_len: r.next() >> r.below(64),
            };
            // Flags where the frame allows them.
            let sum_push = h.kind == FrameKind::Push && h.op == ReduceOp::Sum;
            if (sum_push || h.kind == FrameKind::Result) && r.below(4) == 0 {
                h.flags.non_finite = true;
                h.payload_len = 0;
            }
            h.flags.undo_previous =
                (sum_push || h.kind == FrameKind::StateGet) && r.below(4) == 0;
            let mut b = h.to_bytes().to_vec();
            prop_assert_eq!(FrameHeader::decode(&b, u64::MAX), Ok(h));
            for _ in 0..r.below(3) {
                let i = r.below(b.len() as u64 + 4) as usize;
                if i < b.len() {
                    b[i] = r.next() as u8;
                } else {
                    b.truncate(r.below(b.len() as u64 + 1) as usize);
                }
            }
            b
        };
        let got = FrameHeader::decode(&bytes, max);
        prop_assert_eq!(&got, &reference_header(&bytes, max), "{:02x?}", bytes);
        if let Err(e) = got {
            let field = match e {
                ProtocolError::TruncatedHeader { .. } => "frame header",
                ProtocolError::BadMagic { .. } => "magic",
                ProtocolError::BadKind(_) => "frame kind",
                ProtocolError::BadOp(_) => "reduce op",
                ProtocolError::BadFlags { .. } => "frame flags",
                ProtocolError::Oversized { .. } => "payload",
                ref other => panic!("unexpected {other:?}"),
            };
            prop_assert!(e.to_string().contains(field), "{}", e);
        }
    });
}

/// Decodes `body` as `T`: an accepted message must re-encode to a frame that decodes to it, a
/// refused one be a `Malformed` naming `T`.
fn check_control<T>(body: &[u8], type_name: &str) -> Result<(), TestCaseError>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    match decode_control::<T>(body) {
        Ok(m) => {
            let frame = encode_control(&m).unwrap();
            prop_assert_eq!(&decode_control::<T>(&frame[4..]).unwrap(), &m);
        }
        Err(e) => {
            prop_assert!(matches!(e, ProtocolError::Malformed(_)), "{:?}", e);
            let want = format!("malformed control message: {type_name}: ");
            prop_assert!(e.to_string().starts_with(&want), "{}", e);
        }
    }
    Ok(())
}

#[test]
fn control_frames_refuse_garbage_by_message_type() {
    let name = "control_frames_refuse_garbage_by_message_type";
    proptest!(prop_config(name, 20_000), |(s in any::<u64>(), len in any::<u32>())| {
        let mut r = Rng(s);
        // The length prefix.
        match check_control_len(len) {
            Ok(n) => prop_assert!(len <= MAX_CONTROL_FRAME && n == len as usize),
            Err(e) => {
                prop_assert!(len > MAX_CONTROL_FRAME);
                prop_assert!(e.to_string().contains("exceeds the limit"), "{}", e);
            }
        }
        // The body, from a valid message of either direction.
        let good = if r.below(2) == 0 {
            encode_control(&to_scheduler(&mut r)).unwrap()
        } else {
            encode_control(&from_scheduler(&mut r)).unwrap()
        };
        let body = mutate(&good[4..], &mut r);
        check_control::<ToScheduler>(&body, "ToScheduler")?;
        check_control::<FromScheduler>(&body, "FromScheduler")?;
    });
}

#[test]
fn close_reasons_read_as_their_code_says() {
    let name = "close_reasons_read_as_their_code_says";
    proptest!(prop_config(name, 20_000), |(s in any::<u64>())| {
        let mut r = Rng(s);
        let code = if r.below(4) == 0 { r.next() } else { r.below(6) };
        let lost = Departure::NodeLost { node: r.node(), reason: r.text() };
        let bytes = if r.below(4) == 0 { lost.reason() } else { mutate(&lost.reason(), &mut r) };
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let d = Departure::from_close(code, &bytes);
        match code {
            0 => prop_assert_eq!(d, Departure::Done(text)),
            1 => prop_assert_eq!(d, Departure::Refused(text)),
            4 => prop_assert_eq!(d, Departure::JobFailed(text)),
            3 => match d {
                // Accepted: a node name and reason that read back as themselves.
                Departure::NodeLost { .. } => {
                    prop_assert_eq!(Departure::from_close(3, &d.reason()), d.clone());
                    if bytes == lost.reason() {
                        prop_assert_eq!(d, lost);
                    }
                }
                other => {
                    prop_assert!(bytes != lost.reason(), "a valid reason was refused");
                    prop_assert_eq!(other, Departure::Failed(text));
                }
            },
            _ => prop_assert_eq!(d, Departure::Failed(text)),
        }
    });
}

/// Each length field of each message, claiming 2^62 bytes (or more than a frame) where the
/// frame holds a few: refused by name, nothing allocated. Before the limit in
/// `protocol::bincode_config` these aborted the process ("memory allocation of … bytes
/// failed"), as the former `protocol::tests::control_decode_never_panics` did with
/// PROPTEST_RNG_SEED=15914815323866399232.
#[test]
fn huge_length_claims_are_refused_without_allocating() {
    let claims = [u64::MAX, 1 << 62, 1 << 40, u64::from(MAX_CONTROL_FRAME) + 1];
    for claim in claims {
        let mut huge = vec![253u8];
        huge.extend_from_slice(&claim.to_le_bytes());
        let with = |prefix: &[u8]| [prefix, &huge[..], b"abc"].concat();
        // FromScheduler::Refused { reason }, Placement { name, .. }, Welcome { servers, .. }.
        for body in [with(&[1]), with(&[2]), with(&[0, 0])] {
            let e = decode_control::<FromScheduler>(&body).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("malformed control message: FromScheduler: "),
                "{e}"
            );
        }
        // ToScheduler::Declare { name, .. }, PlacementAck { name, .. }.
        for body in [with(&[1]), with(&[2])] {
            let e = decode_control::<ToScheduler>(&body).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("malformed control message: ToScheduler: "),
                "{e}"
            );
        }
        // A close reason whose reason string claims that much.
        let node = NodeName {
            role: NodeRole::Server,
            id: 1,
            addr: "10.0.0.2:7001".parse().unwrap(),
        };
        let good = Departure::NodeLost {
            node,
            reason: String::new(),
        }
        .reason();
        let bad = [&good[..good.len() - 1], &huge[..], b"abc"].concat();
        assert!(matches!(
            Departure::from_close(3, &bad),
            Departure::Failed(_)
        ));
    }
    // A claim beyond the limit says so.
    let mut body = vec![1u8, 253];
    body.extend_from_slice(&(1u64 << 62).to_le_bytes());
    let e = decode_control::<FromScheduler>(&body)
        .unwrap_err()
        .to_string();
    assert!(e.contains("length field claims more than"), "{e}");
}
