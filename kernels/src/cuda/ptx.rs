//! The kernels' PTX as shipped with the crate, and how a `GpuContext` picks its PTX.
//!
//! `kernels/cuda/pushpull_kernels.ptx` ([`SHIPPED_PTX`], built into the library with
//! `include_str!`) is [`SOURCE`] compiled by NVRTC 12.4.127 for [`PTX_ARCH`] (`compute_70`)
//! with [`NVRTC_OPTIONS`](super::NVRTC_OPTIONS): PTX ISA 8.4, which every CUDA 12.4 or newer
//! driver (CUDA 13 included) JIT-compiles for its GPU, Volta and later. A GPU therefore needs
//! only the driver (libcuda) at run time, not NVRTC. `scripts/ptx.sh` regenerates the file after a change to
//! the kernel sources, and `tests/nvrtc_compile.rs` fails when it is stale (it compares with
//! NVRTC 12.4 only, which CI installs; NVRTC 13 cannot target `compute_70`).
//!
//! Which PTX a context loads:
//! 1. with `PUSHPULL_NVRTC=1` ([`NVRTC_ENV`]), [`SOURCE`] compiled at run time by the NVRTC
//!    found on the loader's path (for [`super::ptx_arch`]), and nothing else;
//! 2. otherwise the shipped PTX;
//! 3. when the driver refuses it (a driver older than CUDA 12.4), [`SOURCE`] compiled by NVRTC
//!    if libnvrtc can be loaded; the error names both failures otherwise.
//!
//! NVRTC's PTX is compiled once per process.

use std::fmt::Display;
use std::sync::{Once, OnceLock};

use super::{compile_ptx, compile_ptx_for, no_panic, nvrtc_available, CudaError, PTX_ARCH, SOURCE};

/// The PTX shipped with the crate: [`SOURCE`] compiled by NVRTC 12.4 ([`SHIPPED_PTX_NVRTC`]) for
/// [`PTX_ARCH`] with [`NVRTC_OPTIONS`](super::NVRTC_OPTIONS) (`scripts/ptx.sh` makes it).
pub const SHIPPED_PTX: &str = include_str!("../../cuda/pushpull_kernels.ptx");

/// Where [`SHIPPED_PTX`] lives, from the repository root.
pub const SHIPPED_PTX_FILE: &str = "kernels/cuda/pushpull_kernels.ptx";

/// The NVRTC version (major, minor) that makes [`SHIPPED_PTX`]: its PTX ISA (8.4) is the oldest
/// that CUDA 13 drivers still load, and it still targets `compute_70`.
pub const SHIPPED_PTX_NVRTC: (i32, i32) = (12, 4);

/// The environment variable that asks for the kernels to be compiled with NVRTC at run time
/// instead of loading [`SHIPPED_PTX`] (value `1`).
pub const NVRTC_ENV: &str = "PUSHPULL_NVRTC";

/// Whether `PUSHPULL_NVRTC=1` asks for a run-time NVRTC compile.
pub fn nvrtc_requested() -> bool {
    std::env::var(NVRTC_ENV).is_ok_and(|v| v == "1")
}

/// The version (major, minor) of the libnvrtc that cudarc loads, or `None` when there is none
/// (never panics).
pub fn nvrtc_version() -> Option<(i32, i32)> {
    if !nvrtc_available() {
        return None;
    }
    no_panic(|| {
        use cudarc::nvrtc::sys;
        let (mut major, mut minor): (std::ffi::c_int, std::ffi::c_int) = (0, 0);
        // SAFETY: NVRTC writes one integer through each pointer.
        let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
        (r == sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
    })
    .flatten()
}

/// The first instruction of `ptx` that would break exact f32 semantics (a fused multiply-add,
/// an approximate division or square root, flush-to-zero), if any: what NVRTC's options must
/// keep out of the kernels.
pub fn inexact_instruction(ptx: &str) -> Option<&'static str> {
    [
        "fma.rn",
        "mad.f32",
        "div.approx",
        "div.full",
        "sqrt.approx",
        ".ftz.",
    ]
    .into_iter()
    .find(|i| ptx.contains(i))
}

/// Compiles [`SOURCE`] with the loaded NVRTC exactly as [`SHIPPED_PTX`] is made: for
/// [`PTX_ARCH`] with [`NVRTC_OPTIONS`](super::NVRTC_OPTIONS). With NVRTC 12.4 the result must equal [`SHIPPED_PTX`]
/// (NVRTC 13 refuses `compute_70`).
pub fn compile_shipped_ptx() -> Result<String, CudaError> {
    compile_ptx_for(SOURCE, || PTX_ARCH)
}

