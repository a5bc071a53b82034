//! `pushpull bench net --job train`: the training job ([`pushpull_jobs::train`]) on the shaped
//! network, per compressor and seed, next to the same job with every push_pull skipped (the
//! compute alone), so a row says how much communication adds to a training step and what the
//! compressor buys over uncompressed training.
//!
//! A run is one cluster ([`super::cluster::run_cluster`]) whose workers run `job.kind =
//! "train"`; its [`TrainRow`] takes the workers' own reports ([`pushpull_jobs::train::TrainReport`]):
//! seconds per step are their compute plus push_pull seconds over the steps (the mean over
//! workers, which move in lockstep), without data generation and evaluation.

use std::collections::BTreeMap;

use pushpull_proto::Config;
use serde::{Deserialize, Serialize};

use super::cluster::{run_cluster, RunLimits};
use super::topo::Topology;
use pushpull_jobs::train::compare::preset;
use pushpull_jobs::JobConfig;
use pushpull_launch::procs::Programs;
use pushpull_node::error::{CliError, CliResult};

/// The row name of the runs without push_pull.
pub const COMPUTE_ONLY: &str = "compute only";

/// What the training series runs.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainPlan {
    /// Training presets ([`pushpull_jobs::train::compare::PRESETS`]).
    pub compressors: Vec<String>,
    /// Job seeds, one run per compressor and seed.
    pub seeds: Vec<u64>,
    /// Hidden widths of the MLP.
    pub hidden: Vec<u32>,
    /// Samples per worker per step.
    pub batch_size: u32,
    /// SGD steps.
    pub steps: u32,
}

/// One training run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrainRow {
    /// Rate label.
    pub rate: String,
    /// Preset, or [`COMPUTE_ONLY`].
    pub compressor: String,
    /// The preset's map.
    pub params: BTreeMap<String, String>,
    /// Job seed.
    pub seed: u64,
    /// Workers.
    pub workers: u32,
    /// Servers.
    pub servers: u32,
    /// Parameters of the model.
    pub model_params: u64,
    /// Steps.
    pub steps: u32,
    /// Samples per worker per step.
    pub batch_size: u32,
    /// Seconds per step: compute plus push_pull (mean over workers).
    pub step_seconds: f64,
    /// Of which compute (forward, backward, update).
    pub compute_seconds: f64,
    /// Of which push_pull of the step's gradients.
    pub push_pull_seconds: f64,
    /// Wall seconds of the whole run (start to last exit, cluster start-up included).
    pub wall_seconds: f64,
    /// Test accuracy at the end.
    pub test_accuracy: f64,
    /// Payload bytes pushed per worker per step.
    pub pushed_bytes_per_step: f64,
    /// Raw fp32 bytes / pushed bytes.
    pub compression: f64,
}

/// The cluster file of one training run.
pub fn train_config(
    base: &Config,
    (workers, servers): (u32, u32),
    plan: &TrainPlan,
    compressor: &str,
    seed: u64,
) -> CliResult<Config> {
    let mut c = base.clone();
    c.cluster.num_workers = workers;
    c.cluster.num_servers = servers;
    c.cluster.seed = Some(seed);
    let job = JobConfig::edit(&mut c, |j| {
        j.kind = "train".to_string();
        j.hidden = plan.hidden.clone();
        j.batch_size = plan.batch_size;
        j.steps = plan.steps;
        j.skip_push_pull = compressor == COMPUTE_ONLY;
    })
    .map_err(CliError::usage)?;
    let name = if job.skip_push_pull {
        "none"
    } else {
        compressor
    };
    let params = preset(name).map_err(|e| CliError::usage(format!("--compressors: {e}")))?;
    pushpull_jobs::train::compare::set_default_map(&mut c, &params);
    c.validate("the training benchmark's cluster file")
        .map_err(CliError::usage)?;
    Ok(c)
}

/// Runs one training run on `topo` and turns the workers' reports into a row.
pub async fn run_one(
    topo: &Topology,
    config: &Config,
    programs: &Programs,
    limits: &RunLimits,
    (rate, compressor): (&str, &str),
) -> CliResult<TrainRow> {
    let run = run_cluster(topo, config, programs, limits).await?;
    let reports = &run.train_reports;
    let Some(r0) = reports.first() else {
        return Err(CliError::failed("the training run produced no report"));
    };
    let n = reports.len() as f64;
    let steps = r0.steps.max(1) as f64;
    let mean = |f: &dyn Fn(&pushpull_jobs::train::TrainReport) -> f64| {
        reports.iter().map(f).sum::<f64>() / n
    };
    let compute = mean(&|r| r.compute_seconds) / steps;
    let exchange = mean(&|r| r.exchange_seconds) / steps;
    Ok(TrainRow {
        rate: rate.to_string(),
        compressor: compressor.to_string(),
        params: config.tensor_params("").into_iter().collect(),
        seed: r0.seed,
        workers: config.cluster.num_workers,
        servers: config.cluster.num_servers,
        model_params: r0.params,
        steps: r0.steps,
        batch_size: r0.batch_size as u32,
        step_seconds: compute + exchange,
        compute_seconds: compute,
        push_pull_seconds: exchange,
        wall_seconds: run.wall_seconds,
        test_accuracy: r0.test_accuracy,
        pushed_bytes_per_step: r0.bytes_pushed as f64 / steps,
        compression: r0.compression_ratio,
    })
}

