//! Decorators: error feedback and Nesterov momentum, wrapping any [`Compressor`].
//!
//! The registry builds `Momentum(ErrorFeedback(codec))` (momentum on workers only). Both keep
//! one state vector per chunk and change it only when the whole round succeeds: a round that
//! fails (non-finite input, an overflow, a bad context) leaves the state as it was. A
//! successful round computes the new state into a second buffer and swaps it in, so the state
//! before it stays there until the next round and [`Compressor::undo`] swaps it back.
//! A refused round also leaves no payload in `out`, whichever pass refused it. They implement
//! compression and their state; everything else (the length, payload sizes, decoding) is the
//! codec's, reached through [`Compressor::codec`].

use crate::error::KernelError;
use crate::params::EfKind;
use crate::simd::multiversion;
use crate::{ChainState, Codec, Compressor, Fed, Nesterov, RoundCtx};

/// Error feedback: `p = g + e` (vanilla) or `p = g + (η_{t−1}/η_t)·e` (corrected), send
/// `C(p)`, keep `e ← p − D(C(p))`.
///
/// The residual is computed from the bytes actually sent: `e = fl(p − D(C(p)))` bit for bit,
/// with `D` the wrapped compressor's decompress (with the same [`RoundCtx`]). For `corrected`,
/// `RoundCtx::lr` must hold the learning rate η_t of every round (finite, > 0): the factor is
/// `η_{t−1} / η_t` computed in f32 (1 in the first round), and `p = g + factor * e` in f32.
pub struct ErrorFeedback {
    inner: Box<dyn Compressor>,
    kind: EfKind,
    name: String,
    e: Vec<f32>,
    p: Vec<f32>,
    d: Vec<f32>,
    prev_lr: Option<f32>,
    /// The last round committed and not undone, and what undoing it restores.
    undo: Option<EfUndo>,
}

/// What [`ErrorFeedback`] needs to undo its last round.
struct EfUndo {
    round: u64,
    /// The residual before the round is in `p` (`true`) or `d` (`false`).
    in_p: bool,
    prev_lr: Option<f32>,
}

impl ErrorFeedback {
    /// Wraps `inner` with a zero residual.
    pub fn new(inner: Box<dyn Compressor>, kind: EfKind) -> ErrorFeedback {
        let n = inner.len();
        let k = match kind {
            EfKind::Vanilla => "vanilla",
            EfKind::Corrected => "corrected",
        };
        ErrorFeedback {
            name: format!("ef({k}, {})", inner.name()),
            inner,
            kind,
            e: vec![0.0; n],
            p: vec![0.0; n],
            d: vec![0.0; n],
            prev_lr: None,
            undo: None,
        }
    }

