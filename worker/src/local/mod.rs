//! Local groups (`cluster.local_size` G > 1; ARCHITECTURE.md, "Two levels"): the workers of
//! one host sum their chunks in shared memory, in local-rank order, and each chunk's owner
//! pushes the host's sum once and shares the result.
//!
//! | item | what it is |
//! |---|---|
//! | [`Local`] | this member's view of its group: its local rank, the notes table, where each tensor's accumulator lives in the shared memory |
//! | [`GroupLink`] | what the rounds need of the group's transport: notes to a member, the shared accumulators (`pushpull_group` on a host; a test double in the tests) |
//! | [`notes`] | the notes members send each other and the table that hands them to waiting chunks (pure) |
//! | [`chunk_round`] | one chunk's round in a group: the turn, the add, the owner's push, the copy |
//!
//! The order of one chunk's round `r` on host `h` (key `k`, owner `o = chunk_owner(k, G)`):
//! member 0 waits until every other member copied round `r − 1`'s result ([`NoteKind::Copied`]),
//! then writes its part; member `l > 0` waits for [`NoteKind::Added`] from `l − 1`, adds its
//! part and tells `l + 1` (the last member tells the owner [`NoteKind::Summed`]); the owner
//! pushes the host sum (as host `h`, with the chain of rank `h` of a flat job of
//! `num_workers / G` workers), decodes the result into the accumulator and tells everyone
//! ([`NoteKind::Result`], [`NoteKind::NonFinite`] or [`NoteKind::Aborted`]); every member
//! copies the result out and tells member 0. One accumulator per tensor, written by one member
//! at a time: the notes order every access.
//!
//! A broadcast takes the same path: the root writes its values and every other member adds
//! `-0.0`, which leaves every value, `-0.0` and NaN included, as it is.

mod link;
pub(crate) mod notes;
mod round;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pushpull_kernels::IntraCodec;

use crate::error::WorkerError;
use crate::tensor::TensorInner;
pub(crate) use notes::{Channel, Note, NoteKind, NoteTable, Waiter};
pub(crate) use round::chunk_round;

/// What a member's rounds need of its group's transport.
pub(crate) trait GroupLink: Send + Sync + 'static {
    /// Sends `notes` to local rank `to`; an error names the member that cannot be reached.
    fn send(&self, to: u32, notes: &[Note]) -> Result<(), WorkerError>;

    /// Elements of shared accumulator space.
    fn capacity(&self) -> usize;

    /// The shared elements `offset .. offset + len` (within [`GroupLink::capacity`]).
    ///
    /// # Safety
    /// The caller must hold the turn for this range (module docs): no other member touches it
    /// until the caller's next note, and the slice is dropped before that note is sent.
    #[allow(clippy::mut_from_ref)]
    unsafe fn acc(&self, offset: usize, len: usize) -> &mut [f32];
}

/// Where a tensor's accumulator lives, and its intra-host codec.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    /// Offset in elements in the shared space.
    pub(crate) offset: usize,
    /// The tensor's `intra_compressor`.
    pub(crate) intra: IntraCodec,
}

#[derive(Default)]
struct Places {
    /// First chunk's key → place.
    of: HashMap<u64, Place>,
    /// Member 0: the next free element.
    next: usize,
}

/// This member's view of its local group (module docs).
pub(crate) struct Local {
    link: Arc<dyn GroupLink>,
    /// The notes that arrived for this member.
    pub(crate) notes: Arc<NoteTable>,
    /// This member's local rank.
    pub(crate) local_rank: u32,
    /// Members of the group (G).
    pub(crate) local_size: u32,
    /// Whether chunks go through the servers (`ClusterConfig::uses_servers`).
    pub(crate) uses_servers: bool,
    places: Mutex<Places>,
}

/// Accumulators start on 16-element (64-byte) boundaries.
const ALIGN: usize = 16;

impl Local {
    /// A member of a group of `local_size` on `link`, its notes delivered to `notes` (by
    /// whoever reads the transport).
    pub(crate) fn new(
        link: Arc<dyn GroupLink>,
        notes: Arc<NoteTable>,
        local_rank: u32,
        local_size: u32,
        uses_servers: bool,
    ) -> Local {
        Local {
            link,
            notes,
            local_rank,
            local_size,
            uses_servers,
            places: Mutex::new(Places::default()),
        }
    }

