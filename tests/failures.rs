//! SIGKILL of a worker, a server or the scheduler mid-run: every other process fails with an
//! error naming the lost node within two heartbeat timeouts of the kill.

mod common;

use std::time::{Duration, Instant};

use common::*;
use pushpull::jobs::JobConfig;

/// Slack on top of two heartbeat timeouts for a busy 2-core machine (process scheduling,
/// debug builds).
const SLACK: Duration = Duration::from_millis(2500);

struct Running {
    cluster: ProcCluster,
    workers: Vec<Proc>,
}

/// 2 workers x 2 servers, all processes, running the built-in job for (practically) ever.
fn start_running() -> Running {
    let mut config = test_config(2, 2);
    JobConfig::edit(&mut config, |j| {
        j.scale = 0.001;
        j.rounds = 1_000_000;
        j.warmup = 0;
    })
    .unwrap();
    let cluster = ProcCluster::start(config);
    let mut workers: Vec<Proc> = (0..2)
        .map(|i| {
            start_worker_process(
                &cluster.config_path,
                &cluster.certs,
                i,
                cluster.scheduler_addr,
            )
        })
        .collect();
    // Mid-run: both workers have completed a few rounds.
    for w in &mut workers {
        w.wait_line("pushpull-worker progress rank=", GENEROUS);
        w.wait_line("pushpull-worker progress rank=", GENEROUS);
    }
    Running { cluster, workers }
}

/// Waits for every process in `procs` to exit with code 1 and stderr containing `needle`,
/// each within two heartbeat timeouts (plus [`SLACK`]) of `killed_at`. Exits are observed
/// concurrently, so each process's time is its own.
fn expect_failures(procs: &mut [&mut Proc], needle: &str, killed_at: Instant) {
    let bound = 2 * Duration::from_millis(HEARTBEAT_TIMEOUT_MS) + SLACK;
    let mut exited: Vec<Option<Duration>> = vec![None; procs.len()];
    while exited.iter().any(Option::is_none) {
        assert!(
            killed_at.elapsed() < GENEROUS,
            "processes still running {GENEROUS:?} after the kill"
        );
        for (i, p) in procs.iter_mut().enumerate() {
            if exited[i].is_none() && p.child.try_wait().unwrap().is_some() {
                exited[i] = Some(killed_at.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for (i, p) in procs.iter_mut().enumerate() {
        let st = p.wait_exit(GENEROUS);
        let took = exited[i].unwrap();
        let err = p.stderr();
        assert_eq!(
            st.code(),
            Some(1),
            "{} exit status {st}; stderr:\n{err}",
            p.name
        );
        assert!(
            err.contains(needle),
            "{}'s error should name {needle:?}; stderr:\n{err}",
            p.name
        );
        assert!(
            took <= bound,
            "{} took {took:?} after the kill to fail (bound {bound:?}); stderr:\n{err}",
            p.name
        );
        eprintln!(
            "{} failed {took:?} after the kill: {}",
            p.name,
            err.lines()
                .filter(|l| l.starts_with("error:"))
                .collect::<Vec<_>>()
                .join(" / ")
        );
    }
}

#[test]
fn sigkill_of_a_worker() {
    let _g = cluster_lock();
    let mut r = start_running();
    r.workers[1].kill();
    let killed_at = Instant::now();
    let Running { cluster, workers } = &mut r;
    let (w0, _) = workers.split_at_mut(1);
    let mut procs: Vec<&mut Proc> = vec![&mut w0[0], &mut cluster.scheduler];
    for (s, _) in &mut cluster.servers {
        procs.push(s);
    }
    expect_failures(&mut procs, "worker 1 (127.0.0.1:", killed_at);
}

#[test]
fn sigkill_of_a_server() {
    let _g = cluster_lock();
    let mut r = start_running();
    let addr = r.cluster.servers[1].1;
    r.cluster.servers[1].0.kill();
    let killed_at = Instant::now();
    let Running { cluster, workers } = &mut r;
    let mut procs: Vec<&mut Proc> = vec![&mut cluster.scheduler, &mut cluster.servers[0].0];
    for w in workers.iter_mut() {
        procs.push(w);
    }
    expect_failures(&mut procs, &format!("server 1 ({addr})"), killed_at);
}

#[test]
fn sigkill_of_the_scheduler() {
    let _g = cluster_lock();
    let mut r = start_running();
    let addr = r.cluster.scheduler_addr;
    r.cluster.scheduler.kill();
    let killed_at = Instant::now();
    let Running { cluster, workers } = &mut r;
    let mut procs: Vec<&mut Proc> = Vec::new();
    for (s, _) in &mut cluster.servers {
        procs.push(s);
    }
    for w in workers.iter_mut() {
        procs.push(w);
    }
    expect_failures(&mut procs, &format!("scheduler ({addr})"), killed_at);
}
