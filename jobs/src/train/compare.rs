//! Compressor presets, `--param` overrides and the comparison table of `pushpull local`.
//!
//! A preset is a complete `[tensors.default]` map with defaults tuned on the default task
//! (see BENCHMARKS.md, "Training quality"):
//!
//! | name | map |
//! |---|---|
//! | `none` | `compressor=none` |
//! | `fp16`, `bf16` | `compressor=fp16` (`bf16`) |
//! | `onebit` | `compressor=onebit scaling=true ef=vanilla momentum=nesterov` (dist-EF-SGDM: momentum before compression, the loop's own momentum 0) |
//! | `topk` | `compressor=topk k=0.01 ef=vanilla momentum=nesterov` |
//! | `randomk` | `compressor=randomk k=0.1 ef=vanilla momentum=nesterov` |
//! | `dithering` | `compressor=dithering k=15 bucket=512` (QSGD, linear levels, max norm) |
//! | `minmax` | `compressor=minmax bits=8 bucket=512` |
//! | `dpsgd` | `compressor=none exchange=gossip`: decentralised SGD, full-precision models averaged with the graph neighbours (the baseline of the next two) |
//! | `moniqua` | `compressor=moniqua theta=1 theta_schedule=lr bits=2 exchange=gossip`: Moniqua (θ = the step's learning rate, the paper's θ ∝ α; stochastic rounding, shared draws) |
//! | `minmax-gossip` | `compressor=minmax bits=2 bucket=512 exchange=gossip`: quantised differences without the modulo (min-max per bucket; `x_i + Σ_j W_ij (Q(x_j) − Q(x_i))`, the rounding draws shared) |
//! | `minmax-direct` | `compressor=minmax bits=2 bucket=512 exchange=gossip_direct`: the naive direct quantisation of Moniqua's equation 4 (`W_ii x_i + Σ_j W_ij Q(x_j)`), which its Theorem 1 shows stalling |
//!
//! The gossip presets run decentralised SGD (see the [module docs](super)) over the cluster's
//! `[gossip]` graph (a ring by default).
//!
//! `logistic` in a `--compare` list is not a compressor: it is the baseline row, logistic
//! regression on the same data, uncompressed.

use std::collections::BTreeMap;

use pushpull_proto::Config;
use serde::{Deserialize, Serialize};

use super::TrainReport;

/// The names `--compressor` and `--compare` accept (`--compare` also takes `logistic`).
pub const PRESETS: &[&str] = &[
    "none",
    "fp16",
    "bf16",
    "onebit",
    "topk",
    "randomk",
    "dithering",
    "dithering-elias",
    "minmax",
    "dpsgd",
    "moniqua",
    "minmax-gossip",
    "minmax-direct",
];

/// The row name of the logistic-regression baseline.
pub const BASELINE: &str = "logistic";

/// The `[tensors.default]` map of a preset.
///
/// # Errors
/// An unknown name, naming it and the presets.
pub fn preset(name: &str) -> Result<BTreeMap<String, String>, String> {
    let pairs: &[(&str, &str)] = match name {
        "none" => &[("compressor", "none")],
        "fp16" => &[("compressor", "fp16")],
        "bf16" => &[("compressor", "bf16")],
        "onebit" => &[
            ("compressor", "onebit"),
            ("scaling", "true"),
            ("ef", "vanilla"),
            ("momentum", "nesterov"),
        ],
        "topk" => &[
            ("compressor", "topk"),
            ("k", "0.01"),
            ("ef", "vanilla"),
            ("momentum", "nesterov"),
        ],
        "randomk" => &[
            ("compressor", "randomk"),
            ("k", "0.1"),
            ("ef", "vanilla"),
            ("momentum", "nesterov"),
        ],
        "dithering" => &[("compressor", "dithering"), ("k", "15"), ("bucket", "512")],
        // QSGD's coding of gaps and levels (the paper's section 3.2) over few levels, where most
        // values are 0 or small integers the code spends few bits on; Elias gamma, which costs
        // less than the paper's recursive code at these levels and gaps (BENCHMARKS.md, "QSGD's
        // Elias code").
        "dithering-elias" => &[
            ("compressor", "dithering"),
            ("k", "4"),
            ("bucket", "512"),
            ("encoding", "elias"),
        ],
        "minmax" => &[("compressor", "minmax"), ("bits", "8"), ("bucket", "512")],
        "dpsgd" => &[("compressor", "none"), ("exchange", "gossip")],
        "moniqua" => &[
            ("compressor", "moniqua"),
            ("theta", "1"),
            ("theta_schedule", "lr"),
            ("bits", "2"),
            ("exchange", "gossip"),
        ],
        "minmax-gossip" => &[
            ("compressor", "minmax"),
            ("bits", "2"),
            ("bucket", "512"),
            ("exchange", "gossip"),
        ],
        "minmax-direct" => &[
            ("compressor", "minmax"),
            ("bits", "2"),
            ("bucket", "512"),
            ("exchange", "gossip_direct"),
        ],
        other => {
            return Err(format!(
                "unknown compressor {other:?}: one of {}",
                PRESETS.join(", ")
            ))
        }
    };
    Ok(pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// Parses a `--param k=v` value.
///
/// # Errors
/// No `=`, or an empty key.
pub fn parse_param(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("--param {s:?}: expected KEY=VALUE, e.g. k=0.01")),
    }
}