    fn places(&self) -> std::sync::MutexGuard<'_, Places> {
        self.places.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called on every member once `tensor` is declared: member 0 gives it an accumulator and
    /// tells the others where (the others learn it from that note before their first round).
    ///
    /// # Errors
    /// The shared space is full (naming the tensor and the sizes), or a member cannot be
    /// reached.
    pub(crate) fn place(&self, tensor: &TensorInner) -> Result<(), WorkerError> {
        let Some(first) = tensor.placement.chunks.first() else {
            return Ok(());
        };
        if self.local_rank != 0 {
            return Ok(());
        }
        let intra = intra_of(tensor)?;
        let len = tensor.placement.len as usize;
        let offset = {
            let mut places = self.places();
            if let Some(p) = places.of.get(&first.key) {
                p.offset
            } else {
                let offset = places.next;
                let end = offset.saturating_add(len);
                if end > self.link.capacity() {
                    return Err(WorkerError::Internal(format!(
                        "tensor {:?} ({len} elements) does not fit in the local group's shared \
                         memory: {} of {} elements are in use",
                        tensor.placement.name,
                        offset,
                        self.link.capacity()
                    )));
                }
                places.next = end.div_ceil(ALIGN) * ALIGN;
                places.of.insert(first.key, Place { offset, intra });
                offset
            }
        };
        let note = Note {
            kind: NoteKind::Placed,
            key: first.key,
            round: offset as u64,
        };
        for to in 1..self.local_size {
            self.link.send(to, &[note])?;
        }
        Ok(())
    }

    /// Where `tensor`'s accumulator lives: known at once on member 0, from member 0's note on
    /// the others (awaited once per tensor).
    pub(crate) async fn place_of(&self, tensor: &TensorInner) -> Result<Place, WorkerError> {
        let key = tensor.placement.chunks[0].key;
        if let Some(p) = self.places().of.get(&key) {
            return Ok(*p);
        }
        let note = self.wait(Channel::Placed, key, 0, 1).await?;
        let place = Place {
            offset: note.round as usize,
            intra: intra_of(tensor)?,
        };
        if place.offset.saturating_add(tensor.placement.len as usize) > self.link.capacity() {
            return Err(WorkerError::Internal(format!(
                "local rank 0 placed tensor {:?} at element {} of a shared memory of {}",
                tensor.placement.name,
                place.offset,
                self.link.capacity()
            )));
        }
        self.places().of.insert(key, place);
        Ok(place)
    }

    /// Waits for `need` notes on `channel` for `(key, round)`; the last one.
    pub(crate) async fn wait(
        &self,
        channel: Channel,
        key: u64,
        round: u64,
        need: u32,
    ) -> Result<Note, WorkerError> {
        match self.notes.register(channel, key, round, need)? {
            Waiter::Ready(note) => Ok(note),
            Waiter::Pending(rx) => rx.await.unwrap_or_else(|_| {
                Err(WorkerError::Internal(format!(
                    "the local notes table dropped {channel:?} of key {key:#018x} round {round}"
                )))
            }),
        }
    }

    /// Sends one note to local rank `to`.
    pub(crate) fn send(
        &self,
        to: u32,
        kind: NoteKind,
        key: u64,
        round: u64,
    ) -> Result<(), WorkerError> {
        self.link.send(to, &[Note { kind, key, round }])
    }

    /// The shared accumulator of chunk `range` (elements of the tensor) of a tensor placed at
    /// `place`.
    ///
    /// # Safety
    /// As [`GroupLink::acc`]: the caller holds the turn for the chunk.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn acc(&self, place: Place, range: std::ops::Range<usize>) -> &mut [f32] {
        // SAFETY: the caller's obligation, passed on.
        unsafe { self.link.acc(place.offset + range.start, range.len()) }
    }
}

/// Joins this worker's local group (`cluster.local_size` > 1): the members of its host, found
/// by a name made of the scheduler's address (`scheduler`), the job seed and the host's index.
/// Blocks until every member is in (at most `cluster.connect_timeout_ms`): call it off the
/// runtime's threads. `on_lost` hears of a member lost (before this member's chunks waiting
/// for notes fail with it).
pub(crate) fn join(
    config: &pushpull_proto::Config,
    scheduler: &str,
    job_seed: u64,
    rank: u32,
    on_lost: Arc<dyn Fn(WorkerError) + Send + Sync>,
) -> Result<Local, WorkerError> {
    let g = config.cluster.local_size;
    let name = format!("pushpull/{scheduler}/{job_seed:016x}/h{}", rank / g);
    let notes = Arc::new(NoteTable::default());
    let join = link::Join {
        name: &name,
        rank,
        local_size: g,
        timeout: config.connect_timeout(),
    };
    let lost: link::OnLost = {
        let notes = notes.clone();
        Arc::new(move |e: WorkerError| {
            // The job's error first (its connections close naming the member), then the
            // waiting chunks: a round failing with the loss may end the process before a
            // later close is sent (seen in CI: the scheduler then named this worker).
            on_lost(e.clone());
            notes.poison(e)
        })
    };
    let link = link::ShmLink::join(&join, notes.clone(), lost)?;
    tracing::debug!("worker {rank}: joined its local group {name}");
    Ok(Local::new(
        Arc::new(link),
        notes,
        rank % g,
        g,
        config.cluster.uses_servers(),
    ))
}

/// A tensor's intra-host codec, from its agreed map.
fn intra_of(tensor: &TensorInner) -> Result<IntraCodec, WorkerError> {
    pushpull_kernels::parse_params(&tensor.placement.params)
        .map(|spec| spec.intra)
        .map_err(|e| WorkerError::Internal(format!("tensor {:?}: {e}", tensor.placement.name)))
}
