//! The one error type of the crate.
//!
//! Every variant's message names what was wrong and what is allowed, so that it can be shown to
//! a user as is: a bad parameter names the key as the user spelled it, the value and the allowed
//! values; a bad payload names the compressor, the expected and the actual length; bad input
//! names the index of the first offending element.

/// Everything that can go wrong when building a compressor or running one.
///
/// The enum is `#[non_exhaustive]`: match on the variants you care about and keep a fallback.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// A parameter value that does not parse or is out of range.
    #[error("parameter \"{key}\" = \"{value}\": {allowed}")]
    BadValue {
        /// The key as it appeared in the map (e.g. `byteps_compressor_k`).
        key: String,
        /// The value as it appeared in the map.
        value: String,
        /// What is allowed (e.g. "expected a positive number (a fraction < 1 or a count >= 1)").
        allowed: String,
    },
    /// A key that no compressor or decorator knows.
    #[error("unknown parameter \"{key}\" (= \"{value}\"); known keys: {known}")]
    UnknownKey {
        /// The unknown key.
        key: String,
        /// Its value.
        value: String,
        /// The list of known keys.
        known: String,
    },
    /// A key that is known but has no meaning for the selected compressor or decorator.
    #[error("parameter \"{key}\" = \"{value}\" does not apply here: {why}")]
    NotApplicable {
        /// The key as it appeared in the map.
        key: String,
        /// Its value.
        value: String,
        /// Why, and where it would apply.
        why: String,
    },
    /// A required parameter is missing.
    #[error("parameter \"{key}\" is required by {needed_by}: {allowed}")]
    Missing {
        /// The key's short name (its BytePS spelling is listed in `allowed` where one exists).
        key: String,
        /// The compressor or decorator that needs it.
        needed_by: String,
        /// What is allowed.
        allowed: String,
    },
    /// Two spellings of the same key with different values.
    #[error("parameters \"{key}\" = \"{value}\" and \"{other_key}\" = \"{other_value}\" are two spellings of the same setting with different values")]
    Conflict {
        /// The first spelling.
        key: String,
        /// Its value.
        value: String,
        /// The second spelling.
        other_key: String,
        /// Its value.
        other_value: String,
    },
    /// The compressor is valid but refused for this purpose.
    #[error("{compressor}: {why}")]
    Refused {
        /// The compressor's name.
        compressor: String,
        /// Why it is refused and what to do instead.
        why: String,
    },
    /// A slice (input, output, accumulator or reference) has the wrong length.
    #[error("{compressor}: {what} has {actual} elements, expected {expected} (the chunk length)")]
    LengthMismatch {
        /// The compressor's name.
        compressor: String,
        /// Which slice: "input", "output", "accumulator" or "reference".
        what: &'static str,
        /// The chunk length the compressor is bound to.
        expected: usize,
        /// The slice's length.
        actual: usize,
    },
    /// The input holds a NaN or an infinity.
    #[error("{compressor}: {what} element {index} is {value}; NaN and infinities cannot be compressed (nothing was changed)")]
    NonFinite {
        /// The compressor's name.
        compressor: String,
        /// Which slice: "input" (or "compressed value" inside a decorator).
        what: &'static str,
        /// The index of the first non-finite element.
        index: usize,
        /// The element itself.
        value: f32,
    },
    /// Finite input whose statistics overflow f32 (e.g. `max - min` or a sum of squares).
    #[error("{compressor}: {detail}")]
    Overflow {
        /// The compressor's name.
        compressor: String,
        /// What overflowed.
        detail: String,
    },
    /// A payload whose length is wrong for this compressor and chunk length.
    #[error("{compressor}: payload is {actual} bytes, expected {expected}")]
    PayloadLength {
        /// The compressor's name.
        compressor: String,
        /// The expected length, e.g. "4100 bytes" or "between 8 and 4100 bytes".
        expected: String,
        /// The payload's length in bytes.
        actual: usize,
    },
    /// A payload of plausible length whose content is invalid (e.g. an index out of range).
    #[error("{compressor}: malformed payload: {detail}")]
    Malformed {
        /// The compressor's name.
        compressor: String,
        /// What is wrong.
        detail: String,
    },
    /// Something the round context must provide is missing or invalid (a learning rate, a
    /// reference).
    #[error("{compressor}: {detail}")]
    Context {
        /// The compressor's name.
        compressor: String,
        /// What is missing.
        detail: String,
    },
    /// The device a chunk lives on (a GPU, or its emulation) failed or refused the work.
    #[error("{compressor} on {device}: {detail}")]
    Device {
        /// The compressor's name.
        compressor: String,
        /// The device (`cuda:0`, `emulated`).
        device: String,
        /// What failed.
        detail: String,
    },
}

impl KernelError {
    /// Whether the error says the data is too large or not a number (a NaN or infinity in
    /// the input, or finite input whose compression overflows f32), as opposed to a bad
    /// context, parameter or payload. A round that fails this way leaves the state as it was,
    /// and a cluster answers it with a non-finite sum (see `pushpull_proto::protocol`'s
    /// `FrameFlags::NON_FINITE`) instead of failing.
    pub fn is_non_finite(&self) -> bool {
        matches!(
            self,
            KernelError::NonFinite { .. } | KernelError::Overflow { .. }
        )
    }

    pub(crate) fn bad(key: &str, value: &str, allowed: impl Into<String>) -> KernelError {
        KernelError::BadValue {
            key: key.to_string(),
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }

    pub(crate) fn len(
        compressor: &str,
        what: &'static str,
        expected: usize,
        actual: usize,
    ) -> KernelError {
        KernelError::LengthMismatch {
            compressor: compressor.to_string(),
            what,
            expected,
            actual,
        }
    }

    /// A payload of `actual` bytes where the format has exactly `expected` (also what the
    /// device's decoders say).
    pub fn payload_exact(compressor: &str, expected: usize, actual: usize) -> KernelError {
        KernelError::PayloadLength {
            compressor: compressor.to_string(),
            expected: format!("{expected} bytes"),
            actual,
        }
    }

    pub(crate) fn malformed(compressor: &str, detail: impl Into<String>) -> KernelError {
        KernelError::Malformed {
            compressor: compressor.to_string(),
            detail: detail.into(),
        }
    }

    pub(crate) fn overflow(compressor: &str, detail: impl Into<String>) -> KernelError {
        KernelError::Overflow {
            compressor: compressor.to_string(),
            detail: detail.into(),
        }
    }

    pub(crate) fn context(compressor: &str, detail: impl Into<String>) -> KernelError {
        KernelError::Context {
            compressor: compressor.to_string(),
            detail: detail.into(),
        }
    }
}

/// The crate's result: an error is a [`KernelError`].
pub type Result<T, E = KernelError> = std::result::Result<T, E>;
