//! A small seeded random number generator (SplitMix64) with uniform and Gaussian draws, so the
//! data, the teacher network, the initial weights and the minibatch order are pure functions of
//! the job seed, identical on every worker and every platform.

/// SplitMix64 (Steele, Lea and Flood): 64-bit state, full period, good enough for synthetic
/// data and weight initialisation.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
    spare: Option<f64>,
}

impl Rng {
    /// A generator for one purpose: `stream` separates independent uses of the same seed
    /// (data, teacher, init, batches of rank r, ...).
    pub fn new(seed: u64, stream: u64) -> Rng {
        let mut r = Rng {
            state: seed ^ stream.wrapping_mul(0xD6E8_FEB8_6659_FD93),
            spare: None,
        };
        // Decorrelate nearby seeds.
        r.next_u64();
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in 0..n (n ≥ 1), by Lemire's multiply-shift (bias below 2^-32 for n < 2^32).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Standard normal (Box–Muller, both values used).
    pub fn normal(&mut self) -> f64 {
        if let Some(s) = self.spare.take() {
            return s;
        }
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = std::f64::consts::TAU * u2;
        self.spare = Some(r * t.sin());
        r * t.cos()
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_has_unit_moments_and_streams_differ() {
        let mut r = Rng::new(7, 1);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        // 5 standard errors.
        assert!(mean.abs() < 5.0 / (n as f64).sqrt(), "mean {mean}");
        assert!(
            (var - 1.0).abs() < 5.0 * (2.0 / n as f64).sqrt(),
            "var {var}"
        );
        assert_ne!(Rng::new(7, 1).next_u64(), Rng::new(7, 2).next_u64());
        assert_eq!(Rng::new(7, 1).next_u64(), Rng::new(7, 1).next_u64());
        let mut v: Vec<u32> = (0..100).collect();
        Rng::new(3, 0).shuffle(&mut v);
        let mut s = v.clone();
        s.sort();
        assert_eq!(s, (0..100).collect::<Vec<_>>());
        assert_ne!(v, s);
    }
}
