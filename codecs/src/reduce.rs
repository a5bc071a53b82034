//! The reduction, defined once: the rank-order sum of the workers' payloads, a local group's
//! host sum ([`host_fold`]) and the average, which the servers (`pushpull_server`'s `KeyRounds`), the workers, the single-process
//! reference and the device's decode (`pp_chunk_out` in `cuda/pushpull_table.cuh`, bound to
//! [`average`] by `pushpull-kernels`'s `tests/device_batch.rs`) all follow, so that a distributed result is the
//! reference's bits.

use crate::chain::Compressor;
use crate::codec::RoundCtx;
use crate::error::KernelError;

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
        codec: &Compressor,
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

/// A tensor's intra-host codec (`intra_compressor`): what each member of a local group rounds
/// its gradient to, and back to fp32, before the host sum. Only the rounding counts: the sum
/// itself is always in fp32 ([`host_fold`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IntraCodec {
    /// fp32 as it is.
    #[default]
    None,
    /// Rounded to fp16 as the `fp16` compressor does (round to nearest even, saturating at
    /// ±65504).
    Fp16,
    /// Rounded to bf16 as the `bf16` compressor does (saturating at bf16's largest finite).
    Bf16,
}

impl IntraCodec {
    /// The value of `intra_compressor`.
    pub fn name(self) -> &'static str {
        match self {
            IntraCodec::None => "none",
            IntraCodec::Fp16 => "fp16",
            IntraCodec::Bf16 => "bf16",
        }
    }

    /// `x` rounded to the codec's type and back; inf and NaN stay what they are, so a member's
    /// non-finite gradient makes the host sum non-finite.
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            IntraCodec::None => x,
            _ if !x.is_finite() => x,
            IntraCodec::Fp16 => crate::elem::f16_to_f32(crate::elem::f32_to_f16_sat(x)),
            IntraCodec::Bf16 => crate::elem::bf16_to_f32(crate::elem::f32_to_bf16_sat(x)),
        }
    }
}

/// Adds one member's gradient `x` to its host's sum `acc`, in local-rank order, by
/// [`RankOrderSum`]'s rule: local rank 0 (`first`) writes `intra.round(x)` (no zeroing, so a
/// `-0.0` stays), every later member adds `intra.round(x)` in fp32. Called by each member in
/// turn on the shared accumulator, and by the single-process reference.
///
/// # Panics
/// If `x` and `acc` differ in length (callers slice both from one chunk).
#[inline]
pub fn host_fold(intra: IntraCodec, first: bool, x: &[f32], acc: &mut [f32]) {
    assert_eq!(x.len(), acc.len(), "host_fold: one chunk's slices");
    match (intra, first) {
        (IntraCodec::None, true) => acc.copy_from_slice(x),
        (IntraCodec::None, false) => {
            for (a, v) in acc.iter_mut().zip(x) {
                *a += *v;
            }
        }
        (_, true) => {
            for (a, v) in acc.iter_mut().zip(x) {
                *a = intra.round(*v);
            }
        }
        (_, false) => {
            for (a, v) in acc.iter_mut().zip(x) {
                *a += intra.round(*v);
            }
        }
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
            sum.add(&codec, &f32s(x), &ctx, &mut acc).unwrap();
        }
        let want = |i: usize| ((ranks[0][i] + ranks[1][i]) + ranks[2][i]) + ranks[3][i];
        assert_eq!(acc.map(f32::to_bits), [want(0), want(1)].map(f32::to_bits));
        // A payload that does not decode leaves the rank out.
        assert!(sum.add(&codec, &[0; 3], &ctx, &mut acc).is_err());
        assert_eq!(sum.next_rank(), 4);
    }

    #[test]
    fn the_host_sum_is_member_0_rounded_then_each_member_added_in_order() {
        let members = [
            [1e8f32, -0.0, 1.0e-3],
            [1.0, -0.0, 3.0e-3],
            [-1e8, -0.0, 7e4],
        ];
        for intra in [IntraCodec::None, IntraCodec::Fp16, IntraCodec::Bf16] {
            let mut acc = [f32::NAN; 3];
            for (l, x) in members.iter().enumerate() {
                host_fold(intra, l == 0, x, &mut acc);
            }
            // A plain reimplementation through f64-free scalar steps, in the same order.
            let d = |x: f32| match intra {
                IntraCodec::None => x,
                IntraCodec::Fp16 => half::f16::from_f32(x.clamp(-65504.0, 65504.0)).to_f32(),
                IntraCodec::Bf16 => half::bf16::from_f32(x).to_f32(),
            };
            let want: Vec<u32> = (0..3)
                .map(|i| ((d(members[0][i]) + d(members[1][i])) + d(members[2][i])).to_bits())
                .collect();
            assert_eq!(acc.map(f32::to_bits).to_vec(), want, "{intra:?}");
        }
        // -0.0 survives an all-negative-zero sum; fp16 saturates, non-finite stays.
        let mut acc = [0.0f32; 1];
        host_fold(IntraCodec::None, true, &[-0.0], &mut acc);
        host_fold(IntraCodec::None, false, &[-0.0], &mut acc);
        assert_eq!(acc[0].to_bits(), (-0.0f32).to_bits());
        assert_eq!(IntraCodec::Fp16.round(1e6), 65504.0);
        assert!(IntraCodec::Fp16.round(f32::INFINITY).is_infinite());
        assert!(IntraCodec::Bf16.round(f32::NAN).is_nan());
    }

    #[test]
    fn the_average_divides() {
        let mut x = [1.0f32, 3.0, -7.0, 0.1];
        average(&mut x, 3);
        assert_eq!(x, [1.0f32 / 3.0, 1.0, -7.0 / 3.0, 0.1 / 3.0]);
    }
}
