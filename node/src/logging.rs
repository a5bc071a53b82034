//! Logging: `tracing` to stderr. `RUST_LOG` is respected; without it, pushpull's crates log at
//! `info` (or BytePS's `BYTEPS_LOG_LEVEL`) and everything else at `warn`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The filter used when `RUST_LOG` is not set.
pub const DEFAULT_FILTER: &str = "warn,pushpull=info,pushpull_node=info,pushpull_proto=info,\
    pushpull_net=info,pushpull_scheduler=info,pushpull_server=info,pushpull_worker=info,\
    pushpull_codecs=info,pushpull_kernels=info";

/// Installs the stderr subscriber once (later calls do nothing).
pub fn init() {
    let filter = match std::env::var("RUST_LOG") {
        Ok(s) if !s.trim().is_empty() => {
            EnvFilter::try_new(&s).unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER))
        }
        _ => {
            // A bad BYTEPS_LOG_LEVEL is reported by the node's config check, naming it.
            let level = std::env::var("BYTEPS_LOG_LEVEL")
                .ok()
                .and_then(|v| pushpull_proto::config::env::log_level(&v).ok());
            match level {
                Some(l) => EnvFilter::new(DEFAULT_FILTER.replace("=info", &format!("={l}"))),
                None => EnvFilter::new(DEFAULT_FILTER),
            }
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(filter)
        .try_init();
}
