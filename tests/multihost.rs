//! The multi-host launch as a cluster manager uses it: `pushpull prepare` writes a job folder
//! whose scheduler is a DNS name (`localhost:PORT`), and `pushpull node` starts each node of it
//! from its index (the scheduler binds every address, the others resolve the name); the
//! built-in job runs to the end, checked bit for bit. A worker's own command gets BytePS's
//! variables, and its exit status is the node's (`pushpull node` replaces itself with it).

mod common;
use common::*;

use pushpull::jobs::JobConfig;

/// A UDP port that was free a moment ago.
fn free_port() -> u16 {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    s.local_addr().unwrap().port()
}

/// `pushpull prepare` of 2 workers (one local group, pushing through the server all the same)
/// and 1 server into `dir`, the scheduler at `localhost:PORT`, the built-in benchmark job
/// checked bit for bit.
fn prepare(dir: &std::path::Path) -> String {
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
    let base_path = write_config(&base, &tempfile::tempdir().unwrap().keep());
    let scheduler = format!("localhost:{}", free_port());
    let out = dir.display().to_string();
    let args = [
        "prepare",
        "--out",
        &out,
        "--scheduler",
        &scheduler,
        "--config",
        base_path.to_str().unwrap(),
        "--local-size",
        "2",
    ]
    .map(String::from);
    let mut p = Proc::spawn("prepare", PUSHPULL, &args);
    assert!(p.wait_exit(GENEROUS).success(), "{}", p.stderr());
    scheduler
}

#[test]
fn nodes_of_a_prepared_job_find_a_scheduler_by_name() {
    let _lock = cluster_lock();
    let dir = tempfile::tempdir().unwrap();
    let scheduler = prepare(dir.path());
    let job = dir.path().display().to_string();
    // Every node of the job by its index over the whole job (`--role auto`: a Kubernetes
    // indexed Job's or one srun step's view).
    let mut nodes: Vec<Proc> = (0..4)
        .map(|i| {
            let args = [
                "node",
                "--job-dir",
                &job,
                "--role",
                "auto",
                "--index",
                &i.to_string(),
            ]
            .map(String::from);
            Proc::spawn(&format!("node {i}"), PUSHPULL, &args)
        })
        .collect();
    for p in nodes.iter_mut().rev() {
        let status = p.wait_exit(GENEROUS);
        assert!(status.success(), "{} failed: {}", p.name, p.stderr());
    }
    for w in [2, 3] {
        let out = nodes[w].stdout().join("\n");
        assert!(out.contains("check: passed"), "worker {}: {out}", w - 2);
        assert!(!out.contains("(0 bytes pushed"), "worker {}: {out}", w - 2);
        let err = nodes[w].stderr();
        assert!(err.contains(&format!("worker{} (--index)", w - 2)), "{err}");
    }
    assert!(nodes[0].stderr().contains("scheduler"), "{scheduler}");
}

#[test]
fn a_workers_command_gets_the_jobs_variables_and_its_status_is_the_nodes() {
    let dir = tempfile::tempdir().unwrap();
    prepare(dir.path());
    let job = dir.path().display().to_string();
    let script =
        "echo \"$DMLC_WORKER_ID $BYTEPS_LOCAL_RANK $BYTEPS_LOCAL_SIZE $DMLC_PS_ROOT_URI\"; \
                  test -r \"$PUSHPULL_TLS_KEY\" && exit 3";
    let args = [
        "node",
        "--job-dir",
        &job,
        "--role",
        "worker",
        "--index",
        "1",
        "--",
        "sh",
        "-c",
        script,
    ]
    .map(String::from);
    let mut p = Proc::spawn("worker 1", PUSHPULL, &args);
    let status = p.wait_exit(GENEROUS);
    assert_eq!(status.code(), Some(3), "{}", p.stderr());
    assert_eq!(p.stdout(), vec!["0 1 2 localhost".to_string()]);
    // Keys are private to their owner.
    use std::os::unix::fs::PermissionsExt;
    let key = dir.path().join("worker1/worker1.key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", key.display());
}
