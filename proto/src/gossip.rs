//! The workers' graph of a decentralised exchange (`exchange = "gossip"`, Algorithm 1 of Lu
//! and De Sa, "Moniqua: Modulo Quantized Communication in Decentralized SGD", ICML 2020): the
//! mixing matrix `W` (row `i` worker `i`'s weights) and the checks that make it one ([`Mixing`]). It lives here because
//! the cluster file's `[gossip]` table is checked when the file is read, and the servers that
//! relay the messages need each worker's neighbours; the averaging itself is
//! `pushpull_codecs::gossip`.

use nalgebra::DMatrix;

/// How far a row's sum or a pair of symmetric entries may be from exact (decimal entries such
/// as 1/3 written in a file are not exact in binary).
pub const TOLERANCE: f64 = 1e-9;

/// A mixing matrix: symmetric, doubly stochastic, non-negative, with spectral gap
/// `ρ = max(|λ₂|, |λₙ|) < 1` (the paper's assumption: the graph reaches consensus). Made
/// only through [`Mixing::new`], which checks all of it, or [`Mixing::ring`].
#[derive(Debug, Clone, PartialEq)]
pub struct Mixing {
    n: usize,
    /// Row-major `n × n`.
    w: Vec<f64>,
    rho: f64,
}

impl Mixing {
    /// Checks `rows` (`W`, row `i` worker `i`'s weights) and returns the matrix. Errors name
    /// what is wrong: the row or the pair of entries, or the eigenvalue that breaks the
    /// spectral gap (a disconnected graph has `λ₂ = 1`; a bipartite one with no self-weight,
    /// such as a ring of 4 with ½ to each neighbour, has `λₙ = −1` and never reaches
    /// consensus).
    pub fn new(rows: &[Vec<f64>]) -> Result<Mixing, String> {
        let n = rows.len();
        if n == 0 {
            return Err("the mixing matrix has no rows".into());
        }
        for (i, row) in rows.iter().enumerate() {
            if row.len() != n {
                return Err(format!(
                    "row {i} of the mixing matrix has {} entries; a matrix for {n} workers needs \
                     {n}",
                    row.len()
                ));
            }
            if let Some((j, v)) = row
                .iter()
                .enumerate()
                .find(|(_, v)| !v.is_finite() || **v < 0.0)
            {
                return Err(format!(
                    "W[{i}][{j}] = {v}: weights must be finite and non-negative"
                ));
            }
            let sum: f64 = row.iter().sum();
            if (sum - 1.0).abs() > TOLERANCE {
                return Err(format!(
                    "row {i} of the mixing matrix sums to {sum}, not 1 (W must be doubly \
                     stochastic)"
                ));
            }
        }
        let asymmetric = (0..n)
            .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
            .find(|&(i, j)| (rows[i][j] - rows[j][i]).abs() > TOLERANCE);
        if let Some((i, j)) = asymmetric {
            return Err(format!(
                "W[{i}][{j}] = {} but W[{j}][{i}] = {}: the mixing matrix must be symmetric",
                rows[i][j], rows[j][i]
            ));
        }
        let w: Vec<f64> = rows.iter().flatten().copied().collect();
        let mut eig: Vec<f64> = DMatrix::from_row_slice(n, n, &w)
            .symmetric_eigenvalues()
            .iter()
            .copied()
            .collect();
        eig.sort_by(|a, b| b.total_cmp(a));
        // λ₁ = 1 (the all-ones vector); ρ is the largest magnitude of the others.
        let rest = &eig[1..];
        let (at, rho) = rest
            .iter()
            .enumerate()
            .map(|(k, l)| (k + 2, l.abs()))
            .fold((0, 0.0f64), |acc, x| if x.1 > acc.1 { x } else { acc });
        if rho >= 1.0 - TOLERANCE {
            return Err(format!(
                "eigenvalue λ{at} = {:.6} of the mixing matrix has magnitude 1: the spectral gap \
                 ρ = max(|λ₂|, |λₙ|) must be below 1, or the workers never reach consensus (a \
                 disconnected graph has λ₂ = 1; a bipartite one without self-weights λₙ = −1)",
                rest[at - 2]
            ));
        }
        Ok(Mixing { n, w, rho })
    }

    /// The default graph: a ring, weight ⅓ on each neighbour and on itself (`n ≥ 3`); two
    /// workers average with ½ each; one keeps its model.
    pub fn ring(n: usize) -> Mixing {
        let rows: Vec<Vec<f64>> = (0..n)
            .map(|i| {
                let mut row = vec![0.0; n];
                match n {
                    1 => row[0] = 1.0,
                    2 => row.iter_mut().for_each(|v| *v = 0.5),
                    _ => {
                        for j in [i, (i + 1) % n, (i + n - 1) % n] {
                            row[j] = 1.0 / 3.0;
                        }
                    }
                }
                row
            })
            .collect();
        Mixing::new(&rows).expect("a ring is a valid mixing matrix")
    }

