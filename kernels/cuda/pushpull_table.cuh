// pushpull_table.cuh: the chunk tables of device batches, and the per-element and per-group
// work units of the table kernels (pp_t_* in pushpull_kernels.cu), written once as
// `__host__ __device__` functions on top of pushpull_elem.cuh and pushpull_work.cuh, which it
// needs first. NVRTC gets the four files concatenated (src/cuda/mod.rs SOURCE); host_shim.cpp
// includes the three headers.

#ifndef PUSHPULL_TABLE_CUH
#define PUSHPULL_TABLE_CUH

#ifndef PUSHPULL_WORK_CUH
#include "pushpull_work.cuh"
#endif

// ------------------------------------------------------------------------------------------------
// Device batches (src/device/table.rs mirrors these definitions field for field). A worker
// compresses many chunks at once: every chunk of a batch is one PPChunk of a table in device
// memory, and each step of the chain is one launch over the whole table (blockIdx.y is the
// chunk; the step's usual grid-stride loops run in x). The table kernels of
// pushpull_kernels.cu dispatch on the chunk's scheme to the same work units as the one-chunk
// kernels, and host_shim.cpp emulates them chunk by chunk.
// ------------------------------------------------------------------------------------------------

// PPChunk::scheme: the chunk's wire format.
#define PP_SCHEME_RAW 0u
#define PP_SCHEME_FP16 1u
#define PP_SCHEME_BF16 2u
#define PP_SCHEME_ONEBIT 3u
#define PP_SCHEME_MINMAX 4u
#define PP_SCHEME_DITHER 5u
#define PP_SCHEME_RANDOMK 6u

// PPChunk::opts bits.
#define PP_OPT_SCALING 1u   // onebit: the scale is mean |x| (else 1)
#define PP_OPT_NATURAL 2u   // dithering: natural levels (else linear)
#define PP_OPT_L2 4u        // dithering: l2 norm (else max |x|)
#define PP_OPT_VANILLA 8u   // error feedback: vanilla (else corrected, with `factor`)
#define PP_OPT_AVERAGE 16u  // decoding: divide by `divisor`

// A chunk's check words (src/device/mod.rs `flag`), 8-byte aligned in device memory.
#define PP_FLAG_NESTEROV 0u     // momentum's input or new momentum not finite
#define PP_FLAG_EF_INPUT 1u     // gradient + residual not finite
#define PP_FLAG_EF_RESIDUAL 2u  // the new residual not finite
#define PP_FLAG_PRESENT 3u      // decoding: 1 the chunk's pulled payload is in the arena, 2 its sum is not finite (decoded as NaN)
#define PP_FLAG_FIRST_BAD 4u    // two words: the codec input's first non-finite index, or ~0
#define PP_FLAG_WORDS 6u
#define PP_PRESENT_NON_FINITE 2u

// One chunk of a batch. Addresses are device addresses (host addresses on the emulated device);
// 0 means absent (no momentum, no error feedback).
struct PPChunk {
    pp_u64 g;         // the gradient (n f32)
    pp_u64 x;         // the codec's input: ep with error feedback, else mp with momentum, else g
    pp_u64 y;         // where a pulled result is decoded (n f32)
    pp_u64 n;         // elements
    pp_u64 payload;   // the payload (4-byte words)
    pp_u64 flags;     // PP_FLAG_WORDS u32
    pp_u64 m;         // momentum (n f32), its next value m_next, and its output mp
    pp_u64 m_next;
    pp_u64 mp;
    pp_u64 e;         // the error-feedback residual, the codec input ep, the new residual d
    pp_u64 ep;
    pp_u64 d;
    pp_u64 partials;  // f64 block partials (onebit, l2 dithering)
    pp_u64 spans;     // f32 span partials, two per span (minmax, max-norm dithering)
    pp_u64 bucket;    // elements per bucket (n when unset)
    pp_u64 k;         // random-k's values
    pp_u64 rounding;  // this round's rounding stream (Stream::rounding base)
    pp_u64 indices;   // this round's random-k index stream (Stream::indices base)
    pp_u32 scheme;    // PP_SCHEME_*
    pp_u32 param;     // minmax: bits; dithering: levels s
    pp_u32 opts;      // PP_OPT_* bits
    pp_u32 pad;
    float mu;         // Nesterov's mu
    float factor;     // corrected error feedback's eta_{t-1} / eta_t
    float scale;      // random-k's value scale
    float divisor;    // decoding with PP_OPT_AVERAGE: the number of workers
};

