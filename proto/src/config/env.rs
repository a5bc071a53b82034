//! BytePS's environment variables (`BYTEPS_*`, `DMLC_*`): every one pushpull knows is either
//! honoured or refused with an error naming it, and any other variable with those prefixes is
//! refused too, so that a BytePS job file's setting is never silently ignored. [`VARIABLES`] is
//! the one table (docs/byteps-variables.md's table is made from it, and `tests/docs.rs` checks
//! that it is).
//!
//! Three kinds are honoured:
//!
//! * **Where the job runs** ([`Use::Launch`]): the scheduler's address, the counts, the rank.
//!   `pushpull.torch` reads them (python/pushpull/_env.py, with torchrun's); the node binaries
//!   read them through [`launch_settings`], as their flags: they override the cluster file (a
//!   value that differs from the file's is logged), and a flag overrides them.
//! * **Tuning mapped onto a cluster-file key** ([`Use::Key`]): applied by [`apply_tuning`]
//!   wherever a node loads its cluster file; a key the file sets explicitly wins, and the
//!   variable that lost is logged.
//! * **The log level** ([`Use::LogLevel`]): `BYTEPS_LOG_LEVEL` when `RUST_LOG` is not set.
//! * **The timeline** ([`Use::TraceOn`], with `BYTEPS_TRACE_DIR` ([`Use::With`]) and the step
//!   window's two [`Use::Key`] variables): `BYTEPS_TRACE_ON=1` sets `trace.dir` (to
//!   `BYTEPS_TRACE_DIR`, else BytePS's `./trace`) and, where neither the file nor a variable
//!   sets them, BytePS's window of steps 10 to 20; the file's `trace.dir` wins.
//!
//! Variables for what pushpull does one fixed way ([`Use::Fixed`]) accept that way's value and
//! refuse the others; the rest ([`Use::Refused`]) are refused whatever their value.

use std::collections::BTreeSet;

use super::{Config, ConfigError, SchedulerAddr};

