//! The plan of a `pushpull bench train` sitting: the flags checked (every refusal names the
//! flag, the value and the allowed ones), the systems checked against the lists the per-worker
//! script prints ([`Catalog`]), and the order of the runs, all before any namespace exists.

use serde::{Deserialize, Serialize};

use super::TrainArgs;
use crate::net::topo::parse_rate;
use pushpull_node::error::{CliError, CliResult};

/// The word of `--rates` for links without tbf.
pub const UNSHAPED: &str = "none";

/// What `train.py --list-systems` prints: the presets of `pushpull:PRESET` and the hooks of
/// `ddp:HOOK`; a hook written `NAME:R` stands for `NAME:N` with N a whole number >= 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Catalog {
    /// pushpull's presets.
    pub pushpull: Vec<String>,
    /// DDP's hooks.
    pub ddp: Vec<String>,
}

/// How a system exchanges gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// `pushpull.torch` with a scheduler and servers.
    PushPull,
    /// torch's DistributedDataParallel on gloo.
    Ddp,
}

/// One system of `--systems`: its kind and its preset or hook (`onebit`, `powersgd:2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct System {
    /// pushpull or DDP.
    pub kind: Kind,
    /// The preset or hook, as `train.py --system` takes it after the colon.
    pub name: String,
}

impl System {
    /// `pushpull:NAME` or `ddp:NAME`, as `train.py --system` takes it.
    pub fn label(&self) -> String {
        match self.kind {
            Kind::PushPull => format!("pushpull:{}", self.name),
            Kind::Ddp => format!("ddp:{}", self.name),
        }
    }

    /// Whether this is DDP without compression (`ddp:none`), the reference of every sitting.
    pub fn is_reference(&self) -> bool {
        self.kind == Kind::Ddp && self.name == "none"
    }
}

/// The reference system's label: its final quality is the default target and its training
/// time sets the others' time limit.
pub const REFERENCE: &str = "ddp:none";

/// A shaped run of a system other than the reference stops once its training clock passed this
/// many times the reference's training seconds (at the next evaluation).
pub const TIME_LIMIT_FACTOR: f64 = 1.5;

impl Catalog {
    /// Reads `train.py --list-systems`'s output.
    pub fn parse(text: &str) -> Result<Catalog, String> {
        let line = text
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .unwrap_or("");
        serde_json::from_str(line).map_err(|e| format!("expected one JSON object: {e}"))
    }

    /// `KIND:NAME` as a [`System`], or an error naming the value and the allowed ones.
    pub fn system(&self, text: &str) -> Result<System, String> {
        let text = text.trim();
        let all = || {
            format!(
                "pushpull:PRESET (PRESET one of {}) or ddp:HOOK (HOOK one of {})",
                self.pushpull.join(", "),
                self.ddp.join(", ")
            )
        };
        let Some((kind, name)) = text.split_once(':') else {
            return Err(format!("unknown system {text:?}: {}", all()));
        };
        let (kind, list, what) = match kind {
            "pushpull" => (Kind::PushPull, &self.pushpull, "pushpull preset"),
            "ddp" => (Kind::Ddp, &self.ddp, "ddp hook"),
            _ => return Err(format!("unknown system {text:?}: {}", all())),
        };
        let known = list.iter().any(|allowed| match allowed.strip_suffix(":R") {
            Some(stem) => name
                .strip_prefix(stem)
                .and_then(|r| r.strip_prefix(':'))
                .is_some_and(|r| {
                    r.bytes().all(|b| b.is_ascii_digit()) && r.parse::<u32>().is_ok_and(|n| n >= 1)
                }),
            None => allowed == name,
        });
        if !known {
            let r = if list.iter().any(|a| a.ends_with(":R")) {
                " (R a whole number >= 1)"
            } else {
                ""
            };
            return Err(format!(
                "unknown {what} {name:?} in {text:?}: one of {}{r}",
                list.join(", ")
            ));
        }
        Ok(System {
            kind,
            name: name.to_string(),
        })
    }
}

/// Where a pushpull run's scheduler and servers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Each on a host of its own (links of their own).
    Separate,
    /// Server s in worker s mod W's namespace, the scheduler in worker 0's: no links beyond the
    /// workers', as DDP has.
    Colocated,
}

impl Placement {
    /// `--placement`'s word.
    pub fn flag(self) -> &'static str {
        match self {
            Placement::Separate => "separate",
            Placement::Colocated => "colocated",
        }
    }

    /// What the tables say.
    pub fn label(self) -> &'static str {
        match self {
            Placement::Separate => "separate hosts",
            Placement::Colocated => "colocated",
        }
    }
}

/// What the tables say for a DDP run (it has no servers and no links beyond the workers').
pub const NO_SERVERS: &str = "no servers";

