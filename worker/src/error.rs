//! [`WorkerError`]: everything a worker call can fail with.
//!
//! Errors are `Clone` (one node loss fails every pending call with the same error), so they
//! carry messages rather than the underlying I/O errors. Every message names what it is about:
//! the tensor (and its chunk, key and round on the data path), or the node that was lost, as
//! [`NodeName`] prints it (`worker 1 (10.0.0.2:50312)`, `server 0 (10.0.0.3:9100)`,
//! `scheduler (10.0.0.1:9000)`).

use pushpull_net::transport::TransportError;
use pushpull_proto::departure::Departure;
use pushpull_proto::NodeName;

/// A transport error as the reason a node was lost (without repeating the peer's name).
pub(crate) fn transport_reason(e: &TransportError) -> String {
    match e {
        TransportError::Connection { source, .. } => format!("connection lost ({source})"),
        TransportError::Stream { message, .. } => format!("stream failed ({message})"),
        other => other.to_string(),
    }
}

/// Why a round could not use the caller's data: encode a chunk of it, decode a result into it,
/// or move it between host and device (`crate::data`). The round reports it as
/// [`WorkerError::Codec`], naming the chunk, the key and the round.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum DataError {
    /// The chunk's codec failed; its message names the compressor and what was wrong.
    #[error("{0}")]
    Codec(#[from] pushpull_kernels::KernelError),
    /// The device failed: a driver call, a copy between host and device, the call's batch.
    #[error("{0}")]
    Device(String),
    /// The data does not fit the round: a gossip result that does not split into the
    /// neighbours' messages, a gossip result for a tensor that is summed.
    #[error("{0}")]
    Mismatch(String),
    /// What was being done when `source` failed (encoding this worker's own gossip message,
    /// decoding a neighbour's).
    #[error("{doing}: {source}")]
    During {
        doing: String,
        source: Box<DataError>,
    },
}

impl DataError {
    /// `self`, as what failed while `doing`.
    pub(crate) fn during(self, doing: impl Into<String>) -> DataError {
        DataError::During {
            doing: doing.into(),
            source: Box::new(self),
        }
    }
}

