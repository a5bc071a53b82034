//! Runtime CPU dispatch and the small vector-friendly building blocks the codecs share.
//!
//! The kernels are written as plain Rust loops over fixed-size groups (32 elements per output
//! word for bit streams, [`crate::elem::REDUCE_BLOCK`] for reductions) so that LLVM vectorises
//! them. The crate is compiled for the baseline target (SSE2 on x86-64), where `f32::floor` is a
//! library call and nothing vectorises well, so every hot kernel is compiled three times by
//! [`multiversion!`]: with AVX-512 (F, DQ, BW, VL: 64-bit multiplies for the SplitMix64 draws),
//! with AVX2, and for the baseline, and the widest the CPU has is picked at run time
//! ([`SimdLevel`]). All compile the *same* source with IEEE semantics (Rust never contracts
//! `a * b + c` into an FMA, and none of these enables FMA), so all produce the same bits;
//! `codecs/tests/simd_levels.rs` checks it for every compressor, capping the level with
//! [`set_max_simd_level`].

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// The instruction sets the hot kernels are compiled for, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// The target's baseline (SSE2 on x86-64; every other architecture).
    Baseline,
    /// AVX2.
    Avx2,
    /// AVX-512 F, DQ, BW and VL.
    Avx512,
}

/// The widest level this CPU supports.
fn detected() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512dq")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl")
            {
                return SimdLevel::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return SimdLevel::Avx2;
            }
        }
        SimdLevel::Baseline
    })
}

/// The cap set by [`set_max_simd_level`] (`SimdLevel as u8`).
static CAP: AtomicU8 = AtomicU8::new(SimdLevel::Avx512 as u8);

/// The level the kernels use: the widest this CPU supports, at most the cap of
/// [`set_max_simd_level`]. Every level gives the same bits; only the speed differs.
pub fn simd_level() -> SimdLevel {
    let cap = match CAP.load(Ordering::Relaxed) {
        0 => SimdLevel::Baseline,
        1 => SimdLevel::Avx2,
        _ => SimdLevel::Avx512,
    };
    detected().min(cap)
}

/// Caps the instruction set of every kernel of this process at `level` (from the next kernel
/// call on; a level the CPU lacks is never used). For tests that compare the levels' bytes and
/// for measurements; the default is no cap.
pub fn set_max_simd_level(level: SimdLevel) {
    CAP.store(level as u8, Ordering::Relaxed);
}

