//! `moniqua`: b-bit codes of `(x / B_θ) mod 1`, decoded against a reference (Moniqua, Lu and
//! De Sa 2020, Algorithm 1 and Lemma 2). CPU only.
//!
//! With `δ = 2^-(b+1)` (nearest rounding) or `δ = 2^-b` (stochastic rounding), `δ < 1/2`, and
//! `B_θ = 2θ / (1 - 2δ)`, all in f64:
//! * encode: `f = z - floor(z)` with `z = x / B_θ` (so `f` in `[0, 1)` is `(x / B_θ) mod 1`
//!   up to the representative), `t = f * 2^b`, `code = round(t) mod 2^b` where `round` is
//!   `floor(t + 1/2)` (nearest) or `floor(t) + (u < t - floor(t))` (stochastic, `u` the element's
//!   rounding uniform, 16 bits since protocol version 3: unbiased up to `2^-16` of a step). A
//!   code that rounds up to `2^b` (the value 1, i.e. +1/2 in the paper's `[-1/2, 1/2)`
//!   representative) wraps to 0.
//! * decode with reference `y`: `q = code * 2^-b`, `x̂ = ((B_θ q - y) mod B_θ) + y` with
//!   `a mod B = a - B * floor(a / B + 1/2)` in `[-B/2, B/2)`, rounded to f32 at the end.
//!
//! Lemma 2: if `|x - y| < θ` then `|x̂ - x| <= δ B_θ = 2θδ / (1 - 2δ)` (plus the final f32
//! rounding of `x̂`), however large `|x|` is.
//!
//! With `theta_schedule = lr` ([`ThetaSchedule::Lr`]) the round's θ is `theta · α` with `α`
//! the round's learning rate ([`RoundCtx::lr`], required), as in the paper's Theorem 2, whose
//! `θ_k = 2·α_k·G·C_α·log(16n)/(1 − ηρ)` is proportional to the step size: workers' models
//! differ by about `α·G / (1 − ρ)`, so a bound that shrinks with a decaying rate quantises
//! finer as training settles. `B_θ` is then the
//! fixed `B_θ` of `theta` times `α` (in f64, `α` widened from f32), the same on every worker.
//!
//! With `theta_schedule = bound` ([`ThetaSchedule::Bound`]) the round's θ is `theta` times the
//! paper's Theorem 2 bound [`RoundCtx::theta_bound`], `2·α_k·G·ln(16n)/(1 − ρ)`, which the
//! worker computes from the gradient bound `G` it tracks for the tensor (so it differs from
//! worker to worker): each message then carries its sender's `B_θ` (8 bytes, an f64 after the
//! codes), and a receiver recovers it with that `B_θ`, which Lemma 2 needs of the sender only.
//!
//! Wire format: a bit stream of `n` codes of `b` bits. Size `4 * ceil(n * b / 32)`; with
//! `theta_schedule = bound` followed by the sender's `B_θ` (little-endian f64); with
//! `hash = true` ([`recovered_hash`], the paper's verification, §6 "Choosing θ empirically")
//! followed by 8 bytes: a little-endian u64 hash of the un-modded quantised values, which the
//! receiver recomputes from what it recovered and compares, so a θ too small for the two models'
//! distance is an error naming the message instead of a silently wrong average.
//!
//! # The reference
//! [`RoundCtx::reference`] carries it: compress ignores it (it is checked for length when
//! given); decompress and decompress-add require it (`len` values, the receiver's own copy,
//! within θ of the sender's values). A sender gets Algorithm 1's "local biased term" by
//! decompressing its own payload with its own values as the reference.

use std::sync::Arc;

use super::{par_segments, prepare, GroupDecoder, GroupEncoder};
use crate::chain::Body;
use crate::codec::{Codec, CodecInfo, RoundCtx};
use crate::error::{KernelError, Result};
use crate::rng::Stream;
use crate::simd::{multiversion, stream_bytes, with_width};
use crate::spec::{
    name_of, BuildOptions, CodecSpec, Entry, KeyInfo, Keys, Kind, Purpose, Spellings,
};
use pushpull_proto::placement::PayloadModel;