/// An error from a [`crate::Worker`] call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkerError {
    /// The configuration is invalid, or the TLS identity named by `[tls]` could not be loaded.
    /// Fix the file; retrying won't help.
    #[error("worker configuration: {0}")]
    Config(String),

    /// A node could not be reached while joining (the scheduler within
    /// `cluster.connect_timeout_ms`, or a server named in the cluster map).
    #[error("cannot connect to {node}: {message}")]
    Connect {
        /// The node, e.g. `scheduler (127.0.0.1:9000)` or `server 1 (10.0.0.3:9100)`.
        node: String,
        /// Why (quinn's or rustls's message, or how long it tried).
        message: String,
    },

    /// The scheduler refused the registration (duplicate or out-of-range rank, a setting that
    /// differs from the scheduler's, cluster full, protocol version). The reason names the
    /// setting and both values where there are two.
    #[error("the scheduler refused this worker: {reason}")]
    Refused {
        /// The scheduler's message.
        reason: String,
    },

    /// A node of the job was lost: the scheduler reported it (`NodeLost`), or this worker lost
    /// its connection to it, or the scheduler went silent for longer than
    /// `cluster.heartbeat_timeout_ms`. The job cannot continue; every pending and later call
    /// of this worker fails with this error.
    #[error("{node} was lost: {reason}")]
    NodeLost {
        /// Who.
        node: NodeName,
        /// What was observed.
        reason: String,
    },

    /// A member of this worker's local group (`cluster.local_size` > 1) is gone: its process
    /// ended or closed its link to the group. The group cannot sum another chunk; every pending
    /// and later call fails with this error.
    #[error("worker {rank} (local rank {local_rank} of host {host}) was lost: {reason}")]
    MemberLost {
        /// Its rank.
        rank: u32,
        /// Its local rank.
        local_rank: u32,
        /// Its host's index.
        host: u32,
        /// What was observed.
        reason: String,
    },

    /// The local group could not be formed or used (shared memory, its sockets, a member that
    /// answered something else than expected).
    #[error("local group of host {host}: {message}")]
    LocalGroup {
        /// The host's index.
        host: u32,
        /// What went wrong, naming the member or the field.
        message: String,
    },

    /// The scheduler ended the job because of a failure (`Shutdown` with an error) without
    /// first naming a lost node. Every pending and later call fails with this error.
    #[error("the scheduler ended the job: {reason}")]
    JobFailed {
        /// The scheduler's message.
        reason: String,
    },

    /// The scheduler ended the job cleanly, but this worker had not finished. Happens only when
    /// the scheduler and this worker disagree about the job's end.
    #[error("the scheduler shut the job down (it considers every worker finished)")]
    ShutDown,

    /// A peer broke the protocol (a malformed frame or an unexpected message). The connection
    /// can't be trusted, so the job fails as for a lost node.
    #[error("protocol error from {peer}: {message}")]
    Protocol {
        /// The peer, e.g. `server 0 (127.0.0.1:9100)`.
        peer: String,
        /// What was wrong.
        message: String,
    },

    /// [`crate::Worker::finish`] was called (on this handle or a clone): no more operations.
    #[error("this worker has finished (finish() was called); no more operations are possible")]
    Finished,

    /// The last [`crate::Worker`] handle was dropped without `finish` while this operation
    /// was running in the background.
    #[error("the worker was dropped without finish(); its operations were cancelled")]
    Dropped,

    /// [`crate::Worker::abort`] ended this worker after a failure while this operation was
    /// running in the background.
    #[error("the worker was aborted ({reason}); its operations were cancelled")]
    Abandoned {
        /// The reason given to `abort`.
        reason: String,
    },

    /// The scheduler answered a declare with an error (lengths or parameters differ between
    /// workers, a key collision, a server refused the tensor). Names the tensor and both
    /// values. Other tensors keep working.
    #[error("declare of tensor {name:?} failed: {message}")]
    Declare {
        /// The tensor.
        name: String,
        /// The scheduler's message.
        message: String,
    },

    /// The tensor is not declared on this worker: a name-based lookup failed, or a
    /// [`crate::Tensor`] handle from another `Worker` was passed.
    #[error("tensor {name:?} is not declared on this worker (call declare first; a Tensor from another Worker can't be used)")]
    Undeclared {
        /// The tensor's name.
        name: String,
    },

    /// The buffer passed to push_pull/broadcast does not have the declared length. Nothing was
    /// sent and no round was used.
    #[error("tensor {name:?} was declared with {declared} elements, but the buffer has {got}")]
    LengthMismatch {
        /// The tensor.
        name: String,
        /// Its declared length.
        declared: u64,
        /// The buffer's length.
        got: u64,
    },

    /// A gradient reported with [`crate::Worker::track_gradient`] holds a value that is not
    /// finite, or a bound given to [`crate::Worker::report_gradient_bound`] is not a finite
    /// number ≥ 0. Nothing was recorded.
    #[error("tensor {name:?}: {message}")]
    BadGradient {
        /// The tensor.
        name: String,
        /// The element or the bound, and its value.
        message: String,
    },

    /// A tensor appears more than once in one [`crate::Worker::push_pull_group_into`] call (a
    /// tensor's rounds run one after another: make a second call). Nothing was sent for that
    /// entry and no round was used.
    #[error("tensor {name:?} appears more than once in one group call; a tensor's rounds run one after another, so reduce it again in a later call")]
    TwiceInGroup {
        /// The tensor.
        name: String,
    },

    /// A device buffer this call cannot use: the tensor's push_pull rounds (and its
    /// error-feedback and momentum state) live elsewhere, or the device failed before anything
    /// was sent. Nothing was sent and no round was used.
    #[error("tensor {name:?}: {message}")]
    Device {
        /// The tensor.
        name: String,
        /// What is wrong, naming the devices.
        message: String,
    },

    /// A call that does not fit how the tensor is exchanged: `push_pull` of a tensor declared
    /// with `exchange = "gossip"`, or `gossip` of one that is summed. Nothing was sent and no
    /// round was used.
    #[error("{op} of tensor {name:?}: {message}")]
    WrongExchange {
        /// The call (`push_pull`, `gossip`).
        op: &'static str,
        /// The tensor.
        name: String,
        /// What the tensor is exchanged by and what to call instead.
        message: String,
    },

    /// A broadcast root that is not a rank of the job. Nothing was sent.
    #[error("broadcast of tensor {name:?}: root {root} is not a rank (the job has {num_workers} workers)")]
    BadRoot {
        /// The tensor.
        name: String,
        /// The requested root.
        root: u32,
        /// Workers in the job.
        num_workers: u32,
    },

    /// A server aborted a round of one chunk (a bad push from some worker: wrong length,
    /// undecodable payload, mismatching op, ...). The message is the server's and names the
    /// worker that caused it. The round still completed for every other chunk, so the tensor's
    /// rounds stay in step with the other workers; the next call may succeed.
    #[error("{op} of tensor {name:?} aborted by {server} at chunk {chunk} (key {key:#018x}, round {round}): {message}")]
    Aborted {
        /// `push_pull` or `broadcast`.
        op: &'static str,
        /// The tensor.
        name: String,
        /// Chunk index within the tensor.
        chunk: u32,
        /// The chunk's key.
        key: u64,
        /// The tensor's round.
        round: u64,
        /// The server that aborted, e.g. `server 0 (127.0.0.1:9100)`.
        server: String,
        /// The server's message.
        message: String,
    },

    /// The chunk's codec failed to encode this worker's data or to decode a result.
    #[error(
        "tensor {name:?} chunk {chunk} (key {key:#018x}, round {round}): codec error: {message}"
    )]
    Codec {
        /// The tensor.
        name: String,
        /// Chunk index.
        chunk: u32,
        /// The chunk's key.
        key: u64,
        /// The round.
        round: u64,
        /// The codec's message.
        message: String,
    },

    /// The placement the scheduler sent cannot be applied here (chunks that don't tile the
    /// tensor, a server id outside the map, a chunk too large for this machine's address space,
    /// or the codec factory refused a chunk).
    #[error("tensor {name:?}: unusable placement: {message}")]
    Placement {
        /// The tensor.
        name: String,
        /// What was wrong.
        message: String,
    },

    /// A checkpoint could not be saved or loaded ([`crate::Worker::save_state`],
    /// [`crate::Worker::load_state`]): the file could not be read or written, is not a
    /// checkpoint, is truncated or corrupted, or was saved with a setting that changes results
    /// and differs here (the message names the setting and both values), or the job is not in
    /// a state to save or restore (named).
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The file, or `(in memory)` for [`crate::Checkpoint`] values.
        path: String,
        /// What was wrong.
        message: String,
    },

    /// A bug or a runtime failure (a background task panicked, the blocking wrapper could not
    /// start its runtime).
    #[error("internal worker error: {0}")]
    Internal(String),
}