/// Defines `fn $name(args) -> ret` that calls `$imp(args)` compiled for the widest
/// [`SimdLevel`] in use ([`simd_level`]; x86-64 only), or the baseline build.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? = $imp:path;) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                match $crate::simd::simd_level() {
                    $crate::simd::SimdLevel::Avx512 => {
                        #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl")]
                        unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                            $imp($($arg),*)
                        }
                        // SAFETY: `simd_level` never exceeds what the CPU supports; `avx512`
                        // has no other safety requirement.
                        return unsafe { avx512($($arg),*) };
                    }
                    $crate::simd::SimdLevel::Avx2 => {
                        #[target_feature(enable = "avx2")]
                        unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                            $imp($($arg),*)
                        }
                        // SAFETY: as above, for AVX2.
                        return unsafe { avx2($($arg),*) };
                    }
                    $crate::simd::SimdLevel::Baseline => {}
                }
            }
            $imp($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// Calls `$body` with the const generic `$W` set to the runtime width `$w` (1..=16).
macro_rules! with_width {
    ($w:expr, $W:ident => $body:expr) => {
        match $w {
            1 => {
                const $W: usize = 1;
                $body
            }
            2 => {
                const $W: usize = 2;
                $body
            }
            3 => {
                const $W: usize = 3;
                $body
            }
            4 => {
                const $W: usize = 4;
                $body
            }
            5 => {
                const $W: usize = 5;
                $body
            }
            6 => {
                const $W: usize = 6;
                $body
            }
            7 => {
                const $W: usize = 7;
                $body
            }
            8 => {
                const $W: usize = 8;
                $body
            }
            9 => {
                const $W: usize = 9;
                $body
            }
            10 => {
                const $W: usize = 10;
                $body
            }
            11 => {
                const $W: usize = 11;
                $body
            }
            12 => {
                const $W: usize = 12;
                $body
            }
            13 => {
                const $W: usize = 13;
                $body
            }
            14 => {
                const $W: usize = 14;
                $body
            }
            15 => {
                const $W: usize = 15;
                $body
            }
            16 => {
                const $W: usize = 16;
                $body
            }
            other => unreachable!("code width {other} outside 1..=16"),
        }
    };
}
pub(crate) use with_width;

/// The f32 exponent mask: an element is non-finite iff `bits & EXP == EXP`.
pub(crate) const EXP: u32 = 0x7f80_0000;

/// Whether every element is finite (no NaN, no infinity).
#[inline(always)]
fn all_finite_impl(x: &[f32]) -> bool {
    let mut bad = 0u32;
    for v in x {
        bad |= ((v.to_bits() & EXP) == EXP) as u32;
    }
    bad == 0
}

multiversion! {
    /// Whether every element is finite.
    pub(crate) fn all_finite_serial(x: &[f32]) -> bool = all_finite_impl;
}

/// Index of the first non-finite element, if any (parallel for long slices).
pub(crate) fn first_non_finite(x: &[f32]) -> Option<usize> {
    use rayon::prelude::*;
    let seg = crate::par::SEG;
    if crate::par::enabled(x.len()) {
        let ok = x.par_chunks(seg).all(all_finite_serial);
        if ok {
            return None;
        }
    } else if all_finite_serial(x) {
        return None;
    }
    x.iter().position(|v| !v.is_finite())
}

/// Stores `v` little-endian at u32 number `i` of the byte buffer at `dst`.
///
/// # Safety
/// `dst` must be valid for writes of `4 * i + 4` bytes.
#[inline(always)]
pub(crate) unsafe fn store_u32(dst: *mut u8, i: usize, v: u32) {
    // SAFETY: guaranteed by the caller; unaligned writes are allowed.
    unsafe { (dst as *mut u32).add(i).write_unaligned(v.to_le()) }
}

/// Loads the little-endian u32 number `i` of the byte buffer at `src`.
///
/// # Safety
/// `src` must be valid for reads of `4 * i + 4` bytes.
#[inline(always)]
pub(crate) unsafe fn load_u32(src: *const u8, i: usize) -> u32 {
    // SAFETY: guaranteed by the caller; unaligned reads are allowed.
    u32::from_le(unsafe { (src as *const u32).add(i).read_unaligned() })
}

/// Stores `v` little-endian at u16 number `i` of the byte buffer at `dst`.
///
/// # Safety
/// `dst` must be valid for writes of `2 * i + 2` bytes.
#[inline(always)]
pub(crate) unsafe fn store_u16(dst: *mut u8, i: usize, v: u16) {
    // SAFETY: guaranteed by the caller.
    unsafe { (dst as *mut u16).add(i).write_unaligned(v.to_le()) }
}

/// Loads the little-endian u16 number `i` of the byte buffer at `src`.
///
/// # Safety
/// `src` must be valid for reads of `2 * i + 2` bytes.
#[inline(always)]
pub(crate) unsafe fn load_u16(src: *const u8, i: usize) -> u16 {
    // SAFETY: guaranteed by the caller.
    u16::from_le(unsafe { (src as *const u16).add(i).read_unaligned() })
}

/// Copies `words` to `dst` as little-endian u32s (`dst.len() >= 4 * words.len()`).
#[inline(always)]
pub(crate) fn put_words(dst: &mut [u8], words: &[u32]) {
    assert!(dst.len() >= 4 * words.len());
    let p = dst.as_mut_ptr();
    for (i, &w) in words.iter().enumerate() {
        // SAFETY: 4 * i + 4 <= 4 * words.len() <= dst.len().
        unsafe { store_u32(p, i, w) }
    }
}

/// Reads little-endian u32 number `i` of `src`.
#[inline(always)]
pub(crate) fn get_u32(src: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([src[4 * i], src[4 * i + 1], src[4 * i + 2], src[4 * i + 3]])
}

/// Reads little-endian f32 number `i` of `src`.
#[inline(always)]
pub(crate) fn get_f32(src: &[u8], i: usize) -> f32 {
    f32::from_bits(get_u32(src, i))
}

/// Packs 32 codes of `W` bits (each `< 2^W`) into `W` u32 words, code `t` at bits
/// `[t*W, t*W + W)` of the 32*W-bit group.
#[inline(always)]
pub(crate) fn pack32<const W: usize>(c: &[u32; 32], out: &mut [u32]) {
    let out = &mut out[..W];
    if W == 1 || W == 2 || W == 4 || W == 8 || W == 16 {
        // Codes never straddle words: word j holds codes j*per .. j*per+per.
        let per = 32 / W;
        for (j, o) in out.iter_mut().enumerate() {
            let mut acc = 0u32;
            for t in 0..per {
                acc |= c[j * per + t] << (t * W);
            }
            *o = acc;
        }
    } else {
        let mut acc = 0u64;
        let mut nb = 0usize;
        let mut o = 0usize;
        for &v in c.iter() {
            acc |= (v as u64) << nb;
            nb += W;
            if nb >= 32 {
                out[o] = acc as u32;
                o += 1;
                acc >>= 32;
                nb -= 32;
            }
        }
    }
}

/// Unpacks the 32 codes of a `W`-word group (the inverse of [`pack32`]).
#[inline(always)]
pub(crate) fn unpack32<const W: usize>(words: &[u32], c: &mut [u32; 32]) {
    let words = &words[..W];
    let mask = if W == 32 { u32::MAX } else { (1u32 << W) - 1 };
    if W == 1 || W == 2 || W == 4 || W == 8 || W == 16 {
        let per = 32 / W;
        for (j, &w) in words.iter().enumerate() {
            for t in 0..per {
                c[j * per + t] = (w >> (t * W)) & mask;
            }
        }
    } else {
        for (t, ct) in c.iter_mut().enumerate() {
            let bit = t * W;
            let word = bit / 32;
            let off = bit % 32;
            let mut v = words[word] >> off;
            if off + W > 32 {
                v |= words[word + 1] << (32 - off);
            }
            *ct = v & mask;
        }
    }
}

/// Loads the `W` words of group `g` from a byte bit stream.
#[inline(always)]
pub(crate) fn load_group<const W: usize>(src: &[u8], g: usize, words: &mut [u32; 16]) {
    assert!(src.len() >= (g + 1) * 4 * W);
    let p = src.as_ptr();
    for (k, w) in words[..W].iter_mut().enumerate() {
        // SAFETY: 4 * (g * W + k) + 4 <= 4 * (g + 1) * W <= src.len().
        *w = unsafe { load_u32(p, g * W + k) };
    }
}

/// Number of bytes of a bit stream of `n` codes of `w` bits: `4 * ceil(n * w / 32)`.
pub const fn stream_bytes(n: usize, w: u32) -> usize {
    4 * (n * w as usize).div_ceil(32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip<const W: usize>() {
        let mut c = [0u32; 32];
        for (t, v) in c.iter_mut().enumerate() {
            *v = ((t as u32).wrapping_mul(2_654_435_761) >> 7) & ((1u32 << W) - 1);
        }
        let mut words = [0u32; 16];
        pack32::<W>(&c, &mut words);
        // Compare against the bit-by-bit definition.
        for (t, &v) in c.iter().enumerate() {
            for b in 0..W {
                let j = t * W + b;
                let got = (words[j / 32] >> (j % 32)) & 1;
                assert_eq!(got, (v >> b) & 1, "W={W} t={t} b={b}");
            }
        }
        let mut back = [0u32; 32];
        unpack32::<W>(&words, &mut back);
        assert_eq!(back, c);
    }

    #[test]
    fn pack_unpack_all_widths() {
        roundtrip::<1>();
        roundtrip::<2>();
        roundtrip::<3>();
        roundtrip::<4>();
        roundtrip::<5>();
        roundtrip::<6>();
        roundtrip::<7>();
        roundtrip::<8>();
        roundtrip::<9>();
        roundtrip::<10>();
        roundtrip::<11>();
        roundtrip::<12>();
        roundtrip::<13>();
        roundtrip::<14>();
        roundtrip::<15>();
        roundtrip::<16>();
    }

    #[test]
    fn finiteness() {
        let mut x = vec![1.0f32; 1000];
        assert_eq!(first_non_finite(&x), None);
        x[777] = f32::NAN;
        x[900] = f32::INFINITY;
        assert_eq!(first_non_finite(&x), Some(777));
        x[3] = f32::NEG_INFINITY;
        assert_eq!(first_non_finite(&x), Some(3));
    }
}
