//! [`BufPool`]: reused byte buffers for encoded payloads.
//!
//! A payload is encoded into a `Vec<u8>` taken from the pool and frozen into [`Bytes`] that
//! own it ([`Bytes::from_owner`]). QUIC holds those `Bytes` until the peer has acknowledged
//! the data; when the last clone is dropped the `Vec` (its capacity intact) goes back to the
//! pool, so steady-state rounds encode into memory that is already allocated and paged in,
//! instead of a fresh allocation per chunk and round.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// A pool of byte buffers. Cheap to share (`Arc`); see the [module docs](self).
#[derive(Debug)]
pub struct BufPool {
    free: Mutex<Free>,
    max_bytes: usize,
}

#[derive(Debug, Default)]
struct Free {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

/// A pooled buffer owned by [`Bytes`]; returns to its pool when dropped.
struct Pooled {
    buf: Vec<u8>,
    pool: Arc<BufPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

impl BufPool {
    /// A pool that keeps at most `max_bytes` of capacity in idle buffers (what is beyond is
    /// freed).
    pub fn new(max_bytes: usize) -> Arc<BufPool> {
        Arc::new(BufPool {
            free: Mutex::new(Free::default()),
            max_bytes,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Free> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An empty buffer, with the capacity of one it was used for before when the pool has one
    /// (the largest idle one, so a big payload rarely has to grow a small buffer).
    pub fn take(&self) -> Vec<u8> {
        let mut free = self.lock();
        match free.bufs.pop() {
            Some(buf) => {
                free.bytes -= buf.capacity();
                buf
            }
            None => Vec::new(),
        }
    }

    /// Freezes `buf` into `Bytes` whose last drop returns it to this pool.
    pub fn freeze(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            buf,
            pool: self.clone(),
        })
    }

    /// Returns `buf` to the pool (cleared), unless the pool holds enough already.
    pub fn give_back(&self, mut buf: Vec<u8>) {
        if buf.capacity() == 0 {
            return;
        }
        buf.clear();
        let mut free = self.lock();
        if free.bytes + buf.capacity() > self.max_bytes {
            return;
        }
        free.bytes += buf.capacity();
        // Keep them sorted by capacity, largest last, so `take` hands out the largest.
        let at = free
            .bufs
            .partition_point(|b| b.capacity() <= buf.capacity());
        free.bufs.insert(at, buf);
    }

    /// Idle buffers and their capacity in bytes, for tests and diagnostics.
    pub fn idle(&self) -> (usize, usize) {
        let free = self.lock();
        (free.bufs.len(), free.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_buffers_come_back_when_the_last_clone_drops() {
        let pool = BufPool::new(1 << 20);
        let mut v = pool.take();
        assert_eq!(v.capacity(), 0);
        v.extend_from_slice(&[7u8; 1000]);
        let cap = v.capacity();
        let b = pool.freeze(v);
        let b2 = b.slice(10..20);
        assert_eq!(&b[..3], &[7, 7, 7]);
        drop(b);
        assert_eq!(pool.idle().0, 0, "a clone still holds it");
        assert_eq!(&b2[..], &[7u8; 10]);
        drop(b2);
        assert_eq!(pool.idle(), (1, cap));
        let again = pool.take();
        assert!(again.is_empty() && again.capacity() == cap);
        assert_eq!(pool.idle(), (0, 0));
    }

    #[test]
    fn the_pool_keeps_at_most_its_bound_and_hands_out_the_largest() {
        let pool = BufPool::new(3000);
        for n in [1000usize, 500, 2000] {
            pool.give_back(Vec::with_capacity(n));
        }
        // 1000 + 500 fit; 2000 more would pass 3000.
        assert_eq!(pool.idle(), (2, 1500));
        assert_eq!(pool.take().capacity(), 1000);
        assert_eq!(pool.take().capacity(), 500);
        assert_eq!(pool.take().capacity(), 0);
    }
}
