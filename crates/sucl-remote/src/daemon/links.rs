//! What a session knows of its peer mesh: its place in it, the outgoing links, transfers in
//! flight and the events peers wait for (the data; `mesh` moves it).

use super::sync::lock;
use super::waiters::Waiters;
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
    /// Local events that members wait for, or may.
    pub(super) waiters: Waiters,
    /// Events of peers that completed, or (false) never will, for the wait that runs.
    pub(super) remote_done: HashMap<(u32, u64), bool>,
    /// The event of a peer the running wait is for, and that wait's number (see
    /// [`RemoteState::waiting_for`]).
    pub(super) remote_waiting: Option<(u32, u64)>,
    /// Waits for peers' events begun.
    pub(super) remote_waits: u64,
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
    /// Peer-memory offers received for transfers whose receiving command has not taken them.
    pub(super) mem_offers: HashMap<(u32, u64), MemOffer>,
    /// Answers to this session's peer-memory offers, by (member, transfer).
    pub(super) mem_answers: HashMap<(u32, u64), MemAnswer>,
    /// How incoming transfers offered through peer memory were answered (to answer an offer
    /// sent again after a cut alike), oldest first (bounded).
    pub(super) mem_finished: HashMap<(u32, u64), MemAnswer>,
    pub(super) mem_finished_order: VecDeque<(u32, u64)>,
    /// Members that refused peer memory for good (why): migrations to them go over the link.
    pub(super) mem_refused_by: HashMap<u32, String>,
    /// Peers' buffers freed (member, memory handle): their mappings here are closed by the
    /// next command that migrates (not by the link's reader, which must not wait for one).
    pub(super) mem_closing: Vec<(u32, [u8; 64])>,
    /// Peer-memory offers this session made whose answers no command has joined yet, oldest
    /// first.
    pub(super) offered: Vec<Offered>,
    /// Offers to members lost before they answered: a member may still copy from their
    /// buffers, which are therefore freed only when the session ends.
    pub(super) orphaned: Vec<Offered>,
    /// Offers taken out of `offered` by a join (or the session's settling) that waits for
    /// their answers now.
    pub(super) joining: HashSet<(u32, u64)>,
    /// Destination: incoming offers taken out of `mem_offers` by their receiving command and
    /// not yet answered (an offer sent again meanwhile is answered by that command).
    pub(super) mem_taking: HashSet<(u32, u64)>,
    /// Destination: members' memory handles whose buffers were freed ([`crate::wire::Frame::PeerMemClose`]):
    /// an offer carrying one is refused, never copied from (bounded by [`FINISHED_KEPT`]).
    pub(super) mem_dead: HashSet<(u32, [u8; 64])>,
}

/// What a destination does with a peer-memory offer that arrived.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum OfferArrival {
    /// Answered before (the answer was lost with a link): send this answer again.
    AnswerAgain(MemAnswer),
    /// Its receiving command is taking it now and will answer.
    BeingTaken,
    /// Kept for its receiving command.
    Kept,
    /// More than [`MEM_PENDING_KEPT`] offers pending: dropped.
    Dropped,
}

/// A peer-memory offer made and not yet joined.
pub(super) struct Offered {
    pub(super) peer: u32,
    pub(super) transfer: u64,
    /// The source buffer's device (its stream waits for the copy).
    pub(super) device: u32,
    pub(super) buffer: u64,
    pub(super) range: std::ops::Range<usize>,
    /// The encoded offer (sent again after a link was made again).
    pub(super) frame: Vec<u8>,
}

/// A peer-memory offer as it arrived ([`crate::wire::Frame::PeerMemOffer`]).
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // without CUDA every offer is refused unread
pub(super) struct MemOffer {
    pub(super) node: u64,
    pub(super) pid: u32,
    pub(super) handle: [u8; 64],
    pub(super) offset: u64,
    pub(super) len: u64,
    pub(super) event: [u8; 64],
}

/// How a destination answered a peer-memory offer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum MemAnswer {
    /// Copied; its completion event's handle.
    Copied([u8; 64]),
    /// Refused (for good or for this transfer alone), and why.
    Refused { permanent: bool, reason: String },
}

impl MemAnswer {
    /// The frame that says it for `transfer`.
    pub(super) fn frame(&self, transfer: u64) -> crate::wire::Frame {
        match self {
            MemAnswer::Copied(event) => crate::wire::Frame::PeerMemDone { transfer, event: *event },
            MemAnswer::Refused { permanent, reason } => {
                crate::wire::Frame::PeerMemRefused { transfer, permanent: *permanent, reason: reason.clone() }
            }
        }
    }
}

/// The refusal of an offer whose source buffer was freed.
pub(super) fn freed_refusal() -> MemAnswer {
    MemAnswer::Refused { permanent: false, reason: "the source freed the buffer (its memory handle was closed)".into() }
}

/// Peer-memory offers and answers a session keeps at most (beyond, a member is misbehaving:
/// it sends offers nobody migrates, and more are dropped).
pub(super) const MEM_PENDING_KEPT: usize = 4096;

