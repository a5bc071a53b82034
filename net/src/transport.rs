//! QUIC endpoints and framed I/O over quinn: the thin layer between sockets and the protocol.
//!
//! * [`Endpoint`]s are built with these settings: GSO on, 16 MiB stream receive window,
//!   connection windows of at least 64 MiB (see [`transport_config`]), 4 MiB UDP socket
//!   buffers, datagrams up to `cluster.max_udp_payload`, and an idle timeout equal to
//!   the heartbeat timeout with keep-alives at the heartbeat interval (so quinn declares a dead
//!   peer at the same moment the heartbeat logic would). Every endpoint is both a TLS server
//!   (when it has an identity to serve) and a client with the cluster's client config.
//!   Congestion control is Cubic under a ceiling the node's sender sets ([`crate::cap`]).
//! * [`ControlStream`] sends and receives length-prefixed bincode control messages.
//! * [`send_frame`] / [`read_frame`] move one data frame per unidirectional stream.
//! * [`with_socket_wrapper`] runs a future under which every endpoint bound puts its UDP
//!   socket behind a [`SocketWrapper`] (tests: [`crate::lossy`]); without it, nothing wraps.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use serde::{de::DeserializeOwned, Serialize};

use crate::cap::WindowCap;
use crate::tls::TlsIdentity;
use pushpull_proto::config::{Config, SchedulerAddr};
use pushpull_proto::protocol::{
    check_control_len, decode_control, encode_control, FrameHeader, ProtocolError, FRAME_HEADER_LEN,
};

/// Bytes of UDP socket send and receive buffer requested (the kernel may cap it at
/// `net.core.rmem_max`).
pub const UDP_BUFFER_BYTES: usize = 4 << 20;

/// Concurrent unidirectional streams a peer may open. Streams are finished as soon as their
/// frame is written and read to the end on arrival, so this bounds only frames in transit.
pub const MAX_CONCURRENT_UNI_STREAMS: u32 = 1024;

/// A transport error; names the peer where there is one.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// Binding the UDP socket failed (e.g. the port is in use).
    #[error("cannot bind UDP {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// TLS setup failed.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// Could not connect.
    #[error("cannot connect to {addr}: {message}")]
    Connect {
        /// The peer.
        addr: SocketAddr,
        /// Why.
        message: String,
    },
    /// The connection failed or closed.
    #[error("connection to {peer} lost: {source}")]
    Connection {
        /// The peer.
        peer: String,
        /// quinn's reason.
        source: quinn::ConnectionError,
    },
    /// A stream failed mid-frame.
    #[error("stream from/to {peer} failed: {message}")]
    Stream {
        /// The peer.
        peer: String,
        /// Why.
        message: String,
    },
    /// A frame or message was malformed.
    #[error("bad frame from {peer}: {source}")]
    Protocol {
        /// The peer.
        peer: String,
        /// What was wrong.
        source: ProtocolError,
    },
}

/// quinn transport settings derived from the cluster config.
///
/// * `send_fairness(false)`: streams of one priority are sent one after another, not
///   round-robin, so the first frame ready is the first one finished (with fair sharing every
///   chunk in flight finishes late, and results cannot flow back while pushes still go out).
///   Priorities between frames come from [`crate::sender::FrameSender`].
/// * The connection's send and receive windows are at least twice `cluster.send_window_bytes`,
///   so the frames the [`pushpull_proto::sendq`] window lets out never block in quinn.
/// * Path MTU discovery up to `cluster.max_udp_payload` (jumbo frames where the path has them);
///   [`Endpoint::bind`] also advertises that size to peers, or they would cap the discovery.
///
/// [`Endpoint::bind`] adds the congestion controller: Cubic under the endpoint's
/// [`WindowCap`] ([`crate::cap`]).
pub fn transport_config(cfg: &Config) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    let idle = quinn::IdleTimeout::try_from(cfg.heartbeat_timeout())
        .unwrap_or_else(|_| quinn::IdleTimeout::from(quinn::VarInt::from_u32(60_000)));
    let window = cfg
        .cluster
        .send_window_bytes
        .saturating_mul(2)
        .max(64 << 20);
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(cfg.cluster.max_udp_payload);
    t.max_idle_timeout(Some(idle))
        .keep_alive_interval(Some(cfg.heartbeat_interval()))
        .stream_receive_window(quinn::VarInt::from_u32(16 << 20))
        .receive_window(quinn::VarInt::from_u64(window).unwrap_or(quinn::VarInt::MAX))
        .send_window(window)
        .send_fairness(false)
        .mtu_discovery_config(Some(mtu))
        .max_concurrent_uni_streams(quinn::VarInt::from_u32(MAX_CONCURRENT_UNI_STREAMS))
        .max_concurrent_bidi_streams(quinn::VarInt::from_u32(16))
        .enable_segmentation_offload(true);
    t
}

