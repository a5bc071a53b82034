//! Dithering's Elias encoding (`encoding = elias`): the non-zero levels' gaps, signs and
//! levels in Elias-gamma codes (see the parent module's docs for the format).

use super::{encode_linear, encode_natural, value, Dithering, Partition};
use crate::codecs::{par_segments, prepare, put_f32s};
use crate::error::KernelError;
use crate::rng::Stream;
use crate::simd::{stream_bytes, with_width};

/// LSB-first bit writer into u32 words.
struct BitWriter {
    words: Vec<u32>,
    acc: u64,
    nbits: u32,
}

impl BitWriter {
    fn new(cap_words: usize) -> BitWriter {
        BitWriter {
            words: Vec::with_capacity(cap_words),
            acc: 0,
            nbits: 0,
        }
    }

    /// Appends the low `count <= 32` bits of `v`.
    #[inline(always)]
    fn put(&mut self, v: u32, count: u32) {
        debug_assert!(count <= 32);
        let v = if count == 32 {
            v as u64
        } else {
            (v & ((1u32 << count) - 1)) as u64
        };
        self.acc |= v << self.nbits;
        self.nbits += count;
        if self.nbits >= 32 {
            self.words.push(self.acc as u32);
            self.acc >>= 32;
            self.nbits -= 32;
        }
    }

    /// Appends `gamma(v)`, `v >= 1`.
    #[inline(always)]
    fn gamma(&mut self, v: u64) {
        debug_assert!(v >= 1);
        let n = 63 - v.leading_zeros();
        // n zeros then a one.
        if n < 32 {
            self.put(1 << n, n + 1);
        } else {
            self.put(0, 32);
            self.put(1 << (n - 32), n - 32 + 1);
        }
        // The n low bits, least significant first.
        if n <= 32 {
            self.put(v as u32, n);
        } else {
            self.put(v as u32, 32);
            self.put((v >> 32) as u32, n - 32);
        }
    }

    fn finish(mut self) -> Vec<u32> {
        if self.nbits > 0 {
            self.words.push(self.acc as u32);
        }
        self.words
    }
}

/// LSB-first bit reader over little-endian u32 words of a byte slice.
struct BitReader<'a> {
    src: &'a [u8],
    /// Next word to load.
    next: usize,
    acc: u64,
    nbits: u32,
}

impl<'a> BitReader<'a> {
    fn new(src: &'a [u8]) -> BitReader<'a> {
        BitReader {
            src,
            next: 0,
            acc: 0,
            nbits: 0,
        }
    }

    #[inline(always)]
    fn refill(&mut self) {
        while self.nbits <= 32 && self.next * 4 < self.src.len() {
            self.acc |= (crate::simd::get_u32(self.src, self.next) as u64) << self.nbits;
            self.next += 1;
            self.nbits += 32;
        }
    }

    /// Reads `count <= 32` bits; `None` past the end.
    #[inline(always)]
    fn get(&mut self, count: u32) -> Option<u32> {
        if count == 0 {
            return Some(0);
        }
        self.refill();
        if self.nbits < count {
            return None;
        }
        let v = (self.acc & ((1u64 << count) - 1)) as u32;
        self.acc >>= count;
        self.nbits -= count;
        Some(v)
    }

    /// Reads `gamma(v)` with `v <= max`; `None` if malformed or past the end.
    #[inline(always)]
    fn gamma(&mut self, max: u64) -> Option<u64> {
        self.refill();
        let low = self.acc as u32;
        let n = if low != 0 && self.nbits >= 32 {
            low.trailing_zeros()
        } else {
            // Slow path: count zeros one by one (near the end of the stream or > 31 zeros).
            let mut n = 0u32;
            while self.get(1)? == 0 {
                n += 1;
                if n > 40 {
                    return None;
                }
            }
            let v = self.low_bits(n)?;
            return if v <= max { Some(v) } else { None };
        };
        self.acc >>= n + 1;
        self.nbits -= n + 1;
        let v = self.low_bits(n)?;
        if v <= max {
            Some(v)
        } else {
            None
        }
    }

    /// Reads the `n` low bits of a gamma code and adds the leading one.
    #[inline(always)]
    fn low_bits(&mut self, n: u32) -> Option<u64> {
        let lo = if n <= 32 {
            self.get(n)? as u64
        } else {
            let a = self.get(32)? as u64;
            let b = self.get(n - 32)? as u64;
            a | (b << 32)
        };
        Some((1u64 << n) | lo)
    }

    /// Number of bits consumed so far.
    fn consumed(&self) -> usize {
        self.next * 32 - self.nbits as usize
    }
}

impl Dithering {
    pub(super) fn compress_elias(
        &self,
        x: &[f32],
        norms: &[f32],
        stream: Stream,
        out: &mut Vec<u8>,
    ) -> Result<(), KernelError> {
        let n = self.base.n;
        // The levels and signs come from the packed encoder (the same draws, so both encodings
        // decode to the same values); the serial entropy coder then walks the packed codes.
        let w = self.w();
        let mut packed = vec![0u8; stream_bytes(n, w)];
        let f = match self.partition {
            Partition::Linear => encode_linear,
            Partition::Natural => encode_natural,
        };
        let factors = self.factors(norms);
        par_segments(x, w, &mut packed, |xs, i0, d| {
            f(xs, i0, d, stream, (norms, &factors), &self.bk, self.s)
        });
        let mut wr = BitWriter::new(self.elias_max_size() / 4);
        let mut prev: i64 = -1;
        let mut m = 0u32;
        with_width!(w, W => {
            let mut words = [0u32; 16];
            let mut c = [0u32; 32];
            let total = packed.len() / 4;
            for g in 0..n.div_ceil(32) {
                for (k, wd) in words[..W].iter_mut().enumerate() {
                    let at = g * W + k;
                    *wd = if at < total { crate::simd::get_u32(&packed, at) } else { 0 };
                }
                crate::simd::unpack32::<W>(&words, &mut c);
                if c.iter().all(|&v| v >> 1 == 0) {
                    continue;
                }
                for (t, &code) in c.iter().enumerate() {
                    let i = 32 * g + t;
                    if code >> 1 != 0 && i < n {
                        wr.gamma((i as i64 - prev) as u64);
                        wr.put(code & 1, 1);
                        wr.gamma((code >> 1) as u64);
                        prev = i as i64;
                        m += 1;
                    }
                }
            }
        });
        let words = wr.finish();
        let nb = self.bk.count;
        let size = 4 + 4 * nb + 4 * words.len();
        let dst = prepare(out, size);
        dst[..4].copy_from_slice(&m.to_le_bytes());
        put_f32s(&mut dst[4..4 + 4 * nb], norms.iter().copied());
        crate::simd::put_words(&mut dst[4 + 4 * nb..], &words);
        Ok(())
    }

