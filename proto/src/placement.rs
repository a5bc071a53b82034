//! Chunking, keys and placement: pure arithmetic, no I/O.
//!
//! * A tensor of `len` f32 elements is cut into `ceil(4·len / partition_bytes)` chunks of equal
//!   size: the first `len % n` chunks have one element more than the rest
//!   ([`chunk_ranges`]). Offsets and lengths are u64, so tensors beyond 4 GiB work.
//! * `partition_bytes` is each tensor's own: the cluster's, halved for tensors whose chunks
//!   would carry more than `cluster.max_chunk_payload_bytes` on the wire ([`TensorCut`], with
//!   what each compressor states its payload weighs, [`PayloadModel`]).
//! * A chunk's key is derived from the tensor's *name* and the chunk index ([`chunk_key`]),
//!   never from a declaration counter, so workers may declare in any order.
//! * The scheduler assigns each chunk to the server with the fewest bytes so far among the
//!   tensors declared with the same parameter map (ties: the fewest bytes of all tensors, then
//!   the lowest id), chunk by chunk ([`Placer`]). Results never depend on placement.
//! * With local groups (`cluster.local_size` G > 1), one member of each host owns a chunk: it
//!   compresses the host's sum, pushes it and shares the result ([`chunk_owner`]: the key
//!   modulo G, so owners spread evenly whatever the tensors' sizes).

mod cut;

pub use cut::{CutRules, Kept, KeptCount, PayloadModel, TensorCut};

use crate::config::ParamMap;
use crate::protocol::{ChunkPlacement, TensorPlacement};

/// FNV-1a 64 of a byte string.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64's finaliser, a bijection on u64: spreads chunk keys here, and is the mixing
/// step of the compressors' counter-based random streams (`pushpull_kernels::rng`) and of the
/// benchmark's data, which all use this one definition.
#[inline(always)]
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of chunk `index` of tensor `name`: `mix64(fnv1a64(name) ^ mix64(index))`.
/// The scheduler checks that no two chunks of declared tensors share a key.
pub fn chunk_key(name: &str, index: u64) -> u64 {
    mix64(fnv1a64(name.as_bytes()) ^ mix64(index.wrapping_add(1)))
}

/// The local rank (`0..local_size`) of the member of each host that owns the chunk with `key`:
/// `key % local_size` (keys are hashes, so every member owns about as many chunks).
pub fn chunk_owner(key: u64, local_size: u32) -> u32 {
    (key % u64::from(local_size.max(1))) as u32
}

/// Number of chunks of a tensor of `len` elements (0 for an empty tensor).
pub fn num_chunks(len: u64, partition_bytes: u64) -> u64 {
    let per_chunk = (partition_bytes / 4).max(1);
    len.div_ceil(per_chunk)
}

/// `(offset, len)` of every chunk: equal sizes, the first `len % n` one element longer.
pub fn chunk_ranges(len: u64, partition_bytes: u64) -> impl Iterator<Item = (u64, u64)> {
    let n = num_chunks(len, partition_bytes);
    let (base, extra) = len.checked_div(n).map_or((0, 0), |base| (base, len % n));
    (0..n).map(move |i| {
        let offset = i * base + i.min(extra);
        let clen = base + u64::from(i < extra);
        (offset, clen)
    })
}

/// [`chunk_ranges`] in whole `unit`s of elements (a column of a column-wise onebit tensor):
/// the tensor's `len / unit` units split into equal runs of at most `partition_bytes` (at
/// least one unit, so a unit longer than the partition makes a longer chunk), the first ones
/// one unit longer. A `unit` of 0 or 1, or one that does not divide `len`, cuts as
/// [`chunk_ranges`] does (the codec then refuses the tensor by name).
pub fn chunk_ranges_in(
    len: u64,
    partition_bytes: u64,
    unit: u64,
) -> Box<dyn Iterator<Item = (u64, u64)>> {
    if unit <= 1 || len % unit != 0 {
        return Box::new(chunk_ranges(len, partition_bytes));
    }
    let units = len / unit;
    let per_chunk = ((partition_bytes / 4) / unit).max(1);
    let n = units.div_ceil(per_chunk);
    let (base, extra) = units
        .checked_div(n)
        .map_or((0, 0), |base| (base, units % n));
    Box::new((0..n).map(move |i| {
        let first = i * base + i.min(extra);
        ((first) * unit, (base + u64::from(i < extra)) * unit)
    }))
}

