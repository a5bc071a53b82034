//! Shared by `cuda_host.rs`, `cuda_host_kernels.rs` and `cuda_gpu.rs`: seeds, random inputs, the compressor
//! configurations under test, and the CPU compressors of the registry.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use pushpull_kernels::cuda::{GpuScheme, RoundStreams};
use pushpull_kernels::rng::mix64;
use pushpull_kernels::{build_compressor, Compressor, NodeIdentity, Role, RoundCtx};

/// The test seed: `PUSHPULL_TEST_SEED` when set, else the clock. Printed either way, so a
/// failure can be replayed.
pub fn seed(test: &str) -> u64 {
    let s = match std::env::var("PUSHPULL_TEST_SEED") {
        Ok(v) => v
            .trim()
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("PUSHPULL_TEST_SEED={v:?} is not a u64")),
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5eed),
    };
    println!("{test}: seed {s} (replay with PUSHPULL_TEST_SEED={s})");
    s
}

/// A small SplitMix64 generator for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }
    pub fn u32(&mut self) -> u32 {
        (self.u64() >> 32) as u32
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.u64() as u128 * n as u128) >> 64) as u64
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.u64() >> 40) as f32 / 16_777_216.0
    }
    pub fn bool(&mut self) -> bool {
        self.u64() & 1 == 1
    }
    /// Any finite f32 bit pattern (subnormals, zeros and huge values included).
    pub fn finite_bits(&mut self) -> f32 {
        loop {
            let v = f32::from_bits(self.u32());
            if v.is_finite() {
                return v;
            }
        }
    }
    /// Any finite f32 with |x| < 2^60: subnormals and large values whose squares and
    /// differences still fit in f32 sums.
    pub fn wide(&mut self) -> f32 {
        loop {
            let v = self.finite_bits();
            if v.abs() < 1.152_921_5e18 {
                return v;
            }
        }
    }
    /// A gradient-like value: a signed magnitude spread over many binades.
    pub fn grad(&mut self) -> f32 {
        let m = self.unit() + 0.5;
        let e = self.below(40) as i32 - 30;
        let v = m * 2f32.powi(e);
        if self.bool() {
            -v
        } else {
            v
        }
    }
    /// A mix of gradient-like values, exact zeros of both signs, repeats and rare huge or tiny
    /// values (the edge cases every encoder must agree on).
    pub fn mixed(&mut self) -> f32 {
        match self.below(20) {
            0 => 0.0,
            1 => -0.0,
            2 => self.wide(),
            3 => f32::from_bits(self.below(0x80_0000) as u32 | (self.u32() & 0x8000_0000)),
            4 => 1.0,
            5 => -0.5,
            _ => self.grad(),
        }
    }
}

/// Random input of length n: each test chunk is drawn from one of several "shapes".
pub fn input(rng: &mut Rng, n: usize) -> Vec<f32> {
    match rng.below(9) {
        // Rare: any finite bit pattern, so buckets overflow (max - min, sums of squares) and
        // the compressors must refuse the chunk alike.
        8 => (0..n).map(|_| rng.finite_bits()).collect(),
        0 | 4 => (0..n).map(|_| rng.grad()).collect(),
        1 | 5 => (0..n).map(|_| rng.mixed()).collect(),
        2 | 6 => {
            // Many exact zeros (ReLU-like), both signs.
            (0..n)
                .map(|_| match rng.below(4) {
                    0 => 0.0,
                    1 => -0.0,
                    _ => rng.grad(),
                })
                .collect()
        }
        _ => {
            // Values on a coarse grid (repeated values, ties in min/max).
            (0..n)
                .map(|_| (rng.below(16) as f32 - 8.0) * 0.125)
                .collect()
        }
    }
}

/// Chunk lengths every whole-chunk test covers (0, 1, around 32, around blocks and spans).
pub const LENGTHS: &[usize] = &[
    0, 1, 2, 31, 32, 33, 100, 255, 256, 257, 1000, 2047, 2049, 5000,
];

