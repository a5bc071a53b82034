//! The CUDA element functions and kernels, compiled for the host.
//!
//! `build.rs` compiles `kernels/cuda/host_shim.cpp` (which includes `pushpull_elem.cuh` and
//! `pushpull_work.cuh`, the headers the kernels use) with `-ffp-contract=off -fno-fast-math`. This module binds it:
//!
//! * one safe wrapper per element function, named after its [`crate::rng`] /
//!   [`crate::elem`] counterpart, so tests compare the two bit for bit;
//! * [`compress`], [`decompress`] and [`decompress_add`]: whole chunks through a serial
//!   emulation of the kernel launch sequence of the GPU codec (every block and thread run in turn,
//!   calling the same per-thread functions as the kernels). These are test and debugging aids,
//!   not a fast path: use the CPU compressors for that.

use super::scheme::{GpuScheme, RoundStreams};
use super::CudaError;
use crate::rng::Role;

/// Raw declarations of `host_shim.cpp`.
#[doc(hidden)]
pub mod ffi {
    #![allow(missing_docs)]
    extern "C" {
        pub fn pp_host_mix64(z: u64) -> u64;
        pub fn pp_host_stream_rounding(
            seed: u64,
            key: u64,
            round: u64,
            role: u64,
            rank: u32,
        ) -> u64;
        pub fn pp_host_stream_indices(seed: u64, key: u64, round: u64) -> u64;
        pub fn pp_host_draw(base: u64, counter: u64) -> u64;
        pub fn pp_host_uniform(base: u64, i: u64) -> f32;
        pub fn pp_host_uniform_cached(base: u64, i: u64) -> f32;
        pub fn pp_host_uniform_from_bits(bits: u16) -> f32;
        pub fn pp_host_permute(n: u64, key: u64, j: u64) -> u64;
        pub fn pp_host_perm_half_bits(n: u64) -> u32;
        pub fn pp_host_stochastic_round(t: f32, u: f32) -> u32;
        pub fn pp_host_f32_to_u32_sat(f: f32) -> u32;
        pub fn pp_host_sign_bit(x: f32) -> u32;
        pub fn pp_host_f32_to_f16_sat(x: f32) -> u16;
        pub fn pp_host_f16_to_f32(b: u16) -> f32;
        pub fn pp_host_f32_to_bf16_sat(x: f32) -> u16;
        pub fn pp_host_bf16_to_f32(b: u16) -> f32;
        pub fn pp_host_minmax_step(mn: f32, mx: f32, levels: u32) -> f32;
        pub fn pp_host_minmax_code(x: f32, mn: f32, step: f32, levels: u32, u: f32) -> u32;
        pub fn pp_host_minmax_value(q: u32, mn: f32, step: f32) -> f32;
        pub fn pp_host_dither_linear_level(x: f32, norm: f32, s: u32, u: f32) -> u32;
        pub fn pp_host_dither_linear_value(level: u32, sign: u32, norm: f32, s: u32) -> f32;
        pub fn pp_host_dither_natural_level(x: f32, norm: f32, s: u32, u: f32) -> u32;
        pub fn pp_host_dither_natural_value(level: u32, sign: u32, norm: f32, s: u32) -> f32;
        pub fn pp_host_pow2(e: i32) -> f32;
        pub fn pp_host_dither_width(s: u32) -> u32;
        pub fn pp_host_randomk_scale(n: u64, k: u64, unbiased: bool) -> f32;
        pub fn pp_host_read_code(bytes: *const u8, len: u64, i: u64, w: u32) -> u32;
        pub fn pp_host_pack_tile_capacity(w: u32) -> u64;
        pub fn pp_host_num_pieces(n: u64, bucket: u64, unit: u64) -> u64;
        pub fn pp_host_word_elems(n: u64, w: u32, word: u64, i0: *mut u64, i1: *mut u64);
        pub fn pp_host_tree_sum_block(x: *const f32, len: u64, op: u32) -> f32;
        pub fn pp_emu_bucket_stats(
            x: *const f32,
            n: u64,
            bucket: u64,
            stat: u32,
            out: *mut f32,
            out_len: u64,
        ) -> bool;

        pub fn pp_emu_fp16_compress(x: *const f32, n: u64, out: *mut u8, out_len: u64) -> bool;
        pub fn pp_emu_bf16_compress(x: *const f32, n: u64, out: *mut u8, out_len: u64) -> bool;
        pub fn pp_emu_fp16_decompress(
            p: *const u8,
            len: u64,
            n: u64,
            out: *mut f32,
            add: bool,
        ) -> bool;
        pub fn pp_emu_bf16_decompress(
            p: *const u8,
            len: u64,
            n: u64,
            out: *mut f32,
            add: bool,
        ) -> bool;
        pub fn pp_emu_onebit_compress(
            x: *const f32,
            n: u64,
            scaling: bool,
            out: *mut u8,
            out_len: u64,
        ) -> bool;
        pub fn pp_emu_onebit_decompress(
            p: *const u8,
            len: u64,
            n: u64,
            out: *mut f32,
            add: bool,
        ) -> bool;
        pub fn pp_emu_minmax_compress(
            x: *const f32,
            n: u64,
            bucket: u64,
            bits: u32,
            stream: u64,
            out: *mut u8,
            out_len: u64,
        ) -> bool;
        pub fn pp_emu_minmax_decompress(
            p: *const u8,
            len: u64,
            n: u64,
            bucket: u64,
            bits: u32,
            out: *mut f32,
            add: bool,
        ) -> bool;
        pub fn pp_emu_dither_compress(
            x: *const f32,
            n: u64,
            bucket: u64,
            s: u32,
            natural: bool,
            l2: bool,
            stream: u64,
            out: *mut u8,
            out_len: u64,
        ) -> bool;
        pub fn pp_emu_dither_decompress(
            p: *const u8,
            len: u64,
            n: u64,
            bucket: u64,
            s: u32,
            natural: bool,
            out: *mut f32,
            add: bool,
        ) -> bool;
        pub fn pp_emu_randomk_compress(
            x: *const f32,
            n: u64,
            k: u64,
            key: u64,
            scale: f32,
            out: *mut u8,
            out_len: u64,
        ) -> bool;
        pub fn pp_emu_randomk_decompress(
            p: *const u8,
            len: u64,
            n: u64,
            k: u64,
            key: u64,
            out: *mut f32,
            add: bool,
        ) -> bool;
        pub fn pp_emu_table_step(step: u32, table: *const u8, chunks: u64) -> bool;
        pub fn pp_host_chunk_layout(out: *mut u64, out_len: u64) -> u64;
    }
}

