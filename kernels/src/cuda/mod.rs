//! The CUDA path: kernels for the fixed-width compressors, compiled at run time with NVRTC,
//! bit-identical to the CPU compressors.
//!
//! # Map
//!
//! | file | what |
//! |---|---|
//! | `kernels/cuda/pushpull_elem.cuh` | `__host__ __device__` twins of [`crate::rng`] and [`crate::elem`] (SplitMix64 streams, the keyed permutation, stochastic rounding, saturating f16/bf16 casts written with integer bit manipulation, minmax/dithering levels), the reduction steps, and the per-thread work units of every kernel (pack one u32 word, decode one group of 4 elements) |
//! | `kernels/cuda/pushpull_kernels.cu` | the `extern "C" __global__` kernels ([`ENTRY_POINTS`]): thin wrappers that map threads to the work units of the header |
//! | `kernels/cuda/host_shim.cpp` | the header compiled for the host by `build.rs` (`cc`, `-O2 -ffp-contract=off -fno-fast-math`), plus serial emulations of each kernel launch sequence |
//! | [`host`] | Rust bindings of the shim: element functions and whole-chunk emulation |
//! | [`scheme`] | [`GpuScheme`]: which fixed-width encoding, its parameters, payload sizes |
//! | `codec` (feature `cuda`) | `GpuContext` (module loaded on a `CudaContext` and stream) and `GpuCodec` (compress, decompress, decompress_add on cudarc device buffers) |
//! | `device` (feature `cuda`) | `GpuContext` as a [`crate::device::Device`]: `CudaSlice<f32>` memory, the error-feedback, momentum and average kernels, payloads copied to the host |
//!
//! # Kernels
//!
//! Per encoding and direction: `pp_{fp16,bf16,onebit,minmax,dither,randomk}_{compress,
//! decompress,decompress_add}`, plus the reductions they need: `pp_block_sums` (f32 tree sum of
//! `|x|` or `x²` over each block of 256, counted from each bucket start, as f64 partials; a
//! warp per block), `pp_finalize_sums` (per bucket: partials added in f64 within groups of 256,
//! then the group sums, in order; then mean or sqrt), `pp_span_minmax` / `pp_finalize_minmax`
//! (per-bucket min and max, or max `|x|`), and the helpers `pp_fill_u32`, `pp_add_zero` and
//! `pp_first_nonfinite`. onebit's compress makes the sign words (warp ballots) and the `|x|`
//! partials in one pass. Other bit streams are written by one thread per output u32 word (a code that
//! straddles two words is computed by both threads), so packing needs no atomics; the elements a
//! block needs are staged through shared memory with coalesced loads. Decoders run one thread per
//! group of 4 elements. Random-k scatters need no atomics either: its indices are distinct;
//! its decompress_add gathers `acc[idx] + v` first, adds `0.0` to every element (off the support
//! that turns `-0.0` into `+0.0`, exactly as adding a decompressed zero does), then scatters.
//!
//! # Wire formats (little-endian, shared with the CPU compressors)
//!
//! A bit stream of n codes of w bits puts code i at stream bits `[i*w, i*w + w)`, stream bit j
//! being bit `j % 32` of u32 word `j / 32`, zero-padded to whole words. `nb = ceil(n / bucket)`.
//! * fp16 / bf16: n × u16 (saturating casts, round to nearest even);
//! * onebit: f32 scale (mean |x| of the chunk, or 1.0 without scaling), then n sign bits;
//! * minmax (b bits): nb × (f32 min, f32 max), then n codes of b bits;
//! * dithering (s levels, packed): nb × f32 norm (max |x| or l2), then n codes of
//!   `1 + bit_length(s)` bits, `(level << 1) | sign`;
//! * random-k: k × f32, value j = `x[permute(j)] * scale`, indices from the keyed permutation of
//!   `0..n` ([`crate::rng::Permutation`]), never sent.
//!
//! # How the bytes stay identical
//! * one definition of every formula in [`crate::elem`] / [`crate::rng`], mirrored operation by
//!   operation in the header;
//! * no FMA contraction anywhere: NVRTC runs with `--fmad=false` (and `--ftz=false
//!   --prec-div=true --prec-sqrt=true`, no fast math), the host shim with `-ffp-contract=off`;
//! * one reduction order: 256-element f32 trees exactly as [`crate::elem::tree_sum_block`]
//!   (three levels in a lane's registers, five by warp shuffles), block partials added as
//!   [`crate::elem::sum_partials`] does (groups of 256 in parallel, then the groups in order);
//!   per-bucket min and max go on the wire as [`crate::elem::canonical_zero`] of
//!   the result, so the order of a min/max reduction cannot show (only ±0 compare equal with
//!   different bits);
//! * draws are pure functions of `(stream, element index)`, so any thread can make any draw.
//!
//! # Tests and how to run them
//! * `tests/cuda_host.rs` (always runs): the host-compiled header against the Rust functions
//!   bit for bit on fresh random inputs (seed printed; set `PUSHPULL_TEST_SEED` to replay), and
//!   `tests/cuda_host_kernels.rs` the kernel emulation against the CPU compressors' bytes;
//! * `tests/nvrtc_compile.rs`: compiles [`SOURCE`] with NVRTC and checks every
//!   [`ENTRY_POINTS`] name is a `.entry` of the PTX. It skips with a printed line when libnvrtc is
//!   missing, unless `PUSHPULL_REQUIRE_NVRTC=1` (CI: `source .ci/nvrtc.sh` installs NVRTC from
//!   PyPI into `.venv-nvrtc`, sets `LD_LIBRARY_PATH` and that variable);
//! * `tests/cuda_gpu.rs`: runs the kernels on a GPU against the CPU bytes. These tests are
//!   `#[ignore]`d and need the `cuda` feature: on a GPU machine run
//!   `cargo test -p pushpull-kernels --features cuda --test cuda_gpu -- --ignored`
//!   (with libnvrtc on `LD_LIBRARY_PATH`). Without a GPU they fail loudly rather than pass.
//!
//! # Run-time behaviour without CUDA
//! cudarc loads libcuda and libnvrtc dynamically and panics when a missing library is used, so
//! every entry point here first checks `is_culib_present()`, then initialises and counts devices,
//! and catches panics: [`gpu_available`] and [`nvrtc_available`] never panic, and
//! [`select_device`] with [`DevicePref::Auto`] falls back to the CPU and says so once.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::str::FromStr;
use std::sync::{Once, OnceLock};