impl WorkerError {
    /// What losing the connection to `server` means. A server that ended because another
    /// node was lost says so in its close ([`Departure`]); then that node is the one lost
    /// (or the job failed, if the scheduler ended it), and `server` only reported it.
    /// Otherwise `server` itself was lost.
    pub(crate) fn server_lost(server: &NodeName, e: &TransportError) -> WorkerError {
        let source = match e {
            TransportError::Connection { source, .. } => source,
            other => {
                return WorkerError::NodeLost {
                    node: server.clone(),
                    reason: transport_reason(other),
                }
            }
        };
        WorkerError::server_connection_lost(server, source)
    }

    /// [`WorkerError::server_lost`] for the connection error itself.
    pub(crate) fn server_connection_lost(
        server: &NodeName,
        e: &quinn::ConnectionError,
    ) -> WorkerError {
        if let quinn::ConnectionError::ApplicationClosed(close) = e {
            match Departure::from_close(close.error_code.into_inner(), &close.reason) {
                Departure::NodeLost { node, reason } => {
                    return WorkerError::NodeLost {
                        node,
                        reason: format!("{reason} (reported by {server})"),
                    }
                }
                Departure::JobFailed(reason) => return WorkerError::JobFailed { reason },
                _ => {}
            }
        }
        WorkerError::NodeLost {
            node: server.clone(),
            reason: format!("connection lost ({e})"),
        }
    }

