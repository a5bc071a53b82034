//! `Compressor::state` and `Compressor::set_state`: a chain restored from another's state
//! continues exactly as that chain does (same payloads, same residual and momentum, bit for
//! bit), which a checkpoint and restart relies on; and a state of another shape is refused,
//! naming the chain and what differs, with nothing changed.

mod common;

use common::*;
use pushpull_codecs::ChainState;

#[test]
fn a_restored_chain_continues_bit_for_bit() {
    let seed = seed("a_restored_chain_continues_bit_for_bit");
    let mut rng = TestRng::new(seed);
    for kv in decorated_chains(true) {
        let n = 1 + rng.below(300) as usize;
        let (Some(mut run), Some(mut fresh)) = (try_build(&kv, n), try_build(&kv, n)) else {
            continue;
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for round in 0..3u64 {
            run.compress(&rng.gradient(n, 1.0), &changing_lr(round), &mut a)
                .unwrap();
        }
        let saved = run.state();
        assert_eq!(saved.residual.is_some(), run.residual().is_some(), "{kv:?}");
        fresh.set_state(&saved).unwrap();
        assert_eq!(fresh.state(), saved, "seed {seed} {kv:?}");
        for round in 3..6u64 {
            let x = rng.gradient(n, 1.0);
            run.compress(&x, &changing_lr(round), &mut a).unwrap();
            fresh.compress(&x, &changing_lr(round), &mut b).unwrap();
            assert_eq!(a, b, "seed {seed} {kv:?} round {round}: payloads");
            assert_eq!(run.state(), fresh.state(), "seed {seed} {kv:?}");
        }
    }
}

#[test]
fn a_state_of_another_shape_is_refused_and_changes_nothing() {
    let n = 40;
    let ef = [("compressor", "onebit"), ("ef", "vanilla")];
    let both = [
        ("compressor", "topk"),
        ("k", "0.1"),
        ("ef", "vanilla"),
        ("momentum", "nesterov"),
    ];
    let plain = [("compressor", "onebit")];
    let mut c = try_build(&both, n).unwrap();
    let mut out = Vec::new();
    c.compress(&vec![0.5; n], &changing_lr(0), &mut out)
        .unwrap();
    let kept = c.state();
    let cases: Vec<(ChainState, &str)> = vec![
        (ChainState::default(), "no momentum buffer"),
        (
            ChainState {
                momentum: Some(vec![0.0; n]),
                ..ChainState::default()
            },
            "no error-feedback residual",
        ),
        (
            ChainState {
                momentum: Some(vec![0.0; n - 1]),
                residual: Some(vec![0.0; n]),
                prev_lr: None,
            },
            "saved momentum",
        ),
        (
            ChainState {
                momentum: Some(vec![0.0; n]),
                residual: Some(vec![0.0; n + 1]),
                prev_lr: None,
            },
            "saved residual",
        ),
        (
            ChainState {
                momentum: Some(vec![0.0; n]),
                residual: Some(vec![0.0; n]),
                prev_lr: Some(0.1),
            },
            "previous learning rate",
        ),
    ];
    for (state, want) in cases {
        let e = c.set_state(&state).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("topk"), "{want}: {e}");
        assert_eq!(c.state(), kept, "{want}");
    }
    let mut p = try_build(&plain, n).unwrap();
    let e = p.set_state(&kept).unwrap_err().to_string();
    assert!(e.contains("onebit") && e.contains("residual"), "{e}");
    let mut e1 = try_build(&ef, n).unwrap();
    let e = e1.set_state(&kept).unwrap_err().to_string();
    assert!(e.contains("momentum"), "{e}");
}
