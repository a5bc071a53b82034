//! What a `pushpull bench train` sitting records and prints: every run ([`TtaRun`]: rank 0's
//! JSON lines, the veth counters of the hosts it used, its processes' CPU seconds) with what is
//! derived from it ([`Outcome`]: time and steps to the target, the speed-up over DDP fp32,
//! bytes and CPU seconds per step), the failures, the tables and the JSON report.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::plan::REFERENCE;
use crate::net::train::mean_sd;
use crate::net::Machine;

/// One `"kind": "eval"` line of rank 0 (`bench/tta/train.py`); fields this harness does not
/// read are kept in `other`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Eval {
    /// Steps done.
    pub step: u64,
    /// Training seconds so far (evaluations and their barriers off the clock).
    pub wall_s: f64,
    /// Validation bits per byte.
    pub val_bpb: f64,
    /// Rank 0's CPU seconds per step since the previous line (evaluation excluded).
    #[serde(default)]
    pub cpu_s_per_step: Option<f64>,
    /// Bytes rank 0 handed to the exchange per step since the previous line (pushpull: pushed;
    /// DDP: all-reduced).
    #[serde(default)]
    pub bytes_per_step: Option<f64>,
    /// The rest of the line.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// The `"kind": "end"` line of rank 0.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct End {
    /// Whether `--target-bpb` was reached (false when the script had no target).
    pub reached: bool,
    /// Steps done.
    pub step: u64,
    /// Training seconds.
    pub wall_s: f64,
    /// The last evaluation's validation bits per byte.
    pub val_bpb: Option<f64>,
    /// What ended the run: `target`, `time_limit` or `steps`.
    #[serde(default)]
    pub stopped: Option<String>,
    /// The rest of the line.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// Bytes through one host's link over a run (its veth counters, read before the first process
/// started and after the last exited).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HostBytes {
    /// The host (`worker0`, `server1`, `scheduler`).
    pub host: String,
    /// Bytes it sent.
    pub tx: u64,
    /// Bytes it received.
    pub rx: u64,
}

/// CPU seconds of one process over its whole life (start-up and evaluations included), read
/// from `/proc` every 0.1 s while it ran (so up to 0.1 s short).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProcCpu {
    /// `rank R`, `scheduler`, `server S`.
    pub process: String,
    /// The host whose namespace it ran in.
    pub host: String,
    /// CPU seconds, user and system, every thread.
    pub cpu_seconds: f64,
}

/// What is derived from a run (and, for the speed-up, from DDP fp32's run of the same rate
/// and seed).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Outcome {
    /// Whether an evaluation reached the target.
    pub reached: bool,
    /// Steps at the first evaluation at or below the target.
    pub steps_to_target: Option<u64>,
    /// Training seconds at that evaluation.
    pub seconds_to_target: Option<f64>,
    /// DDP fp32's training seconds to the target over this run's (above 1: faster).
    pub speedup: Option<f64>,
    /// The last evaluation's validation bits per byte.
    pub final_val_bpb: Option<f64>,
    /// Bytes rank 0 handed to the exchange per step (the eval lines' `bytes_per_step`,
    /// weighted by their steps).
    pub app_bytes_per_step: Option<f64>,
    /// Bytes through a worker host's link (sent + received) per step: the mean over worker
    /// hosts of their veth counters over the run over its steps. It includes the start-up
    /// broadcast and the evaluations' barriers and broadcasts (a few bytes each), and, when
    /// colocated, the servers' traffic to the other workers.
    pub wire_bytes_per_step: Option<f64>,
    /// Rank 0's CPU seconds per training step (the eval lines', weighted by their steps).
    pub cpu_s_per_step: Option<f64>,
    /// The scheduler's and servers' CPU seconds over the run per step (pushpull only).
    pub node_cpu_s_per_step: Option<f64>,
}

