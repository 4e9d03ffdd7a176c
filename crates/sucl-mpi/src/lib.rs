//! sucl-mpi: the MPI backend. Host buffers move through the system MPI (Open MPI or MPICH).
//! Collectives are MPI's own blocking ones — the ones MPI tunes; its non-blocking collectives
//! are slower (see [`set_nonblocking_collectives`]) — run on the caller's thread, bounded by a
//! watchdog thread (the `watchdog` module) so that a stuck peer ends the job instead of hanging
//! it. Point-to-point requests are non-blocking, polled under sucl's bounded waits. A small C
//! shim (built with `mpicc`) keeps MPI's handles on the C side, so no bindings generator is
//! needed. Depends only on `sucl-core`.
//!
//! # Buffers are never written after a call returns
//!
//! A collective cannot be interrupted or cancelled once MPI runs it (MPI forbids `MPI_Cancel`
//! on non-blocking collectives, and a blocking one returns only when done). So when a
//! collective overstays — it ran past the timeout, or it is still running [`ABORT_GRACE`] after
//! another rank failed — this backend does not return the buffers to the caller: the watchdog
//! prints the error to stderr and ends the whole job with `MPI_Abort` (exit status
//! [`ABORT_EXIT_CODE`] under Open MPI's `mpirun`) while the call is still inside MPI. A
//! collective that MPI itself fails (it returns an error code) has returned its buffers; the
//! error goes back to the caller and the job's abort flag is raised, so that ranks still waiting
//! in the same collective are ended by their watchdogs. A point-to-point request that is withdrawn
//! (after a timeout or another error) is cancelled with `MPI_Cancel` and then polled until MPI
//! reports it complete (cancelled, or finished after all), for at most [`CANCEL_GRACE`]; only
//! if it does not complete by then is the job aborted the same way.

#![warn(missing_docs)]

#[cfg(not(sucl_mpi_missing))]
use std::ffi::c_longlong;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use sucl_core::backend::{Backend, CollDesc, CollOp, ReqId, VCollDesc, VCollOp};
use sucl_core::dtype::finish_reduce;
use sucl_core::wait::{Backoff, Waiter};
use sucl_core::{AbortState, DType, Error, ReduceOp, Result};

mod meet;
mod watchdog;
pub use meet::meet_over_mpi;
use watchdog::Watch;
pub use watchdog::ABORT_GRACE;

#[cfg(sucl_mpi_missing)]
mod missing {
    //! Stand-ins when no MPI was found at build time: initialization fails with the reason, so
    //! nothing below it is ever reached.
    #![allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
    use std::ffi::{c_char, c_int, c_longlong, c_void};
    pub unsafe fn sucl_mpi_init(_: *mut c_int) -> c_int {
        -1
    }
    pub unsafe fn sucl_mpi_finalize() -> c_int {
        0
    }
    pub unsafe fn sucl_mpi_world(_: *mut c_int, _: *mut c_int) {}
    pub unsafe fn sucl_mpi_tag_ub() -> c_int {
        0
    }
    pub unsafe fn sucl_mpi_error_string(_: c_int, b: *mut c_char, len: c_int) {
        let msg = b"sucl was built without an MPI library (mpicc was not found at build time)\0";
        let n = msg.len().min(len.max(0) as usize);
        if n == 0 {
            return;
        }
        // SAFETY: the caller passes `b` valid for `len` bytes (as the C shim's contract says);
        // at most `len` bytes are written, the last one a NUL.
        std::ptr::copy_nonoverlapping(msg.as_ptr() as *const c_char, b, n);
        *b.add(n - 1) = 0;
    }
    pub unsafe fn sucl_mpi_version(b: *mut c_char, l: c_int) {
        sucl_mpi_error_string(0, b, l)
    }
    pub unsafe fn sucl_mpi_comm_create(_: *const c_int, _: c_int, _: *mut c_int) -> *mut c_void {
        std::ptr::null_mut()
    }
    pub unsafe fn sucl_mpi_comm_free(_: *mut c_void) {}
    pub unsafe fn sucl_mpi_isend(_: *mut c_void, _: *const c_void, _: c_int, _: c_int, _: c_int, _: *mut c_int) -> *mut c_void {
        std::ptr::null_mut()
    }
    pub unsafe fn sucl_mpi_irecv(_: *mut c_void, _: *mut c_void, _: c_int, _: c_int, _: c_int, _: *mut c_int) -> *mut c_void {
        std::ptr::null_mut()
    }
    pub unsafe fn sucl_mpi_test(_: *mut c_void, _: *mut c_int, _: *mut c_longlong) -> c_int {
        -1
    }
    pub unsafe fn sucl_mpi_cancel(_: *mut c_void) -> c_int {
        1
    }
    pub unsafe fn sucl_mpi_abort(_: c_int) {}
    pub unsafe fn sucl_mpi_is_truncation(_: c_int) -> c_int {
        0
    }
    pub unsafe fn sucl_mpi_icoll(
        _: *mut c_void,
        _: c_int,
        _: *const c_void,
        _: *mut c_void,
        _: c_int,
        _: c_int,
        _: c_int,
        _: c_int,
        _: *mut c_int,
    ) -> *mut c_void {
        std::ptr::null_mut()
    }
    pub unsafe fn sucl_mpi_coll(
        _: *mut c_void,
        _: c_int,
        _: *const c_void,
        _: *mut c_void,
        _: c_int,
        _: c_int,
        _: c_int,
        _: c_int,
    ) -> c_int {
        -1
    }
    pub unsafe fn sucl_mpi_coll_world(_: c_int, _: *const c_void, _: *mut c_void, _: c_int, _: c_int, _: c_int, _: c_int) -> c_int {
        -1
    }
}
#[cfg(sucl_mpi_missing)]
use missing::*;

