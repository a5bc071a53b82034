//! Fuzzing every compressor's payload decoder (the bytes a server reads from a worker's push
//! and a worker from a server's result), over fresh random inputs (seed printed; replay with
//! PUSHPULL_TEST_SEED).
//!
//! The chains are built as nodes build them: through [`chunk_codec`] from a string map
//! (`Purpose::Gradient`), as a worker (any rank) or a server (any id), for every compressor of
//! `common::all_configs` but Moniqua, alone, with error feedback and with momentum, for chunk
//! lengths around the boundaries, a last chunk one shorter than the first (top-k and random-k
//! count `k` against the first), and a tensor below `min_compress_bytes` (raw fp32). Moniqua
//! (model averaging only) goes through the registry with a reference, on both roles.
//!
//! Payloads: arbitrary bytes of any length; random bytes of a length the format allows (the
//! only way past the length checks into the content checks: norms, scales, levels, indices,
//! Elias codes); and a valid payload with a few bytes, or one aligned f32, overwritten by edge
//! values (0x00, 0xff, NaN, infinities, huge, negative, subnormal).
//!
//! Checked for each: no panic; `decompress` and `decompress_add` accept the same payloads; an
//! accepted payload gives `acc + decompress` bit for bit from `decompress_add` (the trait's
//! contract); a refused one writes neither output, and its error names the codec as the chain
//! prints it (e.g. `topk(k=3)`), and a wrong length the payload's length.

mod common;

use common::*;
use proptest::prelude::*;
use pushpull_codecs::chunk::{effective_spec, ChunkInfo};
use pushpull_codecs::{chunk_codec, Compressor, KernelError, Node, NodeIdentity, RoundCtx};

/// The maps fuzzed through `chunk_codec`: every gradient compressor, alone, with error
/// feedback, with momentum.
fn gradient_maps() -> Vec<Vec<(&'static str, &'static str)>> {
    let plain: Vec<_> = all_configs()
        .into_iter()
        .filter(|kv| !kv.contains(&("compressor", "moniqua")))
        .collect();
    let mut v = plain.clone();
    for kv in &plain {
        let mut ef = kv.clone();
        ef.push(("ef", "vanilla"));
        v.push(ef);
        let mut m = kv.clone();
        m.push(("momentum", "nesterov"));
        v.push(m);
    }
    v
}

fn moniqua_maps() -> Vec<Vec<(&'static str, &'static str)>> {
    all_configs()
        .into_iter()
        .filter(|kv| kv.contains(&("compressor", "moniqua")))
        .collect()
}

/// One fuzzed decoder: the chain, the codec name its errors must carry, and a description for
/// failure messages.
struct Target {
    c: Compressor,
    codec: String,
    what: String,
}

/// Builds case `ci` of chunk length `n` for a worker or a server, as the nodes do.
fn target(ci: usize, n: usize, server: bool, rng: &mut TestRng) -> Option<Target> {
    let maps = gradient_maps();
    if ci >= maps.len() {
        let kv = &moniqua_maps()[ci - maps.len()];
        let who = if server {
            NodeIdentity::server(rng.next_u64(), rng.next_u64(), 0)
        } else {
            NodeIdentity::worker(rng.next_u64(), rng.next_u64(), rng.below(8) as u32)
        };
        let c = build_as(kv, n, who);
        let codec = pushpull_codecs::parse_params(&map(kv))
            .unwrap()
            .codec
            .display_name();
        return Some(Target {
            what: format!("{kv:?} n={n} server={server}"),
            c,
            codec,
        });
    }
    let kv = &maps[ci];
    let params = map(kv);
    // A last chunk one shorter than the first, now and then; a tensor below the threshold.
    let full = if n > 0 && rng.below(3) == 0 { n + 1 } else { n };
    let min_compress_bytes = if rng.below(8) == 0 { u64::MAX } else { 0 };
    let node = if server {
        Node::Server {
            id: rng.below(4) as u32,
        }
    } else {
        Node::Worker {
            rank: rng.below(8) as u32,
        }
    };
    let info = ChunkInfo {
        params: &params,
        tensor_len: (full + n) as u64,
        chunk_len: n as u64,
        full_chunk_len: full as u64,
        key: rng.next_u64(),
        job_seed: rng.next_u64(),
        node,
        min_compress_bytes,
    };
    // Settings that do not fit this length (k beyond n) are refused at build time: skip them.
    let c = chunk_codec(&info).ok()?;
    let codec = effective_spec(&params, info.tensor_len, min_compress_bytes)
        .unwrap()
        .codec
        .display_name();
    Some(Target {
        what: format!(
            "{kv:?} n={n} full={full} node={node:?} min_compress_bytes={min_compress_bytes}"
        ),
        c,
        codec,
    })
}

/// Edge values for an overwritten f32.
const EDGE_F32: &[f32] = &[
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::MAX,
    -f32::MAX,
    -1.0,
    -0.0,
    1e-45,
    1e30,
    0.0,
];

