//! [`Checkpoint`]: what a worker saves at a barrier so that a restarted job continues bit for
//! bit ([`crate::Worker::save_state`], [`crate::Worker::load_state`]), its file format, and the
//! check that a restarted job has the settings the checkpoint was taken with. Pure: no file, no
//! socket (the worker's shell in `worker/checkpoint.rs` does the I/O).
//!
//! # File format
//! | bytes | what |
//! |---|---|
//! | 8 | magic `b"PPCKPT\0\0"` |
//! | 4 | format version, u32 little-endian ([`CHECKPOINT_VERSION`]) |
//! | 8 | digest of the settings (FNV-1a 64 of their bincode), u64 little-endian |
//! | 8 | body length in bytes, u64 little-endian |
//! | 8 | FNV-1a 64 of the body, u64 little-endian |
//! | rest | the body: the checkpoint, bincode 2 (standard configuration, serde) |
//!
//! The body holds the settings in full (so a refusal names the setting that differs, not just
//! that the digests do), the learning rate, each tensor's next round and its chunks' chain
//! states ([`ChainState`]), and in rank 0's checkpoint every server key's [`KeyState`].

use std::collections::BTreeMap;

use pushpull_proto::checkpoint::{decode_exact, ChainState, KeyState};
use pushpull_proto::config::ClusterDigest;
use pushpull_proto::protocol::ChunkPlacement;
use pushpull_proto::ParamMap;
use serde::{Deserialize, Serialize};

/// The checkpoint file format's version; a file of another version is refused naming both.
/// Version 2 added each tensor's gradient bound; version 3 its last sum round and a discarded
/// round not yet carried to the servers; version 4 a PowerSGD tensor's state.
pub const CHECKPOINT_VERSION: u32 = 4;

const MAGIC: [u8; 8] = *b"PPCKPT\0\0";
const HEADER_LEN: usize = 8 + 4 + 8 + 8 + 8;

/// One worker's compressor state at a barrier, and the settings it was taken with: what
/// [`crate::Worker::checkpoint`] returns and [`crate::Worker::restore`] takes;
/// [`Checkpoint::to_bytes`] and [`Checkpoint::from_bytes`] are its file format (the module
/// docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub(crate) settings: Settings,
    /// The learning rate last set ([`crate::Worker::set_learning_rate`]) as f32 bits, 0: none.
    pub(crate) learning_rate: u32,
    /// By tensor name.
    pub(crate) tensors: BTreeMap<String, TensorState>,
    /// Every server key's state, by key (rank 0's checkpoint; empty on the others and in jobs
    /// without servers).
    pub(crate) servers: BTreeMap<u64, KeyState>,
}

/// The settings that change a job's results, as the checkpoint compares them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Settings {
    /// The worker's rank.
    pub(crate) rank: u32,
    /// The effective job seed (`cluster.seed`, or the one the scheduler picked).
    pub(crate) job_seed: u64,
    /// [`ClusterDigest`] without the settings that do not change results ([`results_only`]).
    pub(crate) cluster: ClusterDigest,
    /// Every declared tensor, by name.
    pub(crate) tensors: BTreeMap<String, TensorSettings>,
}

/// A declared tensor as far as results go: its length, parameter map and chunks (the priority
/// only orders frames).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TensorSettings {
    pub(crate) len: u64,
    pub(crate) params: ParamMap,
    pub(crate) chunks: Vec<ChunkPlacement>,
}

/// One tensor's state: its next round, each chunk's chain, the gradient bound `G` tracked
/// for moniqua's `theta_schedule = bound` (0: none), its last sum round, and a round
/// discarded ([`crate::Worker::discard_last_round`]) whose undoing the tensor's next push
/// still has to ask of the servers (the chains' states are saved with it undone, here and on
/// the servers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TensorState {
    pub(crate) next_round: u64,
    pub(crate) chains: Vec<ChainState>,
    pub(crate) gradient_bound: f32,
    pub(crate) last_sum: Option<u64>,
    pub(crate) discarded: Option<u64>,
    /// A PowerSGD tensor's state (`compressor = powersgd`), `None` for other tensors.
    pub(crate) low_rank: Option<LowRankState>,
}

/// A PowerSGD tensor's state: [`pushpull_kernels::PowerSgdState`] as the file keeps it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub(crate) struct LowRankState {
    pub(crate) step: u64,
    pub(crate) error: Vec<f32>,
    pub(crate) q: Vec<f32>,
}

impl From<&pushpull_kernels::PowerSgdState> for LowRankState {
    fn from(s: &pushpull_kernels::PowerSgdState) -> LowRankState {
        LowRankState {
            step: s.step,
            error: s.error.clone(),
            q: s.q.clone(),
        }
    }
}

