//! Which parts of a tensor PowerSGD compresses ([`PowerSgdSpec::plan`], torch's
//! `_should_compress`), and how a low-rank step lays them out ([`Layout`]).

use std::sync::Arc;

use super::PowerSgdSpec;
use crate::error::{KernelError, Result};

/// What the map says the tensor holds: one matrix, or a bucket of gradients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matrices {
    /// One matrix of `rows` rows (`rows`: the tensor's first dimension).
    Rows(u64),
    /// Gradients one after another (`pieces`), each a matrix `rows × cols` (a vector is
    /// `n × 1`), as torch's hook sees the gradients of a bucket.
    Pieces(Arc<[Piece]>),
}

/// One gradient of a bucket: `rows × cols` elements, row-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Its first dimension.
    pub rows: u64,
    /// Its other elements per row (1 for a vector).
    pub cols: u64,
}

impl Matrices {
    /// `pieces`' value: `RxC` (a matrix) or `N` (a vector), comma-separated.
    pub(super) fn parse_pieces(key: &str, value: &str) -> Result<Matrices> {
        let bad = |why: String| Err(KernelError::bad(key, value, why));
        let mut pieces = Vec::new();
        for (i, item) in value.split(',').enumerate() {
            let item = item.trim();
            let number = |s: &str| s.trim().parse::<u64>().ok();
            let piece = match item.split_once(['x', 'X']) {
                Some((r, c)) => number(r)
                    .zip(number(c))
                    .map(|(rows, cols)| Piece { rows, cols }),
                None => number(item).map(|n| Piece { rows: n, cols: 1 }),
            };
            match piece {
                Some(p) if p.rows.checked_mul(p.cols).is_some() => pieces.push(p),
                _ => {
                    return bad(format!(
                        "piece {i} is {item:?}: expected ROWSxCOLS (a gradient viewed as \
                         shape[0] × the rest) or N (a vector), comma-separated"
                    ))
                }
            }
        }
        Ok(Matrices::Pieces(pieces.into()))
    }

    /// The map's value of `rows` or `pieces`.
    pub(super) fn value(&self) -> String {
        match self {
            Matrices::Rows(r) => r.to_string(),
            Matrices::Pieces(pieces) => pieces
                .iter()
                .map(|p| match p.cols {
                    1 => p.rows.to_string(),
                    c => format!("{}x{c}", p.rows),
                })
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

/// A matrix PowerSGD compresses: `rows × cols`, approximated at `rank`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Rows of `M` (and of `P`).
    pub rows: usize,
    /// Columns of `M` (rows of `Q`).
    pub cols: usize,
    /// Columns of `P` and `Q`.
    pub rank: usize,
}

impl Shape {
    /// Elements of `P`.
    pub fn p_len(&self) -> usize {
        self.rows * self.rank
    }
    /// Elements of `Q`.
    pub fn q_len(&self) -> usize {
        self.cols * self.rank
    }
}

/// One part of a low-rank step's tensor, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// A matrix PowerSGD compresses.
    Matrix(Shape),
    /// Elements summed as they are: a vector, or a matrix PowerSGD would not shrink. They
    /// travel in `P`'s round, after the `P`s of the matrices before them.
    Plain(usize),
}

impl Part {
    /// Its elements in the tensor.
    pub fn tensor_len(&self) -> usize {
        match *self {
            Part::Matrix(s) => s.rows * s.cols,
            Part::Plain(n) => n,
        }
    }
    /// Its elements in `P`'s round.
    pub fn p_len(&self) -> usize {
        match *self {
            Part::Matrix(s) => s.p_len(),
            Part::Plain(n) => n,
        }
    }
    /// Its elements in `Q`'s round.
    pub fn q_len(&self) -> usize {
        match *self {
            Part::Matrix(s) => s.q_len(),
            Part::Plain(_) => 0,
        }
    }
}

/// The parts of a tensor a low-rank step runs on, at least one of them a matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    parts: Vec<Part>,
}

