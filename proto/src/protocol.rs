//! The wire protocol: control messages and data frames.
//!
//! # Connections
//! * **Node ↔ scheduler**: every server and worker opens one QUIC connection to the scheduler
//!   and, on it, one bidirectional *control stream*. Both directions carry [`ToScheduler`] /
//!   [`FromScheduler`] messages, each a *control frame*: a u32 little-endian length followed by
//!   that many bytes of bincode 2 (standard configuration, serde). Control frames are at most
//!   [`MAX_CONTROL_FRAME`] bytes.
//! * **Worker → server**: every worker opens one QUIC connection to every server. Each message
//!   is a *data frame* on its own **unidirectional** stream, which the sender finishes right
//!   after the frame: a [`FrameHeader`] ([`FRAME_HEADER_LEN`] bytes, fixed layout below)
//!   followed by `payload_len` bytes of payload. The first frame a worker sends on a new
//!   connection is a [`FrameKind::Hello`]; after that, one [`FrameKind::Push`] per chunk and
//!   round. The server answers each completed round with one [`FrameKind::Result`] (or
//!   [`FrameKind::Abort`]) frame per worker, on a unidirectional stream it opens.
//!
//! Because every stream is finished as soon as its frame is written, and every receiver reads
//! every incoming stream to the end at once (never waiting for other workers before reading),
//! no stream is ever held open while the round waits for someone else: stream credit cannot
//! run out however many keys are in flight or in which order workers issue them.
//!
//! # Data frame header (little-endian, 40 bytes)
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic `b"PPF1"` |
//! | 4 | 1 | kind ([`FrameKind`]) |
//! | 5 | 1 | op ([`ReduceOp`]; 0 for frames that aren't pushes) |
//! | 6 | 2 | flags ([`FrameFlags`]): bit 0 non-finite, bit 1 undo the previous round (sum pushes, `StateGet`); other bits 0 |
//! | 8 | 4 | rank of the worker (sender of a push/hello; receiver of a result/abort) |
//! | 12 | 4 | aux: the root rank of a broadcast; for a sum, the learning rate the worker set for the round as f32 bits (0: none; every push of a round must carry the same) |
//! | 16 | 8 | key |
//! | 24 | 8 | round |
//! | 32 | 8 | payload length in bytes (u64; bounded by [`max_payload_len`]) |
//!
//! The payload of a push or result is the chunk's encoded bytes; of an abort, a UTF-8 error
//! message; of a hello, empty. The state frames (a checkpoint: a worker asks for a key's state,
//! `StateGet`, or restores it, `StatePut`; the server answers `State`) carry round
//! [`STATE_ROUND`](crate::checkpoint::STATE_ROUND) and a
//! [`KeyState`](crate::checkpoint::KeyState) (or nothing) as payload.
//!
//! # Gossip rounds (decentralised averaging)
//! A key of a tensor exchanged by gossip (`exchange = "gossip"` in its map) runs
//! [`ReduceOp::Gossip`] rounds: every worker pushes its chunk's message (its own model,
//! encoded; `aux` 0, no flags) and the server, which decodes nothing, relays: the result for
//! rank `i` is the pushes of `i`'s neighbours in the cluster's mixing matrix (`[gossip]`,
//! `W[i][j] > 0`, `j ≠ i`), concatenated in ascending rank order. Every push of a gossip key
//! has the same length (its codec's fixed payload), so the result splits into equal parts
//! ([`split_gossip_result`]). A result is at most [`max_payload_len`] times the largest number
//! of neighbours.
//!
//! # Non-finite rounds (mixed precision)
//! A worker whose chunk holds inf or NaN (or whose compression of it overflows f32) pushes it
//! flagged [`FrameFlags::non_finite`] with an empty payload, its compressor state unchanged.
//! A sum round with such a push, or whose sum cannot be encoded for the same reason, completes
//! with a `Result` flagged non-finite and empty for every worker: the server's state is
//! unchanged, every worker undoes the round's change of its own state and fills the chunk with
//! NaN, so that every worker's loss scaler skips the step, as it would after an all-reduce of
//! the non-finite gradients. A worker that discards a round whose sum was finite (its
//! optimizer skipped the step) undoes its state and flags its next push of the key
//! [`FrameFlags::undo_previous`]; the server then undoes its state's change of the key's
//! previous sum round before summing (every push of a round must agree). A checkpoint taken
//! after such a discard, before that next push, asks for the key's state with a `StateGet`
//! flagged [`FrameFlags::undo_previous`]: the server undoes that change then (undoing twice
//! does nothing) and answers with the state as it will be when the next round opens.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::config::{ClusterDigest, ParamMap};

