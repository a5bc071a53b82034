//! The registry's parameter maps: the BytePS and short spellings, and one named error for
//! every kind of bad map (never a panic, whatever the map).

mod common;

use common::*;
use proptest::prelude::*;
use pushpull_codecs::{
    build_compressor, build_from_spec, parse_params, BuildOptions, DitheringSpec, IntraCodec,
    KSpec, KernelError, NodeIdentity, Purpose, TopKSpec,
};

fn who() -> NodeIdentity {
    NodeIdentity::worker(5, 6, 0)
}

/// The error of building `kv` for a chunk of `len`, as text.
fn err(kv: &[(&str, &str)], len: usize) -> String {
    match build_compressor(&map(kv), len, &who()) {
        Ok(c) => panic!("{kv:?} built {}", c.name()),
        Err(e) => e.to_string(),
    }
}

fn assert_err(kv: &[(&str, &str)], len: usize, needles: &[&str]) {
    let e = err(kv, len);
    for n in needles {
        assert!(e.contains(n), "{kv:?}: error {e:?} does not mention {n:?}");
    }
}

/// Every configuration's canonical map, and its printed form, parse back to the same spec.
#[test]
fn canonical_maps_parse_back_to_their_spec() {
    for kv in all_configs() {
        let spec = parse_params(&map(&kv)).unwrap_or_else(|e| panic!("{kv:?}: {e}"));
        let again = parse_params(&spec.to_params()).unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(again, spec, "{kv:?}");
        let printed: Vec<(String, String)> = spec
            .to_string()
            .split(' ')
            .map(|kv| kv.split_once('=').expect("key=value"))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let printed = printed.into_iter().collect();
        assert_eq!(parse_params(&printed).unwrap(), spec, "{spec}");
    }
}

#[test]
fn byteps_spellings_build_the_documented_chain() {
    let c = build_compressor(
        &map(&[
            ("byteps_compressor_type", "topk"),
            ("byteps_compressor_k", "3"),
            ("byteps_error_feedback_type", "vanilla"),
        ]),
        100,
        &who(),
    )
    .unwrap();
    assert_eq!(c.name(), "ef(vanilla, topk(k=3))");
    let c = build_compressor(
        &map(&[
            ("byteps_compressor_type", "onebit"),
            ("byteps_compressor_onebit_scaling", "true"),
            ("byteps_ef_type", "vanilla"),
            ("byteps_momentum_type", "nesterov"),
            ("byteps_momentum_mu", "0.5"),
            ("byteps_seed", "42"),
        ]),
        100,
        &who(),
    )
    .unwrap();
    assert_eq!(
        c.name(),
        "nesterov(mu=0.5, ef(vanilla, onebit(scaling=true)))"
    );
    let a = parse_params(&map(&[
        ("byteps_compressor_type", "dithering"),
        ("byteps_compressor_k", "4"),
        ("byteps_dithering_partition", "1"),
        ("byteps_dithering_normalize", "1"),
    ]))
    .unwrap();
    let b = parse_params(&map(&[
        ("compressor", "dithering"),
        ("k", "4"),
        ("partition", "natural"),
        ("normalize", "l2"),
    ]))
    .unwrap();
    assert_eq!(a, b);
    assert_eq!(
        a.to_string(),
        "compressor=dithering encoding=packed k=4 normalize=l2 partition=natural"
    );
    assert_eq!(parse_params(&a.to_params()).unwrap(), a);
    let c = parse_params(&map(&[
        ("compressor", "dithering"),
        ("k", "4"),
        ("partition", "0"),
        ("normalize", "0"),
    ]))
    .unwrap();
    assert!(c.codec.downcast::<DitheringSpec>().is_some());
    assert_ne!(a, c);
    // Equal values under two spellings are fine.
    parse_params(&map(&[
        ("k", "3"),
        ("byteps_compressor_k", "3"),
        ("compressor", "topk"),
    ]))
    .unwrap();
    // The empty map is `none`.
    assert_eq!(
        build_compressor(&map(&[]), 10, &who()).unwrap().name(),
        "none"
    );
}