// -------------------------------------------------------------------------------------------
// Element functions. All are pure; the C side touches no memory but its arguments.
// -------------------------------------------------------------------------------------------

/// The host twin's pure functions, each calling its `pp_host_*` counterpart, which reads
/// nothing but its arguments.
macro_rules! pure {
    ($($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $ffi:ident;)*) => {$(
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: pure function of its arguments.
            unsafe { ffi::$ffi($($arg),*) }
        }
    )*};
}

pure! {
    /// `pp_mix64` ([`crate::rng::mix64`]).
    fn mix64(z: u64) -> u64 = pp_host_mix64;

    /// `pp_stream_indices` ([`crate::rng::Stream::indices`]); returns the base.
    fn stream_indices(seed: u64, key: u64, round: u64) -> u64 = pp_host_stream_indices;

    /// `pp_draw` ([`crate::rng::Stream::draw`]).
    fn draw(base: u64, counter: u64) -> u64 = pp_host_draw;

    /// `pp_uniform` ([`crate::rng::Stream::uniform`]).
    fn uniform(base: u64, i: u64) -> f32 = pp_host_uniform;

    /// `PPUniforms::at` (the per-draw cache of four elements the pack kernels use), primed with
    /// element `i ^ 4` (another draw), then `i ^ 3` (another lane of the same draw).
    fn uniform_cached(base: u64, i: u64) -> f32 = pp_host_uniform_cached;

    /// `pp_uniform_from_bits` ([`crate::rng::uniform_from_bits`]).
    fn uniform_from_bits(bits: u16) -> f32 = pp_host_uniform_from_bits;

    /// Half the bit width of the Feistel domain `pp_perm_new` picks for `n`.
    fn perm_half_bits(n: u64) -> u32 = pp_host_perm_half_bits;

    /// `pp_stochastic_round` ([`crate::elem::stochastic_round`]).
    fn stochastic_round(t: f32, u: f32) -> u32 = pp_host_stochastic_round;

    /// `pp_f32_to_u32_sat`: Rust's `f as u32`.
    fn f32_to_u32_sat(f: f32) -> u32 = pp_host_f32_to_u32_sat;

    /// `pp_sign_bit` ([`crate::elem::sign_bit`]).
    fn sign_bit(x: f32) -> u32 = pp_host_sign_bit;

    /// `pp_f32_to_f16_sat` ([`crate::elem::f32_to_f16_sat`]).
    fn f32_to_f16_sat(x: f32) -> u16 = pp_host_f32_to_f16_sat;

    /// `pp_f16_to_f32` ([`crate::elem::f16_to_f32`]).
    fn f16_to_f32(b: u16) -> f32 = pp_host_f16_to_f32;

    /// `pp_f32_to_bf16_sat` ([`crate::elem::f32_to_bf16_sat`]).
    fn f32_to_bf16_sat(x: f32) -> u16 = pp_host_f32_to_bf16_sat;

    /// `pp_bf16_to_f32` ([`crate::elem::bf16_to_f32`]).
    fn bf16_to_f32(b: u16) -> f32 = pp_host_bf16_to_f32;

    /// `pp_minmax_step` ([`crate::elem::minmax_step`]).
    fn minmax_step(min: f32, max: f32, levels: u32) -> f32 = pp_host_minmax_step;

    /// `pp_minmax_code` ([`crate::elem::minmax_code`]).
    fn minmax_code(x: f32, min: f32, step: f32, levels: u32, u: f32) -> u32 = pp_host_minmax_code;

    /// `pp_minmax_value` ([`crate::elem::minmax_value`]).
    fn minmax_value(q: u32, min: f32, step: f32) -> f32 = pp_host_minmax_value;

    /// `pp_dither_linear_level` ([`crate::elem::dither_linear_level`]).
    fn dither_linear_level(x: f32, norm: f32, s: u32, u: f32) -> u32 = pp_host_dither_linear_level;

    /// `pp_dither_linear_value` ([`crate::elem::dither_linear_value`]).
    fn dither_linear_value(level: u32, sign: u32, norm: f32, s: u32) -> f32 = pp_host_dither_linear_value;

    /// `pp_dither_natural_level` ([`crate::elem::dither_natural_level`]).
    fn dither_natural_level(x: f32, norm: f32, s: u32, u: f32) -> u32 = pp_host_dither_natural_level;

    /// `pp_dither_natural_value` ([`crate::elem::dither_natural_value`]).
    fn dither_natural_value(level: u32, sign: u32, norm: f32, s: u32) -> f32 = pp_host_dither_natural_value;

    /// `pp_pow2` ([`crate::elem::pow2`]).
    fn pow2(e: i32) -> f32 = pp_host_pow2;

    /// `pp_dither_width`: `1 + bit_length(s)`.
    fn dither_width(s: u32) -> u32 = pp_host_dither_width;

    /// `pp_randomk_scale` ([`GpuScheme::randomk_scale`]).
    fn randomk_scale(n: u64, k: u64, unbiased: bool) -> f32 = pp_host_randomk_scale;
}

