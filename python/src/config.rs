//! How a Python worker's settings become a [`Config`]: the cluster file (or a loopback
//! cluster's defaults), BytePS's tuning variables, and the keyword overrides of `Worker(...)`.

use std::path::PathBuf;

use pushpull_proto::Config;
use pushpull_worker::WorkerError;

/// How to join: `config` (a cluster file, or the defaults of a loopback cluster) with the
/// overrides given. `None` keeps the file's value.
#[allow(clippy::too_many_arguments)]
pub(crate) fn join_config(
    config: Option<PathBuf>,
    scheduler: Option<String>,
    (num_workers, num_servers, local_size): (Option<u32>, Option<u32>, Option<u32>),
    tls_ca: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    server_name: Option<String>,
) -> Result<Config, WorkerError> {
    let bad = |e: String| WorkerError::Config(e);
    let (mut c, text) = match &config {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| bad(format!("cannot read config file {}: {e}", p.display())))?;
            let c = Config::from_toml_str(&text, &p.display().to_string())
                .map_err(|e| bad(e.to_string()))?;
            (c, text)
        }
        None => (
            Config::local(num_workers.unwrap_or(1), num_servers.unwrap_or(1)),
            String::new(),
        ),
    };
    // BytePS's tuning variables (the launch ones are read by pushpull/_env.py into the
    // arguments): a key the file sets wins, and the variable is logged; any other BYTEPS_* or
    // DMLC_* variable is refused by name.
    let vars: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let explicit = pushpull_proto::config::env::explicit_keys(&text);
    for note in pushpull_proto::config::env::apply_tuning(&mut c, &explicit, &vars)
        .map_err(|e| bad(e.to_string()))?
    {
        eprintln!("pushpull: {note}");
    }
    if let Some(s) = scheduler {
        pushpull_proto::config::SchedulerAddr::parse(&s)
            .map_err(|e| bad(format!("scheduler address {s:?}: {e}")))?;
        c.cluster.scheduler = s;
    }
    if let Some(n) = num_workers {
        c.cluster.num_workers = n;
    }
    if let Some(n) = num_servers {
        c.cluster.num_servers = n;
    }
    if let Some(g) = local_size {
        c.cluster.local_size = g;
    }
    if tls_ca.is_some() {
        c.tls.ca = tls_ca;
    }
    if tls_cert.is_some() {
        c.tls.cert = tls_cert;
    }
    if tls_key.is_some() {
        c.tls.key = tls_key;
    }
    if let Some(n) = server_name {
        c.tls.server_name = n;
    }
    let origin = config.map_or("(worker settings)".to_string(), |p| {
        format!("{} with the given overrides", p.display())
    });
    c.validate(&origin).map_err(|e| bad(e.to_string()))?;
    Ok(c)
}
