//! The synthetic classification task: Gaussian inputs labelled by a fixed random teacher
//! network, with label noise on the training set, a clean held-out test set, and the training
//! set sharded across workers by rank.
//!
//! Everything is a pure function of the job seed and the [`TaskSpec`], so every worker builds
//! the same task and keeps its own shard; a run is reproducible from its seed.
//!
//! The teacher: `label(x) = argmax(W2 · (|W1 · x| − √(2/π)))`, with `W1` of shape
//! `teacher_hidden × input_dim` (rows: random unit vectors) and `W2` of shape
//! `classes × teacher_hidden` (entries N(0, 1/teacher_hidden)). Each hidden unit `|w·x|` is an
//! even function of x (centred by its mean √(2/π), so classes are roughly balanced), so
//! `label(x) = label(−x)`: no linear classifier does better than about chance, while a ReLU MLP
//! can represent the teacher exactly (`|z| = relu(z) + relu(−z)`) and has to learn its
//! `teacher_hidden` directions from data. The logistic baseline measures exactly that gap.

use super::rng::Rng;

/// What defines the task (the data-related `[job]` keys).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    /// Input features.
    pub input_dim: usize,
    /// Classes.
    pub classes: usize,
    /// Hidden width of the teacher.
    pub teacher_hidden: usize,
    /// Training samples (all workers together).
    pub train_samples: usize,
    /// Test samples.
    pub test_samples: usize,
    /// Fraction of training labels replaced by a uniformly random class.
    pub label_noise: f64,
}

/// Inputs (row-major, `n × input_dim`) and labels.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// Row-major features.
    pub x: Vec<f32>,
    /// Class of each row.
    pub y: Vec<u32>,
    /// Features per row.
    pub dim: usize,
}

impl Split {
    /// Rows.
    pub fn len(&self) -> usize {
        self.y.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }
}

/// One worker's view of the task.
#[derive(Debug, Clone)]
pub struct Task {
    /// This worker's shard of the training set (noisy labels).
    pub train: Split,
    /// The whole test set (clean labels).
    pub test: Split,
    /// Fraction of this shard's labels that the noise changed.
    pub noisy_fraction: f64,
}

// RNG streams of the task.
const STREAM_TEACHER: u64 = 1;
const STREAM_TRAIN: u64 = 2;
const STREAM_TEST: u64 = 3;
const STREAM_NOISE: u64 = 4;

/// E|z| for z ~ N(0, 1): √(2/π). Subtracting it centres the teacher's hidden units, so the
/// classes come out roughly balanced.
const MEAN_ABS_NORMAL: f32 = 0.797_884_6;

struct Teacher {
    w1: Vec<f32>,
    w2: Vec<f32>,
    hidden: usize,
}

impl Teacher {
    fn new(seed: u64, spec: &TaskSpec) -> Teacher {
        let mut r = Rng::new(seed, STREAM_TEACHER);
        let (d, h, c) = (spec.input_dim, spec.teacher_hidden, spec.classes);
        let s2 = (1.0 / h as f64).sqrt();
        let mut w1: Vec<f32> = (0..h * d).map(|_| r.normal() as f32).collect();
        for row in w1.chunks_mut(d) {
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
            row.iter_mut().for_each(|v| *v /= norm);
        }
        Teacher {
            w1,
            w2: (0..c * h).map(|_| (r.normal() * s2) as f32).collect(),
            hidden: h,
        }
    }

    fn label(&self, x: &[f32], hid: &mut [f32], classes: usize) -> u32 {
        let d = x.len();
        for (j, hj) in hid.iter_mut().enumerate() {
            let row = &self.w1[j * d..(j + 1) * d];
            let z: f32 = row.iter().zip(x).map(|(a, b)| a * b).sum();
            *hj = z.abs() - MEAN_ABS_NORMAL;
        }
        let mut best = (0u32, f32::NEG_INFINITY);
        for c in 0..classes {
            let row = &self.w2[c * self.hidden..(c + 1) * self.hidden];
            let z: f32 = row.iter().zip(hid.iter()).map(|(a, b)| a * b).sum();
            if z > best.1 {
                best = (c as u32, z);
            }
        }
        best.0
    }
}