    /// Decodes an Elias payload into `(index, value)` pairs after full validation.
    pub(super) fn elias_entries(&self, payload: &[u8]) -> Result<Vec<(u32, f32)>, KernelError> {
        let nb = self.bk.count;
        let name = &self.base.name;
        let min = 4 + 4 * nb;
        let max = self.elias_max_size();
        if payload.len() < min || payload.len() > max || payload.len() % 4 != 0 {
            return Err(KernelError::PayloadLength {
                compressor: name.clone(),
                expected: format!("a multiple of 4 between {min} and {max} bytes"),
                actual: payload.len(),
            });
        }
        let m = crate::simd::get_u32(payload, 0) as usize;
        if m > self.base.n {
            return Err(KernelError::malformed(
                name,
                format!("{m} non-zero levels announced for {} elements", self.base.n),
            ));
        }
        let norms: Vec<f32> = (0..nb)
            .map(|b| crate::simd::get_f32(payload, 1 + b))
            .collect();
        self.check_norms(&norms)?;
        let body = &payload[min..];
        let mut rd = BitReader::new(body);
        let mut entries = Vec::with_capacity(m);
        let natural = self.partition == Partition::Natural;
        let mut next: u64 = 0; // smallest index the next entry may have
        for e in 0..m {
            let bad = |what: &str| KernelError::malformed(name, format!("entry {e}: {what}"));
            let max_gap = self.base.n as u64 - next;
            let gap = rd
                .gamma(max_gap)
                .ok_or_else(|| bad("bad or truncated index gap"))?;
            let i = next + gap - 1;
            let sign = rd.get(1).ok_or_else(|| bad("truncated sign"))?;
            let l = rd
                .gamma(self.s as u64)
                .ok_or_else(|| bad("bad or truncated level"))? as u32;
            let nm = norms[i as usize / self.bk.size];
            let v = if natural {
                value::<true>(l, sign, nm, self.s)
            } else {
                value::<false>(l, sign, nm, self.s)
            };
            entries.push((i as u32, v));
            next = i + 1;
        }
        let used = rd.consumed();
        let words = body.len() / 4;
        if used.div_ceil(32) != words || rd.get((words * 32 - used) as u32) != Some(0) {
            return Err(KernelError::malformed(
                name,
                format!(
                    "{} bytes of codes after the header, the {m} entries use {used} bits",
                    body.len()
                ),
            ));
        }
        Ok(entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gamma_roundtrip() {
        let vals: Vec<u64> = (1..300)
            .chain([1 << 31, (1 << 32) - 1, 1 << 32, (1 << 40) + 12345])
            .collect();
        let mut w = BitWriter::new(0);
        for &v in &vals {
            w.gamma(v);
            w.put(1, 1);
        }
        let words = w.finish();
        let mut bytes = vec![0u8; words.len() * 4];
        crate::simd::put_words(&mut bytes, &words);
        let mut r = BitReader::new(&bytes);
        for &v in &vals {
            assert_eq!(r.gamma(u64::MAX >> 1), Some(v));
            assert_eq!(r.get(1), Some(1));
        }
        // The documented bit layout: gamma(5) = 0 0 1 then 5's two low bits (1, 0) LSB first.
        let mut w = BitWriter::new(0);
        w.gamma(5);
        assert_eq!(w.finish(), vec![0b0_1100]);
    }
}
