//! The plan of a `pushpull bench net` invocation: the flags validated, and every run's cluster
//! file built and checked before any network exists (a bad flag fails in a second, not after a
//! network was built and measured).

use std::collections::BTreeMap;

use pushpull_jobs::JobConfig;
use pushpull_proto::Config;

use super::topo::parse_rate;
use super::train::{train_config, TrainPlan, COMPUTE_ONLY};
use super::{preset, NetArgs, PRESETS};
use pushpull_node::error::{CliError, CliResult};

/// One planned run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) series: &'static str,
    pub(crate) compressor: String,
    pub(crate) servers: u32,
    pub(crate) scale: f64,
    /// `cluster.local_size` of the run: `--local-size`, or 1 for the flat run of
    /// `--compare-flat` (the same hosts, every worker pushing on its own).
    pub(crate) local_size: u32,
}

/// The job scale giving `mb` MB (1e6 bytes) of fp32 per worker per round.
pub fn scale_for_mb(mb: f64) -> f64 {
    mb * 1e6 / (pushpull_jobs::resnet::RESNET50_ELEMENTS as f64 * 4.0)
}

/// The cluster file of one run: `base` with the node counts (workers, servers, workers per
/// local group), the job and the tensors' map.
pub fn run_config(
    base: &Config,
    (workers, servers, local_size): (u32, u32, u32),
    scale: f64,
    (rounds, warmup, check): (u32, u32, bool),
    params: &BTreeMap<String, String>,
) -> CliResult<Config> {
    let mut c = base.clone();
    c.cluster.num_workers = workers;
    c.cluster.num_servers = servers;
    c.cluster.local_size = local_size;
    JobConfig::edit(&mut c, |j| {
        j.kind = "benchmark".to_string();
        j.scale = scale;
        j.rounds = rounds;
        j.warmup = warmup;
        j.check = check;
    })
    .map_err(CliError::usage)?;
    pushpull_jobs::train::compare::set_default_map(&mut c, params);
    c.validate("the benchmark's cluster file")
        .map_err(CliError::usage)?;
    Ok(c)
}

/// Rough memory a run needs: every worker holds its inputs, results and in-flight copies; the
/// servers hold every worker's pushes of their keys.
pub(crate) fn memory_needed(workers: u32, scale: f64) -> u64 {
    let per_worker = scale * pushpull_jobs::resnet::RESNET50_ELEMENTS as f64 * 4.0;
    (per_worker * 7.0 * workers as f64) as u64
}

/// Everything [`super::run`] checked before building a network.
pub(crate) struct Setup {
    /// Rate labels and bits per second.
    pub(crate) rates: Vec<(String, u64)>,
    /// The cluster file every run starts from.
    pub(crate) base: Config,
    /// Benchmark plans per rate label (empty for `--job train`).
    pub(crate) plans: BTreeMap<String, Vec<Plan>>,
    /// The training plan (`--job train`).
    pub(crate) train: Option<TrainPlan>,
    /// Timed rounds, warm-up rounds, check.
    pub(crate) job: (u32, u32, bool),
}

