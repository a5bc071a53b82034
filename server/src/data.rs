//! The receiving half of a server's data plane: worker connections (`Hello` first, one task
//! per incoming stream), reading each frame to its end, and feeding pushes to their key's state
//! machine. What the tasks share and the sending half (results and aborts to workers) are in
//! `crate::shared`; the scheduler session that places keys and watches liveness is in
//! [`crate::service`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use pushpull_net::certs::peer_grant;
use pushpull_net::sender::Peer;
use pushpull_net::transport::Endpoint;
use pushpull_proto::departure::Departure;
use pushpull_proto::protocol::{FrameHeader, FrameKind, NodeRole, FRAME_HEADER_LEN};
use tracing::{debug, info, warn};

use crate::checkpoint::handle_state_frame;
use crate::shared::{abort, Shared, WorkerConn, ABORT_PRIORITY};
use crate::stats::KeyStats;

pub(crate) async fn accept_loop(endpoint: Endpoint, shared: Arc<Shared>) {
    while let Some(incoming) = endpoint.quinn.accept().await {
        let shared = shared.clone();
        tokio::spawn(async move {
            match incoming.await {
                Ok(conn) => serve_worker(shared, conn).await,
                Err(e) => debug!("incoming connection failed: {e}"),
            }
        });
    }
}

/// What reading one incoming stream gave.
pub(crate) enum Incoming {
    /// A well-formed frame.
    Frame(FrameHeader, Bytes),
    /// The header was readable but the rest was not (payload too long, truncated, extra
    /// bytes, stream reset).
    Bad(FrameHeader, String),
    /// Not even a header.
    Unreadable(String),
}

/// Reads one data frame to the end of its stream. Like [`pushpull_net::transport::read_frame`], but
/// keeps the header when the payload is bad, so the sender can be answered with an `Abort`.
pub(crate) async fn read_incoming(recv: &mut quinn::RecvStream, max_payload: u64) -> Incoming {
    let mut head = [0u8; FRAME_HEADER_LEN];
    match recv.read_exact(&mut head).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(n)) => {
            return Incoming::Unreadable(format!(
                "truncated frame header: {n} of {FRAME_HEADER_LEN} bytes"
            ))
        }
        Err(quinn::ReadExactError::ReadError(e)) => return Incoming::Unreadable(e.to_string()),
    }
    let header = match FrameHeader::decode(&head, u64::MAX) {
        Ok(h) => h,
        Err(e) => {
            let _ = recv.stop(quinn::VarInt::from_u32(1));
            return Incoming::Unreadable(e.to_string());
        }
    };
    if header.payload_len > max_payload {
        let _ = recv.stop(quinn::VarInt::from_u32(1));
        return Incoming::Bad(
            header,
            format!(
                "frame payload of {} bytes exceeds the limit of {max_payload} bytes",
                header.payload_len
            ),
        );
    }
    let want = header.payload_len as usize;
    let mut single: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    let mut got = 0usize;
    loop {
        match recv.read_chunk(usize::MAX, true).await {
            Ok(Some(chunk)) => {
                got += chunk.bytes.len();
                if got > want {
                    let _ = recv.stop(quinn::VarInt::from_u32(1));
                    return Incoming::Bad(
                        header,
                        format!("more bytes than the declared payload of {want} bytes"),
                    );
                }
                if single.is_none() && buf.is_empty() {
                    single = Some(chunk.bytes);
                } else {
                    if let Some(first) = single.take() {
                        buf.reserve(want);
                        buf.extend_from_slice(&first);
                    }
                    buf.extend_from_slice(&chunk.bytes);
                }
            }
            Ok(None) => break,
            Err(quinn::ReadError::ConnectionLost(e)) => {
                return Incoming::Unreadable(format!("connection lost: {e}"))
            }
            Err(e) => return Incoming::Bad(header, format!("stream failed: {e}")),
        }
    }
    if got < want {
        return Incoming::Bad(
            header,
            format!("truncated frame payload: {got} of {want} bytes"),
        );
    }
    let payload = single.unwrap_or_else(|| buf.freeze());
    Incoming::Frame(header, payload)
}

