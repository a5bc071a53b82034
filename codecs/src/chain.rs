//! The chain: one [`Compressor`] per chunk, owning a codec and all the state around it.
//!
//! A chain is `nesterov(ef(codec))` with each layer optional: Nesterov momentum (workers
//! only), then error feedback, then the codec ([`crate::Codec`]), built by the registry
//! ([`crate::build_from_spec`]). The codec is stateless between rounds; the chain keeps the
//! rest (the residual, the momentum, the previous learning rate, what undoing the last round
//! restores, the checkpoint), once, so nothing forwards state through layers.
//!
//! State changes only when a whole round succeeds: a round that fails (non-finite input, an
//! overflow, a bad context) leaves the state as it was and no payload in `out`. A successful
//! round computes the new state into a second buffer and swaps it in, so the state before it
//! stays there until the next round and [`Compressor::undo`] swaps it back.
//!
//! # Fast paths
//! Chosen when the chain is built, by the codec's concrete type ([`Body`]), not asked for
//! round by round: a sparse codec (top-k, random-k) subtracts its decoding from error
//! feedback's input in place instead of decoding a whole chunk ([`Subtract`]); onebit also
//! forms error feedback's input, and momentum's step before it, in its sign-and-sum pass
//! ([`EncodeFed`]). For the other codecs momentum's step and error feedback's `p = g + e` are
//! one pass before the codec's encoding. Every path gives the bits of taking the passes one by
//! one; where a fused pass meets a non-finite value, the passes one by one name it.

use crate::codec::{Codec, RoundCtx};
use crate::error::{KernelError, Result};
use pushpull_proto::checkpoint::ChainState;

mod passes;
use passes::{add_scaled, nesterov, nesterov_fed, sub_into};

/// Error feedback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EfKind {
    /// `p = g + e; e ← p − D(C(p))`.
    Vanilla,
    /// `p = g + (η_{t−1}/η_t)·e; e ← p − D(C(p))`, η from [`RoundCtx::lr`].
    Corrected,
}

impl EfKind {
    /// Its value of the `ef` key.
    pub fn name(self) -> &'static str {
        match self {
            EfKind::Vanilla => "vanilla",
            EfKind::Corrected => "corrected",
        }
    }
}

/// A codec that can subtract its decoding in place: `acc = acc - decode(payload)` bit for bit,
/// without decoding into a buffer, and whether every element of `acc` is finite afterwards.
/// Top-k and random-k subtract on their support only (off it `a - 0.0 == a` for every `a`,
/// `-0.0` included); onebit adds its decoding with the scale negated (`a - v == a + (-v)`
/// exactly, signed zeros included). `acc` holds the chunk's length; on `Err` it may be partly
/// changed.
pub trait Subtract: Codec {
    /// `acc = acc - decode(payload)`; whether every element of `acc` is finite.
    fn subtract_decoded(&self, payload: &[u8], ctx: &RoundCtx, acc: &mut [f32]) -> Result<bool>;
}

/// A codec that forms error feedback's input while it encodes it (onebit): the payload, `p`
/// and a [`Nesterov`] step's `next` are those of taking the passes one by one. `Ok(false)`
/// when some element of `p` or of `next` is not finite: `p` and `next` are then whole, `out`
/// empty, and the chain names the element by taking the passes one by one. Every slice holds
/// the chunk's length.
pub trait EncodeFed: Subtract {
    /// Encodes error feedback's input `p` (formed from `fed` into `p`) into `out`; whether
    /// every element of `p` and of the momentum's `next` is finite.
    fn encode_fed(
        &mut self,
        fed: Fed<'_>,
        p: &mut [f32],
        ctx: &RoundCtx,
        out: &mut Vec<u8>,
    ) -> Result<bool>;
}

/// A chain's codec, by what it can do beyond [`Codec`]: its fast paths.
pub enum Body {
    /// Encodes and decodes only.
    Plain(Box<dyn Codec>),
    /// Also subtracts its decoding in place.
    Sparse(Box<dyn Subtract>),
    /// Also forms error feedback's input as it encodes.
    Fused(Box<dyn EncodeFed>),
}

