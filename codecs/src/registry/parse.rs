//! [`parse_params`]: a string map to a [`CompressorSpec`], each problem an error naming the
//! key as spelled, the value and what is allowed: an unknown key, a key that does not apply to
//! the chosen compressor, two spellings of one key with different values, an unknown name, a
//! number that does not parse or is out of range, a missing required value. Keys and values
//! are matched exactly (case-sensitive).

use std::collections::BTreeMap;

use super::{all_keys, find_key, lookup, COMPRESSORS};
use crate::chain::EfKind;
use crate::error::{KernelError, Result};
use crate::params::{CompressorSpec, Exchange, IntraCodec};
use crate::spec::{Keys, Spellings};

/// Whether a tensor with map `params` is gossiped (`exchange = "gossip"`); a map the codecs
/// refuse is not (its codec's factory names what is wrong).
pub fn is_gossip(params: &BTreeMap<String, String>) -> bool {
    parse_params(params).is_ok_and(|s| s.exchange.is_gossip())
}

fn known_keys() -> String {
    let mut v = Vec::new();
    for k in all_keys() {
        if !v.contains(&k.name) {
            v.push(k.name);
        }
        v.extend_from_slice(k.aliases);
    }
    v.join(", ")
}

/// The chain's keys, which apply whatever the compressor.
const GENERAL: [&str; 7] = [
    "compressor",
    "ef",
    "momentum",
    "mu",
    "seed",
    "intra_compressor",
    "exchange",
];

/// The spellings of error feedback (`ef`).
const EFS: Spellings<Option<EfKind>> = &[
    (&["none"], None),
    (&["vanilla"], Some(EfKind::Vanilla)),
    (&["corrected"], Some(EfKind::Corrected)),
];
/// The spellings of `momentum`.
const MOMENTA: Spellings<bool> = &[(&["none"], false), (&["nesterov"], true)];
/// The spellings of `intra_compressor`.
const INTRAS: Spellings<IntraCodec> = &[
    (&["none"], IntraCodec::None),
    (&["fp16"], IntraCodec::Fp16),
    (&["bf16"], IntraCodec::Bf16),
];
/// The spellings of `exchange`.
const EXCHANGES: Spellings<Exchange> = &[
    (&["push_pull"], Exchange::PushPull),
    (&["gossip"], Exchange::Gossip),
    (&["gossip_direct"], Exchange::GossipDirect),
];

/// Parses and validates a parameter map (see the crate docs for the table of keys).
pub fn parse_params(params: &BTreeMap<String, String>) -> Result<CompressorSpec> {
    // 1. Resolve spellings.
    let mut r = Keys {
        map: BTreeMap::new(),
        compressor: "none",
    };
    for (key, value) in params {
        let info = find_key(key).ok_or_else(|| KernelError::UnknownKey {
            key: key.clone(),
            value: value.clone(),
            known: known_keys(),
        })?;
        if let Some((k0, v0)) = r.get(info.name) {
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
        r.map.insert(info.name, (key.as_str(), value.as_str()));
    }

    // 2. The compressor and which keys apply to it.
    let compressor = r.get("compressor").map(|(_, v)| v).unwrap_or("none");
    r.compressor = compressor;
    let Some(entry) = lookup(compressor) else {
        let (k, v) = r
            .get("compressor")
            .expect("a non-default name came from the map");
        let names: Vec<&str> = COMPRESSORS.iter().map(|e| e.name).collect();
        return Err(KernelError::bad(
            k,
            v,
            format!("expected one of {}", names.join(", ")),
        ));
    };
    for (&short, &(k, v)) in &r.map {
        if GENERAL.contains(&short) || entry.reads(short) {
            continue;
        }
        let users: Vec<&str> = COMPRESSORS
            .iter()
            .filter(|e| e.reads(short))
            .map(|e| e.name)
            .collect();
        return Err(KernelError::NotApplicable {
            key: k.to_string(),
            value: v.to_string(),
            why: format!(
                "compressor \"{compressor}\" does not use it (it applies to {})",
                users.join(", ")
            ),
        });
    }
    // 3. Decorators and seed.
    let ef = r.choice("ef", EFS, None, "expected none, vanilla or corrected")?;
    let momentum = r.choice("momentum", MOMENTA, false, "expected none or nesterov")?;
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
    let intra = r.choice(
        "intra_compressor",
        INTRAS,
        IntraCodec::None,
        "expected none, fp16 or bf16",
    )?;
    let seed = match r.get("seed") {
        None => None,
        Some((k, v)) => Some(
            v.parse::<u64>()
                .map_err(|_| KernelError::bad(k, v, "expected an unsigned 64-bit integer"))?,
        ),
    };

    // 4. The compressor's own settings.
    let codec = (entry.parse)(&r)?;
    let exchange = r.choice(
        "exchange",
        EXCHANGES,
        Exchange::PushPull,
        "expected push_pull, gossip or gossip_direct",
    )?;
    if exchange.is_gossip() {
        let (k, v) = r.get("exchange").expect("gossip came from the map");
        if !codec.kind().fixed_size {
            return Err(KernelError::NotApplicable {
                key: k.to_string(),
                value: v.to_string(),
                why: format!(
                    "compressor \"{compressor}\" cannot be gossiped: gossip relays messages of \
                     a fixed size, and its payloads vary"
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
