//! Decentralised averaging of a tensor declared with `exchange = "gossip"` (Moniqua's
//! Algorithm 1, lines 3–5; Lu and De Sa, ICML 2020): [`crate::Worker::gossip`] encodes
//! each chunk of this worker's model with the chunk's codec and pushes it; the chunk's server
//! relays the pushes of this worker's graph neighbours (the cluster's `[gossip]` mixing
//! matrix, [`row`]) undecoded; [`average_gossip`] decodes each against this worker's own values
//! (the moniqua codec's reference), decodes this worker's own message the same way (the paper's
//! `x̂_i`, re-encoded here: encoding is deterministic in the round, and shared rounding draws
//! make it the same on every worker), and writes
//! `x + Σ_j W_ij (x̂_j − x̂_i)` ([`pushpull_kernels::gossip::average_step`]); with
//! `exchange = "gossip_direct"` (Moniqua's equation 4) its own exact `x` stands for `x̂_i`,
//! which is `W_ii x + Σ_{j≠i} W_ij x̂_j`. A call that does
//! not fit how its tensor is exchanged is refused first ([`check_exchange`]). The gradient
//! bound of `theta_schedule = bound` is in `crate::gradient_bound`.

use pushpull_kernels::gossip::average_step;
use pushpull_kernels::RoundCtx as CodecRound;
use pushpull_proto::protocol::split_gossip_result;
use pushpull_proto::{Config, ParamMap};

use crate::core::RoundKind;
use crate::error::{DataError, WorkerError};
use crate::tensor::{GossipRow, TensorInner};

/// A tensor's gossip row on worker `rank` when its map says `exchange = "gossip"` or
/// `"gossip_direct"`; `None` for a summed tensor.
pub(crate) fn row(
    config: &Config,
    rank: u32,
    params: &ParamMap,
) -> Result<Option<GossipRow>, String> {
    let exchange = match pushpull_kernels::parse_params(params) {
        Ok(s) if s.exchange.is_gossip() => s.exchange,
        _ => return Ok(None),
    };
    let graph = config.gossip.graph(&config.cluster)?;
    let neighbours = graph
        .into_iter()
        .nth(rank as usize)
        .ok_or_else(|| format!("rank {rank} is not a worker of the gossip graph"))?;
    Ok(Some(GossipRow {
        neighbours,
        direct: exchange == pushpull_kernels::Exchange::GossipDirect,
    }))
}

/// Chunk `index` of a gossip round: `slice` holds this worker's values `x` and receives the
/// average with the neighbours' messages in `payload` (see the module docs); `lr` is the
/// round's learning rate, which the codec reads with `theta_schedule = "lr"` (the pushes were
/// encoded with it).
pub(crate) fn average_gossip(
    tensor: &TensorInner,
    index: usize,
    slice: &mut [f32],
    round: u64,
    lr: Option<f32>,
    payload: &[u8],
) -> Result<(), DataError> {
    let Some(row) = &tensor.gossip else {
        let message = "a gossip result for a tensor that is summed";
        return Err(DataError::Mismatch(message.into()));
    };
    let mut codec = tensor.codec(index);
    let x = slice.to_vec();
    let mut mine = Vec::new();
    let ctx = CodecRound {
        lr,
        theta_bound: tensor.bound.theta_bound(round, lr),
        ..CodecRound::new(round)
    };
    codec
        .compress(&x, &ctx, &mut mine)
        .map_err(|e| DataError::from(e).during("encoding this worker's own message"))?;
    let parts = split_gossip_result(payload, row.neighbours.len(), mine.len())
        .map_err(DataError::Mismatch)?;
    let ctx = ctx.with_reference(&x);
    let decode = |bytes: &[u8], from: String| -> Result<Vec<f32>, DataError> {
        let mut v = vec![0.0f32; x.len()];
        codec
            .decompress(bytes, &ctx, &mut v)
            .map_err(|e| DataError::from(e).during(format!("decoding {from}'s message")))?;
        Ok(v)
    };
    // Equation 4 keeps this worker's exact values; Algorithm 1 its own message's decoding.
    let own = if row.direct {
        x.clone()
    } else {
        decode(&mine, "this worker".into())?
    };
    let theirs = row
        .neighbours
        .iter()
        .zip(parts)
        .map(|(&(j, _), bytes)| decode(bytes, format!("worker {j}")))
        .collect::<Result<Vec<_>, _>>()?;
    let neighbours: Vec<(f64, &[f32])> = row
        .neighbours
        .iter()
        .zip(&theirs)
        .map(|(&(_, w), v)| (w, &v[..]))
        .collect();
    average_step(&x, &own, &neighbours, slice);
    Ok(())
}

/// Refuses a call whose kind does not fit how `tensor` is exchanged (before anything is sent).
pub(crate) fn check_exchange(tensor: &TensorInner, kind: RoundKind) -> Result<(), WorkerError> {
    let wrong = |message: &str| {
        Err(WorkerError::WrongExchange {
            op: kind.op_name(),
            name: tensor.placement.name.clone(),
            message: message.to_string(),
        })
    };
    match (kind, tensor.gossip.is_some()) {
        (RoundKind::Sum { .. }, true) => wrong(
            "its map says exchange = \"gossip\": its rounds average models with the graph \
             neighbours (call gossip), they are not summed",
        ),
        (RoundKind::Gossip, false) => wrong(
            "it is summed by push_pull; declare it with exchange = \"gossip\" in its map to \
             average it with the graph neighbours",
        ),
        _ => Ok(()),
    }
}