impl Body {
    fn codec(&self) -> &dyn Codec {
        match self {
            Body::Plain(c) => c.as_ref(),
            Body::Sparse(c) => c.as_ref(),
            Body::Fused(c) => c.as_ref(),
        }
    }

    fn codec_mut(&mut self) -> &mut dyn Codec {
        match self {
            Body::Plain(c) => c.as_mut(),
            Body::Sparse(c) => c.as_mut(),
            Body::Fused(c) => c.as_mut(),
        }
    }
}

/// Error feedback's codec input, formed by a codec as it encodes ([`EncodeFed`]): `p = g +
/// residual` (vanilla) or `g + factor · residual` ([`crate::elem::fed`]), where `g` is the
/// gradient, or with Nesterov momentum before error feedback the momentum's output for it.
#[derive(Debug)]
pub struct Fed<'a> {
    /// The round's gradient.
    pub gradient: &'a [f32],
    /// Nesterov momentum between the gradient and error feedback, when the chain has it.
    pub nesterov: Option<Nesterov<'a>>,
    /// The residual carried from the last round.
    pub residual: &'a [f32],
    /// The residual's factor (corrected error feedback: η_{t−1}/η_t).
    pub factor: f32,
    /// Vanilla error feedback: the factor is not applied.
    pub vanilla: bool,
}

/// Nesterov momentum's step: for a gradient `g`, `next ← μ·m + g` and the input handed on is
/// `g + μ·next` ([`crate::elem::nesterov`]); `momentum` itself is not changed.
#[derive(Debug)]
pub struct Nesterov<'a> {
    /// The momentum `m` carried from the last round.
    pub momentum: &'a [f32],
    /// μ.
    pub mu: f32,
    /// Where the next momentum goes (the chain commits it if the round succeeds).
    pub next: &'a mut [f32],
}

/// A compressor bound to one chunk (one key): a codec, with error feedback and Nesterov
/// momentum when configured, and their state (see the module docs). Each call to
/// [`Compressor::compress`] is one round; every payload is decoded with the codec.
pub struct Compressor {
    name: String,
    body: Body,
    ef: Option<Feedback>,
    momentum: Option<Velocity>,
    /// The last round committed and not undone, and what undoing it restores.
    undo: Option<Undo>,
}

/// Error feedback: `p = g + e` (vanilla) or `p = g + (η_{t−1}/η_t)·e` (corrected), send
/// `C(p)`, keep `e ← p − D(C(p))`.
///
/// The residual is computed from the bytes actually sent: `e = fl(p − D(C(p)))` bit for bit,
/// with `D` the codec's decoding (with the same [`RoundCtx`]). For `corrected`,
/// `RoundCtx::lr` must hold the learning rate η_t of every round (finite, > 0): the factor is
/// `η_{t−1} / η_t` computed in f32 (1 in the first round), and `p = g + factor * e` in f32.
struct Feedback {
    kind: EfKind,
    /// `ef(kind, codec)`: what its errors name.
    name: String,
    e: Vec<f32>,
    p: Vec<f32>,
    d: Vec<f32>,
    prev_lr: Option<f32>,
}

/// Nesterov momentum: `m ← μ·m + g; p ← g + μ·m` (with the new `m`), then compress `p`.
///
/// The training code's own optimizer momentum must then be 0 (the RFC's precaution 4: this is
/// dist-EF-SGDM, where momentum comes before compression). Built on workers only.
struct Velocity {
    mu: f32,
    m: Vec<f32>,
    /// The next round's `m`, computed with `p` and swapped in when the round succeeds (then
    /// the momentum before the round, until the next one).
    next: Vec<f32>,
    p: Vec<f32>,
}

/// What undoing the last committed round restores.
struct Undo {
    round: u64,
    /// Error feedback's: where the residual before the round is.
    residual: Option<ResidualUndo>,
}

