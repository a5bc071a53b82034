//! Roles bound to certificates, through the whole stack (the test kit in `common`): a node
//! may play only the role its certificate grants, whichever side checks.

use pushpull_scheduler::Scheduler;
use pushpull_server::Server;
use pushpull_worker::{JoinOptions, Worker, WorkerError};

mod common;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_certificate_cannot_serve_and_a_server_certificate_cannot_work() {
    tokio::time::timeout(TIMEOUT, async {
        let s = nodes_with(1, 1, 16, |_| {}).await;
        // A worker's certificate registering as a second server 0.
        let rogue = Server::bind(s.config.clone(), s.identity(1))
            .await
            .unwrap()
            .with_requested_id(Some(0));
        let e = rogue.run().await.unwrap_err().to_string();
        println!("{e}");
        assert!(
            e.contains(
                "registration refused by the scheduler: certificate of a worker (any rank) \
                 cannot act as server 0"
            ),
            "{e}"
        );
        // Server 0's certificate joining as a worker.
        let e = Worker::join(
            &s.config,
            s.node_identity("server0"),
            JoinOptions::default(),
        )
        .await
        .unwrap_err();
        println!("{e}");
        assert!(matches!(e, WorkerError::Refused { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("certificate of server 0 cannot act as a worker"),
            "{e}"
        );
        // The real worker still joins, and the job runs.
        let mut s = s;
        s.workers = s
            .join(&[None])
            .await
            .into_iter()
            .map(|w| w.unwrap())
            .collect();
        s.finish_all().await;
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_refuse_a_scheduler_whose_certificate_is_a_workers() {
    tokio::time::timeout(TIMEOUT, async {
        let s = nodes_with(1, 1, 16, |_| {}).await;
        let mut config = s.config.clone();
        config.cluster.scheduler = "127.0.0.1:0".into();
        let rogue = Scheduler::bind(config.clone(), s.identity(0))
            .await
            .unwrap();
        config.cluster.scheduler = rogue.local_addr().to_string();
        let rogue = tokio::spawn(rogue.run());
        let e = Worker::join(&config, s.identity(1), JoinOptions::default())
            .await
            .unwrap_err();
        println!("{e}");
        assert!(matches!(e, WorkerError::Connect { .. }), "{e}");
        assert!(
            e.to_string().contains(
                "refused: certificate of a worker (any rank) cannot act as the scheduler"
            ),
            "{e}"
        );
        rogue.abort();
    })
    .await
    .expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_check_roles_off_any_cluster_certificate_plays_any_role() {
    tokio::time::timeout(TIMEOUT, async {
        // The documented way to run with certificates from one's own PKI.
        let mut s = nodes_with(1, 1, 16, |c| c.tls.check_roles = false).await;
        let w = Worker::join(
            &s.config,
            s.node_identity("server0"),
            JoinOptions::default(),
        )
        .await
        .unwrap();
        s.workers = vec![w];
        s.finish_all().await;
    })
    .await
    .expect("test timed out");
}
