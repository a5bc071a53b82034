//! `pushpull bench transport`: raw quinn throughput with the cluster's own settings, to put the
//! push_pull numbers in perspective.
//!
//! The benchmark starts separate processes of `pushpull` itself, like a cluster: `S` *sinks*
//! (`pushpull bench sink`, in the role of servers) and `ceil(N / S)` *senders* (`pushpull bench
//! send`, in the role of workers), with `N` connections laid out like a W×S cluster (sender `w`
//! connects to sinks `0..S`, the first `N` pairs). Every endpoint is
//! [`pushpull_net::transport::Endpoint::bind`] with the same transport settings and mutual
//! TLS as the cluster (a throw-away CA). Each connection carries `B` bytes as data frames of
//! `partition_bytes` (the cluster's chunk size), each on its own unidirectional stream, sent
//! by the cluster's own [`FrameSender`] (byte window `cluster.send_window_bytes`); the sink
//! reads each stream to the end ([`read_frame`], as a server does). GB/s is the bytes all
//! sinks received over the time from the first to the last byte (GB = 1e9 bytes). Every process
//! reports its own CPU seconds.
//!
//! With `--compare-cluster` the same run then starts the local cluster benchmark
//! ([`pushpull_launch::local`]) and prints its push + pull payload throughput summed over workers and the
//! ratio to the raw number. Note the shapes differ: the cluster moves data both ways on each
//! connection (pushes out, results back), the raw benchmark one way.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use pushpull_net::sender::{FrameSender, OnError, Peer};
use pushpull_net::tls::TlsIdentity;
use pushpull_net::transport::{read_frame, Endpoint};
use pushpull_proto::protocol::{max_payload_len, FrameFlags, FrameHeader, FrameKind, ReduceOp};
use pushpull_proto::sendq::Flow;
use pushpull_proto::Config;
use serde::{Deserialize, Serialize};

use pushpull_launch::local::{run_local, LocalOptions, LocalSummary};
use pushpull_launch::procs::{Event, ProcGroup, Programs};
use pushpull_node::commands::{load_config, load_identity, parse_addr_flag, NodeArgs};
use pushpull_node::cpu::process_cpu_seconds;
use pushpull_node::error::{CliError, CliResult};
use pushpull_proto::config::env::NodeRole;

/// The line prefix a sink prints once bound.
pub const SINK_LISTENING: &str = "pushpull-bench-sink listening on ";

/// What to measure.
#[derive(Debug, Clone)]
pub struct TransportOptions {
    /// Cluster settings (transport settings, partition size, in-flight bound).
    pub config: Config,
    /// Connections in all.
    pub connections: u32,
    /// Sink processes.
    pub sinks: u32,
    /// Bytes per connection.
    pub bytes: u64,
    /// Where `pushpull` is.
    pub programs: Programs,
    /// Where the processes run: `None` on this host's loopback; otherwise each sink's network
    /// namespace and the address it binds, and each sender's namespace (`pushpull bench net`,
    /// which runs the baseline on the hosts of its shaped network).
    pub netns: Option<NetnsPlacement>,
}

/// The hosts of a raw transport run in network namespaces (see [`TransportOptions::netns`]).
#[derive(Debug, Clone)]
pub struct NetnsPlacement {
    /// Per sink: its namespace and the IP it binds.
    pub sinks: Vec<(String, std::net::IpAddr)>,
    /// Per sender: its namespace.
    pub senders: Vec<String>,
}

impl NetnsPlacement {
    /// `program args...`, or `ip netns exec NS program args...` for the process placed in a
    /// namespace.
    fn command(
        ns: Option<&String>,
        exe: &std::path::Path,
        args: Vec<String>,
    ) -> (PathBuf, Vec<String>) {
        match ns {
            None => (exe.to_path_buf(), args),
            Some(ns) => {
                let mut a = vec![
                    "netns".to_string(),
                    "exec".to_string(),
                    ns.clone(),
                    exe.display().to_string(),
                ];
                a.extend(args);
                (PathBuf::from("ip"), a)
            }
        }
    }
}