/// What pushpull does with one variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Where the job runs: read by the worker's join (Python) and the binaries' flags.
    Launch(&'static str),
    /// A cluster-file key (dotted), a boolean (`0`/`1`) or an unsigned integer.
    Key(&'static str, Kind),
    /// The log filter when `RUST_LOG` is not set.
    LogLevel,
    /// pushpull behaves one way: the values that mean that way are accepted, others refused.
    Fixed(&'static [&'static str], &'static str),
    /// No equivalent in pushpull: refused, saying why.
    Refused(&'static str),
    /// `BYTEPS_TRACE_ON`: `1` turns the timeline on (`trace.dir`), `0` leaves it off.
    TraceOn,
    /// Read only together with the named variable (what it is for, in words); logged as not
    /// used without it.
    With(&'static str, &'static str),
}

/// The type of a [`Use::Key`] variable's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `0` or `1`.
    Bool,
    /// An unsigned integer.
    Bytes,
}

/// One variable: its name and what pushpull does with it.
#[derive(Debug, Clone, Copy)]
pub struct Variable {
    /// The name.
    pub name: &'static str,
    /// What happens to it.
    pub what: Use,
}

const fn v(name: &'static str, what: Use) -> Variable {
    Variable { name, what }
}

const NO_NCCL: &str = "pushpull reduces a host's GPUs through its local groups, not NCCL";
const NO_NUMA: &str = "pushpull does not pin threads to cores; use taskset or your scheduler's \
                       CPU binding";

/// Every `BYTEPS_*` and `DMLC_*` variable pushpull knows (BytePS's docs/env.md and its
/// launcher), and what it does with each.
pub const VARIABLES: &[Variable] = &[
    v(
        "DMLC_ROLE",
        Use::Launch("`worker` for pushpull.torch; a binary refuses another role than its own"),
    ),
    v(
        "DMLC_PS_ROOT_URI",
        Use::Launch("the scheduler's host (`cluster.scheduler`, with DMLC_PS_ROOT_PORT)"),
    ),
    v("DMLC_PS_ROOT_PORT", Use::Launch("the scheduler's port")),
    v(
        "DMLC_NUM_WORKER",
        Use::Launch("worker hosts: `cluster.num_workers` = DMLC_NUM_WORKER × BYTEPS_LOCAL_SIZE"),
    ),
    v("DMLC_NUM_SERVER", Use::Launch("`cluster.num_servers`")),
    v(
        "DMLC_WORKER_ID",
        Use::Launch(
            "this worker's host: rank = DMLC_WORKER_ID × BYTEPS_LOCAL_SIZE + BYTEPS_LOCAL_RANK",
        ),
    ),
    v(
        "BYTEPS_LOCAL_RANK",
        Use::Launch("this worker's index on its host"),
    ),
    v(
        "BYTEPS_LOCAL_SIZE",
        Use::Launch("workers per host (`cluster.local_size` in pushpull.torch without a cluster file; with one, the file says)"),
    ),
    v(
        "BYTEPS_PARTITION_BYTES",
        Use::Key("cluster.partition_bytes", Kind::Bytes),
    ),
    v(
        "BYTEPS_MIN_COMPRESS_BYTES",
        Use::Key("cluster.min_compress_bytes", Kind::Bytes),
    ),
    v(
        "BYTEPS_FORCE_DISTRIBUTED",
        Use::Key("cluster.force_distributed", Kind::Bool),
    ),
    v("BYTEPS_LOG_LEVEL", Use::LogLevel),
    v(
        "DMLC_ENABLE_RDMA",
        Use::Fixed(&["0"], "pushpull runs over QUIC (UDP), not RDMA"),
    ),
    v(
        "BYTEPS_ENABLE_ASYNC",
        Use::Fixed(&["0"], "pushpull's rounds are synchronous"),
    ),
    v(
        "BYTEPS_SERVER_ENABLE_SCHEDULE",
        Use::Fixed(&["1"], "pushpull always sends in priority order"),
    ),
    v(
        "BYTEPS_SERVER_ENGINE_THREAD",
        Use::Refused(
            "pushpull's servers run one thread per core (tokio); there is no engine-thread setting",
        ),
    ),
    v(
        "DMLC_INTERFACE",
        Use::Refused("set `server.listen` / `server.advertise` in the cluster file instead"),
    ),
    v("BYTEPS_PCIE_SWITCH_SIZE", Use::Refused(NO_NCCL)),
    v("BYTEPS_NCCL_NUM_RINGS", Use::Refused(NO_NCCL)),
    v("BYTEPS_NCCL_GROUP_SIZE", Use::Refused(NO_NCCL)),
    v("BYTEPS_REDUCE_ROOTS", Use::Refused(NO_NCCL)),
    v("BYTEPS_ENABLE_IPC", Use::Refused(NO_NCCL)),
    v("BYTEPS_NUMA_ON", Use::Refused(NO_NUMA)),
    v("BYTEPS_NUMA_DEFAULT_QUOTA", Use::Refused(NO_NUMA)),
    v("BYTEPS_CPU_BLACKLIST", Use::Refused(NO_NUMA)),
    v("BYTEPS_VISIBLE_CPU_CORES", Use::Refused(NO_NUMA)),
    v("BYTEPS_MULTITHREADED_CPU", Use::Refused(NO_NUMA)),
    v("BYTEPS_TRACE_ON", Use::TraceOn),
    v(
        "BYTEPS_TRACE_DIR",
        Use::With(
            "BYTEPS_TRACE_ON",
            "the timeline's folder, `trace.dir` (BytePS's default `./trace` without it)",
        ),
    ),
    v(
        "BYTEPS_TRACE_START_STEP",
        Use::Key("trace.start_step", Kind::Bytes),
    ),
    v(
        "BYTEPS_TRACE_END_STEP",
        Use::Key("trace.end_step", Kind::Bytes),
    ),
    v(
        "BYTEPS_ENABLE_GDB",
        Use::Refused("run the process under gdb yourself"),
    ),
    v(
        "BYTEPS_DEBUG_SAMPLE_TENSOR",
        Use::Refused("pushpull has no tensor sampling; use the metrics"),
    ),
    v(
        "BYTEPS_DISABLE_P2P",
        Use::Refused("pushpull has no peer-to-peer send/recv to disable"),
    ),
    v(
        "BYTEPS_DISABLE_CPU_ALLREDUCE",
        Use::Refused("pushpull reduces CPU tensors always"),
    ),
    v(
        "BYTEPS_DISABLE_GPU_ALLREDUCE",
        Use::Refused("pushpull reduces GPU tensors always"),
    ),
    v(
        "BYTEPS_USE_HASH_KEY",
        Use::Refused("the scheduler places keys by load (no hashing)"),
    ),
    v(
        "BYTEPS_KEY_HASH_FN",
        Use::Refused("the scheduler places keys by load (no hashing)"),
    ),
    v(
        "BYTEPS_OMP_THREAD_PER_GPU",
        Use::Refused("pushpull uses no OpenMP"),
    ),
    v(
        "BYTEPS_THREADPOOL_SIZE",
        Use::Refused("pushpull's workers run one thread per core (tokio)"),
    ),
];

/// The variables of `vars` (name, value) with BytePS's prefixes.
fn byteps_vars(vars: &[(String, String)]) -> impl Iterator<Item = (&str, &str)> {
    vars.iter()
        .filter(|(k, _)| k.starts_with("BYTEPS_") || k.starts_with("DMLC_"))
        .map(|(k, v)| (k.as_str(), v.as_str()))
}

fn error(name: &str, value: &str, allowed: String) -> ConfigError {
    ConfigError::Invalid {
        origin: "the environment".to_string(),
        key: name.to_string(),
        value: format!("{value:?}"),
        allowed,
    }
}

/// The dotted keys a cluster file's text sets explicitly (`cluster.partition_bytes`, ...).
/// Text that does not parse sets nothing (parsing it as a [`Config`] reports the error).
pub fn explicit_keys(text: &str) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    if let Ok(table) = text.parse::<toml::Table>() {
        for (section, value) in &table {
            if let Some(t) = value.as_table() {
                keys.extend(t.keys().map(|k| format!("{section}.{k}")));
            }
        }
    }
    keys
}

