//! Bad input to the binaries: exit code 2 and a message naming the offending thing.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

const T: Duration = Duration::from_secs(60);

const GOOD: &str = r#"
[cluster]
scheduler = "127.0.0.1:0"
num_workers = 1
num_servers = 1
"#;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// Runs `program --config FILE extra...` with valid certificates; returns (code, stderr).
fn run_with_config(
    program: &[&str],
    certs: &Certs,
    node: &str,
    text: &str,
    extra: &[&str],
) -> (Option<i32>, String) {
    let cfg = write(certs.path(), &format!("{node}-test.toml"), text);
    let mut args: Vec<String> = vec!["--config".into(), cfg];
    args.extend(certs.args(node));
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _out, err) = run_bin(program, &refs, T);
    (code, err)
}

fn expect_usage(code: Option<i32>, err: &str, needles: &[&str]) {
    assert_eq!(code, Some(2), "expected exit code 2; stderr:\n{err}");
    for n in needles {
        assert!(err.contains(n), "stderr should name {n:?}:\n{err}");
    }
}

#[test]
fn config_errors_name_the_key_for_every_binary() {
    let certs = Certs::cluster(1, 1);
    let cases: Vec<(String, Vec<&str>)> = vec![
        (format!("{GOOD}num_wrokers = 3\n"), vec!["num_wrokers"]),
        (
            "[cluster]\nscheduler = \"127.0.0.1:0\"\nnum_workers = 1\n".to_string(),
            vec!["num_servers"],
        ),
        (
            GOOD.replace("num_workers = 1", "num_workers = \"two\""),
            vec!["num_workers"],
        ),
        (
            GOOD.replace("num_workers = 1", "num_workers = 0"),
            vec!["cluster.num_workers", "at least 1"],
        ),
        (
            GOOD.replace("127.0.0.1:0", "localhost:x"),
            vec!["cluster.scheduler", "localhost:x"],
        ),
        (
            format!("{GOOD}\n[server]\nlisten = \"10.0.0.300:1\"\n"),
            vec!["server.listen", "10.0.0.300:1"],
        ),
    ];
    for (text, needles) in &cases {
        for (program, node) in [
            (SCHEDULER, "scheduler"),
            (SERVER, "server0"),
            (WORKER, "worker0"),
        ] {
            let (code, err) = run_with_config(program, &certs, node, text, &[]);
            expect_usage(code, &err, needles);
            assert!(
                err.contains(&format!("{node}-test.toml")),
                "names the file:\n{err}"
            );
        }
    }
}

/// `[job]` is the job's: the worker, which runs it, refuses a bad table naming the key and the
/// file; the scheduler and the servers, which run no job, start with it.
#[test]
fn job_errors_are_the_workers_and_the_other_nodes_leave_the_table_alone() {
    let certs = Certs::cluster(1, 1);
    let cases: Vec<(String, Vec<&str>)> = vec![
        (format!("{GOOD}\n[job]\nrounds = -1\n"), vec!["rounds"]),
        (
            format!("{GOOD}\n[job]\nmodel = \"cnn\"\n"),
            vec!["job.model", "cnn", "logistic"],
        ),
        (
            format!("{GOOD}\n[job]\nlabel_noise = 1.5\n"),
            vec!["job.label_noise", "1.5"],
        ),
        (
            format!("{GOOD}\n[job]\nhidden = []\n"),
            vec!["job.hidden", "[]"],
        ),
        (
            format!("{GOOD}\n[job]\nrunds = 3\n"),
            vec!["[job]", "runds"],
        ),
    ];
    for (text, needles) in &cases {
        let (code, err) = run_with_config(WORKER, &certs, "worker0", text, &[]);
        expect_usage(code, &err, needles);
        assert!(err.contains("worker0-test.toml"), "names the file:\n{err}");
    }
    let (text, _) = &cases[1];
    let cfg = write(certs.path(), "nodes-test.toml", text);
    let (mut scheduler, addr) = start_scheduler(Path::new(&cfg), &certs);
    let (mut server, _) = start_server(Path::new(&cfg), &certs, 0, addr);
    server.kill();
    scheduler.kill();
}

#[test]
fn bad_addresses_in_flags_are_named() {
    let certs = Certs::cluster(1, 1);
    for (program, node) in [
        (SCHEDULER, "scheduler"),
        (SERVER, "server0"),
        (WORKER, "worker0"),
    ] {
        let (code, err) = run_with_config(program, &certs, node, GOOD, &["--scheduler", "1.2.3:4"]);
        expect_usage(code, &err, &["--scheduler", "1.2.3:4"]);
    }
    let (code, err) = run_with_config(SERVER, &certs, "server0", GOOD, &["--listen", "nowhere"]);
    expect_usage(code, &err, &["--listen", "nowhere"]);
}

