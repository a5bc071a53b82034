//! `randomk`: k values at pseudo-random indices that every node draws identically.
//!
//! Indices: `idx_j = Permutation::new(n, Stream::indices(seed, key, round)).permute(j)` for
//! `j in 0..k` ([`crate::rng::Permutation`]): a function of `(seed, key, round, j)` only, the
//! same on every worker and on the server, so the wire carries values only. The draws are
//! **without replacement** (a permutation), so the k indices are distinct and no duplicates
//! need adding up.
//!
//! Wire format: `k` little-endian f32, `v_j = x[idx_j] * scale`, with `scale = n / k` (as f32,
//! `n as f32 / k as f32`) when `unbiased = true` on a worker and `1.0` otherwise. Size `4k`.
//! Decompress writes `v_j` at `idx_j` and zeros elsewhere; decompress-add adds. A value whose
//! scaling overflows f32 makes compress fail (`KernelError::Overflow`) instead of sending an
//! infinity.
//!
//! # The server side
//! The server's sum `y = Σ_w D(C(g_w))` is supported on the round's k indices and already holds
//! each worker's n/k scaling. A compressor built with [`crate::Role::Server`] therefore draws
//! the same indices and **never rescales** (`scale = 1` whatever `unbiased` says): its
//! `D(C(y))` is exactly `y` on the support, and the sum a worker pulls equals
//! `Σ_w D(C(g_w))` restricted to the common support. With server-side error feedback the
//! residual `e = p - D(C(p))` is `p` off the support (zero when the server's own residual is
//! zero).

use super::{prepare, scatter, subtract_at};
use crate::chain::{Body, Subtract};
use crate::codec::{Codec, CodecInfo, RoundCtx};
use crate::error::{KernelError, Result};
use crate::rng::{Permutation, Role, Stream};
use crate::spec::{BuildOptions, CodecSpec, Entry, KSpec, KeyInfo, Kind};
use pushpull_proto::placement::PayloadModel;
use rayon::prelude::*;
use std::sync::{Arc, Mutex};

/// The registry's `randomk`: `k` (required), `unbiased`.
pub const ENTRY: Entry = Entry {
    name: "randomk",
    keys: &["k"],
    own_keys: &[KeyInfo {
        name: "unbiased",
        aliases: &[],
        applies_to: "randomk",
        values: "true, false (true scales the k values by n/k on workers)",
        default: "false",
    }],
    parse: |keys| {
        Ok(Arc::new(RandomKSpec {
            k: keys.k(false)?,
            unbiased: keys.flag("unbiased", false)?,
        }))
    },
};

/// Random-k's settings: k values at indices every node draws alike.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomKSpec {
    /// k.
    pub k: KSpec,
    /// Scale by n/k on workers.
    pub unbiased: bool,
}

impl CodecSpec for RandomKSpec {
    fn kind(&self) -> Kind {
        Kind::new("randomk", true, false)
    }
    fn build(&self, base: CodecInfo, opts: &BuildOptions) -> Result<Body> {
        let len = base.n;
        let k = self
            .k
            .chunk_k(false, len, opts.full_chunk_len.unwrap_or(len))?;
        Ok(Body::Sparse(Box::new(RandomK::new(base, k, self.unbiased))))
    }
    fn payload(&self, _: u64) -> PayloadModel {
        PayloadModel {
            kept: Some(self.k.kept(false, 4)),
            ..PayloadModel::default()
        }
    }
    fn display_name(&self) -> String {
        format!("randomk(k={}, unbiased={})", self.k, self.unbiased)
    }
    fn params(&self, put: &mut dyn FnMut(&'static str, String)) {
        put("k", self.k.to_string());
        put("unbiased", self.unbiased.to_string());
    }
}

/// The random-k compressor.
pub(crate) struct RandomK {
    base: CodecInfo,
    k: usize,
    unbiased: bool,
    /// The indices of the last round computed (compress and decompress of one round, and the
    /// server's decompress-add of every push, share them).
    cache: Mutex<Option<(u64, Arc<Vec<u32>>)>>,
}

impl RandomK {
    pub fn new(base: CodecInfo, k: usize, unbiased: bool) -> RandomK {
        assert!(k <= base.n && base.n <= u32::MAX as usize);
        RandomK {
            base: base.sized(4 * k),
            k,
            unbiased,
            cache: Mutex::new(None),
        }
    }