impl From<LowRankState> for pushpull_kernels::PowerSgdState {
    fn from(s: LowRankState) -> pushpull_kernels::PowerSgdState {
        pushpull_kernels::PowerSgdState {
            step: s.step,
            error: s.error,
            q: s.q,
        }
    }
}

impl TensorState {
    /// It holds compressor state (some chain's is not empty, or PowerSGD's error or Q).
    pub(crate) fn stateful(&self) -> bool {
        self.chains.iter().any(|c| *c != ChainState::default())
            || self
                .low_rank
                .as_ref()
                .is_some_and(|l| !l.error.is_empty() || !l.q.is_empty())
    }
}

/// `digest` without the settings that may differ across a restart: timeouts, windows, the
/// UDP payload, the TLS name, and `cluster.seed` (the effective job seed is compared instead,
/// so a restart may name the seed the scheduler picked), and `[tensors.*]` (each declared
/// tensor's resulting map is compared instead).
pub(crate) fn results_only(mut digest: ClusterDigest) -> ClusterDigest {
    digest.heartbeat_interval_ms = 0;
    digest.heartbeat_timeout_ms = 0;
    digest.send_window_bytes = 0;
    digest.max_udp_payload = 0;
    digest.server_name = String::new();
    digest.seed = None;
    digest.tensors = BTreeMap::new();
    digest
}

impl Settings {
    /// The first setting of `self` (the checkpoint's) that differs in `now` (this job's), as a
    /// sentence naming it and both values; `None` when every one agrees.
    pub(crate) fn first_difference(&self, now: &Settings) -> Option<String> {
        if self.rank != now.rank {
            return Some(format!(
                "it is the checkpoint of rank {}, but this worker is rank {} (each worker loads its own)",
                self.rank, now.rank
            ));
        }
        if self.job_seed != now.job_seed {
            return Some(format!(
                "the job seed differs: the checkpoint's is {}, this job's is {} (set cluster.seed = {} to continue it)",
                self.job_seed, now.job_seed, self.job_seed
            ));
        }
        if let Some((key, ours, theirs)) = self.cluster.first_difference(&now.cluster) {
            return Some(format!(
                "{key} differs: {ours} in the checkpoint, {theirs} in this job"
            ));
        }
        for name in self.tensors.keys() {
            if !now.tensors.contains_key(name) {
                return Some(format!(
                    "tensor {name:?} is in the checkpoint but not declared in this job (declare every tensor before loading)"
                ));
            }
        }
        for (name, t) in &now.tensors {
            let Some(saved) = self.tensors.get(name) else {
                return Some(format!(
                    "tensor {name:?} is declared in this job but not in the checkpoint"
                ));
            };
            if saved.len != t.len {
                return Some(format!(
                    "tensor {name:?}: length {} in the checkpoint, {} in this job",
                    saved.len, t.len
                ));
            }
            if saved.params != t.params {
                return Some(format!(
                    "tensor {name:?}: parameter map {:?} in the checkpoint, {:?} in this job",
                    saved.params, t.params
                ));
            }
            if saved.chunks != t.chunks {
                return Some(format!(
                    "tensor {name:?}: chunks (offset, length, key, server) {:?} in the checkpoint, {:?} in this job",
                    chunk_list(&saved.chunks),
                    chunk_list(&t.chunks)
                ));
            }
        }
        None
    }
}

fn chunk_list(chunks: &[ChunkPlacement]) -> Vec<(u64, u64, u64, u32)> {
    chunks
        .iter()
        .map(|c| (c.offset, c.len, c.key, c.server))
        .collect()
}

/// FNV-1a, 64 bits: the settings' digest and the body's checksum (not a cryptographic hash:
/// it catches a truncated or damaged file, not a forged one).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Numbers, strings, vectors and maps into a Vec: cannot fail.
    bincode::serde::encode_to_vec(value, bincode::config::standard()).unwrap_or_default()
}

impl Checkpoint {
    /// The rank whose checkpoint this is.
    pub fn rank(&self) -> u32 {
        self.settings.rank
    }

    /// The job seed it was taken with.
    pub fn job_seed(&self) -> u64 {
        self.settings.job_seed
    }