fn gaussian_rows(seed: u64, stream: u64, n: usize, d: usize) -> Vec<f32> {
    let mut r = Rng::new(seed, stream);
    (0..n * d).map(|_| r.normal() as f32).collect()
}

fn label_all(teacher: &Teacher, x: &[f32], d: usize, classes: usize) -> Vec<u32> {
    let mut hid = vec![0.0f32; teacher.hidden];
    x.chunks_exact(d)
        .map(|row| teacher.label(row, &mut hid, classes))
        .collect()
}

/// Builds rank `rank`'s view of the task (of `num_workers`): the training set is generated
/// whole (so the noise and the shards don't depend on the number of workers' order of work),
/// then row i goes to worker `i % num_workers`.
pub fn build(seed: u64, spec: &TaskSpec, rank: u32, num_workers: u32) -> Task {
    let d = spec.input_dim;
    let teacher = Teacher::new(seed, spec);
    let train_x = gaussian_rows(seed, STREAM_TRAIN, spec.train_samples, d);
    let clean = label_all(&teacher, &train_x, d, spec.classes);
    let mut train_y = clean.clone();
    let mut noise = Rng::new(seed, STREAM_NOISE);
    for y in train_y.iter_mut() {
        // Two draws per row whatever happens, so the noise of row i doesn't depend on others.
        let flip = noise.uniform() < spec.label_noise;
        let class = noise.below(spec.classes as u64) as u32;
        if flip {
            *y = class;
        }
    }
    let (mut sx, mut sy) = (Vec::new(), Vec::new());
    let mut changed = 0usize;
    for i in (rank as usize..spec.train_samples).step_by(num_workers.max(1) as usize) {
        sx.extend_from_slice(&train_x[i * d..(i + 1) * d]);
        sy.push(train_y[i]);
        changed += usize::from(train_y[i] != clean[i]);
    }
    let test_x = gaussian_rows(seed, STREAM_TEST, spec.test_samples, d);
    let test_y = label_all(&teacher, &test_x, d, spec.classes);
    Task {
        noisy_fraction: changed as f64 / sy.len().max(1) as f64,
        train: Split {
            x: sx,
            y: sy,
            dim: d,
        },
        test: Split {
            x: test_x,
            y: test_y,
            dim: d,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TaskSpec {
        TaskSpec {
            input_dim: 16,
            classes: 5,
            teacher_hidden: 8,
            train_samples: 1001,
            test_samples: 300,
            label_noise: 0.2,
        }
    }

    #[test]
    fn shards_partition_the_training_set_and_are_reproducible() {
        let s = spec();
        let a = build(9, &s, 0, 3);
        let b = build(9, &s, 1, 3);
        let c = build(9, &s, 2, 3);
        assert_eq!(a.train.len() + b.train.len() + c.train.len(), 1001);
        assert_eq!(a.train.len(), 334);
        assert_eq!(a.test, b.test, "every worker has the whole test set");
        assert_eq!(build(9, &s, 1, 3).train, b.train);
        assert_ne!(build(10, &s, 1, 3).train, b.train);
        let one = build(9, &s, 0, 1);
        assert_eq!(
            &one.train.x[16..32],
            &b.train.x[..16],
            "row 1 is worker 1's first row"
        );
    }

    #[test]
    fn labels_use_every_class_and_noise_is_near_its_rate() {
        let mut s = spec();
        s.train_samples = 20_000;
        let t = build(3, &s, 0, 1);
        let mut counts = [0usize; 5];
        for &y in &t.test.y {
            counts[y as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
        // A replaced label equals the old one with probability 1/5: changed ≈ 0.2 · 0.8.
        assert!(
            (t.noisy_fraction - 0.16).abs() < 0.02,
            "{}",
            t.noisy_fraction
        );
    }
}
