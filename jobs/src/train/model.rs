//! The models, in candle: an MLP (linear layers with ReLU between them) or multinomial logistic
//! regression (one linear layer), with parameters as candle [`Var`]s that the training loop
//! updates from the averaged gradients.

use candle_core::{DType, Device, Tensor, Var};

use super::rng::Rng;

/// One parameter tensor: its push_pull name (`fc1.weight`, `fc1.bias`, ...), shape and value.
#[derive(Debug)]
pub struct Param {
    /// The name every worker declares it under.
    pub name: String,
    /// `[out, in]` for weights, `[out]` for biases.
    pub shape: Vec<usize>,
    /// The candle variable (gradients are taken with respect to it).
    pub var: Var,
}

impl Param {
    /// Elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A stack of linear layers: `widths[0]` inputs, `widths.last()` outputs (logits), ReLU after
/// every layer but the last. `[d, c]` is logistic regression.
#[derive(Debug)]
pub struct Model {
    /// `fc1.weight, fc1.bias, fc2.weight, ...`, in layer order (the declaration order).
    pub params: Vec<Param>,
}

impl Model {
    /// Layer widths `widths` (at least 2), weights drawn from the seed with He-normal scaling
    /// (N(0, 2/fan_in)) for layers followed by ReLU and N(0, 1/fan_in) for the output layer;
    /// biases 0. The same seed gives the same weights on every worker.
    pub fn new(widths: &[usize], seed: u64, device: &Device) -> candle_core::Result<Model> {
        assert!(widths.len() >= 2, "a model needs inputs and outputs");
        let mut rng = Rng::new(seed, 0x1417);
        let mut params = Vec::new();
        let layers = widths.len() - 1;
        for l in 0..layers {
            let (fan_in, out) = (widths[l], widths[l + 1]);
            let gain = if l + 1 < layers { 2.0 } else { 1.0 };
            let s = (gain / fan_in as f64).sqrt();
            let w: Vec<f32> = (0..out * fan_in)
                .map(|_| (rng.normal() * s) as f32)
                .collect();
            params.push(Param {
                name: format!("fc{}.weight", l + 1),
                shape: vec![out, fan_in],
                var: Var::from_vec(w, (out, fan_in), device)?,
            });
            params.push(Param {
                name: format!("fc{}.bias", l + 1),
                shape: vec![out],
                var: Var::zeros(out, DType::F32, device)?,
            });
        }
        Ok(Model { params })
    }

    /// Total parameter count.
    pub fn num_params(&self) -> usize {
        self.params.iter().map(Param::len).sum()
    }

    /// Logits for a batch `x` of shape `[n, widths[0]]`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let layers = self.params.len() / 2;
        let mut h = x.clone();
        for l in 0..layers {
            let (w, b) = (&self.params[2 * l].var, &self.params[2 * l + 1].var);
            h = h
                .matmul(&w.as_tensor().t()?)?
                .broadcast_add(b.as_tensor())?;
            if l + 1 < layers {
                h = h.relu()?;
            }
        }
        Ok(h)
    }
}

/// Mean cross-entropy and accuracy of `model` on `x` (`[n, d]`) and `y` (`[n]`, u32), in
/// batches of `batch` rows (bounded memory).
pub fn evaluate(
    model: &Model,
    x: &Tensor,
    y: &Tensor,
    batch: usize,
) -> candle_core::Result<(f64, f64)> {
    let n = y.dims1()?;
    let (mut loss_sum, mut correct) = (0.0f64, 0u64);
    let mut start = 0;
    while start < n {
        let len = batch.min(n - start);
        let xb = x.narrow(0, start, len)?;
        let yb = y.narrow(0, start, len)?;
        let logits = model.forward(&xb)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &yb)?.to_scalar::<f32>()?;
        loss_sum += loss as f64 * len as f64;
        let pred = logits.argmax(1)?;
        correct += pred
            .eq(&yb)?
            .to_dtype(DType::U32)?
            .sum_all()?
            .to_scalar::<u32>()? as u64;
        start += len;
    }
    Ok((loss_sum / n as f64, correct as f64 / n as f64))
}
