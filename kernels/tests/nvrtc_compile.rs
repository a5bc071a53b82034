//! Compiles the CUDA kernels to PTX with NVRTC (no GPU needed) and checks that every name in
//! `ENTRY_POINTS` is a `.entry` of the PTX, and that the PTX has no other entry; with NVRTC 12.4
//! (what CI installs), that the PTX shipped with the crate (`kernels/cuda/pushpull_kernels.ptx`)
//! is exactly what NVRTC makes of the current sources for `compute_70` (`scripts/ptx.sh`
//! regenerates it: it runs `shipped_ptx_is_fresh` with `PUSHPULL_WRITE_PTX=1`, which writes the
//! file instead of comparing).
//!
//! Without libnvrtc the tests print a SKIPPED line and pass, unless
//! `PUSHPULL_REQUIRE_NVRTC=1` (CI sets it through `.ci/nvrtc.sh`, which installs NVRTC from
//! PyPI), in which case they fail.

use std::collections::BTreeSet;

use pushpull_kernels::cuda::{
    compile_ptx, compile_ptx_from, compile_shipped_ptx, nvrtc_available, nvrtc_version, ptx_arch,
    CudaError, ENTRY_POINTS, SHIPPED_PTX, SHIPPED_PTX_FILE, SHIPPED_PTX_NVRTC,
};

fn nvrtc_required() -> bool {
    std::env::var("PUSHPULL_REQUIRE_NVRTC").is_ok_and(|v| v == "1")
}

/// Ok(true) when NVRTC is there; Ok(false) after printing the skip line.
fn nvrtc_or_skip(test: &str) -> bool {
    if nvrtc_available() {
        return true;
    }
    assert!(
        !nvrtc_required(),
        "{test}: PUSHPULL_REQUIRE_NVRTC=1 but NVRTC is required and missing: libnvrtc.so could \
         not be loaded (source .ci/nvrtc.sh, or put the lib folder of the \
         nvidia-cuda-nvrtc-cu12 wheel on LD_LIBRARY_PATH)"
    );
    println!(
        "{test}: SKIPPED: libnvrtc not found (set PUSHPULL_REQUIRE_NVRTC=1 to make this an error)"
    );
    false
}

/// The names after `.entry` in a PTX module.
fn entries(ptx: &str) -> BTreeSet<String> {
    ptx.lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix(".visible .entry ")?;
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            Some(name)
        })
        .collect()
}

#[test]
fn kernels_compile_to_ptx_with_every_entry_point() {
    let test = "kernels_compile_to_ptx_with_every_entry_point";
    if !nvrtc_or_skip(test) {
        return;
    }
    let ptx = compile_ptx().unwrap_or_else(|e| panic!("NVRTC compile failed: {e}"));
    let found = entries(&ptx);
    let missing: Vec<&&str> = ENTRY_POINTS
        .iter()
        .filter(|n| !found.contains(**n))
        .collect();
    assert!(
        missing.is_empty(),
        "entry points missing from the PTX: {missing:?}\nPTX entries: {found:?}"
    );
    let listed: BTreeSet<String> = ENTRY_POINTS.iter().map(|s| s.to_string()).collect();
    let extra: Vec<&String> = found.difference(&listed).collect();
    assert!(
        extra.is_empty(),
        "kernels in the PTX that ENTRY_POINTS does not list: {extra:?}"
    );
    // The options took effect: no fused multiply-add, no approximate division or square root,
    // no flush-to-zero.
    if let Some(banned) = pushpull_kernels::cuda::inexact_instruction(&ptx) {
        panic!("the PTX contains `{banned}`: exact f32 semantics are broken");
    }
    // The oldest architecture this NVRTC supports from Volta on (NVRTC 12: sm_70, 13: sm_75).
    let arch = ptx_arch();
    let target = format!(".target {}", arch.replace("compute_", "sm_"));
    assert!(
        ptx.contains(&target),
        "the PTX does not say `{target}` (ptx_arch() = {arch})"
    );
    println!(
        "{test}: {} entry points compiled for {arch} ({} bytes of PTX, {})",
        found.len(),
        ptx.len(),
        ptx.lines()
            .find(|l| l.starts_with(".version"))
            .unwrap_or("no .version line")
    );
}