/// The registry's `moniqua`: `theta` (required), `bits`, `rounding`, `theta_schedule`, `hash`.
pub const ENTRY: Entry = Entry {
    name: "moniqua",
    keys: &["bits"],
    own_keys: &[
        KeyInfo {
            name: "theta",
            aliases: &[],
            applies_to: "moniqua",
            values: "a finite number > 0: the a-priori bound on |x - reference|",
            default: "required",
        },
        KeyInfo {
            name: "rounding",
            aliases: &[],
            applies_to: "moniqua",
            values: "stochastic (delta = 2^-bits), nearest (delta = 2^-(bits+1))",
            default: "stochastic",
        },
        KeyInfo {
            name: "theta_schedule",
            aliases: &[],
            applies_to: "moniqua",
            values: "fixed (theta in every round), lr (theta times the round's learning rate, \
                     which must be set every round), bound (theta times the paper's Theorem 2 bound \
                     2·lr·G·ln(16n)/(1 − ρ), G the largest |gradient| the worker has been told of \
                     for the tensor, Worker::track_gradient; each message carries its B_theta)",
            default: "fixed",
        },
        KeyInfo {
            name: "hash",
            aliases: &[],
            applies_to: "moniqua",
            values: "true (each message carries a hash of its un-modded values, 8 bytes; a receiver \
                     whose recovery differs, its model more than theta from the sender's, fails \
                     the round naming the sender), false",
            default: "false",
        },
    ],
    parse,
};

/// Moniqua's settings: modulo quantisation against the receiver's own values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoniquaSpec {
    /// The bound θ on |x - reference|.
    pub theta: f64,
    /// Bits per element.
    pub bits: u32,
    /// Rounding mode.
    pub rounding: Rounding,
    /// Whether θ follows the learning rate.
    pub schedule: ThetaSchedule,
    /// Whether each message carries the hash of its un-modded values (checked on decoding).
    pub hash: bool,
}

/// The roundings' spellings.
const ROUNDINGS: Spellings<Rounding> = &[
    (&["stochastic"], Rounding::Stochastic),
    (&["nearest"], Rounding::Nearest),
];

fn parse(keys: &Keys<'_>) -> Result<Arc<dyn CodecSpec>> {
    let (k, v) = keys.require("theta", "theta: a finite number > 0")?;
    let theta = match v.parse::<f64>() {
        Ok(t) if t.is_finite() && t > 0.0 => t,
        _ => return Err(KernelError::bad(k, v, "expected a finite number > 0")),
    };
    let rounding = keys.choice(
        "rounding",
        ROUNDINGS,
        Rounding::Stochastic,
        "expected stochastic or nearest",
    )?;
    let bits = keys.bits()?;
    let delta = delta(bits, rounding);
    if delta >= 0.5 {
        return Err(KernelError::bad(
            keys.get("bits").map(|(k, _)| k).unwrap_or("bits"),
            &bits.to_string(),
            format!(
                "moniqua needs delta < 1/2, and {} rounding with {bits} bit(s) gives delta = \
                 {delta}; use bits >= 2 or rounding=nearest",
                name_of(ROUNDINGS, rounding)
            ),
        ));
    }
    if !b_theta(theta, bits, rounding).is_finite() {
        return Err(KernelError::bad(
            k,
            v,
            "theta is too large: B_theta overflows",
        ));
    }
    let schedule = keys.choice(
        "theta_schedule",
        &[
            (&["fixed"], ThetaSchedule::Fixed),
            (&["lr"], ThetaSchedule::Lr),
            (&["bound"], ThetaSchedule::Bound),
        ],
        ThetaSchedule::Fixed,
        "expected fixed, lr or bound",
    )?;
    Ok(Arc::new(MoniquaSpec {
        theta,
        bits,
        rounding,
        schedule,
        hash: keys.flag("hash", false)?,
    }))
}