PP_HD const float* pp_f32p(pp_u64 a) { return (const float*)a; }
PP_HD float* pp_f32m(pp_u64 a) { return (float*)a; }
PP_HD pp_u32* pp_u32m(pp_u64 a) { return (pp_u32*)a; }

// Code width of a bit-stream scheme (onebit 1, minmax bits, dithering 1 + bit_length(s)).
PP_HD pp_u32 pp_chunk_width(const PPChunk& c) {
    if (c.scheme == PP_SCHEME_ONEBIT) {
        return 1u;
    }
    if (c.scheme == PP_SCHEME_MINMAX) {
        return c.param;
    }
    if (c.scheme == PP_SCHEME_DITHER) {
        return pp_dither_width(c.param);
    }
    return 0u;
}

// Header words in front of a bit-stream scheme's codes.
PP_HD pp_u64 pp_chunk_header_words(const PPChunk& c) {
    if (c.scheme == PP_SCHEME_ONEBIT) {
        return pp_onebit_header_words();
    }
    if (c.scheme == PP_SCHEME_MINMAX) {
        return pp_minmax_header_words(c.n, c.bucket);
    }
    return pp_dither_header_words(c.n, c.bucket);
}

// Whether the chunk's codec input holds a non-finite element (the later steps skip it: the
// round is refused, and its payload and residual are never used).
PP_HD bool pp_chunk_bad(const PPChunk& c) {
    const pp_u32* f = pp_u32m(c.flags);
    return (f[PP_FLAG_FIRST_BAD] & f[PP_FLAG_FIRST_BAD + 1]) != 0xffffffffu;
}

// Element i of the prepare step: Nesterov momentum (mp = g + mu * m_next, m_next = mu * m + g),
// then error feedback (ep = input + e, or input + factor * e), as the CPU decorators compute
// them; the verdicts go into the chunk's flags. Returns the codec input's value.
PP_HD float pp_prepare_elem(const PPChunk& c, pp_u64 i) {
    pp_u32* flags = pp_u32m(c.flags);
    float in = pp_f32p(c.g)[i];
    if (c.m != 0) {
        float mn = pp_momentum_next(pp_f32p(c.m)[i], in, c.mu);
        float v = pp_nesterov_value(in, mn, c.mu);
        if (!pp_is_finite(v) || !pp_is_finite(mn)) {
            flags[PP_FLAG_NESTEROV] = 1u;
        }
        pp_f32m(c.m_next)[i] = mn;
        pp_f32m(c.mp)[i] = v;
        in = v;
    }
    if (c.e != 0) {
        float v = pp_ef_sum(in, pp_f32p(c.e)[i], c.factor, (c.opts & PP_OPT_VANILLA) != 0);
        if (!pp_is_finite(v)) {
            flags[PP_FLAG_EF_INPUT] = 1u;
        }
        pp_f32m(c.ep)[i] = v;
        in = v;
    }
    return in;
}

// The decoded values of elements [i0, i0 + count) of a dense scheme's payload (raw fp32,
// fp16, bf16, onebit, minmax, dithering; random-k is a scatter).
PP_HD void pp_chunk_decode_group(const PPChunk& c, pp_u64 i0, pp_u32 count, float* vals) {
    const pp_u32* p = pp_u32m(c.payload);
    switch (c.scheme) {
        case PP_SCHEME_RAW:
            for (pp_u32 k = 0; k < count; ++k) {
                vals[k] = pp_f32_from_bits(p[i0 + k]);
            }
            break;
        case PP_SCHEME_FP16:
        case PP_SCHEME_BF16: {
            const pp_u16* h = (const pp_u16*)p;
            for (pp_u32 k = 0; k < count; ++k) {
                vals[k] = c.scheme == PP_SCHEME_FP16 ? pp_f16_to_f32(h[i0 + k])
                                                     : pp_bf16_to_f32(h[i0 + k]);
            }
            break;
        }
        case PP_SCHEME_ONEBIT:
            pp_onebit_decode_group(p, i0, count, vals);
            break;
        case PP_SCHEME_MINMAX:
            pp_minmax_decode_group(p, c.n, c.bucket, c.param, i0, count, vals);
            break;
        default:
            pp_dither_decode_group(p, c.n, c.bucket, c.param, (c.opts & PP_OPT_NATURAL) != 0, i0,
                                   count, vals);
            break;
    }
}

