//! Compiles the CUDA element functions for the host (kernels/cuda/host_shim.cpp, which includes
//! kernels/cuda/pushpull_elem.cuh and pushpull_work.cuh) with the `cc` crate and links them into the crate, so tests
//! can compare the CUDA math with the Rust path bit for bit on machines without a GPU.
//!
//! The flags matter: `-ffp-contract=off` forbids fusing `a * b + c` into an FMA (the device side
//! uses NVRTC's `--fmad=false`) and `-fno-fast-math` keeps IEEE semantics. The `.cu`/`.cuh`
//! sources themselves are embedded with `include_str!` in src/cuda/mod.rs for run-time NVRTC
//! compilation; this script only tells cargo to rebuild when they change.

fn main() {
    let sources = [
        "cuda/pushpull_elem.cuh",
        "cuda/pushpull_work.cuh",
        "cuda/pushpull_table.cuh",
        "cuda/pushpull_kernels.cu",
        "cuda/host_shim.cpp",
    ];
    for s in sources {
        println!("cargo:rerun-if-changed={s}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    cc::Build::new()
        .cpp(true)
        .file("cuda/host_shim.cpp")
        .include("cuda")
        .flag("-std=c++17")
        .flag("-O2")
        .flag("-ffp-contract=off")
        .flag("-fno-fast-math")
        .warnings(true)
        .extra_warnings(true)
        .compile("pushpull_cuda_host_shim");
}
