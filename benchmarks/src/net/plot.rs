//! `pushpull bench net --plot FILE.svg`: the report as a picture (plotters' SVG backend).
//!
//! One panel per rate of the compressor series: seconds per round of every compressor (the
//! median as a dot, the fastest and slowest round as a bar) next to its wire floor (a red dash),
//! on a log scale, so a glance shows how far each run is from the floor. Then, if the scaling
//! series ran, seconds per round and the floor against the size per worker (log-log), and
//! against the number of servers. Then, for `--job train`, seconds per training step per
//! compressor next to the compute alone.

use std::path::Path;

use plotters::prelude::*;

use super::report::RunRow;
use super::train::{mean_sd, TrainRow, COMPUTE_ONLY};
use pushpull_node::error::{CliError, CliResult};

const MEASURED: RGBColor = RGBColor(31, 119, 180);
const FLOOR: RGBColor = RGBColor(214, 39, 40);
const PANEL: (u32, u32) = (760, 380);

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// A tick label: up to three significant decimals, no trailing zeros (`0.25`, `2`, `10`).
fn tick(v: &f64) -> String {
    let s = if *v >= 10.0 {
        format!("{v:.0}")
    } else if *v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn err(e: impl std::fmt::Display) -> CliError {
    CliError::failed(format!("drawing the plot: {e}"))
}

/// The y range of a log axis holding every value of `values` (positive ones).
fn log_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::INFINITY, 0.0f64), |(a, b), v| (a.min(v), b.max(v)));
    if !lo.is_finite() {
        return 0.01..1.0;
    }
    (lo / 1.6)..(hi * 1.6)
}

/// Tick positions of a log axis over `r`: 1, 2 and 5 times each power of ten inside it (plotters'
/// own log ticks are powers of ten only, often a single label).
fn log_ticks(r: &std::ops::Range<f64>) -> Vec<f64> {
    let mut v = Vec::new();
    let mut p = 10f64.powf(r.start.max(1e-9).log10().floor());
    while p <= r.end {
        for m in [1.0, 2.0, 5.0] {
            let t = p * m;
            if (r.start..=r.end).contains(&t) {
                v.push(t);
            }
        }
        p *= 10.0;
    }
    v
}

/// One panel: categories along x, for each a measured median with its min-max and a floor.
fn categories(
    area: &Area<'_>,
    title: &str,
    y_label: &str,
    items: &[(String, f64, f64, f64, f64)],
    (measured, floor): (&str, &str),
) -> CliResult<()> {
    let y = log_range(items.iter().flat_map(|i| [i.1, i.2, i.3, i.4]));
    let n = items.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(
            -0.5..(n - 0.5),
            y.clone().log_scale().with_key_points(log_ticks(&y)),
        )
        .map_err(err)?;
    let labels: Vec<String> = items.iter().map(|i| i.0.clone()).collect();
    chart
        .configure_mesh()
        .x_labels(items.len().max(1))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_desc(format!("dot: {measured}; red bar: {floor}"))
        .y_desc(y_label)
        .y_label_formatter(&tick)
        .light_line_style(TRANSPARENT)
        .disable_x_mesh()
        .draw()
        .map_err(err)?;
    let xs = || items.iter().enumerate().map(|(i, it)| (i as f64, it));
    chart
        .draw_series(
            xs().map(|(x, it)| {
                PathElement::new(vec![(x, it.2), (x, it.3)], MEASURED.stroke_width(2))
            }),
        )
        .map_err(err)?;
    chart
        .draw_series(xs().map(|(x, it)| Circle::new((x, it.1), 5, MEASURED.filled())))
        .map_err(err)?;
    chart
        .draw_series(xs().map(|(x, it)| {
            PathElement::new(
                vec![(x - 0.3, it.4), (x + 0.3, it.4)],
                FLOOR.stroke_width(3),
            )
        }))
        .map_err(err)?;
    Ok(())
}

/// Seconds per round and the floor against `x` (log-log), one line each.
fn lines(area: &Area<'_>, title: &str, x_label: &str, points: &[(f64, f64, f64)]) -> CliResult<()> {
    let x = log_range(points.iter().map(|p| p.0));
    let y = log_range(points.iter().flat_map(|p| [p.1, p.2]));
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(
            x.clone().log_scale().with_key_points(log_ticks(&x)),
            y.clone().log_scale().with_key_points(log_ticks(&y)),
        )
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(format!(
            "{x_label} (blue: push_pull, median s/round; red: wire floor)"
        ))
        .y_desc("seconds per round")
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            points.iter().map(|p| (p.0, p.1)),
            MEASURED.stroke_width(2),
        ))
        .map_err(err)?;
    chart
        .draw_series(
            points
                .iter()
                .map(|p| Circle::new((p.0, p.1), 4, MEASURED.filled())),
        )
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            points.iter().map(|p| (p.0, p.2)),
            FLOOR.stroke_width(2),
        ))
        .map_err(err)?;
    Ok(())
}

/// The size (MB per worker) the server-count runs share: the one run at the most server counts
/// (the largest on a tie).
fn server_series_size(scaling: &[&RunRow]) -> f64 {
    let mut best = (0usize, 0.0f64);
    for r in scaling {
        let mut counts: Vec<u32> = scaling
            .iter()
            .filter(|o| (o.mb_per_worker - r.mb_per_worker).abs() < 1e-9)
            .map(|o| o.servers)
            .collect();
        counts.sort_unstable();
        counts.dedup();
        if (counts.len(), r.mb_per_worker) > best {
            best = (counts.len(), r.mb_per_worker);
        }
    }
    best.1
}

