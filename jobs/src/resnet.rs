//! The ResNet-50 parameter set (torchvision's `resnet50`): 161 tensors, 25 557 032 elements.
//!
//! 53 convolution weights (no biases), 53 batch-norm layers with a `weight` (gamma) and a
//! `bias` (beta) each, and the final fully connected layer's weight and bias, named and ordered
//! as in torchvision's `state_dict` (without the batch-norm running statistics, which are not
//! gradients).

/// One parameter tensor: its name and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamShape {
    /// torchvision's name, e.g. `layer1.0.conv1.weight`.
    pub name: String,
    /// The shape, e.g. `[64, 64, 1, 1]`.
    pub shape: Vec<u64>,
}

impl ParamShape {
    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// Total elements of ResNet-50's parameters.
pub const RESNET50_ELEMENTS: u64 = 25_557_032;

/// Number of ResNet-50 parameter tensors.
pub const RESNET50_TENSORS: usize = 161;

/// ResNet-50's parameter tensors in `state_dict` order.
pub fn resnet50() -> Vec<ParamShape> {
    let mut out = Vec::with_capacity(RESNET50_TENSORS);
    let conv = |out: &mut Vec<ParamShape>, name: String, o: u64, i: u64, k: u64| {
        out.push(ParamShape {
            name: format!("{name}.weight"),
            shape: vec![o, i, k, k],
        })
    };
    let bn = |out: &mut Vec<ParamShape>, name: String, c: u64| {
        for p in ["weight", "bias"] {
            out.push(ParamShape {
                name: format!("{name}.{p}"),
                shape: vec![c],
            });
        }
    };
    conv(&mut out, "conv1".into(), 64, 3, 7);
    bn(&mut out, "bn1".into(), 64);
    let mut inplanes = 64;
    for (layer, (blocks, planes)) in [(3u64, 64u64), (4, 128), (6, 256), (3, 512)]
        .into_iter()
        .enumerate()
    {
        for b in 0..blocks {
            let p = format!("layer{}.{b}", layer + 1);
            conv(&mut out, format!("{p}.conv1"), planes, inplanes, 1);
            bn(&mut out, format!("{p}.bn1"), planes);
            conv(&mut out, format!("{p}.conv2"), planes, planes, 3);
            bn(&mut out, format!("{p}.bn2"), planes);
            conv(&mut out, format!("{p}.conv3"), planes * 4, planes, 1);
            bn(&mut out, format!("{p}.bn3"), planes * 4);
            if b == 0 {
                conv(
                    &mut out,
                    format!("{p}.downsample.0"),
                    planes * 4,
                    inplanes,
                    1,
                );
                bn(&mut out, format!("{p}.downsample.1"), planes * 4);
            }
            inplanes = planes * 4;
        }
    }
    out.push(ParamShape {
        name: "fc.weight".into(),
        shape: vec![1000, 2048],
    });
    out.push(ParamShape {
        name: "fc.bias".into(),
        shape: vec![1000],
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_torchvision_counts() {
        let p = resnet50();
        assert_eq!(p.len(), RESNET50_TENSORS);
        assert_eq!(
            p.iter().map(ParamShape::numel).sum::<u64>(),
            RESNET50_ELEMENTS
        );
        assert_eq!(p[0].name, "conv1.weight");
        assert_eq!(p[160].name, "fc.bias");
        let mut names: Vec<_> = p.iter().map(|s| &s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), RESNET50_TENSORS);
    }
}
