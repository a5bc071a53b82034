//! Declare, a collective: comparing every worker's declaration, placing the tensor,
//! collecting the servers' acknowledgements (step 2 in the [parent module](super)).

use super::decl::describe;
use super::*;
use pushpull_codecs::chunk::tensor_cut;

impl SchedulerState {
    pub(super) fn on_declare(&mut self, rank: u32, name: String, decl: Decl) {
        match self.tensors.get_mut(&name) {
            Some(TensorState::Placed(p, requested)) => {
                let result = match Decl::of_placement(p, *requested).diff(&decl) {
                    None => Ok(p.clone()),
                    Some(d) => Err(describe(
                        &name,
                        "it is already declared with",
                        &format!("worker {rank} declared"),
                        &d,
                    )),
                };
                return self.send_workers([rank], &FromScheduler::Declared { name, result });
            }
            Some(TensorState::Placing {
                placement,
                requested,
                waiting,
                ..
            }) => {
                match Decl::of_placement(placement, *requested).diff(&decl) {
                    None => {
                        waiting.insert(rank);
                    }
                    Some(d) => {
                        let result = Err(describe(
                            &name,
                            "it is already declared with",
                            &format!("worker {rank} declared"),
                            &d,
                        ));
                        self.send_workers([rank], &FromScheduler::Declared { name, result });
                    }
                }
                return;
            }
            Some(TensorState::Collecting(decls)) => {
                if let Some(first) = decls.get(&rank) {
                    if let Some(d) = first.diff(&decl) {
                        let result = Err(format!(
                            "{} (declared twice before every worker declared it)",
                            describe(&name, &format!("worker {rank} first declared"), "then", &d)
                        ));
                        self.send_workers([rank], &FromScheduler::Declared { name, result });
                    }
                    return;
                }
                decls.insert(rank, decl);
            }
            None => {
                self.tensors.insert(
                    name.clone(),
                    TensorState::Collecting(BTreeMap::from([(rank, decl)])),
                );
            }
        }
        // A worker that already finished will never declare it.
        if let Some(f) = self.finished_without(|_, r| {
            matches!(self.tensors.get(&name), Some(TensorState::Collecting(d)) if d.contains_key(&r))
        }) {
            let Some(TensorState::Collecting(decls)) = self.tensors.remove(&name) else {
                unreachable!()
            };
            let msg = FromScheduler::Declared {
                result: Err(format!(
                    "tensor {name:?}: worker {f} finished without declaring it"
                )),
                name,
            };
            return self.send_workers(decls.into_keys(), &msg);
        }
        let complete = matches!(self.tensors.get(&name),
            Some(TensorState::Collecting(d)) if d.len() as u32 == self.cfg.num_workers);
        if complete {
            self.collective_complete(name);
        }
    }

    /// The lowest finished worker rank for which `took_part(self, rank)` is false.
    pub(super) fn finished_without(&self, took_part: impl Fn(&Self, u32) -> bool) -> Option<u32> {
        self.all_ranks()
            .find(|&r| self.conns[&self.workers[r as usize].conn].finished && !took_part(self, r))
    }