/// One process's own account, printed as a JSON line at exit.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SideReport {
    /// `sink` or `sender`.
    pub role: String,
    /// Bytes received (sink, headers included) or sent (sender).
    pub bytes: u64,
    /// Frames.
    pub frames: u64,
    /// Unix time of the first byte received (sink) or of the start (sender), seconds.
    pub first: f64,
    /// Unix time of the last byte received (sink) or of the end (sender), seconds.
    pub last: f64,
    /// CPU seconds of the process.
    pub cpu_seconds: f64,
    /// Packets quinn declared lost (sender side; 0 for sinks).
    #[serde(default)]
    pub lost_packets: u64,
}

/// The raw transport result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TransportReport {
    /// Connections.
    pub connections: u32,
    /// Sender processes.
    pub senders: u32,
    /// Sink processes.
    pub sinks: u32,
    /// Bytes per frame (`partition_bytes`).
    pub frame_bytes: u64,
    /// Bytes received by all sinks.
    pub bytes: u64,
    /// Seconds from the first byte to the last.
    pub seconds: f64,
    /// `bytes / seconds / 1e9`.
    pub gb_per_second: f64,
    /// CPU seconds per process (`sender 0`, …, `sink 0`, …).
    pub cpu_seconds: BTreeMap<String, f64>,
    /// CPU seconds per GB moved, senders and sinks together.
    pub cpu_seconds_per_gb: f64,
    /// Packets the senders' quinn declared lost (UDP receive buffer overflows on loopback).
    pub lost_packets: u64,
}

impl TransportReport {
    /// The human-readable report.
    pub fn to_text(&self) -> String {
        let cpu: Vec<String> = self
            .cpu_seconds
            .iter()
            .map(|(k, v)| format!("{k} {v:.2}"))
            .collect();
        format!(
            "raw quinn: {} connections ({} senders x {} sinks), {} bytes in frames of {} bytes: \
             {:.3} GB/s ({:.2} s), {} packets lost\n  CPU seconds: {} ({:.2} CPU-s per GB)",
            self.connections,
            self.senders,
            self.sinks,
            self.bytes,
            self.frame_bytes,
            self.gb_per_second,
            self.seconds,
            self.lost_packets,
            cpu.join("; "),
            self.cpu_seconds_per_gb
        )
    }
}

/// The raw benchmark next to the cluster benchmark.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompareReport {
    /// Raw quinn.
    pub transport: TransportReport,
    /// The local cluster.
    pub cluster: LocalSummary,
    /// Cluster push + pull payload GB/s summed over workers.
    pub cluster_payload_gb_per_second: f64,
    /// `cluster_payload_gb_per_second / transport.gb_per_second`.
    pub ratio: f64,
}

