//! The [`Codec`] trait, what a wire format implements; [`CodecInfo`], what it states about
//! itself as data; [`NodeIdentity`] (who draws) and [`RoundCtx`] (what a round brings).

use crate::error::{KernelError, Result};
use crate::rng::{Role, Stream};

/// A wire format bound to one chunk (one key): encodes a chunk into a payload, and decodes a
/// payload into the chunk or adds it to an accumulator. It keeps no state between rounds:
/// error feedback and momentum are the chain's ([`crate::Compressor`]), which also checks every
/// slice's length against [`CodecInfo::len`] before calling in, so an implementation may rely
/// on it.
pub trait Codec: Send {
    /// Its name, chunk length, payload size and the coordinates of its random draws.
    fn info(&self) -> &CodecInfo;
    /// Encodes `input` (`len` elements) into `out` (replacing its content); one round.
    fn encode(&mut self, input: &[f32], ctx: &RoundCtx, out: &mut Vec<u8>) -> Result<()>;
    /// Decodes `payload` into `out` (`add = false`) or adds it to `out` (`add = true`: bit for
    /// bit what decoding into a temporary followed by `out[i] += tmp[i]` gives); `out` holds
    /// `len` elements and is untouched when the payload is refused.
    fn decode(&self, payload: &[u8], ctx: &RoundCtx, out: &mut [f32], add: bool) -> Result<()>;
}

/// What a codec states about itself, as data: its name, chunk length, the largest payload it
/// writes, and the coordinates of its random draws.
#[derive(Debug, Clone)]
pub struct CodecInfo {
    pub(crate) name: String,
    pub(crate) n: usize,
    pub(crate) payload: usize,
    pub(crate) seed: u64,
    pub(crate) key: u64,
    pub(crate) role: Role,
    pub(crate) rank: u32,
}

impl CodecInfo {
    /// A codec's info before its payload size is known ([`CodecInfo::sized`]).
    pub(crate) fn new(name: String, n: usize, who: &NodeIdentity, seed: Option<u64>) -> Self {
        CodecInfo {
            name,
            n,
            payload: 0,
            seed: seed.unwrap_or(who.job_seed),
            key: who.key,
            role: who.role,
            rank: who.rank,
        }
    }

    /// The info of a codec written outside this crate (one that wraps another for a test, or
    /// a plug-in of a [`crate::CodecFactory`]): it draws with no identity of its own.
    pub fn custom(name: impl Into<String>, len: usize, max_payload: usize) -> Self {
        let who = NodeIdentity::worker(0, 0, 0);
        CodecInfo::new(name.into(), len, &who, None).sized(max_payload)
    }

    /// With its payload size.
    pub(crate) fn sized(mut self, payload: usize) -> Self {
        self.payload = payload;
        self
    }

    /// The codec's name, e.g. `topk(k=3)`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The chunk length it is bound to.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether the chunk is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The largest payload it writes for its chunk: the exact size for fixed-width formats,
    /// the bound for Elias-coded dithering.
    pub fn max_payload(&self) -> usize {
        self.payload
    }

    /// The stochastic-rounding stream of `round`.
    #[inline]
    pub(crate) fn rounding(&self, round: u64) -> Stream {
        Stream::rounding(self.seed, self.key, round, self.role, self.rank)
    }

    /// Checks a slice length against the chunk length.
    #[inline]
    pub(crate) fn check(&self, what: &'static str, len: usize) -> Result<()> {
        if len == self.n {
            Ok(())
        } else {
            Err(KernelError::len(&self.name, what, self.n, len))
        }
    }

    /// Checks a payload's length against the exact size.
    #[inline]
    pub(crate) fn check_payload(&self, actual: usize) -> Result<()> {
        if self.payload == actual {
            Ok(())
        } else {
            Err(KernelError::payload_exact(&self.name, self.payload, actual))
        }
    }

    /// The error for an input known to hold a non-finite element.
    pub(crate) fn non_finite(&self, x: &[f32]) -> KernelError {
        match x.iter().position(|v| !v.is_finite()) {
            Some(i) => KernelError::NonFinite {
                compressor: self.name.clone(),
                what: "input",
                index: i,
                value: x[i],
            },
            None => KernelError::overflow(&self.name, "input statistics overflow f32"),
        }
    }

    /// `Err(non_finite)` if some element of `x` is NaN or infinite.
    pub(crate) fn require_finite(&self, x: &[f32]) -> Result<()> {
        match crate::simd::first_non_finite(x) {
            None => Ok(()),
            Some(_) => Err(self.non_finite(x)),
        }
    }
}

/// Who is compressing: the coordinates of every random draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeIdentity {
    /// The job seed (the configured one, or the scheduler's pick); a tensor's `seed` key
    /// replaces it for that tensor.
    pub job_seed: u64,
    /// The chunk's key.
    pub key: u64,
    /// Worker or server.
    pub role: Role,
    /// The worker's rank, or the server's id.
    pub rank: u32,
}

impl NodeIdentity {
    /// A worker's identity.
    pub fn worker(job_seed: u64, key: u64, rank: u32) -> NodeIdentity {
        NodeIdentity {
            job_seed,
            key,
            role: Role::Worker,
            rank,
        }
    }

    /// A server's identity.
    pub fn server(job_seed: u64, key: u64, server_id: u32) -> NodeIdentity {
        NodeIdentity {
            job_seed,
            key,
            role: Role::Server,
            rank: server_id,
        }
    }
}

/// What one round of compress or decompress needs besides the data.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RoundCtx<'a> {
    /// The round number (push_pull count of this key); part of every random draw.
    pub round: u64,
    /// This round's learning rate η_t; required by `ef=corrected`, ignored otherwise.
    pub lr: Option<f32>,
    /// Moniqua's reference values (the receiver's own copy, `len` elements): required by its
    /// decompress and decompress-add, ignored by every other compressor.
    pub reference: Option<&'a [f32]>,
    /// Moniqua's a-priori bound from its Theorem 2 for this round on this worker,
    /// `2·α_k·G·ln(16n)/(1 − ρ)` (`α_k` the round's learning rate, `G` the bound of the
    /// tensor's gradients the worker has tracked, `n` workers, `ρ` the mixing matrix's
    /// spectral gap): required to encode with `theta_schedule = bound`, ignored otherwise.
    pub theta_bound: Option<f64>,
}

impl<'a> RoundCtx<'a> {
    /// The context of round `round`, with no learning rate and no reference.
    pub fn new(round: u64) -> RoundCtx<'a> {
        RoundCtx {
            round,
            lr: None,
            reference: None,
            theta_bound: None,
        }
    }

    /// With a learning rate.
    pub fn with_lr(mut self, lr: f32) -> RoundCtx<'a> {
        self.lr = Some(lr);
        self
    }

    /// With a reference.
    pub fn with_reference(mut self, reference: &'a [f32]) -> RoundCtx<'a> {
        self.reference = Some(reference);
        self
    }
}
