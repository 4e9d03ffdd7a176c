//! The point-to-point engine: frames, tag matching and non-blocking progress over any byte channel.
//!
//! Each peer is one ordered byte stream (a TCP socket, a shared-memory ring). Sends are queued
//! per peer and written as header + payload without copies; incoming frames are matched in
//! arrival order against posted receives with the same tag (MPI's non-overtaking rule) and land
//! directly in the user's buffer. Frames nobody posted for yet are kept as unexpected messages,
//! growing only as their bytes actually arrive. Any failure aborts the whole communicator.

use crate::backend::{CollDesc, ReqId};
use crate::error::{AbortState, Error, Result};
use crate::wait::{Backoff, Phase, Waiter};
use crate::wire::{Header, Kind, HEADER_LEN};
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

/// Implements the point-to-point methods of [`crate::Backend`] (`post_send`, `post_recv`, `test`,
/// `wait`, `cancel`) by delegating to the [`Engine`] in field `$field`.
#[macro_export]
macro_rules! delegate_p2p_to_engine {
    ($field:ident) => {
        unsafe fn post_send(&mut self, peer: usize, tag: u64, ptr: *const u8, len: usize) -> $crate::Result<$crate::backend::ReqId> {
            self.$field.post_send(peer, tag, [0, 0], ptr, len)
        }
        unsafe fn post_recv(&mut self, peer: usize, tag: u64, ptr: *mut u8, cap: usize) -> $crate::Result<$crate::backend::ReqId> {
            self.$field.post_recv(peer, tag, None, ptr, cap)
        }
        fn test(&mut self, req: $crate::backend::ReqId) -> $crate::Result<Option<usize>> {
            self.$field.test(req)
        }
        fn wait(&mut self, req: $crate::backend::ReqId) -> $crate::Result<usize> {
            self.$field.wait(req)
        }
        fn cancel(&mut self, req: $crate::backend::ReqId) {
            self.$field.cancel(req)
        }
    };
}

/// Default of [`EngineConfig::max_unexpected`]: 1 GiB of messages waiting for their receive.
pub const DEFAULT_MAX_UNEXPECTED: u64 = 1 << 30;

/// How many payload buffers of consumed unexpected messages the engine keeps for the next ones,
/// and their most bytes together: a message that arrives before its receive costs no
/// allocation in the steady state (a broadcast's receivers can fall dozens of messages behind
/// its root), and an idle engine holds at most 8 MiB of them.
const SPARE_BUFFERS: usize = 64;
const SPARE_BYTES: usize = 8 << 20;

/// Tag bit reserved for collectives; user tags never set it.
pub const COLL_TAG_BIT: u64 = 1 << 63;

/// A non-blocking, ordered byte stream to one peer.
pub trait Channel: Send {
    /// Writes a prefix of the concatenation of `parts`; `Ok(0)` when the stream is full.
    fn try_write(&mut self, parts: &[&[u8]]) -> io::Result<usize>;
    /// Reads what is available into `buf`; `Ok(0)` when nothing is; end of stream is an error.
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// A file descriptor to block on with `poll`, if the channel has one.
    fn raw_fd(&self) -> Option<RawFd> {
        None
    }
    /// Whether the channel holds bytes already read from its descriptor (a read-ahead), which
    /// `poll` on the descriptor cannot see.
    fn has_buffered(&self) -> bool {
        false
    }
}

enum OpKind {
    Send { hdr: [u8; HEADER_LEN], ptr: *const u8, len: usize, sent: usize },
    Recv { ptr: *mut u8, cap: usize, tag: u64, expect: Option<[u64; 2]>, unexp: Option<u64> },
}

struct Op {
    peer: usize,
    done: bool,
    bytes: usize,
    kind: OpKind,
}

struct Slot {
    gen: u32,
    op: Option<Op>,
}

enum Target {
    Op(u32),
    Unexpected(u64),
    Discard,
}

enum Rx {
    Header { buf: [u8; HEADER_LEN], got: usize },
    Payload { len: usize, got: usize, target: Target, hdr: Header },
}

struct Unexpected {
    id: u64,
    tag: u64,
    meta: [u64; 2],
    len: usize,
    data: Vec<u8>,
    claimed_by: Option<u32>,
}

struct Peer {
    chan: Option<Box<dyn Channel>>,
    /// The peer closed its end between frames: fine unless we still need something from it.
    closed: bool,
    sendq: VecDeque<u32>,
    posted: VecDeque<u32>,
    unexpected: VecDeque<Unexpected>,
    rx: Rx,
}

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Bound of every wait.
    pub timeout: Duration,
    /// Largest payload a peer may announce.
    pub max_message: u64,
    /// Most bytes of messages nobody posted a receive for yet that the engine holds at once (all
    /// peers together); a message that would exceed it is an error naming its sender.
    pub max_unexpected: u64,
    /// How waits poll before blocking.
    pub backoff: Backoff,
    /// With at least this many open channels (every one with a descriptor), each round of
    /// progress first asks poll(2), with no timeout, which have bytes, and reads only from
    /// those; 0: never. Reading every peer's socket costs a syscall per peer per round, one
    /// poll costs one for all, and with one peer a poll is a syscall more than the read.
    pub poll_first_from: usize,
}

/// Point-to-point engine of one communicator (see the module documentation).
pub struct Engine {
    rank: usize,
    world_ranks: Vec<usize>,
    peers: Vec<Peer>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    next_unexp: u64,
    /// Bytes announced by the messages in the unexpected queues (bounded by `max_unexpected`).
    unexpected_bytes: u64,
    /// Emptied payload buffers of consumed unexpected messages, for reuse (see [`SPARE_BUFFERS`]),
    /// and the sum of their capacities.
    spare: Vec<Vec<u8>>,
    spare_bytes: usize,
    abort: Arc<AbortState>,
    cfg: EngineConfig,
    failed: bool,
    pollfds: Vec<libc::pollfd>,
    /// Per peer: whether the last [`Engine::poll_readable`] found bytes to read.
    readable: Vec<bool>,
    coll_seq: u64,
    activity: &'static str,
    /// Reusable scratch for algorithms (kept here so steady-state calls do not allocate).
    pub scratch: Vec<u8>,
    /// A second scratch buffer.
    pub scratch2: Vec<u8>,
    /// Reusable request list for algorithms.
    pub reqs: Vec<ReqId>,
}