/// One run of the sitting, per rate and seed.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    /// The system.
    pub system: System,
    /// pushpull's placement (`None` for DDP).
    pub placement: Option<Placement>,
}

impl RunPlan {
    /// The placement's label, or [`NO_SERVERS`].
    pub fn placement_label(&self) -> &'static str {
        self.placement.map_or(NO_SERVERS, Placement::label)
    }
}

/// The flags, checked (`--quick` applied).
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    /// Rate labels and tbf bits per second (0: [`UNSHAPED`]).
    pub rates: Vec<(String, u64)>,
    /// Workers.
    pub workers: u32,
    /// Servers of the pushpull runs.
    pub servers: u32,
    /// pushpull's placements.
    pub placements: Vec<Placement>,
    /// The systems, checked against the catalog, duplicates dropped.
    pub systems: Vec<System>,
    /// The workload.
    pub workload: String,
    /// Its size.
    pub size: String,
    /// `--set FIELD=VALUE`, passed through.
    pub set: Vec<String>,
    /// Steps at most.
    pub steps: u32,
    /// Steps between evaluations.
    pub eval_every: u32,
    /// Seeds.
    pub seeds: Vec<u64>,
    /// `--target-bpb`.
    pub target_bpb: Option<f64>,
    /// `--no-stop`.
    pub no_stop: bool,
}

/// What `--quick` runs.
#[derive(Debug, Clone, Copy)]
pub struct Quick {
    /// The workload.
    pub workload: &'static str,
    /// Its size.
    pub size: &'static str,
    /// `--set` overrides of the size, comma-separated.
    pub set: &'static str,
    /// Workers.
    pub workers: u32,
    /// Servers.
    pub servers: u32,
    /// Systems, comma-separated.
    pub systems: &'static str,
    /// The one rate.
    pub rate: &'static str,
    /// Steps.
    pub steps: u32,
    /// Steps between evaluations.
    pub eval_every: u32,
}

/// `--quick`: one tiny workload, 2 workers, 1 server, two systems, 100 Mbit/s (about a minute
/// on 2 cores: three runs of 200 steps, most of each the processes' start). `d_model=64` makes
/// the convolutions' weights larger than `cluster.min_compress_bytes`, so onebit compresses
/// them, and a step's 0.4 MB of gradients take longer to send at 100 Mbit/s than to compute.
pub const QUICK: Quick = Quick {
    workload: "conv",
    size: "tiny",
    set: "d_model=64",
    workers: 2,
    servers: 1,
    systems: "pushpull:onebit,ddp:none",
    rate: "100mbit",
    steps: 200,
    eval_every: 25,
};

/// A workload's step budget when `--steps` is not given (bench/tta/README.md, "Sizing": DDP
/// fp32 flattened, about 3 minutes at 100 Mbit/s with 4 workers on 2 cores). An unknown
/// workload gets the transformer's; train.py's check refuses it before anything runs.
fn budget(workload: &str) -> u32 {
    match workload {
        "conv" => 260,
        _ => 360,
    }
}

fn usage(msg: impl std::fmt::Display) -> CliError {
    CliError::usage(msg)
}

