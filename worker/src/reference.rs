//! A single-process reference of a whole job's push_pull: what a cluster must produce, bit for
//! bit, computed without sockets, servers or tasks.
//!
//! [`Reference`] plays every worker and every server of a job in one loop, with the same
//! kernels in the same order and the same seeds as the real nodes: per chunk, each rank
//! compresses its slice with its own chain (worker role, its rank: momentum, error feedback,
//! codec), the "server" sums the payloads in rank order (the servers' [`RankOrderSum`]),
//! compresses the sum with its own chain (server role), and every rank decompresses
//! that payload with its own chain (then divides by the number of workers for
//! [`Reduce::Average`]). A chunk that some rank's chain refuses as not finite, or whose sum the
//! server's chain refuses so, comes back as NaN to every rank, every chain's round of it
//! undone, as a cluster's non-finite rounds do; [`Reference::discard_last_round`] undoes a
//! tensor's last round everywhere. Chunking, keys, parameter maps (config defaults overlaid with the
//! declared map) and the `min_compress_bytes` rule are the cluster's own
//! ([`pushpull_proto::placement`], [`pushpull_kernels::chunk::chunk_codec`]); nothing else is
//! shared with the worker's data path.
//!
//! With local groups (`cluster.local_size` G > 1, ARCHITECTURE.md "Two levels") each host's
//! members are first summed in local-rank order ([`host_fold`], after the tensor's
//! `intra_compressor`), and the job above is played with one "worker" per host: host `h`'s
//! chains are those of rank `h` of a flat job of `num_workers / G` workers, fed the host sums;
//! every member gets its host's decoding (and [`Reduce::Average`] divides by `num_workers`).
//! With a single host and `cluster.force_distributed` unset, the result is the host sum itself:
//! no chain, no server.
//!
//! [`Reference::gossip`] plays a round of decentralised averaging (`exchange = "gossip"`):
//! every rank encodes its slice with its chain, and every rank decodes its own message and
//! its neighbours' (the cluster's `[gossip]` mixing matrix) against its own values and
//! averages them ([`pushpull_kernels::gossip::average_step`]; with `exchange =
//! "gossip_direct"` against its own values in place of its own message); no server takes part.
//!
//! Tests compare a cluster's pulled results with it, and the built-in benchmark job checks
//! every round against it.

use pushpull_kernels::chunk::LowRankPlan;
use pushpull_kernels::{
    average, host_fold, CodecContext, CodecFactory, Compressor, IntraCodec, KernelsFactory, Node,
    PowerSgd, RankOrderSum, RoundCtx,
};
use pushpull_proto::placement::Placer;
use pushpull_proto::protocol::TensorPlacement;
use pushpull_proto::{Config, ParamMap};

use crate::tensor::Reduce;

/// A declared tensor of a [`Reference`] (an index into it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefTensor(usize);

struct RefState {
    placement: TensorPlacement,
    /// What each member rounds its gradient to before its host's sum.
    intra: IntraCodec,
    /// `[host][chunk]` (a host is a rank where `local_size` is 1); empty where the job
    /// finishes its reduction on its one host.
    hosts: Vec<Vec<Compressor>>,
    /// `[chunk]`.
    servers: Vec<Compressor>,
    round: u64,
    /// The last push_pull round.
    last_sum: Option<u64>,
    /// Each rank's gradient bound `G` (moniqua's `theta_schedule = bound`): the largest
    /// magnitude reported so far, 0 before any.
    grad_bound: Vec<f32>,
    /// A tensor PowerSGD compresses: its P and Q tensors and every rank's state.
    low_rank: Option<RefLowRank>,
}

/// A PowerSGD tensor of a [`Reference`]: the tensors its P and Q are summed as, and each
/// rank's state.
struct RefLowRank {
    p: RefTensor,
    q: RefTensor,
    ranks: Vec<PowerSgd>,
}

