//! The runs of one shaped network: the benchmark's compressor and scaling series, the
//! training runs, and the peers (`--peers`), each turned into rows or failures.

use super::cluster::{run_cluster, RunLimits};
use super::peers::{self, PeerRow, PeerScript};
use super::plan::{memory_needed, Setup};
use super::probe::LinkRate;
use super::report::{make_row, RowContext, RunRow};
use super::topo::{check_interrupted, Topology};
use super::train::{self, train_config, TrainPlan, TrainRow, COMPUTE_ONLY};
use super::{load_average, mem_available, preset, run_config, NetArgs, RunFailure};
use pushpull_launch::procs::Programs;
use pushpull_node::error::CliResult;

/// What every run on one network shares.
pub(super) struct NetCtx<'a> {
    pub(super) args: &'a NetArgs,
    pub(super) topo: &'a Topology,
    pub(super) rate: &'a str,
    pub(super) links: &'a [LinkRate],
    pub(super) programs: &'a Programs,
    pub(super) limits: &'a RunLimits,
    pub(super) cores: usize,
}

/// The benchmark runs of one network.
pub(super) fn run_benchmarks(
    ctx: &NetCtx<'_>,
    rt: &tokio::runtime::Runtime,
    setup: &Setup,
    rows: &mut Vec<RunRow>,
    failures: &mut Vec<RunFailure>,
) -> CliResult<()> {
    let (args, rate) = (ctx.args, ctx.rate);
    for p in setup.plans.get(rate).into_iter().flatten() {
        check_interrupted()?;
        let params = preset(&p.compressor)?;
        let mb_per_worker = p.scale * pushpull_jobs::resnet::RESNET50_ELEMENTS as f64 * 4.0 / 1e6;
        let fail = |e: String| RunFailure {
            series: p.series.to_string(),
            compressor: p.compressor.clone(),
            rate: rate.to_string(),
            workers: args.workers,
            servers: p.servers,
            local_size: p.local_size,
            mb_per_worker,
            error: e,
        };
        // The same run twice (e.g. S = 4 in both series): measure once.
        if let Some(prev) = rows.iter().find(|r| {
            r.rate == rate
                && r.compressor == p.compressor
                && r.servers == p.servers
                && r.local_size == p.local_size
                && (r.mb_per_worker - mb_per_worker).abs() < 1e-9
        }) {
            let mut again = prev.clone();
            again.series = p.series.to_string();
            rows.push(again);
            continue;
        }
        let need = memory_needed(args.workers, p.scale);
        let avail = mem_available();
        if need as f64 > avail as f64 * 0.8 {
            failures.push(fail(format!(
                "skipped: needs about {:.1} GB of memory, {:.1} GB available",
                need as f64 / 1e9,
                avail as f64 / 1e9
            )));
            continue;
        }
        let config = run_config(
            &setup.base,
            (args.workers, p.servers, p.local_size),
            p.scale,
            setup.job,
            &params,
        )?;
        let load_before = load_average()[0];
        eprintln!(
            "pushpull bench net: {rate} {} {}x{}{} {:.1} MB/worker: running (load {:.2})",
            p.compressor,
            args.workers,
            p.servers,
            groups_label(args.local_size, p.local_size),
            mb_per_worker,
            load_before
        );
        match rt.block_on(run_cluster(ctx.topo, &config, ctx.programs, ctx.limits)) {
            Ok(run) => {
                let rctx = RowContext {
                    series: p.series.to_string(),
                    compressor: p.compressor.clone(),
                    params,
                    rate: rate.to_string(),
                    scale: p.scale,
                    local_size: p.local_size,
                    partition_bytes: config.cluster.partition_bytes,
                    links: ctx.links.to_vec(),
                    cores: ctx.cores,
                    load_before,
                };
                let row = make_row(&rctx, &run);
                eprintln!(
                    "pushpull bench net:   {:.3} s/round (floor {:.3} s, ratio {:.2}, {}-bound)",
                    row.median_seconds, row.floor_seconds, row.ratio, row.bound
                );
                rows.push(row);
            }
            Err(e) => {
                check_interrupted()?;
                eprintln!("pushpull bench net:   failed: {e}");
                failures.push(fail(e.to_string()));
            }
        }
    }
    Ok(())
}

/// How the workers of a run sit on the hosts, for the log: nothing with one worker per host,
/// ` in groups of G` for local groups, ` flat, G per host` for `--compare-flat`'s run.
pub(super) fn groups_label(per_host: u32, local_size: u32) -> String {
    match (per_host, local_size) {
        (1, _) => String::new(),
        (h, 1) => format!(" flat, {h} per host"),
        (_, g) => format!(" in groups of {g}"),
    }
}

