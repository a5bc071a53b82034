//! The plug-in point for compression on the data path.
//!
//! A [`ChunkCodec`] turns one chunk of f32 into the bytes a push carries, and a payload back
//! into f32 (or adds it into an accumulator, which is what a server does per push). The spine
//! ships [`Fp32Codec`] (raw little-endian f32, BytePS's `none`); the compression library's
//! compressors plug in behind the same trait.

/// Why a payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CodecError(pub String);

/// Encodes and decodes one chunk (one key) of fixed length.
pub trait ChunkCodec: Send {
    /// Elements in the chunk.
    fn len(&self) -> usize;
    /// Whether the chunk is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Largest payload `encode` can produce.
    fn max_encoded_len(&self) -> usize;
    /// Encodes `input` (exactly `len()` elements) for `round` into `out` (cleared first).
    fn encode(&mut self, input: &[f32], round: u64, out: &mut Vec<u8>) -> Result<(), CodecError>;
    /// Decodes `payload` of `round` into `out` (exactly `len()` elements), overwriting every
    /// element (a server decodes rank 0's push into the key's reused accumulator).
    fn decode(&self, payload: &[u8], round: u64, out: &mut [f32]) -> Result<(), CodecError>;
    /// Decodes `payload` of `round` and adds it into `acc`, element by element, without a
    /// temporary. Must equal `decode` followed by `+=`, bit for bit.
    fn decode_add(&self, payload: &[u8], round: u64, acc: &mut [f32]) -> Result<(), CodecError>;
    /// The learning rate of the round about to be encoded (what the training loop set with
    /// the worker's `set_learning_rate`; on servers, what the round's pushes carried). Called
    /// before `encode` whenever one is known; codecs that don't need it (everything but
    /// corrected error feedback) ignore it.
    fn set_learning_rate(&mut self, _lr: f32) {}
    /// A short description for logs, e.g. `ef(vanilla, onebit(scaling))`.
    fn describe(&self) -> String {
        format!("a codec of {} elements", self.len())
    }
}

/// Raw fp32, little-endian: 4 bytes per element.
#[derive(Debug, Clone)]
pub struct Fp32Codec {
    len: usize,
}

impl Fp32Codec {
    /// A codec for chunks of `len` elements.
    pub fn new(len: usize) -> Fp32Codec {
        Fp32Codec { len }
    }

    fn check(&self, payload: &[u8], out_len: usize) -> Result<(), CodecError> {
        if out_len != self.len {
            return Err(CodecError(format!(
                "buffer of {out_len} elements for a chunk of {}",
                self.len
            )));
        }
        if payload.len() != 4 * self.len {
            return Err(CodecError(format!(
                "fp32 payload of {} bytes, expected {} ({} elements)",
                payload.len(),
                4 * self.len,
                self.len
            )));
        }
        Ok(())
    }
}

impl ChunkCodec for Fp32Codec {
    fn len(&self) -> usize {
        self.len
    }

    fn max_encoded_len(&self) -> usize {
        4 * self.len
    }

    fn describe(&self) -> String {
        "fp32".into()
    }

    fn encode(&mut self, input: &[f32], _round: u64, out: &mut Vec<u8>) -> Result<(), CodecError> {
        if input.len() != self.len {
            return Err(CodecError(format!(
                "input of {} elements for a chunk of {}",
                input.len(),
                self.len
            )));
        }
        out.clear();
        out.reserve(4 * input.len());
        for v in input {
            out.extend_from_slice(&v.to_le_bytes());
        }
        Ok(())
    }

    fn decode(&self, payload: &[u8], _round: u64, out: &mut [f32]) -> Result<(), CodecError> {
        self.check(payload, out.len())?;
        for (o, b) in out.iter_mut().zip(payload.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }

    fn decode_add(&self, payload: &[u8], _round: u64, acc: &mut [f32]) -> Result<(), CodecError> {
        self.check(payload, acc.len())?;
        for (o, b) in acc.iter_mut().zip(payload.chunks_exact(4)) {
            *o += f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp32_round_trip_and_add() {
        let x: Vec<f32> = (0..1001).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
        let mut c = Fp32Codec::new(x.len());
        let mut bytes = Vec::new();
        c.encode(&x, 0, &mut bytes).unwrap();
        assert_eq!(bytes.len(), c.max_encoded_len());
        let mut y = vec![0.0; x.len()];
        c.decode(&bytes, 0, &mut y).unwrap();
        assert_eq!(x, y);
        let mut acc = x.clone();
        c.decode_add(&bytes, 0, &mut acc).unwrap();
        assert!(acc.iter().zip(&x).all(|(a, b)| *a == b + b));
        let e = c.decode(&bytes[..7], 0, &mut y).unwrap_err().to_string();
        assert!(e.contains("7 bytes") && e.contains("4004"), "{e}");
    }
}