/// One compressor configuration: the registry's parameter map and the GPU scheme it must equal
/// (for a chunk of `len` elements on a worker).
pub struct Case {
    pub params: BTreeMap<String, String>,
    pub scheme: GpuScheme,
}

fn map(kv: &[(&str, String)]) -> BTreeMap<String, String> {
    kv.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

/// The configurations for a chunk of `len` elements: every fixed-width encoding, with buckets
/// that do and do not divide the length, several widths and level counts.
pub fn cases(rng: &mut Rng, len: usize) -> Vec<Case> {
    let mut v = Vec::new();
    let push = |v: &mut Vec<Case>, kv: &[(&str, String)], scheme: GpuScheme| {
        v.push(Case {
            params: map(kv),
            scheme,
        })
    };
    push(&mut v, &[("compressor", "fp16".into())], GpuScheme::Fp16);
    push(&mut v, &[("compressor", "bf16".into())], GpuScheme::Bf16);
    for scaling in [false, true] {
        push(
            &mut v,
            &[
                ("compressor", "onebit".into()),
                ("scaling", scaling.to_string()),
            ],
            GpuScheme::OneBit { scaling },
        );
    }
    let random_bucket = 1 + rng.below(700) as usize;
    for (bits, bucket) in [
        (8, None),
        (1, Some(7)),
        (3, Some(random_bucket)),
        (4, Some(256)),
        (5, Some(2049)),
        (1 + rng.below(8) as u32, Some(1 + rng.below(3000) as usize)),
    ] {
        let mut kv = vec![
            ("compressor", "minmax".to_string()),
            ("bits", bits.to_string()),
        ];
        if let Some(b) = bucket {
            kv.push(("bucket", b.to_string()));
        }
        push(&mut v, &kv, GpuScheme::MinMax { bits, bucket });
    }
    let random_s = 1 + rng.below(32) as u32;
    for (s, natural, l2, bucket) in [
        (1, false, false, None),
        (4, false, true, Some(512)),
        (7, false, false, Some(33)),
        (127, false, true, Some(random_bucket)),
        (1, true, false, Some(100)),
        (8, true, true, None),
        (32, true, false, Some(300)),
        (
            random_s,
            rng.bool(),
            rng.bool(),
            Some(1 + rng.below(3000) as usize),
        ),
    ] {
        let mut kv = vec![
            ("compressor", "dithering".to_string()),
            ("k", s.to_string()),
            (
                "partition",
                if natural { "natural" } else { "linear" }.to_string(),
            ),
            ("normalize", if l2 { "l2" } else { "max" }.to_string()),
        ];
        if let Some(b) = bucket {
            kv.push(("bucket", b.to_string()));
        }
        push(
            &mut v,
            &kv,
            GpuScheme::Dithering {
                levels: s,
                natural,
                l2,
                bucket,
            },
        );
    }
    if len > 0 {
        let k = 1 + rng.below(len as u64) as usize;
        for unbiased in [false, true] {
            push(
                &mut v,
                &[
                    ("compressor", "randomk".into()),
                    ("k", k.to_string()),
                    ("unbiased", unbiased.to_string()),
                ],
                GpuScheme::RandomK { k, unbiased },
            );
        }
        push(
            &mut v,
            &[("compressor", "randomk".into()), ("k", len.to_string())],
            GpuScheme::RandomK {
                k: len,
                unbiased: false,
            },
        );
    }
    v
}

/// The identity and round every whole-chunk test uses for one trial.
pub struct Round {
    pub job_seed: u64,
    pub key: u64,
    pub round: u64,
    pub rank: u32,
}

impl Round {
    pub fn random(rng: &mut Rng) -> Round {
        Round {
            job_seed: rng.u64(),
            key: rng.u64(),
            round: rng.below(1000),
            rank: rng.below(8) as u32,
        }
    }
    pub fn who(&self) -> NodeIdentity {
        NodeIdentity::worker(self.job_seed, self.key, self.rank)
    }
    pub fn ctx(&self) -> RoundCtx<'static> {
        RoundCtx::new(self.round)
    }
    pub fn streams(&self) -> RoundStreams {
        RoundStreams::new(self.job_seed, self.key, self.round, Role::Worker, self.rank)
    }
}

