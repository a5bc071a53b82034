//! The chain's keys and those several compressors share: their spellings, what they apply to,
//! their values and default. Each compressor's own keys are in its registry entry;
//! [`crate::registry::all_keys`] lists every key, which the error for an unknown key names.

use crate::spec::KeyInfo;

/// The chain's keys and the keys several compressors share.
pub const KEYS: &[KeyInfo] = &[
    KeyInfo {
        name: "compressor",
        aliases: &["byteps_compressor_type"],
        applies_to: "all",
        values: "the name of a compressor of the registry (pushpull_codecs::COMPRESSORS)",
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
        values: "push_pull (summed through the servers), gossip (model parameters averaged \
                 with the neighbours of the cluster's [gossip] mixing matrix, relayed by the \
                 servers; no ef or momentum: x_i + sum_j W_ij (x^_j - x^_i)), or gossip_direct \
                 (the same messages averaged as Moniqua's equation 4, the naive scheme: \
                 W_ii x_i + sum_j W_ij x^_j)",
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
