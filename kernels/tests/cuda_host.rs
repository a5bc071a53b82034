//! The CUDA code compiled for the host (kernels/cuda/host_shim.cpp, built by build.rs) against
//! the Rust path, bit for bit, on fresh random inputs (the seed is printed; set
//! `PUSHPULL_TEST_SEED` to replay a run): every element function of `pushpull_elem.cuh` and
//! `pushpull_work.cuh` against its `rng.rs` / `elem.rs` twin, including edge values (±0,
//! subnormals, values that must saturate, exact ties for round-to-nearest-even, levels at their
//! boundaries). Whole kernel launch sequences are in
//! `cuda_host_kernels.rs`.
//!
//! Runs everywhere (no GPU, no CUDA toolkit needed).

mod cuda_common;

use cuda_common::*;
use pushpull_kernels::cuda::host::{self, BucketStat};
use pushpull_kernels::cuda::GpuScheme;
use pushpull_kernels::elem;
use pushpull_kernels::rng::{self, Permutation, Role, Stream};

const TRIALS: usize = 100_000;

fn same_f32(what: &str, got: f32, want: f32, args: impl std::fmt::Debug) {
    assert_eq!(
        got.to_bits(),
        want.to_bits(),
        "{what}{args:?}: CUDA {got:e} ({:#010x}) vs Rust {want:e} ({:#010x})",
        got.to_bits(),
        want.to_bits()
    );
}

#[test]
fn rng_functions_match() {
    let mut r = Rng::new(seed("rng_functions_match"));
    for t in 0..TRIALS {
        let z = r.u64();
        assert_eq!(host::mix64(z), rng::mix64(z), "mix64({z:#x})");
        let (seed, key, round, rank) = (r.u64(), r.u64(), r.u64(), r.u32());
        for role in [Role::Worker, Role::Server] {
            assert_eq!(
                host::stream_rounding(seed, key, round, role, rank),
                Stream::rounding(seed, key, round, role, rank).base(),
                "stream_rounding({seed}, {key}, {round}, {role:?}, {rank})"
            );
        }
        assert_eq!(
            host::stream_indices(seed, key, round),
            Stream::indices(seed, key, round).base()
        );
        let base = r.u64();
        let s = Stream::from_base(base);
        let c = if t % 2 == 0 {
            r.u64()
        } else {
            r.below(1 << 20)
        };
        assert_eq!(host::draw(base, c), s.draw(c), "draw({base:#x}, {c})");
        same_f32("uniform", host::uniform(base, c), s.uniform(c), (base, c));
        same_f32(
            "uniform (four-lane cache)",
            host::uniform_cached(base, c),
            s.uniform(c),
            (base, c),
        );
        let bits = r.u32() as u16;
        same_f32(
            "uniform_from_bits",
            host::uniform_from_bits(bits),
            rng::uniform_from_bits(bits),
            bits,
        );
    }
    for bits in [0u16, 1, 255, 256, u16::MAX, u16::MAX - 255, 0x8000] {
        same_f32(
            "uniform_from_bits",
            host::uniform_from_bits(bits),
            rng::uniform_from_bits(bits),
            bits,
        );
    }
}

#[test]
fn permutation_matches() {
    let mut r = Rng::new(seed("permutation_matches"));
    let mut ns: Vec<u64> = vec![
        1,
        2,
        3,
        4,
        5,
        15,
        16,
        17,
        255,
        256,
        257,
        4096,
        4097,
        (1 << 20) + 1,
    ];
    ns.extend((0..6).map(|_| 1 + r.below(1 << 30)));
    ns.extend((0..3).map(|_| 1 + r.below(1 << 40)));
    for &n in &ns {
        let key = r.u64();
        let p = Permutation::new(n, Stream::from_base(key));
        let js: Vec<u64> = if n <= 4097 {
            (0..n).collect()
        } else {
            let mut v: Vec<u64> = (0..500).map(|_| r.below(n)).collect();
            v.extend([0, n - 1]);
            v
        };
        for j in js {
            assert_eq!(
                host::permute(n, key, j),
                p.permute(j),
                "permute(n = {n}, key = {key:#x}, j = {j})"
            );
        }
    }
    // The domain: the smallest even power of two >= n, at least 4.
    for (n, half) in [
        (0u64, 1u32),
        (1, 1),
        (4, 1),
        (5, 2),
        (16, 2),
        (17, 3),
        (1 << 40, 20),
    ] {
        assert_eq!(host::perm_half_bits(n), half, "half bits of n = {n}");
    }
}

