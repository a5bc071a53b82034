//! `powersgd`: PowerSGD's low-rank compression, as torch's `powerSGD_hook` does it, through
//! the servers.
//!
//! Unlike every other compressor it is not a per-chunk codec: a step of a tensor is three
//! dependent sums of whole matrices. The tensor is read as the matrix `M` of `rows` rows
//! (`rows` is its first dimension, torch's `tensor.view(shape[0], -1)`: row `i` is the
//! `cols = len / rows` contiguous elements `i·cols ..`). Where PowerSGD shrinks it by more than
//! `min_compression_rate` (`rows·cols > rate·(rows + cols)·rank`, torch's `_should_compress`),
//! a step is ([`PowerSgd`], the worker's state machine, written once for workers and the
//! single-process reference):
//!
//! 1. `M = gradient + error` (the error of the previous step; `use_error_feedback`);
//! 2. `Q` is the previous step's averaged `Q`, orthogonalised (`warm_start`), or a random
//!    matrix drawn from [`crate::rng::Stream::low_rank`], the same on every worker,
//!    orthogonalised; `P = M·Q` (`rows × rank`), **summed** over the workers;
//! 3. `P̂ = orthogonalise(ΣP)`; `Q = Mᵀ·P̂` (`cols × rank`), **summed**, then divided by the
//!    number of workers (an IEEE division per element);
//! 4. the result is `P̂·Qᵀ` (the average; for a sum, `P̂·(ΣQ)ᵀ`), and the new error is `M`
//!    minus the averaged approximation.
//!
//! Steps before `start_iter`, vectors (`rows` or `cols` is 1), matrices below the rate and
//! tensors under `cluster.min_compress_bytes` are plain float32 sums, as torch's hook leaves
//! them to an uncompressed all-reduce. (torch's hook also carries an error for those: the
//! local input minus the average, whose sum over the workers is zero, so the average it
//! produces is unchanged up to rounding; pushpull keeps none.) The servers only ever sum
//! float32: a tensor's own chunks are built as `none` codecs, and its P and Q travel as two
//! more tensors of `compressor = none` that the worker declares beside it. Orthogonalisation
//! is Gram-Schmidt for every rank (torch switches to a QR factorisation above rank 2: the
//! same matrix up to rounding and the signs of its columns), with sums in f64; a column of
//! zeros stays zero where torch's would become NaN (`orthogonalization_epsilon = 0`).
//!
//! A tensor may also hold a bucket of gradients one after another (`pieces` in place of
//! `rows`: each gradient's `ROWSxCOLS` or `N`), as torch's hook sees a DDP bucket: a step then
//! runs the steps above for every matrix of the bucket at once ([`Layout`]), with one round of
//! all their `P`s (the bucket's uncompressed parts ride in it, summed as they are) and one of
//! all their `Q`s, where one tensor per matrix would take two rounds each. Each matrix's rank
//! is then `min(rank, rows, cols)`, as torch's hook takes it, and the random starting `Q`s
//! are one draw of the stream, the matrices' in order.
//!
//! Error feedback is the method's own (torch's `use_error_feedback`), so the chain's `ef` and
//! `momentum` are refused on a `powersgd` map, as are `intra_compressor` (P and Q are summed in
//! float32) and `exchange = gossip`.

mod plan;
mod products;
mod step;

use std::sync::Arc;

pub use plan::{Layout, Matrices, Part, Piece, Plan, Shape};
pub use step::{PowerSgd, PowerSgdState};

use super::cast::{Cast, CastCodec};
use crate::chain::Body;
use crate::codec::CodecInfo;
use crate::error::{KernelError, Result};
use crate::spec::{BuildOptions, CodecSpec, Entry, KeyInfo, Keys, Kind};
use pushpull_proto::placement::PayloadModel;

