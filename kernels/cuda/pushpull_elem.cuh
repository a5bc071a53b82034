// pushpull_elem.cuh: the per-element math, randomness, reductions and per-thread work units of
// the CUDA compressors, written once as `__host__ __device__` functions.
//
// This header is the CUDA twin of `kernels/src/rng.rs` and `kernels/src/elem.rs`; every function
// here mirrors one there bit for bit (same f32/f64 operations in the same order, no fused
// multiply-add, integer bit manipulation for the 16-bit casts). It compiles three ways:
//
//   * under NVRTC (`__CUDACC_RTC__`): no standard headers exist there, so the integer types are
//     typedef'd here and math functions (floorf, sqrt) are NVRTC built-ins. NVRTC is run with
//     `--fmad=false --ftz=false --prec-div=true --prec-sqrt=true` (see src/cuda/mod.rs);
//   * under nvcc (`__CUDACC__`), should someone build the .cu ahead of time;
//   * by a host C++ compiler (kernels/build.rs, `-O2 -ffp-contract=off -fno-fast-math`), where
//     `__host__`/`__device__` are defined empty. kernels/cuda/host_shim.cpp wraps the functions
//     for the Rust tests (kernels/tests/cuda_host.rs) and emulates each kernel over a chunk by
//     calling the same per-thread functions serially.
//
// Changing a formula here changes the wire format: change rng.rs / elem.rs with it (and the other
// way round). The wire formats are documented in src/cuda/mod.rs.

#ifndef PUSHPULL_ELEM_CUH
#define PUSHPULL_ELEM_CUH

#if defined(__CUDACC__)
#define PP_HD __host__ __device__ __forceinline__
#else
#ifndef __host__
#define __host__
#endif
#ifndef __device__
#define __device__
#endif
#define PP_HD inline
#include <math.h>
#include <string.h>
#endif

typedef unsigned short pp_u16;
typedef unsigned int pp_u32;
typedef int pp_i32;
typedef unsigned long long pp_u64;

// ------------------------------------------------------------------------------------------------
// Constants shared with the Rust side.
// ------------------------------------------------------------------------------------------------

// Elements per reduction block (elem::REDUCE_BLOCK): one 256-thread CUDA block.
#define PP_REDUCE_BLOCK 256u
// Elements per min/max span: one warp, 64 elements per lane.
#define PP_SPAN 2048u
// Block partials per group of the f64 sum (elem::SUM_GROUP): a bucket's partials are added in
// order within groups of this many, then the group sums in order.
#define PP_SUM_GROUP 256u
// Pieces (reduction blocks or spans) per bucket above which a finalize kernel spends a whole
// CUDA block on each bucket instead of one thread.
#define PP_WIDE_BUCKET 256u
// Output u32 words per block of a pack (compress) kernel; the kernel needs exactly this many
// threads per block.
#define PP_PACK_WORDS 256u
// Elements per thread in the decompress kernels.
#define PP_GROUP 4u

// rng.rs: GOLDEN, DOMAIN_ROUNDING, DOMAIN_INDICES.
#define PP_GOLDEN 0x9e3779b97f4a7c15ULL
#define PP_DOMAIN_ROUNDING 0x726f756e64696e67ULL
#define PP_DOMAIN_INDICES 0x696e646963657321ULL

// ------------------------------------------------------------------------------------------------
// Bit casts and integer helpers.
// ------------------------------------------------------------------------------------------------

