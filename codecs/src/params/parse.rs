//! [`parse_params`]: a string map to a [`CompressorSpec`], each problem an error naming the
//! key as spelled, the value and what is allowed (see the [module docs](super)).

use super::*;

/// The map with every spelling resolved to the short key: short key → (spelled key, value).
struct Resolved<'a> {
    m: BTreeMap<&'static str, (&'a str, &'a str)>,
}

impl<'a> Resolved<'a> {
    fn get(&self, key: &str) -> Option<(&'a str, &'a str)> {
        self.m.get(key).copied()
    }
}

fn known_keys() -> String {
    let mut v = Vec::new();
    for k in KEYS {
        v.push(k.name);
        v.extend_from_slice(k.aliases);
    }
    v.join(", ")
}

fn parse_bool(key: &str, v: &str) -> Result<bool, KernelError> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(KernelError::bad(key, v, "expected true or false")),
    }
}

fn parse_whole(key: &str, v: &str, lo: u64, hi: u64, what: &str) -> Result<u64, KernelError> {
    let allowed = || format!("expected {what}, a whole number in {lo}..={hi}");
    let n: u64 = v.parse().map_err(|_| KernelError::bad(key, v, allowed()))?;
    if n < lo || n > hi {
        return Err(KernelError::bad(key, v, allowed()));
    }
    Ok(n)
}

fn parse_k(key: &str, v: &str, topk: bool) -> Result<KSpec, KernelError> {
    let allowed = "expected a positive number (a fraction < 1 or a count >= 1)";
    let x: f64 = v.parse().map_err(|_| KernelError::bad(key, v, allowed))?;
    if !x.is_finite() || x <= 0.0 {
        return Err(KernelError::bad(key, v, allowed));
    }
    if x < 1.0 {
        if topk && x > 0.5 {
            return Err(KernelError::bad(
                key,
                v,
                "a fraction for topk must be <= 0.5 (topk keeps at most half the chunk)",
            ));
        }
        return Ok(KSpec::Fraction(x));
    }
    if x.fract() != 0.0 || x > u32::MAX as f64 {
        return Err(KernelError::bad(
            key,
            v,
            "a count >= 1 must be a whole number (below 2^32); a fraction must be < 1",
        ));
    }
    Ok(KSpec::Count(x as u64))
}