/// The residual before a round is in `p` (`in_p`) or `d`; the learning rate it kept.
#[derive(Clone, Copy)]
struct ResidualUndo {
    in_p: bool,
    prev_lr: Option<f32>,
}

impl Compressor {
    /// A chain of `codec` alone: it compresses with the codec's encoding and has no state.
    pub fn new(codec: Box<dyn Codec>) -> Compressor {
        Compressor::of(Body::Plain(codec), None, None)
    }

    /// `nesterov(mu, ef(kind, body))`, each layer where given.
    pub(crate) fn of(body: Body, ef: Option<EfKind>, mu: Option<f32>) -> Compressor {
        let n = body.codec().info().len();
        let mut name = body.codec().info().name().to_string();
        let ef = ef.map(|kind| {
            name = format!("ef({}, {name})", kind.name());
            Feedback {
                kind,
                name: name.clone(),
                e: vec![0.0; n],
                p: vec![0.0; n],
                d: vec![0.0; n],
                prev_lr: None,
            }
        });
        let momentum = mu.map(|mu| {
            name = format!("nesterov(mu={mu}, {name})");
            Velocity {
                mu,
                m: vec![0.0; n],
                next: vec![0.0; n],
                p: vec![0.0; n],
            }
        });
        Compressor {
            name,
            body,
            ef,
            momentum,
            undo: None,
        }
    }

    /// The codec: what every payload is decoded with.
    pub fn codec(&self) -> &dyn Codec {
        self.body.codec()
    }

    /// The chain's name, e.g. `ef(vanilla, topk(k=3))`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The chunk length it is bound to.
    pub fn len(&self) -> usize {
        self.codec().info().len()
    }

    /// Whether the chunk is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The largest payload compress can produce for this chunk length (the exact size for
    /// fixed-width formats; [`crate::CodecInfo::max_payload`]).
    pub fn max_compressed_len(&self) -> usize {
        self.codec().info().max_payload()
    }

    /// `Err` unless `len` is the chunk's length; `what` names the slice.
    fn check(&self, what: &'static str, len: usize) -> Result<()> {
        let n = self.len();
        if len == n {
            Ok(())
        } else {
            Err(KernelError::len(&self.name, what, n, len))
        }
    }

    /// Compresses `input` (`len` elements) into `out` (replacing its content); one round.
    /// A refused round leaves no payload and the state unchanged.
    pub fn compress(&mut self, input: &[f32], ctx: &RoundCtx, out: &mut Vec<u8>) -> Result<()> {
        // Whatever happens below may overwrite the state before the last round.
        self.undo = None;
        let done = self.round(input, ctx, out);
        match done {
            Ok(residual) => {
                if self.momentum.is_some() || residual.is_some() {
                    self.undo = Some(Undo {
                        round: ctx.round,
                        residual,
                    });
                }
                Ok(())
            }
            Err(e) => {
                out.clear();
                Err(e)
            }
        }
    }

    /// One round, committing its state; error feedback's undo when it has some.
    fn round(
        &mut self,
        input: &[f32],
        ctx: &RoundCtx,
        out: &mut Vec<u8>,
    ) -> Result<Option<ResidualUndo>> {
        self.check("input", input.len())?;
        let Compressor {
            name,
            body,
            ef,
            momentum,
            ..
        } = self;
        let Some(v) = momentum else {
            return match ef {
                Some(ef) => ef.round(body, input, ctx, out).map(Some),
                None => body.codec_mut().encode(input, ctx, out).map(|()| None),
            };
        };
        // A chain that takes the momentum's step in error feedback's pass (onebit's, or the
        // generic one) saves one over the chunk; where that pass fails, one pass at a time,
        // which names the error.
        let fused = ef.as_mut().and_then(|ef| {
            let step = Nesterov {
                momentum: &v.m,
                mu: v.mu,
                next: &mut v.next,
            };
            ef.nesterov_round(body, input, step, ctx, out)
        });
        let residual = match fused {
            Some(done) => Some(done?),
            None => {
                if !nesterov(input, &v.m, v.mu, &mut v.next, &mut v.p) {
                    if let Some(err) = first_bad(name, "input", input) {
                        return Err(err);
                    }
                    return Err(KernelError::overflow(
                        name.as_str(),
                        "the momentum update overflows f32",
                    ));
                }
                match ef {
                    Some(ef) => Some(ef.round(body, &v.p, ctx, out)?),
                    None => {
                        body.codec_mut().encode(&v.p, ctx, out)?;
                        None
                    }
                }
            }
        };
        // Commit the new momentum only once the round succeeded.
        std::mem::swap(&mut v.m, &mut v.next);
        Ok(residual)
    }