/// One run that finished.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TtaRun {
    /// Rate label (`none`: no tbf).
    pub rate: String,
    /// `pushpull:PRESET` or `ddp:HOOK`.
    pub system: String,
    /// `separate hosts`, `colocated` (pushpull) or `no servers` (DDP).
    pub placement: String,
    /// Seed (model, data order).
    pub seed: u64,
    /// Workers.
    pub workers: u32,
    /// Servers (0 for DDP).
    pub servers: u32,
    /// The target the run is measured against (validation bits per byte).
    pub target_bpb: Option<f64>,
    /// Where the target came from: `--target-bpb`, `ddp:none's final` or `none`.
    pub target_source: String,
    /// Whether the script was told to stop at the target (and at the time limit).
    pub stopped_early: bool,
    /// The time limit it was given, training seconds.
    pub time_limit_s: Option<f64>,
    /// Rank 0's `"kind": "run"` line.
    pub run: serde_json::Value,
    /// Rank 0's `"kind": "eval"` lines.
    pub evals: Vec<Eval>,
    /// Rank 0's `"kind": "end"` line.
    pub end: End,
    /// Every host a process of the run ran on.
    pub hosts: Vec<HostBytes>,
    /// Every process of the run.
    pub processes: Vec<ProcCpu>,
    /// Packets tbf dropped on the worker hosts' links during the run (both directions).
    pub tbf_drops: u64,
    /// Seconds from the first process's start to the last one's exit.
    pub wall_seconds: f64,
    /// What is derived.
    pub outcome: Outcome,
}

/// A run that failed; the sitting went on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TtaFailure {
    /// Rate label.
    pub rate: String,
    /// The system.
    pub system: String,
    /// Its placement.
    pub placement: String,
    /// Seed.
    pub seed: u64,
    /// The process that failed first (`rank 1`, `server 0`), when one did.
    pub process: Option<String>,
    /// Why, with the process's last stderr lines.
    pub error: String,
}

/// One network of the sitting.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Network {
    /// Rate label.
    pub rate: String,
    /// tbf rate, bits/s (0: no tbf).
    pub rate_bits: u64,
    /// The tbf arguments on both ends of every link (`None`: unshaped).
    pub tbf: Option<String>,
    /// MTU of every link.
    pub mtu: u32,
}

/// The sitting's settings, as checked.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Settings {
    /// The interpreter.
    pub python: String,
    /// The workload.
    pub workload: String,
    /// Its size.
    pub size: String,
    /// `--set` overrides.
    pub set: Vec<String>,
    /// Steps at most.
    pub steps: u32,
    /// Steps between evaluations.
    pub eval_every: u32,
    /// Workers.
    pub workers: u32,
    /// Servers of the pushpull runs.
    pub servers: u32,
    /// The systems, in the order given.
    pub systems: Vec<String>,
    /// pushpull's placements.
    pub placements: Vec<String>,
    /// Seeds.
    pub seeds: Vec<u64>,
    /// `--target-bpb`.
    pub target_bpb: Option<f64>,
    /// `--no-stop`.
    pub no_stop: bool,
    /// A shaped run stops at this many times DDP fp32's training seconds.
    pub time_limit_factor: f64,
    /// `--quick`.
    pub quick: bool,
}

/// What `--json FILE` holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TtaReport {
    /// The machine.
    pub machine: Machine,
    /// The settings.
    pub settings: Settings,
    /// The networks, one per rate.
    pub networks: Vec<Network>,
    /// Every run that finished.
    pub runs: Vec<TtaRun>,
    /// Every run that failed.
    pub failures: Vec<TtaFailure>,
}

/// A per-step figure of the eval lines, weighted by the steps each covers.
fn weighted(evals: &[Eval], field: impl Fn(&Eval) -> Option<f64>) -> Option<f64> {
    let (mut sum, mut steps) = (0.0, 0u64);
    let mut prev = 0;
    for e in evals {
        let n = e.step.saturating_sub(prev);
        prev = e.step;
        if let (Some(v), true) = (field(e), n > 0) {
            sum += v * n as f64;
            steps += n;
        }
    }
    (steps > 0).then(|| sum / steps as f64)
}

