//! The registry: every compressor by name in one table ([`COMPRESSORS`]), and from a tensor's
//! string map (or a parsed [`CompressorSpec`]) to the whole chain `nesterov(ef(codec))`
//! ([`Compressor`]).
//!
//! Each compressor's entry ([`Entry`]) is written beside its codec (`codecs/src/codecs/`): its
//! name, the keys it reads and their parse into its settings ([`crate::spec::CodecSpec`]),
//! which build its codec. Adding one is its own file and a line of the table.

mod parse;

use std::collections::BTreeMap;

pub use parse::{is_gossip, parse_params};

use crate::chain::Compressor;
use crate::codec::{CodecInfo, NodeIdentity};
use crate::codecs::{cast, dithering, minmax, moniqua, onebit, powersgd, randomk, topk};
use crate::error::{KernelError, Result};
use crate::params::{CompressorSpec, KEYS};
use crate::rng::Role;
pub use crate::spec::{BuildOptions, Purpose};
use crate::spec::{Entry, KeyInfo};

/// Every compressor, by the `compressor` value that names it.
pub const COMPRESSORS: &[Entry] = &[
    cast::NONE,
    cast::FP16,
    cast::BF16,
    onebit::ENTRY,
    topk::ENTRY,
    randomk::ENTRY,
    dithering::ENTRY,
    minmax::ENTRY,
    moniqua::ENTRY,
    powersgd::ENTRY,
];

/// The compressor named `name`.
pub fn lookup(name: &str) -> Option<&'static Entry> {
    COMPRESSORS.iter().find(|e| e.name == name)
}

/// Every key a map may hold: the chain's and the shared ones ([`KEYS`]), then each
/// compressor's own, in the table's order.
pub fn all_keys() -> impl Iterator<Item = &'static KeyInfo> {
    KEYS.iter()
        .chain(COMPRESSORS.iter().flat_map(|e| e.own_keys.iter()))
}

/// The key spelled `spelling` (its short name or an alias).
fn find_key(spelling: &str) -> Option<&'static KeyInfo> {
    all_keys().find(|k| k.name == spelling || k.aliases.contains(&spelling))
}

/// Overlays `top` on `base`, as a declared map overlays the cluster file's defaults: each key of
/// `top` replaces the value of its setting in `base` whatever the spelling there (so a declared
/// `byteps_compressor_type = "onebit"` replaces a default `compressor = "none"` instead of
/// conflicting with it). Keys that are not in [`all_keys`] are copied as they are (parsing names
/// them later).
pub fn overlay_params(base: &mut BTreeMap<String, String>, top: &BTreeMap<String, String>) {
    for (key, value) in top {
        if let Some(info) = find_key(key) {
            base.remove(info.name);
            for a in info.aliases {
                base.remove(*a);
            }
        }
        base.insert(key.clone(), value.clone());
    }
}

/// Builds the chain for gradient push_pull of one chunk of `len` elements, from the tensor's
/// parameter map (see the crate docs for the keys). Top-k/random-k counts are checked against
/// `len`; for a tensor's shorter last chunk use [`build_from_spec`] with
/// [`BuildOptions::full_chunk_len`].
pub fn build_compressor(
    params: &BTreeMap<String, String>,
    len: usize,
    who: &NodeIdentity,
) -> Result<Compressor> {
    let spec = parse_params(params)?;
    build_from_spec(&spec, len, who, BuildOptions::default())
}

/// Builds the chain `nesterov(ef(codec))` from a parsed spec: momentum only on workers (a
/// server ignores it), error feedback wherever configured.
pub fn build_from_spec(
    spec: &CompressorSpec,
    len: usize,
    who: &NodeIdentity,
    opts: BuildOptions,
) -> Result<Compressor> {
    let body = build_codec(spec, len, who, opts)?;
    let mu = spec.momentum_mu.filter(|_| who.role == Role::Worker);
    Ok(Compressor::of(body, spec.ef, mu))
}

/// Builds the codec alone, by its fast paths: the payload sizes of a chain, without the state
/// buffers of error feedback and momentum ([`Compressor::of`] with neither).
pub(crate) fn build_codec(
    spec: &CompressorSpec,
    len: usize,
    who: &NodeIdentity,
    opts: BuildOptions,
) -> Result<crate::chain::Body> {
    if len > u32::MAX as usize {
        return Err(KernelError::bad(
            "len",
            &len.to_string(),
            "a chunk holds at most 2^32 - 1 elements",
        ));
    }
    let base = CodecInfo::new(spec.codec.display_name(), len, who, spec.seed);
    spec.codec.build(base, &opts)
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
