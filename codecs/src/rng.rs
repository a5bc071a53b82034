//! Counter-based randomness: every draw is a pure function of its coordinates.
//!
//! A compressor never carries a generator *state*. Instead each draw is computed from
//! `(job seed, key, round, role, rank, counter)`, so
//!
//! * any element's draw can be made by any thread (a rayon task or a CUDA thread) in any order,
//!   and the CPU and CUDA paths produce the same bits;
//! * a run is reproducible from its job seed alone;
//! * workers and the server round with *independent* noise (the role and rank are part of the
//!   stream), so their rounding errors do not correlate;
//! * random-k indices depend on `(seed, key, round)` only, so every node draws the same indices
//!   and the wire carries values only.
//!
//! The mixing function is the SplitMix64 finaliser (Steele, Lea and Flood, "Fast splittable
//! pseudorandom number generators", 2014, variant 13 by D. Stafford). `draw(c)` equals the
//! `c`-th output of a SplitMix64 generator whose state starts at the stream's base, which passes
//! BigCrush; we use it counter-style. One 64-bit draw feeds four elements (16 bits each), because
//! a full hash per element would cost more than the rest of a compress.
//!
//! # Rounding uniforms (wire format version 3)
//! Element `i` takes draw `i / 4` and its 16-bit lane `i % 4` (lane 0 = the low 16 bits):
//! `u_i = bits16 * 2^-16`, exact in f32, in `[0, 1 - 2^-16]`. So for any `p` in `[0, 1]`,
//! `P(u_i < p) = ceil(p * 2^16) / 2^16`: a stochastic rounding `floor(t) + (u < frac(t))` rounds
//! up with a probability that exceeds `frac(t)` by less than `2^-16`, i.e. its bias is below
//! `2^-16` of one quantisation step (never negative). Protocol versions up to 2 used two elements
//! per draw with 24 bits each (bias below `2^-24` of a step); version 3 changed it for speed.
//!
//! The same functions exist in CUDA C (`cuda/pushpull_elem.cuh`); tests compile that header for
//! the host and compare it with this module bit for bit.

/// Weyl increment of SplitMix64 (the golden ratio in 64-bit fixed point).
pub const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// Domain tag for stochastic-rounding streams.
const DOMAIN_ROUNDING: u64 = 0x726f_756e_6469_6e67; // "rounding"
/// Domain tag for random-k index streams.
const DOMAIN_INDICES: u64 = 0x696e_6469_6365_7321; // "indices!"
/// Domain tag for PowerSGD's random starting matrices.
const DOMAIN_LOW_RANK: u64 = 0x6c6f_775f_7261_6e6b; // "low_rank"

/// The role of the node that draws; part of every rounding stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A worker compresses gradients before the push.
    Worker,
    /// A server recompresses the aggregated sum before answering pulls.
    Server,
}

impl Role {
    /// The value mixed into the stream (worker 0, server 1).
    pub const fn tag(self) -> u64 {
        match self {
            Role::Worker => 0,
            Role::Server => 1,
        }
    }
}

pub use pushpull_proto::placement::mix64;

/// One independent stream of 64-bit draws, addressed by a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stream {
    base: u64,
}

impl Stream {
    /// The stream a node uses for stochastic rounding of `key` in `round`.
    ///
    /// `base = mix(mix(mix(mix(seed ^ D) ^ key) ^ round) ^ (role << 32 | rank))`.
    pub const fn rounding(seed: u64, key: u64, round: u64, role: Role, rank: u32) -> Stream {
        let mut h = mix64(seed ^ DOMAIN_ROUNDING);
        h = mix64(h ^ key);
        h = mix64(h ^ round);
        h = mix64(h ^ ((role.tag() << 32) | rank as u64));
        Stream { base: h }
    }

    /// The stream random-k uses to pick indices of `key` in `round`: the same on every node.
    pub const fn indices(seed: u64, key: u64, round: u64) -> Stream {
        let mut h = mix64(seed ^ DOMAIN_INDICES);
        h = mix64(h ^ key);
        h = mix64(h ^ round);
        Stream { base: h }
    }

    /// The stream PowerSGD draws a tensor's random starting matrix Q from, for `key` (the
    /// tensor's first chunk) at its step `step`: the same on every node.
    pub const fn low_rank(seed: u64, key: u64, step: u64) -> Stream {
        let mut h = mix64(seed ^ DOMAIN_LOW_RANK);
        h = mix64(h ^ key);
        h = mix64(h ^ step);
        Stream { base: h }
    }

    /// A stream from a raw base value (tests and the CUDA bridge use it).
    pub const fn from_base(base: u64) -> Stream {
        Stream { base }
    }

    /// The base value (what the CUDA kernels receive as their `stream` argument).
    pub const fn base(self) -> u64 {
        self.base
    }

    /// The 64-bit draw number `counter`: `mix64(base + counter * GOLDEN)`.
    #[inline(always)]
    pub const fn draw(self, counter: u64) -> u64 {
        mix64(self.base.wrapping_add(counter.wrapping_mul(GOLDEN)))
    }