/// The training runs of one network: per seed, the compute alone and every compressor.
pub(super) fn run_training(
    ctx: &NetCtx<'_>,
    rt: &tokio::runtime::Runtime,
    setup: &Setup,
    plan: &TrainPlan,
    rows: &mut Vec<TrainRow>,
    failures: &mut Vec<RunFailure>,
) -> CliResult<()> {
    let (args, rate) = (ctx.args, ctx.rate);
    for &seed in &plan.seeds {
        for c in std::iter::once(COMPUTE_ONLY.to_string()).chain(plan.compressors.clone()) {
            check_interrupted()?;
            let config = train_config(&setup.base, (args.workers, args.servers), plan, &c, seed)?;
            eprintln!(
                "pushpull bench net: {rate} train {c} seed {seed} {}x{}: running (load {:.2})",
                args.workers,
                args.servers,
                load_average()[0]
            );
            let run = rt.block_on(train::run_one(
                ctx.topo,
                &config,
                ctx.programs,
                ctx.limits,
                (rate, &c),
            ));
            match run {
                Ok(row) => {
                    eprintln!(
                        "pushpull bench net:   {:.4} s/step (compute {:.4}), accuracy {:.2} %",
                        row.step_seconds,
                        row.compute_seconds,
                        100.0 * row.test_accuracy
                    );
                    rows.push(row);
                }
                Err(e) => {
                    check_interrupted()?;
                    eprintln!("pushpull bench net:   failed: {e}");
                    failures.push(RunFailure {
                        series: "train".into(),
                        compressor: c.clone(),
                        rate: rate.to_string(),
                        workers: args.workers,
                        servers: args.servers,
                        local_size: 1,
                        mb_per_worker: 0.0,
                        error: format!("seed {seed}: {e}"),
                    });
                }
            }
        }
    }
    Ok(())
}

/// The peer runs of one network (`--peers`), after its compressor series.
pub(super) fn run_peers(
    ctx: &NetCtx<'_>,
    rt: &tokio::runtime::Runtime,
    script: &mut PeerScript,
    rows: &[RunRow],
    out: &mut Vec<PeerRow>,
    failures: &mut Vec<RunFailure>,
) -> CliResult<()> {
    let (args, rate) = (ctx.args, ctx.rate);
    let series: Vec<&RunRow> = rows
        .iter()
        .filter(|r| r.rate == rate && r.series == "compressors")
        .collect();
    let bytes = (args.scale * pushpull_jobs::resnet::RESNET50_ELEMENTS as f64 * 4.0).round() as u64;
    for peers::PeerPlan {
        job,
        compressor,
        bytes: moved,
        piece,
    } in peers::plan(&series, bytes)
    {
        check_interrupted()?;
        eprintln!(
            "pushpull bench net: {rate} {} moving {:.2} MB/worker ({compressor}): running (load {:.2})",
            job.label(),
            moved as f64 / 1e6,
            load_average()[0]
        );
        let workers_servers = (args.workers, args.servers);
        let run = rt.block_on(script.run(
            ctx.topo,
            job,
            workers_servers,
            (moved, piece),
            args.rounds,
            ctx.limits.timeout,
        ));
        match run {
            Ok(seconds) => {
                eprintln!("pushpull bench net:   {seconds:.3} s/round");
                out.push(PeerRow {
                    rate: rate.to_string(),
                    peer: job.label().to_string(),
                    compressor: compressor.clone(),
                    workers: args.workers,
                    servers: if job == peers::PeerJob::Ps {
                        args.servers
                    } else {
                        0
                    },
                    bytes_per_worker: moved,
                    piece_bytes: piece,
                    median_seconds: seconds,
                    pushpull_seconds: series
                        .iter()
                        .find(|r| r.compressor == compressor && r.servers == args.servers)
                        .map(|r| r.median_seconds),
                });
            }
            Err(e) => {
                check_interrupted()?;
                eprintln!("pushpull bench net:   failed: {e}");
                failures.push(RunFailure {
                    series: "peers".into(),
                    compressor: format!("{} ({compressor})", job.label()),
                    rate: rate.to_string(),
                    workers: args.workers,
                    servers: args.servers,
                    local_size: 1,
                    mb_per_worker: moved as f64 / 1e6,
                    error: e.to_string(),
                });
            }
        }
    }
    Ok(())
}
