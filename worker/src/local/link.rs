//! A local group's transport on one host: the shared memory, the rendezvous, the notes and the
//! members' liveness (Linux).
//!
//! * **Shared memory**: one `memfd` (never a name in `/dev/shm`: a killed process leaks
//!   nothing; the memory goes when the last member's mapping does), sized once and sealed
//!   against growing and shrinking, mapped shared by every member. Its first page is a
//!   [`Header`] (magic, version, job, host, group size, data bytes) that a member checks
//!   before it uses the memory; the accumulators follow. The size is virtual: only the pages
//!   of declared tensors' accumulators are ever touched.
//! * **Rendezvous**: local rank 0 listens on an abstract Unix stream socket named after the
//!   job (`<job>/rendezvous`; abstract: no file either). Every other member connects (retrying
//!   until the connect timeout), says hello (job, host, local rank, group size); local rank 0
//!   checks it and answers with the memfd (`SCM_RIGHTS`) or with why it refuses.
//! * **Notes**: every member binds an abstract datagram socket `<job>/l<local rank>`; a note
//!   is 17 bytes (kind, key, round, little-endian), a datagram holds up to [`MAX_NOTES`].
//!   A thread per member reads them into its [`NoteTable`].
//! * **Liveness**: the rendezvous connections stay open. When a member's process ends, local
//!   rank 0 reads the end of its stream and tells the others ([`NoteKind`] `Lost`, the member
//!   in `key`); when local rank 0's ends, every member reads it. Each poisons its table with
//!   [`WorkerError::MemberLost`] naming the member.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use super::{GroupLink, Note, NoteKind, NoteTable};
use crate::error::WorkerError;

/// Bytes of one note on the wire.
const NOTE_BYTES: usize = 17;
/// The most notes in one datagram.
pub(crate) const MAX_NOTES: usize = 3800;
/// `"PPGROUP\0"`.
const MAGIC: u64 = u64::from_le_bytes(*b"PPGROUP\0");
/// The segment layout's version.
const VERSION: u32 = 1;
/// The header's page: the accumulators start after it.
const HEADER_BYTES: usize = 4096;
/// The shared accumulator space, in elements (virtual: 64 GiB, touched only where tensors are
/// placed).
pub(crate) const CAPACITY: usize = 1 << 34;

/// Who a group is: every member's hello and the segment's header carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    /// A hash of the job's name (the scheduler's address and the job seed).
    pub(crate) job: u64,
    /// The host's index.
    pub(crate) host: u32,
    /// Members (G).
    pub(crate) local_size: u32,
    /// Bytes of accumulator space.
    pub(crate) data_bytes: u64,
}

impl Header {
    fn encode(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.host.to_le_bytes());
        b[16..24].copy_from_slice(&self.job.to_le_bytes());
        b[24..28].copy_from_slice(&self.local_size.to_le_bytes());
        b[28..32].copy_from_slice(&((self.data_bytes >> 12) as u32).to_le_bytes());
        b
    }

    /// Checks `bytes` (a segment's first bytes) against `self`; the error names the field.
    pub(crate) fn check(&self, bytes: &[u8]) -> Result<(), String> {
        if bytes.len() < 32 {
            return Err(format!("a header of {} bytes (32 expected)", bytes.len()));
        }
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let want = self.encode();
        let fields: [(&str, usize, usize); 6] = [
            ("magic", 0, 8),
            ("version", 8, 4),
            ("host", 12, 4),
            ("job", 16, 8),
            ("group size", 24, 4),
            ("data size (pages)", 28, 4),
        ];
        for (name, at, len) in fields {
            if bytes[at..at + len] != want[at..at + len] {
                let (found, expected) = if len == 8 {
                    (
                        u64_at(at),
                        u64::from_le_bytes(want[at..at + 8].try_into().unwrap()),
                    )
                } else {
                    (
                        u32_at(at) as u64,
                        u32::from_le_bytes(want[at..at + 4].try_into().unwrap()) as u64,
                    )
                };
                return Err(format!(
                    "the shared memory's {name} is {found:#x}, this member expects {expected:#x}"
                ));
            }
        }
        Ok(())
    }
}

