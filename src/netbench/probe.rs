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

use super::topo::{check_interrupted, Topology};
use crate::error::{CliError, CliResult};

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

/// Sends for `seconds` from host `from` to host `to` and returns the receiver's goodput in
/// bits/s (payload bytes from first byte to end of stream).
pub fn transfer(topo: &Topology, from: usize, to: usize, seconds: f64) -> CliResult<f64> {
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
                loop {
                    let n = stream.read(&mut buf).map_err(io)?;
                    if n == 0 {
                        break;
                    }
                    first.get_or_insert_with(Instant::now);
                    total += n as u64;
                }
                let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
                Ok((total, secs))
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
                let end = Instant::now() + Duration::from_secs_f64(seconds);
                while Instant::now() < end {
                    stream.write_all(&buf).map_err(io)?;
                }
                stream.shutdown(std::net::Shutdown::Write).map_err(io)?;
                Ok(())
            })
        });
        let sent = sender
            .join()
            .unwrap_or_else(|_| Err(CliError::failed(format!("{what}: sender panicked"))));
        let received = receiver
            .join()
            .unwrap_or_else(|_| Err(CliError::failed(format!("{what}: receiver panicked"))));
        sent?;
        let (bytes, secs) = received?;
        if secs <= 0.0 || bytes == 0 {
            return Err(CliError::failed(format!("{what}: no data arrived")));
        }
        Ok(bytes as f64 * 8.0 / secs)
    })
}

/// Measures every host's upload and download once: host `i` sends to host `i + 1` (the last
/// to the first), one pair at a time, `seconds` each.
pub fn measure_links(topo: &Topology, seconds: f64) -> CliResult<Vec<LinkRate>> {
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
    for i in 0..n {
        check_interrupted()?;
        let j = (i + 1) % n;
        let r = transfer(topo, i, j, seconds)?;
        rates[i].up_bits_per_second = r;
        rates[j].down_bits_per_second = r;
    }
    Ok(rates)
}