/// The value of [`Use::Key`] key `key` in `config`, as its variable writes it.
fn key_value(config: &Config, key: &str) -> String {
    let c = &config.cluster;
    match key {
        "cluster.partition_bytes" => c.partition_bytes.to_string(),
        "cluster.min_compress_bytes" => c.min_compress_bytes.to_string(),
        "cluster.force_distributed" => u8::from(c.force_distributed).to_string(),
        "trace.start_step" => config.trace.start_step.to_string(),
        "trace.end_step" => config
            .trace
            .end_step
            .map_or(String::new(), |e| e.to_string()),
        _ => String::new(),
    }
}

/// Sets [`Use::Key`] key `key` from `value` (checked by the caller).
fn set_key(config: &mut Config, key: &str, value: &str) {
    let c = &mut config.cluster;
    let n = value.parse::<u64>().unwrap_or(0);
    match key {
        "cluster.partition_bytes" => c.partition_bytes = n,
        "cluster.min_compress_bytes" => c.min_compress_bytes = n,
        "cluster.force_distributed" => c.force_distributed = value == "1",
        "trace.start_step" => config.trace.start_step = n,
        "trace.end_step" => config.trace.end_step = Some(n),
        _ => {}
    }
}

/// Checks every `BYTEPS_*`/`DMLC_*` variable of `vars` and applies the tuning ones
/// ([`Use::Key`]) to `config`, unless `explicit` (the keys its file sets) holds the key.
/// Returns what to log (a variable that lost to the file). Errors name the variable: one
/// pushpull does not know, a refused one, a fixed one with another value, a value that does not
/// parse.
pub fn apply_tuning(
    config: &mut Config,
    explicit: &BTreeSet<String>,
    vars: &[(String, String)],
) -> Result<Vec<String>, ConfigError> {
    let mut notes = Vec::new();
    for (name, value) in byteps_vars(vars) {
        let Some(var) = VARIABLES.iter().find(|v| v.name == name) else {
            return Err(error(
                name,
                value,
                "not a BytePS variable pushpull knows (docs/byteps-variables.md lists them): \
                 unset it"
                    .to_string(),
            ));
        };
        match var.what {
            Use::Launch(_) => {}
            Use::With(other, _) => {
                let with = vars.iter().any(|(k, v)| k == other && v.trim() == "1");
                if !with {
                    notes.push(format!("{name}={value} is not used: {other} is not 1"));
                }
            }
            Use::TraceOn => {
                let on = match value.trim() {
                    "0" => false,
                    "1" => true,
                    _ => return Err(error(name, value, "0 or 1".to_string())),
                };
                if on {
                    notes.extend(trace_on(config, explicit, vars));
                }
            }
            Use::LogLevel => {
                log_level(value).map_err(|_| {
                    error(
                        name,
                        value,
                        "TRACE, DEBUG, INFO, WARNING, ERROR or FATAL".into(),
                    )
                })?;
            }
            Use::Fixed(accepted, why) => {
                if !accepted.contains(&value.trim()) {
                    return Err(error(
                        name,
                        value,
                        format!("only {} ({why})", accepted.join(" or ")),
                    ));
                }
            }
            Use::Refused(why) => {
                return Err(error(
                    name,
                    value,
                    format!("not supported: {why}; unset it"),
                ));
            }
            Use::Key(key, kind) => {
                let v = value.trim();
                let ok = match kind {
                    Kind::Bool => v == "0" || v == "1",
                    Kind::Bytes => v.parse::<u64>().is_ok(),
                };
                if !ok {
                    let allowed = match kind {
                        Kind::Bool => "0 or 1",
                        Kind::Bytes => "an unsigned integer",
                    };
                    return Err(error(name, value, allowed.to_string()));
                }
                let current = key_value(config, key);
                if explicit.contains(key) {
                    if current != v {
                        notes.push(format!(
                            "{name}={v} is not used: the cluster file sets {key} = {current}"
                        ));
                    }
                    continue;
                }
                set_key(config, key, v);
                if let Err(e) = config.validate("the environment") {
                    let allowed = match e {
                        ConfigError::Invalid { allowed, .. } => format!("{key}: {allowed}"),
                        other => other.to_string(),
                    };
                    return Err(error(name, value, allowed));
                }
            }
        }
    }
    Ok(notes)
}

