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
    /// `[job]`: the built-in job that `pushpull-worker` and `pushpull local` run.
    #[serde(default)]
    pub job: JobConfig,
    /// `[tensors.default]` and `[tensors."name"]`: per-tensor parameter maps.
    #[serde(default)]
    pub tensors: TensorsConfig,
}

/// `[cluster]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// `scheduler`: the scheduler's address, `host:port` (an IP address; the scheduler binds it,
    /// everyone else dials it). Port 0 lets the scheduler pick one (it prints the address).
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
    /// (BENCHMARKS.md); on much faster links larger chunks save per-frame work.
    #[serde(default = "default_partition_bytes")]
    pub partition_bytes: u64,
    /// `max_chunk_payload_bytes`: the most bytes one chunk carries on the wire (default: a
    /// quarter of `partition_bytes`, at least 1024; 32768 at the default partition). A tensor
    /// whose codec would send more per `partition_bytes` chunk (fp32 tensors, those below
    /// `min_compress_bytes`, fp16 and bf16) gets chunks of `partition_bytes` halved until one
    /// fits (`pushpull_proto::placement::cut_bytes`); compressed chunks are far smaller and
    /// keep `partition_bytes`. A chunk's sum leaves its server only once every worker's copy
    /// has arrived, so on a slow link results start, and trail the pushes, about one chunk per
    /// worker late: at 10 Mbit/s 128 KiB of fp32 is 0.1 s per copy (BENCHMARKS.md, "Wire
    /// speed"). At least 1024; at `partition_bytes` or more every tensor is cut at
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
}

