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
//!
//! The v-collectives (gatherv, all_gatherv, scatterv, all_to_allv) use the same steps, their
//! first step fused with the runtime's agreement (module `vcoll`). Every copy into or out of
//! the segment goes through `copy_bytes`, which avoids a slow case of memcpy on AMD CPUs.

use crate::shm_sync::{arrive, reached, wait_until, Consumer, Producer, RingMemory};
use crate::HostConfig;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use sucl_core::backend::{Backend, CollDesc, CollOp, VAgreement, VCollDesc};
use sucl_core::chunk::{block_range, bytes};
use sucl_core::dtype::{finish_reduce, reduce_bytes, reduce_bytes_into};
use sucl_core::engine::{Channel, Engine};
use sucl_core::store::StoreClient;
use sucl_core::wait::Waiter;
use sucl_core::{AbortState, Error, ReduceOp, Result};

mod vcoll;

const MAGIC: u64 = 0x5355_434c_5348_4d32; // "SUCLSHM2"
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
/// What rank 0 stores instead of the segment's path when it could not create it.
const FAILED: &str = "failed: ";

/// A mapped shared-memory segment: the only way to its bytes. Words are handed out as
/// `&AtomicU64` (shared mutation is what atomics are for); bytes are copied in and out, or lent
/// as slices whose lifetime is bounded by a borrow of the segment and whose exclusivity the
/// caller vouches for (`unsafe`, with the step protocol of the module documentation as reason).
/// Every access is bounds-checked against the mapping.
struct Segment {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is process-wide memory valid until drop; all access to it goes through the
// methods below, whose contracts (atomics, or the step/ring protocols) order it across threads
// and processes alike.
unsafe impl Send for Segment {}
// SAFETY: as for Send: `&Segment` only offers atomics and protocol-guarded copies.
unsafe impl Sync for Segment {}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: base/len describe a mapping we created and nobody uses after drop (every
        // borrow of the segment has ended).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// Copies of at most this many bytes never take the slow path of [`copy_raw`] (glibc's memcpy
/// moves them with vector instructions whatever the addresses).
const ALIAS_SAFE_BYTES: usize = 2048;

/// Copies `len` bytes from `src` to `dst`, around a trap of glibc's memcpy on AMD Zen: from a few
/// KiB up to a few hundred KiB it uses `rep movsb`, which runs 15–25× slower (2–3 GB/s instead
/// of ~50, measured on this project's EPYC VMs) when the destination lies 1–31 bytes past the
/// source modulo 4 KiB (the CPU takes the stores for aliases of the loads). Which distance a copy
/// gets depends on where the user's buffer happens to lie against the shared segment, so every
/// copy into or out of shared memory goes through here: near that distance (1–63 bytes, with a
/// margin) it copies in [`ALIAS_SAFE_BYTES`] pieces, which are as fast as the best case.
///
/// # Safety
/// As [`std::ptr::copy_nonoverlapping`]: both ranges valid for `len` bytes, not overlapping.
#[inline]
unsafe fn copy_raw(dst: *mut u8, src: *const u8, len: usize) {
    let ahead = (dst as usize).wrapping_sub(src as usize) % 4096;
    if len <= ALIAS_SAFE_BYTES || !(1..64).contains(&ahead) {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    let mut done = 0;
    while done < len {
        let k = ALIAS_SAFE_BYTES.min(len - done);
        // SAFETY: done + k <= len, so both pieces lie in the caller's ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), k) };
        done += k;
    }
}

/// [`copy_raw`] between slices of equal length (panics otherwise, like `copy_from_slice`).
#[inline]
pub(crate) fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy between slices of different lengths");
    // SAFETY: both slices are valid for their (equal) length, and a `&mut` slice never overlaps
    // a `&` one.
    unsafe { copy_raw(dst.as_mut_ptr(), src.as_ptr(), src.len()) }
}

/// Free bytes of the filesystem holding `f` (for the unprivileged user).
fn free_bytes(f: &File) -> io::Result<u64> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `f` is an open descriptor; `st` is a writable statvfs the call fills.
    if unsafe { libc::fstatvfs(f.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatvfs succeeded, so it initialized `st`.
    let st = unsafe { st.assume_init() };
    // The field types differ between targets (u32 or u64): widen where needed.
    #[allow(clippy::useless_conversion)]
    let (blocks, size) = (u64::from(st.f_bavail), u64::from(st.f_frsize));
    Ok(blocks.saturating_mul(size))
}

impl Segment {
    /// Creates the file `path` (which must not exist), reserves all `len` bytes of it — a full
    /// filesystem is an error here, not a SIGBUS at first touch — and maps it.
    fn create(path: &Path, len: usize, rank: usize) -> Result<Segment> {
        let io = |what: &str| {
            let what = format!("shm setup: {what} {}", path.display());
            move |e: io::Error| Error::io(rank, what, e)
        };
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(io("creating the segment"))?;
        let reserved = Self::reserve(&f, path, len, rank);
        let mapped = reserved.and_then(|()| Self::map(&f, len).map_err(io("mapping the segment")));
        if mapped.is_err() {
            let _ = std::fs::remove_file(path);
        }
        mapped
    }

    /// Allocates every page of the segment's file up front.
    fn reserve(f: &File, path: &Path, len: usize, rank: usize) -> Result<()> {
        let dir = path.parent().unwrap_or(Path::new("/")).display().to_string();
        let full = |free: u64| {
            Error::io(
                rank,
                format!(
                    "shm setup: the shared-memory segment needs {len} bytes but {dir} has only {free} bytes free \
                     (point SUCL_SHM_DIR at a larger tmpfs, or lower SUCL_SHM_ARENA_BYTES / SUCL_SHM_RING_BYTES)"
                ),
                io::Error::from_raw_os_error(libc::ENOSPC),
            )
        };
        let free = free_bytes(f).map_err(|e| Error::io(rank, format!("shm setup: free space of {dir}"), e))?;
        if free < len as u64 {
            // Checked first so that a hopeless reservation does not fill the filesystem meanwhile.
            return Err(full(free));
        }
        let len_off = libc::off_t::try_from(len).map_err(|_| full(free))?;
        // SAFETY: plain call on an open descriptor; it returns an error number, touching no memory.
        match unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, len_off) } {
            0 => Ok(()),
            libc::ENOSPC | libc::EFBIG => Err(full(free_bytes(f).unwrap_or(0))),
            e => Err(Error::io(rank, format!("shm setup: reserving {len} bytes in {dir}"), io::Error::from_raw_os_error(e))),
        }
    }

    /// Opens the segment another rank created, mapping all of it.
    fn open(path: &Path) -> io::Result<Segment> {
        let f = OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
        let len = usize::try_from(f.metadata()?.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "segment too large"))?;
        if len < HEADER_BYTES {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("segment of {len} bytes has no room for its header")));
        }
        Self::map(&f, len)
    }

    fn map(f: &File, len: usize) -> io::Result<Segment> {
        // SAFETY: a fresh shared mapping of an open file descriptor; failure is checked. The
        // descriptor may be closed afterwards: the mapping keeps the file alive.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Segment { base: p as *mut u8, len })
    }

    /// The address of bytes `off..off + len`, which must lie inside the mapping.
    #[inline(always)]
    fn ptr(&self, off: usize, len: usize) -> *mut u8 {
        assert!(off <= self.len && len <= self.len - off, "shared-memory access {off}+{len} outside a {}-byte segment", self.len);
        // SAFETY: off <= self.len (checked), so the result lies in the mapping or one past it.
        unsafe { self.base.add(off) }
    }

    /// The 64-bit word at `off` (a multiple of 8).
    #[inline(always)]
    fn atomic(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8), "unaligned shared-memory word at {off}");
        let p = self.ptr(off, 8);
        // SAFETY: p is inside the mapping (checked) and 8-byte aligned (the mapping is page
        // aligned, off is a multiple of 8); the mapping outlives `&self`. An AtomicU64 may be
        // read and written concurrently by any party, here or in other processes.
        unsafe { &*(p as *const AtomicU64) }
    }

    /// Copies `src` into the segment at `off`.
    ///
    /// # Safety
    /// Nobody (in any process) reads or writes `off..off + src.len()` during the copy.
    #[inline(always)]
    unsafe fn write(&self, off: usize, src: &[u8]) {
        let p = self.ptr(off, src.len());
        // SAFETY: the range is in the mapping (checked) and, per the caller, ours alone; `src` is
        // private memory, so the two do not overlap.
        unsafe { copy_raw(p, src.as_ptr(), src.len()) };
    }

    /// Copies the segment's bytes at `off` into `dst`.
    ///
    /// # Safety
    /// Nobody (in any process) writes `off..off + dst.len()` during the copy.
    #[inline(always)]
    unsafe fn read(&self, off: usize, dst: &mut [u8]) {
        let p = self.ptr(off, dst.len());
        // SAFETY: the range is in the mapping (checked) and, per the caller, not written
        // meanwhile; `dst` is private memory, so the two do not overlap.
        unsafe { copy_raw(dst.as_mut_ptr(), p, dst.len()) };
    }

    /// Bytes `off..off + len`, shared, for as long as the segment is borrowed.
    ///
    /// # Safety
    /// Nobody (in any process) writes the range while the slice lives.
    #[inline(always)]
    unsafe fn bytes(&self, off: usize, len: usize) -> &[u8] {
        // SAFETY: in the mapping (checked), which outlives the borrow; not written meanwhile
        // (the caller's contract).
        unsafe { std::slice::from_raw_parts(self.ptr(off, len), len) }
    }

    /// Bytes `off..off + len`, exclusive, for as long as the segment is borrowed.
    ///
    /// # Safety
    /// Nobody else (in any process, this one included) reads or writes the range while the
    /// slice lives.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes_mut(&self, off: usize, len: usize) -> &mut [u8] {
        // SAFETY: in the mapping (checked), which outlives the borrow; exclusive (the caller's
        // contract), so no other reference to these bytes exists while this one lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(off, len), len) }
    }
}

