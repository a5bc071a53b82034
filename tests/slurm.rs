//! `deploy/slurm/pushpull.sbatch` on a real Slurm cluster (CI starts a one-machine cluster with
//! `deploy/slurm/one-machine.sh` and sets `PUSHPULL_REQUIRE_SLURM=1`): a good job's exit status
//! is 0 and every worker's check passed; a job whose worker is killed mid-job fails, its output
//! names the lost worker, and nothing of the job is left running.
//!
//! Without a cluster (`sinfo` fails) the tests say so and skip, unless
//! `PUSHPULL_REQUIRE_SLURM=1` turns that into a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use pushpull::jobs::JobConfig;

const PUSHPULL: &str = env!("CARGO_BIN_EXE_pushpull");

/// Whether a Slurm cluster answers here; panics when one is required and none answers.
fn slurm_or_skip(test: &str) -> bool {
    let required = std::env::var("PUSHPULL_REQUIRE_SLURM").is_ok_and(|v| v == "1");
    let up = Command::new("sinfo")
        .args(["-h", "-o", "%T"])
        .output()
        .is_ok_and(|o| o.status.success() && !o.stdout.is_empty());
    if !up && required {
        panic!("PUSHPULL_REQUIRE_SLURM=1 but `sinfo` finds no Slurm cluster");
    }
    if !up {
        eprintln!(
            "skipped: {test}: no Slurm cluster here (deploy/slurm/one-machine.sh starts one)"
        );
    }
    up
}

fn sbatch_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/slurm/pushpull.sbatch")
}

/// A cluster file of the built-in benchmark job (small, checked bit for bit) with `rounds`
/// rounds and short heartbeats, written into `dir`.
fn base_config(dir: &Path, rounds: u32) -> PathBuf {
    let mut c = pushpull::launch::local::default_config();
    c.cluster.heartbeat_interval_ms = 500;
    c.cluster.heartbeat_timeout_ms = 3000;
    JobConfig::edit(&mut c, |j| {
        j.kind = "benchmark".into();
        j.scale = 0.01;
        j.rounds = rounds;
        j.warmup = 1;
        j.check = true;
    })
    .unwrap();
    let sub = dir.join("base");
    std::fs::create_dir_all(&sub).unwrap();
    pushpull::launch::write_config(&c, &sub).unwrap()
}

/// `sbatch --wait` of the script in `dir` with 2 workers on one node and `args` as the
/// workers' command; returns the exit code, the job's output and its id.
fn submit(dir: &Path, config: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = dir.join("job.out");
    let done = Command::new("sbatch")
        .arg("--wait")
        .arg("--nodes=1")
        .arg("--ntasks-per-node=2")
        .arg(format!("--chdir={}", dir.display()))
        .arg(format!("--output={}", out.display()))
        .arg(sbatch_script())
        .args(args)
        .env("PUSHPULL", PUSHPULL)
        .env("PUSHPULL_CONFIG", config)
        .env("PUSHPULL_PORT", free_port().to_string())
        .env("PUSHPULL_JOB_DIR", dir.join("job"))
        .output()
        .expect("sbatch");
    let said = String::from_utf8_lossy(&done.stdout);
    let id = said
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .to_string();
    let text = std::fs::read(&out).unwrap_or_default();
    (
        done.status.code(),
        String::from_utf8_lossy(&text).into_owned(),
        id,
    )
}

fn free_port() -> u16 {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    s.local_addr().unwrap().port()
}

/// Processes whose command line mentions `dir`.
fn left_running(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    let mut left = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(&needle) {
            left.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
        }
    }
    left
}

#[test]
fn a_slurm_job_runs_the_built_in_job_and_returns_its_status() {
    if !slurm_or_skip("Slurm: a good job") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = base_config(dir.path(), 5);
    let (code, out, _) = submit(dir.path(), &config, &[]);
    assert_eq!(code, Some(0), "the job failed:\n{out}");
    for rank in 0..2 {
        assert!(
            out.contains(&format!("pushpull-worker rank {rank} of 2")),
            "no report of worker {rank}:\n{out}"
        );
    }
    assert_eq!(out.matches("check: passed").count(), 2, "{out}");
    // The keys the script made are private.
    use std::os::unix::fs::PermissionsExt;
    let key = dir.path().join("job/worker0/worker0.key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", key.display());
}

#[test]
fn a_slurm_job_whose_worker_dies_fails_naming_it_and_leaves_nothing() {
    if !slurm_or_skip("Slurm: a failing job") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = base_config(dir.path(), 1_000_000);
    // Every worker runs the built-in job; worker 1 is killed (SIGKILL) after 3 s.
    let script = format!(
        "rank=$((DMLC_WORKER_ID * BYTEPS_LOCAL_SIZE + BYTEPS_LOCAL_RANK)); {PUSHPULL} worker \
         --config \"$PUSHPULL_CONFIG\" --ca \"$PUSHPULL_TLS_CA\" --cert \"$PUSHPULL_TLS_CERT\" \
         --key \"$PUSHPULL_TLS_KEY\" --rank $rank & p=$!; if [ $rank = 1 ]; then sleep 3; \
         kill -9 $p; exit 9; fi; wait $p"
    );
    let started = std::time::Instant::now();
    let (code, out, id) = submit(dir.path(), &config, &["sh", "-c", &script]);
    assert_ne!(code, Some(0), "the job should fail:\n{out}");
    assert!(out.contains("worker 1") && out.contains("lost"), "{out}");
    // The scheduler and the servers stopped too (a million rounds would take hours).
    assert!(started.elapsed().as_secs() < 120, "{out}");
    let left = left_running(dir.path());
    assert!(left.is_empty(), "still running after the job: {left:?}");
    let queue = Command::new("squeue")
        .args(["-h", "-j", &id])
        .output()
        .unwrap();
    let queue = String::from_utf8_lossy(&queue.stdout);
    assert!(
        queue.trim().is_empty(),
        "job {id} is still in the queue: {queue}"
    );
}
