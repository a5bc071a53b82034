//! CNTK's column-wise onebit (`columns = C`, column-major: a column is `len / C` contiguous
//! elements) through the real scheduler and servers, against a plain per-column
//! implementation written here: the scheduler cuts the tensor at column boundaries, so each
//! column's levels are those of the whole column however the tensor is chunked.

use pushpull_worker::Reduce;

mod common;
use common::set::map;
use common::*;

/// Plain column-wise onebit of `x` with `columns` columns: each element becomes the mean of
/// its column's negative elements if it is negative, else of its non-negative ones (sums in
/// f64 from +0.0 in index order, rounded to f32).
fn plain(x: &[f32], columns: usize) -> Vec<f32> {
    let rows = x.len() / columns;
    let mut out = Vec::with_capacity(x.len());
    for col in x.chunks(rows) {
        let mean = |neg: bool| {
            let v: Vec<f64> = col
                .iter()
                .filter(|&&a| (a < 0.0) == neg)
                .map(|&a| a as f64)
                .collect();
            if v.is_empty() {
                0.0
            } else {
                (v.iter().fold(0.0, |s, a| s + a) / v.len() as f64) as f32
            }
        };
        let (p, q) = (mean(false), mean(true));
        out.extend(col.iter().map(|&a| if a < 0.0 { q } else { p }));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_wise_tensor_spanning_chunks_keeps_its_columns_whole() {
    tokio::time::timeout(TIMEOUT, async {
        let seed = seed();
        // 64 KiB partitions hold 3.3 columns of 5000: chunks of 3 columns.
        let s = stack(2, 2, 64 * 1024).await;
        let (columns, len) = (6usize, 30_000u64);
        let params = map(&[("compressor", "onebit"), ("columns", "6"), ("ef", "none")]);
        let ts = declare_all_with(&s, "w", len, params).await;
        assert_eq!(ts[0].num_chunks(), 2);
        let xs: Vec<Vec<f32>> = (0..2u64)
            .map(|r| data(seed ^ (r << 32), len as usize))
            .collect();
        let calls = s
            .workers
            .iter()
            .zip(&ts)
            .zip(&xs)
            .map(|((w, t), x)| w.push_pull(t, x.clone(), Reduce::Sum));
        let got: Vec<Vec<f32>> = futures_util::future::join_all(calls)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        // Each worker's decoded push, summed in rank order, compressed again by the server.
        let sum: Vec<f32> = plain(&xs[0], columns)
            .iter()
            .zip(plain(&xs[1], columns))
            .map(|(a, b)| a + b)
            .collect();
        let want = plain(&sum, columns);
        for (r, g) in got.iter().enumerate() {
            if let Some(i) = (0..g.len()).find(|&i| g[i].to_bits() != want[i].to_bits()) {
                panic!(
                    "seed {seed}: rank {r} element {i} (column {}): {} against the plain {}",
                    i / 5000,
                    g[i],
                    want[i]
                );
            }
        }
        // Not a trivial result: two levels per column, twelve in all.
        let mut levels: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
        levels.sort();
        levels.dedup();
        assert!(levels.len() > 6, "{} distinct values", levels.len());
        s.finish_all().await;
    })
    .await
    .expect("timed out");
}

/// Columns that do not divide the tensor are refused at declare, naming the tensor's length
/// and the columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn columns_that_do_not_divide_the_tensor_are_refused_by_name() {
    tokio::time::timeout(TIMEOUT, async {
        let s = stack(1, 1, 64 * 1024).await;
        let params = map(&[("compressor", "onebit"), ("columns", "7"), ("ef", "none")]);
        let e = s.workers[0]
            .declare("w", 30_001, params)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("not 7 whole columns") && e.contains("30001"),
            "{e}"
        );
        s.finish_all().await;
    })
    .await
    .expect("timed out");
}
