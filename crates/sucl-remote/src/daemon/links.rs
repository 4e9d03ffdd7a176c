//! What a session knows of its peer mesh: its place in it, the outgoing links, transfers in
//! flight and the events peers wait for (the data; `mesh` moves it).

use super::sync::lock;
use crate::auth::MeshKey;
use crate::transport::Link;
use crate::wire::PeerSpec;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex};

/// This session's place in a peer mesh.
pub(super) struct MeshInfo {
    pub(super) id: [u8; 16],
    pub(super) key: MeshKey,
    pub(super) index: u32,
    pub(super) peers: HashMap<u32, PeerSpec>,
}

/// A transfer arriving from a peer: pieces staged as they come (in pooled chunks), taken by
/// the receiving command as soon as it runs, so that its copy into the buffer overlaps the
/// link's next reads.
pub(super) struct Incoming {
    pub(super) total: u64,
    /// Bytes staged so far (pieces received in order; a re-sent prefix is skipped).
    pub(super) received: u64,
    /// Staged pieces not yet taken: (chunk, bytes used in it).
    pub(super) chunks: VecDeque<(Vec<u8>, usize)>,
}

/// The bytes of one staging chunk (and the largest piece a migration sends).
pub(super) const STAGE_CHUNK: usize = 256 << 10;
/// Staging chunks a session keeps for reuse.
pub(super) const STAGE_POOL: usize = 32;
/// Completed incoming transfers a session remembers (to acknowledge a re-sent one again).
pub(super) const FINISHED_KEPT: usize = 1 << 16;

/// One outgoing link to a mesh member. Its thread (re)connects it and writes the small frames
/// queued here (notices, subscriptions, acknowledgements), so that no thread that reads (a
/// peer link, a client connection) ever blocks on a peer's socket; a migrating command writes
/// its data straight from the buffer instead, holding `write` for each whole frame.
pub(super) struct PeerOut {
    pub(super) st: Mutex<OutState>,
    pub(super) cv: Condvar,
    pub(super) write: Mutex<()>,
}

#[derive(Default)]
pub(super) struct OutState {
    /// The connection in use (`None` while it is being made or re-made).
    pub(super) link: Option<Link>,
    /// Counts connections made; a break reported for an older one changes nothing.
    pub(super) generation: u64,
    pub(super) frames: VecDeque<Vec<u8>>,
    pub(super) max_frame: u32,
    /// Why the member cannot be reached any more (the link will not be re-made).
    pub(super) error: Option<String>,
    pub(super) closed: bool,
}

impl PeerOut {
    /// Connection `generation` broke: drop it (its thread makes a new one).
    pub(super) fn broken(&self, generation: u64) {
        let mut st = lock(&self.st);
        if st.generation == generation {
            if let Some(l) = st.link.take() {
                l.shutdown();
            }
        }
        drop(st);
        self.cv.notify_all();
    }
}

/// What a session knows of its mesh: links, local events peers wait for, remote events and
/// transfers it waits for, peers it lost.
#[derive(Default)]
pub(super) struct RemoteState {
    pub(super) mesh: Option<MeshInfo>,
    pub(super) outs: HashMap<u32, Arc<PeerOut>>,
    pub(super) ins: Vec<Link>,
    /// Local events that completed (kept for peers that subscribe later).
    pub(super) done: HashSet<u64>,
    /// Peers waiting for local events.
    pub(super) subscribers: HashMap<u64, Vec<u32>>,
    /// Events of peers that completed, or (false) never will.
    pub(super) remote_done: HashMap<(u32, u64), bool>,
    pub(super) inbox: HashMap<(u32, u64), Incoming>,
    /// Bytes staged in `inbox`.
    pub(super) staged: u64,
    /// Incoming transfers taken by their command, with their sizes, oldest first (bounded).
    pub(super) finished: HashMap<(u32, u64), u64>,
    pub(super) finished_order: VecDeque<(u32, u64)>,
    /// Outgoing transfers: the bytes the destination said it holds.
    pub(super) progress: HashMap<(u32, u64), u64>,
    /// Members that have opened a link to this session (a later one is a re-made link).
    pub(super) linked_from: HashSet<u32>,
    /// Per member: bumped whenever a link with it breaks or a new one from it opens (frames
    /// in flight may have been lost: waiters re-send what they are waiting on).
    pub(super) epoch: HashMap<u32, u64>,
    /// Staging chunks for reuse.
    pub(super) pool: Vec<Vec<u8>>,
    pub(super) lost: HashMap<u32, String>,
}

impl RemoteState {
    pub(super) fn epoch(&self, peer: u32) -> u64 {
        self.epoch.get(&peer).copied().unwrap_or(0)
    }
    pub(super) fn chunk(&mut self, len: usize) -> Vec<u8> {
        match self.pool.pop() {
            Some(c) if c.len() >= len => c,
            _ => vec![0u8; len.max(STAGE_CHUNK)],
        }
    }
    pub(super) fn recycle(&mut self, c: Vec<u8>) {
        if self.pool.len() < STAGE_POOL && c.len() == STAGE_CHUNK {
            self.pool.push(c);
        }
    }
    pub(super) fn finish(&mut self, key: (u32, u64), total: u64) {
        if self.finished.insert(key, total).is_none() {
            self.finished_order.push_back(key);
            if self.finished_order.len() > FINISHED_KEPT {
                let old = self.finished_order.pop_front().expect("non-empty");
                self.finished.remove(&old);
            }
        }
    }
}