/// This machine's identity in peer-memory offers: a hash of the kernel's boot id (one per boot
/// of one machine; daemons in containers or network namespaces of one host share it), else of
/// the host name. Not a secret, and not trusted alone: opening the handle decides.
pub(super) fn this_node() -> u64 {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    let id = read("/proc/sys/kernel/random/boot_id");
    let id = if id.is_empty() { read("/proc/sys/kernel/hostname") } else { id };
    id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

impl RemoteState {
    /// A wait for event `event` of `peer` begins: returns its number, for its subscription.
    pub(super) fn waiting_for(&mut self, peer: u32, event: u64) -> u64 {
        self.remote_done.clear(); // nothing is waited for between waits
        self.remote_waiting = Some((peer, event));
        self.remote_waits += 1;
        self.remote_waits
    }

    /// The wait for event `event` of `peer` ended: its notice is taken.
    pub(super) fn waited_for(&mut self, peer: u32, event: u64) {
        self.remote_done.remove(&(peer, event));
        self.remote_waiting = None;
    }

    /// A member's notice came: kept only for the wait that runs for it.
    pub(super) fn notice(&mut self, peer: u32, event: u64, ok: bool) {
        if self.remote_waiting == Some((peer, event)) {
            self.remote_done.insert((peer, event), ok);
        }
    }

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
    /// Whether this session waits for the answer to its offer `key` (an answer to anything
    /// else is a duplicate, or from a confused member: dropped).
    pub(super) fn offer_live(&self, key: (u32, u64)) -> bool {
        self.joining.contains(&key) || self.offered.iter().any(|o| (o.peer, o.transfer) == key)
    }

    /// Keeps the answer to offer `key` if it is live; `false` when dropped.
    pub(super) fn mem_answered(&mut self, key: (u32, u64), answer: MemAnswer) -> bool {
        let live = self.offer_live(key);
        if live {
            self.mem_answers.insert(key, answer);
        }
        live
    }

    /// Destination: what to do with offer `offer` of incoming transfer `key`.
    pub(super) fn mem_offered(&mut self, key: (u32, u64), offer: MemOffer) -> OfferArrival {
        if self.mem_dead.contains(&(key.0, offer.handle)) && !self.mem_finished.contains_key(&key) {
            self.mem_finish(key, freed_refusal());
        }
        if let Some(a) = self.mem_finished.get(&key) {
            return OfferArrival::AnswerAgain(a.clone());
        }
        if self.mem_taking.contains(&key) {
            return OfferArrival::BeingTaken;
        }
        if self.mem_offers.len() >= MEM_PENDING_KEPT && !self.mem_offers.contains_key(&key) {
            return OfferArrival::Dropped;
        }
        self.mem_offers.insert(key, offer);
        OfferArrival::Kept
    }

    /// Destination: member `from` freed the buffer of memory handle `handle`: its mapping
    /// here is closed by the next command that migrates, and the offers of it not yet taken
    /// are refused (this transfer only: the bytes come over the link). Returns those refused,
    /// each with its refusal to send.
    pub(super) fn mem_closed(&mut self, from: u32, handle: [u8; 64]) -> Vec<(u64, MemAnswer)> {
        if self.mem_dead.len() < FINISHED_KEPT {
            self.mem_dead.insert((from, handle));
        }
        if self.mem_closing.len() < MEM_PENDING_KEPT {
            self.mem_closing.push((from, handle));
        }
        let stale: Vec<(u32, u64)> = self.mem_offers.iter().filter(|(k, o)| k.0 == from && o.handle == handle).map(|(k, _)| *k).collect();
        stale
            .into_iter()
            .map(|key| {
                self.mem_offers.remove(&key);
                self.mem_finish(key, freed_refusal());
                (key.1, freed_refusal())
            })
            .collect()
    }

    /// Destination: whether member `from`'s handle `handle` was closed (its buffer freed).
    pub(super) fn mem_is_dead(&self, from: u32, handle: &[u8; 64]) -> bool {
        self.mem_dead.contains(&(from, *handle))
    }

    /// Destination: the receiving command takes offer `key` (`None`: none arrived).
    pub(super) fn mem_take(&mut self, key: (u32, u64)) -> Option<MemOffer> {
        let offer = self.mem_offers.remove(&key)?;
        self.mem_taking.insert(key);
        Some(offer)
    }

    /// Remembers how the peer-memory offer of incoming transfer `key` was answered.
    pub(super) fn mem_finish(&mut self, key: (u32, u64), answer: MemAnswer) {
        self.mem_taking.remove(&key);
        remember(&mut self.mem_finished, &mut self.mem_finished_order, key, answer);
    }

    pub(super) fn finish(&mut self, key: (u32, u64), total: u64) {
        remember(&mut self.finished, &mut self.finished_order, key, total);
    }
}

/// Inserts `key` into `map`, forgetting the oldest entry (by `order`) beyond
/// [`FINISHED_KEPT`]; a key already there keeps its place and first value.
fn remember<V>(map: &mut HashMap<(u32, u64), V>, order: &mut VecDeque<(u32, u64)>, key: (u32, u64), value: V) {
    if let std::collections::hash_map::Entry::Vacant(v) = map.entry(key) {
        v.insert(value);
        order.push_back(key);
        if order.len() > FINISHED_KEPT {
            let old = order.pop_front().expect("non-empty");
            map.remove(&old);
        }
    }
}