/// Sets `[tensors.default]` of `config` to `map` (replacing it whole).
pub fn set_default_map(config: &mut Config, map: &BTreeMap<String, String>) {
    let table = map
        .iter()
        .map(|(k, v)| (k.clone(), toml::Value::String(v.clone())))
        .collect();
    config.tensors.tables.insert("default".to_string(), table);
}

/// One run (one compressor, one seed) as the table shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunRow {
    /// The preset (or `logistic`).
    pub name: String,
    /// The job seed.
    pub seed: u64,
    /// `[tensors.default]` of the largest tensor, `key=value` pairs.
    pub compression: String,
    /// Test accuracy (the same on every worker).
    pub test_accuracy: f64,
    /// Final training loss, mean over workers.
    pub train_loss: f64,
    /// Test loss.
    pub test_loss: f64,
    /// Steps.
    pub steps: u32,
    /// Parameters.
    pub params: u64,
    /// Raw fp32 bytes per worker.
    pub raw_bytes: u64,
    /// Bytes pushed per worker (mean over workers).
    pub bytes_pushed: u64,
    /// Bytes pulled per worker (mean over workers).
    pub bytes_pulled: u64,
    /// raw / pushed.
    pub compression_ratio: f64,
    /// Seconds compressing per worker (mean).
    pub compress_seconds: f64,
    /// Seconds decompressing per worker (mean).
    pub decompress_seconds: f64,
    /// Seconds in forward, backward and the optimizer per worker (mean).
    pub compute_seconds: f64,
    /// Seconds in the push_pulls per worker (mean).
    pub exchange_seconds: f64,
    /// Seconds of a worker's whole training run (mean; data and evaluation included).
    pub train_seconds: f64,
    /// Wall seconds of the whole local cluster run.
    pub wall_seconds: f64,
}

impl RunRow {
    /// Summarises the workers' reports of one run.
    pub fn from_reports(name: &str, reports: &[TrainReport], wall_seconds: f64) -> RunRow {
        let n = reports.len().max(1) as f64;
        let mean = |f: &dyn Fn(&TrainReport) -> f64| reports.iter().map(f).sum::<f64>() / n;
        let first = reports.first();
        let raw = mean(&|r| r.raw_bytes as f64);
        let pushed = mean(&|r| r.bytes_pushed as f64);
        RunRow {
            name: name.to_string(),
            seed: first.map_or(0, |r| r.seed),
            compression: first.map_or_else(String::new, |r| r.compression.clone()),
            test_accuracy: first.map_or(0.0, |r| r.test_accuracy),
            train_loss: mean(&|r| r.train_loss),
            test_loss: first.map_or(0.0, |r| r.test_loss),
            steps: first.map_or(0, |r| r.steps),
            params: first.map_or(0, |r| r.params),
            raw_bytes: raw.round() as u64,
            bytes_pushed: pushed.round() as u64,
            bytes_pulled: mean(&|r| r.bytes_pulled as f64).round() as u64,
            compression_ratio: if pushed > 0.0 { raw / pushed } else { 1.0 },
            compress_seconds: mean(&|r| r.compress_seconds),
            decompress_seconds: mean(&|r| r.decompress_seconds),
            compute_seconds: mean(&|r| r.compute_seconds),
            exchange_seconds: mean(&|r| r.exchange_seconds),
            train_seconds: mean(&|r| r.wall_seconds),
            wall_seconds,
        }
    }
}

