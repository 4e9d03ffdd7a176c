//! The shared-memory backend: ranks on one host share one POSIX shared-memory segment.
//!
//! Layout: a header; one control block per rank (barrier counter and two collective
//! descriptors, each on its own cache line); one single-producer/single-consumer byte ring per
//! ordered pair for point-to-point; one arena per rank for collectives. The segment is unlinked
//! as soon as every rank has mapped it, so nothing is left in /dev/shm even if a rank crashes.
//!
//! Collectives run in *steps*. In a step each rank writes its share into half `step % 2` of its
//! own arena, all ranks pass a flag barrier, then each rank reads what it needs from the others'
//! halves. A rank writes a half again only two steps later, after a barrier that every rank
//! reached only once done reading it, so one barrier per step suffices. Large reductions use two
//! barriers per step: each rank reduces a 1/n portion of the chunk in place, then everyone
//! copies every portion out; every rank's memory bandwidth works at once.

use crate::HostConfig;
use std::ffi::CString;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use sucl_core::backend::{Backend, CollDesc, CollOp};
use sucl_core::chunk::{block_range, bytes};
use sucl_core::dtype::{finish_reduce, reduce_bytes, reduce_bytes_into};
use sucl_core::engine::{Channel, Engine};
use sucl_core::store::StoreClient;
use sucl_core::wait::Waiter;
use sucl_core::{AbortState, Error, Result};

const MAGIC: u64 = 0x5355_434c_5348_4d31; // "SUCLSHM1"
const HEADER_BYTES: usize = 4096;
/// Per rank: a cache line with the barrier counter, then two mailboxes (one per step parity)
/// holding a sequence number, the step's collective descriptor and up to [`INLINE_MAX`] bytes of
/// payload, so a small collective costs one cache-line transfer per peer.
const CTL_BYTES: usize = 128 + 2 * MAILBOX_BYTES;
const MAILBOX_BYTES: usize = 4096 + 64;
const MAILBOX_DATA: usize = 32;
/// Largest collective payload carried inline in the mailbox.
pub const INLINE_MAX: usize = MAILBOX_BYTES - MAILBOX_DATA;
const RING_CTL_BYTES: usize = 256;

/// A mapped shared-memory segment.
struct Segment {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is process-wide memory; all cross-process access goes through atomics
// or the step/barrier protocol described in the module documentation.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: base/len describe a mapping we created.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

impl Segment {
    fn open(name: &str, len: usize, create: bool) -> io::Result<Segment> {
        let c = CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment name"))?;
        let flags = if create { libc::O_CREAT | libc::O_EXCL | libc::O_RDWR } else { libc::O_RDWR };
        // SAFETY: plain libc calls with valid arguments; every failure is checked.
        unsafe {
            let fd = libc::shm_open(c.as_ptr(), flags, 0o600);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            if create && libc::ftruncate(fd, len as libc::off_t) != 0 {
                let e = io::Error::last_os_error();
                libc::close(fd);
                libc::shm_unlink(c.as_ptr());
                return Err(e);
            }
            let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
            libc::close(fd);
            if p == libc::MAP_FAILED {
                let e = io::Error::last_os_error();
                if create {
                    libc::shm_unlink(c.as_ptr());
                }
                return Err(e);
            }
            Ok(Segment { base: p as *mut u8, len })
        }
    }