/// Encodes `notes` into one datagram.
pub(crate) fn encode_notes(notes: &[Note]) -> Vec<u8> {
    let mut b = Vec::with_capacity(notes.len() * NOTE_BYTES);
    for n in notes {
        let kind = NoteKind::ALL
            .iter()
            .position(|k| *k == n.kind)
            .expect("a kind") as u8;
        b.push(kind);
        b.extend_from_slice(&n.key.to_le_bytes());
        b.extend_from_slice(&n.round.to_le_bytes());
    }
    b
}

/// Decodes a datagram of notes; the error says what is wrong with it.
pub(crate) fn decode_notes(b: &[u8]) -> Result<Vec<Note>, String> {
    if b.is_empty() || b.len() % NOTE_BYTES != 0 {
        return Err(format!(
            "a datagram of {} bytes (a positive multiple of {NOTE_BYTES} expected)",
            b.len()
        ));
    }
    b.chunks_exact(NOTE_BYTES)
        .map(|c| {
            let kind = *NoteKind::ALL
                .get(c[0] as usize)
                .ok_or_else(|| format!("a note of unknown kind {}", c[0]))?;
            Ok(Note {
                kind,
                key: u64::from_le_bytes(c[1..9].try_into().expect("8 bytes")),
                round: u64::from_le_bytes(c[9..17].try_into().expect("8 bytes")),
            })
        })
        .collect()
}

/// The group's transport for one member (module docs). Dropping it stops its threads.
pub(crate) struct ShmLink {
    map: memmap2::MmapRaw,
    notes_socket: UnixDatagram,
    peers: Vec<SocketAddr>,
    ranks: (u32, u32, u32),
    stop: Arc<AtomicBool>,
    /// Told when a note cannot be sent, as the watching threads are told of a lost member.
    on_lost: OnLost,
}

/// Called with the group's end: [`WorkerError::MemberLost`] when a member is gone, or
/// [`WorkerError::LocalGroup`] when this member cannot send a note.
pub(crate) type OnLost = Arc<dyn Fn(WorkerError) + Send + Sync>;

/// What a member needs to join its group.
pub(crate) struct Join<'a> {
    /// Unique to the job and host on this machine (names the sockets).
    pub(crate) name: &'a str,
    /// This worker's rank.
    pub(crate) rank: u32,
    /// Members (G).
    pub(crate) local_size: u32,
    /// How long to wait for the others.
    pub(crate) timeout: Duration,
}

fn abstract_addr(name: &str) -> std::io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(name.as_bytes())
}