/// Validates the flags and builds (and checks) every run's cluster file.
pub(crate) fn setup(args: &NetArgs) -> CliResult<Setup> {
    let rates: Vec<(String, u64)> = args
        .rates
        .iter()
        .map(|r| {
            parse_rate(r)
                .map(|b| (r.trim().to_string(), b))
                .map_err(|e| CliError::usage(format!("--rates: {e}")))
        })
        .collect::<CliResult<_>>()?;
    if rates.is_empty() {
        return Err(CliError::usage("--rates: give at least one rate"));
    }
    if args.workers == 0 || args.servers == 0 {
        return Err(CliError::usage(
            "--workers and --servers must be at least 1",
        ));
    }
    if args.local_size == 0 || args.workers % args.local_size != 0 {
        return Err(CliError::usage(format!(
            "--local-size {}: must divide --workers {} (that many workers share each host)",
            args.local_size, args.workers
        )));
    }
    if args.compare_flat && args.local_size == 1 {
        return Err(CliError::usage(
            "--compare-flat compares local groups with flat runs: give --local-size 2 or more",
        ));
    }
    if args.warmup == 0 || args.rounds == 0 {
        return Err(CliError::usage(
            "--warmup and --rounds must be at least 1 (the counters start at the end of the \
             warm-up)",
        ));
    }
    if !(args.scale > 0.0 && args.scale.is_finite()) {
        return Err(CliError::usage(format!(
            "--scale {}: must be a positive number",
            args.scale
        )));
    }
    if !(0.0..=60.0).contains(&args.probe_seconds) {
        return Err(CliError::usage("--probe-seconds: 0 to 60"));
    }
    if !(0.0..=600.0).contains(&args.baseline_seconds) {
        return Err(CliError::usage("--baseline-seconds: 0 to 600"));
    }
    if !(576..=65_535).contains(&args.mtu) {
        return Err(CliError::usage(format!(
            "--mtu {}: a link MTU from 576 to 65535 bytes",
            args.mtu
        )));
    }
    let base = match &args.config {
        Some(p) => Config::from_file(p).map_err(CliError::usage)?,
        None => pushpull_launch::local::default_config(),
    };
    let job = (args.rounds, args.warmup, args.check);
    if args.job == "train" {
        if args.local_size > 1 {
            return Err(CliError::usage(
                "--local-size runs the benchmark job; --job train places one worker per host",
            ));
        }
        let plan = TrainPlan {
            compressors: args
                .compressors
                .clone()
                .unwrap_or_else(|| ["none", "onebit", "topk"].map(String::from).to_vec()),
            seeds: args.seeds.clone(),
            hidden: args.hidden.clone(),
            batch_size: args.batch_size,
            steps: args.steps,
        };
        if plan.seeds.is_empty() || plan.compressors.is_empty() {
            return Err(CliError::usage(
                "--job train needs at least one seed and one compressor",
            ));
        }
        for c in plan.compressors.iter().chain([&COMPUTE_ONLY.to_string()]) {
            train_config(&base, (args.workers, args.servers), &plan, c, plan.seeds[0])?;
        }
        return Ok(Setup {
            rates,
            base,
            plans: BTreeMap::new(),
            train: Some(plan),
            job,
        });
    }
    let compressors = args.compressors.clone().unwrap_or_else(|| {
        PRESETS
            .iter()
            .map(|(n, _)| n.to_string())
            .collect::<Vec<_>>()
    });
    for c in &compressors {
        preset(c).map_err(|e| CliError::usage(format!("--compressors: {e}")))?;
    }
    preset(&args.scaling_compressor)
        .map_err(|e| CliError::usage(format!("--scaling-compressor: {e}")))?;
    if let Some(bad) = args
        .scaling_sizes
        .iter()
        .find(|&&m| !(m > 0.0 && m.is_finite()))
    {
        return Err(CliError::usage(format!(
            "--scaling-sizes: {bad} is not a positive size in MB"
        )));
    }
    if args.scaling_servers.contains(&0) {
        return Err(CliError::usage(
            "--scaling-servers: counts must be at least 1",
        ));
    }
    let scaling_rate = match &args.scaling_rate {
        None => rates[0].0.clone(),
        Some(r) => {
            let bits =
                parse_rate(r).map_err(|e| CliError::usage(format!("--scaling-rate: {e}")))?;
            rates
                .iter()
                .find(|(_, b)| *b == bits)
                .map(|(l, _)| l.clone())
                .ok_or_else(|| CliError::usage(format!("--scaling-rate {r}: not one of --rates")))?
        }
    };
    let mut plans = BTreeMap::new();
    for (rate, _) in &rates {
        let mut list = Vec::new();
        if !args.skip_compressors {
            for c in &compressors {
                list.push(Plan {
                    series: "compressors",
                    compressor: c.clone(),
                    servers: args.servers,
                    scale: args.scale,
                    local_size: args.local_size,
                });
                if args.compare_flat {
                    list.push(Plan {
                        series: "compressors",
                        compressor: c.clone(),
                        servers: args.servers,
                        scale: args.scale,
                        local_size: 1,
                    });
                }
            }
        }
        if !args.skip_scaling && *rate == scaling_rate {
            for &mb in &args.scaling_sizes {
                list.push(Plan {
                    series: "scaling",
                    compressor: args.scaling_compressor.clone(),
                    servers: args.servers,
                    scale: scale_for_mb(mb),
                    local_size: args.local_size,
                });
            }
            for &s in &args.scaling_servers {
                list.push(Plan {
                    series: "scaling",
                    compressor: args.scaling_compressor.clone(),
                    servers: s,
                    scale: args.scale,
                    local_size: args.local_size,
                });
            }
        }
        // Check the plan's cluster files before building anything.
        for p in &list {
            run_config(
                &base,
                (args.workers, p.servers, p.local_size),
                p.scale,
                job,
                &preset(&p.compressor)?,
            )?;
        }
        plans.insert(rate.clone(), list);
    }
    Ok(Setup {
        rates,
        base,
        plans,
        train: None,
        job,
    })
}
