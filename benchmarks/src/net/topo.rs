//! The shaped network: one namespace per host joined by veth pairs to a bridge in a namespace of
//! its own, every veth end shaped with `tc ... tbf`, all built with plain `ip` and `tc` commands
//! and torn down when the [`Topology`] is dropped.
//!
//! ```text
//!  ns PREFIX-scheduler        ns PREFIX-br                 ns PREFIX-worker0
//!  eth0 198.18.0.1/24 ══veth══ p0 ─┐                 ┌─ p5 ══veth══ eth0 198.18.0.6/24
//!  (tbf: host upload)  (tbf: host download)  br0  ...       (tbf on both ends)
//! ```
//!
//! Addresses come from 198.18.0.0/24 (RFC 2544's benchmarking range), which exists only inside
//! these namespaces; nothing is created or changed in the root namespace (`ip -n NS` and
//! `tc -n NS` run every command inside the namespace it changes, and veth pairs are created
//! there directly). Namespace names are `pp<pid>n<seq>-<host>`, unique per run.
//!
//! Ctrl-C, SIGTERM and SIGHUP set a flag ([`install_signal_handlers`], [`interrupted`]) that the
//! benchmark polls, so it unwinds normally and the guard's `Drop` runs.

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use pushpull_node::error::{CliError, CliResult};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static SEQUENCE: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_signal(_sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Catches SIGINT, SIGTERM and SIGHUP: instead of dying, the process sets a flag that the
/// benchmark checks ([`interrupted`]), so it stops its children and deletes its namespaces.
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(
                sig,
                on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
}

/// Whether a signal asked us to stop.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Fails with "interrupted" once a signal arrived.
pub fn check_interrupted() -> CliResult<()> {
    if interrupted() {
        Err(CliError::failed(
            "interrupted by a signal: stopped the benchmark",
        ))
    } else {
        Ok(())
    }
}

/// Runs `program args` and returns its stdout; the error names the whole command line and
/// quotes its stderr.
pub fn run_cmd(program: &str, args: &[&str]) -> CliResult<String> {
    let line = || format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| CliError::failed(format!("cannot run `{}`: {e}", line())))?;
    if !out.status.success() {
        return Err(CliError::failed(format!(
            "`{}` failed ({}): {}",
            line(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Link shaping of every host, both directions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shaping {
    /// tbf rate in bits per second (tc's `kbit`/`mbit`/`gbit` are powers of 1000); 0: no tbf at
    /// all, the links run at the veth pairs' own speed (`bench train --rates none`).
    pub rate_bits: u64,
    /// MTU of every link (both veth ends and the bridge), bytes: 1500 is Ethernet's, 9000
    /// jumbo frames.
    pub mtu: u32,
}

/// Ethernet's MTU, the default of the shaped links.
pub const DEFAULT_MTU: u32 = 1500;

impl Shaping {
    /// tbf burst in bytes: 10 ms worth of the rate (≥ rate/HZ for any HZ ≥ 100), at least
    /// 128 KiB so a 64 KiB GSO packet always fits.
    pub fn burst_bytes(&self) -> u64 {
        (self.rate_bits / 8 / 100).max(128 << 10)
    }

    /// tbf queue limit in bytes: the burst plus 50 ms worth of the rate.
    pub fn limit_bytes(&self) -> u64 {
        self.burst_bytes() + self.rate_bits / 8 / 20
    }

    /// The `tbf ...` arguments of `tc qdisc add dev IF root`.
    pub fn tbf_args(&self) -> Vec<String> {
        vec![
            "tbf".into(),
            "rate".into(),
            format!("{}bit", self.rate_bits),
            "burst".into(),
            format!("{}b", self.burst_bytes()),
            "limit".into(),
            format!("{}b", self.limit_bytes()),
        ]
    }
}

/// Parses a rate like `100mbit`, `1gbit`, `2.5gbit`, `500kbit` or `1000000bit` (tc's units,
/// powers of 1000) into bits per second.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = [
        ("tbit", 1e12),
        ("gbit", 1e9),
        ("mbit", 1e6),
        ("kbit", 1e3),
        ("bit", 1.0),
    ]
    .iter()
    .find_map(|(u, m)| t.strip_suffix(u).map(|n| (n.to_string(), *m)))
    .ok_or_else(|| {
        format!("rate {s:?}: expected a number and a unit: bit, kbit, mbit, gbit, tbit")
    })?;
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("rate {s:?}: {num:?} is not a number"))?;
    let bits = v * mult;
    if !(bits.is_finite() && (8000.0..=1e12).contains(&bits)) {
        return Err(format!("rate {s:?}: must be between 8kbit and 1tbit"));
    }
    Ok(bits.round() as u64)
}

/// One host: its namespace, address and the bridge-side end of its veth pair.
#[derive(Debug, Clone)]
pub struct Host {
    /// Its name: the node it runs (`scheduler`, `server0`, `worker1`, ...), or `host<h>` for a
    /// host of a local group.
    pub name: String,
    /// The nodes it runs (`[name]` for a host of one node; `worker4`..`worker7` for host 1 of
    /// groups of 4).
    pub nodes: Vec<String>,
    /// Its network namespace.
    pub ns: String,
    /// Its address on the test subnet (interface `eth0`).
    pub ip: Ipv4Addr,
    /// The veth end in the bridge namespace (`p<i>`).
    pub port: String,
}

/// The namespaces of one run. Dropping it kills whatever still runs in them and deletes them.
#[derive(Debug)]
pub struct Topology {
    /// Common prefix of every namespace name (`pp<pid>n<seq>`).
    pub prefix: String,
    /// The bridge's namespace.
    pub bridge_ns: String,
    /// The hosts, in the order given.
    pub hosts: Vec<Host>,
    /// The shaping of every link.
    pub shaping: Shaping,
    created: Vec<String>,
}

/// The prefix every namespace of this process starts with: `pp<pid>n`.
pub fn process_prefix() -> String {
    format!("pp{}n", std::process::id())
}

/// Names of the existing network namespaces (`ip netns list`).
pub fn list_namespaces() -> CliResult<Vec<String>> {
    let out = run_cmd("ip", &["netns", "list"])?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// Deletes namespaces `pp<pid>n...` left behind by a benchmark process that no longer exists
/// (one killed with SIGKILL cannot clean up); returns their names.
pub fn remove_stale() -> CliResult<Vec<String>> {
    let mut removed = Vec::new();
    for ns in list_namespaces()? {
        let Some(rest) = ns.strip_prefix("pp") else {
            continue;
        };
        let Some((pid, tail)) = rest.split_once('n') else {
            continue;
        };
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) || !tail.contains('-') {
            continue;
        }
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        delete_namespace(&ns)?;
        removed.push(ns);
    }
    Ok(removed)
}

/// Kills every process in `ns` (SIGKILL) and deletes it.
fn delete_namespace(ns: &str) -> CliResult<()> {
    if let Ok(pids) = run_cmd("ip", &["netns", "pids", ns]) {
        for pid in pids
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            // SAFETY: plain kill(2) of a process inside our own namespace.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
    run_cmd("ip", &["netns", "del", ns]).map(|_| ())
}

impl Topology {
    /// Creates a bridge namespace and one namespace per name in `hosts`, each running the node
    /// of its name, links each host to the bridge with a veth pair shaped by `shaping` on both
    /// ends (not shaped when its rate is 0). On failure everything created so far is deleted and the error names the failed
    /// command.
    pub fn create(hosts: &[String], shaping: Shaping) -> CliResult<Topology> {
        let hosts: Vec<(String, Vec<String>)> =
            hosts.iter().map(|h| (h.clone(), vec![h.clone()])).collect();
        Topology::with_nodes(&hosts, shaping)
    }

    /// [`Topology::create`] for hosts that run several nodes: `(host name, its nodes)`.
    pub fn with_nodes(hosts: &[(String, Vec<String>)], shaping: Shaping) -> CliResult<Topology> {
        if hosts.is_empty() || hosts.len() > 250 {
            return Err(CliError::usage(format!(
                "a shaped network needs 1 to 250 hosts, not {}",
                hosts.len()
            )));
        }
        let prefix = format!(
            "{}{}",
            process_prefix(),
            SEQUENCE.fetch_add(1, Ordering::SeqCst)
        );
        let mut topo = Topology {
            bridge_ns: format!("{prefix}-br"),
            prefix,
            hosts: Vec::new(),
            shaping,
            created: Vec::new(),
        };
        topo.build(hosts)?;
        Ok(topo)
    }

    fn add_ns(&mut self, ns: &str) -> CliResult<()> {
        run_cmd("ip", &["netns", "add", ns])?;
        self.created.push(ns.to_string());
        Ok(())
    }

    fn build(&mut self, hosts: &[(String, Vec<String>)]) -> CliResult<()> {
        let br = self.bridge_ns.clone();
        self.add_ns(&br)?;
        let mtu = self.shaping.mtu.to_string();
        run_cmd("ip", &["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        run_cmd("ip", &["-n", &br, "link", "set", "br0", "mtu", &mtu])?;
        run_cmd("ip", &["-n", &br, "link", "set", "br0", "up"])?;
        let tbf = self.shaping.tbf_args();
        let tbf: Vec<&str> = tbf.iter().map(String::as_str).collect();
        for (i, (name, nodes)) in hosts.iter().enumerate() {
            check_interrupted()?;
            let ns = format!("{}-{name}", self.prefix);
            let port = format!("p{i}");
            let ip = Ipv4Addr::new(198, 18, 0, i as u8 + 1);
            let cidr = format!("{ip}/24");
            self.add_ns(&ns)?;
            run_cmd(
                "ip",
                &[
                    "-n", &br, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                    "netns", &ns,
                ],
            )?;
            run_cmd("ip", &["-n", &br, "link", "set", &port, "mtu", &mtu])?;
            run_cmd("ip", &["-n", &ns, "link", "set", "eth0", "mtu", &mtu])?;
            run_cmd("ip", &["-n", &br, "link", "set", &port, "master", "br0"])?;
            run_cmd("ip", &["-n", &br, "link", "set", &port, "up"])?;
            run_cmd("ip", &["-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
            run_cmd("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
            run_cmd("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
            if self.shaping.rate_bits > 0 {
                let mut up = vec!["-n", ns.as_str(), "qdisc", "add", "dev", "eth0", "root"];
                up.extend(&tbf);
                run_cmd("tc", &up)?;
                let mut down = vec!["-n", br.as_str(), "qdisc", "add", "dev", &port, "root"];
                down.extend(&tbf);
                run_cmd("tc", &down)?;
            }
            self.hosts.push(Host {
                name: name.clone(),
                nodes: nodes.clone(),
                ns,
                ip,
                port,
            });
        }
        Ok(())
    }

    /// The host named `name` or running node `name`.
    pub fn host(&self, name: &str) -> CliResult<&Host> {
        self.hosts
            .iter()
            .find(|h| h.name == name || h.nodes.iter().any(|n| n == name))
            .ok_or_else(|| CliError::failed(format!("the shaped network has no host {name:?}")))
    }

    /// Every namespace this topology created (and will delete).
    pub fn namespaces(&self) -> &[String] {
        &self.created
    }

    /// `(tx bytes, rx bytes)` of every host's `eth0`, in host order, read in one command from
    /// the bridge-side ends of the veth pairs (`ip -n BRIDGE_NS -s -j link show`): a port
    /// receives exactly what its host's `eth0` sends and vice versa, and one command keeps the
    /// snapshot short.
    pub fn counters(&self) -> CliResult<Vec<(u64, u64)>> {
        let out = run_cmd("ip", &["-n", &self.bridge_ns, "-s", "-j", "link", "show"])?;
        let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| {
            CliError::failed(format!("`ip -n {} -s -j link show`: {e}", self.bridge_ns))
        })?;
        self.hosts
            .iter()
            .map(|h| {
                let port = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|l| l["ifname"] == h.port.as_str());
                let get = |dir: &str| port.and_then(|p| p["stats64"][dir]["bytes"].as_u64());
                match (get("rx"), get("tx")) {
                    (Some(host_tx), Some(host_rx)) => Ok((host_tx, host_rx)),
                    _ => Err(CliError::failed(format!(
                        "`ip -n {} -s -j link show` printed no byte counters for {}",
                        self.bridge_ns, h.port
                    ))),
                }
            })
            .collect()
    }

    /// Packets dropped by the tbf queues of host `h`: `[upload, download]` (its own end's
    /// queue, and the bridge's toward it).
    pub fn tbf_drops(&self, h: &Host) -> CliResult<[u64; 2]> {
        let mut drops = [0; 2];
        let ends = [(h.ns.as_str(), "eth0"), (self.bridge_ns.as_str(), &h.port)];
        for (side, (ns, dev)) in ends.into_iter().enumerate() {
            let out = run_cmd("tc", &["-n", ns, "-s", "-j", "qdisc", "show", "dev", dev])?;
            let v: serde_json::Value = serde_json::from_str(&out)
                .map_err(|e| CliError::failed(format!("`tc -s -j qdisc` in {ns}: {e}")))?;
            drops[side] += v
                .as_array()
                .into_iter()
                .flatten()
                .filter(|q| q["kind"] == "tbf")
                .filter_map(|q| q["drops"].as_u64())
                .sum::<u64>();
        }
        Ok(drops)
    }

    /// Kills every process left in the namespaces and deletes them; returns the errors (also
    /// printed on stderr). Called by `Drop`; calling it twice is harmless.
    pub fn teardown(&mut self) -> Vec<String> {
        let mut errors = Vec::new();
        // Hosts first, the bridge last (deleting a host's namespace removes its veth pair).
        while let Some(ns) = self.created.pop() {
            if let Err(e) = delete_namespace(&ns) {
                eprintln!("pushpull bench net: cleanup: {e}");
                errors.push(e.to_string());
            }
        }
        errors
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("100mbit"), Ok(100_000_000));
        assert_eq!(parse_rate("1gbit"), Ok(1_000_000_000));
        assert_eq!(parse_rate("2.5Gbit"), Ok(2_500_000_000));
        assert_eq!(parse_rate("500kbit"), Ok(500_000));
        assert!(parse_rate("100").unwrap_err().contains("unit"));
        assert!(parse_rate("fastmbit").unwrap_err().contains("not a number"));
        assert!(parse_rate("0mbit").is_err());
    }

    #[test]
    fn tbf_parameters() {
        let s = Shaping {
            rate_bits: 100_000_000,
            mtu: DEFAULT_MTU,
        };
        assert_eq!(s.burst_bytes(), 131_072);
        assert_eq!(s.limit_bytes(), 131_072 + 625_000);
        let g = Shaping {
            rate_bits: 1_000_000_000,
            mtu: 9000,
        };
        assert_eq!(g.burst_bytes(), 1_250_000);
        assert_eq!(
            g.tbf_args().join(" "),
            "tbf rate 1000000000bit burst 1250000b limit 7500000b"
        );
    }
}
