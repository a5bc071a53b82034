//! [`ClusterDigest`]: the settings every node of a cluster must share, and how two digests are
//! compared (the first difference, named by its key).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{scalar_to_string, Config, ParamMap};

impl Config {
    /// The settings that must be equal on every node of a cluster.
    pub fn digest(&self) -> ClusterDigest {
        ClusterDigest {
            num_workers: self.cluster.num_workers,
            num_servers: self.cluster.num_servers,
            partition_bytes: self.cluster.partition_bytes,
            max_chunk_payload_bytes: self.cluster.chunk_payload_bound(),
            min_compress_bytes: self.cluster.min_compress_bytes,
            seed: self.cluster.seed,
            heartbeat_interval_ms: self.cluster.heartbeat_interval_ms,
            heartbeat_timeout_ms: self.cluster.heartbeat_timeout_ms,
            send_window_bytes: self.cluster.send_window_bytes,
            max_udp_payload: self.cluster.max_udp_payload,
            local_size: self.cluster.local_size,
            force_distributed: self.cluster.force_distributed,
            server_name: self.tls.server_name.clone(),
            gossip_mixing: self
                .gossip
                .mixing
                .iter()
                .flatten()
                .map(|row| row.iter().map(|v| v.to_bits()).collect())
                .collect(),
            gossip_gamma: self.gossip.gamma.to_bits(),
            tensors: self
                .tensors
                .tables
                .iter()
                .map(|(t, m)| {
                    (
                        t.clone(),
                        m.iter()
                            .filter_map(|(k, v)| Some((k.clone(), scalar_to_string(v).ok()?)))
                            .collect(),
                    )
                })
                .collect(),
        }
    }
}

/// The cluster-relevant settings a node sends when it registers; the scheduler refuses a node
/// whose digest differs from its own and says which setting differs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterDigest {
    /// `cluster.num_workers`.
    pub num_workers: u32,
    /// `cluster.num_servers`.
    pub num_servers: u32,
    /// `cluster.partition_bytes`.
    pub partition_bytes: u64,
    /// `cluster.max_chunk_payload_bytes`, or its default from `partition_bytes`.
    pub max_chunk_payload_bytes: u64,
    /// `cluster.min_compress_bytes`.
    pub min_compress_bytes: u64,
    /// `cluster.seed`.
    pub seed: Option<u64>,
    /// `cluster.heartbeat_interval_ms`.
    pub heartbeat_interval_ms: u64,
    /// `cluster.heartbeat_timeout_ms`.
    pub heartbeat_timeout_ms: u64,
    /// `cluster.send_window_bytes`.
    pub send_window_bytes: u64,
    /// `cluster.max_udp_payload`.
    pub max_udp_payload: u16,
    /// `cluster.local_size`.
    pub local_size: u32,
    /// `cluster.force_distributed`.
    pub force_distributed: bool,
    /// `tls.server_name`.
    pub server_name: String,
    /// `gossip.mixing`, each entry's f64 bits (empty: the default ring).
    pub gossip_mixing: Vec<Vec<u64>>,
    /// `gossip.gamma`'s f64 bits.
    pub gossip_gamma: u64,
    /// `[tensors.*]`, values as strings.
    pub tensors: BTreeMap<String, ParamMap>,
}

impl ClusterDigest {
    /// The first setting that differs, as `(key, ours, theirs)`, or `None` if all agree.
    pub fn first_difference(&self, theirs: &ClusterDigest) -> Option<(String, String, String)> {
        macro_rules! cmp {
            ($field:ident, $key:expr) => {
                if self.$field != theirs.$field {
                    return Some((
                        $key.to_string(),
                        format!("{:?}", self.$field),
                        format!("{:?}", theirs.$field),
                    ));
                }
            };
        }
        cmp!(num_workers, "cluster.num_workers");
        cmp!(num_servers, "cluster.num_servers");
        cmp!(partition_bytes, "cluster.partition_bytes");
        cmp!(max_chunk_payload_bytes, "cluster.max_chunk_payload_bytes");
        cmp!(min_compress_bytes, "cluster.min_compress_bytes");
        cmp!(seed, "cluster.seed");
        cmp!(heartbeat_interval_ms, "cluster.heartbeat_interval_ms");
        cmp!(heartbeat_timeout_ms, "cluster.heartbeat_timeout_ms");
        cmp!(send_window_bytes, "cluster.send_window_bytes");
        cmp!(max_udp_payload, "cluster.max_udp_payload");
        cmp!(local_size, "cluster.local_size");
        cmp!(force_distributed, "cluster.force_distributed");
        cmp!(server_name, "tls.server_name");
        cmp!(gossip_mixing, "gossip.mixing");
        cmp!(gossip_gamma, "gossip.gamma");
        let tables: std::collections::BTreeSet<&String> =
            self.tensors.keys().chain(theirs.tensors.keys()).collect();
        for t in tables {
            let (a, b) = (self.tensors.get(t), theirs.tensors.get(t));
            if a != b {
                return Some((format!("tensors.{t:?}"), format!("{a:?}"), format!("{b:?}")));
            }
        }
        None
    }
}
