//! [`Reference`] (`pushpull._native.Reference`): the single-process reference of a job
//! ([`pushpull_worker::reference::Reference`]), for tests that compare a job's bits with it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use pushpull_proto::Config;
use pushpull_worker::reference::{RefTensor, Reference as RefJob};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::reduce;

/// The single-process reference of a job (`pushpull._native.Reference`): every worker and
/// server in one loop, giving the bits a cluster must produce.
///
/// `Reference(num_workers, job_seed, config=None)`: `config` is the job's cluster file (for
/// `[tensors]`, `partition_bytes`, `min_compress_bytes`).
#[pyclass(module = "pushpull._native")]
pub struct Reference {
    /// In a mutex: a pyclass must be `Sync`, the compressor chains are only `Send`.
    job: Mutex<RefJob>,
    tensors: BTreeMap<String, RefTensor>,
}

#[pymethods]
impl Reference {
    #[new]
    #[pyo3(signature = (num_workers, job_seed, config=None))]
    fn new(num_workers: u32, job_seed: u64, config: Option<PathBuf>) -> PyResult<Reference> {
        let mut c = match config {
            Some(p) => Config::from_file(&p).map_err(|e| PyValueError::new_err(e.to_string()))?,
            None => Config::local(num_workers, 1),
        };
        c.cluster.num_workers = num_workers;
        Ok(Reference {
            job: Mutex::new(RefJob::new(&c, job_seed)),
            tensors: BTreeMap::new(),
        })
    }

    /// Declares `name` as the workers do.
    #[pyo3(signature = (name, length, params=None))]
    fn declare(
        &mut self,
        name: &str,
        length: u64,
        params: Option<BTreeMap<String, String>>,
    ) -> PyResult<()> {
        let t = self
            .job
            .get_mut()
            .expect("not poisoned")
            .declare(name, length, params.unwrap_or_default())
            .map_err(|e| PyValueError::new_err(format!("tensor {name:?}: {e}")))?;
        self.tensors.insert(name.to_string(), t);
        Ok(())
    }

    /// Discards `name`'s last push_pull round everywhere (see `Worker.discard_last_round`).
    fn discard_last_round(&mut self, name: &str) -> PyResult<()> {
        let t = *self
            .tensors
            .get(name)
            .ok_or_else(|| PyValueError::new_err(format!("tensor {name:?} is not declared")))?;
        self.job
            .get_mut()
            .expect("not poisoned")
            .discard_last_round(t);
        Ok(())
    }

    /// See `Worker.set_learning_rate`.
    fn set_learning_rate(&mut self, lr: f32) {
        self.job
            .get_mut()
            .expect("not poisoned")
            .set_learning_rate(lr)
    }

    /// One round of `name`: `inputs[r]` is rank r's buffer as little-endian float32 bytes;
    /// returns every rank's result the same way (NaN in a chunk whose sum is not finite).
    fn push_pull<'py>(
        &mut self,
        py: Python<'py>,
        name: &str,
        inputs: Vec<Vec<u8>>,
        average: bool,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let t = *self
            .tensors
            .get(name)
            .ok_or_else(|| PyValueError::new_err(format!("tensor {name:?} is not declared")))?;
        let mut bufs = Vec::with_capacity(inputs.len());
        for (r, bytes) in inputs.iter().enumerate() {
            if bytes.len() % 4 != 0 {
                return Err(PyValueError::new_err(format!(
                    "tensor {name:?}: input of rank {r} has {} bytes, not a whole number of float32",
                    bytes.len()
                )));
            }
            bufs.push(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect::<Vec<f32>>(),
            );
        }
        let op = reduce(average);
        let out = self
            .job
            .get_mut()
            .expect("not poisoned")
            .push_pull(t, &bufs, op)
            .map_err(|e| PyValueError::new_err(format!("tensor {name:?}: {e}")))?;
        Ok(out
            .iter()
            .map(|v| {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                PyBytes::new(py, &bytes)
            })
            .collect())
    }
}