/// Protocol version; a node with another version is refused at registration.
///
/// * Version 3: the stochastic compressors' payloads changed (same sizes, different bytes):
///   stochastic rounding uses 16-bit uniforms, four per SplitMix64 draw (element `i` takes draw
///   `i / 4`, lane `i % 4`; was two 24-bit uniforms per draw), and minmax/dithering multiply by a
///   per-bucket reciprocal (`1 / step`, `s / norm`, `1 / norm`) instead of dividing each element
///   (see `pushpull_kernels::rng` and `pushpull_kernels::elem`). Mixed builds would decode each
///   other's payloads fine but would no longer be bit-identical to the single-process reference.
/// * Version 4: the registration's digest carries `cluster.max_chunk_payload_bytes` (fp32 and
///   fp16 tensors are cut into chunks of at most that payload, so the placement changed).
/// * Version 5: data frames carry [`FrameFlags`] in the formerly reserved bytes 6..8
///   (non-finite pushes and results, undoing the previous round).
/// * Version 6: the registration's digest carries `cluster.local_size` and
///   `cluster.force_distributed` (local groups: a data frame's pushes come from each host's
///   owner of the chunk, one per host).
/// * Version 7: column-wise onebit's wire format 2 (`columns` counts a tensor's columns,
///   column-major, and the scheduler cuts such a tensor at column boundaries; format 1 read a
///   chunk row-major, mixing a tensor's columns up across chunks).
/// * Version 8: the state frames ([`FrameKind::StateGet`], [`FrameKind::StatePut`],
///   [`FrameKind::State`]) that carry a server's compressor state to a worker's checkpoint and
///   back.
/// * Version 9: gossip rounds ([`ReduceOp::Gossip`]), and the registration's digest carries the
///   `[gossip]` table.
/// * Version 10: a `StateGet` may be flagged [`FrameFlags::undo_previous`] (a checkpoint
///   taken after a discarded round; see the [module docs](self)).
pub const PROTOCOL_VERSION: u32 = 10;

/// Largest control frame body (bytes). A placement of a 1e9-element tensor is ~1000 chunks,
/// far below this.
pub const MAX_CONTROL_FRAME: u32 = 64 << 20;

/// Size of [`FrameHeader`] on the wire.
pub const FRAME_HEADER_LEN: usize = 40;

/// Data frame magic.
pub const FRAME_MAGIC: [u8; 4] = *b"PPF1";

/// The largest payload a data frame may carry for a cluster with this partition size: twice
/// the partition plus 64 KiB (room for compressors whose worst case exceeds fp32, e.g. top-k
/// with large k, and for headers).
pub fn max_payload_len(partition_bytes: u64) -> u64 {
    partition_bytes.saturating_mul(2).saturating_add(64 * 1024)
}

/// Errors decoding frames or messages. Each says what was wrong.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolError {
    /// Fewer bytes than a header.
    #[error("truncated frame header: {got} of {FRAME_HEADER_LEN} bytes")]
    TruncatedHeader {
        /// Bytes received.
        got: usize,
    },
    /// Wrong magic.
    #[error("bad frame magic {got:02x?} (expected {FRAME_MAGIC:02x?}): not a pushpull data frame")]
    BadMagic {
        /// What arrived.
        got: [u8; 4],
    },
    /// Unknown kind byte.
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    /// Unknown op byte.
    #[error("unknown reduce op {0}")]
    BadOp(u8),
    /// Flags that are unknown or do not fit the frame.
    #[error("bad frame flags {flags:#06x}: {why}")]
    BadFlags {
        /// The flags field.
        flags: u16,
        /// What is wrong.
        why: &'static str,
    },
    /// Payload larger than allowed.
    #[error("frame payload of {len} bytes exceeds the limit of {max} bytes")]
    Oversized {
        /// Declared length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The stream ended before the declared payload length.
    #[error("truncated frame payload: {got} of {expected} bytes")]
    TruncatedPayload {
        /// Received.
        got: u64,
        /// Declared.
        expected: u64,
    },
    /// A control frame failed to decode.
    #[error("malformed control message: {0}")]
    Malformed(String),
    /// A control frame longer than [`MAX_CONTROL_FRAME`].
    #[error("control frame of {len} bytes exceeds the limit of {MAX_CONTROL_FRAME} bytes")]
    ControlTooLarge {
        /// Declared length.
        len: u64,
    },
}

