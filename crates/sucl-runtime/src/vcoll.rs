//! V-collectives: `gatherv`, `all_gatherv`, `scatterv`, `all_to_allv` — per-rank counts and
//! displacements, MPI style — run by the communicator's point-to-point host backend: natively
//! where it can, else over its point-to-point engine.
//!
//! **API contract (so that disagreements are found, never truncated or hung on).** Every rank
//! passes the *whole* counts table of the call, not only its own part: `counts[r]` elements for
//! rank `r` (gatherv, scatterv, all_gatherv), or the `size × size` matrix `counts[i * size + j]`
//! = elements rank `i` sends to rank `j` (all_to_allv). A rank's own send (or receive) length
//! must equal its entry. Displacements are local to the rank that owns the buffer (the root's
//! receive buffer for gatherv, each rank's buffers otherwise) and are in elements.
//!
//! **Before any data moves** each rank validates its arguments (lengths of the tables, every
//! block inside its buffer, no two receive blocks overlapping, root in range), then all ranks
//! all_gather a fixed-size fingerprint: operation, element type, root, a hash of the counts
//! table and whether the rank's own arguments were valid. A rank with bad arguments returns its
//! `InvalidArgument`; every other rank returns `Mismatch` naming it; ranks whose tables differ
//! all return `Mismatch` naming the ranks that differ. Cost: one small all_gather per call —
//! or nothing extra where the point-to-point backend runs the exchange itself as the first
//! step of its native v-collective ([`sucl_core::Backend::v_collective_agreeing`]; shm does:
//! the fingerprints travel in its mailboxes, with the data too when it fits, and nothing is
//! copied out before every fingerprint was compared). Validation allocates nothing for
//! communicators of up to 32 ranks (`PAIRWISE_MAX`).
//!
//! **Messages** carry the tag `VCOLL_TAG_BIT | sequence`, where the sequence is the
//! communicator's collective number (the same on every rank; it rises on every collective), so
//! a message left over from a failed call can never match a later one, and user tags (at most
//! [`crate::MAX_TAG`]) never collide with them. Zero-length blocks send nothing (both sides
//! know it from the agreed table). A received block whose length differs from the table is a
//! `Mismatch`.
//!
//! Algorithms: a backend with native v-collectives runs them — shm fused with the agreement
//! (its streams of blocks go through the mailboxes or arena windows, as its plain collectives
//! do; see `sucl_host::shm`), MPI after it (MPI_Igatherv, MPI_Iallgatherv, MPI_Iscatterv,
//! MPI_Ialltoallv). Otherwise (tcp) the generic algorithms over point-to-point: linear for
//! gatherv and scatterv (the root posts all its receives or sends at once); pairwise exchange
//! for all_to_allv and all_gatherv (step `k`: send to `rank + k`, receive from `rank − k`),
//! which keeps one send and one receive in flight per rank.
//!
//! Device memory goes over NCCL as one group of sends and receives per call (the same
//! validation and agreement first); without NCCL (staged) a device v-collective is an error
//! for now.

use crate::{Buf, BufMut, Communicator, Element, Error, Mem, MemMut, Result};
use std::ops::Range;
use sucl_core::backend::{CollOp, VAgreement, VCollDesc, VCollOp};
use sucl_core::ReduceOp;

/// Tag bit of v-collective messages: above every user tag, below the engine's own collective
/// tags (bit 63), so neither can match these.
pub const VCOLL_TAG_BIT: u64 = 1 << 62;

/// Magic word of a v-collective fingerprint (and its layout version).
const VFP_MAGIC: u64 = u64::from_le_bytes(*b"SUCLvco1");

/// Words of one rank's fingerprint.
const VFP_WORDS: usize = 6;

/// A peer and an element range of the buffer that goes to it or comes from it.
#[cfg(feature = "cuda")]
type Peer = (usize, Range<usize>);

/// One [`Peer`] block per rank: `counts[r]` elements at `displs[r]`.
#[cfg(feature = "cuda")]
fn spans(counts: &[usize], displs: &[usize]) -> Vec<Peer> {
    counts.iter().zip(displs).enumerate().map(|(p, (&c, &d))| (p, d..d + c)).collect()
}

/// Which v-collective a call is (part of the fingerprint).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum VOp {
    Gatherv = 1,
    AllGatherv = 2,
    Scatterv = 3,
    AllToAllv = 4,
}

impl VOp {
    /// The call's name, as users write it.
    fn name(self) -> &'static str {
        match self {
            VOp::Gatherv => "gatherv",
            VOp::AllGatherv => "all_gatherv",
            VOp::Scatterv => "scatterv",
            VOp::AllToAllv => "all_to_allv",
        }
    }
}

