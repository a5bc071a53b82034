//! Gradient compression on a device for pushpull: the CUDA kernels (shipped as PTX, or
//! compiled by NVRTC), their host-compiled twin (the same formulas in C++, what CI runs instead
//! of a GPU), and the device data path: tensors whose chunks compress in device memory, in
//! batches of chunks launched together. They give the bytes of the CPU codecs of
//! [`pushpull_codecs`], which this crate re-exports whole (so `pushpull_kernels::chunk`,
//! `pushpull_kernels::Compressor`, ... are the codecs crate's): code that compresses on the CPU
//! only (the scheduler, the servers) depends on `pushpull-codecs` alone, without cudarc or the
//! C++ twin.
//!
//! # Map of the crate
//!
//! | module | what |
//! |---|---|
//! | (root) | everything of [`pushpull_codecs`], re-exported |
//! | [`cuda`] | the CUDA kernels (same bytes as the CPU for the fixed-width formats), shipped as PTX; [`cuda::Device`] (where a buffer lives: `cpu`, `cuda:N`, `emulated`); the host twin's bindings |
//! | [`device`] | tensors in device memory: the [`device::Device`] trait, a tensor's chains on a device ([`device::DeviceTensor`]), batches of chunks launched together ([`device::Batch`]), the [`device::EmulatedDevice`] of CI |

pub use pushpull_codecs::*;

pub mod cuda;
pub mod device;