impl CodecSpec for MoniquaSpec {
    fn kind(&self) -> Kind {
        Kind::new("moniqua", self.rounding == Rounding::Stochastic, true)
    }
    fn build(&self, base: CodecInfo, opts: &BuildOptions) -> Result<Body> {
        if opts.purpose == Purpose::Gradient {
            return Err(KernelError::Refused {
                compressor: base.name,
                why: "moniqua cannot compress gradients for push_pull: it sends values modulo \
                      B_theta and needs a reference within theta of them on the receiver, \
                      which only decentralised averaging has: declare the model's parameters \
                      with exchange = \"gossip\" (and keep another compressor for gradients)"
                    .into(),
            });
        }
        Ok(Body::Plain(Box::new(Moniqua::new(base, *self))))
    }
    fn payload(&self, _: u64) -> PayloadModel {
        let bound = if self.schedule == ThetaSchedule::Bound {
            8
        } else {
            0
        };
        PayloadModel {
            header: bound + if self.hash { 8 } else { 0 },
            stream_bits: u64::from(self.bits),
            ..PayloadModel::default()
        }
    }
    fn display_name(&self) -> String {
        let check = if self.hash { ", hash" } else { "" };
        let per_lr = match self.schedule {
            ThetaSchedule::Fixed => "",
            ThetaSchedule::Lr => " x lr",
            ThetaSchedule::Bound => " x bound",
        };
        format!(
            "moniqua(theta={}{per_lr}, bits={}, {}{check})",
            self.theta,
            self.bits,
            name_of(ROUNDINGS, self.rounding)
        )
    }
    fn params(&self, put: &mut dyn FnMut(&'static str, String)) {
        put("theta", self.theta.to_string());
        if self.hash {
            put("hash", "true".to_string());
        }
        put("bits", self.bits.to_string());
        put("rounding", name_of(ROUNDINGS, self.rounding).to_string());
        match self.schedule {
            ThetaSchedule::Fixed => {}
            ThetaSchedule::Lr => put("theta_schedule", "lr".to_string()),
            ThetaSchedule::Bound => put("theta_schedule", "bound".to_string()),
        }
    }
}

/// Moniqua's rounding (the `rounding` key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// Stochastic rounding: `δ = 2^-bits`.
    Stochastic,
    /// Nearest rounding: `δ = 2^-(bits+1)`.
    Nearest,
}

/// How Moniqua's θ follows training (the `theta_schedule` key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThetaSchedule {
    /// `fixed`: θ is `theta` in every round.
    Fixed,
    /// `lr`: θ is `theta · α`, `α` the round's learning rate.
    Lr,
    /// `bound`: θ is `theta` times the paper's Theorem 2 bound for the round
    /// ([`RoundCtx::theta_bound`]), carried in each message.
    Bound,
}

/// The Moniqua compressor.
pub(crate) struct Moniqua {
    base: CodecInfo,
    bits: u32,
    rounding: Rounding,
    schedule: ThetaSchedule,
    /// Whether messages carry the hash of their un-modded values.
    hash: bool,
    /// `B_θ` of `theta` (of `theta · α` once scaled by the round's `α`).
    b_theta: f64,
}

/// The hash of the un-modded quantised values a bit `stream` of `reference.len()` codes
/// recovers against `reference` with `B_θ = b`: element `i`'s value is `B_θ · m_i / 2^bits`
/// with the integer `m_i = code_i + 2^bits · k_i`, `k_i = −floor((B_θ·q_i − y_i)/B_θ + ½)` (the
/// decode's wrap count, exact in f64), and the hash is the wrapping sum over `i` of
/// `mix64(m_i ^ mix64(i + 1))`. The sender computes it against its own values (it recovers
/// exactly what it quantised, Lemma 2 with a distance of 0); a receiver gets the same sum
/// exactly when every element was recovered right, and a different one, but for a 2^-64
/// chance, when some `k_i` differs, i.e. when the models were more than θ apart there.
pub fn recovered_hash(stream: &[u8], reference: &[f32], b: f64, bits: u32) -> u64 {
    use crate::rng::mix64;
    let inv_scale = 1.0 / (1u64 << bits) as f64;
    let mask = (1u64 << bits) - 1;
    let mut h = 0u64;
    for (i, &y) in reference.iter().enumerate() {
        let bit = i * bits as usize;
        let (word, shift) = (bit / 32, bit % 32);
        let lo = u64::from(crate::simd::get_u32(stream, word));
        let hi = if shift + bits as usize > 32 {
            u64::from(crate::simd::get_u32(stream, word + 1)) << 32
        } else {
            0
        };
        let code = ((lo | hi) >> shift) & mask;
        let a = b * (code as f64 * inv_scale) - y as f64;
        let k = -(a / b + 0.5).floor();
        let m = (k as i64).wrapping_mul(1 << bits).wrapping_add(code as i64);
        h = h.wrapping_add(mix64(m as u64 ^ mix64(i as u64 + 1)));
    }
    h
}