    /// How this worker's connections close when this is the job's error: a lost node, or a
    /// lost member of its local group (`workers`: every worker's address, by rank), is named
    /// ([`Departure::NodeLost`]), so that the scheduler and the servers blame it, not the
    /// messenger; the scheduler's end of the job is passed on ([`Departure::JobFailed`]); a
    /// local group this worker could not use is its own failure ([`Departure::Failed`]).
    /// `None` for the other errors, which end one call, not the job. (A server closes the same
    /// way: `pushpull_server`'s `service.rs`.)
    pub(crate) fn departure(&self, workers: &[std::net::SocketAddr]) -> Option<Departure> {
        match self {
            WorkerError::NodeLost { node, reason } => Some(Departure::NodeLost {
                node: node.clone(),
                reason: reason.clone(),
            }),
            WorkerError::MemberLost { rank, reason, .. } => Some(Departure::NodeLost {
                node: NodeName {
                    role: pushpull_proto::NodeRole::Worker,
                    id: *rank,
                    addr: *workers.get(*rank as usize)?,
                },
                reason: reason.clone(),
            }),
            WorkerError::JobFailed { reason } => Some(Departure::JobFailed(reason.clone())),
            WorkerError::LocalGroup { .. } => Some(Departure::Failed(self.to_string())),
            _ => None,
        }
    }

