//! `Compressor::undo`: a chain whose round `r` is undone continues exactly as a chain that
//! never ran round `r` (same payloads, same residual and momentum, bit for bit), and an undo
//! of any other round does nothing. This is what a discarded round (a non-finite sum, or an
//! optimizer step skipped by mixed precision's loss scaler) relies on.

mod common;

use common::*;
use pushpull_codecs::Compressor;

fn state(c: &Compressor) -> (Option<Vec<f32>>, Option<Vec<f32>>) {
    (
        c.residual().map(<[f32]>::to_vec),
        c.momentum().map(<[f32]>::to_vec),
    )
}

#[test]
fn an_undone_round_leaves_the_chain_as_if_it_never_ran() {
    let seed = seed("an_undone_round_leaves_the_chain_as_if_it_never_ran");
    let mut rng = TestRng::new(seed);
    for kv in decorated_chains(false) {
        let n = 1 + rng.below(300) as usize;
        let (Some(mut undone), Some(mut plain)) = (try_build(&kv, n), try_build(&kv, n)) else {
            continue;
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for round in 0..3u64 {
            let x = rng.gradient(n, 1.0);
            undone.compress(&x, &changing_lr(round), &mut a).unwrap();
            plain.compress(&x, &changing_lr(round), &mut b).unwrap();
        }
        // Round 3 runs on one chain only, then is undone.
        let x = rng.gradient(n, 1.0);
        undone.compress(&x, &changing_lr(3), &mut a).unwrap();
        let after = state(&undone);
        undone.undo(2); // not the last round: nothing
        assert_eq!(state(&undone), after, "seed {seed} {kv:?}: undo(2)");
        undone.undo(3);
        assert_eq!(state(&undone), state(&plain), "seed {seed} {kv:?}");
        undone.undo(3); // twice: nothing more
        assert_eq!(state(&undone), state(&plain), "seed {seed} {kv:?}");
        // Both continue with round 4, bit for bit.
        for round in 4..6u64 {
            let x = rng.gradient(n, 1.0);
            undone.compress(&x, &changing_lr(round), &mut a).unwrap();
            plain.compress(&x, &changing_lr(round), &mut b).unwrap();
            assert_eq!(a, b, "seed {seed} {kv:?} round {round}: payloads");
            assert_eq!(state(&undone), state(&plain), "seed {seed} {kv:?}");
        }
    }
}

#[test]
fn undo_after_a_failed_round_does_nothing() {
    let seed = seed("undo_after_a_failed_round_does_nothing");
    let mut rng = TestRng::new(seed);
    for kv in decorated_chains(false) {
        let n = 2 + rng.below(300) as usize;
        let Some(mut c) = try_build(&kv, n) else {
            continue;
        };
        let mut out = Vec::new();
        for round in 0..2u64 {
            c.compress(&rng.gradient(n, 1.0), &changing_lr(round), &mut out)
                .unwrap();
        }
        let kept = state(&c);
        let mut x = rng.gradient(n, 1.0);
        x[rng.below(n as u64) as usize] = f32::INFINITY;
        let e = c.compress(&x, &changing_lr(2), &mut out).unwrap_err();
        assert!(e.is_non_finite(), "{kv:?}: {e}");
        // Round 2 failed and changed nothing; round 1's change is no longer undoable.
        c.undo(2);
        c.undo(1);
        assert_eq!(state(&c), kept, "seed {seed} {kv:?}");
    }
}