/// Mean and sample standard deviation (0 for fewer than two values).
pub fn mean_sd(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (f64::NAN, 0.0);
    }
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (m, 0.0);
    }
    let v = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0);
    (m, v.sqrt())
}

/// The summary table of the training series: per rate and compressor, mean ± sd over seeds.
pub fn train_table(rows: &[TrainRow]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| rate | run | seeds | s/step | compute s/step | push_pull s/step | comm adds | \
         speed-up vs none | wall s | test accuracy % | pushed kB/step/worker (x) |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|");
    let mut groups: Vec<(String, String)> = Vec::new();
    for r in rows {
        let g = (r.rate.clone(), r.compressor.clone());
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    let of = |rate: &str, c: &str| -> Vec<&TrainRow> {
        rows.iter()
            .filter(|r| r.rate == rate && r.compressor == c)
            .collect()
    };
    for (rate, c) in &groups {
        let runs = of(rate, c);
        let col = |f: fn(&TrainRow) -> f64| mean_sd(&runs.iter().map(|r| f(r)).collect::<Vec<_>>());
        let (step, _) = col(|r| r.step_seconds);
        let (compute, _) = col(|r| r.compute_seconds);
        let (pp, _) = col(|r| r.push_pull_seconds);
        let (wall, _) = col(|r| r.wall_seconds);
        let (acc, acc_sd) = col(|r| 100.0 * r.test_accuracy);
        let (pushed, _) = col(|r| r.pushed_bytes_per_step);
        let (ratio, _) = col(|r| r.compression);
        // Communication's share: this run's step over the compute-only runs' step.
        let alone = mean_sd(
            &of(rate, COMPUTE_ONLY)
                .iter()
                .map(|r| r.step_seconds)
                .collect::<Vec<_>>(),
        )
        .0;
        let adds = if c != COMPUTE_ONLY && alone > 0.0 {
            format!("{:+.0}%", 100.0 * (step / alone - 1.0))
        } else {
            "-".to_string()
        };
        let none = mean_sd(
            &of(rate, "none")
                .iter()
                .map(|r| r.step_seconds)
                .collect::<Vec<_>>(),
        )
        .0;
        let speedup = if c != COMPUTE_ONLY && none > 0.0 && step > 0.0 {
            format!("{:.2}x", none / step)
        } else {
            "-".to_string()
        };
        let accuracy = if c == COMPUTE_ONLY {
            format!("({acc:.2} ± {acc_sd:.2}, no averaging)")
        } else {
            format!("{acc:.2} ± {acc_sd:.2}")
        };
        let _ = writeln!(
            s,
            "| {rate} | {c} | {} | {step:.4} | {compute:.4} | {pp:.4} | {adds} | {speedup} | {wall:.1} | {accuracy} | {:.1} ({ratio:.1}x) |",
            runs.len(),
            pushed / 1e3,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(c: &str, seed: u64, step: f64, acc: f64) -> TrainRow {
        TrainRow {
            rate: "100mbit".into(),
            compressor: c.into(),
            params: BTreeMap::new(),
            seed,
            workers: 4,
            servers: 4,
            model_params: 1,
            steps: 10,
            batch_size: 256,
            step_seconds: step,
            compute_seconds: step / 2.0,
            push_pull_seconds: step / 2.0,
            wall_seconds: 10.0,
            test_accuracy: acc,
            pushed_bytes_per_step: 1000.0,
            compression: 1.0,
        }
    }

    #[test]
    fn the_table_compares_with_compute_only_and_none() {
        let rows = vec![
            row(COMPUTE_ONLY, 1, 0.10, 0.5),
            row(COMPUTE_ONLY, 2, 0.10, 0.5),
            row("none", 1, 0.40, 0.80),
            row("none", 2, 0.40, 0.82),
            row("onebit", 1, 0.12, 0.79),
            row("onebit", 2, 0.12, 0.81),
        ];
        let t = train_table(&rows);
        let onebit = t.lines().find(|l| l.contains("| onebit |")).unwrap();
        assert!(onebit.contains("+20%"), "{onebit}");
        assert!(onebit.contains("3.33x"), "{onebit}");
        assert!(onebit.contains("80.00 ± 1.41"), "{onebit}");
        let none = t.lines().find(|l| l.contains("| none |")).unwrap();
        assert!(none.contains("+300%") && none.contains("1.00x"), "{none}");
        assert_eq!(mean_sd(&[1.0, 3.0]), (2.0, 2f64.sqrt()));
    }

    #[test]
    fn train_configs_are_valid_and_compute_only_skips_push_pull() {
        let plan = TrainPlan {
            compressors: vec!["onebit".into()],
            seeds: vec![7],
            hidden: vec![64, 64],
            batch_size: 32,
            steps: 5,
        };
        let base = pushpull_launch::local::default_config();
        let c = train_config(&base, (4, 4), &plan, "onebit", 7).unwrap();
        let job = JobConfig::of(&c).unwrap();
        assert_eq!(job.kind, "train");
        assert_eq!(c.cluster.seed, Some(7));
        assert!(!job.skip_push_pull);
        assert_eq!(c.tensor_params("x")["momentum"], "nesterov");
        let c = train_config(&base, (4, 4), &plan, COMPUTE_ONLY, 7).unwrap();
        assert!(JobConfig::of(&c).unwrap().skip_push_pull);
        let e = train_config(&base, (4, 4), &plan, "zip", 7).unwrap_err();
        assert!(e.to_string().contains("zip"), "{e}");
    }
}