/// `δ` for `bits` and the rounding mode.
pub fn delta(bits: u32, rounding: Rounding) -> f64 {
    match rounding {
        Rounding::Nearest => 0.5f64.powi(bits as i32 + 1),
        Rounding::Stochastic => 0.5f64.powi(bits as i32),
    }
}

/// `B_θ = 2θ / (1 - 2δ)`.
pub fn b_theta(theta: f64, bits: u32, rounding: Rounding) -> f64 {
    2.0 * theta / (1.0 - 2.0 * delta(bits, rounding))
}

impl Moniqua {
    pub fn new(base: CodecInfo, spec: MoniquaSpec) -> Moniqua {
        let MoniquaSpec {
            theta,
            bits,
            rounding,
            schedule,
            hash,
        } = spec;
        let mut m = Moniqua {
            base,
            bits,
            rounding,
            schedule,
            hash,
            b_theta: b_theta(theta, bits, rounding),
        };
        let size = m.stream_size() + m.b_size() + if hash { 8 } else { 0 };
        m.base.payload = size;
        m
    }

    /// Bytes of the code stream (the payload without its hash).
    fn stream_size(&self) -> usize {
        stream_bytes(self.base.n, self.bits)
    }

    /// Bytes of the sender's `B_θ` after the codes (`theta_schedule = bound` only).
    fn b_size(&self) -> usize {
        if self.schedule == ThetaSchedule::Bound {
            8
        } else {
            0
        }
    }

    /// `B_θ` of this round as the sender has it: fixed, or scaled by the round's learning
    /// rate or by its Theorem 2 bound.
    fn round_b(&self, ctx: &RoundCtx) -> Result<f64, KernelError> {
        match self.schedule {
            ThetaSchedule::Fixed => Ok(self.b_theta),
            ThetaSchedule::Bound => match ctx.theta_bound {
                Some(t) if t.is_finite() && t > 0.0 && (self.b_theta * t).is_finite() => {
                    Ok(self.b_theta * t)
                }
                Some(t) => Err(KernelError::context(
                    &self.base.name,
                    format!(
                        "theta_schedule = bound: this round's bound {t} (from the learning \
                         rate and the tracked gradient bound) must be finite and > 0"
                    ),
                )),
                None => Err(KernelError::context(
                    &self.base.name,
                    "theta_schedule = bound needs the round's bound from the learning rate and the \
                     tensor's tracked gradient bound (set the rate every step, \
                     Worker::set_learning_rate, and report the gradients, Worker::track_gradient)",
                )),
            },
            ThetaSchedule::Lr => match ctx.lr {
                Some(lr) if lr.is_finite() && lr > 0.0 => Ok(self.b_theta * lr as f64),
                _ => Err(KernelError::context(
                    &self.base.name,
                    "theta_schedule = lr scales theta by the round's learning rate, and this \
                     round has none (set it every step: Worker::set_learning_rate)",
                )),
            },
        }
    }
}

/// Moniqua codes.
struct Enc<const STOCHASTIC: bool> {
    b: f64,
    scale: f64,
    mask: u32,
}

impl<const S: bool> GroupEncoder for Enc<S> {
    const STOCHASTIC: bool = S;
    #[inline(always)]
    fn codes(&self, _gi: usize, xs: &[f32], u: &[f32], c: &mut [u32]) {
        for t in 0..xs.len() {
            let z = xs[t] as f64 / self.b;
            let f = z - z.floor();
            let tt = f * self.scale;
            c[t] = if S {
                let fl = tt.floor();
                (small_int(fl) + ((u[t] as f64) < tt - fl) as u32) & self.mask
            } else {
                small_int((tt + 0.5).floor()) & self.mask
            };
        }
    }
}