/// Every worker and server of a job in one process (see the module docs).
pub struct Reference {
    config: Config,
    job_seed: u64,
    num_workers: u32,
    /// Workers per host (`cluster.local_size`).
    local_size: u32,
    /// Whether chunks go through the servers (`ClusterConfig::uses_servers`).
    servers: bool,
    lr: Option<f32>,
    tensors: Vec<RefState>,
}

impl Reference {
    /// A job of `config.cluster.num_workers` workers with seed `job_seed`.
    pub fn new(config: &Config, job_seed: u64) -> Reference {
        Reference {
            config: config.clone(),
            job_seed,
            num_workers: config.cluster.num_workers,
            local_size: config.cluster.local_size.max(1),
            servers: config.cluster.uses_servers(),
            lr: None,
            tensors: Vec::new(),
        }
    }

    /// Declares a tensor: `params` overlay the config's `tensor_params(name)`, as
    /// [`crate::Worker::declare`] does.
    ///
    /// # Errors
    /// The kernels' message for a bad parameter map.
    pub fn declare(&mut self, name: &str, len: u64, params: ParamMap) -> Result<RefTensor, String> {
        let mut merged = self.config.tensor_params(name);
        pushpull_kernels::overlay_params(&mut merged, &params);
        let min = self.config.cluster.min_compress_bytes;
        let plan = pushpull_kernels::chunk::low_rank_plan(&merged, len, min)?;
        let t = self.declare_map(name, len, merged)?;
        if let Some(plan) = plan {
            // The worker's P and Q tensors.
            let [(p, p_len), (q, q_len)] = plan.sum_tensors(name);
            let p = self.declare_map(&p, p_len, LowRankPlan::sum_map())?;
            let q = self.declare_map(&q, q_len, LowRankPlan::sum_map())?;
            let key = self.tensors[t.0].placement.chunks[0].key;
            let ranks = (0..self.num_workers)
                .map(|_| plan.start(self.job_seed, key))
                .collect();
            self.tensors[t.0].low_rank = Some(RefLowRank { p, q, ranks });
        }
        Ok(t)
    }

    /// Declares a tensor with the map `merged` as it is.
    fn declare_map(&mut self, name: &str, len: u64, merged: ParamMap) -> Result<RefTensor, String> {
        // Cut as the scheduler cuts.
        let cut = pushpull_kernels::chunk::tensor_cut(&merged, len, &self.config.cluster.cut());
        let placement = Placer::new(1, cut.chunk_bytes).place_cut(name, len, &cut, merged);
        // The same factory and context as a worker's declare and a server's placement.
        let build = |node: Node| -> Result<Vec<Compressor>, String> {
            (0..placement.chunks.len())
                .map(|i| {
                    let ctx = CodecContext::new(&placement, i, self.job_seed, node, &self.config)
                        .expect("a chunk of the placement");
                    KernelsFactory.make(&ctx)
                })
                .collect()
        };
        let intra = pushpull_kernels::parse_params(&placement.params)
            .map_err(|e| e.to_string())?
            .intra;
        let (hosts, servers) = if self.servers {
            let hosts = (0..self.num_workers / self.local_size)
                .map(|rank| build(Node::Worker { rank }))
                .collect::<Result<Vec<_>, _>>()?;
            (hosts, build(Node::Server { id: 0 })?)
        } else {
            (Vec::new(), Vec::new())
        };
        self.tensors.push(RefState {
            placement,
            intra,
            hosts,
            servers,
            round: 0,
            last_sum: None,
            grad_bound: vec![0.0; self.num_workers as usize],
            low_rank: None,
        });
        Ok(RefTensor(self.tensors.len() - 1))
    }

    /// A broadcast of `t` in the cluster ([`crate::Worker::broadcast`]): it uses one round of
    /// the tensor, as a push_pull does, and changes no compressor state. Stochastic compressors
    /// draw from streams of the round number, so a job that broadcast before its push_pulls
    /// matches its reference only if the reference counts the broadcast too.
    pub fn broadcast(&mut self, t: RefTensor) {
        self.tensors[t.0].round += 1;
    }