/// Beyond twice the number of workers, how many connections may wait for their `Hello`.
const SPARE_AWAITING_HELLO: usize = 32;

/// Counts a connection in [`Shared::awaiting_hello`] until dropped.
struct HelloWait<'a>(&'a AtomicUsize);

impl Drop for HelloWait<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves one worker's data connection: `Hello` first, then one task per stream.
pub(crate) async fn serve_worker(shared: Arc<Shared>, conn: quinn::Connection) {
    let addr = conn.remote_address();
    let refuse = |why: String| {
        warn!(%addr, "worker connection refused: {why}");
        let refused = Departure::Refused(why);
        conn.close(quinn::VarInt::from_u32(refused.code()), &refused.reason());
    };
    // At most 2 × workers + SPARE_AWAITING_HELLO connections may wait for their Hello at
    // once: a flood of connections cannot pile up tasks.
    let cap = 2 * shared.num_workers as usize + SPARE_AWAITING_HELLO;
    let waiting = shared.awaiting_hello.fetch_add(1, Ordering::SeqCst);
    let hello_wait = HelloWait(&shared.awaiting_hello);
    if waiting >= cap {
        return refuse(format!(
            "{waiting} connections are already waiting to say Hello (at most {cap}); try again"
        ));
    }
    // The first stream and its whole frame, within the bound: a peer that opens the stream
    // and stalls must not hold this task forever.
    let hello = async {
        let mut first = conn.accept_uni().await?;
        Ok::<_, quinn::ConnectionError>(read_incoming(&mut first, 0).await)
    };
    let hello = match tokio::time::timeout(shared.heartbeat_timeout, hello).await {
        Ok(Ok(frame)) => frame,
        Ok(Err(e)) => return debug!(%addr, "connection closed before Hello: {e}"),
        Err(_) => return refuse("no Hello within the heartbeat timeout".into()),
    };
    drop(hello_wait);
    let rank = match hello {
        Incoming::Frame(h, _) if h.kind == FrameKind::Hello => h.rank,
        // A Hello read with a payload limit of 0: say what was wrong with it, not its kind.
        Incoming::Bad(h, _) if h.kind == FrameKind::Hello && h.payload_len > 0 => {
            return refuse(format!(
                "a Hello frame carries no payload, got {} bytes",
                h.payload_len
            ))
        }
        Incoming::Bad(h, why) if h.kind == FrameKind::Hello => {
            return refuse(format!("bad Hello frame: {why}"))
        }
        Incoming::Frame(h, _) | Incoming::Bad(h, _) => {
            return refuse(format!("the first frame must be Hello, got {:?}", h.kind))
        }
        Incoming::Unreadable(e) => return refuse(format!("bad Hello frame: {e}")),
    };
    if rank >= shared.num_workers {
        return refuse(format!(
            "Hello from rank {rank}, but the job has {} workers",
            shared.num_workers
        ));
    }
    if let Err(why) = peer_grant(&conn, shared.check_roles).allows(NodeRole::Worker, Some(rank)) {
        return refuse(format!("Hello from rank {rank}: {why}"));
    }
    let w = WorkerConn {
        peer: Peer {
            conn: conn.clone(),
            name: format!("worker {rank} ({addr})").into(),
        },
        sender: shared.sender.clone(),
    };
    {
        let mut workers = shared.workers.write().unwrap_or_else(|e| e.into_inner());
        let slot = &mut workers[rank as usize];
        if let Some(old) = slot {
            if old.peer.conn.close_reason().is_none() {
                let why = format!("rank {rank} is already connected as {}", old.peer.name);
                drop(workers);
                return refuse(why);
            }
        }
        *slot = Some(w.clone());
    }
    info!("{} connected", w.peer.name);
    loop {
        match conn.accept_uni().await {
            Ok(mut stream) => {
                let shared = shared.clone();
                let w = w.clone();
                tokio::spawn(async move {
                    let frame = read_incoming(&mut stream, shared.max_payload).await;
                    handle_frame(&shared, &w, rank, frame);
                });
            }
            Err(e) => {
                info!("{} disconnected: {e}", w.peer.name);
                // A clean finish (a lost worker is reported by the scheduler instead).
                if let quinn::ConnectionError::ApplicationClosed(close) = &e {
                    let why = Departure::from_close(close.error_code.into_inner(), &close.reason);
                    if matches!(why, Departure::Done(_)) {
                        shared.worker_left(rank, &w.peer.name);
                    }
                }
                break;
            }
        }
    }
}