impl ShmLink {
    /// Joins the group (module docs); its notes go to `table`.
    pub(crate) fn join(
        j: &Join<'_>,
        table: Arc<NoteTable>,
        on_lost: OnLost,
    ) -> Result<ShmLink, WorkerError> {
        let (g, l, host) = (j.local_size, j.rank % j.local_size, j.rank / j.local_size);
        let err = |message: String| WorkerError::LocalGroup { host, message };
        let header = Header {
            job: pushpull_proto::placement::fnv1a64(j.name.as_bytes()),
            host,
            local_size: g,
            data_bytes: (CAPACITY * 4) as u64,
        };
        let notes_socket = UnixDatagram::bind_addr(
            &abstract_addr(&format!("{}/l{l}", j.name)).map_err(|e| err(e.to_string()))?,
        )
        .map_err(|e| err(format!("binding local rank {l}'s note socket: {e}")))?;
        let peers = (0..g)
            .map(|m| abstract_addr(&format!("{}/l{m}", j.name)))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| err(e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let deadline = Instant::now() + j.timeout;
        let rendezvous =
            abstract_addr(&format!("{}/rendezvous", j.name)).map_err(|e| err(e.to_string()))?;
        let (fd, streams): (OwnedFd, Vec<(u32, UnixStream)>) = if l == 0 {
            let fd = create_segment(&header).map_err(err)?;
            let listener = UnixListener::bind_addr(&rendezvous)
                .map_err(|e| err(format!("listening for the group's members: {e}")))?;
            let streams = admit(&listener, &header, &fd, deadline).map_err(err)?;
            (fd, streams)
        } else {
            let (fd, stream) = enter(&rendezvous, &header, l, deadline).map_err(err)?;
            (fd, vec![(0, stream)])
        };
        let file = std::fs::File::from(fd);
        let map = memmap2::MmapOptions::new()
            .map_raw(&file)
            .map_err(|e| err(format!("mapping the shared memory: {e}")))?;
        // SAFETY: the mapping is at least HEADER_BYTES long (checked at creation or by fstat).
        let head = unsafe { std::slice::from_raw_parts(map.as_ptr(), 32) };
        header.check(head).map_err(err)?;
        let link = ShmLink {
            map,
            notes_socket,
            peers,
            ranks: (j.rank, l, host),
            stop,
            on_lost: on_lost.clone(),
        };
        link.spawn_readers(table, on_lost, streams, g)
            .map_err(|e| err(format!("starting the group's threads: {e}")))?;
        Ok(link)
    }

    fn spawn_readers(
        &self,
        table: Arc<NoteTable>,
        on_lost: OnLost,
        streams: Vec<(u32, UnixStream)>,
        g: u32,
    ) -> std::io::Result<()> {
        let (_, l, host) = self.ranks;
        let lost = move |m: u32, reason: String| WorkerError::MemberLost {
            rank: host * g + m,
            local_rank: m,
            host,
            reason,
        };
        // Notes.
        let socket = self.notes_socket.try_clone()?;
        socket.set_read_timeout(Some(Duration::from_millis(200)))?;
        let (t, stop, gone) = (table, self.stop.clone(), on_lost.clone());
        std::thread::Builder::new()
            .name(format!("pushpull-local-{l}-notes"))
            .spawn(move || {
                let mut buf = vec![0u8; MAX_NOTES * NOTE_BYTES];
                while !stop.load(Ordering::Relaxed) {
                    let n = match socket.recv(&mut buf) {
                        Ok(n) => n,
                        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
                        Err(_) => return,
                    };
                    match decode_notes(&buf[..n]) {
                        Ok(notes) => {
                            for note in notes {
                                if note.kind == NoteKind::Lost {
                                    let m = note.key as u32;
                                    gone(lost(m, "its process ended or closed the group's socket (seen by local rank 0)".into()));
                                } else {
                                    t.deliver(note);
                                }
                            }
                        }
                        Err(why) => tracing::warn!("local rank {l}: a bad note datagram ignored: {why}"),
                    }
                }
            })?;
        // Liveness: local rank 0 watches every member, the others watch local rank 0.
        for (m, stream) in streams {
            let (stop, gone) = (self.stop.clone(), on_lost.clone());
            let tell = (l == 0).then(|| (self.notes_socket.try_clone(), self.peers.clone()));
            stream.set_read_timeout(Some(Duration::from_millis(200)))?;
            std::thread::Builder::new()
                .name(format!("pushpull-local-{l}-watch-{m}"))
                .spawn(move || {
                    let mut stream = stream;
                    let mut b = [0u8; 1];
                    while !stop.load(Ordering::Relaxed) {
                        match stream.read(&mut b) {
                            Ok(0) => break,
                            Ok(_) => continue,
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                ) =>
                            {
                                continue
                            }
                            Err(_) => break,
                        }
                    }
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    gone(lost(
                        m,
                        "its process ended or closed the group's socket".into(),
                    ));
                    if let Some((Ok(socket), peers)) = tell {
                        let note = encode_notes(&[Note {
                            kind: NoteKind::Lost,
                            key: m as u64,
                            round: 0,
                        }]);
                        for (to, addr) in peers.iter().enumerate() {
                            if to as u32 != m && to != 0 {
                                let _ = socket.send_to_addr(&note, addr);
                            }
                        }
                    }
                })?;
        }
        Ok(())
    }
}