impl TtaRun {
    /// Fills [`Outcome`] from the run's lines, counters and target (not the speed-up: see
    /// [`fill_speedups`]).
    pub fn derive(&mut self, worker_hosts: &[String]) {
        let first = self
            .target_bpb
            .and_then(|t| self.evals.iter().find(|e| e.val_bpb <= t));
        let steps = self.end.step.max(1) as f64;
        let wire: Vec<f64> = self
            .hosts
            .iter()
            .filter(|h| worker_hosts.contains(&h.host))
            .map(|h| (h.tx + h.rx) as f64 / steps)
            .collect();
        let nodes: Vec<f64> = self
            .processes
            .iter()
            .filter(|p| !p.process.starts_with("rank "))
            .map(|p| p.cpu_seconds)
            .collect();
        self.outcome = Outcome {
            reached: first.is_some(),
            steps_to_target: first.map(|e| e.step),
            seconds_to_target: first.map(|e| e.wall_s),
            speedup: None,
            final_val_bpb: self.end.val_bpb.or(self.evals.last().map(|e| e.val_bpb)),
            app_bytes_per_step: weighted(&self.evals, |e| e.bytes_per_step),
            wire_bytes_per_step: (!wire.is_empty())
                .then(|| wire.iter().sum::<f64>() / wire.len() as f64),
            cpu_s_per_step: weighted(&self.evals, |e| e.cpu_s_per_step),
            node_cpu_s_per_step: (!nodes.is_empty()).then(|| nodes.iter().sum::<f64>() / steps),
        };
    }
}

/// Sets every run's speed-up: DDP fp32's seconds to the target at the same rate and seed over
/// the run's.
pub fn fill_speedups(runs: &mut [TtaRun]) {
    let reference: BTreeMap<(String, u64), f64> = runs
        .iter()
        .filter(|r| r.system == REFERENCE)
        .filter_map(|r| Some(((r.rate.clone(), r.seed), r.outcome.seconds_to_target?)))
        .collect();
    for r in runs.iter_mut() {
        r.outcome.speedup = match (
            reference.get(&(r.rate.clone(), r.seed)),
            r.outcome.seconds_to_target,
        ) {
            (Some(d), Some(s)) if s > 0.0 => Some(d / s),
            _ => None,
        };
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// Bytes as `1.23 MB`, `45.6 kB` or `789 B`.
pub fn bytes(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} MB", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1} kB", v / 1e3)
    } else {
        format!("{v:.0} B")
    }
}

/// What the table's columns mean (printed under it).
pub const COLUMNS: &str = "steps/train s to tgt: at the first evaluation at or below the \
    target (training clock, evaluation off it); x DDP fp32: ddp:none's training seconds to the \
    target over the run's; app B: bytes rank 0 handed to the exchange per step (pushpull: \
    pushed; DDP: all-reduced); wire B: a worker host's veth bytes sent + received per step \
    (mean over the workers, the whole run); CPU s: rank 0's per training step; nodes CPU s: \
    the scheduler's and servers' per step (whole run).";

