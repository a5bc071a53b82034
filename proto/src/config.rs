//! The TOML cluster file: one file that every node of a cluster reads.
//!
//! Every table and key is documented on its field below; `configs/local.toml` and
//! `configs/multi-host.toml` are commented examples. Unknown keys are rejected (serde's
//! `deny_unknown_fields`), so a typo is an error that names the key instead of a silently
//! ignored setting.
//!
//! ```toml
//! [cluster]
//! scheduler = "10.0.0.1:9000"   # where the scheduler listens and everyone dials
//! num_workers = 4
//! num_servers = 4
//!
//! [tls]
//! ca = "certs/ca.pem"
//! cert = "certs/node.pem"
//! key = "certs/node.key"
//!
//! [tensors.default]
//! compressor = "onebit"
//! ef = "vanilla"
//!
//! [tensors."fc1.weight"]
//! compressor = "topk"
//! k = 0.01
//! ```
//!
//! Settings that must agree across the cluster (see [`ClusterDigest`]) are compared by the
//! scheduler when a node registers; a node whose settings differ is refused with an error that
//! names the setting and both values.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::gossip::Mixing;
use serde::{Deserialize, Serialize};

/// The largest `cluster.send_window_bytes` (1 GiB).
pub const MAX_SEND_WINDOW_BYTES: u64 = 1 << 30;

/// The largest `cluster.max_udp_payload`: quinn 0.11 sends up to 10 datagrams in one
/// segmentation-offload batch, and the kernel refuses batches of 64 KiB or more (larger
/// datagrams stall the connection; measured on loopback, where 7000 fails and 6000 works).
pub const MAX_UDP_PAYLOAD: u16 = 6500;

/// A string-to-string parameter map for one tensor, as BytePS users write it.
pub type ParamMap = BTreeMap<String, String>;

/// Largest allowed `partition_bytes` (1 GiB): keeps every payload bound below `u32::MAX`-ish
/// sizes that a single QUIC stream handles comfortably.
pub const MAX_PARTITION_BYTES: u64 = 1 << 30;

/// The smallest chunk, in fp32 bytes, of a job that reduces on its one host without servers
/// ([`ClusterConfig::cut`]): BytePS's default partition.
pub const LOCAL_PARTITION_BYTES: u64 = 4_096_000;

/// An error in a cluster file: names the file, the key and what is allowed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// TOML syntax error, unknown key, missing key or wrong type (toml's message names the key
    /// and the line).
    #[error("invalid config {origin}: {message}")]
    Parse {
        /// The file name, or "(inline)".
        origin: String,
        /// toml's message.
        message: String,
    },
    /// A value that parsed but is not allowed.
    #[error("invalid config {origin}: `{key}` = {value}: {allowed}")]
    Invalid {
        /// The file name, or "(inline)".
        origin: String,
        /// The dotted key, e.g. `cluster.num_workers`.
        key: String,
        /// The value as written.
        value: String,
        /// What would be accepted.
        allowed: String,
    },
}

/// The whole cluster file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `[cluster]`: what every node must agree on.
    pub cluster: ClusterConfig,
    /// `[tls]`: certificates. Optional for `pushpull local`, which makes its own.
    #[serde(default)]
    pub tls: TlsConfig,
    /// `[server]`: settings of server processes.
    #[serde(default)]
    pub server: ServerConfig,
    /// `[worker]`: settings of worker processes.
    #[serde(default)]
    pub worker: WorkerConfig,
    /// `[metrics]`: the opt-in Prometheus endpoint every node may serve. Not part of the
    /// [`ClusterDigest`]: it changes no result.
    #[serde(default, skip_serializing_if = "MetricsConfig::is_off")]
    pub metrics: MetricsConfig,
    /// `[trace]`: the opt-in timeline, a Chrome trace file per process. Not part of the
    /// [`ClusterDigest`]: it changes no result.
    #[serde(default, skip_serializing_if = "TraceConfig::is_off")]
    pub trace: TraceConfig,
    /// `[gossip]`: the workers' graph for tensors exchanged by gossip (`exchange = "gossip"`
    /// in their map: decentralised averaging, Moniqua). Part of the [`ClusterDigest`].
    #[serde(default, skip_serializing_if = "GossipConfig::is_default")]
    pub gossip: GossipConfig,
    /// `[job]`: the built-in job that `pushpull-worker` and `pushpull local` run. Its keys are
    /// the job's (`pushpull_jobs::JobConfig` reads and checks them); a node that runs no job
    /// accepts the table as it is.
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub job: toml::Table,
    /// `[tensors.default]` and `[tensors."name"]`: per-tensor parameter maps.
    #[serde(default)]
    pub tensors: TensorsConfig,
}