    /// Decodes `payload` into `out` (`len` elements).
    pub fn decompress(&self, payload: &[u8], ctx: &RoundCtx, out: &mut [f32]) -> Result<()> {
        self.check("output", out.len())?;
        self.codec().decode(payload, ctx, out, false)
    }

    /// Decodes `payload` and adds it to `acc` (`len` elements): bit for bit the same as
    /// decompress into a temporary followed by `acc[i] += tmp[i]`, so a server can sum pushes
    /// without a temporary. A failed decompress leaves `acc` untouched.
    pub fn decompress_add(&self, payload: &[u8], ctx: &RoundCtx, acc: &mut [f32]) -> Result<()> {
        self.check("accumulator", acc.len())?;
        self.codec().decode(payload, ctx, acc, true)
    }

    /// The error-feedback residual, if the chain has error feedback.
    pub fn residual(&self) -> Option<&[f32]> {
        self.ef.as_ref().map(|ef| &ef.e[..])
    }

    /// The momentum buffer, if the chain has momentum.
    pub fn momentum(&self) -> Option<&[f32]> {
        self.momentum.as_ref().map(|v| &v.m[..])
    }

    /// Zeroes the state (residual, momentum, previous learning rate): the chain of a worker
    /// that starts fresh.
    pub fn reset(&mut self) {
        if let Some(ef) = &mut self.ef {
            ef.e.fill(0.0);
            ef.prev_lr = None;
        }
        if let Some(v) = &mut self.momentum {
            v.m.fill(0.0);
        }
        self.undo = None;
    }

    /// The state that later rounds depend on (residual, momentum, previous learning rate), for
    /// a checkpoint: empty for a chain of a codec alone.
    pub fn state(&self) -> ChainState {
        ChainState {
            residual: self.ef.as_ref().map(|ef| ef.e.clone()),
            prev_lr: self.ef.as_ref().and_then(|ef| ef.prev_lr),
            momentum: self.momentum.as_ref().map(|v| v.m.clone()),
        }
    }

    /// Restores [`Compressor::state`] of a chain built alike (same parameters and length);
    /// what a round could undo is forgotten. Refuses, naming the chain and what differs, a
    /// state with a part this chain lacks or without one it has, or of another length; the
    /// state is then unchanged.
    pub fn set_state(&mut self, state: &ChainState) -> Result<()> {
        let n = self.len();
        let parts = [
            (
                &state.momentum,
                self.momentum.is_some(),
                "a ",
                "momentum buffer",
                "saved momentum",
            ),
            (
                &state.residual,
                self.ef.is_some(),
                "an ",
                "error-feedback residual",
                "saved residual",
            ),
        ];
        let (mut extra, mut missing) = (Vec::new(), Vec::new());
        for (part, kept, article, what, saved) in parts {
            match (part, kept) {
                (Some(_), false) => extra.push(format!("{article}{what}")),
                (None, true) => missing.push(format!("no {what}")),
                (Some(v), true) if v.len() != n => {
                    return Err(KernelError::len(&self.name, saved, n, v.len()))
                }
                _ => {}
            }
        }
        if !extra.is_empty() {
            return Err(self.refuse(format!(
                "the saved state has {}, which this chain does not keep",
                extra.join(" and ")
            )));
        }
        if !missing.is_empty() {
            return Err(self.refuse(format!(
                "the saved state has {}, which this chain keeps",
                missing.join(" and ")
            )));
        }
        if let Some(lr) = state.prev_lr {
            match &self.ef {
                Some(ef) if ef.kind == EfKind::Corrected => {}
                _ => {
                    return Err(self.refuse(
                        "the saved state has a previous learning rate, which this chain does \
                         not keep (only corrected error feedback does)",
                    ))
                }
            }
            if !(lr.is_finite() && lr > 0.0) {
                return Err(self.refuse(format!(
                    "the saved previous learning rate {lr} is not finite and > 0"
                )));
            }
        }
        if let (Some(ef), Some(e)) = (&mut self.ef, &state.residual) {
            ef.e.copy_from_slice(e);
            ef.prev_lr = state.prev_lr;
        }
        if let (Some(v), Some(m)) = (&mut self.momentum, &state.momentum) {
            v.m.copy_from_slice(m);
        }
        self.undo = None;
        Ok(())
    }