#[test]
fn every_bad_map_names_the_key_the_value_and_what_is_allowed() {
    // Unknown key, unknown names.
    assert_err(
        &[("compresor", "topk")],
        10,
        &[
            "unknown parameter",
            "\"compresor\"",
            "byteps_compressor_type",
        ],
    );
    assert_err(
        &[("compressor", "zip")],
        10,
        &["\"compressor\" = \"zip\"", "onebit", "dithering"],
    );
    assert_err(
        &[("byteps_compressor_type", "TopK")],
        10,
        &["\"byteps_compressor_type\" = \"TopK\"", "topk"],
    );
    assert_err(
        &[("ef", "fancy")],
        10,
        &["\"ef\" = \"fancy\"", "vanilla", "corrected"],
    );
    assert_err(
        &[("byteps_momentum_type", "heavy")],
        10,
        &["\"byteps_momentum_type\" = \"heavy\"", "nesterov"],
    );
    // Booleans are true/false only.
    for v in ["1", "0", "True", "yes", ""] {
        assert_err(
            &[
                ("compressor", "onebit"),
                ("byteps_compressor_onebit_scaling", v),
            ],
            10,
            &[
                &format!("\"byteps_compressor_onebit_scaling\" = \"{v}\""),
                "true or false",
            ],
        );
        assert_err(
            &[("compressor", "randomk"), ("k", "2"), ("unbiased", v)],
            10,
            &["\"unbiased\"", "true or false"],
        );
    }
    // k: missing, unparsable, out of range.
    assert_err(
        &[("compressor", "topk")],
        10,
        &["\"k\" is required by topk"],
    );
    assert_err(
        &[("compressor", "randomk")],
        10,
        &["\"k\" is required by randomk"],
    );
    assert_err(
        &[("compressor", "dithering")],
        10,
        &["\"k\" is required by dithering"],
    );
    assert_eq!(
        err(&[("compressor", "topk"), ("byteps_compressor_k", "abc")], 10),
        "parameter \"byteps_compressor_k\" = \"abc\": expected a positive number (a fraction < 1 or a count >= 1)"
    );
    for v in ["0", "-1", "nan", "inf", "", "1e400"] {
        assert_err(
            &[("compressor", "topk"), ("k", v)],
            10,
            &[&format!("\"k\" = \"{v}\""), "positive number"],
        );
    }
    assert_err(
        &[("compressor", "topk"), ("k", "2.5")],
        10,
        &["\"k\" = \"2.5\"", "whole number"],
    );
    assert_err(
        &[("compressor", "topk"), ("k", "0.7")],
        10,
        &["\"k\" = \"0.7\"", "half the chunk"],
    );
    assert_err(
        &[("compressor", "topk"), ("k", "6")],
        10,
        &["\"k\" = \"6\"", "k <= 5"],
    );
    assert_err(
        &[("compressor", "randomk"), ("k", "11")],
        10,
        &["\"k\" = \"11\"", "k <= 10"],
    );
    assert_err(
        &[("compressor", "dithering"), ("k", "0")],
        10,
        &["\"k\" = \"0\"", "1..=32767"],
    );
    assert_err(
        &[("compressor", "dithering"), ("k", "0.5")],
        10,
        &["\"k\" = \"0.5\"", "levels"],
    );
    assert_err(
        &[
            ("compressor", "dithering"),
            ("k", "33"),
            ("partition", "natural"),
        ],
        10,
        &["\"k\" = \"33\"", "1..=32"],
    );
    assert_err(
        &[("compressor", "dithering"), ("k", "40000")],
        10,
        &["\"k\" = \"40000\"", "1..=32767"],
    );
    // bits, bucket, columns.
    for v in ["0", "9", "x", "-3", "4.0"] {
        assert_err(
            &[("compressor", "minmax"), ("bits", v)],
            10,
            &[&format!("\"bits\" = \"{v}\""), "1..=8"],
        );
        assert_err(
            &[("compressor", "moniqua"), ("theta", "1"), ("bits", v)],
            10,
            &[&format!("\"bits\" = \"{v}\""), "1..=8"],
        );
    }
    assert_err(
        &[("compressor", "minmax"), ("bucket", "0")],
        10,
        &["\"bucket\" = \"0\"", "whole number"],
    );
    assert_err(
        &[("compressor", "onebit"), ("columns", "0")],
        10,
        &["\"columns\" = \"0\""],
    );
    assert_err(
        &[
            ("compressor", "onebit"),
            ("columns", "4"),
            ("scaling", "true"),
        ],
        10,
        &["\"scaling\"", "per-column"],
    );
    // 1-bit SGD's residual: a column-wise map says whether it wants it.
    assert_err(
        &[("compressor", "onebit"), ("columns", "4")],
        10,
        &["\"ef\" is required", "columns=4", "vanilla", "none"],
    );
    for ef in ["none", "vanilla", "corrected"] {
        let kv = [
            ("compressor", "onebit"),
            ("columns", "4"),
            ("byteps_ef_type", ef),
        ];
        parse_params(&map(&kv)).unwrap_or_else(|e| panic!("{kv:?}: {e}"));
    }
    // mu.
    for v in ["1", "1.0", "-0.1", "abc", "NaN"] {
        assert_err(
            &[("momentum", "nesterov"), ("byteps_momentum_mu", v)],
            10,
            &[&format!("\"byteps_momentum_mu\" = \"{v}\""), "[0, 1)"],
        );
    }
    assert_err(
        &[("mu", "0.9")],
        10,
        &["\"mu\" = \"0.9\"", "momentum=nesterov"],
    );
    // Dithering options.
    assert_err(
        &[("compressor", "dithering"), ("k", "2"), ("partition", "2")],
        10,
        &["\"partition\" = \"2\"", "linear", "natural"],
    );
    assert_err(
        &[
            ("compressor", "dithering"),
            ("k", "2"),
            ("byteps_dithering_normalize", "L2"),
        ],
        10,
        &["\"byteps_dithering_normalize\" = \"L2\"", "max", "l2"],
    );
    assert_err(
        &[
            ("compressor", "dithering"),
            ("k", "2"),
            ("encoding", "huffman"),
        ],
        10,
        &[
            "\"encoding\" = \"huffman\"",
            "packed",
            "elias",
            "elias_omega",
        ],
    );
    // Moniqua.
    assert_err(
        &[("compressor", "moniqua")],
        10,
        &["\"theta\" is required by moniqua"],
    );
    for v in ["0", "-1", "nan", "inf", "x"] {
        assert_err(
            &[("compressor", "moniqua"), ("theta", v)],
            10,
            &[&format!("\"theta\" = \"{v}\""), "> 0"],
        );
    }
    assert_err(
        &[("compressor", "moniqua"), ("theta", "1"), ("bits", "1")],
        10,
        &["\"bits\" = \"1\"", "delta", "1/2"],
    );
    assert_err(
        &[
            ("compressor", "moniqua"),
            ("theta", "1"),
            ("rounding", "up"),
        ],
        10,
        &["\"rounding\" = \"up\"", "nearest"],
    );
    assert_err(
        &[("compressor", "moniqua"), ("theta", "1")],
        10,
        &["moniqua", "gradients"],
    );
    // Keys that do not apply, conflicting spellings, the seed.
    assert_err(
        &[("compressor", "topk"), ("k", "2"), ("bits", "4")],
        10,
        &["\"bits\" = \"4\"", "does not apply", "minmax"],
    );
    assert_err(
        &[("compressor", "fp16"), ("scaling", "true")],
        10,
        &["\"scaling\"", "does not apply"],
    );
    assert_err(
        &[
            ("compressor", "topk"),
            ("k", "2"),
            ("byteps_compressor_k", "3"),
        ],
        10,
        &[
            "\"byteps_compressor_k\" = \"3\"",
            "\"k\" = \"2\"",
            "two spellings",
        ],
    );
    assert_err(
        &[
            ("byteps_error_feedback_type", "vanilla"),
            ("byteps_ef_type", "corrected"),
        ],
        10,
        &["byteps_ef_type", "byteps_error_feedback_type"],
    );
    assert_err(
        &[("seed", "-1")],
        10,
        &["\"seed\" = \"-1\"", "unsigned 64-bit"],
    );
    assert_err(
        &[("compressor", "onebit"), ("intra_compressor", "int8")],
        10,
        &["\"intra_compressor\" = \"int8\"", "none, fp16 or bf16"],
    );
}

