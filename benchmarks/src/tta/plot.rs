//! `pushpull bench train --plot FILE.svg`: per rate, two charts side by side, validation bits
//! per byte against training seconds and against steps, one line per run (a colour per system
//! and placement, the legend naming it once; several seeds share the colour), the target as a
//! grey line (plotters' SVG backend, as `bench net --plot`).

use std::path::Path;

use plotters::prelude::*;

use super::report::TtaRun;
use pushpull_node::error::{CliError, CliResult};

const PANEL: (u32, u32) = (640, 420);
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn err(e: impl std::fmt::Display) -> CliError {
    CliError::failed(format!("drawing the plot: {e}"))
}

/// A run's line label: `system (placement)`.
pub fn label(r: &TtaRun) -> String {
    format!("{} ({})", r.system, r.placement)
}

/// The x and y ranges of the runs' points (`x` picks training seconds or steps), with a margin.
fn ranges(runs: &[&TtaRun], x: impl Fn(&super::report::Eval) -> f64) -> ((f64, f64), (f64, f64)) {
    let mut xr = (0.0f64, 0.0f64);
    let mut yr = (f64::INFINITY, f64::NEG_INFINITY);
    for e in runs.iter().flat_map(|r| &r.evals) {
        xr.1 = xr.1.max(x(e));
        yr = (yr.0.min(e.val_bpb), yr.1.max(e.val_bpb));
    }
    for t in runs.iter().filter_map(|r| r.target_bpb) {
        yr = (yr.0.min(t), yr.1.max(t));
    }
    if !yr.0.is_finite() {
        yr = (0.0, 8.0);
    }
    let pad = ((yr.1 - yr.0) * 0.05).max(0.01);
    ((0.0, xr.1.max(1e-3) * 1.02), (yr.0 - pad, yr.1 + pad))
}

fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    title: &str,
    x_desc: &str,
    runs: &[&TtaRun],
    x: impl Fn(&super::report::Eval) -> f64 + Copy,
) -> CliResult<()> {
    let ((x0, x1), (y0, y1)) = ranges(runs, x);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("validation bits per byte")
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(err)?;
    let mut targets: Vec<f64> = Vec::new();
    for t in runs.iter().filter_map(|r| r.target_bpb) {
        if !targets.iter().any(|u| (u - t).abs() < 1e-12) {
            targets.push(t);
        }
    }
    for t in targets {
        chart
            .draw_series(LineSeries::new(
                [(x0, t), (x1, t)],
                RGBColor(170, 170, 170).stroke_width(1),
            ))
            .map_err(err)?;
    }
    let mut labels: Vec<String> = Vec::new();
    for r in runs {
        let name = label(r);
        let (i, first) = match labels.iter().position(|l| *l == name) {
            Some(i) => (i, false),
            None => {
                labels.push(name.clone());
                (labels.len() - 1, true)
            }
        };
        let colour = PALETTE[i % PALETTE.len()];
        let series = chart
            .draw_series(LineSeries::new(
                r.evals.iter().map(|e| (x(e), e.val_bpb)),
                colour.stroke_width(2),
            ))
            .map_err(err)?;
        if first {
            series.label(name).legend(move |(lx, ly)| {
                PathElement::new(vec![(lx, ly), (lx + 18, ly)], colour.stroke_width(2))
            });
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Draws the runs into `path` (see the module docs); `rates` in the order of the sitting.
pub fn draw(path: &Path, rates: &[String], runs: &[TtaRun]) -> CliResult<()> {
    let rates: Vec<&String> = rates
        .iter()
        .filter(|r| runs.iter().any(|x| &x.rate == *r))
        .collect();
    if rates.is_empty() {
        return Err(CliError::failed("nothing to plot: no run finished"));
    }
    let root =
        SVGBackend::new(path, (PANEL.0 * 2, PANEL.1 * rates.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let rows = root.split_evenly((rates.len(), 2));
    for (i, rate) in rates.iter().enumerate() {
        let these: Vec<&TtaRun> = runs.iter().filter(|r| &r.rate == *rate).collect();
        let shaped = if rate.as_str() == super::plan::UNSHAPED {
            "no tbf".to_string()
        } else {
            rate.to_string()
        };
        panel(
            &rows[2 * i],
            &format!("{shaped}: validation bpb against training time"),
            "training seconds (evaluation off the clock)",
            &these,
            |e| e.wall_s,
        )?;
        panel(
            &rows[2 * i + 1],
            &format!("{shaped}: validation bpb against steps"),
            "steps",
            &these,
            |e| e.step as f64,
        )?;
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::report::tests::run;
    use super::*;

    #[test]
    fn a_plot_is_drawn() {
        let runs = vec![
            run("ddp:none", "no servers", &[(0, 0.0, 8.0), (10, 2.0, 4.0)]),
            run(
                "pushpull:onebit",
                "colocated",
                &[(0, 0.0, 8.0), (10, 1.0, 4.5)],
            ),
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tta.svg");
        draw(&path, &["100mbit".to_string()], &runs).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("pushpull:onebit (colocated)"), "no legend");
        assert!(svg.contains("against steps"));
        assert!(draw(&path, &["1gbit".to_string()], &runs).is_err());
    }
}
