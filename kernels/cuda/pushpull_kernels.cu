// pushpull_kernels.cu: the CUDA kernels of the fixed-width compressors.
//
// Compiled to PTX by NVRTC (src/cuda/mod.rs prepends pushpull_elem.cuh, pushpull_work.cuh and
// pushpull_table.cuh to this file, so no include path is needed; nvcc finds the headers next to this file). Every
// kernel is a thin wrapper: it maps threads to work units and calls the per-thread functions of
// the headers, which the host emulation (host_shim.cpp) calls serially in the same way.
// All element counts are 64-bit; pointers to payloads are u32 words (f32 values are stored as
// their bits, so no type punning is needed).
//
// Launch contracts (src/cuda/codec.rs follows them):
//   * the finalize kernels and every *_compress of a bit-stream encoding need exactly 256
//     threads per block (PP_REDUCE_BLOCK, PP_PACK_WORDS); pp_block_sums and pp_span_minmax need
//     a multiple of 32 (a warp per reduction block or span);
//   * the pack kernels need dynamic shared memory of pp_pack_tile_capacity(w) floats;
//   * all kernels use grid-stride loops, so any grid size is correct.

#ifndef PUSHPULL_ELEM_CUH
#include "pushpull_elem.cuh"
#endif
#ifndef PUSHPULL_WORK_CUH
#include "pushpull_work.cuh"
#endif
#ifndef PUSHPULL_TABLE_CUH
#include "pushpull_table.cuh"
#endif

#define PP_TID() ((pp_u64)blockIdx.x * (pp_u64)blockDim.x + (pp_u64)threadIdx.x)
#define PP_STRIDE() ((pp_u64)gridDim.x * (pp_u64)blockDim.x)

// ------------------------------------------------------------------------------------------------
// Utilities
// ------------------------------------------------------------------------------------------------

// dst[0..count) = value (zero-fills random-k outputs, writes onebit's unit scale).
extern "C" __global__ void pp_fill_u32(pp_u32* dst, pp_u64 count, pp_u32 value) {
    for (pp_u64 i = PP_TID(); i < count; i += PP_STRIDE()) {
        dst[i] = value;
    }
}

// ------------------------------------------------------------------------------------------------
// Reductions
// ------------------------------------------------------------------------------------------------

#define PP_LANE() (threadIdx.x & 31u)
#define PP_WARP_ID() ((pp_u64)blockIdx.x * (blockDim.x / 32u) + threadIdx.x / 32u)
#define PP_WARPS() ((pp_u64)gridDim.x * (blockDim.x / 32u))

// partials[g] = the f32 tree sum of f(x) over reduction block g (op 0: |x|, op 1: x*x), as f64.
// One warp per block (warp-level grid-stride over the pp_num_pieces(n, bucket, 256) blocks):
// the first three levels in each lane's registers, the last five by shuffles.
__device__ __forceinline__ void pp_block_sums_body(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 op,
                                         double* partials) {
    pp_u64 blocks = pp_num_pieces(n, bucket, PP_REDUCE_BLOCK);
    for (pp_u64 g = PP_WARP_ID(); g < blocks; g += PP_WARPS()) {
        float s = pp_block_sum_lane(x, n, bucket, g, PP_LANE(), op);
        for (pp_u32 stride = 16; stride > 0; stride /= 2) {
            s = s + __shfl_down_sync(0xffffffffu, s, stride);  // lanes >= stride: unused
        }
        if (PP_LANE() == 0) {
            partials[g] = (double)s;
        }
    }
}

extern "C" __global__ void pp_block_sums(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 op,
                                         double* partials) {
    pp_block_sums_body(x, n, bucket, op, partials);
}

