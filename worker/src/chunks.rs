//! Pure arithmetic between a placement (u64 offsets and lengths) and a caller's buffer.
//!
//! The scheduler's placement describes chunks with u64 offsets and lengths; a buffer is
//! indexed by `usize`. [`chunk_ranges`] checks once, at declare time, that the chunks tile the
//! tensor exactly, in order, on servers that exist, and converts them to `usize` ranges
//! (failing cleanly on a 32-bit machine instead of truncating).

use std::ops::Range;

use pushpull_proto::protocol::ChunkPlacement;

/// Checks that `chunks` tile `[0, len)` exactly, in order, each non-empty and on a server id
/// below `num_servers`, and returns their element ranges as `usize`. The error says which chunk
/// is wrong and how.
pub(crate) fn chunk_ranges(
    len: u64,
    chunks: &[ChunkPlacement],
    num_servers: u32,
) -> Result<Vec<Range<usize>>, String> {
    let mut out = Vec::with_capacity(chunks.len());
    let mut next: u64 = 0;
    for (i, c) in chunks.iter().enumerate() {
        if c.offset != next {
            return Err(format!(
                "chunk {i} (key {:#018x}) starts at element {}, expected {next}",
                c.key, c.offset
            ));
        }
        if c.len == 0 {
            return Err(format!("chunk {i} (key {:#018x}) is empty", c.key));
        }
        if c.server >= num_servers {
            return Err(format!(
                "chunk {i} (key {:#018x}) is placed on server {}, but the job has {num_servers} servers",
                c.key, c.server
            ));
        }
        let end = c.offset.checked_add(c.len).ok_or_else(|| {
            format!(
                "chunk {i} (key {:#018x}): offset + length overflows u64",
                c.key
            )
        })?;
        let to_usize = |v: u64| {
            usize::try_from(v).map_err(|_| {
                format!(
                    "chunk {i} (key {:#018x}) ends at element {v}, beyond this machine's address space",
                    c.key
                )
            })
        };
        out.push(to_usize(c.offset)?..to_usize(end)?);
        next = end;
    }
    if next != len {
        return Err(format!(
            "the chunks cover {next} elements of a tensor of {len}"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pushpull_proto::placement::Placer;
    use pushpull_proto::ParamMap;

    const P: u64 = 4_096_000;

    #[test]
    fn one_billion_elements_without_allocating_a_buffer() {
        let len = 1_000_000_000u64;
        let t = Placer::new(3, P).place("huge", len, ParamMap::new());
        let ranges = chunk_ranges(len, &t.chunks, 3).unwrap();
        assert_eq!(ranges.len(), 977);
        assert_eq!(ranges.first().unwrap().start, 0);
        assert_eq!(ranges.last().unwrap().end, 1_000_000_000usize);
        let bytes: u64 = ranges.iter().map(|r| (r.end - r.start) as u64 * 4).sum();
        assert_eq!(bytes, 4_000_000_000); // beyond u32::MAX, exact in u64
        assert!(ranges.iter().all(|r| (r.end - r.start) as u64 * 4 <= P));
    }

    #[cfg(target_pointer_width = "64")]
    #[test]
    fn more_elements_than_u32_max() {
        let len = 5_000_000_000u64; // 20 GB of fp32: only the arithmetic, no buffer
        let t = Placer::new(2, P).place("bigger", len, ParamMap::new());
        let ranges = chunk_ranges(len, &t.chunks, 2).unwrap();
        assert_eq!(ranges.last().unwrap().end as u64, len);
        let last = t.chunks.last().unwrap();
        assert!(last.offset > u32::MAX as u64);
    }

    #[test]
    fn ranges_are_disjoint_and_cover_the_tensor() {
        let len = 1003u64;
        let t = Placer::new(2, 400).place("t", len, ParamMap::new());
        let ranges = chunk_ranges(len, &t.chunks, 2).unwrap();
        assert_eq!(ranges.len(), t.chunks.len());
        let mut next = 0;
        for (r, c) in ranges.iter().zip(&t.chunks) {
            assert_eq!(r.start, next);
            assert_eq!(
                (r.start as u64, (r.end - r.start) as u64),
                (c.offset, c.len)
            );
            next = r.end;
        }
        assert_eq!(next as u64, len);
    }

    #[test]
    fn empty_tensor_has_no_chunks() {
        assert!(chunk_ranges(0, &[], 1).unwrap().is_empty());
    }

    #[test]
    fn bad_placements_are_named() {
        let c = |offset, len, server| ChunkPlacement {
            key: 0x42,
            offset,
            len,
            server,
        };
        let e = chunk_ranges(10, &[c(0, 4, 0), c(5, 5, 0)], 1).unwrap_err();
        assert!(
            e.contains("chunk 1") && e.contains("starts at element 5, expected 4"),
            "{e}"
        );
        let e = chunk_ranges(10, &[c(0, 10, 2)], 2).unwrap_err();
        assert!(e.contains("server 2") && e.contains("2 servers"), "{e}");
        let e = chunk_ranges(10, &[c(0, 4, 0)], 1).unwrap_err();
        assert!(e.contains("cover 4 elements of a tensor of 10"), "{e}");
        let e = chunk_ranges(10, &[c(0, 0, 0)], 1).unwrap_err();
        assert!(e.contains("empty"), "{e}");
        let e = chunk_ranges(u64::MAX, &[c(0, 5, 0), c(5, u64::MAX, 0)], 1).unwrap_err();
        assert!(e.contains("overflows"), "{e}");
    }
}