pub mod host;
pub mod scheme;

#[cfg(feature = "cuda")]
#[macro_use]
mod codec;
#[cfg(feature = "cuda")]
mod device;

#[cfg(feature = "cuda")]
pub use codec::{GpuCodec, GpuContext};
#[cfg(feature = "cuda")]
pub use device::{CudaDevice, PinnedStaging};
pub use scheme::{GpuScheme, RoundStreams};

/// The complete CUDA C source handed to NVRTC: the element header followed by the kernels
/// (the `.cu` includes the header only when it is not already defined, so NVRTC needs no
/// include path).
pub const SOURCE: &str = concat!(
    include_str!("../../cuda/pushpull_elem.cuh"),
    "\n",
    include_str!("../../cuda/pushpull_kernels.cu")
);

/// The oldest virtual architecture the PTX is generated for: `compute_70` (Volta) JIT-compiles
/// on every GPU from Volta on; the PTX ISA version follows the NVRTC release (8.4 for NVRTC
/// 12.4, which needs a CUDA 12.4+ driver). NVRTC 13 no longer targets Volta: [`ptx_arch`] picks
/// the oldest architecture from this one on that the loaded NVRTC supports.
pub const PTX_ARCH: &str = "compute_70";

/// The virtual architectures [`ptx_arch`] chooses from, oldest first (from [`PTX_ARCH`] on).
const PTX_ARCHES: &[(i32, &str)] = &[
    (70, "compute_70"),
    (75, "compute_75"),
    (80, "compute_80"),
    (86, "compute_86"),
    (89, "compute_89"),
    (90, "compute_90"),
];