/// `[cluster]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// `scheduler`: the scheduler's address, `host:port`: an IP address (the scheduler binds
    /// it, everyone else dials it) or a DNS name (the scheduler binds every address on the port;
    /// the others resolve the name, retrying until `connect_timeout_ms`, as on Kubernetes where
    /// a pod's address is known only by name). Port 0 lets the scheduler pick one (it prints
    /// the address).
    pub scheduler: String,
    /// `num_workers`: how many workers the job has (>= 1).
    pub num_workers: u32,
    /// `num_servers`: how many servers share the keys (>= 1).
    pub num_servers: u32,
    /// `partition_bytes`: the largest chunk of a tensor, in fp32 bytes (BytePS's
    /// `BYTEPS_PARTITION_BYTES`; default 131072, where BytePS uses 4096000). Must be a positive
    /// multiple of 4. A server can sum a chunk only once every worker's push of it has arrived,
    /// and results trail pushes by about one chunk per worker: on 100 Mbit/s links 128 KiB
    /// chunks keep both directions of every link busy, where 4 MB chunks leave a third idle
    /// (BENCHMARKS.md at 60710fe, "Why the chunk size matters"); on much faster links larger
    /// chunks save per-frame work.
    #[serde(default = "default_partition_bytes")]
    pub partition_bytes: u64,
    /// `max_chunk_payload_bytes`: the most bytes one chunk carries on the wire (default: a
    /// quarter of `partition_bytes`, at least 1024; 32768 at the default partition). A tensor
    /// whose codec would send more per `partition_bytes` chunk (fp32 tensors, those below
    /// `min_compress_bytes`, fp16 and bf16) gets chunks of `partition_bytes` halved until one
    /// fits (`pushpull_proto::placement::TensorCut`); compressed chunks are far smaller and
    /// keep `partition_bytes`. A chunk's sum leaves its server only once every worker's copy
    /// has arrived, so on a slow link results start, and trail the pushes, about one chunk per
    /// worker late: at 10 Mbit/s 128 KiB of fp32 is 0.1 s per copy (BENCHMARKS.md, "Chunk
    /// size"). At least 1024; at `partition_bytes` or more every tensor is cut at
    /// `partition_bytes` (fewer frames: less CPU on fast links). See
    /// [`ClusterConfig::chunk_payload_bound`].
    #[serde(default)]
    pub max_chunk_payload_bytes: Option<u64>,
    /// `min_compress_bytes`: tensors smaller than this travel uncompressed (default 65536).
    #[serde(default = "default_min_compress_bytes")]
    pub min_compress_bytes: u64,
    /// `seed`: the job seed for every stochastic compressor. Absent: the scheduler picks one,
    /// logs it and sends it to every node.
    #[serde(default)]
    pub seed: Option<u64>,
    /// `heartbeat_interval_ms`: how often nodes and the scheduler send heartbeats (default 1000).
    #[serde(default = "default_heartbeat_interval_ms")]
    pub heartbeat_interval_ms: u64,
    /// `heartbeat_timeout_ms`: a node silent this long is declared lost (default 10000). Must be
    /// at least twice the interval. Also quinn's idle timeout.
    #[serde(default = "default_heartbeat_timeout_ms")]
    pub heartbeat_timeout_ms: u64,
    /// `connect_timeout_ms`: how long a node keeps retrying to reach the scheduler at start-up
    /// (default 30000).
    #[serde(default = "default_connect_timeout_ms")]
    pub connect_timeout_ms: u64,
    /// `rendezvous_timeout_ms`: how long the scheduler waits, from its start, for every server
    /// and worker to register (default 300000). Past it the job fails: every waiting node gets
    /// an error saying who registered and who is missing. The scheduler logs who it waits for
    /// every 10 s meanwhile.
    #[serde(default = "default_rendezvous_timeout_ms")]
    pub rendezvous_timeout_ms: u64,
    /// `send_window_bytes`: the most bytes of data frames a node keeps in flight over all its
    /// connections (handed to QUIC, not yet acknowledged by the peer; default 16 MiB). Below
    /// it the window follows the network (a worker's: what the bare path holds at its
    /// measured delivery rate plus 256 KiB queued; a server's: its rate times the round trip
    /// its results see, 25–100 ms; at most twice the sum of the connections' congestion
    /// windows, at least 64 KiB; see `sendq::rate` and the net crate's `sender`); frames
    /// wait beyond it in priority order, and a frame leaves the
    /// window once delivered, whatever its round is doing (see `sendq`).
    #[serde(default = "default_send_window_bytes")]
    pub send_window_bytes: u64,
    /// `max_udp_payload`: the largest UDP payload QUIC's path MTU discovery tries (default and
    /// most 6500: jumbo frames get most of their benefit, and quinn sends up to 10 datagrams in
    /// one segmentation-offload batch, which must stay below 64 KiB; discovery settles lower on
    /// a path with a smaller MTU, e.g. at about 1452 on Ethernet's 1500). At least 1200.
    #[serde(default = "default_max_udp_payload")]
    pub max_udp_payload: u16,
    /// `local_size`: workers per host (BytePS's `BYTEPS_LOCAL_SIZE`; default 1). Above 1 the
    /// workers of one host form a local group (ranks `h * local_size ..` on host `h`, local rank
    /// `rank % local_size`): they sum their gradients through shared memory, and each chunk's
    /// sum is compressed and pushed once per host by one member, its owner
    /// ([`crate::placement::chunk_owner`]), so servers see `num_workers / local_size` pushes
    /// per chunk. Must divide `num_workers`. See ARCHITECTURE.md, "Two levels".
    #[serde(default = "default_local_size")]
    pub local_size: u32,
    /// `force_distributed`: with a single host (`local_size == num_workers` > 1), still push each
    /// chunk's sum through the servers (BytePS's `BYTEPS_FORCE_DISTRIBUTED`; default false:
    /// such a job finishes its reduction on the host, with no compression and no server).
    #[serde(default)]
    pub force_distributed: bool,
}