/// The job's error for a note that local rank `l` (worker `rank` of host `host`) could not send
/// to local rank `to`: the group cannot go on, since a member would wait for it forever. A
/// socket that is gone means the member is ([`WorkerError::MemberLost`]); any other error is
/// this member's ([`WorkerError::LocalGroup`], naming it).
fn send_error(e: &std::io::Error, (rank, l, host): (u32, u32, u32), to: u32) -> WorkerError {
    let gone = matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::NotFound
            | std::io::ErrorKind::NotConnected
    );
    if gone {
        WorkerError::MemberLost {
            rank: rank - l + to,
            local_rank: to,
            host,
            reason: format!("local rank {l} cannot reach its note socket: {e}"),
        }
    } else {
        WorkerError::LocalGroup {
            host,
            message: format!(
                "local rank {l} (worker {rank}) could not send a note to local rank {to}: {e}"
            ),
        }
    }
}

impl Drop for ShmLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl GroupLink for ShmLink {
    fn send(&self, to: u32, notes: &[Note]) -> Result<(), WorkerError> {
        let (rank, l, host) = self.ranks;
        for batch in notes.chunks(MAX_NOTES) {
            let datagram = encode_notes(batch);
            let sent = loop {
                match self
                    .notes_socket
                    .send_to_addr(&datagram, &self.peers[to as usize])
                {
                    // A signal (e.g. a Python handler) interrupted a send blocked on a full
                    // queue: the member is alive.
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    other => break other,
                }
            };
            if let Err(e) = sent {
                let e = send_error(&e, (rank, l, host), to);
                // The job's error, told before this round fails with it (the round's failure
                // may end the process).
                (self.on_lost)(e.clone());
                return Err(e);
            }
        }
        Ok(())
    }

    fn capacity(&self) -> usize {
        (self.map.len() - HEADER_BYTES) / 4
    }

    unsafe fn acc(&self, offset: usize, len: usize) -> &mut [f32] {
        assert!(
            offset + len <= self.capacity(),
            "an accumulator within the shared memory"
        );
        // SAFETY: within the mapping (checked), f32-aligned (a page plus 4-byte offsets); the
        // caller holds the turn (no other member reads or writes the range meanwhile).
        unsafe {
            std::slice::from_raw_parts_mut(
                (self.map.as_mut_ptr().add(HEADER_BYTES) as *mut f32).add(offset),
                len,
            )
        }
    }
}

/// Local rank 0: a sealed memfd of the header's size, the header written.
fn create_segment(header: &Header) -> Result<OwnedFd, String> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::memfd::{memfd_create, MFdFlags};
    let fd = memfd_create(
        c"pushpull-local-group",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .map_err(|e| format!("memfd_create: {e}"))?;
    let file = std::fs::File::from(fd);
    file.set_len(HEADER_BYTES as u64 + header.data_bytes)
        .map_err(|e| format!("sizing the shared memory: {e}"))?;
    (&file)
        .write_all(&header.encode())
        .map_err(|e| format!("writing the shared memory's header: {e}"))?;
    fcntl(
        &file,
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL,
        ),
    )
    .map_err(|e| format!("sealing the shared memory: {e}"))?;
    Ok(OwnedFd::from(file))
}

/// A member's hello: job, host, local rank, group size.
fn hello(header: &Header, l: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0..8].copy_from_slice(&header.job.to_le_bytes());
    b[8..12].copy_from_slice(&header.host.to_le_bytes());
    b[12..16].copy_from_slice(&l.to_le_bytes());
    b[16..20].copy_from_slice(&header.local_size.to_le_bytes());
    b
}