/// Assigns chunks to servers, least-loaded by bytes first: by default fp32 bytes, or with
/// [`Placer::place_cut`] the bytes each chunk really carries (its payload model's).
///
/// The load that decides is that of the tensors declared with the same parameter map (ties:
/// the load of all tensors, then the lowest id). Tensors with one map are exchanged together
/// (a model's gradients), while others may travel once: a job that first broadcasts its
/// parameters as fp32 (4 MB chunks with `configs/gpu-local.toml`) leaves the servers up to one
/// such chunk apart, more than a step's onebit gradients weigh, and balancing the gradients
/// against that total put 152 of a ResNet-50 step's 175 chunks on one server
/// (BENCHMARKS.md at 60710fe, "PyTorch on GPUs"). Within a map, servers stay within one
/// chunk's weight of each other.
#[derive(Debug, Clone)]
pub struct Placer {
    load_bytes: Vec<u64>,
    /// The load of the tensors of each parameter map.
    map_bytes: std::collections::BTreeMap<ParamMap, Vec<u64>>,
    partition_bytes: u64,
}

impl Placer {
    /// A placer for `num_servers` empty servers.
    pub fn new(num_servers: u32, partition_bytes: u64) -> Placer {
        Placer {
            load_bytes: vec![0; num_servers as usize],
            map_bytes: Default::default(),
            partition_bytes,
        }
    }

    /// Bytes assigned to each server so far.
    pub fn load_bytes(&self) -> &[u64] {
        &self.load_bytes
    }

    /// Cuts a tensor into chunks and assigns each to the currently least-loaded server,
    /// weighing each chunk by its fp32 bytes. The placement's priority is 0; the scheduler sets
    /// the agreed one.
    pub fn place(&mut self, name: &str, len: u64, params: ParamMap) -> TensorPlacement {
        let cut = TensorCut::fp32(self.partition_bytes);
        self.place_cut(name, len, &cut, params)
    }

