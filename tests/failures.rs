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
    start_running_in(2, 1)
}

/// [`start_running`] with `workers` in local groups of `local_size`.
fn start_running_in(workers: u32, local_size: u32) -> Running {
    let mut config = test_config(workers, 2);
    config.cluster.local_size = local_size;
    JobConfig::edit(&mut config, |j| {
        j.scale = 0.001;
        j.rounds = 1_000_000;
        j.warmup = 0;
    })
    .unwrap();
    let cluster = ProcCluster::start(config);
    let mut workers: Vec<Proc> = (0..workers)
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
    let statuses: Vec<_> = procs.iter_mut().map(|p| p.wait_exit(GENEROUS)).collect();
    // Every process's warnings and errors, for a failure's message: a race shows only there.
    let others: String = procs
        .iter()
        .map(|p| {
            let lines = p.stderr();
            let lines = lines.lines().filter(|l| {
                l.starts_with("error:") || l.contains(" WARN ") || l.contains(" ERROR ")
            });
            format!(
                "---- {}\n{}\n",
                p.name,
                lines.collect::<Vec<_>>().join("\n")
            )
        })
        .collect();
    for (i, p) in procs.iter_mut().enumerate() {
        let st = statuses[i];
        let took = exited[i].unwrap();
        let err = p.stderr();
        assert_eq!(
            st.code(),
            Some(1),
            "{} exit status {st}; stderr:\n{err}\nall processes:\n{others}",
            p.name
        );
        assert!(
            err.contains(needle),
            "{}'s error should name {needle:?}; stderr:\n{err}\nall processes:\n{others}",
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

/// A local group's leader (local rank 0 of host 1, which created the group's shared memory):
/// its group's other member, the other group, the scheduler and the servers all fail naming
/// it, and `/dev/shm` holds nothing new (the memory was a memfd).
#[test]
fn sigkill_of_a_local_group_member() {
    let _g = cluster_lock();
    let shm_before = shm_listing();
    let mut r = start_running_in(4, 2);
    r.workers[2].kill();
    let killed_at = Instant::now();
    let Running { cluster, workers } = &mut r;
    let mut procs: Vec<&mut Proc> = vec![&mut cluster.scheduler];
    for (i, w) in workers.iter_mut().enumerate() {
        if i != 2 {
            procs.push(w);
        }
    }
    for (s, _) in &mut cluster.servers {
        procs.push(s);
    }
    expect_failures(&mut procs, "worker 2 (", killed_at);
    assert_eq!(shm_listing(), shm_before, "/dev/shm after the job");
}

fn shm_listing() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
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