/// A hash of the counts table, word by word (FNV-1a's constants, each word folded in whole and
/// its high bits mixed down): equal tables give equal hashes on every rank and platform.
fn table_hash(counts: &[usize]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &c in counts {
        h = (h ^ c as u64).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 32;
    }
    h
}

/// One rank's fingerprint of a v-collective call (what the agreement step compares).
fn fingerprint(op: VOp, dtype: u64, root: usize, counts: &[usize], ok: bool) -> [u64; VFP_WORDS] {
    [VFP_MAGIC, op as u64, dtype, root as u64, table_hash(counts), ok as u64]
}

/// A host call's counts and displacements in bytes, MPI style (see [`VCollDesc`]), in one
/// allocation: send counts, send displacements, receive counts, receive displacements, and
/// the whole agreed counts table.
struct ByteTables {
    words: Vec<usize>,
    ends: [usize; 5],
}

impl ByteTables {
    fn new(es: usize, parts: [Counts<'_>; 5]) -> ByteTables {
        let mut words = Vec::with_capacity(parts.iter().map(|p| p.len).sum());
        let mut ends = [0; 5];
        for (e, p) in ends.iter_mut().zip(parts) {
            words.extend((0..p.len).map(|i| p.get(i) * es));
            *e = words.len();
        }
        ByteTables { words, ends }
    }

    fn part(&self, i: usize) -> &[usize] {
        &self.words[if i == 0 { 0 } else { self.ends[i - 1] }..self.ends[i]]
    }

    fn desc(&self, op: VCollOp, root: usize) -> VCollDesc<'_> {
        VCollDesc {
            op,
            root,
            send_counts: self.part(0),
            send_displs: self.part(1),
            recv_counts: self.part(2),
            recv_displs: self.part(3),
            table: self.part(4),
        }
    }
}

/// Where a v-collective's data is, for the agreement step.
enum Data<'s, 'r> {
    /// Host memory: the call, or `None` where this rank's arguments are invalid.
    Host(Option<HostCall<'s, 'r>>),
    /// Device memory: the data goes elsewhere (NCCL) after the agreement.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Device,
}

/// The data side of a host v-collective on a rank whose arguments are valid.
struct HostCall<'s, 'r> {
    op: VCollOp,
    root: usize,
    tables: ByteTables,
    send: &'s [u8],
    recv: &'r mut [u8],
}

/// The element range `displ .. displ + count` checked against a buffer of `len` elements.
fn block(arg: &'static str, rank: usize, which: usize, count: usize, displ: usize, len: usize) -> Result<Range<usize>> {
    match displ.checked_add(count) {
        Some(end) if end <= len => Ok(displ..end),
        _ => Err(Error::invalid(
            rank,
            arg,
            format!("block {which} ({count} elements at displacement {displ}) does not fit in the buffer of {len} elements"),
        )),
    }
}

/// Up to this many blocks, the overlap check compares every pair (no allocation: the check runs
/// on every call); beyond it, it sorts.
const PAIRWISE_MAX: usize = 32;

/// Checks that the `n` receive blocks `range(0) .. range(n - 1)` do not overlap (empty ones
/// never do).
fn disjoint(arg: &'static str, rank: usize, n: usize, range: impl Fn(usize) -> Range<usize>) -> Result<()> {
    let overlap = |(i, a): (usize, Range<usize>), (j, b): (usize, Range<usize>)| {
        Error::invalid(rank, arg, format!("receive blocks {i} ({a:?}) and {j} ({b:?}) overlap"))
    };
    if n <= PAIRWISE_MAX {
        for i in 0..n {
            let a = range(i);
            for j in (i + 1..n).filter(|_| !a.is_empty()) {
                let b = range(j);
                if !b.is_empty() && a.start < b.end && b.start < a.end {
                    return Err(overlap((i, a), (j, b)));
                }
            }
        }
        return Ok(());
    }
    let mut v: Vec<(usize, Range<usize>)> = (0..n).map(|i| (i, range(i))).filter(|(_, r)| !r.is_empty()).collect();
    v.sort_by_key(|(_, r)| r.start);
    match v.windows(2).find(|w| w[1].1.start < w[0].1.end) {
        Some(w) => Err(overlap(w[0].clone(), w[1].clone())),
        None => Ok(()),
    }
}

/// A vector of counts seen in place: a whole table, a row of the all_to_allv matrix, or a column
/// of it (`len` entries, `step` apart from `start`).
#[derive(Clone, Copy)]
struct Counts<'a> {
    v: &'a [usize],
    start: usize,
    step: usize,
    len: usize,
}

