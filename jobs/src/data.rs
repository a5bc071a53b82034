//! Reproducible test data: every element a worker pushes is a pure function of
//! `(seed, round, rank, tensor index, element index)`, so any node can regenerate every other
//! worker's data and check a push_pull result bit for bit against the rank-order f32 sum.
//!
//! Each element is one SplitMix64 draw turned into an f32 in `[-1, 1)` with a random power of
//! two scale (`2^0 … 2^-7`), so the values are exact in f32, have mixed magnitudes, and their
//! f32 sums depend on the summation order (a check in another order would fail).

use rayon::prelude::*;

pub use pushpull_proto::placement::mix64;

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The stream id of one tensor's data for one worker and round.
pub fn stream(seed: u64, round: u64, rank: u32, tensor: u32) -> u64 {
    let a = mix64(seed ^ 0x7075_7368_7075_6c6c); // "pushpull"
    let b = mix64(a ^ round.wrapping_mul(GOLDEN));
    mix64(b ^ ((u64::from(rank) << 32) | u64::from(tensor)))
}

/// Element `i` of stream `s`: an exact f32 in `[-1, 1)`.
#[inline]
pub fn element(s: u64, i: u64) -> f32 {
    let v = mix64(s.wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN)));
    let m = (v >> 40) as i32 - (1 << 23); // 24 significant bits at most
    let shift = (v & 7) as u32;
    m as f32 * f32::from_bits((127 - 23 - shift) << 23) // * 2^-(23 + shift), exact
}

/// Elements per rayon task.
const BLOCK: usize = 1 << 14;

/// Fills `out` with stream `s`, elements `0..out.len()`.
pub fn fill(s: u64, out: &mut [f32]) {
    out.par_chunks_mut(BLOCK)
        .enumerate()
        .for_each(|(b, chunk)| {
            let base = (b * BLOCK) as u64;
            for (j, o) in chunk.iter_mut().enumerate() {
                *o = element(s, base + j as u64);
            }
        });
}

/// Worker `rank`'s data for tensor `tensor` of `len` elements in `round`.
pub fn generate(seed: u64, round: u64, rank: u32, tensor: u32, len: usize) -> Vec<f32> {
    let mut v = vec![0.0f32; len];
    fill(stream(seed, round, rank, tensor), &mut v);
    v
}

/// Element `i` of the sum in rank order, `streams` in local groups of `local_size` (1: none):
/// each group's members in local-rank order (`+=` in f32), then the groups' sums in host
/// order, as a two-level job sums uncompressed data (ARCHITECTURE.md, "Two levels").
#[inline]
fn sum_element(streams: &[u64], local_size: usize, i: u64) -> f32 {
    let host = |members: &[u64]| {
        let mut acc = element(members[0], i);
        for &s in &members[1..] {
            acc += element(s, i);
        }
        acc
    };
    let mut groups = streams.chunks(local_size.max(1));
    let mut acc = host(groups.next().expect("at least one worker"));
    for g in groups {
        acc += host(g);
    }
    acc
}

/// The rank-order f32 sum of every worker's data for `tensor` in `round` (what the servers
/// must return bit for bit), the workers in local groups of `local_size`.
pub fn expected_sum(
    seed: u64,
    round: u64,
    (num_workers, local_size): (u32, u32),
    tensor: u32,
    len: usize,
) -> Vec<f32> {
    let streams: Vec<u64> = (0..num_workers)
        .map(|r| stream(seed, round, r, tensor))
        .collect();
    let mut out = vec![0.0f32; len];
    out.par_chunks_mut(BLOCK)
        .enumerate()
        .for_each(|(b, chunk)| {
            let base = (b * BLOCK) as u64;
            for (j, o) in chunk.iter_mut().enumerate() {
                *o = sum_element(&streams, local_size as usize, base + j as u64);
            }
        });
    out
}

/// The first element where a result differs from the expected one.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// Element index.
    pub index: u64,
    /// What the rank-order sum gives.
    pub expected: f32,
    /// What arrived.
    pub got: f32,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "element {}: expected {:e} ({:#010x}), got {:e} ({:#010x})",
            self.index,
            self.expected,
            self.expected.to_bits(),
            self.got,
            self.got.to_bits()
        )
    }
}

