//! Measures what each shaped link achieves: a timed TCP transfer (std::net) from every host to
//! the next one in a ring, one transfer at a time, so each host's upload and download are each
//! measured once. Sockets are opened by threads that joined the hosts' namespaces with
//! `setns(2)` ([`in_netns`]); nothing is spawned.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::baseline::TransportCost;
use super::topo::{check_interrupted, Topology};
use pushpull_node::error::{CliError, CliResult};

/// Runs `f` on a new thread that first joins network namespace `ns` (only that thread moves).
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> CliResult<T> + Send) -> CliResult<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            enter_netns(ns)?;
            f()
        })
        .join()
        .unwrap_or_else(|_| {
            Err(CliError::failed(format!(
                "a thread in namespace {ns} panicked"
            )))
        })
    })
}

/// Moves the calling thread into network namespace `ns` (`/var/run/netns/NS`).
pub fn enter_netns(ns: &str) -> CliResult<()> {
    let path = format!("/var/run/netns/{ns}");
    let f = File::open(&path).map_err(|e| CliError::failed(format!("cannot open {path}: {e}")))?;
    // SAFETY: setns on a valid namespace fd; affects only this thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(CliError::failed(format!(
            "setns({path}, CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// The achieved TCP goodput of one host's upload and download, bits per second.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LinkRate {
    /// The host.
    pub host: String,
    /// Its upload (host → bridge), bits/s of TCP payload.
    pub up_bits_per_second: f64,
    /// Its download (bridge → host), bits/s of TCP payload.
    pub down_bits_per_second: f64,
}

/// One timed TCP transfer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Transfer {
    /// The receiver's goodput, bits/s (payload bytes from first byte to end of stream).
    pub bits_per_second: f64,
    /// Payload bytes received.
    pub bytes: u64,
    /// CPU seconds of the sending and the receiving thread (user + system).
    pub cpu_seconds: f64,
}

/// CPU seconds the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid pointer to a timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Sends for `seconds` from host `from` to host `to`.
pub fn transfer(topo: &Topology, from: usize, to: usize, seconds: f64) -> CliResult<Transfer> {
    let (src, dst) = (&topo.hosts[from], &topo.hosts[to]);
    let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
    let what = format!("rate probe {} -> {}", src.name, dst.name);
    let what = what.as_str();
    std::thread::scope(|s| {
        let receiver = s.spawn(move || {
            in_netns(&dst.ns, move || {
                let listener = TcpListener::bind((dst.ip, 0))
                    .map_err(|e| CliError::failed(format!("{what}: bind {}: {e}", dst.ip)))?;
                let addr = listener
                    .local_addr()
                    .map_err(|e| CliError::failed(format!("{what}: {e}")))?;
                let _ = tx.send(addr);
                listener
                    .set_nonblocking(true)
                    .map_err(|e| CliError::failed(format!("{what}: {e}")))?;
                let deadline = Instant::now() + Duration::from_secs(10);
                let mut stream = loop {
                    match listener.accept() {
                        Ok((st, _)) => break st,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            if Instant::now() > deadline {
                                return Err(CliError::failed(format!(
                                    "{what}: nobody connected within 10 s"
                                )));
                            }
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(e) => return Err(CliError::failed(format!("{what}: accept: {e}"))),
                    }
                };
                let io = |e: std::io::Error| CliError::failed(format!("{what}: receive: {e}"));
                stream.set_nonblocking(false).map_err(io)?;
                stream
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .map_err(io)?;
                let mut buf = vec![0u8; 1 << 16];
                let mut total = 0u64;
                let mut first: Option<Instant> = None;
                let cpu0 = thread_cpu_seconds();
                loop {
                    let n = stream.read(&mut buf).map_err(io)?;
                    if n == 0 {
                        break;
                    }
                    first.get_or_insert_with(Instant::now);
                    total += n as u64;
                }
                let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
                Ok((total, secs, thread_cpu_seconds() - cpu0))
            })
        });
        let sender = s.spawn(move || {
            in_netns(&src.ns, move || {
                let addr = rx
                    .recv_timeout(Duration::from_secs(10))
                    .map_err(|_| CliError::failed(format!("{what}: the receiver did not start")))?;
                let io =
                    |e: std::io::Error| CliError::failed(format!("{what}: send to {addr}: {e}"));
                let mut stream =
                    TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(io)?;
                stream
                    .set_write_timeout(Some(Duration::from_secs(10)))
                    .map_err(io)?;
                let buf = vec![0x5au8; 1 << 16];
                let cpu0 = thread_cpu_seconds();
                let end = Instant::now() + Duration::from_secs_f64(seconds);
                while Instant::now() < end {
                    stream.write_all(&buf).map_err(io)?;
                }
                stream.shutdown(std::net::Shutdown::Write).map_err(io)?;
                Ok(thread_cpu_seconds() - cpu0)
            })
        });
        let sent = sender
            .join()
            .unwrap_or_else(|_| Err(CliError::failed(format!("{what}: sender panicked"))));
        let received = receiver
            .join()
            .unwrap_or_else(|_| Err(CliError::failed(format!("{what}: receiver panicked"))));
        let sender_cpu = sent?;
        let (bytes, secs, receiver_cpu) = received?;
        if secs <= 0.0 || bytes == 0 {
            return Err(CliError::failed(format!("{what}: no data arrived")));
        }
        Ok(Transfer {
            bits_per_second: bytes as f64 * 8.0 / secs,
            bytes,
            cpu_seconds: sender_cpu + receiver_cpu,
        })
    })
}

/// Measures every host's upload and download once: host `i` sends to host `i + 1` (the last
/// to the first), one pair at a time, `seconds` each. Also returns what plain TCP cost in CPU
/// over all those transfers.
pub fn measure_links(topo: &Topology, seconds: f64) -> CliResult<(Vec<LinkRate>, TransportCost)> {
    let n = topo.hosts.len();
    let mut rates: Vec<LinkRate> = topo
        .hosts
        .iter()
        .map(|h| LinkRate {
            host: h.name.clone(),
            up_bits_per_second: 0.0,
            down_bits_per_second: 0.0,
        })
        .collect();
    if n < 2 {
        return Err(CliError::failed(
            "measuring link rates needs at least two hosts",
        ));
    }
    let mut tcp = TransportCost::new("tcp");
    for i in 0..n {
        check_interrupted()?;
        let j = (i + 1) % n;
        let t = transfer(topo, i, j, seconds)?;
        rates[i].up_bits_per_second = t.bits_per_second;
        rates[j].down_bits_per_second = t.bits_per_second;
        tcp.add(
            t.bytes,
            t.bytes as f64 * 8.0 / t.bits_per_second,
            t.cpu_seconds,
        );
    }
    Ok((rates, tcp))
}