/// `BYTEPS_TRACE_ON=1`: `trace.dir` from `BYTEPS_TRACE_DIR` (BytePS's default `./trace`), and
/// BytePS's window (steps 10 to 20) where neither the file nor a variable sets its ends; the
/// file's `trace.dir` wins (returned as a note).
fn trace_on(
    config: &mut Config,
    explicit: &BTreeSet<String>,
    vars: &[(String, String)],
) -> Option<String> {
    let var = |name: &str| vars.iter().any(|(k, _)| k == name);
    let t = &mut config.trace;
    if !explicit.contains("trace.start_step") && !var("BYTEPS_TRACE_START_STEP") {
        t.start_step = 10;
    }
    if !explicit.contains("trace.end_step") && !var("BYTEPS_TRACE_END_STEP") {
        t.end_step = Some(20);
    }
    let dir = vars
        .iter()
        .find(|(k, v)| k == "BYTEPS_TRACE_DIR" && !v.trim().is_empty())
        .map_or("./trace".to_string(), |(_, v)| v.trim().to_string());
    if explicit.contains("trace.dir") {
        // `pushpull local` writes the variables' values into the file it gives its nodes.
        let file = t.dir.clone().unwrap_or_default();
        return (file != dir).then(|| {
            format!("BYTEPS_TRACE_ON's folder {dir:?} is not used: the cluster file sets trace.dir = {file:?}")
        });
    }
    t.dir = Some(dir);
    None
}

