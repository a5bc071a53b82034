//! The convergence check of the compressor tests: a compressed run must bring the training
//! loss below a threshold derived from an uncompressed run on the same task, same seed.
//!
//! The threshold keeps most of the reference's progress: with `initial` the loss at the start
//! (≈ ln(classes)) and `reference` the uncompressed run's final loss,
//! `threshold = reference + SLACK · (initial − reference)`. A run whose gradients are lost
//! (zeros come back, or garbage that cancels out) stays near `initial` and fails; a compressed
//! run that learns nearly as well passes. The reference itself must have learned (its loss
//! at most `MIN_PROGRESS` of the initial loss), or the check would prove nothing.

/// Fraction of the reference's loss reduction a run may give up.
pub const SLACK: f64 = 0.3;

/// The reference's final loss must be below `MIN_PROGRESS · initial`.
pub const MIN_PROGRESS: f64 = 0.8;

/// The threshold a run's final loss must get below.
///
/// # Errors
/// When the inputs are not finite and positive, or the reference did not learn.
pub fn loss_threshold(initial: f64, reference: f64) -> Result<f64, String> {
    if !(initial.is_finite() && reference.is_finite() && initial > 0.0 && reference >= 0.0) {
        return Err(format!(
            "losses must be finite: initial {initial}, reference {reference}"
        ));
    }
    if reference > MIN_PROGRESS * initial {
        return Err(format!(
            "the uncompressed reference did not learn: final loss {reference:.4} is above \
             {MIN_PROGRESS} x the initial loss {initial:.4}"
        ));
    }
    Ok(reference + SLACK * (initial - reference))
}

/// Checks one run's final loss against the reference: Ok, or an error naming the run, its
/// loss, the threshold and the reference.
pub fn check_converged(
    run: &str,
    final_loss: f64,
    initial: f64,
    reference: f64,
) -> Result<(), String> {
    let threshold = loss_threshold(initial, reference)?;
    if final_loss.is_finite() && final_loss < threshold {
        Ok(())
    } else {
        Err(format!(
            "{run}: final loss {final_loss:.4} is not below {threshold:.4} (uncompressed \
             reference {reference:.4}, initial {initial:.4}, slack {SLACK})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learning_runs_pass_and_stalled_or_broken_runs_fail() {
        let initial = (10f64).ln();
        let reference = 0.9;
        assert!(check_converged("onebit", 1.0, initial, reference).is_ok());
        assert!(check_converged("same", reference, initial, reference).is_ok());
        // Gradients replaced by zeros: the loss stays at its initial value.
        let e = check_converged("zeros", initial, initial, reference).unwrap_err();
        assert!(e.contains("zeros") && e.contains("not below"), "{e}");
        assert!(check_converged("nan", f64::NAN, initial, reference).is_err());
        // A reference that did not learn makes every check fail loudly.
        let e = check_converged("x", 0.1, initial, initial * 0.95).unwrap_err();
        assert!(e.contains("did not learn"), "{e}");
    }
}
