//! The per-worker script: `bench/tta/train.py` with the two modules it imports (`corpus.py`,
//! `models.py`), embedded in the binary and written to a temporary folder for the sitting, and
//! the interpreter of `--python` that runs it. Before anything starts the script says which
//! systems it knows (`--list-systems`, the one list of presets and hooks) and checks the run's
//! settings with each kind of system (`--check`: the workload, size, `--set` fields, steps, and
//! that torch, gloo and `pushpull.torch` import).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::plan::{Catalog, Kind, Setup, System};
use pushpull_node::error::{CliError, CliResult};

/// The script and its modules, by file name.
const FILES: [(&str, &str); 3] = [
    ("train.py", include_str!("../../../bench/tta/train.py")),
    ("corpus.py", include_str!("../../../bench/tta/corpus.py")),
    ("models.py", include_str!("../../../bench/tta/models.py")),
];

/// The script written out, and the interpreter that runs it.
pub struct Script {
    python: PathBuf,
    dir: tempfile::TempDir,
}

/// The last non-empty lines of `text`, joined with ` | `.
fn tail(text: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(text);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

impl Script {
    /// Writes the script's files to a temporary folder, to be run by `python`.
    pub fn new(python: &Path) -> CliResult<Script> {
        let dir = tempfile::Builder::new()
            .prefix("pushpull-tta-script-")
            .tempdir()
            .map_err(|e| CliError::failed(format!("cannot make a temporary folder: {e}")))?;
        for (name, text) in FILES {
            std::fs::write(dir.path().join(name), text).map_err(|e| {
                CliError::failed(format!("cannot write {name} to a temporary folder: {e}"))
            })?;
        }
        Ok(Script {
            python: python.to_path_buf(),
            dir,
        })
    }

    /// The interpreter.
    pub fn python(&self) -> &Path {
        &self.python
    }

    /// The script's path.
    pub fn train_py(&self) -> PathBuf {
        self.dir.path().join("train.py")
    }

    fn run(&self, args: &[String]) -> CliResult<std::process::Output> {
        Command::new(&self.python)
            .arg(self.train_py())
            .args(args)
            .env("OMP_NUM_THREADS", "1")
            .output()
            .map_err(|e| {
                CliError::usage(format!(
                    "--python {}: cannot run it: {e} (give an interpreter with torch and \
                     pushpull, e.g. a virtual environment's bin/python)",
                    self.python.display()
                ))
            })
    }

    /// `train.py --list-systems`: the presets and hooks it knows.
    pub fn catalog(&self) -> CliResult<Catalog> {
        let out = self.run(&["--list-systems".to_string()])?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(CliError::usage(format!(
                "--python {}: `train.py --list-systems` failed ({}): {}",
                self.python.display(),
                out.status,
                tail(&out.stderr, 3)
            )));
        }
        Catalog::parse(&stdout).map_err(|e| {
            CliError::usage(format!(
                "--python {}: `train.py --list-systems` printed {:?}: {e}",
                self.python.display(),
                stdout.trim()
            ))
        })
    }

    /// `train.py --check` with the settings of a run of `system`: refuses what a run would
    /// refuse, and an interpreter without the system's packages.
    pub fn check(&self, setup: &Setup, system: &System) -> CliResult<()> {
        let mut args = train_args(setup, system, 0, Path::new("/dev/null"), None, None);
        args.push("--check".to_string());
        let out = self.run(&args)?;
        if out.status.success() {
            return Ok(());
        }
        let why = tail(&out.stderr, 1);
        let why = why.strip_prefix("train.py: error: ").unwrap_or(&why);
        Err(CliError::usage(if out.status.code() == Some(2) {
            format!(
                "train.py refused the runs' settings (--workload {}, --size {}, --set, --steps, \
                 --eval-every): {why}",
                setup.workload, setup.size
            )
        } else {
            let needs = match system.kind {
                Kind::PushPull => "torch and pushpull",
                Kind::Ddp => "torch with gloo",
            };
            format!(
                "--python {}: cannot run {} (it needs {needs}): {why}",
                self.python.display(),
                system.label()
            )
        }))
    }
}

/// `train.py`'s arguments for one run (after the script's path): the system, the workload and
/// its size, the schedule, the seed, the output file, and the target and time limit when the
/// run stops early.
pub fn train_args(
    setup: &Setup,
    system: &System,
    seed: u64,
    out: &Path,
    target_bpb: Option<f64>,
    time_limit: Option<f64>,
) -> Vec<String> {
    let mut a: Vec<String> = [
        "--system",
        &system.label(),
        "--workload",
        &setup.workload,
        "--size",
        &setup.size,
        "--steps",
        &setup.steps.to_string(),
        "--eval-every",
        &setup.eval_every.to_string(),
        "--seed",
        &seed.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for kv in &setup.set {
        a.extend(["--set".to_string(), kv.clone()]);
    }
    if let Some(t) = target_bpb {
        a.extend(["--target-bpb".to_string(), format!("{t}")]);
    }
    if let Some(t) = time_limit {
        a.extend(["--time-limit".to_string(), format!("{t:.3}")]);
    }
    a.extend(["--out".to_string(), out.display().to_string()]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_takes_the_harness_s_flags() {
        let train = FILES[0].1;
        for flag in [
            "--system",
            "--workload",
            "--size",
            "--set",
            "--steps",
            "--eval-every",
            "--seed",
            "--target-bpb",
            "--time-limit",
            "--out",
            "--list-systems",
            "--check",
        ] {
            assert!(train.contains(&format!("\"{flag}\"")), "{flag}");
        }
        // The modules train.py imports are the ones written next to it.
        for (name, _) in &FILES[1..] {
            let module = name.trim_end_matches(".py");
            assert!(train.contains(&format!("import {module}")), "{module}");
        }
    }

    #[test]
    fn a_missing_interpreter_names_python() {
        let s = Script::new(Path::new("/nonexistent/python3")).unwrap();
        let e = s.catalog().unwrap_err().to_string();
        assert!(
            e.contains("--python /nonexistent/python3: cannot run it"),
            "{e}"
        );
    }

    #[test]
    fn run_arguments() {
        let setup = Setup {
            rates: vec![("100mbit".into(), 100_000_000)],
            workers: 2,
            servers: 1,
            placements: vec![],
            systems: vec![],
            workload: "conv".into(),
            size: "tiny".into(),
            set: vec!["d_model=48".into()],
            steps: 100,
            eval_every: 10,
            seeds: vec![0],
            target_bpb: None,
            no_stop: false,
        };
        let system = System {
            kind: Kind::Ddp,
            name: "powersgd:2".into(),
        };
        let a = train_args(
            &setup,
            &system,
            3,
            Path::new("/t/r.jsonl"),
            Some(4.5),
            Some(12.0),
        );
        assert_eq!(
            a.join(" "),
            "--system ddp:powersgd:2 --workload conv --size tiny --steps 100 --eval-every 10 \
             --seed 3 --set d_model=48 --target-bpb 4.5 --time-limit 12.000 --out /t/r.jsonl"
        );
    }
}
