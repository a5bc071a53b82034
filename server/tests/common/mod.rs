//! The kit of the server's socket tests: certificates, a fake scheduler and fake workers
//! around one real `Server`, payload helpers and the setup of a registered server.
#![allow(dead_code, unused_imports)]

pub use std::collections::HashMap;
pub use std::net::SocketAddr;
pub use std::sync::Arc;
pub use std::time::Duration;

pub use bytes::Bytes;
pub use pushpull_codecs::{fp32_codec, Compressor, RoundCtx};
pub use pushpull_net::certs::generate_cluster;
use pushpull_net::tls::TlsIdentity;
pub use pushpull_net::transport::{read_frame, send_frame, ControlSender, ControlStream, Endpoint};
pub use pushpull_proto::config::ParamMap;
pub use pushpull_proto::placement::Placer;
pub use pushpull_proto::protocol::{
    ClusterMap, FrameFlags, FrameHeader, FrameKind, FromScheduler, NodeName, NodeRole, ReduceOp,
    TensorPlacement, ToScheduler,
};
pub use pushpull_proto::Config;
pub use pushpull_server::{CodecContext, Server, ServerError};
pub use tokio::sync::{mpsc, Mutex};
pub use tokio::task::JoinHandle;

pub const WAIT: Duration = Duration::from_secs(10);

pub struct Certs {
    pub _dir: tempfile::TempDir,
    pub scheduler: TlsIdentity,
    pub server: TlsIdentity,
    pub workers: Vec<TlsIdentity>,
}

pub fn certs(num_workers: usize) -> Certs {
    let dir = tempfile::tempdir().unwrap();
    let mut names = vec!["scheduler".to_string(), "server0".to_string()];
    names.extend((0..num_workers).map(|i| format!("worker{i}")));
    let cfgs = generate_cluster(dir.path(), "pushpull.cluster", &names).unwrap();
    let ids: Vec<TlsIdentity> = cfgs.iter().map(|c| TlsIdentity::load(c).unwrap()).collect();
    Certs {
        _dir: dir,
        scheduler: ids[0].clone(),
        server: ids[1].clone(),
        workers: ids[2..].to_vec(),
    }
}

/// The scheduler's side of the server's control stream.
pub struct FakeScheduler {
    pub _ep: Endpoint,
    pub addr: SocketAddr,
    pub tx: Arc<Mutex<ControlSender>>,
    pub rx: mpsc::UnboundedReceiver<ToScheduler>,
    pub heartbeats: Option<JoinHandle<()>>,
}

impl FakeScheduler {
    /// Binds; returns the scheduler and the config (pointing at it) the server should use.
    pub fn bind(certs: &Certs, mut cfg: Config) -> (Endpoint, Config) {
        let ep = Endpoint::bind("127.0.0.1:0".parse().unwrap(), &certs.scheduler, &cfg).unwrap();
        cfg.cluster.scheduler = ep.local_addr().to_string();
        (ep, cfg)
    }

    /// Accepts the server's connection and control stream, reads its Register.
    pub async fn accept(
        ep: Endpoint,
        cfg: &Config,
        heartbeats: bool,
    ) -> (FakeScheduler, ToScheduler) {
        let addr = ep.local_addr();
        let conn = tokio::time::timeout(WAIT, async {
            ep.quinn.accept().await.unwrap().await.unwrap()
        })
        .await
        .unwrap();
        let (send, recv) = conn.accept_bi().await.unwrap();
        let (tx, mut rx) = ControlStream::new(send, recv, "server").split();
        let (mtx, mrx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(m)) = rx.recv::<ToScheduler>().await {
                if m != ToScheduler::Heartbeat && mtx.send(m).is_err() {
                    break;
                }
            }
        });
        let tx = Arc::new(Mutex::new(tx));
        let heartbeats = heartbeats.then(|| {
            let tx = tx.clone();
            let every = cfg.heartbeat_interval();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    if tx
                        .lock()
                        .await
                        .send(&FromScheduler::Heartbeat)
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            })
        });
        let mut s = FakeScheduler {
            _ep: ep,
            addr,
            tx,
            rx: mrx,
            heartbeats,
        };
        let reg = s.recv().await;
        (s, reg)
    }

    pub async fn send(&self, m: FromScheduler) {
        self.tx.lock().await.send(&m).await.unwrap();
    }

    pub async fn recv(&mut self) -> ToScheduler {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("scheduler waited too long")
            .expect("control stream ended")
    }

    pub async fn welcome(&self, server_addr: SocketAddr) {
        self.send(FromScheduler::Welcome {
            id: 0,
            map: ClusterMap {
                servers: vec![server_addr],
                workers: vec![],
                job_seed: 42,
            },
        })
        .await;
    }

    pub async fn place(&mut self, p: &TensorPlacement) -> Option<String> {
        self.send(FromScheduler::Placement(p.clone())).await;
        match self.recv().await {
            ToScheduler::PlacementAck { name, error } => {
                assert_eq!(name, p.name);
                error
            }
            other => panic!("expected PlacementAck, got {other:?}"),
        }
    }
}

impl Drop for FakeScheduler {
    fn drop(&mut self) {
        if let Some(h) = &self.heartbeats {
            h.abort();
        }
    }
}

/// A worker's data connection to the server.
pub struct FakeWorker {
    pub rank: u32,
    pub conn: quinn::Connection,
    pub rx: mpsc::UnboundedReceiver<(FrameHeader, Bytes)>,
    pub stash: HashMap<(u64, u64), (FrameKind, Bytes)>,
    pub _ep: Endpoint,
}