impl Layout {
    /// A tensor that is one matrix.
    pub fn matrix(shape: Shape) -> Layout {
        Layout {
            parts: vec![Part::Matrix(shape)],
        }
    }
    /// Its parts, in order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }
    /// The tensor's elements.
    pub fn len(&self) -> usize {
        self.parts.iter().map(Part::tensor_len).sum()
    }
    /// Whether the tensor is empty (never: a layout holds a matrix).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Elements of `P`'s round: the matrices' `P`s and the plain parts.
    pub fn p_len(&self) -> usize {
        self.parts.iter().map(Part::p_len).sum()
    }
    /// Elements of `Q`'s round: the matrices' `Q`s.
    pub fn q_len(&self) -> usize {
        self.parts.iter().map(Part::q_len).sum()
    }
}

/// How a tensor's steps run under a [`PowerSgdSpec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Every step is a plain float32 sum: no part is a matrix PowerSGD would shrink by
    /// `min_compression_rate`.
    Plain,
    /// Steps from `start_iter` on are low-rank.
    LowRank(Layout),
}

impl PowerSgdSpec {
    /// How a tensor of `len` elements runs: refused, naming the key, where `rows` does not
    /// divide `len`, the pieces do not add up to it, or (`rows`) the matrix's largest rank
    /// is below `rank`. In pieces, each matrix's rank is `min(rank, rows, cols)`, as torch's
    /// hook takes it.
    pub fn plan(&self, len: u64) -> Result<Plan> {
        let parts = match &self.matrices {
            Matrices::Rows(rows) => vec![self.one_matrix(*rows, len)?],
            Matrices::Pieces(pieces) => {
                let total: u128 = pieces.iter().map(|p| u128::from(p.rows * p.cols)).sum();
                if total != u128::from(len) {
                    return Err(KernelError::bad(
                        "pieces",
                        &self.matrices.value(),
                        format!(
                            "the pieces hold {total} elements, the tensor {len}: expected the \
                             shapes of the gradients the tensor holds, in order"
                        ),
                    ));
                }
                pieces
                    .iter()
                    .map(|p| {
                        let rank = u64::from(self.rank).min(p.rows).min(p.cols);
                        self.part(p.rows, p.cols, rank)
                    })
                    .collect()
            }
        };
        if parts.iter().any(|p| matches!(p, Part::Matrix(_))) {
            Ok(Plan::LowRank(Layout { parts }))
        } else {
            Ok(Plan::Plain)
        }
    }

    /// The part of a tensor of `len` elements that is one matrix of `rows` rows.
    fn one_matrix(&self, rows: u64, len: u64) -> Result<Part> {
        if len == 0 {
            return Ok(Part::Plain(0));
        }
        if rows > len || len % rows != 0 {
            return Err(KernelError::bad(
                "rows",
                &rows.to_string(),
                format!(
                    "expected the tensor's first dimension, a divisor of its length {len} \
                     (the matrix is rows × len/rows)"
                ),
            ));
        }
        let cols = len / rows;
        let rank = u64::from(self.rank);
        let largest = rows.min(cols);
        if rows > 1 && cols > 1 && rank > largest {
            return Err(KernelError::bad(
                "rank",
                &rank.to_string(),
                format!(
                    "a {rows} × {cols} matrix has rank at most {largest}: expected 1..={largest}"
                ),
            ));
        }
        Ok(self.part(rows, cols, rank))
    }

    /// A `rows × cols` matrix at `rank`: compressed where PowerSGD shrinks it by more than
    /// `min_compression_rate` (torch's `_should_compress`), never a vector.
    fn part(&self, rows: u64, cols: u64, rank: u64) -> Part {
        let uncompressed = (rows * cols) as f64;
        let compressed = (rows as f64 + cols as f64) * rank as f64;
        if rows > 1 && cols > 1 && compressed * self.min_compression_rate < uncompressed {
            Part::Matrix(Shape {
                rows: rows as usize,
                cols: cols as usize,
                rank: rank as usize,
            })
        } else {
            Part::Plain((rows * cols) as usize)
        }
    }
}
