//! A data-parallel candle training loop on pushpull: copy this into your own program.
//!
//! Every worker trains the same two-layer MLP on its own shard of a synthetic dataset. Each
//! step it computes the gradients with candle, push_pulls every gradient tensor with
//! `Reduce::Average` (compressed as the tensor's parameter map says: here onebit with error
//! feedback for the big weight matrix; tensors below `cluster.min_compress_bytes`, like the
//! biases, travel uncompressed), and applies SGD with momentum to the averaged gradient.
//! Every worker starts from rank 0's weights (a broadcast), so all replicas stay identical.
//!
//! # Running it
//! Without arguments it starts a whole cluster inside this process (a scheduler and a server
//! as tokio tasks, two workers as threads, throw-away certificates) and trains:
//!
//! ```text
//! cargo run --release -p pushpull-worker --example train_candle
//! ```
//!
//! With a cluster file it joins an existing cluster as one worker (start the scheduler and
//! servers with `pushpull-scheduler`/`pushpull-server`, see `examples/basic.rs` for the file):
//!
//! ```text
//! cargo run --release -p pushpull-worker --example train_candle -- my.toml [RANK]
//! ```
//!
//! What to keep when you copy it: declare every gradient in the same order with the same names
//! on every worker; call `set_learning_rate` before each step's push_pulls (used by
//! `ef = "corrected"`); with `momentum = "nesterov"` in a tensor's map, set your optimizer's
//! momentum to 0 for it (the compressor applies momentum before compressing).

use candle_core::{DType, Device, Tensor, Var};
use pushpull_worker::{BlockingWorker, Config, JoinOptions, ParamMap, Reduce, WorkerError};

const IN: usize = 32;
const HIDDEN: usize = 512;
const CLASSES: usize = 4;
const SAMPLES_PER_WORKER: usize = 2048;
const BATCH: usize = 64;
const STEPS: usize = 200;
const LR: f32 = 0.05;
const MOMENTUM: f32 = 0.9;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A tiny deterministic generator (so the example needs no `rand`).
fn lcg(state: &mut u64) -> f32 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// This worker's shard: uniform inputs, labels from a fixed random linear teacher followed by
/// |.| (so the classes are not linearly separable).
fn shard(rank: u32) -> (Vec<f32>, Vec<u32>) {
    let mut teacher_rng = 7u64;
    let teacher: Vec<f32> = (0..IN * CLASSES).map(|_| lcg(&mut teacher_rng)).collect();
    let mut rng = 1000 + rank as u64;
    let x: Vec<f32> = (0..SAMPLES_PER_WORKER * IN)
        .map(|_| lcg(&mut rng))
        .collect();
    let y = x
        .chunks(IN)
        .map(|row| {
            let score = |c: usize| -> f32 {
                let z: f32 = row.iter().zip(&teacher[c * IN..]).map(|(a, b)| a * b).sum();
                z.abs()
            };
            (0..CLASSES)
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                .unwrap() as u32
        })
        .collect();
    (x, y)
}