/// Bytes between the starts of consecutive arena halves beyond the half itself, so that halves
/// and ranks do not share cache sets (4 KiB aliasing slows copies between aligned buffers).
const SKEW: usize = 64 * 17;
/// From this many ranks, large reductions step by at least [`WIDE_REDUCTION_STEP`].
const WIDE_RANKS: usize = 16;
/// The least step of a large reduction at [`WIDE_RANKS`] ranks or more.
const WIDE_REDUCTION_STEP: usize = 1 << 20;

/// The settings a segment's layout and protocol depend on: rank 0 writes them into the header
/// and every other rank must have the same (or setup fails with `Mismatch` naming the key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SegmentSettings {
    ranks: u64,
    ring_bytes: u64,
    arena_bytes: u64,
    small_bytes: u64,
    chunk_bytes: u64,
}

impl SegmentSettings {
    fn of(cfg: &HostConfig, ranks: usize) -> Self {
        SegmentSettings {
            ranks: ranks as u64,
            ring_bytes: cfg.shm_ring_bytes as u64,
            arena_bytes: cfg.shm_arena_bytes as u64,
            small_bytes: cfg.shm_small_bytes as u64,
            chunk_bytes: cfg.shm_chunk_bytes as u64,
        }
    }

    fn words(&self) -> [(&'static str, u64); 5] {
        [
            ("communicator size", self.ranks),
            ("shm.ring_bytes", self.ring_bytes),
            ("shm.arena_bytes", self.arena_bytes),
            ("shm.small_bytes", self.small_bytes),
            ("shm.chunk_bytes", self.chunk_bytes),
        ]
    }

    /// Header words 1.. hold the settings; word 0 the magic, stored last (release).
    fn write(&self, seg: &Segment) {
        for (i, (_, v)) in self.words().iter().enumerate() {
            seg.atomic(8 * (i + 1)).store(*v, Ordering::Relaxed);
        }
        seg.atomic(0).store(MAGIC, Ordering::Release);
    }

    fn read(seg: &Segment) -> Option<Self> {
        if seg.atomic(0).load(Ordering::Acquire) != MAGIC {
            return None;
        }
        let w = |i: usize| seg.atomic(8 * i).load(Ordering::Relaxed);
        Some(SegmentSettings { ranks: w(1), ring_bytes: w(2), arena_bytes: w(3), small_bytes: w(4), chunk_bytes: w(5) })
    }

    /// The first setting that differs from rank 0's: (key, rank 0's value, ours).
    fn differs_from(&self, rank0: &SegmentSettings) -> Option<(&'static str, u64, u64)> {
        self.words().iter().zip(rank0.words()).find(|(a, b)| a.1 != b.1).map(|(mine, theirs)| (mine.0, theirs.1, mine.1))
    }

    fn layout(&self) -> Layout {
        Layout {
            n: self.ranks as usize,
            ring: (self.ring_bytes as usize).next_power_of_two().max(4096),
            half: ((self.arena_bytes as usize).max(8192) / 2) & !127,
        }
    }
}

#[derive(Clone, Copy)]
struct Layout {
    n: usize,
    ring: usize,
    /// Usable bytes of one arena half.
    half: usize,
}

impl Layout {
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

/// The ranks' control blocks (barrier counter, two mailboxes each): the part of the segment
/// every collective touches. Its bounds are checked once, when it is made; an access then checks
/// only the rank index, parity and payload length against the layout, which keeps it inside.
struct Controls {
    seg: Arc<Segment>,
    n: usize,
}

impl Controls {
    /// The control blocks of `n` ranks; panics unless the segment holds all of them.
    fn new(seg: Arc<Segment>, n: usize) -> Controls {
        let end = n.checked_mul(CTL_BYTES).and_then(|b| b.checked_add(HEADER_BYTES));
        assert!(end.is_some_and(|e| e <= seg.len), "a {}-byte segment has no room for {n} control blocks", seg.len);
        Controls { seg, n }
    }