#[test]
fn rounding_sign_and_saturating_int_casts_match() {
    let mut r = Rng::new(seed("rounding_sign_and_saturating_int_casts_match"));
    let specials = [
        0.0f32,
        -0.0,
        0.5,
        1.0,
        -0.5,
        -1.0,
        -0.999,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        1e-45,
        -1e-45,
        4_294_967_040.0,
        4_294_967_296.0,
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
    ];
    for &f in &specials {
        assert_eq!(host::f32_to_u32_sat(f), f as u32, "{f} as u32");
        assert_eq!(host::sign_bit(f), elem::sign_bit(f), "sign_bit({f})");
    }
    for _ in 0..TRIALS {
        let f = match r.below(3) {
            0 => r.finite_bits(),
            1 => f32::from_bits(r.u32()),
            _ => r.unit() * 300.0,
        };
        assert_eq!(host::f32_to_u32_sat(f), f as u32, "{f:e} as u32");
        assert_eq!(host::sign_bit(f), elem::sign_bit(f), "sign_bit({f:e})");
    }
    let mut ts: Vec<f32> = specials
        .iter()
        .copied()
        .filter(|t| !t.is_infinite())
        .collect();
    ts.extend([2.5, 255.0, 254.999_98, 3.0e9, 1.0e30]);
    for _ in 0..TRIALS {
        let t = match r.below(4) {
            0 => r.below(300) as f32,
            1 => r.unit() * 256.0,
            2 => r.grad().abs(),
            _ => ts[r.below(ts.len() as u64) as usize],
        };
        let frac = t - t.floor();
        let u = match r.below(4) {
            0 => frac, // u == frac: rounds down
            1 => f32::from_bits(frac.to_bits().saturating_sub(1)),
            2 => 0.0,
            _ => r.unit(),
        };
        assert_eq!(
            host::stochastic_round(t, u),
            elem::stochastic_round(t, u),
            "stochastic_round({t:e}, {u:e})"
        );
    }
}

#[test]
fn half_casts_match_exhaustively_and_on_ties() {
    let mut r = Rng::new(seed("half_casts_match_exhaustively_and_on_ties"));
    // Every 16-bit pattern decodes alike (NaNs included).
    for b in 0..=u16::MAX {
        same_f32("f16_to_f32", host::f16_to_f32(b), elem::f16_to_f32(b), b);
        same_f32("bf16_to_f32", host::bf16_to_f32(b), elem::bf16_to_f32(b), b);
    }
    let check = |x: f32| {
        assert_eq!(
            host::f32_to_f16_sat(x),
            elem::f32_to_f16_sat(x),
            "f32_to_f16_sat({x:e} = {:#010x})",
            x.to_bits()
        );
        assert_eq!(
            host::f32_to_bf16_sat(x),
            elem::f32_to_bf16_sat(x),
            "f32_to_bf16_sat({x:e} = {:#010x})",
            x.to_bits()
        );
    };
    // Ties between adjacent binary16 values (subnormal and normal) and their neighbours.
    for h in 0u16..0x7bff {
        let mid = ((elem::f16_to_f32(h) as f64 + elem::f16_to_f32(h + 1) as f64) / 2.0) as f32;
        for x in [
            mid,
            f32::from_bits(mid.to_bits() + 1),
            mid.next_down_compat(),
        ] {
            check(x);
            check(-x);
        }
    }
    // bf16 ties: low half exactly 0x8000, and one ulp either side.
    for _ in 0..TRIALS {
        let hi = r.u32() & 0xffff_0000;
        for lo in [0x7fffu32, 0x8000, 0x8001, 0] {
            let x = f32::from_bits(hi | lo);
            if x.is_finite() {
                check(x);
            }
        }
    }
    // Saturation, infinities, subnormals and random finite values.
    for x in [
        65504.0f32,
        65519.99,
        65520.0,
        65536.0,
        1e9,
        f32::MAX,
        f32::INFINITY,
        3.389_531_4e38,
        f32::from_bits(0x7f7f_7fff),
        f32::from_bits(0x7f7f_8000),
        f32::from_bits(0x7f7f_8001),
        5.960_464_5e-8, // 2^-24, the smallest f16 subnormal
        2.980_232_2e-8, // 2^-25: a tie between 0 and 2^-24
        2.980_232_4e-8,
        6.103_515_6e-5, // 2^-14, the smallest f16 normal
        f32::MIN_POSITIVE,
        1e-45,
        0.0,
    ] {
        check(x);
        check(-x);
    }
    for _ in 0..TRIALS {
        check(r.finite_bits());
        check(r.grad());
    }
}