/// The cluster file's rules for cutting tensors into chunks ([`ClusterConfig::cut`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutRules {
    /// `cluster.partition_bytes`: the fp32 bytes of a chunk at most.
    pub partition_bytes: u64,
    /// `cluster.max_chunk_payload_bytes`: the bytes one chunk carries on the wire at most (a
    /// chunk whose payload would be larger is cut finer).
    pub max_chunk_payload_bytes: u64,
    /// `cluster.min_compress_bytes`: tensors below it travel as fp32.
    pub min_compress_bytes: u64,
}

impl ClusterConfig {
    /// The rules tensors are cut by: the file's `partition_bytes`, payload bound
    /// ([`ClusterConfig::chunk_payload_bound`]) and `min_compress_bytes`, except in a job that
    /// reduces on its one host without servers ([`ClusterConfig::uses_servers`] false), whose
    /// chunks only order the members' turns: there at least [`LOCAL_PARTITION_BYTES`] each
    /// (BytePS's default partition), so fewer chunks cost fewer notes between the members.
    pub fn cut(&self) -> CutRules {
        let floor = if self.uses_servers() {
            0
        } else {
            LOCAL_PARTITION_BYTES
        };
        CutRules {
            partition_bytes: self.partition_bytes.max(floor),
            max_chunk_payload_bytes: self.chunk_payload_bound().max(floor),
            min_compress_bytes: self.min_compress_bytes,
        }
    }