    /// Whether this error ends the job for this worker (a lost node, a failed job, a protocol
    /// violation, finish, drop): every later call fails too. The other errors concern one call
    /// or one tensor.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            WorkerError::NodeLost { .. }
                | WorkerError::MemberLost { .. }
                | WorkerError::LocalGroup { .. }
                | WorkerError::JobFailed { .. }
                | WorkerError::ShutDown
                | WorkerError::Protocol { .. }
                | WorkerError::Finished
                | WorkerError::Dropped
                | WorkerError::Abandoned { .. }
                | WorkerError::Refused { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pushpull_proto::NodeRole;

    fn node(role: NodeRole, id: u32, port: u16) -> NodeName {
        NodeName {
            role,
            id,
            addr: ([127, 0, 0, 1], port).into(),
        }
    }

    fn closed_with(d: &Departure) -> quinn::ConnectionError {
        quinn::ConnectionError::ApplicationClosed(quinn::ApplicationClose {
            error_code: quinn::VarInt::from_u32(d.code()),
            reason: d.reason().into(),
        })
    }

    #[test]
    fn a_server_closing_because_of_another_node_names_that_node() {
        let server = node(NodeRole::Server, 0, 9100);
        let scheduler = node(NodeRole::Scheduler, 0, 9000);
        let lost = Departure::NodeLost {
            node: scheduler.clone(),
            reason: "no message for 3.0 s".into(),
        };
        assert_eq!(
            WorkerError::server_connection_lost(&server, &closed_with(&lost)).to_string(),
            "scheduler (127.0.0.1:9000) was lost: no message for 3.0 s \
             (reported by server 0 (127.0.0.1:9100))"
        );
        let failed = Departure::JobFailed("worker 1 lost".into());
        assert_eq!(
            WorkerError::server_connection_lost(&server, &closed_with(&failed)),
            WorkerError::JobFailed {
                reason: "worker 1 lost".into()
            }
        );
        // The server's own failure, a clean close while the job runs, a reset: the server.
        for e in [
            closed_with(&Departure::Failed("server exiting: out of memory".into())),
            closed_with(&Departure::Done("server exiting".into())),
            quinn::ConnectionError::TimedOut,
        ] {
            let got = WorkerError::server_connection_lost(&server, &e).to_string();
            assert!(
                got.starts_with("server 0 (127.0.0.1:9100) was lost: connection lost"),
                "{got}"
            );
        }
    }

    /// A worker whose job failed tells its peers who was lost (or that the scheduler ended
    /// the job), and the departure reads back as the same error at the other end.
    #[test]
    fn a_worker_closing_because_of_another_node_names_that_node() {
        let workers: Vec<std::net::SocketAddr> = (0..3)
            .map(|i| node(NodeRole::Worker, i, 5000 + i as u16).addr)
            .collect();
        let server = node(NodeRole::Server, 1, 9101);
        let lost = WorkerError::NodeLost {
            node: server.clone(),
            reason: "no heartbeat for 10.0 s".into(),
        };
        let member = WorkerError::MemberLost {
            rank: 2,
            local_rank: 0,
            host: 1,
            reason: "its group socket closed".into(),
        };
        let ended = WorkerError::JobFailed {
            reason: "worker 0 lost".into(),
        };
        let d = lost.departure(&workers).unwrap();
        assert_eq!(
            d.to_string(),
            "server 1 (127.0.0.1:9101) was lost: no heartbeat for 10.0 s"
        );
        // Read back at the other end: the lost one, reported by this worker.
        let back = Departure::from_close(d.code().into(), &d.reason());
        assert_eq!(back, d);
        let d = member.departure(&workers).unwrap();
        assert_eq!(
            d.to_string(),
            "worker 2 (127.0.0.1:5002) was lost: its group socket closed"
        );
        assert_eq!(
            ended.departure(&workers),
            Some(Departure::JobFailed("worker 0 lost".into()))
        );
        let group = WorkerError::LocalGroup {
            host: 0,
            message: "local rank 1 (worker 1) could not send a note to local rank 0".into(),
        };
        assert_eq!(
            group.departure(&workers),
            Some(Departure::Failed(group.to_string()))
        );
        // This worker's other errors, and a member the map does not know: the caller's reason.
        let own = WorkerError::Codec {
            name: "w".into(),
            chunk: 0,
            key: 0,
            round: 0,
            message: "bad".into(),
        };
        assert_eq!(own.departure(&workers), None);
        assert_eq!(member.departure(&workers[..2]), None);
    }

    #[test]
    fn lost_nodes_are_named_by_role_id_and_address() {
        let e = WorkerError::NodeLost {
            node: node(NodeRole::Worker, 1, 5000),
            reason: "no heartbeat for 10.0 s".into(),
        };
        assert_eq!(
            e.to_string(),
            "worker 1 (127.0.0.1:5000) was lost: no heartbeat for 10.0 s"
        );
        let e = WorkerError::NodeLost {
            node: node(NodeRole::Server, 0, 9100),
            reason: "connection lost".into(),
        };
        assert!(
            e.to_string()
                .starts_with("server 0 (127.0.0.1:9100) was lost"),
            "{e}"
        );
        let e = WorkerError::NodeLost {
            node: node(NodeRole::Scheduler, 0, 9000),
            reason: "silent".into(),
        };
        assert!(
            e.to_string()
                .starts_with("scheduler (127.0.0.1:9000) was lost"),
            "{e}"
        );
        assert!(e.is_fatal());
    }

    #[test]
    fn tensor_errors_name_the_tensor_and_values() {
        let e = WorkerError::LengthMismatch {
            name: "fc1.weight".into(),
            declared: 1_000_000_000,
            got: 999,
        };
        assert_eq!(
            e.to_string(),
            "tensor \"fc1.weight\" was declared with 1000000000 elements, but the buffer has 999"
        );
        assert!(!e.is_fatal());
        let e = WorkerError::Undeclared { name: "b".into() };
        assert!(
            e.to_string().contains("tensor \"b\" is not declared"),
            "{e}"
        );
        let e = WorkerError::Aborted {
            op: "push_pull",
            name: "w".into(),
            chunk: 3,
            key: 0xabc,
            round: 7,
            server: "server 1 (127.0.0.1:9101)".into(),
            message: "rank 1 pushed 8 bytes, expected 16".into(),
        };
        let s = e.to_string();
        for part in [
            "\"w\"",
            "server 1",
            "chunk 3",
            "0x0000000000000abc",
            "round 7",
            "rank 1",
        ] {
            assert!(s.contains(part), "{s} lacks {part}");
        }
        let e = WorkerError::BadRoot {
            name: "w".into(),
            root: 4,
            num_workers: 2,
        };
        assert!(e.to_string().contains("root 4") && e.to_string().contains("2 workers"));
        let e = WorkerError::Declare {
            name: "fc1.weight".into(),
            message:
                "tensor \"fc1.weight\": worker 0 declared 1000 elements, worker 1 declared 999"
                    .into(),
        };
        assert!(e.to_string().contains("1000") && e.to_string().contains("999"));
    }
}