/// `pp_stream_rounding` ([`crate::rng::Stream::rounding`]); returns the base.
pub fn stream_rounding(seed: u64, key: u64, round: u64, role: Role, rank: u32) -> u64 {
    // SAFETY: pure function of its arguments.
    unsafe { ffi::pp_host_stream_rounding(seed, key, round, role.tag(), rank) }
}

/// `pp_permute(pp_perm_new(n, key), j)` ([`crate::rng::Permutation::permute`]); `j < n`.
pub fn permute(n: u64, key: u64, j: u64) -> u64 {
    assert!(j < n, "permute: j = {j} must be below n = {n}");
    // SAFETY: pure function of its arguments; j < n so cycle walking terminates.
    unsafe { ffi::pp_host_permute(n, key, j) }
}

/// `pp_read_code`: code `i` of width `w` (1..=32) from a bit stream.
pub fn read_code(stream: &[u8], i: u64, w: u32) -> u32 {
    assert!((1..=32).contains(&w), "code width {w} outside 1..=32");
    let end_bit = (i + 1) * w as u64;
    assert!(
        end_bit <= 8 * stream.len() as u64,
        "code {i} of width {w} lies past the stream's {} bytes",
        stream.len()
    );
    // SAFETY: the shim copies `len` bytes into a padded word buffer; the code lies inside.
    unsafe { ffi::pp_host_read_code(stream.as_ptr(), stream.len() as u64, i, w) }
}

/// `pp_pack_tile_capacity`: shared-memory floats a pack block needs for code width `w`.
pub fn pack_tile_capacity(w: u32) -> u64 {
    assert!((1..=32).contains(&w), "code width {w} outside 1..=32");
    // SAFETY: pure function of its arguments.
    unsafe { ffi::pp_host_pack_tile_capacity(w) }
}

