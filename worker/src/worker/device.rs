//! [`Worker::push_pull_device`], [`Worker::push_pull_group_device`] and
//! [`Worker::broadcast_device`]: rounds over tensors in a device's memory (see the module docs
//! of `crate::data` and [`pushpull_kernels::device`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use pushpull_kernels::cuda::{Device as Place, DevicePref};
use pushpull_kernels::device::Device;

use super::{RoundHandle, Worker};
use crate::core::RoundKind;
use crate::data::{ChainSetup, DeviceData, HostData};
use crate::error::WorkerError;
use crate::tensor::{Reduce, Tensor};

impl Worker {
    /// [`Worker::push_pull`] of a tensor in device memory: `mem` (on `device`) is replaced by
    /// the sum or average in place and handed back, bit for bit what the host path gives.
    ///
    /// The chunks are compressed on the device by the chains of the tensor's parameter map
    /// ([`pushpull_kernels::device::DeviceTensor`]: error feedback and momentum state live on
    /// the device), all of them with a dozen driver calls, and only the compressed payloads
    /// are copied to the host and pushed; the results are copied to the device and decoded
    /// there into `mem`. Compressors without a device kernel (top-k, column-wise onebit,
    /// Elias-coded dithering), and every chunk when a custom [`crate::CodecFactory`] is set,
    /// or in a local group, go through a host copy of the tensor (copied in once a round, the
    /// results copied back once) and use its CPU codec. With `worker.device = "cpu"` the
    /// whole tensor is copied to the host, reduced there, and copied back.
    /// [`crate::Tensor::metrics`] says where each round compressed.
    ///
    /// Work is ordered on the device's stream: hand in a device whose stream is the one your
    /// gradients are computed on (e.g. `CudaDevice::new(GpuContext::with_stream(s)?)`, feature
    /// `cuda`), or order that stream before it, and compression starts after them; the result
    /// is ordered before later work on the device's stream. `mem` is owned by the round until
    /// it completes, so dropping the returned future never leaves a round writing into freed
    /// memory (the round finishes in the background, as on the host). To order another stream
    /// after rounds without the host waiting for them, take a ticket ([`Device::ticket`]),
    /// make that stream wait for it ([`Device::wait_ticket`]) and signal it
    /// ([`Device::signal`]) once the rounds' futures have resolved, whatever their outcome
    /// (`pushpull.torch`'s ordered step does this).
    ///
    /// # Errors
    /// As [`Worker::push_pull`], plus [`WorkerError::Device`] (nothing sent, no round used)
    /// when the tensor's push_pull rounds so far ran elsewhere (on host buffers, or another
    /// device: its compressor state lives there) or the device failed before the round (an
    /// allocation of its state names the bytes asked for), and [`WorkerError::Codec`] naming
    /// the chunk when it fails during the round.
    pub async fn push_pull_device<D: Device>(
        &self,
        tensor: &Tensor,
        device: &Arc<D>,
        mem: D::Mem,
        op: Reduce,
    ) -> Result<D::Mem, WorkerError> {
        let kind = RoundKind::Sum {
            average: op == Reduce::Average,
        };
        self.submit_device(tensor, device, mem, kind).await
    }

    /// [`Worker::push_pull_device`] of every `(tensor, buffer)` of `calls` (all on `device`),
    /// started together as [`Worker::push_pull_group`] starts host buffers (the chunks leave
    /// in the tensors' priority order), and compressed on the device as **one batch**: each
    /// step of the chains is one driver call for every chunk of every tensor, so a step's
    /// gradients cost a dozen driver calls, not a dozen per tensor. Hand in a step's
    /// gradients (or DDP-sized buckets of them) this way. Returns once the batch's payloads
    /// are on the host and every round has started (a device still busy with work queued
    /// before the batch delays this call, and these rounds, but no other tensor's).
    ///
    /// # Errors
    /// Per handle, those of [`Worker::push_pull_device`] and [`Worker::push_pull_group_into`].
    pub async fn push_pull_group_device<D: Device>(
        &self,
        calls: Vec<(Tensor, D::Mem)>,
        device: &Arc<D>,
        op: Reduce,
    ) -> Vec<RoundHandle<D::Mem>> {
        if self.host_only() {
            return self.group_on_host(calls, device, op).await;
        }
        let setup = self.chain_setup();
        let calls = calls
            .into_iter()
            .map(|(t, mem)| (t, DeviceData::owned(device.clone(), mem, setup)))
            .collect();
        self.group(calls, op)
            .await
            .into_iter()
            .map(|h| h.map(DeviceData::into_keep))
            .collect()
    }

