//! Faults through the whole stack (the test kit in `common`): a worker that vanishes, a
//! server killed or frozen, a silent scheduler, a refused registration, a stranger's
//! certificate. Every error names the node that failed, and every later call of the worker
//! repeats that first cause.

use std::time::{Duration, Instant};

use pushpull_net::certs::generate_cluster;
use pushpull_net::tls::TlsIdentity;
use pushpull_proto::Config;
use pushpull_worker::{JoinOptions, Reduce, Worker, WorkerError};

mod common;
use common::*;

/// Heartbeat (and QUIC idle) timeout of the tests that wait for one.
const FAULT_TIMEOUT_MS: u64 = 3000;

fn short_timeouts(c: &mut Config) {
    c.cluster.heartbeat_timeout_ms = FAULT_TIMEOUT_MS;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_worker_fails_the_others_naming_it() {
    tokio::time::timeout(TIMEOUT, async {
        let mut s = stack(2, 1, 4096).await;
        let t = declare_all(&s, "grad", 100).await;
        let pending = {
            let (w, t) = (s.workers[0].clone(), t[0].clone());
            tokio::spawn(async move { w.push_pull(&t, vec![1.0; 100], Reduce::Sum).await })
        };
        let barrier = {
            let w = s.workers[0].clone();
            tokio::spawn(async move { w.barrier().await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let w1 = s.workers.pop().unwrap();
        drop(t);
        drop(w1); // no finish: the scheduler sees worker 1 vanish
        let e = pending.await.unwrap().unwrap_err();
        println!("worker 0 got: {e}");
        assert!(e.to_string().contains("worker 1 ("), "{e}");
        assert!(!e.to_string().starts_with("server"), "{e}");
        // The server's abort and the scheduler's report race; the worker waits briefly for
        // the report, so the pending call normally fails with NodeLost too.
        assert!(
            e.is_fatal() || matches!(e, WorkerError::Aborted { .. }),
            "{e}"
        );
        let e = barrier.await.unwrap().unwrap_err();
        assert!(e.to_string().starts_with("worker 1 ("), "{e}");
        assert!(e.is_fatal(), "{e}");
        let later = s.workers[0].barrier().await.unwrap_err();
        assert_eq!(later.to_string(), e.to_string(), "the first cause stays");
        let e = s.scheduler.join().await.unwrap_err();
        assert!(e.contains("worker 1"), "{e}");
        assert!(matches!(
            s.workers[0].clone().finish().await,
            Err(WorkerError::NodeLost { .. })
        ));
    })
    .await
    .expect("test timed out");
}

/// A worker whose job failed aborts: its own call in flight fails with `Abandoned`, and the
/// other worker's round and the scheduler fail naming it and the reason it gave, at once (not
/// after a heartbeat timeout: the close has left when `abort` returns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_worker_is_named_with_its_reason() {
    tokio::time::timeout(TIMEOUT, async {
        let mut s = stack_with(2, 1, 4096, |c| c.cluster.heartbeat_timeout_ms = 30_000).await;
        let t = declare_all(&s, "grad", 100).await;
        // Worker 1's round of a second tensor waits for worker 0, and worker 0's round of
        // "grad" waits for worker 1.
        let other = s.workers[1].declare("other", 10, Default::default());
        let other0 = s.workers[0].declare("other", 10, Default::default());
        let (other, _) = tokio::join!(other, other0);
        let mine = {
            let (w, o) = (s.workers[1].clone(), other.unwrap());
            tokio::spawn(async move { w.push_pull(&o, vec![1.0; 10], Reduce::Sum).await })
        };
        let pending = {
            let (w, t) = (s.workers[0].clone(), t[0].clone());
            tokio::spawn(async move { w.push_pull(&t, vec![1.0; 100], Reduce::Sum).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = Instant::now();
        s.workers.pop().unwrap().abort("the model diverged").await;
        let e = mine.await.unwrap().unwrap_err();
        assert!(matches!(e, WorkerError::Abandoned { .. }), "{e}");
        assert!(e.to_string().contains("the model diverged"), "{e}");
        let e = pending.await.unwrap().unwrap_err();
        println!(
            "worker 0 got: {e} ({:?} after the abort)",
            started.elapsed()
        );
        assert!(e.to_string().contains("worker 1 ("), "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        let e = s.scheduler.join().await.unwrap_err();
        assert!(
            e.contains("worker 1") && e.contains("the model diverged"),
            "{e}"
        );
    })
    .await
    .expect("test timed out");
}

/// Worker 1 finishes cleanly while worker 0 waits for a round that needs worker 1's push (the
/// workers made different numbers of calls, e.g. a script that ended early and shut down in a
/// `finally`): the servers fail that round, and every later one, naming worker 1, instead of
/// leaving worker 0 waiting forever (a finished worker is not a lost node: nobody reports it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_finished_early_is_named_by_the_rounds_that_need_it() {
    tokio::time::timeout(TIMEOUT, async {
        let s = stack_with(2, 2, 64, short_timeouts).await;
        let t = declare_all(&s, "grad", 100).await;
        // One complete round, then worker 0 alone starts round 1.
        let (w0, w1) = (s.workers[0].clone(), s.workers[1].clone());
        let (a, b) = tokio::join!(
            w0.push_pull(&t[0], vec![1.0; 100], Reduce::Sum),
            w1.push_pull(&t[1], vec![2.0; 100], Reduce::Sum)
        );
        assert_eq!(a.unwrap(), vec![3.0; 100]);
        assert_eq!(b.unwrap(), vec![3.0; 100]);
        let pending = {
            let (w, t) = (w0.clone(), t[0].clone());
            tokio::spawn(async move { w.push_pull(&t, vec![1.0; 100], Reduce::Sum).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let start = Instant::now();
        // Worker 1's finish waits up to the heartbeat timeout for the job's Shutdown (worker 0
        // has not finished), then closes its connections.
        w1.finish().await.unwrap();
        let e = pending.await.unwrap().unwrap_err();
        let took = start.elapsed();
        println!(
            "worker 0 got, {:.1} s after worker 1 began to finish: {e}",
            took.as_secs_f64()
        );
        assert!(matches!(e, WorkerError::Aborted { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("worker 1 (") && text.contains("finished"),
            "{e}"
        );
        assert!(
            took < Duration::from_millis(FAULT_TIMEOUT_MS + 2000),
            "{took:?}"
        );
        // A later round fails at once, naming it too.
        let e = w0
            .push_pull(&t[0], vec![1.0; 100], Reduce::Sum)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("worker 1 ("), "{e}");
        drop(t);
        drop(w0);
    })
    .await
    .expect("test timed out");
}

/// Server 0 of two workers' job stops as `fault` stops it, while worker 0 waits for a
/// round: that call, and every later call of both workers, fails naming server 0; so does
/// the scheduler.
async fn lost_server(fault: fn(&Node)) {
    let s = stack_with(2, 1, 16, short_timeouts).await;
    let w = &s.workers;
    let t = declare_all(&s, "grad", 10).await;
    let server = format!("server 0 ({})", s.servers[0].addr);
    let pending = {
        let (w, t) = (w[0].clone(), t[0].clone());
        tokio::spawn(async move { w.push_pull(&t, vec![1.0; 10], Reduce::Sum).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let start = Instant::now();
    fault(&s.servers[0]);
    let e = pending.await.unwrap().unwrap_err();
    println!("after {:?}: {e}", start.elapsed());
    assert!(
        e.to_string().starts_with(&format!("{server} was lost")),
        "{e}"
    );
    assert!(e.is_fatal());
    let later = w[0].barrier().await.unwrap_err();
    assert_eq!(later.to_string(), e.to_string(), "the first cause stays");
    let e = w[1]
        .push_pull(&t[1], vec![1.0; 10], Reduce::Sum)
        .await
        .unwrap_err();
    assert!(e.to_string().starts_with(&server), "{e}");
    let e = w[0].clone().finish().await.unwrap_err();
    assert!(e.to_string().starts_with(&server), "{e}");
    let e = s.scheduler.join().await.unwrap_err();
    assert!(e.contains("server 0"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_fails_pending_and_later_calls_naming_it() {
    tokio::time::timeout(TIMEOUT, lost_server(Node::kill))
        .await
        .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_fails_pending_and_later_calls_naming_it() {
    tokio::time::timeout(TIMEOUT, lost_server(Node::freeze))
        .await
        .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_scheduler_is_detected() {
    tokio::time::timeout(TIMEOUT, async {
        let s = stack_with(2, 1, 16, short_timeouts).await;
        let t = declare_all(&s, "grad", 10).await;
        s.scheduler.freeze();
        let start = Instant::now();
        let e = s.workers[0]
            .push_pull(&t[0], vec![1.0; 10], Reduce::Sum)
            .await
            .unwrap_err();
        let waited = start.elapsed();
        println!("after {waited:?}: {e}");
        assert!(
            e.to_string()
                .starts_with(&format!("scheduler ({}) was lost: ", s.scheduler.addr)),
            "{e}"
        );
        assert!(
            waited < Duration::from_millis(3 * FAULT_TIMEOUT_MS),
            "took {waited:?}"
        );
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_reports_the_reason() {
    tokio::time::timeout(TIMEOUT, async {
        let s = nodes_with(2, 1, 16, |_| {}).await;
        let join = |w: usize, requested_rank: Option<u32>| {
            let (config, id) = (s.config.clone(), s.identity(w));
            async move { Worker::join(&config, id, JoinOptions { requested_rank }).await }
        };
        let first = tokio::spawn(join(0, Some(1)));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let e = join(1, Some(1)).await.unwrap_err();
        assert!(matches!(e, WorkerError::Refused { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("requested worker rank 1 is already taken by the worker at"),
            "{e}"
        );
        // A rank out of range is refused before dialling.
        let e = join(1, Some(2)).await.unwrap_err();
        assert!(
            e.to_string().contains("requested rank 2 is out of range"),
            "{e}"
        );
        let second = join(2, None).await.unwrap();
        assert_eq!(second.rank(), 0);
        let first = first.await.unwrap().unwrap();
        assert_eq!(first.rank(), 1);
        let mut s = s;
        s.workers = vec![second, first];
        s.finish_all().await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_from_another_ca_is_refused_at_the_handshake() {
    tokio::time::timeout(TIMEOUT, async {
        let mut s = nodes_with(1, 1, 16, |_| {}).await;
        s.config.cluster.connect_timeout_ms = 2000;
        let dir = tempfile::tempdir().unwrap();
        let stranger =
            &generate_cluster(dir.path(), "pushpull.cluster", &["worker0".into()]).unwrap()[0];
        let stranger = TlsIdentity::load(stranger).unwrap();
        let e = Worker::join(&s.config, stranger, JoinOptions::default())
            .await
            .unwrap_err();
        println!("{e}");
        assert!(matches!(e, WorkerError::Connect { .. }), "{e}");
        assert!(
            e.to_string().starts_with(&format!(
                "cannot connect to scheduler ({})",
                s.scheduler.addr
            )),
            "{e}"
        );
    })
    .await
    .expect("test timed out");
}

/// Which node [`every_survivor_names`] kills.
#[derive(Clone, Copy)]
enum Victim {
    Scheduler,
    Server(usize),
}

/// Two workers, two servers, a round in flight on both servers; `victim` is killed. Every
/// survivor's error names the victim, though the other nodes end too (a server told of the
/// loss closes its connections; its close names the victim, not itself).
async fn every_survivor_names(victim: Victim) {
    let s = stack_with(2, 2, 64, short_timeouts).await;
    let t = declare_all(&s, "grad", 1000).await;
    let node = match victim {
        Victim::Scheduler => &s.scheduler,
        Victim::Server(i) => &s.servers[i],
    };
    let name = format!("{} (", node.name);
    let pending = {
        let (w, t) = (s.workers[0].clone(), t[0].clone());
        tokio::spawn(async move { w.push_pull(&t, vec![1.0; 1000], Reduce::Sum).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    node.kill();
    let e = pending.await.unwrap().unwrap_err();
    println!("worker 0: {e}");
    assert!(e.to_string().starts_with(&name), "{e}");
    // Worker 1 had nothing in flight: its next call reports the same node.
    let e = s.workers[1]
        .push_pull(&t[1], vec![1.0; 1000], Reduce::Sum)
        .await
        .unwrap_err();
    println!("worker 1: {e}");
    assert!(e.to_string().starts_with(&name), "{e}");
    // The surviving scheduler and servers end naming it too.
    let Stack {
        scheduler, servers, ..
    } = s;
    let mut survivors = vec![scheduler];
    survivors.extend(servers);
    for n in survivors {
        let who = n.name.clone();
        if format!("{who} (") == name {
            continue;
        }
        let e = n.join().await.unwrap_err();
        println!("{who}: {e}");
        assert!(e.contains(&name), "{who}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_named_not_the_server_that_reported_it() {
    tokio::time::timeout(TIMEOUT, every_survivor_names(Victim::Server(1)))
        .await
        .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_scheduler_is_named_not_the_servers_that_ended_with_it() {
    tokio::time::timeout(TIMEOUT, every_survivor_names(Victim::Scheduler))
        .await
        .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incomplete_rendezvous_fails_naming_who_is_missing() {
    tokio::time::timeout(TIMEOUT, async {
        let s = nodes_with(2, 1, 16, |c| c.cluster.rendezvous_timeout_ms = 1500).await;
        let start = Instant::now();
        let e = Worker::join(
            &s.config,
            s.identity(0),
            JoinOptions {
                requested_rank: Some(1),
            },
        )
        .await
        .unwrap_err();
        println!("after {:?}: {e}", start.elapsed());
        assert!(matches!(e, WorkerError::JobFailed { .. }), "{e}");
        assert!(
            e.to_string().contains(
                "rendezvous timed out after 1.5 s (cluster.rendezvous_timeout_ms): \
                 1 of 2 workers registered (missing ranks [0]); 1 of 1 servers registered"
            ),
            "{e}"
        );
        let e = s.scheduler.join().await.unwrap_err();
        assert!(e.contains("rendezvous timed out"), "{e}");
        for server in s.servers {
            let e = server.join().await.unwrap_err();
            assert!(e.contains("rendezvous timed out"), "{e}");
        }
    })
    .await
    .expect("test timed out");
}
