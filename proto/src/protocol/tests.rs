//! Tests of the protocol's messages and frame headers.

use super::*;

#[test]
fn workers_on_a_host_are_those_with_its_address() {
    let addr = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
    let map = ClusterMap {
        servers: vec![addr("10.0.0.9:9000")],
        workers: vec![
            addr("10.0.0.1:5000"),
            addr("10.0.0.2:5000"),
            addr("10.0.0.1:5001"),
            addr("10.0.0.1:5002"),
        ],
        job_seed: 0,
    };
    assert_eq!(
        (0..4).map(|r| map.workers_on_host(r)).collect::<Vec<_>>(),
        [3, 1, 3, 3]
    );
    // A rank the map does not hold: alone.
    assert_eq!(map.workers_on_host(7), 1);
}

fn header() -> FrameHeader {
    FrameHeader {
        kind: FrameKind::Push,
        op: ReduceOp::Broadcast,
        flags: FrameFlags::default(),
        rank: 3,
        aux: 1,
        key: 0xdead_beef_0123_4567,
        round: 7,
        payload_len: 5 << 32, // beyond 4 GiB: lengths are 64-bit
    }
}

#[test]
fn header_round_trips_with_64_bit_lengths() {
    let h = header();
    let b = h.to_bytes();
    assert_eq!(b.len(), FRAME_HEADER_LEN);
    assert_eq!(FrameHeader::decode(&b, u64::MAX).unwrap(), h);
}

#[test]
fn bad_headers_are_errors() {
    let b = header().to_bytes();
    assert_eq!(
        FrameHeader::decode(&b[..39], u64::MAX),
        Err(ProtocolError::TruncatedHeader { got: 39 })
    );
    let mut m = b.to_vec();
    m[0] = b'X';
    assert!(matches!(
        FrameHeader::decode(&m, u64::MAX),
        Err(ProtocolError::BadMagic { .. })
    ));
    let mut m = b.to_vec();
    m[4] = 9;
    assert_eq!(
        FrameHeader::decode(&m, u64::MAX),
        Err(ProtocolError::BadKind(9))
    );
    let mut m = b.to_vec();
    m[5] = 7;
    assert_eq!(
        FrameHeader::decode(&m, u64::MAX),
        Err(ProtocolError::BadOp(7))
    );
    let e = FrameHeader::decode(&b, 1000).unwrap_err();
    assert!(e.to_string().contains("exceeds the limit of 1000"), "{e}");
}

#[test]
fn flags_round_trip_and_are_checked_against_the_frame() {
    let sum_push = |flags, payload_len| FrameHeader {
        op: ReduceOp::Sum,
        flags,
        payload_len,
        ..header()
    };
    for (non_finite, undo_previous) in [(false, true), (true, false), (true, true)] {
        let flags = FrameFlags {
            non_finite,
            undo_previous,
        };
        let h = sum_push(flags, if non_finite { 0 } else { 12 });
        assert_eq!(FrameHeader::decode(&h.to_bytes(), u64::MAX).unwrap(), h);
    }
    let result = FrameHeader {
        kind: FrameKind::Result,
        ..sum_push(
            FrameFlags {
                non_finite: true,
                undo_previous: false,
            },
            0,
        )
    };
    assert_eq!(
        FrameHeader::decode(&result.to_bytes(), u64::MAX).unwrap(),
        result
    );
    let refused = |h: FrameHeader, bits: Option<u16>, why: &str| {
        let mut b = h.to_bytes().to_vec();
        if let Some(bits) = bits {
            b[6..8].copy_from_slice(&bits.to_le_bytes());
        }
        let e = FrameHeader::decode(&b, u64::MAX).unwrap_err();
        assert!(matches!(e, ProtocolError::BadFlags { .. }), "{e}");
        assert!(e.to_string().contains(why), "{e}");
    };
    refused(sum_push(FrameFlags::default(), 0), Some(4), "unknown bits");
    let nf = FrameFlags {
        non_finite: true,
        undo_previous: false,
    };
    refused(sum_push(nf, 8), None, "carries no payload");
    refused(
        FrameHeader {
            flags: nf,
            payload_len: 0,
            ..header()
        },
        None,
        "can be non-finite",
    );
    let undo = FrameFlags {
        non_finite: false,
        undo_previous: true,
    };
    refused(
        FrameHeader {
            kind: FrameKind::Result,
            ..sum_push(undo, 0)
        },
        None,
        "only a sum push or a StateGet can undo",
    );
    let get = FrameHeader {
        kind: FrameKind::StateGet,
        op: ReduceOp::Sum,
        flags: undo,
        round: crate::checkpoint::STATE_ROUND,
        payload_len: 0,
        ..header()
    };
    assert_eq!(FrameHeader::decode(&get.to_bytes(), u64::MAX).unwrap(), get);
}

#[test]
fn control_round_trip_and_garbage() {
    let msg = FromScheduler::Declared {
        name: "fc1.weight".into(),
        result: Err("lengths differ".into()),
    };
    let frame = encode_control(&msg).unwrap();
    let len = u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize;
    assert_eq!(len, frame.len() - 4);
    let back: FromScheduler = decode_control(&frame[4..]).unwrap();
    assert_eq!(back, msg);
    assert!(decode_control::<FromScheduler>(&frame[4..frame.len() - 1]).is_err());
    let mut trailing = frame[4..].to_vec();
    trailing.push(0);
    assert!(decode_control::<FromScheduler>(&trailing).is_err());
    assert!(check_control_len(MAX_CONTROL_FRAME + 1).is_err());
}

// Arbitrary and mutated bytes for every decoder here (and `Departure::from_close`):
// proto/tests/decoders.rs.
