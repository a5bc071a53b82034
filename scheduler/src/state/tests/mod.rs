//! Tests of [`super::SchedulerState`] (the harness here; the tests by concern in `register`,
//! `declare`, `liveness`): registration orders, declare mismatches, barriers,
//! liveness and the clean finish, driven by events and a fake clock.

use super::*;
use pushpull_proto::placement::chunk_key;
use pushpull_proto::protocol::ChunkPlacement;

const SEED: u64 = 42;

/// A scheduler state with a fake clock and helpers to play nodes.
struct H {
    s: SchedulerState,
    now: Instant,
    cfg: Config,
}

fn waddr(conn: ConnId) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, conn as u8], 1000 + conn as u16))
}
fn saddr(conn: ConnId) -> SocketAddr {
    SocketAddr::from(([10, 1, 0, conn as u8], 7000 + conn as u16))
}

impl H {
    fn new(workers: u32, servers: u32) -> H {
        H::new_with(workers, servers, |_| {})
    }
    fn new_with(workers: u32, servers: u32, tweak: impl FnOnce(&mut Config)) -> H {
        let mut cfg = Config::local(workers, servers);
        cfg.cluster.partition_bytes = 400; // 100 elements per chunk
        tweak(&mut cfg);
        let now = Instant::now();
        H {
            s: SchedulerState::new(StateConfig::from_config(&cfg, SEED), now),
            now,
            cfg,
        }
    }
    fn ev(&mut self, e: Event) {
        self.s.handle(self.now, e);
    }
    fn msg(&mut self, conn: ConnId, msg: ToScheduler) {
        self.ev(Event::Message { conn, msg });
    }
    fn register(&mut self, conn: ConnId, role: NodeRole, requested: Option<u32>) {
        let digest = self.cfg.digest();
        self.register_with(conn, role, requested, digest);
    }
    fn register_with(
        &mut self,
        conn: ConnId,
        role: NodeRole,
        requested: Option<u32>,
        digest: ClusterDigest,
    ) {
        self.register_granted(conn, role, requested, digest, PeerGrant::Unchecked);
    }
    /// Registers with a certificate that grants `grant`.
    fn register_granted(
        &mut self,
        conn: ConnId,
        role: NodeRole,
        requested: Option<u32>,
        digest: ClusterDigest,
        grant: PeerGrant,
    ) {
        self.ev(Event::Connected {
            conn,
            addr: waddr(conn),
            grant,
        });
        let listen_addr = (role == NodeRole::Server).then(|| saddr(conn));
        self.msg(
            conn,
            ToScheduler::Register {
                version: PROTOCOL_VERSION,
                role,
                requested_id: requested,
                listen_addr,
                digest,
            },
        );
    }
    fn advance(&mut self, ms: u64) {
        self.now += Duration::from_millis(ms);
        self.ev(Event::Tick);
    }
    fn take(&mut self) -> Vec<Action> {
        std::iter::from_fn(|| self.s.poll_action()).collect()
    }
    /// Registers servers on conns 100.. and workers on conns 0.., returns the conn of
    /// every server id and worker rank.
    fn start(workers: u32, servers: u32) -> (H, Vec<ConnId>, Vec<ConnId>) {
        H::start_with(workers, servers, |_| {})
    }
    fn start_with(
        workers: u32,
        servers: u32,
        tweak: impl FnOnce(&mut Config),
    ) -> (H, Vec<ConnId>, Vec<ConnId>) {
        let mut h = H::new_with(workers, servers, tweak);
        for s in 0..servers {
            h.register(100 + s as ConnId, NodeRole::Server, None);
        }
        for w in 0..workers {
            h.register(w as ConnId, NodeRole::Worker, None);
        }
        let acts = h.take();
        let ids = welcomes(&acts);
        let mut srv = vec![0; servers as usize];
        let mut wrk = vec![0; workers as usize];
        for (conn, id) in ids {
            if conn >= 100 {
                srv[id as usize] = conn;
            } else {
                wrk[id as usize] = conn;
            }
        }
        (h, srv, wrk)
    }
    fn declare(&mut self, conn: ConnId, name: &str, len: u64, params: &[(&str, &str)]) {
        self.declare_with_priority(conn, name, len, params, None)
    }
    fn declare_with_priority(
        &mut self,
        conn: ConnId,
        name: &str,
        len: u64,
        params: &[(&str, &str)],
        priority: Option<i32>,
    ) {
        let params = params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.msg(
            conn,
            ToScheduler::Declare {
                name: name.into(),
                len,
                params,
                priority,
            },
        );
    }
    fn ack(&mut self, conn: ConnId, name: &str, error: Option<&str>) {
        self.msg(
            conn,
            ToScheduler::PlacementAck {
                name: name.into(),
                error: error.map(String::from),
            },
        );
    }
    fn heartbeat_all_but(&mut self, conns: &[ConnId], silent: ConnId) {
        for &c in conns {
            if c != silent {
                self.msg(c, ToScheduler::Heartbeat);
            }
        }
    }
}

/// Non-heartbeat messages sent to `conn`.
fn to(acts: &[Action], conn: ConnId) -> Vec<FromScheduler> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Send(c, m) if *c == conn && *m != FromScheduler::Heartbeat => Some(m.clone()),
            _ => None,
        })
        .collect()
}

/// (conn, id) of every Welcome.
fn welcomes(acts: &[Action]) -> Vec<(ConnId, u32)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Send(c, FromScheduler::Welcome { id, .. }) => Some((*c, *id)),
            _ => None,
        })
        .collect()
}

fn refusal(acts: &[Action], conn: ConnId) -> String {
    assert!(acts.contains(&Action::Close(conn)), "{acts:?}");
    match to(acts, conn).as_slice() {
        [FromScheduler::Refused { reason }] => reason.clone(),
        other => panic!("expected one refusal, got {other:?}"),
    }
}

fn declared(acts: &[Action], conn: ConnId) -> Vec<(String, Result<TensorPlacement, String>)> {
    to(acts, conn)
        .into_iter()
        .filter_map(|m| match m {
            FromScheduler::Declared { name, result } => Some((name, result)),
            _ => None,
        })
        .collect()
}

fn placements(acts: &[Action], conn: ConnId) -> Vec<TensorPlacement> {
    to(acts, conn)
        .into_iter()
        .filter_map(|m| match m {
            FromScheduler::Placement(p) => Some(p),
            _ => None,
        })
        .collect()
}

fn finish_of(acts: &[Action]) -> Option<Result<(), JobFailure>> {
    acts.iter().find_map(|a| match a {
        Action::Finish(r) => Some(r.clone()),
        _ => None,
    })
}

// ----------------------------------------------------------- registration

mod declare;
mod liveness;
mod register;