/// The architecture the kernels are compiled for: the oldest of `compute_70`, 75, 80, 86, 89
/// and 90 that the loaded NVRTC lists as supported ([`PTX_ARCH`] where NVRTC cannot say).
/// Checked once per process.
pub fn ptx_arch() -> &'static str {
    static ARCH: OnceLock<&'static str> = OnceLock::new();
    ARCH.get_or_init(|| {
        let supported = no_panic(|| {
            use cudarc::nvrtc::sys;
            let mut n: std::ffi::c_int = 0;
            // SAFETY: NVRTC writes the count, then exactly `n` integers into a buffer of `n`.
            unsafe {
                if sys::nvrtcGetNumSupportedArchs(&mut n) != sys::nvrtcResult::NVRTC_SUCCESS {
                    return None;
                }
                let mut archs = vec![0 as std::ffi::c_int; n.max(0) as usize];
                if sys::nvrtcGetSupportedArchs(archs.as_mut_ptr())
                    != sys::nvrtcResult::NVRTC_SUCCESS
                {
                    return None;
                }
                Some(archs)
            }
        })
        .flatten();
        match supported {
            Some(archs) => PTX_ARCHES
                .iter()
                .find(|(sm, _)| archs.contains(sm))
                .map_or(PTX_ARCH, |&(_, name)| name),
            None => PTX_ARCH,
        }
    })
}

/// NVRTC options: exact IEEE f32/f64 arithmetic, no FMA contraction, no flush-to-zero.
pub const NVRTC_OPTIONS: &[&str] = &[
    "--fmad=false",
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
];

macro_rules! kernels {
    ($($variant:ident => $name:literal,)*) => {
        /// One kernel of [`SOURCE`]; the discriminant is its position in [`ENTRY_POINTS`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
        pub(crate) enum Kernel { $($variant,)* }

        /// The name of every `extern "C" __global__` kernel in [`SOURCE`].
        pub const ENTRY_POINTS: &[&str] = &[$($name,)*];
    };
}

kernels! {
    FillU32 => "pp_fill_u32",
    BlockSums => "pp_block_sums",
    FinalizeSums => "pp_finalize_sums",
    SpanMinmax => "pp_span_minmax",
    FinalizeMinmax => "pp_finalize_minmax",
    Fp16Compress => "pp_fp16_compress",
    Fp16Decompress => "pp_fp16_decompress",
    Fp16DecompressAdd => "pp_fp16_decompress_add",
    Bf16Compress => "pp_bf16_compress",
    Bf16Decompress => "pp_bf16_decompress",
    Bf16DecompressAdd => "pp_bf16_decompress_add",
    OnebitCompress => "pp_onebit_compress",
    OnebitDecompress => "pp_onebit_decompress",
    OnebitDecompressAdd => "pp_onebit_decompress_add",
    MinmaxCompress => "pp_minmax_compress",
    MinmaxDecompress => "pp_minmax_decompress",
    MinmaxDecompressAdd => "pp_minmax_decompress_add",
    DitherCompress => "pp_dither_compress",
    DitherDecompress => "pp_dither_decompress",
    DitherDecompressAdd => "pp_dither_decompress_add",
    RandomkCompress => "pp_randomk_compress",
    RandomkDecompress => "pp_randomk_decompress",
    RandomkDecompressAdd => "pp_randomk_decompress_add",
    AddZero => "pp_add_zero",
    FirstNonfinite => "pp_first_nonfinite",
    TClear => "pp_t_clear",
    TPrepare => "pp_t_prepare",
    TStats => "pp_t_stats",
    TFinalize => "pp_t_finalize",
    TEncode => "pp_t_encode",
    TResidual => "pp_t_residual",
    TResidualScatter => "pp_t_residual_scatter",
    TDecode => "pp_t_decode",
    TDecodeScatter => "pp_t_decode_scatter",
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl Kernel {
    /// The kernel's entry point name.
    pub(crate) fn name(self) -> &'static str {
        ENTRY_POINTS[self as usize]
    }

    /// The table kernel of a batch step.
    pub(crate) fn of_step(step: crate::device::table::Step) -> Kernel {
        use crate::device::table::Step;
        match step {
            Step::Clear => Kernel::TClear,
            Step::Prepare => Kernel::TPrepare,
            Step::Stats => Kernel::TStats,
            Step::Finalize => Kernel::TFinalize,
            Step::Encode => Kernel::TEncode,
            Step::Residual => Kernel::TResidual,
            Step::ResidualScatter => Kernel::TResidualScatter,
            Step::Decode => Kernel::TDecode,
            Step::DecodeScatter => Kernel::TDecodeScatter,
        }
    }
}