    /// [`Placer::place`] with the tensor's own cut ([`TensorCut`]: its chunk size, in whole
    /// units), weighing each chunk by the payload its codec sends, so that servers carry equal
    /// traffic when some tensors are compressed and others (below `min_compress_bytes`) are
    /// not.
    pub fn place_cut(
        &mut self,
        name: &str,
        len: u64,
        cut: &TensorCut,
        params: ParamMap,
    ) -> TensorPlacement {
        let servers = self.load_bytes.len();
        let map_bytes = self
            .map_bytes
            .entry(params.clone())
            .or_insert_with(|| vec![0; servers]);
        let full = cut.ranges(len).next().map_or(0, |(_, l)| l);
        let chunks = cut
            .ranges(len)
            .enumerate()
            .map(|(i, (offset, clen))| {
                let server = (0..servers)
                    .min_by_key(|&id| (map_bytes[id], self.load_bytes[id], id))
                    .unwrap_or(0);
                let w = cut.payload.bytes(clen, full);
                if let Some(load) = self.load_bytes.get_mut(server) {
                    *load += w;
                    map_bytes[server] += w;
                }
                ChunkPlacement {
                    key: chunk_key(name, i as u64),
                    offset,
                    len: clen,
                    server: server as u32,
                }
            })
            .collect();
        TensorPlacement {
            name: name.to_string(),
            len,
            params,
            priority: 0,
            chunks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 4_096_000;

    #[test]
    fn chunks_cover_the_tensor_exactly() {
        for len in [0u64, 1, 1000, 1_024_000, 1_024_001, 3_000_003, 10_000_000] {
            let ranges: Vec<_> = chunk_ranges(len, P).collect();
            let mut next = 0;
            for &(off, l) in &ranges {
                assert_eq!(off, next);
                assert!(l >= 1 && l * 4 <= P, "len {len}: chunk of {l}");
                next += l;
            }
            assert_eq!(next, len);
            let (min, max) = ranges
                .iter()
                .fold((u64::MAX, 0), |(a, b), &(_, l)| (a.min(l), b.max(l)));
            if !ranges.is_empty() {
                assert!(max - min <= 1, "unequal chunks for {len}");
            }
        }
    }

    #[test]
    fn one_billion_elements_without_allocating() {
        let len = 1_000_000_000u64;
        let n = num_chunks(len, P);
        assert_eq!(n, 977); // ceil(4e9 / 4_096_000)
        let last = chunk_ranges(len, P).last().unwrap();
        assert_eq!(last.0 + last.1, len);
        // Every chunk fits a partition and the byte total is exact in u64.
        assert!(chunk_ranges(len, P).all(|(_, l)| l * 4 <= P));
        assert_eq!(
            chunk_ranges(len, P).map(|(_, l)| l * 4).sum::<u64>(),
            4_000_000_000
        );
    }

    #[test]
    fn more_than_4_gib_of_bytes() {
        let len = (5u64 << 32) / 4 + 17; // 5 GiB of fp32 plus a bit
        let sum: u64 = chunk_ranges(len, P).map(|(_, l)| l).sum();
        assert_eq!(sum, len);
        let mut placer = Placer::new(4, P);
        let t = placer.place("huge", len, ParamMap::new());
        assert_eq!(t.chunks.iter().map(|c| c.len).sum::<u64>(), len);
        let loads = placer.load_bytes();
        let (lo, hi) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
        assert!(hi - lo <= P, "unbalanced {loads:?}");
        assert_eq!(loads.iter().sum::<u64>(), len * 4);
    }

    #[test]
    fn placement_balances_bytes_not_counts() {
        let mut placer = Placer::new(2, P);
        placer.place("big", 1_024_000, ParamMap::new()); // one full chunk -> server 0
        let small = placer.place("a", 10, ParamMap::new()); // -> server 1
        assert_eq!(small.chunks[0].server, 1);
        let small2 = placer.place("b", 10, ParamMap::new()); // server 1 still lighter
        assert_eq!(small2.chunks[0].server, 1);
    }

    #[test]
    fn each_map_is_balanced_on_its_own() {
        let onebit: ParamMap = [("compressor".to_string(), "onebit".to_string())].into();
        // Broadcast-like fp32 tensors first: server 0 ends one 4 MB chunk ahead.
        let mut placer = Placer::new(2, P);
        placer.place("Parameter.a", 3 * 1_024_000, ParamMap::new());
        assert_eq!(placer.load_bytes(), &[2 * P, P]);
        // Then 40 gradients of one map, each 1/100 of a chunk: they split 20/20 (against the
        // total load they would all go to server 1).
        let mut on = [0; 2];
        for i in 0..40 {
            let t = placer.place(&format!("Gradient.{i}"), 10_240, onebit.clone());
            on[t.chunks[0].server as usize] += 1;
        }
        assert_eq!(on, [20, 20]);
        // A new map starts where the total is lighter (server 1, the tie-break).
        let fp16: ParamMap = [("compressor".to_string(), "fp16".to_string())].into();
        assert_eq!(placer.place("x", 10, fp16).chunks[0].server, 1);
    }

    #[test]
    fn chunks_in_units_hold_whole_units() {
        // 12 columns of 1000: a partition of 2.5 columns holds 2; 12 columns in 6 chunks.
        let r: Vec<_> = chunk_ranges_in(12_000, 4 * 2_500, 1000).collect();
        assert_eq!(r.len(), 6);
        assert!(r.iter().all(|&(o, l)| o % 1000 == 0 && l == 2000), "{r:?}");
        // 7 columns in 3 chunks: 3, 2, 2 columns, tiling the tensor.
        let r: Vec<_> = chunk_ranges_in(7_000, 4 * 3_000, 1000).collect();
        assert_eq!(r, vec![(0, 3000), (3000, 2000), (5000, 2000)]);
        // A column longer than the partition makes a longer chunk.
        let r: Vec<_> = chunk_ranges_in(3_000, 400, 1000).collect();
        assert_eq!(r, vec![(0, 1000), (1000, 1000), (2000, 1000)]);
        // No unit, or one that does not divide: the plain cut.
        let plain: Vec<_> = chunk_ranges(7_001, 4 * 3_000).collect();
        assert_eq!(
            chunk_ranges_in(7_001, 4 * 3_000, 1000).collect::<Vec<_>>(),
            plain
        );
        assert_eq!(chunk_ranges_in(0, 400, 10).count(), 0);
    }

    #[test]
    fn keys_depend_on_names_and_indices_only() {
        assert_eq!(chunk_key("fc1.weight", 0), chunk_key("fc1.weight", 0));
        assert_ne!(chunk_key("fc1.weight", 0), chunk_key("fc1.weight", 1));
        assert_ne!(chunk_key("fc1.weight", 0), chunk_key("fc1.bias", 0));
        let mut keys: Vec<u64> = (0..10_000).map(|i| chunk_key("t", i)).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), 10_000);
    }
}