/// `pp_num_pieces`: reduction blocks (`unit` 256) or min/max spans (`unit` 2048) of a chunk.
pub fn num_pieces(n: u64, bucket: u64, unit: u64) -> u64 {
    assert!(
        bucket >= 1 && unit >= 1,
        "bucket and unit must be at least 1"
    );
    // SAFETY: pure function of its arguments (no division by zero: checked above).
    unsafe { ffi::pp_host_num_pieces(n, bucket, unit) }
}

/// The elements `[i0, i1)` of a stream of `n` codes of `w` bits (1..=32) that overlap u32 word
/// `word` (a pack kernel's thread).
pub fn word_elems(n: u64, w: u32, word: u64) -> (u64, u64) {
    assert!((1..=32).contains(&w), "a code has 1 to 32 bits");
    let (mut i0, mut i1) = (0u64, 0u64);
    // SAFETY: writes the two u64 it is given; no division by zero (w >= 1).
    unsafe { ffi::pp_host_word_elems(n, w, word, &mut i0, &mut i1) };
    (i0, i1)
}

/// The f32 tree sum of one block (at most 256 values) of `|x|` (`squares` false) or `x²`.
pub fn tree_sum_block(x: &[f32], squares: bool) -> f32 {
    assert!(x.len() <= 256, "a block holds at most 256 values");
    // SAFETY: reads x.len() floats.
    unsafe { ffi::pp_host_tree_sum_block(x.as_ptr(), x.len() as u64, squares as u32) }
}

/// A per-bucket statistic, through the emulated reduction kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketStat {
    /// Mean |x| ([`crate::elem::mean_abs`]).
    MeanAbs,
    /// l2 norm ([`crate::elem::l2_norm`]).
    L2,
    /// Max |x| ([`crate::elem::max_abs`]).
    MaxAbs,
    /// (min, max) pairs ([`crate::elem::min_max`]).
    MinMax,
}

/// Per-bucket statistics of `x` (buckets of `bucket` elements) as the reduction kernels compute
/// them; `MinMax` gives `[min0, max0, min1, max1, …]`.
pub fn bucket_stats(x: &[f32], bucket: usize, stat: BucketStat) -> Vec<f32> {
    let bucket = bucket.max(1);
    let nb = super::scheme::num_buckets(x.len(), bucket);
    let (code, len) = match stat {
        BucketStat::MeanAbs => (0, nb),
        BucketStat::L2 => (1, nb),
        BucketStat::MaxAbs => (2, nb),
        BucketStat::MinMax => (3, 2 * nb),
    };
    let mut out = vec![0.0f32; len];
    // SAFETY: reads x.len() floats, writes out.len() floats (the shim checks the length).
    let ok = unsafe {
        ffi::pp_emu_bucket_stats(
            x.as_ptr(),
            x.len() as u64,
            bucket as u64,
            code,
            out.as_mut_ptr(),
            out.len() as u64,
        )
    };
    assert!(ok, "pp_emu_bucket_stats rejected its arguments");
    out
}

// -------------------------------------------------------------------------------------------
// Whole chunks.
// -------------------------------------------------------------------------------------------

fn shim_failed(what: &str, scheme: &GpuScheme, n: usize) -> CudaError {
    CudaError::Invalid(format!(
        "host emulation of {what} rejected {scheme:?} for {n} elements (size or parameters)"
    ))
}

/// Compresses `input` with the emulated kernels of `scheme`, replacing the contents of `out`
/// with exactly [`GpuScheme::compressed_len`] bytes. Rejects what the GPU codec's
/// `compress_host` rejects (non-finite input, [`GpuScheme::header_problem`]).
pub fn compress(
    scheme: &GpuScheme,
    input: &[f32],
    streams: RoundStreams,
    out: &mut Vec<u8>,
) -> Result<(), CudaError> {
    let n = input.len();
    scheme.validate(n)?;
    if let Some(i) = input.iter().position(|v| !v.is_finite()) {
        return Err(CudaError::Invalid(format!(
            "input element {i} is not finite ({})",
            input[i]
        )));
    }
    let len = scheme.compressed_len(n);
    out.clear();
    out.resize(len, 0);
    let (x, n64, o, l) = (input.as_ptr(), n as u64, out.as_mut_ptr(), len as u64);
    let bucket = scheme.bucket_len(n) as u64;
    let stream = streams.rounding.base();
    // SAFETY: every call reads n floats from x and writes exactly l bytes to o; the shim checks
    // l against the documented size before writing.
    let ok = unsafe {
        match *scheme {
            GpuScheme::Fp16 => ffi::pp_emu_fp16_compress(x, n64, o, l),
            GpuScheme::Bf16 => ffi::pp_emu_bf16_compress(x, n64, o, l),
            GpuScheme::OneBit { scaling } => ffi::pp_emu_onebit_compress(x, n64, scaling, o, l),
            GpuScheme::MinMax { bits, .. } => {
                ffi::pp_emu_minmax_compress(x, n64, bucket, bits, stream, o, l)
            }
            GpuScheme::Dithering {
                levels,
                natural,
                l2,
                ..
            } => ffi::pp_emu_dither_compress(x, n64, bucket, levels, natural, l2, stream, o, l),
            GpuScheme::RandomK { k, unbiased } => {
                let scale = GpuScheme::randomk_scale(n, k, unbiased);
                ffi::pp_emu_randomk_compress(x, n64, k as u64, streams.indices.base(), scale, o, l)
            }
        }
    };
    if !ok {
        return Err(shim_failed("compress", scheme, n));
    }
    match scheme.header_problem(n, out) {
        Some(problem) => {
            out.clear();
            Err(CudaError::Invalid(problem))
        }
        None => Ok(()),
    }
}

