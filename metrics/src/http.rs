//! [`serve`]: the HTTP listener of a node's metrics. `GET /metrics` (or `/`) answers the
//! [`Source`]'s families as Prometheus text; any other path is a 404 and any other method a
//! 405. hyper parses HTTP/1.1; a client that does not send its request head within
//! [`HEADER_TIMEOUT`] is disconnected.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::task::JoinHandle;

use crate::families::Families;

/// How long a client may take to send its request head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What a scrape renders: a node's families, built at the time of the request.
pub trait Source: Send + Sync + 'static {
    /// Adds this node's families to `out`.
    fn collect(&self, out: &mut Families);

    /// The labels every sample of this node carries (`role`, `rank` or `id`).
    fn node_labels(&self) -> Vec<(&'static str, String)>;
}

/// A running metrics listener; dropping it stops listening (a scrape in progress finishes).
#[derive(Debug)]
pub struct MetricsEndpoint {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl MetricsEndpoint {
    /// The bound address (the real port when the requested one was 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `addr` (TCP; port 0 picks a free port) and serves `source`'s metrics until the
/// returned endpoint is dropped. Must be called within a tokio runtime (the listener and its
/// connections are tasks of that runtime). The error is the bind's (the address in use, or not
/// local).
pub fn serve(addr: SocketAddr, source: Arc<dyn Source>) -> std::io::Result<MetricsEndpoint> {
    let std_listener = std::net::TcpListener::bind(addr)?;
    std_listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(std_listener)?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // E.g. out of file descriptors: wait rather than spin.
                    tracing::warn!("metrics endpoint {addr}: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let source = source.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let response = respond(&req, source.as_ref());
                    async move { Ok::<_, Infallible>(response) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(e) = conn.await {
                    tracing::debug!("metrics endpoint {addr}: {e}");
                }
            });
        }
    });
    Ok(MetricsEndpoint { addr, task })
}

/// The answer to one request.
fn respond(req: &Request<Incoming>, source: &dyn Source) -> Response<Full<Bytes>> {
    let plain = |status: StatusCode, text: &str| {
        let mut r = Response::new(Full::new(Bytes::from(text.to_string())));
        *r.status_mut() = status;
        r
    };
    if !matches!(req.uri().path(), "/metrics" | "/") {
        return plain(
            StatusCode::NOT_FOUND,
            "pushpull serves its metrics at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n");
    }
    let mut families = Families::new(&source.node_labels());
    source.collect(&mut families);
    let mut r = Response::new(Full::new(Bytes::from(families.render())));
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(Families::content_type()),
    );
    r
}