/// The table of one rate's runs (one line a run).
pub fn table(runs: &[&TtaRun]) -> String {
    let row = |c: [&str; 13]| {
        format!(
            "{:<20} {:<14} {:>4} {:>7} {:>10} {:>7} {:>7} {:>10} {:>7} {:>10} {:>11} {:>8} {:>8}\n",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11], c[12]
        )
    };
    let mut s = row([
        "system",
        "placement",
        "seed",
        "target",
        "reached",
        "steps",
        "train s",
        "x DDP fp32",
        "final",
        "app B",
        "wire B",
        "CPU s",
        "nodes",
    ]);
    s.push_str(&row([
        "", "", "", "bpb", "", "to tgt", "to tgt", "speed-up", "bpb", "/w/step", "/w/step",
        "/step", "CPU s/st",
    ]));
    for r in runs {
        let o = &r.outcome;
        let reached = match (r.target_bpb, o.reached) {
            (None, _) => "-",
            (Some(_), true) => "yes",
            (Some(_), false) if r.end.stopped.as_deref() == Some("time_limit") => "no (limit)",
            (Some(_), false) => "no",
        };
        let cells = [
            r.system.clone(),
            r.placement.clone(),
            r.seed.to_string(),
            opt(r.target_bpb, |v| format!("{v:.4}")),
            reached.to_string(),
            o.steps_to_target
                .map_or_else(|| "-".to_string(), |v| v.to_string()),
            opt(o.seconds_to_target, |v| format!("{v:.1}")),
            opt(o.speedup, |v| format!("{v:.2}x")),
            opt(o.final_val_bpb, |v| format!("{v:.4}")),
            opt(o.app_bytes_per_step, bytes),
            opt(o.wire_bytes_per_step, bytes),
            opt(o.cpu_s_per_step, |v| format!("{v:.4}")),
            opt(o.node_cpu_s_per_step, |v| format!("{v:.4}")),
        ];
        s.push_str(&row(cells.each_ref().map(String::as_str)));
    }
    s
}

/// A group of runs: rate, system, placement.
type GroupKey = (String, String, String);

/// `pick` of each run that has one, grouped by rate, system and placement in the runs' order.
fn grouped<T>(runs: &[TtaRun], pick: impl Fn(&TtaRun) -> Option<T>) -> Vec<(GroupKey, Vec<T>)> {
    let mut groups: Vec<(GroupKey, Vec<T>)> = Vec::new();
    for r in runs {
        let Some(v) = pick(r) else { continue };
        let key = (r.rate.clone(), r.system.clone(), r.placement.clone());
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, vs)) => vs.push(v),
            None => groups.push((key, vec![v])),
        }
    }
    groups
}

/// Final quality over seeds: per rate, system and placement, the mean ± sd of the final
/// validation bits per byte of the runs that trained every step (`stopped = steps`).
pub fn quality_table(runs: &[TtaRun]) -> String {
    let groups = grouped(runs, |r| {
        r.outcome
            .final_val_bpb
            .filter(|_| r.end.stopped.as_deref() == Some("steps"))
    });
    if !groups.iter().any(|(_, v)| v.len() > 1) {
        return String::new();
    }
    let mut s = format!(
        "final quality (runs that trained every step)\n{:<8} {:<20} {:<14} {:>5} {:>16}\n",
        "rate", "system", "placement", "seeds", "final val bpb"
    );
    for ((rate, system, placement), vs) in &groups {
        let (m, sd) = mean_sd(vs);
        s.push_str(&format!(
            "{rate:<8} {system:<20} {placement:<14} {:>5} {:>9.4} ± {sd:.4}\n",
            vs.len(),
            m
        ));
    }
    s
}

/// Speed-ups over seeds: per rate, system and placement run more than once, the median of
/// the runs' × DDP fp32 and their range (each run against ddp:none of its own seed, so the
/// seeds alternate the systems), counting only the runs that reached the target.
pub fn speedup_table(runs: &[TtaRun]) -> String {
    let groups = grouped(runs, |r| {
        (r.system != REFERENCE).then_some(r.outcome.speedup)
    });
    if !groups.iter().any(|(_, v)| v.len() > 1) {
        return String::new();
    }
    let mut s = format!(
        "x DDP fp32 over seeds (median, range; runs that reached the target)\n{:<8} {:<20} \
         {:<14} {:>7} {:>8} {:>16}\n",
        "rate", "system", "placement", "reached", "median", "range"
    );
    for ((rate, system, placement), vs) in &groups {
        let mut got: Vec<f64> = vs.iter().flatten().copied().collect();
        got.sort_by(f64::total_cmp);
        let (median, range) = match (got.first(), got.last()) {
            (Some(lo), Some(hi)) => (
                format!("{:.2}x", pushpull_node::report::median(&got)),
                format!("{lo:.2}-{hi:.2}x"),
            ),
            _ => ("-".to_string(), "-".to_string()),
        };
        s.push_str(&format!(
            "{rate:<8} {system:<20} {placement:<14} {:>7} {median:>8} {range:>16}\n",
            format!("{}/{}", got.len(), vs.len())
        ));
    }
    s
}