    /// Each tensor's name and the round it continues with.
    pub fn rounds(&self) -> Vec<(String, u64)> {
        self.tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.next_round))
            .collect()
    }

    /// The number of server keys whose state it carries (rank 0's, with servers; else 0).
    pub fn server_keys(&self) -> usize {
        self.servers.len()
    }

    /// The digest of its settings: FNV-1a 64 of their bincode, as the file's header holds it.
    pub fn settings_digest(&self) -> u64 {
        fnv1a(&encode(&self.settings))
    }

    /// The file format (the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let body = encode(self);
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        out.extend_from_slice(&self.settings_digest().to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&fnv1a(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Reads [`Checkpoint::to_bytes`]'s format.
    ///
    /// # Errors
    /// A message saying what is wrong: not a checkpoint (the magic), another version (both
    /// named), truncated (how many bytes of how many), extra bytes, a checksum or settings
    /// digest that does not match (the file was damaged), or a body that does not decode.
    pub fn from_bytes(bytes: &[u8]) -> Result<Checkpoint, String> {
        if bytes.len() < HEADER_LEN {
            return Err(format!(
                "truncated: {} bytes, shorter than the {HEADER_LEN}-byte header",
                bytes.len()
            ));
        }
        if bytes[..8] != MAGIC {
            return Err(format!(
                "not a pushpull checkpoint: it starts with {:02x?}, not {MAGIC:02x?}",
                &bytes[..8]
            ));
        }
        let word = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if version != CHECKPOINT_VERSION {
            return Err(format!(
                "format version {version}, but this build reads version {CHECKPOINT_VERSION}"
            ));
        }
        let (digest, body_len, checksum) = (word(12), word(20), word(28));
        let body = &bytes[HEADER_LEN..];
        if (body.len() as u64) < body_len {
            return Err(format!(
                "truncated: {} bytes of a {}-byte file",
                bytes.len(),
                body_len.saturating_add(HEADER_LEN as u64)
            ));
        }
        if body.len() as u64 > body_len {
            return Err(format!(
                "{} bytes after the {}-byte checkpoint",
                body.len() as u64 - body_len,
                body_len + HEADER_LEN as u64
            ));
        }
        let found = fnv1a(body);
        if found != checksum {
            return Err(format!(
                "corrupted: the body's checksum is {found:#018x}, the header says {checksum:#018x}"
            ));
        }
        let checkpoint: Checkpoint = decode_exact(body, "the checkpoint's body")?;
        if checkpoint.settings_digest() != digest {
            return Err(format!(
                "corrupted: the settings' digest is {:#018x}, the header says {digest:#018x}",
                checkpoint.settings_digest()
            ));
        }
        Ok(checkpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        let cluster = results_only(pushpull_proto::Config::local(2, 1).digest());
        let chunk = ChunkPlacement {
            key: 9,
            offset: 0,
            len: 3,
            server: 0,
        };
        let tensors = BTreeMap::from([(
            "w".to_string(),
            TensorSettings {
                len: 3,
                params: ParamMap::from([("compressor".into(), "onebit".into())]),
                chunks: vec![chunk],
            },
        )]);
        Checkpoint {
            settings: Settings {
                rank: 0,
                job_seed: 42,
                cluster,
                tensors,
            },
            learning_rate: 0.5f32.to_bits(),
            tensors: BTreeMap::from([(
                "w".to_string(),
                TensorState {
                    next_round: 4,
                    chains: vec![ChainState {
                        residual: Some(vec![0.25, -1.0, 3.0]),
                        ..ChainState::default()
                    }],
                    gradient_bound: 0.75,
                    last_sum: Some(3),
                    discarded: Some(3),
                    low_rank: Some(LowRankState {
                        step: 4,
                        error: vec![0.5, 0.25, -2.0],
                        q: vec![1.0],
                    }),
                },
            )]),
            servers: BTreeMap::from([(9, KeyState::default())]),
        }
    }

    #[test]
    fn round_trips_and_every_damage_is_named() {
        let c = sample();
        let b = c.to_bytes();
        assert_eq!(Checkpoint::from_bytes(&b).unwrap(), c);
        for cut in 0..b.len() {
            let e = Checkpoint::from_bytes(&b[..cut]).unwrap_err();
            assert!(e.contains("truncated"), "cut at {cut}: {e}");
        }
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x10;
            let e = Checkpoint::from_bytes(&d).unwrap_err();
            let named = [
                "not a pushpull",
                "version",
                "corrupted",
                "truncated",
                "after the",
            ];
            assert!(named.iter().any(|n| e.contains(n)), "byte {i}: {e}");
        }
    }

    #[test]
    fn differences_name_the_setting() {
        let c = sample().settings;
        let mut d = c.clone();
        d.cluster.num_workers += 1;
        assert!(c
            .first_difference(&d)
            .unwrap()
            .contains("cluster.num_workers"));
        let mut d = c.clone();
        d.job_seed = 7;
        assert!(c
            .first_difference(&d)
            .unwrap()
            .contains("cluster.seed = 42"));
        let mut d = c.clone();
        d.tensors.get_mut("w").unwrap().len = 4;
        assert!(c
            .first_difference(&d)
            .unwrap()
            .contains("tensor \"w\": length 3"));
        let mut d = c.clone();
        d.tensors.get_mut("w").unwrap().chunks[0].server = 1;
        assert!(c.first_difference(&d).unwrap().contains("chunks"));
        let mut d = c.clone();
        d.rank = 1;
        assert!(c.first_difference(&d).unwrap().contains("rank 0"));
        assert_eq!(c.first_difference(&c), None);
    }
}