/// Puts an endpoint's UDP socket (as quinn's tokio runtime wraps it) behind another
/// [`quinn::AsyncUdpSocket`], e.g. [`crate::lossy::LossySocket`].
pub type SocketWrapper = Arc<
    dyn Fn(Arc<dyn quinn::AsyncUdpSocket>) -> std::io::Result<Arc<dyn quinn::AsyncUdpSocket>>
        + Send
        + Sync,
>;

tokio::task_local! {
    static WRAP_SOCKET: SocketWrapper;
}

/// Runs `fut` so that every [`Endpoint::bind`] it calls (in its own task, not in tasks it
/// spawns) passes the endpoint's UDP socket through `wrap`.
///
/// This is how tests put a node that binds its own endpoint (`Scheduler::bind`,
/// `Server::bind`, `Worker::join`) behind a lossy socket without a parameter on those
/// functions: the endpoint keeps the wrapped socket for its whole life, and an endpoint bound
/// outside such a future (every endpoint of the binaries) uses the real socket directly.
pub async fn with_socket_wrapper<F: Future>(wrap: SocketWrapper, fut: F) -> F::Output {
    WRAP_SOCKET.scope(wrap, fut).await
}

/// A quinn endpoint plus the name clients verify.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The quinn endpoint.
    pub quinn: quinn::Endpoint,
    server_name: String,
    window_cap: WindowCap,
}

