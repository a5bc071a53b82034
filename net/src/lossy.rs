//! A lossy UDP socket for tests: [`LossySocket`] wraps the socket quinn sends through and drops,
//! duplicates and delays (so reorders) a configured share of the datagrams it sends, as
//! `tc netem` would on a kernel that had it.
//!
//! * **Where it sits.** Behind quinn, in front of the real socket: [`LossySocket`] implements
//!   quinn's [`AsyncUdpSocket`] around the one quinn's tokio runtime builds, and
//!   [`Impairments::wrapper`] makes a [`SocketWrapper`] for
//!   [`crate::transport::with_socket_wrapper`], under which every [`crate::transport::Endpoint`]
//!   bound uses it. So a test puts a whole node (scheduler, server or worker, each binding its
//!   endpoint inside `Scheduler::bind`, `Server::bind`, `Worker::join`) behind it without a new
//!   parameter on those functions, while an endpoint bound outside such a future (every one
//!   the binaries bind: nothing outside tests calls it) gets the real socket as before. The
//!   worker test kit (`worker/tests/common`, `lossy_stack_with`) uses it for
//!   `worker/tests/loss.rs`. A UDP relay in front of each listening node would have needed no
//!   hook at all, but it would add a hop with its own address mapping, buffers and task
//!   scheduling that no real deployment has, and it could not see quinn's segmentation-offload
//!   batches; this wrapper changes nothing but the fate of each datagram.
//! * **What it does, per datagram sent** (one uniform draw each): drop it (share
//!   [`Impairments::drop`]); send it and a copy of it up to [`Impairments::max_delay`] later
//!   ([`Impairments::duplicate`]); send it up to `max_delay` late, so datagrams sent after it
//!   overtake it ([`Impairments::reorder`]); or send it at once. Everything happens on send:
//!   when every node of a test is wrapped, every path is impaired in both directions, and
//!   receiving passes through untouched.
//! * **Segmentation offload.** quinn hands a socket that supports GSO a batch of datagrams
//!   in one [`Transmit`] (`segment_size` set). The wrapper reports the real socket's
//!   `max_transmit_segments`, so quinn batches as it does without the wrapper, and splits each
//!   batch into single datagrams, each meeting its own fate (one fate per batch would drop up
//!   to 10 datagrams at once, far burstier than the configured share). On receive, GRO
//!   batches are left to quinn as the real socket reports them (`max_receive_segments`,
//!   `RecvMeta::stride`): the wrapper never sends a batch, so any batch a peer receives was
//!   coalesced by the receiving kernel, after the datagrams' fates were drawn.
//! * **Seeded.** The fate of the n-th datagram a socket sends is a pure function of
//!   `(seed, n)` (SplitMix64 of a counter, as the compressors draw theirs), so a seed replays
//!   the same sequence of fates; which packet is the n-th still depends on timing. A transmit
//!   the socket refuses (quinn retries it) draws no number.
//!   [`Impairments::for_node`] derives one seed per socket.
//! * **Backpressure stays real.** When the real socket would block on the first datagram of
//!   a transmit, quinn gets `WouldBlock` and retries as usual; when it blocks later in a split
//!   batch, the rest is sent by a task that waits for the socket to be writable.
//!
//! [`LossCounters`] count what was done (datagrams, dropped, duplicated, delayed, batches
//! split), shared by every socket a wrapper makes.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use quinn::udp::{EcnCodepoint, RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

use crate::transport::SocketWrapper;

/// What a [`LossySocket`] does to the datagrams it sends: shares in `[0, 1]` summing to at
/// most 1, and a seed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Impairments {
    /// Share of datagrams dropped.
    pub drop: f64,
    /// Share of datagrams sent twice, the copy up to `max_delay` later.
    pub duplicate: f64,
    /// Share of datagrams sent up to `max_delay` late (later datagrams overtake them).
    pub reorder: f64,
    /// The longest delay of a late datagram or copy (each delay is drawn uniformly in
    /// `(0, max_delay]`).
    pub max_delay: Duration,
    /// Seed of the fates.
    pub seed: u64,
}