impl FakeWorker {
    pub async fn connect(
        identity: &TlsIdentity,
        cfg: &Config,
        server: SocketAddr,
        rank: u32,
    ) -> Self {
        let ep = Endpoint::bind("127.0.0.1:0".parse().unwrap(), identity, cfg).unwrap();
        let conn = ep.connect(server).await.unwrap();
        let hello = FrameHeader {
            kind: FrameKind::Hello,
            op: ReduceOp::Sum,
            flags: FrameFlags::default(),
            rank,
            aux: 0,
            key: 0,
            round: 0,
            payload_len: 0,
        };
        send_frame(&conn, &hello, Bytes::new(), "server")
            .await
            .unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let c = conn.clone();
        tokio::spawn(async move {
            while let Ok(mut s) = c.accept_uni().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let f = read_frame(&mut s, 1 << 30, "server").await.unwrap();
                    let _ = tx.send(f);
                });
            }
        });
        FakeWorker {
            rank,
            conn,
            rx,
            stash: HashMap::new(),
            _ep: ep,
        }
    }

    pub async fn push(&self, key: u64, round: u64, op: ReduceOp, aux: u32, payload: Bytes) {
        let h = FrameHeader {
            kind: FrameKind::Push,
            op,
            flags: FrameFlags::default(),
            rank: self.rank,
            aux,
            key,
            round,
            payload_len: payload.len() as u64,
        };
        send_frame(&self.conn, &h, payload, "server").await.unwrap();
    }

    /// Writes raw bytes as one stream (for malformed frames).
    pub async fn raw(&self, parts: &[&[u8]]) {
        let mut s = self.conn.open_uni().await.unwrap();
        for p in parts {
            s.write_all(p).await.unwrap();
        }
        s.finish().unwrap();
    }

    /// The frame for `(key, round)`, whatever order frames arrive in.
    pub async fn expect(&mut self, key: u64, round: u64) -> (FrameKind, Bytes) {
        if let Some(f) = self.stash.remove(&(key, round)) {
            return f;
        }
        loop {
            let (h, p) = tokio::time::timeout(WAIT, self.rx.recv())
                .await
                .unwrap_or_else(|_| {
                    panic!("rank {}: no frame for key {key} round {round}", self.rank)
                })
                .expect("connection ended");
            assert_eq!(h.rank, self.rank);
            if (h.key, h.round) == (key, round) {
                return (h.kind, p);
            }
            self.stash.insert((h.key, h.round), (h.kind, p));
        }
    }

    pub async fn expect_result(&mut self, key: u64, round: u64) -> Vec<f32> {
        match self.expect(key, round).await {
            (FrameKind::Result, p) => dec(&p),
            (kind, p) => panic!("{kind:?}: {}", String::from_utf8_lossy(&p)),
        }
    }

    pub async fn expect_abort(&mut self, key: u64, round: u64) -> String {
        match self.expect(key, round).await {
            (FrameKind::Abort, p) => String::from_utf8(p.to_vec()).unwrap(),
            (kind, p) => panic!("expected an abort, got {kind:?} ({} bytes)", p.len()),
        }
    }
}

pub fn enc(x: &[f32]) -> Bytes {
    let mut out = Vec::new();
    fp32_codec(x.len())
        .compress(x, &RoundCtx::new(0), &mut out)
        .unwrap();
    Bytes::from(out)
}

pub fn dec(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Deterministic data of many magnitudes: rank-order and other orders give different bits.
pub fn data(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let m = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            m * 2f32.powi(((s >> 20) % 16) as i32 - 8)
        })
        .collect()
}

pub fn placement(placer: &mut Placer, name: &str, len: u64, params: ParamMap) -> TensorPlacement {
    placer.place(name, len, params)
}

pub struct Setup {
    pub certs: Certs,
    pub cfg: Config,
    pub sched: FakeScheduler,
    pub server_addr: SocketAddr,
    pub run: JoinHandle<Result<(), ServerError>>,
}

/// A server registered with a fake scheduler (welcomed unless `welcome` is false).
pub async fn setup(mut cfg: Config, heartbeats: bool, welcome: bool) -> Setup {
    let certs = certs(cfg.cluster.num_workers as usize);
    cfg.server.listen = "127.0.0.1:0".into();
    let (ep, cfg) = FakeScheduler::bind(&certs, cfg);
    let server = Server::bind(cfg.clone(), certs.server.clone())
        .await
        .unwrap()
        .with_codec_factory(|ctx: &CodecContext<'_>| -> Result<Compressor, String> {
            match ctx.tensor.params.get("compressor").map(String::as_str) {
                None | Some("none") => Ok(fp32_codec(ctx.chunk.len as usize)),
                Some(other) => Err(format!("unknown compressor {other:?}")),
            }
        });
    let server_addr = server.local_addr();
    let run = tokio::spawn(server.run());
    let (sched, reg) = FakeScheduler::accept(ep, &cfg, heartbeats).await;
    match reg {
        ToScheduler::Register {
            role,
            listen_addr,
            digest,
            ..
        } => {
            assert_eq!(role, NodeRole::Server);
            assert_eq!(listen_addr, Some(server_addr));
            assert_eq!(digest, cfg.digest());
        }
        other => panic!("expected Register, got {other:?}"),
    }
    if welcome {
        sched.welcome(server_addr).await;
    }
    Setup {
        certs,
        cfg,
        sched,
        server_addr,
        run,
    }
}

pub async fn finished(run: JoinHandle<Result<(), ServerError>>) -> Result<(), ServerError> {
    tokio::time::timeout(WAIT, run)
        .await
        .expect("server did not exit")
        .unwrap()
}
