//! [`Config::validate`]: the range checks of every value that parsed, each error naming its key,
//! the value and what is allowed.

use super::*;

impl Config {
    /// Checks every value that parsed but may still be out of range.
    pub fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let bad = |key: &str, value: String, allowed: &str| ConfigError::Invalid {
            origin: origin.to_string(),
            key: key.to_string(),
            value,
            allowed: allowed.to_string(),
        };
        let c = &self.cluster;
        SchedulerAddr::parse(&c.scheduler)
            .map_err(|allowed| bad("cluster.scheduler", format!("{:?}", c.scheduler), &allowed))?;
        if c.num_workers == 0 {
            return Err(bad("cluster.num_workers", "0".into(), "must be at least 1"));
        }
        if c.local_size == 0 || c.local_size > 256 || c.num_workers % c.local_size != 0 {
            return Err(bad(
                "cluster.local_size",
                c.local_size.to_string(),
                &format!(
                    "workers per host: an integer in 1..=256 that divides cluster.num_workers \
                     ({})",
                    c.num_workers
                ),
            ));
        }
        let g = &self.gossip;
        if !(g.gamma > 0.0 && g.gamma <= 1.0) {
            return Err(bad("gossip.gamma", g.gamma.to_string(), "0 < gamma <= 1"));
        }
        if g.mixing.is_some() {
            g.matrix(c.num_workers)
                .map_err(|allowed| bad("gossip.mixing", format!("{:?}", g.mixing), &allowed))?;
        }
        if c.num_servers == 0 {
            return Err(bad("cluster.num_servers", "0".into(), "must be at least 1"));
        }
        if c.partition_bytes == 0 || c.partition_bytes % 4 != 0 {
            return Err(bad(
                "cluster.partition_bytes",
                c.partition_bytes.to_string(),
                "must be a positive multiple of 4 (bytes of fp32)",
            ));
        }
        if c.partition_bytes > MAX_PARTITION_BYTES {
            return Err(bad(
                "cluster.partition_bytes",
                c.partition_bytes.to_string(),
                &format!("must be at most {}", MAX_PARTITION_BYTES),
            ));
        }
        if let Some(bound) = c.max_chunk_payload_bytes.filter(|&b| b < 1024) {
            return Err(bad(
                "cluster.max_chunk_payload_bytes",
                bound.to_string(),
                "must be at least 1024 (bytes on the wire per chunk)",
            ));
        }
        if c.rendezvous_timeout_ms == 0 {
            return Err(bad(
                "cluster.rendezvous_timeout_ms",
                "0".into(),
                "must be at least 1",
            ));
        }
        if c.heartbeat_interval_ms == 0 {
            return Err(bad(
                "cluster.heartbeat_interval_ms",
                "0".into(),
                "must be at least 1",
            ));
        }
        if c.heartbeat_timeout_ms < 2 * c.heartbeat_interval_ms {
            return Err(bad(
                "cluster.heartbeat_timeout_ms",
                c.heartbeat_timeout_ms.to_string(),
                &format!(
                    "must be at least twice heartbeat_interval_ms ({})",
                    c.heartbeat_interval_ms
                ),
            ));
        }
        if !(1..=MAX_SEND_WINDOW_BYTES).contains(&c.send_window_bytes) {
            return Err(bad(
                "cluster.send_window_bytes",
                c.send_window_bytes.to_string(),
                &format!("a number of bytes from 1 to {MAX_SEND_WINDOW_BYTES}"),
            ));
        }
        if !(1200..=MAX_UDP_PAYLOAD).contains(&c.max_udp_payload) {
            return Err(bad(
                "cluster.max_udp_payload",
                c.max_udp_payload.to_string(),
                &format!(
                    "a number of bytes from 1200 to {MAX_UDP_PAYLOAD} (quinn batches up to 10 \
                     datagrams per send, and a batch must stay below 64 KiB)"
                ),
            ));
        }
        parse_addr(&self.server.listen).map_err(|allowed| {
            bad(
                "server.listen",
                format!("{:?}", self.server.listen),
                &allowed,
            )
        })?;
        if let Some(adv) = &self.server.advertise {
            parse_addr(adv)
                .map_err(|allowed| bad("server.advertise", format!("{adv:?}"), &allowed))?;
        }
        if let Some(m) = &self.metrics.listen {
            parse_addr(m).map_err(|allowed| bad("metrics.listen", format!("{m:?}"), &allowed))?;
        }
        let t = &self.trace;
        if t.dir.as_deref() == Some("") {
            return Err(bad(
                "trace.dir",
                "\"\"".into(),
                "a folder path, or leave it out",
            ));
        }
        if t.start_step == 0 {
            return Err(bad(
                "trace.start_step",
                "0".into(),
                "a step ≥ 1 (steps count from 1)",
            ));
        }
        if let Some(end) = t.end_step {
            if end < t.start_step {
                return Err(bad(
                    "trace.end_step",
                    end.to_string(),
                    &format!("a step ≥ trace.start_step ({})", t.start_step),
                ));
            }
        }
        let d = self.worker.device.as_str();
        let ordinal = d.strip_prefix("cuda:").map(|n| n.parse::<u32>().is_ok());
        if !(["auto", "cpu", "cuda"].contains(&d) || ordinal == Some(true)) {
            return Err(bad(
                "worker.device",
                format!("{d:?}"),
                "one of \"auto\", \"cpu\", \"cuda\", \"cuda:N\" (N a device ordinal)",
            ));
        }
        if self.tls.server_name.is_empty() {
            return Err(bad("tls.server_name", "\"\"".into(), "a DNS name"));
        }
        for (table, map) in &self.tensors.tables {
            for (key, value) in map {
                scalar_to_string(value).map_err(|allowed| {
                    bad(
                        &format!("tensors.{table:?}.{key}"),
                        value.to_string(),
                        &allowed,
                    )
                })?;
            }
        }
        Ok(())
    }
}
