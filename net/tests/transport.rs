//! The transport over real quinn sockets on loopback: control streams, data frames, malformed
//! frames, and mutual TLS refusals in both directions.

use std::time::Duration;

use bytes::Bytes;
use pushpull_net::cap::MIN_CEILING;
use pushpull_net::certs::generate_cluster;
use pushpull_net::tls::TlsIdentity;
use pushpull_net::transport::{read_frame, send_frame, ControlStream, Endpoint, TransportError};
use pushpull_proto::config::Config;
use pushpull_proto::protocol::{
    FrameFlags, FrameHeader, FrameKind, FromScheduler, ProtocolError, ReduceOp, ToScheduler,
};

fn identities(dir: &std::path::Path, n: usize) -> Vec<TlsIdentity> {
    let names: Vec<String> = (0..n).map(|i| format!("node{i}")).collect();
    generate_cluster(dir, "pushpull.cluster", &names)
        .unwrap()
        .iter()
        .map(|c| TlsIdentity::load(c).unwrap())
        .collect()
}

fn config() -> Config {
    let mut c = Config::local(1, 1);
    c.cluster.heartbeat_interval_ms = 200;
    c.cluster.heartbeat_timeout_ms = 2000;
    c
}

fn local() -> std::net::SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

#[tokio::test]
async fn control_stream_and_data_frames_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let ids = identities(dir.path(), 2);
    let cfg = config();
    let server = Endpoint::bind(local(), &ids[0], &cfg).unwrap();
    let client = Endpoint::bind(local(), &ids[1], &cfg).unwrap();
    let addr = server.local_addr();

    let accept = tokio::spawn(async move {
        let conn = server.quinn.accept().await.unwrap().await.unwrap();
        let (send, recv) = conn.accept_bi().await.unwrap();
        let (mut tx, mut rx) = ControlStream::new(send, recv, "client").split();
        let msg: ToScheduler = rx.recv().await.unwrap().unwrap();
        assert_eq!(msg, ToScheduler::Heartbeat);
        tx.send(&FromScheduler::BarrierDone { id: 7 })
            .await
            .unwrap();
        // One good data frame, then a frame whose header lies about its length.
        let mut s = conn.accept_uni().await.unwrap();
        let (h, p) = read_frame(&mut s, 1 << 20, "client").await.unwrap();
        assert_eq!(h.key, 42);
        assert_eq!(&p[..], b"payload!");
        let mut s = conn.accept_uni().await.unwrap();
        let e = read_frame(&mut s, 1 << 20, "client").await.unwrap_err();
        assert!(
            matches!(
                e,
                TransportError::Protocol {
                    source: ProtocolError::TruncatedPayload {
                        got: 3,
                        expected: 100
                    },
                    ..
                }
            ),
            "{e}"
        );
        let mut s = conn.accept_uni().await.unwrap();
        let e = read_frame(&mut s, 16, "client").await.unwrap_err();
        assert!(e.to_string().contains("exceeds the limit"), "{e}");
        let mut s = conn.accept_uni().await.unwrap();
        let e = read_frame(&mut s, 1 << 20, "client").await.unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
        conn
    });

    let conn = client.connect(addr).await.unwrap();
    let (send, recv) = conn.open_bi().await.unwrap();
    let (mut tx, mut rx) = ControlStream::new(send, recv, "server").split();
    tx.send(&ToScheduler::Heartbeat).await.unwrap();
    let back: FromScheduler = rx.recv().await.unwrap().unwrap();
    assert_eq!(back, FromScheduler::BarrierDone { id: 7 });

    let header = |len: u64| FrameHeader {
        kind: FrameKind::Push,
        op: ReduceOp::Sum,
        flags: FrameFlags::default(),
        rank: 0,
        aux: 0,
        key: 42,
        round: 0,
        payload_len: len,
    };
    send_frame(&conn, &header(8), Bytes::from_static(b"payload!"), "server")
        .await
        .unwrap();
    // Truncated: header says 100 bytes, 3 follow.
    let mut s = conn.open_uni().await.unwrap();
    s.write_all(&header(100).to_bytes()).await.unwrap();
    s.write_all(b"abc").await.unwrap();
    s.finish().unwrap();
    // Oversized for a 16-byte limit.
    send_frame(&conn, &header(64), Bytes::from(vec![1u8; 64]), "server")
        .await
        .unwrap();
    // Garbage.
    let mut s = conn.open_uni().await.unwrap();
    s.write_all(&[0xffu8; 60]).await.unwrap();
    s.finish().unwrap();

    let _server_conn = tokio::time::timeout(Duration::from_secs(20), accept)
        .await
        .unwrap()
        .unwrap();
}

/// Connects `client` to `server` and reports whether a stream round trip works.
async fn handshake_ok(server: Endpoint, client: Endpoint) -> bool {
    let addr = server.local_addr();
    let srv = tokio::spawn(async move {
        let incoming = server.quinn.accept().await?;
        let conn = incoming.await.ok()?;
        let mut s = conn.accept_uni().await.ok()?;
        s.read_to_end(16).await.ok()
    });
    let client_ok = async {
        let conn = client.connect(addr).await.ok()?;
        let mut s = conn.open_uni().await.ok()?;
        s.write_all(b"hi").await.ok()?;
        s.finish().ok()?;
        Some(conn)
    };
    let conn = tokio::time::timeout(Duration::from_secs(10), client_ok)
        .await
        .ok()
        .flatten();
    let got = tokio::time::timeout(Duration::from_secs(10), srv).await;
    drop(conn);
    matches!(got, Ok(Ok(Some(ref v))) if v == b"hi")
}

