//! Declaring tensors: [`Worker::declare`] (a collective through the scheduler, which places
//! the chunks), the tensor's registration (one codec per chunk from the codec factory, the
//! gossip row, the local group's share) and the lookups by name.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use pushpull_kernels::{CodecContext, Node};
use pushpull_proto::protocol::ToScheduler;
use pushpull_proto::ParamMap;

use super::{lock, Worker};
use crate::chunks::chunk_ranges;
use crate::error::WorkerError;
use crate::tensor::{Tensor, TensorInner};

impl Worker {
    /// Declares tensor `name` of `len` f32 elements, a collective: returns once every worker of
    /// the job has declared `name`, with the placement the scheduler chose.
    ///
    /// The parameter map sent is the config's `tensor_params(name)` (`[tensors.default]`
    /// overlaid with `[tensors."name"]`) overlaid with `params`, where a key of `params` replaces
    /// its setting whatever the spelling in the file (`byteps_compressor_type` replaces
    /// `compressor`; [`pushpull_kernels::overlay_params`]); every worker must end up with the
    /// same map and length. Declaring a name again with the same length and parameters
    /// returns the same tensor (same round counter).
    ///
    /// The tensor's priority is the default, declaration order: the n-th tensor the scheduler
    /// places gets priority `-n`, so tensors declared earlier are sent first (see
    /// [`Worker::declare_with_priority`] and [`Tensor::priority`]).
    ///
    /// A tensor PowerSGD compresses (`compressor = "powersgd"`, docs/compression.md) declares
    /// two more with it, `NAME#powersgd.p` and `NAME#powersgd.q`, which its steps' P and Q are
    /// summed as; a `rows`, `pieces` or `rank` that does not fit `len` fails every worker's
    /// declare before the scheduler is asked.
    ///
    /// Dropping the future before it resolves is harmless: the declare message is already
    /// sent whole; a later `declare` of the same name picks up the answer.
    ///
    /// # Errors
    /// [`WorkerError::Declare`] when the workers disagree (the message names the tensor and
    /// both values) or a server refused the tensor; [`WorkerError::Placement`] when the
    /// placement can't be used here or the codec factory refused a chunk; a fatal error if the
    /// job failed.
    pub async fn declare(
        &self,
        name: &str,
        len: u64,
        params: ParamMap,
    ) -> Result<Tensor, WorkerError> {
        self.declare_inner(name, len, params, None).await
    }

    /// [`Worker::declare`] with an explicit `priority`: this tensor's pushes (on every worker)
    /// and results (on every server) leave each connection before those of tensors with a
    /// lower priority, and after those of tensors with a higher one; equal priorities go in
    /// the order they became ready. Every worker must declare the tensor with the same
    /// priority, or every declare fails naming the tensor and both values.
    ///
    /// The default priorities (declaration order) are 0, -1, -2, …; explicit ones may be any
    /// `i32`, e.g. `-(layer index)`.
    ///
    /// # Errors
    /// As [`Worker::declare`].
    pub async fn declare_with_priority(
        &self,
        name: &str,
        len: u64,
        params: ParamMap,
        priority: i32,
    ) -> Result<Tensor, WorkerError> {
        self.declare_inner(name, len, params, Some(priority)).await
    }

    async fn declare_inner(
        &self,
        name: &str,
        len: u64,
        params: ParamMap,
        priority: Option<i32>,
    ) -> Result<Tensor, WorkerError> {
        let mut merged = self.inner.config.tensor_params(name);
        pushpull_kernels::overlay_params(&mut merged, &params);
        let min = self.inner.config.cluster.min_compress_bytes;
        let low_rank =
            pushpull_kernels::chunk::low_rank_plan(&merged, len, min).map_err(|message| {
                WorkerError::Declare {
                    name: name.to_string(),
                    message,
                }
            })?;
        let placement = self.place(name, len, merged, priority).await?;
        let low_rank = match low_rank {
            Some(plan) => Some(self.declare_low_rank(&placement, plan).await?),
            None => None,
        };
        self.register_tensor(placement, low_rank, false)
    }

    /// Declares tensor `name` with the map `merged` as it is (no overlay) with the scheduler:
    /// the placement every worker agreed on.
    pub(super) async fn place(
        &self,
        name: &str,
        len: u64,
        merged: ParamMap,
        priority: Option<i32>,
    ) -> Result<pushpull_proto::protocol::TensorPlacement, WorkerError> {
        let shared = &self.inner.shared;
        shared.check()?;
        let (rx, first) = lock(&shared.pending).wait_declare(name)?;
        if first {
            shared.send(ToScheduler::Declare {
                name: name.to_string(),
                len,
                params: merged.clone(),
                priority,
            })?;
        }
        let answer = rx.await.map_err(|_| {
            shared
                .state()
                .fatal
                .unwrap_or_else(|| WorkerError::Internal("declare waiter dropped".into()))
        })?;
        let placement = answer?.map_err(|message| WorkerError::Declare {
            name: name.to_string(),
            message,
        })?;
        if placement.name != name
            || placement.len != len
            || placement.params != merged
            || priority.is_some_and(|p| p != placement.priority)
        {
            return Err(WorkerError::Declare {
                name: name.to_string(),
                message: format!(
                    "the scheduler answered with {} elements, parameters {:?} and priority {}, but this call declared {len} elements with {merged:?} and priority {} (concurrent declares of one name must agree)",
                    placement.len,
                    placement.params,
                    placement.priority,
                    priority.map_or("(default)".to_string(), |p| p.to_string())
                ),
            });
        }
        Ok(placement)
    }