#[test]
fn compile_errors_are_reported_not_panicked() {
    if !nvrtc_or_skip("compile_errors_are_reported_not_panicked") {
        // Without NVRTC, compile_ptx must say so instead of panicking inside cudarc.
        assert!(matches!(compile_ptx(), Err(CudaError::NvrtcMissing)));
        return;
    }
    // A broken source comes back as an error carrying NVRTC's log.
    let err = compile_ptx_from("extern \"C\" __global__ void k() { undefined_name; }")
        .unwrap_err()
        .to_string();
    assert!(err.contains("undefined_name"), "{err}");
}

/// `PUSHPULL_WRITE_PTX=1` (set by `scripts/ptx.sh`): write the shipped PTX instead of comparing.
fn write_requested() -> bool {
    std::env::var("PUSHPULL_WRITE_PTX").is_ok_and(|v| v == "1")
}

/// The first line where `a` and `b` differ (1-based), with both lines.
fn first_difference<'a>(a: &'a str, b: &'a str) -> (usize, &'a str, &'a str) {
    let (mut la, mut lb) = (a.lines(), b.lines());
    for n in 1.. {
        match (la.next(), lb.next()) {
            (Some(x), Some(y)) if x == y => continue,
            (x, y) => {
                return (
                    n,
                    x.unwrap_or("<end of file>"),
                    y.unwrap_or("<end of file>"),
                )
            }
        }
    }
    unreachable!()
}

#[test]
fn shipped_ptx_is_fresh() {
    let test = "shipped_ptx_is_fresh";
    let write = write_requested();
    let (major, minor) = SHIPPED_PTX_NVRTC;
    if !nvrtc_or_skip(test) {
        assert!(
            !write,
            "PUSHPULL_WRITE_PTX=1 needs NVRTC {major}.{minor}: run scripts/ptx.sh"
        );
        return;
    }
    let version = nvrtc_version().expect("libnvrtc loads but nvrtcVersion failed");
    if version != SHIPPED_PTX_NVRTC {
        assert!(
            !write,
            "PUSHPULL_WRITE_PTX=1 needs NVRTC {major}.{minor}, but NVRTC {}.{} is loaded: run \
             scripts/ptx.sh (it puts NVRTC {major}.{minor} from PyPI on LD_LIBRARY_PATH)",
            version.0, version.1
        );
        println!(
            "{test}: SKIPPED the comparison with {SHIPPED_PTX_FILE}: NVRTC {}.{} is loaded, the \
             shipped PTX is made by NVRTC {major}.{minor} (source .ci/nvrtc.sh to compare)",
            version.0, version.1
        );
        return;
    }
    let fresh = compile_shipped_ptx().unwrap_or_else(|e| panic!("NVRTC compile failed: {e}"));
    if write {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda/pushpull_kernels.ptx");
        if fresh == SHIPPED_PTX {
            println!("{test}: {SHIPPED_PTX_FILE} is already up to date");
        } else {
            std::fs::write(path, &fresh).unwrap_or_else(|e| panic!("writing {path}: {e}"));
            println!("{test}: wrote {path} ({} bytes)", fresh.len());
        }
        return;
    }
    if fresh != SHIPPED_PTX {
        let (line, shipped, now) = first_difference(SHIPPED_PTX, &fresh);
        panic!(
            "{SHIPPED_PTX_FILE} is stale: it is not what NVRTC {major}.{minor} makes of the \
             current kernel sources (kernels/cuda/pushpull_elem.cuh, pushpull_work.cuh, \
             pushpull_table.cuh and pushpull_kernels.cu). Run `scripts/ptx.sh` to regenerate it and commit the file with the kernel change.\n\
             First difference, line {line}:\n  shipped: {shipped}\n  fresh:   {now}"
        );
    }
    println!(
        "{test}: {SHIPPED_PTX_FILE} is what NVRTC {major}.{minor} makes of SOURCE ({} bytes)",
        fresh.len()
    );
}