impl Endpoint {
    /// Binds `addr` (port 0 picks a free port) as TLS server and client with `identity`.
    pub fn bind(
        addr: SocketAddr,
        identity: &TlsIdentity,
        cfg: &Config,
    ) -> Result<Endpoint, TransportError> {
        let window_cap = WindowCap::new();
        let mut transport = transport_config(cfg);
        transport.congestion_controller_factory(window_cap.factory());
        let transport = Arc::new(transport);
        let server_crypto = QuicServerConfig::try_from(identity.server_config()?)
            .map_err(|e| crate::tls::TlsError::Setup(e.to_string()))?;
        let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_crypto));
        server.transport_config(transport.clone());
        let client_crypto = QuicClientConfig::try_from(identity.client_config()?)
            .map_err(|e| crate::tls::TlsError::Setup(e.to_string()))?;
        let mut client = quinn::ClientConfig::new(Arc::new(client_crypto));
        client.transport_config(transport);

        let socket = bind_udp(addr).map_err(|source| TransportError::Bind { addr, source })?;
        let mut endpoint_config = quinn::EndpointConfig::default();
        // What this endpoint advertises it can receive; path MTU discovery never goes above
        // the peer's advertisement (quinn's default is Ethernet's 1472).
        endpoint_config
            .max_udp_payload_size(cfg.cluster.max_udp_payload)
            .map_err(|e| crate::tls::TlsError::Setup(format!("cluster.max_udp_payload: {e}")))?;
        // What `quinn::Endpoint::new` does, with the wrapper of `with_socket_wrapper` between.
        let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
        let mut socket = runtime
            .wrap_udp_socket(socket)
            .map_err(|source| TransportError::Bind { addr, source })?;
        if let Ok(wrap) = WRAP_SOCKET.try_with(Arc::clone) {
            socket = wrap(socket).map_err(|source| TransportError::Bind { addr, source })?;
        }
        let mut ep = quinn::Endpoint::new_with_abstract_socket(
            endpoint_config,
            Some(server),
            socket,
            runtime,
        )
        .map_err(|source| TransportError::Bind { addr, source })?;
        ep.set_default_client_config(client);
        Ok(Endpoint {
            quinn: ep,
            server_name: identity.server_name.clone(),
            window_cap,
        })
    }

    /// The ceiling on the congestion windows of this endpoint's connections (none until set):
    /// hand it to the node's [`crate::sender::FrameSender`].
    pub fn window_cap(&self) -> &WindowCap {
        &self.window_cap
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.quinn
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// Connects to `addr`, verifying the cluster name.
    pub async fn connect(&self, addr: SocketAddr) -> Result<quinn::Connection, TransportError> {
        let connecting =
            self.quinn
                .connect(addr, &self.server_name)
                .map_err(|e| TransportError::Connect {
                    addr,
                    message: e.to_string(),
                })?;
        connecting.await.map_err(|e| TransportError::Connect {
            addr,
            message: e.to_string(),
        })
    }

    /// Connects, retrying every 200 ms until `timeout` has passed (a scheduler that starts
    /// later than its nodes). The final error says how long it tried.
    pub async fn connect_with_retry(
        &self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<quinn::Connection, TransportError> {
        let start = Instant::now();
        loop {
            match tokio::time::timeout(
                Duration::from_secs(3).min(timeout.max(Duration::from_millis(100))),
                self.connect(addr),
            )
            .await
            {
                Ok(Ok(conn)) => return Ok(conn),
                Ok(Err(e)) if start.elapsed() >= timeout => {
                    return Err(TransportError::Connect {
                        addr,
                        message: format!(
                            "gave up after {:.1} s: {e}",
                            start.elapsed().as_secs_f64()
                        ),
                    })
                }
                Err(_) if start.elapsed() >= timeout => {
                    return Err(TransportError::Connect {
                        addr,
                        message: format!(
                            "no answer after {:.1} s (is the scheduler running at this address?)",
                            start.elapsed().as_secs_f64()
                        ),
                    })
                }
                Ok(Err(e)) => {
                    // A TLS refusal won't get better by retrying.
                    if e.to_string().contains("certificate") || e.to_string().contains("TLS") {
                        return Err(e);
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                Err(_) => {}
            }
        }
    }
}

/// The scheduler's socket address: `addr` itself, or its name resolved (an IPv4 address when
/// the name has one, since nodes bind IPv4 by default), retrying every 200 ms until `timeout`
/// has passed (on Kubernetes a pod's name resolves only once the pod exists). The error names
/// the name, why it failed and for how long it was tried.
pub async fn resolve_scheduler(
    addr: &SchedulerAddr,
    timeout: Duration,
) -> Result<SocketAddr, String> {
    let (host, port) = match addr {
        SchedulerAddr::Ip(a) => return Ok(*a),
        SchedulerAddr::Name { host, port } => (host.as_str(), *port),
    };
    let start = Instant::now();
    loop {
        let why = match tokio::net::lookup_host((host, port)).await {
            Ok(found) => {
                let found: Vec<SocketAddr> = found.collect();
                if let Some(a) = found.iter().find(|a| a.is_ipv4()).or(found.first()) {
                    return Ok(*a);
                }
                "the name has no address".to_string()
            }
            Err(e) => e.to_string(),
        };
        if start.elapsed() >= timeout {
            return Err(format!(
                "cannot resolve the scheduler's name {host:?} (cluster.scheduler): {why} (tried \
                 for {:.1} s, cluster.connect_timeout_ms)",
                start.elapsed().as_secs_f64()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn bind_udp(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        let _ = socket.set_only_v6(false);
    }
    // Best effort: the kernel caps these at net.core.{r,w}mem_max.
    let _ = socket.set_recv_buffer_size(UDP_BUFFER_BYTES);
    let _ = socket.set_send_buffer_size(UDP_BUFFER_BYTES);
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// A bidirectional stream carrying control frames (u32 LE length + bincode body).
#[derive(Debug)]
pub struct ControlStream {
    /// Sending half.
    pub send: quinn::SendStream,
    /// Receiving half.
    pub recv: quinn::RecvStream,
    peer: String,
}

impl ControlStream {
    /// Wraps an open stream; `peer` names the other side in errors.
    pub fn new(send: quinn::SendStream, recv: quinn::RecvStream, peer: impl Into<String>) -> Self {
        ControlStream {
            send,
            recv,
            peer: peer.into(),
        }
    }

    /// The peer's name as used in errors.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Splits into a sender and a receiver that can live in different tasks.
    pub fn split(self) -> (ControlSender, ControlReceiver) {
        (
            ControlSender {
                send: self.send,
                peer: self.peer.clone(),
            },
            ControlReceiver {
                recv: self.recv,
                peer: self.peer,
            },
        )
    }
}

/// The sending half of a [`ControlStream`].
#[derive(Debug)]
pub struct ControlSender {
    send: quinn::SendStream,
    peer: String,
}

impl ControlSender {
    /// Sends one control message.
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), TransportError> {
        let frame = encode_control(msg).map_err(|source| TransportError::Protocol {
            peer: self.peer.clone(),
            source,
        })?;
        self.send
            .write_all(&frame)
            .await
            .map_err(|e| TransportError::Stream {
                peer: self.peer.clone(),
                message: e.to_string(),
            })
    }

    /// Finishes the stream (no more messages).
    pub fn finish(&mut self) {
        let _ = self.send.finish();
    }
}

/// The receiving half of a [`ControlStream`].
#[derive(Debug)]
pub struct ControlReceiver {
    recv: quinn::RecvStream,
    peer: String,
}

impl ControlReceiver {
    /// Receives one control message; `Ok(None)` when the peer finished the stream cleanly
    /// between messages.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<Option<T>, TransportError> {
        let mut len = [0u8; 4];
        match self.recv.read_exact(&mut len).await {
            Ok(()) => {}
            Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
            Err(quinn::ReadExactError::FinishedEarly(n)) => {
                return Err(TransportError::Protocol {
                    peer: self.peer.clone(),
                    source: ProtocolError::Malformed(format!(
                        "truncated length prefix ({n} of 4 bytes)"
                    )),
                })
            }
            Err(quinn::ReadExactError::ReadError(e)) => return Err(self.read_err(e)),
        }
        let len = check_control_len(u32::from_le_bytes(len)).map_err(|source| {
            TransportError::Protocol {
                peer: self.peer.clone(),
                source,
            }
        })?;
        let mut body = vec![0u8; len];
        match self.recv.read_exact(&mut body).await {
            Ok(()) => {}
            Err(quinn::ReadExactError::FinishedEarly(n)) => {
                return Err(TransportError::Protocol {
                    peer: self.peer.clone(),
                    source: ProtocolError::Malformed(format!(
                        "truncated control message ({n} of {len} bytes)"
                    )),
                })
            }
            Err(quinn::ReadExactError::ReadError(e)) => return Err(self.read_err(e)),
        }
        decode_control(&body)
            .map(Some)
            .map_err(|source| TransportError::Protocol {
                peer: self.peer.clone(),
                source,
            })
    }

    fn read_err(&self, e: quinn::ReadError) -> TransportError {
        match e {
            quinn::ReadError::ConnectionLost(source) => TransportError::Connection {
                peer: self.peer.clone(),
                source,
            },
            other => TransportError::Stream {
                peer: self.peer.clone(),
                message: other.to_string(),
            },
        }
    }
}

/// Sends one data frame on a new unidirectional stream and finishes it. The payload is not
/// copied.
pub async fn send_frame(
    conn: &quinn::Connection,
    header: &FrameHeader,
    payload: Bytes,
    peer: &str,
) -> Result<(), TransportError> {
    write_frame(conn, header, payload, peer, None)
        .await
        .map(drop)
}

/// Opens a unidirectional stream (at `priority`, if given), writes one frame on it and finishes
/// it; returns the stream (its `stopped()` tells when the peer has all of it).
pub(crate) async fn write_frame(
    conn: &quinn::Connection,
    header: &FrameHeader,
    payload: Bytes,
    peer: &str,
    priority: Option<i32>,
) -> Result<quinn::SendStream, TransportError> {
    debug_assert_eq!(header.payload_len, payload.len() as u64);
    let stream_err = |message: String| TransportError::Stream {
        peer: peer.to_string(),
        message,
    };
    let mut s = conn
        .open_uni()
        .await
        .map_err(|source| TransportError::Connection {
            peer: peer.to_string(),
            source,
        })?;
    if let Some(p) = priority {
        s.set_priority(p).map_err(|e| stream_err(e.to_string()))?;
    }
    let mut chunks = [header.to_bytes(), payload];
    s.write_all_chunks(&mut chunks)
        .await
        .map_err(|e| stream_err(e.to_string()))?;
    s.finish().map_err(|e| stream_err(e.to_string()))?;
    Ok(s)
}

/// Reads one data frame (header + payload) from a unidirectional stream to its end. The
/// payload must be exactly `payload_len` bytes and at most `max_payload`.
pub async fn read_frame(
    recv: &mut quinn::RecvStream,
    max_payload: u64,
    peer: &str,
) -> Result<(FrameHeader, Bytes), TransportError> {
    let proto = |source| TransportError::Protocol {
        peer: peer.to_string(),
        source,
    };
    let limit = FRAME_HEADER_LEN.saturating_add(usize::try_from(max_payload).unwrap_or(usize::MAX));
    let data = recv.read_to_end(limit).await.map_err(|e| match e {
        quinn::ReadToEndError::TooLong => proto(ProtocolError::Oversized {
            len: u64::MAX,
            max: max_payload,
        }),
        quinn::ReadToEndError::Read(quinn::ReadError::ConnectionLost(source)) => {
            TransportError::Connection {
                peer: peer.to_string(),
                source,
            }
        }
        quinn::ReadToEndError::Read(other) => TransportError::Stream {
            peer: peer.to_string(),
            message: other.to_string(),
        },
    })?;
    let header = FrameHeader::decode(&data, max_payload).map_err(proto)?;
    let got = (data.len() - FRAME_HEADER_LEN) as u64;
    if got < header.payload_len {
        return Err(proto(ProtocolError::TruncatedPayload {
            got,
            expected: header.payload_len,
        }));
    }
    if got > header.payload_len {
        return Err(proto(ProtocolError::Malformed(format!(
            "{} bytes after the declared payload of {} bytes",
            got - header.payload_len,
            header.payload_len
        ))));
    }
    let payload = Bytes::from(data).slice(FRAME_HEADER_LEN..);
    Ok((header, payload))
}