#[test]
fn missing_config_file_and_unreadable_certificates_are_named() {
    let certs = Certs::cluster(1, 1);
    let (code, _, err) = run_bin(SCHEDULER, &["--config", "/nonexistent/cluster.toml"], T);
    expect_usage(code, &err, &["/nonexistent/cluster.toml"]);

    let cfg = write(certs.path(), "good.toml", GOOD);
    for (program, node) in [
        (SCHEDULER, "scheduler"),
        (SERVER, "server0"),
        (WORKER, "worker0"),
    ] {
        let mut args = vec!["--config".to_string(), cfg.clone()];
        args.extend(certs.args(node));
        // Replace the key with a file that is not a key, then with one that does not exist.
        let not_a_key = certs.path().join("ca/ca.pem").display().to_string();
        let n = args.len();
        args[n - 1] = not_a_key.clone();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, _, err) = run_bin(program, &refs, T);
        expect_usage(code, &err, &[&not_a_key]);
        args[n - 1] = "/nonexistent/node.key".into();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, _, err) = run_bin(program, &refs, T);
        expect_usage(code, &err, &["/nonexistent/node.key"]);
    }
    // No [tls] at all.
    let (code, _, err) = run_bin(SCHEDULER, &["--config", &cfg], T);
    expect_usage(code, &err, &["tls.ca"]);
}

#[test]
fn a_port_in_use_is_named() {
    let certs = Certs::cluster(1, 1);
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let text = GOOD.replace("127.0.0.1:0", &addr.to_string());
    let (code, err) = run_with_config(SCHEDULER, &certs, "scheduler", &text, &[]);
    expect_usage(code, &err, &[&addr.to_string()]);
    assert!(err.to_lowercase().contains("in use"), "{err}");
    let (code, err) = run_with_config(
        SERVER,
        &certs,
        "server0",
        GOOD,
        &["--listen", &addr.to_string()],
    );
    expect_usage(code, &err, &[&addr.to_string()]);
    drop(taken);
}

#[test]
fn usage_errors_and_help() {
    let (code, _, err) = run_bin(SCHEDULER, &["--config", "x.toml", "--bogus"], T);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--bogus"), "{err}");
    let (code, _, err) = run_bin(WORKER, &["--rank", "x", "--config", "c.toml"], T);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--rank"), "{err}");
    for (program, flags) in [
        (
            SCHEDULER,
            &["--config", "--scheduler", "--ca", "--cert", "--key"][..],
        ),
        (SERVER, &["--listen"][..]),
        (WORKER, &["--rank", "--json", "--progress"][..]),
    ] {
        let (code, out, err) = run_bin(program, &["--help"], T);
        assert_eq!(code, Some(0), "{err}");
        for f in flags {
            assert!(out.contains(f), "{program:?} --help lacks {f}:\n{out}");
        }
    }
    let (code, out, _) = run_bin(PUSHPULL, &["--help"], T);
    assert_eq!(code, Some(0));
    for sub in ["local", "certs", "bench", "scheduler", "server", "worker"] {
        assert!(out.contains(sub), "pushpull --help lacks {sub}:\n{out}");
    }
    let (code, _, err) = run_bin(PUSHPULL, &["local", "--workers", "0"], T);
    expect_usage(code, &err, &["cluster.num_workers"]);
    let (code, _, err) = run_bin(PUSHPULL, &["local", "--scale", "0"], T);
    expect_usage(code, &err, &["job.scale"]);
    // The training flags: bad values are named before anything starts.
    let (code, _, err) = run_bin(PUSHPULL, &["local", "--compressor", "zip"], T);
    expect_usage(code, &err, &["zip", "onebit", "logistic"]);
    let (code, _, err) = run_bin(PUSHPULL, &["local", "--compare", "none,gzip"], T);
    expect_usage(code, &err, &["gzip"]);
    let (code, _, err) = run_bin(PUSHPULL, &["local", "--param", "k"], T);
    expect_usage(code, &err, &["--param", "KEY=VALUE"]);
    let (code, _, err) = run_bin(PUSHPULL, &["local", "--lr=-1"], T);
    expect_usage(code, &err, &["job.lr", "-1"]);
    let (code, _, err) = run_bin(PUSHPULL, &["local", "--job", "dance"], T);
    expect_usage(code, &err, &["job.kind", "dance", "train"]);
    // The benchmark job runs once: training's repetitions are refused, not ignored.
    let args = ["local", "--job", "benchmark", "--compare", "none,onebit"];
    let (code, _, err) = run_bin(PUSHPULL, &args, T);
    expect_usage(code, &err, &["--compare", "benchmark", "--compressor"]);
    let (code, _, err) = run_bin(PUSHPULL, &["local", "--buffers", "gpu"], T);
    expect_usage(code, &err, &["job.buffers", "\"gpu\"", "emulated"]);
    let (code, out, err) = run_bin(PUSHPULL, &["local", "--help"], T);
    assert_eq!(code, Some(0), "{err}");
    for f in [
        "--compressor",
        "--param",
        "--compare",
        "--seeds",
        "--job",
        "--steps",
    ] {
        assert!(out.contains(f), "pushpull local --help lacks {f}:\n{out}");
    }
}