impl Impairments {
    /// No impairment at all (every datagram sent at once, once).
    pub fn none(seed: u64) -> Impairments {
        Impairments {
            drop: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            max_delay: Duration::from_millis(4),
            seed,
        }
    }

    /// The same impairments with a seed of their own for socket `node` (so two sockets
    /// under one test seed do not drop the same datagram numbers).
    pub fn for_node(&self, node: u64) -> Impairments {
        Impairments {
            seed: mix(self.seed ^ mix(node.wrapping_add(0x6c6f_7373))),
            ..*self
        }
    }

    /// Checks that the shares are in `[0, 1]` and sum to at most 1.
    pub fn validate(&self) -> Result<(), String> {
        let shares = [
            ("drop", self.drop),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
        ];
        for (name, share) in shares {
            if !(0.0..=1.0).contains(&share) {
                return Err(format!("{name} share {share} is not in [0, 1]"));
            }
        }
        let sum = self.drop + self.duplicate + self.reorder;
        if sum > 1.0 {
            return Err(format!("the shares sum to {sum}, more than 1"));
        }
        Ok(())
    }

    /// A [`SocketWrapper`] that puts each endpoint bound under it behind a [`LossySocket`]
    /// with these impairments, counting into `counters`. Every socket it wraps draws the
    /// same fates: give each node its own wrapper ([`Impairments::for_node`]).
    pub fn wrapper(self, counters: Arc<LossCounters>) -> SocketWrapper {
        Arc::new(move |inner| {
            let socket: Arc<dyn AsyncUdpSocket> =
                Arc::new(LossySocket::new(inner, self, counters.clone())?);
            Ok(socket)
        })
    }

    /// The fate of datagram number `n`.
    fn fate(&self, n: u64) -> Fate {
        let u = unit(mix(self.seed ^ mix(2 * n)));
        let delay = || {
            let v = 1.0 - unit(mix(self.seed ^ mix(2 * n + 1))); // in (0, 1]
            self.max_delay.mul_f64(v)
        };
        if u < self.drop {
            Fate::Drop
        } else if u < self.drop + self.duplicate {
            Fate::Duplicate(delay())
        } else if u < self.drop + self.duplicate + self.reorder {
            Fate::Delay(delay())
        } else {
            Fate::Send
        }
    }
}

/// What happens to one datagram.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Send,
    Drop,
    /// Sent now, and a copy after the delay.
    Duplicate(Duration),
    /// Sent after the delay only.
    Delay(Duration),
}

/// SplitMix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform draw in `[0, 1)` from 53 bits.
fn unit(bits: u64) -> f64 {
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// What the sockets of one wrapper did, counted as they did it.
#[derive(Debug, Default)]
pub struct LossCounters {
    datagrams: AtomicU64,
    dropped: AtomicU64,
    duplicated: AtomicU64,
    delayed: AtomicU64,
    batches_split: AtomicU64,
}

impl LossCounters {
    /// The counts so far.
    pub fn snapshot(&self) -> LossStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LossStats {
            datagrams: get(&self.datagrams),
            dropped: get(&self.dropped),
            duplicated: get(&self.duplicated),
            delayed: get(&self.delayed),
            batches_split: get(&self.batches_split),
        }
    }
}

/// A snapshot of [`LossCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossStats {
    /// Datagrams quinn handed over (each datagram of a batch counted).
    pub datagrams: u64,
    /// Of those, dropped.
    pub dropped: u64,
    /// Sent twice.
    pub duplicated: u64,
    /// Sent late.
    pub delayed: u64,
    /// Segmentation-offload batches split into datagrams.
    pub batches_split: u64,
}

impl fmt::Display for LossStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} datagrams: {} dropped, {} duplicated, {} delayed; {} batches split",
            self.datagrams, self.dropped, self.duplicated, self.delayed, self.batches_split
        )
    }
}