/// `v as u32` for an integer-valued `0 <= v < 2^32` without the saturating cast (which does not
/// vectorise): `v + 2^52` is exact and its low mantissa bits are `v`.
#[inline(always)]
fn small_int(v: f64) -> u32 {
    ((v + 4_503_599_627_370_496.0).to_bits() - 0x4330_0000_0000_0000) as u32
}

#[inline(always)]
fn encode_impl(
    x: &[f32],
    i0: usize,
    dst: &mut [u8],
    stream: Stream,
    b: f64,
    bits: u32,
    stochastic: bool,
) {
    let scale = (1u64 << bits) as f64;
    let mask = (1u32 << bits) - 1;
    if stochastic {
        let enc = Enc::<true> { b, scale, mask };
        with_width!(bits, W => super::encode_groups::<W, _>(x, i0, stream, dst, &enc))
    } else {
        let enc = Enc::<false> { b, scale, mask };
        with_width!(bits, W => super::encode_groups::<W, _>(x, i0, stream, dst, &enc))
    }
}

multiversion! {
    fn encode(x: &[f32], i0: usize, dst: &mut [u8], stream: Stream, b: f64, bits: u32, stochastic: bool) = encode_impl;
}

#[inline(always)]
fn recover(c: u32, y: f32, b: f64, inv_scale: f64) -> f32 {
    let q = c as f64 * inv_scale;
    let a = b * q - y as f64;
    let m = a - b * (a / b + 0.5).floor();
    (m + y as f64) as f32
}

/// Recovery against the reference segment (`reference[0]` is element `i0`).
struct Dec<'a> {
    reference: &'a [f32],
    i0: usize,
    b: f64,
    inv_scale: f64,
}

impl GroupDecoder for Dec<'_> {
    #[inline(always)]
    fn values(&self, gi: usize, c: &[u32], v: &mut [f32]) {
        let r = gi - self.i0;
        let n = self.reference.len();
        let m = c.len().min(n.saturating_sub(r));
        let y = &self.reference[r..r + m];
        for ((vi, &ci), &yi) in v[..m].iter_mut().zip(&c[..m]).zip(y) {
            *vi = recover(ci, yi, self.b, self.inv_scale);
        }
        for (vi, &ci) in v[m..].iter_mut().zip(&c[m..]) {
            *vi = recover(ci, 0.0, self.b, self.inv_scale);
        }
    }
}

#[inline(always)]
fn decode_impl<const ADD: bool>(
    src: &[u8],
    i0: usize,
    out: &mut [f32],
    reference: &[f32],
    b: f64,
    bits: u32,
) {
    let dec = Dec {
        reference,
        i0,
        b,
        inv_scale: 1.0 / (1u64 << bits) as f64,
    };
    with_width!(bits, W => super::decode_groups::<W, ADD, _>(src, i0, out, &dec))
}

multiversion! {
    fn decode(src: &[u8], i0: usize, out: &mut [f32], reference: &[f32], b: f64, bits: u32) = decode_impl::<false>;
}
multiversion! {
    fn decode_add(src: &[u8], i0: usize, out: &mut [f32], reference: &[f32], b: f64, bits: u32) = decode_impl::<true>;
}

impl Moniqua {
    fn reference<'a>(&self, ctx: &RoundCtx<'a>) -> Result<&'a [f32], KernelError> {
        let r = ctx.reference.ok_or_else(|| {
            KernelError::context(
                &self.base.name,
                "decoding needs the receiver's reference values in RoundCtx::reference (its own \
                 copy, within theta of the sender's values)",
            )
        })?;
        self.base.check("reference", r.len())?;
        if let Some(i) = crate::simd::first_non_finite(r) {
            return Err(KernelError::NonFinite {
                compressor: self.base.name.clone(),
                what: "reference",
                index: i,
                value: r[i],
            });
        }
        Ok(r)
    }
}

