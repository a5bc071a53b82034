// host_shim.cpp: the CUDA element functions and kernel work units, compiled for the host.
//
// kernels/build.rs compiles this file with the `cc` crate (`-O2 -ffp-contract=off
// -fno-fast-math -std=c++17`) and links it into pushpull-kernels; src/cuda/host.rs declares
// the `extern "C"` functions below. Two kinds of entry points:
//
//   * pp_host_<fn>: one element function of pushpull_elem.cuh, for bit-for-bit comparison with
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

// pp_block_sums: every block g, lane by lane, then the shuffle levels over the 32 lanes.
std::vector<double> emu_block_sums(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 op) {
    pp_u64 blocks = pp_num_pieces(n, bucket, PP_REDUCE_BLOCK);
    std::vector<double> partials(blocks);
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
    return partials;
}

// pp_finalize_sums: a thread per narrow bucket; a block per wide one, its group sums staged
// PP_REDUCE_BLOCK at a time.
void emu_finalize_sums(const std::vector<double>& partials, pp_u64 n, pp_u64 bucket, pp_u32 mode,
                       pp_u32* hdr) {
    pp_u64 nb = pp_num_buckets(n, bucket);
    bool wide = pp_wide_buckets(bucket, PP_REDUCE_BLOCK);
    double buf[PP_REDUCE_BLOCK];
    for (pp_u64 b = 0; b < nb; ++b) {
        pp_u64 first, count;
        pp_bucket_pieces(n, bucket, PP_REDUCE_BLOCK, b, &first, &count);
        pp_u32 want = pp_f32_bits(pp_finalize_sum(partials.data(), n, bucket, b, mode));
        if (!wide) {
            hdr[b] = want;
            continue;
        }
        pp_u64 groups = pp_div_ceil(count, PP_SUM_GROUP);
        double sum = -0.0;
        for (pp_u64 j0 = 0; j0 < groups; j0 += PP_REDUCE_BLOCK) {
            pp_u64 m = pp_min_u64(PP_REDUCE_BLOCK, groups - j0);
            for (pp_u64 t = 0; t < m; ++t) {
                buf[t] = pp_sum_group(partials.data() + first, count, j0 + t);
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

// pp_span_minmax then pp_finalize_minmax.
void emu_minmax(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 mode, pp_u32* hdr) {
    pp_u64 spans = pp_num_pieces(n, bucket, PP_SPAN);
    std::vector<float> partials(2 * spans);
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
    pp_u64 nb = pp_num_buckets(n, bucket);
    if (!pp_wide_buckets(bucket, PP_SPAN)) {
        for (pp_u64 b = 0; b < nb; ++b) {
            pp_finalize_minmax(partials.data(), n, bucket, b, mode, hdr);
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
            pp_mm_fold_partials(mode, &lo[t], &hi[t], partials.data() + 2 * (first + k0), k1 - k0);
        }
        for (pp_u32 stride = PP_REDUCE_BLOCK / 2; stride > 0; stride /= 2) {
            for (pp_u32 t = 0; t < PP_REDUCE_BLOCK; ++t) {
                pp_mm_tree_step(lo, hi, t, stride, mode);
            }
        }
        // The serial fold (pp_finalize_minmax) gives the same header; poison the output if not.
        float sl, sh;
        pp_mm_init(mode, &sl, &sh);
        pp_mm_fold_partials(mode, &sl, &sh, partials.data() + 2 * first, count);
        pp_u32 got[2] = {0, 0}, want[2] = {0, 0};
        pp_mm_store(mode, lo[0], hi[0], 0, got);
        pp_mm_store(mode, sl, sh, 0, want);
        if (got[0] != want[0] || got[1] != want[1]) {
            lo[0] = hi[0] = pp_f32_from_bits(0x7fc0dead);
        }
        pp_mm_store(mode, lo[0], hi[0], b, hdr);
    }
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
        emu_finalize_sums(emu_block_sums(x, n, bucket, stat), n, bucket, stat, hdr.data());
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
    // pp_onebit_compress: every block g, lane by lane; the signs of element k of every lane
    // make word 8g + k (the warp's ballot); the partials as emu_block_sums makes them.
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
            buf[hw + 8u * g + k] = word;
        }
    }
    if (scaling && n > 0) {
        emu_finalize_sums(emu_block_sums(x, n, n, 0), n, n, 0, buf.data());
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
        emu_finalize_sums(emu_block_sums(x, n, bucket, 1), n, bucket, 1, buf.data());
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

// ---------------------------------------------------------------------------------------------
// Error feedback, momentum and averaging (pp_ef_input, pp_ef_residual, pp_nesterov,
// pp_momentum_update, pp_divide): the kernels' loops run serially. The first three return
// whether every result was finite (the kernels' *bad flag, inverted).
// ---------------------------------------------------------------------------------------------

bool pp_emu_ef_input(const float* g, const float* e, pp_u64 n, float factor, bool vanilla,
                     float* p) {
    bool ok = true;
    for (pp_u64 i = 0; i < n; ++i) {
        float v = pp_ef_sum(g[i], e[i], factor, vanilla);
        ok = ok && pp_is_finite(v);
        p[i] = v;
    }
    return ok;
}

bool pp_emu_ef_residual(const float* p, float* d, pp_u64 n) {
    bool ok = true;
    for (pp_u64 i = 0; i < n; ++i) {
        float v = p[i] - d[i];
        ok = ok && pp_is_finite(v);
        d[i] = v;
    }
    return ok;
}

bool pp_emu_nesterov(const float* g, const float* m, pp_u64 n, float mu, float* p) {
    bool ok = true;
    for (pp_u64 i = 0; i < n; ++i) {
        float mn = pp_momentum_next(m[i], g[i], mu);
        float v = pp_nesterov_value(g[i], mn, mu);
        ok = ok && pp_is_finite(v) && pp_is_finite(mn);
        p[i] = v;
    }
    return ok;
}

void pp_emu_momentum_update(const float* g, float* m, pp_u64 n, float mu) {
    for (pp_u64 i = 0; i < n; ++i) {
        m[i] = pp_momentum_next(m[i], g[i], mu);
    }
}

void pp_emu_divide(float* y, pp_u64 n, float w) {
    for (pp_u64 i = 0; i < n; ++i) {
        y[i] = y[i] / w;
    }
}

}  // extern "C"