/// `text` cut into lines of at most `width` characters at spaces, each ending in a newline.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// The whole report as text: settings, per rate its network and table, final quality, failures.
pub fn to_text(r: &TtaReport) -> String {
    let st = &r.settings;
    let head = format!(
        "pushpull bench train: {} ({}{}), {} steps, evaluated every {}; {} workers, pushpull \
         with {} server(s); {} cores, {} build, load average {:.2} at the start, {:.2} at the \
         end",
        st.workload,
        st.size,
        if st.set.is_empty() {
            String::new()
        } else {
            format!(" {}", st.set.join(" "))
        },
        st.steps,
        st.eval_every,
        st.workers,
        st.servers,
        r.machine.cores,
        if r.machine.build_profile.is_empty() {
            "unrecorded"
        } else {
            &r.machine.build_profile
        },
        r.machine.load_start[0],
        r.machine.load_end[0],
    );
    let mut s = wrap(&head, 100);
    s.push_str(&wrap(
        "placement: separate hosts = scheduler and servers on hosts of their own; colocated = \
         server s in worker s mod W's namespace, the scheduler in worker 0's; DDP has no \
         servers and no extra links.",
        100,
    ));
    for n in &r.networks {
        let runs: Vec<&TtaRun> = r.runs.iter().filter(|x| x.rate == n.rate).collect();
        s.push('\n');
        let line = match &n.tbf {
            Some(tbf) if st.no_stop => format!(
                "rate {}: {tbf} on both ends of every link, MTU {}; every run trains every step \
                 (--no-stop)",
                n.rate, n.mtu
            ),
            Some(tbf) => format!(
                "rate {}: {tbf} on both ends of every link, MTU {}; runs stop at the target or \
                 at {}x DDP fp32's training seconds",
                n.rate, n.mtu, st.time_limit_factor
            ),
            None => format!(
                "rate {}: no tbf (veth speed), MTU {}; every run trains every step",
                n.rate, n.mtu
            ),
        };
        s.push_str(&wrap(&line, 100));
        if runs.is_empty() {
            s.push_str("no run finished\n");
        } else {
            s.push_str(&table(&runs));
            s.push_str(&wrap(COLUMNS, 100));
        }
    }
    for table in [speedup_table(&r.runs), quality_table(&r.runs)] {
        if !table.is_empty() {
            s.push('\n');
            s.push_str(&table);
        }
    }
    if !r.failures.is_empty() {
        s.push('\n');
    }
    for f in &r.failures {
        s.push_str(&format!(
            "FAILED {} {} ({}) seed {}{}: {}\n",
            f.rate,
            f.system,
            f.placement,
            f.seed,
            f.process
                .as_deref()
                .map_or_else(String::new, |p| format!(", {p}")),
            f.error
        ));
    }
    s.trim_end().to_string()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn eval(step: u64, wall_s: f64, val_bpb: f64) -> Eval {
        Eval {
            step,
            wall_s,
            val_bpb,
            cpu_s_per_step: (step > 0).then_some(0.01 * step as f64),
            bytes_per_step: (step > 0).then_some(1000.0),
            other: BTreeMap::new(),
        }
    }

    pub(crate) fn run(system: &str, placement: &str, curve: &[(u64, f64, f64)]) -> TtaRun {
        let evals: Vec<Eval> = curve.iter().map(|&(s, w, b)| eval(s, w, b)).collect();
        let last = evals.last().cloned().unwrap_or_default();
        TtaRun {
            rate: "100mbit".into(),
            system: system.into(),
            placement: placement.into(),
            seed: 0,
            workers: 2,
            servers: 1,
            target_bpb: Some(4.0),
            target_source: "ddp:none's final".into(),
            stopped_early: true,
            time_limit_s: None,
            run: serde_json::json!({"kind": "run"}),
            evals,
            end: End {
                reached: false,
                step: last.step,
                wall_s: last.wall_s,
                val_bpb: Some(last.val_bpb),
                stopped: Some("steps".into()),
                other: BTreeMap::new(),
            },
            hosts: vec![
                HostBytes {
                    host: "worker0".into(),
                    tx: 1000,
                    rx: 3000,
                },
                HostBytes {
                    host: "server0".into(),
                    tx: 9999,
                    rx: 9999,
                },
            ],
            processes: vec![
                ProcCpu {
                    process: "rank 0".into(),
                    host: "worker0".into(),
                    cpu_seconds: 5.0,
                },
                ProcCpu {
                    process: "server 0".into(),
                    host: "server0".into(),
                    cpu_seconds: 2.0,
                },
            ],
            tbf_drops: 0,
            wall_seconds: 10.0,
            outcome: Outcome::default(),
        }
    }

    #[test]
    fn outcomes_come_from_the_first_evaluation_at_the_target() {
        let mut ddp = run(
            "ddp:none",
            "no servers",
            &[(0, 0.0, 8.0), (10, 2.0, 4.5), (20, 4.0, 4.0)],
        );
        let mut pp = run(
            "pushpull:onebit",
            "colocated",
            &[(0, 0.0, 8.0), (10, 1.0, 3.9), (20, 2.0, 3.5)],
        );
        let workers = vec!["worker0".to_string()];
        ddp.derive(&workers);
        pp.derive(&workers);
        let mut runs = vec![ddp, pp];
        fill_speedups(&mut runs);
        let (d, p) = (&runs[0].outcome, &runs[1].outcome);
        assert_eq!(
            (d.steps_to_target, d.seconds_to_target),
            (Some(20), Some(4.0))
        );
        assert_eq!(d.speedup, Some(1.0));
        assert_eq!(
            (p.steps_to_target, p.seconds_to_target),
            (Some(10), Some(1.0))
        );
        assert_eq!(p.speedup, Some(4.0));
        assert_eq!(p.final_val_bpb, Some(3.5));
        // Weighted by steps: 0.1 over steps 1-10, 0.2 over 11-20.
        assert!((p.cpu_s_per_step.unwrap() - 0.15).abs() < 1e-12);
        assert_eq!(p.app_bytes_per_step, Some(1000.0));
        // Only worker hosts count: (1000 + 3000) / 20 steps.
        assert_eq!(p.wire_bytes_per_step, Some(200.0));
        // The server's CPU over the steps.
        assert_eq!(p.node_cpu_s_per_step, Some(0.1));

        let mut slow = run("ddp:fp16", "no servers", &[(0, 0.0, 8.0), (10, 3.0, 4.2)]);
        slow.end.stopped = Some("time_limit".into());
        slow.derive(&workers);
        assert!(!slow.outcome.reached);
        let refs: Vec<&TtaRun> = runs.iter().chain([&slow]).collect();
        let t = table(&refs);
        assert!(t.contains("4.00x"), "{t}");
        assert!(t.contains("no (limit)"), "{t}");
        assert!(t.contains("colocated"), "{t}");
        assert!(t.contains("no servers"), "{t}");
    }

    #[test]
    fn the_report_round_trips_and_prints() {
        let mut a = run("ddp:none", "no servers", &[(0, 0.0, 8.0), (10, 2.0, 4.0)]);
        a.derive(&["worker0".to_string()]);
        let mut b = a.clone();
        b.seed = 1;
        b.end.val_bpb = Some(4.2);
        b.derive(&["worker0".to_string()]);
        let mut c = run(
            "pushpull:onebit",
            "separate hosts",
            &[(0, 0.0, 8.0), (10, 1.0, 4.0)],
        );
        c.derive(&["worker0".to_string()]);
        let (mut d, mut e) = (c.clone(), c.clone());
        c.outcome.speedup = Some(2.0);
        (d.seed, d.outcome.speedup) = (1, Some(3.0));
        (e.seed, e.outcome.speedup) = (2, None);
        let report = TtaReport {
            machine: Machine {
                cores: 2,
                kernel: "6".into(),
                mem_available_bytes: 1,
                load_start: [0.5; 3],
                load_end: [1.0; 3],
                build_profile: "release".into(),
            },
            settings: Settings {
                python: "python3".into(),
                workload: "conv".into(),
                size: "tiny".into(),
                set: vec![],
                steps: 10,
                eval_every: 10,
                workers: 2,
                servers: 1,
                systems: vec!["ddp:none".into()],
                placements: vec!["separate".into()],
                seeds: vec![0, 1],
                target_bpb: None,
                no_stop: false,
                time_limit_factor: 1.5,
                quick: false,
            },
            networks: vec![Network {
                rate: "100mbit".into(),
                rate_bits: 100_000_000,
                tbf: Some("tbf rate 100000000bit".into()),
                mtu: 1500,
            }],
            runs: vec![a, b, c, d, e],
            failures: vec![TtaFailure {
                rate: "100mbit".into(),
                system: "pushpull:onebit".into(),
                placement: "colocated".into(),
                seed: 0,
                process: Some("rank 1".into()),
                error: "rank 1 (pid 7) exited with code 1".into(),
            }],
        };
        let text = serde_json::to_string(&report).unwrap();
        let back: TtaReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back, report);
        let t = to_text(&report);
        assert!(
            t.contains("FAILED 100mbit pushpull:onebit (colocated) seed 0, rank 1"),
            "{t}"
        );
        assert!(t.contains("final quality"), "{t}");
        assert!(t.contains("4.1000 ± 0.1414"), "{t}");
        assert!(t.contains("x DDP fp32 over seeds"), "{t}");
        assert!(
            t.lines().any(|l| l.starts_with("100mbit  pushpull:onebit")
                && l.split_whitespace()
                    .skip(4)
                    .eq(["2/3", "2.50x", "2.00-3.00x"])),
            "{t}"
        );
        assert!(t.contains("DDP has no servers"), "{t}");
        assert!(t.lines().all(|l| l.len() <= 180), "{t}");
        assert_eq!(wrap("a bb ccc", 4), "a bb\nccc\n");
    }

    #[test]
    fn eval_lines_parse_and_keep_every_field() {
        let line = r#"{"kind": "eval", "step": 20, "wall_s": 0.15, "val_bpb": 5.1, "train_loss": 4.6, "lr": 0.04, "cpu_s_per_step": 0.005, "bytes_per_step": 133632.0, "raw_bytes_per_step": 133632.0, "bytes_pulled_per_step": 133632.0, "eval_s": 0.002}"#;
        let e: Eval = serde_json::from_str(line).unwrap();
        assert_eq!((e.step, e.bytes_per_step), (20, Some(133632.0)));
        assert_eq!(e.other["train_loss"], 4.6);
        assert_eq!(e.other["kind"], "eval");
        let zero = r#"{"kind": "eval", "step": 0, "wall_s": 0.0, "val_bpb": 7.9, "cpu_s_per_step": null, "bytes_per_step": null}"#;
        let e: Eval = serde_json::from_str(zero).unwrap();
        assert_eq!(e.cpu_s_per_step, None);
        assert_eq!(bytes(133632.0), "133.6 kB");
    }
}
