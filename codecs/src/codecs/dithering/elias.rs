//! Dithering's Elias encodings (`encoding = elias`, `elias_omega`): the non-zero levels' gaps,
//! signs and levels in Elias gamma or Elias omega codes (see the parent module's docs for the
//! format).

use super::{encode_linear, encode_natural, value, Dithering, EliasCode, Partition};
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

    /// Appends `omega(v)`, `v >= 1`: Elias's recursive code. Its groups, from the first
    /// written: each holds the bit count minus one of the next, the last holds `v`; a group
    /// of `N + 1` bits is a one then its `N` low bits, least significant first; a zero ends it.
    #[inline(always)]
    fn omega(&mut self, mut v: u64) {
        debug_assert!(v >= 1);
        // At most 4 groups for a u64: v, then 63 at most, 5, 2.
        let mut groups = [0u64; 6];
        let mut k = 0;
        while v > 1 {
            groups[k] = v;
            k += 1;
            v = u64::from(63 - v.leading_zeros());
        }
        for &g in groups[..k].iter().rev() {
            let n = 63 - g.leading_zeros();
            self.put(1, 1);
            if n <= 32 {
                self.put(g as u32, n);
            } else {
                self.put(g as u32, 32);
                self.put((g >> 32) as u32, n - 32);
            }
        }
        self.put(0, 1);
    }

    /// Appends `v >= 1` in `code`.
    #[inline(always)]
    fn code(&mut self, code: EliasCode, v: u64) {
        match code {
            EliasCode::Gamma => self.gamma(v),
            EliasCode::Omega => self.omega(v),
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

    /// Reads `omega(v)` with `v <= max`; `None` if malformed or past the end.
    #[inline(always)]
    fn omega(&mut self, max: u64) -> Option<u64> {
        let mut v: u64 = 1;
        loop {
            if self.get(1)? == 0 {
                return (v <= max).then_some(v);
            }
            // The next group has `v + 1` bits, and is larger than `v`: past `max` (or 64 bits),
            // so is the value.
            if v >= 64 {
                return None;
            }
            v = self.low_bits(v as u32)?;
            if v > max {
                return None;
            }
        }
    }

    /// Reads `v <= max` in `code`.
    #[inline(always)]
    fn code(&mut self, code: EliasCode, max: u64) -> Option<u64> {
        match code {
            EliasCode::Gamma => self.gamma(max),
            EliasCode::Omega => self.omega(max),
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

/// Bits of `omega(v)`, `v >= 1`.
pub(super) fn omega_len(mut v: u64) -> u32 {
    let mut bits = 1;
    while v > 1 {
        let n = 63 - v.leading_zeros();
        bits += n + 1;
        v = u64::from(n);
    }
    bits
}

impl EliasCode {
    /// The most bits an element of a chunk costs in this code with `s` levels: each entry is
    /// `code(gap) + 1 + code(level)`, a gap `g` costs at most `2g - 1` bits in either code
    /// (checked by the tests) and the gaps add up to at most the chunk's length, so at most
    /// `2 + 1 + longest level code - 1` bits an element.
    pub(super) fn max_bits_per_element(self, s: u32) -> u32 {
        match self {
            EliasCode::Gamma => 3 + 2 * (31 - s.leading_zeros()),
            EliasCode::Omega => 2 + (1..=u64::from(s)).map(omega_len).max().unwrap_or(1),
        }
    }
}

impl Dithering {
    pub(super) fn compress_elias(
        &self,
        elias: EliasCode,
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
        let mut wr = BitWriter::new(self.elias_max_size(elias) / 4);
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
                        wr.code(elias, (i as i64 - prev) as u64);
                        wr.put(code & 1, 1);
                        wr.code(elias, (code >> 1) as u64);
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
    pub(super) fn elias_entries(
        &self,
        code: EliasCode,
        payload: &[u8],
    ) -> Result<Vec<(u32, f32)>, KernelError> {
        let nb = self.bk.count;
        let name = &self.base.name;
        let min = 4 + 4 * nb;
        let max = self.elias_max_size(code);
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
                .code(code, max_gap)
                .ok_or_else(|| bad("bad or truncated index gap"))?;
            let i = next + gap - 1;
            let sign = rd.get(1).ok_or_else(|| bad("truncated sign"))?;
            let l = rd
                .code(code, self.s as u64)
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

    /// Values written in `code`, each followed by a one bit, read back.
    fn roundtrip(code: EliasCode, vals: &[u64]) {
        let mut w = BitWriter::new(0);
        for &v in vals {
            w.code(code, v);
            w.put(1, 1);
        }
        let words = w.finish();
        let mut bytes = vec![0u8; words.len() * 4];
        crate::simd::put_words(&mut bytes, &words);
        let mut r = BitReader::new(&bytes);
        for &v in vals {
            assert_eq!(r.code(code, u64::MAX >> 1), Some(v), "{code:?} {v}");
            assert_eq!(r.get(1), Some(1));
        }
    }

    #[test]
    fn gamma_roundtrip() {
        let vals: Vec<u64> = (1..300)
            .chain([1 << 31, (1 << 32) - 1, 1 << 32, (1 << 40) + 12345])
            .collect();
        roundtrip(EliasCode::Gamma, &vals);
        // The documented bit layout: gamma(5) = 0 0 1 then 5's two low bits (1, 0) LSB first.
        let mut w = BitWriter::new(0);
        w.gamma(5);
        assert_eq!(w.finish(), vec![0b0_1100]);
    }

    /// Elias omega as the textbook writes it (most significant bit first), for comparison.
    fn omega_textbook(mut v: u64) -> String {
        let mut code = String::from("0");
        while v > 1 {
            let bin = format!("{v:b}");
            v = bin.len() as u64 - 1;
            code = bin + &code;
        }
        code
    }

    #[test]
    fn omega_roundtrip_and_lengths() {
        let vals: Vec<u64> = (1..2000)
            .chain([
                1 << 16,
                (1 << 31) + 7,
                (1 << 32) - 1,
                1 << 32,
                (1 << 40) + 12345,
            ])
            .chain([u64::MAX >> 1])
            .collect();
        roundtrip(EliasCode::Omega, &vals);
        for &v in vals.iter().chain(&[u64::MAX]) {
            // The same length as the textbook code: log v + log log v + ... + 1.
            assert_eq!(omega_len(v) as usize, omega_textbook(v).len(), "{v}");
        }
        let mut w = BitWriter::new(0);
        w.omega(u64::MAX);
        let mut bytes = vec![0u8; 4 * 4];
        crate::simd::put_words(&mut bytes, &w.finish());
        assert_eq!(BitReader::new(&bytes).omega(u64::MAX), Some(u64::MAX));
        // The documented layout: omega(16) = groups 2 (1 then 0), 4 (1 then 0 0), 16 (1 then
        // 0 0 0 0), then 0 — each group a one then its low bits, least significant first.
        let mut w = BitWriter::new(0);
        w.omega(16);
        // Bits from the first: 1 0, 1 0 0, 1 0 0 0 0, 0; read as a word, least significant
        // bit first.
        assert_eq!(w.finish(), vec![0b100101]);
        assert_eq!(omega_textbook(16), "10100100000");
        // A value above `max` is refused, whichever group passes it.
        let mut w = BitWriter::new(0);
        w.omega(1000);
        let mut bytes = vec![0u8; 4 * 2];
        crate::simd::put_words(&mut bytes, &w.finish());
        assert_eq!(BitReader::new(&bytes).omega(999), None);
        assert_eq!(BitReader::new(&bytes).omega(1000), Some(1000));
        // omega(1) is a single zero bit: still refused where nothing may follow.
        assert_eq!(BitReader::new(&[0; 4]).omega(0), None);
        // Ones forever: malformed, not a loop or an overflow.
        assert_eq!(BitReader::new(&[0xff; 64]).omega(u64::MAX), None);
    }

    #[test]
    fn a_gap_costs_at_most_2g_minus_1_bits_in_either_code() {
        for g in (1..1 << 16).chain((17..63).map(|k| 1u64 << k)) {
            let gamma = 2 * (63 - g.leading_zeros()) + 1;
            assert!(u64::from(gamma) < 2 * g, "gamma({g})");
            assert!(u64::from(omega_len(g)) < 2 * g, "omega({g})");
        }
        assert_eq!(EliasCode::Gamma.max_bits_per_element(4), 7);
        assert_eq!(
            EliasCode::Omega.max_bits_per_element(4),
            8,
            "omega(4) is 6 bits"
        );
    }
}
