//! [`Pool`]: reused buffers for encoded payloads; [`BufPool`], the pool of `Vec<u8>`s.
//!
//! A payload is encoded into a buffer taken from the pool and frozen into [`Bytes`] that own
//! it ([`Bytes::from_owner`]). QUIC holds those `Bytes` until the peer has acknowledged the
//! data; when the last clone is dropped the buffer (its capacity intact) goes back to the
//! pool, so steady-state rounds encode into memory that is already allocated and paged in,
//! instead of a fresh allocation per chunk and round. The same holds for any buffer type that
//! is [`Recycle`], e.g. a worker's page-locked staging of payloads compressed on a GPU.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// A buffer a [`Pool`] can hold: bytes with a capacity, emptied when it comes back.
pub trait Recycle: AsRef<[u8]> + Send + Sync + 'static {
    /// Bytes of memory the buffer holds (what the pool's bound counts).
    fn capacity(&self) -> usize;
    /// Readies the buffer for its next use (a `Vec` is cleared).
    fn reset(&mut self);
}

impl Recycle for Vec<u8> {
    fn capacity(&self) -> usize {
        Vec::capacity(self)
    }
    fn reset(&mut self) {
        self.clear();
    }
}

/// A pool of buffers. Cheap to share (`Arc`); see the [module docs](self).
#[derive(Debug)]
pub struct Pool<B> {
    free: Mutex<Free<B>>,
    max_bytes: usize,
}

/// The pool of byte vectors that encoders write into.
pub type BufPool = Pool<Vec<u8>>;

#[derive(Debug)]
struct Free<B> {
    bufs: Vec<B>,
    bytes: usize,
}

/// A pooled buffer owned by [`Bytes`]; returns to its pool when dropped.
struct Pooled<B: Recycle> {
    buf: Option<B>,
    pool: Arc<Pool<B>>,
}

impl<B: Recycle> AsRef<[u8]> for Pooled<B> {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_ref().map_or(&[], |b| b.as_ref())
    }
}

impl<B: Recycle> Drop for Pooled<B> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            self.pool.give_back(buf);
        }
    }
}

impl<B: Recycle> Pool<B> {
    /// A pool that keeps at most `max_bytes` of capacity in idle buffers (what is beyond is
    /// freed).
    pub fn new(max_bytes: usize) -> Arc<Pool<B>> {
        Arc::new(Pool {
            free: Mutex::new(Free {
                bufs: Vec::new(),
                bytes: 0,
            }),
            max_bytes,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Free<B>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The largest idle buffer, if the pool has one (so a big payload rarely has to grow a
    /// small buffer).
    pub fn take_idle(&self) -> Option<B> {
        let mut free = self.lock();
        let buf = free.bufs.pop()?;
        free.bytes -= buf.capacity();
        Some(buf)
    }

    /// Freezes `buf` into `Bytes` whose last drop returns it to this pool.
    pub fn freeze(self: &Arc<Self>, buf: B) -> Bytes {
        Bytes::from_owner(Pooled {
            buf: Some(buf),
            pool: self.clone(),
        })
    }

    /// Returns `buf` to the pool (reset), unless the pool holds enough already.
    pub fn give_back(&self, mut buf: B) {
        let capacity = buf.capacity();
        if capacity == 0 {
            return;
        }
        buf.reset();
        let mut free = self.lock();
        if free.bytes + capacity > self.max_bytes {
            return;
        }
        free.bytes += capacity;
        // Keep them sorted by capacity, largest last, so `take_idle` hands out the largest.
        let at = free.bufs.partition_point(|b| b.capacity() <= capacity);
        free.bufs.insert(at, buf);
    }

    /// Idle buffers and their capacity in bytes, for tests and diagnostics.
    pub fn idle(&self) -> (usize, usize) {
        let free = self.lock();
        (free.bufs.len(), free.bytes)
    }
}

impl Pool<Vec<u8>> {
    /// An empty buffer, with the capacity of one it was used for before when the pool has one
    /// (the largest idle one).
    pub fn take(&self) -> Vec<u8> {
        self.take_idle().unwrap_or_default()
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

    /// A buffer type that is not a `Vec` (as a device's staging): it comes back when the last
    /// `Bytes` of it drops, not before, and is reset then.
    #[test]
    fn any_recycle_buffer_comes_back_only_when_its_last_bytes_drop() {
        #[derive(Debug)]
        struct Staging {
            bytes: Vec<u8>,
            resets: usize,
        }
        impl AsRef<[u8]> for Staging {
            fn as_ref(&self) -> &[u8] {
                &self.bytes
            }
        }
        impl Recycle for Staging {
            fn capacity(&self) -> usize {
                self.bytes.len()
            }
            fn reset(&mut self) {
                self.resets += 1;
            }
        }
        let pool: Arc<Pool<Staging>> = Pool::new(1 << 20);
        let staging = Staging {
            bytes: (0..=255u8).collect(),
            resets: 0,
        };
        // A payload of 100 bytes at the start of the buffer, as a worker pushes it.
        let payload = pool.freeze(staging).slice(..100);
        let held = payload.clone();
        assert_eq!(payload.len(), 100);
        assert_eq!(payload[99], 99);
        drop(payload);
        assert_eq!(pool.idle(), (0, 0), "a clone (QUIC's) still holds it");
        drop(held);
        assert_eq!(pool.idle(), (1, 256));
        let back = pool.take_idle().unwrap();
        assert_eq!((back.bytes.len(), back.resets), (256, 1));
        assert!(pool.take_idle().is_none());
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
