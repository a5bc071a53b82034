//! The payload checks the device's decoders (`pushpull-kernels`, which decode on a GPU what
//! these codecs encode) share with the codecs here, so both refuse the same payloads.

/// Element `i` of a payload read as little-endian f32 words.
pub fn f32_at(payload: &[u8], i: usize) -> f32 {
    crate::simd::get_f32(payload, i)
}

/// Whether the tail bits of a bit stream (past `n * w` bits) are zero, as the format requires.
pub fn tail_bits_zero(stream: &[u8], n: usize, w: u32) -> bool {
    crate::codecs::tail_bits_zero(stream, n, w)
}

/// Whether every code of a packed dithering stream of `n` codes has a level `<= s`.
pub fn packed_levels_ok(stream: &[u8], n: usize, s: u32) -> bool {
    crate::codecs::dithering::packed_levels_ok(stream, n, s)
}
