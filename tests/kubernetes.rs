//! `pushpull prepare --kubernetes NAME` writes manifests the Kubernetes API accepts: the file
//! is checked offline against the API's schemas by `kubernetes-validate` (PyPI; it carries the
//! OpenAPI schemas of each Kubernetes version) with `--strict`, so an unknown or misplaced
//! field fails, at 1.28 (the first version that labels a pod with its completion index, which
//! the Service selects) and a recent version. Nothing here talks to a cluster; the pods of a
//! written Job are emulated as processes, each with only what its pod would see.
//!
//! The validator is `PUSHPULL_KUBERNETES_VALIDATE` or `kubernetes-validate` on the PATH
//! (`python3 -m venv /tmp/kv && /tmp/kv/bin/pip install kubernetes-validate`). Without one the
//! schema test says so and skips, unless `PUSHPULL_REQUIRE_K8S_SCHEMAS=1` (CI) turns that into
//! a failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{cluster_lock, test_config, write_config, Proc, GENEROUS};
use pushpull::jobs::JobConfig;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_pushpull");
/// The Kubernetes versions whose schemas the manifests are checked against.
const VERSIONS: [&str; 2] = ["1.28.0", "1.34.0"];

fn prepare(out: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("prepare")
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .expect("pushpull prepare")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// The validator, or None (after saying so) when there is none and none is required.
fn validator_or_skip(test: &str) -> Option<PathBuf> {
    let required = std::env::var("PUSHPULL_REQUIRE_K8S_SCHEMAS").is_ok_and(|v| v == "1");
    let program = std::env::var_os("PUSHPULL_KUBERNETES_VALIDATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("kubernetes-validate"));
    let runs = Command::new(&program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    match (runs, required) {
        (true, _) => Some(program),
        (false, true) => panic!(
            "PUSHPULL_REQUIRE_K8S_SCHEMAS=1 but {} does not run",
            program.display()
        ),
        (false, false) => {
            eprintln!(
                "skipped: {test}: no kubernetes-validate here (pip install kubernetes-validate, \
                 or set PUSHPULL_KUBERNETES_VALIDATE)"
            );
            None
        }
    }
}

fn validate(program: &Path, version: &str, file: &Path) -> Output {
    Command::new(program)
        .args(["--strict", "--kubernetes-version", version])
        .arg(file)
        .output()
        .expect("kubernetes-validate")
}

#[test]
fn the_manifests_pass_the_kubernetes_schemas_strictly() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("job");
    let done = prepare(
        &out,
        &[
            "--kubernetes",
            "pushpull-test",
            "--image",
            "registry.example/pushpull:1",
            "--servers",
            "2",
            "--workers",
            "4",
            "--",
            "python",
            "train.py",
        ],
    );
    assert!(done.status.success(), "{}", stderr(&done));
    let file = out.join("kubernetes.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("\"completions\": 7"), "{text}");
    assert!(text.contains("\"cluster.toml\""), "{text}");
    let toml = std::fs::read_to_string(out.join("cluster.toml")).unwrap();
    assert!(
        toml.contains("scheduler = \"pushpull-test:29500\""),
        "{toml}"
    );

    let Some(program) = validator_or_skip("the_manifests_pass_the_kubernetes_schemas_strictly")
    else {
        return;
    };
    for version in VERSIONS {
        let o = validate(&program, version, &file);
        let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
        assert!(o.status.success(), "Kubernetes {version}: {said}");
        // Four objects, each checked.
        assert_eq!(said.matches("INFO").count(), 4, "{said}");
    }
    // --strict is what catches a misplaced field: the same file with one is refused.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        text.replace(
            "\"backoffLimit\": 0",
            "\"backoffLimit\": 0, \"restartPolicy\": \"Never\"",
        ),
    )
    .unwrap();
    let o = validate(&program, VERSIONS[0], &bad);
    let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(
        !o.status.success() && said.contains("restartPolicy"),
        "{said}"
    );
}

#[test]
fn bad_kubernetes_flags_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("job");
    let refused = |args: &[&str], says: &str| {
        let o = prepare(&out, args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    };
    refused(&["--kubernetes", "Push_Pull"], "--kubernetes \"Push_Pull\"");
    refused(
        &["--kubernetes", "pp", "--scheduler", "node001:9000"],
        "through the Service pp",
    );
    refused(&["--kubernetes", "pp", "--image", "a b"], "--image \"a b\"");
    refused(
        &["--kubernetes", "pp", "--workers", "4", "--local-size", "2"],
        "cluster.local_size = 2",
    );
    // --image and a command belong to --kubernetes; without either, --scheduler is needed.
    refused(
        &["--scheduler", "node001:9000", "--image", "x"],
        "--kubernetes",
    );
    refused(&[], "--scheduler");
    assert!(!out.join("kubernetes.yaml").exists());
}

