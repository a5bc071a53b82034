//! Why a node closed its connections, as the QUIC application close code and reason it sends.
//!
//! When a node ends because *another* node failed (a server whose scheduler went silent, or
//! that was told a worker was lost), its peers may see its connection close before they hear
//! the news themselves. The close therefore says who is really at fault: a worker that reads
//! [`Departure::NodeLost`] from a server reports the node it names, not the server that was
//! only the messenger.
//!
//! | code | departure | reason bytes |
//! |---|---|---|
//! | 0 | [`Departure::Done`] | UTF-8 text |
//! | 1 | [`Departure::Refused`] | UTF-8: why the connection was refused |
//! | 2 | [`Departure::Failed`] | UTF-8: how this node failed by itself |
//! | 3 | [`Departure::NodeLost`] | bincode 2 of (lost node, why), as control messages |
//! | 4 | [`Departure::JobFailed`] | UTF-8: the scheduler's error that ended the job |
//!
//! Unknown codes and undecodable reasons read as [`Departure::Failed`] with the bytes as
//! (lossy) text: the closing node is then blamed, which is all a peer can know.

use crate::protocol::{bincode_config, NodeName};

/// Why a node closed its connections (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Departure {
    /// The job ended cleanly.
    Done(String),
    /// This connection was refused (e.g. a worker's `Hello` named a rank it does not hold).
    Refused(String),
    /// The node failed by itself.
    Failed(String),
    /// Another node was lost, which ended this one.
    NodeLost {
        /// The lost node.
        node: NodeName,
        /// Why, as this node learnt it.
        reason: String,
    },
    /// The scheduler ended the job with an error.
    JobFailed(String),
}

impl Departure {
    /// The close code.
    pub fn code(&self) -> u32 {
        match self {
            Departure::Done(_) => 0,
            Departure::Refused(_) => 1,
            Departure::Failed(_) => 2,
            Departure::NodeLost { .. } => 3,
            Departure::JobFailed(_) => 4,
        }
    }

    /// The close reason bytes.
    pub fn reason(&self) -> Vec<u8> {
        match self {
            Departure::Done(s)
            | Departure::Refused(s)
            | Departure::Failed(s)
            | Departure::JobFailed(s) => s.as_bytes().to_vec(),
            Departure::NodeLost { node, reason } => {
                bincode::serde::encode_to_vec((node, reason), bincode_config())
                    .unwrap_or_else(|_| format!("{node} was lost: {reason}").into_bytes())
            }
        }
    }

    /// Reads a close code and reason (never fails: see the module docs).
    pub fn from_close(code: u64, bytes: &[u8]) -> Departure {
        let text = || String::from_utf8_lossy(bytes).into_owned();
        match code {
            0 => Departure::Done(text()),
            1 => Departure::Refused(text()),
            // Control messages' configuration: its limit on what length fields claim keeps a
            // reason claiming a 2^62-byte string from aborting the reader.
            3 => match bincode::serde::decode_from_slice::<(NodeName, String), _>(
                bytes,
                bincode_config(),
            ) {
                // All of it, or garbage that happens to start like a node name.
                Ok(((node, reason), used)) if used == bytes.len() => {
                    Departure::NodeLost { node, reason }
                }
                _ => Departure::Failed(text()),
            },
            4 => Departure::JobFailed(text()),
            _ => Departure::Failed(text()),
        }
    }
}

impl std::fmt::Display for Departure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Departure::Done(s) | Departure::Refused(s) | Departure::Failed(s) => f.write_str(s),
            Departure::NodeLost { node, reason } => write!(f, "{node} was lost: {reason}"),
            Departure::JobFailed(s) => write!(f, "the scheduler ended the job: {s}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::NodeRole;

    fn lost() -> Departure {
        Departure::NodeLost {
            node: NodeName {
                role: NodeRole::Scheduler,
                id: 0,
                addr: "10.0.0.1:7000".parse().unwrap(),
            },
            reason: "no message for 3.0 s".into(),
        }
    }

    #[test]
    fn every_departure_reads_back_as_sent() {
        for d in [
            Departure::Done("server exiting".into()),
            Departure::Refused("rank 3 is not yours".into()),
            Departure::Failed("out of memory".into()),
            lost(),
            Departure::JobFailed("worker 1 lost".into()),
        ] {
            assert_eq!(Departure::from_close(d.code() as u64, &d.reason()), d);
        }
        assert_eq!(
            lost().to_string(),
            "scheduler (10.0.0.1:7000) was lost: no message for 3.0 s"
        );
    }

    #[test]
    fn unknown_codes_and_garbage_blame_the_closing_node() {
        assert_eq!(
            Departure::from_close(99, b"whatever"),
            Departure::Failed("whatever".into())
        );
        assert_eq!(
            Departure::from_close(3, b"\xff\xfe not bincode"),
            Departure::Failed("\u{fffd}\u{fffd} not bincode".into())
        );
        let mut trailing = lost().reason();
        trailing.extend_from_slice(b"junk");
        assert!(matches!(
            Departure::from_close(3, &trailing),
            Departure::Failed(_)
        ));
    }
}