// SAFETY: the raw pointers inside ops are owned by the posting caller under the contract of
// `post_send`/`post_recv`; the engine is used from one thread at a time.
unsafe impl Send for Engine {}

impl Engine {
    /// An engine for `rank` among `channels.len()` ranks; `channels[rank]` must be `None`.
    /// `world_ranks` maps communicator ranks to world ranks for error messages.
    pub fn new(
        rank: usize,
        channels: Vec<Option<Box<dyn Channel>>>,
        world_ranks: Vec<usize>,
        abort: Arc<AbortState>,
        cfg: EngineConfig,
    ) -> Self {
        let peers = channels
            .into_iter()
            .map(|chan| Peer {
                chan,
                closed: false,
                sendq: VecDeque::new(),
                posted: VecDeque::new(),
                unexpected: VecDeque::new(),
                rx: Rx::Header { buf: [0; HEADER_LEN], got: 0 },
            })
            .collect();
        Engine {
            rank,
            world_ranks,
            peers,
            slots: vec![],
            free: vec![],
            next_unexp: 0,
            unexpected_bytes: 0,
            spare: vec![],
            spare_bytes: 0,
            abort,
            cfg,
            failed: false,
            pollfds: vec![],
            readable: vec![],
            coll_seq: 0,
            activity: "point-to-point",
            scratch: vec![],
            scratch2: vec![],
            reqs: vec![],
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.peers.len()
    }

    /// The configured timeout.
    pub fn timeout(&self) -> Duration {
        self.cfg.timeout
    }

    /// The abort state shared with the rest of the process.
    pub fn abort_state(&self) -> &Arc<AbortState> {
        &self.abort
    }

    /// The world rank of communicator rank `r`.
    pub fn world_rank(&self, r: usize) -> usize {
        self.world_ranks.get(r).copied().unwrap_or(r)
    }

    /// A fresh tag for the next collective (all ranks call collectives in the same order).
    pub fn next_coll_tag(&mut self) -> u64 {
        self.coll_seq = self.coll_seq.wrapping_add(1);
        COLL_TAG_BIT | (self.coll_seq & 0x7fff_ffff_ffff_ffff)
    }

    /// [`Engine::next_coll_tag`] for a collective about to start, after making sure that no
    /// message of an earlier collective is still waiting here: every rank completes collective
    /// `k` only after receiving all it expects of it, so such a message can only come from a
    /// rank that called collective `k` with other arguments (a different root, say). It can
    /// never be received (its tag carries `k`); it is reported as the disagreement it shows.
    pub fn begin_collective(&mut self) -> Result<u64> {
        let tag = self.next_coll_tag();
        for p in 0..self.peers.len() {
            if let Some(u) = self.peers[p].unexpected.iter().find(|u| self.is_stale(u.tag)) {
                let e = self.stale_message(p, u.tag, u.meta);
                return Err(self.fail(e));
            }
        }
        Ok(tag)
    }

    /// Whether `tag` belongs to a collective this rank has already completed.
    fn is_stale(&self, tag: u64) -> bool {
        tag & COLL_TAG_BIT != 0 && (tag & !COLL_TAG_BIT) < (self.coll_seq & !COLL_TAG_BIT)
    }

    fn stale_message(&self, p: usize, tag: u64, meta: [u64; 2]) -> Error {
        let call = match CollDesc::decode(meta) {
            Some(d) if d.op.rooted() => format!("{} with root {} and count {}", d.op.name(), d.root, d.count),
            Some(d) => format!("{} with count {}", d.op.name(), d.count),
            None => "an unknown collective".into(),
        };
        let what = format!(
            "an earlier collective: rank {} sent data for its collective #{} ({call}) that no call on rank {} expects",
            self.world_rank(p),
            tag & !COLL_TAG_BIT,
            self.world_rank(self.rank)
        );
        Error::Mismatch { rank: self.world_rank(self.rank), what }
    }

    /// Fails fast if this engine or the job was already aborted.
    pub fn check_usable(&self, during: &str) -> Result<()> {
        self.abort.check(self.world_rank(self.rank), during)?;
        if self.failed {
            return Err(Error::Aborted { rank: self.world_rank(self.rank), reason: "communicator failed earlier".into() });
        }
        Ok(())
    }

    fn fail(&mut self, e: Error) -> Error {
        self.failed = true;
        let e = match e {
            Error::LostPeer { .. } => self.root_cause(e),
            e => e,
        };
        self.abort.raise(e.abort_info());
        e
    }

    /// A peer that closed its connection may itself be failing because of another rank: give
    /// the store a moment to name the root cause, and report that instead.
    fn root_cause(&self, e: Error) -> Error {
        if !self.abort.has_notifier() {
            return e;
        }
        let deadline = std::time::Instant::now() + Duration::from_millis(200);
        while !self.abort.is_set() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        match self.abort.info() {
            Some(info) => info.to_error(self.world_rank(self.rank), self.activity),
            None => e,
        }
    }

    fn alloc(&mut self, op: Op) -> ReqId {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { gen: 0, op: None });
                (self.slots.len() - 1) as u32
            }
        };
        let s = &mut self.slots[idx as usize];
        s.gen = s.gen.wrapping_add(1);
        s.op = Some(op);
        (s.gen as u64) << 32 | idx as u64
    }

    fn slot_of(&self, req: ReqId) -> Option<u32> {
        let idx = (req & 0xffff_ffff) as u32;
        let s = self.slots.get(idx as usize)?;
        (s.gen == (req >> 32) as u32 && s.op.is_some()).then_some(idx)
    }

    fn op_mut(&mut self, idx: u32) -> &mut Op {
        self.slots[idx as usize].op.as_mut().expect("live op")
    }

    fn retire(&mut self, idx: u32) -> usize {
        let op = self.slots[idx as usize].op.take().expect("live op");
        self.free.push(idx);
        op.bytes
    }

    fn check_peer(&self, peer: usize, arg: &'static str) -> Result<()> {
        if peer >= self.peers.len() {
            return Err(Error::invalid(
                self.world_rank(self.rank),
                arg,
                format!("rank {peer} out of range (communicator size {})", self.peers.len()),
            ));
        }
        Ok(())
    }

    /// Posts a send. `meta` travels in the header (a collective descriptor, or zeros).
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid and unmodified until the request completes or is cancelled.
    pub unsafe fn post_send(&mut self, peer: usize, tag: u64, meta: [u64; 2], ptr: *const u8, len: usize) -> Result<ReqId> {
        self.check_peer(peer, "peer")?;
        self.check_usable("send")?;
        if peer == self.rank {
            return self.self_send(tag, meta, ptr, len);
        }
        if self.peers[peer].closed {
            let e = Error::LostPeer {
                rank: self.world_rank(self.rank),
                peer: self.world_rank(peer),
                during: "send (the peer had already closed its connection)".into(),
            };
            return Err(self.fail(e));
        }
        let hdr = Header::data(tag, len, meta).encode();
        let req = self.alloc(Op { peer, done: false, bytes: len, kind: OpKind::Send { hdr, ptr, len, sent: 0 } });
        let idx = (req & 0xffff_ffff) as u32;
        self.peers[peer].sendq.push_back(idx);
        if self.peers[peer].sendq.len() == 1 {
            // Eager first attempt: small messages usually leave right here.
            if let Err(e) = self.progress_send(peer) {
                return Err(self.fail(e));
            }
        }
        Ok(req)
    }

    /// A send to this rank itself: delivered to a posted receive or copied into the
    /// unexpected queue at once, so the request completes before this returns.
    ///
    /// # Safety
    /// As [`Engine::post_send`]: `ptr..ptr+len` is valid for reads for the call.
    unsafe fn self_send(&mut self, tag: u64, meta: [u64; 2], ptr: *const u8, len: usize) -> Result<ReqId> {
        // SAFETY: the caller guarantees `ptr..ptr+len` is valid and unmodified until the request
        // completes, which happens before this returns; `data` is not kept past the call (the
        // unexpected queue stores a copy).
        let data = std::slice::from_raw_parts(ptr, len);
        let me = self.rank;
        let pos = self.peers[me]
            .posted
            .iter()
            .position(|&i| matches!(&self.slots[i as usize].op, Some(Op { kind: OpKind::Recv { tag: t, .. }, .. }) if *t == tag));
        if let Some(p) = pos {
            let idx = self.peers[me].posted.remove(p).unwrap();
            self.deliver_copy(idx, tag, meta, data)?;
        } else {
            self.admit_unexpected(me, len as u64)?;
            let id = self.next_unexp;
            self.next_unexp += 1;
            self.unexpected_bytes += len as u64;
            let mut buf = self.spare_buffer();
            buf.extend_from_slice(data);
            self.peers[me].unexpected.push_back(Unexpected { id, tag, meta, len, data: buf, claimed_by: None });
        }
        Ok(self.alloc(Op { peer: me, done: true, bytes: len, kind: OpKind::Send { hdr: [0; HEADER_LEN], ptr, len, sent: len } }))
    }

    /// Copies a complete message into recv op `idx` and completes it.
    fn deliver_copy(&mut self, idx: u32, tag: u64, meta: [u64; 2], data: &[u8]) -> Result<()> {
        let me = self.world_rank(self.rank);
        let op = self.op_mut(idx);
        let peer = op.peer;
        let OpKind::Recv { ptr, cap, expect, .. } = op.kind else { unreachable!() };
        let _ = tag;
        if let Some(exp) = expect {
            if exp != meta {
                let what = describe(exp, me, meta, peer);
                return Err(Error::Mismatch { rank: me, what });
            }
        }
        if data.len() > cap {
            return Err(Error::invalid(
                me,
                "recv buffer",
                format!("message of {} bytes from rank {peer} does not fit in {cap} bytes", data.len()),
            ));
        }
        // SAFETY: the posting caller guarantees ptr..ptr+cap is valid.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
        op.bytes = data.len();
        op.done = true;
        Ok(())
    }

    /// Posts a receive. With `expect`, a frame whose meta words differ is a mismatch error.
    ///
    /// # Safety
    /// `ptr..ptr+cap` must stay valid and untouched until the request completes or is cancelled.
    pub unsafe fn post_recv(&mut self, peer: usize, tag: u64, expect: Option<[u64; 2]>, ptr: *mut u8, cap: usize) -> Result<ReqId> {
        self.check_peer(peer, "peer")?;
        self.check_usable("recv")?;
        let req = self.alloc(Op { peer, done: false, bytes: 0, kind: OpKind::Recv { ptr, cap, tag, expect, unexp: None } });
        let idx = (req & 0xffff_ffff) as u32;
        let pos = self.peers[peer].unexpected.iter().position(|u| u.tag == tag && u.claimed_by.is_none());
        match pos {
            Some(p) if self.peers[peer].unexpected[p].data.len() == self.peers[peer].unexpected[p].len && !self.is_filling(peer, p) => {
                let u = self.take_unexpected(peer, p);
                let delivered = self.deliver_copy(idx, u.tag, u.meta, &u.data);
                self.recycle(u.data);
                if let Err(e) = delivered {
                    self.retire(idx);
                    return Err(self.fail(e));
                }
            }
            Some(p) => {
                let id = self.peers[peer].unexpected[p].id;
                self.peers[peer].unexpected[p].claimed_by = Some(idx);
                if let OpKind::Recv { unexp, .. } = &mut self.op_mut(idx).kind {
                    *unexp = Some(id);
                }
            }
            None => self.peers[peer].posted.push_back(idx),
        }
        Ok(req)
    }

    fn is_filling(&self, peer: usize, p: usize) -> bool {
        let id = self.peers[peer].unexpected[p].id;
        matches!(&self.peers[peer].rx, Rx::Payload { target: Target::Unexpected(t), .. } if *t == id)
    }

    /// Blocking send of `data` (bounded by the timeout).
    pub fn send(&mut self, peer: usize, tag: u64, meta: [u64; 2], data: &[u8]) -> Result<()> {
        // SAFETY: we wait for completion before `data`'s borrow ends.
        let r = unsafe { self.post_send(peer, tag, meta, data.as_ptr(), data.len())? };
        self.wait_guarded(r)
    }

    /// Blocking receive into `buf`; returns the message length.
    pub fn recv(&mut self, peer: usize, tag: u64, expect: Option<[u64; 2]>, buf: &mut [u8]) -> Result<usize> {
        // SAFETY: we wait for completion before `buf`'s borrow ends.
        let r = unsafe { self.post_recv(peer, tag, expect, buf.as_mut_ptr(), buf.len())? };
        match self.wait(r) {
            Ok(n) => Ok(n),
            Err(e) => {
                self.cancel(r);
                Err(e)
            }
        }
    }

    /// Simultaneous send and receive (what ring and pairwise steps need).
    pub fn sendrecv(&mut self, to: usize, sbuf: &[u8], from: usize, rbuf: &mut [u8], tag: u64, meta: [u64; 2]) -> Result<()> {
        // SAFETY: both requests complete or are cancelled before the borrows end.
        unsafe {
            let r = self.post_recv(from, tag, Some(meta), rbuf.as_mut_ptr(), rbuf.len())?;
            let s = match self.post_send(to, tag, meta, sbuf.as_ptr(), sbuf.len()) {
                Ok(s) => s,
                Err(e) => {
                    self.cancel(r);
                    return Err(e);
                }
            };
            let res = self.wait(r).and_then(|_| self.wait(s));
            if res.is_err() {
                self.cancel(r);
                self.cancel(s);
            }
            res.map(|_| ())
        }
    }

    fn wait_guarded(&mut self, r: ReqId) -> Result<()> {
        match self.wait(r) {
            Ok(_) => Ok(()),
            Err(e) => {
                self.cancel(r);
                Err(e)
            }
        }
    }

    /// Waits for every request in `reqs` (cancelling all of them on error).
    pub fn wait_all(&mut self, reqs: &[ReqId]) -> Result<()> {
        for (i, &r) in reqs.iter().enumerate() {
            if let Err(e) = self.wait(r) {
                for &q in &reqs[i..] {
                    self.cancel(q);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Completes and retires `req` if done, after one round of progress.
    pub fn test(&mut self, req: ReqId) -> Result<Option<usize>> {
        let idx = self
            .slot_of(req)
            .ok_or_else(|| Error::invalid(self.world_rank(self.rank), "request", "unknown or already completed request"))?;
        if !self.slots[idx as usize].op.as_ref().unwrap().done {
            self.progress()?;
        }
        if self.slots[idx as usize].op.as_ref().unwrap().done {
            return Ok(Some(self.retire(idx)));
        }
        self.check_usable("test")?;
        Ok(None)
    }

    /// Waits (bounded) for `req`, then retires it.
    pub fn wait(&mut self, req: ReqId) -> Result<usize> {
        let idx = self
            .slot_of(req)
            .ok_or_else(|| Error::invalid(self.world_rank(self.rank), "request", "unknown or already completed request"))?;
        let mut waiter = Waiter::new(self.cfg.timeout, self.cfg.backoff);
        loop {
            if self.slots[idx as usize].op.as_ref().unwrap().done {
                return Ok(self.retire(idx));
            }
            let moved = self.progress()?;
            if self.slots[idx as usize].op.as_ref().unwrap().done {
                return Ok(self.retire(idx));
            }
            let peer = self.slots[idx as usize].op.as_ref().unwrap().peer;
            if self.peers[peer].closed {
                let e = Error::LostPeer {
                    rank: self.world_rank(self.rank),
                    peer: self.world_rank(peer),
                    during: format!("{} (rank {} closed its connection)", self.activity, self.world_rank(peer)),
                };
                return Err(self.fail(e));
            }
            if !moved {
                let blocked = waiter.phase() == Phase::Block && self.block_on_fds(&waiter);
                let rank = self.world_rank(self.rank);
                let peer = self.slots[idx as usize].op.as_ref().unwrap().peer;
                let wr = self.world_rank(peer);
                let is_send = matches!(self.slots[idx as usize].op.as_ref().unwrap().kind, OpKind::Send { .. });
                let activity = self.activity;
                let what = || format!("{activity} ({} rank {wr})", if is_send { "send to" } else { "receive from" });
                if let Err(e) = waiter.pause(&self.abort, rank, &what, blocked) {
                    self.failed = true;
                    if matches!(e, Error::Timeout { .. }) {
                        self.abort.raise(e.abort_info());
                    }
                    return Err(e);
                }
            }
        }
    }

    /// Polls every channel that has a file descriptor for up to 1 ms; false if none has one.
    fn block_on_fds(&mut self, waiter: &Waiter) -> bool {
        self.pollfds.clear();
        for p in &self.peers {
            match p.chan.as_ref().map(|c| c.raw_fd()) {
                Some(Some(fd)) => {
                    let events = libc::POLLIN | if p.sendq.is_empty() { 0 } else { libc::POLLOUT };
                    self.pollfds.push(libc::pollfd { fd, events, revents: 0 });
                }
                Some(None) => return false,
                None => {}
            }
        }
        if self.pollfds.is_empty() {
            return false;
        }
        let ms = waiter.remaining().as_millis().clamp(0, 1) as i32;
        // SAFETY: pollfds is a valid array of the given length.
        unsafe { libc::poll(self.pollfds.as_mut_ptr(), self.pollfds.len() as libc::nfds_t, ms) };
        true
    }

    /// Fills `readable` from one poll(2) with no timeout over every open channel: true where a
    /// read would find bytes, an end of stream or an error (or the channel has bytes buffered).
    /// False, and `readable` untouched, where fewer than `poll_first_from` channels are open, a
    /// channel has no descriptor or poll fails: then every channel is read.
    fn poll_readable(&mut self) -> bool {
        self.pollfds.clear();
        for p in &self.peers {
            if p.chan.is_none() || p.closed {
                continue;
            }
            match p.chan.as_ref().and_then(|c| c.raw_fd()) {
                Some(fd) => self.pollfds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 }),
                None => return false,
            }
        }
        if self.pollfds.len() < self.cfg.poll_first_from {
            return false;
        }
        // SAFETY: pollfds is a valid array of the given length; a zero timeout never blocks.
        let rc = unsafe { libc::poll(self.pollfds.as_mut_ptr(), self.pollfds.len() as libc::nfds_t, 0) };
        if rc < 0 {
            return false;
        }
        self.readable.resize(self.peers.len(), false);
        let mut fds = self.pollfds.iter();
        for (p, peer) in self.peers.iter().enumerate() {
            let Some(chan) = peer.chan.as_ref().filter(|_| !peer.closed) else { continue };
            let revents = fds.next().map_or(0, |f| f.revents);
            self.readable[p] = revents != 0 || chan.has_buffered();
        }
        true
    }

    /// Withdraws a request (see [`crate::Backend::cancel`]).
    pub fn cancel(&mut self, req: ReqId) {
        let Some(idx) = self.slot_of(req) else { return };
        let op = self.slots[idx as usize].op.as_ref().unwrap();
        let peer = op.peer;
        if op.done {
            self.retire(idx);
            return;
        }
        match op.kind {
            OpKind::Send { sent, .. } => {
                if sent > 0 {
                    // Half a frame is on the wire; the stream cannot be resynchronized.
                    let e = Error::Aborted { rank: self.world_rank(self.rank), reason: "a partially sent message was cancelled".into() };
                    let _ = self.fail(e);
                }
                self.peers[peer].sendq.retain(|&i| i != idx);
            }
            OpKind::Recv { unexp, .. } => {
                self.peers[peer].posted.retain(|&i| i != idx);
                if let Some(id) = unexp {
                    if let Some(u) = self.peers[peer].unexpected.iter_mut().find(|u| u.id == id) {
                        u.claimed_by = None;
                    }
                }
                if let Rx::Payload { target, .. } = &mut self.peers[peer].rx {
                    if matches!(target, Target::Op(i) if *i == idx) {
                        *target = Target::Discard;
                    }
                }
            }
        }
        self.retire(idx);
    }

    /// Whether a posted send or receive has not completed yet. A backend whose collectives wait
    /// outside this engine (shared memory's barriers) progresses the engine while this holds:
    /// a peer may need one of these messages to move before it can reach that collective.
    pub fn has_pending(&self) -> bool {
        self.peers.iter().any(|p| !p.sendq.is_empty() || !p.posted.is_empty())
    }

    /// One round of progress on every channel. Returns whether any byte moved.
    pub fn progress(&mut self) -> Result<bool> {
        if self.abort.is_set() {
            self.check_usable("progress")?;
        }
        let mut moved = false;
        let gated = self.cfg.poll_first_from > 0 && self.poll_readable();
        for p in 0..self.peers.len() {
            if self.peers[p].chan.is_none() || self.peers[p].closed {
                continue;
            }
            let read = !gated || self.readable[p];
            let r = self.progress_send(p).and_then(|a| if read { self.progress_recv(p).map(|b| a | b) } else { Ok(a) });
            match r {
                Ok(m) => moved |= m,
                Err(e) => return Err(self.fail(e)),
            }
        }
        Ok(moved)
    }

    fn lost(&self, peer: usize, e: io::Error, during: &str) -> Error {
        let wp = self.world_rank(peer);
        let during = format!("{} ({during} rank {wp})", self.activity);
        match e.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted => Error::LostPeer { rank: self.world_rank(self.rank), peer: wp, during },
            _ => Error::io(self.world_rank(self.rank), during, e),
        }
    }

    /// Names what the engine is doing, for error messages (a collective's name, or
    /// point-to-point).
    pub fn set_activity(&mut self, activity: &'static str) {
        self.activity = activity;
    }

    fn progress_send(&mut self, p: usize) -> Result<bool> {
        let mut moved = false;
        while let Some(&idx) = self.peers[p].sendq.front() {
            let Some(Op { kind: OpKind::Send { hdr, ptr, len, sent }, .. }) = &self.slots[idx as usize].op else { unreachable!() };
            let (hdr, ptr, len, sent) = (*hdr, *ptr, *len, *sent);
            // SAFETY: the posting caller keeps ptr..ptr+len valid until completion.
            let data = unsafe { std::slice::from_raw_parts(ptr, len) };
            let total = HEADER_LEN + len;
            let parts: [&[u8]; 2] = if sent < HEADER_LEN { [&hdr[sent..], data] } else { [&data[sent - HEADER_LEN..], &[]] };
            let chan = self.peers[p].chan.as_mut().unwrap();
            let n = match chan.try_write(&parts) {
                Ok(n) => n,
                Err(e) => return Err(self.lost(p, e, "send to")),
            };
            if n == 0 {
                break;
            }
            moved = true;
            let op = self.op_mut(idx);
            if let OpKind::Send { sent, .. } = &mut op.kind {
                *sent += n;
                if *sent == total {
                    op.done = true;
                    self.peers[p].sendq.pop_front();
                    continue;
                }
            }
            break;
        }
        Ok(moved)
    }

    fn progress_recv(&mut self, p: usize) -> Result<bool> {
        let mut moved = false;
        loop {
            let peer = &mut self.peers[p];
            match &mut peer.rx {
                Rx::Header { buf, got } => {
                    let chan = peer.chan.as_mut().unwrap();
                    let n = match chan.try_read(&mut buf[*got..]) {
                        Ok(n) => n,
                        Err(e) if *got == 0 && e.kind() == io::ErrorKind::UnexpectedEof => {
                            // A clean close between frames; an error only if we wait on this peer.
                            peer.closed = true;
                            return Ok(moved);
                        }
                        Err(e) => return Err(self.lost(p, e, "receive from")),
                    };
                    if n == 0 {
                        return Ok(moved);
                    }
                    moved = true;
                    *got += n;
                    if *got < HEADER_LEN {
                        continue;
                    }
                    let raw = *buf;
                    self.on_header(p, &raw)?;
                }
                Rx::Payload { len, got, target, hdr } => {
                    let (len, hdr) = (*len, *hdr);
                    if *got == len {
                        let target = std::mem::replace(target, Target::Discard);
                        peer.rx = Rx::Header { buf: [0; HEADER_LEN], got: 0 };
                        self.on_payload_done(p, target, hdr)?;
                        continue;
                    }
                    let g = *got;
                    let n = match target {
                        Target::Op(idx) => {
                            let Some(Op { kind: OpKind::Recv { ptr, .. }, .. }) = &self.slots[*idx as usize].op else { unreachable!() };
                            // SAFETY: the posting caller keeps the buffer valid; len <= cap was checked.
                            let dst = unsafe { std::slice::from_raw_parts_mut(ptr.add(g), len - g) };
                            peer.chan.as_mut().unwrap().try_read(dst)
                        }
                        Target::Unexpected(id) => {
                            let id = *id;
                            let u = peer.unexpected.iter_mut().find(|u| u.id == id).expect("unexpected entry");
                            // Grow only as bytes arrive, so a peer's claim costs nothing until sent.
                            let want = (len - g).min(1 << 20);
                            u.data.resize(g + want, 0);
                            let r = peer.chan.as_mut().unwrap().try_read(&mut u.data[g..g + want]);
                            if let Ok(k) = r {
                                u.data.truncate(g + k);
                            }
                            r
                        }
                        Target::Discard => {
                            let mut sink = [0u8; 4096];
                            let want = (len - g).min(sink.len());
                            peer.chan.as_mut().unwrap().try_read(&mut sink[..want])
                        }
                    };
                    let n = match n {
                        Ok(n) => n,
                        Err(e) => return Err(self.lost(p, e, "receive from")),
                    };
                    if n == 0 {
                        return Ok(moved);
                    }
                    moved = true;
                    if let Rx::Payload { got, .. } = &mut self.peers[p].rx {
                        *got += n;
                    }
                }
            }
        }
    }

    fn on_header(&mut self, p: usize, raw: &[u8; HEADER_LEN]) -> Result<()> {
        let me = self.world_rank(self.rank);
        let wp = self.world_rank(p);
        let hdr = Header::decode(raw, self.cfg.max_message).map_err(|w| Error::Protocol { rank: me, peer: wp, why: w.to_string() })?;
        match hdr.kind {
            Kind::Data => {}
            Kind::Abort => {
                // The payload (reason) is read and reported below, once complete.
                if hdr.len > 4096 {
                    return Err(Error::Protocol { rank: me, peer: wp, why: format!("abort reason of {} bytes", hdr.len) });
                }
            }
            k => return Err(Error::Protocol { rank: me, peer: wp, why: format!("unexpected frame kind {k:?} on a data connection") }),
        }
        let len = hdr.len as usize;
        let target = if hdr.kind == Kind::Abort {
            let id = self.push_unexpected(p, hdr);
            Target::Unexpected(id)
        } else {
            let pos = self.peers[p]
                .posted
                .iter()
                .position(|&i| matches!(&self.slots[i as usize].op, Some(Op { kind: OpKind::Recv { tag, .. }, .. }) if *tag == hdr.tag));
            match pos {
                Some(k) => {
                    let idx = self.peers[p].posted.remove(k).unwrap();
                    let Some(Op { kind: OpKind::Recv { cap, expect, .. }, .. }) = &self.slots[idx as usize].op else { unreachable!() };
                    if let Some(exp) = *expect {
                        if exp != hdr.meta {
                            return Err(Error::Mismatch { rank: me, what: describe(exp, me, hdr.meta, wp) });
                        }
                    }
                    if len > *cap {
                        return Err(Error::invalid(
                            me,
                            "recv buffer",
                            format!("message of {len} bytes from rank {wp} does not fit in {cap} bytes"),
                        ));
                    }
                    self.op_mut(idx).bytes = len;
                    Target::Op(idx)
                }
                None if self.is_stale(hdr.tag) => return Err(self.stale_message(p, hdr.tag, hdr.meta)),
                None => {
                    self.admit_unexpected(p, hdr.len)?;
                    Target::Unexpected(self.push_unexpected(p, hdr))
                }
            }
        };
        self.peers[p].rx = Rx::Payload { len, got: 0, target, hdr };
        Ok(())
    }

    /// Refuses a message of `len` bytes from `p` that would take the unexpected queues past
    /// their bound (so a peer's announcement cannot make this rank hold unbounded memory).
    fn admit_unexpected(&self, p: usize, len: u64) -> Result<()> {
        let limit = self.cfg.max_unexpected;
        if self.unexpected_bytes.saturating_add(len) <= limit {
            return Ok(());
        }
        Err(Error::Protocol {
            rank: self.world_rank(self.rank),
            peer: self.world_rank(p),
            why: format!(
                "a message of {len} bytes arrived with no receive posted for it while {} bytes already wait unmatched; \
                 more than the unexpected-message limit of {limit} bytes (SUCL_MAX_UNEXPECTED_BYTES)",
                self.unexpected_bytes
            ),
        })
    }

    fn push_unexpected(&mut self, p: usize, hdr: Header) -> u64 {
        let id = self.next_unexp;
        self.next_unexp += 1;
        self.unexpected_bytes += hdr.len;
        let data = self.spare_buffer();
        self.peers[p].unexpected.push_back(Unexpected { id, tag: hdr.tag, meta: hdr.meta, len: hdr.len as usize, data, claimed_by: None });
        id
    }

    /// An empty payload buffer for an unexpected message: a kept one, or a new one.
    fn spare_buffer(&mut self) -> Vec<u8> {
        let buf = self.spare.pop().unwrap_or_default();
        self.spare_bytes -= buf.capacity();
        buf
    }

    /// Keeps an unexpected message's payload buffer for the next one (emptied; see
    /// [`SPARE_BUFFERS`]), or frees it.
    fn recycle(&mut self, mut data: Vec<u8>) {
        if self.spare.len() < SPARE_BUFFERS && self.spare_bytes + data.capacity() <= SPARE_BYTES {
            data.clear();
            self.spare_bytes += data.capacity();
            self.spare.push(data);
        }
    }

    fn take_unexpected(&mut self, p: usize, pos: usize) -> Unexpected {
        let u = self.peers[p].unexpected.remove(pos).expect("unexpected entry");
        self.unexpected_bytes -= u.len as u64;
        u
    }

    fn on_payload_done(&mut self, p: usize, target: Target, hdr: Header) -> Result<()> {
        match target {
            Target::Op(idx) => {
                self.op_mut(idx).done = true;
            }
            Target::Unexpected(id) => {
                let pos = self.peers[p].unexpected.iter().position(|u| u.id == id).expect("unexpected entry");
                if hdr.kind == Kind::Abort {
                    let u = self.take_unexpected(p, pos);
                    let reason = String::from_utf8_lossy(&u.data).into_owned();
                    let me = self.world_rank(self.rank);
                    let info =
                        crate::error::AbortInfo { lost_rank: None, reason: format!("rank {} aborted: {reason}", self.world_rank(p)) };
                    self.abort.set_remote(info.clone());
                    return Err(info.to_error(me, "receive"));
                }
                if let Some(idx) = self.peers[p].unexpected[pos].claimed_by {
                    let u = self.take_unexpected(p, pos);
                    let delivered = self.deliver_copy(idx, u.tag, u.meta, &u.data);
                    self.recycle(u.data);
                    delivered?;
                }
            }
            Target::Discard => {}
        }
        Ok(())
    }

    /// Sends an abort frame to every peer (best effort, non-blocking).
    pub fn broadcast_abort(&mut self, reason: &str) {
        let payload = reason.as_bytes();
        let payload = &payload[..payload.len().min(4096)];
        let hdr = Header { kind: Kind::Abort, tag: 0, len: payload.len() as u64, meta: [0, 0] }.encode();
        for p in &mut self.peers {
            if let Some(c) = p.chan.as_mut() {
                if p.sendq.is_empty() {
                    let _ = c.try_write(&[&hdr, payload]);
                }
            }
        }
    }
}