/// What a data frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[repr(u8)]
pub enum FrameKind {
    /// Worker → server, first frame of a connection: "I am worker `rank`".
    Hello = 1,
    /// Worker → server: this worker's contribution to `(key, round)`.
    Push = 2,
    /// Server → worker: the aggregated `(key, round)`.
    Result = 3,
    /// Server → worker: `(key, round)` was aborted; the payload is the error message.
    Abort = 4,
    /// Worker → server, round [`STATE_ROUND`](crate::checkpoint::STATE_ROUND), empty: "send me
    /// the key's state" (a checkpoint, between rounds).
    StateGet = 5,
    /// Worker → server, round [`STATE_ROUND`](crate::checkpoint::STATE_ROUND): the key's state
    /// ([`KeyState`](crate::checkpoint::KeyState)) to restore before its first round.
    StatePut = 6,
    /// Server → worker, round [`STATE_ROUND`](crate::checkpoint::STATE_ROUND): the answer to
    /// `StateGet` (the key's [`KeyState`](crate::checkpoint::KeyState)) or to `StatePut`
    /// (empty); a refusal is an `Abort` at that round.
    State = 7,
}

/// How a round combines the pushes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum in rank order (averaging is done by the worker after the pull).
    #[default]
    Sum = 0,
    /// Everyone receives the root's payload (the root rank is the header's `aux`).
    Broadcast = 1,
    /// Each worker receives its graph neighbours' payloads, relayed undecoded (see the
    /// [module docs](self) on gossip rounds).
    Gossip = 2,
}

/// Splits a gossip result into the `neighbours` payloads it carries (in ascending rank
/// order), each `part` bytes. An error says what the length should have been.
pub fn split_gossip_result(
    payload: &[u8],
    neighbours: usize,
    part: usize,
) -> Result<Vec<&[u8]>, String> {
    let want = neighbours.checked_mul(part);
    if want != Some(payload.len()) || (part == 0 && neighbours > 0) {
        return Err(format!(
            "a gossip result for {neighbours} neighbours of {part}-byte messages has {} bytes, \
             not {}",
            payload.len(),
            want.map_or("more than fits in memory".to_string(), |w| w.to_string())
        ));
    }
    Ok(payload.chunks_exact(part.max(1)).take(neighbours).collect())
}

/// The flags of a data frame (see the [module docs](self) on non-finite rounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FrameFlags {
    /// A sum push or result whose chunk was not finite (bit 0); its payload is empty.
    pub non_finite: bool,
    /// A sum push whose sender discarded the key's previous sum round, or a `StateGet` asking
    /// for the key's state with that round undone (bit 1).
    pub undo_previous: bool,
}

impl FrameFlags {
    const NON_FINITE: u16 = 1;
    const UNDO_PREVIOUS: u16 = 2;

    /// The flags as the header's u16.
    pub fn bits(self) -> u16 {
        let bit = |set: bool, bit: u16| if set { bit } else { 0 };
        bit(self.non_finite, Self::NON_FINITE) | bit(self.undo_previous, Self::UNDO_PREVIOUS)
    }

    /// The flags of a frame of `kind` and `op` with `payload_len` bytes, checked.
    fn decode(
        bits: u16,
        kind: FrameKind,
        op: ReduceOp,
        payload_len: u64,
    ) -> Result<FrameFlags, ProtocolError> {
        let bad = |why| Err(ProtocolError::BadFlags { flags: bits, why });
        if bits & !(Self::NON_FINITE | Self::UNDO_PREVIOUS) != 0 {
            return bad("unknown bits (known: 0x0001 non-finite, 0x0002 undo previous)");
        }
        let flags = FrameFlags {
            non_finite: bits & Self::NON_FINITE != 0,
            undo_previous: bits & Self::UNDO_PREVIOUS != 0,
        };
        let sum_push = kind == FrameKind::Push && op == ReduceOp::Sum;
        if flags.non_finite {
            if !(sum_push || kind == FrameKind::Result) {
                return bad("only a sum push or a result can be non-finite");
            }
            if payload_len != 0 {
                return bad("a non-finite frame carries no payload");
            }
        }
        if flags.undo_previous && !(sum_push || kind == FrameKind::StateGet) {
            return bad("only a sum push or a StateGet can undo the previous round");
        }
        Ok(flags)
    }
}

