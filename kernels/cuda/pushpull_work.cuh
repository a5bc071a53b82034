// pushpull_work.cuh: the per-thread work units of the CUDA compressors (reductions, packing,
// decoding) and the per-element formulas of error feedback and momentum, written once as
// `__host__ __device__` functions on top of pushpull_elem.cuh (the math, randomness and geometry
// they use), which it needs first. Like that header, each function mirrors its Rust twin bit for
// bit and compiles three ways (NVRTC, nvcc, the host C++ compiler of kernels/build.rs); NVRTC
// gets the files concatenated (src/cuda/mod.rs SOURCE), host_shim.cpp includes them.

#ifndef PUSHPULL_WORK_CUH
#define PUSHPULL_WORK_CUH

#ifndef PUSHPULL_ELEM_CUH
#include "pushpull_elem.cuh"
#endif

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

#endif  // PUSHPULL_WORK_CUH
