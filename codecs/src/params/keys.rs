//! The table of parameter keys: every key a tensor's map may hold, its other spellings, what it
//! applies to, its values and default. The crate docs' table and the error for an unknown key
//! are both made from it.

/// One parameter key: its short name, the other spellings accepted, and what it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyInfo {
    /// The short name (the RFC's table, or this project's).
    pub name: &'static str,
    /// Other accepted spellings (the BytePS keys).
    pub aliases: &'static [&'static str],
    /// Which compressors or decorators use it.
    pub applies_to: &'static str,
    /// The values it accepts.
    pub values: &'static str,
    /// The default when absent.
    pub default: &'static str,
}

/// Every key the registry accepts.
pub const KEYS: &[KeyInfo] = &[
    KeyInfo {
        name: "compressor",
        aliases: &["byteps_compressor_type"],
        applies_to: "all",
        values: "none, fp16, bf16, onebit, topk, randomk, dithering, minmax, moniqua",
        default: "none",
    },
    KeyInfo {
        name: "k",
        aliases: &["byteps_compressor_k"],
        applies_to: "topk, randomk, dithering",
        values: "topk/randomk: a fraction of the chunk in (0, 1) (topk: <= 0.5) or a whole count \
                 >= 1 per chunk (topk: <= len/2, randomk: <= len); dithering: the number of levels \
                 s, a whole number, 1..=32767 (linear) or 1..=32 (natural)",
        default: "required",
    },
    KeyInfo {
        name: "scaling",
        aliases: &["byteps_compressor_onebit_scaling"],
        applies_to: "onebit",
        values: "true, false",
        default: "false",
    },
    KeyInfo {
        name: "columns",
        aliases: &[],
        applies_to: "onebit",
        values: "a whole number >= 1 that divides the tensor's length: its column count, \
                 column-major (CNTK's layout: a column is len / columns contiguous elements); \
                 selects the column-wise variant (two levels per column, chunks cut at column \
                 boundaries), which requires `ef` (1-bit SGD's residual: vanilla, or none)",
        default: "absent (one scale for the chunk)",
    },
    KeyInfo {
        name: "unbiased",
        aliases: &[],
        applies_to: "randomk",
        values: "true, false (true scales the k values by n/k on workers)",
        default: "false",
    },
    KeyInfo {
        name: "partition",
        aliases: &["byteps_dithering_partition"],
        applies_to: "dithering",
        values: "linear or 0, natural or 1",
        default: "linear",
    },
    KeyInfo {
        name: "normalize",
        aliases: &["byteps_dithering_normalize"],
        applies_to: "dithering",
        values: "max or 0, l2 or 1",
        default: "max",
    },
    KeyInfo {
        name: "encoding",
        aliases: &[],
        applies_to: "dithering",
        values: "packed, elias",
        default: "packed",
    },
    KeyInfo {
        name: "bucket",
        aliases: &[],
        applies_to: "dithering, minmax",
        values: "a whole number >= 1 of elements per bucket (QSGD uses 512)",
        default: "the whole chunk",
    },
    KeyInfo {
        name: "bits",
        aliases: &[],
        applies_to: "minmax, moniqua",
        values: "a whole number 1..=8 (moniqua with stochastic rounding: 2..=8)",
        default: "8",
    },
    KeyInfo {
        name: "theta",
        aliases: &[],
        applies_to: "moniqua",
        values: "a finite number > 0: the a-priori bound on |x - reference|",
        default: "required",
    },
    KeyInfo {
        name: "rounding",
        aliases: &[],
        applies_to: "moniqua",
        values: "stochastic (delta = 2^-bits), nearest (delta = 2^-(bits+1))",
        default: "stochastic",
    },
    KeyInfo {
        name: "theta_schedule",
        aliases: &[],
        applies_to: "moniqua",
        values: "fixed (theta in every round), lr (theta times the round's learning rate, \
                 which must be set every round), bound (theta times the paper's Theorem 2 bound \
                 2·lr·G·ln(16n)/(1 − ρ), G the largest |gradient| the worker has been told of \
                 for the tensor, Worker::track_gradient; each message carries its B_theta)",
        default: "fixed",
    },
    KeyInfo {
        name: "hash",
        aliases: &[],
        applies_to: "moniqua",
        values: "true (each message carries a hash of its un-modded values, 8 bytes; a receiver \
                 whose recovery differs, its model more than theta from the sender's, fails \
                 the round naming the sender), false",
        default: "false",
    },
    KeyInfo {
        name: "ef",
        aliases: &["byteps_error_feedback_type", "byteps_ef_type"],
        applies_to: "all (decorator)",
        values:
            "none, vanilla, corrected (learning-rate corrected: needs RoundCtx::lr every round)",
        default: "none",
    },
    KeyInfo {
        name: "momentum",
        aliases: &["byteps_momentum_type"],
        applies_to: "all (decorator, workers only)",
        values: "none, nesterov",
        default: "none",
    },
    KeyInfo {
        name: "mu",
        aliases: &["byteps_momentum_mu"],
        applies_to: "momentum=nesterov",
        values: "a number in [0, 1)",
        default: "0.9",
    },
    KeyInfo {
        name: "intra_compressor",
        aliases: &[],
        applies_to: "all (local groups: cluster.local_size > 1)",
        values: "none, fp16, bf16: what each member's gradient is rounded to (and back to fp32) \
                 before the host's sum in local-rank order",
        default: "none",
    },
    KeyInfo {
        name: "exchange",
        aliases: &[],
        applies_to: "none, fp16, bf16, minmax, moniqua (gossip); all (push_pull)",
        values: "push_pull (summed through the servers) or gossip (model parameters averaged \
                 with the neighbours of the cluster's [gossip] mixing matrix, relayed by the \
                 servers; no ef or momentum)",
        default: "push_pull",
    },
    KeyInfo {
        name: "seed",
        aliases: &["byteps_seed"],
        applies_to: "all",
        values: "an unsigned 64-bit integer; replaces the job seed for this tensor's random draws",
        default: "the job seed",
    },
];

/// Overlays `top` on `base`, as a declared map overlays the cluster file's defaults: each key of
/// `top` replaces the value of its setting in `base` whatever the spelling there (so a declared
/// `byteps_compressor_type = "onebit"` replaces a default `compressor = "none"` instead of
/// conflicting with it). Keys that are not in [`KEYS`] are copied as they are (parsing names
/// them later).
pub fn overlay_params(
    base: &mut std::collections::BTreeMap<String, String>,
    top: &std::collections::BTreeMap<String, String>,
) {
    for (key, value) in top {
        if let Some(info) = KEYS
            .iter()
            .find(|k| k.name == key.as_str() || k.aliases.contains(&key.as_str()))
        {
            base.remove(info.name);
            for a in info.aliases {
                base.remove(*a);
            }
        }
        base.insert(key.clone(), value.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_replaces_every_spelling_of_a_setting() {
        let m = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let mut base = m(&[("compressor", "none"), ("ef", "vanilla"), ("odd", "1")]);
        overlay_params(
            &mut base,
            &m(&[("byteps_compressor_type", "onebit"), ("k", "0.1")]),
        );
        assert_eq!(
            base,
            m(&[
                ("byteps_compressor_type", "onebit"),
                ("ef", "vanilla"),
                ("k", "0.1"),
                ("odd", "1")
            ])
        );
    }
}