/// quinn's UDP socket behind [`Impairments`] (see the module docs).
pub struct LossySocket {
    inner: Arc<dyn AsyncUdpSocket>,
    impairments: Impairments,
    /// The number of the next datagram's fate, held through each send so that a transmit
    /// quinn must retry draws no numbers.
    next: Mutex<u64>,
    counters: Arc<LossCounters>,
    /// Where late datagrams are sent from.
    runtime: tokio::runtime::Handle,
}

impl fmt::Debug for LossySocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LossySocket")
            .field("inner", &self.inner)
            .field("impairments", &self.impairments)
            .finish_non_exhaustive()
    }
}

impl LossySocket {
    /// Wraps `inner`; must be called inside a tokio runtime (which sends the late datagrams).
    pub fn new(
        inner: Arc<dyn AsyncUdpSocket>,
        impairments: Impairments,
        counters: Arc<LossCounters>,
    ) -> io::Result<LossySocket> {
        impairments
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| io::Error::other(format!("LossySocket needs a tokio runtime: {e}")))?;
        Ok(LossySocket {
            inner,
            impairments,
            next: Mutex::new(0),
            counters,
            runtime,
        })
    }

    /// Sends `datagrams` in order after `delay`, waiting whenever the socket would block; one
    /// the socket refuses otherwise is lost, as the kernel would lose it.
    fn send_later(&self, datagrams: Vec<Datagram>, delay: Duration) {
        let inner = self.inner.clone();
        self.runtime.spawn(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let mut poller: Option<Pin<Box<dyn UdpPoller>>> = None;
            for d in datagrams {
                loop {
                    match inner.try_send(&d.transmit()) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            let p = poller.get_or_insert_with(|| inner.clone().create_io_poller());
                            if std::future::poll_fn(|cx| p.as_mut().poll_writable(cx))
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                        Ok(()) | Err(_) => break,
                    }
                }
            }
        });
    }
}

/// An owned datagram, for sending later.
#[derive(Debug, Clone)]
struct Datagram {
    destination: SocketAddr,
    ecn: Option<EcnCodepoint>,
    contents: Vec<u8>,
    src_ip: Option<IpAddr>,
}

impl Datagram {
    fn of(t: &Transmit<'_>) -> Datagram {
        Datagram {
            destination: t.destination,
            ecn: t.ecn,
            contents: t.contents.to_vec(),
            src_ip: t.src_ip,
        }
    }

    fn transmit(&self) -> Transmit<'_> {
        Transmit {
            destination: self.destination,
            ecn: self.ecn,
            contents: &self.contents,
            segment_size: None,
            src_ip: self.src_ip,
        }
    }
}