/// Checks every flag that needs no Python (the systems are checked by [`systems`]).
pub fn check_flags(args: &TrainArgs) -> CliResult<Setup> {
    let (workload, size, workers, servers, rates, steps, eval_every) = if args.quick {
        let q = QUICK;
        (
            q.workload.to_string(),
            q.size.to_string(),
            q.workers,
            q.servers,
            vec![q.rate.to_string()],
            q.steps,
            q.eval_every,
        )
    } else {
        (
            args.workload.clone(),
            args.size.clone(),
            args.workers,
            args.servers,
            args.rates.clone(),
            args.steps.unwrap_or_else(|| budget(&args.workload)),
            args.eval_every,
        )
    };
    let mut parsed: Vec<(String, u64)> = Vec::new();
    for r in &rates {
        let r = r.trim();
        let bits = if r == UNSHAPED {
            0
        } else {
            parse_rate(r).map_err(|e| usage(format!("--rates: {e}, or {UNSHAPED} (no tbf)")))?
        };
        if parsed
            .iter()
            .any(|(l, b)| l == r || (*b == bits && bits > 0))
        {
            return Err(usage(format!("--rates: {r} is given twice")));
        }
        parsed.push((r.to_string(), bits));
    }
    if parsed.is_empty() {
        return Err(usage("--rates: give at least one rate (or none)"));
    }
    if workers == 0 || workers > 64 {
        return Err(usage(format!("--workers {workers}: 1 to 64")));
    }
    if servers == 0 || servers > 64 {
        return Err(usage(format!("--servers {servers}: 1 to 64")));
    }
    let mut placements = Vec::new();
    for p in &args.placement {
        let p = match p.trim() {
            "separate" => Placement::Separate,
            "colocated" => Placement::Colocated,
            other => {
                return Err(usage(format!(
                    "--placement: unknown placement {other:?}: separate, colocated"
                )))
            }
        };
        if !placements.contains(&p) {
            placements.push(p);
        }
    }
    if placements.is_empty() {
        return Err(usage(
            "--placement: give separate, colocated or both (comma-separated)",
        ));
    }
    if steps == 0 || eval_every == 0 {
        return Err(usage("--steps and --eval-every must be at least 1"));
    }
    if args.seeds.is_empty() {
        return Err(usage("--seeds: give at least one seed"));
    }
    let mut seeds = Vec::new();
    for &s in &args.seeds {
        if !seeds.contains(&s) {
            seeds.push(s);
        }
    }
    if let Some(t) = args.target_bpb {
        if !(t > 0.0 && t.is_finite()) {
            return Err(usage(format!(
                "--target-bpb {t}: a positive number of bits per byte"
            )));
        }
    }
    for kv in &args.set {
        if !kv.contains('=') {
            return Err(usage(format!("--set {kv:?}: expected FIELD=VALUE")));
        }
    }
    if args.run_timeout == 0 {
        return Err(usage("--run-timeout: at least 1 second"));
    }
    Ok(Setup {
        rates: parsed,
        workers,
        servers,
        placements,
        systems: Vec::new(),
        workload,
        size,
        set: if args.quick {
            QUICK.set.split(',').map(str::to_string).collect()
        } else {
            args.set.clone()
        },
        steps,
        eval_every,
        seeds,
        target_bpb: args.target_bpb,
        no_stop: args.no_stop,
    })
}

/// `--systems` (or `--quick`'s) checked against the catalog, in order, duplicates dropped.
pub fn systems(args: &TrainArgs, catalog: &Catalog) -> CliResult<Vec<System>> {
    let given: Vec<String> = if args.quick {
        QUICK.systems.split(',').map(str::to_string).collect()
    } else {
        args.systems.clone()
    };
    let mut out: Vec<System> = Vec::new();
    for s in given.iter().filter(|s| !s.trim().is_empty()) {
        let system = catalog
            .system(s)
            .map_err(|e| usage(format!("--systems: {e}")))?;
        if !out.contains(&system) {
            out.push(system);
        }
    }
    if out.is_empty() {
        return Err(usage("--systems: give at least one system"));
    }
    Ok(out)
}

impl Setup {
    /// The runs of one rate and seed, in order: the reference (`ddp:none`) first when it is one
    /// of the systems, then the others as given, each pushpull system once per placement.
    pub fn runs(&self) -> Vec<RunPlan> {
        let mut order: Vec<&System> = self.systems.iter().filter(|s| s.is_reference()).collect();
        order.extend(self.systems.iter().filter(|s| !s.is_reference()));
        let mut out = Vec::new();
        for s in order {
            match s.kind {
                Kind::Ddp => out.push(RunPlan {
                    system: s.clone(),
                    placement: None,
                }),
                Kind::PushPull => out.extend(self.placements.iter().map(|&p| RunPlan {
                    system: s.clone(),
                    placement: Some(p),
                })),
            }
        }
        out
    }

    /// Whether the network needs hosts for the scheduler and the servers (a pushpull run on
    /// separate hosts).
    pub fn needs_server_hosts(&self) -> bool {
        self.systems.iter().any(|s| s.kind == Kind::PushPull)
            && self.placements.contains(&Placement::Separate)
    }

    /// Whether runs at this rate stop early (at the target or the time limit): shaped rates
    /// without `--no-stop`. Unshaped runs always go to `--steps`: they give the final quality.
    pub fn stops_early(&self, rate_bits: u64) -> bool {
        rate_bits > 0 && !self.no_stop
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: TrainArgs,
    }

    fn args(line: &[&str]) -> TrainArgs {
        Cli::try_parse_from(std::iter::once("bench-train").chain(line.iter().copied()))
            .unwrap()
            .args
    }

    fn catalog() -> Catalog {
        Catalog::parse(
            r#"{"pushpull": ["none", "fp16", "dithering", "onebit", "topk", "powersgd:R"], "ddp": ["none", "fp16", "powersgd:R", "noop"]}"#,
        )
        .unwrap()
    }