/// The node a binary runs, for `DMLC_ROLE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeRole {
    /// `pushpull-scheduler`.
    Scheduler,
    /// `pushpull-server`.
    Server,
    /// `pushpull-worker`.
    Worker,
}

/// What BytePS's launch variables say about the job, for the binaries (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaunchSettings {
    /// `DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT`.
    pub scheduler: Option<String>,
    /// `DMLC_NUM_WORKER × BYTEPS_LOCAL_SIZE`.
    pub num_workers: Option<u32>,
    /// `DMLC_NUM_SERVER`.
    pub num_servers: Option<u32>,
    /// `BYTEPS_LOCAL_SIZE` (when set). Not applied to `cluster.local_size`: with a cluster
    /// file the file says how workers group (as in pushpull.torch; `pushpull local --
    /// COMMAND` sets it to every worker of a flat job).
    pub local_size: Option<u32>,
    /// `DMLC_WORKER_ID × BYTEPS_LOCAL_SIZE + BYTEPS_LOCAL_RANK` (when `DMLC_WORKER_ID` is set).
    pub rank: Option<u32>,
}

impl LaunchSettings {
    /// Applies the settings to `config` (they override its values: the scheduler and the
    /// counts); returns what to log (each value that differed from the file's).
    pub fn apply(&self, config: &mut Config) -> Vec<String> {
        let mut notes = Vec::new();
        let c = &mut config.cluster;
        let mut set = |key: &str, var: &str, old: String, new: String| {
            if old != new {
                notes.push(format!(
                    "{var} sets {key} = {new} (the cluster file says {old})"
                ));
            }
        };
        if let Some(s) = &self.scheduler {
            set(
                "cluster.scheduler",
                "DMLC_PS_ROOT_URI/PORT",
                c.scheduler.clone(),
                s.clone(),
            );
            c.scheduler = s.clone();
        }
        if let Some(n) = self.num_workers {
            set(
                "cluster.num_workers",
                "DMLC_NUM_WORKER",
                c.num_workers.to_string(),
                n.to_string(),
            );
            c.num_workers = n;
        }
        if let Some(n) = self.num_servers {
            set(
                "cluster.num_servers",
                "DMLC_NUM_SERVER",
                c.num_servers.to_string(),
                n.to_string(),
            );
            c.num_servers = n;
        }
        notes
    }
}