/// A fuzzed payload for `c` of kind `how` (see the module docs), from a valid one.
fn payload(how: u64, good: &[u8], max: usize, rng: &mut TestRng) -> Vec<u8> {
    let random = |len: usize, rng: &mut TestRng| -> Vec<u8> {
        (0..len).map(|_| rng.next_u64() as u8).collect()
    };
    match how {
        // Arbitrary bytes of any length up to twice the largest payload.
        0 => {
            let len = rng.below(2 * max as u64 + 9) as usize;
            random(len, rng)
        }
        // Random bytes of an allowed length: the exact size, or for a variable-length format
        // anything up to the largest.
        1 => {
            let len = if good.len() == max && rng.below(2) == 0 {
                max
            } else {
                rng.below(max as u64 + 1) as usize
            };
            random(len, rng)
        }
        // A valid payload with a few bytes set to 0x00, 0xff, 0x7f, 0x80 or random.
        2 => {
            let mut p = good.to_vec();
            for _ in 0..1 + rng.below(4) {
                if !p.is_empty() {
                    let i = rng.below(p.len() as u64) as usize;
                    p[i] = [0x00, 0xff, 0x7f, 0x80, rng.next_u64() as u8][rng.below(5) as usize];
                }
            }
            p
        }
        // A valid payload with one aligned f32 (a header: scale, norm, min/max, level; or a
        // value) replaced by an edge value.
        _ => {
            let mut p = good.to_vec();
            if p.len() >= 4 {
                // Headers come first: half the time one of the first 4 words.
                let words = p.len() / 4;
                let w = if rng.below(2) == 0 {
                    rng.below(words.min(4) as u64)
                } else {
                    rng.below(words as u64)
                } as usize;
                let v = EDGE_F32[rng.below(EDGE_F32.len() as u64) as usize];
                p[4 * w..4 * w + 4].copy_from_slice(&v.to_le_bytes());
            }
            p
        }
    }
}

fn check(t: &Target, payload: &[u8], cx: &RoundCtx) -> Result<(), TestCaseError> {
    let n = t.c.len();
    let what = &t.what;
    let sentinel: Vec<f32> = (0..n)
        .map(|i| match i % 3 {
            0 => -0.0,
            1 => i as f32 * 0.5 - 3.0,
            _ => 0.0,
        })
        .collect();
    let mut out = sentinel.clone();
    let r = t.c.decompress(payload, cx, &mut out);
    let mut acc = sentinel.clone();
    let r2 = t.c.decompress_add(payload, cx, &mut acc);
    prop_assert_eq!(
        r.is_ok(),
        r2.is_ok(),
        "{}: decompress {:?} but decompress_add {:?}",
        what,
        r,
        r2
    );
    match (r, r2) {
        (Ok(()), Ok(())) => {
            for i in 0..n {
                let want = sentinel[i] + out[i];
                prop_assert_eq!(
                    acc[i].to_bits(),
                    want.to_bits(),
                    "{}: element {}: {} + {} but decompress_add gave {}",
                    what,
                    i,
                    sentinel[i],
                    out[i],
                    acc[i]
                );
            }
        }
        (Err(e), Err(e2)) => {
            for (name, v) in [("decompress", &out), ("decompress_add", &acc)] {
                prop_assert!(
                    v.iter()
                        .zip(&sentinel)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{}: a failed {} wrote ({})",
                    what,
                    name,
                    e
                );
            }
            for e in [e, e2] {
                let text = e.to_string();
                prop_assert!(
                    text.contains(&t.codec),
                    "{}: the error does not name the codec {}: {}",
                    what,
                    t.codec,
                    text
                );
                if let KernelError::PayloadLength { actual, .. } = e {
                    prop_assert_eq!(actual, payload.len(), "{}: {}", what, text);
                }
            }
        }
        _ => unreachable!(),
    }
    Ok(())
}

#[test]
fn every_payload_decoder_refuses_garbage_by_name_and_never_panics() {
    let cases = (gradient_maps().len() + moniqua_maps().len()) as u64;
    let strat = (
        0..cases as usize,
        prop_oneof![
            Just(0usize),
            Just(1),
            Just(31),
            Just(33),
            Just(64),
            2usize..300
        ],
        any::<bool>(),
        0u64..4,
        any::<u64>(),
    );
    let name = "every_payload_decoder_refuses_garbage_by_name_and_never_panics";
    proptest!(prop_config(name, 6000), |((ci, n, server, how, s) in strat)| {
        let mut rng = TestRng::new(s);
        let t = target(ci, n, server, &mut rng);
        prop_assume!(t.is_some());
        let mut t = t.unwrap();
        let x = rng.gradient(n, 1.0);
        let refv: Vec<f32> = x.iter().map(|v| v + 0.25).collect();
        let cx = ctx(rng.below(1000), &refv).with_lr(0.1);
        let mut good = Vec::new();
        t.c.compress(&x, &cx, &mut good).unwrap();
        let p = payload(how, &good, t.c.max_compressed_len(), &mut rng);
        check(&t, &p, &cx)?;
    });
}