/// The CPU compressor of a case.
pub fn cpu(case: &Case, len: usize, round: &Round) -> Compressor {
    build_compressor(&case.params, len, &round.who())
        .unwrap_or_else(|e| panic!("the registry refused {:?}: {e}", case.params))
}

/// Bitwise equality of two f32 slices, with the first difference in the message.
pub fn assert_same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: element {i} differs: {:e} ({:#010x}) vs expected {:e} ({:#010x})",
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

/// Byte equality with the first differing byte in the message.
pub fn assert_same_bytes(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: payload sizes differ ({} vs expected {})",
        got.len(),
        want.len()
    );
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: byte {i} of {} differs: {:#04x} vs expected {:#04x}",
            got.len(),
            got[i],
            want[i]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// A serial reference of the wire formats, written straight from the documented formats with
// `elem` and `rng`: the judge when the emulated kernels, the GPU and the CPU compressors
// disagree.
// ---------------------------------------------------------------------------------------------

use pushpull_kernels::elem;
use pushpull_kernels::rng::Permutation;

fn put_stream(out: &mut Vec<u8>, codes: &[u32], w: u32) {
    let mut words = vec![0u32; (codes.len() * w as usize).div_ceil(32)];
    for (i, &c) in codes.iter().enumerate() {
        assert!(w == 32 || c >> w == 0, "code {c} does not fit {w} bits");
        for b in 0..w as usize {
            if (c >> b) & 1 == 1 {
                let j = i * w as usize + b;
                words[j / 32] |= 1 << (j % 32);
            }
        }
    }
    for wd in words {
        out.extend_from_slice(&wd.to_le_bytes());
    }
}

fn get_stream(bytes: &[u8], i: usize, w: u32) -> u32 {
    let mut c = 0;
    for b in 0..w as usize {
        let j = i * w as usize + b;
        c |= (((bytes[j / 8] >> (j % 8)) & 1) as u32) << b;
    }
    c
}

fn f32_at(bytes: &[u8], i: usize) -> f32 {
    f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap())
}

/// The payload the documented format prescribes, or `None` where the compressors refuse
/// (non-finite input, a onebit mean, minmax range or l2 norm that overflows f32, a linear
/// dithering norm × s or a random-k value x × n/k that does).
pub fn reference_compress(scheme: &GpuScheme, x: &[f32], streams: RoundStreams) -> Option<Vec<u8>> {
    if x.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let n = x.len();
    let bucket = scheme.bucket_len(n);
    let u = |i: usize| streams.rounding.uniform(i as u64);
    let mut out = Vec::new();
    match *scheme {
        GpuScheme::Fp16 => x
            .iter()
            .for_each(|&v| out.extend_from_slice(&elem::f32_to_f16_sat(v).to_le_bytes())),
        GpuScheme::Bf16 => x
            .iter()
            .for_each(|&v| out.extend_from_slice(&elem::f32_to_bf16_sat(v).to_le_bytes())),
        GpuScheme::OneBit { scaling } => {
            let scale = if scaling { elem::mean_abs(x) } else { 1.0 };
            if !scale.is_finite() {
                return None;
            }
            out.extend_from_slice(&scale.to_le_bytes());
            let codes: Vec<u32> = x.iter().map(|&v| elem::sign_bit(v)).collect();
            put_stream(&mut out, &codes, 1);
        }
        GpuScheme::MinMax { bits, .. } => {
            let levels = (1u32 << bits) - 1;
            let mut codes = Vec::with_capacity(n);
            for (b, c) in x.chunks(bucket).enumerate() {
                let (lo, hi) = elem::min_max(c);
                let (lo, hi) = (elem::canonical_zero(lo), elem::canonical_zero(hi));
                if !(hi - lo).is_finite() {
                    return None;
                }
                out.extend_from_slice(&lo.to_le_bytes());
                out.extend_from_slice(&hi.to_le_bytes());
                let step = elem::minmax_step(lo, hi, levels);
                for (t, &v) in c.iter().enumerate() {
                    codes.push(elem::minmax_code(v, lo, step, levels, u(b * bucket + t)));
                }
            }
            put_stream(&mut out, &codes, bits);
        }
        GpuScheme::Dithering {
            levels: s,
            natural,
            l2,
            ..
        } => {
            let w = 1 + (32 - s.leading_zeros());
            let mut codes = Vec::with_capacity(n);
            for (b, c) in x.chunks(bucket).enumerate() {
                let norm = if l2 {
                    elem::l2_norm(c)
                } else {
                    elem::max_abs(c)
                };
                if !norm.is_finite() || (!natural && !(norm * s as f32).is_finite()) {
                    return None;
                }
                out.extend_from_slice(&norm.to_le_bytes());
                for (t, &v) in c.iter().enumerate() {
                    let ui = u(b * bucket + t);
                    let level = if natural {
                        elem::dither_natural_level(v, norm, s, ui)
                    } else {
                        elem::dither_linear_level(v, norm, s, ui)
                    };
                    codes.push((level << 1) | elem::sign_bit(v));
                }
            }
            put_stream(&mut out, &codes, w);
        }
        GpuScheme::RandomK { k, unbiased } => {
            let p = Permutation::new(n as u64, streams.indices);
            let scale = GpuScheme::randomk_scale(n, k, unbiased);
            for j in 0..k {
                let v = x[p.permute(j as u64) as usize] * scale;
                if !v.is_finite() {
                    return None;
                }
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    assert_eq!(out.len(), scheme.compressed_len(n), "reference size");
    Some(out)
}

/// The values a payload decodes to (decompress; decompress_add is `acc + this`).
pub fn reference_decompress(
    scheme: &GpuScheme,
    p: &[u8],
    n: usize,
    streams: RoundStreams,
) -> Vec<f32> {
    let bucket = scheme.bucket_len(n);
    let nb = if n == 0 { 0 } else { n.div_ceil(bucket) };
    match *scheme {
        GpuScheme::Fp16 => (0..n)
            .map(|i| elem::f16_to_f32(u16::from_le_bytes([p[2 * i], p[2 * i + 1]])))
            .collect(),
        GpuScheme::Bf16 => (0..n)
            .map(|i| elem::bf16_to_f32(u16::from_le_bytes([p[2 * i], p[2 * i + 1]])))
            .collect(),
        GpuScheme::OneBit { .. } => {
            let scale = f32_at(p, 0);
            (0..n)
                .map(|i| {
                    if get_stream(&p[4..], i, 1) == 1 {
                        -scale
                    } else {
                        scale
                    }
                })
                .collect()
        }
        GpuScheme::MinMax { bits, .. } => {
            let levels = (1u32 << bits) - 1;
            (0..n)
                .map(|i| {
                    let b = i / bucket;
                    let (lo, hi) = (f32_at(p, 2 * b), f32_at(p, 2 * b + 1));
                    let step = elem::minmax_step(lo, hi, levels);
                    elem::minmax_value(get_stream(&p[8 * nb..], i, bits), lo, step)
                })
                .collect()
        }
        GpuScheme::Dithering {
            levels: s, natural, ..
        } => {
            let w = 1 + (32 - s.leading_zeros());
            (0..n)
                .map(|i| {
                    let norm = f32_at(p, i / bucket);
                    let c = get_stream(&p[4 * nb..], i, w);
                    if natural {
                        elem::dither_natural_value(c >> 1, c & 1, norm, s)
                    } else {
                        elem::dither_linear_value(c >> 1, c & 1, norm, s)
                    }
                })
                .collect()
        }
        GpuScheme::RandomK { k, .. } => {
            let mut out = vec![0.0f32; n];
            let perm = Permutation::new(n as u64, streams.indices);
            for j in 0..k {
                out[perm.permute(j as u64) as usize] = f32_at(p, j);
            }
            out
        }
    }
}