/// Which PTX a module was loaded from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum PtxOrigin {
    /// [`SHIPPED_PTX`].
    Shipped,
    /// [`SOURCE`] compiled by NVRTC in this process.
    Nvrtc,
}

/// [`SOURCE`] compiled by NVRTC ([`compile_ptx`]), once per process.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn nvrtc_ptx() -> Result<&'static str, CudaError> {
    if !nvrtc_available() {
        return Err(CudaError::NvrtcMissing);
    }
    static PTX: OnceLock<Result<String, String>> = OnceLock::new();
    match PTX.get_or_init(|| compile_ptx().map_err(|e| e.to_string())) {
        Ok(p) => Ok(p),
        Err(e) => Err(CudaError::Compile(e.clone())),
    }
}

/// Loads the kernels with `load` (a driver module load of PTX text) from the PTX the module
/// docs describe: the shipped PTX, or NVRTC's when `PUSHPULL_NVRTC=1` or the driver refuses the
/// shipped one. Never panics where libnvrtc is absent.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn load_kernels<M, E: Display>(
    load: impl FnMut(&'static str) -> Result<M, E>,
) -> Result<M, CudaError> {
    let (module, origin) = load_from(nvrtc_requested(), SHIPPED_PTX, nvrtc_ptx, load)?;
    if origin == PtxOrigin::Nvrtc {
        static SAID: Once = Once::new();
        SAID.call_once(|| {
            let (major, minor) = nvrtc_version().unwrap_or((0, 0));
            tracing::info!(
                "CUDA kernels compiled at run time by NVRTC {major}.{minor} ({})",
                if nvrtc_requested() {
                    "PUSHPULL_NVRTC=1"
                } else {
                    "the driver refused the shipped PTX"
                }
            );
        });
    }
    Ok(module)
}