    /// How many hosts push each chunk: `num_workers / local_size`.
    pub fn num_hosts(&self) -> u32 {
        self.num_workers / self.local_size.max(1)
    }

    /// Whether chunks go through the servers: always without local groups (`local_size` 1)
    /// or with several hosts; a job that is one local group only when `force_distributed` is
    /// set.
    pub fn uses_servers(&self) -> bool {
        self.local_size <= 1 || self.num_hosts() > 1 || self.force_distributed
    }

    /// The payload bound chunks are cut to: `max_chunk_payload_bytes`, or a quarter of
    /// `partition_bytes` (at least 1024) where it is not set, so raising `partition_bytes` (to
    /// BytePS's 4096000, say) raises both.
    pub fn chunk_payload_bound(&self) -> u64 {
        self.max_chunk_payload_bytes
            .unwrap_or((self.partition_bytes / 4).max(1024))
    }
}

/// `[tls]`: PEM files of this node. All nodes' certificates must be signed by `ca` and carry
/// `server_name` as a DNS subject alternative name (`pushpull certs` makes such a set).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// `ca`: the cluster CA certificate (PEM). Peers must present a certificate it signed.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// `cert`: this node's certificate chain (PEM).
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// `key`: this node's private key (PEM, PKCS#8).
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// `server_name`: the DNS name clients verify in every server certificate (default
    /// `pushpull.cluster`); one cluster-wide name, so certificates don't depend on IPs.
    #[serde(default = "default_server_name")]
    pub server_name: String,
    /// `check_roles`: every node checks that a peer's certificate grants the role (and id) it
    /// claims, as a `pushpull://ROLE/ID` URI that `pushpull certs` writes (see
    /// [`crate::grant`]; default true). `false` accepts any certificate the cluster CA signed
    /// in any role: for certificates from one's own PKI that carry no such URI.
    #[serde(default = "default_true")]
    pub check_roles: bool,
    /// `refuse_loose_keys`: refuse to start with a private key file that group or others may
    /// read (as ssh does); default false, which only warns.
    #[serde(default)]
    pub refuse_loose_keys: bool,
}

impl TlsConfig {
    /// The node command-line flags that select these files: `--ca F --cert F --key F` (a flag
    /// whose file is unset gets an empty value, which the node then refuses naming it).
    pub fn to_args(&self) -> Vec<String> {
        let p = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        vec![
            "--ca".into(),
            p(&self.ca),
            "--cert".into(),
            p(&self.cert),
            "--key".into(),
            p(&self.key),
        ]
    }
}

/// `[server]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// `listen`: the address a server binds (default `0.0.0.0:0`: any interface, a free port).
    #[serde(default = "default_listen")]
    pub listen: String,
    /// `advertise`: the address workers should dial, if not the bound one (e.g. when binding
    /// `0.0.0.0`; default: the bound port on the address used to reach the scheduler).
    #[serde(default)]
    pub advertise: Option<String>,
}

/// `[worker]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// `device`: where device buffers are compressed: `auto` (on their device), `cpu` (copied
    /// to the host), `cuda` or `cuda:N` (a usable GPU required at join). Host buffers are
    /// always compressed on the CPU. See the worker crate's `Worker::push_pull_device`.
    #[serde(default = "default_device")]
    pub device: String,
}

/// `[metrics]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// `listen`: the address, IP:PORT, where each node (scheduler, server, worker) serves its
    /// Prometheus text metrics over HTTP (`GET /metrics`); absent (the default): no endpoint.
    /// Port 0 picks a free port (each node prints `pushpull-ROLE metrics on ADDR`); nodes that
    /// share a host and a fixed port need the per-node override (`--metrics ADDR`, or
    /// `PUSHPULL_METRICS=ADDR` for a Python worker). Bind a loopback address unless the
    /// metrics must be reachable from other hosts: they are served without TLS.
    #[serde(default)]
    pub listen: Option<String>,
}