/// Parses and validates a parameter map (see the crate docs for the table of keys).
pub fn parse_params(params: &BTreeMap<String, String>) -> Result<CompressorSpec, KernelError> {
    // 1. Resolve spellings.
    let mut r = Resolved { m: BTreeMap::new() };
    for (key, value) in params {
        let info = KEYS
            .iter()
            .find(|k| k.name == key.as_str() || k.aliases.contains(&key.as_str()))
            .ok_or_else(|| KernelError::UnknownKey {
                key: key.clone(),
                value: value.clone(),
                known: known_keys(),
            })?;
        if let Some(&(k0, v0)) = r.m.get(info.name) {
            if v0 != value.as_str() {
                return Err(KernelError::Conflict {
                    key: k0.to_string(),
                    value: v0.to_string(),
                    other_key: key.clone(),
                    other_value: value.clone(),
                });
            }
            continue;
        }
        r.m.insert(info.name, (key.as_str(), value.as_str()));
    }

    // 2. The compressor and which keys apply to it.
    let compressor = r.get("compressor").map(|(_, v)| v).unwrap_or("none");
    let applicable: &[&str] = match compressor {
        "none" | "fp16" | "bf16" => &[],
        "onebit" => &["scaling", "columns"],
        "topk" => &["k"],
        "randomk" => &["k", "unbiased"],
        "dithering" => &["k", "partition", "normalize", "encoding", "bucket"],
        "minmax" => &["bits", "bucket"],
        "moniqua" => &["theta", "bits", "rounding", "theta_schedule", "hash"],
        _ => {
            let (k, v) = r
                .get("compressor")
                .expect("a non-default name came from the map");
            return Err(KernelError::bad(
                k,
                v,
                "expected one of none, fp16, bf16, onebit, topk, randomk, dithering, minmax, moniqua",
            ));
        }
    };
    let general = [
        "compressor",
        "ef",
        "momentum",
        "mu",
        "seed",
        "intra_compressor",
        "exchange",
    ];
    for (&short, &(k, v)) in &r.m {
        if general.contains(&short) || applicable.contains(&short) {
            continue;
        }
        let info = KEYS.iter().find(|i| i.name == short).expect("resolved");
        return Err(KernelError::NotApplicable {
            key: k.to_string(),
            value: v.to_string(),
            why: format!(
                "compressor \"{compressor}\" does not use it (it applies to {})",
                info.applies_to
            ),
        });
    }

    // 3. Decorators and seed.
    let ef = match r.get("ef") {
        None => None,
        Some((_, "none")) => None,
        Some((_, "vanilla")) => Some(EfKind::Vanilla),
        Some((_, "corrected")) => Some(EfKind::Corrected),
        Some((k, v)) => {
            return Err(KernelError::bad(
                k,
                v,
                "expected none, vanilla or corrected",
            ))
        }
    };
    let momentum = match r.get("momentum") {
        None | Some((_, "none")) => false,
        Some((_, "nesterov")) => true,
        Some((k, v)) => return Err(KernelError::bad(k, v, "expected none or nesterov")),
    };
    let momentum_mu = match (momentum, r.get("mu")) {
        (false, None) => None,
        (false, Some((k, v))) => {
            return Err(KernelError::NotApplicable {
                key: k.to_string(),
                value: v.to_string(),
                why: "mu applies only with momentum=nesterov".into(),
            })
        }
        (true, None) => Some(0.9),
        (true, Some((k, v))) => {
            let allowed = "expected a number in [0, 1)";
            let mu: f32 = v.parse().map_err(|_| KernelError::bad(k, v, allowed))?;
            if !(0.0..1.0).contains(&mu) {
                return Err(KernelError::bad(k, v, allowed));
            }
            Some(mu)
        }
    };
    let intra = match r.get("intra_compressor") {
        None | Some((_, "none")) => IntraCodec::None,
        Some((_, "fp16")) => IntraCodec::Fp16,
        Some((_, "bf16")) => IntraCodec::Bf16,
        Some((k, v)) => return Err(KernelError::bad(k, v, "expected none, fp16 or bf16")),
    };
    let seed = match r.get("seed") {
        None => None,
        Some((k, v)) => Some(
            v.parse::<u64>()
                .map_err(|_| KernelError::bad(k, v, "expected an unsigned 64-bit integer"))?,
        ),
    };

    // 4. The compressor's own settings.
    let bool_or = |short: &str, d: bool| -> Result<bool, KernelError> {
        match r.get(short) {
            None => Ok(d),
            Some((k, v)) => parse_bool(k, v),
        }
    };
    let bucket = || -> Result<Option<usize>, KernelError> {
        match r.get("bucket") {
            None => Ok(None),
            Some((k, v)) => {
                Ok(Some(
                    parse_whole(k, v, 1, u32::MAX as u64, "a bucket length in elements")? as usize,
                ))
            }
        }
    };
    let bits = |hi_note: &str| -> Result<u32, KernelError> {
        match r.get("bits") {
            None => Ok(8),
            Some((k, v)) => Ok(parse_whole(k, v, 1, 8, hi_note)? as u32),
        }
    };
    let require = |short: &str, allowed: &str| {
        r.get(short).ok_or_else(|| KernelError::Missing {
            key: short.to_string(),
            needed_by: compressor.to_string(),
            allowed: allowed.to_string(),
        })
    };
    let codec = match compressor {
        "none" => CodecSpec::None,
        "fp16" => CodecSpec::Fp16,
        "bf16" => CodecSpec::Bf16,
        "onebit" => match r.get("columns") {
            None => CodecSpec::OneBit {
                scaling: bool_or("scaling", false)?,
            },
            Some((k, v)) => {
                let columns = parse_whole(k, v, 1, u32::MAX as u64, "a column count")? as usize;
                if let Some((sk, sv)) = r.get("scaling") {
                    return Err(KernelError::NotApplicable {
                        key: sk.to_string(),
                        value: sv.to_string(),
                        why: format!(
                            "the column-wise onebit variant ({k}={v}) has its own per-column \
                             levels; remove \"{sk}\""
                        ),
                    });
                }
                if r.get("ef").is_none() {
                    // 1-bit SGD keeps its quantisation residual (CNTK's notes): a map must
                    // say whether it wants it, so that no existing map changes its bits.
                    return Err(KernelError::Missing {
                        key: "ef".to_string(),
                        needed_by: format!(
                            "the column-wise onebit variant ({k}={v}), 1-bit SGD, whose \
                             residual is part of the method"
                        ),
                        allowed: "byteps_ef_type / byteps_error_feedback_type / ef: vanilla \
                                  (1-bit SGD's residual), corrected, or none (say so to go \
                                  without it)"
                            .to_string(),
                    });
                }
                CodecSpec::OneBitColumns {
                    columns,
                    chunk_columns: None,
                }
            }
        },
        "topk" => {
            let (k, v) = require(
                "k",
                "byteps_compressor_k / k: a fraction < 1 or a count >= 1",
            )?;
            CodecSpec::TopK {
                k: parse_k(k, v, true)?,
            }
        }
        "randomk" => {
            let (k, v) = require(
                "k",
                "byteps_compressor_k / k: a fraction < 1 or a count >= 1",
            )?;
            CodecSpec::RandomK {
                k: parse_k(k, v, false)?,
                unbiased: bool_or("unbiased", false)?,
            }
        }
        "dithering" => {
            let partition = match r.get("partition") {
                None => Partition::Linear,
                Some((_, "linear" | "0")) => Partition::Linear,
                Some((_, "natural" | "1")) => Partition::Natural,
                Some((k, v)) => {
                    return Err(KernelError::bad(
                        k,
                        v,
                        "expected linear (or 0) or natural (or 1)",
                    ))
                }
            };
            let normalize = match r.get("normalize") {
                None => Normalize::Max,
                Some((_, "max" | "0")) => Normalize::Max,
                Some((_, "l2" | "1")) => Normalize::L2,
                Some((k, v)) => {
                    return Err(KernelError::bad(k, v, "expected max (or 0) or l2 (or 1)"))
                }
            };
            let encoding = match r.get("encoding") {
                None | Some((_, "packed")) => Encoding::Packed,
                Some((_, "elias")) => Encoding::Elias,
                Some((k, v)) => return Err(KernelError::bad(k, v, "expected packed or elias")),
            };
            let (k, v) = require("k", "byteps_compressor_k / k: the number of levels s >= 1")?;
            let hi = match partition {
                Partition::Linear => 32767,
                Partition::Natural => 32,
            };
            let s = match v.parse::<u64>() {
                Ok(s) if (1..=hi).contains(&s) => s as u32,
                _ => {
                    return Err(KernelError::bad(
                        k,
                        v,
                        format!(
                            "expected the number of dithering levels s, a whole number in 1..={hi} \
                             for the {} partition",
                            partition_name(partition)
                        ),
                    ))
                }
            };
            CodecSpec::Dithering {
                s,
                partition,
                normalize,
                bucket: bucket()?,
                encoding,
            }
        }
        "minmax" => CodecSpec::MinMax {
            bits: bits("bits per element")?,
            bucket: bucket()?,
        },
        "moniqua" => {
            let (k, v) = require("theta", "theta: a finite number > 0")?;
            let theta: f64 = v
                .parse()
                .map_err(|_| KernelError::bad(k, v, "expected a finite number > 0"))?;
            if !(theta.is_finite() && theta > 0.0) {
                return Err(KernelError::bad(k, v, "expected a finite number > 0"));
            }
            let rounding = match r.get("rounding") {
                None | Some((_, "stochastic")) => Rounding::Stochastic,
                Some((_, "nearest")) => Rounding::Nearest,
                Some((k, v)) => {
                    return Err(KernelError::bad(k, v, "expected stochastic or nearest"))
                }
            };
            let b = bits("bits per element")?;
            let delta = crate::codecs::moniqua::delta(b, rounding);
            if delta >= 0.5 {
                return Err(KernelError::bad(
                    r.get("bits").map(|(k, _)| k).unwrap_or("bits"),
                    &b.to_string(),
                    format!(
                        "moniqua needs delta < 1/2, and {} rounding with {b} bit(s) gives delta = \
                         {delta}; use bits >= 2 or rounding=nearest",
                        rounding_name(rounding)
                    ),
                ));
            }
            let b_theta = crate::codecs::moniqua::b_theta(theta, b, rounding);
            if !b_theta.is_finite() {
                return Err(KernelError::bad(
                    k,
                    v,
                    "theta is too large: B_theta overflows",
                ));
            }
            let schedule = match r.get("theta_schedule") {
                None | Some((_, "fixed")) => ThetaSchedule::Fixed,
                Some((_, "lr")) => ThetaSchedule::Lr,
                Some((_, "bound")) => ThetaSchedule::Bound,
                Some((k, v)) => return Err(KernelError::bad(k, v, "expected fixed, lr or bound")),
            };
            let hash = match r.get("hash") {
                None => false,
                Some((k, v)) => parse_bool(k, v)?,
            };
            CodecSpec::Moniqua {
                theta,
                bits: b,
                rounding,
                schedule,
                hash,
            }
        }
        _ => unreachable!("checked above"),
    };
    let exchange = match r.get("exchange") {
        None | Some((_, "push_pull")) => Exchange::PushPull,
        Some((_, "gossip")) => Exchange::Gossip,
        Some((k, v)) => return Err(KernelError::bad(k, v, "expected push_pull or gossip")),
    };
    if exchange == Exchange::Gossip {
        let (k, v) = r.get("exchange").expect("gossip came from the map");
        if !matches!(
            codec,
            CodecSpec::None
                | CodecSpec::Fp16
                | CodecSpec::Bf16
                | CodecSpec::MinMax { .. }
                | CodecSpec::Moniqua { .. }
        ) {
            return Err(KernelError::NotApplicable {
                key: k.to_string(),
                value: v.to_string(),
                why: format!(
                    "compressor \"{compressor}\" cannot be gossiped: gossip relays messages of \
                     a fixed size (none, fp16, bf16, minmax or moniqua)"
                ),
            });
        }
        for key in ["ef", "momentum"] {
            if let Some((ek, ev)) = r.get(key).filter(|(_, v)| *v != "none") {
                return Err(KernelError::NotApplicable {
                    key: ek.to_string(),
                    value: ev.to_string(),
                    why: "exchange = gossip averages model parameters: error feedback and \
                          momentum are for gradients (keep them in the optimizer)"
                        .into(),
                });
            }
        }
    }
    Ok(CompressorSpec {
        codec,
        ef,
        momentum_mu,
        seed,
        intra,
        exchange,
    })
}