    fn unlink(name: &str) {
        if let Ok(c) = CString::new(name) {
            // SAFETY: valid C string.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
    }

    #[inline(always)]
    fn at(&self, off: usize) -> *mut u8 {
        debug_assert!(off < self.len);
        // SAFETY: callers compute offsets inside the layout.
        unsafe { self.base.add(off) }
    }

    #[inline(always)]
    fn atomic(&self, off: usize) -> &AtomicU64 {
        // SAFETY: offsets are 8-byte aligned inside the mapping, which outlives &self.
        unsafe { &*(self.at(off) as *const AtomicU64) }
    }
}

/// Bytes between the starts of consecutive arena halves beyond the half itself, so that halves
/// and ranks do not share cache sets (4 KiB aliasing slows copies between aligned buffers).
const SKEW: usize = 64 * 17;

#[derive(Clone, Copy)]
struct Layout {
    n: usize,
    ring: usize,
    /// Usable bytes of one arena half.
    half: usize,
}

impl Layout {
    fn ctl(&self, r: usize) -> usize {
        HEADER_BYTES + r * CTL_BYTES
    }
    fn mailbox(&self, r: usize, h: usize) -> usize {
        self.ctl(r) + 128 + h * MAILBOX_BYTES
    }
    fn ring(&self, from: usize, to: usize) -> usize {
        HEADER_BYTES + self.n * CTL_BYTES + (from * self.n + to) * (RING_CTL_BYTES + self.ring)
    }
    fn arena_stride(&self) -> usize {
        2 * (self.half + SKEW) + SKEW
    }
    fn half(&self, r: usize, h: usize) -> usize {
        HEADER_BYTES
            + self.n * CTL_BYTES
            + self.n * self.n * (RING_CTL_BYTES + self.ring)
            + r * self.arena_stride()
            + h * (self.half + SKEW)
            + (r % 4) * 128
    }
    fn total(&self) -> usize {
        HEADER_BYTES + self.n * CTL_BYTES + self.n * self.n * (RING_CTL_BYTES + self.ring) + self.n * self.arena_stride() + 4096
    }
}

/// One direction of a ring pair, as an engine channel.
struct RingChannel {
    seg: Arc<Segment>,
    out_ctl: usize,
    in_ctl: usize,
    cap: usize,
    head: u64,
    tail: u64,
    peer_tail: u64,
}

impl RingChannel {
    fn data(&self, ctl: usize) -> *mut u8 {
        self.seg.at(ctl + RING_CTL_BYTES)
    }
}

impl Channel for RingChannel {
    fn try_write(&mut self, parts: &[&[u8]]) -> io::Result<usize> {
        let mut free = self.cap - (self.head - self.peer_tail) as usize;
        if free == 0 {
            self.peer_tail = self.seg.atomic(self.out_ctl + 128).load(Ordering::Acquire);
            free = self.cap - (self.head - self.peer_tail) as usize;
            if free == 0 {
                return Ok(0);
            }
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if free < total {
            self.peer_tail = self.seg.atomic(self.out_ctl + 128).load(Ordering::Acquire);
            free = self.cap - (self.head - self.peer_tail) as usize;
        }
        let data = self.data(self.out_ctl);
        let mut written = 0;
        for p in parts {
            let k = p.len().min(free - written);
            let mut done = 0;
            while done < k {
                let pos = ((self.head as usize) + written + done) & (self.cap - 1);
                let run = (k - done).min(self.cap - pos);
                // SAFETY: pos..pos+run lies in the ring's data area; only we write it now.
                unsafe { std::ptr::copy_nonoverlapping(p.as_ptr().add(done), data.add(pos), run) };
                done += run;
            }
            written += k;
            if written == free {
                break;
            }
        }
        if written > 0 {
            self.head += written as u64;
            self.seg.atomic(self.out_ctl).store(self.head, Ordering::Release);
        }
        Ok(written)
    }

    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let head = self.seg.atomic(self.in_ctl).load(Ordering::Acquire);
        let avail = (head - self.tail) as usize;
        if avail == 0 {
            return Ok(0);
        }
        let k = avail.min(buf.len());
        let data = self.data(self.in_ctl);
        let mut done = 0;
        while done < k {
            let pos = (self.tail as usize + done) & (self.cap - 1);
            let run = (k - done).min(self.cap - pos);
            // SAFETY: the producer published these bytes with a release store of head.
            unsafe { std::ptr::copy_nonoverlapping(data.add(pos), buf.as_mut_ptr().add(done), run) };
            done += run;
        }
        self.tail += k as u64;
        self.seg.atomic(self.in_ctl + 128).store(self.tail, Ordering::Release);
        Ok(k)
    }
}

/// The shared-memory backend of one communicator.
pub struct ShmBackend {
    seg: Arc<Segment>,
    lay: Layout,
    rank: usize,
    world_rank: usize,
    engine: Engine,
    abort: Arc<AbortState>,
    cfg: HostConfig,
    barrier_seq: u64,
    step: u64,
}

impl ShmBackend {
    /// Creates (rank 0) or opens the job's segment named after `segment_name`, through the store
    /// under `prefix`. Every rank of `world_ranks` must be on this host.
    pub fn connect(
        store: &StoreClient,
        prefix: &str,
        segment_name: &str,
        rank: usize,
        world_ranks: Vec<usize>,
        abort: Arc<AbortState>,
        cfg: &HostConfig,
    ) -> Result<ShmBackend> {
        let n = world_ranks.len();
        let wr = world_ranks[rank];
        let lay = Layout { n, ring: cfg.shm_ring_bytes.next_power_of_two().max(4096), half: (cfg.shm_arena_bytes.max(8192) / 2) & !127 };
        let io = |what: &'static str| move |e: io::Error| Error::io(wr, format!("shm setup: {what}"), e);
        let seg = if rank == 0 {
            let s = Segment::open(segment_name, lay.total(), true).map_err(io("creating the segment"))?;
            s.atomic(8).store(n as u64, Ordering::Relaxed);
            s.atomic(0).store(MAGIC, Ordering::Release);
            store.set(&format!("{prefix}/shm"), segment_name.as_bytes())?;
            s
        } else {
            let name = String::from_utf8_lossy(&store.get(&format!("{prefix}/shm"))?).into_owned();
            let s = Segment::open(&name, lay.total(), false).map_err(io("opening the segment"))?;
            if s.atomic(0).load(Ordering::Acquire) != MAGIC || s.atomic(8).load(Ordering::Relaxed) != n as u64 {
                return Err(Error::Mismatch {
                    rank: wr,
                    what: format!("shared-memory segment {name}: layout differs (ranks disagree on size or shm settings)"),
                });
            }
            s
        };
        let barrier = store.barrier(&format!("{prefix}/shm-mapped"), n);
        if rank == 0 {
            // Everyone mapped it (or setup failed): the name is no longer needed.
            Segment::unlink(segment_name);
        }
        barrier?;
        let seg = Arc::new(seg);
        let channels = (0..n)
            .map(|j| {
                (j != rank).then(|| {
                    Box::new(RingChannel {
                        seg: seg.clone(),
                        out_ctl: lay.ring(rank, j),
                        in_ctl: lay.ring(j, rank),
                        cap: lay.ring,
                        head: 0,
                        tail: 0,
                        peer_tail: 0,
                    }) as Box<dyn Channel>
                })
            })
            .collect();
        let engine = Engine::new(rank, channels, world_ranks, abort.clone(), cfg.engine());
        Ok(ShmBackend { seg, lay, rank, world_rank: wr, engine, abort, cfg: cfg.clone(), barrier_seq: 0, step: 0 })
    }