/// The fixed header of a data frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// What the frame is.
    pub kind: FrameKind,
    /// How the round combines pushes (pushes only).
    pub op: ReduceOp,
    /// Non-finite, undo previous (see the [module docs](self)).
    pub flags: FrameFlags,
    /// The worker's rank.
    pub rank: u32,
    /// The broadcast root; for a sum, the round's learning rate as f32 bits (0: none set).
    pub aux: u32,
    /// The chunk's key.
    pub key: u64,
    /// The round of this key.
    pub round: u64,
    /// Payload length in bytes.
    pub payload_len: u64,
}

impl FrameHeader {
    /// Encodes the header into exactly [`FRAME_HEADER_LEN`] bytes.
    pub fn encode(&self, out: &mut BytesMut) {
        out.reserve(FRAME_HEADER_LEN);
        out.put_slice(&FRAME_MAGIC);
        out.put_u8(self.kind as u8);
        out.put_u8(self.op as u8);
        out.put_u16_le(self.flags.bits());
        out.put_u32_le(self.rank);
        out.put_u32_le(self.aux);
        out.put_u64_le(self.key);
        out.put_u64_le(self.round);
        out.put_u64_le(self.payload_len);
    }

    /// The encoded header as bytes.
    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(FRAME_HEADER_LEN);
        self.encode(&mut b);
        b.freeze()
    }

    /// Decodes a header, checking the magic, the kind, the op, the flags and that the payload
    /// length is at most `max_payload`.
    pub fn decode(mut buf: &[u8], max_payload: u64) -> Result<FrameHeader, ProtocolError> {
        if buf.len() < FRAME_HEADER_LEN {
            return Err(ProtocolError::TruncatedHeader { got: buf.len() });
        }
        let mut magic = [0u8; 4];
        buf.copy_to_slice(&mut magic);
        if magic != FRAME_MAGIC {
            return Err(ProtocolError::BadMagic { got: magic });
        }
        let kind = match buf.get_u8() {
            1 => FrameKind::Hello,
            2 => FrameKind::Push,
            3 => FrameKind::Result,
            4 => FrameKind::Abort,
            5 => FrameKind::StateGet,
            6 => FrameKind::StatePut,
            7 => FrameKind::State,
            k => return Err(ProtocolError::BadKind(k)),
        };
        let op = match buf.get_u8() {
            0 => ReduceOp::Sum,
            1 => ReduceOp::Broadcast,
            2 => ReduceOp::Gossip,
            o => return Err(ProtocolError::BadOp(o)),
        };
        let flag_bits = buf.get_u16_le();
        let rank = buf.get_u32_le();
        let aux = buf.get_u32_le();
        let key = buf.get_u64_le();
        let round = buf.get_u64_le();
        let payload_len = buf.get_u64_le();
        if payload_len > max_payload {
            return Err(ProtocolError::Oversized {
                len: payload_len,
                max: max_payload,
            });
        }
        let flags = FrameFlags::decode(flag_bits, kind, op, payload_len)?;
        Ok(FrameHeader {
            kind,
            op,
            flags,
            rank,
            aux,
            key,
            round,
            payload_len,
        })
    }
}

/// A node's role in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub enum NodeRole {
    /// The rendezvous point.
    Scheduler,
    /// Holds a shard of the keys, sums pushes.
    Server,
    /// Runs training code, pushes gradients.
    Worker,
}

impl std::fmt::Display for NodeRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NodeRole::Scheduler => "scheduler",
            NodeRole::Server => "server",
            NodeRole::Worker => "worker",
        })
    }
}

/// Who a node is: role, id within the role (server id or worker rank) and address. Its
/// `Display` is what error messages print, e.g. `worker 1 (127.0.0.1:50312)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeName {
    /// The role.
    pub role: NodeRole,
    /// Server id or worker rank (0 for the scheduler).
    pub id: u32,
    /// The address the node is reached at (servers, scheduler) or connects from (workers).
    pub addr: SocketAddr,
}