impl<'a> Counts<'a> {
    fn all(v: &'a [usize]) -> Self {
        Counts { v, start: 0, step: 1, len: v.len() }
    }

    /// Column `j` of the `n × n` matrix `m` (entries `i * n + j`), or nothing if `m` is not one.
    fn column(m: &'a [usize], n: usize, j: usize) -> Self {
        Counts { v: m, start: j, step: n, len: if m.len() == n * n { n } else { 0 } }
    }

    /// Row `i` of the `n × n` matrix `m`, or nothing if `m` is not one.
    fn row(m: &'a [usize], n: usize, i: usize) -> Self {
        Counts { v: m, start: i * n, step: 1, len: if m.len() == n * n { n } else { 0 } }
    }

    fn get(&self, i: usize) -> usize {
        self.v[self.start + i * self.step]
    }

    #[cfg(any(feature = "cuda", test))]
    fn to_vec(self) -> Vec<usize> {
        (0..self.len).map(|i| self.get(i)).collect()
    }
}

impl Communicator {
    fn table_len(&self, arg: &'static str, got: usize, want: usize) -> Result<()> {
        if got != want {
            return Err(Error::invalid(self.wr(), arg, format!("has {got} entries but this communicator needs {want}")));
        }
        Ok(())
    }

    /// Checks the blocks of `displs`/`counts` against a buffer of `len` elements (and against
    /// each other if they may not overlap), allocating nothing for small communicators.
    fn check_blocks(&self, arg: &'static str, counts: Counts<'_>, displs: &[usize], len: usize, no_overlap: bool) -> Result<()> {
        self.table_len(arg, displs.len(), self.size)?;
        for (i, &d) in displs.iter().enumerate() {
            block(arg, self.wr(), i, counts.get(i), d, len)?;
        }
        if no_overlap {
            disjoint(arg, self.wr(), displs.len(), |i| displs[i]..displs[i] + counts.get(i))?;
        }
        Ok(())
    }

    /// The element ranges of `displs`/`counts` in a buffer of `len` elements, checked.
    fn blocks(&self, arg: &'static str, counts: Counts<'_>, displs: &[usize], len: usize, no_overlap: bool) -> Result<Vec<Range<usize>>> {
        self.check_blocks(arg, counts, displs, len, no_overlap)?;
        Ok(displs.iter().enumerate().map(|(i, &d)| d..d + counts.get(i)).collect())
    }

    fn own_len(&self, arg: &'static str, got: usize, want: usize) -> Result<()> {
        if got != want {
            return Err(Error::invalid(self.wr(), arg, format!("has {got} elements but the counts table gives this rank {want}")));
        }
        Ok(())
    }

    /// The agreement step (see the module docs) on its own, for the paths that run it before
    /// their data (device memory): every rank learns whether all ranks passed valid arguments
    /// and the same counts table. Returns the tag for the call's messages.
    #[cfg(feature = "cuda")]
    fn agree_v(&self, op: VOp, dtype: u64, root: usize, counts: &[usize], local: Result<()>) -> Result<u64> {
        self.agree(op, fingerprint(op, dtype, root, counts, local.is_ok()), local, Data::Device).map(|a| a.unwrap_or(0))
    }