/// The registry's `powersgd`.
pub const ENTRY: Entry = Entry {
    name: "powersgd",
    keys: &[],
    own_keys: &[
        KeyInfo {
            name: "rows",
            aliases: &[],
            applies_to: "powersgd",
            values: "the tensor's first dimension (shape[0]), a divisor of its length: the \
                     matrix is rows × (len / rows), row-major (pushpull.torch fills it in)",
            default: "required",
        },
        KeyInfo {
            name: "pieces",
            aliases: &[],
            applies_to: "powersgd",
            values: "instead of rows, for a tensor holding a bucket of gradients one after \
                     another: each one's ROWSxCOLS (shape[0] × the rest) or N (a vector), \
                     comma-separated, adding up to the tensor's length; one P and one Q round \
                     a step for all of them (pushpull.torch fills it in for its buckets)",
            default: "rows instead",
        },
        KeyInfo {
            name: "rank",
            aliases: &["matrix_approximation_rank"],
            applies_to: "powersgd",
            values: "a whole number >= 1, at most min(rows, cols) of the matrix with rows; with \
                     pieces, each matrix's rank is min(rank, rows, cols), as torch's hook's",
            default: "1",
        },
        KeyInfo {
            name: "start_iter",
            aliases: &["start_powerSGD_iter"],
            applies_to: "powersgd",
            values: "a whole number >= 0: the steps summed uncompressed before PowerSGD starts",
            default: "1000",
        },
        KeyInfo {
            name: "min_compression_rate",
            aliases: &[],
            applies_to: "powersgd",
            values: "a finite number > 0: a matrix is compressed only where rows·cols > \
                     rate·(rows + cols)·rank",
            default: "2",
        },
        KeyInfo {
            name: "use_error_feedback",
            aliases: &[],
            applies_to: "powersgd",
            values: "true, false: keep the local input minus the global approximation and add \
                     it to the next step's gradient",
            default: "true",
        },
        KeyInfo {
            name: "warm_start",
            aliases: &[],
            applies_to: "powersgd",
            values: "true (Q starts from the previous step's), false (a new random Q each step)",
            default: "true",
        },
        KeyInfo {
            name: "orthogonalization_epsilon",
            aliases: &[],
            applies_to: "powersgd",
            values: "a finite number >= 0 added to each column's norm before dividing by it",
            default: "0",
        },
    ],
    parse,
};

/// PowerSGD's settings (torch's `PowerSGDState` names; see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct PowerSgdSpec {
    /// The matrix (`rows`) or the matrices (`pieces`) the tensor holds.
    pub matrices: Matrices,
    /// The rank of the approximation (torch's `matrix_approximation_rank`).
    pub rank: u32,
    /// Steps summed uncompressed before compression starts (torch's `start_powerSGD_iter`).
    pub start_iter: u64,
    /// A matrix is compressed only where it shrinks by more than this.
    pub min_compression_rate: f64,
    /// Whether the local error is kept and added to the next step.
    pub use_error_feedback: bool,
    /// Whether Q starts from the previous step's.
    pub warm_start: bool,
    /// Added to a column's norm before the division.
    pub orthogonalization_epsilon: f32,
}