#[test]
fn the_intra_host_codec_is_a_key_of_every_map() {
    for (v, want) in [
        ("none", IntraCodec::None),
        ("fp16", IntraCodec::Fp16),
        ("bf16", IntraCodec::Bf16),
    ] {
        let spec = parse_params(&map(&[
            ("compressor", "topk"),
            ("k", "3"),
            ("intra_compressor", v),
        ]))
        .unwrap();
        assert_eq!(spec.intra, want);
        // The canonical map keeps it (and says nothing of the default).
        assert_eq!(parse_params(&spec.to_params()).unwrap(), spec);
        assert_eq!(
            spec.to_params().contains_key("intra_compressor"),
            v != "none"
        );
    }
    assert_eq!(parse_params(&map(&[])).unwrap().intra, IntraCodec::None);
}

#[test]
fn k_for_fractions_and_for_a_tensor_spanning_chunks() {
    let spec = parse_params(&map(&[("compressor", "topk"), ("k", "0.01")])).unwrap();
    let topk = |spec: &pushpull_codecs::CompressorSpec| *spec.codec.downcast::<TopKSpec>().unwrap();
    assert_eq!(
        topk(&spec),
        TopKSpec {
            k: KSpec::Fraction(0.01)
        }
    );
    assert_eq!(topk(&spec).k.chunk_k(true, 1000, 1000).unwrap(), 10);
    assert_eq!(topk(&spec).k.chunk_k(true, 50, 1000).unwrap(), 1); // at least one
    assert_eq!(topk(&spec).k.chunk_k(true, 0, 0).unwrap(), 0);
    let spec = parse_params(&map(&[("compressor", "topk"), ("k", "100")])).unwrap();
    let k = topk(&spec);
    assert_eq!(k.k.chunk_k(true, 1000, 1000).unwrap(), 100);
    // The last, shorter chunk keeps the proportion.
    assert_eq!(k.k.chunk_k(true, 250, 1000).unwrap(), 25);
    assert_eq!(k.k.chunk_k(true, 3, 1000).unwrap(), 1);
    // Checked against the full chunk length, not the short one.
    assert!(k.k.chunk_k(true, 150, 150).is_err());
    let opts = BuildOptions {
        purpose: Purpose::Gradient,
        full_chunk_len: Some(1000),
        tensor_len: None,
    };
    let c = build_from_spec(&spec, 150, &who(), opts).unwrap();
    assert_eq!(c.max_compressed_len(), 8 * 15);
    assert!(spec.check_len(199).is_err());
    spec.check_len(200).unwrap();
}