impl AsyncUdpSocket for LossySocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        let len = transmit.contents.len();
        let size = match transmit.segment_size {
            Some(s) if s > 0 && s < len => s,
            _ => len.max(1),
        };
        let count = |c: &AtomicU64| {
            c.fetch_add(1, Ordering::Relaxed);
        };
        // Whether a datagram of this transmit has met its fate: until then, an error from the
        // socket goes back to quinn, which handles it as it would without the wrapper.
        let mut started = false;
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let mut n = *next;
        // Once the socket blocks mid-batch: the datagrams to send as soon as it drains.
        let mut blocked: Option<Vec<Datagram>> = None;
        for contents in transmit.contents.chunks(size) {
            let one = Transmit {
                destination: transmit.destination,
                ecn: transmit.ecn,
                contents,
                segment_size: None,
                src_ip: transmit.src_ip,
            };
            let fate = self.impairments.fate(n);
            n += 1;
            match fate {
                Fate::Drop => count(&self.counters.dropped),
                Fate::Delay(d) => {
                    self.send_later(vec![Datagram::of(&one)], d);
                    count(&self.counters.delayed);
                }
                Fate::Send | Fate::Duplicate(_) => {
                    if let Some(pending) = &mut blocked {
                        pending.push(Datagram::of(&one));
                    } else {
                        match self.inner.try_send(&one) {
                            Ok(()) => {}
                            Err(e) if !started => return Err(e),
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                blocked = Some(vec![Datagram::of(&one)]);
                            }
                            // Lost, as the kernel's error would lose the whole batch.
                            Err(_) => {}
                        }
                    }
                    if let Fate::Duplicate(d) = fate {
                        self.send_later(vec![Datagram::of(&one)], d);
                        count(&self.counters.duplicated);
                    }
                }
            }
            started = true;
            count(&self.counters.datagrams);
        }
        *next = n;
        drop(next);
        if let Some(pending) = blocked {
            self.send_later(pending, Duration::ZERO);
        }
        if size < len {
            count(&self.counters.batches_split);
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::AtomicUsize;

    fn seed() -> u64 {
        let s = std::env::var("PUSHPULL_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        println!("seed {s} (set PUSHPULL_TEST_SEED to repeat)");
        s
    }

    fn impairments(seed: u64, drop: f64, duplicate: f64, reorder: f64) -> Impairments {
        Impairments {
            drop,
            duplicate,
            reorder,
            max_delay: Duration::from_millis(2),
            seed,
        }
    }

    /// `n` draws of each fate is within 6 standard deviations of `share * n`.
    fn assert_share(name: &str, got: u64, share: f64, n: u64) {
        let mean = share * n as f64;
        let sd = (n as f64 * share * (1.0 - share)).sqrt();
        assert!(
            (got as f64 - mean).abs() <= 6.0 * sd + 1.0,
            "{name}: {got} of {n}, expected about {mean:.0} (sd {sd:.1})"
        );
    }

    #[test]
    fn fates_come_in_the_configured_shares_and_replay_from_the_seed() {
        let seed = seed();
        let imp = impairments(seed, 0.05, 0.02, 0.1);
        let n = 200_000u64;
        let mut counts = [0u64; 4];
        for i in 0..n {
            let fate = imp.fate(i);
            counts[match fate {
                Fate::Send => 0,
                Fate::Drop => 1,
                Fate::Duplicate(d) | Fate::Delay(d) => {
                    assert!(d > Duration::ZERO && d <= imp.max_delay, "{d:?}");
                    if matches!(fate, Fate::Duplicate(_)) {
                        2
                    } else {
                        3
                    }
                }
            }] += 1;
            assert_eq!(fate, imp.fate(i), "a pure function of (seed, n)");
        }
        assert_share("dropped", counts[1], 0.05, n);
        assert_share("duplicated", counts[2], 0.02, n);
        assert_share("delayed", counts[3], 0.1, n);
        let other = imp.for_node(1);
        let same = (0..1000).filter(|&i| other.fate(i) == imp.fate(i)).count();
        assert!(
            same < 950,
            "another node's fates are its own ({same} of 1000 equal)"
        );
        assert_eq!(imp.for_node(1), imp.for_node(1));
        assert!(impairments(1, 0.5, 0.4, 0.2).validate().is_err());
        assert!(impairments(1, -0.1, 0.0, 0.0).validate().is_err());
        assert!(impairments(1, 0.5, 0.3, 0.2).validate().is_ok());
    }

    /// A socket that records what it is asked to send, and blocks on the calls listed.
    #[derive(Debug, Default)]
    struct Recorder {
        sent: Mutex<Vec<(Vec<u8>, Option<usize>)>>,
        block_calls: Vec<usize>,
        calls: AtomicUsize,
    }

    #[derive(Debug)]
    struct Writable;

    impl UdpPoller for Writable {
        fn poll_writable(self: Pin<&mut Self>, _: &mut Context) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncUdpSocket for Recorder {
        fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
            Box::pin(Writable)
        }
        fn try_send(&self, t: &Transmit) -> io::Result<()> {
            if self
                .block_calls
                .contains(&self.calls.fetch_add(1, Ordering::SeqCst))
            {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let mut sent = self.sent.lock().unwrap();
            sent.push((t.contents.to_vec(), t.segment_size));
            Ok(())
        }
        fn poll_recv(
            &self,
            _: &mut Context,
            _: &mut [IoSliceMut<'_>],
            _: &mut [RecvMeta],
        ) -> Poll<io::Result<usize>> {
            Poll::Pending
        }
        fn local_addr(&self) -> io::Result<SocketAddr> {
            Ok(SocketAddr::from(([127, 0, 0, 1], 9)))
        }
        fn max_transmit_segments(&self) -> usize {
            10
        }
    }

    fn batch<'a>(contents: &'a [u8], segment: usize) -> Transmit<'a> {
        Transmit {
            destination: SocketAddr::from(([127, 0, 0, 1], 7)),
            ecn: None,
            contents,
            segment_size: Some(segment),
            src_ip: None,
        }
    }

    fn wrap(rec: &Arc<Recorder>, imp: Impairments) -> (LossySocket, Arc<LossCounters>) {
        let counters = Arc::new(LossCounters::default());
        let inner: Arc<dyn AsyncUdpSocket> = rec.clone();
        (
            LossySocket::new(inner, imp, counters.clone()).unwrap(),
            counters,
        )
    }

    #[tokio::test]
    async fn batches_are_split_and_each_datagram_meets_its_own_fate() {
        // Unimpaired: a batch of 11 (the last one short) arrives as 11 datagrams in order.
        let rec = Arc::new(Recorder::default());
        let (socket, counters) = wrap(&rec, Impairments::none(0));
        assert_eq!(socket.max_transmit_segments(), 10, "quinn still batches");
        let contents: Vec<u8> = (0..1050u32).map(|i| i as u8).collect();
        socket.try_send(&batch(&contents, 100)).unwrap();
        let sent = rec.sent.lock().unwrap().clone();
        assert_eq!(sent.len(), 11);
        assert!(sent.iter().all(|(c, seg)| seg.is_none() && c.len() <= 100));
        assert_eq!(sent.concat_contents(), contents);
        let stats = counters.snapshot();
        assert_eq!((stats.datagrams, stats.batches_split), (11, 1), "{stats}");

        // Impaired: datagram n of the socket meets fate(n), batch or not.
        let seed = seed();
        let imp = impairments(seed, 0.2, 0.2, 0.2);
        let rec = Arc::new(Recorder::default());
        let (socket, counters) = wrap(&rec, imp);
        let batches = 300u32;
        for b in 0..batches {
            let contents: Vec<u8> = (0..10u32)
                .flat_map(|i| [(b * 10 + i).to_le_bytes(), [0; 4]].concat())
                .collect();
            socket.try_send(&batch(&contents, 8)).unwrap();
        }
        tokio::time::sleep(imp.max_delay * 10).await;
        let mut times: HashMap<u32, usize> = HashMap::new();
        for (c, seg) in rec.sent.lock().unwrap().iter() {
            assert_eq!((c.len(), *seg), (8, None));
            *times
                .entry(u32::from_le_bytes(c[..4].try_into().unwrap()))
                .or_default() += 1;
        }
        for n in 0..batches * 10 {
            let expected = match imp.fate(n as u64) {
                Fate::Drop => 0,
                Fate::Send | Fate::Delay(_) => 1,
                Fate::Duplicate(_) => 2,
            };
            let got = times.get(&n).copied().unwrap_or(0);
            assert_eq!(got, expected, "datagram {n} (seed {seed})");
        }
        let stats = counters.snapshot();
        println!("{stats}");
        assert_eq!(stats.datagrams, u64::from(batches) * 10);
        assert_eq!(stats.batches_split, u64::from(batches));
        let n = stats.datagrams;
        assert_share("dropped", stats.dropped, 0.2, n);
        assert_share("duplicated", stats.duplicated, 0.2, n);
        assert_share("delayed", stats.delayed, 0.2, n);
    }

    trait Concat {
        fn concat_contents(&self) -> Vec<u8>;
    }

    impl Concat for Vec<(Vec<u8>, Option<usize>)> {
        fn concat_contents(&self) -> Vec<u8> {
            self.iter().flat_map(|(c, _)| c.clone()).collect()
        }
    }

    #[tokio::test]
    async fn a_full_socket_blocks_quinn_first_and_the_rest_of_a_batch_later() {
        let rec = Arc::new(Recorder {
            block_calls: vec![0, 2, 3],
            ..Default::default()
        });
        let (socket, counters) = wrap(&rec, Impairments::none(0));
        let contents: Vec<u8> = (0..50u8).collect();
        // Blocked at once: quinn hears WouldBlock, nothing was sent, counted or drawn.
        let e = socket.try_send(&batch(&contents, 10)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(rec.sent.lock().unwrap().is_empty());
        assert_eq!(counters.snapshot().datagrams, 0);
        assert_eq!(*socket.next.lock().unwrap(), 0);
        // Blocked after the first datagram: the rest follow, in order, once writable.
        socket.try_send(&batch(&contents, 10)).unwrap();
        assert_eq!(rec.sent.lock().unwrap().len(), 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let sent = rec.sent.lock().unwrap().clone();
        assert_eq!(sent.len(), 5);
        assert_eq!(sent.concat_contents(), contents);
        assert_eq!(counters.snapshot().datagrams, 5);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn over_a_real_socket_the_configured_shares_arrive_dropped_duplicated_and_reordered() {
        let seed = seed();
        let imp = impairments(seed, 0.05, 0.05, 0.05);
        let receiver = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let to = receiver.local_addr().unwrap();
        let std_socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let inner = quinn::Runtime::wrap_udp_socket(&quinn::TokioRuntime, std_socket).unwrap();
        let counters = Arc::new(LossCounters::default());
        let socket = LossySocket::new(inner, imp, counters.clone()).unwrap();

        let n = 4000u32;
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = [0u8; 64];
            while let Ok(Ok(len)) =
                tokio::time::timeout(Duration::from_millis(500), receiver.recv(&mut buf)).await
            {
                assert_eq!(len, 4);
                got.push(u32::from_le_bytes(buf[..4].try_into().unwrap()));
            }
            got
        });
        let socket = Arc::new(socket);
        let mut poller = socket.clone().create_io_poller();
        for i in 0..n {
            let contents = i.to_le_bytes();
            let t = Transmit {
                destination: to,
                ecn: None,
                contents: &contents,
                segment_size: None,
                src_ip: None,
            };
            // As quinn sends: on WouldBlock, wait until writable and try again.
            loop {
                match socket.try_send(&t) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::future::poll_fn(|cx| poller.as_mut().poll_writable(cx))
                            .await
                            .unwrap();
                    }
                    other => break other.unwrap(),
                }
            }
            if i % 16 == 15 {
                // Paced, so the receiver's kernel buffer never overflows.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let got = reader.await.unwrap();
        let stats = counters.snapshot();
        println!("{stats}");
        let mut times = vec![0u32; n as usize];
        let (mut late, mut highest) = (0u32, None);
        for &i in &got {
            times[i as usize] += 1;
            if highest.is_some_and(|h| i < h) {
                late += 1;
            }
            highest = highest.max(Some(i));
        }
        for i in 0..n {
            let expected = match imp.fate(u64::from(i)) {
                Fate::Drop => 0,
                Fate::Send | Fate::Delay(_) => 1,
                Fate::Duplicate(_) => 2,
            };
            assert_eq!(times[i as usize], expected, "datagram {i} (seed {seed})");
        }
        assert_eq!(stats.datagrams, u64::from(n));
        assert_share("dropped", stats.dropped, 0.05, u64::from(n));
        assert_share("duplicated", stats.duplicated, 0.05, u64::from(n));
        assert_share("delayed", stats.delayed, 0.05, u64::from(n));
        // Late datagrams and copies arrive after later ones (up to 2 ms late, 16 sent a ms).
        let delayed = stats.delayed + stats.duplicated;
        println!("{late} arrivals after a later datagram, of {delayed} sent late");
        assert!(u64::from(late) >= delayed / 2, "{late} of {delayed} late");
    }
}
