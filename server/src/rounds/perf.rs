//! A timing of the state machine, run by hand.

use super::*;

/// Time of one W=2 round of a 4 MB chunk through the state machine (run with
/// `--ignored --nocapture`; the numbers depend on the profile).
#[test]
#[ignore]
fn state_machine_round_time() {
    let len = 1_024_000;
    let mut k = KeyRounds::new(
        KeyInfo {
            tensor: "t".into(),
            chunk: 0,
            key: 1,
            len,
            num_workers: 2,
            local_size: 1,
            priority: 0,
        },
        fp32_codec(len),
    );
    let mut p = Vec::new();
    fp32_codec(len)
        .compress(&vec![1.5f32; len], &RoundCtx::new(0), &mut p)
        .unwrap();
    let p = Bytes::from(p);
    let n = 20;
    let start = std::time::Instant::now();
    for round in 0..n {
        assert!(k.push(1, round, ReduceOp::Sum, 0, p.clone()).is_empty());
        assert_eq!(k.push(0, round, ReduceOp::Sum, 0, p.clone()).len(), 1);
    }
    println!(
        "{:.2} ms per round",
        start.elapsed().as_secs_f64() * 1e3 / n as f64
    );
}