fn train(worker: &BlockingWorker) -> Result<(), Error> {
    let dev = Device::Cpu;
    let rank = worker.rank();
    // The model: fc1 (IN -> HIDDEN, ReLU), fc2 (HIDDEN -> CLASSES).
    let mut seed = 42u64;
    let mut init = |n: usize, fan_in: usize| -> Vec<f32> {
        let s = (3.0 / fan_in as f32).sqrt();
        (0..n).map(|_| lcg(&mut seed) * s).collect()
    };
    let shapes = [
        ("fc1.weight", vec![HIDDEN, IN]),
        ("fc1.bias", vec![HIDDEN]),
        ("fc2.weight", vec![CLASSES, HIDDEN]),
        ("fc2.bias", vec![CLASSES]),
    ];
    let mut vars = Vec::new();
    let mut tensors = Vec::new();
    for (name, shape) in &shapes {
        let n: usize = shape.iter().product();
        // Every worker declares the same tensors in the same order. The map here overrides
        // the cluster file's [tensors] for this tensor.
        let mut params = ParamMap::new();
        if *name == "fc1.weight" {
            params.insert("compressor".into(), "onebit".into());
            params.insert("scaling".into(), "true".into());
            params.insert("ef".into(), "vanilla".into());
        }
        let t = worker.declare(name, n as u64, params)?;
        // Start from rank 0's weights.
        let mut w = if name.ends_with("weight") {
            init(n, shape[1])
        } else {
            vec![0.0; n]
        };
        worker.broadcast(&t, &mut w, 0)?;
        vars.push(Var::from_vec(w, shape.as_slice(), &dev)?);
        tensors.push(t);
    }
    let mut velocity: Vec<Vec<f32>> = vars.iter().map(|v| vec![0.0; v.elem_count()]).collect();

    let (x, y) = shard(rank);
    let x = Tensor::from_vec(x, (SAMPLES_PER_WORKER, IN), &dev)?;
    let y = Tensor::from_vec(y, SAMPLES_PER_WORKER, &dev)?;
    for step in 0..STEPS {
        let start = (step * BATCH) % (SAMPLES_PER_WORKER - BATCH);
        let (xb, yb) = (x.narrow(0, start, BATCH)?, y.narrow(0, start, BATCH)?);
        // Forward and backward with candle.
        let h = xb.matmul(&vars[0].t()?)?.broadcast_add(&vars[1])?.relu()?;
        let logits = h.matmul(&vars[2].t()?)?.broadcast_add(&vars[3])?;
        let loss = candle_nn::loss::cross_entropy(&logits, &yb)?;
        let grads = loss.backward()?;

        // Average the gradients over all workers, then SGD with momentum.
        worker.set_learning_rate(LR);
        for (i, var) in vars.iter().enumerate() {
            let g = grads.get(var).expect("every parameter has a gradient");
            let mut g = g.flatten_all()?.to_vec1::<f32>()?;
            worker.push_pull(&tensors[i], &mut g, Reduce::Average)?;
            let mut w = var.flatten_all()?.to_vec1::<f32>()?;
            for ((w, v), g) in w.iter_mut().zip(&mut velocity[i]).zip(&g) {
                *v = MOMENTUM * *v + g;
                *w -= LR * *v;
            }
            var.set(&Tensor::from_vec(w, var.shape(), &dev)?)?;
        }
        if step % 50 == 0 || step + 1 == STEPS {
            let acc = logits
                .argmax(1)?
                .eq(&yb)?
                .to_dtype(DType::F32)?
                .mean_all()?
                .to_scalar::<f32>()?;
            println!(
                "worker {rank}: step {step:3}: loss {:.4}, batch accuracy {acc:.3}",
                loss.to_scalar::<f32>()?
            );
        }
    }
    println!("worker {rank}: {}", worker.metrics());
    Ok(())
}

fn join_and_train(
    config: &Config,
    id: pushpull_worker::TlsIdentity,
    rank: Option<u32>,
) -> Result<(), Error> {
    let worker = BlockingWorker::join(
        config,
        id,
        JoinOptions {
            requested_rank: rank,
        },
    )?;
    train(&worker)?;
    worker.finish()?;
    Ok(())
}

/// A scheduler, one server and two workers in this process.
fn in_process() -> Result<(), Error> {
    let dir = tempfile::tempdir()?;
    let names = ["scheduler", "server0", "worker0", "worker1"].map(String::from);
    let tls = pushpull_net::certs::generate_cluster(dir.path(), "pushpull.cluster", &names)?;
    let ids = tls
        .iter()
        .map(pushpull_worker::TlsIdentity::load)
        .collect::<Result<Vec<_>, _>>()?;
    let mut config = Config::local(2, 1);
    let rt = tokio::runtime::Runtime::new()?;
    let scheduler = rt.block_on(pushpull_scheduler::Scheduler::bind(
        config.clone(),
        ids[0].clone(),
    ))?;
    config.cluster.scheduler = scheduler.local_addr().to_string();
    let scheduler = rt.spawn(scheduler.run());
    let server = rt.block_on(pushpull_server::Server::bind(
        config.clone(),
        ids[1].clone(),
    ))?;
    let server = rt.spawn(server.run());
    std::thread::scope(|s| -> Result<(), Error> {
        let handles: Vec<_> = (0..2u32)
            .map(|w| {
                let (config, id) = (&config, ids[2 + w as usize].clone());
                s.spawn(move || join_and_train(config, id, Some(w)))
            })
            .collect();
        for h in handles {
            h.join().expect("worker thread")?;
        }
        Ok(())
    })?;
    rt.block_on(scheduler)??;
    rt.block_on(server)??;
    Ok(())
}

/// Joins the cluster of the file at `path` as one worker (optionally asking for `rank`).
fn from_file(path: &str, rank: Option<String>) -> Result<(), Error> {
    let rank = rank.map(|r| r.parse::<u32>()).transpose()?;
    let config = Config::from_file(path)?;
    let id = pushpull_worker::TlsIdentity::load(&config.tls)
        .map_err(|e| WorkerError::Config(e.to_string()))?;
    join_and_train(&config, id, rank)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let result = match args.next() {
        None => in_process(),
        Some(path) => from_file(&path, args.next()),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
