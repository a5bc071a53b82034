//! The registry: from a tensor's string map (or a parsed [`CompressorSpec`]) to the whole chain
//! `nesterov(ef(codec))` ([`Compressor`]).

use crate::chain::Body;
use crate::codecs::{
    cast::{Cast, CastCodec},
    dithering::Dithering,
    minmax::MinMax,
    moniqua::Moniqua,
    onebit::OneBit,
    onebit_col::OneBitColumns,
    randomk::RandomK,
    topk::TopK,
};
use crate::error::KernelError;
use crate::params::{parse_params, CodecSpec, CompressorSpec};
use crate::rng::Role;
use crate::{CodecInfo, Compressor, NodeIdentity};
use std::collections::BTreeMap;

/// What the values being compressed are; some compressors only make sense for one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Purpose {
    /// Gradients in push_pull (the default). Moniqua is refused: it needs a reference within
    /// θ of the values, which gradients do not have.
    #[default]
    Gradient,
    /// Model parameters in decentralised averaging (`exchange = "gossip"`, Moniqua's setting:
    /// the reference is the receiver's own parameters).
    ModelAveraging,
}

/// Options of [`build_from_spec`] beyond the chunk length and identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BuildOptions {
    /// What is compressed.
    pub purpose: Purpose,
    /// Length of the tensor's full-size chunks when this chunk may be shorter (the tensor's
    /// last chunk); `None` means this chunk is full-size. Top-k's and random-k's count `k` is
    /// validated against it and scaled down for a shorter chunk
    /// ([`CompressorSpec::chunk_k`]).
    pub full_chunk_len: Option<usize>,
}

/// Builds the chain for gradient push_pull of one chunk of `len` elements, from the tensor's
/// parameter map (see the crate docs for the keys). Top-k/random-k counts are checked against
/// `len`; for a tensor's shorter last chunk use [`build_from_spec`] with
/// [`BuildOptions::full_chunk_len`].
pub fn build_compressor(
    params: &BTreeMap<String, String>,
    len: usize,
    who: &NodeIdentity,
) -> Result<Compressor, KernelError> {
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
) -> Result<Compressor, KernelError> {
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
) -> Result<Body, KernelError> {
    if len > u32::MAX as usize {
        return Err(KernelError::bad(
            "len",
            &len.to_string(),
            "a chunk holds at most 2^32 - 1 elements",
        ));
    }
    let full = opts.full_chunk_len.unwrap_or(len);
    let k = spec.chunk_k(len, full)?;
    let name = spec.codec.display_name();
    let base = CodecInfo::new(name, len, who, spec.seed);
    Ok(match spec.codec {
        CodecSpec::None => Body::Plain(Box::new(CastCodec::new(base, Cast::None))),
        CodecSpec::Fp16 => Body::Plain(Box::new(CastCodec::new(base, Cast::Fp16))),
        CodecSpec::Bf16 => Body::Plain(Box::new(CastCodec::new(base, Cast::Bf16))),
        CodecSpec::OneBit { scaling } => Body::Fused(Box::new(OneBit::new(base, scaling))),
        CodecSpec::OneBitColumns {
            columns,
            chunk_columns,
        } => Body::Plain(Box::new(OneBitColumns::new(
            base,
            chunk_columns.unwrap_or(columns),
        ))),
        CodecSpec::TopK { .. } => Body::Sparse(Box::new(TopK::new(base, k.expect("topk has k")))),
        CodecSpec::RandomK { unbiased, .. } => Body::Sparse(Box::new(RandomK::new(
            base,
            k.expect("randomk has k"),
            unbiased,
        ))),
        CodecSpec::Dithering {
            s,
            partition,
            normalize,
            bucket,
            encoding,
        } => Body::Plain(Box::new(Dithering::new(
            base, s, partition, normalize, encoding, bucket,
        ))),
        CodecSpec::MinMax { bits, bucket } => {
            Body::Plain(Box::new(MinMax::new(base, bits, bucket)))
        }
        CodecSpec::Moniqua {
            theta,
            bits,
            rounding,
            schedule,
            hash,
        } => {
            if opts.purpose == Purpose::Gradient {
                return Err(KernelError::Refused {
                    compressor: base.name,
                    why: "moniqua cannot compress gradients for push_pull: it sends values \
                          modulo B_theta and needs a reference within theta of them on the \
                          receiver, which only decentralised averaging has: declare the \
                          model's parameters with exchange = \"gossip\" (and keep another \
                          compressor for gradients)"
                        .into(),
                });
            }
            Body::Plain(Box::new(Moniqua::new(
                base, theta, bits, rounding, schedule, hash,
            )))
        }
    })
}