impl CompareReport {
    /// The human-readable report.
    pub fn to_text(&self) -> String {
        format!(
            "{}\n{}\npush_pull payload throughput / raw quinn throughput = {:.3} / {:.3} GB/s = {:.3} \
             (push_pull: push + pull payload summed over workers, both directions; raw: one \
             direction)",
            self.transport.to_text(),
            self.cluster.to_text(),
            self.cluster_payload_gb_per_second,
            self.transport.gb_per_second,
            self.ratio
        )
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Runs the raw benchmark (see the module docs). Call on a runtime whose thread outlives it.
pub async fn run_transport(opts: &TransportOptions) -> CliResult<TransportReport> {
    if opts.connections == 0 {
        return Err(CliError::usage("--connections 0: must be at least 1"));
    }
    if opts.sinks == 0 {
        return Err(CliError::usage("--sinks 0: must be at least 1"));
    }
    if opts.bytes == 0 {
        return Err(CliError::usage("--bytes 0: must be at least 1"));
    }
    let sinks = opts.sinks.min(opts.connections);
    let senders = opts.connections.div_ceil(sinks);
    if let Some(n) = &opts.netns {
        if n.sinks.len() < sinks as usize || n.senders.len() < senders as usize {
            return Err(CliError::usage(format!(
                "{sinks} sinks and {senders} senders need as many hosts; the placement has {} and {}",
                n.sinks.len(),
                n.senders.len()
            )));
        }
    }
    // Connection j: sender j / sinks -> sink j % sinks.
    let pairs: Vec<(u32, u32)> = (0..opts.connections)
        .map(|j| (j / sinks, j % sinks))
        .collect();

    let names: Vec<String> = (0..sinks)
        .map(|i| format!("sink{i}"))
        .chain((0..senders).map(|i| format!("sender{i}")))
        .collect();
    let files = pushpull_launch::ClusterFiles::new("pushpull-bench-", &opts.config, &names)?;
    let (tls, config_path) = (&files.tls, &files.config_path);
    let exe = &opts.programs.pushpull;
    let mut group = ProcGroup::new();
    let mut sink_addrs = Vec::new();
    for s in 0..sinks {
        let conns = pairs.iter().filter(|p| p.1 == s).count();
        let placed = opts.netns.as_ref().map(|n| &n.sinks[s as usize]);
        let listen = match placed {
            Some((_, ip)) => SocketAddr::new(*ip, 0),
            None => SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let mut a: Vec<String> = vec![
            "bench".into(),
            "sink".into(),
            "--config".into(),
            config_path.display().to_string(),
            "--connections".into(),
            conns.to_string(),
            "--bytes".into(),
            opts.bytes.to_string(),
            "--listen".into(),
            listen.to_string(),
        ];
        a.extend(tls[s as usize].to_args());
        let (prog, a) = NetnsPlacement::command(placed.map(|p| &p.0), exe, a);
        let idx = group.spawn(&format!("sink {s}"), &prog, &a)?;
        sink_addrs.push(
            group
                .wait_line(idx, SINK_LISTENING, pushpull_node::report::STARTUP_TIMEOUT)
                .await?,
        );
    }
    for w in 0..senders {
        let to: Vec<String> = pairs
            .iter()
            .filter(|p| p.0 == w)
            .map(|p| sink_addrs[p.1 as usize].clone())
            .collect();
        let mut a: Vec<String> = vec![
            "bench".into(),
            "send".into(),
            "--config".into(),
            config_path.display().to_string(),
            "--to".into(),
            to.join(","),
            "--bytes".into(),
            opts.bytes.to_string(),
        ];
        a.extend(tls[(sinks + w) as usize].to_args());
        let ns = opts.netns.as_ref().map(|n| &n.senders[w as usize]);
        let (prog, a) = NetnsPlacement::command(ns, exe, a);
        group.spawn(&format!("sender {w}"), &prog, &a)?;
    }
    let mut reports: BTreeMap<String, SideReport> = BTreeMap::new();
    while let Some(ev) = group.next_event().await {
        match ev {
            Event::Line { proc, line } if line.starts_with('{') => {
                let r: SideReport = serde_json::from_str(&line).map_err(|e| {
                    CliError::failed(format!("{}: unreadable report: {e}", group.name(proc)))
                })?;
                reports.insert(group.name(proc).to_string(), r);
            }
            Event::Exit { proc, status } if !status.success() => {
                let msg = group.failure_message(proc, status);
                group.kill_all();
                return Err(CliError::failed(format!("bench transport: {msg}")));
            }
            _ => {}
        }
    }
    let sink_reports: Vec<&SideReport> = reports.values().filter(|r| r.role == "sink").collect();
    let bytes: u64 = sink_reports.iter().map(|r| r.bytes).sum();
    let first = sink_reports
        .iter()
        .map(|r| r.first)
        .fold(f64::INFINITY, f64::min);
    let last = sink_reports.iter().map(|r| r.last).fold(0.0, f64::max);
    let seconds = (last - first).max(1e-9);
    let cpu: BTreeMap<String, f64> = reports
        .iter()
        .map(|(k, r)| (k.clone(), r.cpu_seconds))
        .collect();
    let cpu_total: f64 = cpu.values().sum();
    Ok(TransportReport {
        connections: opts.connections,
        senders,
        sinks,
        frame_bytes: opts.config.cluster.partition_bytes,
        bytes,
        seconds,
        gb_per_second: bytes as f64 / seconds / 1e9,
        cpu_seconds: cpu,
        cpu_seconds_per_gb: cpu_total / (bytes as f64 / 1e9).max(1e-12),
        lost_packets: reports.values().map(|r| r.lost_packets).sum(),
    })
}

/// Runs the raw benchmark, then the local cluster benchmark, and compares them.
pub async fn run_compare(
    opts: &TransportOptions,
    cluster: &LocalOptions,
) -> CliResult<CompareReport> {
    let transport = run_transport(opts).await?;
    let cluster = run_local(cluster).await?;
    let payload = cluster.aggregate_payload_gb_per_second();
    Ok(CompareReport {
        ratio: payload / transport.gb_per_second.max(1e-12),
        cluster_payload_gb_per_second: payload,
        transport,
        cluster,
    })
}

fn print_json_line<T: Serialize>(v: &T) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", serde_json::to_string(v).expect("serializes"));
    let _ = out.flush();
}

/// `pushpull bench sink`: binds `listen`, accepts `connections` connections and reads every
/// frame to the end; a connection that delivered `bytes` payload bytes is closed. Prints a
/// [`SideReport`].
pub async fn run_sink(
    args: &NodeArgs,
    listen: SocketAddr,
    connections: u32,
    bytes: u64,
) -> CliResult<()> {
    let (config, _) = load_config(args, NodeRole::Server)?;
    let identity = load_identity(&config)?;
    let ep = bind(listen, &identity, &config)?;
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{SINK_LISTENING}{}", ep.local_addr());
        let _ = out.flush();
    }
    let max_payload = max_payload_len(config.cluster.partition_bytes);
    let total = Arc::new(AtomicU64::new(0));
    let frames = Arc::new(AtomicU64::new(0));
    let first = Arc::new(std::sync::Mutex::new(f64::INFINITY));
    let last = Arc::new(std::sync::Mutex::new(0.0f64));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let incoming = tokio::time::timeout(Duration::from_secs(60), ep.quinn.accept())
            .await
            .map_err(|_| CliError::failed("sink: no connection within 60 s"))?
            .ok_or_else(|| CliError::failed("sink: endpoint closed"))?;
        let conn = incoming
            .await
            .map_err(|e| CliError::failed(format!("sink: handshake failed: {e}")))?;
        let (total, frames, first, last) =
            (total.clone(), frames.clone(), first.clone(), last.clone());
        tasks.spawn(async move {
            let peer = conn.remote_address().to_string();
            let got = Arc::new(AtomicU64::new(0));
            let mut readers = tokio::task::JoinSet::new();
            loop {
                if got.load(Ordering::Relaxed) >= bytes {
                    break;
                }
                tokio::select! {
                    s = conn.accept_uni() => {
                        let Ok(mut s) = s else { break };
                        {
                            let mut f = first.lock().unwrap();
                            if f.is_infinite() { *f = now(); }
                        }
                        let (got, total, frames, last, peer) =
                            (got.clone(), total.clone(), frames.clone(), last.clone(), peer.clone());
                        readers.spawn(async move {
                            if let Ok((_, payload)) = read_frame(&mut s, max_payload, &peer).await {
                                got.fetch_add(payload.len() as u64, Ordering::Relaxed);
                                total.fetch_add(payload.len() as u64, Ordering::Relaxed);
                                frames.fetch_add(1, Ordering::Relaxed);
                                *last.lock().unwrap() = now();
                            }
                        });
                    }
                    Some(_) = readers.join_next() => {}
                }
            }
            while readers.join_next().await.is_some() {}
            conn.close(0u32.into(), b"done");
        });
    }
    while tasks.join_next().await.is_some() {}
    ep.quinn.wait_idle().await;
    let first = *first.lock().unwrap();
    print_json_line(&SideReport {
        role: "sink".into(),
        bytes: total.load(Ordering::Relaxed),
        frames: frames.load(Ordering::Relaxed),
        first: if first.is_finite() { first } else { 0.0 },
        last: *last.lock().unwrap(),
        cpu_seconds: process_cpu_seconds(),
        lost_packets: 0,
    });
    Ok(())
}

