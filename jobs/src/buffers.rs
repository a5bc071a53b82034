//! Where the benchmark job's tensors live (`job.buffers`) and how one round reduces them.
//!
//! [`Rounds`] is what [`crate::benchmark`]'s round loop needs: prepare the inputs (not
//! timed), run one round of every tensor's push_pull with all calls in flight together, and
//! show a result on the host for the checks. [`HostRounds`] keeps fp32 tensors in host memory
//! and reduces them out of place (`push_pull_into`, or one `push_pull_group_into`);
//! [`DeviceRounds`] keeps them in a [`Device`]'s memory (a CUDA GPU, or the host-emulated
//! device) and reduces them in place with `push_pull_device` (or one `push_pull_group_device`:
//! one batch on the device), after copying each tensor's input into its work buffer.

use std::sync::Arc;
use std::time::Instant;

use futures_util::stream::{FuturesUnordered, StreamExt};
use pushpull_worker::{Device, Reduce, Tensor, Worker};

use pushpull_node::error::{CliError, CliResult};

/// One round's calls, made all at once, in `order` (indices into the job's tensors).
pub struct RoundPlan<'a> {
    /// The job's tensors, in declaration order.
    pub tensors: &'a [Tensor],
    /// The order the calls are made in.
    pub order: &'a [usize],
    /// One grouped call instead of separate calls.
    pub group: bool,
    /// When the round started (for the time to first layer).
    pub start: Instant,
}

/// A round's outcome: the seconds into the round at which tensor 0's result arrived, or the
/// first failure (the tensor, where one failed, and the error).
pub type RoundOutcome = Result<f64, (Option<usize>, String)>;

/// A round's calls as they end: when tensor 0's result arrived, and the first failure.
#[derive(Default)]
struct Tally {
    first_tensor: f64,
    failed: Option<(Option<usize>, String)>,
}

impl Tally {
    /// Tensor `i`'s call ended `at` seconds into the round; its buffer, if it came back.
    fn record<T, E: std::fmt::Display>(&mut self, i: usize, r: Result<T, E>, at: f64) -> Option<T> {
        if i == 0 {
            self.first_tensor = at;
        }
        r.map_err(|e| self.fail(Some(i), e.to_string())).ok()
    }

    fn fail(&mut self, tensor: Option<usize>, message: String) {
        self.failed.get_or_insert((tensor, message));
    }

    fn outcome(self) -> RoundOutcome {
        self.failed.map_or(Ok(self.first_tensor), Err)
    }
}

/// The job's tensors in some memory, reduced one round at a time.
pub trait Rounds {
    /// Makes every tensor's input ready for the next round (not timed).
    fn prepare(&mut self) -> CliResult<()>;

    /// Runs one round of every tensor's push_pull(Sum), all in flight together.
    fn round(
        &mut self,
        worker: &Worker,
        plan: RoundPlan<'_>,
    ) -> impl std::future::Future<Output = RoundOutcome>;

    /// Tensor `i`'s latest result, on the host.
    fn result(&mut self, i: usize) -> CliResult<std::borrow::Cow<'_, [f32]>>;

    /// Driver calls the buffers' device made so far (0 on the host).
    fn driver_calls(&self) -> u64 {
        0
    }
}

/// Host memory: the inputs are reduced out of place every round (no copy per round).
pub struct HostRounds {
    inputs: Vec<Arc<[f32]>>,
    outs: Vec<Option<Vec<f32>>>,
}

impl HostRounds {
    /// Rounds over these inputs.
    pub fn new(inputs: Vec<Arc<[f32]>>) -> HostRounds {
        let outs = inputs.iter().map(|x| Some(vec![0.0; x.len()])).collect();
        HostRounds { inputs, outs }
    }
}

impl Rounds for HostRounds {
    fn prepare(&mut self) -> CliResult<()> {
        Ok(())
    }

    async fn round(&mut self, worker: &Worker, plan: RoundPlan<'_>) -> RoundOutcome {
        let RoundPlan {
            tensors,
            order,
            group,
            start,
        } = plan;
        let mut set = tokio::task::JoinSet::new();
        if group {
            let calls = order
                .iter()
                .map(|&i| {
                    let buf = self.outs[i].take().expect("every buffer is back");
                    (tensors[i].clone(), self.inputs[i].clone(), buf)
                })
                .collect();
            let handles = worker.push_pull_group_into(calls, Reduce::Sum).await;
            for (&i, h) in order.iter().zip(handles) {
                set.spawn(async move {
                    let r = h.await;
                    (i, r.map(|(_, out)| out), start.elapsed().as_secs_f64())
                });
            }
        } else {
            for &i in order {
                let (w, t) = (worker.clone(), tensors[i].clone());
                let (input, buf) = (
                    self.inputs[i].clone(),
                    self.outs[i].take().expect("every buffer is back"),
                );
                set.spawn(async move {
                    let r = w.push_pull_into(&t, input, buf, Reduce::Sum).await;
                    (i, r.map(|(_, out)| out), start.elapsed().as_secs_f64())
                });
            }
        }
        let mut tally = Tally::default();
        while let Some(joined) = set.join_next().await {
            match joined {
                Ok((i, r, at)) => self.outs[i] = tally.record(i, r, at),
                Err(e) => tally.fail(None, format!("push_pull task: {e}")),
            }
        }
        tally.outcome()
    }

