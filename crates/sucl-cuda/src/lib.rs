//! sucl-cuda: CUDA devices for sucl — the device layer ([`Device`], [`Queue`], [`Buffer`],
//! [`PinnedBuffer`], [`Event`], run-time compiled [`Kernel`]s) and the NCCL backend.
//!
//! CUDA and NCCL are loaded at run time (cudarc's dynamic loading), so a machine without a GPU
//! builds and runs everything else; [`probe`] and [`nccl_version`] say why CUDA or NCCL is
//! unavailable instead of failing. Device communication goes through a [`DeviceBackend`]:
//! [`NcclBackend`] (enqueued on the caller's stream, no host synchronization) or the staged
//! path in the facade (device → pinned host → any host backend → device). Depends on
//! `sucl-core` only.

#![warn(missing_docs)]

mod device;
mod foreign;
pub mod ipc;
mod nccl_api;
mod raw;
mod signal;
pub use device::{Buffer, BufferView, BufferViewMut, Device, DeviceElement, DeviceMemory, DeviceMemoryMut, Event, PinnedBuffer, Queue};
pub use foreign::{driver_available, pointer_device, ForeignBuffer};
pub use ipc::{IpcBackend, IpcOptions};
pub use raw::RawNccl;
pub use signal::{StreamSignal, SIGNAL_FAILED};

use cudarc::driver::{CudaContext, CudaStream};

use cudarc::nccl::sys as ncclsys;
use nccl_api::{nccl_call, nccl_call_err, nccl_call_text, nccl_op, nccl_type};
use std::ffi::CString;
use std::sync::Arc;
use std::time::Duration;
use sucl_core::backend::{CollDesc, CollOp};
use sucl_core::wait::{Backoff, Waiter};
use sucl_core::{AbortState, Error, ReduceOp, Result};

pub use cudarc;

pub(crate) fn dl_present(lib: &str) -> bool {
    let c = CString::new(lib).expect("library name");
    // SAFETY: `c` is a NUL-terminated string that outlives both calls; dlclose gets only the
    // non-null handle dlopen returned, once, and nothing from the library is used.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
        true
    }
}

/// The number of CUDA devices, or why CUDA cannot be used here.
pub fn probe() -> std::result::Result<usize, String> {
    if !dl_present("libcuda.so.1") && !dl_present("libcuda.so") {
        return Err("the CUDA driver (libcuda.so.1) was not found".into());
    }
    match CudaContext::device_count() {
        Ok(0) => Err("the CUDA driver reports no devices".into()),
        Ok(n) => Ok(n as usize),
        Err(e) => Err(format!("the CUDA driver failed: {e:?}")),
    }
}

/// The CUDA driver's version (e.g. 13000), if loadable.
pub fn driver_version() -> std::result::Result<i32, String> {
    probe()?;
    let mut v = 0;
    // SAFETY: cuDriverGetVersion only writes one int through the pointer, a live local; probe()
    // above found the driver library, so the symbol resolves.
    let rc = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    if rc != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuDriverGetVersion: {rc:?}"));
    }
    Ok(v)
}

/// NCCL's version code (e.g. 22803), or why NCCL is unavailable.
pub fn nccl_version() -> std::result::Result<i32, String> {
    if !dl_present("libnccl.so.2") && !dl_present("libnccl.so") {
        return Err("libnccl.so.2 not found".into());
    }
    cudarc::nccl::result::get_nccl_version().map_err(|e| nccl_call_text("ncclGetVersion", e.0, std::ptr::null_mut()))
}

/// Wraps a CUDA driver error.
pub fn cuda_err(rank: usize, during: &str, e: cudarc::driver::DriverError) -> Error {
    Error::BackendUnavailable { rank, backend: "cuda".into(), why: format!("{during}: {e:?}") }
}

fn nccl_err(rank: usize, during: &str, e: cudarc::nccl::result::NcclError, comm: ncclsys::ncclComm_t) -> Error {
    nccl_call_err(rank, during, e.0, comm)
}

