//! Shared test helpers: the printed seed, random data, rayon pools, building compressors from `k=v` lists,
//! and a straightforward reference encoder written from the wire-format spec.
#![allow(dead_code)]

use proptest::test_runner::{Config, RngSeed};
use pushpull_codecs::rng::{Role, Stream};
use pushpull_codecs::{
    build_from_spec, parse_params, BuildOptions, Compressor, NodeIdentity, Purpose, RoundCtx,
};
use std::collections::BTreeMap;

/// The test seed: `PUSHPULL_TEST_SEED` if set, else the clock; printed so a failure can be
/// replayed with `PUSHPULL_TEST_SEED=<seed> cargo test ...`.
pub fn seed(test: &str) -> u64 {
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

/// A proptest config seeded with [`seed`].
pub fn prop_config(test: &str, cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed(test)),
        failure_persistence: None,
        ..Config::default()
    }
}

/// A rayon pool of `threads` threads (the kernels split long chunks across the current pool).
pub fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

/// A small deterministic generator for test data (SplitMix64).
#[derive(Debug, Clone)]
pub struct TestRng(u64);

impl TestRng {
    pub fn new(seed: u64) -> TestRng {
        TestRng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        pushpull_codecs::rng::mix64(self.0)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// Roughly normal (sum of 4 uniforms, centred, unit variance).
    pub fn normal(&mut self) -> f64 {
        (self.unit() + self.unit() + self.unit() + self.unit() - 2.0) * 3f64.sqrt()
    }
    /// Gradient-like data: normal values of scale `scale`, some exact zeros, a few outliers,
    /// some repeated values. Never all zeros for `n >= 1`.
    pub fn gradient(&mut self, n: usize, scale: f64) -> Vec<f32> {
        let mut v: Vec<f32> = (0..n)
            .map(|_| {
                let r = self.below(100);
                let x = self.normal() * scale;
                match r {
                    0..=4 => 0.0,
                    5 => (x * 30.0) as f32,
                    6 => -0.0,
                    7 => 0.5 * scale as f32,
                    _ => x as f32,
                }
            })
            .collect();
        if n > 0 && v.iter().all(|&a| a == 0.0) {
            v[0] = scale as f32;
        }
        v
    }
}

pub fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Builds a chain for a worker (or server) from `k=v` pairs; Moniqua is allowed.
pub fn build_as(kv: &[(&str, &str)], n: usize, who: NodeIdentity) -> Compressor {
    let spec = parse_params(&map(kv)).unwrap_or_else(|e| panic!("{kv:?}: {e}"));
    let opts = BuildOptions {
        purpose: Purpose::ModelAveraging,
        ..BuildOptions::default()
    };
    build_from_spec(&spec, n, &who, opts).unwrap_or_else(|e| panic!("{kv:?}: {e}"))
}

/// Like [`build_as`] for a worker, or `None` when the map does not fit this length.
pub fn try_build(kv: &[(&str, &str)], n: usize) -> Option<Compressor> {
    let spec = parse_params(&map(kv)).unwrap_or_else(|e| panic!("{kv:?}: {e}"));
    let opts = BuildOptions {
        purpose: Purpose::ModelAveraging,
        ..BuildOptions::default()
    };
    build_from_spec(&spec, n, &NodeIdentity::worker(1234, 77, 0), opts).ok()
}

pub fn build(kv: &[(&str, &str)], n: usize) -> Compressor {
    build_as(kv, n, NodeIdentity::worker(1234, 77, 0))
}

/// Every compressor (and a few settings of each), for the tests that run over all of them.
pub fn all_configs() -> Vec<Vec<(&'static str, &'static str)>> {
    vec![
        vec![("compressor", "none")],
        vec![("compressor", "fp16")],
        vec![("compressor", "bf16")],
        vec![("compressor", "onebit")],
        vec![("compressor", "onebit"), ("scaling", "true")],
        vec![("compressor", "onebit"), ("columns", "5"), ("ef", "none")],
        vec![("compressor", "topk"), ("k", "0.1")],
        vec![("compressor", "topk"), ("k", "1")],
        vec![("compressor", "randomk"), ("k", "0.2")],
        vec![
            ("compressor", "randomk"),
            ("k", "0.2"),
            ("unbiased", "true"),
        ],
        vec![("compressor", "dithering"), ("k", "1")],
        vec![
            ("compressor", "dithering"),
            ("k", "5"),
            ("normalize", "l2"),
            ("bucket", "16"),
        ],
        vec![
            ("compressor", "dithering"),
            ("k", "4"),
            ("partition", "natural"),
        ],
        vec![
            ("compressor", "dithering"),
            ("k", "300"),
            ("partition", "linear"),
            ("bucket", "33"),
        ],
        vec![
            ("compressor", "dithering"),
            ("k", "3"),
            ("encoding", "elias"),
            ("bucket", "10"),
        ],
        vec![
            ("compressor", "dithering"),
            ("k", "8"),
            ("encoding", "elias"),
            ("partition", "natural"),
            ("normalize", "l2"),
        ],
        vec![
            ("compressor", "dithering"),
            ("k", "20"),
            ("encoding", "elias_omega"),
            ("bucket", "12"),
        ],
        vec![("compressor", "minmax")],
        vec![("compressor", "minmax"), ("bits", "3"), ("bucket", "7")],
        vec![("compressor", "minmax"), ("bits", "1")],
        vec![("compressor", "moniqua"), ("theta", "0.5"), ("bits", "4")],
        vec![
            ("compressor", "moniqua"),
            ("theta", "2"),
            ("bits", "1"),
            ("rounding", "nearest"),
        ],
    ]
}

/// A context with a reference (for Moniqua; ignored by the others).
pub fn ctx(round: u64, reference: &[f32]) -> RoundCtx<'_> {
    RoundCtx::new(round).with_reference(reference)
}