    pub(super) fn collective_complete(&mut self, name: String) {
        let Some(TensorState::Collecting(decls)) = self.tensors.remove(&name) else {
            unreachable!("collective_complete on a collecting tensor")
        };
        let (&r0, decl0) = decls.iter().next().expect("at least one declaration");
        let first = decls.iter().find_map(|(&r, decl)| {
            decl0.diff(decl).map(|d| {
                describe(
                    &name,
                    &format!("worker {r0} declared"),
                    &format!("worker {r} declared"),
                    &d,
                )
            })
        });
        if let Some(msg) = first {
            tracing::warn!("declare failed: {msg}");
            let msg = FromScheduler::Declared {
                name,
                result: Err(msg),
            };
            return self.send_workers(self.all_ranks(), &msg);
        }
        let Decl {
            len,
            params,
            priority,
        } = decl0.clone();
        // fp32 and fp16 tensors are cut finer than `partition_bytes`, compressed ones are not
        // (`cluster.max_chunk_payload_bytes`); column-wise tensors at column boundaries.
        let cut = tensor_cut(&params, len, &self.cfg.cut);
        let part = cut.chunk_bytes;
        let chunks = num_chunks(len, part);
        if chunks > MAX_CHUNKS_PER_TENSOR {
            let msg = format!(
                "tensor {name:?}: {len} elements make {chunks} chunks of at most {part} bytes, \
                 more than the limit of {MAX_CHUNKS_PER_TENSOR} chunks per tensor (split the \
                 tensor or raise cluster.partition_bytes and cluster.max_chunk_payload_bytes)"
            );
            tracing::warn!("declare failed: {msg}");
            let msg = FromScheduler::Declared {
                name,
                result: Err(msg),
            };
            return self.send_workers(self.all_ranks(), &msg);
        }
        // Servers are balanced by the bytes each chunk really carries: with compression, a
        // tensor below `min_compress_bytes` (raw fp32) weighs up to 32 times more per element
        // than its compressed neighbours.
        let mut trial = self.placer.clone();
        let mut placement = trial.place_cut(&name, len, &cut, params.clone());
        // The default: declaration order, earliest first.
        placement.priority = priority.unwrap_or_else(|| {
            i32::try_from(self.placed_count)
                .map(|n| -n)
                .unwrap_or(-i32::MAX)
        });
        if let Some(msg) = self.collision(&placement) {
            tracing::warn!("declare failed: {msg}");
            let msg = FromScheduler::Declared {
                name,
                result: Err(msg),
            };
            return self.send_workers(self.all_ranks(), &msg);
        }
        self.placer = trial;
        self.placed_count += 1;
        for (i, c) in placement.chunks.iter().enumerate() {
            self.key_owner.insert(c.key, (name.clone(), i));
        }
        tracing::info!(
            "tensor {name:?} declared: {} elements in {} chunks; asking {} servers to set it up",
            placement.len,
            placement.chunks.len(),
            self.cfg.num_servers
        );
        for s in 0..self.servers.len() {
            let conn = self.servers[s].conn;
            self.send(conn, FromScheduler::Placement(placement.clone()));
        }
        self.tensors.insert(
            name,
            TensorState::Placing {
                placement,
                requested: priority,
                acked: BTreeSet::new(),
                error: None,
                waiting: self.all_ranks().collect(),
            },
        );
    }

    /// An error naming both tensors if a chunk key of `p` is already used.
    pub(super) fn collision(&self, p: &TensorPlacement) -> Option<String> {
        let mut own: BTreeMap<u64, usize> = BTreeMap::new();
        for (i, c) in p.chunks.iter().enumerate() {
            if let Some((other, j)) = self.key_owner.get(&c.key) {
                return Some(format!(
                    "tensor {:?}: chunk {i} has key {:#018x}, which chunk {j} of tensor {other:?} \
                     already uses; rename one of the tensors",
                    p.name, c.key
                ));
            }
            if let Some(j) = own.insert(c.key, i) {
                return Some(format!(
                    "tensor {:?}: chunks {j} and {i} have the same key {:#018x}; rename the tensor",
                    p.name, c.key
                ));
            }
        }
        None
    }

    pub(super) fn on_ack(&mut self, server: u32, name: String, error: Option<String>) {
        let who = self.servers[server as usize].name.clone();
        let Some(TensorState::Placing {
            acked,
            error: first_error,
            ..
        }) = self.tensors.get_mut(&name)
        else {
            tracing::warn!(
                "{who} acknowledged tensor {name:?}, which is not being placed; ignored"
            );
            return;
        };
        acked.insert(server);
        if let (Some(e), None) = (error, &first_error) {
            tracing::warn!("{who} refused tensor {name:?}: {e}");
            *first_error = Some(format!("tensor {name:?}: {who} refused it: {e}"));
        }
        if acked.len() as u32 != self.cfg.num_servers {
            return;
        }
        let Some(TensorState::Placing {
            placement,
            requested,
            error,
            waiting,
            ..
        }) = self.tensors.remove(&name)
        else {
            unreachable!()
        };
        let result = match error {
            None => {
                self.tensors.insert(
                    name.clone(),
                    TensorState::Placed(placement.clone(), requested),
                );
                Ok(placement)
            }
            Some(e) => {
                for c in &placement.chunks {
                    self.key_owner.remove(&c.key);
                }
                Err(e)
            }
        };
        self.send_workers(waiting, &FromScheduler::Declared { name, result });
    }
}