    fn result(&mut self, i: usize) -> CliResult<std::borrow::Cow<'_, [f32]>> {
        let out = self.outs[i].as_deref().expect("every push_pull answered");
        Ok(std::borrow::Cow::Borrowed(out))
    }
}

/// Device memory: each tensor's work buffer lives on `device`; every round uploads the input
/// into it (not timed) and reduces it in place, with one call per tensor or one group call
/// (one batch on the device).
pub struct DeviceRounds<D: Device> {
    device: Arc<D>,
    inputs: Vec<Arc<[f32]>>,
    work: Vec<Option<D::Mem>>,
}

fn device_err(what: &str, e: impl std::fmt::Display) -> CliError {
    CliError::failed(format!("{what}: {e}"))
}

impl<D: Device> DeviceRounds<D> {
    /// Work buffers for `inputs` on `device`.
    pub fn new(device: Arc<D>, inputs: &[Arc<[f32]>]) -> CliResult<DeviceRounds<D>> {
        let work = inputs
            .iter()
            .map(|x| {
                device
                    .alloc_zeros(x.len())
                    .map(Some)
                    .map_err(|e| device_err("allocating device memory for the job's tensors", e))
            })
            .collect::<CliResult<Vec<_>>>()?;
        Ok(DeviceRounds {
            device,
            inputs: inputs.to_vec(),
            work,
        })
    }
}

impl<D: Device> Rounds for DeviceRounds<D> {
    fn prepare(&mut self) -> CliResult<()> {
        for (x, w) in self.inputs.iter().zip(&self.work) {
            let w = w.as_ref().expect("every buffer is back");
            // SAFETY: the work buffer holds x.len() elements and no round is running.
            unsafe { self.device.upload(x, self.device.mem_addr(w)) }
                .map_err(|e| device_err("copying an input to the device", e))?;
        }
        Ok(())
    }

    async fn round(&mut self, worker: &Worker, plan: RoundPlan<'_>) -> RoundOutcome {
        let RoundPlan {
            tensors,
            order,
            group,
            start,
        } = plan;
        let mut tally = Tally::default();
        if group {
            let calls = order
                .iter()
                .map(|&i| {
                    let mem = self.work[i].take().expect("every buffer is back");
                    (tensors[i].clone(), mem)
                })
                .collect();
            let handles = worker
                .push_pull_group_device(calls, &self.device, Reduce::Sum)
                .await;
            let mut calls: FuturesUnordered<_> = order
                .iter()
                .zip(handles)
                .map(|(&i, h)| async move { (i, h.await, start.elapsed().as_secs_f64()) })
                .collect();
            while let Some((i, r, at)) = calls.next().await {
                self.work[i] = tally.record(i, r, at);
            }
            return tally.outcome();
        }
        // All calls in flight at once in this task (futures polled in the order pushed).
        let mut calls = FuturesUnordered::new();
        for &i in order {
            let mem = self.work[i].take().expect("every buffer is back");
            let (t, device) = (&tensors[i], &self.device);
            calls.push(async move {
                let r = worker.push_pull_device(t, device, mem, Reduce::Sum).await;
                (i, r, start.elapsed().as_secs_f64())
            });
        }
        while let Some((i, r, at)) = calls.next().await {
            self.work[i] = tally.record(i, r, at);
        }
        tally.outcome()
    }

    fn driver_calls(&self) -> u64 {
        self.device.driver_calls()
    }

    fn result(&mut self, i: usize) -> CliResult<std::borrow::Cow<'_, [f32]>> {
        let mem = self.work[i].as_ref().expect("every push_pull answered");
        let mut out = vec![0.0f32; self.device.mem_len(mem)];
        // SAFETY: `mem` holds out.len() elements and no round is running.
        unsafe { self.device.download(self.device.mem_addr(mem), &mut out) }
            .map_err(|e| device_err("copying a result to the host", e))?;
        Ok(std::borrow::Cow::Owned(out))
    }
}