// ---- the reference encoder -----------------------------------------------------------------

/// A bit stream written bit by bit from the definition: code `i` at bits `[i*w, i*w+w)`,
/// stream bit `j` = bit `j % 32` of little-endian u32 word `j / 32`, padded to whole words.
pub fn bit_stream(codes: &[u32], w: u32) -> Vec<u8> {
    let nbits = codes.len() * w as usize;
    let mut words = vec![0u32; nbits.div_ceil(32)];
    for (i, &c) in codes.iter().enumerate() {
        assert!(w == 32 || c < (1 << w));
        for b in 0..w as usize {
            if (c >> b) & 1 == 1 {
                let j = i * w as usize + b;
                words[j / 32] |= 1 << (j % 32);
            }
        }
    }
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

pub fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The rounding uniform of element `i`.
pub fn uniform(seed: u64, key: u64, round: u64, role: Role, rank: u32, i: usize) -> f32 {
    Stream::rounding(seed, key, round, role, rank).uniform(i as u64)
}

/// Bucket ranges: buckets of `b` elements (None = one bucket), restarting reductions.
pub fn buckets(n: usize, b: Option<usize>) -> Vec<std::ops::Range<usize>> {
    let size = b.unwrap_or(n).max(1);
    (0..n.div_ceil(size))
        .map(|k| k * size..((k + 1) * size).min(n))
        .collect()
}

/// Every compressor of [`all_configs`] under decorators: vanilla and corrected error feedback,
/// Nesterov momentum over error feedback, and with `alone` also the codec alone and momentum
/// alone (Moniqua has no decorators: it appears only alone).
pub fn decorated_chains(alone: bool) -> Vec<Vec<(&'static str, &'static str)>> {
    let mut v = Vec::new();
    for kv in all_configs() {
        if alone {
            v.push(kv.clone());
        }
        if kv.contains(&("compressor", "moniqua")) {
            continue;
        }
        let mut extras = vec![
            vec![("ef", "vanilla")],
            vec![("ef", "corrected")],
            vec![("ef", "vanilla"), ("momentum", "nesterov"), ("mu", "0.9")],
        ];
        if alone {
            extras.push(vec![("momentum", "nesterov")]);
        }
        for extra in extras {
            let mut c = kv.clone();
            c.extend(extra);
            v.push(c);
        }
    }
    v
}

/// Round `round`'s context with a learning rate that changes every round, so corrected error
/// feedback's previous rate matters.
pub fn changing_lr(round: u64) -> RoundCtx<'static> {
    RoundCtx {
        lr: Some(0.1 / (1 + round) as f32),
        ..RoundCtx::new(round)
    }
}