fn describe(mine: [u64; 2], me: usize, theirs: [u64; 2], peer: usize) -> String {
    match CollDesc::decode(mine) {
        Some(d) => d.describe_mismatch(me, theirs, peer),
        None => format!("message descriptor with rank {peer}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An in-memory peer: reads hand out `input` in the given piece sizes; writes are kept.
    struct MemChannel {
        input: Vec<u8>,
        pos: usize,
        pieces: Vec<usize>,
        turn: usize,
        written: Vec<u8>,
    }

    impl Channel for MemChannel {
        fn try_write(&mut self, parts: &[&[u8]]) -> io::Result<usize> {
            let mut n = 0;
            for p in parts {
                self.written.extend_from_slice(p);
                n += p.len();
            }
            Ok(n)
        }
        fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.pos == self.input.len() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let piece = self.pieces.get(self.turn % self.pieces.len().max(1)).copied().unwrap_or(7).max(1);
            self.turn += 1;
            let n = piece.min(buf.len()).min(self.input.len() - self.pos);
            buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    fn engine(input: Vec<u8>, pieces: Vec<usize>) -> Engine {
        engine_with_limit(input, pieces, DEFAULT_MAX_UNEXPECTED)
    }

    fn engine_with_limit(input: Vec<u8>, pieces: Vec<usize>, max_unexpected: u64) -> Engine {
        let chan = MemChannel { input, pos: 0, pieces, turn: 0, written: vec![] };
        let cfg = EngineConfig {
            timeout: Duration::from_secs(2),
            max_message: 1 << 20,
            max_unexpected,
            backoff: Backoff::DEDICATED,
            poll_first_from: 0,
        };
        Engine::new(0, vec![None, Some(Box::new(chan))], vec![0, 7], AbortState::new(), cfg)
    }

    /// What a receive of tag 5 into 128 bytes must return for `bytes` from the peer: the payload
    /// when they are exactly one valid data frame of tag 5 that fits, an error otherwise.
    fn expected_outcome(bytes: &[u8]) -> Option<&[u8]> {
        let raw: &[u8; HEADER_LEN] = bytes.get(..HEADER_LEN)?.try_into().ok()?;
        let h = Header::decode(raw, 1 << 20).ok()?;
        let whole = h.kind == Kind::Data && h.tag == 5 && h.len <= 128 && bytes.len() as u64 == HEADER_LEN as u64 + h.len;
        whole.then(|| &bytes[HEADER_LEN..])
    }

    #[test]
    fn unexpected_messages_beyond_the_bound_are_an_error_naming_the_peer() {
        // Two 60-byte messages nobody asked for yet, then the one we wait for: 120 > 100.
        let mut input = frame(1, &[1; 60]);
        input.extend(frame(2, &[2; 60]));
        input.extend(frame(3, &[3; 10]));
        let mut e = engine_with_limit(input, vec![64], 100);
        let err = e.recv(1, 3, None, &mut [0u8; 16]).unwrap_err();
        match &err {
            Error::Protocol { peer: 7, why, .. } if why.contains("unexpected-message limit of 100 bytes") => {}
            other => panic!("expected a protocol error naming rank 7 and the limit, got {other}"),
        }
    }

    fn frame(tag: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = Header::data(tag, payload.len(), [0, 0]).encode().to_vec();
        v.extend_from_slice(payload);
        v
    }

    /// A peer whose bytes the test hands over as it goes; empty means "nothing yet", not EOF.
    struct FeedChannel(Arc<std::sync::Mutex<VecDeque<u8>>>);

    impl Channel for FeedChannel {
        fn try_write(&mut self, parts: &[&[u8]]) -> io::Result<usize> {
            Ok(parts.iter().map(|p| p.len()).sum())
        }
        fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let mut q = self.0.lock().unwrap();
            let n = buf.len().min(q.len());
            for (d, s) in buf.iter_mut().zip(q.drain(..n)) {
                *d = s;
            }
            Ok(n)
        }
    }

    #[test]
    fn unexpected_payload_buffers_are_reused_and_carry_nothing_over() {
        let feed = Arc::new(std::sync::Mutex::new(VecDeque::new()));
        let mut e = Engine::new(0, vec![None, Some(Box::new(FeedChannel(feed.clone())))], vec![0, 7], AbortState::new(), test_cfg());
        let mut kept = None;
        // Each round: a message nobody asked for yet (tag 1, shrinking), then the awaited one.
        for (round, len) in [60usize, 30, 45, 1].into_iter().enumerate() {
            let v = round as u8 + 1;
            feed.lock().unwrap().extend(frame(1, &vec![v; len]).into_iter().chain(frame(2, &[9; 4])));
            let mut b = [0u8; 4];
            assert_eq!(e.recv(1, 2, None, &mut b).unwrap(), 4);
            let mut a = [0u8; 64];
            assert_eq!(e.recv(1, 1, None, &mut a).unwrap(), len, "round {round}");
            assert!(a[..len].iter().all(|&x| x == v) && a[len..].iter().all(|&x| x == 0), "round {round}: {a:?}");
            // One buffer came back, and it is the same one every round: no allocation after the first.
            assert_eq!(e.spare.len(), 1, "round {round}");
            let ptr = e.spare[0].as_ptr();
            assert_eq!(*kept.get_or_insert(ptr), ptr, "round {round} allocated a new buffer");
        }
        // A message to ourselves before its receive is copied into a kept buffer too.
        e.send(0, 3, [0, 0], &[5; 3]).unwrap();
        let mut a = [0u8; 8];
        assert_eq!(e.recv(0, 3, None, &mut a).unwrap(), 3);
        assert_eq!(a, [5, 5, 5, 0, 0, 0, 0, 0]);
        assert_eq!(e.spare[0].as_ptr(), kept.unwrap(), "the self-sent message reused the kept buffer");
        // Many waiting at once: the engine keeps at most SPARE_BUFFERS of them, SPARE_BYTES in all.
        let n = SPARE_BUFFERS + 10;
        for t in 0..n as u64 {
            feed.lock().unwrap().extend(frame(100 + t, &[3; 8]));
        }
        feed.lock().unwrap().extend(frame(2, &[9; 4]));
        e.recv(1, 2, None, &mut [0u8; 4]).unwrap();
        for t in 0..n as u64 {
            assert_eq!(e.recv(1, 100 + t, None, &mut [0u8; 8]).unwrap(), 8);
        }
        assert_eq!(e.spare.len(), SPARE_BUFFERS);
        assert_eq!(e.spare_bytes, e.spare.iter().map(Vec::capacity).sum::<usize>());
        assert!(e.spare_bytes <= SPARE_BYTES);
    }

    fn test_cfg() -> EngineConfig {
        EngineConfig {
            timeout: Duration::from_secs(2),
            max_message: 1 << 20,
            max_unexpected: DEFAULT_MAX_UNEXPECTED,
            backoff: Backoff::DEDICATED,
            poll_first_from: 0,
        }
    }

    #[test]
    fn unexpected_bytes_are_released_when_received() {
        // Five rounds of a 60-byte message taken after a later one: never more than 70 bytes wait
        // at once, although 300 pass through an engine whose bound is 100.
        let feed = Arc::new(std::sync::Mutex::new(VecDeque::new()));
        let cfg = EngineConfig {
            timeout: Duration::from_secs(2),
            max_message: 1 << 20,
            max_unexpected: 100,
            backoff: Backoff::DEDICATED,
            poll_first_from: 0,
        };
        let mut e = Engine::new(0, vec![None, Some(Box::new(FeedChannel(feed.clone())))], vec![0, 7], AbortState::new(), cfg);
        for round in 0..5 {
            feed.lock().unwrap().extend(frame(1, &[1; 60]).into_iter().chain(frame(2, &[2; 10])));
            let (mut a, mut b) = ([0u8; 60], [0u8; 10]);
            assert_eq!(e.recv(1, 2, None, &mut b).unwrap_or_else(|err| panic!("round {round}: {err}")), 10);
            assert_eq!(e.recv(1, 1, None, &mut a).unwrap(), 60);
            assert_eq!((a, b), ([1; 60], [2; 10]));
        }
    }

    proptest! {
        /// Arbitrary bytes from a peer never panic the decoder: a receive ends in data or an error.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300), pieces in proptest::collection::vec(1usize..64, 1..8)) {
            let mut e = engine(bytes, pieces);
            let mut buf = [0u8; 64];
            let _ = e.recv(1, 5, None, &mut buf);
        }

        /// A valid frame with one byte flipped and/or cut anywhere: the receive returns the
        /// payload only when the bytes still are one whole valid frame for it; every truncated or
        /// corrupted frame is an error (promptly: no timeout), never a panic or wrong data.
        #[test]
        fn truncated_or_corrupted_frames_are_errors(payload in proptest::collection::vec(any::<u8>(), 0..100), cut in 0usize..200, flip in any::<u8>(), at in 0usize..140) {
            let mut v = frame(5, &payload);
            if at < v.len() { v[at] ^= flip; }
            v.truncate(cut.min(v.len()));
            let expected = expected_outcome(&v).map(<[u8]>::to_vec);
            let mut e = engine(v, vec![3]);
            let mut buf = [0u8; 128];
            match (e.recv(1, 5, None, &mut buf), expected) {
                (Ok(n), Some(want)) => prop_assert_eq!(&buf[..n], &want[..]),
                (Ok(n), None) => prop_assert!(false, "a truncated or corrupted frame was received as {} bytes", n),
                (Err(err), Some(_)) => prop_assert!(false, "a whole valid frame failed: {}", err),
                (Err(err), None) => prop_assert!(!matches!(err, Error::Timeout { .. }), "waited for the timeout: {}", err),
            }
        }

        /// Frames arriving in arbitrary read sizes, received in another tag order, arrive intact.
        #[test]
        fn frames_survive_any_chunking(a in proptest::collection::vec(any::<u8>(), 0..200), b in proptest::collection::vec(any::<u8>(), 0..200), pieces in proptest::collection::vec(1usize..50, 1..6)) {
            let mut input = frame(1, &a);
            input.extend(frame(2, &b));
            let mut e = engine(input, pieces);
            let (mut ba, mut bb) = (vec![0u8; 200], vec![0u8; 200]);
            let nb = e.recv(1, 2, None, &mut bb).unwrap();
            let na = e.recv(1, 1, None, &mut ba).unwrap();
            prop_assert_eq!(&bb[..nb], &b[..]);
            prop_assert_eq!(&ba[..na], &a[..]);
        }
    }
}