impl MetricsConfig {
    /// No endpoint configured.
    pub fn is_off(&self) -> bool {
        self.listen.is_none()
    }
}

/// `[trace]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TraceConfig {
    /// `dir`: the folder where every node (scheduler, server, worker) writes its timeline,
    /// `<node>-<pid>.json` in the Chrome trace format (chrome://tracing, ui.perfetto.dev), when
    /// it ends; absent (the default): no timeline. The environment variable `PUSHPULL_TRACE`
    /// overrides it per process.
    #[serde(default)]
    pub dir: Option<String>,
    /// `start_step`: the first step recorded, from 1 (BytePS's `BYTEPS_TRACE_START_STEP`). A
    /// tensor's round `r` (from 0) is its step `r + 1`, on workers and servers alike.
    #[serde(default = "default_trace_start_step")]
    pub start_step: u64,
    /// `end_step`: the last step recorded (BytePS's `BYTEPS_TRACE_END_STEP`); absent: every
    /// step from `start_step` on.
    #[serde(default)]
    pub end_step: Option<u64>,
}

fn default_trace_start_step() -> u64 {
    1
}

impl Default for TraceConfig {
    fn default() -> TraceConfig {
        TraceConfig {
            dir: None,
            start_step: default_trace_start_step(),
            end_step: None,
        }
    }
}

impl TraceConfig {
    /// Nothing set: no timeline unless `PUSHPULL_TRACE` asks for one.
    pub fn is_off(&self) -> bool {
        *self == TraceConfig::default()
    }
}

/// `[gossip]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GossipConfig {
    /// `mixing`: the mixing matrix `W`, one row per worker (`W[i][j]`: the weight worker `i`
    /// gives worker `j`'s model; `j` is a neighbour of `i` where it is above 0). It must be
    /// symmetric, doubly stochastic, non-negative, with spectral gap `ρ < 1`
    /// ([`Mixing::new`] names what is wrong). Absent (the default): a ring, ⅓ on each
    /// neighbour and on itself ([`Mixing::ring`]).
    #[serde(default)]
    pub mixing: Option<Vec<Vec<f64>>>,
    /// `gamma`: the slack `γ` in `0 < γ ≤ 1`; the exchange averages with `γW + (1−γ)I` (what
    /// Moniqua's 1-bit variant, with nearest rounding, needs). Default 1: `W` itself.
    #[serde(default = "default_gamma")]
    pub gamma: f64,
}

fn default_gamma() -> f64 {
    1.0
}

impl Default for GossipConfig {
    fn default() -> Self {
        GossipConfig {
            mixing: None,
            gamma: default_gamma(),
        }
    }
}

impl GossipConfig {
    /// The defaults: a ring, no slack.
    pub fn is_default(&self) -> bool {
        *self == GossipConfig::default()
    }

    /// Each worker's neighbours `j` and weights `W[i][j]`, ascending (what a gossip round
    /// relays and averages), for the job of `cluster`: [`GossipConfig::matrix`]'s rows. Errors
    /// name the setting: gossip runs without local groups (`cluster.local_size` 1), and the
    /// matrix must be valid.
    pub fn graph(&self, cluster: &ClusterConfig) -> Result<Vec<Vec<(u32, f64)>>, String> {
        if cluster.local_size > 1 {
            return Err(format!(
                "exchange = \"gossip\" runs without local groups (cluster.local_size is {}; \
                 set it to 1)",
                cluster.local_size
            ));
        }
        let w = self
            .matrix(cluster.num_workers)
            .map_err(|e| format!("gossip.mixing: {e}"))?;
        Ok((0..w.len())
            .map(|i| {
                w.neighbours(i)
                    .into_iter()
                    .map(|(j, wij)| (j as u32, wij))
                    .collect()
            })
            .collect())
    }