    /// [`Worker::push_pull_group_device`] over memory borrowed by address: `(tensor, address,
    /// elements, keep)`, `keep` holding the memory alive and handed back (e.g. a framework's
    /// tensor object). Under `worker.device = "cpu"` every entry is refused (the caller copies
    /// to the host instead: see [`Worker::cuda_route`]).
    ///
    /// # Safety
    /// Each address addresses that many f32 of `device`'s memory, which its `keep` keeps alive
    /// and which nothing else reads or writes until the round's handle has resolved and the
    /// device's work on it has completed (later work on the device's stream is ordered after
    /// it).
    pub async unsafe fn push_pull_group_borrowed<D: Device, K: Send + 'static>(
        &self,
        calls: Vec<(Tensor, u64, usize, K)>,
        device: &Arc<D>,
        op: Reduce,
    ) -> Vec<RoundHandle<K>> {
        if self.host_only() {
            return calls
                .into_iter()
                .map(|(t, ..)| {
                    let e = WorkerError::Config(format!(
                        "tensor {:?}: worker.device = \"cpu\" reduces device memory on the host, \
                         so it cannot be lent by address: copy it to the host",
                        t.name()
                    ));
                    RoundHandle::new(async move { Err(e) })
                })
                .collect();
        }
        let setup = self.chain_setup();
        let calls = calls
            .into_iter()
            .map(|(t, addr, len, keep)| {
                // SAFETY: the caller's contract.
                let data = unsafe { DeviceData::borrowed(device.clone(), addr, len, keep, setup) };
                (t, data)
            })
            .collect();
        self.group(calls, op)
            .await
            .into_iter()
            .map(|h| h.map(DeviceData::into_keep))
            .collect()
    }

    /// [`Worker::broadcast`] of a tensor in device memory (the root's data is copied to the
    /// host and pushed as raw fp32; every worker's `mem` receives it). Errors as
    /// [`Worker::push_pull_device`] and [`Worker::broadcast`].
    pub async fn broadcast_device<D: Device>(
        &self,
        tensor: &Tensor,
        device: &Arc<D>,
        mem: D::Mem,
        root: u32,
    ) -> Result<D::Mem, WorkerError> {
        self.check_root(tensor, root)?;
        self.submit_device(tensor, device, mem, RoundKind::Broadcast { root })
            .await
    }

    /// `worker.device = "cpu"`: device buffers are copied to the host and reduced there.
    fn host_only(&self) -> bool {
        self.inner.device == DevicePref::Cpu
    }

    /// Where a round over a buffer in the memory of CUDA device `ordinal` is reduced, as
    /// `worker.device` says: on that GPU (`Some`, with `auto`, or `cuda:N` naming it), or copied
    /// to the host (`None`, with `cpu`). A buffer on another GPU than the one `worker.device`
    /// names is refused, naming both.
    pub fn cuda_route(&self, ordinal: usize) -> Result<Option<Place>, WorkerError> {
        cuda_route(self.inner.device, ordinal).map_err(WorkerError::Config)
    }

    fn chain_setup(&self) -> ChainSetup {
        ChainSetup {
            job_seed: self.inner.map.job_seed,
            rank: self.inner.rank,
            min_compress_bytes: self.inner.config.cluster.min_compress_bytes,
            custom_factory: self.inner.custom_factory.load(Ordering::Relaxed),
            local_group: self.inner.local.is_some(),
        }
    }

    async fn submit_device<D: Device>(
        &self,
        tensor: &Tensor,
        device: &Arc<D>,
        mem: D::Mem,
        kind: RoundKind,
    ) -> Result<D::Mem, WorkerError> {
        if self.host_only() {
            self.check_tensor(tensor)?;
            let host = to_host(tensor, device.as_ref(), &mem)?;
            let host = self.submit(tensor, HostData(host), kind).await?.0;
            return from_host(tensor, device.as_ref(), mem, &host);
        }
        let data = DeviceData::owned(device.clone(), mem, self.chain_setup());
        self.submit(tensor, data, kind).await?.into_keep()
    }

    /// `worker.device = "cpu"`: a group of device buffers reduced as host copies.
    async fn group_on_host<D: Device>(
        &self,
        calls: Vec<(Tensor, D::Mem)>,
        device: &Arc<D>,
        op: Reduce,
    ) -> Vec<RoundHandle<D::Mem>> {
        let mut copies = Vec::with_capacity(calls.len());
        let mut host = Vec::with_capacity(calls.len());
        for (t, mem) in calls {
            match to_host(&t, device.as_ref(), &mem) {
                Ok(copy) => {
                    host.push((t.clone(), copy));
                    copies.push(Ok((t, mem)));
                }
                Err(e) => copies.push(Err(e)),
            }
        }
        let mut handles = self.push_pull_group(host, op).await.into_iter();
        copies
            .into_iter()
            .map(|c| match (c, handles.next()) {
                (Ok((t, mem)), Some(h)) => {
                    let device = device.clone();
                    RoundHandle::new(async move { from_host(&t, device.as_ref(), mem, &h.await?) })
                }
                (Err(e), _) => RoundHandle::new(async move { Err(e) }),
                (Ok(_), None) => RoundHandle::new(async move {
                    Err(WorkerError::Internal(
                        "a group call's entry was lost".into(),
                    ))
                }),
            })
            .collect()
    }
}

