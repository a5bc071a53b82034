//! Barriers, the finish and liveness: heartbeats, silent and disconnected nodes, losses
//! (steps 3 to 5 in the [parent module](super)).

use super::*;

impl SchedulerState {
    pub(super) fn on_barrier(&mut self, rank: u32, id: u64) {
        self.barriers.entry(id).or_default().insert(rank);
        if self.barriers[&id].len() as u32 == self.cfg.num_workers {
            self.barriers.remove(&id);
            return self.send_workers(self.all_ranks(), &FromScheduler::BarrierDone { id });
        }
        self.check_stuck_barriers();
    }

    /// Fails the job if a pending barrier lacks a worker that already finished.
    pub(super) fn check_stuck_barriers(&mut self) {
        let stuck = self.barriers.iter().find_map(|(&id, ranks)| {
            self.finished_without(|_, r| ranks.contains(&r))
                .map(|f| (id, ranks.iter().next().copied().unwrap_or(0), f))
        });
        if let Some((id, waiter, f)) = stuck {
            let msg = format!(
                "barrier {id} can never complete: worker {f} finished without entering it while \
                 worker {waiter} waits in it"
            );
            tracing::warn!("{msg}");
            for conn in self.live_members(None) {
                self.send(
                    conn,
                    FromScheduler::Shutdown {
                        error: Some(msg.clone()),
                    },
                );
            }
            self.finish(Err(JobFailure::Stuck(msg)));
        }
    }

    pub(super) fn on_finished(&mut self, rank: u32) {
        let conn = self.workers[rank as usize].conn;
        let c = self.conns.get_mut(&conn).expect("member connection");
        if c.finished {
            return;
        }
        c.finished = true;
        tracing::info!("{} finished", self.workers[rank as usize].name);
        // Declares this worker will never join fail for the others.
        let orphaned: Vec<String> = self
            .tensors
            .iter()
            .filter_map(|(n, t)| match t {
                TensorState::Collecting(d) if !d.contains_key(&rank) => Some(n.clone()),
                _ => None,
            })
            .collect();
        for name in orphaned {
            let Some(TensorState::Collecting(decls)) = self.tensors.remove(&name) else {
                unreachable!()
            };
            let msg = FromScheduler::Declared {
                result: Err(format!(
                    "tensor {name:?}: worker {rank} finished without declaring it"
                )),
                name,
            };
            self.send_workers(decls.into_keys(), &msg);
        }
        self.check_stuck_barriers();
        if self.done {
            return;
        }
        let all = self.workers.iter().all(|w| self.conns[&w.conn].finished);
        if all {
            tracing::info!("every worker finished; telling every node to shut down");
            for conn in self.live_members(None) {
                self.send(conn, FromScheduler::Shutdown { error: None });
            }
            self.finish(Ok(()));
        }
    }

    pub(super) fn on_disconnected(&mut self, conn: ConnId, reason: String) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.disconnected = true;
        match c.phase.clone() {
            Phase::Member { role, id } => {
                if !c.finished {
                    self.lose(role, id, format!("connection lost: {reason}"));
                }
            }
            Phase::Pending { role, .. } => {
                tracing::warn!(
                    peer = %c.addr,
                    "{role} left before the cluster was complete ({reason}); its slot is free again"
                );
                self.conns.remove(&conn);
            }
            // Nothing refers to a connection that never became a member: forget it.
            Phase::Connected | Phase::Gone => {
                self.conns.remove(&conn);
            }
        }
    }

    /// A member closed blaming `node`'s loss: `node` is lost (once), the member its messenger.
    pub(super) fn on_blamed(&mut self, conn: ConnId, node: NodeName, reason: String) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let Phase::Member { role, id } = c.phase.clone() else {
            return;
        };
        let messenger = self.member(role, id).name.clone();
        let blamed = self.conns.values().find_map(|c| match c.phase {
            Phase::Member { role, id }
                if role == node.role && id == node.id && !c.finished && !c.disconnected =>
            {
                Some((role, id))
            }
            _ => None,
        });
        if let Some((role, id)) = blamed {
            self.lose(role, id, format!("{reason} (reported by {messenger})"));
        }
    }

    pub(super) fn on_tick(&mut self, now: Instant) {
        if !self.running {
            self.check_rendezvous(now);
            if self.done {
                return;
            }
        }
        if now >= self.next_heartbeat {
            let targets: Vec<ConnId> = self
                .conns
                .iter()
                .filter(|(_, c)| {
                    !c.disconnected
                        && matches!(c.phase, Phase::Pending { .. } | Phase::Member { .. })
                })
                .map(|(&k, _)| k)
                .collect();
            let missed = 2 * self.cfg.heartbeat_interval;
            for conn in targets {
                if let Some(c) = self.conns.get_mut(&conn) {
                    if !c.finished && now.saturating_duration_since(c.last_heard) > missed {
                        c.missed_heartbeats += 1;
                    }
                }
                self.send(conn, FromScheduler::Heartbeat);
            }
            self.next_heartbeat = now + self.cfg.heartbeat_interval;
        }
        let timeout = self.cfg.heartbeat_timeout;
        let silent: Vec<(ConnId, Duration)> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                !c.finished && !matches!(c.phase, Phase::Gone) && now >= c.last_heard + timeout
            })
            .map(|(&k, c)| (k, now - c.last_heard))
            .collect();
        for (conn, quiet) in silent {
            if self.done {
                return;
            }
            let c = self.conns.get_mut(&conn).expect("silent connection");
            let reason = format!(
                "no heartbeat for {:.1} s (timeout {:.1} s)",
                quiet.as_secs_f64(),
                timeout.as_secs_f64()
            );
            match c.phase.clone() {
                Phase::Member { role, id } => self.lose(role, id, reason),
                Phase::Pending { role, .. } => {
                    tracing::warn!(
                        peer = %c.addr,
                        "{role} dropped before the cluster was complete: {reason}; its slot is \
                         free again"
                    );
                    c.phase = Phase::Gone;
                    let reason = format!(
                        "dropped while waiting for the rest of the cluster: {reason} (a waiting \
                         node must keep sending heartbeats)"
                    );
                    self.send(conn, FromScheduler::Refused { reason });
                    self.actions.push_back(Action::Close(conn));
                }
                Phase::Connected => {
                    tracing::warn!(peer = %c.addr, "connection never registered: {reason}");
                    c.phase = Phase::Gone;
                    let reason = format!("no Register message: {reason}");
                    self.send(conn, FromScheduler::Refused { reason });
                    self.actions.push_back(Action::Close(conn));
                }
                Phase::Gone => {}
            }
        }
    }

    pub(super) fn lose(&mut self, role: NodeRole, id: u32, reason: String) {
        let m = self.member(role, id).clone();
        tracing::warn!("{} lost: {reason}; shutting the job down", m.name);
        let lost = FromScheduler::NodeLost {
            node: m.name.clone(),
            reason: reason.clone(),
        };
        let shutdown = FromScheduler::Shutdown {
            error: Some(format!("{} lost: {reason}", m.name)),
        };
        let others = self.live_members(Some(m.conn));
        for &conn in &others {
            self.send(conn, lost.clone());
        }
        for &conn in &others {
            self.send(conn, shutdown.clone());
        }
        // The lost node itself, if it can still hear us, learns why the job ended.
        if !self.conns[&m.conn].disconnected {
            self.send(m.conn, shutdown);
        }
        self.finish(Err(JobFailure::NodeLost {
            node: m.name,
            reason,
        }));
    }
}
