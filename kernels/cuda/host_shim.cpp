// host_shim.cpp: the CUDA element functions and kernel work units, compiled for the host.
//
// kernels/build.rs compiles this file with the `cc` crate (`-O2 -ffp-contract=off
// -fno-fast-math -std=c++17`) and links it into pushpull-kernels; src/cuda/host.rs declares
// the `extern "C"` functions below. Two kinds of entry points:
//
//   * pp_host_<fn>: one element function of pushpull_elem.cuh or pushpull_work.cuh, for bit-for-bit comparison with
//     rng.rs / elem.rs;
//   * pp_emu_<kernel sequence>: a whole compress / decompress / decompress_add of one chunk,
//     emulating the kernel launches that src/cuda/codec.rs makes: every CUDA block and thread
//     is run serially, calling the same per-thread functions the kernels call (the reduction
//     trees level by level, the pack tiles through a staging buffer of the kernel's shared
//     memory size). Payloads cross the FFI as bytes and are copied into aligned word buffers.
//
// Errors (a wrong output size, a staging tile that would overflow the kernel's shared memory)
// return false, so the Rust tests fail instead of corrupting memory.

#include "pushpull_elem.cuh"
#include "pushpull_work.cuh"
#include "pushpull_table.cuh"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <vector>

namespace {

std::vector<pp_u32> load_words(const uint8_t* bytes, pp_u64 len) {
    std::vector<pp_u32> w((len + 3) / 4 + 1, 0u);  // +1: pp_read_code may peek one word ahead
    if (len > 0) {
        memcpy(w.data(), bytes, len);
    }
    return w;
}

void store_words(const std::vector<pp_u32>& w, uint8_t* out, pp_u64 len) {
    if (len > 0) {
        memcpy(out, w.data(), len);
    }
}

// pp_block_sums: every block g, lane by lane, then the shuffle levels over the 32 lanes, into
// partials (pp_num_pieces(n, bucket, 256) of them).
void emu_block_sums_into(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 op, double* partials) {
    pp_u64 blocks = pp_num_pieces(n, bucket, PP_REDUCE_BLOCK);
    float s[32];
    for (pp_u64 g = 0; g < blocks; ++g) {
        for (pp_u32 l = 0; l < 32u; ++l) {
            s[l] = pp_block_sum_lane(x, n, bucket, g, l, op);
        }
        for (pp_u32 stride = 16; stride > 0; stride /= 2) {
            for (pp_u32 t = 0; t < 32u; ++t) {
                pp_tree_sum_step(s, t, stride);
            }
        }
        partials[g] = (double)s[0];
    }
}

std::vector<double> emu_block_sums(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 op) {
    std::vector<double> partials(pp_num_pieces(n, bucket, PP_REDUCE_BLOCK));
    emu_block_sums_into(x, n, bucket, op, partials.data());
    return partials;
}

// pp_finalize_sums: a thread per narrow bucket; a block per wide one, its group sums staged
// PP_REDUCE_BLOCK at a time.
void emu_finalize_sums(const double* partials, pp_u64 n, pp_u64 bucket, pp_u32 mode, pp_u32* hdr) {
    pp_u64 nb = pp_num_buckets(n, bucket);
    bool wide = pp_wide_buckets(bucket, PP_REDUCE_BLOCK);
    double buf[PP_REDUCE_BLOCK];
    for (pp_u64 b = 0; b < nb; ++b) {
        pp_u64 first, count;
        pp_bucket_pieces(n, bucket, PP_REDUCE_BLOCK, b, &first, &count);
        pp_u32 want = pp_f32_bits(pp_finalize_sum(partials, n, bucket, b, mode));
        if (!wide) {
            hdr[b] = want;
            continue;
        }
        pp_u64 groups = pp_div_ceil(count, PP_SUM_GROUP);
        double sum = -0.0;
        for (pp_u64 j0 = 0; j0 < groups; j0 += PP_REDUCE_BLOCK) {
            pp_u64 m = pp_min_u64(PP_REDUCE_BLOCK, groups - j0);
            for (pp_u64 t = 0; t < m; ++t) {
                buf[t] = pp_sum_group(partials + first, count, j0 + t);
            }
            sum = pp_add_in_order(sum, buf, m);
        }
        hdr[b] = pp_f32_bits(pp_finalize_value(sum, pp_bucket_len(n, bucket, b), mode));
        // The serial definition (pp_finalize_sum) agrees; poison the output if not.
        if (hdr[b] != want) {
            hdr[b] = 0x7fc0dead;
        }
    }
}

// pp_span_minmax: the (lo, hi) pair of every span, into partials (2 pp_num_pieces(n, bucket,
// 2048) floats).
void emu_span_minmax_into(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 mode, float* partials) {
    pp_u64 spans = pp_num_pieces(n, bucket, PP_SPAN);
    float lo[PP_REDUCE_BLOCK];
    float hi[PP_REDUCE_BLOCK];
    for (pp_u64 g = 0; g < spans; ++g) {
        for (pp_u32 l = 0; l < 32u; ++l) {
            pp_span_lane(x, n, bucket, g, l, mode, &lo[l], &hi[l]);
        }
        for (pp_u32 stride = 16; stride > 0; stride /= 2) {
            for (pp_u32 t = 0; t < 32u; ++t) {
                pp_mm_tree_step(lo, hi, t, stride, mode);
            }
        }
        partials[2 * g] = lo[0];
        partials[2 * g + 1] = hi[0];
    }
}

// pp_finalize_minmax: the header words of every bucket from the span partials.
void emu_finalize_minmax(const float* partials, pp_u64 n, pp_u64 bucket, pp_u32 mode,
                         pp_u32* hdr) {
    float lo[PP_REDUCE_BLOCK];
    float hi[PP_REDUCE_BLOCK];
    pp_u64 nb = pp_num_buckets(n, bucket);
    if (!pp_wide_buckets(bucket, PP_SPAN)) {
        for (pp_u64 b = 0; b < nb; ++b) {
            pp_finalize_minmax(partials, n, bucket, b, mode, hdr);
        }
        return;
    }
    // A block per wide bucket: thread t folds a contiguous run of spans, then the tree.
    for (pp_u64 b = 0; b < nb; ++b) {
        pp_u64 first, count;
        pp_bucket_pieces(n, bucket, PP_SPAN, b, &first, &count);
        pp_u64 per = pp_div_ceil(count, PP_REDUCE_BLOCK);
        for (pp_u32 t = 0; t < PP_REDUCE_BLOCK; ++t) {
            pp_u64 k0 = pp_min_u64((pp_u64)t * per, count);
            pp_u64 k1 = pp_min_u64(k0 + per, count);
            pp_mm_init(mode, &lo[t], &hi[t]);
            pp_mm_fold_partials(mode, &lo[t], &hi[t], partials + 2 * (first + k0), k1 - k0);
        }
        for (pp_u32 stride = PP_REDUCE_BLOCK / 2; stride > 0; stride /= 2) {
            for (pp_u32 t = 0; t < PP_REDUCE_BLOCK; ++t) {
                pp_mm_tree_step(lo, hi, t, stride, mode);
            }
        }
        // The serial fold (pp_finalize_minmax) gives the same header; poison the output if not.
        float sl, sh;
        pp_mm_init(mode, &sl, &sh);
        pp_mm_fold_partials(mode, &sl, &sh, partials + 2 * first, count);
        pp_u32 got[2] = {0, 0}, want[2] = {0, 0};
        pp_mm_store(mode, lo[0], hi[0], 0, got);
        pp_mm_store(mode, sl, sh, 0, want);
        if (got[0] != want[0] || got[1] != want[1]) {
            lo[0] = hi[0] = pp_f32_from_bits(0x7fc0dead);
        }
        pp_mm_store(mode, lo[0], hi[0], b, hdr);
    }
}

// pp_span_minmax then pp_finalize_minmax.
void emu_minmax(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 mode, pp_u32* hdr) {
    std::vector<float> partials(2 * pp_num_pieces(n, bucket, PP_SPAN));
    emu_span_minmax_into(x, n, bucket, mode, partials.data());
    emu_finalize_minmax(partials.data(), n, bucket, mode, hdr);
}

// pp_pack_kernel: tiles of PP_PACK_WORDS words, staged like the kernel's shared memory.
template <class Enc>
bool emu_pack(Enc enc, const float* x, pp_u64 n, pp_u32 w, pp_u32* words) {
    pp_u64 nwords = pp_stream_words(n, w);
    if (pp_direct_width(w)) {
        // The kernel's direct path: every word from the elements where they are.
        for (pp_u64 word = 0; word < nwords; ++word) {
            words[word] = pp_pack_word(enc, pp_direct(x), n, w, word);
        }
        return true;
    }
    pp_u64 cap = pp_pack_tile_capacity(w);
    std::vector<float> tile(cap);
    for (pp_u64 w0 = 0; w0 < nwords; w0 += PP_PACK_WORDS) {
        pp_u64 e0, e1;
        pp_pack_tile(n, w, nwords, w0, &e0, &e1);
        if (e1 < e0 || (e1 > e0 && pp_tile_slot(e1 - 1 - e0) >= cap)) {
            return false;
        }
        for (pp_u64 e = e0; e < e1; ++e) {
            tile[pp_tile_slot(e - e0)] = x[e];
        }
        for (pp_u32 t = 0; t < PP_PACK_WORDS; ++t) {
            pp_u64 word = w0 + t;
            if (word < nwords) {
                words[word] = pp_pack_word(enc, pp_tile(tile.data(), e0), n, w, word);
            }
        }
    }
    return true;
}

// pp_onebit_compress: every block g, lane by lane; the signs of element k of every lane make
// word 8g + k (the warp's ballot); the |x| partials as emu_block_sums makes them.
void emu_onebit_signs(const float* x, pp_u64 n, pp_u32* words, double* partials) {
    pp_u64 blocks = pp_num_pieces(n, n, PP_REDUCE_BLOCK);
    pp_u64 nwords = pp_stream_words(n, 1u);
    for (pp_u64 g = 0; g < blocks; ++g) {
        float v[32][8];
        for (pp_u32 l = 0; l < 32u; ++l) {
            pp_block_lane_load(x, n, n, g, l, v[l]);
        }
        for (pp_u32 k = 0; k < 8u && 8u * g + k < nwords; ++k) {
            pp_u32 word = 0;
            for (pp_u32 l = 0; l < 32u; ++l) {
                word |= pp_sign_bit(v[l][k]) << l;
            }
            words[8u * g + k] = word;
        }
    }
    emu_block_sums_into(x, n, n, 0, partials);
}

// The decompress kernels: one "thread" per group of PP_GROUP elements.
template <class Decode>
void emu_decode(pp_u64 n, float* out, bool add, Decode decode) {
    pp_u64 groups = pp_div_ceil(n, PP_GROUP);
    for (pp_u64 gi = 0; gi < groups; ++gi) {
        pp_u64 i0 = gi * PP_GROUP;
        pp_u32 count = (pp_u32)pp_min_u64(PP_GROUP, n - i0);
        float vals[PP_GROUP];
        decode(i0, count, vals);
        pp_store_group(out, i0, count, vals, add);
    }
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------------------------------------
// Element functions.
// ---------------------------------------------------------------------------------------------

pp_u64 pp_host_mix64(pp_u64 z) { return pp_mix64(z); }
pp_u64 pp_host_stream_rounding(pp_u64 seed, pp_u64 key, pp_u64 round, pp_u64 role_tag,
                               pp_u32 rank) {
    return pp_stream_rounding(seed, key, round, role_tag, rank);
}
pp_u64 pp_host_stream_indices(pp_u64 seed, pp_u64 key, pp_u64 round) {
    return pp_stream_indices(seed, key, round);
}
pp_u64 pp_host_draw(pp_u64 base, pp_u64 counter) { return pp_draw(base, counter); }
float pp_host_uniform(pp_u64 base, pp_u64 i) { return pp_uniform(base, i); }
float pp_host_uniform_cached(pp_u64 base, pp_u64 i) {
    // Exercises PPUniforms: a cache primed with an element of another draw, then with another
    // element of i's draw (four per draw), then i.
    PPUniforms u = pp_uniforms(base);
    (void)u.at(i ^ 4u);
    (void)u.at(i ^ 3u);
    return u.at(i);
}
float pp_host_uniform_from_bits(pp_u16 bits) { return pp_uniform_from_bits(bits); }
pp_u64 pp_host_permute(pp_u64 n, pp_u64 key, pp_u64 j) { return pp_permute(pp_perm_new(n, key), j); }
pp_u32 pp_host_perm_half_bits(pp_u64 n) { return pp_perm_new(n, 0).half_bits; }
pp_u32 pp_host_stochastic_round(float t, float u) { return pp_stochastic_round(t, u); }
pp_u32 pp_host_f32_to_u32_sat(float f) { return pp_f32_to_u32_sat(f); }
pp_u32 pp_host_sign_bit(float x) { return pp_sign_bit(x); }
pp_u16 pp_host_f32_to_f16_sat(float x) { return pp_f32_to_f16_sat(x); }
float pp_host_f16_to_f32(pp_u16 b) { return pp_f16_to_f32(b); }
pp_u16 pp_host_f32_to_bf16_sat(float x) { return pp_f32_to_bf16_sat(x); }
float pp_host_bf16_to_f32(pp_u16 b) { return pp_bf16_to_f32(b); }
float pp_host_minmax_step(float mn, float mx, pp_u32 levels) { return pp_minmax_step(mn, mx, levels); }
pp_u32 pp_host_minmax_code(float x, float mn, float step, pp_u32 levels, float u) {
    return pp_minmax_code(x, mn, step, levels, u);
}
float pp_host_minmax_value(pp_u32 q, float mn, float step) { return pp_minmax_value(q, mn, step); }
pp_u32 pp_host_dither_linear_level(float x, float norm, pp_u32 s, float u) {
    return pp_dither_linear_level(x, norm, s, u);
}
float pp_host_dither_linear_value(pp_u32 level, pp_u32 sign, float norm, pp_u32 s) {
    return pp_dither_linear_value(level, sign, norm, s);
}
pp_u32 pp_host_dither_natural_level(float x, float norm, pp_u32 s, float u) {
    return pp_dither_natural_level(x, norm, s, u);
}
float pp_host_dither_natural_value(pp_u32 level, pp_u32 sign, float norm, pp_u32 s) {
    return pp_dither_natural_value(level, sign, norm, s);
}
float pp_host_pow2(pp_i32 e) { return pp_pow2(e); }
pp_u32 pp_host_dither_width(pp_u32 s) { return pp_dither_width(s); }
float pp_host_randomk_scale(pp_u64 n, pp_u64 k, bool unbiased) {
    return pp_randomk_scale(n, k, unbiased);
}
pp_u32 pp_host_read_code(const uint8_t* bytes, pp_u64 len, pp_u64 i, pp_u32 w) {
    std::vector<pp_u32> words = load_words(bytes, len);
    return pp_read_code(words.data(), i, w);
}

// The f32 tree sum of one block of len <= 256 values (op 0 |x|, op 1 x*x).
pp_u64 pp_host_pack_tile_capacity(pp_u32 w) { return pp_pack_tile_capacity(w); }
pp_u64 pp_host_num_pieces(pp_u64 n, pp_u64 bucket, pp_u64 unit) {
    return pp_num_pieces(n, bucket, unit);
}

void pp_host_word_elems(pp_u64 n, pp_u32 w, pp_u64 word, pp_u64* i0, pp_u64* i1) {
    pp_word_elems(n, w, word, i0, i1);
}

float pp_host_tree_sum_block(const float* x, pp_u64 len, pp_u32 op) {
    float s[PP_REDUCE_BLOCK];
    for (pp_u32 t = 0; t < PP_REDUCE_BLOCK; ++t) {
        s[t] = t < len ? pp_reduce_value(x[t], op) : 0.0f;
    }
    return pp_tree_sum_256(s);
}

// Per-bucket statistics through the reduction kernels' emulation, written as f32 into out:
// stat 0 mean |x| (nb values), 1 l2 norm (nb), 2 max |x| (nb), 3 (min, max) pairs (2 nb).
bool pp_emu_bucket_stats(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 stat, float* out,
                         pp_u64 out_len) {
    pp_u64 nb = pp_num_buckets(n, bucket);
    pp_u64 need = stat == 3 ? 2 * nb : nb;
    if (out_len != need || stat > 3) {
        return false;
    }
    std::vector<pp_u32> hdr(need + 1);
    if (stat <= 1) {
        emu_finalize_sums(emu_block_sums(x, n, bucket, stat).data(), n, bucket, stat, hdr.data());
    } else {
        emu_minmax(x, n, bucket, stat == 2 ? 1u : 0u, hdr.data());
    }
    for (pp_u64 i = 0; i < need; ++i) {
        out[i] = pp_f32_from_bits(hdr[i]);
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// Whole-chunk emulation. *_compress write exactly out_len bytes (false if that is not the
// documented size); *_decompress read a payload of len bytes and write (add 0) or add (add 1)
// n floats.
// ---------------------------------------------------------------------------------------------

bool pp_emu_fp16_compress(const float* x, pp_u64 n, uint8_t* out, pp_u64 out_len) {
    if (out_len != 2 * n) {
        return false;
    }
    std::vector<pp_u16> h(n + 1);
    for (pp_u64 i = 0; i < n; ++i) {
        h[i] = pp_f32_to_f16_sat(x[i]);
    }
    if (n > 0) {
        memcpy(out, h.data(), 2 * n);
    }
    return true;
}

bool pp_emu_bf16_compress(const float* x, pp_u64 n, uint8_t* out, pp_u64 out_len) {
    if (out_len != 2 * n) {
        return false;
    }
    std::vector<pp_u16> h(n + 1);
    for (pp_u64 i = 0; i < n; ++i) {
        h[i] = pp_f32_to_bf16_sat(x[i]);
    }
    if (n > 0) {
        memcpy(out, h.data(), 2 * n);
    }
    return true;
}

static bool emu_half_decompress(const uint8_t* p, pp_u64 len, pp_u64 n, float* out, bool add,
                                bool bf16) {
    if (len != 2 * n) {
        return false;
    }
    std::vector<pp_u16> h(n + 1);
    if (n > 0) {
        memcpy(h.data(), p, 2 * n);
    }
    for (pp_u64 i = 0; i < n; ++i) {
        float v = bf16 ? pp_bf16_to_f32(h[i]) : pp_f16_to_f32(h[i]);
        out[i] = add ? out[i] + v : v;
    }
    return true;
}

bool pp_emu_fp16_decompress(const uint8_t* p, pp_u64 len, pp_u64 n, float* out, bool add) {
    return emu_half_decompress(p, len, n, out, add, false);
}

bool pp_emu_bf16_decompress(const uint8_t* p, pp_u64 len, pp_u64 n, float* out, bool add) {
    return emu_half_decompress(p, len, n, out, add, true);
}

bool pp_emu_onebit_compress(const float* x, pp_u64 n, bool scaling, uint8_t* out,
                            pp_u64 out_len) {
    pp_u64 hw = pp_onebit_header_words();
    pp_u64 words = hw + pp_stream_words(n, 1);
    if (out_len != 4 * words) {
        return false;
    }
    std::vector<pp_u32> buf(words);
    std::vector<double> partials(pp_num_pieces(n, n, PP_REDUCE_BLOCK));
    emu_onebit_signs(x, n, buf.data() + hw, partials.data());
    if (scaling && n > 0) {
        emu_finalize_sums(partials.data(), n, n, 0, buf.data());
    } else {
        buf[0] = pp_f32_bits(scaling ? 0.0f : 1.0f);  // elem::mean_abs of nothing is 0
    }
    store_words(buf, out, out_len);
    return true;
}

bool pp_emu_onebit_decompress(const uint8_t* p, pp_u64 len, pp_u64 n, float* out, bool add) {
    if (len != 4 * (pp_onebit_header_words() + pp_stream_words(n, 1))) {
        return false;
    }
    std::vector<pp_u32> w = load_words(p, len);
    emu_decode(n, out, add, [&](pp_u64 i0, pp_u32 count, float* vals) {
        pp_onebit_decode_group(w.data(), i0, count, vals);
    });
    return true;
}

bool pp_emu_minmax_compress(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 bits, pp_u64 stream,
                            uint8_t* out, pp_u64 out_len) {
    pp_u64 hw = pp_minmax_header_words(n, bucket);
    pp_u64 words = hw + pp_stream_words(n, bits);
    if (out_len != 4 * words || bits < 1 || bits > 8) {
        return false;
    }
    std::vector<pp_u32> buf(words + 1);
    emu_minmax(x, n, bucket, 0, buf.data());
    if (!emu_pack(pp_minmax_enc(buf.data(), bucket, bits, stream), x, n, bits, buf.data() + hw)) {
        return false;
    }
    store_words(buf, out, out_len);
    return true;
}

bool pp_emu_minmax_decompress(const uint8_t* p, pp_u64 len, pp_u64 n, pp_u64 bucket, pp_u32 bits,
                              float* out, bool add) {
    if (len != 4 * (pp_minmax_header_words(n, bucket) + pp_stream_words(n, bits)) || bits < 1 ||
        bits > 8) {
        return false;
    }
    std::vector<pp_u32> w = load_words(p, len);
    emu_decode(n, out, add, [&](pp_u64 i0, pp_u32 count, float* vals) {
        pp_minmax_decode_group(w.data(), n, bucket, bits, i0, count, vals);
    });
    return true;
}

bool pp_emu_dither_compress(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 s, bool natural,
                            bool l2, pp_u64 stream, uint8_t* out, pp_u64 out_len) {
    pp_u32 w = pp_dither_width(s);
    pp_u64 hw = pp_dither_header_words(n, bucket);
    pp_u64 words = hw + pp_stream_words(n, w);
    if (out_len != 4 * words || s < 1 || w > 32) {
        return false;
    }
    std::vector<pp_u32> buf(words + 1);
    if (l2) {
        emu_finalize_sums(emu_block_sums(x, n, bucket, 1).data(), n, bucket, 1, buf.data());
    } else {
        emu_minmax(x, n, bucket, 1, buf.data());
    }
    if (!emu_pack(pp_dither_enc(buf.data(), bucket, s, natural, stream), x, n, w,
                  buf.data() + hw)) {
        return false;
    }
    store_words(buf, out, out_len);
    return true;
}

bool pp_emu_dither_decompress(const uint8_t* p, pp_u64 len, pp_u64 n, pp_u64 bucket, pp_u32 s,
                              bool natural, float* out, bool add) {
    pp_u32 w = pp_dither_width(s);
    if (len != 4 * (pp_dither_header_words(n, bucket) + pp_stream_words(n, w)) || s < 1 ||
        w > 32) {
        return false;
    }
    std::vector<pp_u32> words = load_words(p, len);
    emu_decode(n, out, add, [&](pp_u64 i0, pp_u32 count, float* vals) {
        pp_dither_decode_group(words.data(), n, bucket, s, natural, i0, count, vals);
    });
    return true;
}

bool pp_emu_randomk_compress(const float* x, pp_u64 n, pp_u64 k, pp_u64 key, float scale,
                             uint8_t* out, pp_u64 out_len) {
    if (out_len != 4 * k || k > n) {
        return false;
    }
    std::vector<pp_u32> buf(k + 1);
    PPPerm p = pp_perm_new(n, key);
    for (pp_u64 j = 0; j < k; ++j) {
        buf[j] = pp_f32_bits(pp_randomk_value(x, p, j, scale));
    }
    store_words(buf, out, out_len);
    return true;
}

bool pp_emu_randomk_decompress(const uint8_t* p, pp_u64 len, pp_u64 n, pp_u64 k, pp_u64 key,
                               float* out, bool add) {
    if (len != 4 * k || k > n) {
        return false;
    }
    std::vector<pp_u32> w = load_words(p, len);
    PPPerm perm = pp_perm_new(n, key);
    if (add) {
        std::vector<pp_u32> r(k + 1);
        for (pp_u64 j = 0; j < k; ++j) {  // pp_randomk_decompress_add
            r[j] = pp_f32_bits(out[pp_permute(perm, j)] + pp_f32_from_bits(w[j]));
        }
        for (pp_u64 i = 0; i < n; ++i) {  // pp_add_zero
            out[i] = out[i] + 0.0f;
        }
        w.swap(r);  // pp_randomk_decompress with r as the payload
    } else {
        for (pp_u64 i = 0; i < n; ++i) {  // pp_fill_u32
            out[i] = 0.0f;
        }
    }
    for (pp_u64 j = 0; j < k; ++j) {  // pp_randomk_decompress
        out[pp_permute(perm, j)] = pp_f32_from_bits(w[j]);
    }
    return true;
}

}  // extern "C"

// ---------------------------------------------------------------------------------------------
// Batches: the table kernels of pushpull_kernels.cu (pp_t_*), chunk after chunk, each running
// the same work units as its kernel (src/device/table.rs `Step` numbers them). The table's
// addresses are host addresses here. Returns false for an unknown step or a pack tile that
// would overflow the kernel's shared memory.
// ---------------------------------------------------------------------------------------------

namespace {

bool emu_table_chunk(pp_u32 step, const PPChunk& c) {
    pp_u32* flags = pp_u32m(c.flags);
    if (step == 0) {  // pp_t_clear
        pp_clear_flags(c);
        return true;
    }
    if (step == 1) {  // pp_t_prepare
        for (pp_u64 i = 0; i < c.n; ++i) {
            float in = pp_prepare_elem(c, i);
            pp_u64 first = (pp_u64)flags[PP_FLAG_FIRST_BAD] |
                           ((pp_u64)flags[PP_FLAG_FIRST_BAD + 1] << 32);
            if (!pp_is_finite(in) && i < first) {
                flags[PP_FLAG_FIRST_BAD] = (pp_u32)i;
                flags[PP_FLAG_FIRST_BAD + 1] = (pp_u32)(i >> 32);
            }
        }
        return true;
    }
    const float* x = pp_f32p(c.x);
    pp_u32* payload = pp_u32m(c.payload);
    bool natural = (c.opts & PP_OPT_NATURAL) != 0;
    bool l2 = (c.opts & PP_OPT_L2) != 0;
    switch (step) {
        case 2:  // pp_t_stats
            if (pp_chunk_bad(c)) {
                return true;
            }
            if (c.scheme == PP_SCHEME_ONEBIT) {
                emu_onebit_signs(x, c.n, payload + pp_onebit_header_words(),
                                 (double*)c.partials);
            } else if (c.scheme == PP_SCHEME_MINMAX || (c.scheme == PP_SCHEME_DITHER && !l2)) {
                emu_span_minmax_into(x, c.n, c.bucket, c.scheme == PP_SCHEME_MINMAX ? 0u : 1u,
                                     pp_f32m(c.spans));
            } else if (c.scheme == PP_SCHEME_DITHER) {
                emu_block_sums_into(x, c.n, c.bucket, 1u, (double*)c.partials);
            }
            return true;
        case 3:  // pp_t_finalize
            if (pp_chunk_bad(c)) {
                return true;
            }
            if (c.scheme == PP_SCHEME_ONEBIT) {
                bool scaling = (c.opts & PP_OPT_SCALING) != 0;
                if (scaling && c.n > 0) {
                    emu_finalize_sums((const double*)c.partials, c.n, c.n, 0u, payload);
                } else {
                    payload[0] = pp_f32_bits(scaling ? 0.0f : 1.0f);
                }
            } else if (c.scheme == PP_SCHEME_MINMAX || (c.scheme == PP_SCHEME_DITHER && !l2)) {
                emu_finalize_minmax(pp_f32p(c.spans), c.n, c.bucket,
                                    c.scheme == PP_SCHEME_MINMAX ? 0u : 1u, payload);
            } else if (c.scheme == PP_SCHEME_DITHER) {
                emu_finalize_sums((const double*)c.partials, c.n, c.bucket, 1u, payload);
            }
            return true;
        case 4:  // pp_t_encode
            if (pp_chunk_bad(c)) {
                return true;
            }
            switch (c.scheme) {
                case PP_SCHEME_RAW:
                    for (pp_u64 i = 0; i < c.n; ++i) {
                        payload[i] = pp_f32_bits(x[i]);
                    }
                    return true;
                case PP_SCHEME_FP16:
                case PP_SCHEME_BF16: {
                    pp_u16* h = (pp_u16*)payload;
                    for (pp_u64 i = 0; i < c.n; ++i) {
                        h[i] = c.scheme == PP_SCHEME_FP16 ? pp_f32_to_f16_sat(x[i])
                                                          : pp_f32_to_bf16_sat(x[i]);
                    }
                    return true;
                }
                case PP_SCHEME_MINMAX:
                    return emu_pack(pp_minmax_enc(payload, c.bucket, c.param, c.rounding), x, c.n,
                                    c.param, payload + pp_minmax_header_words(c.n, c.bucket));
                case PP_SCHEME_DITHER:
                    return emu_pack(pp_dither_enc(payload, c.bucket, c.param, natural, c.rounding),
                                    x, c.n, pp_dither_width(c.param),
                                    payload + pp_dither_header_words(c.n, c.bucket));
                case PP_SCHEME_RANDOMK: {
                    PPPerm perm = pp_perm_new(c.n, c.indices);
                    for (pp_u64 j = 0; j < c.k; ++j) {
                        payload[j] = pp_f32_bits(pp_randomk_value(x, perm, j, c.scale));
                    }
                    return true;
                }
                default:
                    return true;  // onebit's codes came with its statistics
            }
        case 5:  // pp_t_residual
            if (c.e == 0 || pp_chunk_bad(c)) {
                return true;
            }
            for (pp_u64 i0 = 0; i0 < c.n; i0 += PP_GROUP) {
                if (!pp_residual_group(c, i0, (pp_u32)pp_min_u64(PP_GROUP, c.n - i0))) {
                    flags[PP_FLAG_EF_RESIDUAL] = 1u;
                }
            }
            return true;
        case 6: {  // pp_t_residual_scatter
            if (c.e == 0 || c.scheme != PP_SCHEME_RANDOMK || pp_chunk_bad(c)) {
                return true;
            }
            PPPerm perm = pp_perm_new(c.n, c.indices);
            for (pp_u64 j = 0; j < c.k; ++j) {
                if (!pp_residual_scatter(c, perm, j)) {
                    flags[PP_FLAG_EF_RESIDUAL] = 1u;
                }
            }
            return true;
        }
        case 7:  // pp_t_decode
            if (flags[PP_FLAG_PRESENT] == 0) {
                return true;
            }
            for (pp_u64 i0 = 0; i0 < c.n; i0 += PP_GROUP) {
                pp_u32 count = (pp_u32)pp_min_u64(PP_GROUP, c.n - i0);
                float vals[PP_GROUP];
                pp_decode_or_nan(c, flags[PP_FLAG_PRESENT], i0, count, vals);
                pp_store_group(pp_f32m(c.y), i0, count, vals, false);
            }
            return true;
        case 8: {  // pp_t_decode_scatter
            if (c.scheme != PP_SCHEME_RANDOMK || flags[PP_FLAG_PRESENT] != 1u) {
                return true;
            }
            PPPerm perm = pp_perm_new(c.n, c.indices);
            for (pp_u64 j = 0; j < c.k; ++j) {
                pp_decode_scatter(c, perm, j);
            }
            return true;
        }
        default:
            return false;
    }
}

}  // namespace

extern "C" {

// Runs table step `step` over chunks [0, chunks) of `table`.
bool pp_emu_table_step(pp_u32 step, const PPChunk* table, pp_u64 chunks) {
    for (pp_u64 c = 0; c < chunks; ++c) {
        if (!emu_table_chunk(step, table[c])) {
            return false;
        }
    }
    return true;
}

// sizeof(PPChunk) and the byte offset of every field, in declaration order, into out (at most
// out_len values); returns how many fields there are.
pp_u64 pp_host_chunk_layout(pp_u64* out, pp_u64 out_len) {
    pp_u64 offs[] = {
        sizeof(PPChunk),
        offsetof(PPChunk, g),        offsetof(PPChunk, x),       offsetof(PPChunk, y),
        offsetof(PPChunk, n),        offsetof(PPChunk, payload), offsetof(PPChunk, flags),
        offsetof(PPChunk, m),        offsetof(PPChunk, m_next),  offsetof(PPChunk, mp),
        offsetof(PPChunk, e),        offsetof(PPChunk, ep),      offsetof(PPChunk, d),
        offsetof(PPChunk, partials), offsetof(PPChunk, spans),   offsetof(PPChunk, bucket),
        offsetof(PPChunk, k),        offsetof(PPChunk, rounding), offsetof(PPChunk, indices),
        offsetof(PPChunk, scheme),   offsetof(PPChunk, param),   offsetof(PPChunk, opts),
        offsetof(PPChunk, pad),      offsetof(PPChunk, mu),      offsetof(PPChunk, factor),
        offsetof(PPChunk, scale),    offsetof(PPChunk, divisor),
    };
    pp_u64 count = sizeof offs / sizeof offs[0];
    for (pp_u64 i = 0; i < count && i < out_len; ++i) {
        out[i] = offs[i];
    }
    return count;
}

}  // extern "C"
