//! Mutual TLS: strangers are refused at the handshake, in both directions.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use pushpull_net::tls::{TlsIdentity, ALPN};
use pushpull_net::transport::Endpoint;
use quinn::crypto::rustls::QuicClientConfig;

/// An identity whose certificate comes from another CA but which trusts the cluster's CA (so
/// the handshake gets as far as the cluster verifying *our* certificate).
fn rogue_client(cluster: &Certs, rogue: &Certs) -> TlsIdentity {
    let mut id = rogue.identity("rogue");
    id.ca = cluster.identity("worker0").ca;
    id
}

/// Connects and waits for the peer's verdict. Returns the error text of the refusal; panics if
/// the connection is still open after the peer had ample time to check the certificate.
async fn refused(conn: Result<quinn::Connecting, quinn::ConnectError>) -> String {
    let conn = match conn.unwrap().await {
        Err(e) => return e.to_string(),
        Ok(c) => c,
    };
    // TLS 1.3: the client finishes first; the server verifies the client's certificate and
    // closes the connection with a TLS alert.
    match tokio::time::timeout(Duration::from_secs(10), conn.closed()).await {
        Ok(reason) => {
            let text = reason.to_string();
            assert!(
                !matches!(reason, quinn::ConnectionError::ApplicationClosed(_)),
                "closed by the application, not refused at the handshake: {text}"
            );
            text
        }
        Err(_) => panic!("the connection is still open: the stranger was accepted"),
    }
}

fn assert_tls_refusal(text: &str) {
    let t = text.to_lowercase();
    assert!(
        t.contains("certificate")
            || t.contains("handshake")
            || t.contains("crypto")
            || t.contains("alert"),
        "not a TLS refusal: {text}"
    );
}

fn no_cert_endpoint(cluster: &Certs) -> quinn::Endpoint {
    let ca = cluster.identity("worker0").ca;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    let mut ep = quinn::Endpoint::client(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    ep.set_default_client_config(quinn::ClientConfig::new(Arc::new(
        QuicClientConfig::try_from(cfg).unwrap(),
    )));
    ep
}

#[test]
fn strangers_are_refused_by_the_scheduler_and_by_a_server() {
    let _g = cluster_lock();
    let mut cluster = ProcCluster::start(test_config(1, 1));
    let rogue = Certs::new(&["rogue"]);
    let targets = [
        ("scheduler", cluster.scheduler_addr),
        ("server 0", cluster.servers[0].1),
    ];
    run_async(async {
        let config = test_config(1, 1);
        let other_ca = Endpoint::bind(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            &rogue_client(&cluster.certs, &rogue),
            &config,
        )
        .unwrap();
        let no_cert = no_cert_endpoint(&cluster.certs);
        for (who, addr) in targets {
            let text = refused(other_ca.quinn.connect(addr, "pushpull.cluster")).await;
            eprintln!("{who}, certificate from another CA: {text}");
            assert_tls_refusal(&text);
            let text = refused(no_cert.connect(addr, "pushpull.cluster")).await;
            eprintln!("{who}, no certificate: {text}");
            assert_tls_refusal(&text);
        }
    });
    // Both are still serving.
    assert!(
        cluster.scheduler.child.try_wait().unwrap().is_none(),
        "{}",
        cluster.scheduler.stderr()
    );
    assert!(
        cluster.servers[0].0.child.try_wait().unwrap().is_none(),
        "{}",
        cluster.servers[0].0.stderr()
    );
}

#[test]
fn a_worker_refuses_a_peer_with_a_certificate_from_another_ca() {
    let _g = cluster_lock();
    let cluster_certs = Certs::cluster(1, 1);
    let rogue = Certs::new(&["scheduler", "server0"]);
    run_async(async {
        // A rogue "server" endpoint: certificate from another CA.
        let config = test_config(1, 1);
        let rogue_server = Endpoint::bind(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            &rogue.identity("server0"),
            &config,
        )
        .unwrap();
        let accept = tokio::spawn({
            let ep = rogue_server.quinn.clone();
            async move {
                if let Some(inc) = ep.accept().await {
                    let _ = inc.await;
                }
            }
        });
        let worker_ep = Endpoint::bind(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            &cluster_certs.identity("worker0"),
            &config,
        )
        .unwrap();
        let e = worker_ep
            .connect(rogue_server.local_addr())
            .await
            .expect_err("the worker accepted a server certificate from another CA");
        eprintln!("worker -> rogue server: {e}");
        assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
        accept.abort();
    });

    // End to end: the real worker binary against a scheduler whose certificate comes from
    // another CA fails at once, naming the scheduler and the certificate problem.
    let mut config = test_config(1, 1);
    config.cluster.connect_timeout_ms = 60_000;
    let path = write_config(&config, cluster_certs.path());
    let (mut sched, addr) = start_scheduler(&path, &rogue);
    let mut worker = start_worker_process(&path, &cluster_certs, 0, addr);
    let st = worker.wait_exit(Duration::from_secs(30));
    let err = worker.stderr();
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(
        err.contains(&addr.to_string()),
        "names the scheduler: {err}"
    );
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    sched.kill();
}