/// Reads BytePS's launch variables of `vars` for a binary of `role` (the same rules as
/// pushpull.torch's `_env.py`). Errors name the variable.
pub fn launch_settings(
    role: NodeRole,
    vars: &[(String, String)],
) -> Result<LaunchSettings, ConfigError> {
    let get = |name: &str| {
        vars.iter()
            .find(|(k, v)| k == name && !v.is_empty())
            .map(|(_, v)| v.trim().to_string())
    };
    let int = |name: &str, min: u32| -> Result<Option<u32>, ConfigError> {
        match get(name) {
            None => Ok(None),
            Some(v) => match v.parse::<u32>() {
                Ok(n) if n >= min => Ok(Some(n)),
                _ => Err(error(name, &v, format!("an integer >= {min}"))),
            },
        }
    };
    if let Some(r) = get("DMLC_ROLE") {
        let mine = match role {
            NodeRole::Scheduler => "scheduler",
            NodeRole::Server => "server",
            NodeRole::Worker => "worker",
        };
        if r != mine {
            return Err(error(
                "DMLC_ROLE",
                &r,
                format!("this is the {mine}'s binary: {mine}, or unset"),
            ));
        }
    }
    let mut s = LaunchSettings::default();
    match (get("DMLC_PS_ROOT_URI"), get("DMLC_PS_ROOT_PORT")) {
        (Some(uri), Some(port)) => {
            int("DMLC_PS_ROOT_PORT", 0)?;
            let addr = if uri.contains(':') && !uri.starts_with('[') {
                format!("[{uri}]:{port}")
            } else {
                format!("{uri}:{port}")
            };
            SchedulerAddr::parse(&addr)
                .map_err(|allowed| error("DMLC_PS_ROOT_URI", &uri, allowed))?;
            s.scheduler = Some(addr);
        }
        (None, None) => {}
        (Some(_), None) => {
            return Err(error(
                "DMLC_PS_ROOT_PORT",
                "",
                "set with DMLC_PS_ROOT_URI".into(),
            ))
        }
        (None, Some(_)) => {
            return Err(error(
                "DMLC_PS_ROOT_URI",
                "",
                "set with DMLC_PS_ROOT_PORT".into(),
            ))
        }
    }
    let g = int("BYTEPS_LOCAL_SIZE", 1)?;
    let local = int("BYTEPS_LOCAL_RANK", 0)?.unwrap_or(0);
    if local >= g.unwrap_or(1) {
        return Err(error(
            "BYTEPS_LOCAL_RANK",
            &local.to_string(),
            format!("below BYTEPS_LOCAL_SIZE ({})", g.unwrap_or(1)),
        ));
    }
    s.local_size = g;
    let hosts = int("DMLC_NUM_WORKER", 1)?;
    s.num_workers = hosts.map(|h| h * g.unwrap_or(1));
    s.num_servers = int("DMLC_NUM_SERVER", 1)?;
    if let Some(id) = int("DMLC_WORKER_ID", 0)? {
        if hosts.is_some_and(|h| id >= h) {
            return Err(error(
                "DMLC_WORKER_ID",
                &id.to_string(),
                format!("below DMLC_NUM_WORKER ({})", hosts.unwrap_or(0)),
            ));
        }
        s.rank = Some(id * g.unwrap_or(1) + local);
    }
    Ok(s)
}

/// `BYTEPS_LOG_LEVEL`'s value as a `tracing` level (`TRACE`, `DEBUG`, `INFO`, `WARNING`,
/// `ERROR`, `FATAL`; any case); `Err` names what is allowed.
pub fn log_level(value: &str) -> Result<&'static str, String> {
    match value.trim().to_ascii_uppercase().as_str() {
        "TRACE" => Ok("trace"),
        "DEBUG" => Ok("debug"),
        "INFO" => Ok("info"),
        "WARNING" | "WARN" => Ok("warn"),
        "ERROR" | "FATAL" => Ok("error"),
        _ => Err(format!(
            "BYTEPS_LOG_LEVEL={value:?}: TRACE, DEBUG, INFO, WARNING, ERROR or FATAL"
        )),
    }
}

