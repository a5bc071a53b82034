//! The devices a Python worker's device rounds run on: the emulated device and one
//! [`CudaDevice`] per GPU, opened at first use ([`Devices`], [`Route`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use pushpull_worker::{CudaDevice, CudaError, Device, EmulatedDevice, GpuContext, WorkerError};

/// The devices a worker's device rounds run on, made at first use: the emulated one, and
/// one [`CudaDevice`] (its context's stream, its loaded kernels) per GPU.
#[derive(Default)]
pub(crate) struct Devices {
    emulated: Arc<EmulatedDevice>,
    cuda: Mutex<BTreeMap<usize, Arc<CudaDevice>>>,
}

/// Where a device round runs.
pub(crate) enum Route {
    Emulated(Arc<EmulatedDevice>),
    Cuda(Arc<CudaDevice>),
}

impl Devices {
    /// The device `name` names: `emulated` or `cuda:N`.
    pub(crate) fn get(&self, name: &str) -> Result<Route, WorkerError> {
        if name == "emulated" {
            return Ok(Route::Emulated(self.emulated.clone()));
        }
        let ordinal = name
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| {
                WorkerError::Config(format!(
                    "device {name:?}: expected \"emulated\" or \"cuda:N\""
                ))
            })?;
        let mut cuda = self.cuda.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = cuda.get(&ordinal) {
            return Ok(Route::Cuda(d.clone()));
        }
        let gpu = process_gpu(ordinal)
            .map_err(|e| WorkerError::Config(format!("opening {name} for device buffers: {e}")))?;
        let d = Arc::new(CudaDevice::new(gpu));
        cuda.insert(ordinal, d.clone());
        Ok(Route::Cuda(d))
    }

    /// Driver calls the worker's devices made so far.
    pub(crate) fn driver_calls(&self) -> u64 {
        let cuda = self.cuda.lock().unwrap_or_else(|p| p.into_inner());
        self.emulated.driver_calls() + cuda.values().map(|d| d.driver_calls()).sum::<u64>()
    }
}

/// The process's context on GPU `ordinal` (its primary context, the worker stream, the
/// kernels), opened on first use and never closed, whichever worker asked: torch's caching
/// allocator records events on that stream for every tensor that crossed it
/// (`record_stream` in `pushpull.torch`) when the tensor is freed, which can be during the
/// interpreter's shutdown, after every worker is gone (torch keeps its own streams for the
/// life of the process the same way). Closing it with the worker crashed such a process at
/// exit ("context is destroyed", seen on an H100).
fn process_gpu(ordinal: usize) -> Result<Arc<GpuContext>, CudaError> {
    static GPUS: Mutex<BTreeMap<usize, Arc<GpuContext>>> = Mutex::new(BTreeMap::new());
    let mut gpus = GPUS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(gpu) = gpus.get(&ordinal) {
        return Ok(gpu.clone());
    }
    let gpu = GpuContext::new(ordinal)?;
    gpus.insert(ordinal, gpu.clone());
    Ok(gpu)
}