impl ClusterConfig {
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

/// `[job]`: the built-in job (`pushpull-worker` without user code; `pushpull local`).
///
/// `kind = "benchmark"` uses `rounds`, `warmup`, `scale` and `check`; `kind = "train"` uses the
/// training keys (`model` .. `lr_schedule`). Keys of the other kind are accepted and ignored,
/// so one file can switch between the two.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// `kind`: `benchmark` (push_pull of a ResNet-50-like tensor set on random data, every
    /// result checked against an independent sum; the default when `[job]` has no `kind`) or
    /// `train` (data-parallel SGD of a candle MLP on a synthetic classification task, the
    /// gradients push_pulled with each tensor's compressor; `configs/local.toml` sets it).
    #[serde(default = "default_job_kind")]
    pub kind: String,
    /// `rounds`: push_pull rounds after warm-up (default 10).
    #[serde(default = "default_rounds")]
    pub rounds: u32,
    /// `warmup`: rounds run before timing starts (default 1).
    #[serde(default = "default_warmup")]
    pub warmup: u32,
    /// `scale`: fraction of the ResNet-50 tensor set's element count (default 1.0 =
    /// 25.6 M elements, 161 tensors); every tensor keeps at least one element.
    #[serde(default = "default_scale")]
    pub scale: f64,
    /// `check`: verify every result against the independently computed sum (default true).
    #[serde(default = "default_true")]
    pub check: bool,
    /// `priority` (benchmark): `forward` (tensor i of the set is declared with priority -i, so
    /// the first layers' results come first, as the next forward pass needs them; the
    /// default) or `none` (every tensor priority 0: frames leave in the order they are
    /// issued, the last layer first, as a backward pass issues them).
    #[serde(default = "default_job_priority")]
    pub priority: String,
    /// `issue` (benchmark): how a round's push_pull calls are made, all at once: `group` (one
    /// `push_pull_group_into` of every tensor, whose chunks leave in priority order; the
    /// default), or separate calls, `backward` (the last layer first, as a backward pass
    /// produces the gradients) or `forward` (the first layer first). With separate calls, which
    /// frames a worker sends first depends on how its calls and its compression interleave with
    /// its sender, so workers may start a round in different orders (BENCHMARKS.md, "The order
    /// of simultaneous calls").
    #[serde(default = "default_job_issue")]
    pub issue: String,
    /// `buffers` (benchmark): where each worker's tensors live: `host` (host memory, the
    /// default), `device` (GPU memory, compressed where `worker.device` says: on the GPU by
    /// default, so only compressed payloads cross PCIe; needs a usable CUDA GPU) or `emulated`
    /// (the host-emulated device of the worker crate, which runs the device path's kernels on
    /// the CPU: the device data path without a GPU, for tests). Device buffers are reduced in
    /// place: with `issue = group`, in one `push_pull_group_device` call (one batch of every
    /// chunk on the device), else with one `push_pull_device` call per tensor in `issue`'s
    /// order, all before any is awaited.
    #[serde(default = "default_job_buffers")]
    pub buffers: String,
    /// `skip_push_pull` (train): train without any push_pull, each worker alone on its shard
    /// (for timing the compute alone; default false).
    #[serde(default)]
    pub skip_push_pull: bool,
    /// `model` (train): `mlp` (ReLU layers of widths `hidden`, default) or `logistic`
    /// (multinomial logistic regression: one linear layer, the baseline).
    #[serde(default = "default_model")]
    pub model: String,
    /// `steps` (train): SGD steps, one push_pull of every gradient tensor each (default 300).
    #[serde(default = "default_steps")]
    pub steps: u32,
    /// `batch_size` (train): samples per worker per step (default 64).
    #[serde(default = "default_batch_size")]
    pub batch_size: u32,
    /// `lr` (train): peak learning rate of SGD (default 0.1).
    #[serde(default = "default_lr")]
    pub lr: f64,
    /// `lr_schedule` (train): `cosine` (decay from `lr` to 0 over `steps`, default) or
    /// `constant`.
    #[serde(default = "default_lr_schedule")]
    pub lr_schedule: String,
    /// `momentum` (train): SGD momentum in [0, 1) (default 0.9). Ignored (0) for tensors whose
    /// parameter map has `momentum = "nesterov"`: the compressor's momentum owns it then.
    #[serde(default = "default_momentum")]
    pub momentum: f64,
    /// `input_dim` (train): input features (default 16).
    #[serde(default = "default_input_dim")]
    pub input_dim: u32,
    /// `hidden` (train, mlp): widths of the hidden layers (default [512, 512]).
    #[serde(default = "default_hidden")]
    pub hidden: Vec<u32>,
    /// `classes` (train): number of classes (default 10).
    #[serde(default = "default_classes")]
    pub classes: u32,
    /// `teacher_hidden` (train): hidden units of the random teacher network whose argmax labels
    /// the data (`argmax(W2 · (|W1 · x| − √(2/π)))`, see the root package's `train::data`;
    /// default 8).
    #[serde(default = "default_teacher_hidden")]
    pub teacher_hidden: u32,
    /// `train_samples` (train): training set size, sharded across workers by rank (sample i
    /// goes to worker i mod num_workers; default 32768).
    #[serde(default = "default_train_samples")]
    pub train_samples: u32,
    /// `test_samples` (train): held-out test set size, labelled by the teacher without noise
    /// (default 4096).
    #[serde(default = "default_test_samples")]
    pub test_samples: u32,
    /// `label_noise` (train): fraction in [0, 1) of training labels replaced by a uniformly
    /// random class (default 0.1).
    #[serde(default = "default_label_noise")]
    pub label_noise: f64,
    /// `eval_every` (train): also evaluate on the test set every this many steps (0: only at
    /// the end; default 0).
    #[serde(default)]
    pub eval_every: u32,
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
fn default_job_priority() -> String {
    "forward".to_string()
}
fn default_job_buffers() -> String {
    "host".into()
}

fn default_job_issue() -> String {
    "group".to_string()
}
fn default_job_kind() -> String {
    "benchmark".to_string()
}
fn default_model() -> String {
    "mlp".to_string()
}
fn default_steps() -> u32 {
    300
}
fn default_batch_size() -> u32 {
    64
}
fn default_lr() -> f64 {
    0.1
}
fn default_lr_schedule() -> String {
    "cosine".to_string()
}
fn default_momentum() -> f64 {
    0.9
}
fn default_input_dim() -> u32 {
    16
}
fn default_hidden() -> Vec<u32> {
    vec![512, 512]
}
fn default_classes() -> u32 {
    10
}
fn default_teacher_hidden() -> u32 {
    8
}
fn default_train_samples() -> u32 {
    32_768
}
fn default_test_samples() -> u32 {
    4_096
}
fn default_label_noise() -> f64 {
    0.1
}
fn default_rounds() -> u32 {
    10
}
fn default_warmup() -> u32 {
    1
}
fn default_scale() -> f64 {
    1.0
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

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            kind: default_job_kind(),
            rounds: default_rounds(),
            warmup: default_warmup(),
            scale: default_scale(),
            check: true,
            priority: default_job_priority(),
            issue: default_job_issue(),
            buffers: default_job_buffers(),
            skip_push_pull: false,
            model: default_model(),
            steps: default_steps(),
            batch_size: default_batch_size(),
            lr: default_lr(),
            lr_schedule: default_lr_schedule(),
            momentum: default_momentum(),
            input_dim: default_input_dim(),
            hidden: default_hidden(),
            classes: default_classes(),
            teacher_hidden: default_teacher_hidden(),
            train_samples: default_train_samples(),
            test_samples: default_test_samples(),
            label_noise: default_label_noise(),
            eval_every: 0,
        }
    }
}