fn key_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(vec![
            "compressor", "byteps_compressor_type", "k", "byteps_compressor_k", "scaling",
            "byteps_compressor_onebit_scaling", "ef", "byteps_error_feedback_type", "byteps_ef_type",
            "momentum", "byteps_momentum_type", "mu", "byteps_momentum_mu", "seed", "byteps_seed",
            "partition", "byteps_dithering_partition", "normalize", "byteps_dithering_normalize",
            "bits", "bucket", "encoding", "theta", "rounding", "unbiased", "columns",
            "intra_compressor",
        ]).prop_map(str::to_string),
        1 => "[a-z_]{0,12}",
    ]
}

fn value_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(vec![
            "none", "fp16", "bf16", "onebit", "topk", "randomk", "dithering", "minmax", "moniqua",
            "true", "false", "vanilla", "corrected", "nesterov", "linear", "natural", "max", "l2",
            "packed", "elias", "elias_omega", "nearest", "stochastic", "0", "1", "2", "3", "8", "9", "0.5", "0.01",
            "0.9", "1.5", "-1", "nan", "inf", "1e300", "18446744073709551616", "",
        ]).prop_map(str::to_string),
        1 => ".{0,8}",
    ]
}

#[test]
fn no_map_panics() {
    let strat = (
        proptest::collection::btree_map(key_strategy(), value_strategy(), 0..7),
        0usize..70,
        any::<bool>(),
    );
    proptest!(prop_config("no_map_panics", 2000), |((m, len, server) in strat)| {
        let who = if server { NodeIdentity::server(1, 2, 0) } else { NodeIdentity::worker(1, 2, 3) };
        match build_compressor(&m, len, &who) {
            Ok(mut c) => {
                // A built chain works on this length.
                let x: Vec<f32> = (0..len).map(|i| i as f32 - 20.0).collect();
                let mut out = Vec::new();
                let ctx = pushpull_codecs::RoundCtx::new(1).with_lr(0.1);
                c.compress(&x, &ctx, &mut out).unwrap();
                prop_assert!(out.len() <= c.max_compressed_len());
                let mut y = vec![0f32; len];
                c.decompress(&out, &ctx, &mut y).unwrap();
            }
            Err(e) => {
                let s = e.to_string();
                prop_assert!(!s.is_empty());
                // Every parameter error quotes a key.
                if !matches!(e, KernelError::Refused { .. }) {
                    prop_assert!(s.contains('"'), "{}", s);
                }
            }
        }
    });
}