    /// Discards `t`'s last push_pull round ([`crate::Worker::discard_last_round`] on every
    /// worker): every chain, workers' and servers', undoes it.
    pub fn discard_last_round(&mut self, t: RefTensor) {
        let state = &mut self.tensors[t.0];
        if let Some(low) = &mut state.low_rank {
            let low_rank = low.ranks[0].last_step_compressed();
            low.ranks.iter_mut().for_each(PowerSgd::discard);
            if low_rank {
                return;
            }
        }
        let Some(round) = state.last_sum else { return };
        let chains = state.hosts.iter_mut().flatten();
        for chain in chains.chain(&mut state.servers) {
            chain.undo(round);
        }
    }

    /// Rank `rank` reports a gradient of `t` (see [`crate::Worker::track_gradient`]: the
    /// largest magnitude so far is its `G`); values that are not finite are the worker's
    /// error, so here they are left out.
    pub fn track_gradient(&mut self, t: RefTensor, rank: u32, gradient: &[f32]) {
        let g = gradient
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f32, |m, v| m.max(v.abs()));
        let bound = &mut self.tensors[t.0].grad_bound[rank as usize];
        *bound = bound.max(g);
    }

    /// Sets the learning rate of the next rounds (see [`crate::Worker::set_learning_rate`]).
    pub fn set_learning_rate(&mut self, lr: f32) {
        self.lr = (lr.is_finite() && lr > 0.0).then_some(lr);
    }

    /// The placement-independent part of a declared tensor: name, length, agreed map, chunks.
    pub fn placement(&self, t: RefTensor) -> &TensorPlacement {
        &self.tensors[t.0].placement
    }

    /// One gossip round of `t` (declared with `exchange = "gossip"`): `inputs[r]` is rank r's
    /// model; returns every rank's average with its neighbours (see the module docs).
    ///
    /// # Errors
    /// A wrong number of inputs or a wrong length, a tensor that is summed, a job with local
    /// groups, or the kernels' message (a value that is not finite); the tensor's round
    /// counter still advances, as in a cluster.
    pub fn gossip(&mut self, t: RefTensor, inputs: &[Vec<f32>]) -> Result<Vec<Vec<f32>>, String> {
        let w = self.num_workers as usize;
        let graph = self.config.gossip.graph(&self.config.cluster)?;
        let state = &mut self.tensors[t.0];
        let round = state.round;
        state.round += 1;
        let len = state.placement.len as usize;
        if inputs.len() != w || inputs.iter().any(|x| x.len() != len) {
            return Err(format!("{w} inputs of {len} elements needed"));
        }
        let exchange = pushpull_kernels::parse_params(&state.placement.params)
            .map_or(pushpull_kernels::Exchange::PushPull, |s| s.exchange);
        let direct = exchange == pushpull_kernels::Exchange::GossipDirect;
        if !exchange.is_gossip() {
            return Err(format!(
                "tensor {:?} is summed: its map needs exchange = \"gossip\"",
                state.placement.name
            ));
        }
        let mut outputs = inputs.to_vec();
        let rho = self.config.gossip.matrix(self.num_workers)?.rho();
        // The learning rate last set (moniqua's `theta_schedule = lr` reads it), and each
        // rank's Theorem 2 bound from it and the rank's G (`theta_schedule = bound`).
        let lr = self.lr;
        let ctx_of = |r: usize| RoundCtx {
            lr,
            theta_bound: match (lr, state.grad_bound[r]) {
                (Some(lr), g) if g > 0.0 => Some(pushpull_kernels::gossip::theorem2_theta(
                    f64::from(lr),
                    f64::from(g),
                    w,
                    rho,
                )),
                _ => None,
            },
            ..RoundCtx::new(round)
        };
        for (c, chunk) in state.placement.chunks.iter().enumerate() {
            let range = chunk.offset as usize..(chunk.offset + chunk.len) as usize;
            let what = |r: usize, e: pushpull_kernels::KernelError| {
                format!(
                    "tensor {:?} chunk {c} round {round}: rank {r}: {e}",
                    state.placement.name
                )
            };
            let mut payloads = Vec::with_capacity(w);
            for (r, x) in inputs.iter().enumerate() {
                let mut p = Vec::new();
                state.hosts[r][c]
                    .compress(&x[range.clone()], &ctx_of(r), &mut p)
                    .map_err(|e| what(r, e))?;
                payloads.push(p);
            }
            for (i, x) in inputs.iter().enumerate() {
                let x = &x[range.clone()];
                let at = ctx_of(i).with_reference(x);
                let decode = |p: &[u8]| -> Result<Vec<f32>, String> {
                    let mut v = vec![0.0f32; x.len()];
                    state.hosts[i][c]
                        .decompress(p, &at, &mut v)
                        .map_err(|e| what(i, e))?;
                    Ok(v)
                };
                // Equation 4 (`gossip_direct`) keeps the rank's exact values.
                let own = if direct {
                    x.to_vec()
                } else {
                    decode(&payloads[i])?
                };
                let theirs = graph[i]
                    .iter()
                    .map(|&(j, wij)| Ok((wij, decode(&payloads[j as usize])?)))
                    .collect::<Result<Vec<_>, String>>()?;
                let views: Vec<(f64, &[f32])> =
                    theirs.iter().map(|(wij, v)| (*wij, &v[..])).collect();
                pushpull_kernels::gossip::average_step(
                    x,
                    &own,
                    &views,
                    &mut outputs[i][range.clone()],
                );
            }
        }
        Ok(outputs)
    }

    /// One round of `t`: `inputs[r]` is rank r's buffer; returns every rank's result.
    ///
    /// # Errors
    /// A wrong number of inputs or a wrong length, or the kernels' message when a chain
    /// refuses the data for another reason than its not being finite; the tensor's round
    /// counter still advances, as in a cluster.
    pub fn push_pull(
        &mut self,
        t: RefTensor,
        inputs: &[Vec<f32>],
        reduce: Reduce,
    ) -> Result<Vec<Vec<f32>>, String> {
        let w = self.num_workers as usize;
        let state = &mut self.tensors[t.0];
        let len = state.placement.len as usize;
        if inputs.len() != w {
            return Err(format!("{} inputs for {w} workers", inputs.len()));
        }
        if let Some((r, x)) = inputs.iter().enumerate().find(|(_, x)| x.len() != len) {
            return Err(format!(
                "rank {r}: {} elements for a tensor of {len}",
                x.len()
            ));
        }
        if let Some(mut low) = state.low_rank.take() {
            let result = self.low_rank_step(t, &mut low, inputs, reduce);
            self.tensors[t.0].low_rank = Some(low);
            return result;
        }
        self.sum_round(t, inputs, reduce)
    }

    /// A step of a PowerSGD tensor (the worker's `low_rank` module): before `start_iter`, a
    /// round of the tensor; then every rank's P summed as a round of the P tensor, every Q as
    /// a round of the Q tensor.
    fn low_rank_step(
        &mut self,
        t: RefTensor,
        low: &mut RefLowRank,
        inputs: &[Vec<f32>],
        reduce: Reduce,
    ) -> Result<Vec<Vec<f32>>, String> {
        if !low.ranks[0].compressing() {
            let out = self.sum_round(t, inputs, reduce)?;
            low.ranks.iter_mut().for_each(PowerSgd::plain_step);
            return Ok(out);
        }
        let ps: Vec<Vec<f32>> = low
            .ranks
            .iter_mut()
            .zip(inputs)
            .map(|(s, x)| s.begin(x))
            .collect();
        let p_sums = self.push_pull(low.p, &ps, Reduce::Sum)?;
        let qs: Vec<Vec<f32>> = low
            .ranks
            .iter_mut()
            .zip(&p_sums)
            .map(|(s, p)| s.middle(p))
            .collect();
        let q_sums = self.push_pull(low.q, &qs, Reduce::Sum)?;
        let average = reduce == Reduce::Average;
        let mut outputs = vec![vec![0.0f32; inputs[0].len()]; inputs.len()];
        for ((s, q), out) in low.ranks.iter_mut().zip(&q_sums).zip(&mut outputs) {
            s.finish(q, self.num_workers, average, out);
        }
        Ok(outputs)
    }

    /// One round of `t` itself, its inputs checked.
    fn sum_round(
        &mut self,
        t: RefTensor,
        inputs: &[Vec<f32>],
        reduce: Reduce,
    ) -> Result<Vec<Vec<f32>>, String> {
        let w = self.num_workers as usize;
        let lr = self.lr;
        let state = &mut self.tensors[t.0];
        let len = state.placement.len as usize;
        let round = state.round;
        state.round += 1;
        state.last_sum = Some(round);
        let g = self.local_size as usize;
        let mut outputs = vec![vec![0.0f32; len]; w];
        let mut payload = Vec::new();
        let mut sum = Vec::new();
        let mut host_sums: Vec<Vec<f32>> = vec![Vec::new(); w / g];
        let who = if g == 1 { "rank" } else { "host" };
        for (c, chunk) in state.placement.chunks.iter().enumerate() {
            let range = chunk.offset as usize..(chunk.offset + chunk.len) as usize;
            let what = |who: String, e: pushpull_kernels::KernelError| {
                format!(
                    "tensor {:?} chunk {c} round {round}: {who}: {e}",
                    state.placement.name
                )
            };
            // Each host's sum of its members, in local-rank order (a host is a rank where
            // `local_size` is 1: its "sum" is its input, untouched).
            for (h, host_sum) in host_sums.iter_mut().enumerate() {
                host_sum.clear();
                host_sum.resize(range.len(), 0.0);
                let members = &inputs[h * g..(h + 1) * g];
                if g == 1 {
                    host_sum.copy_from_slice(&members[0][range.clone()]);
                    continue;
                }
                for (l, x) in members.iter().enumerate() {
                    host_fold(state.intra, l == 0, &x[range.clone()], host_sum);
                }
            }
            let results = |outputs: &mut [Vec<f32>], h: usize, x: &[f32]| {
                for out in &mut outputs[h * g..(h + 1) * g] {
                    out[range.clone()].copy_from_slice(x);
                }
            };
            if !self.servers {
                // One host, no server: the host sum is the result.
                results(&mut outputs, 0, &host_sums[0]);
                continue;
            }
            let ctx = RoundCtx {
                lr,
                ..RoundCtx::new(round)
            };
            sum.clear();
            sum.resize(range.len(), 0.0f32);
            let mut finite = true;
            let mut fold = RankOrderSum::new();
            for (h, input) in host_sums.iter().enumerate() {
                match state.hosts[h][c].compress(input, &ctx, &mut payload) {
                    Ok(()) => {}
                    Err(e) if e.is_non_finite() => finite = false,
                    Err(e) => return Err(what(format!("{who} {h} compress"), e)),
                }
                if !finite {
                    continue;
                }
                fold.add(&state.servers[c], &payload, &ctx, &mut sum)
                    .map_err(|e| what(format!("server decompress of {who} {h}"), e))?;
            }
            if finite {
                match state.servers[c].compress(&sum, &ctx, &mut payload) {
                    Ok(()) => {}
                    Err(e) if e.is_non_finite() => finite = false,
                    Err(e) => return Err(what("server compress".into(), e)),
                }
            }
            if !finite {
                sum.fill(f32::NAN);
                for (h, chains) in state.hosts.iter_mut().enumerate() {
                    chains[c].undo(round);
                    results(&mut outputs, h, &sum);
                }
                continue;
            }
            for (h, chains) in state.hosts.iter().enumerate() {
                // Each host's owner decodes; its members copy (the same bits).
                chains[c]
                    .decompress(&payload, &ctx, &mut sum)
                    .map_err(|e| what(format!("{who} {h} decompress"), e))?;
                results(&mut outputs, h, &sum);
            }
        }
        if reduce == Reduce::Average {
            for out in &mut outputs {
                average(out, self.num_workers);
            }
        }
        Ok(outputs)
    }
}