    /// The agreement step with fingerprint `mine`, and the host data with it where it can: a
    /// host call (`Data::Host`: this rank's byte tables and buffers, `None` if its arguments are
    /// invalid) goes to the point-to-point backend's fused v-collective when it offers one (then
    /// `Ok(None)`: the data moved), else to its native one after the agreement collective
    /// (`Ok(None)` too); `Ok(Some(tag))` leaves the data to the generic algorithm, with the tag
    /// of its messages. A call on device buffers (`Data::Device`) only agrees, by the collective. Whatever
    /// the path, ranks whose arguments are invalid or whose tables differ get the same errors,
    /// and nothing is delivered before every rank's fingerprint was compared.
    fn agree(&self, op: VOp, mine: [u64; VFP_WORDS], local: Result<()>, data: Data<'_, '_>) -> Result<Option<u64>> {
        self.check_poisoned(op.name())?;
        let d = Self::desc::<u64>(CollOp::AllGather, VFP_WORDS, ReduceOp::Sum, 0);
        self.enter_collective(&d)?;
        self.current_op.set(op.name());
        // Every rank's fingerprint: on the stack for communicators of up to 16 ranks.
        let (mut stack, mut heap) = ([0u64; VFP_WORDS * 16], Vec::new());
        let all: &mut [u64] = if self.size <= 16 {
            &mut stack[..VFP_WORDS * self.size]
        } else {
            heap.resize(VFP_WORDS * self.size, 0);
            &mut heap
        };
        let (host, call, s, r): (_, _, &[u8], &mut [u8]) = match data {
            Data::Host(Some(h)) => (true, Some((h.op, h.root, h.tables)), h.send, h.recv),
            Data::Host(None) => (true, None, &[], &mut []),
            Data::Device => (false, None, &[], &mut []),
        };
        let desc = call.as_ref().map(|(op, root, t)| t.desc(*op, *root));
        // Offered or not regardless of the arguments: every rank takes the same path (device
        // calls are calls on device buffers on every rank, or fail on the rank that mixes memories).
        let agree = VAgreement { mine: &mine[..], all: &mut *all };
        let fused = if host { self.backend_mut().v_collective_agreeing(agree, desc.as_ref(), s, r) } else { None };
        let fused = match fused {
            Some(r) => Some(self.settle(r)?),
            None => {
                // The exchange has the same shape on every rank, valid arguments or not. It is
                // sucl's own protocol, so the test-only fault hook (which stands for a backend
                // corrupting users' results) never touches it.
                let r = self.coll_unhooked(d, Some(bytemuck::cast_slice(&mine[..])), bytemuck::cast_slice_mut(&mut *all));
                self.settle(r)?;
                None
            }
        };
        local?;
        self.compare_fingerprints_v(op, &mine, all)?;
        if fused == Some(true) {
            return Ok(None);
        }
        if fused == Some(false) {
            // The backend saw a difference that the comparison above should have named.
            return Err(self.poison(Error::Mismatch { rank: self.wr(), what: format!("{op:?}: the ranks' fingerprints differ") }));
        }
        if let Some(d) = desc {
            if let Some(res) = self.backend_mut().v_collective(&d, s, r) {
                self.settle(res)?;
                return Ok(None);
            }
        }
        Ok(Some(VCOLL_TAG_BIT | (self.coll_seq.get() & (VCOLL_TAG_BIT - 1))))
    }

    /// Every rank's fingerprint against this rank's: ranks that rejected their arguments, then
    /// ranks whose call differs, as `Mismatch` (the same on every rank).
    fn compare_fingerprints_v(&self, op: VOp, mine: &[u64; VFP_WORDS], all: &[u64]) -> Result<()> {
        let rows = || all.chunks(VFP_WORDS);
        let bad: Vec<usize> = rows().enumerate().filter(|(_, w)| w[5] != 1).map(|(r, _)| r).collect();
        if !bad.is_empty() {
            return Err(Error::Mismatch { rank: self.wr(), what: format!("{op:?} arguments: rank(s) {bad:?} rejected theirs") });
        }
        let differ: Vec<usize> = rows().enumerate().filter(|(_, w)| w[..5] != mine[..5]).map(|(r, _)| r).collect();
        if !differ.is_empty() {
            return Err(Error::Mismatch {
                rank: self.wr(),
                what: format!("{op:?} (operation, element type, root or counts table): rank(s) {differ:?} differ from rank {}", self.rank),
            });
        }
        Ok(())
    }