/// Feeds one frame from worker `rank` to its key and carries out the actions.
pub(crate) fn handle_frame(shared: &Arc<Shared>, w: &WorkerConn, rank: u32, frame: Incoming) {
    let arrived = pushpull_net::timeline::on().then(pushpull_net::timeline::now);
    if pushpull_net::trace::enabled() || arrived.is_some() {
        if let (Some(id), Incoming::Frame(h, _)) = (shared.server_id.get(), &frame) {
            if pushpull_net::trace::enabled() {
                pushpull_net::trace::set_node(format!("server{id}"));
            }
            pushpull_net::trace::frame_arrived(h, &w.peer.name);
        }
    }
    let (header, payload, bad) = match frame {
        Incoming::Frame(h, p) => (h, p, None),
        Incoming::Bad(h, why) => (h, Bytes::new(), Some(why)),
        Incoming::Unreadable(why) => {
            warn!("unreadable frame from {}: {why}", w.peer.name);
            return;
        }
    };
    if matches!(header.kind, FrameKind::StateGet | FrameKind::StatePut) {
        return handle_state_frame(shared, w, rank, &header, &payload, bad);
    }
    let key = header.key;
    let round = header.round;
    if header.kind != FrameKind::Push {
        let why = format!(
            "{} expected a Push frame from {}, got {:?}{}",
            shared.id_str(),
            w.peer.name,
            header.kind,
            bad.as_deref()
                .map(|b| format!(" ({b})"))
                .unwrap_or_default()
        );
        warn!(key, round, "{why}");
        if header.kind != FrameKind::Hello {
            let frame = (abort(), key, round, Bytes::from(why));
            w.send(rank, frame, ABORT_PRIORITY);
        }
        return;
    }
    let Some(k) = shared.keys.get(&key).map(|e| e.value().clone()) else {
        let why =
            format!(
            "key {key:#018x} round {round}: push from rank {rank} for a key that {} does not hold (no \
             tensor placed on it has this key){}",
            shared.id_str(),
            bad.as_deref().map(|b| format!("; also: {b}")).unwrap_or_default()
        );
        warn!("{why}");
        let frame = (abort(), key, round, Bytes::from(why));
        w.send(rank, frame, ABORT_PRIORITY);
        return;
    };
    if let Some(s) = shared.key_stats.get(&key) {
        KeyStats::add(&s.bytes_received, payload.len() as u64);
    }
    let (priority, actions) = {
        let mut k = k.lock().unwrap_or_else(|e| e.into_inner());
        let actions = if let Some(why) = bad {
            k.reject(rank, round, &why)
        } else if header.rank != rank {
            let why = format!(
                "its header says rank {} but the connection said Hello as rank {rank}",
                header.rank
            );
            k.reject(rank, round, &why)
        } else {
            let was = (k.is_open(), k.current_round());
            // Taken up now, under the key's lock: the pushes of a round are taken up in the
            // order their times are read (their arrival times, read before the lock, may be in
            // another order), so the round's `receive` never ends before it begins.
            let taken = arrived.map(|_| pushpull_net::timeline::now());
            let actions = k.push_flagged(rank, round, header.op, header.aux, header.flags, payload);
            if let (Some(at), Some(&id)) = (taken, shared.server_id.get()) {
                crate::spans::receive(id, k.info(), round, at, was, &actions);
            }
            actions
        };
        (k.info().priority, actions)
    };
    shared.execute(key, priority, actions);
}
