//! Every compressor's `decompress` and `decompress_add`, built as nodes build them
//! (`chunk_codec`; Moniqua through the registry), over arbitrary payloads. The first 4 bytes
//! pick the map, the chunk length (0..1024), worker or server and the round; the rest is the
//! payload. No panic; both accept the same payloads; an accepted one gives `acc + decompress`
//! bit for bit from `decompress_add`; a refused one writes nothing and names the codec.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use pushpull_codecs::chunk::ChunkInfo;
use pushpull_codecs::{
    build_from_spec, chunk_codec, parse_params, BuildOptions, Compressor, Node, NodeIdentity,
    Purpose, RoundCtx,
};

const MAPS: &[&[(&str, &str)]] = &[
    &[("compressor", "none")],
    &[("compressor", "fp16")],
    &[("compressor", "bf16")],
    &[("compressor", "onebit"), ("scaling", "true")],
    &[("compressor", "onebit"), ("columns", "5"), ("ef", "none")],
    &[("compressor", "topk"), ("k", "0.1"), ("ef", "vanilla")],
    &[
        ("compressor", "randomk"),
        ("k", "0.2"),
        ("unbiased", "true"),
    ],
    &[
        ("compressor", "dithering"),
        ("k", "5"),
        ("normalize", "l2"),
        ("bucket", "16"),
    ],
    &[
        ("compressor", "dithering"),
        ("k", "300"),
        ("partition", "linear"),
        ("bucket", "33"),
    ],
    &[
        ("compressor", "dithering"),
        ("k", "3"),
        ("encoding", "elias"),
        ("bucket", "10"),
    ],
    &[
        ("compressor", "dithering"),
        ("k", "8"),
        ("encoding", "elias"),
        ("partition", "natural"),
    ],
    &[("compressor", "minmax"), ("bits", "3"), ("bucket", "7")],
    &[("compressor", "moniqua"), ("theta", "0.5"), ("bits", "4")],
];

fuzz_target!(|data: &[u8]| {
    let [m, n0, n1, who, payload @ ..] = data else {
        return;
    };
    let kv = MAPS[*m as usize % MAPS.len()];
    let params: BTreeMap<String, String> = kv
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let n = usize::from(u16::from_le_bytes([*n0, *n1]) % 1024);
    let server = who & 1 == 1;
    let round = u64::from(who >> 1);
    let codec = parse_params(&params).unwrap().codec.display_name();
    let c: Compressor = if kv[0].1 == "moniqua" {
        let who = if server {
            NodeIdentity::server(7, 9, 0)
        } else {
            NodeIdentity::worker(7, 9, 1)
        };
        let opts = BuildOptions {
            purpose: Purpose::ModelAveraging,
            ..BuildOptions::default()
        };
        build_from_spec(&parse_params(&params).unwrap(), n, &who, opts).unwrap()
    } else {
        let info = ChunkInfo {
            params: &params,
            tensor_len: n as u64,
            chunk_len: n as u64,
            full_chunk_len: n as u64,
            key: 9,
            job_seed: 7,
            node: if server {
                Node::Server { id: 1 }
            } else {
                Node::Worker { rank: 1 }
            },
            min_compress_bytes: 0,
        };
        match chunk_codec(&info) {
            Ok(c) => c,
            Err(_) => return, // k beyond this length
        }
    };
    let reference: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 1.0).collect();
    let cx = RoundCtx::new(round).with_reference(&reference);
    let sentinel: Vec<f32> = (0..n)
        .map(|i| if i % 2 == 0 { -0.0 } else { i as f32 })
        .collect();
    let mut out = sentinel.clone();
    let mut acc = sentinel.clone();
    let r = c.decompress(payload, &cx, &mut out);
    let r2 = c.decompress_add(payload, &cx, &mut acc);
    match (r, r2) {
        (Ok(()), Ok(())) => {
            for i in 0..n {
                assert_eq!(
                    acc[i].to_bits(),
                    (sentinel[i] + out[i]).to_bits(),
                    "element {i}"
                );
            }
        }
        (Err(e), Err(e2)) => {
            assert!(out
                .iter()
                .zip(&sentinel)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
            assert!(acc
                .iter()
                .zip(&sentinel)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
            for e in [e, e2] {
                assert!(e.to_string().contains(&codec), "{e}");
            }
        }
        (r, r2) => panic!("{kv:?}: decompress {r:?} but decompress_add {r2:?}"),
    }
});
