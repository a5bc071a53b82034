//! The single-process reference of two-level jobs (`cluster.local_size` > 1), against sums
//! written out by hand: the host sums in local-rank order, then the hosts in host order.

mod common;

use common::{data, same_bits, seed};
use pushpull_proto::{Config, ParamMap};
use pushpull_worker::reference::Reference;
use pushpull_worker::Reduce;

const LEN: usize = 70_001;

fn config(workers: u32, local_size: u32, map: &[(&str, &str)]) -> Config {
    let mut c = Config::local(workers, 2);
    c.cluster.local_size = local_size;
    c.cluster.min_compress_bytes = 0;
    let t = c.tensors.tables.entry("default".into()).or_default();
    for (k, v) in map {
        t.insert(k.to_string(), toml::Value::String(v.to_string()));
    }
    c.validate("test").unwrap();
    c
}

fn inputs(seed: u64, workers: usize) -> Vec<Vec<f32>> {
    (0..workers)
        .map(|r| data(seed ^ ((r as u64 + 1) * 0x1234_5678_9abc), LEN))
        .collect()
}

fn run(c: &Config, job_seed: u64, inputs: &[Vec<f32>], reduce: Reduce) -> Vec<Vec<f32>> {
    let mut r = Reference::new(c, job_seed);
    let t = r.declare("w", LEN as u64, ParamMap::new()).unwrap();
    r.push_pull(t, inputs, reduce).unwrap()
}

#[test]
fn two_hosts_of_two_sum_each_host_then_the_hosts() {
    let s = seed();
    let x = inputs(s, 4);
    let out = run(&config(4, 2, &[]), s, &x, Reduce::Average);
    let want: Vec<f32> = (0..LEN)
        .map(|i| ((x[0][i] + x[1][i]) + (x[2][i] + x[3][i])) / 4.0)
        .collect();
    for (r, o) in out.iter().enumerate() {
        assert!(same_bits(o, &want), "rank {r}");
    }
    // Not the flat job's order, which the reference would give with local_size 1.
    let flat = run(&config(4, 1, &[]), s, &x, Reduce::Average);
    assert!(!same_bits(&flat[0], &want), "the orders differ somewhere");
}

#[test]
fn one_host_without_servers_is_the_host_sum_after_the_intra_codec() {
    let s = seed();
    let x = inputs(s, 3);
    let fp16 = |v: f32| half::f16::from_f32(v.clamp(-65504.0, 65504.0)).to_f32();
    for (intra, d) in [
        ("none", (|v| v) as fn(f32) -> f32),
        ("fp16", fp16 as fn(f32) -> f32),
    ] {
        // onebit would change the bits if a chain ran: with one host none does.
        let c = config(
            3,
            3,
            &[("compressor", "onebit"), ("intra_compressor", intra)],
        );
        let out = run(&c, s, &x, Reduce::Sum);
        let want: Vec<f32> = (0..LEN)
            .map(|i| (d(x[0][i]) + d(x[1][i])) + d(x[2][i]))
            .collect();
        for (r, o) in out.iter().enumerate() {
            assert!(same_bits(o, &want), "{intra}: rank {r}");
        }
    }
}

#[test]
fn a_host_is_rank_h_of_a_flat_job_fed_the_host_sums() {
    // Forced through the servers, one host of three is worker 0 of a one-worker job whose
    // input is the host sum: the same chain (onebit with error feedback), the same bits, round
    // after round.
    let s = seed();
    let map = [("compressor", "onebit"), ("ef", "vanilla")];
    let mut two_level = config(3, 3, &map);
    two_level.cluster.force_distributed = true;
    let flat = config(1, 1, &map);
    let mut a = Reference::new(&two_level, s);
    let mut b = Reference::new(&flat, s);
    let ta = a.declare("w", LEN as u64, ParamMap::new()).unwrap();
    let tb = b.declare("w", LEN as u64, ParamMap::new()).unwrap();
    for round in 0..3 {
        let x = inputs(s.wrapping_add(round), 3);
        let host: Vec<f32> = (0..LEN).map(|i| (x[0][i] + x[1][i]) + x[2][i]).collect();
        let got = a.push_pull(ta, &x, Reduce::Sum).unwrap();
        let want = b
            .push_pull(tb, std::slice::from_ref(&host), Reduce::Sum)
            .unwrap();
        assert!(!same_bits(&want[0], &host), "onebit changed the sum");
        for (r, o) in got.iter().enumerate() {
            assert!(same_bits(o, &want[0]), "round {round} rank {r}");
        }
    }
}