/// Mean and sample standard deviation (0 for one value).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Stat {
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation (n − 1).
    pub sd: f64,
}

impl Stat {
    /// Over `xs` (non-empty).
    pub fn of(xs: &[f64]) -> Stat {
        let n = xs.len().max(1) as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let sd = if xs.len() > 1 {
            (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        Stat { mean, sd }
    }

    fn show(&self, scale: f64, decimals: usize, with_sd: bool) -> String {
        if with_sd {
            format!(
                "{:.*} ± {:.*}",
                decimals,
                self.mean * scale,
                decimals,
                self.sd * scale
            )
        } else {
            format!("{:.*}", decimals, self.mean * scale)
        }
    }
}

/// One line of the table: a preset over all seeds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SummaryRow {
    /// The preset (or `logistic`).
    pub name: String,
    /// `key=value` pairs of the map.
    pub compression: String,
    /// Seeds run.
    pub seeds: Vec<u64>,
    /// Test accuracy.
    pub test_accuracy: Stat,
    /// Final training loss.
    pub train_loss: Stat,
    /// Steps.
    pub steps: u32,
    /// Raw fp32 bytes per worker.
    pub raw_bytes: f64,
    /// Bytes pushed per worker.
    pub bytes_pushed: f64,
    /// Bytes pulled per worker.
    pub bytes_pulled: f64,
    /// raw / pushed.
    pub compression_ratio: f64,
    /// Wall seconds per run.
    pub wall_seconds: Stat,
}

/// What `pushpull local` (the training job) prints: every run and the table.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CompareReport {
    /// Workers per run.
    pub num_workers: u32,
    /// Servers per run.
    pub num_servers: u32,
    /// Model layer widths of the MLP runs.
    pub widths: Vec<usize>,
    /// MLP parameters.
    pub params: u64,
    /// Every run, in order.
    pub runs: Vec<RunRow>,
    /// One row per preset, in the order asked.
    pub summary: Vec<SummaryRow>,
}

impl CompareReport {
    /// Groups `runs` by name (first-seen order) into the summary.
    pub fn new(
        num_workers: u32,
        num_servers: u32,
        widths: Vec<usize>,
        params: u64,
        runs: Vec<RunRow>,
    ) -> CompareReport {
        let mut names: Vec<String> = Vec::new();
        for r in &runs {
            if !names.contains(&r.name) {
                names.push(r.name.clone());
            }
        }
        let summary = names
            .iter()
            .map(|name| {
                let rs: Vec<&RunRow> = runs.iter().filter(|r| &r.name == name).collect();
                let n = rs.len() as f64;
                let mean = |f: &dyn Fn(&RunRow) -> f64| rs.iter().map(|r| f(r)).sum::<f64>() / n;
                let raw = mean(&|r| r.raw_bytes as f64);
                let pushed = mean(&|r| r.bytes_pushed as f64);
                SummaryRow {
                    name: name.clone(),
                    compression: rs[0].compression.clone(),
                    seeds: rs.iter().map(|r| r.seed).collect(),
                    test_accuracy: Stat::of(
                        &rs.iter().map(|r| r.test_accuracy).collect::<Vec<_>>(),
                    ),
                    train_loss: Stat::of(&rs.iter().map(|r| r.train_loss).collect::<Vec<_>>()),
                    steps: rs[0].steps,
                    raw_bytes: raw,
                    bytes_pushed: pushed,
                    bytes_pulled: mean(&|r| r.bytes_pulled as f64),
                    compression_ratio: if pushed > 0.0 { raw / pushed } else { 1.0 },
                    wall_seconds: Stat::of(&rs.iter().map(|r| r.wall_seconds).collect::<Vec<_>>()),
                }
            })
            .collect();
        CompareReport {
            num_workers,
            num_servers,
            widths,
            params,
            runs,
            summary,
        }
    }