/// Errors of the CUDA path.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// libnvrtc could not be loaded.
    #[error(
        "NVRTC (libnvrtc.so) was not found, so the CUDA kernels cannot be compiled: install it \
         (e.g. `pip install nvidia-cuda-nvrtc-cu12==12.4.127`, or `source .ci/nvrtc.sh`) and put \
         its lib folder on LD_LIBRARY_PATH"
    )]
    NvrtcMissing,
    /// No usable CUDA GPU: the reason says which part is missing.
    #[error("no CUDA GPU is available: {0}")]
    NoGpu(String),
    /// NVRTC rejected the source (the message carries NVRTC's log).
    #[error("NVRTC failed to compile the CUDA kernels: {0}")]
    Compile(String),
    /// A CUDA driver call failed.
    #[error("CUDA driver error while {what}: {detail}")]
    Driver {
        /// What was being done.
        what: String,
        /// The driver's error.
        detail: String,
    },
    /// A parameter or buffer the CUDA path cannot accept.
    #[error("invalid input to the CUDA compressor: {0}")]
    Invalid(String),
    /// A device preference string that is not one of the allowed values.
    #[error("unknown device {value:?}: expected one of \"auto\", \"cpu\", \"cuda\", \"cuda:N\"")]
    UnknownDevice {
        /// The value that was given.
        value: String,
    },
}

/// Runs `f`, turning a panic inside cudarc (a library or symbol that cannot be loaded) into
/// `None`.
fn no_panic<T>(f: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(f)).ok()
}

/// Whether libnvrtc can be used: linked at build time (feature `linked-cuda`), or loadable.
#[cfg(not(feature = "linked-cuda"))]
fn nvrtc_linked_or_loadable() -> bool {
    // SAFETY: is_culib_present only tries to dlopen the candidate library names.
    no_panic(|| unsafe { cudarc::nvrtc::sys::is_culib_present() }).unwrap_or(false)
}

#[cfg(feature = "linked-cuda")]
fn nvrtc_linked_or_loadable() -> bool {
    true
}

/// Whether libcuda can be used (`None`: cudarc panicked looking), as for NVRTC.
#[cfg(not(feature = "linked-cuda"))]
fn driver_linked_or_loadable() -> Option<bool> {
    // SAFETY: is_culib_present only tries to dlopen the candidate library names.
    no_panic(|| unsafe { cudarc::driver::sys::is_culib_present() })
}

#[cfg(feature = "linked-cuda")]
fn driver_linked_or_loadable() -> Option<bool> {
    Some(true)
}

/// Whether libnvrtc can be loaded (checked once per process; never panics).
pub fn nvrtc_available() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(nvrtc_linked_or_loadable)
}

/// The number of CUDA devices, or why there are none (checked once per process; never panics).
fn gpu_probe() -> &'static Result<usize, String> {
    static PROBE: OnceLock<Result<usize, String>> = OnceLock::new();
    PROBE.get_or_init(|| {
        let present = driver_linked_or_loadable();
        if present != Some(true) {
            return Err("the CUDA driver library (libcuda.so) was not found".into());
        }
        match no_panic(|| {
            cudarc::driver::result::init()?;
            cudarc::driver::CudaContext::device_count()
        }) {
            None => Err("the CUDA driver library could not be used (missing symbol)".into()),
            Some(Err(e)) => Err(format!("the CUDA driver failed to initialise: {e}")),
            Some(Ok(c)) if c <= 0 => Err("the CUDA driver reports no device".into()),
            Some(Ok(c)) => Ok(c as usize),
        }
    })
}

/// Whether a CUDA GPU can be used: libcuda loads, `cuInit` succeeds and at least one device
/// exists (checked once per process; never panics). Running the kernels also needs
/// [`nvrtc_available`].
pub fn gpu_available() -> bool {
    gpu_probe().is_ok()
}