/// Local rank 0: admits the G − 1 others, each with a hello that matches; hands them the fd.
fn admit(
    listener: &UnixListener,
    header: &Header,
    fd: &OwnedFd,
    deadline: Instant,
) -> Result<Vec<(u32, UnixStream)>, String> {
    let g = header.local_size;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut admitted: Vec<(u32, UnixStream)> = Vec::new();
    while admitted.len() + 1 < g as usize {
        let (mut stream, _) = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    let mut missing: Vec<u32> = (1..g)
                        .filter(|m| !admitted.iter().any(|a| a.0 == *m))
                        .collect();
                    missing.sort_unstable();
                    return Err(format!(
                        "local ranks {missing:?} did not join within the connect timeout"
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => return Err(format!("accepting a member: {e}")),
        };
        stream.set_nonblocking(false).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        let mut b = [0u8; 20];
        if let Err(e) = stream.read_exact(&mut b) {
            tracing::warn!("local group: a connection without a hello ignored: {e}");
            continue;
        }
        let m = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
        let refusal = if b != hello(header, m) {
            Some("its hello names another job, host or group size".to_string())
        } else if m == 0 || m >= g {
            Some(format!("local rank {m} is not in 1..{g}"))
        } else if admitted.iter().any(|a| a.0 == m) {
            Some(format!("local rank {m} joined twice"))
        } else {
            None
        };
        if let Some(why) = refusal {
            let _ = stream.write_all(&[1]);
            let _ = stream.write_all(why.as_bytes());
            tracing::warn!("local group: refused a member: {why}");
            continue;
        }
        let iov = [IoSlice::new(&[0u8])];
        let fds = [fd.as_raw_fd()];
        sendmsg::<()>(
            stream.as_raw_fd(),
            &iov,
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .map_err(|e| format!("handing local rank {m} the shared memory: {e}"))?;
        admitted.push((m, stream));
    }
    Ok(admitted)
}

/// A member: connects to local rank 0 (retrying), says hello, receives the fd.
fn enter(
    rendezvous: &SocketAddr,
    header: &Header,
    l: u32,
    deadline: Instant,
) -> Result<(OwnedFd, UnixStream), String> {
    let mut stream = loop {
        match UnixStream::connect_addr(rendezvous) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => {
                return Err(format!(
                    "local rank 0 did not answer within the connect timeout: {e}"
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    stream
        .write_all(&hello(header, l))
        .map_err(|e| format!("saying hello: {e}"))?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_secs(1));
    stream
        .set_read_timeout(Some(left))
        .map_err(|e| e.to_string())?;
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| format!("waiting for local rank 0's answer: {e}"))?;
    let mut fd = None;
    for c in msg.cmsgs().map_err(|e| e.to_string())? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for raw in fds {
                // SAFETY: SCM_RIGHTS gave this process a new descriptor that nothing else owns.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                fd.get_or_insert(owned);
            }
        }
    }
    let bytes = msg.bytes;
    match (bytes, byte[0], fd) {
        (1, 0, Some(fd)) => {
            let len = std::fs::File::from(fd.try_clone().map_err(|e| e.to_string())?)
                .metadata()
                .map_err(|e| e.to_string())?
                .len();
            let want = HEADER_BYTES as u64 + header.data_bytes;
            if len != want {
                return Err(format!(
                    "the shared memory has {len} bytes, this member expects {want}"
                ));
            }
            Ok((fd, stream))
        }
        (1, 1, _) => {
            let mut why = String::new();
            let _ = stream.read_to_string(&mut why);
            Err(format!("local rank 0 refused local rank {l}: {why}"))
        }
        _ => Err("local rank 0 answered without the shared memory".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_round_trip_and_bad_datagrams_are_named() {
        let notes: Vec<Note> = NoteKind::ALL
            .iter()
            .enumerate()
            .map(|(i, &kind)| Note {
                kind,
                key: u64::MAX - i as u64,
                round: i as u64 * 7,
            })
            .collect();
        assert_eq!(decode_notes(&encode_notes(&notes)).unwrap(), notes);
        assert!(decode_notes(&[]).unwrap_err().contains("0 bytes"));
        assert!(decode_notes(&[0; 18]).unwrap_err().contains("18 bytes"));
        let mut bad = encode_notes(&notes[..1]);
        bad[0] = 200;
        assert!(decode_notes(&bad).unwrap_err().contains("unknown kind 200"));
        // Any bytes: an error or notes, never a panic.
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..200usize {
            let b: Vec<u8> = (0..len)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    s as u8
                })
                .collect();
            let _ = decode_notes(&b);
        }
    }

    /// A note sent to a member whose process is gone (its socket closed) fails naming that
    /// member, and the group's loss callback hears of it before the send returns.
    #[test]
    fn a_note_to_a_member_that_is_gone_names_it() {
        let name = format!("pushpull-test/{}/gone", std::process::id());
        let heard: Arc<std::sync::Mutex<Vec<WorkerError>>> = Arc::default();
        let member = |rank: u32| {
            let (name, heard) = (name.clone(), heard.clone());
            std::thread::spawn(move || {
                let join = Join {
                    name: &name,
                    rank,
                    local_size: 2,
                    timeout: Duration::from_secs(10),
                };
                let on_lost: OnLost = Arc::new(move |e| heard.lock().unwrap().push(e));
                ShmLink::join(&join, Arc::new(NoteTable::default()), on_lost).unwrap()
            })
        };
        let (zero, one) = (member(2), member(3));
        let (zero, one) = (zero.join().unwrap(), one.join().unwrap());
        let note = Note {
            kind: NoteKind::Added,
            key: 1,
            round: 0,
        };
        zero.send(1, &[note]).unwrap();
        drop(one);
        // Its note thread holds the socket until it sees the stop (every 200 ms).
        let until = Instant::now() + Duration::from_secs(10);
        let e = loop {
            match zero.send(1, &[note]) {
                Err(e) => break e,
                Ok(()) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
                Ok(()) => panic!("notes still reach a member whose link was dropped 10 s ago"),
            }
        };
        let text = e.to_string();
        assert!(
            matches!(
                e,
                WorkerError::MemberLost {
                    rank: 3,
                    local_rank: 1,
                    host: 1,
                    ..
                }
            ),
            "{text}"
        );
        assert!(text.contains("cannot reach its note socket"), "{text}");
        let heard = heard.lock().unwrap();
        assert!(heard.contains(&e), "the callback heard {heard:?}");
    }

    /// A vanished socket names the member; any other send error names this member.
    #[test]
    fn a_note_that_cannot_be_sent_names_who_is_at_fault() {
        use std::io::{Error, ErrorKind};
        let me = (5, 1, 1); // worker 5, local rank 1 of host 1 (groups of 4)
        for kind in [
            ErrorKind::ConnectionRefused,
            ErrorKind::NotFound,
            ErrorKind::NotConnected,
        ] {
            let e = send_error(&Error::from(kind), me, 3);
            assert!(
                matches!(
                    e,
                    WorkerError::MemberLost {
                        rank: 7,
                        local_rank: 3,
                        host: 1,
                        ..
                    }
                ),
                "{kind:?}: {e}"
            );
        }
        for kind in [
            ErrorKind::OutOfMemory,
            ErrorKind::Other,
            ErrorKind::InvalidInput,
        ] {
            let e = send_error(&Error::from(kind), me, 3);
            let text = e.to_string();
            assert!(
                matches!(e, WorkerError::LocalGroup { host: 1, .. }),
                "{kind:?}: {text}"
            );
            assert!(
                text.contains("local rank 1 (worker 5)") && text.contains("local rank 3"),
                "{text}"
            );
        }
    }

    #[test]
    fn a_header_of_another_group_is_refused_naming_the_field() {
        let h = Header {
            job: 7,
            host: 1,
            local_size: 4,
            data_bytes: 1 << 20,
        };
        h.check(&h.encode()).unwrap();
        for (other, field) in [
            (Header { job: 8, ..h }, "job"),
            (Header { host: 2, ..h }, "host"),
            (Header { local_size: 2, ..h }, "group size"),
            (
                Header {
                    data_bytes: 1 << 21,
                    ..h
                },
                "data size",
            ),
        ] {
            let e = h.check(&other.encode()).unwrap_err();
            assert!(e.contains(field), "{e}");
        }
        let mut b = h.encode();
        b[0] ^= 1;
        assert!(h.check(&b).unwrap_err().contains("magic"));
        assert!(h.check(&b[..5]).unwrap_err().contains("5 bytes"));
    }
}