    #[inline(always)]
    fn half(&self, r: usize, h: usize) -> *mut u8 {
        self.seg.at(self.lay.half(r, h))
    }

    fn half_bytes(&self) -> usize {
        self.lay.half
    }

    #[inline]
    fn barrier(&mut self, op: CollOp) -> Result<()> {
        self.barrier_seq += 1;
        let seq = self.barrier_seq;
        self.seg.atomic(self.lay.ctl(self.rank)).store(seq, Ordering::Release);
        for j in 0..self.lay.n {
            if j == self.rank {
                continue;
            }
            let a = self.seg.atomic(self.lay.ctl(j));
            if a.load(Ordering::Acquire) >= seq {
                continue;
            }
            let mut w = Waiter::new(self.cfg.timeout, self.cfg.backoff);
            while a.load(Ordering::Acquire) < seq {
                let wr = self.world_rank;
                let peer = self.engine.world_rank(j);
                if let Err(e) =
                    w.pause(&self.abort, wr, &|| format!("{} (waiting for rank {peer} at a shared-memory barrier)", op.name()), false)
                {
                    if matches!(e, Error::Timeout { .. }) {
                        self.abort.raise(e.abort_info());
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Starts a step: returns the arena half to use and publishes this rank's descriptor in the
    /// step's mailbox (with the sequence number of the barrier that follows, so that a peer
    /// waiting at an inline step sees it and reports the disagreement instead of hanging).
    #[inline]
    fn begin_step(&mut self, desc: Option<&CollDesc>) -> usize {
        self.step += 1;
        let h = (self.step % 2) as usize;
        if let Some(d) = desc {
            let w = d.encode();
            let mb = self.lay.mailbox(self.rank, h);
            self.seg.atomic(mb + 8).store(w[0], Ordering::Relaxed);
            self.seg.atomic(mb + 16).store(w[1], Ordering::Relaxed);
            self.seg.atomic(mb).store(self.barrier_seq + 1, Ordering::Release);
        }
        h
    }

    /// One step whose payload (`data`, at most [`INLINE_MAX`] bytes) travels in the mailbox:
    /// publish, then wait until every peer published the same step. Returns the parity.
    #[inline]
    fn inline_step(&mut self, d: &CollDesc, data: Option<&[u8]>) -> Result<usize> {
        self.step += 1;
        let h = (self.step % 2) as usize;
        self.barrier_seq += 1;
        let seq = self.barrier_seq;
        let mb = self.lay.mailbox(self.rank, h);
        let w = d.encode();
        self.seg.atomic(mb + 8).store(w[0], Ordering::Relaxed);
        self.seg.atomic(mb + 16).store(w[1], Ordering::Relaxed);
        if let Some(data) = data {
            self.slice(self.seg.at(mb + MAILBOX_DATA), data.len()).copy_from_slice(data);
        }
        self.seg.atomic(mb).store(seq, Ordering::Release);
        self.seg.atomic(self.lay.ctl(self.rank)).store(seq, Ordering::Release);
        for j in 0..self.lay.n {
            if j == self.rank {
                continue;
            }
            let a = self.seg.atomic(self.lay.mailbox(j, h));
            if a.load(Ordering::Acquire) >= seq {
                continue;
            }
            let mut w = Waiter::new(self.cfg.timeout, self.cfg.backoff);
            while a.load(Ordering::Acquire) < seq {
                let (wr, peer) = (self.world_rank, self.engine.world_rank(j));
                if let Err(e) = w.pause(&self.abort, wr, &|| format!("{} (waiting for rank {peer} in shared memory)", d.op.name()), false) {
                    if matches!(e, Error::Timeout { .. }) {
                        self.abort.raise(e.abort_info());
                    }
                    return Err(e);
                }
            }
        }
        self.check_descs(d, h)?;
        Ok(h)
    }

    #[inline(always)]
    fn inline_data(&self, r: usize, h: usize, len: usize) -> &'static mut [u8] {
        self.slice(self.seg.at(self.lay.mailbox(r, h) + MAILBOX_DATA), len)
    }

    /// After the step's first barrier: every rank's descriptor must equal ours.
    #[inline]
    fn check_descs(&self, desc: &CollDesc, h: usize) -> Result<()> {
        let mine = desc.encode();
        for j in 0..self.lay.n {
            let off = self.lay.mailbox(j, h) + 8;
            let theirs = [self.seg.atomic(off).load(Ordering::Relaxed), self.seg.atomic(off + 8).load(Ordering::Relaxed)];
            if theirs != mine {
                // Every rank sees the same descriptors, so every rank reports this same error.
                return Err(Error::Mismatch {
                    rank: self.world_rank,
                    what: desc.describe_mismatch(self.world_rank, theirs, self.engine.world_rank(j)),
                });
            }
        }
        Ok(())
    }

    fn slice(&self, p: *mut u8, len: usize) -> &'static mut [u8] {
        // SAFETY: p..p+len lies inside an arena half; the step protocol gives this rank exclusive
        // write access to its own half and read access to others' for the step's duration.
        unsafe { std::slice::from_raw_parts_mut(p, len) }
    }

    fn collective_inner(&mut self, d: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        let (n, me) = (self.lay.n, self.rank);
        let es = d.dtype.size();
        let hb = self.half_bytes();
        if n == 1 {
            // A communicator of one: every collective is a local copy (or nothing).
            if let (Some(s), false) = (send, matches!(d.op, CollOp::Barrier | CollOp::Broadcast)) {
                recv.copy_from_slice(s);
            }
            return Ok(());
        }
        match d.op {
            CollOp::Barrier => self.inline_step(d, None).map(|_| ()),
            CollOp::AllReduce | CollOp::Reduce => {
                let len = d.count * es;
                let all = d.op == CollOp::AllReduce;
                let root = if all { usize::MAX } else { d.root };
                let input: &[u8] = match send {
                    Some(s) => s,
                    None => &*recv,
                };
                let input = self.slice(input.as_ptr() as *mut u8, input.len());
                if len <= INLINE_MAX.min(self.cfg.shm_small_bytes) {
                    let h = self.inline_step(d, Some(input))?;
                    if all || me == root {
                        reduce_bytes_into(recv, self.inline_data(0, h, len), self.inline_data(1, h, len), d.dtype, d.redop);
                        for j in 2..n {
                            reduce_bytes(recv, self.inline_data(j, h, len), d.dtype, d.redop);
                        }
                    }
                } else if len <= self.cfg.shm_small_bytes.min(hb) {
                    let h = self.begin_step(Some(d));
                    self.slice(self.half(me, h), len).copy_from_slice(input);
                    self.barrier(d.op)?;
                    self.check_descs(d, h)?;
                    if all || me == root {
                        // Same order on every rank: bitwise-identical results everywhere.
                        reduce_bytes_into(recv, self.slice(self.half(0, h), len), self.slice(self.half(1, h), len), d.dtype, d.redop);
                        for j in 2..n {
                            reduce_bytes(recv, self.slice(self.half(j, h), len), d.dtype, d.redop);
                        }
                    }
                } else {
                    // Chunks small enough to stay in cache between the phases.
                    let chunk = (hb.min(self.cfg.shm_chunk_bytes.max(4096)) / es) * es;
                    let mut first = true;
                    let mut off = 0;
                    while off < len {
                        let c = chunk.min(len - off);
                        let h = self.begin_step(first.then_some(d));
                        let mine = self.slice(self.half(me, h), c);
                        let p = bytes(block_range(c / es, n, me), es);
                        // Publish the portions others reduce; ours is read straight from input.
                        mine[..p.start].copy_from_slice(&input[off..off + p.start]);
                        mine[p.end..].copy_from_slice(&input[off + p.end..off + c]);
                        self.barrier(d.op)?;
                        if first {
                            self.check_descs(d, h)?;
                            first = false;
                        }
                        let mut others = (0..n).filter(|&j| j != me);
                        let j0 = others.next().expect("n > 1");
                        let src0 = self.slice(self.half(j0, h), c);
                        reduce_bytes_into(&mut mine[p.clone()], &input[off + p.start..off + p.end], &src0[p.clone()], d.dtype, d.redop);
                        for j in others {
                            let theirs = self.slice(self.half(j, h), c);
                            reduce_bytes(&mut mine[p.clone()], &theirs[p.clone()], d.dtype, d.redop);
                        }
                        self.barrier(d.op)?;
                        if all || me == root {
                            for j in 0..n {
                                let pj = bytes(block_range(c / es, n, j), es);
                                let src = self.slice(self.half(j, h), c);
                                recv[off + pj.start..off + pj.end].copy_from_slice(&src[pj]);
                            }
                        }
                        off += c;
                    }
                }
                if all || me == root {
                    finish_reduce(recv, d.dtype, d.redop, n);
                }
                Ok(())
            }
            CollOp::Broadcast if d.count * es <= INLINE_MAX => {
                let len = d.count * es;
                let h = self.inline_step(d, (me == d.root).then_some(&*recv))?;
                if me != d.root {
                    recv.copy_from_slice(self.inline_data(d.root, h, len));
                }
                Ok(())
            }
            CollOp::Broadcast => {
                let len = d.count * es;
                let mut off = 0;
                let mut first = true;
                loop {
                    let c = hb.min(len - off);
                    let h = self.begin_step(first.then_some(d));
                    if me == d.root {
                        self.slice(self.half(me, h), c).copy_from_slice(&recv[off..off + c]);
                    }
                    self.barrier(d.op)?;
                    if first {
                        self.check_descs(d, h)?;
                        first = false;
                    }
                    if me != d.root {
                        recv[off..off + c].copy_from_slice(self.slice(self.half(d.root, h), c));
                    }
                    off += c;
                    if off >= len {
                        return Ok(());
                    }
                }
            }
            CollOp::AllGather | CollOp::Gather => {
                let blk = d.count * es;
                let all = d.op == CollOp::AllGather;
                let mine_in: &[u8] = match send {
                    Some(s) => s,
                    None => &recv[me * blk..(me + 1) * blk],
                };
                let mine_in = self.slice(mine_in.as_ptr() as *mut u8, mine_in.len());
                let mut off = 0;
                let mut first = true;
                loop {
                    let c = hb.min(blk - off);
                    let h = self.begin_step(first.then_some(d));
                    self.slice(self.half(me, h), c).copy_from_slice(&mine_in[off..off + c]);
                    self.barrier(d.op)?;
                    if first {
                        self.check_descs(d, h)?;
                        first = false;
                    }
                    if all || me == d.root {
                        for j in 0..n {
                            if j == me && send.is_none() {
                                continue;
                            }
                            recv[j * blk + off..j * blk + off + c].copy_from_slice(self.slice(self.half(j, h), c));
                        }
                    }
                    off += c;
                    if off >= blk {
                        return Ok(());
                    }
                }
            }
            CollOp::Scatter | CollOp::AllToAll | CollOp::ReduceScatter => {
                let blk = d.count * es;
                let rooted = d.op == CollOp::Scatter;
                let sub = ((hb / n) / es).max(1) * es;
                let mut off = 0;
                let mut first = true;
                loop {
                    let c = sub.min(blk - off);
                    let h = self.begin_step(first.then_some(d));
                    if !rooted || me == d.root {
                        let s = send.expect("send buffer");
                        let mine = self.slice(self.half(me, h), n * c);
                        for j in 0..n {
                            mine[j * c..(j + 1) * c].copy_from_slice(&s[j * blk + off..j * blk + off + c]);
                        }
                    }
                    self.barrier(d.op)?;
                    if first {
                        self.check_descs(d, h)?;
                        first = false;
                    }
                    let at = |j: usize| self.slice(self.half(j, h), n * c);
                    match d.op {
                        CollOp::Scatter => recv[off..off + c].copy_from_slice(&at(d.root)[me * c..(me + 1) * c]),
                        CollOp::AllToAll => {
                            for j in 0..n {
                                recv[j * blk + off..j * blk + off + c].copy_from_slice(&at(j)[me * c..(me + 1) * c]);
                            }
                        }
                        _ => {
                            let out = &mut recv[off..off + c];
                            out.copy_from_slice(&at(0)[me * c..(me + 1) * c]);
                            for j in 1..n {
                                reduce_bytes(out, &at(j)[me * c..(me + 1) * c], d.dtype, d.redop);
                            }
                        }
                    }
                    off += c;
                    if off >= blk {
                        break;
                    }
                }
                if d.op == CollOp::ReduceScatter {
                    finish_reduce(recv, d.dtype, d.redop, n);
                }
                Ok(())
            }
        }
    }
}

impl Backend for ShmBackend {
    fn name(&self) -> &'static str {
        "shm"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.lay.n
    }
    sucl_core::delegate_p2p_to_engine!(engine);

    fn collective(&mut self, desc: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        if self.abort.is_set() {
            self.abort.check(self.world_rank, desc.op.name())?;
        }
        self.collective_inner(desc, send, recv)
    }
}
