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
//! Tests compare a cluster's pulled results with it, and the built-in benchmark job checks
//! every round against it.

use pushpull_kernels::{
    average, CodecContext, CodecFactory, Compressor, KernelsFactory, Node, RankOrderSum, RoundCtx,
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
    /// `[rank][chunk]`.
    workers: Vec<Vec<Box<dyn Compressor>>>,
    /// `[chunk]`.
    servers: Vec<Box<dyn Compressor>>,
    round: u64,
    /// The last push_pull round.
    last_sum: Option<u64>,
}

/// Every worker and server of a job in one process (see the module docs).
pub struct Reference {
    config: Config,
    job_seed: u64,
    num_workers: u32,
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
        let c = &self.config.cluster;
        let part = pushpull_kernels::chunk::partition_bytes(
            &merged,
            len,
            (
                c.partition_bytes,
                c.chunk_payload_bound(),
                c.min_compress_bytes,
            ),
        );
        let placement = Placer::new(1, part).place(name, len, merged);
        // The same factory and context as a worker's declare and a server's placement.
        let build = |node: Node| -> Result<Vec<Box<dyn Compressor>>, String> {
            (0..placement.chunks.len())
                .map(|i| {
                    let ctx = CodecContext::new(&placement, i, self.job_seed, node, &self.config)
                        .expect("a chunk of the placement");
                    KernelsFactory.make(&ctx)
                })
                .collect()
        };
        let workers = (0..self.num_workers)
            .map(|rank| build(Node::Worker { rank }))
            .collect::<Result<Vec<_>, _>>()?;
        let servers = build(Node::Server { id: 0 })?;
        self.tensors.push(RefState {
            placement,
            workers,
            servers,
            round: 0,
            last_sum: None,
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
        let Some(round) = state.last_sum else { return };
        let chains = state.workers.iter_mut().flatten();
        for chain in chains.chain(&mut state.servers) {
            chain.undo(round);
        }
    }

    /// Sets the learning rate of the next rounds (see [`crate::Worker::set_learning_rate`]).
    pub fn set_learning_rate(&mut self, lr: f32) {
        self.lr = (lr.is_finite() && lr > 0.0).then_some(lr);
    }

    /// The placement-independent part of a declared tensor: name, length, agreed map, chunks.
    pub fn placement(&self, t: RefTensor) -> &TensorPlacement {
        &self.tensors[t.0].placement
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
        let lr = self.lr;
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
        let round = state.round;
        state.round += 1;
        state.last_sum = Some(round);
        let mut outputs = vec![vec![0.0f32; len]; w];
        let mut payload = Vec::new();
        let mut sum = Vec::new();
        for (c, chunk) in state.placement.chunks.iter().enumerate() {
            let range = chunk.offset as usize..(chunk.offset + chunk.len) as usize;
            let what = |who: String, e: pushpull_kernels::KernelError| {
                format!(
                    "tensor {:?} chunk {c} round {round}: {who}: {e}",
                    state.placement.name
                )
            };
            let ctx = RoundCtx {
                lr,
                ..RoundCtx::new(round)
            };
            sum.clear();
            sum.resize(range.len(), 0.0f32);
            let mut finite = true;
            let mut fold = RankOrderSum::new();
            for (r, input) in inputs.iter().enumerate() {
                match state.workers[r][c].compress(&input[range.clone()], &ctx, &mut payload) {
                    Ok(()) => {}
                    Err(e) if e.is_non_finite() => finite = false,
                    Err(e) => return Err(what(format!("rank {r} compress"), e)),
                }
                if !finite {
                    continue;
                }
                fold.add(state.servers[c].as_ref(), &payload, &ctx, &mut sum)
                    .map_err(|e| what(format!("server decompress of rank {r}"), e))?;
            }
            if finite {
                match state.servers[c].compress(&sum, &ctx, &mut payload) {
                    Ok(()) => {}
                    Err(e) if e.is_non_finite() => finite = false,
                    Err(e) => return Err(what("server compress".into(), e)),
                }
            }
            if !finite {
                for (r, out) in outputs.iter_mut().enumerate() {
                    state.workers[r][c].undo(round);
                    out[range.clone()].fill(f32::NAN);
                }
                continue;
            }
            for (r, out) in outputs.iter_mut().enumerate() {
                state.workers[r][c]
                    .decompress(&payload, &ctx, &mut out[range.clone()])
                    .map_err(|e| what(format!("rank {r} decompress"), e))?;
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