/// Checks `result` bit for bit against the rank-order sum of every worker's data (in local
/// groups of `local_size`), without materialising the expected tensor. Returns the first
/// mismatch.
pub fn check_sum(
    seed: u64,
    round: u64,
    (num_workers, local_size): (u32, u32),
    tensor: u32,
    result: &[f32],
) -> Result<(), Mismatch> {
    let streams: Vec<u64> = (0..num_workers)
        .map(|r| stream(seed, round, r, tensor))
        .collect();
    let found = result
        .par_chunks(BLOCK)
        .enumerate()
        .filter_map(|(b, chunk)| {
            let base = (b * BLOCK) as u64;
            chunk.iter().enumerate().find_map(|(j, &got)| {
                let i = base + j as u64;
                let expected = sum_element(&streams, local_size as usize, i);
                (expected.to_bits() != got.to_bits()).then_some(Mismatch {
                    index: i,
                    expected,
                    got,
                })
            })
        })
        .min_by_key(|m| m.index);
    match found {
        Some(m) => Err(m),
        None => Ok(()),
    }
}

/// Checks `result` bit for bit against stream `s` (a broadcast delivers the root's bytes).
pub fn check_equal(s: u64, result: &[f32]) -> Result<(), Mismatch> {
    let found = result
        .par_chunks(BLOCK)
        .enumerate()
        .filter_map(|(b, chunk)| {
            let base = (b * BLOCK) as u64;
            chunk.iter().enumerate().find_map(|(j, &got)| {
                let i = base + j as u64;
                let expected = element(s, i);
                (expected.to_bits() != got.to_bits()).then_some(Mismatch {
                    index: i,
                    expected,
                    got,
                })
            })
        })
        .min_by_key(|m| m.index);
    match found {
        Some(m) => Err(m),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_are_exact_and_in_range() {
        let v = generate(1, 2, 3, 4, 100_000);
        assert!(v.iter().all(|x| (-1.0..1.0).contains(x)));
        // Reproducible, and different per rank.
        assert_eq!(v, generate(1, 2, 3, 4, 100_000));
        assert_ne!(v, generate(1, 2, 4, 4, 100_000));
    }

    #[test]
    fn sum_is_rank_order_and_order_matters() {
        let w = 3;
        let len = 50_000;
        let data: Vec<Vec<f32>> = (0..w).map(|r| generate(9, 0, r, 7, len)).collect();
        let mut acc = data[0].clone();
        for d in &data[1..] {
            for (a, x) in acc.iter_mut().zip(d) {
                *a += x;
            }
        }
        let exp = expected_sum(9, 0, (w, 1), 7, len);
        assert!(acc
            .iter()
            .zip(&exp)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        assert_eq!(check_sum(9, 0, (w, 1), 7, &acc), Ok(()));
        // Summing in reverse order differs somewhere: the check is meaningful.
        let mut rev = data[2].clone();
        for d in [&data[1], &data[0]] {
            for (a, x) in rev.iter_mut().zip(d) {
                *a += x;
            }
        }
        assert!(check_sum(9, 0, (w, 1), 7, &rev).is_err());
        let mut bad = acc.clone();
        bad[40_000] += 1.0;
        assert_eq!(check_sum(9, 0, (w, 1), 7, &bad).unwrap_err().index, 40_000);
        assert_eq!(check_equal(stream(9, 0, 2, 7), &data[2]), Ok(()));
    }

    #[test]
    fn local_groups_sum_each_group_then_the_groups() {
        let len = 50_000;
        let d: Vec<Vec<f32>> = (0..4).map(|r| generate(5, 1, r, 3, len)).collect();
        let want: Vec<f32> = (0..len)
            .map(|i| (d[0][i] + d[1][i]) + (d[2][i] + d[3][i]))
            .collect();
        assert_eq!(check_sum(5, 1, (4, 2), 3, &want), Ok(()));
        // Not the flat order somewhere.
        assert!(check_sum(5, 1, (4, 1), 3, &want).is_err());
        let exp = expected_sum(5, 1, (4, 2), 3, len);
        assert!(exp
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