#[tokio::test]
async fn mutual_tls_accepts_the_cluster_and_refuses_strangers() {
    let dir = tempfile::tempdir().unwrap();
    let rogue_dir = tempfile::tempdir().unwrap();
    let ids = identities(dir.path(), 2);
    let rogue = identities(rogue_dir.path(), 1);
    let cfg = config();
    let ep = |id: &TlsIdentity| Endpoint::bind(local(), id, &cfg).unwrap();

    assert!(
        handshake_ok(ep(&ids[0]), ep(&ids[1])).await,
        "cluster peers must connect"
    );
    assert!(
        !handshake_ok(ep(&ids[0]), ep(&rogue[0])).await,
        "a client with a certificate from another CA must be refused"
    );
    assert!(
        !handshake_ok(ep(&rogue[0]), ep(&ids[1])).await,
        "a server with a certificate from another CA must be refused by the client"
    );

    // A client that presents no certificate at all.
    let server = ep(&ids[0]);
    let addr = server.local_addr();
    let srv = tokio::spawn(async move {
        let incoming = server.quinn.accept().await?;
        incoming.await.ok().map(|_| ())
    });
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ids[1].ca.clone()).unwrap();
    let mut no_cert = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    no_cert.alpn_protocols = vec![pushpull_net::tls::ALPN.to_vec()];
    let mut anon = quinn::Endpoint::client(local()).unwrap();
    anon.set_default_client_config(quinn::ClientConfig::new(std::sync::Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(no_cert).unwrap(),
    )));
    let attempt = async {
        let conn = anon.connect(addr, "pushpull.cluster").ok()?.await.ok()?;
        // TLS 1.3: the client may think it is connected until the server's alert arrives.
        let mut s = conn.open_uni().await.ok()?;
        s.write_all(b"hi").await.ok()?;
        s.finish().ok()?;
        conn.closed().await;
        Some(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), attempt).await;
    let served = tokio::time::timeout(Duration::from_secs(10), srv).await;
    assert!(
        matches!(served, Ok(Ok(None))),
        "a client without a certificate must be refused: {served:?}"
    );
}

/// Sends one 4 MB frame from a client whose endpoint's window ceiling is `cap` (if any);
/// returns the largest congestion window its connection reported while sending, sampled every
/// millisecond, and checks the frame arrived whole.
async fn largest_cwnd_under(cap: Option<u64>) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let ids = identities(dir.path(), 2);
    let cfg = config();
    let server = Endpoint::bind(local(), &ids[0], &cfg).unwrap();
    let client = Endpoint::bind(local(), &ids[1], &cfg).unwrap();
    if let Some(c) = cap {
        client.window_cap().set(c);
    }
    let addr = server.local_addr();
    let len = 4u64 << 20;
    let accept = tokio::spawn(async move {
        let conn = server.quinn.accept().await.unwrap().await.unwrap();
        let mut s = conn.accept_uni().await.unwrap();
        let (_, p) = read_frame(&mut s, 8 << 20, "client").await.unwrap();
        assert_eq!(p.len() as u64, len);
        assert!(p.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        conn
    });
    let conn = client.connect(addr).await.unwrap();
    let header = FrameHeader {
        kind: FrameKind::Push,
        op: ReduceOp::Sum,
        flags: FrameFlags::default(),
        rank: 0,
        aux: 0,
        key: 1,
        round: 0,
        payload_len: len,
    };
    let payload: Bytes = (0..len)
        .map(|i| (i % 251) as u8)
        .collect::<Vec<u8>>()
        .into();
    let sampler = {
        let conn = conn.clone();
        tokio::spawn(async move {
            let mut largest = 0;
            loop {
                largest = largest.max(conn.stats().path.cwnd);
                if conn.close_reason().is_some() {
                    return largest;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    send_frame(&conn, &header, payload, "server").await.unwrap();
    let server_conn = accept.await.unwrap();
    conn.close(0u32.into(), b"done");
    let largest = sampler.await.unwrap();
    drop(server_conn);
    largest
}

#[tokio::test]
async fn an_endpoints_window_ceiling_bounds_its_congestion_windows() {
    // Cubic's window grows past the lowest ceiling while 4 MB cross loopback; under that
    // ceiling it never reports more, and the frame still arrives whole. A ceiling below it
    // (a send window of a few bytes) is raised to it, not obeyed: the frame still arrives.
    let free = largest_cwnd_under(None).await;
    assert!(free > MIN_CEILING, "uncapped cwnd {free}");
    let capped = largest_cwnd_under(Some(MIN_CEILING)).await;
    assert!(capped <= MIN_CEILING, "capped cwnd {capped}");
    let tiny = largest_cwnd_under(Some(100)).await;
    assert!(tiny <= MIN_CEILING, "capped cwnd {tiny}");
}