impl std::fmt::Display for NodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.role {
            NodeRole::Scheduler => write!(f, "scheduler ({})", self.addr),
            r => write!(f, "{r} {} ({})", self.id, self.addr),
        }
    }
}

/// Node → scheduler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToScheduler {
    /// First message on the control stream.
    Register {
        /// [`PROTOCOL_VERSION`] of the sender.
        version: u32,
        /// `Server` or `Worker`.
        role: NodeRole,
        /// A worker may ask for a rank (a server for an id).
        requested_id: Option<u32>,
        /// Servers: the address workers dial.
        listen_addr: Option<SocketAddr>,
        /// The sender's cluster-relevant settings.
        digest: ClusterDigest,
    },
    /// Worker: declare a tensor (a collective; answered by [`FromScheduler::Declared`]).
    Declare {
        /// Tensor name; keys derive from it.
        name: String,
        /// Number of f32 elements.
        len: u64,
        /// The tensor's parameter map (after the worker overlaid the config's).
        params: ParamMap,
        /// The priority the declare call asked for (every worker must ask for the same);
        /// `None`: the scheduler's default, declaration order (see
        /// [`TensorPlacement::priority`]).
        priority: Option<i32>,
    },
    /// Server: it has set up the keys of a declared tensor (answer to
    /// [`FromScheduler::Placement`]), or could not (`error`).
    PlacementAck {
        /// Tensor name.
        name: String,
        /// Why the server refused the tensor, if it did.
        error: Option<String>,
    },
    /// Worker: enter barrier number `id` (barriers are numbered 0, 1, 2, … per worker).
    Barrier {
        /// The barrier's sequence number.
        id: u64,
    },
    /// Liveness, every heartbeat interval.
    Heartbeat,
    /// Worker: this worker is done (clean `finish`).
    Finished,
}

/// Scheduler → node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FromScheduler {
    /// Registration accepted; sent once every node has registered.
    Welcome {
        /// This node's server id or worker rank.
        id: u32,
        /// Everyone's addresses and the job seed.
        map: ClusterMap,
    },
    /// Registration refused (duplicate rank, config mismatch, version, cluster full); the
    /// node must exit with this message.
    Refused {
        /// What was wrong, naming the setting and both values where relevant.
        reason: String,
    },
    /// To servers: set up the keys of a tensor, then answer [`ToScheduler::PlacementAck`].
    Placement(TensorPlacement),
    /// To workers: the outcome of a declare collective.
    Declared {
        /// Tensor name.
        name: String,
        /// The placement, or the error every worker gets (e.g. lengths differ: names the
        /// tensor and both values).
        result: Result<TensorPlacement, String>,
    },
    /// To workers: barrier `id` is complete.
    BarrierDone {
        /// The barrier's sequence number.
        id: u64,
    },
    /// Liveness, every heartbeat interval.
    Heartbeat,
    /// A node went silent past the heartbeat timeout (or its connection closed). Every pending
    /// operation must fail with an error naming it.
    NodeLost {
        /// The lost node.
        node: NodeName,
        /// What the scheduler observed.
        reason: String,
    },
    /// The job is over: exit. `error` is set when it ended because of a failure.
    Shutdown {
        /// Why, when not a clean end.
        error: Option<String>,
    },
}

/// The cluster map every node receives in [`FromScheduler::Welcome`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Servers, indexed by server id.
    pub servers: Vec<SocketAddr>,
    /// Workers' addresses (as seen by the scheduler), indexed by rank.
    pub workers: Vec<SocketAddr>,
    /// The job seed (configured, or picked by the scheduler).
    pub job_seed: u64,
}

impl ClusterMap {
    /// The workers whose address has worker `rank`'s IP, `rank` included (at least 1): the
    /// processes that likely push through one host's link (`sendq::rate::Flow::Source`'s
    /// `sharers`). On loopback that is every worker, which changes nothing there: at
    /// loopback's rates a source's queue is set by its rate, not by the share.
    pub fn workers_on_host(&self, rank: u32) -> u32 {
        let Some(me) = self.workers.get(rank as usize) else {
            return 1;
        };
        let same = self.workers.iter().filter(|a| a.ip() == me.ip()).count();
        u32::try_from(same).unwrap_or(u32::MAX).max(1)
    }
}