fn parse(keys: &Keys<'_>) -> Result<Arc<dyn CodecSpec>> {
    for (short, why) in [
        (
            "ef",
            "powersgd keeps its own error feedback (the local input minus the global \
             approximation, torch's use_error_feedback); a second one would feed the error \
             back twice",
        ),
        (
            "momentum",
            "powersgd leaves momentum to the training's optimizer, as torch's hook does",
        ),
        (
            "intra_compressor",
            "powersgd's P and Q are summed in float32",
        ),
        (
            "exchange",
            "powersgd sums through the servers (exchange = push_pull)",
        ),
    ] {
        if let Some((k, v)) = keys.get(short) {
            if v != "none" && v != "push_pull" {
                return Err(KernelError::NotApplicable {
                    key: k.to_string(),
                    value: v.to_string(),
                    why: why.to_string(),
                });
            }
        }
    }
    let matrices = match (keys.get("rows"), keys.get("pieces")) {
        (Some((k, _)), Some((k2, v2))) => {
            return Err(KernelError::bad(
                k2,
                v2,
                format!(
                    "{k} is given too: {k} says the tensor is one matrix, {k2} that it is a \
                     bucket of them; give one"
                ),
            ))
        }
        (None, Some((k, v))) => Matrices::parse_pieces(k, v)?,
        _ => {
            let rows = keys.require(
                "rows",
                "rows: the tensor's first dimension, shape[0] (or pieces, the shapes of a \
                 bucket's gradients; pushpull.torch fills them in)",
            )?;
            match rows.1.parse::<u64>() {
                Ok(r) if r >= 1 => Matrices::Rows(r),
                _ => {
                    return Err(KernelError::bad(
                        rows.0,
                        rows.1,
                        "expected the tensor's first dimension, a whole number >= 1",
                    ))
                }
            }
        }
    };
    let rank = keys
        .whole("rank", 1, u32::MAX as u64, "the approximation's rank")?
        .unwrap_or(1) as u32;
    let start_iter = keys
        .whole("start_iter", 0, u64::MAX, "a step count")?
        .unwrap_or(1000);
    let min_compression_rate = match keys.get("min_compression_rate") {
        None => 2.0,
        Some((k, v)) => match v.parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => x,
            _ => return Err(KernelError::bad(k, v, "expected a finite number > 0")),
        },
    };
    let orthogonalization_epsilon = match keys.get("orthogonalization_epsilon") {
        None => 0.0,
        Some((k, v)) => match v.parse::<f32>() {
            Ok(x) if x.is_finite() && x >= 0.0 => x,
            _ => return Err(KernelError::bad(k, v, "expected a finite number >= 0")),
        },
    };
    Ok(Arc::new(PowerSgdSpec {
        matrices,
        rank,
        start_iter,
        min_compression_rate,
        use_error_feedback: keys.flag("use_error_feedback", true)?,
        warm_start: keys.flag("warm_start", true)?,
        orthogonalization_epsilon,
    }))
}

impl PowerSgdSpec {
    /// The key and value that say what the tensor holds: `rows` or `pieces`.
    fn matrices_param(&self) -> (&'static str, String) {
        let key = match self.matrices {
            Matrices::Rows(_) => "rows",
            Matrices::Pieces(_) => "pieces",
        };
        (key, self.matrices.value())
    }
}

impl CodecSpec for PowerSgdSpec {
    fn kind(&self) -> Kind {
        Kind::new("powersgd", false, true)
    }
    fn display_name(&self) -> String {
        let (key, value) = self.matrices_param();
        format!(
            "powersgd(rank={}, {key}={value}, start_iter={})",
            self.rank, self.start_iter
        )
    }
    fn params(&self, put: &mut dyn FnMut(&'static str, String)) {
        let (key, value) = self.matrices_param();
        put(key, value);
        put("rank", self.rank.to_string());
        put("start_iter", self.start_iter.to_string());
        put(
            "min_compression_rate",
            self.min_compression_rate.to_string(),
        );
        put("use_error_feedback", self.use_error_feedback.to_string());
        put("warm_start", self.warm_start.to_string());
        put(
            "orthogonalization_epsilon",
            self.orthogonalization_epsilon.to_string(),
        );
    }
    /// A chunk of the tensor itself is summed as float32 (the steps before `start_iter`, and
    /// every step of a tensor PowerSGD leaves uncompressed).
    fn build(&self, base: CodecInfo, _: &BuildOptions) -> Result<Body> {
        Ok(Body::Plain(Box::new(CastCodec::new(base, Cast::None))))
    }
    fn payload(&self, _: u64) -> PayloadModel {
        PayloadModel {
            per_element: 4,
            ..PayloadModel::default()
        }
    }
}