impl JobConfig {
    /// Checks the `[job]` keys (those of both kinds); errors name the key, the value and what
    /// is allowed. `num_workers` bounds `train_samples` (every worker needs a sample).
    fn validate(
        &self,
        num_workers: u32,
        bad: &dyn Fn(&str, String, &str) -> ConfigError,
    ) -> Result<(), ConfigError> {
        let one_of = |key: &str, value: &str, allowed: &[&str]| {
            if allowed.contains(&value) {
                Ok(())
            } else {
                let list: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
                Err(bad(
                    key,
                    format!("{value:?}"),
                    &format!("one of {}", list.join(", ")),
                ))
            }
        };
        let range_u32 = |key: &str, v: u32, lo: u32, hi: u32| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(bad(
                    key,
                    v.to_string(),
                    &format!("an integer in {lo}..={hi}"),
                ))
            }
        };
        one_of("job.kind", &self.kind, &["benchmark", "train"])?;
        one_of("job.model", &self.model, &["mlp", "logistic"])?;
        one_of("job.priority", &self.priority, &["forward", "none"])?;
        one_of("job.issue", &self.issue, &["group", "backward", "forward"])?;
        one_of(
            "job.buffers",
            &self.buffers,
            &["host", "device", "emulated"],
        )?;
        one_of(
            "job.lr_schedule",
            &self.lr_schedule,
            &["cosine", "constant"],
        )?;
        range_u32("job.steps", self.steps, 1, 10_000_000)?;
        range_u32("job.batch_size", self.batch_size, 1, 65_536)?;
        range_u32("job.input_dim", self.input_dim, 1, 65_536)?;
        range_u32("job.classes", self.classes, 2, 65_536)?;
        range_u32("job.teacher_hidden", self.teacher_hidden, 1, 65_536)?;
        range_u32("job.test_samples", self.test_samples, 1, 10_000_000)?;
        range_u32(
            "job.train_samples",
            self.train_samples,
            num_workers.max(1),
            10_000_000,
        )?;
        if self.model == "mlp" && self.hidden.is_empty() {
            return Err(bad(
                "job.hidden",
                "[]".into(),
                "at least one hidden width for model = \"mlp\" (use model = \"logistic\" for \
                 no hidden layer)",
            ));
        }
        for &h in &self.hidden {
            if !(1..=65_536).contains(&h) {
                return Err(bad(
                    "job.hidden",
                    format!("{:?}", self.hidden),
                    "widths in 1..=65536",
                ));
            }
        }
        let data_elements =
            (self.train_samples as u64 + self.test_samples as u64) * self.input_dim as u64;
        if data_elements > 1 << 28 {
            return Err(bad(
                "job.train_samples",
                self.train_samples.to_string(),
                &format!(
                    "(train_samples + test_samples) * input_dim must be at most 268435456 \
                     elements (here {data_elements})"
                ),
            ));
        }
        if !(self.lr.is_finite() && self.lr > 0.0 && self.lr <= 100.0) {
            return Err(bad("job.lr", self.lr.to_string(), "a number in (0, 100]"));
        }
        if !(self.momentum.is_finite() && (0.0..1.0).contains(&self.momentum)) {
            return Err(bad(
                "job.momentum",
                self.momentum.to_string(),
                "a number in [0, 1)",
            ));
        }
        if !(self.label_noise.is_finite() && (0.0..1.0).contains(&self.label_noise)) {
            return Err(bad(
                "job.label_noise",
                self.label_noise.to_string(),
                "a fraction in [0, 1)",
            ));
        }
        Ok(())
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
            },
            tls: TlsConfig::default(),
            server: ServerConfig {
                listen: "127.0.0.1:0".to_string(),
                advertise: None,
            },
            worker: WorkerConfig::default(),
            job: JobConfig::default(),
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
    pub fn scheduler_addr(&self) -> SocketAddr {
        // validate() checked it.
        parse_addr(&self.cluster.scheduler).expect("validated scheduler address")
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
mod validate;
pub use digest::ClusterDigest;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod example_files;