    fn refuse(&self, detail: impl Into<String>) -> KernelError {
        KernelError::context(&self.name, detail)
    }

    /// Undoes round `round`'s change of the state (residual, momentum, previous learning
    /// rate), if `round` is the last round compressed successfully and it was not undone yet;
    /// otherwise (that round failed, was never compressed here, or a later one was) does
    /// nothing. For a round whose result is discarded: a non-finite sum, or an optimizer step
    /// that was skipped (mixed precision's loss scaler found inf/NaN).
    pub fn undo(&mut self, round: u64) {
        let Some(u) = self.undo.take_if(|u| u.round == round) else {
            return;
        };
        if let (Some(ef), Some(r)) = (&mut self.ef, u.residual) {
            let old = if r.in_p { &mut ef.p } else { &mut ef.d };
            std::mem::swap(&mut ef.e, old);
            ef.prev_lr = r.prev_lr;
        }
        if let Some(v) = &mut self.momentum {
            std::mem::swap(&mut v.m, &mut v.next);
        }
    }
}

impl std::fmt::Debug for Compressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compressor")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Feedback {
    /// The residual's factor this round and the learning rate to keep (`corrected`), or why
    /// the round's context is refused.
    fn factor(&self, ctx: &RoundCtx) -> Result<(f32, Option<f32>)> {
        let (factor, lr) = match self.kind {
            EfKind::Vanilla => (1.0f32, None),
            EfKind::Corrected => {
                let lr = ctx.lr.ok_or_else(|| {
                    KernelError::context(
                        &self.name,
                        "corrected error feedback needs the learning rate of this round in \
                         RoundCtx::lr",
                    )
                })?;
                if !(lr.is_finite() && lr > 0.0) {
                    return Err(KernelError::context(
                        &self.name,
                        format!("learning rate {lr} in RoundCtx::lr must be finite and > 0"),
                    ));
                }
                (self.prev_lr.map(|p| p / lr).unwrap_or(1.0), Some(lr))
            }
        };
        if !factor.is_finite() {
            return Err(KernelError::context(
                &self.name,
                format!("learning-rate ratio {factor} is not finite"),
            ));
        }
        Ok((factor, lr))
    }

    /// One round on `input`: `p` formed (by the codec as it encodes, where it can), encoded,
    /// and the residual kept.
    fn round(
        &mut self,
        body: &mut Body,
        input: &[f32],
        ctx: &RoundCtx,
        out: &mut Vec<u8>,
    ) -> Result<ResidualUndo> {
        let (factor, lr) = self.factor(ctx)?;
        let vanilla = self.kind == EfKind::Vanilla;
        let (finite, encoded) = match body {
            Body::Fused(codec) => {
                let fed = Fed {
                    gradient: input,
                    nesterov: None,
                    residual: &self.e,
                    factor,
                    vanilla,
                };
                (codec.encode_fed(fed, &mut self.p, ctx, out)?, true)
            }
            _ => (
                add_scaled(input, &self.e, factor, vanilla, &mut self.p),
                false,
            ),
        };
        if !finite {
            if let Some(err) = first_bad(&self.name, "input", input) {
                return Err(err);
            }
            let i = self.p.iter().position(|v| !v.is_finite()).unwrap_or(0);
            return Err(KernelError::overflow(
                &self.name,
                format!(
                    "element {i}: gradient {} plus residual {} overflows f32",
                    input[i], self.e[i]
                ),
            ));
        }
        if !encoded {
            body.codec_mut().encode(&self.p, ctx, out)?;
        }
        self.keep_residual(body, ctx, lr, out)
    }

    /// Momentum's step, `p` and the encoding in one pass (onebit's, or the generic one before
    /// the codec's encoding); `None` where a setting or a value makes the round fail: then
    /// `out` is empty, the state unchanged, and the caller takes the passes one by one.
    fn nesterov_round(
        &mut self,
        body: &mut Body,
        input: &[f32],
        step: Nesterov<'_>,
        ctx: &RoundCtx,
        out: &mut Vec<u8>,
    ) -> Option<Result<ResidualUndo>> {
        out.clear();
        let (factor, lr) = self.factor(ctx).ok()?;
        let vanilla = self.kind == EfKind::Vanilla;
        let Nesterov { momentum, mu, next } = step;
        let encoded = match body {
            Body::Fused(codec) => {
                let fed = Fed {
                    gradient: input,
                    nesterov: Some(Nesterov {
                        momentum,
                        mu,
                        next: &mut *next,
                    }),
                    residual: &self.e,
                    factor,
                    vanilla,
                };
                matches!(codec.encode_fed(fed, &mut self.p, ctx, out), Ok(true))
            }
            _ => {
                let e = &self.e;
                nesterov_fed(input, momentum, mu, next, e, factor, vanilla, &mut self.p)
                    && body.codec_mut().encode(&self.p, ctx, out).is_ok()
            }
        };
        if !encoded {
            out.clear();
            return None;
        }
        Some(self.keep_residual(body, ctx, lr, out))
    }

    /// After `p` (in `self.p`) was encoded into `out`: `e ← p − D(C(p))`, or the new residual's
    /// overflow (no payload then, the state unchanged).
    fn keep_residual(
        &mut self,
        body: &Body,
        ctx: &RoundCtx,
        lr: Option<f32>,
        out: &mut Vec<u8>,
    ) -> Result<ResidualUndo> {
        // e <- p - D(C(p)), committed only when finite: in place where the codec subtracts its
        // decoding (the same bits, without decoding a whole chunk); otherwise computed in `d`.
        let in_place = match body {
            Body::Plain(_) => None,
            Body::Sparse(c) => Some(c.subtract_decoded(out, ctx, &mut self.p)),
            Body::Fused(c) => Some(c.subtract_decoded(out, ctx, &mut self.p)),
        };
        let (new_e, finite, in_p) = match in_place {
            Some(res) => (&mut self.p, res?, true),
            None => {
                body.codec().decode(out, ctx, &mut self.d, false)?;
                let finite = sub_into(&self.p, &mut self.d);
                (&mut self.d, finite, false)
            }
        };
        if !finite {
            let i = new_e.iter().position(|v| !v.is_finite()).unwrap_or(0);
            out.clear();
            return Err(KernelError::overflow(
                &self.name,
                format!("element {i}: the new residual p - D(C(p)) overflows f32"),
            ));
        }
        std::mem::swap(&mut self.e, new_e);
        let undo = ResidualUndo {
            in_p,
            prev_lr: self.prev_lr,
        };
        if lr.is_some() {
            self.prev_lr = lr;
        }
        Ok(undo)
    }
}

fn first_bad(name: &str, what: &'static str, g: &[f32]) -> Option<KernelError> {
    crate::simd::first_non_finite(g).map(|i| KernelError::NonFinite {
        compressor: name.to_string(),
        what,
        index: i,
        value: g[i],
    })
}