    /// The address of byte `at` (< CTL_BYTES) of rank `r`'s block.
    #[inline(always)]
    fn at(&self, r: usize, at: usize) -> *mut u8 {
        assert!(r < self.n && at < CTL_BYTES, "control block access {r}/{at} outside {} blocks", self.n);
        // SAFETY: r < n and at < CTL_BYTES (checked), and `new` checked that the n blocks lie in
        // the mapping, so the address is inside it.
        unsafe { self.seg.base.add(HEADER_BYTES + r * CTL_BYTES + at) }
    }

    /// Rank `r`'s barrier counter.
    #[inline(always)]
    fn counter(&self, r: usize) -> &AtomicU64 {
        // SAFETY: inside the mapping (`at`), 8-byte aligned (the mapping is page aligned, the
        // offset a multiple of 8), valid while `self` is borrowed; atomics may be shared.
        unsafe { &*(self.at(r, 0) as *const AtomicU64) }
    }

    /// Rank `r`'s mailbox `h` (0 or 1): its sequence word, then the two words of its descriptor.
    #[inline(always)]
    fn mailbox(&self, r: usize, h: usize) -> &[AtomicU64; 3] {
        assert!(h < 2);
        // SAFETY: as for `counter`; the three words end well before the block does.
        unsafe { &*(self.at(r, 128 + h * MAILBOX_BYTES) as *const [AtomicU64; 3]) }
    }

    /// The payload area of rank `r`'s mailbox `h`, whose first `len` (at most [`INLINE_MAX`])
    /// bytes lie inside the block: 128 + 2 × MAILBOX_BYTES = CTL_BYTES, MAILBOX_DATA + INLINE_MAX
    /// = MAILBOX_BYTES.
    #[inline(always)]
    fn payload(&self, r: usize, h: usize, len: usize) -> *mut u8 {
        assert!(h < 2 && len <= INLINE_MAX);
        self.at(r, 128 + h * MAILBOX_BYTES + MAILBOX_DATA)
    }
}

/// One ring of the segment (`ctl`: its control block; head and tail on their own cache lines,
/// data after [`RING_CTL_BYTES`]).
struct SegmentRing {
    seg: Arc<Segment>,
    ctl: usize,
    cap: usize,
}

impl RingMemory for SegmentRing {
    type W = AtomicU64;
    #[inline(always)]
    fn head(&self) -> &AtomicU64 {
        self.seg.atomic(self.ctl)
    }
    #[inline(always)]
    fn tail(&self) -> &AtomicU64 {
        self.seg.atomic(self.ctl + 128)
    }
    #[inline(always)]
    fn capacity(&self) -> usize {
        self.cap
    }
    #[inline(always)]
    unsafe fn put(&self, pos: usize, src: &[u8]) {
        debug_assert!(pos + src.len() <= self.cap);
        // SAFETY: the range is free ring space, ours alone (RingMemory::put's contract).
        unsafe { self.seg.write(self.ctl + RING_CTL_BYTES + pos, src) }
    }
    #[inline(always)]
    unsafe fn get(&self, pos: usize, dst: &mut [u8]) {
        debug_assert!(pos + dst.len() <= self.cap);
        // SAFETY: the range is published and not yet handed back (RingMemory::get's contract).
        unsafe { self.seg.read(self.ctl + RING_CTL_BYTES + pos, dst) }
    }
}

/// One direction of a ring pair, as an engine channel.
struct RingChannel {
    out: Producer<SegmentRing>,
    inp: Consumer<SegmentRing>,
}

impl Channel for RingChannel {
    fn try_write(&mut self, parts: &[&[u8]]) -> io::Result<usize> {
        Ok(self.out.try_write(parts))
    }

    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Ok(self.inp.try_read(buf))
    }
}

/// The shared-memory backend of one communicator.
pub struct ShmBackend {
    seg: Arc<Segment>,
    ctl: Controls,
    lay: Layout,
    rank: usize,
    world_rank: usize,
    engine: Engine,
    abort: Arc<AbortState>,
    cfg: HostConfig,
    barrier_seq: u64,
    step: u64,
    /// The v-collectives' plan, kept between calls so that planning does not allocate.
    vplan: vcoll::VPlan,
}

impl ShmBackend {
    /// Creates (rank 0) or opens the job's segment, a file named `segment_name` in the
    /// configured directory (`HostConfig::shm_dir`), through the store under `prefix`. Every
    /// rank of `world_ranks` must be on this host, and all must have the same shm settings
    /// (otherwise every rank fails with [`Error::Mismatch`], the differing rank naming the key).
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
        let settings = SegmentSettings::of(cfg, n);
        let lay = settings.layout();
        let key = format!("{prefix}/shm");
        let (seg, path) = if rank == 0 {
            let path = Path::new(&cfg.shm_dir).join(segment_name.trim_start_matches('/'));
            let seg = match Segment::create(&path, lay.total(), wr) {
                Ok(s) => s,
                Err(e) => {
                    // The others would otherwise wait for the path until their timeout.
                    let _ = store.set(&key, format!("{FAILED}{e}").as_bytes());
                    return Err(e);
                }
            };
            settings.write(&seg);
            if let Err(e) = store.set(&key, path.as_os_str().as_encoded_bytes()) {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
            (Ok(seg), path)
        } else {
            let v = store.get(&key)?;
            let v = String::from_utf8_lossy(&v).into_owned();
            if let Some(why) = v.strip_prefix(FAILED) {
                return Err(Error::BackendUnavailable {
                    rank: wr,
                    backend: "shm".into(),
                    why: format!("rank 0 could not set up the shared-memory segment: {why}"),
                });
            }
            let path = PathBuf::from(v);
            let seg = Segment::open(&path)
                .map_err(|e| Error::io(wr, format!("shm setup: opening the segment {}", path.display()), e))
                .and_then(|s| Self::check_settings(&s, &settings, lay.total(), wr).map(|()| s));
            (seg, path)
        };
        // Everyone reports before the barrier, so that a rank whose settings differ fails every
        // rank at once rather than leaving the others to time out later.
        let bad_key = format!("{prefix}/shm-bad");
        if seg.is_err() {
            store.add(&bad_key, 1)?;
        }
        let barrier = store.barrier(&format!("{prefix}/shm-mapped"), n);
        if rank == 0 {
            // Everyone mapped it (or setup failed): the name is no longer needed.
            let _ = std::fs::remove_file(&path);
        }
        barrier?;
        let seg = Arc::new(seg?);
        let bad = store.add(&bad_key, 0)?;
        if bad > 0 {
            return Err(Error::Mismatch {
                rank: wr,
                what: format!("the shared-memory settings ({bad} rank(s) differ from rank 0; their errors name the setting)"),
            });
        }
        let ring = |from: usize, to: usize| SegmentRing { seg: seg.clone(), ctl: lay.ring(from, to), cap: lay.ring };
        let channels = (0..n)
            .map(|j| {
                (j != rank).then(|| {
                    Box::new(RingChannel { out: Producer::new(ring(rank, j)), inp: Consumer::new(ring(j, rank)) }) as Box<dyn Channel>
                })
            })
            .collect();
        let engine = Engine::new(rank, channels, world_ranks, abort.clone(), cfg.engine());
        let ctl = Controls::new(seg.clone(), n);
        Ok(ShmBackend {
            seg,
            ctl,
            lay,
            rank,
            world_rank: wr,
            engine,
            abort,
            cfg: cfg.clone(),
            barrier_seq: 0,
            step: 0,
            vplan: Default::default(),
        })
    }