    pub(super) fn register_tensor(
        &self,
        placement: pushpull_proto::protocol::TensorPlacement,
        low_rank: Option<crate::tensor::LowRank>,
        low_rank_part: bool,
    ) -> Result<Tensor, WorkerError> {
        let mut tensors = lock(&self.inner.tensors);
        let name = placement.name.clone();
        let bad = |message: String| WorkerError::Placement {
            name: name.clone(),
            message,
        };
        if let Some(t) = tensors.get(&name) {
            return if t.inner.placement == placement {
                Ok(t.clone())
            } else {
                Err(bad(
                    "already declared on this worker with another placement".into(),
                ))
            };
        }
        let num_servers = self.num_servers();
        let ranges = chunk_ranges(placement.len, &placement.chunks, num_servers).map_err(bad)?;
        let gossip = crate::gossip::row(&self.inner.config, self.inner.rank, &placement.params)
            .map_err(bad)?;
        let bound =
            crate::gradient_bound::bound(&self.inner.config, gossip.is_some()).map_err(bad)?;
        let factory = lock(&self.inner.codec_factory).clone();
        let mut codecs = Vec::with_capacity(placement.chunks.len());
        for (i, (c, r)) in placement.chunks.iter().zip(&ranges).enumerate() {
            let ctx = CodecContext {
                tensor: &placement,
                chunk: c,
                chunk_index: i as u32,
                job_seed: self.inner.map.job_seed,
                // In a local group the chains are the host's: rank h of a flat job of hosts.
                node: Node::Worker {
                    rank: self.inner.rank / self.inner.config.cluster.local_size.max(1),
                },
                config: &self.inner.config,
            };
            let codec = factory
                .make(&ctx)
                .map_err(|e| bad(format!("the codec factory refused chunk {i}: {e}")))?;
            if codec.len() != r.end - r.start {
                return Err(bad(format!(
                    "the codec of chunk {i} is for {} elements, the chunk has {}",
                    codec.len(),
                    r.end - r.start
                )));
            }
            codecs.push(Mutex::new(codec));
        }
        let tensor = Tensor {
            inner: Arc::new(TensorInner {
                trace_name: pushpull_net::timeline::Name::new(&placement.name),
                placement,
                ranges,
                codecs,
                residence: Mutex::new(crate::tensor::Residence::new()),
                round: Arc::default(),
                rounds_started: AtomicU64::new(0),
                first_round: AtomicU64::new(0),
                bytes_pushed: AtomicU64::new(0),
                bytes_pulled: AtomicU64::new(0),
                rounds_done: AtomicU64::new(0),
                round_clock: Default::default(),
                rounds_non_finite: AtomicU64::new(0),
                compress_nanos: AtomicU64::new(0),
                wait_nanos: AtomicU64::new(0),
                decompress_nanos: AtomicU64::new(0),
                gossip,
                bound,
                low_rank_part,
                low_rank,
            }),
        };
        if let Some(local) = &self.inner.local {
            local.place(&tensor.inner)?;
        }
        tensors.insert(name, tensor.clone());
        Ok(tensor)
    }

    /// Whether tensor `name` of `len` elements, declared with `params` (overlaid on the
    /// config's map as [`Worker::declare`] does), would be summed as plain float32
    /// ([`pushpull_kernels::CompressorSpec::is_plain`]): uncompressed by its map or because it
    /// is under `cluster.min_compress_bytes`, with no error feedback, momentum, intra-host
    /// rounding or gossip. A map the codecs refuse is not plain (its declare names the
    /// problem). Declares nothing.
    pub fn is_plain(&self, name: &str, len: u64, params: &ParamMap) -> bool {
        self.effective_spec(name, len, params)
            .is_some_and(|s| s.is_plain())
    }

    /// The compressor tensor `name` of `len` elements would run, declared with `params`
    /// (overlaid on the config's map as [`Worker::declare`] does), as its canonical map
    /// ([`pushpull_kernels::CompressorSpec::to_params`]: short keys, defaults filled in;
    /// `compressor = "none"` and no error feedback under `cluster.min_compress_bytes`).
    /// `None` for a map the codecs refuse (its declare names the problem). Declares nothing.
    pub fn effective_params(&self, name: &str, len: u64, params: &ParamMap) -> Option<ParamMap> {
        self.effective_spec(name, len, params)
            .map(|s| s.to_params())
    }

    fn effective_spec(
        &self,
        name: &str,
        len: u64,
        params: &ParamMap,
    ) -> Option<pushpull_kernels::CompressorSpec> {
        let mut merged = self.inner.config.tensor_params(name);
        pushpull_kernels::overlay_params(&mut merged, params);
        let min = self.inner.config.cluster.min_compress_bytes;
        pushpull_kernels::chunk::effective_spec(&merged, len, min).ok()
    }

    /// Whether a tensor of `len` elements is under `cluster.min_compress_bytes`, so that it
    /// travels uncompressed whatever its map's codec.
    pub fn is_small(&self, len: u64) -> bool {
        pushpull_kernels::chunk::is_small(len, self.inner.config.cluster.min_compress_bytes)
    }

    /// The tensor declared under `name` on this worker.
    ///
    /// # Errors
    /// [`WorkerError::Undeclared`] naming it.
    pub fn tensor(&self, name: &str) -> Result<Tensor, WorkerError> {
        lock(&self.inner.tensors)
            .get(name)
            .cloned()
            .ok_or_else(|| WorkerError::Undeclared {
                name: name.to_string(),
            })
    }

    pub(super) fn check_tensor(&self, tensor: &Tensor) -> Result<(), WorkerError> {
        match lock(&self.inner.tensors).get(tensor.name()) {
            Some(t) if Arc::ptr_eq(&t.inner, &tensor.inner) => Ok(()),
            _ => Err(WorkerError::Undeclared {
                name: tensor.name().to_string(),
            }),
        }
    }
}