impl Codec for Moniqua {
    fn info(&self) -> &CodecInfo {
        &self.base
    }
    fn encode(&mut self, input: &[f32], ctx: &RoundCtx, out: &mut Vec<u8>) -> Result<()> {
        if let Some(r) = ctx.reference {
            self.base.check("reference", r.len())?;
        }
        self.base.require_finite(input)?;
        let b = self.round_b(ctx)?;
        let stream = self.base.rounding(ctx.round);
        let stochastic = self.rounding == Rounding::Stochastic;
        let stream_size = self.stream_size();
        let dst = prepare(out, self.base.payload);
        let bits = self.bits;
        let (codes, rest) = dst.split_at_mut(stream_size);
        let (b_bytes, hash) = rest.split_at_mut(self.b_size());
        par_segments(input, bits, codes, |xs, i0, d| {
            encode(xs, i0, d, stream, b, bits, stochastic)
        });
        if !b_bytes.is_empty() {
            b_bytes.copy_from_slice(&b.to_le_bytes());
        }
        if self.hash {
            hash.copy_from_slice(&recovered_hash(codes, input, b, bits).to_le_bytes());
        }
        Ok(())
    }
    fn decode(&self, payload: &[u8], ctx: &RoundCtx, out: &mut [f32], add: bool) -> Result<()> {
        self.base.check_payload(payload.len())?;
        let (payload, rest) = payload.split_at(self.stream_size());
        let (b_bytes, hash) = rest.split_at(self.b_size());
        if !super::tail_bits_zero(payload, self.base.n, self.bits) {
            return Err(KernelError::malformed(
                &self.base.name,
                "padding bits after the last code are not zero",
            ));
        }
        let r = self.reference(ctx)?;
        let b = match b_bytes.try_into() {
            // The sender's own B_θ (theta_schedule = bound).
            Ok(bytes) => match f64::from_le_bytes(bytes) {
                b if b.is_finite() && b > 0.0 => b,
                b => {
                    return Err(KernelError::malformed(
                        &self.base.name,
                        format!("the sender's B_theta {b} is not a finite number > 0"),
                    ))
                }
            },
            Err(_) => self.round_b(ctx)?,
        };
        let f = if add { decode_add } else { decode };
        let seg = crate::par::SEG;
        if crate::par::enabled(out.len()) {
            use rayon::prelude::*;
            let seg_bytes = seg / 8 * self.bits as usize;
            out.par_chunks_mut(seg)
                .zip(payload.par_chunks(seg_bytes))
                .zip(r.par_chunks(seg))
                .enumerate()
                .for_each(|(i, ((o, s), rr))| f(s, i * seg, o, rr, b, self.bits));
        } else {
            f(payload, 0, out, r, b, self.bits);
        }
        if self.hash {
            let sent = u64::from_le_bytes(hash.try_into().expect("8 bytes: the payload's size"));
            if recovered_hash(payload, r, b, self.bits) != sent {
                // `add`: `out` already holds the wrong values added; the caller drops the round.
                return Err(KernelError::context(
                    &self.base.name,
                    "the hash check failed: the values recovered are not the sender's, so its \
                     model and this one (the reference) differ by more than theta somewhere in \
                     this chunk; raise theta (or its theta_schedule's factor)",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_value_roundtrip_respects_lemma_2() {
        for rounding in [Rounding::Nearest, Rounding::Stochastic] {
            for bits in 1..=8 {
                if delta(bits, rounding) >= 0.5 {
                    continue;
                }
                let theta = 0.37;
                let b = b_theta(theta, bits, rounding);
                let bound = delta(bits, rounding) * b;
                for &(x, y) in &[
                    (0.0f32, 0.3f32),
                    (1000.25, 1000.0),
                    (-5e4, -5e4 + 0.36),
                    (3.0, 2.64),
                ] {
                    for ui in 0..16 {
                        let u = ui as f32 / 16.0;
                        let z = x as f64 / b;
                        let f = z - z.floor();
                        let t = f * (1u64 << bits) as f64;
                        let cc = if rounding == Rounding::Stochastic {
                            (t.floor() as u32 + ((u as f64) < t - t.floor()) as u32)
                                & ((1 << bits) - 1)
                        } else {
                            ((t + 0.5).floor() as u32) & ((1 << bits) - 1)
                        };
                        let xh = recover(cc, y, b, 1.0 / (1u64 << bits) as f64);
                        let slack = (x.abs() as f64) * f32::EPSILON as f64;
                        assert!(
                            ((xh as f64) - x as f64).abs() <= bound * (1.0 + 1e-9) + slack,
                            "bits {bits} {rounding:?}: x {x} y {y} -> {xh}, bound {bound}"
                        );
                    }
                }
            }
        }
    }
}