    /// A rank other than 0: its settings must be the ones rank 0 wrote into the header, and the
    /// segment as large as they imply.
    fn check_settings(seg: &Segment, mine: &SegmentSettings, total: usize, wr: usize) -> Result<()> {
        let Some(rank0) = SegmentSettings::read(seg) else {
            return Err(Error::Mismatch { rank: wr, what: "the shared-memory segment format (different sucl versions?)".into() });
        };
        if let Some((key, theirs, ours)) = mine.differs_from(&rank0) {
            return Err(Error::Mismatch { rank: wr, what: format!("shm setting {key}: rank 0 has {theirs}, rank {wr} has {ours}") });
        }
        if seg.len != total {
            return Err(Error::Mismatch {
                rank: wr,
                what: format!("the shared-memory segment's size: {} bytes, but this rank's settings need {total}", seg.len),
            });
        }
        Ok(())
    }

    /// Offset of arena half `h` of rank `r`.
    #[inline(always)]
    fn half(&self, r: usize, h: usize) -> usize {
        self.lay.half(r, h)
    }

    fn half_bytes(&self) -> usize {
        self.lay.half
    }

    /// Bytes one step of a large gather or all_gather publishes per rank: at most a half, and no
    /// more than
    /// `shm_chunk_bytes` (a multiple of `es`), so what a rank publishes is still in cache when
    /// its peers read it, and the next step's copy-in (into the other half) overlaps their
    /// reads. (Broadcast keeps whole halves: its readers copy one block each, and smaller
    /// steps only add barriers the root waits at.) The same on every rank: the layout and
    /// `shm_chunk_bytes` are rank 0's.
    fn step_bytes(&self, es: usize) -> usize {
        ((self.half_bytes().min(self.cfg.shm_chunk_bytes.max(4096)) / es) * es).max(es)
    }

    /// Bytes one step of a large reduction covers: [`ShmBackend::step_bytes`], but from
    /// [`WIDE_RANKS`] ranks up at least [`WIDE_REDUCTION_STEP`] (within a half). Each rank reduces
    /// the step's bytes over the rank count, so 256 KiB steps leave 16 KiB portions at 16 ranks:
    /// measured on 32 CPUs at 16 ranks, 1 MiB steps took 0.81–0.94 × the time of 256 KiB ones
    /// from 512 KiB to 4 MiB (0.67 × Open MPI vader's at 1 MiB, where 256 KiB steps took
    /// 0.78–1.04 × in five measurements). The same on every rank: the layout and settings are rank 0's.
    fn reduction_step_bytes(&self, es: usize) -> usize {
        let step = self.step_bytes(es);
        if self.lay.n < WIDE_RANKS {
            return step;
        }
        step.max(((self.half_bytes().min(WIDE_REDUCTION_STEP) / es) * es).max(es))
    }

    /// [`ShmBackend::barrier`]'s wait once peer `j` is not there yet: spin, yield, sleep, time
    /// out — progressing this communicator's posted sends and receives meanwhile (a peer may
    /// need one of them to move before it can arrive: say it waits for a large message of ours
    /// that only our progress pushes through the ring).
    #[inline(never)]
    fn wait_slow(&mut self, j: usize, word: impl Fn(&Controls) -> &AtomicU64, seq: u64, op: &'static str, place: &str) -> Result<()> {
        let mut w = Waiter::new(self.cfg.timeout, self.cfg.backoff);
        let peer = self.engine.world_rank(j);
        let (engine, abort, rank) = (&mut self.engine, &self.abort, self.world_rank);
        let mut rounds = 0u32;
        wait_until(word(&self.ctl), seq, || {
            // Every 64th round: the first rounds of a wait are a spin for a peer that is about
            // to arrive, and a look at every channel there would add to a small collective.
            rounds = rounds.wrapping_add(1);
            if rounds.is_multiple_of(64) && engine.has_pending() {
                engine.progress()?;
            }
            w.pause(abort, rank, &|| format!("{op} (waiting for rank {peer} {place})"), false).inspect_err(|e| {
                if matches!(e, Error::Timeout { .. }) {
                    abort.raise(e.abort_info());
                }
            })
        })
    }