/// Draws the report's charts into `path` (see the module docs).
pub fn draw(path: &Path, runs: &[RunRow], train: &[TrainRow]) -> CliResult<()> {
    let mut rates: Vec<&str> = Vec::new();
    for r in runs.iter().filter(|r| r.series == "compressors") {
        if !rates.contains(&r.rate.as_str()) {
            rates.push(&r.rate);
        }
    }
    let scaling: Vec<&RunRow> = runs.iter().filter(|r| r.series == "scaling").collect();
    let mut train_rates: Vec<&str> = Vec::new();
    for r in train {
        if !train_rates.contains(&r.rate.as_str()) {
            train_rates.push(&r.rate);
        }
    }
    let panels = rates.len() + usize::from(!scaling.is_empty()) * 2 + train_rates.len();
    if panels == 0 {
        return Err(CliError::failed("nothing to plot: no run finished"));
    }
    let root = SVGBackend::new(path, (PANEL.0, PANEL.1 * panels as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let areas = root.split_evenly((panels, 1));
    let mut next = areas.iter();
    for rate in &rates {
        let rows: Vec<&RunRow> = runs
            .iter()
            .filter(|r| r.series == "compressors" && r.rate == *rate)
            .collect();
        let items: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r.compressor.clone(),
                    r.median_seconds,
                    r.min_seconds,
                    r.max_seconds,
                    r.floor_seconds,
                )
            })
            .collect();
        let (w, s, mb) = rows
            .first()
            .map_or((0, 0, 0.0), |r| (r.workers, r.servers, r.mb_per_worker));
        let title = format!("{rate}, {w} workers x {s} servers, {mb:.1} MB fp32 per worker");
        let area = next.next().expect("one area per panel");
        categories(
            area,
            &title,
            "seconds per round",
            &items,
            ("push_pull (median, min-max)", "wire floor"),
        )?;
    }
    if !scaling.is_empty() {
        let top = scaling.iter().map(|r| r.servers).max().unwrap_or(1);
        let mut sizes: Vec<(f64, f64, f64)> = scaling
            .iter()
            .filter(|r| r.servers == top)
            .map(|r| (r.mb_per_worker, r.median_seconds, r.floor_seconds))
            .collect();
        sizes.sort_by(|a, b| a.0.total_cmp(&b.0));
        sizes.dedup_by(|a, b| (a.0 - b.0).abs() < 1e-9);
        let head = scaling[0];
        let area = next.next().expect("one area per panel");
        lines(
            area,
            &format!(
                "scaling: {} at {}, {} workers x {top} servers",
                head.compressor, head.rate, head.workers
            ),
            "MB fp32 per worker per round",
            &sizes,
        )?;
        let full = server_series_size(&scaling);
        let mut servers: Vec<(f64, f64, f64)> = scaling
            .iter()
            .filter(|r| (r.mb_per_worker - full).abs() < 1e-9)
            .map(|r| (r.servers as f64, r.median_seconds, r.floor_seconds))
            .collect();
        servers.sort_by(|a, b| a.0.total_cmp(&b.0));
        servers.dedup_by(|a, b| a.0 == b.0);
        let area = next.next().expect("one area per panel");
        lines(
            area,
            &format!(
                "scaling: {} at {}, {full:.0} MB per worker, {} workers",
                head.compressor, head.rate, head.workers
            ),
            "servers",
            &servers,
        )?;
    }
    for rate in &train_rates {
        let mut names: Vec<&str> = Vec::new();
        for r in train.iter().filter(|r| r.rate == *rate) {
            if r.compressor != COMPUTE_ONLY && !names.contains(&r.compressor.as_str()) {
                names.push(&r.compressor);
            }
        }
        let step = |c: &str| -> Vec<f64> {
            train
                .iter()
                .filter(|r| r.rate == *rate && r.compressor == c)
                .map(|r| r.step_seconds)
                .collect()
        };
        let alone = mean_sd(&step(COMPUTE_ONLY)).0;
        let items: Vec<_> = names
            .iter()
            .map(|c| {
                let s = step(c);
                let lo = s.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = s.iter().copied().fold(0.0, f64::max);
                (c.to_string(), mean_sd(&s).0, lo, hi, alone)
            })
            .collect();
        let area = next.next().expect("one area per panel");
        categories(
            area,
            &format!("training at {rate}: seconds per step"),
            "seconds per step",
            &items,
            ("step (mean, min-max over seeds)", "compute alone"),
        )?;
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_panel_uses_the_size_run_at_most_server_counts() {
        let row = |mb: f64, servers: u32| RunRow {
            series: "scaling".into(),
            mb_per_worker: mb,
            servers,
            ..RunRow::default()
        };
        let rows = [
            row(1.0, 4),
            row(100.0, 4),
            row(400.0, 4),
            row(102.2, 1),
            row(102.2, 2),
            row(102.2, 4),
        ];
        let refs: Vec<&RunRow> = rows.iter().collect();
        assert_eq!(server_series_size(&refs), 102.2);
    }

    #[test]
    fn log_ticks_are_1_2_5_inside_the_range() {
        assert_eq!(log_ticks(&(0.06..1.3)), vec![0.1, 0.2, 0.5, 1.0]);
        assert_eq!(log_ticks(&(3.0..60.0)), vec![5.0, 10.0, 20.0, 50.0]);
    }

    #[test]
    fn ticks_are_short() {
        assert_eq!(tick(&0.30000000001), "0.3");
        assert_eq!(tick(&2.0), "2");
        assert_eq!(tick(&12.34), "12");
        assert_eq!(tick(&0.125), "0.125");
        assert_eq!(tick(&1.5), "1.5");
    }
}
