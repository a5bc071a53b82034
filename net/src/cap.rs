//! [`WindowCap`]: a ceiling on the congestion window of every connection of one endpoint, set
//! by the node's [`FrameSender`](crate::sender::FrameSender) from its send window.
//!
//! The send queue hands quinn whole frames, and always has room for two of them
//! ([`Flow::min_frames`](pushpull_proto::sendq::Flow::min_frames)): at 10 Mbit/s two 128 KiB
//! chunks are 210 ms of the link, four times a worker's window there. Past the queue, Cubic
//! decides how many of those bytes are on the wire, and it grows each connection's window until
//! the bottleneck's queue overflows; after a loss one worker's window is cut and the other's
//! is not, so two workers pushing into one server's link stop taking equal shares, and the
//! server's results, which need every worker's copy of a chunk, wait on the slower one
//! (BENCHMARKS.md at 60710fe, "A ceiling on the congestion window"). With the ceiling, a worker
//! has no more bytes on the wire than its window says, whatever the size of its frames, so the
//! windows that are equal by construction (`pushpull_proto::sendq::rate`) are the shares.
//!
//! The ceiling wraps quinn's default controller (Cubic): losses still shrink the window below
//! it. A [`WindowCap`] nobody sets leaves Cubic alone.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use quinn::congestion::{Controller, ControllerFactory, CubicConfig};

/// The lowest ceiling: a congestion window below a datagram stops a connection, its control
/// messages and heartbeats with it, and a send window of a few hundred bytes is a setting
/// tests use (`cluster.send_window_bytes`).
pub const MIN_CEILING: u64 = 64 << 10;

/// A ceiling, in bytes, on the congestion window of every connection built with
/// [`WindowCap::factory`]. Cheap to clone; clones share the value. Unset: no ceiling.
#[derive(Clone, Debug)]
pub struct WindowCap(Arc<AtomicU64>);

impl Default for WindowCap {
    fn default() -> Self {
        WindowCap(Arc::new(AtomicU64::new(u64::MAX)))
    }
}

impl WindowCap {
    /// No ceiling until [`WindowCap::set`].
    pub fn new() -> WindowCap {
        WindowCap::default()
    }

    /// Sets the ceiling (bytes, at least [`MIN_CEILING`]) for every connection, from their next
    /// packet on.
    pub fn set(&self, bytes: u64) {
        self.0.store(bytes.max(MIN_CEILING), Ordering::Relaxed);
    }

    /// The ceiling (`u64::MAX`: none).
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// A congestion controller factory for `quinn::TransportConfig`: Cubic under this ceiling.
    pub fn factory(&self) -> Arc<dyn ControllerFactory + Send + Sync> {
        self.factory_over(CubicConfig::default())
    }

    fn factory_over(&self, cubic: CubicConfig) -> Arc<dyn ControllerFactory + Send + Sync> {
        Arc::new(CappedFactory {
            cap: self.clone(),
            cubic: Arc::new(cubic),
        })
    }
}

struct CappedFactory {
    cap: WindowCap,
    cubic: Arc<CubicConfig>,
}

impl ControllerFactory for CappedFactory {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        Box::new(Capped {
            cap: self.cap.clone(),
            inner: self.cubic.clone().build(now, current_mtu),
        })
    }
}

/// Cubic, with [`Controller::window`] at most the ceiling; every event goes to Cubic.
struct Capped {
    cap: WindowCap,
    inner: Box<dyn Controller>,
}

impl Controller for Capped {
    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.inner.on_sent(now, bytes, last_packet_number)
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &quinn_proto::RttEstimator,
    ) {
        self.inner.on_ack(now, sent, bytes, app_limited, rtt)
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest_packet_num_acked: Option<u64>,
    ) {
        self.inner
            .on_end_acks(now, in_flight, app_limited, largest_packet_num_acked)
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        self.inner
            .on_congestion_event(now, sent, is_persistent_congestion, lost_bytes)
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.inner.on_mtu_update(new_mtu)
    }

    fn window(&self) -> u64 {
        self.inner.window().min(self.cap.get())
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(Capped {
            cap: self.cap.clone(),
            inner: self.inner.clone_box(),
        })
    }

    fn initial_window(&self) -> u64 {
        self.inner.initial_window()
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_cubics_under_the_ceiling() {
        let cap = WindowCap::new();
        let mut cubic = CubicConfig::default();
        cubic.initial_window(1 << 20);
        let mut c = cap.factory_over(cubic).build(Instant::now(), 1200);
        assert_eq!(c.window(), 1 << 20, "unset: Cubic's own");
        cap.set(MIN_CEILING + 1);
        assert_eq!(c.window(), MIN_CEILING + 1);
        cap.set(1);
        assert_eq!(c.window(), MIN_CEILING, "never below the lowest ceiling");
        cap.set(u64::MAX);
        // A loss still shrinks Cubic's window under a ceiling above it.
        c.on_congestion_event(Instant::now(), Instant::now(), false, 1200);
        let after_loss = c.window();
        assert!(after_loss < 1 << 20, "{after_loss} after a loss");
        cap.set(after_loss + 1);
        assert_eq!(c.window(), after_loss);
    }
}