    #[test]
    fn systems_are_checked_against_the_catalog() {
        let c = catalog();
        assert_eq!(
            c.system("ddp:powersgd:4").unwrap(),
            System {
                kind: Kind::Ddp,
                name: "powersgd:4".into()
            }
        );
        assert!(c.system("pushpull:onebit").is_ok());
        for (bad, says) in [
            ("pushpull:twobit", "unknown pushpull preset \"twobit\""),
            ("ddp:powersgd", "powersgd:R"),
            ("ddp:powersgd:0", "R a whole number"),
            ("ddp:powersgd:x", "powersgd:R"),
            ("ddp:int8", "one of none, fp16, powersgd:R, noop"),
            ("horovod:none", "unknown system \"horovod:none\""),
            (
                "onebit",
                "pushpull:PRESET (PRESET one of none, fp16, dithering, onebit, topk, powersgd:R)",
            ),
        ] {
            let e = c.system(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = systems(&args(&["--systems", "ddp:none,pushpull:zip"]), &c).unwrap_err();
        assert!(e.to_string().contains("--systems"), "{e}");
        assert!(e.to_string().contains("\"zip\""), "{e}");
        assert!(Catalog::parse("Traceback ...").is_err());
    }

    #[test]
    fn the_reference_runs_first_and_pushpull_once_per_placement() {
        let mut s = check_flags(&args(&[])).unwrap();
        s.systems = systems(
            &args(&["--systems", "pushpull:onebit,ddp:fp16,ddp:none,ddp:none"]),
            &catalog(),
        )
        .unwrap();
        let runs: Vec<(String, &str)> = s
            .runs()
            .iter()
            .map(|r| (r.system.label(), r.placement_label()))
            .collect();
        assert_eq!(
            runs,
            vec![
                ("ddp:none".to_string(), "no servers"),
                ("pushpull:onebit".to_string(), "separate hosts"),
                ("pushpull:onebit".to_string(), "colocated"),
                ("ddp:fp16".to_string(), "no servers"),
            ]
        );
        assert!(s.needs_server_hosts());
        assert!(s.stops_early(100_000_000));
        assert!(!s.stops_early(0));
    }

    #[test]
    fn the_defaults_are_the_issue_s() {
        let s = check_flags(&args(&[])).unwrap();
        assert_eq!(s.rates, vec![("100mbit".to_string(), 100_000_000)]);
        assert_eq!((s.workers, s.servers), (4, 4));
        assert_eq!(
            s.placements,
            vec![Placement::Separate, Placement::Colocated]
        );
        assert_eq!((s.steps, s.eval_every), (360, 30));
        let conv = check_flags(&args(&["--workload", "conv"])).unwrap();
        assert_eq!(conv.steps, 260);
        let all = systems(&args(&[]), &catalog()).unwrap();
        let labels: Vec<String> = all.iter().map(System::label).collect();
        assert_eq!(labels.join(","), super::super::DEFAULT_SYSTEMS);
    }

    #[test]
    fn quick_is_one_tiny_workload_and_two_systems() {
        let a = args(&["--quick", "--placement", "colocated"]);
        let mut s = check_flags(&a).unwrap();
        s.systems = systems(&a, &catalog()).unwrap();
        assert_eq!((s.workload.as_str(), s.size.as_str()), ("conv", "tiny"));
        assert_eq!(s.set, ["d_model=64"]);
        assert_eq!((s.workers, s.servers), (2, 1));
        assert_eq!(s.rates, vec![("100mbit".to_string(), 100_000_000)]);
        let labels: Vec<String> = s.runs().iter().map(|r| r.system.label()).collect();
        assert_eq!(labels, ["ddp:none", "pushpull:onebit"]);
        assert!(!s.needs_server_hosts());
        // --quick sets these itself.
        let e = Cli::try_parse_from(["bench-train", "--quick", "--workers", "3"]);
        assert!(e.is_err());
    }

    #[test]
    fn bad_flags_name_the_flag_and_the_value() {
        for (line, says) in [
            (&["--rates", "fast"][..], "--rates: rate \"fast\""),
            (&["--rates", "100mbit,100mbit"][..], "given twice"),
            (&["--rates", "none,100mbit"][..], ""),
            (
                &["--placement", "nearby"][..],
                "unknown placement \"nearby\": separate, colocated",
            ),
            (&["--workers", "0"][..], "--workers 0"),
            (&["--steps", "0"][..], "--steps"),
            (&["--target-bpb=-1"][..], "--target-bpb -1"),
            (&["--target-bpb", "0"][..], "--target-bpb 0"),
            (
                &["--set", "d_model"][..],
                "--set \"d_model\": expected FIELD=VALUE",
            ),
        ] {
            match check_flags(&args(line)) {
                Ok(s) => {
                    assert!(says.is_empty(), "{line:?} accepted");
                    assert_eq!(s.rates[0], ("none".to_string(), 0));
                }
                Err(e) => {
                    assert!(!says.is_empty(), "{line:?}: {e}");
                    assert!(e.to_string().contains(says), "{line:?}: {e}");
                }
            }
        }
    }
}