    /// The uniform number in `[0, 1)` that element `i` uses for stochastic rounding.
    ///
    /// Element `i` takes draw `i / 4` and its 16-bit lane `i % 4` (lane 0 = the low 16 bits),
    /// as `bits16 * 2^-16` ([`uniform_from_bits`]), exactly representable in f32. So
    /// `P(u < p) = ceil(p * 2^16) / 2^16` for any `p` in `[0, 1]`: the bias of a stochastic
    /// rounding is below `2^-16` of one quantisation step.
    #[inline(always)]
    pub const fn uniform(self, i: u64) -> f32 {
        let d = self.draw(i >> 2);
        uniform_from_bits((d >> (16 * (i & 3))) as u16)
    }
}

/// `bits * 2^-16`: a 16-bit lane of a draw as a uniform number in `[0, 1)` (exact in f32).
#[inline(always)]
pub const fn uniform_from_bits(bits: u16) -> f32 {
    bits as f32 * (1.0 / 65_536.0)
}

/// A keyed pseudo-random permutation of `0..n` (a 4-round balanced Feistel network on the
/// smallest even power of two ≥ `n`, with cycle walking).
///
/// Random-k takes `index_j = permute(j)` for `j in 0..k`: k *distinct* indices (draws without
/// replacement), each computable independently by any thread, identical on every node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    key: u64,
}

impl Permutation {
    /// The permutation of `0..n` keyed by `stream` (use [`Stream::indices`]).
    pub fn new(n: u64, stream: Stream) -> Permutation {
        // Smallest even bit count b >= 2 with 2^b >= n.
        let mut bits = 64 - n.saturating_sub(1).leading_zeros();
        bits = bits.max(2);
        if bits % 2 == 1 {
            bits += 1;
        }
        Permutation {
            n,
            half_bits: bits / 2,
            key: stream.base(),
        }
    }

    /// The length of the permuted range.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// One pass of the Feistel network over the power-of-two domain.
    #[inline(always)]
    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let mut l = x >> self.half_bits;
        let mut r = x & mask;
        let mut round = 0u64;
        while round < 4 {
            let f = mix64(self.key ^ (round << 56) ^ r) & mask;
            let next_r = l ^ f;
            l = r;
            r = next_r;
            round += 1;
        }
        (l << self.half_bits) | r
    }

    /// The image of `j` (`j < n` required; the result is `< n`).
    #[inline]
    pub fn permute(&self, j: u64) -> u64 {
        debug_assert!(j < self.n);
        let mut x = self.feistel(j);
        while x >= self.n {
            x = self.feistel(x);
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_reference_values() {
        // SplitMix64 seeded with 0 (state += GOLDEN before mixing) yields these first outputs;
        // an independent definition of the generator, so a typo in a constant shows up here.
        let s = Stream::from_base(GOLDEN);
        assert_eq!(s.draw(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(s.draw(1), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(s.draw(2), 0x06c4_5d18_8009_454f);
    }

    #[test]
    fn streams_differ_by_every_coordinate() {
        let a = Stream::rounding(1, 2, 3, Role::Worker, 0);
        assert_ne!(a, Stream::rounding(9, 2, 3, Role::Worker, 0));
        assert_ne!(a, Stream::rounding(1, 9, 3, Role::Worker, 0));
        assert_ne!(a, Stream::rounding(1, 2, 9, Role::Worker, 0));
        assert_ne!(a, Stream::rounding(1, 2, 3, Role::Server, 0));
        assert_ne!(a, Stream::rounding(1, 2, 3, Role::Worker, 1));
        assert_ne!(a.base(), Stream::indices(1, 2, 3).base());
    }

    #[test]
    fn uniform_is_in_unit_interval_and_roughly_uniform() {
        let s = Stream::rounding(42, 7, 0, Role::Worker, 3);
        let n = 200_000u64;
        let mut sum = 0.0f64;
        for i in 0..n {
            let u = s.uniform(i);
            assert!((0.0..1.0).contains(&u), "u = {u}");
            sum += u as f64;
        }
        let mean = sum / n as f64;
        // Mean of U(0,1) has sd 1/sqrt(12 n) ~ 0.00065; 6 sd.
        assert!((mean - 0.5).abs() < 0.004, "mean = {mean}");
    }

    #[test]
    fn uniform_lanes_are_the_documented_ones() {
        let s = Stream::rounding(1, 2, 3, Role::Server, 4);
        for i in 0..64u64 {
            let lane = (s.draw(i / 4) >> (16 * (i % 4))) & 0xffff;
            assert_eq!(s.uniform(i), lane as f32 / 65_536.0, "element {i}");
        }
        assert_eq!(uniform_from_bits(0), 0.0);
        assert_eq!(uniform_from_bits(u16::MAX), 1.0 - 1.0 / 65_536.0);
    }

    #[test]
    fn permutation_is_a_bijection() {
        for n in [1u64, 2, 3, 4, 5, 7, 8, 100, 1000, 4097] {
            let p = Permutation::new(n, Stream::indices(5, n, 1));
            let mut seen = vec![false; n as usize];
            for j in 0..n {
                let x = p.permute(j);
                assert!(x < n);
                assert!(!seen[x as usize], "n = {n}: {x} hit twice");
                seen[x as usize] = true;
            }
        }
    }

    #[test]
    fn permutation_depends_on_the_key() {
        let n = 1000;
        let a = Permutation::new(n, Stream::indices(1, 2, 3));
        let b = Permutation::new(n, Stream::indices(1, 2, 4));
        let same = (0..n).filter(|&j| a.permute(j) == b.permute(j)).count();
        assert!(same < 20, "{same} of {n} fixed points shared");
    }
}