/// One chunk of a tensor: `len` elements starting at element `offset`, key `key`, held by
/// server `server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkPlacement {
    /// The chunk's key (derived from the tensor name and chunk index).
    pub key: u64,
    /// First element (64-bit: tensors may exceed 4 Gi elements' worth of bytes).
    pub offset: u64,
    /// Number of elements.
    pub len: u64,
    /// Server id.
    pub server: u32,
}

/// Where a declared tensor's chunks live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorPlacement {
    /// Tensor name.
    pub name: String,
    /// Element count.
    pub len: u64,
    /// The agreed parameter map.
    pub params: ParamMap,
    /// The order in which this tensor's frames leave a connection relative to other tensors'
    /// (higher first; FIFO among equal priorities): pushes on every worker, results on every
    /// server. The priority every worker's declare asked for, or by default `-n` for the n-th
    /// tensor the scheduler placed (0, -1, -2, …): tensors declared earlier go first, as in
    /// BytePS, since the next forward pass needs the first layers first.
    pub priority: i32,
    /// The chunks, in element order.
    pub chunks: Vec<ChunkPlacement>,
}

impl TensorPlacement {
    /// Chunks held by server `server`.
    pub fn chunks_on(&self, server: u32) -> impl Iterator<Item = &ChunkPlacement> {
        self.chunks.iter().filter(move |c| c.server == server)
    }
}

/// The bincode configuration every control message (and [`crate::departure`]'s close reason)
/// uses: bincode's standard encoding, decoded with a limit of [`MAX_CONTROL_FRAME`] bytes on
/// what length fields may claim. Without the limit, a string or list whose length field claims
/// 2^62 bytes makes bincode allocate that much before reading it, and the node aborts.
pub(crate) fn bincode_config() -> bincode::config::Configuration<
    bincode::config::LittleEndian,
    bincode::config::Varint,
    bincode::config::Limit<{ MAX_CONTROL_FRAME as usize }>,
> {
    bincode::config::standard().with_limit()
}

/// The last path segment of `T`'s name (`FromScheduler`), for error messages.
fn message_name<T>() -> &'static str {
    std::any::type_name::<T>()
        .rsplit("::")
        .next()
        .unwrap_or("?")
}

/// A bincode decode error as a [`ProtocolError::Malformed`] naming the message type `T`.
fn malformed<T>(e: bincode::error::DecodeError) -> ProtocolError {
    let what = message_name::<T>();
    ProtocolError::Malformed(match e {
        bincode::error::DecodeError::LimitExceeded => {
            format!("{what}: a length field claims more than the {MAX_CONTROL_FRAME}-byte limit")
        }
        e => format!("{what}: {e}"),
    })
}

/// Encodes a control message as a control frame (u32 LE length + bincode body).
pub fn encode_control<T: Serialize>(msg: &T) -> Result<Bytes, ProtocolError> {
    let body = bincode::serde::encode_to_vec(msg, bincode_config())
        .map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    if body.len() as u64 > MAX_CONTROL_FRAME as u64 {
        return Err(ProtocolError::ControlTooLarge {
            len: body.len() as u64,
        });
    }
    let mut out = BytesMut::with_capacity(4 + body.len());
    out.put_u32_le(body.len() as u32);
    out.put_slice(&body);
    Ok(out.freeze())
}

/// Decodes a control frame body (without the length prefix). Trailing bytes are an error.
pub fn decode_control<T: DeserializeOwned>(body: &[u8]) -> Result<T, ProtocolError> {
    let (msg, used) =
        bincode::serde::decode_from_slice(body, bincode_config()).map_err(malformed::<T>)?;
    if used != body.len() {
        return Err(ProtocolError::Malformed(format!(
            "{}: {} trailing bytes after the message",
            message_name::<T>(),
            body.len() - used
        )));
    }
    Ok(msg)
}

/// Checks a control frame's length prefix.
pub fn check_control_len(len: u32) -> Result<usize, ProtocolError> {
    if len > MAX_CONTROL_FRAME {
        Err(ProtocolError::ControlTooLarge { len: len as u64 })
    } else {
        Ok(len as usize)
    }
}

/// A map from key to tensor name and chunk index, for error messages.
pub type KeyNames = BTreeMap<u64, (String, u32)>;

#[cfg(test)]
mod tests;
