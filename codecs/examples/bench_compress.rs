//! Prints the compressor throughput table (GB/s of fp32 input and ratio to memcpy).
//!
//! ```text
//! cargo run --release -p pushpull-codecs --example bench_compress -- [--threads N]
//!     [--sizes 1048576,26843546] [--min-ms 500] [--filter SUBSTRING]
//!     [--simd baseline|avx2|avx512]
//! ```
//!
//! `--simd` caps the kernels' instruction set (the default is the widest the CPU has), to
//! compare the levels in one sitting; every level gives the same bytes.

use pushpull_codecs::bench::{bench_table, format_table, BenchConfig};
use pushpull_codecs::{set_max_simd_level, simd_level, SimdLevel};
use std::time::Duration;

const USAGE: &str = "usage: bench_compress [--threads N] [--sizes N,N,...] [--min-ms N] \
                     [--filter SUBSTRING] [--simd baseline|avx2|avx512]";

fn parse() -> Result<(BenchConfig, Option<String>), String> {
    let mut cfg = BenchConfig::default();
    let mut filter: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        let number = |flag: &str, v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag} {v:?}: expected a whole number"))
        };
        match a.as_str() {
            "--threads" => cfg.threads = number("--threads", &val()?)? as usize,
            "--sizes" => {
                cfg.sizes = val()?
                    .split(',')
                    .map(|s| number("--sizes", s).map(|n| n as usize))
                    .collect::<Result<_, _>>()?
            }
            "--min-ms" => cfg.min_time = Duration::from_millis(number("--min-ms", &val()?)?),
            "--filter" => filter = Some(val()?),
            "--simd" => set_max_simd_level(match val()?.as_str() {
                "baseline" => SimdLevel::Baseline,
                "avx2" => SimdLevel::Avx2,
                "avx512" => SimdLevel::Avx512,
                v => return Err(format!("--simd {v:?}: expected baseline, avx2 or avx512")),
            }),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok((cfg, filter))
}

fn main() {
    let (mut cfg, filter) = parse().unwrap_or_else(|e| {
        eprintln!("error: {e}\n{USAGE}");
        std::process::exit(2);
    });
    if let Some(f) = filter {
        cfg.cases.retain(|c| c.label.contains(&f));
    }
    println!("instruction set: {:?}", simd_level());
    let rows = bench_table(&cfg);
    print!("{}", format_table(&rows, cfg.threads));
}
