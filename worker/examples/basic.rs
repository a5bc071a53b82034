//! A minimal data-parallel "training" loop with the pushpull worker API.
//!
//! Each worker joins the job, declares one parameter tensor, takes its initial values from
//! rank 0 (broadcast), then runs a few steps of plain SGD on a toy problem: worker `r`'s
//! gradient pulls the parameters towards `r + 1`, so after averaging over all workers the
//! parameters move towards the mean target, `(num_workers + 1) / 2`, on every worker alike.
//!
//! # Running it
//! The example needs a running scheduler and servers reading the same cluster file, with the
//! scheduler on a fixed port and a `[tls]` section (every node presents a certificate signed by
//! the cluster CA). `configs/local.toml` is the file of the `pushpull local` launcher (port 0,
//! no `[tls]`: the launcher fills both in), so copy it and set, e.g.:
//!
//! ```text
//! [cluster]
//! scheduler = "127.0.0.1:9000"
//! num_workers = 2
//! num_servers = 1
//! [tls]
//! ca = "certs/ca.pem"
//! cert = "certs/node.pem"
//! key = "certs/node.key"
//! ```
//!
//! Make the certificates with `pushpull certs` (see `pushpull --help`), or with
//! `pushpull_net::certs::generate_cluster`. Then, with the binaries of the root package
//! (`cargo build --release`; see each binary's `--help` for how to pass the cluster file):
//!
//! ```text
//! pushpull-scheduler ...my.toml &                                   # the rendezvous
//! pushpull-server    ...my.toml &                                   # one per num_servers
//! cargo run -p pushpull-worker --example basic -- my.toml &         # worker 0
//! cargo run -p pushpull-worker --example basic -- my.toml           # worker 1
//! ```
//!
//! (`pushpull local` starts a scheduler, servers and the built-in benchmark workers in one
//! command.) Arguments: the config path (default `configs/local.toml`) and, optionally, the
//! rank to ask for. `RUST_LOG=info` shows the worker's log.

use pushpull_worker::{JoinOptions, ParamMap, Reduce, Worker, WorkerError};

const LEN: usize = 1000;
const STEPS: usize = 5;
const LEARNING_RATE: f32 = 0.5;

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    if let Err(e) = run().await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), WorkerError> {
    let mut args = std::env::args().skip(1);
    let config_path = args
        .next()
        .unwrap_or_else(|| "configs/local.toml".to_string());
    let requested_rank = match args.next() {
        Some(r) => Some(
            r.parse::<u32>()
                .map_err(|_| WorkerError::Config(format!("rank {r:?} is not a number")))?,
        ),
        None => None,
    };

    // Join: registers with the scheduler, waits for every node, connects to every server.
    let worker =
        Worker::join_with_config_file(&config_path, JoinOptions { requested_rank }).await?;
    let (rank, workers) = (worker.rank(), worker.num_workers());
    println!(
        "worker {rank} of {workers} joined ({} servers, job seed {})",
        worker.num_servers(),
        worker.job_seed()
    );

    // Declare: a collective; every worker declares the same name and length.
    let weights = worker
        .declare("toy.weights", LEN as u64, ParamMap::new())
        .await?;

    // Initial parameters: rank 0's values win.
    let init: Vec<f32> = (0..LEN).map(|i| (i as f32 * 0.01).sin()).collect();
    let mut params = worker.broadcast(&weights, init, 0).await?;

    // SGD steps: gradient of 0.5 * (w - target)^2, averaged over the workers.
    let target = (rank + 1) as f32;
    let grad_tensor = worker
        .declare("toy.grad", LEN as u64, ParamMap::new())
        .await?;
    for step in 0..STEPS {
        let grad: Vec<f32> = params.iter().map(|w| w - target).collect();
        let avg = worker
            .push_pull(&grad_tensor, grad, Reduce::Average)
            .await?;
        for (w, g) in params.iter_mut().zip(&avg) {
            *w -= LEARNING_RATE * g;
        }
        println!("worker {rank}: step {step}: w[0] = {:.6}", params[0]);
    }

    // Everyone holds the same parameters: check that with one more broadcast.
    let reference = worker.broadcast(&weights, params.clone(), 0).await?;
    assert_eq!(reference, params, "replicas diverged");

    worker.barrier().await?;
    println!("worker {rank}: {}", worker.metrics());
    worker.finish().await
}