    /// The residual's factor this round and the learning rate to keep (`corrected`), or why
    /// the round's context is refused.
    fn factor(&self, ctx: &RoundCtx) -> Result<(f32, Option<f32>), KernelError> {
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

    /// After `p` (in `self.p`) was compressed into `out`: `e ← p − D(C(p))` and the round's
    /// commit, or the new residual's overflow (no payload then, the state unchanged).
    fn keep_residual(
        &mut self,
        ctx: &RoundCtx,
        lr: Option<f32>,
        out: &mut Vec<u8>,
    ) -> Result<(), KernelError> {
        // e <- p - D(C(p)), committed only when finite: for a sparse payload (top-k,
        // random-k) subtracted in place on its support, which is the same bits and saves
        // decoding a whole chunk and subtracting it; otherwise computed in `d`.
        let (new_e, finite, in_p) = match self.inner.codec().subtract_decoded(out, ctx, &mut self.p)
        {
            Some(res) => (&mut self.p, res?, true),
            None => {
                self.inner.decompress(out, ctx, &mut self.d)?;
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
        self.undo = Some(EfUndo {
            round: ctx.round,
            in_p,
            prev_lr: self.prev_lr,
        });
        if lr.is_some() {
            self.prev_lr = lr;
        }
        Ok(())
    }

    /// One round of [`Compressor::compress`] (which leaves no payload when it fails).
    fn round(
        &mut self,
        input: &[f32],
        ctx: &RoundCtx,
        out: &mut Vec<u8>,
    ) -> Result<(), KernelError> {
        let n = self.e.len();
        // Whatever happens below may overwrite the state before the last round.
        self.undo = None;
        if input.len() != n {
            return Err(KernelError::len(&self.name, "input", n, input.len()));
        }
        let (factor, lr) = self.factor(ctx)?;
        let vanilla = self.kind == EfKind::Vanilla;
        // A codec that forms p while encoding (onebit) saves a pass over it.
        let fed = Fed {
            gradient: input,
            nesterov: None,
            residual: &self.e,
            factor,
            vanilla,
        };
        let fused = self
            .inner
            .codec_mut()
            .and_then(|codec| codec.compress_fed(fed, &mut self.p, ctx, out));
        let (finite, encoded) = match fused {
            Some(encoded) => (encoded?, true),
            None => (
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
            self.inner.compress(&self.p, ctx, out)?;
        }
        self.keep_residual(ctx, lr, out)
    }
}

#[inline(always)]
fn add_scaled_impl(g: &[f32], e: &[f32], f: f32, vanilla: bool, p: &mut [f32]) -> bool {
    let mut bad = 0u32;
    for ((pi, gi), ei) in p.iter_mut().zip(g).zip(e) {
        let v = crate::elem::fed(*gi, *ei, f, vanilla);
        bad |= ((v.to_bits() & crate::simd::EXP) == crate::simd::EXP) as u32;
        *pi = v;
    }
    bad == 0
}

multiversion! {
    fn add_scaled(g: &[f32], e: &[f32], f: f32, vanilla: bool, p: &mut [f32]) -> bool = add_scaled_impl;
}

/// Momentum's step and error feedback's input in one pass, for a codec without its own
/// ([`Codec::compress_fed`]): `next = μ·m + g`, `p = fed(g + μ·next, e)` ([`crate::elem`]'s
/// `nesterov` and `fed`); whether every `next` and `p` is finite.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn nesterov_fed_impl(
    g: &[f32],
    m: &[f32],
    mu: f32,
    next: &mut [f32],
    e: &[f32],
    f: f32,
    vanilla: bool,
    p: &mut [f32],
) -> bool {
    let n = p.len();
    let (g, m, next, e) = (&g[..n], &m[..n], &mut next[..n], &e[..n]);
    let mut bad = 0u32;
    for i in 0..n {
        let (mn, x) = crate::elem::nesterov(g[i], m[i], mu);
        let v = crate::elem::fed(x, e[i], f, vanilla);
        bad |= ((v.to_bits() & crate::simd::EXP) == crate::simd::EXP) as u32
            | ((mn.to_bits() & crate::simd::EXP) == crate::simd::EXP) as u32;
        next[i] = mn;
        p[i] = v;
    }
    bad == 0
}

multiversion! {
    #[allow(clippy::too_many_arguments)]
    fn nesterov_fed(g: &[f32], m: &[f32], mu: f32, next: &mut [f32], e: &[f32], f: f32, vanilla: bool, p: &mut [f32]) -> bool = nesterov_fed_impl;
}

/// `d = p - d`; whether every result is finite.
#[inline(always)]
fn sub_into_impl(p: &[f32], d: &mut [f32]) -> bool {
    let mut bad = 0u32;
    for (di, pi) in d.iter_mut().zip(p) {
        let v = *pi - *di;
        bad |= ((v.to_bits() & crate::simd::EXP) == crate::simd::EXP) as u32;
        *di = v;
    }
    bad == 0
}

multiversion! {
    fn sub_into(p: &[f32], d: &mut [f32]) -> bool = sub_into_impl;
}

/// A decorated chain's refused round leaves no payload, whichever pass refused it.
fn no_payload_unless_done(
    done: Result<(), KernelError>,
    out: &mut Vec<u8>,
) -> Result<(), KernelError> {
    if done.is_err() {
        out.clear();
    }
    done
}

fn first_bad(name: &str, what: &'static str, g: &[f32]) -> Option<KernelError> {
    crate::simd::first_non_finite(g).map(|i| KernelError::NonFinite {
        compressor: name.to_string(),
        what,
        index: i,
        value: g[i],
    })
}

impl Compressor for ErrorFeedback {
    fn codec(&self) -> &dyn Codec {
        self.inner.codec()
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn compress(
        &mut self,
        input: &[f32],
        ctx: &RoundCtx,
        out: &mut Vec<u8>,
    ) -> Result<(), KernelError> {
        let done = self.round(input, ctx, out);
        no_payload_unless_done(done, out)
    }
    fn compress_nesterov(
        &mut self,
        input: &[f32],
        nesterov: Nesterov<'_>,
        ctx: &RoundCtx,
        out: &mut Vec<u8>,
    ) -> Option<Result<(), KernelError>> {
        let n = self.e.len();
        // The pass below overwrites `p`, which may hold the state before the last round.
        self.undo = None;
        // No payload unless this succeeds (the trait's promise).
        out.clear();
        if input.len() != n || nesterov.momentum.len() != n || nesterov.next.len() != n {
            return None;
        }
        let (factor, lr) = self.factor(ctx).ok()?;
        let vanilla = self.kind == EfKind::Vanilla;
        let Nesterov { momentum, mu, next } = nesterov;
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
        let fused = self
            .inner
            .codec_mut()
            .and_then(|codec| codec.compress_fed(fed, &mut self.p, ctx, out));
        let encoded = match fused {
            Some(encoded) => matches!(encoded, Ok(true)),
            // One pass forms p, then the codec encodes it.
            None => {
                nesterov_fed(
                    input,
                    momentum,
                    mu,
                    next,
                    &self.e,
                    factor,
                    vanilla,
                    &mut self.p,
                ) && self.inner.compress(&self.p, ctx, out).is_ok()
            }
        };
        if !encoded {
            // The passes one by one name what failed.
            out.clear();
            return None;
        }
        Some(self.keep_residual(ctx, lr, out))
    }
    fn residual(&self) -> Option<&[f32]> {
        Some(&self.e)
    }
    fn momentum(&self) -> Option<&[f32]> {
        self.inner.momentum()
    }
    fn reset(&mut self) {
        self.e.fill(0.0);
        self.prev_lr = None;
        self.undo = None;
        self.inner.reset();
    }
    fn state(&self) -> ChainState {
        ChainState {
            residual: Some(self.e.clone()),
            prev_lr: self.prev_lr,
            ..self.inner.state()
        }
    }
    fn set_state(&mut self, state: &ChainState) -> Result<(), KernelError> {
        let Some(e) = &state.residual else {
            return Err(KernelError::context(
                &self.name,
                "the saved state has no error-feedback residual, which this chain keeps",
            ));
        };
        if e.len() != self.e.len() {
            return Err(KernelError::len(
                &self.name,
                "saved residual",
                self.e.len(),
                e.len(),
            ));
        }
        if self.kind == EfKind::Vanilla && state.prev_lr.is_some() {
            return Err(KernelError::context(
                &self.name,
                "the saved state has a previous learning rate, which vanilla error feedback does not keep",
            ));
        }
        if let Some(lr) = state.prev_lr.filter(|lr| !(lr.is_finite() && *lr > 0.0)) {
            return Err(KernelError::context(
                &self.name,
                format!("the saved previous learning rate {lr} is not finite and > 0"),
            ));
        }
        let rest = ChainState {
            residual: None,
            prev_lr: None,
            ..state.clone()
        };
        self.inner.set_state(&rest)?;
        self.e.copy_from_slice(e);
        self.prev_lr = state.prev_lr;
        self.undo = None;
        Ok(())
    }
    fn undo(&mut self, round: u64) {
        if let Some(u) = self.undo.take_if(|u| u.round == round) {
            let old = if u.in_p { &mut self.p } else { &mut self.d };
            std::mem::swap(&mut self.e, old);
            self.prev_lr = u.prev_lr;
        }
        self.inner.undo(round);
    }
}

/// Nesterov momentum: `m ← μ·m + g; p ← g + μ·m` (with the new `m`), then compress `p`.
/// Where the chain below takes this step with its own first pass (error feedback's, which
/// onebit makes part of its encoding: [`Compressor::compress_nesterov`]), it does: the same
/// bits, one pass over the chunk fewer.
///
/// The training code's own optimizer momentum must then be 0 (the RFC's precaution 4: this is
/// dist-EF-SGDM, where momentum comes before compression). Built on workers only.
pub struct Momentum {
    inner: Box<dyn Compressor>,
    mu: f32,
    name: String,
    m: Vec<f32>,
    /// The next round's `m`, computed with `p` and swapped in when the round succeeds (then
    /// the momentum before the round, until the next one).
    next: Vec<f32>,
    p: Vec<f32>,
    /// The last round committed and not undone.
    undo: Option<u64>,
}

impl Momentum {
    /// Wraps `inner` with a zero momentum buffer.
    pub fn new(inner: Box<dyn Compressor>, mu: f32) -> Momentum {
        let n = inner.len();
        Momentum {
            name: format!("nesterov(mu={mu}, {})", inner.name()),
            inner,
            mu,
            m: vec![0.0; n],
            next: vec![0.0; n],
            p: vec![0.0; n],
            undo: None,
        }
    }

    /// One round of [`Compressor::compress`] (which leaves no payload when it fails).
    fn round(
        &mut self,
        input: &[f32],
        ctx: &RoundCtx,
        out: &mut Vec<u8>,
    ) -> Result<(), KernelError> {
        let n = self.m.len();
        // Whatever happens below overwrites the momentum before the last round.
        self.undo = None;
        if input.len() != n {
            return Err(KernelError::len(&self.name, "input", n, input.len()));
        }
        // A chain that takes the momentum's step in its own pass (error feedback into onebit)
        // saves one over the chunk; otherwise, or where that pass fails, one pass at a time.
        let step = Nesterov {
            momentum: &self.m,
            mu: self.mu,
            next: &mut self.next,
        };
        if let Some(done) = self.inner.compress_nesterov(input, step, ctx, out) {
            done?;
        } else {
            if !nesterov(input, &self.m, self.mu, &mut self.next, &mut self.p) {
                if let Some(err) = first_bad(&self.name, "input", input) {
                    return Err(err);
                }
                return Err(KernelError::overflow(
                    &self.name,
                    "the momentum update overflows f32",
                ));
            }
            self.inner.compress(&self.p, ctx, out)?;
        }
        // Commit the new momentum only once the round succeeded.
        std::mem::swap(&mut self.m, &mut self.next);
        self.undo = Some(ctx.round);
        Ok(())
    }
}

/// `next = μ·m + g; p = g + μ·next`; whether every value is finite.
#[inline(always)]
fn nesterov_impl(g: &[f32], m: &[f32], mu: f32, next: &mut [f32], p: &mut [f32]) -> bool {
    let mut bad = 0u32;
    for (((pi, ni), gi), mi) in p.iter_mut().zip(next.iter_mut()).zip(g).zip(m) {
        let (mn, v) = crate::elem::nesterov(*gi, *mi, mu);
        bad |= ((v.to_bits() & crate::simd::EXP) == crate::simd::EXP) as u32
            | ((mn.to_bits() & crate::simd::EXP) == crate::simd::EXP) as u32;
        *ni = mn;
        *pi = v;
    }
    bad == 0
}

multiversion! {
    fn nesterov(g: &[f32], m: &[f32], mu: f32, next: &mut [f32], p: &mut [f32]) -> bool = nesterov_impl;
}

impl Compressor for Momentum {
    fn codec(&self) -> &dyn Codec {
        self.inner.codec()
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn compress(
        &mut self,
        input: &[f32],
        ctx: &RoundCtx,
        out: &mut Vec<u8>,
    ) -> Result<(), KernelError> {
        let done = self.round(input, ctx, out);
        no_payload_unless_done(done, out)
    }
    fn residual(&self) -> Option<&[f32]> {
        self.inner.residual()
    }
    fn momentum(&self) -> Option<&[f32]> {
        Some(&self.m)
    }
    fn reset(&mut self) {
        self.m.fill(0.0);
        self.undo = None;
        self.inner.reset();
    }
    fn state(&self) -> ChainState {
        ChainState {
            momentum: Some(self.m.clone()),
            ..self.inner.state()
        }
    }
    fn set_state(&mut self, state: &ChainState) -> Result<(), KernelError> {
        let Some(m) = &state.momentum else {
            return Err(KernelError::context(
                &self.name,
                "the saved state has no momentum buffer, which this chain keeps",
            ));
        };
        if m.len() != self.m.len() {
            return Err(KernelError::len(
                &self.name,
                "saved momentum",
                self.m.len(),
                m.len(),
            ));
        }
        let rest = ChainState {
            momentum: None,
            ..state.clone()
        };
        self.inner.set_state(&rest)?;
        self.m.copy_from_slice(m);
        self.undo = None;
        Ok(())
    }
    fn undo(&mut self, round: u64) {
        // The inner chain committed with this one: undone with it, or not at all (a round
        // that failed here before reaching it must not undo its earlier one).
        if self.undo.take_if(|r| *r == round).is_some() {
            std::mem::swap(&mut self.m, &mut self.next);
            self.inner.undo(round);
        }
    }
}