fn decode(
    scheme: &GpuScheme,
    payload: &[u8],
    streams: RoundStreams,
    out: &mut [f32],
    add: bool,
) -> Result<(), CudaError> {
    let n = out.len();
    scheme.validate(n)?;
    let want = scheme.compressed_len(n);
    if payload.len() != want {
        return Err(CudaError::Invalid(format!(
            "{scheme:?} payload of {} bytes for {n} elements, expected {want}",
            payload.len()
        )));
    }
    let (p, l, n64, o) = (
        payload.as_ptr(),
        payload.len() as u64,
        n as u64,
        out.as_mut_ptr(),
    );
    let bucket = scheme.bucket_len(n) as u64;
    // SAFETY: every call reads l bytes from p and reads/writes n floats at o; the shim checks l.
    let ok = unsafe {
        match *scheme {
            GpuScheme::Fp16 => ffi::pp_emu_fp16_decompress(p, l, n64, o, add),
            GpuScheme::Bf16 => ffi::pp_emu_bf16_decompress(p, l, n64, o, add),
            GpuScheme::OneBit { .. } => ffi::pp_emu_onebit_decompress(p, l, n64, o, add),
            GpuScheme::MinMax { bits, .. } => {
                ffi::pp_emu_minmax_decompress(p, l, n64, bucket, bits, o, add)
            }
            GpuScheme::Dithering {
                levels, natural, ..
            } => ffi::pp_emu_dither_decompress(p, l, n64, bucket, levels, natural, o, add),
            GpuScheme::RandomK { k, .. } => {
                ffi::pp_emu_randomk_decompress(p, l, n64, k as u64, streams.indices.base(), o, add)
            }
        }
    };
    if ok {
        Ok(())
    } else {
        Err(shim_failed(
            if add { "decompress_add" } else { "decompress" },
            scheme,
            n,
        ))
    }
}

/// Decodes `payload` into `out` (its length is the chunk length) with the emulated kernels.
/// `streams` matters only for random-k (its indices).
pub fn decompress(
    scheme: &GpuScheme,
    payload: &[u8],
    streams: RoundStreams,
    out: &mut [f32],
) -> Result<(), CudaError> {
    decode(scheme, payload, streams, out, false)
}

/// Decodes `payload` and adds it into `acc` with the emulated kernels.
pub fn decompress_add(
    scheme: &GpuScheme,
    payload: &[u8],
    streams: RoundStreams,
    acc: &mut [f32],
) -> Result<(), CudaError> {
    decode(scheme, payload, streams, acc, true)
}

// -------------------------------------------------------------------------------------------
// Batches.
// -------------------------------------------------------------------------------------------

/// Runs table step `step` (`pp_t_*`, emulated by `pp_emu_table_step`) over the `chunks` entries
/// of the table at host address `table`.
///
/// # Safety
/// `table` addresses `chunks` [`crate::device::table::Entry`] whose addresses point into live
/// host memory large enough for their chunks (the emulated device's memory).
pub unsafe fn table_step(
    step: crate::device::table::Step,
    table: u64,
    chunks: usize,
) -> Result<(), CudaError> {
    // SAFETY: the caller vouches for the table and its addresses.
    if unsafe { ffi::pp_emu_table_step(step as u32, table as *const u8, chunks as u64) } {
        Ok(())
    } else {
        Err(CudaError::Invalid(format!(
            "host emulation of {} rejected its table (a pack tile too large?)",
            step.kernel()
        )))
    }
}