    /// The matrix a job of `num_workers` averages with: `mixing` (or the ring) with the slack
    /// applied. Errors name the row, the entry or the eigenvalue.
    pub fn matrix(&self, num_workers: u32) -> Result<Mixing, String> {
        let w = match &self.mixing {
            Some(rows) if rows.len() != num_workers as usize => {
                return Err(format!(
                    "the mixing matrix has {} rows; cluster.num_workers is {num_workers}, one row \
                     per worker",
                    rows.len()
                ))
            }
            Some(rows) => Mixing::new(rows)?,
            None => Mixing::ring(num_workers as usize),
        };
        if self.gamma == 1.0 {
            Ok(w)
        } else {
            w.slack(self.gamma)
        }
    }
}

/// `[tensors]`: `default` applies to every tensor; a table named after a tensor overrides
/// single keys for it. Values may be TOML strings, numbers or booleans; they are turned into
/// the strings the compressor registry parses.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(transparent)]
pub struct TensorsConfig {
    /// Table name → key → value.
    pub tables: BTreeMap<String, BTreeMap<String, toml::Value>>,
}

fn default_partition_bytes() -> u64 {
    131_072
}
fn default_min_compress_bytes() -> u64 {
    65_536
}
fn default_local_size() -> u32 {
    1
}
fn default_heartbeat_interval_ms() -> u64 {
    1_000
}
fn default_heartbeat_timeout_ms() -> u64 {
    10_000
}
fn default_connect_timeout_ms() -> u64 {
    30_000
}
fn default_rendezvous_timeout_ms() -> u64 {
    300_000
}
fn default_send_window_bytes() -> u64 {
    16 << 20
}
fn default_max_udp_payload() -> u16 {
    MAX_UDP_PAYLOAD
}
fn default_server_name() -> String {
    "pushpull.cluster".to_string()
}
fn default_listen() -> String {
    "0.0.0.0:0".to_string()
}
fn default_device() -> String {
    "auto".to_string()
}
fn default_true() -> bool {
    true
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            ca: None,
            cert: None,
            key: None,
            server_name: default_server_name(),
            check_roles: true,
            refuse_loose_keys: false,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: default_listen(),
            advertise: None,
        }
    }
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            device: default_device(),
        }
    }
}

impl Config {
    /// A config for `num_workers` workers and `num_servers` servers on loopback, every other
    /// setting at its default (the scheduler picks a free port).
    pub fn local(num_workers: u32, num_servers: u32) -> Config {
        Config {
            cluster: ClusterConfig {
                scheduler: "127.0.0.1:0".to_string(),
                num_workers,
                num_servers,
                partition_bytes: default_partition_bytes(),
                max_chunk_payload_bytes: None,
                min_compress_bytes: default_min_compress_bytes(),
                seed: None,
                heartbeat_interval_ms: default_heartbeat_interval_ms(),
                heartbeat_timeout_ms: default_heartbeat_timeout_ms(),
                connect_timeout_ms: default_connect_timeout_ms(),
                rendezvous_timeout_ms: default_rendezvous_timeout_ms(),
                send_window_bytes: default_send_window_bytes(),
                max_udp_payload: default_max_udp_payload(),
                local_size: default_local_size(),
                force_distributed: false,
            },
            tls: TlsConfig::default(),
            server: ServerConfig {
                listen: "127.0.0.1:0".to_string(),
                advertise: None,
            },
            worker: WorkerConfig::default(),
            metrics: MetricsConfig::default(),
            trace: TraceConfig::default(),
            gossip: GossipConfig::default(),
            job: toml::Table::new(),
            tensors: TensorsConfig::default(),
        }
    }