    #[inline]
    fn barrier(&mut self, op: &'static str) -> Result<()> {
        self.barrier_seq += 1;
        let seq = self.barrier_seq;
        arrive(self.ctl.counter(self.rank), seq);
        let (n, me) = (self.lay.n, self.rank);
        for j in (0..n).filter(|&j| j != me) {
            if !reached(self.ctl.counter(j), seq) {
                self.wait_slow(j, |c| c.counter(j), seq, op, "at a shared-memory barrier")?;
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
            let m = self.ctl.mailbox(self.rank, h);
            m[1].store(w[0], Ordering::Relaxed);
            m[2].store(w[1], Ordering::Relaxed);
            arrive(&m[0], self.barrier_seq + 1);
        }
        h
    }

    /// One step whose payload (`data`, at most [`INLINE_MAX`] bytes) travels in the mailbox:
    /// publish, then wait until every peer published the same step and check that every
    /// descriptor equals ours. Returns the parity.
    #[inline(always)]
    fn inline_step(&mut self, d: &CollDesc, data: Option<&[u8]>) -> Result<usize> {
        let w = d.encode();
        let h = self.begin_inline(w);
        if let Some(data) = data {
            self.write_inline(h, 0, data);
        }
        // Any difference sends us to `check_descs`, which names it the same way on every rank.
        if self.end_inline(h, w, d.op.name())? {
            self.check_descs(d, h)?;
        }
        Ok(h)
    }

    /// Opens a step whose payload travels in the mailbox: stores the descriptor words `w` in
    /// this rank's mailbox of the step's parity (returned); the payload is written next
    /// ([`ShmBackend::write_inline`]), then [`ShmBackend::end_inline`] publishes both.
    #[inline(always)]
    fn begin_inline(&mut self, w: [u64; 2]) -> usize {
        self.step += 1;
        let h = (self.step % 2) as usize;
        self.barrier_seq += 1;
        let mine = self.ctl.mailbox(self.rank, h);
        mine[1].store(w[0], Ordering::Relaxed);
        mine[2].store(w[1], Ordering::Relaxed);
        h
    }

    /// Copies `src` to byte `at` of this rank's mailbox payload `h`, between
    /// [`ShmBackend::begin_inline`] and [`ShmBackend::end_inline`].
    #[inline(always)]
    fn write_inline(&self, h: usize, at: usize, src: &[u8]) {
        assert!(at <= INLINE_MAX && src.len() <= INLINE_MAX - at, "inline payload {at}+{} past {INLINE_MAX}", src.len());
        let p = self.ctl.payload(self.rank, h, at + src.len());
        // SAFETY: p + at .. p + at + src.len() is in the mapping (`payload` checked the whole
        // length) and ours to write now: peers read mailbox h only after seeing its sequence
        // word reach this step's number (released by `end_inline`), and finished reading what
        // it held two steps ago before arriving at the previous step, which we passed. `src`
        // is private memory: no overlap.
        unsafe { copy_raw(p.add(at), src.as_ptr(), src.len()) };
    }

    /// Closes an inline step: publishes this rank's mailbox and waits until every peer
    /// published the same step. Returns whether any peer's descriptor words differ from `w`.
    #[inline(always)]
    fn end_inline(&mut self, h: usize, w: [u64; 2], op: &'static str) -> Result<bool> {
        let seq = self.barrier_seq;
        arrive(&self.ctl.mailbox(self.rank, h)[0], seq);
        arrive(self.ctl.counter(self.rank), seq);
        // Every peer first, its wait written out here rather than through `wait_for`, then every
        // descriptor in one pass (each read after its sequence word was acquired). Measured on
        // 32 CPUs in four calls of 8 rounds: this form ran 8–32 B all_reduce at 0.91–1.10 × the
        // time of d651309 at 16 ranks, where `wait_for` with the descriptor read inside the
        // loop ran 1.10–1.19 ×, and `wait_for` (inlined or not) in this two-pass shape 0.97–1.19 ×.
        let (n, me) = (self.lay.n, self.rank);
        for j in (0..n).filter(|&j| j != me) {
            let a = &self.ctl.mailbox(j, h)[0];
            if reached(a, seq) {
                continue;
            }
            let mut wt = Waiter::new(self.cfg.timeout, self.cfg.backoff);
            let mut rounds = 0u32;
            while !reached(a, seq) {
                // As in `wait_slow`: posted messages move while a peer is awaited, every 64th
                // round (the wait stays written out here: see the measurement above).
                rounds = rounds.wrapping_add(1);
                if rounds.is_multiple_of(64) && self.engine.has_pending() {
                    self.engine.progress()?;
                }
                let (wr, peer) = (self.world_rank, self.engine.world_rank(j));
                if let Err(e) = wt.pause(&self.abort, wr, &|| format!("{op} (waiting for rank {peer} in shared memory)"), false) {
                    if matches!(e, Error::Timeout { .. }) {
                        self.abort.raise(e.abort_info());
                    }
                    return Err(e);
                }
            }
        }
        let mut differs = 0;
        for j in 0..self.lay.n {
            let m = self.ctl.mailbox(j, h);
            differs |= (m[1].load(Ordering::Relaxed) ^ w[0]) | (m[2].load(Ordering::Relaxed) ^ w[1]);
        }
        Ok(differs != 0)
    }

    /// Rank `r`'s inline payload of the current step (parity `h`), as published.
    #[inline(always)]
    fn inline_data(&self, r: usize, h: usize, len: usize) -> &[u8] {
        self.inline_at(r, h, 0, len)
    }

    /// Bytes `at..at + len` of rank `r`'s inline payload of the current step (parity `h`).
    #[inline(always)]
    fn inline_at(&self, r: usize, h: usize, at: usize, len: usize) -> &[u8] {
        assert!(at <= INLINE_MAX && len <= INLINE_MAX - at, "inline payload {at}+{len} past {INLINE_MAX}");
        // SAFETY: every rank published its mailbox h for this step (end_inline waited for it),
        // and none writes it again before passing the next step, which needs us there first;
        // the borrow of `self` ends before we can take that step (it needs `&mut self`). The
        // bytes lie in the mapping (`payload` checked at + len), which outlives `self`.
        unsafe { std::slice::from_raw_parts(self.ctl.payload(r, h, at + len).add(at), len) }
    }

    /// After the step's first barrier: every rank's descriptor must equal ours.
    #[inline(never)]
    fn check_descs(&self, desc: &CollDesc, h: usize) -> Result<()> {
        let mine = desc.encode();
        for j in 0..self.lay.n {
            let m = self.ctl.mailbox(j, h);
            let theirs = [m[1].load(Ordering::Relaxed), m[2].load(Ordering::Relaxed)];
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

    /// Copies `src` into this rank's half `h` at `at`, in a step's write phase.
    #[inline(always)]
    fn publish(&self, h: usize, at: usize, src: &[u8]) {
        assert!(at + src.len() <= self.lay.half);
        // SAFETY (step protocol): before the step's barrier our half h is ours alone — peers read
        // it only after that barrier (or, in a v-collective's first step, after seeing our
        // mailbox's sequence word, raised after this copy), and finished reading it two steps
        // ago before arriving at the previous step's barrier, which we passed.
        unsafe { self.seg.write(self.half(self.rank, h) + at, src) }
    }

    /// Rank `r`'s half `h` from `at` on, in a step's read phase.
    #[inline(always)]
    fn peek(&self, r: usize, h: usize, at: usize, len: usize) -> &[u8] {
        assert!(at + len <= self.lay.half);
        // SAFETY (step protocol): after the step's barrier nobody writes half h of any rank until
        // every rank arrived at the next step's barrier — which needs us, and `&mut self`, so
        // this borrow has ended by then. (Large reductions' middle phase writes only each rank's
        // own portion, which it never reads through here.)
        unsafe { self.seg.bytes(self.half(r, h) + at, len) }
    }

    /// A large reduction's middle phase: `mine` ← our input portion reduced with every peer's
    /// copy of portion `p` of the current chunk, in this rank's half `h`.
    fn reduce_portion(&self, d: &CollDesc, h: usize, p: std::ops::Range<usize>, input: &[u8]) {
        let me = self.rank;
        let mut others = (0..self.lay.n).filter(|&j| j != me);
        let j0 = others.next().expect("n > 1");
        // SAFETY (step protocol, middle phase): portion p of our half is ours alone between the
        // step's two barriers — peers read only their own portions of it now, and ours after the
        // second barrier — and no rank writes portion p of its own half in this phase but us.
        let mine = unsafe { self.seg.bytes_mut(self.half(me, h) + p.start, p.len()) };
        reduce_bytes_into(mine, input, self.peek(j0, h, p.start, p.len()), d.dtype, d.redop);
        for j in others {
            reduce_bytes(mine, self.peek(j, h, p.start, p.len()), d.dtype, d.redop);
        }
    }

    /// Whether a reduction of `len` bytes takes a single-barrier path, where every rank (the root,
    /// for reduce) reads all `n` inputs whole: the fewest steps, but its reads grow with the rank
    /// count. Beyond 1.5 × `shm_small_bytes` read from peers, the two-barrier split (each rank
    /// reduces one portion, then everyone gathers the portions) moves less: at 16 ranks an
    /// 8 KiB all_reduce reads 15 × 8 KiB one way, about 2 × 8 KiB the other. Measured (16 KiB
    /// small size, 16 and 32 CPUs): 16 ranks × 2 KiB and 8 ranks × 4 KiB one-step took 8.3–11.3 µs,
    /// the split at twice the size 5.7–7.5 µs; 4 ranks × 8 KiB one-step 7.3 µs beat the split at
    /// 16 KiB (8.1 µs). The same on every rank: `n` and `shm_small_bytes` are rank 0's.
    #[inline]
    fn one_step_reduction(&self, len: usize) -> bool {
        let peer_reads = len.saturating_mul(self.lay.n - 1);
        len <= self.cfg.shm_small_bytes && peer_reads.saturating_mul(2) <= 3 * self.cfg.shm_small_bytes
    }

    fn collective_inner(&mut self, d: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        let (n, me) = (self.lay.n, self.rank);
        let es = d.dtype.size();
        let hb = self.half_bytes();
        if n == 1 {
            // A communicator of one: every collective is a local copy (or nothing).
            if let (Some(s), false) = (send, matches!(d.op, CollOp::Barrier | CollOp::Broadcast)) {
                copy_bytes(recv, s);
            }
            return Ok(());
        }
        // In place (`send == None`), the input is `recv` itself: each step takes a fresh shared
        // borrow of the input it needs and lets it end before `recv` is written, so input and
        // output are never live at once (the borrow checker holds us to it).
        match d.op {
            CollOp::Barrier => self.inline_step(d, None).map(|_| ()),
            CollOp::AllReduce | CollOp::Reduce => {
                let len = d.count * es;
                let all = d.op == CollOp::AllReduce;
                let root = if all { usize::MAX } else { d.root };
                let one_step = self.one_step_reduction(len);
                if one_step && len <= INLINE_MAX {
                    let h = self.inline_step(d, Some(send.unwrap_or(recv)))?;
                    if all || me == root {
                        reduce_bytes_into(recv, self.inline_data(0, h, len), self.inline_data(1, h, len), d.dtype, d.redop);
                        for j in 2..n {
                            reduce_bytes(recv, self.inline_data(j, h, len), d.dtype, d.redop);
                        }
                    }
                } else if one_step && len <= hb {
                    let h = self.begin_step(Some(d));
                    self.publish(h, 0, send.unwrap_or(recv));
                    self.barrier(d.op.name())?;
                    self.check_descs(d, h)?;
                    if all || me == root {
                        // Same order on every rank: bitwise-identical results everywhere.
                        reduce_bytes_into(recv, self.peek(0, h, 0, len), self.peek(1, h, 0, len), d.dtype, d.redop);
                        for j in 2..n {
                            reduce_bytes(recv, self.peek(j, h, 0, len), d.dtype, d.redop);
                        }
                    }
                } else {
                    // Chunks small enough to stay in cache between the phases.
                    let chunk = self.reduction_step_bytes(es);
                    let mut first = true;
                    let mut off = 0;
                    while off < len {
                        let c = chunk.min(len - off);
                        let h = self.begin_step(first.then_some(d));
                        let p = bytes(block_range(c / es, n, me), es);
                        {
                            // Publish the portions others reduce; ours is read straight from input.
                            let input = &send.unwrap_or(recv)[off..off + c];
                            self.publish(h, 0, &input[..p.start]);
                            self.publish(h, p.end, &input[p.end..]);
                        }
                        self.barrier(d.op.name())?;
                        if first {
                            self.check_descs(d, h)?;
                            first = false;
                        }
                        self.reduce_portion(d, h, p.clone(), &send.unwrap_or(recv)[off + p.start..off + p.end]);
                        self.barrier(d.op.name())?;
                        if all || me == root {
                            for j in 0..n {
                                let pj = bytes(block_range(c / es, n, j), es);
                                copy_bytes(&mut recv[off + pj.start..off + pj.end], self.peek(j, h, pj.start, pj.len()));
                            }
                        }
                        off += c;
                    }
                }
                if (all || me == root) && d.redop == ReduceOp::Avg {
                    finish_reduce(recv, d.dtype, d.redop, n);
                }
                Ok(())
            }
            CollOp::Broadcast if d.count * es <= INLINE_MAX => {
                let len = d.count * es;
                let h = self.inline_step(d, (me == d.root).then_some(&*recv))?;
                if me != d.root {
                    copy_bytes(recv, self.inline_data(d.root, h, len));
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
                        self.publish(h, 0, &recv[off..off + c]);
                    }
                    self.barrier(d.op.name())?;
                    if first {
                        self.check_descs(d, h)?;
                        first = false;
                    }
                    if me != d.root {
                        copy_bytes(&mut recv[off..off + c], self.peek(d.root, h, 0, c));
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
                let step = self.step_bytes(es);
                let mut off = 0;
                let mut first = true;
                loop {
                    let c = step.min(blk - off);
                    let h = self.begin_step(first.then_some(d));
                    let mine = match send {
                        Some(s) => &s[off..off + c],
                        None => &recv[me * blk + off..me * blk + off + c],
                    };
                    self.publish(h, 0, mine);
                    self.barrier(d.op.name())?;
                    if first {
                        self.check_descs(d, h)?;
                        first = false;
                    }
                    if all || me == d.root {
                        for j in 0..n {
                            if j == me && send.is_none() {
                                continue;
                            }
                            copy_bytes(&mut recv[j * blk + off..j * blk + off + c], self.peek(j, h, 0, c));
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
                // reduce_scatter, and scatter and all_to_all between two ranks: each rank's block
                // of a step is one `shm_chunk_bytes` piece (a step publishes n of them, up to a
                // half), still in cache when read. With more ranks, scatter and all_to_all keep
                // a half's share per block: there a step's barrier waits for the slowest of n
                // ranks, and more steps measured slower (2 × H200 host, 8 ranks: 1.04–1.21×).
                let piece = if d.op == CollOp::ReduceScatter || n == 2 { self.cfg.shm_chunk_bytes.max(4096) } else { hb };
                let sub = ((hb.min(piece.saturating_mul(n)) / n) / es).max(1) * es;
                let mut off = 0;
                let mut first = true;
                loop {
                    let c = sub.min(blk - off);
                    let h = self.begin_step(first.then_some(d));
                    if !rooted || me == d.root {
                        let s = send.expect("send buffer");
                        for j in 0..n {
                            self.publish(h, j * c, &s[j * blk + off..j * blk + off + c]);
                        }
                    }
                    self.barrier(d.op.name())?;
                    if first {
                        self.check_descs(d, h)?;
                        first = false;
                    }
                    match d.op {
                        CollOp::Scatter => copy_bytes(&mut recv[off..off + c], self.peek(d.root, h, me * c, c)),
                        CollOp::AllToAll => {
                            for j in 0..n {
                                copy_bytes(&mut recv[j * blk + off..j * blk + off + c], self.peek(j, h, me * c, c));
                            }
                        }
                        _ => {
                            let out = &mut recv[off..off + c];
                            copy_bytes(out, self.peek(0, h, me * c, c));
                            for j in 1..n {
                                reduce_bytes(out, self.peek(j, h, me * c, c), d.dtype, d.redop);
                            }
                        }
                    }
                    off += c;
                    if off >= blk {
                        break;
                    }
                }
                if d.op == CollOp::ReduceScatter && d.redop == ReduceOp::Avg {
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

    fn v_collective_agreeing(
        &mut self,
        agree: VAgreement<'_>,
        desc: Option<&VCollDesc<'_>>,
        send: &[u8],
        recv: &mut [u8],
    ) -> Option<Result<bool>> {
        Some(self.v_agreeing(agree, desc, send, recv))
    }
}

#[cfg(test)]
mod tests {
    //! The ring over a real mapped segment (named `ring_*`: the valgrind run selects them), the
    //! segment's reservation and the settings check.
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A fresh segment of `len` bytes, already unlinked (the mapping keeps it alive).
    fn segment(len: usize) -> Segment {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = PathBuf::from(format!("/dev/shm/sucl-unit-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let seg = Segment::create(&path, len, 0).expect("segment");
        std::fs::remove_file(&path).unwrap();
        seg
    }

    fn ring_pair(cap: usize) -> (Producer<SegmentRing>, Consumer<SegmentRing>) {
        let seg = Arc::new(segment(RING_CTL_BYTES + cap));
        (Producer::new(SegmentRing { seg: seg.clone(), ctl: 0, cap }), Consumer::new(SegmentRing { seg, ctl: 0, cap }))
    }

    fn pattern(len: usize, seed: usize) -> Vec<u8> {
        (0..len).map(|i| ((i * 7 + seed * 13) % 251) as u8).collect()
    }

    #[test]
    fn ring_full_ring_takes_nothing_until_read() {
        let (mut p, mut c) = ring_pair(4096);
        let data = pattern(5000, 1);
        assert_eq!(p.try_write(&[&data[..100], &data[100..]]), 4096, "a write fills the ring, no more");
        assert_eq!(p.try_write(&[&data[4096..]]), 0, "a full ring takes nothing");
        let mut got = vec![0u8; 1000];
        assert_eq!(c.try_read(&mut got), 1000);
        assert_eq!(got, data[..1000]);
        assert_eq!(p.try_write(&[&data[4096..]]), 904, "the space read is free again");
        let mut rest = vec![0u8; 8192];
        assert_eq!(c.try_read(&mut rest), 4000);
        assert_eq!(rest[..4000], data[1000..]);
        assert_eq!(c.try_read(&mut rest), 0, "an empty ring gives nothing");
    }

    #[test]
    fn ring_wraps_around_and_keeps_order() {
        let (mut p, mut c) = ring_pair(4096);
        let mut sent = vec![];
        let mut got = vec![];
        // Odd sizes, so writes and reads straddle the ring's end at ever different offsets.
        for (i, len) in [1usize, 3000, 777, 4096, 2049, 5, 4000, 1234].iter().cycle().take(40).enumerate() {
            let m = pattern(*len, i);
            let (mut off, mut tries) = (0, 0);
            while off < m.len() {
                tries += 1;
                assert!(tries < 10_000, "the ring stalled: {off} of {} bytes written", m.len());
                let mid = off + (m.len() - off) / 3;
                off += p.try_write(&[&m[off..mid], &m[mid..]]);
                let mut buf = vec![0u8; 1 + (i * 997) % 3001];
                let n = c.try_read(&mut buf);
                got.extend_from_slice(&buf[..n]);
            }
            sent.extend_from_slice(&m);
        }
        let mut buf = vec![0u8; 4096];
        loop {
            let n = c.try_read(&mut buf);
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got.len(), sent.len());
        assert!(got == sent, "bytes out of order or corrupted");
    }

    #[test]
    fn ring_streams_between_threads() {
        let (mut p, mut c) = ring_pair(4096);
        let total = 300_000;
        let t = std::thread::spawn(move || {
            let data = pattern(total, 9);
            let mut off = 0;
            while off < total {
                let end = (off + 1500).min(total);
                let n = p.try_write(&[&data[off..end]]);
                if n == 0 {
                    std::thread::yield_now();
                }
                off += n;
            }
        });
        let mut got = Vec::with_capacity(total);
        let mut buf = vec![0u8; 1000];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while got.len() < total {
            assert!(std::time::Instant::now() < deadline, "stream stalled at {} bytes", got.len());
            let n = c.try_read(&mut buf);
            if n == 0 {
                std::thread::yield_now();
            }
            got.extend_from_slice(&buf[..n]);
        }
        t.join().unwrap();
        assert!(got == pattern(total, 9), "bytes out of order or corrupted");
    }

    #[test]
    fn copies_at_every_distance_modulo_4k_move_every_byte() {
        // Source and destination at every offset from 0 to 4095 against each other (the pieces
        // path near 1..63), lengths around the piece size, and a piece that ends short.
        let src = pattern(3 * 4096 + 5000, 3);
        let mut dst = vec![0u8; 3 * 4096 + 5000];
        for ahead in (0..4096).step_by(7).chain(1..64) {
            for len in [0, 1, ALIAS_SAFE_BYTES, ALIAS_SAFE_BYTES + 1, 3 * ALIAS_SAFE_BYTES + 17, 4096 + 3] {
                let s = 100;
                // `dst`'s offset such that the destination lies `ahead` bytes past the source mod 4 KiB.
                let base = (src.as_ptr() as usize + s + ahead).wrapping_sub(dst.as_ptr() as usize) % 4096;
                dst.fill(0);
                copy_bytes(&mut dst[base..base + len], &src[s..s + len]);
                assert_eq!((dst[base..].as_ptr() as usize).wrapping_sub(src[s..].as_ptr() as usize) % 4096, ahead);
                assert!(dst[base..base + len] == src[s..s + len], "{len} bytes at distance {ahead}");
                assert!(dst[..base].iter().chain(&dst[base + len..]).all(|&b| b == 0), "bytes outside the copy written");
            }
        }
    }

    #[test]
    fn control_blocks_are_checked_once_against_the_segment_then_by_rank() {
        let seg = Arc::new(segment(HEADER_BYTES + 2 * CTL_BYTES));
        let ctl = Controls::new(seg.clone(), 2);
        ctl.mailbox(1, 1)[2].store(7, Ordering::Relaxed);
        assert_eq!(seg.atomic(HEADER_BYTES + CTL_BYTES + 128 + MAILBOX_BYTES + 16).load(Ordering::Relaxed), 7);
        let end = ctl.payload(1, 1, INLINE_MAX) as usize + INLINE_MAX;
        assert_eq!(end, seg.base as usize + HEADER_BYTES + 2 * CTL_BYTES, "the last payload ends at the last block's end");
        let refused = |f: Box<dyn FnOnce() + std::panic::UnwindSafe>| std::panic::catch_unwind(f).is_err();
        let s = seg.clone();
        assert!(refused(Box::new(move || drop(Controls::new(s, 3)))), "3 blocks do not fit");
        let c = Controls::new(seg.clone(), 2);
        assert!(
            refused(Box::new(move || {
                c.counter(2);
            })),
            "rank 2 of 2"
        );
        let c = Controls::new(seg.clone(), 2);
        assert!(
            refused(Box::new(move || {
                c.payload(0, 0, INLINE_MAX + 1);
            })),
            "payload longer than a mailbox"
        );
        let c = Controls::new(seg, 2);
        assert!(
            refused(Box::new(move || {
                c.mailbox(0, 2);
            })),
            "parity 2"
        );
    }

    #[test]
    fn segment_too_large_for_its_filesystem_names_bytes_needed_and_free() {
        let dir = "/dev/shm";
        let f = File::open(dir).unwrap();
        let free = free_bytes(&f).unwrap();
        let len = usize::try_from(free).unwrap() + (1 << 30);
        let path = PathBuf::from(format!("{dir}/sucl-unit-big-{}", std::process::id()));
        let e = Segment::create(&path, len, 3).err().expect("a segment larger than the free space must fail").to_string();
        assert!(e.contains(&format!("needs {len} bytes")) && e.contains("bytes free") && e.contains(dir), "{e}");
        assert!(e.starts_with("rank 3:"), "{e}");
        assert!(!path.exists(), "a failed segment must not be left behind");
    }

    #[test]
    fn segment_settings_differing_from_rank_0s_are_a_mismatch_naming_key_and_values() {
        let rank0 = HostConfig::default();
        let s0 = SegmentSettings::of(&rank0, 2);
        let total = s0.layout().total();
        let seg = segment(total);
        s0.write(&seg);
        assert!(ShmBackend::check_settings(&seg, &s0, total, 1).is_ok());
        for (key, cfg, want) in [
            ("shm.small_bytes", HostConfig { shm_small_bytes: 0, ..rank0.clone() }, "rank 0 has 16384, rank 1 has 0"),
            ("shm.ring_bytes", HostConfig { shm_ring_bytes: 1 << 20, ..rank0.clone() }, "rank 0 has 524288, rank 1 has 1048576"),
            ("shm.arena_bytes", HostConfig { shm_arena_bytes: 1 << 16, ..rank0.clone() }, "rank 0 has 8388608, rank 1 has 65536"),
            ("shm.chunk_bytes", HostConfig { shm_chunk_bytes: 8192, ..rank0.clone() }, "rank 0 has 262144, rank 1 has 8192"),
        ] {
            let mine = SegmentSettings::of(&cfg, 2);
            let e = ShmBackend::check_settings(&seg, &mine, mine.layout().total(), 1).unwrap_err();
            assert!(matches!(e, Error::Mismatch { .. }), "{e}");
            assert!(e.to_string().contains(&format!("{key}: {want}")), "{e}");
        }
        let three = SegmentSettings::of(&rank0, 3);
        let e = ShmBackend::check_settings(&seg, &three, three.layout().total(), 1).unwrap_err().to_string();
        assert!(e.contains("communicator size: rank 0 has 2, rank 1 has 3"), "{e}");
    }
}