/// The objects of a `kubernetes.yaml`: JSON documents separated by `---`, after comments.
fn objects(text: &str) -> Vec<Value> {
    text.split("\n---\n")
        .map(|d| {
            let json: String = d.lines().filter(|l| !l.starts_with('#')).collect();
            serde_json::from_str(&json).unwrap()
        })
        .collect()
}

/// A UDP port that was free a moment ago.
fn free_port() -> u16 {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    s.local_addr().unwrap().port()
}

/// The Job's pods as processes here, each given only what Kubernetes would mount: the
/// ConfigMap's cluster file at its /job, and at its /tls the Secret's files that the volume's
/// items put under its index (what `subPathExpr: $(INDEX)` mounts), mode 0400; the command is
/// the container's with `$(INDEX)` expanded. One substitution: the scheduler's name (the
/// Service's, resolved by cluster DNS) becomes `localhost`. The built-in job runs to the end,
/// checked bit for bit.
#[test]
fn the_jobs_pods_emulated_here_run_the_job() {
    let _lock = cluster_lock();
    let dir = tempfile::tempdir().unwrap();
    let mut base = test_config(2, 1);
    base.cluster.force_distributed = true;
    JobConfig::edit(&mut base, |j| {
        j.kind = "benchmark".into();
        j.scale = 0.01;
        j.rounds = 2;
        j.warmup = 1;
        j.check = true;
    })
    .unwrap();
    let base_dir = dir.path().join("base");
    std::fs::create_dir_all(&base_dir).unwrap();
    let base_path = write_config(&base, &base_dir);
    let out = dir.path().join("job");
    let base_arg = base_path.display().to_string();
    let done = prepare(&out, &["--kubernetes", "pp", "--config", &base_arg]);
    assert!(done.status.success(), "{}", stderr(&done));
    let objs = objects(&std::fs::read_to_string(out.join("kubernetes.yaml")).unwrap());
    let (config_map, secret, job) = (&objs[0], &objs[1], &objs[3]);
    let pod = &job["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let items = pod["volumes"][1]["secret"]["items"].as_array().unwrap();
    let n = job["spec"]["completions"].as_u64().unwrap();
    assert_eq!(n, 4);
    let toml = config_map["data"]["cluster.toml"].as_str().unwrap();
    let toml = toml.replace("\"pp:29500\"", &format!("\"localhost:{}\"", free_port()));

    use std::os::unix::fs::PermissionsExt;
    let mut pods: Vec<Proc> = (0..n)
        .map(|i| {
            let root = dir.path().join(format!("pod{i}"));
            let (job_dir, tls_dir) = (root.join("job"), root.join("tls"));
            std::fs::create_dir_all(&job_dir).unwrap();
            std::fs::create_dir_all(&tls_dir).unwrap();
            std::fs::write(job_dir.join("cluster.toml"), &toml).unwrap();
            for item in items {
                let path = item["path"].as_str().unwrap();
                if let Some(file) = path.strip_prefix(&format!("{i}/")) {
                    let key = item["key"].as_str().unwrap();
                    let f = tls_dir.join(file);
                    std::fs::write(&f, secret["stringData"][key].as_str().unwrap()).unwrap();
                    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o400)).unwrap();
                }
            }
            let args: Vec<String> = container["command"].as_array().unwrap()[1..]
                .iter()
                .map(|a| match a.as_str().unwrap() {
                    "/job" => job_dir.display().to_string(),
                    "/tls" => tls_dir.display().to_string(),
                    "$(INDEX)" => i.to_string(),
                    other => other.to_string(),
                })
                .collect();
            Proc::spawn(&format!("pod {i}"), &[BIN], &args)
        })
        .collect();
    for p in pods.iter_mut().rev() {
        let status = p.wait_exit(GENEROUS);
        assert!(status.success(), "{} failed: {}", p.name, p.stderr());
    }
    assert!(pods[0].stderr().contains("scheduler (--index)"));
    for w in [2, 3] {
        let said = pods[w].stdout().join("\n");
        assert!(said.contains("check: passed"), "pod {w}: {said}");
        let err = pods[w].stderr();
        assert!(err.contains(&format!("worker{} (--index)", w - 2)), "{err}");
        // Only its own key was there to use.
        let tls = dir.path().join(format!("pod{w}/tls"));
        assert_eq!(std::fs::read_dir(&tls).unwrap().count(), 3);
    }
}
