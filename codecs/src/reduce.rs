//! The reduction, defined once: the rank-order sum of the workers' payloads and the average,
//! which the servers (`pushpull_server`'s `KeyRounds`), the workers, the single-process
//! reference and the device's decode (`pp_chunk_out` in `cuda/pushpull_table.cuh`, bound to
//! [`average`] by `pushpull-kernels`'s `tests/device_batch.rs`) all follow, so that a distributed result is the
//! reference's bits.

use crate::error::KernelError;
use crate::{Compressor, RoundCtx};

/// A sum of payloads in rank order: rank 0's payload decoded into the accumulator, then ranks
/// 1, 2, … added (`decompress_add`), so the sum has the same bits whatever order the payloads
/// arrived in. Incremental: each rank is added as soon as the ranks before it are in; nothing
/// needs all of them at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankOrderSum {
    next: u32,
}

impl RankOrderSum {
    /// A sum with no rank in it yet.
    pub fn new() -> RankOrderSum {
        RankOrderSum::default()
    }

    /// The rank whose payload comes next (ranks `0..next_rank()` are in).
    pub fn next_rank(&self) -> u32 {
        self.next
    }

    /// Adds the payload of rank [`RankOrderSum::next_rank`] to `acc` (`codec.len()`
    /// elements; rank 0 overwrites it, so it needs no zeroing), decoded by `codec`.
    ///
    /// # Errors
    /// The codec's, for a payload it cannot decode; the rank is then not in the sum.
    #[inline]
    pub fn add(
        &mut self,
        codec: &dyn Compressor,
        payload: &[u8],
        ctx: &RoundCtx,
        acc: &mut [f32],
    ) -> Result<(), KernelError> {
        if self.next == 0 {
            codec.decompress(payload, ctx, acc)?;
        } else {
            codec.decompress_add(payload, ctx, acc)?;
        }
        self.next += 1;
        Ok(())
    }
}

/// The average of a sum over `workers` workers, in place: every element becomes exactly
/// `sum / workers as f32` (an IEEE division, not a multiplication by the reciprocal), as the
/// device's decode computes it.
#[inline]
pub fn average(sum: &mut [f32], workers: u32) {
    let w = workers as f32;
    for x in sum.iter_mut() {
        *x /= w;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fp32_codec;

    fn f32s(x: &[f32]) -> Vec<u8> {
        x.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn the_sum_is_rank_0_decoded_then_each_rank_added_in_order() {
        // Magnitudes where the order of the additions shows in the bits.
        let ranks = [[1e8f32, -3.0], [1.0, 5e-8], [-1e8, 1.0], [0.5, 7.0]];
        let codec = fp32_codec(2);
        let ctx = RoundCtx::new(0);
        let mut acc = [f32::NAN; 2]; // overwritten by rank 0
        let mut sum = RankOrderSum::new();
        for (r, x) in ranks.iter().enumerate() {
            assert_eq!(sum.next_rank(), r as u32);
            sum.add(codec.as_ref(), &f32s(x), &ctx, &mut acc).unwrap();
        }
        let want = |i: usize| ((ranks[0][i] + ranks[1][i]) + ranks[2][i]) + ranks[3][i];
        assert_eq!(acc.map(f32::to_bits), [want(0), want(1)].map(f32::to_bits));
        // A payload that does not decode leaves the rank out.
        assert!(sum.add(codec.as_ref(), &[0; 3], &ctx, &mut acc).is_err());
        assert_eq!(sum.next_rank(), 4);
    }

    #[test]
    fn the_average_divides() {
        let mut x = [1.0f32, 3.0, -7.0, 0.1];
        average(&mut x, 3);
        assert_eq!(x, [1.0f32 / 3.0, 1.0, -7.0 / 3.0, 0.1 / 3.0]);
    }
}