    /// The table (like the BytePS RFC's CIFAR100 table) and, for every compressed row, the
    /// accuracy difference and bytes saved against `none`.
    pub fn to_text(&self) -> String {
        let multi = self.summary.iter().any(|s| s.seeds.len() > 1);
        let seeds = self
            .summary
            .first()
            .map(|s| s.seeds.clone())
            .unwrap_or_default();
        let mut out = format!(
            "pushpull local: training an MLP {:?} ({} parameters) on {} workers x {} servers; \
             seeds {:?}{}\n",
            self.widths,
            self.params,
            self.num_workers,
            self.num_servers,
            seeds,
            if multi {
                " (mean ± sd over seeds)"
            } else {
                ""
            },
        );
        let header = [
            "run",
            "test acc %",
            "final loss",
            "steps",
            "pushed/worker",
            "pulled/worker",
            "ratio",
            "wall s",
            "map (largest tensor)",
        ];
        let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
        for s in &self.summary {
            rows.push(vec![
                s.name.clone(),
                s.test_accuracy.show(100.0, 2, multi),
                s.train_loss.show(1.0, 4, multi),
                s.steps.to_string(),
                human_bytes(s.bytes_pushed),
                human_bytes(s.bytes_pulled),
                format!("{:.1}x", s.compression_ratio),
                s.wall_seconds.show(1.0, 1, false),
                s.compression.clone(),
            ]);
        }
        let widths: Vec<usize> = (0..header.len())
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        for (i, r) in rows.iter().enumerate() {
            let cells: Vec<String> = r
                .iter()
                .enumerate()
                .map(|(c, cell)| {
                    let pad = widths[c] - cell.chars().count();
                    if c == 0 || c + 1 == r.len() {
                        format!("{cell}{}", " ".repeat(pad))
                    } else {
                        format!("{}{cell}", " ".repeat(pad))
                    }
                })
                .collect();
            out.push_str("  ");
            out.push_str(cells.join("  ").trim_end());
            out.push('\n');
            if i == 0 {
                let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
                out.push_str(&format!("  {}\n", "-".repeat(total.min(120))));
            }
        }
        if let Some(base) = self.summary.iter().find(|s| s.name == "none") {
            for s in self.summary.iter().filter(|s| s.name != "none") {
                let diff = 100.0 * (s.test_accuracy.mean - base.test_accuracy.mean);
                if s.name == BASELINE {
                    out.push_str(&format!(
                        "  {}: {:+.2} points of accuracy vs the uncompressed MLP (the task is \
                         not linearly separable)\n",
                        s.name, diff
                    ));
                } else {
                    out.push_str(&format!(
                        "  {}: {:+.2} points of accuracy vs none; pushed {:.1}x fewer bytes \
                         ({} saved per worker)\n",
                        s.name,
                        diff,
                        if s.bytes_pushed > 0.0 {
                            base.bytes_pushed / s.bytes_pushed
                        } else {
                            1.0
                        },
                        human_bytes((base.bytes_pushed - s.bytes_pushed).max(0.0)),
                    ));
                }
            }
        }
        out.trim_end().to_string()
    }
}

/// `1234567.0` -> `1.23 MB` (decimal units).
pub fn human_bytes(b: f64) -> String {
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.2} kB", b / 1e3)
    } else {
        format!("{b:.0} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_and_params_parse() {
        for p in PRESETS {
            // A preset is named after its compressor (and, after a dash, its variant);
            // decentralised SGD's full-precision baseline after its algorithm.
            let map = preset(p).unwrap();
            let gossip = map
                .get("exchange")
                .is_some_and(|e| e == "gossip" || e == "gossip_direct");
            let codec = if *p == "dpsgd" {
                "none"
            } else {
                p.split('-').next().unwrap()
            };
            assert_eq!(map["compressor"], codec, "{p}");
            assert_eq!(
                gossip,
                ["dpsgd", "moniqua", "minmax-gossip", "minmax-direct"].contains(p),
                "{p}"
            );
        }
        assert_eq!(preset("dithering-elias").unwrap()["encoding"], "elias");
        assert!(preset("zip").unwrap_err().contains("onebit"));
        assert_eq!(parse_param("k=0.1").unwrap(), ("k".into(), "0.1".into()));
        assert!(parse_param("k").is_err());
        assert!(parse_param("=1").is_err());
    }

    #[test]
    fn stats_are_mean_and_sample_sd() {
        let s = Stat::of(&[1.0, 2.0, 3.0]);
        assert!((s.mean - 2.0).abs() < 1e-12 && (s.sd - 1.0).abs() < 1e-12);
        assert_eq!(Stat::of(&[5.0]).sd, 0.0);
    }
}