/// `next_down` without needing a recent toolchain.
trait NextDown {
    fn next_down_compat(self) -> f32;
}
impl NextDown for f32 {
    fn next_down_compat(self) -> f32 {
        if self == 0.0 {
            -f32::from_bits(1)
        } else if self > 0.0 {
            f32::from_bits(self.to_bits() - 1)
        } else {
            f32::from_bits(self.to_bits() + 1)
        }
    }
}

#[test]
fn minmax_element_math_matches() {
    let mut r = Rng::new(seed("minmax_element_math_matches"));
    for _ in 0..TRIALS {
        let bits = 1 + r.below(8) as u32;
        let levels = (1u32 << bits) - 1;
        let (a, b) = match r.below(4) {
            0 => (r.grad(), r.grad()),
            1 => (r.mixed(), r.mixed()),
            2 => {
                let v = r.grad();
                (v, v) // a constant bucket: step 0
            }
            _ => (-r.unit(), r.unit()),
        };
        let (mn, mx) = if a <= b { (a, b) } else { (b, a) };
        let step = elem::minmax_step(mn, mx, levels);
        same_f32(
            "minmax_step",
            host::minmax_step(mn, mx, levels),
            step,
            (mn, mx, levels),
        );
        let x = match r.below(5) {
            0 => mn,
            1 => mx,
            2 => mn + (mx - mn) * r.unit(),
            3 => minmax_boundary(&mut r, mn, step, levels),
            _ => r.grad(), // outside the range too: clamped
        };
        let u = r.unit();
        let q = elem::minmax_code(x, mn, step, levels, u);
        assert_eq!(
            host::minmax_code(x, mn, step, levels, u),
            q,
            "minmax_code({x:e}, {mn:e}, {step:e}, {levels}, {u:e})"
        );
        assert!(q <= levels);
        let q = r.below(levels as u64 + 1) as u32;
        same_f32(
            "minmax_value",
            host::minmax_value(q, mn, step),
            elem::minmax_value(q, mn, step),
            (q, mn, step),
        );
    }
}

/// An x exactly on a quantisation level (or one ulp off it).
fn minmax_boundary(r: &mut Rng, mn: f32, step: f32, levels: u32) -> f32 {
    let q = r.below(levels as u64 + 1) as f32;
    let v = mn + q * step;
    match r.below(3) {
        0 => v,
        1 => f32::from_bits(v.to_bits().wrapping_add(1)),
        _ => f32::from_bits(v.to_bits().wrapping_sub(1)),
    }
}