    /// The scale applied on compress.
    fn scale(&self) -> f32 {
        if self.unbiased && self.base.role == Role::Worker && self.k > 0 {
            self.base.n as f32 / self.k as f32
        } else {
            1.0
        }
    }

    /// The k indices of `round`.
    pub(crate) fn indices(&self, round: u64) -> Arc<Vec<u32>> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((r, idx)) = cache.as_ref() {
            if *r == round {
                return idx.clone();
            }
        }
        let p = Permutation::new(
            self.base.n as u64,
            Stream::indices(self.base.seed, self.base.key, round),
        );
        let idx: Vec<u32> = if crate::par::enabled(self.k * 16) {
            (0..self.k)
                .into_par_iter()
                .with_min_len(4096)
                .map(|j| p.permute(j as u64) as u32)
                .collect()
        } else {
            (0..self.k as u64).map(|j| p.permute(j) as u32).collect()
        };
        let idx = Arc::new(idx);
        *cache = Some((round, idx.clone()));
        idx
    }

    fn check_payload(&self, payload: &[u8]) -> Result<(), KernelError> {
        self.base.check_payload(payload.len())?;
        if let Some(j) = payload
            .chunks_exact(4)
            .position(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite())
        {
            return Err(KernelError::malformed(
                &self.base.name,
                format!("value {j} is not finite"),
            ));
        }
        Ok(())
    }
}

/// The `(index, value)` pairs of a payload with its round's indices `idx`.
fn pairs<'a>(payload: &'a [u8], idx: &'a [u32]) -> impl Iterator<Item = (usize, f32)> + Clone + 'a {
    payload
        .chunks_exact(4)
        .zip(idx)
        .map(|(b, &i)| (i as usize, f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
}

impl Codec for RandomK {
    fn info(&self) -> &CodecInfo {
        &self.base
    }
    fn encode(&mut self, input: &[f32], ctx: &RoundCtx, out: &mut Vec<u8>) -> Result<()> {
        // Every element is checked, not only the k sent: under error feedback the others go
        // into the residual.
        self.base.require_finite(input)?;
        let idx = self.indices(ctx.round);
        let scale = self.scale();
        let dst = prepare(out, self.base.payload);
        let put = |d: &mut [u8], ix: &[u32]| {
            for (o, &i) in d.chunks_exact_mut(4).zip(ix) {
                o.copy_from_slice(&(input[i as usize] * scale).to_le_bytes());
            }
        };
        if crate::par::enabled(self.k * 8) {
            dst.par_chunks_mut(4 * 8192)
                .zip(idx.par_chunks(8192))
                .for_each(|(d, ix)| put(d, ix));
        } else {
            put(dst, &idx);
        }
        if scale != 1.0 {
            // x * n/k can overflow for |x| near f32::MAX: refuse rather than send infinities.
            if let Some(j) = dst
                .chunks_exact(4)
                .position(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite())
            {
                let i = idx[j] as usize;
                out.clear();
                return Err(KernelError::overflow(
                    &self.base.name,
                    format!(
                        "element {i} = {} times n/k = {scale} overflows f32",
                        input[i]
                    ),
                ));
            }
        }
        Ok(())
    }
    fn decode(&self, payload: &[u8], ctx: &RoundCtx, out: &mut [f32], add: bool) -> Result<()> {
        self.check_payload(payload)?;
        let idx = self.indices(ctx.round);
        scatter(out, pairs(payload, &idx), add);
        Ok(())
    }
}

impl Subtract for RandomK {
    fn subtract_decoded(&self, payload: &[u8], ctx: &RoundCtx, acc: &mut [f32]) -> Result<bool> {
        self.check_payload(payload)?;
        let idx = self.indices(ctx.round);
        Ok(subtract_at(acc, pairs(payload, &idx)))
    }
}