/// NCCL's `NCCL_CONFIG_INITIALIZER` for the configuration layout cudarc binds (`nccl-02028`:
/// NCCL 2.28's `ncclConfig_t`), with `blocking` off: every field NCCL should choose is
/// `NCCL_CONFIG_UNDEF_INT` (`INT_MIN`) or `NCCL_CONFIG_UNDEF_PTR` (null). NCCL reads `size`
/// bytes and treats fields newer than `version` as unset, so a newer library accepts it.
fn nonblocking_config() -> ncclsys::ncclConfig_t {
    const UNDEF_INT: std::ffi::c_int = std::ffi::c_int::MIN;
    ncclsys::ncclConfig_t {
        size: std::mem::size_of::<ncclsys::ncclConfig_t>(),
        magic: 0xcafe_beef,
        // NCCL_VERSION(2, 28, 0): the header release whose layout this is.
        version: 22800,
        blocking: 0,
        cgaClusterSize: UNDEF_INT,
        minCTAs: UNDEF_INT,
        maxCTAs: UNDEF_INT,
        netName: std::ptr::null(),
        splitShare: UNDEF_INT,
        trafficClass: UNDEF_INT,
        commName: std::ptr::null(),
        collnetEnable: UNDEF_INT,
        CTAPolicy: UNDEF_INT,
        shrinkShare: UNDEF_INT,
        nvlsCTAs: UNDEF_INT,
        nChannelsPerNetPeer: UNDEF_INT,
        nvlinkCentricSched: UNDEF_INT,
    }
}

/// A transport for device memory: collectives on raw device pointers, ordered on a stream.
pub trait DeviceBackend: Send {
    /// Short name.
    fn name(&self) -> &'static str;
    /// Whether it can serve `desc`.
    fn supports(&self, _desc: &CollDesc) -> bool {
        true
    }
    /// Enqueues (or runs) a collective. `send == None` means in place (see
    /// [`sucl_core::Backend::collective`]); pointers are device addresses on `stream`'s device.
    ///
    /// # Safety
    /// `send` and `recv` must be device allocations on `stream`'s device covering the sizes
    /// `desc` gives this rank ([`CollDesc::buffer_lens`]), and stay allocated — not freed,
    /// nor written by other work (`send`), nor read or written by other work (`recv`) — until
    /// `stream` has run everything enqueued here.
    unsafe fn collective(&mut self, desc: &CollDesc, send: Option<u64>, recv: u64, stream: &CudaStream) -> Result<()>;
    /// Enqueues point-to-point transfers as one group, so that a rank may send to and receive
    /// from the same peer without deadlock: `sends` and `recvs` are (device address, bytes, peer).
    ///
    /// # Safety
    /// Each address must be a device allocation on `stream`'s device covering its byte count,
    /// kept allocated (and, for receives, untouched by other work) until `stream` has run the
    /// transfers.
    unsafe fn p2p(&mut self, sends: &[(u64, usize, usize)], recvs: &[(u64, usize, usize)], stream: &CudaStream) -> Result<()>;
    /// Waits (bounded) until everything enqueued on `stream` finished, surfacing asynchronous
    /// errors; aborts the backend on error or timeout.
    fn synchronize(&mut self, stream: &CudaStream) -> Result<()>;
}