#[test]
fn gossip_takes_fixed_size_messages_and_no_gradient_decorators() {
    let g = ("exchange", "gossip");
    assert_err(
        &[("compressor", "topk"), ("k", "0.1"), g],
        1000,
        &["exchange", "fixed size"],
    );
    assert_err(
        &[("compressor", "onebit"), g],
        1000,
        &["exchange", "onebit"],
    );
    assert_err(
        &[("compressor", "fp16"), ("ef", "vanilla"), g],
        1000,
        &["ef", "error feedback"],
    );
    assert_err(
        &[("compressor", "none"), ("momentum", "nesterov"), g],
        1000,
        &["momentum"],
    );
    assert_err(
        &[("exchange", "allreduce")],
        1000,
        &["exchange", "push_pull, gossip or gossip_direct"],
    );
    // Equation 4's direct form takes the same codecs and refuses the same decorators.
    let d = ("exchange", "gossip_direct");
    assert_err(
        &[("compressor", "onebit"), d],
        1000,
        &["exchange", "onebit"],
    );
    assert_err(
        &[("compressor", "none"), ("ef", "vanilla"), d],
        1000,
        &["ef"],
    );
    let direct = parse_params(&map(&[("compressor", "minmax"), ("bits", "2"), d])).unwrap();
    assert_eq!(direct.exchange, pushpull_codecs::Exchange::GossipDirect);
    assert!(direct.exchange.is_gossip());
    assert_eq!(parse_params(&direct.to_params()).unwrap(), direct);
    // Moniqua for push_pull is refused, and the error says how to gossip instead.
    assert_err(
        &[("compressor", "moniqua"), ("theta", "1")],
        1000,
        &["exchange = \"gossip\""],
    );
    let spec = parse_params(&map(&[("compressor", "moniqua"), ("theta", "1"), g])).unwrap();
    assert_eq!(spec.exchange, pushpull_codecs::Exchange::Gossip);
    assert_eq!(
        spec.to_params().get("exchange").map(String::as_str),
        Some("gossip")
    );
}

#[test]
fn a_plain_tensor_is_an_uncompressed_sum_with_no_state() {
    use pushpull_codecs::chunk::effective_spec;
    let plain = |kv: &[(&str, &str)], len: u64| {
        effective_spec(&map(kv), len, 65536)
            .expect("a valid map")
            .is_plain()
    };
    let onebit_ef = [("compressor", "onebit"), ("ef", "vanilla")];
    // Under min_compress_bytes the codec and error feedback are dropped: plain.
    assert!(plain(&onebit_ef, 16383));
    assert!(!plain(&onebit_ef, 16384));
    assert!(plain(&[], 1 << 20));
    assert!(plain(&[("compressor", "none")], 1 << 20));
    assert!(!plain(&[("compressor", "fp16")], 1 << 20));
    // What small tensors keep is state or rounding: not plain.
    let nesterov = [("compressor", "onebit"), ("momentum", "nesterov")];
    assert!(!plain(&nesterov, 10));
    assert!(!plain(&[("intra_compressor", "fp16")], 10));
    assert!(!plain(&[("exchange", "gossip")], 10));
}

/// The registry's table: names unique; every shared key an entry reads is in `KEYS` once, every
/// own key is declared by one entry and not shared; every entry parses its minimal map into
/// settings of its own name that print back to an equal spec.
#[test]
fn the_registry_table_is_consistent() {
    use pushpull_codecs::{COMPRESSORS, KEYS};
    let mut names: Vec<&str> = COMPRESSORS.iter().map(|e| e.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), COMPRESSORS.len(), "a name twice in the table");
    for e in COMPRESSORS {
        for key in e.keys {
            assert_eq!(
                KEYS.iter().filter(|k| k.name == *key).count(),
                1,
                "{}: shared key {key} is not in KEYS once",
                e.name
            );
        }
        for k in e.own_keys {
            let elsewhere = COMPRESSORS
                .iter()
                .flat_map(|o| o.own_keys)
                .filter(|o| o.name == k.name)
                .count();
            assert!(
                elsewhere == 1 && !KEYS.iter().any(|s| s.name == k.name),
                "{}: own key {} is declared {elsewhere} times among entries, or shared too",
                e.name,
                k.name
            );
            assert!(e.reads(k.name), "{}: does not read {}", e.name, k.name);
        }
        let minimal = match e.name {
            "topk" | "randomk" | "dithering" => vec![("compressor", e.name), ("k", "2")],
            "moniqua" => vec![("compressor", e.name), ("theta", "0.5")],
            "powersgd" => vec![("compressor", e.name), ("rows", "4")],
            _ => vec![("compressor", e.name)],
        };
        let spec = parse_params(&map(&minimal)).unwrap();
        assert_eq!(spec.codec.kind().name, e.name);
        assert_eq!(parse_params(&spec.to_params()).unwrap(), spec, "{}", e.name);
    }
}