// The residual step for the group of elements [i0, i0 + count) of a chunk with error feedback:
// d = ep - D(C(ep)), from the payload the chunk just made (raw fp32: ep - ep; random-k:
// ep - 0 here, its support is fixed by pp_residual_scatter). Returns whether every value is
// finite.
PP_HD bool pp_residual_group(const PPChunk& c, pp_u64 i0, pp_u32 count) {
    float vals[PP_GROUP];
    const float* ep = pp_f32p(c.ep);
    if (c.scheme == PP_SCHEME_RAW) {
        for (pp_u32 k = 0; k < count; ++k) {
            vals[k] = ep[i0 + k];
        }
    } else if (c.scheme == PP_SCHEME_RANDOMK) {
        for (pp_u32 k = 0; k < count; ++k) {
            vals[k] = 0.0f;
        }
    } else {
        pp_chunk_decode_group(c, i0, count, vals);
    }
    bool ok = true;
    float* d = pp_f32m(c.d);
    for (pp_u32 k = 0; k < count; ++k) {
        float v = ep[i0 + k] - vals[k];
        ok = ok && pp_is_finite(v);
        d[i0 + k] = v;
    }
    return ok;
}

// Random-k's residual on its support: d[permute(j)] = ep[permute(j)] - value j.
PP_HD bool pp_residual_scatter(const PPChunk& c, PPPerm perm, pp_u64 j) {
    pp_u64 i = pp_permute(perm, j);
    float v = pp_f32p(c.ep)[i] - pp_f32_from_bits(pp_u32m(c.payload)[j]);
    pp_f32m(c.d)[i] = v;
    return pp_is_finite(v);
}

// A pulled value as the output stores it: divided by the number of workers for an average.
PP_HD float pp_chunk_out(const PPChunk& c, float v) {
    return (c.opts & PP_OPT_AVERAGE) != 0 ? v / c.divisor : v;
}

// Decoding a pulled payload, the group [i0, i0 + count): the values to store, a dense scheme's
// decoded values or random-k's zeros (its values are scattered by pp_decode_scatter), averaged
// when asked (0 / w is 0).
PP_HD void pp_decode_values(const PPChunk& c, pp_u64 i0, pp_u32 count, float* vals) {
    if (c.scheme == PP_SCHEME_RANDOMK) {
        for (pp_u32 k = 0; k < count; ++k) {
            vals[k] = 0.0f;
        }
        return;
    }
    pp_chunk_decode_group(c, i0, count, vals);
    for (pp_u32 k = 0; k < count; ++k) {
        vals[k] = pp_chunk_out(c, vals[k]);
    }
}

// What decoding stores for the group [i0, i0 + count) of a chunk whose PRESENT word is
// `present`: its decoded values, or NaN where the sum was not finite (a NaN the training
// loop's loss scaler finds, as it would in an all-reduce of the non-finite gradients).
PP_HD void pp_decode_or_nan(const PPChunk& c, pp_u32 present, pp_u64 i0, pp_u32 count,
                            float* vals) {
    if (present == PP_PRESENT_NON_FINITE) {
        for (pp_u32 k = 0; k < count; ++k) {
            vals[k] = pp_f32_from_bits(0x7fc00000u);
        }
        return;
    }
    pp_decode_values(c, i0, count, vals);
}

// Random-k's pulled value j: y[permute(j)] = value j (averaged when asked).
PP_HD void pp_decode_scatter(const PPChunk& c, PPPerm perm, pp_u64 j) {
    pp_f32m(c.y)[pp_permute(perm, j)] = pp_chunk_out(c, pp_f32_from_bits(pp_u32m(c.payload)[j]));
}

// Clears chunk c's flags for a new round (FIRST_BAD at "none").
PP_HD void pp_clear_flags(const PPChunk& c) {
    pp_u32* f = pp_u32m(c.flags);
    for (pp_u32 w = 0; w < PP_FLAG_WORDS; ++w) {
        f[w] = w >= PP_FLAG_FIRST_BAD ? 0xffffffffu : 0u;
    }
}

#endif  // PUSHPULL_TABLE_CUH