#[cfg(not(sucl_mpi_missing))]
extern "C" {
    fn sucl_mpi_init(multiple: *mut c_int) -> c_int;
    fn sucl_mpi_finalize() -> c_int;
    fn sucl_mpi_world(rank: *mut c_int, size: *mut c_int);
    fn sucl_mpi_tag_ub() -> c_int;
    fn sucl_mpi_error_string(code: c_int, buf: *mut c_char, len: c_int);
    fn sucl_mpi_version(buf: *mut c_char, len: c_int);
    fn sucl_mpi_comm_create(ranks: *const c_int, n: c_int, err: *mut c_int) -> *mut c_void;
    fn sucl_mpi_comm_free(c: *mut c_void);
    fn sucl_mpi_isend(c: *mut c_void, buf: *const c_void, len: c_int, peer: c_int, tag: c_int, err: *mut c_int) -> *mut c_void;
    fn sucl_mpi_irecv(c: *mut c_void, buf: *mut c_void, cap: c_int, peer: c_int, tag: c_int, err: *mut c_int) -> *mut c_void;
    fn sucl_mpi_test(req: *mut c_void, done: *mut c_int, bytes: *mut c_longlong) -> c_int;
    fn sucl_mpi_cancel(req: *mut c_void) -> c_int;
    fn sucl_mpi_abort(code: c_int);
    fn sucl_mpi_is_truncation(code: c_int) -> c_int;
    #[allow(clippy::too_many_arguments)]
    fn sucl_mpi_icoll(
        c: *mut c_void,
        op: c_int,
        send: *const c_void,
        recv: *mut c_void,
        count: c_int,
        dt: c_int,
        redop: c_int,
        root: c_int,
        err: *mut c_int,
    ) -> *mut c_void;
    #[allow(clippy::too_many_arguments)]
    fn sucl_mpi_coll(
        c: *mut c_void,
        op: c_int,
        send: *const c_void,
        recv: *mut c_void,
        count: c_int,
        dt: c_int,
        redop: c_int,
        root: c_int,
    ) -> c_int;
    fn sucl_mpi_coll_world(op: c_int, send: *const c_void, recv: *mut c_void, count: c_int, dt: c_int, redop: c_int, root: c_int) -> c_int;
}