    /// Reads and validates a cluster file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_toml_str(&text, &path.display().to_string())
    }

    /// Parses and validates TOML text; `origin` names it in errors (a file name).
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            origin: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        config.validate(origin)?;
        Ok(config)
    }

    /// The scheduler address, parsed.
    pub fn scheduler_addr(&self) -> SchedulerAddr {
        // validate() checked it.
        SchedulerAddr::parse(&self.cluster.scheduler).expect("validated scheduler address")
    }

    /// The heartbeat interval.
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.cluster.heartbeat_interval_ms)
    }

    /// The heartbeat timeout (also quinn's idle timeout).
    pub fn heartbeat_timeout(&self) -> Duration {
        Duration::from_millis(self.cluster.heartbeat_timeout_ms)
    }

    /// How long to keep trying to reach the scheduler.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.cluster.connect_timeout_ms)
    }

    /// `cluster.rendezvous_timeout_ms` as a duration.
    pub fn rendezvous_timeout(&self) -> Duration {
        Duration::from_millis(self.cluster.rendezvous_timeout_ms)
    }

    /// The parameter map the config gives tensor `name`: `[tensors.default]` overlaid with
    /// `[tensors."name"]`. A map passed to `declare` is overlaid on top of this by the worker.
    pub fn tensor_params(&self, name: &str) -> ParamMap {
        let mut out = ParamMap::new();
        for table in ["default", name] {
            if let Some(map) = self.tensors.tables.get(table) {
                for (k, v) in map {
                    // validate() checked every value is a scalar.
                    if let Ok(s) = scalar_to_string(v) {
                        out.insert(k.clone(), s);
                    }
                }
            }
        }
        out
    }
}

/// Parses `ip:port`; the error says what is expected.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>().map_err(|_| {
        "expected an IP address and port, e.g. \"127.0.0.1:9000\" or \"[::1]:9000\"".to_string()
    })
}

/// `cluster.scheduler`: an IP address and port, or a DNS name and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SchedulerAddr {
    /// An IP address and port.
    Ip(SocketAddr),
    /// A DNS name (letters, digits, `-` and `.`: RFC 1123) and port.
    Name {
        /// The name, e.g. `pushpull-0.pushpull` or `node001`.
        host: String,
        /// The port.
        port: u16,
    },
}

impl SchedulerAddr {
    /// Parses `IP:PORT`, `[IPv6]:PORT` or `NAME:PORT`; the error says what is allowed.
    pub fn parse(s: &str) -> Result<SchedulerAddr, String> {
        const ALLOWED: &str = "expected an IP address or DNS name and a port, e.g. \
                               \"10.0.0.1:9000\", \"[::1]:9000\" or \"node001:9000\"";
        if let Ok(a) = s.parse::<SocketAddr>() {
            return Ok(SchedulerAddr::Ip(a));
        }
        let (host, port) = s.rsplit_once(':').ok_or(ALLOWED)?;
        let port: u16 = port.parse().map_err(|_| ALLOWED)?;
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        let host = host.strip_suffix('.').unwrap_or(host);
        // A name of digits and dots only is a malformed IPv4 address, not a name.
        let numeric = host.bytes().all(|b| b.is_ascii_digit() || b == b'.');
        if host.is_empty() || host.len() > 253 || numeric || !host.split('.').all(label_ok) {
            return Err(ALLOWED.to_string());
        }
        Ok(SchedulerAddr::Name {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// The port.
    pub fn port(&self) -> u16 {
        match self {
            SchedulerAddr::Ip(a) => a.port(),
            SchedulerAddr::Name { port, .. } => *port,
        }
    }

    /// The address the scheduler binds: the IP address itself, or every IPv4 address on the
    /// port for a name (the name's addresses are the host's own).
    pub fn bind_addr(&self) -> SocketAddr {
        match self {
            SchedulerAddr::Ip(a) => *a,
            SchedulerAddr::Name { port, .. } => {
                SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, *port))
            }
        }
    }
}

impl std::fmt::Display for SchedulerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SchedulerAddr::Ip(a) => write!(f, "{a}"),
            SchedulerAddr::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// Turns a TOML scalar into the string a parameter map holds.
fn scalar_to_string(v: &toml::Value) -> Result<String, String> {
    match v {
        toml::Value::String(s) => Ok(s.clone()),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        _ => Err("a string, number or boolean".to_string()),
    }
}

mod digest;
pub mod env;
mod validate;
pub use digest::ClusterDigest;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod example_files;