/// [`Worker::cuda_route`] under `worker.device = pref`.
fn cuda_route(pref: DevicePref, ordinal: usize) -> Result<Option<Place>, String> {
    let on = Place::Cuda { ordinal };
    let wanted = match pref {
        DevicePref::Cpu => return Ok(None),
        DevicePref::Auto => return Ok(Some(on)),
        DevicePref::Cuda => 0,
        DevicePref::CudaOrdinal(n) => n,
    };
    if wanted == ordinal {
        Ok(Some(on))
    } else {
        Err(format!(
            "worker.device = \"{pref}\" names cuda:{wanted}, but a buffer on {on} was handed in: \
             hand in buffers on cuda:{wanted}, or set worker.device = \"auto\""
        ))
    }
}

fn copy_error<D: Device>(tensor: &Tensor, device: &D, e: impl std::fmt::Display) -> WorkerError {
    WorkerError::Device {
        name: tensor.name().to_string(),
        message: format!("copying between {} and the host: {e}", device.place()),
    }
}

/// A host copy of `mem` (`worker.device = "cpu"`).
fn to_host<D: Device>(tensor: &Tensor, device: &D, mem: &D::Mem) -> Result<Vec<f32>, WorkerError> {
    let mut host = vec![0.0f32; device.mem_len(mem)];
    // SAFETY: `mem` holds that many elements.
    unsafe { device.download(device.mem_addr(mem), &mut host) }
        .map_err(|e| copy_error(tensor, device, e))?;
    Ok(host)
}

/// `mem` overwritten with `host` (`worker.device = "cpu"`).
fn from_host<D: Device>(
    tensor: &Tensor,
    device: &D,
    mem: D::Mem,
    host: &[f32],
) -> Result<D::Mem, WorkerError> {
    if host.len() != device.mem_len(&mem) {
        return Err(copy_error(tensor, device, "the lengths differ"));
    }
    tensor.inner.residence().buffer_on = device.place();
    // SAFETY: `mem` holds host.len() elements.
    unsafe { device.upload(host, device.mem_addr(&mem)) }
        .map_err(|e| copy_error(tensor, device, e))?;
    Ok(mem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_buffers_go_where_worker_device_says() {
        let cuda = |n| Some(Place::Cuda { ordinal: n });
        assert_eq!(cuda_route(DevicePref::Auto, 3), Ok(cuda(3)));
        assert_eq!(cuda_route(DevicePref::Cpu, 3), Ok(None));
        assert_eq!(cuda_route(DevicePref::Cuda, 0), Ok(cuda(0)));
        assert_eq!(cuda_route(DevicePref::CudaOrdinal(2), 2), Ok(cuda(2)));
        let e = cuda_route(DevicePref::CudaOrdinal(1), 0).unwrap_err();
        assert!(
            e.contains("\"cuda:1\"") && e.contains("cuda:0") && e.contains("auto"),
            "{e}"
        );
        assert!(cuda_route(DevicePref::Cuda, 1)
            .unwrap_err()
            .contains("names cuda:0"));
    }
}