#[test]
fn dithering_element_math_matches() {
    let mut r = Rng::new(seed("dithering_element_math_matches"));
    for _ in 0..TRIALS {
        let natural = r.bool();
        let s = if natural {
            1 + r.below(32) as u32
        } else {
            match r.below(3) {
                0 => 1 + r.below(8) as u32,
                1 => 1 + r.below(32767) as u32,
                _ => [1u32, 2, 3, 4, 7, 8, 15, 16, 127, 128, 32767][r.below(11) as usize],
            }
        };
        let x = r.mixed();
        let norm = match r.below(6) {
            0 => 0.0,
            1 => x.abs() * 0.75, // |x| > norm: clamped to the top level
            2 => x.abs(),
            _ => x.abs().max(r.grad().abs()),
        };
        // Levels at their boundaries: x = ±norm * level_value, and one ulp either side.
        let x = match r.below(3) {
            0 if norm > 0.0 => {
                let l = r.below(s as u64 + 1) as u32;
                let v = if natural {
                    elem::dither_natural_value(l, 0, norm, s)
                } else {
                    elem::dither_linear_value(l, 0, norm, s)
                };
                let v = match r.below(3) {
                    0 => v,
                    1 => f32::from_bits(v.to_bits() + 1),
                    _ => f32::from_bits(v.to_bits().saturating_sub(1)),
                };
                if r.bool() {
                    -v
                } else {
                    v
                }
            }
            _ => x,
        };
        let u = if r.below(8) == 0 { 0.0 } else { r.unit() };
        let (got, want) = if natural {
            (
                host::dither_natural_level(x, norm, s, u),
                elem::dither_natural_level(x, norm, s, u),
            )
        } else {
            (
                host::dither_linear_level(x, norm, s, u),
                elem::dither_linear_level(x, norm, s, u),
            )
        };
        assert_eq!(
            got, want,
            "dither level (natural {natural}) of x = {x:e}, norm = {norm:e}, s = {s}, u = {u:e}"
        );
        assert!(want <= s);
        let level = r.below(s as u64 + 1) as u32;
        let sign = r.below(2) as u32;
        let nm = if r.below(10) == 0 {
            0.0
        } else {
            r.grad().abs()
        };
        same_f32(
            "dither_linear_value",
            host::dither_linear_value(level, sign, nm, s),
            elem::dither_linear_value(level, sign, nm, s),
            (level, sign, nm, s),
        );
        if s <= 32 {
            same_f32(
                "dither_natural_value",
                host::dither_natural_value(level, sign, nm, s),
                elem::dither_natural_value(level, sign, nm, s),
                (level, sign, nm, s),
            );
        }
    }
    for e in -126..=127 {
        same_f32("pow2", host::pow2(e), elem::pow2(e), e);
    }
    for s in (1..=70u32).chain([127, 128, 255, 256, 32767, 32768, u32::MAX >> 1]) {
        assert_eq!(
            host::dither_width(s),
            1 + (32 - s.leading_zeros()),
            "width of s = {s}"
        );
    }
}

#[test]
fn randomk_scale_matches() {
    let mut r = Rng::new(seed("randomk_scale_matches"));
    for _ in 0..10_000 {
        let n = 1 + r.below(1 << 34);
        let k = 1 + r.below(n);
        for unbiased in [false, true] {
            same_f32(
                "randomk_scale",
                host::randomk_scale(n, k, unbiased),
                GpuScheme::randomk_scale(n as usize, k as usize, unbiased),
                (n, k, unbiased),
            );
        }
        let want = n as f32 / k as f32;
        assert_eq!(host::randomk_scale(n, k, true).to_bits(), want.to_bits());
    }
}

/// The elements a pack thread's word covers, against 128-bit arithmetic: every code width,
/// words below and above 2^32 (where the header switches from 32-bit to 64-bit divisions).
#[test]
fn word_element_ranges_match() {
    let mut r = Rng::new(seed("word_element_ranges_match"));
    for w in 1..=32u32 {
        for t in 0..500 {
            let word = match t % 4 {
                0 => r.below(1 << 20),
                1 => (1u64 << 32) - 1 - r.below(64),
                2 => (1u64 << 32) + r.below(64),
                _ => r.below(1 << 40),
            };
            let n = if t % 2 == 0 {
                u64::MAX
            } else {
                1 + r.below(1 << 41)
            };
            let bit0 = word as u128 * 32;
            let i0 = (bit0 / w as u128) as u64;
            let i1 = ((bit0 + 32).div_ceil(w as u128) as u64).min(n);
            assert_eq!(
                host::word_elems(n, w, word),
                (i0, i1),
                "w = {w}, word = {word}, n = {n}"
            );
        }
    }
}

#[test]
fn block_tree_sums_match() {
    let mut r = Rng::new(seed("block_tree_sums_match"));
    for _ in 0..2_000 {
        let len = r.below(257) as usize;
        let x: Vec<f32> = (0..len).map(|_| r.mixed()).collect();
        same_f32(
            "tree_sum |x|",
            host::tree_sum_block(&x, false),
            elem::tree_sum_block(&x, f32::abs),
            len,
        );
        same_f32(
            "tree_sum x²",
            host::tree_sum_block(&x, true),
            elem::tree_sum_block(&x, |v| v * v),
            len,
        );
    }
    // The order is the documented one: 1e8 + (-1e8) first, then + 1.
    let mut x = vec![0.0f32; 256];
    x[0] = 1e8;
    x[128] = 1e8;
    x[1] = 1.0;
    assert_eq!(
        host::tree_sum_block(&x, false),
        elem::tree_sum_block(&x, f32::abs)
    );
}

