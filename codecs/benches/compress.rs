//! Criterion benchmarks: compress, decompress and decompress-add of every compressor at 1 Mi
//! and 25.6 Mi elements, with a memcpy of the same buffer as the baseline, reported as
//! throughput of fp32 input (criterion's "thrpt", in GiB/s).
//!
//! ```text
//! cargo bench -p pushpull-codecs --bench compress              # rayon's default threads
//! RAYON_NUM_THREADS=1 cargo bench -p pushpull-codecs --bench compress   # one core
//! cargo bench -p pushpull-codecs --bench compress -- 'onebit'   # a filter
//! ```
//!
//! For the ratio-to-memcpy table use
//! `cargo run --release -p pushpull-codecs --example bench_compress`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pushpull_codecs::bench::{default_cases, test_data};
use pushpull_codecs::{
    build_from_spec, parse_params, BuildOptions, NodeIdentity, Purpose, RoundCtx,
};
use std::hint::black_box;
use std::time::Duration;

fn sizes() -> Vec<(usize, &'static str)> {
    vec![(1 << 20, "1Mi"), (26_843_546, "25.6Mi")]
}

fn benches(c: &mut Criterion) {
    for (n, label) in sizes() {
        let x = test_data(n, 0x5eed);
        let reference: Vec<f32> = x.iter().map(|v| v + 0.1).collect();
        let mut g = c.benchmark_group(format!("compress/{label}"));
        g.throughput(Throughput::Bytes(4 * n as u64));
        g.sample_size(10);
        g.warm_up_time(Duration::from_millis(500));
        g.measurement_time(Duration::from_secs(2));
        let mut dst = vec![0f32; n];
        g.bench_function("memcpy", |b| b.iter(|| dst.copy_from_slice(black_box(&x))));
        for case in default_cases() {
            let spec = parse_params(&case.params).expect("bench case");
            let opts = BuildOptions {
                purpose: Purpose::ModelAveraging,
                ..BuildOptions::default()
            };
            let mut comp = build_from_spec(&spec, n, &NodeIdentity::worker(7, 42, 0), opts)
                .expect("bench case");
            let mut out = Vec::with_capacity(comp.max_compressed_len());
            let mut round = 0u64;
            g.bench_function(BenchmarkId::new("compress", &case.label), |b| {
                b.iter(|| {
                    round += 1;
                    let ctx = RoundCtx::new(round).with_reference(&reference);
                    comp.compress(black_box(&x), &ctx, &mut out)
                        .expect("compress");
                })
            });
            let ctx = RoundCtx::new(round).with_reference(&reference);
            let payload = out.clone();
            let mut y = vec![0f32; n];
            g.bench_function(BenchmarkId::new("decompress", &case.label), |b| {
                b.iter(|| {
                    comp.decompress(black_box(&payload), &ctx, &mut y)
                        .expect("decompress")
                })
            });
            g.bench_function(BenchmarkId::new("decompress_add", &case.label), |b| {
                b.iter(|| {
                    comp.decompress_add(black_box(&payload), &ctx, &mut y)
                        .expect("decompress_add")
                })
            });
        }
        g.finish();
    }
}

criterion_group!(compress, benches);
criterion_main!(compress);
