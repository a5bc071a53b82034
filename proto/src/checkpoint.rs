//! The compressor state a checkpoint carries across a restart: one chain's ([`ChainState`]:
//! error-feedback residual, momentum, the previous learning rate) and one server key's
//! ([`KeyState`]: its chain and its next round), and how a key's state travels between a
//! worker and the server that holds the key ([`FrameKind::StateGet`],
//! [`FrameKind::StatePut`], [`FrameKind::State`], all at round [`STATE_ROUND`]).
//!
//! [`FrameKind::StateGet`]: crate::protocol::FrameKind::StateGet
//! [`FrameKind::StatePut`]: crate::protocol::FrameKind::StatePut
//! [`FrameKind::State`]: crate::protocol::FrameKind::State

use serde::{Deserialize, Serialize};

/// The round field of the state frames: no round of a key reaches it, so a worker's table of
/// waiting chunks tells the answer to a state frame from a round's result.
pub const STATE_ROUND: u64 = u64::MAX;

/// The state of one compressor chain that its next rounds depend on. A chain without
/// error feedback or momentum has none (`ChainState::default()`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChainState {
    /// Error feedback's residual `e`, if the chain has error feedback.
    pub residual: Option<Vec<f32>>,
    /// Nesterov momentum's `m`, if the chain has momentum (workers only).
    pub momentum: Option<Vec<f32>>,
    /// Corrected error feedback's learning rate of its last round (`η_{t−1}`), if any.
    pub prev_lr: Option<f32>,
}

/// What a server keeps of one key across a restart: the round it expects next and its chain's
/// state. Sent as the payload of a `State` frame (the server's answer to `StateGet`) and of a
/// `StatePut` frame (a restarted worker's, before the key's first round).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KeyState {
    /// The next round of the key.
    pub round: u64,
    /// The server chain's state.
    pub chain: ChainState,
}

impl KeyState {
    /// The state as bytes (bincode 2, standard configuration).
    pub fn encode(&self) -> Vec<u8> {
        // Encoding plain numbers and vectors into a Vec cannot fail.
        bincode::serde::encode_to_vec(self, bincode::config::standard()).unwrap_or_default()
    }

    /// Decodes [`KeyState::encode`]'s bytes; a length field may claim at most `bytes.len()`
    /// bytes, and trailing bytes are an error.
    pub fn decode(bytes: &[u8]) -> Result<KeyState, String> {
        decode_exact(bytes, "a key's state")
    }
}

/// The most bytes a length field in a checkpoint may claim (1 TiB): far above any tensor, far
/// below what a corrupt length field (2^62) would make a decoder reserve.
pub const MAX_STATE_BYTES: usize = 1 << 40;

/// Decodes one `T` from all of `bytes` (bincode 2, standard configuration, length fields
/// bounded by [`MAX_STATE_BYTES`]); trailing bytes are an error; `what` names it in the error.
pub fn decode_exact<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, String> {
    let config = bincode::config::standard().with_limit::<MAX_STATE_BYTES>();
    let (value, used) =
        bincode::serde::decode_from_slice(bytes, config).map_err(|e| format!("{what}: {e}"))?;
    if used != bytes.len() {
        return Err(format!(
            "{what}: {} trailing bytes after its end",
            bytes.len() - used
        ));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_state_round_trips_and_refuses_truncation() {
        let s = KeyState {
            round: 7,
            chain: ChainState {
                residual: Some(vec![1.5, -0.25, f32::MIN_POSITIVE]),
                momentum: None,
                prev_lr: Some(0.1),
            },
        };
        let b = s.encode();
        assert_eq!(KeyState::decode(&b).unwrap(), s);
        for cut in 0..b.len() {
            assert!(KeyState::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(KeyState::decode(&long).unwrap_err().contains("trailing"));
    }
}