    /// Sends `send` to `dest` and receives exactly `recv.len()` bytes from `src` (either may be
    /// absent), both in flight together, on the point-to-point backend.
    fn v_step(&self, tag: u64, send: Option<(usize, &[u8])>, recv: Option<(usize, &mut [u8])>) -> Result<()> {
        let mut b = self.backend_mut();
        let want = recv.as_ref().map(|(_, r)| r.len());
        let from = recv.as_ref().map(|(s, _)| *s);
        let rq = match recv {
            // SAFETY: `r` stays mutably borrowed until this function returns, and the request is
            // waited for or cancelled below before it returns.
            Some((src, r)) => Some(unsafe { b.post_recv(src, tag, r.as_mut_ptr(), r.len()) }?),
            None => None,
        };
        let sq = match send {
            // SAFETY: `s` stays borrowed until this function returns; the request is waited for
            // or cancelled below.
            Some((dest, s)) => match unsafe { b.post_send(dest, tag, s.as_ptr(), s.len()) } {
                Ok(q) => Some(q),
                Err(e) => {
                    if let Some(q) = rq {
                        b.cancel(q);
                    }
                    return Err(e);
                }
            },
            None => None,
        };
        let mut first: Option<Error> = None;
        let mut got = None;
        for (q, is_recv) in [(sq, false), (rq, true)] {
            let Some(q) = q else { continue };
            if first.is_some() {
                b.cancel(q);
                continue;
            }
            match b.wait(q) {
                Ok(n) if is_recv => got = Some(n),
                Ok(_) => {}
                Err(e) => {
                    b.cancel(q);
                    first = Some(e);
                }
            }
        }
        drop(b);
        if let Some(e) = first {
            return Err(e);
        }
        if let (Some(n), Some(w), Some(src)) = (got, want, from) {
            if n != w {
                return Err(Error::Mismatch {
                    rank: self.wr(),
                    what: format!("v-collective block size: {n} bytes from rank {src}, the counts table says {w}"),
                });
            }
        }
        Ok(())
    }

    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn host_only<'a>(&self, op: &str, m: Mem<'a>) -> Result<&'a [u8]> {
        match m {
            Mem::Host(b) => Ok(b),
            #[cfg(feature = "cuda")]
            Mem::Device(_) => Err(self.no_device_v(op)),
        }
    }

    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn host_only_mut<'a>(&self, op: &str, m: MemMut<'a>) -> Result<&'a mut [u8]> {
        match m {
            MemMut::Host(b) => Ok(b),
            #[cfg(feature = "cuda")]
            MemMut::Device(_) => Err(self.no_device_v(op)),
        }
    }

    #[cfg(feature = "cuda")]
    fn no_device_v(&self, op: &str) -> Error {
        Error::BackendUnavailable {
            rank: self.wr(),
            backend: "nccl/staged".into(),
            why: format!("{op} on device memory is not implemented yet"),
        }
    }

    /// A v-collective on device memory as one NCCL group of sends and receives (element ranges
    /// per peer, this rank included: NCCL serves sends to itself), after validation and agreement.
    #[cfg(feature = "cuda")]
    fn v_nccl(&self, send: Mem<'_>, recv: MemMut<'_>, es: usize, sends: &[Peer], recvs: &[Peer]) -> Result<()> {
        let (Mem::Device(s), MemMut::Device(r)) = (send, recv) else { return Err(self.mixed_memory()) };
        let q = r.queue().clone();
        if s.queue().device().ordinal() != q.device().ordinal() {
            return Err(Error::invalid(self.wr(), "send", "is on another GPU than recv"));
        }
        let (sp, _gs) = s.read_ptr(q.stream());
        let (rp, _gr) = r.write_ptr(q.stream());
        let at = |base: u64, v: &[Peer]| -> Vec<(u64, usize, usize)> {
            v.iter().filter(|(_, b)| !b.is_empty()).map(|(p, b)| (base + (b.start * es) as u64, b.len() * es, *p)).collect()
        };
        let (sl, rl) = (at(sp, sends), at(rp, recvs));
        // SAFETY: every range was validated against its buffer's length (in elements of `es`
        // bytes) before the agreement; both buffers live on `q`'s GPU (checked above) and stay
        // borrowed until we return, and their guards (`_gs`, `_gr`) order later users of the
        // memory after the transfers enqueued on `q`'s stream.
        let done = unsafe { self.nccl_group_p2p(&sl, &rl, &q) };
        self.settle(done)
    }

    /// Gathers `counts[r]` elements from every rank `r` into root's `recv` at element offset
    /// `displs[r]`. Every rank passes the whole `counts` table (its `send` must hold
    /// `counts[rank]` elements); `displs` and `recv` are used on the root only (others may pass
    /// empty ones). Receive blocks may not overlap; gaps between them are left untouched.
    pub fn gatherv<S: Buf + ?Sized, R: BufMut<Elem = S::Elem> + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[usize],
        displs: &[usize],
        root: usize,
    ) -> Result<()> {
        let es = std::mem::size_of::<S::Elem>();
        let me = self.rank;
        let local = (|| {
            self.check_rank("root", root)?;
            self.table_len("counts", counts.len(), self.size)?;
            self.own_len("send", send.len(), counts[me])?;
            if me == root {
                self.check_blocks("displs", Counts::all(counts), displs, recv.len(), true)?;
            }
            Ok(())
        })();
        let dtype = <S::Elem as Element>::DTYPE as u64;
        #[cfg(feature = "cuda")]
        if send.mem().is_device() || recv.mem_mut().is_device() {
            self.agree_v(VOp::Gatherv, dtype, root, counts, local)?;
            let sends: Vec<Peer> = if counts[me] > 0 { vec![(root, 0..counts[me])] } else { Vec::new() };
            let recvs: Vec<Peer> = if me == root { spans(counts, displs) } else { Vec::new() };
            return self.v_nccl(send.mem(), recv.mem_mut(), es, &sends, &recvs);
        }
        let s = self.host_only("gatherv", send.mem())?;
        let r = self.host_only_mut("gatherv", recv.mem_mut())?;
        let fp = fingerprint(VOp::Gatherv, dtype, root, counts, local.is_ok());
        let host = local.is_ok().then(|| {
            let (rc, rd): (&[usize], &[usize]) = if me == root { (counts, displs) } else { (&[], &[]) };
            let tables = ByteTables::new(
                es,
                [Counts::all(&counts[me..=me]), Counts::all(&[0]), Counts::all(rc), Counts::all(rd), Counts::all(counts)],
            );
            HostCall { op: VCollOp::Gatherv, root, tables, send: s, recv: &mut *r }
        });
        let Some(tag) = self.agree(VOp::Gatherv, fp, local, Data::Host(host))? else { return Ok(()) };
        if me != root {
            if counts[me] > 0 {
                return self.settle(self.v_step(tag, Some((root, s)), None));
            }
            return Ok(());
        }
        let blocks = self.blocks("displs", Counts::all(counts), displs, r.len() / es, true)?;
        r[blocks[me].start * es..blocks[me].end * es].copy_from_slice(s);
        let done = self.recv_blocks(tag, r, &blocks, es);
        self.settle(done)
    }

    /// Receives every non-empty block of `blocks` (element ranges of `r`) from the rank of its
    /// index, all posted at once.
    fn recv_blocks(&self, tag: u64, r: &mut [u8], blocks: &[Range<usize>], es: usize) -> Result<()> {
        let mut b = self.backend_mut();
        let mut posted = Vec::new();
        let mut first = None;
        for (src, bl) in blocks.iter().enumerate() {
            if src == self.rank || bl.is_empty() {
                continue;
            }
            let part = &mut r[bl.start * es..bl.end * es];
            // SAFETY: the blocks were checked not to overlap and to lie inside `r`, which stays
            // mutably borrowed until every posted request is waited for or cancelled below.
            match unsafe { b.post_recv(src, tag, part.as_mut_ptr(), part.len()) } {
                Ok(q) => posted.push((q, src, part.len())),
                Err(e) => {
                    first = Some(e);
                    break;
                }
            }
        }
        for (q, src, want) in posted {
            if first.is_some() {
                b.cancel(q);
                continue;
            }
            match b.wait(q) {
                Ok(n) if n != want => {
                    first = Some(Error::Mismatch {
                        rank: self.wr(),
                        what: format!("v-collective block size: {n} bytes from rank {src}, the counts table says {want}"),
                    })
                }
                Ok(_) => {}
                Err(e) => {
                    b.cancel(q);
                    first = Some(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Sends every non-empty block of `blocks` (element ranges of `s`) to the rank of its index,
    /// all posted at once.
    fn send_blocks(&self, tag: u64, s: &[u8], blocks: &[Range<usize>], es: usize) -> Result<()> {
        let mut b = self.backend_mut();
        let mut posted = Vec::new();
        let mut first = None;
        for (dest, bl) in blocks.iter().enumerate() {
            if dest == self.rank || bl.is_empty() {
                continue;
            }
            let part = &s[bl.start * es..bl.end * es];
            // SAFETY: `part` lies inside `s`, borrowed until every request is waited for or
            // cancelled below.
            match unsafe { b.post_send(dest, tag, part.as_ptr(), part.len()) } {
                Ok(q) => posted.push(q),
                Err(e) => {
                    first = Some(e);
                    break;
                }
            }
        }
        for q in posted {
            if first.is_some() {
                b.cancel(q);
            } else if let Err(e) = b.wait(q) {
                b.cancel(q);
                first = Some(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Sends `counts[r]` elements at element offset `displs[r]` of root's `send` to every rank
    /// `r`'s `recv`. Every rank passes the whole `counts` table (its `recv` must hold
    /// `counts[rank]` elements); `displs` and `send` are used on the root only. Send blocks may
    /// overlap.
    pub fn scatterv<S: Buf + ?Sized, R: BufMut<Elem = S::Elem> + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[usize],
        displs: &[usize],
        root: usize,
    ) -> Result<()> {
        let es = std::mem::size_of::<S::Elem>();
        let me = self.rank;
        let local = (|| {
            self.check_rank("root", root)?;
            self.table_len("counts", counts.len(), self.size)?;
            self.own_len("recv", recv.len(), counts[me])?;
            if me == root {
                self.check_blocks("displs", Counts::all(counts), displs, send.len(), false)?;
            }
            Ok(())
        })();
        let dtype = <S::Elem as Element>::DTYPE as u64;
        #[cfg(feature = "cuda")]
        if send.mem().is_device() || recv.mem_mut().is_device() {
            self.agree_v(VOp::Scatterv, dtype, root, counts, local)?;
            let sends: Vec<Peer> = if me == root { spans(counts, displs) } else { Vec::new() };
            let recvs: Vec<Peer> = if counts[me] > 0 { vec![(root, 0..counts[me])] } else { Vec::new() };
            return self.v_nccl(send.mem(), recv.mem_mut(), es, &sends, &recvs);
        }
        let r = self.host_only_mut("scatterv", recv.mem_mut())?;
        let s = self.host_only("scatterv", send.mem())?;
        let fp = fingerprint(VOp::Scatterv, dtype, root, counts, local.is_ok());
        let host = local.is_ok().then(|| {
            let (sc, sd): (&[usize], &[usize]) = if me == root { (counts, displs) } else { (&[], &[]) };
            let tables = ByteTables::new(
                es,
                [Counts::all(sc), Counts::all(sd), Counts::all(&counts[me..=me]), Counts::all(&[0]), Counts::all(counts)],
            );
            HostCall { op: VCollOp::Scatterv, root, tables, send: s, recv: &mut *r }
        });
        let Some(tag) = self.agree(VOp::Scatterv, fp, local, Data::Host(host))? else { return Ok(()) };
        if me != root {
            if counts[me] > 0 {
                return self.settle(self.v_step(tag, None, Some((root, r))));
            }
            return Ok(());
        }
        let blocks = self.blocks("displs", Counts::all(counts), displs, s.len() / es, false)?;
        let own = &blocks[me];
        r.copy_from_slice(&s[own.start * es..own.end * es]);
        self.settle(self.send_blocks(tag, s, &blocks, es))
    }

    /// Every rank's `send` (`counts[rank]` elements) lands in every rank's `recv` at element
    /// offset `displs[sender]`. Every rank passes the whole `counts` table and its own `displs`
    /// for its `recv`; receive blocks may not overlap.
    pub fn all_gatherv<S: Buf + ?Sized, R: BufMut<Elem = S::Elem> + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
        counts: &[usize],
        displs: &[usize],
    ) -> Result<()> {
        let es = std::mem::size_of::<S::Elem>();
        let n = self.size;
        let me = self.rank;
        let local = (|| {
            self.table_len("counts", counts.len(), n)?;
            self.own_len("send", send.len(), counts[me])?;
            self.check_blocks("displs", Counts::all(counts), displs, recv.len(), true)
        })();
        let dtype = <S::Elem as Element>::DTYPE as u64;
        #[cfg(feature = "cuda")]
        if send.mem().is_device() || recv.mem_mut().is_device() {
            self.agree_v(VOp::AllGatherv, dtype, 0, counts, local)?;
            let sends: Vec<Peer> = if counts[me] > 0 { (0..n).map(|p| (p, 0..counts[me])).collect() } else { Vec::new() };
            return self.v_nccl(send.mem(), recv.mem_mut(), es, &sends, &spans(counts, displs));
        }
        let s = self.host_only("all_gatherv", send.mem())?;
        let r = self.host_only_mut("all_gatherv", recv.mem_mut())?;
        let fp = fingerprint(VOp::AllGatherv, dtype, 0, counts, local.is_ok());
        let host = local.is_ok().then(|| {
            let tables = ByteTables::new(
                es,
                [Counts::all(&counts[me..=me]), Counts::all(&[0]), Counts::all(counts), Counts::all(displs), Counts::all(counts)],
            );
            HostCall { op: VCollOp::AllGatherv, root: 0, tables, send: s, recv: &mut *r }
        });
        let Some(tag) = self.agree(VOp::AllGatherv, fp, local, Data::Host(host))? else { return Ok(()) };
        let blocks = self.blocks("displs", Counts::all(counts), displs, r.len() / es, true)?;
        r[blocks[me].start * es..blocks[me].end * es].copy_from_slice(s);
        for k in 1..n {
            let dest = (me + k) % n;
            let src = (me + n - k) % n;
            let out = (!s.is_empty()).then_some((dest, s));
            let rb = &blocks[src];
            let inn = (!rb.is_empty()).then_some((src, &mut r[rb.start * es..rb.end * es]));
            let step = self.v_step(tag, out, inn);
            self.settle(step)?;
        }
        Ok(())
    }

    /// All-to-all with per-pair counts. `counts` is the whole `size × size` table, row-major:
    /// `counts[i * size + j]` elements go from rank `i` to rank `j` — every rank passes the same
    /// table. Rank `i`'s block for `j` starts at element `sdispls[j]` of its `send`; the block
    /// it receives from `j` lands at element `rdispls[j]` of its `recv`. Receive blocks may not
    /// overlap; send blocks may.
    pub fn all_to_allv<S: Buf + ?Sized, R: BufMut<Elem = S::Elem> + ?Sized>(
        &self,
        send: &S,
        sdispls: &[usize],
        recv: &mut R,
        rdispls: &[usize],
        counts: &[usize],
    ) -> Result<()> {
        let es = std::mem::size_of::<S::Elem>();
        let n = self.size;
        let me = self.rank;
        let (row, col) = (Counts::row(counts, n, me), Counts::column(counts, n, me));
        let local = (|| {
            self.table_len("counts", counts.len(), n * n)?;
            self.check_blocks("sdispls", row, sdispls, send.len(), false)?;
            self.check_blocks("rdispls", col, rdispls, recv.len(), true)
        })();
        let dtype = <S::Elem as Element>::DTYPE as u64;
        #[cfg(feature = "cuda")]
        if send.mem().is_device() || recv.mem_mut().is_device() {
            self.agree_v(VOp::AllToAllv, dtype, 0, counts, local)?;
            return self.v_nccl(send.mem(), recv.mem_mut(), es, &spans(&row.to_vec(), sdispls), &spans(&col.to_vec(), rdispls));
        }
        let s = self.host_only("all_to_allv", send.mem())?;
        let r = self.host_only_mut("all_to_allv", recv.mem_mut())?;
        let fp = fingerprint(VOp::AllToAllv, dtype, 0, counts, local.is_ok());
        let host = local.is_ok().then(|| {
            let tables = ByteTables::new(es, [row, Counts::all(sdispls), col, Counts::all(rdispls), Counts::all(counts)]);
            HostCall { op: VCollOp::AllToAllv, root: 0, tables, send: s, recv: &mut *r }
        });
        let Some(tag) = self.agree(VOp::AllToAllv, fp, local, Data::Host(host))? else { return Ok(()) };
        let sb = self.blocks("sdispls", row, sdispls, s.len() / es, false)?;
        let rb = self.blocks("rdispls", col, rdispls, r.len() / es, true)?;
        r[rb[me].start * es..rb[me].end * es].copy_from_slice(&s[sb[me].start * es..sb[me].end * es]);
        for k in 1..n {
            let dest = (me + k) % n;
            let src = (me + n - k) % n;
            let out = (!sb[dest].is_empty()).then(|| (dest, &s[sb[dest].start * es..sb[dest].end * es]));
            let b = &rb[src];
            let inn = (!b.is_empty()).then(|| (src, &mut r[b.start * es..b.end * es]));
            let step = self.v_step(tag, out, inn);
            self.settle(step)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_out_of_bounds_and_overlaps_are_rejected() {
        assert!(block("d", 0, 0, 3, 2, 5).is_ok());
        assert!(block("d", 0, 0, 3, 3, 5).is_err());
        assert!(block("d", 0, 0, 1, usize::MAX, 5).is_err());
        let check = |v: &[Range<usize>]| disjoint("d", 0, v.len(), |i| v[i].clone());
        assert!(check(&[0..3, 3..5]).is_ok());
        assert!(check(&[0..3, 2..5]).is_err());
        assert!(check(&[2..2, 0..5]).is_ok(), "an empty block overlaps nothing");
        assert!(check(&[4..9, 0..2, 9..9, 2..4]).is_ok());
        let e = check(&[4..9, 0..2, 8..10]).unwrap_err().to_string();
        assert!(e.contains("receive blocks 0 (4..9) and 2 (8..10) overlap"), "{e}");
    }

    #[test]
    fn many_blocks_are_checked_by_sorting_with_the_same_verdicts() {
        // Beyond PAIRWISE_MAX blocks: reverse order, one empty block inside another, then one
        // overlap far apart in rank order.
        let n = PAIRWISE_MAX + 8;
        let mut v: Vec<Range<usize>> = (0..n).map(|i| (n - 1 - i) * 10..(n - 1 - i) * 10 + 10).collect();
        v[5] = 73..73;
        assert!(disjoint("d", 0, n, |i| v[i].clone()).is_ok());
        v[n - 1] = 395..401;
        let e = disjoint("d", 0, n, |i| v[i].clone()).unwrap_err().to_string();
        assert!(e.contains("overlap") && e.contains(&format!("{}", n - 1)), "{e}");
    }

    #[test]
    fn counts_views_read_rows_and_columns_in_place() {
        let m = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(Counts::row(&m, 3, 1).to_vec(), vec![4, 5, 6]);
        assert_eq!(Counts::column(&m, 3, 2).to_vec(), vec![3, 6, 9]);
        assert_eq!(Counts::column(&m[..8], 3, 2).to_vec(), Vec::<usize>::new(), "not a 3 x 3 matrix");
    }

    #[test]
    fn table_hash_tells_tables_apart() {
        assert_eq!(table_hash(&[1, 2, 3]), table_hash(&[1, 2, 3]));
        assert_ne!(table_hash(&[1, 2, 3]), table_hash(&[1, 3, 2]));
    }
}