#[test]
fn certs_command_writes_a_usable_set() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("certs");
    let out_s = out.display().to_string();
    let (code, stdout, err) = run_bin(
        PUSHPULL,
        &[
            "certs",
            "--out",
            &out_s,
            "--nodes",
            "scheduler,server0,worker0",
        ],
        T,
    );
    assert_eq!(code, Some(0), "{err}");
    for f in [
        "ca/ca.pem",
        "ca/ca.key",
        "scheduler/ca.pem",
        "scheduler/scheduler.pem",
        "server0/server0.key",
        "worker0/worker0.pem",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    // The CA key stays out of every node's folder; keys are the owner's alone.
    for node in ["scheduler", "server0", "worker0"] {
        assert!(!out.join(node).join("ca.key").exists(), "{node}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for f in ["ca/ca.key", "worker0/worker0.key"] {
            let mode = std::fs::metadata(out.join(f)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
    }
    assert!(
        stdout.contains("# server0") && stdout.contains("server0.pem"),
        "{stdout}"
    );
    let tls = pushpull_proto::config::TlsConfig {
        ca: Some(out.join("worker0/ca.pem")),
        cert: Some(out.join("worker0/worker0.pem")),
        key: Some(out.join("worker0/worker0.key")),
        ..Default::default()
    };
    pushpull_net::tls::TlsIdentity::load(&tls).unwrap();
    // A second run refuses to overwrite the CA.
    let (code, _, err) = run_bin(PUSHPULL, &["certs", "--out", &out_s], T);
    expect_usage(code, &err, &["--force"]);
}

/// `pushpull local --device cuda` says what is missing (no GPU here, or a build without the
/// `cuda` feature) and exits 2 before starting anything; a device that is not one is named.
#[test]
fn local_device_cuda_without_a_gpu_or_the_feature_exits_2() {
    let (code, _, err) = run_bin(PUSHPULL, &["local", "--device", "cuda"], T);
    let gpu = pushpull_kernels::cuda::gpu_available();
    if gpu && cfg!(feature = "cuda") {
        println!("a GPU and the cuda feature: --device cuda is accepted here, not checked");
        return;
    }
    let needle = if gpu {
        "without the `cuda` feature"
    } else {
        "no usable CUDA GPU"
    };
    expect_usage(code, &err, &["--device", needle]);
    let (code, _, err) = run_bin(PUSHPULL, &["local", "--device", "tpu"], T);
    expect_usage(code, &err, &["--device", "\"tpu\"", "cuda:N"]);
}

/// BytePS's variables a binary cannot honour are refused by name (exit code 2), before it
/// binds anything; a BytePS job file's setting is never silently ignored.
#[test]
fn byteps_variables_are_honoured_or_refused_by_name() {
    let certs = Certs::cluster(1, 1);
    let cfg = write(certs.path(), "env-test.toml", GOOD);
    let run = |program: &[&str], node: &str, vars: &[(&str, &str)]| {
        let mut c = std::process::Command::new(program[0]);
        c.args(&program[1..])
            .args(["--config", &cfg])
            .args(certs.args(node))
            .env_remove("RUST_LOG");
        for (k, v) in vars {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(SCHEDULER, "scheduler", &[("BYTEPS_NCCL_GROUP_SIZE", "4")]);
    expect_usage(code, &err, &["BYTEPS_NCCL_GROUP_SIZE", "NCCL"]);
    let (code, err) = run(SERVER, "server0", &[("DMLC_ROLE", "worker")]);
    expect_usage(code, &err, &["DMLC_ROLE", "server"]);
    let (code, err) = run(SCHEDULER, "scheduler", &[("BYTEPS_PARTITION_BYTES", "6")]);
    expect_usage(code, &err, &["BYTEPS_PARTITION_BYTES", "multiple of 4"]);
    let (code, err) = run(WORKER, "worker0", &[("BYTEPS_LOG_LEVEL", "loud")]);
    expect_usage(code, &err, &["BYTEPS_LOG_LEVEL", "WARNING"]);
    let (code, err) = run(SERVER, "server0", &[("BYTEPS_NEW_KNOB", "1")]);
    expect_usage(
        code,
        &err,
        &["BYTEPS_NEW_KNOB", "not a BytePS variable pushpull knows"],
    );
}
