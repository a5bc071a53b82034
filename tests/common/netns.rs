//! Network namespaces for the tests that need a real kernel network: whether they may be
//! built here (root and `ip`/`tc`; `PUSHPULL_REQUIRE_NETNS=1`, set by `.ci/run`, turns "no" into
//! a failure instead of a skip), a namespace of its own with a shaped loopback, and running a
//! closure inside one (`setns` on a fresh thread: sockets it opens, threads and processes it
//! starts live in the namespace; the rest of the test process does not move).

use std::fs::File;
use std::os::fd::AsRawFd;

use pushpull::bench::net::topo::{process_prefix, run_cmd};

/// `Ok(())` when the namespaces can be built here, else why not.
fn capable() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not running as root (network namespaces need CAP_SYS_ADMIN)".into());
    }
    Ok(())
}

/// `Some(value)` from `build`, or `None` (after saying why `test` is skipped) when it fails and
/// `PUSHPULL_REQUIRE_NETNS` is not `1`; with it set a failure panics.
pub fn build_or_skip<T>(test: &str, build: impl FnOnce() -> Result<T, String>) -> Option<T> {
    let required = std::env::var("PUSHPULL_REQUIRE_NETNS").is_ok_and(|v| v == "1");
    match capable().and_then(|()| build()) {
        Ok(t) => Some(t),
        Err(why) if required => {
            panic!("PUSHPULL_REQUIRE_NETNS=1 but {test} cannot run: {why}")
        }
        Err(why) => {
            eprintln!("skipped: {test}: {why}");
            None
        }
    }
}

/// A namespace whose only link is its loopback (MTU 1500, like Ethernet), shaped by a tbf
/// qdisc; deleted on drop.
pub struct ShapedLoopback {
    pub name: String,
}

impl ShapedLoopback {
    /// A new namespace with `tbf` (the arguments after `tc qdisc add dev lo root`) on `lo`.
    pub fn new(tag: &str, tbf: &[&str]) -> Result<ShapedLoopback, String> {
        let ns = ShapedLoopback {
            name: format!("{}{tag}", process_prefix()),
        };
        run_cmd("ip", &["netns", "add", &ns.name]).map_err(|e| e.to_string())?;
        let n = ns.name.as_str();
        let mut add = vec!["-n", n, "qdisc", "add", "dev", "lo", "root"];
        add.extend(tbf);
        for (program, args) in [
            ("ip", vec!["-n", n, "link", "set", "lo", "mtu", "1500"]),
            ("ip", vec!["-n", n, "link", "set", "lo", "up"]),
            ("tc", add),
        ] {
            run_cmd(program, &args).map_err(|e| e.to_string())?;
        }
        Ok(ns)
    }

    /// Replaces the loopback's tbf parameters (`tc qdisc change dev lo root ...`).
    pub fn reshape(&self, tbf: &[&str]) {
        let mut args = vec![
            "-n",
            self.name.as_str(),
            "qdisc",
            "change",
            "dev",
            "lo",
            "root",
        ];
        args.extend(tbf);
        run_cmd("tc", &args).unwrap();
    }

    /// Packets the loopback's tbf queue has dropped so far.
    pub fn tbf_drops(&self) -> u64 {
        let out = run_cmd(
            "tc",
            &["-n", &self.name, "-s", "-j", "qdisc", "show", "dev", "lo"],
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v.as_array()
            .into_iter()
            .flatten()
            .filter(|q| q["kind"] == "tbf")
            .filter_map(|q| q["drops"].as_u64())
            .sum()
    }

    /// UDP datagrams the namespace's kernel dropped on receive, outside the qdisc: full receive
    /// buffers and other receive errors (`/proc/net/snmp`'s `Udp:` counters, read inside it).
    /// Its `SndbufErrors` are left out: sends refused for a full buffer are sent again (about
    /// 200 of them in the loss test added nothing to the packets declared lost).
    pub fn udp_drops(&self) -> u64 {
        let snmp = run_cmd(
            "ip",
            &["netns", "exec", &self.name, "cat", "/proc/net/snmp"],
        )
        .unwrap();
        let rows: Vec<Vec<&str>> = snmp
            .lines()
            .filter(|l| l.starts_with("Udp:"))
            .map(|l| l.split_whitespace().collect())
            .collect();
        let (names, values) = (&rows[0], &rows[1]);
        ["InErrors", "RcvbufErrors"]
            .iter()
            .map(|k| {
                let i = names.iter().position(|n| n == k).unwrap();
                values[i].parse::<u64>().unwrap()
            })
            .sum()
    }

    /// Runs `f` on a thread moved into this namespace and returns its result (a panic in `f`
    /// is the caller's panic).
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
                // SAFETY: a valid namespace descriptor; CLONE_NEWNET moves this thread only.
                let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }
}

impl Drop for ShapedLoopback {
    fn drop(&mut self) {
        if let Err(e) = run_cmd("ip", &["netns", "delete", &self.name]) {
            eprintln!("cleanup: {e}");
        }
    }
}