/// The NCCL backend: one NCCL communicator per sucl communicator.
///
/// Setup joins a non-blocking communicator (`ncclConfig_t::blocking = 0`) and splits a blocking
/// child off it for the collectives (NCCL launches a non-blocking communicator's calls from a
/// helper thread, tens of µs each); point-to-point groups stay on the non-blocking one, whose
/// first use connects to the peer and must not hang when the peer is gone. Setup, every call that NCCL answers with `ncclInProgress`, and
/// teardown are polled with `ncclCommGetAsyncError`
/// under sucl's bounded wait, so a rank that never joins, a lost rank (the rendezvous store
/// raises the job's abort flag) or the timeout is an error — NCCL is then aborted
/// (`ncclCommAbort`) — never a hang. A clean drop finalizes (`ncclCommFinalize`, which lets
/// the queued work finish), waits for that (bounded) and destroys; abort is for errors only.
pub struct NcclBackend {
    /// The blocking child: collectives.
    comm: ncclsys::ncclComm_t,
    /// The non-blocking communicator setup joined: point-to-point groups, whose first use
    /// connects to each peer and must stay bounded (a blocking communicator hangs there when
    /// the peer is gone). Null until the split.
    p2p_comm: ncclsys::ncclComm_t,
    rank: usize,
    size: usize,
    world_rank: usize,
    abort: Arc<AbortState>,
    timeout: Duration,
    backoff: Backoff,
    /// Set once `comm` was aborted or destroyed: it must not be used (or freed) again.
    aborted: bool,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; `NcclBackend` owns its communicator and all calls take `&mut self`.
unsafe impl Send for NcclBackend {}

impl Drop for NcclBackend {
    fn drop(&mut self) {
        if self.aborted {
            return;
        }
        if let Err(e) = self.finalize() {
            tracing::warn!(rank = self.world_rank, "NCCL teardown failed, communicator aborted: {e}");
        }
    }
}

/// The 128-byte NCCL unique id, made on one rank and shared through the store.
pub fn nccl_unique_id() -> std::result::Result<Vec<u8>, String> {
    let id = cudarc::nccl::result::get_uniqueid().map_err(|e| nccl_call_text("ncclGetUniqueId", e.0, std::ptr::null_mut()))?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

impl NcclBackend {
    /// Joins the NCCL communicator named by `id` (from [`nccl_unique_id`]) as `rank` of `size`
    /// on `dev`. Collective over the ranks.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dev: &Device,
        id: &[u8],
        rank: usize,
        size: usize,
        world_rank: usize,
        abort: Arc<AbortState>,
        timeout: Duration,
        backoff: Backoff,
    ) -> Result<NcclBackend> {
        if id.len() != 128 {
            return Err(Error::Protocol { rank: world_rank, peer: 0, why: format!("NCCL id of {} bytes (want 128)", id.len()) });
        }
        dev.context().bind_to_thread().map_err(|e| cuda_err(world_rank, "binding the context", e))?;
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, s) in internal.iter_mut().zip(id) {
            *d = *s as std::ffi::c_char;
        }
        let uid = ncclsys::ncclUniqueId { internal };
        let mut config = nonblocking_config();
        let mut comm: ncclsys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` and `config` are valid for writes and reads for the call; `config` is
        // fully initialized as NCCL_CONFIG_INITIALIZER would (see nonblocking_config) and NCCL
        // copies it before returning. The device's context is bound to this thread (above).
        let rc = unsafe { ncclsys::ncclCommInitRankConfig(&mut comm, size as i32, uid, rank as i32, &mut config) };
        if comm.is_null() {
            // NCCL failed before it made a communicator: nothing to abort.
            let e = nccl_call_err(world_rank, "ncclCommInitRankConfig", rc, comm);
            abort.raise(e.abort_info());
            return Err(e);
        }
        let mut nccl =
            NcclBackend { comm, p2p_comm: std::ptr::null_mut(), rank, size, world_rank, abort, timeout, backoff, aborted: false };
        nccl.check("ncclCommInitRankConfig", rc.result())?;
        // Joining is asynchronous: wait (bounded, and never past a lost rank) until it is done.
        nccl.settle("ncclCommInitRankConfig")?;
        nccl.split_blocking()?;
        Ok(nccl)
    }

    /// NCCL launches each call of a non-blocking communicator from a helper thread, which cost
    /// about 35 µs per call on 2 × H200 (all_reduce of 8 B: 43.7 µs against 7.4 µs for NCCL
    /// called directly). So the setup joins non-blocking (bounded, abortable) and then splits
    /// off a blocking child with the same ranks, polled the same way, for the collectives; the
    /// non-blocking parent keeps the point-to-point groups. A rank lost during the split is
    /// caught like one lost during the join.
    fn split_blocking(&mut self) -> Result<()> {
        let mut config = nonblocking_config();
        config.blocking = 1;
        let mut child: ncclsys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `self.comm` is live (just joined, not aborted); `child` and `config` are valid
        // for the call and `config` is fully initialized (see nonblocking_config).
        let rc = unsafe { ncclsys::ncclCommSplit(self.comm, 0, self.rank as i32, &mut child, &mut config) };
        if !matches!(rc, ncclsys::ncclResult_t::ncclSuccess | ncclsys::ncclResult_t::ncclInProgress) {
            return Err(self.fail(nccl_call_err(self.world_rank, "ncclCommSplit", rc, self.comm)));
        }
        // The split runs on the parent's (non-blocking) terms: wait until both say it is done.
        self.settle("ncclCommSplit")?;
        if child.is_null() {
            return Err(self.fail(nccl_call_err(self.world_rank, "ncclCommSplit (no communicator)", rc, self.comm)));
        }
        self.p2p_comm = std::mem::replace(&mut self.comm, child);
        self.settle("ncclCommSplit")
    }

    /// Waits until the communicator has no operation in progress (`ncclCommGetAsyncError` no
    /// longer says `ncclInProgress`), bounded by the timeout and the job's abort flag. On an
    /// NCCL error, the timeout or an abort, NCCL is aborted and the error returned.
    fn settle(&mut self, during: &str) -> Result<()> {
        self.settle_on(self.comm, during)
    }

    /// [`NcclBackend::settle`] for `comm`, one of this backend's live communicators.
    fn settle_on(&mut self, comm: ncclsys::ncclComm_t, during: &str) -> Result<()> {
        let mut w = Waiter::new(self.timeout, self.backoff);
        let wr = self.world_rank;
        loop {
            let mut state = ncclsys::ncclResult_t::ncclSuccess;
            // SAFETY: `comm` is live (not aborted or destroyed: callers check `aborted`) and
            // `state` is valid for writes.
            let rc = unsafe { ncclsys::ncclCommGetAsyncError(comm, &mut state) };
            if rc != ncclsys::ncclResult_t::ncclSuccess {
                return Err(self.fail(nccl_call_err(wr, "ncclCommGetAsyncError", rc, comm)));
            }
            match state {
                ncclsys::ncclResult_t::ncclSuccess => return Ok(()),
                ncclsys::ncclResult_t::ncclInProgress => {}
                failed => return Err(self.fail(nccl_call_err(wr, during, failed, comm))),
            }
            if let Err(e) = w.pause(&self.abort, wr, &|| format!("{during} (nccl)"), false) {
                return Err(self.fail(e));
            }
        }
    }

    /// Clean teardown: `ncclCommFinalize` (NCCL finishes the work queued on the communicator),
    /// a bounded wait for it, then `ncclCommDestroy`. On an error, the timeout, or when the job
    /// already failed, NCCL is aborted instead.
    fn finalize(&mut self) -> Result<()> {
        if self.abort.is_set() {
            // Peers may be gone: finalizing could wait on them. Abort at once.
            let e = Error::Aborted { rank: self.world_rank, reason: "the job failed before NCCL was torn down".into() };
            return Err(self.fail(e));
        }
        for comm in self.comms() {
            // SAFETY: `comm` is live (`aborted` is false) and finalized only here, once.
            let r = unsafe { cudarc::nccl::result::comm_finalize(comm) };
            self.check_on(comm, "ncclCommFinalize", r)?;
            self.settle_on(comm, "ncclCommFinalize")?;
        }
        self.aborted = true;
        let mut done = Ok(());
        for comm in self.comms() {
            // SAFETY: `comm` was finalized and is quiescent; it is destroyed once and never used
            // again (`aborted` is set).
            let r = unsafe { cudarc::nccl::result::comm_destroy(comm) };
            done = done.and(r.map(|_| ()).map_err(|e| nccl_err(self.world_rank, "ncclCommDestroy", e, comm)));
        }
        done
    }

    /// The live communicators: the collectives' and, after the split, the point-to-point one.
    fn comms(&self) -> impl Iterator<Item = ncclsys::ncclComm_t> {
        [self.comm, self.p2p_comm].into_iter().filter(|c| !c.is_null())
    }

    fn fail(&mut self, e: Error) -> Error {
        if !self.aborted {
            self.aborted = true;
            for comm in self.comms() {
                // SAFETY: `comm` is live (`aborted` was false) and `aborted` is set first, so
                // the handle is never used or freed again; aborting unblocks any hung NCCL kernel.
                unsafe {
                    let _ = cudarc::nccl::result::comm_abort(comm);
                }
            }
        }
        self.abort.raise(e.abort_info());
        e
    }

    fn check(
        &mut self,
        during: &str,
        r: std::result::Result<cudarc::nccl::result::NcclStatus, cudarc::nccl::result::NcclError>,
    ) -> Result<()> {
        self.check_on(self.comm, during, r)
    }

    /// [`NcclBackend::check`] of a call on `comm`.
    fn check_on(
        &mut self,
        comm: ncclsys::ncclComm_t,
        during: &str,
        r: std::result::Result<cudarc::nccl::result::NcclStatus, cudarc::nccl::result::NcclError>,
    ) -> Result<()> {
        match r {
            Ok(cudarc::nccl::result::NcclStatus::InProgress) => {
                // A non-blocking communicator: no other NCCL call may follow until it settles.
                self.settle_on(comm, during)
            }
            Ok(_) => Ok(()),
            Err(e) => {
                let e = nccl_err(self.world_rank, during, e, comm);
                Err(self.fail(e))
            }
        }
    }
}

impl DeviceBackend for NcclBackend {
    fn name(&self) -> &'static str {
        "nccl"
    }

    unsafe fn collective(&mut self, d: &CollDesc, send: Option<u64>, recv: u64, stream: &CudaStream) -> Result<()> {
        if self.aborted {
            return Err(Error::Aborted { rank: self.world_rank, reason: "the NCCL communicator was aborted".into() });
        }
        self.abort.check(self.world_rank, d.op.name())?;
        let (t, es) = (nccl_type(d.dtype), d.dtype.size());
        // NCCL 2.28.3 with one rank leaves the tail of a float ncclAvg result unwritten (seen on
        // H200: the last 3 of 2^20+3 elements kept their old values); with one rank the average
        // is the sum, so ask for that.
        let mut d = *d;
        if self.size == 1 && d.redop == ReduceOp::Avg {
            d.redop = ReduceOp::Sum;
        }
        let d = &d;
        let s = stream.cu_stream() as ncclsys::cudaStream_t;
        let c = self.comm;
        let ptr = |p: u64| p as *const std::ffi::c_void;
        let mptr = |p: u64| p as *mut std::ffi::c_void;
        let sendp = send.unwrap_or(recv);
        let blk = (d.count * es) as u64;
        use cudarc::nccl::result as nr;
        // SAFETY: `c` is live (`aborted` was checked above and NCCL calls are never concurrent:
        // `&mut self`); the caller guarantees (this method's contract) that the device pointers
        // cover the sizes `d` gives this rank and stay allocated until `stream` ran the calls.
        let r = unsafe {
            match d.op {
                CollOp::Barrier => {
                    // A one-byte all-reduce on `recv` (at least one byte of scratch): NCCL may
                    // skip zero-element calls, which would order nothing.
                    let u8t = ncclsys::ncclDataType_t::ncclUint8;
                    nr::all_reduce(ptr(recv), mptr(recv), 1, u8t, nccl_op(ReduceOp::Sum), c, s)
                }
                CollOp::Broadcast => nr::broadcast(ptr(recv), mptr(recv), d.count, t, d.root as i32, c, s),
                CollOp::AllReduce => nr::all_reduce(ptr(sendp), mptr(recv), d.count, t, nccl_op(d.redop), c, s),
                CollOp::Reduce => {
                    let dst = if self.rank == d.root { recv } else { sendp };
                    nr::reduce(ptr(sendp), mptr(dst), d.count, t, nccl_op(d.redop), d.root as i32, c, s)
                }
                CollOp::AllGather => {
                    let src = send.unwrap_or(recv + self.rank as u64 * blk);
                    nr::all_gather(ptr(src), mptr(recv), d.count, t, c, s)
                }
                CollOp::ReduceScatter => nr::reduce_scatter(ptr(sendp), mptr(recv), d.count, t, nccl_op(d.redop), c, s),
                CollOp::Gather | CollOp::Scatter | CollOp::AllToAll => {
                    // Grouped point-to-point, as NCCL recommends for these patterns.
                    let r = nr::group_start();
                    if let Err(e) = r {
                        Err(e)
                    } else {
                        let mut res = Ok(nr::NcclStatus::Success);
                        for j in 0..self.size {
                            let jo = j as u64 * blk;
                            let step = match d.op {
                                CollOp::Gather => {
                                    let mut r = Ok(nr::NcclStatus::Success);
                                    if self.rank == d.root {
                                        r = nr::recv(mptr(recv + jo), d.count, t, j as i32, c, s);
                                    }
                                    if r.is_ok() && j == d.root {
                                        let src = send.unwrap_or(recv + self.rank as u64 * blk);
                                        r = nr::send(ptr(src), d.count, t, d.root as i32, c, s);
                                    }
                                    r
                                }
                                CollOp::Scatter => {
                                    let mut r = Ok(nr::NcclStatus::Success);
                                    if self.rank == d.root {
                                        r = nr::send(ptr(sendp + jo), d.count, t, j as i32, c, s);
                                    }
                                    if r.is_ok() && j == d.root {
                                        r = nr::recv(mptr(recv), d.count, t, d.root as i32, c, s);
                                    }
                                    r
                                }
                                _ => nr::send(ptr(sendp + jo), d.count, t, j as i32, c, s)
                                    .and_then(|_| nr::recv(mptr(recv + jo), d.count, t, j as i32, c, s)),
                            };
                            if step.is_err() {
                                res = step;
                                break;
                            }
                        }
                        let end = nr::group_end();
                        res.and(end)
                    }
                }
            }
        };
        self.check(nccl_call(d.op), r)
    }

    unsafe fn p2p(&mut self, sends: &[(u64, usize, usize)], recvs: &[(u64, usize, usize)], stream: &CudaStream) -> Result<()> {
        if self.aborted {
            return Err(Error::Aborted { rank: self.world_rank, reason: "the NCCL communicator was aborted".into() });
        }
        self.abort.check(self.world_rank, "point-to-point")?;
        use cudarc::nccl::result as nr;
        let c = if self.p2p_comm.is_null() { self.comm } else { self.p2p_comm };
        let (s, t) = (stream.cu_stream() as ncclsys::cudaStream_t, ncclsys::ncclDataType_t::ncclUint8);
        // SAFETY: `c` is live (`aborted` was checked above); the caller guarantees (this
        // method's contract) that each address covers its byte count and stays allocated until
        // `stream` ran the transfers.
        let r = unsafe {
            nr::group_start().and_then(|_| {
                let mut res = Ok(nr::NcclStatus::Success);
                for &(p, n, peer) in sends {
                    res = res.and_then(|_| nr::send(p as *const std::ffi::c_void, n, t, peer as i32, c, s));
                }
                for &(p, n, peer) in recvs {
                    res = res.and_then(|_| nr::recv(p as *mut std::ffi::c_void, n, t, peer as i32, c, s));
                }
                let end = nr::group_end();
                res.and(end)
            })
        };
        self.check_on(c, "ncclSend/ncclRecv group (point-to-point)", r)
    }

    fn synchronize(&mut self, stream: &CudaStream) -> Result<()> {
        let mut w = Waiter::new(self.timeout, self.backoff);
        loop {
            // SAFETY: `stream` is borrowed for the call, so the CUstream it wraps is not destroyed.
            let q = unsafe { cudarc::driver::sys::cuStreamQuery(stream.cu_stream()) };
            match q {
                cudarc::driver::sys::CUresult::CUDA_SUCCESS => return Ok(()),
                cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY => {}
                other => {
                    let e = Error::BackendUnavailable {
                        rank: self.world_rank,
                        backend: "cuda".into(),
                        why: format!("stream failed: {other:?}"),
                    };
                    return Err(self.fail(e));
                }
            }
            // No allocation per poll: the (at most two) handles are copied out first.
            let live: [ncclsys::ncclComm_t; 2] = if self.aborted { [std::ptr::null_mut(); 2] } else { [self.comm, self.p2p_comm] };
            for comm in live.into_iter().filter(|c| !c.is_null()) {
                let mut async_err = ncclsys::ncclResult_t::ncclSuccess;
                // SAFETY: `comm` is live (`aborted` is false) and `async_err` is a writable local.
                unsafe { ncclsys::ncclCommGetAsyncError(comm, &mut async_err) };
                if !matches!(async_err, ncclsys::ncclResult_t::ncclSuccess | ncclsys::ncclResult_t::ncclInProgress) {
                    let e = nccl_call_err(self.world_rank, "an earlier call (asynchronous error)", async_err, comm);
                    return Err(self.fail(e));
                }
            }
            let wr = self.world_rank;
            if let Err(e) = w.pause(&self.abort, wr, &|| "waiting for the device stream (nccl)".to_string(), false) {
                return Err(self.fail(e));
            }
        }
    }
}

/// A CUDA C kernel compiled at run time with NVRTC and loaded into one device's context.
pub struct Kernel {
    func: cudarc::driver::CudaFunction,
}

impl Kernel {
    /// Compiles `src` and loads function `name` on `dev`.
    pub fn compile(dev: &Device, src: &str, name: &str) -> Result<Kernel> {
        let rank = dev.rank();
        let ptx = cudarc::nvrtc::compile_ptx(src).map_err(|e| Error::BackendUnavailable {
            rank,
            backend: "nvrtc".into(),
            why: format!("compiling `{name}`: {e:?}"),
        })?;
        let module = dev.context().load_module(ptx).map_err(|e| cuda_err(rank, "loading a module", e))?;
        let func = module.load_function(name).map_err(|e| cuda_err(rank, &format!("finding kernel `{name}`"), e))?;
        Ok(Kernel { func })
    }

    /// The loaded function, for `CudaStream::launch_builder`.
    pub fn function(&self) -> &cudarc::driver::CudaFunction {
        &self.func
    }
}

/// CUDA C for the test-pattern kernels `fill_<dtype>(out, n, base, rank, seed, mode)`: element i
/// gets the value sucl's checks expect from `rank` at global index `base + i` (mode 0: plain,
/// 1: small values for reductions, 2: powers of two for products).
pub const PATTERN_SRC: &str = r#"
#define VALUE(i) long long v; \
    if (mode == 2) { long long m = (rank + (i) + seed) % 2; if (m < 0) m += 2; v = 1 + m; } \
    else if (mode == 1) { long long m = (rank * 7 + (i) * 13 + seed * 3) % 11; if (m < 0) m += 11; v = m - 3; } \
    else { v = rank * 1000003 + (i) * 7 + seed; }
#define FILL_FLOAT(NAME, T) extern "C" __global__ void NAME(T* out, long long n, long long base, long long rank, long long seed, int mode) { \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) { \
        VALUE(base + i) out[i] = (T)(double)v; } }
#define FILL_INT(NAME, T) extern "C" __global__ void NAME(T* out, long long n, long long base, long long rank, long long seed, int mode) { \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) { \
        VALUE(base + i) out[i] = (T)v; } }
FILL_FLOAT(fill_f32, float)
FILL_FLOAT(fill_f64, double)
FILL_INT(fill_u8, unsigned char)
FILL_INT(fill_i8, signed char)
FILL_INT(fill_i32, int)
FILL_INT(fill_u32, unsigned int)
FILL_INT(fill_i64, long long)
FILL_INT(fill_u64, unsigned long long)
"#;