fn bind(addr: SocketAddr, identity: &TlsIdentity, config: &Config) -> CliResult<Endpoint> {
    Endpoint::bind(addr, identity, config)
        .map_err(|e| CliError::usage(format!("cannot bind UDP {addr}: {e}")))
}

/// `pushpull bench send`: connects to every address in `to` and sends `bytes` per connection in
/// frames of `partition_bytes`, each on its own unidirectional stream, through the cluster's
/// own [`FrameSender`] (one queue and byte window of `cluster.send_window_bytes` for every
/// connection, frames interleaved over the connections as a worker's pushes are). Prints a
/// [`SideReport`].
pub async fn run_sender(args: &NodeArgs, to: &str, bytes: u64) -> CliResult<()> {
    let (config, _) = load_config(args, NodeRole::Worker)?;
    let identity = load_identity(&config)?;
    let addrs = to
        .split(',')
        .map(|a| parse_addr_flag("--to", a.trim()))
        .collect::<CliResult<Vec<_>>>()?;
    let unspecified: SocketAddr = match addrs.first() {
        Some(a) if a.is_ipv6() => (std::net::Ipv6Addr::UNSPECIFIED, 0).into(),
        _ => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
    };
    let ep = bind(unspecified, &identity, &config)?;
    let frame = config.cluster.partition_bytes;
    let payload = Bytes::from(
        (0..frame)
            .map(|i| pushpull_jobs::data::mix64(i) as u8)
            .collect::<Vec<u8>>(),
    );
    let mut conns = Vec::new();
    for a in &addrs {
        let c = ep
            .connect_with_retry(*a, config.connect_timeout())
            .await
            .map_err(|e| CliError::failed(format!("sender: {e}")))?;
        conns.push(c);
    }
    let start = now();
    let mut sent = 0u64;
    let mut frames = 0u64;
    let failed: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
    let on_error: OnError = {
        let failed = failed.clone();
        Box::new(move |peer: &Peer, e| {
            failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(format!("sending to {}: {e}", peer.name));
        })
    };
    let (sender, driver) = FrameSender::new(
        config.cluster.send_window_bytes,
        Flow::SOURCE,
        Some(ep.window_cap().clone()),
        on_error,
    );
    let driver = tokio::spawn(driver);
    let peers: Vec<Peer> = conns
        .iter()
        .map(|c| Peer {
            conn: c.clone(),
            name: c.remote_address().to_string().into(),
        })
        .collect();
    // Frames in the order a worker pushes them: chunk by chunk, each to the next sink.
    let mut key = 0u64;
    let mut off = 0u64;
    while off < bytes {
        let n = frame.min(bytes - off);
        for peer in &peers {
            let header = FrameHeader {
                kind: FrameKind::Push,
                op: ReduceOp::Sum,
                flags: FrameFlags::default(),
                rank: 0,
                aux: 0,
                key,
                round: 0,
                payload_len: n,
            };
            sender.send(peer, header, payload.slice(..n as usize), 0);
            key += 1;
            sent += n;
            frames += 1;
        }
        off += n;
    }
    sender.flushed().await;
    let mut tasks = tokio::task::JoinSet::new();
    for conn in conns {
        tasks.spawn(async move {
            // The sink closes the connection once it has read everything.
            let closed = tokio::time::timeout(Duration::from_secs(600), conn.closed()).await;
            match closed {
                Ok(quinn::ConnectionError::ApplicationClosed(_)) => {
                    Ok(conn.stats().path.lost_packets)
                }
                Ok(e) => Err(e.to_string()),
                Err(_) => Err("the sink did not close the connection within 600 s".to_string()),
            }
        });
    }
    let mut lost = 0;
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(l)) => lost += l,
            Ok(Err(e)) => return Err(CliError::failed(format!("sender: {e}"))),
            Err(e) => return Err(CliError::failed(format!("sender task: {e}"))),
        }
    }
    driver.abort();
    if let Some(e) = failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(CliError::failed(format!("sender: {e}")));
    }
    print_json_line(&SideReport {
        role: "sender".into(),
        bytes: sent,
        frames,
        first: start,
        last: now(),
        cpu_seconds: process_cpu_seconds(),
        lost_packets: lost,
    });
    Ok(())
}
