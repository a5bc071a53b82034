//! [`KeyInfo`]: who a key is (tensor, chunk, key, length, the job's workers and hosts) and who
//! pushes its rounds: each host's owner of the key.

use std::fmt;

use pushpull_proto::placement::chunk_owner;

/// Who a key is: used in every message it produces, and who pushes its rounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    /// The tensor's name.
    pub tensor: String,
    /// The chunk's index within the tensor.
    pub chunk: u32,
    /// The key.
    pub key: u64,
    /// Elements in the chunk.
    pub len: usize,
    /// Workers in the job (ranks `0..num_workers`).
    pub num_workers: u32,
    /// Workers per host (`cluster.local_size`, G; 1 without local groups; divides
    /// `num_workers`): host `h` runs ranks `h·G .. h·G + G − 1`.
    pub local_size: u32,
    /// The tensor's priority: results of keys with a higher one are sent first (see
    /// `TensorPlacement::priority`).
    pub priority: i32,
}

impl KeyInfo {
    /// Workers per host, at least 1.
    pub(crate) fn group(&self) -> u32 {
        self.local_size.max(1)
    }

    /// The hosts that push this key's rounds, `num_workers / local_size` (H): a round's
    /// participants are hosts `0..H`.
    pub fn num_hosts(&self) -> u32 {
        self.num_workers / self.group()
    }

    /// The local rank that owns this key on every host:
    /// `pushpull_proto::placement::chunk_owner(key, local_size)`.
    pub fn owner_local_rank(&self) -> u32 {
        chunk_owner(self.key, self.group())
    }

    /// The rank that pushes this key for host `host`: `host·G + chunk_owner(key, G)` (with
    /// G = 1, rank `host` itself).
    pub fn owner_rank(&self, host: u32) -> u32 {
        host * self.group() + self.owner_local_rank()
    }

    /// The owner ranks of hosts `0..H`, ascending: who receives the key's results and round
    /// aborts (every rank `0..num_workers` when G = 1).
    pub fn owner_ranks(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.num_hosts()).map(|h| self.owner_rank(h))
    }

    /// The host whose push of this key `rank` makes, or `None` when `rank` owns no host's
    /// push (another member of its host owns the key, or it is out of range).
    pub fn owner_host(&self, rank: u32) -> Option<u32> {
        let host = rank / self.group();
        (host < self.num_hosts() && self.owner_rank(host) == rank).then_some(host)
    }
}

impl fmt::Display for KeyInfo {
    /// `tensor "fc1.weight" chunk 3 (key 0x00000000000004d2)`: keys in hex, as the scheduler
    /// and the workers print them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tensor {:?} chunk {} (key {:#018x})",
            self.tensor, self.chunk, self.key
        )
    }
}