#[test]
fn bucket_reductions_match() {
    let mut r = Rng::new(seed("bucket_reductions_match"));
    let mut lengths: Vec<usize> = LENGTHS.to_vec();
    // 600 000 in one bucket: more than 256 block partials and spans, so the finalize kernels'
    // staging through shared memory runs several rounds.
    lengths.extend([2048, 4096, 4097, 10_000, 600_000]);
    lengths.push(r.below(20_000) as usize);
    for &n in &lengths {
        let x = input(&mut r, n);
        let buckets = if n > 20_000 {
            // Emulating 256 threads per bucket costs too much for tiny buckets of long chunks.
            vec![n, 131_073]
        } else {
            vec![
                n.max(1),
                1,
                7,
                256,
                300,
                2048,
                2049,
                1 + r.below(5000) as usize,
            ]
        };
        for bucket in buckets {
            let bucket = bucket.min(n.max(1));
            let chunks: Vec<&[f32]> = x.chunks(bucket).collect();
            let what = |s: &str| format!("{s} (n = {n}, bucket = {bucket})");
            let want: Vec<f32> = chunks.iter().map(|c| elem::mean_abs(c)).collect();
            assert_same_bits(
                &what("mean |x|"),
                &host::bucket_stats(&x, bucket, BucketStat::MeanAbs),
                &want,
            );
            let want: Vec<f32> = chunks.iter().map(|c| elem::l2_norm(c)).collect();
            assert_same_bits(
                &what("l2"),
                &host::bucket_stats(&x, bucket, BucketStat::L2),
                &want,
            );
            let want: Vec<f32> = chunks.iter().map(|c| elem::max_abs(c)).collect();
            assert_same_bits(
                &what("max |x|"),
                &host::bucket_stats(&x, bucket, BucketStat::MaxAbs),
                &want,
            );
            let want: Vec<f32> = chunks
                .iter()
                .flat_map(|c| {
                    let (lo, hi) = elem::min_max(c);
                    [elem::canonical_zero(lo), elem::canonical_zero(hi)]
                })
                .collect();
            assert_same_bits(
                &what("(min, max)"),
                &host::bucket_stats(&x, bucket, BucketStat::MinMax),
                &want,
            );
        }
    }
}

#[test]
fn launch_geometry_matches() {
    let mut r = Rng::new(seed("launch_geometry_matches"));
    for w in 1..=32 {
        assert_eq!(
            host::pack_tile_capacity(w),
            pushpull_kernels::cuda::scheme::pack_tile_capacity(w),
            "tile capacity for w = {w}"
        );
        // The codec launches this much dynamic shared memory: below the 48 KiB default limit.
        assert!(4 * host::pack_tile_capacity(w) <= 48 * 1024);
    }
    for _ in 0..10_000 {
        let n = r.below(1 << 30);
        let bucket = 1 + r.below(n.max(1));
        for unit in [256, 2048] {
            assert_eq!(
                host::num_pieces(n, bucket, unit),
                pushpull_kernels::cuda::scheme::num_pieces(n, bucket, unit),
                "pieces of n = {n}, bucket = {bucket}, unit = {unit}"
            );
        }
    }
}

#[test]
fn bit_stream_reader_matches_the_documented_layout() {
    let mut r = Rng::new(seed("bit_stream_reader_matches_the_documented_layout"));
    for _ in 0..200 {
        let w = 1 + r.below(32) as u32;
        let n = r.below(300);
        let bytes: Vec<u8> = (0..4 * (n * w as u64).div_ceil(32))
            .map(|_| r.u32() as u8)
            .collect();
        for i in 0..n {
            // Stream bit j is bit j % 32 of little-endian word j / 32 = bit j % 8 of byte j / 8.
            let mut want = 0u32;
            for b in 0..w as u64 {
                let j = i * w as u64 + b;
                let bit = (bytes[(j / 8) as usize] >> (j % 8)) & 1;
                want |= (bit as u32) << b;
            }
            assert_eq!(host::read_code(&bytes, i, w), want, "code {i} of width {w}");
        }
    }
}
