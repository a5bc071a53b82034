//! Prints the compressor throughput table (GB/s of fp32 input and ratio to memcpy).
//!
//! ```text
//! cargo run --release -p pushpull-kernels --example bench_compress -- [--threads N]
//!     [--sizes 1048576,26843546] [--min-ms 500] [--filter SUBSTRING]
//! ```

use pushpull_kernels::bench::{bench_table, format_table, BenchConfig};
use std::time::Duration;

fn main() {
    let mut cfg = BenchConfig::default();
    let mut filter: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--threads" => cfg.threads = val().parse().expect("--threads N"),
            "--sizes" => {
                cfg.sizes = val()
                    .split(',')
                    .map(|s| s.parse().expect("--sizes a,b,c"))
                    .collect()
            }
            "--min-ms" => cfg.min_time = Duration::from_millis(val().parse().expect("--min-ms N")),
            "--filter" => filter = Some(val()),
            other => panic!("unknown argument {other}"),
        }
    }
    if let Some(f) = filter {
        cfg.cases.retain(|c| c.label.contains(&f));
    }
    let rows = bench_table(&cfg);
    print!("{}", format_table(&rows, cfg.threads));
}