// hdr[b] = bucket b's statistic from the block partials (mode 0: mean, mode 1: sqrt of sum).
// Narrow buckets (at most PP_WIDE_BUCKET partials): one thread per bucket, pp_finalize_sum.
// Wide buckets: one CUDA block per bucket (block-level grid-stride), thread t adding group
// j0 + t of the partials, thread 0 the group sums in order.
__device__ __forceinline__ void pp_finalize_sums_body(const double* partials, pp_u64 n, pp_u64 bucket,
                                            pp_u32 mode, pp_u32* hdr) {
    pp_u64 nb = pp_num_buckets(n, bucket);
    if (!pp_wide_buckets(bucket, PP_REDUCE_BLOCK)) {
        for (pp_u64 b = PP_TID(); b < nb; b += PP_STRIDE()) {
            hdr[b] = pp_f32_bits(pp_finalize_sum(partials, n, bucket, b, mode));
        }
        return;
    }
    __shared__ double groups_buf[PP_REDUCE_BLOCK];
    for (pp_u64 b = blockIdx.x; b < nb; b += gridDim.x) {
        pp_u64 first, count;
        pp_bucket_pieces(n, bucket, PP_REDUCE_BLOCK, b, &first, &count);
        pp_u64 groups = pp_div_ceil(count, PP_SUM_GROUP);
        double sum = -0.0;
        for (pp_u64 j0 = 0; j0 < groups; j0 += PP_REDUCE_BLOCK) {
            pp_u64 m = pp_min_u64(PP_REDUCE_BLOCK, groups - j0);
            if (threadIdx.x < m) {
                groups_buf[threadIdx.x] = pp_sum_group(partials + first, count, j0 + threadIdx.x);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                sum = pp_add_in_order(sum, groups_buf, m);
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            hdr[b] = pp_f32_bits(pp_finalize_value(sum, pp_bucket_len(n, bucket, b), mode));
        }
    }
}

extern "C" __global__ void pp_finalize_sums(const double* partials, pp_u64 n, pp_u64 bucket,
                                            pp_u32 mode, pp_u32* hdr) {
    pp_finalize_sums_body(partials, n, bucket, mode, hdr);
}

// partials[2g], partials[2g+1] = (lo, hi) of span g (mode 0: min, max; mode 1: -, max |x|).
// One warp per span (warp-level grid-stride), lanes strided, combined by shuffles.
__device__ __forceinline__ void pp_span_minmax_body(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 mode,
                                          float* partials) {
    pp_u64 spans = pp_num_pieces(n, bucket, PP_SPAN);
    for (pp_u64 g = PP_WARP_ID(); g < spans; g += PP_WARPS()) {
        float lo, hi;
        pp_span_lane(x, n, bucket, g, PP_LANE(), mode, &lo, &hi);
        for (pp_u32 stride = 16; stride > 0; stride /= 2) {
            float rlo = __shfl_down_sync(0xffffffffu, lo, stride);
            float rhi = __shfl_down_sync(0xffffffffu, hi, stride);
            if (PP_LANE() < stride) {
                pp_mm_combine(mode, &lo, &hi, rlo, rhi);
            }
        }
        if (PP_LANE() == 0) {
            partials[2 * g] = lo;
            partials[2 * g + 1] = hi;
        }
    }
}

extern "C" __global__ void pp_span_minmax(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 mode,
                                          float* partials) {
    pp_span_minmax_body(x, n, bucket, mode, partials);
}

// Header words of each bucket from the span partials. Narrow buckets: one thread per bucket
// (pp_finalize_minmax). Wide buckets: one CUDA block per bucket (block-level grid-stride),
// thread t folding a contiguous run of the bucket's spans, then a tree over the threads.
__device__ __forceinline__ void pp_finalize_minmax_body(const float* partials, pp_u64 n, pp_u64 bucket,
                                              pp_u32 mode, pp_u32* hdr) {
    pp_u64 nb = pp_num_buckets(n, bucket);
    if (!pp_wide_buckets(bucket, PP_SPAN)) {
        for (pp_u64 b = PP_TID(); b < nb; b += PP_STRIDE()) {
            pp_finalize_minmax(partials, n, bucket, b, mode, hdr);
        }
        return;
    }
    __shared__ float lo[PP_REDUCE_BLOCK];
    __shared__ float hi[PP_REDUCE_BLOCK];
    for (pp_u64 b = blockIdx.x; b < nb; b += gridDim.x) {
        pp_u64 first, count;
        pp_bucket_pieces(n, bucket, PP_SPAN, b, &first, &count);
        pp_u64 per = pp_div_ceil(count, PP_REDUCE_BLOCK);
        pp_u64 k0 = pp_min_u64((pp_u64)threadIdx.x * per, count);
        pp_u64 k1 = pp_min_u64(k0 + per, count);
        pp_mm_init(mode, &lo[threadIdx.x], &hi[threadIdx.x]);
        pp_mm_fold_partials(mode, &lo[threadIdx.x], &hi[threadIdx.x], partials + 2 * (first + k0),
                            k1 - k0);
        __syncthreads();
        for (pp_u32 stride = PP_REDUCE_BLOCK / 2; stride > 0; stride /= 2) {
            pp_mm_tree_step(lo, hi, threadIdx.x, stride, mode);
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            pp_mm_store(mode, lo[0], hi[0], b, hdr);
        }
        __syncthreads();
    }
}

extern "C" __global__ void pp_finalize_minmax(const float* partials, pp_u64 n, pp_u64 bucket,
                                              pp_u32 mode, pp_u32* hdr) {
    pp_finalize_minmax_body(partials, n, bucket, mode, hdr);
}

// ------------------------------------------------------------------------------------------------
// fp16 / bf16: n x u16. One thread per element.
// ------------------------------------------------------------------------------------------------

__device__ __forceinline__ void pp_fp16_compress_body(const float* x, pp_u64 n, pp_u16* out) {
    for (pp_u64 i = PP_TID(); i < n; i += PP_STRIDE()) {
        out[i] = pp_f32_to_f16_sat(x[i]);
    }
}

extern "C" __global__ void pp_fp16_compress(const float* x, pp_u64 n, pp_u16* out) {
    pp_fp16_compress_body(x, n, out);
}

extern "C" __global__ void pp_fp16_decompress(const pp_u16* in, pp_u64 n, float* out) {
    for (pp_u64 i = PP_TID(); i < n; i += PP_STRIDE()) {
        out[i] = pp_f16_to_f32(in[i]);
    }
}

extern "C" __global__ void pp_fp16_decompress_add(const pp_u16* in, pp_u64 n, float* acc) {
    for (pp_u64 i = PP_TID(); i < n; i += PP_STRIDE()) {
        acc[i] = acc[i] + pp_f16_to_f32(in[i]);
    }
}

__device__ __forceinline__ void pp_bf16_compress_body(const float* x, pp_u64 n, pp_u16* out) {
    for (pp_u64 i = PP_TID(); i < n; i += PP_STRIDE()) {
        out[i] = pp_f32_to_bf16_sat(x[i]);
    }
}

extern "C" __global__ void pp_bf16_compress(const float* x, pp_u64 n, pp_u16* out) {
    pp_bf16_compress_body(x, n, out);
}

extern "C" __global__ void pp_bf16_decompress(const pp_u16* in, pp_u64 n, float* out) {
    for (pp_u64 i = PP_TID(); i < n; i += PP_STRIDE()) {
        out[i] = pp_bf16_to_f32(in[i]);
    }
}

extern "C" __global__ void pp_bf16_decompress_add(const pp_u16* in, pp_u64 n, float* acc) {
    for (pp_u64 i = PP_TID(); i < n; i += PP_STRIDE()) {
        acc[i] = acc[i] + pp_bf16_to_f32(in[i]);
    }
}

// ------------------------------------------------------------------------------------------------
// Bit-stream packing: one thread per output word. Widths that divide 32 read their elements
// directly; the others (codes straddling words) take PP_PACK_WORDS (256) words per block, the
// elements they cover staged through dynamic shared memory with coalesced loads.
// ------------------------------------------------------------------------------------------------

template <class Enc>
__device__ __forceinline__ void pp_pack_kernel(Enc enc, const float* x, pp_u64 n, pp_u32 w,
                                               pp_u32* words, pp_u64 nwords) {
    if (pp_direct_width(w)) {
        // No element is needed by two words: each thread reads its word's elements where they
        // are (consecutive threads, consecutive elements), no staging, no barrier.
        for (pp_u64 word = PP_TID(); word < nwords; word += PP_STRIDE()) {
            words[word] = pp_pack_word(enc, pp_direct(x), n, w, word);
        }
        return;
    }
    extern __shared__ float tile[];
    for (pp_u64 w0 = (pp_u64)blockIdx.x * PP_PACK_WORDS; w0 < nwords;
         w0 += (pp_u64)gridDim.x * PP_PACK_WORDS) {
        pp_u64 e0, e1;
        pp_pack_tile(n, w, nwords, w0, &e0, &e1);
        for (pp_u64 e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
            tile[pp_tile_slot(e - e0)] = x[e];
        }
        __syncthreads();
        pp_u64 word = w0 + threadIdx.x;
        if (word < nwords) {
            words[word] = pp_pack_word(enc, pp_tile(tile, e0), n, w, word);
        }
        __syncthreads();
    }
}

// onebit in one pass over x: one warp per reduction block g of the whole chunk, lane l holding
// elements 256g + l + 32k (k = 0..7). Sign word 8g + k is the warp's ballot of the signs of
// elements 256g + 32k + l (bit l; 0 past n), written by lane k; partials[g] is the |x| sum of
// the block exactly as pp_block_sums computes it (for the scale header, pp_finalize_sums).
// `words` points at the stream, past the header.
__device__ __forceinline__ void pp_onebit_compress_body(const float* x, pp_u64 n, pp_u32* words,
                                              double* partials) {
    pp_u64 blocks = pp_num_pieces(n, n, PP_REDUCE_BLOCK);
    pp_u64 nwords = pp_stream_words(n, 1u);
    pp_u32 lane = PP_LANE();
    for (pp_u64 g = PP_WARP_ID(); g < blocks; g += PP_WARPS()) {
        float v[8];
        pp_block_lane_load(x, n, n, g, lane, v);
        pp_u32 mine = 0;
        for (pp_u32 k = 0; k < 8u; ++k) {
            pp_u32 word = __ballot_sync(0xffffffffu, pp_sign_bit(v[k]) != 0u);
            mine = lane == k ? word : mine;
        }
        if (lane < 8u && 8u * g + lane < nwords) {
            words[8u * g + lane] = mine;
        }
        float s = pp_block_lane_sum(v, 0u);
        for (pp_u32 stride = 16; stride > 0; stride /= 2) {
            s = s + __shfl_down_sync(0xffffffffu, s, stride);
        }
        if (lane == 0) {
            partials[g] = (double)s;
        }
    }
}

extern "C" __global__ void pp_onebit_compress(const float* x, pp_u64 n, pp_u32* words,
                                              double* partials) {
    pp_onebit_compress_body(x, n, words, partials);
}

// minmax: `payload` starts with the (min, max) header written by pp_finalize_minmax.
__device__ __forceinline__ void pp_minmax_compress_body(const float* x, pp_u64 n, pp_u64 bucket,
                                              pp_u32 bits, pp_u64 stream, pp_u32* payload) {
    pp_u64 hw = pp_minmax_header_words(n, bucket);
    pp_pack_kernel(pp_minmax_enc(payload, bucket, bits, stream), x, n, bits, payload + hw,
                   pp_stream_words(n, bits));
}

extern "C" __global__ void pp_minmax_compress(const float* x, pp_u64 n, pp_u64 bucket,
                                              pp_u32 bits, pp_u64 stream, pp_u32* payload) {
    pp_minmax_compress_body(x, n, bucket, bits, stream, payload);
}

// packed dithering: `payload` starts with the norms written by pp_finalize_sums (l2) or
// pp_finalize_minmax (max). natural: 0 linear levels, 1 natural (powers of two).
__device__ __forceinline__ void pp_dither_compress_body(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 s,
                                              pp_u32 natural, pp_u64 stream, pp_u32* payload) {
    pp_u64 hw = pp_dither_header_words(n, bucket);
    pp_u32 w = pp_dither_width(s);
    pp_pack_kernel(pp_dither_enc(payload, bucket, s, natural != 0, stream), x, n, w,
                   payload + hw, pp_stream_words(n, w));
}

extern "C" __global__ void pp_dither_compress(const float* x, pp_u64 n, pp_u64 bucket, pp_u32 s,
                                              pp_u32 natural, pp_u64 stream, pp_u32* payload) {
    pp_dither_compress_body(x, n, bucket, s, natural, stream, payload);
}

// ------------------------------------------------------------------------------------------------
// Bit-stream decoding: one thread per group of PP_GROUP elements; add != 0 adds into out.
// ------------------------------------------------------------------------------------------------

// Stores a decoded group: one float4 access when the group is whole and 16-byte aligned (the
// same per-element operations as pp_store_group), else pp_store_group.
__device__ __forceinline__ void pp_store_group_dev(float* out, pp_u64 i0, pp_u32 count,
                                                   const float* vals, bool add) {
    float* p = out + i0;
    if (count == 4u && ((unsigned long long)p & 15u) == 0) {
        float4 v = make_float4(vals[0], vals[1], vals[2], vals[3]);
        if (add) {
            float4 a = *(const float4*)p;
            v.x = a.x + v.x;
            v.y = a.y + v.y;
            v.z = a.z + v.z;
            v.w = a.w + v.w;
        }
        *(float4*)p = v;
    } else {
        pp_store_group(out, i0, count, vals, add);
    }
}

#define PP_GROUP_LOOP(...)                                                   \
    pp_u64 groups = pp_div_ceil(n, PP_GROUP);                                 \
    for (pp_u64 gi = PP_TID(); gi < groups; gi += PP_STRIDE()) {              \
        pp_u64 i0 = gi * PP_GROUP;                                            \
        pp_u32 count = (pp_u32)pp_min_u64(PP_GROUP, n - i0);                  \
        float vals[PP_GROUP];                                                 \
        __VA_ARGS__;                                                          \
        pp_store_group_dev(out, i0, count, vals, add);                        \
    }

__device__ __forceinline__ void pp_onebit_decode(const pp_u32* payload, pp_u64 n, float* out,
                                                 bool add) {
    PP_GROUP_LOOP(pp_onebit_decode_group(payload, i0, count, vals))
}

extern "C" __global__ void pp_onebit_decompress(const pp_u32* payload, pp_u64 n, float* out) {
    pp_onebit_decode(payload, n, out, false);
}

extern "C" __global__ void pp_onebit_decompress_add(const pp_u32* payload, pp_u64 n, float* acc) {
    pp_onebit_decode(payload, n, acc, true);
}

__device__ __forceinline__ void pp_minmax_decode(const pp_u32* payload, pp_u64 n, pp_u64 bucket,
                                                 pp_u32 bits, float* out, bool add) {
    PP_GROUP_LOOP(pp_minmax_decode_group(payload, n, bucket, bits, i0, count, vals))
}

extern "C" __global__ void pp_minmax_decompress(const pp_u32* payload, pp_u64 n, pp_u64 bucket,
                                                pp_u32 bits, float* out) {
    pp_minmax_decode(payload, n, bucket, bits, out, false);
}

extern "C" __global__ void pp_minmax_decompress_add(const pp_u32* payload, pp_u64 n,
                                                    pp_u64 bucket, pp_u32 bits, float* acc) {
    pp_minmax_decode(payload, n, bucket, bits, acc, true);
}

__device__ __forceinline__ void pp_dither_decode(const pp_u32* payload, pp_u64 n, pp_u64 bucket,
                                                 pp_u32 s, pp_u32 natural, float* out,
                                                 bool add) {
    PP_GROUP_LOOP(pp_dither_decode_group(payload, n, bucket, s, natural != 0, i0, count, vals))
}

extern "C" __global__ void pp_dither_decompress(const pp_u32* payload, pp_u64 n, pp_u64 bucket,
                                                pp_u32 s, pp_u32 natural, float* out) {
    pp_dither_decode(payload, n, bucket, s, natural, out, false);
}

extern "C" __global__ void pp_dither_decompress_add(const pp_u32* payload, pp_u64 n,
                                                    pp_u64 bucket, pp_u32 s, pp_u32 natural,
                                                    float* acc) {
    pp_dither_decode(payload, n, bucket, s, natural, acc, true);
}

// ------------------------------------------------------------------------------------------------
// random-k: k x f32 at the indices permute(0..k) of the keyed permutation of 0..n (distinct
// indices, so the scatters need no atomics). One thread per value. decompress: pp_fill_u32(0)
// then pp_randomk_decompress; decompress_add: the three steps below.
// ------------------------------------------------------------------------------------------------

__device__ __forceinline__ void pp_randomk_compress_body(const float* x, pp_u64 n, pp_u64 k, pp_u64 key,
                                               float scale, pp_u32* payload) {
    PPPerm p = pp_perm_new(n, key);
    for (pp_u64 j = PP_TID(); j < k; j += PP_STRIDE()) {
        payload[j] = pp_f32_bits(pp_randomk_value(x, p, j, scale));
    }
}

extern "C" __global__ void pp_randomk_compress(const float* x, pp_u64 n, pp_u64 k, pp_u64 key,
                                               float scale, pp_u32* payload) {
    pp_randomk_compress_body(x, n, k, key, scale, payload);
}

// Writes value j at index permute(j); the other elements must have been zeroed (pp_fill_u32).
extern "C" __global__ void pp_randomk_decompress(const pp_u32* payload, pp_u64 n, pp_u64 k,
                                                 pp_u64 key, float* out) {
    PPPerm p = pp_perm_new(n, key);
    for (pp_u64 j = PP_TID(); j < k; j += PP_STRIDE()) {
        out[pp_permute(p, j)] = pp_f32_from_bits(payload[j]);
    }
}

// decompress_add, step 1 of 3: r[j] = acc[permute(j)] + value j (from the original acc).
// Step 2 is pp_add_zero over all of acc (off the support, acc + 0.0 turns -0.0 into +0.0, as
// adding a decompressed zero does), step 3 pp_randomk_decompress with r as its payload.
extern "C" __global__ void pp_randomk_decompress_add(const pp_u32* payload, pp_u64 n, pp_u64 k,
                                                     pp_u64 key, const float* acc, pp_u32* r) {
    PPPerm p = pp_perm_new(n, key);
    for (pp_u64 j = PP_TID(); j < k; j += PP_STRIDE()) {
        r[j] = pp_f32_bits(acc[pp_permute(p, j)] + pp_f32_from_bits(payload[j]));
    }
}

// acc[i] = acc[i] + 0.0 for every i.
extern "C" __global__ void pp_add_zero(float* acc, pp_u64 n) {
    for (pp_u64 i = PP_TID(); i < n; i += PP_STRIDE()) {
        acc[i] = acc[i] + 0.0f;
    }
}

// *first = the smallest index of a non-finite element (*first must start at ~0).
extern "C" __global__ void pp_first_nonfinite(const float* x, pp_u64 n, pp_u64* first) {
    for (pp_u64 i = PP_TID(); i < n; i += PP_STRIDE()) {
        if (!pp_is_finite(x[i])) {
            atomicMin(first, i);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Batches: one launch per step for every chunk of a table (src/device/batch.rs makes the
// tables and the launches). blockIdx.y is the chunk (gridDim.y the table's length), and the
// x-dimension runs the step's grid-stride loop within the chunk, so each chunk runs exactly the
// work units of the one-chunk kernels above; a block dispatches on its chunk's scheme, so all
// threads of a block take the same branch (the warp shuffles and barriers stay uniform).
// Steps in order: pp_t_clear, pp_t_prepare, pp_t_stats, pp_t_finalize, pp_t_encode,
// pp_t_residual, pp_t_residual_scatter (compression); pp_t_decode, pp_t_decode_scatter
// (pulled results). Chunks whose codec input is not finite skip everything after
// pp_t_prepare: their round is refused and nothing they would make is used.
// ------------------------------------------------------------------------------------------------

#define PP_CHUNK() (table[blockIdx.y])

// Flags of chunks [0, chunks) cleared for a new round: one thread per chunk.
extern "C" __global__ void pp_t_clear(const PPChunk* table, pp_u64 chunks) {
    for (pp_u64 c = PP_TID(); c < chunks; c += PP_STRIDE()) {
        pp_clear_flags(table[c]);
    }
}

// Momentum, error feedback and the non-finite check: one thread per element.
extern "C" __global__ void pp_t_prepare(const PPChunk* table) {
    const PPChunk& c = PP_CHUNK();
    for (pp_u64 i = PP_TID(); i < c.n; i += PP_STRIDE()) {
        float in = pp_prepare_elem(c, i);
        if (!pp_is_finite(in)) {
            atomicMin((pp_u64*)(pp_u32m(c.flags) + PP_FLAG_FIRST_BAD), i);
        }
    }
}

// The first pass over the codec input: onebit's signs and |x| partials, the min/max spans of
// minmax and max-norm dithering, the x^2 block partials of l2 dithering.
extern "C" __global__ void pp_t_stats(const PPChunk* table) {
    const PPChunk& c = PP_CHUNK();
    if (pp_chunk_bad(c)) {
        return;
    }
    const float* x = pp_f32p(c.x);
    switch (c.scheme) {
        case PP_SCHEME_ONEBIT:
            pp_onebit_compress_body(x, c.n, pp_u32m(c.payload) + pp_onebit_header_words(),
                                    (double*)c.partials);
            break;
        case PP_SCHEME_MINMAX:
            pp_span_minmax_body(x, c.n, c.bucket, 0u, pp_f32m(c.spans));
            break;
        case PP_SCHEME_DITHER:
            if ((c.opts & PP_OPT_L2) != 0) {
                pp_block_sums_body(x, c.n, c.bucket, 1u, (double*)c.partials);
            } else {
                pp_span_minmax_body(x, c.n, c.bucket, 1u, pp_f32m(c.spans));
            }
            break;
        default:
            break;
    }
}

// The payload headers from the partials: onebit's scale, minmax's (min, max), dithering's
// norms.
extern "C" __global__ void pp_t_finalize(const PPChunk* table) {
    const PPChunk& c = PP_CHUNK();
    if (pp_chunk_bad(c)) {
        return;
    }
    pp_u32* hdr = pp_u32m(c.payload);
    switch (c.scheme) {
        case PP_SCHEME_ONEBIT:
            if ((c.opts & PP_OPT_SCALING) != 0 && c.n > 0) {
                pp_finalize_sums_body((const double*)c.partials, c.n, c.n, 0u, hdr);
            } else if (PP_TID() == 0) {
                // mean |x| of an empty chunk is 0 (elem::mean_abs); no scaling is 1.0.
                hdr[0] = pp_f32_bits((c.opts & PP_OPT_SCALING) != 0 ? 0.0f : 1.0f);
            }
            break;
        case PP_SCHEME_MINMAX:
            pp_finalize_minmax_body(pp_f32p(c.spans), c.n, c.bucket, 0u, hdr);
            break;
        case PP_SCHEME_DITHER:
            if ((c.opts & PP_OPT_L2) != 0) {
                pp_finalize_sums_body((const double*)c.partials, c.n, c.bucket, 1u, hdr);
            } else {
                pp_finalize_minmax_body(pp_f32p(c.spans), c.n, c.bucket, 1u, hdr);
            }
            break;
        default:
            break;
    }
}

// The codes: casts, packed bit streams, random-k's values, raw fp32's copy. The launch gives
// the largest pp_pack_tile_capacity of its tile-staged chunks in dynamic shared memory.
extern "C" __global__ void pp_t_encode(const PPChunk* table) {
    const PPChunk& c = PP_CHUNK();
    if (pp_chunk_bad(c)) {
        return;
    }
    const float* x = pp_f32p(c.x);
    pp_u32* payload = pp_u32m(c.payload);
    switch (c.scheme) {
        case PP_SCHEME_RAW:
            for (pp_u64 i = PP_TID(); i < c.n; i += PP_STRIDE()) {
                payload[i] = pp_f32_bits(x[i]);
            }
            break;
        case PP_SCHEME_FP16:
            pp_fp16_compress_body(x, c.n, (pp_u16*)payload);
            break;
        case PP_SCHEME_BF16:
            pp_bf16_compress_body(x, c.n, (pp_u16*)payload);
            break;
        case PP_SCHEME_MINMAX:
            pp_minmax_compress_body(x, c.n, c.bucket, c.param, c.rounding, payload);
            break;
        case PP_SCHEME_DITHER:
            pp_dither_compress_body(x, c.n, c.bucket, c.param,
                                    (c.opts & PP_OPT_NATURAL) != 0 ? 1u : 0u, c.rounding,
                                    payload);
            break;
        case PP_SCHEME_RANDOMK:
            pp_randomk_compress_body(x, c.n, c.k, c.indices, c.scale, payload);
            break;
        default:
            break;  // onebit's codes came with its statistics
    }
}

// Error feedback's new residual d = ep - D(C(ep)): one thread per group of PP_GROUP elements.
extern "C" __global__ void pp_t_residual(const PPChunk* table) {
    const PPChunk& c = PP_CHUNK();
    if (c.e == 0 || pp_chunk_bad(c)) {
        return;
    }
    pp_u64 groups = pp_div_ceil(c.n, PP_GROUP);
    for (pp_u64 gi = PP_TID(); gi < groups; gi += PP_STRIDE()) {
        pp_u64 i0 = gi * PP_GROUP;
        if (!pp_residual_group(c, i0, (pp_u32)pp_min_u64(PP_GROUP, c.n - i0))) {
            pp_u32m(c.flags)[PP_FLAG_EF_RESIDUAL] = 1u;
        }
    }
}

// Random-k's residual on its support (after pp_t_residual): one thread per value.
extern "C" __global__ void pp_t_residual_scatter(const PPChunk* table) {
    const PPChunk& c = PP_CHUNK();
    if (c.e == 0 || c.scheme != PP_SCHEME_RANDOMK || pp_chunk_bad(c)) {
        return;
    }
    PPPerm perm = pp_perm_new(c.n, c.indices);
    for (pp_u64 j = PP_TID(); j < c.k; j += PP_STRIDE()) {
        if (!pp_residual_scatter(c, perm, j)) {
            pp_u32m(c.flags)[PP_FLAG_EF_RESIDUAL] = 1u;
        }
    }
}

// Pulled payloads (the chunks whose PRESENT word is set) decoded into y, or NaN where the sum
// was not finite: one thread per group.
extern "C" __global__ void pp_t_decode(const PPChunk* table) {
    const PPChunk& c = PP_CHUNK();
    pp_u32 present = pp_u32m(c.flags)[PP_FLAG_PRESENT];
    if (present == 0) {
        return;
    }
    pp_u64 groups = pp_div_ceil(c.n, PP_GROUP);
    for (pp_u64 gi = PP_TID(); gi < groups; gi += PP_STRIDE()) {
        pp_u64 i0 = gi * PP_GROUP;
        pp_u32 count = (pp_u32)pp_min_u64(PP_GROUP, c.n - i0);
        float vals[PP_GROUP];
        pp_decode_or_nan(c, present, i0, count, vals);
        pp_store_group_dev(pp_f32m(c.y), i0, count, vals, false);
    }
}

// Random-k's pulled values scattered into y (after pp_t_decode zeroed it).
extern "C" __global__ void pp_t_decode_scatter(const PPChunk* table) {
    const PPChunk& c = PP_CHUNK();
    if (c.scheme != PP_SCHEME_RANDOMK || pp_u32m(c.flags)[PP_FLAG_PRESENT] != 1u) {
        return;
    }
    PPPerm perm = pp_perm_new(c.n, c.indices);
    for (pp_u64 j = PP_TID(); j < c.k; j += PP_STRIDE()) {
        pp_decode_scatter(c, perm, j);
    }
}