PP_HD pp_u32 pp_f32_bits(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    pp_u32 u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

PP_HD float pp_f32_from_bits(pp_u32 u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

// Leading zeros of a 64-bit value; 64 for 0 (Rust's u64::leading_zeros).
PP_HD pp_u32 pp_clz64(pp_u64 x) {
#if defined(__CUDA_ARCH__)
    return (pp_u32)__clzll((long long)x);
#else
    return x == 0 ? 64u : (pp_u32)__builtin_clzll(x);
#endif
}

// Leading zeros of a 32-bit value; 32 for 0 (Rust's u32::leading_zeros).
PP_HD pp_u32 pp_clz32(pp_u32 x) {
#if defined(__CUDA_ARCH__)
    return (pp_u32)__clz((int)x);
#else
    return x == 0 ? 32u : (pp_u32)__builtin_clz(x);
#endif
}

// Rust's `f as u32`: truncation toward zero, saturating, NaN gives 0.
PP_HD pp_u32 pp_f32_to_u32_sat(float f) {
    if (!(f > -1.0f)) {
        return 0u;  // NaN, or <= -1
    }
    if (f >= 4294967296.0f) {
        return 0xffffffffu;
    }
    return (pp_u32)f;  // (-1, 2^32): truncation is defined (gives 0 on (-1, 0))
}

// Rust's f32::clamp (NaN passes through).
PP_HD float pp_clampf(float x, float lo, float hi) {
    if (x < lo) {
        x = lo;
    }
    if (x > hi) {
        x = hi;
    }
    return x;
}

PP_HD pp_u32 pp_min_u32(pp_u32 a, pp_u32 b) { return a < b ? a : b; }
PP_HD pp_u64 pp_min_u64(pp_u64 a, pp_u64 b) { return a < b ? a : b; }

// ------------------------------------------------------------------------------------------------
// rng.rs: counter-based randomness.
// ------------------------------------------------------------------------------------------------

// SplitMix64's finaliser (rng::mix64).
PP_HD pp_u64 pp_mix64(pp_u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// Stream::rounding(seed, key, round, role, rank).base(); role_tag: worker 0, server 1.
PP_HD pp_u64 pp_stream_rounding(pp_u64 seed, pp_u64 key, pp_u64 round, pp_u64 role_tag,
                                pp_u32 rank) {
    pp_u64 h = pp_mix64(seed ^ PP_DOMAIN_ROUNDING);
    h = pp_mix64(h ^ key);
    h = pp_mix64(h ^ round);
    h = pp_mix64(h ^ ((role_tag << 32) | (pp_u64)rank));
    return h;
}

// Stream::indices(seed, key, round).base().
PP_HD pp_u64 pp_stream_indices(pp_u64 seed, pp_u64 key, pp_u64 round) {
    pp_u64 h = pp_mix64(seed ^ PP_DOMAIN_INDICES);
    h = pp_mix64(h ^ key);
    h = pp_mix64(h ^ round);
    return h;
}

// Stream::draw: mix64(base + counter * GOLDEN).
PP_HD pp_u64 pp_draw(pp_u64 base, pp_u64 counter) {
    return pp_mix64(base + counter * PP_GOLDEN);
}

// rng::uniform_from_bits: bits * 2^-16, exact in f32 (16-bit uniforms, wire format version 3).
PP_HD float pp_uniform_from_bits(pp_u16 bits) { return (float)bits * (1.0f / 65536.0f); }

// Stream::uniform(i): draw i/4, 16-bit lane i%4 (lane 0 = the low 16 bits).
PP_HD float pp_uniform(pp_u64 base, pp_u64 i) {
    pp_u64 d = pp_draw(base, i >> 2);
    return pp_uniform_from_bits((pp_u16)(d >> (16u * (pp_u32)(i & 3u))));
}

// Stream::uniform for increasing element indices, computing each 64-bit draw once per four
// elements.
struct PPUniforms {
    pp_u64 base;
    pp_u64 quad;
    pp_u64 d;
    bool valid;

    PP_HD float at(pp_u64 i) {
        pp_u64 q = i >> 2;
        if (!valid || q != quad) {
            d = pp_draw(base, q);
            quad = q;
            valid = true;
        }
        return pp_uniform_from_bits((pp_u16)(d >> (16u * (pp_u32)(i & 3u))));
    }
};

PP_HD PPUniforms pp_uniforms(pp_u64 base) {
    PPUniforms u;
    u.base = base;
    u.quad = 0;
    u.d = 0;
    u.valid = false;
    return u;
}

// rng::Permutation: 4-round balanced Feistel network on the smallest even power of two >= n
// (at least 4), with cycle walking.
struct PPPerm {
    pp_u64 n;
    pp_u32 half_bits;
    pp_u64 key;
};

PP_HD PPPerm pp_perm_new(pp_u64 n, pp_u64 key) {
    pp_u64 m = n > 0 ? n - 1 : 0;  // n.saturating_sub(1)
    pp_u32 bits = 64u - pp_clz64(m);
    if (bits < 2u) {
        bits = 2u;
    }
    if (bits % 2u == 1u) {
        bits += 1u;
    }
    PPPerm p;
    p.n = n;
    p.half_bits = bits / 2u;
    p.key = key;
    return p;
}

PP_HD pp_u64 pp_feistel(PPPerm p, pp_u64 x) {
    pp_u64 mask = (1ULL << p.half_bits) - 1ULL;
    pp_u64 l = x >> p.half_bits;
    pp_u64 r = x & mask;
    for (pp_u64 round = 0; round < 4; ++round) {
        pp_u64 f = pp_mix64(p.key ^ (round << 56) ^ r) & mask;
        pp_u64 next_r = l ^ f;
        l = r;
        r = next_r;
    }
    return (l << p.half_bits) | r;
}

// Permutation::permute(j) for j < n.
PP_HD pp_u64 pp_permute(PPPerm p, pp_u64 j) {
    pp_u64 x = pp_feistel(p, j);
    while (x >= p.n) {
        x = pp_feistel(p, x);
    }
    return x;
}

// ------------------------------------------------------------------------------------------------
// elem.rs: per-element math.
// ------------------------------------------------------------------------------------------------

// elem::stochastic_round: floor(t), plus one when u < t - floor(t).
PP_HD pp_u32 pp_stochastic_round(float t, float u) {
    float fl = floorf(t);
    float frac = t - fl;
    return pp_f32_to_u32_sat(fl) + (u < frac ? 1u : 0u);
}

// elem::sign_bit: 1 for x < 0 (so -0.0 gives 0).
PP_HD pp_u32 pp_sign_bit(float x) { return x < 0.0f ? 1u : 0u; }

// half::f16::from_f32 (round to nearest even, the crate's portable fallback) on the bits.
PP_HD pp_u16 pp_f32_to_f16_bits(float value) {
    pp_u32 x = pp_f32_bits(value);
    pp_u32 sign = x & 0x80000000u;
    pp_u32 exp = x & 0x7f800000u;
    pp_u32 man = x & 0x007fffffu;
    if (exp == 0x7f800000u) {
        pp_u32 nan_bit = man == 0 ? 0u : 0x0200u;
        return (pp_u16)((sign >> 16) | 0x7c00u | nan_bit | (man >> 13));
    }
    pp_u32 half_sign = sign >> 16;
    pp_i32 unbiased_exp = (pp_i32)(exp >> 23) - 127;
    pp_i32 half_exp = unbiased_exp + 15;
    if (half_exp >= 0x1f) {
        return (pp_u16)(half_sign | 0x7c00u);
    }
    if (half_exp <= 0) {
        if (14 - half_exp > 24) {
            return (pp_u16)half_sign;
        }
        pp_u32 m = man | 0x00800000u;
        pp_u32 half_man = m >> (14 - half_exp);
        pp_u32 round_bit = 1u << (13 - half_exp);
        if ((m & round_bit) != 0 && (m & (3u * round_bit - 1u)) != 0) {
            half_man += 1u;
        }
        return (pp_u16)(half_sign | half_man);
    }
    pp_u32 he = ((pp_u32)half_exp) << 10;
    pp_u32 half_man = man >> 13;
    pp_u32 round_bit = 0x00001000u;
    if ((man & round_bit) != 0 && (man & (3u * round_bit - 1u)) != 0) {
        return (pp_u16)((half_sign | he | half_man) + 1u);
    }
    return (pp_u16)(half_sign | he | half_man);
}

// elem::f32_to_f16_sat: clamp to +-65504, then round to nearest even.
PP_HD pp_u16 pp_f32_to_f16_sat(float x) {
    return pp_f32_to_f16_bits(pp_clampf(x, -65504.0f, 65504.0f));
}

// elem::f16_to_f32 (half's fallback; exact).
PP_HD float pp_f16_to_f32(pp_u16 i) {
    if ((i & 0x7fffu) == 0) {
        return pp_f32_from_bits(((pp_u32)i) << 16);
    }
    pp_u32 half_sign = (pp_u32)(i & 0x8000u);
    pp_u32 half_exp = (pp_u32)(i & 0x7c00u);
    pp_u32 half_man = (pp_u32)(i & 0x03ffu);
    if (half_exp == 0x7c00u) {
        if (half_man == 0) {
            return pp_f32_from_bits((half_sign << 16) | 0x7f800000u);
        }
        return pp_f32_from_bits((half_sign << 16) | 0x7fc00000u | (half_man << 13));
    }
    pp_u32 sign = half_sign << 16;
    pp_i32 unbiased_exp = ((pp_i32)half_exp >> 10) - 15;
    if (half_exp == 0) {
        // Subnormal: normalise. leading_zeros of the 16-bit mantissa, minus 6.
        pp_i32 e = (pp_i32)(pp_clz32(half_man) - 16u) - 6;
        pp_u32 exp = ((pp_u32)(127 - 15 - e)) << 23;
        pp_u32 man = (half_man << (14 + e)) & 0x7fffffu;
        return pp_f32_from_bits(sign | exp | man);
    }
    pp_u32 exp = ((pp_u32)(unbiased_exp + 127)) << 23;
    pp_u32 man = (half_man & 0x03ffu) << 13;
    return pp_f32_from_bits(sign | exp | man);
}

// half::bf16::from_f32 (round to nearest even) on the bits.
PP_HD pp_u16 pp_f32_to_bf16_bits(float value) {
    pp_u32 x = pp_f32_bits(value);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (pp_u16)((x >> 16) | 0x0040u);
    }
    pp_u32 round_bit = 0x00008000u;
    if ((x & round_bit) != 0 && (x & (3u * round_bit - 1u)) != 0) {
        return (pp_u16)((x >> 16) + 1u);
    }
    return (pp_u16)(x >> 16);
}

// elem::f32_to_bf16_sat: clamp to +-BF16_MAX (0x7f7f0000 as f32), then round to nearest even.
PP_HD pp_u16 pp_f32_to_bf16_sat(float x) {
    float bf16_max = pp_f32_from_bits(0x7f7f0000u);
    return pp_f32_to_bf16_bits(pp_clampf(x, -bf16_max, bf16_max));
}

// elem::bf16_to_f32 (exact; NaN payloads kept bit for bit, as the CPU decoder does).
PP_HD float pp_bf16_to_f32(pp_u16 i) {
    return pp_f32_from_bits(((pp_u32)i) << 16);
}

// elem::minmax_step: (max - min) / levels.
PP_HD float pp_minmax_step(float mn, float mx, pp_u32 levels) {
    return (mx - mn) / (float)levels;
}

// elem::bucket_factor: num / den when den > 0 and the quotient is finite, else 0 (the element
// functions then divide by den instead). Division is IEEE (--prec-div=true).
//
// Wire format version 3 multiplies each element by this per-bucket factor instead of dividing.
// The products (x - mn) * inv_step, |x| * scale and |x| * inv are plain f32 multiplications,
// rounded once: like every other product in this header they rely on NVRTC's --fmad=false (and
// -ffp-contract=off on the host) to stay unfused; none of them feeds an addition directly (a
// clamp or min sits between the product and t - floor(t)), so even an nvcc build with the
// default --fmad=true has nothing to contract there.
PP_HD float pp_bucket_factor(float num, float den) {
    if (den > 0.0f) {
        float f = num / den;
        if ((pp_f32_bits(f) & 0x7f800000u) != 0x7f800000u) {  // finite
            return f;
        }
    }
    return 0.0f;
}

// elem::minmax_inv_step: bucket_factor(1, step).
PP_HD float pp_minmax_inv_step(float step) { return pp_bucket_factor(1.0f, step); }

// codecs::fast::clamped_round: stochastic_round(clamp(t, 0, hi), u), at most hi.
PP_HD pp_u32 pp_clamped_round(float t, pp_u32 hi, float u) {
    float c = pp_clampf(t, 0.0f, (float)hi);
    return pp_min_u32(pp_stochastic_round(c, u), hi);
}

// elem::minmax_code with the bucket's inv_step = pp_minmax_inv_step(step) precomputed:
// t = (x - mn) * inv_step (two roundings; no FMA: NVRTC runs with --fmad=false, the host twin
// with -ffp-contract=off), or (x - mn) / step when inv_step is 0.
PP_HD pp_u32 pp_minmax_code_inv(float x, float mn, float step, float inv_step, pp_u32 levels,
                                float u) {
    if (step > 0.0f) {
        float d = x - mn;
        float t = inv_step != 0.0f ? d * inv_step : d / step;
        return pp_clamped_round(t, levels, u);
    }
    return 0u;
}

// elem::minmax_code.
PP_HD pp_u32 pp_minmax_code(float x, float mn, float step, pp_u32 levels, float u) {
    return pp_minmax_code_inv(x, mn, step, pp_minmax_inv_step(step), levels, u);
}

// elem::minmax_value: min + q * step (two roundings, no FMA).
PP_HD float pp_minmax_value(pp_u32 q, float mn, float step) {
    float qs = (float)q * step;
    return mn + qs;
}

// elem::dither_linear_scale: bucket_factor(s, norm).
PP_HD float pp_dither_linear_scale(float norm, pp_u32 s) {
    return pp_bucket_factor((float)s, norm);
}

// elem::dither_linear_level with the bucket's scale = pp_dither_linear_scale(norm, s)
// precomputed: t = |x| * scale, or |x| / norm * s when scale is 0.
PP_HD pp_u32 pp_dither_linear_level_f(float x, float norm, float scale, pp_u32 s, float u) {
    if (norm > 0.0f) {
        float t;
        if (scale != 0.0f) {
            t = fabsf(x) * scale;
        } else {
            float r = fabsf(x) / norm;
            t = r * (float)s;
        }
        return pp_clamped_round(t, s, u);
    }
    return 0u;
}

// elem::dither_linear_level.
PP_HD pp_u32 pp_dither_linear_level(float x, float norm, pp_u32 s, float u) {
    return pp_dither_linear_level_f(x, norm, pp_dither_linear_scale(norm, s), s, u);
}

// elem::dither_linear_value: +-(norm * level) / s.
PP_HD float pp_dither_linear_value(pp_u32 level, pp_u32 sign, float norm, pp_u32 s) {
    float nl = norm * (float)level;
    float v = nl / (float)s;
    return sign != 0 ? -v : v;
}

// elem::pow2: 2^e for -126 <= e <= 127 (exact).
PP_HD float pp_pow2(pp_i32 e) { return pp_f32_from_bits(((pp_u32)(e + 127)) << 23); }

// elem::dither_natural_inv: bucket_factor(1, norm).
PP_HD float pp_dither_natural_inv(float norm) { return pp_bucket_factor(1.0f, norm); }

// elem::dither_natural_level (1 <= s <= 32) with the bucket's inv = pp_dither_natural_inv(norm)
// precomputed: r = |x| * inv, or |x| / norm when inv is 0.
PP_HD pp_u32 pp_dither_natural_level_f(float x, float norm, float inv, pp_u32 s, float u) {
    if (!(norm > 0.0f)) {
        return 0u;
    }
    float r = inv != 0.0f ? fabsf(x) * inv : fabsf(x) / norm;
    // f32::min(r, 1.0); r is never NaN here (norm > 0, x finite or the caller rejected it).
    if (!(r <= 1.0f)) {
        r = 1.0f;
    }
    if (r >= 1.0f) {
        return s;
    }
    pp_i32 bottom = 1 - (pp_i32)s;
    if (r < pp_pow2(bottom)) {
        float p = r * pp_pow2((pp_i32)s - 1);
        return u < p ? 1u : 0u;
    }
    pp_i32 e = (pp_i32)((pp_f32_bits(r) >> 23) & 0xffu) - 127;
    float scaled = r * pp_pow2(-e);
    float p = scaled - 1.0f;
    pp_u32 lower = (pp_u32)(e - bottom + 1);
    return lower + (u < p ? 1u : 0u);
}

// elem::dither_natural_level (1 <= s <= 32).
PP_HD pp_u32 pp_dither_natural_level(float x, float norm, pp_u32 s, float u) {
    return pp_dither_natural_level_f(x, norm, pp_dither_natural_inv(norm), s, u);
}

// elem::dither_natural_value: 0 for level 0, else +-norm * 2^(level - s).
PP_HD float pp_dither_natural_value(pp_u32 level, pp_u32 sign, float norm, pp_u32 s) {
    if (level == 0) {
        return 0.0f;
    }
    float v = norm * pp_pow2((pp_i32)level - (pp_i32)s);
    return sign != 0 ? -v : v;
}

// Code width of packed dithering: 1 sign bit + the bit length of s.
PP_HD pp_u32 pp_dither_width(pp_u32 s) { return 1u + (32u - pp_clz32(s)); }

// Random-k scale: n / k when unbiased, else 1 (both converted to f32 first, like Rust's `as`).
PP_HD float pp_randomk_scale(pp_u64 n, pp_u64 k, bool unbiased) {
    if (!unbiased || k == 0) {
        return 1.0f;
    }
    return (float)n / (float)k;
}

// ------------------------------------------------------------------------------------------------
// Geometry: buckets, reduction blocks, spans, bit streams.
//
// A chunk of n elements is cut into nb = ceil(n / bucket) buckets (bucket >= 1; the caller
// passes bucket = n for "the whole chunk"). Sum reductions cut each bucket into blocks of 256
// counted from the bucket start; block g of the whole chunk is block g % bpb of bucket g / bpb
// with bpb = ceil(bucket / 256) (the last bucket may have fewer blocks; they come last).
// Min/max reductions do the same with spans of 2048.
// ------------------------------------------------------------------------------------------------

PP_HD pp_u64 pp_div_ceil(pp_u64 a, pp_u64 b) { return a / b + (a % b != 0 ? 1u : 0u); }

PP_HD pp_u64 pp_num_buckets(pp_u64 n, pp_u64 bucket) { return n == 0 ? 0 : pp_div_ceil(n, bucket); }

PP_HD pp_u64 pp_bucket_len(pp_u64 n, pp_u64 bucket, pp_u64 b) {
    return pp_min_u64(bucket, n - b * bucket);
}

// Number of `unit`-element pieces (blocks or spans) of a chunk, counted per bucket.
PP_HD pp_u64 pp_num_pieces(pp_u64 n, pp_u64 bucket, pp_u64 unit) {
    pp_u64 nb = pp_num_buckets(n, bucket);
    if (nb == 0) {
        return 0;
    }
    pp_u64 per = pp_div_ceil(bucket, unit);
    return (nb - 1) * per + pp_div_ceil(pp_bucket_len(n, bucket, nb - 1), unit);
}

// Element range [start, end) of piece g.
PP_HD void pp_piece_range(pp_u64 n, pp_u64 bucket, pp_u64 unit, pp_u64 g, pp_u64* start,
                          pp_u64* end) {
    pp_u64 per = pp_div_ceil(bucket, unit);
    pp_u64 b = g / per;
    pp_u64 l = g % per;
    pp_u64 b0 = b * bucket;
    pp_u64 b1 = pp_min_u64(b0 + bucket, n);
    *start = b0 + l * unit;
    *end = pp_min_u64(*start + unit, b1);
}

// Bytes / words of a bit stream of n codes of w bits: 4 * ceil(n * w / 32).
PP_HD pp_u64 pp_stream_words(pp_u64 n, pp_u32 w) { return pp_div_ceil(n * (pp_u64)w, 32); }

// Header words (f32 values) in front of each bit stream.
PP_HD pp_u64 pp_onebit_header_words() { return 1; }
PP_HD pp_u64 pp_minmax_header_words(pp_u64 n, pp_u64 bucket) {
    return 2 * pp_num_buckets(n, bucket);
}
PP_HD pp_u64 pp_dither_header_words(pp_u64 n, pp_u64 bucket) { return pp_num_buckets(n, bucket); }

// Code i of a bit stream (stream bit j = bit j % 32 of word j / 32), 1 <= w <= 32.
PP_HD pp_u32 pp_read_code(const pp_u32* words, pp_u64 i, pp_u32 w) {
    pp_u64 bit = i * (pp_u64)w;
    pp_u64 word = bit >> 5;
    pp_u32 off = (pp_u32)(bit & 31u);
    pp_u32 c = words[word] >> off;
    if (off + w > 32u) {
        c |= words[word + 1] << (32u - off);
    }
    pp_u32 mask = w >= 32u ? 0xffffffffu : ((1u << w) - 1u);
    return c & mask;
}

// Which bucket element i is in, for increasing i: one division per bucket change.
struct PPBucketCursor {
    pp_u64 bucket;
    pp_u64 b;
    pp_u64 start;
    pp_u64 end;
    bool valid;

    // Returns true when the bucket changed (the caller reloads its parameters).
    PP_HD bool seek(pp_u64 i) {
        if (valid && i >= start && i < end) {
            return false;
        }
        // A 32-bit division where it suffices (a 64-bit one is a long routine on a GPU).
        b = (i | bucket) >> 32 == 0 ? (pp_u64)((pp_u32)i / (pp_u32)bucket) : i / bucket;
        start = b * bucket;
        end = start + bucket;
        valid = true;
        return true;
    }
};

PP_HD PPBucketCursor pp_bucket_cursor(pp_u64 bucket) {
    PPBucketCursor c;
    c.bucket = bucket;
    c.b = 0;
    c.start = 0;
    c.end = 0;
    c.valid = false;
    return c;
}

// ------------------------------------------------------------------------------------------------
// Reductions. The kernels run the steps below in parallel (a warp per reduction block or span,
// shuffles between lanes, a CUDA block per wide bucket); the host emulation runs the same steps
// serially, lane by lane and level by level. Within a level no lane reads a slot another lane
// writes, so the two are the same computation.
// ------------------------------------------------------------------------------------------------

// The value a reduction sums: op 0 = |x|, op 1 = x * x (an f32 product).
PP_HD float pp_reduce_value(float x, pp_u32 op) { return op == 0 ? fabsf(x) : x * x; }

// One level of elem::tree_sum_block: s[t] += s[t + stride] for t < stride.
PP_HD void pp_tree_sum_step(float* s, pp_u32 t, pp_u32 stride) {
    if (t < stride) {
        s[t] = s[t] + s[t + stride];
    }
}

// The whole tree, serially (elem::tree_sum_block on a zero-padded block of 256).
PP_HD float pp_tree_sum_256(float* s) {
    for (pp_u32 stride = PP_REDUCE_BLOCK / 2; stride > 0; stride /= 2) {
        for (pp_u32 t = 0; t < stride; ++t) {
            pp_tree_sum_step(s, t, stride);
        }
    }
    return s[0];
}

// Lane l (0..32) of the warp that reduces block g loads the block's elements l + 32k
// (k = 0..7), 0 past the block's end.
PP_HD void pp_block_lane_load(const float* x, pp_u64 n, pp_u64 bucket, pp_u64 g, pp_u32 l,
                              float* v) {
    pp_u64 start, end;
    pp_piece_range(n, bucket, PP_REDUCE_BLOCK, g, &start, &end);
    for (pp_u32 k = 0; k < 8u; ++k) {
        pp_u64 i = start + l + 32u * k;
        v[k] = i < end ? x[i] : 0.0f;
    }
}

// The lane's slot of the tree after strides 128 (slot l + 32k absorbs l + 32(k + 4)), 64 (l,
// l + 32 absorb l + 64, l + 96) and 32 (l absorbs l + 32), from its loaded elements.
PP_HD float pp_block_lane_sum(const float* v, pp_u32 op) {
    float a0 = pp_reduce_value(v[0], op) + pp_reduce_value(v[4], op);
    float a1 = pp_reduce_value(v[1], op) + pp_reduce_value(v[5], op);
    float a2 = pp_reduce_value(v[2], op) + pp_reduce_value(v[6], op);
    float a3 = pp_reduce_value(v[3], op) + pp_reduce_value(v[7], op);
    float b0 = a0 + a2, b1 = a1 + a3;
    return b0 + b1;
}

// Lane l (0..32) of the warp that reduces block g: slot l of the tree after its first three
// levels (strides 128, 64, 32), computed from the lane's own slots l + 32k (k = 0..7), f(x) or
// 0 past the block's end. The warp finishes with strides 16 .. 1 across lanes
// (pp_tree_sum_step on the 32 lane values): the same additions as the 256-slot tree.
PP_HD float pp_block_sum_lane(const float* x, pp_u64 n, pp_u64 bucket, pp_u64 g, pp_u32 l,
                              pp_u32 op) {
    float v[8];
    pp_block_lane_load(x, n, bucket, g, l, v);
    return pp_block_lane_sum(v, op);
}

// Bucket b's statistic from its block partials: added in f64 in block order within groups of
// PP_SUM_GROUP partials (each from -0.0 like Rust's f64 Sum), then the group sums in order
// (elem::sum_partials). mode 0: (sum / len) as f32 (elem::mean_abs); mode 1: sqrt(sum) as f32
// (elem::l2_norm).
PP_HD double pp_add_in_order(double sum, const double* p, pp_u64 count) {
    for (pp_u64 k = 0; k < count; ++k) {
        sum = sum + p[k];
    }
    return sum;
}

// Group j of the `count` partials at p, added in order from -0.0.
PP_HD double pp_sum_group(const double* p, pp_u64 count, pp_u64 j) {
    pp_u64 k0 = j * PP_SUM_GROUP;
    return pp_add_in_order(-0.0, p + k0, pp_min_u64(PP_SUM_GROUP, count - k0));
}

PP_HD float pp_finalize_value(double sum, pp_u64 len, pp_u32 mode) {
    if (mode == 0) {
        return (float)(sum / (double)len);
    }
    return (float)sqrt(sum);
}

// The partials of bucket b: its first index and how many there are.
PP_HD void pp_bucket_pieces(pp_u64 n, pp_u64 bucket, pp_u64 unit, pp_u64 b, pp_u64* first,
                            pp_u64* count) {
    *first = b * pp_div_ceil(bucket, unit);
    *count = pp_div_ceil(pp_bucket_len(n, bucket, b), unit);
}

// Whether buckets of `bucket` elements have more than PP_WIDE_BUCKET pieces of `unit`.
PP_HD bool pp_wide_buckets(pp_u64 bucket, pp_u64 unit) {
    return pp_div_ceil(bucket, unit) > PP_WIDE_BUCKET;
}

// The serial definition (the narrow kernel's thread per bucket).
PP_HD float pp_finalize_sum(const double* partials, pp_u64 n, pp_u64 bucket, pp_u64 b,
                            pp_u32 mode) {
    pp_u64 first, count;
    pp_bucket_pieces(n, bucket, PP_REDUCE_BLOCK, b, &first, &count);
    double sum = -0.0;
    for (pp_u64 j = 0; j < pp_div_ceil(count, PP_SUM_GROUP); ++j) {
        sum = sum + pp_sum_group(partials + first, count, j);
    }
    return pp_finalize_value(sum, pp_bucket_len(n, bucket, b), mode);
}

// elem::canonical_zero: +0.0 for either zero (the wire's min and max never carry -0.0).
PP_HD float pp_canonical_zero(float x) { return x == 0.0f ? 0.0f : x; }

// Whether x is finite (not NaN, not +-Inf).
PP_HD bool pp_is_finite(float x) { return (pp_f32_bits(x) & 0x7f800000u) != 0x7f800000u; }

// Min/max reductions. Only +0 and -0 can compare equal with different bits, and the header
// stores canonical_zero(min), canonical_zero(max), so the header does not depend on the order
// in which values are combined (non-finite input is refused before any header is used): the
// kernels combine in whatever order is fast (lanes strided, shuffles, trees).
// mode 0: (min x, max x), starting from (+inf, -inf); mode 1: max |x| (in hi), starting from 0.
PP_HD void pp_mm_init(pp_u32 mode, float* lo, float* hi) {
    *lo = pp_f32_from_bits(0x7f800000u);
    *hi = mode == 0 ? pp_f32_from_bits(0xff800000u) : 0.0f;
}

PP_HD void pp_mm_combine(pp_u32 mode, float* lo, float* hi, float rlo, float rhi) {
    if (mode == 0 && rlo < *lo) {
        *lo = rlo;
    }
    if (rhi > *hi) {
        *hi = rhi;
    }
}

PP_HD void pp_mm_fold(pp_u32 mode, float* lo, float* hi, float x) {
    if (mode == 0) {
        pp_mm_combine(mode, lo, hi, x, x);
    } else {
        pp_mm_combine(mode, lo, hi, x, fabsf(x));
    }
}

// Lane l (0..32) of the warp that reduces span g folds the span's elements l, l + 32, ...
PP_HD void pp_span_lane(const float* x, pp_u64 n, pp_u64 bucket, pp_u64 g, pp_u32 l,
                        pp_u32 mode, float* lo, float* hi) {
    pp_u64 start, end;
    pp_piece_range(n, bucket, PP_SPAN, g, &start, &end);
    pp_mm_init(mode, lo, hi);
    for (pp_u64 i = start + l; i < end; i += 32u) {
        pp_mm_fold(mode, lo, hi, x[i]);
    }
}

// One level of a tree over slots: slot t (< stride) absorbs t + stride.
PP_HD void pp_mm_tree_step(float* lo, float* hi, pp_u32 t, pp_u32 stride, pp_u32 mode) {
    if (t < stride) {
        pp_mm_combine(mode, &lo[t], &hi[t], lo[t + stride], hi[t + stride]);
    }
}

// Folds span partials (lo, hi pairs) [0, count) into (lo, hi) in span order.
PP_HD void pp_mm_fold_partials(pp_u32 mode, float* lo, float* hi, const float* p, pp_u64 count) {
    for (pp_u64 k = 0; k < count; ++k) {
        pp_mm_combine(mode, lo, hi, p[2 * k], p[2 * k + 1]);
    }
}

// Writes bucket b's header words: mode 0: words 2b, 2b+1 = canonical_zero(min),
// canonical_zero(max); mode 1: word b = max |x|.
PP_HD void pp_mm_store(pp_u32 mode, float lo, float hi, pp_u64 b, pp_u32* hdr) {
    if (mode == 0) {
        hdr[2 * b] = pp_f32_bits(pp_canonical_zero(lo));
        hdr[2 * b + 1] = pp_f32_bits(pp_canonical_zero(hi));
    } else {
        hdr[b] = pp_f32_bits(hi);
    }
}

// Bucket b's min/max from its span partials in span order, into the header (serially: the
// narrow kernel's thread per bucket).
PP_HD void pp_finalize_minmax(const float* partials, pp_u64 n, pp_u64 bucket, pp_u64 b,
                              pp_u32 mode, pp_u32* hdr) {
    pp_u64 first, count;
    pp_bucket_pieces(n, bucket, PP_SPAN, b, &first, &count);
    float lo, hi;
    pp_mm_init(mode, &lo, &hi);
    pp_mm_fold_partials(mode, &lo, &hi, partials + 2 * first, count);
    pp_mm_store(mode, lo, hi, b, hdr);
}

// ------------------------------------------------------------------------------------------------
// Packing: the compress kernels have one thread per output u32 word. The thread computes every
// code that overlaps its word (a code that straddles two words is computed by both threads, the
// same way, since its draw is a pure function of its index) and writes the whole word: no
// atomics. The elements come from a PPTile (the kernel stages them in shared memory, the host
// emulation in a buffer laid out the same way).
// ------------------------------------------------------------------------------------------------

// floor(32 m / w) for a code width w in 1..32, and whether the division is exact, with 32-bit
// divisions while m < 2^32 (m = q w + r: 32 m / w = 32 q + 32 r / w, and 32 r < 1024). A
// 64-bit division costs a GPU thread more than packing a word of 8-bit codes.
PP_HD pp_u64 pp_code_index(pp_u64 m, pp_u32 w, bool* exact) {
    if ((m >> 32) == 0) {
        pp_u32 mm = (pp_u32)m;
        pp_u32 q = mm / w;
        pp_u32 t = 32u * (mm - q * w);
        *exact = t % w == 0u;
        return 32ull * q + t / w;
    }
    pp_u64 bits = m * 32u;
    *exact = bits % w == 0u;
    return bits / w;
}

// Element range [i0, i1) whose codes overlap word `word` (no division when w divides 32).
PP_HD void pp_word_elems(pp_u64 n, pp_u32 w, pp_u64 word, pp_u64* i0, pp_u64* i1) {
    if ((w & (w - 1u)) == 0u) {
        pp_u32 per = 32u / w;
        *i0 = word * per;
        *i1 = pp_min_u64(*i0 + per, n);
        return;
    }
    bool exact;
    *i0 = pp_code_index(word, w, &exact);
    pp_u64 end = pp_code_index(word + 1u, w, &exact);
    *i1 = pp_min_u64(exact ? end : end + 1u, n);
}

// The staged elements of a pack block: element i is at slot pp_tile_slot(i - base). One padding
// float after every 32 keeps the threads of a warp, which read elements 32/w apart, on distinct
// shared-memory banks.
PP_HD pp_u64 pp_tile_slot(pp_u64 e) { return e + (e >> 5); }

struct PPTile {
    const float* t;
    pp_u64 base;
    PP_HD float at(pp_u64 i) const { return t[pp_tile_slot(i - base)]; }
    // Elements i0, i0 + 1, ... of a run that does not cross a multiple of 32 from the base.
    PP_HD const float* run(pp_u64 i0) const { return t + pp_tile_slot(i0 - base); }
};

// The elements where they are (no staging): what pack kernels read when the code width is a
// power of two, whose words need no element twice.
struct PPDirect {
    const float* x;
    PP_HD float at(pp_u64 i) const { return x[i]; }
    PP_HD const float* run(pp_u64 i0) const { return x + i0; }
};

PP_HD PPDirect pp_direct(const float* x) {
    PPDirect d;
    d.x = x;
    return d;
}

// Code widths whose words a pack kernel fills straight from the elements: powers of two up to
// 8 (codes never straddle words, and a word starts at a multiple of four elements).
PP_HD bool pp_direct_width(pp_u32 w) { return w <= 8u && (w & (w - 1u)) == 0u; }

PP_HD PPTile pp_tile(const float* t, pp_u64 base) {
    PPTile tile;
    tile.t = t;
    tile.base = base;
    return tile;
}

// The elements of word `word`, packed: each code is enc.code(i, x_i). The common case takes a
// shorter road to the same bits: when w is a power of two up to 8 (codes never straddle words,
// and a word's first element is a multiple of 4, so its uniforms come from whole draws) and the
// word lies in one bucket, the thread loads the bucket's parameters once and works in 32-bit
// offsets, one draw per four elements (PPUniforms::at's draws).
template <class Enc, class Src>
PP_HD pp_u32 pp_pack_word(Enc& enc, Src xs, pp_u64 n, pp_u32 w, pp_u64 word) {
    pp_u64 i0, i1;
    pp_word_elems(n, w, word, &i0, &i1);
    pp_u32 out = 0;
    if (pp_direct_width(w) && enc.covers(i0, i1)) {
        // A word's elements are consecutive (in a tile too: a run of 32 / w elements starting
        // at a multiple of 32 / w never crosses a padding slot).
        const float* t = xs.run(i0);
        pp_u32 count = (pp_u32)(i1 - i0);
        for (pp_u32 j = 0; j < count; j += 4u) {
            pp_u64 d = pp_draw(enc.uni.base, (i0 + j) >> 2);
            for (pp_u32 k = 0; k < 4u && j + k < count; ++k) {
                float u = pp_uniform_from_bits((pp_u16)(d >> (16u * k)));
                out |= enc.code_with(t[j + k], u) << ((j + k) * w);
            }
        }
        return out;
    }
    pp_u64 bit0 = word * 32u;
    for (pp_u64 i = i0; i < i1; ++i) {
        pp_u32 c = enc.code(i, xs.at(i));
        pp_u64 bit = i * (pp_u64)w;
        if (bit >= bit0) {
            out |= c << (pp_u32)(bit - bit0);  // bits past 32 belong to the next word
        } else {
            out |= c >> (pp_u32)(bit0 - bit);  // the tail of a code begun in the previous word
        }
    }
    return out;
}

// minmax: b-bit codes, per-bucket (min, max) read from the header words.
struct PPMinMaxEnc {
    const pp_u32* hdr;
    pp_u32 levels;
    PPBucketCursor cur;
    PPUniforms uni;
    float mn;
    float step;
    float inv_step;

    // Moves to element i's bucket, loading its parameters when it changed.
    PP_HD void load(pp_u64 i) {
        if (cur.seek(i)) {
            mn = pp_f32_from_bits(hdr[2 * cur.b]);
            step = pp_minmax_step(mn, pp_f32_from_bits(hdr[2 * cur.b + 1]), levels);
            inv_step = pp_minmax_inv_step(step);
        }
    }

    // Loads i0's bucket; whether it holds every element up to i1.
    PP_HD bool covers(pp_u64 i0, pp_u64 i1) {
        load(i0);
        return i1 <= cur.end;
    }

    // The code of x in the loaded bucket, with uniform u.
    PP_HD pp_u32 code_with(float x, float u) {
        return pp_minmax_code_inv(x, mn, step, inv_step, levels, u);
    }

    PP_HD pp_u32 code(pp_u64 i, float x) {
        load(i);
        return code_with(x, uni.at(i));
    }
};

PP_HD PPMinMaxEnc pp_minmax_enc(const pp_u32* hdr, pp_u64 bucket, pp_u32 bits, pp_u64 stream) {
    PPMinMaxEnc e;
    e.hdr = hdr;
    e.levels = (1u << bits) - 1u;
    e.cur = pp_bucket_cursor(bucket);
    e.uni = pp_uniforms(stream);
    e.mn = 0.0f;
    e.step = 0.0f;
    e.inv_step = 0.0f;
    return e;
}

// packed dithering: code = (level << 1) | sign_bit(x), per-bucket norm from the header words.
struct PPDitherEnc {
    const pp_u32* hdr;
    pp_u32 s;
    bool natural;
    PPBucketCursor cur;
    PPUniforms uni;
    float norm;
    float factor;

    // Moves to element i's bucket, loading its norm when it changed.
    PP_HD void load(pp_u64 i) {
        if (cur.seek(i)) {
            norm = pp_f32_from_bits(hdr[cur.b]);
            factor = natural ? pp_dither_natural_inv(norm) : pp_dither_linear_scale(norm, s);
        }
    }

    // Loads i0's bucket; whether it holds every element up to i1.
    PP_HD bool covers(pp_u64 i0, pp_u64 i1) {
        load(i0);
        return i1 <= cur.end;
    }

    // The code of x in the loaded bucket, with uniform u.
    PP_HD pp_u32 code_with(float x, float u) {
        pp_u32 level = natural ? pp_dither_natural_level_f(x, norm, factor, s, u)
                               : pp_dither_linear_level_f(x, norm, factor, s, u);
        return (level << 1) | pp_sign_bit(x);
    }

    PP_HD pp_u32 code(pp_u64 i, float x) {
        load(i);
        return code_with(x, uni.at(i));
    }
};

PP_HD PPDitherEnc pp_dither_enc(const pp_u32* hdr, pp_u64 bucket, pp_u32 s, bool natural,
                                pp_u64 stream) {
    PPDitherEnc e;
    e.hdr = hdr;
    e.s = s;
    e.natural = natural;
    e.cur = pp_bucket_cursor(bucket);
    e.uni = pp_uniforms(stream);
    e.norm = 0.0f;
    e.factor = 0.0f;
    return e;
}

// The element range a pack block stages in shared memory for words [w0, w0 + PP_PACK_WORDS).
PP_HD void pp_pack_tile(pp_u64 n, pp_u32 w, pp_u64 nwords, pp_u64 w0, pp_u64* e0, pp_u64* e1) {
    pp_u64 last = pp_min_u64(w0 + PP_PACK_WORDS, nwords);
    pp_u64 a, b;
    pp_word_elems(n, w, w0, e0, &b);
    pp_word_elems(n, w, last - 1, &a, e1);
}

// Shared-memory floats a pack block needs for code width w (an upper bound over all tiles,
// padding included).
PP_HD pp_u64 pp_pack_tile_capacity(pp_u32 w) {
    pp_u64 elems = (pp_u64)PP_PACK_WORDS * 32u / w + 2u;
    return pp_tile_slot(elems) + 1u;
}

// ------------------------------------------------------------------------------------------------
// Decoding: the decompress kernels have one thread per group of PP_GROUP consecutive elements.
// Each function writes the decoded values of elements [i0, i0 + count) into vals.
// ------------------------------------------------------------------------------------------------

PP_HD void pp_onebit_decode_group(const pp_u32* payload, pp_u64 i0, pp_u32 count, float* vals) {
    float scale = pp_f32_from_bits(payload[0]);
    const pp_u32* words = payload + pp_onebit_header_words();
    for (pp_u32 k = 0; k < count; ++k) {
        pp_u32 bit = pp_read_code(words, i0 + k, 1u);
        vals[k] = bit != 0 ? -scale : scale;
    }
}

PP_HD void pp_minmax_decode_group(const pp_u32* payload, pp_u64 n, pp_u64 bucket, pp_u32 bits,
                                  pp_u64 i0, pp_u32 count, float* vals) {
    const pp_u32* words = payload + pp_minmax_header_words(n, bucket);
    pp_u32 levels = (1u << bits) - 1u;
    PPBucketCursor cur = pp_bucket_cursor(bucket);
    float mn = 0.0f, step = 0.0f;
    for (pp_u32 k = 0; k < count; ++k) {
        pp_u64 i = i0 + k;
        if (cur.seek(i)) {
            mn = pp_f32_from_bits(payload[2 * cur.b]);
            step = pp_minmax_step(mn, pp_f32_from_bits(payload[2 * cur.b + 1]), levels);
        }
        vals[k] = pp_minmax_value(pp_read_code(words, i, bits), mn, step);
    }
}

PP_HD void pp_dither_decode_group(const pp_u32* payload, pp_u64 n, pp_u64 bucket, pp_u32 s,
                                  bool natural, pp_u64 i0, pp_u32 count, float* vals) {
    const pp_u32* words = payload + pp_dither_header_words(n, bucket);
    pp_u32 w = pp_dither_width(s);
    PPBucketCursor cur = pp_bucket_cursor(bucket);
    float norm = 0.0f;
    for (pp_u32 k = 0; k < count; ++k) {
        pp_u64 i = i0 + k;
        if (cur.seek(i)) {
            norm = pp_f32_from_bits(payload[cur.b]);
        }
        pp_u32 c = pp_read_code(words, i, w);
        pp_u32 level = c >> 1;
        pp_u32 sign = c & 1u;
        vals[k] = natural ? pp_dither_natural_value(level, sign, norm, s)
                          : pp_dither_linear_value(level, sign, norm, s);
    }
}

// Writes (add false) or adds (add true) the decoded group into out[i0 .. i0 + count).
PP_HD void pp_store_group(float* out, pp_u64 i0, pp_u32 count, const float* vals, bool add) {
    for (pp_u32 k = 0; k < count; ++k) {
        out[i0 + k] = add ? out[i0 + k] + vals[k] : vals[k];
    }
}

// random-k: value j of the payload is x[permute(j)] * scale.
PP_HD float pp_randomk_value(const float* x, PPPerm p, pp_u64 j, float scale) {
    return x[pp_permute(p, j)] * scale;
}

// ------------------------------------------------------------------------------------------------
// Error feedback, Nesterov momentum and averaging, element by element: the formulas of the CPU
// decorators (src/decorators.rs) and of the worker's average (src/device/chain.rs documents the
// sequence). Written as separate f32 operations; with FMA contraction off they round as Rust does.
// ------------------------------------------------------------------------------------------------

// Error feedback's compressor input: g + e (vanilla) or g + factor * e (corrected).
PP_HD float pp_ef_sum(float g, float e, float factor, bool vanilla) {
    return vanilla ? g + e : g + factor * e;
}

// The new momentum: mu * m + g.
PP_HD float pp_momentum_next(float m, float g, float mu) { return mu * m + g; }

// Nesterov's compressor input from the new momentum mn: g + mu * mn.
PP_HD float pp_nesterov_value(float g, float mn, float mu) { return g + mu * mn; }

#endif  // PUSHPULL_ELEM_CUH