    /// Workers.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the matrix is empty (never: [`Mixing::new`] refuses it).
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// `W[i][j]`.
    pub fn weight(&self, i: usize, j: usize) -> f64 {
        self.w[i * self.n + j]
    }

    /// The spectral gap `ρ = max(|λ₂|, |λₙ|)`.
    pub fn rho(&self) -> f64 {
        self.rho
    }

    /// Worker `i`'s neighbours `j ≠ i` with `W[i][j] > 0`, ascending: the fixed order in
    /// which `pushpull_codecs::gossip::average_step` sums them.
    pub fn neighbours(&self, i: usize) -> Vec<(usize, f64)> {
        (0..self.n)
            .filter(|&j| j != i && self.weight(i, j) > 0.0)
            .map(|j| (j, self.weight(i, j)))
            .collect()
    }

    /// `γW + (1−γ)I` (the paper's slack matrix for 1-bit Moniqua), `0 < γ ≤ 1`.
    pub fn slack(&self, gamma: f64) -> Result<Mixing, String> {
        if !(gamma > 0.0 && gamma <= 1.0) {
            return Err(format!("γ = {gamma}: the slack needs 0 < γ ≤ 1"));
        }
        let rows: Vec<Vec<f64>> = (0..self.n)
            .map(|i| {
                (0..self.n)
                    .map(|j| gamma * self.weight(i, j) + if i == j { 1.0 - gamma } else { 0.0 })
                    .collect()
            })
            .collect();
        Mixing::new(&rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_and_their_gap() {
        for n in 1..9 {
            let w = Mixing::ring(n);
            assert_eq!(w.len(), n);
            assert!(w.rho() < 1.0, "ring of {n}: ρ = {}", w.rho());
        }
        // A ring of n with ⅓ each: λ = (1 + 2cos(2πk/n)) / 3.
        let n = 6;
        let want = (0..n)
            .skip(1)
            .map(|k| {
                ((1.0 + 2.0 * (2.0 * std::f64::consts::PI * k as f64 / n as f64).cos()) / 3.0).abs()
            })
            .fold(0.0, f64::max);
        assert!((Mixing::ring(n).rho() - want).abs() < 1e-12);
        assert_eq!(
            Mixing::ring(5).neighbours(0),
            vec![(1, 1.0 / 3.0), (4, 1.0 / 3.0)]
        );
    }

    #[test]
    fn every_way_a_matrix_can_be_wrong_is_named() {
        let third = 1.0 / 3.0;
        let cases: Vec<(Vec<Vec<f64>>, &str)> = vec![
            (vec![], "no rows"),
            (vec![vec![0.5, 0.5], vec![1.0]], "row 1"),
            (vec![vec![1.5, -0.5], vec![-0.5, 1.5]], "W[0][1] = -0.5"),
            (
                vec![vec![0.5, 0.4], vec![0.4, 0.6]],
                "row 0 of the mixing matrix sums to",
            ),
            (
                vec![
                    vec![0.5, 0.5, 0.0],
                    vec![0.25, 0.5, 0.25],
                    vec![0.25, 0.0, 0.75],
                ],
                "symmetric",
            ),
            // Two separate pairs: λ₂ = 1.
            (
                vec![
                    vec![0.5, 0.5, 0.0, 0.0],
                    vec![0.5, 0.5, 0.0, 0.0],
                    vec![0.0, 0.0, 0.5, 0.5],
                    vec![0.0, 0.0, 0.5, 0.5],
                ],
                "λ2 = 1.0",
            ),
            // A ring of 4 with ½ to each neighbour and nothing on itself: λ₄ = −1.
            (
                vec![
                    vec![0.0, 0.5, 0.0, 0.5],
                    vec![0.5, 0.0, 0.5, 0.0],
                    vec![0.0, 0.5, 0.0, 0.5],
                    vec![0.5, 0.0, 0.5, 0.0],
                ],
                "λ4 = -1.0",
            ),
            (vec![vec![f64::NAN]], "finite"),
        ];
        for (rows, words) in cases {
            let e = Mixing::new(&rows).unwrap_err();
            assert!(e.contains(words), "{rows:?}: {e}");
        }
        // Decimal thirds are accepted.
        let rows = vec![vec![0.333333333333, 0.333333333333, 0.333333333334]; 3];
        assert!(Mixing::new(&rows).is_ok());
        assert!(third > 0.0);
    }

    #[test]
    fn slack_keeps_the_matrix_valid() {
        let w = Mixing::ring(4).slack(0.5).unwrap();
        assert!((w.weight(0, 0) - (0.5 / 3.0 + 0.5)).abs() < 1e-15);
        assert!(w.rho() > Mixing::ring(4).rho());
        assert!(Mixing::ring(4).slack(0.0).is_err());
    }
}