/// [`load_kernels`] with its inputs spelled out: `forced` (`PUSHPULL_NVRTC=1`), the shipped
/// PTX, and how to get NVRTC's PTX.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn load_from<M, E: Display>(
    forced: bool,
    shipped: &'static str,
    nvrtc: impl FnOnce() -> Result<&'static str, CudaError>,
    mut load: impl FnMut(&'static str) -> Result<M, E>,
) -> Result<(M, PtxOrigin), CudaError> {
    if forced {
        let ptx = nvrtc().map_err(|e| {
            CudaError::Compile(format!(
                "{NVRTC_ENV}=1 asks for the kernels to be compiled at run time, and that failed \
                 (unset it to use the PTX shipped with pushpull): {e}"
            ))
        })?;
        return load(ptx)
            .map(|m| (m, PtxOrigin::Nvrtc))
            .map_err(|e| CudaError::Driver {
                what: format!("loading the PTX compiled by NVRTC ({NVRTC_ENV}=1)"),
                detail: e.to_string(),
            });
    }
    let refused = match load(shipped) {
        Ok(m) => return Ok((m, PtxOrigin::Shipped)),
        Err(e) => e.to_string(),
    };
    let what = "loading the CUDA kernels: the driver refused the shipped PTX (PTX ISA 8.4, which \
                needs a CUDA 12.4 or newer driver)"
        .to_string();
    let ptx = match nvrtc() {
        Ok(ptx) => ptx,
        Err(CudaError::NvrtcMissing) => {
            return Err(CudaError::Driver {
                what,
                detail: format!(
                    "{refused}; NVRTC (libnvrtc), which could compile the kernels for this \
                     driver instead, was not found: update the driver, or put libnvrtc on \
                     LD_LIBRARY_PATH"
                ),
            })
        }
        Err(e) => {
            return Err(CudaError::Driver {
                what,
                detail: format!("{refused}; compiling them with NVRTC instead failed too: {e}"),
            })
        }
    };
    load(ptx)
        .map(|m| (m, PtxOrigin::Nvrtc))
        .map_err(|e| CudaError::Driver {
            what,
            detail: format!("{refused}; and it refused NVRTC's PTX too: {e}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::ENTRY_POINTS;
    use std::cell::Cell;

    #[test]
    fn shipped_ptx_names_every_entry_point() {
        for name in ENTRY_POINTS {
            assert!(
                SHIPPED_PTX.contains(&format!(".visible .entry {name}(")),
                "{SHIPPED_PTX_FILE} has no `.entry {name}`: run scripts/ptx.sh"
            );
        }
        let target = format!(".target {}", PTX_ARCH.replace("compute_", "sm_"));
        assert!(
            SHIPPED_PTX.contains(&target),
            "{SHIPPED_PTX_FILE}: no `{target}`"
        );
        assert!(
            SHIPPED_PTX.lines().any(|l| l.trim() == ".version 8.4"),
            "{SHIPPED_PTX_FILE} is not PTX ISA 8.4 (NVRTC 12.4)"
        );
        assert!(
            SHIPPED_PTX.contains("release 12.4"),
            "{SHIPPED_PTX_FILE} was not made by NVRTC 12.4"
        );
        if let Some(banned) = inexact_instruction(SHIPPED_PTX) {
            panic!("{SHIPPED_PTX_FILE} contains `{banned}`");
        }
    }

    const FRESH: &str = "fresh PTX";

    /// A loader that refuses the shipped PTX when `refuse_shipped` and records what it loads.
    fn loader<'a>(
        refuse_shipped: bool,
        loaded: &'a Cell<Option<&'static str>>,
    ) -> impl FnMut(&'static str) -> Result<&'static str, String> + 'a {
        move |ptx| {
            if refuse_shipped && ptx == SHIPPED_PTX {
                return Err("CUDA_ERROR_UNSUPPORTED_PTX_VERSION".to_string());
            }
            loaded.set(Some(ptx));
            Ok(ptx)
        }
    }

    #[test]
    fn the_shipped_ptx_is_loaded_without_nvrtc() {
        let loaded = Cell::new(None);
        let (m, origin) = load_from(
            false,
            SHIPPED_PTX,
            || panic!("NVRTC must not be touched"),
            loader(false, &loaded),
        )
        .unwrap();
        assert_eq!((m, origin), (SHIPPED_PTX, PtxOrigin::Shipped));
    }

    #[test]
    fn a_refused_shipped_ptx_falls_back_to_nvrtc() {
        let loaded = Cell::new(None);
        let (m, origin) =
            load_from(false, SHIPPED_PTX, || Ok(FRESH), loader(true, &loaded)).unwrap();
        assert_eq!((m, origin), (FRESH, PtxOrigin::Nvrtc));

        let err = load_from(
            false,
            SHIPPED_PTX,
            || Err(CudaError::NvrtcMissing),
            loader(true, &loaded),
        )
        .unwrap_err()
        .to_string();
        for needle in ["UNSUPPORTED_PTX_VERSION", "12.4", "NVRTC", "not found"] {
            assert!(err.contains(needle), "{needle:?} missing from: {err}");
        }

        let err = load_from(
            false,
            SHIPPED_PTX,
            || Err(CudaError::Compile("bad".into())),
            loader(true, &loaded),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("UNSUPPORTED_PTX_VERSION") && err.contains("bad"),
            "{err}"
        );
    }

    #[test]
    fn pushpull_nvrtc_1_compiles_even_when_the_shipped_ptx_loads() {
        let loaded = Cell::new(None);
        let (m, origin) =
            load_from(true, SHIPPED_PTX, || Ok(FRESH), loader(false, &loaded)).unwrap();
        assert_eq!((m, origin), (FRESH, PtxOrigin::Nvrtc));
        assert_eq!(loaded.get(), Some(FRESH));

        let loaded = Cell::new(None);
        let err = load_from(
            true,
            SHIPPED_PTX,
            || Err(CudaError::NvrtcMissing),
            loader(false, &loaded),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("PUSHPULL_NVRTC=1"), "{err}");
        assert_eq!(
            loaded.get(),
            None,
            "nothing is loaded when NVRTC was asked for"
        );
    }

    #[test]
    fn nvrtc_version_never_panics() {
        assert_eq!(nvrtc_version().is_some(), nvrtc_available());
    }

    /// On a GPU: the shipped PTX loads without NVRTC and has every kernel
    /// (`cargo test -p pushpull-kernels --features cuda --lib -- --ignored shipped_ptx_loads`).
    #[cfg(feature = "cuda")]
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn shipped_ptx_loads_on_the_gpu() {
        assert!(crate::cuda::gpu_available(), "no usable CUDA GPU here");
        let ctx = cudarc::driver::CudaContext::new(0).expect("opening device 0");
        let (module, origin) = load_from(
            false,
            SHIPPED_PTX,
            || Err(CudaError::NvrtcMissing),
            |ptx| ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(origin, PtxOrigin::Shipped);
        for name in ENTRY_POINTS {
            module
                .load_function(name)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}