/// The number of CUDA devices (0 without a usable driver).
pub fn gpu_count() -> usize {
    gpu_probe().as_ref().map_or(0, |&c| c)
}

/// Compiles [`SOURCE`] to PTX with NVRTC ([`NVRTC_OPTIONS`], [`ptx_arch`]). Needs libnvrtc,
/// not a GPU.
pub fn compile_ptx() -> Result<String, CudaError> {
    compile_ptx_from(SOURCE)
}

/// Compiles any CUDA C `source` to PTX with the options of [`compile_ptx`]; NVRTC's log is in
/// the error when it fails.
pub fn compile_ptx_from(source: &str) -> Result<String, CudaError> {
    if source.contains('\0') {
        return Err(CudaError::Compile("the source contains a NUL byte".into()));
    }
    if !nvrtc_available() {
        return Err(CudaError::NvrtcMissing);
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(ptx_arch()),
        options: NVRTC_OPTIONS.iter().map(|s| s.to_string()).collect(),
        name: Some("pushpull_kernels.cu".into()),
        ..Default::default()
    };
    match no_panic(|| cudarc::nvrtc::compile_ptx_with_opts(source, opts)) {
        None => Err(CudaError::Compile(
            "NVRTC panicked (a symbol missing from libnvrtc?)".into(),
        )),
        Some(Err(cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. })) => Err(
            CudaError::Compile(format!("{nvrtc:?}: {}", log.to_string_lossy())),
        ),
        Some(Err(e)) => Err(CudaError::Compile(e.to_string())),
        Some(Ok(ptx)) => no_panic(|| ptx.to_src())
            .ok_or_else(|| CudaError::Compile("NVRTC returned PTX that is not UTF-8".into())),
    }
}

/// Where the user wants compression to run (the `device` setting).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DevicePref {
    /// A CUDA GPU when one is usable, else the CPU (said once in the log).
    #[default]
    Auto,
    /// Always the CPU.
    Cpu,
    /// A CUDA GPU (device 0); an error when there is none.
    Cuda,
    /// The CUDA GPU with this ordinal (`cuda:N`); an error when there is no such device.
    CudaOrdinal(usize),
}

impl FromStr for DevicePref {
    type Err = CudaError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(DevicePref::Auto),
            "cpu" => Ok(DevicePref::Cpu),
            "cuda" => Ok(DevicePref::Cuda),
            other => match other.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(DevicePref::CudaOrdinal(n)),
                _ => Err(CudaError::UnknownDevice {
                    value: other.to_string(),
                }),
            },
        }
    }
}

impl fmt::Display for DevicePref {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DevicePref::Auto => f.write_str("auto"),
            DevicePref::Cpu => f.write_str("cpu"),
            DevicePref::Cuda => f.write_str("cuda"),
            DevicePref::CudaOrdinal(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Where compression runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// The CPU compressors.
    #[default]
    Cpu,
    /// The CUDA kernels on the device with this ordinal.
    Cuda {
        /// CUDA device ordinal.
        ordinal: usize,
    },
    /// The CUDA kernels' host-compiled twin on host memory ([`crate::device::EmulatedDevice`]:
    /// tests of the device data path without a GPU).
    Emulated,
}

impl fmt::Display for Device {
    /// `cpu` or `cuda:N`, the spelling of the `device` setting (or `emulated`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda { ordinal } => write!(f, "cuda:{ordinal}"),
            Device::Emulated => f.write_str("emulated"),
        }
    }
}

/// Why the GPU path cannot run, or `None` when it can.
fn gpu_unusable_reason() -> Option<String> {
    match gpu_probe() {
        Err(reason) => Some(reason.clone()),
        Ok(_) if !nvrtc_available() => Some(
            "a GPU exists but libnvrtc.so (needed to compile the kernels) was not found".into(),
        ),
        Ok(_) => None,
    }
}

