//! A gossip round's relay ([`relay`]): each rank's neighbours' messages, held undecoded.

use bytes::Bytes;

/// A gossip round's results: for each rank of `0..num_workers`, the messages `held` of its
/// neighbours in `graph` (ascending), concatenated.
pub(super) fn relay(
    graph: &[Vec<u32>],
    held: &[Option<Bytes>],
    num_workers: u32,
) -> Vec<(u32, Bytes)> {
    (0..num_workers)
        .map(|rank| {
            let mut out = bytes::BytesMut::new();
            for &j in graph.get(rank as usize).into_iter().flatten() {
                if let Some(Some(p)) = held.get(j as usize) {
                    out.extend_from_slice(p);
                }
            }
            (rank, out.freeze())
        })
        .collect()
}