fn text(f: impl FnOnce(*mut c_char, c_int)) -> String {
    let mut buf = [0 as c_char; 512];
    f(buf.as_mut_ptr(), buf.len() as c_int);
    // SAFETY: `f` (a shim call given `buf` and its length) NUL-terminates within `buf`, and
    // `buf` is zeroed beforehand, so a NUL lies inside it even if `f` wrote nothing.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

fn mpi_error(code: c_int) -> String {
    // SAFETY: `b` is valid for `l` bytes (text's buffer) and the shim writes at most `l` bytes,
    // NUL-terminated; MPI_Error_string needs no initialized MPI.
    text(|b, l| unsafe { sucl_mpi_error_string(code, b, l) })
}

/// The error code passed to `MPI_Abort` when a request that still owns a caller's buffer cannot
/// be completed or cancelled (see the crate documentation).
pub const ABORT_EXIT_CODE: i32 = 75;

/// How long a cancelled point-to-point request may take to complete before the job is aborted.
pub const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// Ends the whole MPI job after printing `cause`: MPI still owns memory the caller would get
/// back, and neither the completion nor the cancellation of what owns it can be awaited.
fn abort_job(cause: &Error) -> ! {
    eprintln!(
        "sucl: {cause}; MPI still owns the caller's buffers and the call cannot be cancelled, \
         so the job is ended (MPI_Abort, code {ABORT_EXIT_CODE})"
    );
    // SAFETY: MPI is initialized (a backend exists only after init succeeded); MPI_Abort ends
    // every process of the job and does not return.
    unsafe { sucl_mpi_abort(ABORT_EXIT_CODE) };
    // Only reached if MPI_Abort returned, which the standard does not allow.
    std::process::exit(ABORT_EXIT_CODE)
}

static INIT: OnceLock<std::result::Result<(usize, usize), String>> = OnceLock::new();

/// Whether MPI runs at `MPI_THREAD_MULTIPLE` (what two communicators driven from two threads at
/// once need), and how many backends (MPI communicators) are alive in this process.
static THREAD_MULTIPLE: AtomicBool = AtomicBool::new(false);
static LIVE_BACKENDS: AtomicUsize = AtomicUsize::new(0);

/// Initializes MPI once per process; returns (world rank, world size) or why MPI is unusable.
pub fn init() -> std::result::Result<(usize, usize), String> {
    INIT.get_or_init(|| {
        // SAFETY: the shim checks MPI_Initialized first; this runs once per process (OnceLock),
        // so MPI is never initialized twice.
        let mut multiple: c_int = 0;
        // SAFETY: as above; `multiple` is a writable local.
        let rc = unsafe { sucl_mpi_init(&mut multiple) };
        THREAD_MULTIPLE.store(multiple != 0, Ordering::Release);
        if cfg!(sucl_mpi_missing) {
            return Err("sucl was built without an MPI library (mpicc was not found at build time)".to_string());
        }
        if rc != 0 {
            return Err(format!("MPI_Init_thread failed: {}", mpi_error(rc)));
        }
        let (mut r, mut s) = (0, 0);
        // SAFETY: MPI is initialized (rc == 0 above); `r` and `s` are writable locals.
        unsafe { sucl_mpi_world(&mut r, &mut s) };
        Ok((r as usize, s as usize))
    })
    .clone()
}

/// Whether [`init`] succeeded in this process.
pub fn initialized() -> bool {
    matches!(INIT.get(), Some(Ok(_)))
}

/// Why the job failed, as seen by an MPI backend when it was dropped with its abort flag raised
/// (a timeout, a lost rank, an abort from another rank). Recorded then — before the teardown
/// leaves the rendezvous store, whose closing connections would raise the flag in a job that
/// ended well — and read by [`finalize`].
static JOB_FAILED: OnceLock<String> = OnceLock::new();

/// Finalizes MPI if this process initialized it (call once, when the job's last communicator
/// is gone). If the job failed (an MPI backend was dropped with the job's abort flag raised: a
/// timeout, a lost rank, an abort from another rank), `MPI_Finalize` could wait forever for
/// ranks that never reach it, so the job is ended with `MPI_Abort` ([`ABORT_EXIT_CODE`])
/// instead.
pub fn finalize() {
    if !initialized() {
        return;
    }
    if let Some(why) = JOB_FAILED.get() {
        eprintln!(
            "sucl: the job failed ({why}); MPI_Finalize could wait for ranks that never reach it, \
             so the job is ended (MPI_Abort, code {ABORT_EXIT_CODE})"
        );
        // SAFETY: MPI is initialized (checked above) and not finalized (finalize runs once);
        // MPI_Abort ends every process of the job and does not return.
        unsafe { sucl_mpi_abort(ABORT_EXIT_CODE) };
        std::process::exit(ABORT_EXIT_CODE);
    }
    // SAFETY: MPI was initialized by this process; the shim skips MPI_Finalize if it already ran.
    unsafe { sucl_mpi_finalize() };
}

/// The MPI library's version line (initializes MPI if needed).
pub fn version() -> std::result::Result<String, String> {
    init()?;
    // SAFETY: MPI is initialized (init() succeeded above); `b` is valid for `l` bytes and the
    // shim writes at most `l`, NUL-terminated.
    Ok(text(|b, l| unsafe { sucl_mpi_version(b, l) }))
}

/// Whether collectives go through MPI's non-blocking calls (polled under sucl's bounded wait)
/// instead of its blocking ones (bounded by the watchdog).
static NONBLOCKING_COLLECTIVES: AtomicBool = AtomicBool::new(false);

/// Chooses, for every MPI backend of this process from its next collective on, between MPI's
/// blocking collectives (the default) and its non-blocking ones (`MPI_Iallreduce`, ...,
/// polled with `MPI_Test`; the way this backend worked before, kept for measuring). Open MPI
/// 4.1's non-blocking collectives (`libnbc`) are not its tuned blocking ones: on 2 ranks of one
/// host they cost 1.5–3.6× the blocking ones' time at 8–256 B (+0.5 to +0.8 µs;
/// docs/results.md, "Host collectives"), and on a quiet host about 2× from 1 MiB (measured
/// on 2 × H100 hosts, 2026-11-24). On a host loaded far beyond its cores they can be faster from 16 KiB, because
/// their wait backs off where MPI's blocking calls spin, but there MPI called
/// directly is as slow as the blocking mode. Both modes keep the bounded waits and end the job
/// when a collective overstays.
pub fn set_nonblocking_collectives(on: bool) {
    NONBLOCKING_COLLECTIVES.store(on, Ordering::Relaxed);
}

/// MPI called directly, with none of sucl around it: the baseline that `sucl bench --compare`
/// measures the MPI backend against.
pub mod raw {
    use super::*;

    /// Runs the collective `d` on `MPI_COMM_WORLD` with MPI's blocking call, in sucl's buffer
    /// conventions (`send == None`: in place; see `sucl_core::backend::Backend`), reduce op
    /// `avg` excepted (MPI has none). Checks that MPI is initialized and that the buffers hold
    /// what `d` says; nothing else stands between the caller and MPI. No bounded wait either:
    /// a peer that never joins hangs it, as it would hang a program that calls MPI itself.
    pub fn world_collective(d: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> std::result::Result<(), String> {
        let (rank, size) = init()?;
        if d.redop == ReduceOp::Avg && d.op.reduces() {
            return Err("MPI has no `avg` reduction".into());
        }
        if d.op.reduces() && matches!(d.dtype, DType::F16 | DType::BF16) {
            return Err(format!("MPI has no {} reductions", d.dtype.name()));
        }
        if d.op.rooted() && d.root >= size {
            return Err(format!("root {} is not a rank of MPI_COMM_WORLD ({size} ranks)", d.root));
        }
        let count = c_int::try_from(d.count).map_err(|_| format!("count {} exceeds MPI's int", d.count))?;
        let (want_send, want_recv) = d.buffer_lens(size, rank);
        let es = d.dtype.size();
        if send.is_some_and(|s| s.len() < want_send * es) || recv.len() < want_recv * es {
            return Err(format!("buffers too small for {} of {} {}", d.op.name(), d.count, d.dtype.name()));
        }
        if d.count == 0 && d.op != CollOp::Barrier {
            return Ok(());
        }
        let sp = send.map_or(std::ptr::null(), |s| s.as_ptr() as *const c_void);
        let rp = if recv.is_empty() { std::ptr::null_mut() } else { recv.as_mut_ptr() as *mut c_void };
        // SAFETY: MPI is initialized (init above); the buffers hold what `d`'s layout needs on
        // this rank (checked above; an empty receive buffer is one MPI ignores on this rank),
        // and the blocking call is done with them when it returns.
        let rc = unsafe { sucl_mpi_coll_world(d.op as c_int, sp, rp, count, d.dtype as c_int, d.redop as c_int, d.root as c_int) };
        if rc != 0 {
            return Err(format!("{}: {}", d.op.name(), mpi_error(rc)));
        }
        Ok(())
    }
}

struct Pending {
    req: *mut c_void,
    send_len: Option<usize>,
}

/// The MPI backend of one communicator (an MPI communicator over the same world ranks).
///
/// A collective that fails after MPI started it ends the job (`MPI_Abort`) instead of returning
/// the error, because MPI would go on writing into the caller's buffers; see the crate
/// documentation.
pub struct MpiBackend {
    comm: *mut c_void,
    rank: usize,
    size: usize,
    world_rank: usize,
    tag_ub: u64,
    pending: Vec<Option<Pending>>,
    free: Vec<usize>,
    abort: Arc<AbortState>,
    timeout: Duration,
    backoff: Backoff,
    scratch: Vec<u8>,
    watch: Arc<Watch>,
}

// SAFETY: MPI is initialized asking for MPI_THREAD_MULTIPLE. Calls on one backend are
// serialized whatever MPI grants: the backend owns its handles and every call takes `&mut self`
// (or runs in Drop), so moving it to another thread keeps them so. Calls of two backends from two
// threads at once need MPI_THREAD_MULTIPLE; where MPI grants less, `MpiBackend::new` warns once a
// second backend exists.
unsafe impl Send for MpiBackend {}

impl Drop for MpiBackend {
    fn drop(&mut self) {
        if self.abort.is_set() {
            let why = self.abort.info().map_or_else(|| "an abort was raised".to_string(), |i| i.reason);
            let _ = JOB_FAILED.set(why);
        }
        let left: Vec<Pending> = self.pending.iter_mut().filter_map(Option::take).collect();
        for p in left {
            self.withdraw(p);
        }
        // SAFETY: `comm` came from sucl_mpi_comm_create and is freed only here, once; no
        // request on it is live any more (each was completed or withdrawn above).
        unsafe { sucl_mpi_comm_free(self.comm) };
        LIVE_BACKENDS.fetch_sub(1, Ordering::AcqRel);
    }
}

impl MpiBackend {
    /// Creates an MPI communicator over `world_ranks` (sucl world ranks are MPI world ranks:
    /// both come from the MPI launcher). Collective over those ranks.
    pub fn new(rank: usize, world_ranks: Vec<usize>, abort: Arc<AbortState>, timeout: Duration, backoff: Backoff) -> Result<MpiBackend> {
        let wr = world_ranks[rank];
        let (mpi_rank, mpi_size) = init().map_err(|why| Error::BackendUnavailable { rank: wr, backend: "mpi".into(), why })?;
        if mpi_rank != wr || world_ranks.iter().any(|&w| w >= mpi_size) {
            return Err(Error::BackendUnavailable {
                rank: wr,
                backend: "mpi".into(),
                why: format!("MPI world rank {mpi_rank} of {mpi_size} does not match sucl's rank {wr}"),
            });
        }
        let ranks: Vec<c_int> = world_ranks.iter().map(|&w| w as c_int).collect();
        let mut err = 0;
        // SAFETY: MPI is initialized (init() above); `ranks` holds `ranks.len()` valid world
        // ranks (checked above) and `err` is a writable local.
        let comm = unsafe { sucl_mpi_comm_create(ranks.as_ptr(), ranks.len() as c_int, &mut err) };
        if comm.is_null() {
            return Err(Error::BackendUnavailable {
                rank: wr,
                backend: "mpi".into(),
                why: format!("MPI_Comm_create_group: {}", mpi_error(err)),
            });
        }
        // SAFETY: MPI is initialized (init() above); the call only reads an attribute.
        let tag_ub = unsafe { sucl_mpi_tag_ub() } as u64;
        let live = LIVE_BACKENDS.fetch_add(1, Ordering::AcqRel) + 1;
        if live > 1 && !THREAD_MULTIPLE.load(Ordering::Acquire) {
            tracing::warn!(
                rank = wr,
                "MPI did not grant MPI_THREAD_MULTIPLE: {live} MPI communicators are alive, and driving two of them \
                 from two threads at once (two stream-triggered queues, say) is outside what MPI then allows"
            );
        }
        Ok(MpiBackend {
            comm,
            rank,
            size: world_ranks.len(),
            world_rank: wr,
            tag_ub,
            pending: vec![],
            free: vec![],
            watch: Watch::new(wr, timeout, abort.clone()),
            abort,
            timeout,
            backoff,
            scratch: vec![],
        })
    }

    fn err(&self, during: &str, code: c_int) -> Error {
        Error::BackendUnavailable { rank: self.world_rank, backend: "mpi".into(), why: format!("{during}: {}", mpi_error(code)) }
    }

    fn track(&mut self, p: Pending) -> ReqId {
        match self.free.pop() {
            Some(i) => {
                self.pending[i] = Some(p);
                i as ReqId
            }
            None => {
                self.pending.push(Some(p));
                (self.pending.len() - 1) as ReqId
            }
        }
    }

    fn int_len(&self, len: usize, arg: &'static str) -> Result<c_int> {
        c_int::try_from(len).map_err(|_| Error::invalid(self.world_rank, arg, format!("{len} bytes exceed MPI's int count")))
    }

    fn check_tag(&self, tag: u64) -> Result<c_int> {
        if tag > self.tag_ub {
            return Err(Error::invalid(self.world_rank, "tag", format!("{tag} exceeds this MPI's MPI_TAG_UB {}", self.tag_ub)));
        }
        Ok(tag as c_int)
    }

    /// Cancels a point-to-point request and waits until MPI reports it complete, so that its
    /// buffer is no longer MPI's; ends the job if that does not happen within [`CANCEL_GRACE`].
    fn withdraw(&mut self, p: Pending) {
        let what = if p.send_len.is_some() { "cancelling a send" } else { "cancelling a receive" };
        // SAFETY: `p.req` is a live request from the shim, owned by us (taken out of `pending`).
        if unsafe { sucl_mpi_cancel(p.req) } != 0 {
            return; // MPI is finalized: no request can be live.
        }
        let start = std::time::Instant::now();
        loop {
            let (mut done, mut bytes) = (0, 0);
            // SAFETY: `p.req` is still live: only a completed test frees it, and we stop then.
            let rc = unsafe { sucl_mpi_test(p.req, &mut done, &mut bytes) };
            if rc != 0 {
                abort_job(&self.err(what, rc));
            }
            if done != 0 {
                return;
            }
            let after = start.elapsed();
            if after >= CANCEL_GRACE.min(self.timeout) {
                abort_job(&Error::Timeout { rank: self.world_rank, op: format!("{what} (mpi)"), after });
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Polls a raw request to completion under the bounded wait.
    fn poll(&mut self, req: *mut c_void, what: &str) -> Result<i64> {
        let mut w = Waiter::new(self.timeout, self.backoff);
        loop {
            let (mut done, mut bytes) = (0, 0);
            // SAFETY: `req` is live: the shim frees it only when a test reports completion, and
            // we return at that point; `done`/`bytes` are writable locals.
            let rc = unsafe { sucl_mpi_test(req, &mut done, &mut bytes) };
            if rc != 0 {
                return Err(self.err(what, rc));
            }
            if done != 0 {
                return Ok(bytes);
            }
            let wr = self.world_rank;
            if let Err(e) = w.pause(&self.abort, wr, &|| format!("{what} (mpi)"), false) {
                if matches!(e, Error::Timeout { .. }) {
                    self.abort.raise(e.abort_info());
                }
                return Err(e);
            }
        }
    }
}

impl Backend for MpiBackend {
    fn name(&self) -> &'static str {
        "mpi"
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }

    unsafe fn post_send(&mut self, peer: usize, tag: u64, ptr: *const u8, len: usize) -> Result<ReqId> {
        let (t, l) = (self.check_tag(tag)?, self.int_len(len, "send buffer")?);
        self.abort.check(self.world_rank, "send")?;
        let mut err = 0;
        // SAFETY (unsafe fn): the caller keeps `ptr..ptr+len` valid and unmodified until the
        // request completes or is cancelled (post_send's contract); `cancel` upholds the rest.
        let req = sucl_mpi_isend(self.comm, ptr as *const c_void, l, peer as c_int, t, &mut err);
        if req.is_null() {
            return Err(self.err("MPI_Isend", err));
        }
        Ok(self.track(Pending { req, send_len: Some(len) }))
    }

    unsafe fn post_recv(&mut self, peer: usize, tag: u64, ptr: *mut u8, cap: usize) -> Result<ReqId> {
        let (t, l) = (self.check_tag(tag)?, self.int_len(cap, "recv buffer")?);
        self.abort.check(self.world_rank, "recv")?;
        let mut err = 0;
        // SAFETY (unsafe fn): the caller keeps `ptr..ptr+cap` valid and untouched until the
        // request completes or is cancelled (post_recv's contract); `cancel` upholds the rest.
        let req = sucl_mpi_irecv(self.comm, ptr as *mut c_void, l, peer as c_int, t, &mut err);
        if req.is_null() {
            return Err(self.err("MPI_Irecv", err));
        }
        Ok(self.track(Pending { req, send_len: None }))
    }

    fn test(&mut self, id: ReqId) -> Result<Option<usize>> {
        let i = id as usize;
        let Some(p) = self.pending.get(i).and_then(|p| p.as_ref()) else {
            return Err(Error::invalid(self.world_rank, "request", "unknown or already completed request"));
        };
        let (req, send_len) = (p.req, p.send_len);
        let (mut done, mut bytes) = (0, 0);
        // SAFETY: `req` is live: it is still in `pending`, and a request leaves `pending` when
        // a test reports completion (which frees it) or when it is withdrawn.
        let rc = unsafe { sucl_mpi_test(req, &mut done, &mut bytes) };
        if rc != 0 {
            return Err(self.err("MPI_Test", rc));
        }
        if done == 0 {
            self.abort.check(self.world_rank, "test")?;
            return Ok(None);
        }
        self.pending[i] = None;
        self.free.push(i);
        Ok(Some(send_len.unwrap_or(bytes.max(0) as usize)))
    }

    fn wait(&mut self, id: ReqId) -> Result<usize> {
        let i = id as usize;
        let Some(p) = self.pending.get(i).and_then(|p| p.as_ref()) else {
            return Err(Error::invalid(self.world_rank, "request", "unknown or already completed request"));
        };
        let (req, send_len) = (p.req, p.send_len);
        let bytes = self.poll(req, if send_len.is_some() { "send" } else { "receive" })?;
        self.pending[i] = None;
        self.free.push(i);
        Ok(send_len.unwrap_or(bytes.max(0) as usize))
    }

    fn cancel(&mut self, id: ReqId) {
        if let Some(p) = self.pending.get_mut(id as usize).and_then(Option::take) {
            self.free.push(id as usize);
            self.withdraw(p);
        }
    }

    fn supports(&self, d: &CollDesc) -> bool {
        let reduces_half = d.op.reduces() && matches!(d.dtype, DType::F16 | DType::BF16);
        // Open MPI 4.1.4's AVX-512 reduction component sums u8 with saturation instead of
        // wrapping (seen here: `sucl check --backend mpi` found wrong u8 sums from 1000
        // elements on); those calls go to the default backend.
        let saturating_u8 = d.op.reduces() && d.dtype == DType::U8 && matches!(d.redop, ReduceOp::Sum | ReduceOp::Avg);
        !reduces_half && !saturating_u8 && c_int::try_from(d.count.saturating_mul(self.size)).is_ok()
    }

    fn v_collective(&mut self, d: &VCollDesc<'_>, send: &[u8], recv: &mut [u8]) -> Option<Result<()>> {
        Some(self.v_native(d, send, recv))
    }

    fn collective(&mut self, d: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        self.abort.check(self.world_rank, d.op.name())?;
        if d.count == 0 && d.op != CollOp::Barrier {
            // Nothing moves; some MPIs reject the dangling pointers of empty buffers.
            return Ok(());
        }
        let count = self.int_len(d.count, "count")?;
        let sp = send.map_or(std::ptr::null(), |s| s.as_ptr() as *const c_void);
        // Open MPI's non-blocking reduce writes partial results into non-roots' receive
        // buffers, which the standard calls insignificant there: give them scratch space (in
        // both modes: nothing promises that a blocking reduce leaves them alone either).
        let rp = if d.op == CollOp::Reduce && d.root != self.rank {
            self.scratch.resize(d.count * d.dtype.size(), 0);
            self.scratch.as_mut_ptr() as *mut c_void
        } else {
            recv.as_mut_ptr() as *mut c_void
        };
        let (op, dt, redop, root) = (d.op as c_int, d.dtype as c_int, d.redop as c_int, d.root as c_int);
        if NONBLOCKING_COLLECTIVES.load(Ordering::Relaxed) {
            self.nonblocking_collective(d, sp, rp, count)?;
        } else {
            let running = self.watch.enter(d.op);
            // SAFETY: `sp`/`rp` cover `count` elements of the op's layout (the runtime validated
            // the buffer lengths against `d`; the scratch space is resized above), and the
            // blocking call is done with them when it returns; if it overstays, the watchdog
            // ends the job while it is still inside MPI (see the crate documentation).
            let rc = unsafe { sucl_mpi_coll(self.comm, op, sp, rp, count, dt, redop, root) };
            self.watch.leave(running);
            if rc != 0 {
                // MPI gave the buffers back, but ranks may still wait in this collective: tell
                // them (their watchdogs end the job if they stay stuck).
                let e = self.collective_error(d, rc);
                self.abort.raise(e.abort_info());
                return Err(e);
            }
        }
        let at_root = !d.op.rooted() || d.root == self.rank;
        if d.op.reduces() && at_root {
            finish_reduce(recv, d.dtype, d.redop, self.size);
        }
        Ok(())
    }
}

impl MpiBackend {
    /// The error for MPI's code `rc` from collective `d`: a message longer than the buffer that
    /// received it means that the ranks disagree on the count ([`Error::Mismatch`]); anything
    /// else is MPI's failure.
    fn collective_error(&self, d: &CollDesc, rc: c_int) -> Error {
        // SAFETY: MPI_Error_class only reads its argument (MPI is initialized: a backend exists).
        if unsafe { sucl_mpi_is_truncation(rc) } != 0 {
            return Error::Mismatch {
                rank: self.world_rank,
                what: format!(
                    "the count of {} (this rank passed {}; MPI received a message longer than the buffer for it: {})",
                    d.op.name(),
                    d.count,
                    mpi_error(rc)
                ),
            };
        }
        self.err(d.op.name(), rc)
    }

    /// Runs `d` through MPI's non-blocking collective, polled under the bounded wait (see
    /// [`set_nonblocking_collectives`]); the pointers are as [`Backend::collective`] made them.
    fn nonblocking_collective(&mut self, d: &CollDesc, sp: *const c_void, rp: *mut c_void, count: c_int) -> Result<()> {
        let mut err = 0;
        // SAFETY: as in `collective`: `sp`/`rp` cover `count` elements of the op's layout and
        // stay valid until the request completes: we poll it to completion below, and if that
        // fails the job is ended (abort_job) before the buffers can be handed back.
        let req = unsafe {
            sucl_mpi_icoll(self.comm, d.op as c_int, sp, rp, count, d.dtype as c_int, d.redop as c_int, d.root as c_int, &mut err)
        };
        if req.is_null() {
            let e = self.err(d.op.name(), err);
            self.abort.raise(e.abort_info());
            return Err(e);
        }
        if let Err(e) = self.poll(req, d.op.name()) {
            // The collective is still running and cannot be cancelled: MPI would keep writing
            // into `recv` (and reading `send`) after we return. Tell the other ranks, then end
            // the job rather than hand the buffers back.
            self.abort.raise(e.abort_info());
            abort_job(&e);
        }
        Ok(())
    }
}

#[cfg(not(sucl_mpi_missing))]
extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn sucl_mpi_ivcoll(
        c: *mut c_void,
        op: c_int,
        send: *const c_void,
        scounts: *const c_int,
        sdispls: *const c_int,
        recv: *mut c_void,
        rcounts: *const c_int,
        rdispls: *const c_int,
        root: c_int,
        err: *mut c_int,
    ) -> *mut c_void;
}

/// Stand-in when no MPI was found at build time (never reached: initialization fails first).
#[cfg(sucl_mpi_missing)]
#[allow(clippy::too_many_arguments)]
unsafe fn sucl_mpi_ivcoll(
    _: *mut c_void,
    _: c_int,
    _: *const c_void,
    _: *const c_int,
    _: *const c_int,
    _: *mut c_void,
    _: *const c_int,
    _: *const c_int,
    _: c_int,
    err: *mut c_int,
) -> *mut c_void {
    *err = -1;
    std::ptr::null_mut()
}

impl MpiBackend {
    /// `counts`/`displs` as the C ints MPI takes (an error if one does not fit).
    fn c_ints(&self, v: &[usize], arg: &'static str) -> Result<Vec<c_int>> {
        v.iter().map(|&x| self.int_len(x, arg)).collect()
    }

    /// MPI_Igatherv / Iallgatherv / Iscatterv / Ialltoallv on bytes, polled to completion like
    /// the other collectives (the runtime validated and agreed on `d` on every rank).
    fn v_native(&mut self, d: &VCollDesc<'_>, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let name = match d.op {
            VCollOp::Gatherv => "gatherv",
            VCollOp::AllGatherv => "all_gatherv",
            VCollOp::Scatterv => "scatterv",
            VCollOp::AllToAllv => "all_to_allv",
        };
        self.abort.check(self.world_rank, name)?;
        // One-entry arrays are never empty for MPI: a rank without entries passes a zero.
        let pad = |mut v: Vec<c_int>| {
            if v.is_empty() {
                v.push(0);
            }
            v
        };
        let sc = pad(self.c_ints(d.send_counts, "send counts")?);
        let sd = pad(self.c_ints(d.send_displs, "send displacements")?);
        let rc = pad(self.c_ints(d.recv_counts, "recv counts")?);
        let rd = pad(self.c_ints(d.recv_displs, "recv displacements")?);
        let op = match d.op {
            VCollOp::Gatherv => 0,
            VCollOp::AllGatherv => 1,
            VCollOp::Scatterv => 2,
            VCollOp::AllToAllv => 3,
        };
        let mut err = 0;
        // SAFETY: the runtime checked every block against `send`/`recv`, and both stay borrowed
        // until the request completes: we poll it to completion below, and if that fails the job
        // is ended (abort_job) before the buffers can be handed back. The count arrays outlive
        // the request too (MPI may read them until completion).
        let req = unsafe {
            sucl_mpi_ivcoll(
                self.comm,
                op,
                send.as_ptr() as *const c_void,
                sc.as_ptr(),
                sd.as_ptr(),
                recv.as_mut_ptr() as *mut c_void,
                rc.as_ptr(),
                rd.as_ptr(),
                d.root as c_int,
                &mut err,
            )
        };
        if req.is_null() {
            let e = self.err(name, err);
            self.abort.raise(e.abort_info());
            return Err(e);
        }
        if let Err(e) = self.poll(req, name) {
            self.abort.raise(e.abort_info());
            abort_job(&e);
        }
        drop((sc, sd, rc, rd));
        Ok(())
    }
}
