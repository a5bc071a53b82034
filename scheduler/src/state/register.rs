//! Registration: who may join, which ids they get, and the moment the job starts (the rules
//! of step 1 in the [parent module](super)).

use super::*;

impl SchedulerState {
    pub(super) fn on_register(
        &mut self,
        conn: ConnId,
        version: u32,
        role: NodeRole,
        requested: Option<u32>,
        listen: Option<SocketAddr>,
        digest: ClusterDigest,
    ) {
        if version != PROTOCOL_VERSION {
            return self.refuse(
                conn,
                format!(
                    "protocol version mismatch: this node speaks version {version}, the \
                     scheduler speaks version {PROTOCOL_VERSION}"
                ),
            );
        }
        let (count, what, plural, idname) = match role {
            NodeRole::Server => (self.cfg.num_servers, "server", "servers", "server id"),
            NodeRole::Worker => (self.cfg.num_workers, "worker", "workers", "worker rank"),
            NodeRole::Scheduler => {
                return self.refuse(conn, "a scheduler cannot register with a scheduler".into())
            }
        };
        let grant = self.conns[&conn].grant;
        if let Err(why) = grant.allows(role, requested) {
            return self.refuse(conn, why);
        }
        // A certificate that fixes the id decides it.
        let requested = requested.or(grant.id());
        if let Some((key, ours, theirs)) = self.cfg.digest.first_difference(&digest) {
            return self.refuse(
                conn,
                format!(
                    "config mismatch: `{key}` is {ours} on the scheduler but {theirs} on this \
                     {what}"
                ),
            );
        }
        if self.running {
            return self.refuse(
                conn,
                format!(
                    "the cluster is full: all {count} {plural} registered and the job is running"
                ),
            );
        }
        let listen = match role {
            NodeRole::Server => match listen {
                None => {
                    return self.refuse(
                        conn,
                        "a server must send the address workers dial (listen_addr)".into(),
                    )
                }
                Some(a) if a.port() == 0 => {
                    return self.refuse(
                        conn,
                        format!("server listen address {a} has port 0, which workers cannot dial"),
                    )
                }
                Some(a) => Some(a),
            },
            _ => None,
        };
        // Everyone registered with this role so far.
        let pending: Vec<(ConnId, Option<u32>, Option<SocketAddr>)> = self
            .conns
            .iter()
            .filter_map(|(&k, c)| match &c.phase {
                Phase::Pending {
                    role: r,
                    requested,
                    listen,
                    ..
                } if *r == role => Some((k, *requested, *listen)),
                _ => None,
            })
            .collect();
        if let Some(id) = requested {
            if id >= count {
                return self.refuse(
                    conn,
                    format!(
                        "requested {idname} {id} is out of range: the cluster has {count} \
                         {plural} ({idname}s 0..={})",
                        count - 1
                    ),
                );
            }
            if let Some((other, _, _)) = pending.iter().find(|p| p.1 == Some(id)) {
                let other_addr = self.conns[other].addr;
                return self.refuse(
                    conn,
                    format!(
                        "requested {idname} {id} is already taken by the {what} at {other_addr}"
                    ),
                );
            }
        }
        if pending.len() as u32 >= count {
            return self.refuse(
                conn,
                format!("the cluster is full: {count} of {count} {plural} have already registered"),
            );
        }
        if let Some(a) = listen {
            if let Some((other, _, _)) = pending.iter().find(|p| p.2 == Some(a)) {
                let other_addr = self.conns[other].addr;
                return self.refuse(
                    conn,
                    format!(
                        "server listen address {a} is already advertised by the server \
                         registered from {other_addr}"
                    ),
                );
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let c = self.conns.get_mut(&conn).expect("registering connection");
        c.phase = Phase::Pending {
            role,
            requested,
            listen,
            seq,
        };
        tracing::info!(
            peer = %c.addr,
            "{what} registered ({} of {count}{})",
            pending.len() + 1,
            requested.map_or(String::new(), |id| format!(", requested {idname} {id}"))
        );
        self.maybe_start();
    }

    /// Assigns ids: requested ones honoured, the rest lowest-free-first in registration order.
    pub(super) fn assign(&self, role: NodeRole, count: u32) -> Vec<ConnId> {
        let mut regs: Vec<(u64, ConnId, Option<u32>)> = self
            .conns
            .iter()
            .filter_map(|(&k, c)| match &c.phase {
                Phase::Pending {
                    role: r,
                    requested,
                    seq,
                    ..
                } if *r == role => Some((*seq, k, *requested)),
                _ => None,
            })
            .collect();
        regs.sort();
        let mut slots: Vec<Option<ConnId>> = vec![None; count as usize];
        for &(_, k, req) in &regs {
            if let Some(id) = req {
                slots[id as usize] = Some(k);
            }
        }
        let mut free = (0..count as usize)
            .filter(|&i| slots[i].is_none())
            .collect::<Vec<_>>();
        free.reverse();
        for &(_, k, req) in &regs {
            if req.is_none() {
                let i = free.pop().expect("as many registrations as slots");
                slots[i] = Some(k);
            }
        }
        slots
            .into_iter()
            .map(|s| s.expect("every slot filled"))
            .collect()
    }

    pub(super) fn maybe_start(&mut self) {
        let count = |role| {
            self.conns
                .values()
                .filter(|c| matches!(&c.phase, Phase::Pending { role: r, .. } if *r == role))
                .count() as u32
        };
        if count(NodeRole::Server) < self.cfg.num_servers
            || count(NodeRole::Worker) < self.cfg.num_workers
        {
            return;
        }
        let servers = self.assign(NodeRole::Server, self.cfg.num_servers);
        let workers = self.assign(NodeRole::Worker, self.cfg.num_workers);
        let mut server_addrs = Vec::new();
        for (id, &conn) in servers.iter().enumerate() {
            let Phase::Pending { listen, .. } = &self.conns[&conn].phase else {
                unreachable!("assigned a pending server")
            };
            let addr = listen.expect("servers register with a listen address");
            server_addrs.push(addr);
            self.servers.push(Member {
                conn,
                name: NodeName {
                    role: NodeRole::Server,
                    id: id as u32,
                    addr,
                },
            });
        }
        let mut worker_addrs = Vec::new();
        for (rank, &conn) in workers.iter().enumerate() {
            let addr = self.conns[&conn].addr;
            worker_addrs.push(addr);
            self.workers.push(Member {
                conn,
                name: NodeName {
                    role: NodeRole::Worker,
                    id: rank as u32,
                    addr,
                },
            });
        }
        let map = ClusterMap {
            servers: server_addrs,
            workers: worker_addrs,
            job_seed: self.cfg.job_seed,
        };
        for (role, list) in [(NodeRole::Server, servers), (NodeRole::Worker, workers)] {
            for (id, conn) in list.into_iter().enumerate() {
                let id = id as u32;
                self.conns.get_mut(&conn).expect("member").phase = Phase::Member { role, id };
                self.send(
                    conn,
                    FromScheduler::Welcome {
                        id,
                        map: map.clone(),
                    },
                );
            }
        }
        self.running = true;
        tracing::info!(
            servers = ?map.servers,
            workers = ?map.workers,
            job_seed = map.job_seed,
            "cluster complete: {} servers, {} workers welcomed",
            self.cfg.num_servers,
            self.cfg.num_workers
        );
    }

    /// Who registered and who is missing of one role, e.g. `1 of 2 workers registered
    /// (missing ranks [1])`; missing ids are named when every registered node asked for one.
    fn registered_of(&self, role: NodeRole, count: u32) -> String {
        let requested: Vec<Option<u32>> = self
            .conns
            .values()
            .filter_map(|c| match &c.phase {
                Phase::Pending {
                    role: r, requested, ..
                } if *r == role => Some(*requested),
                _ => None,
            })
            .collect();
        let (n, plural, idname) = match role {
            NodeRole::Server => (requested.len() as u32, "servers", "ids"),
            _ => (requested.len() as u32, "workers", "ranks"),
        };
        if n >= count {
            return format!("{count} of {count} {plural} registered");
        }
        if requested.iter().all(Option::is_some) {
            let missing: Vec<u32> = (0..count)
                .filter(|i| !requested.contains(&Some(*i)))
                .collect();
            format!("{n} of {count} {plural} registered (missing {idname} {missing:?})")
        } else {
            format!("{n} of {count} {plural} registered ({} missing)", count - n)
        }
    }

    /// Who registered and who is missing, servers and workers.
    pub(super) fn rendezvous_status(&self) -> String {
        format!(
            "{}; {}",
            self.registered_of(NodeRole::Worker, self.cfg.num_workers),
            self.registered_of(NodeRole::Server, self.cfg.num_servers)
        )
    }

    /// Before the cluster is complete: logs who it waits for every
    /// [`RENDEZVOUS_LOG_INTERVAL`]; past the rendezvous deadline, fails the job, telling every
    /// waiting node who is missing.
    pub(super) fn check_rendezvous(&mut self, now: Instant) {
        if now >= self.rendezvous_deadline {
            let msg = format!(
                "rendezvous timed out after {:.1} s (cluster.rendezvous_timeout_ms): {}",
                self.cfg.rendezvous_timeout.as_secs_f64(),
                self.rendezvous_status()
            );
            tracing::error!("{msg}");
            let waiting: Vec<ConnId> = self
                .conns
                .iter()
                .filter(|(_, c)| !c.disconnected && matches!(c.phase, Phase::Pending { .. }))
                .map(|(&k, _)| k)
                .collect();
            for conn in waiting {
                self.send(
                    conn,
                    FromScheduler::Shutdown {
                        error: Some(msg.clone()),
                    },
                );
                self.actions.push_back(Action::Close(conn));
            }
            return self.finish(Err(JobFailure::Rendezvous(msg)));
        }
        if now >= self.next_rendezvous_log {
            let left = self.rendezvous_deadline.saturating_duration_since(now);
            tracing::info!(
                "waiting for the cluster: {}; rendezvous timeout in {:.0} s",
                self.rendezvous_status(),
                left.as_secs_f64()
            );
            self.next_rendezvous_log = now + RENDEZVOUS_LOG_INTERVAL;
        }
    }
}
