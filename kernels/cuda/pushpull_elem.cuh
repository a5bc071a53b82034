// pushpull_elem.cuh: the per-element math, randomness, bit casts and geometry of the CUDA
// compressors, written once as `__host__ __device__` functions (the reductions and per-thread
// work units built on them are in pushpull_work.cuh).
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

#endif  // PUSHPULL_ELEM_CUH