/// Resolves a [`DevicePref`]: `Cpu` is the CPU; `Cuda` is device 0 and `CudaOrdinal(n)` device
/// n, or an error saying why there is no such usable GPU; `Auto` is device 0 when usable, else
/// the CPU, with one `info` log line (once per process) saying so.
pub fn select_device(pref: DevicePref) -> Result<Device, CudaError> {
    match pref {
        DevicePref::Cpu => Ok(Device::Cpu),
        DevicePref::Cuda | DevicePref::CudaOrdinal(_) => {
            let ordinal = match pref {
                DevicePref::CudaOrdinal(n) => n,
                _ => 0,
            };
            match gpu_unusable_reason() {
                None if ordinal < gpu_count() => Ok(Device::Cuda { ordinal }),
                None => Err(CudaError::NoGpu(format!(
                    "device = \"{pref}\" was requested but there are only {} CUDA devices",
                    gpu_count()
                ))),
                Some(reason) => Err(CudaError::NoGpu(format!(
                    "device = \"{pref}\" was requested but there is no usable CUDA GPU: {reason}"
                ))),
            }
        }
        DevicePref::Auto => match gpu_unusable_reason() {
            None => Ok(Device::Cuda { ordinal: 0 }),
            Some(reason) => {
                static SAID: Once = Once::new();
                SAID.call_once(|| {
                    tracing::info!("no usable CUDA GPU ({reason}); compressing on the CPU");
                });
                Ok(Device::Cpu)
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_enum_matches_entry_points() {
        assert_eq!(Kernel::FillU32.name(), "pp_fill_u32");
        assert_eq!(Kernel::FirstNonfinite.name(), "pp_first_nonfinite");
        assert_eq!(Kernel::TDecodeScatter.name(), *ENTRY_POINTS.last().unwrap());
        for step in crate::device::table::Step::COMPRESS
            .iter()
            .chain(&crate::device::table::Step::DECODE)
        {
            assert_eq!(Kernel::of_step(*step).name(), step.kernel());
        }
        for name in ENTRY_POINTS {
            assert!(
                SOURCE.contains(&format!("__global__ void {name}(")),
                "{name} is not a kernel of SOURCE"
            );
        }
        let kernels = SOURCE.matches("extern \"C\" __global__ void ").count();
        assert_eq!(
            kernels,
            ENTRY_POINTS.len(),
            "a kernel is missing from ENTRY_POINTS"
        );
    }

    #[test]
    fn device_pref_parses_and_rejects() {
        assert_eq!("auto".parse::<DevicePref>().unwrap(), DevicePref::Auto);
        assert_eq!("cpu".parse::<DevicePref>().unwrap(), DevicePref::Cpu);
        assert_eq!("cuda".parse::<DevicePref>().unwrap(), DevicePref::Cuda);
        assert_eq!(
            "cuda:3".parse::<DevicePref>().unwrap(),
            DevicePref::CudaOrdinal(3)
        );
        assert!("cuda:x".parse::<DevicePref>().is_err());
        assert!("cuda:".parse::<DevicePref>().is_err());
        let err = "gpu".parse::<DevicePref>().unwrap_err().to_string();
        assert!(err.contains("\"gpu\""), "{err}");
        assert!(
            err.contains("auto") && err.contains("cpu") && err.contains("cuda"),
            "{err}"
        );
        for p in [
            DevicePref::Auto,
            DevicePref::Cpu,
            DevicePref::Cuda,
            DevicePref::CudaOrdinal(1),
        ] {
            assert_eq!(p.to_string().parse::<DevicePref>().unwrap(), p);
        }
    }

    #[test]
    fn select_device_never_panics_and_agrees_with_availability() {
        assert_eq!(select_device(DevicePref::Cpu).unwrap(), Device::Cpu);
        let usable = gpu_available() && nvrtc_available();
        let auto = select_device(DevicePref::Auto).unwrap();
        match select_device(DevicePref::Cuda) {
            Ok(d) => {
                assert!(usable);
                assert_eq!(d, Device::Cuda { ordinal: 0 });
                assert_eq!(auto, d);
            }
            Err(e) => {
                assert!(!usable);
                assert_eq!(auto, Device::Cpu);
                let msg = e.to_string();
                assert!(msg.contains("no usable CUDA GPU"), "{msg}");
            }
        }
    }
}