/// docs/byteps-variables.md's table of [`VARIABLES`]: name and what pushpull does with it, one
/// row each.
pub fn markdown_table() -> String {
    let mut s = String::from("| variable | what pushpull does with it |\n|---|---|\n");
    for var in VARIABLES {
        let what = match var.what {
            Use::Launch(doc) => format!("honoured: {doc}"),
            Use::Key(key, _) => format!(
                "honoured: `{key}`, unless the cluster file sets it (the variable is then logged as \
                 not used)"
            ),
            Use::LogLevel => "honoured: the log level when `RUST_LOG` is not set (TRACE, DEBUG, \
                              INFO, WARNING, ERROR, FATAL)"
                .to_string(),
            Use::Fixed(accepted, why) => {
                format!("only `{}` is accepted: {why}", accepted.join("` or `"))
            }
            Use::Refused(why) => format!("refused: {why}"),
            Use::TraceOn => "honoured: `1` turns the timeline on: `trace.dir` = BYTEPS_TRACE_DIR \
                             (default `./trace`), steps 10 to 20 unless set (BytePS's window), \
                             unless the cluster file sets `trace.dir`; `0`: off"
                .to_string(),
            Use::With(other, doc) => format!("honoured with `{other}=1`: {doc}"),
        };
        s.push_str(&format!("| `{}` | {what} |\n", var.name));
    }
    s.push_str("| any other `BYTEPS_*` or `DMLC_*` | refused: not a variable pushpull knows |\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn tuning_applies_unless_the_file_sets_the_key() {
        let mut c = Config::local(2, 1);
        let none = BTreeSet::new();
        let env = vars(&[
            ("BYTEPS_PARTITION_BYTES", "8192000"),
            ("BYTEPS_FORCE_DISTRIBUTED", "1"),
            ("BYTEPS_ENABLE_ASYNC", "0"),
            ("HOME", "/root"),
        ]);
        assert!(apply_tuning(&mut c, &none, &env).unwrap().is_empty());
        assert_eq!(c.cluster.partition_bytes, 8_192_000);
        assert!(c.cluster.force_distributed);
        // The file's explicit value wins and the variable is logged.
        let mut c = Config::local(2, 1);
        let text = "[cluster]\nscheduler = \"127.0.0.1:0\"\nnum_workers = 2\nnum_servers = 1\n\
                    partition_bytes = 65536\n";
        let explicit = explicit_keys(text);
        assert!(explicit.contains("cluster.partition_bytes"));
        c.cluster.partition_bytes = 65536;
        let notes = apply_tuning(&mut c, &explicit, &env).unwrap();
        assert_eq!(c.cluster.partition_bytes, 65536);
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("BYTEPS_PARTITION_BYTES=8192000") && notes[0].contains("65536"));
    }

    #[test]
    fn every_other_variable_is_refused_by_name() {
        let cases: &[(&str, &str, &str)] = &[
            ("BYTEPS_PARTITION_BYTES", "4M", "unsigned integer"),
            ("BYTEPS_PARTITION_BYTES", "6", "multiple of 4"),
            ("BYTEPS_FORCE_DISTRIBUTED", "yes", "0 or 1"),
            ("BYTEPS_ENABLE_ASYNC", "1", "synchronous"),
            ("DMLC_ENABLE_RDMA", "1", "QUIC"),
            ("BYTEPS_SERVER_ENGINE_THREAD", "8", "engine-thread"),
            ("BYTEPS_NCCL_GROUP_SIZE", "4", "NCCL"),
            (
                "BYTEPS_SOMETHING_NEW",
                "1",
                "not a BytePS variable pushpull knows",
            ),
            ("DMLC_FOO", "1", "not a BytePS variable pushpull knows"),
            ("BYTEPS_LOG_LEVEL", "loud", "WARNING"),
        ];
        for (name, value, words) in cases {
            let mut c = Config::local(2, 1);
            let e = apply_tuning(&mut c, &BTreeSet::new(), &vars(&[(name, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(name) && e.contains(words), "{name}={value}: {e}");
        }
    }

    #[test]
    fn byteps_trace_variables_set_the_timeline() {
        let mut c = Config::local(2, 1);
        let none = BTreeSet::new();
        let env = vars(&[("BYTEPS_TRACE_ON", "1"), ("BYTEPS_TRACE_DIR", "/tmp/t")]);
        assert!(apply_tuning(&mut c, &none, &env).unwrap().is_empty());
        assert_eq!(c.trace.dir.as_deref(), Some("/tmp/t"));
        assert_eq!((c.trace.start_step, c.trace.end_step), (10, Some(20)));
        let mut c = Config::local(2, 1);
        let env = vars(&[
            ("BYTEPS_TRACE_START_STEP", "2"),
            ("BYTEPS_TRACE_ON", "1"),
            ("BYTEPS_TRACE_END_STEP", "3"),
        ]);
        apply_tuning(&mut c, &none, &env).unwrap();
        assert_eq!(c.trace.dir.as_deref(), Some("./trace"));
        assert_eq!((c.trace.start_step, c.trace.end_step), (2, Some(3)));
        // Without BYTEPS_TRACE_ON the folder is not used, and said so.
        let mut c = Config::local(2, 1);
        let notes = apply_tuning(&mut c, &none, &vars(&[("BYTEPS_TRACE_DIR", "/x")])).unwrap();
        assert_eq!(c.trace.dir, None);
        assert!(notes[0].contains("BYTEPS_TRACE_ON"), "{notes:?}");
        for (name, value, words) in [
            ("BYTEPS_TRACE_ON", "yes", "0 or 1"),
            ("BYTEPS_TRACE_START_STEP", "0", "trace.start_step"),
        ] {
            let mut c = Config::local(2, 1);
            let e = apply_tuning(&mut c, &none, &vars(&[(name, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(name) && e.contains(words), "{e}");
        }
    }

    #[test]
    fn launch_variables_give_the_binaries_their_job() {
        let env = vars(&[
            ("DMLC_ROLE", "worker"),
            ("DMLC_PS_ROOT_URI", "node001"),
            ("DMLC_PS_ROOT_PORT", "9000"),
            ("DMLC_NUM_WORKER", "2"),
            ("DMLC_NUM_SERVER", "3"),
            ("DMLC_WORKER_ID", "1"),
            ("BYTEPS_LOCAL_RANK", "2"),
            ("BYTEPS_LOCAL_SIZE", "4"),
        ]);
        let s = launch_settings(NodeRole::Worker, &env).unwrap();
        assert_eq!(s.scheduler.as_deref(), Some("node001:9000"));
        assert_eq!(
            (s.num_workers, s.num_servers, s.local_size, s.rank),
            (Some(8), Some(3), Some(4), Some(6))
        );
        let mut c = Config::local(2, 1);
        let notes = s.apply(&mut c);
        assert_eq!(c.cluster.num_workers, 8);
        assert_eq!(c.cluster.local_size, 1, "the file says how workers group");
        assert_eq!(notes.len(), 3, "{notes:?}");
        let e = launch_settings(NodeRole::Server, &env)
            .unwrap_err()
            .to_string();
        assert!(e.contains("DMLC_ROLE") && e.contains("server"), "{e}");
        let v6 = vars(&[
            ("DMLC_PS_ROOT_URI", "fd00::1"),
            ("DMLC_PS_ROOT_PORT", "9000"),
        ]);
        let s = launch_settings(NodeRole::Scheduler, &v6).unwrap();
        assert_eq!(s.scheduler.as_deref(), Some("[fd00::1]:9000"));
        for (bad, words) in [
            (vec![("DMLC_PS_ROOT_URI", "h")], "DMLC_PS_ROOT_PORT"),
            (vec![("DMLC_NUM_WORKER", "0")], ">= 1"),
            (
                vec![("BYTEPS_LOCAL_RANK", "2"), ("BYTEPS_LOCAL_SIZE", "2")],
                "below",
            ),
            (
                vec![("DMLC_NUM_WORKER", "2"), ("DMLC_WORKER_ID", "2")],
                "DMLC_WORKER_ID",
            ),
        ] {
            let e = launch_settings(NodeRole::Worker, &vars(&bad))
                .unwrap_err()
                .to_string();
            assert!(e.contains(words), "{bad:?}: {e}");
        }
    }

    #[test]
    fn log_levels_and_the_table() {
        assert_eq!(log_level("warning"), Ok("warn"));
        assert_eq!(log_level("FATAL"), Ok("error"));
        assert!(log_level("loud").unwrap_err().contains("BYTEPS_LOG_LEVEL"));
        let t = markdown_table();
        for var in VARIABLES {
            assert_eq!(
                t.matches(&format!("| `{}` |", var.name)).count(),
                1,
                "{}",
                var.name
            );
        }
        // Names are unique, and every key variable reads and writes its key.
        let names: BTreeSet<&str> = VARIABLES.iter().map(|v| v.name).collect();
        assert_eq!(names.len(), VARIABLES.len());
        for var in VARIABLES {
            if let Use::Key(key, kind) = var.what {
                let mut c = Config::local(1, 1);
                let value = match kind {
                    Kind::Bool => "1",
                    Kind::Bytes => "8192",
                };
                set_key(&mut c, key, value);
                assert_eq!(key_value(&c, key), value, "{key}");
            }
        }
    }
}
