//! The calls sucl serves itself: small all_reduce over sucl-cuda's peer-memory ("ipc") kernels,
//! on communicators whose ranks all set the backend up right after the communicator was made.
//!
//! Setup runs over the program's own NCCL communicator: every rank's readiness, then the
//! peer-memory records and verdicts, travel through `ncclAllGather`s of fixed-size slots (no
//! second store, no extra environment), and
//! [`IpcBackend::setup`] makes every rank agree, so a communicator is served on all of its
//! ranks or on none. Whether a call is served depends only on values equal on every rank (the
//! op, dtype, byte count, that agreement and the settings), never on pointers or local state.
//! Served calls inside a group are queued and launched at the outermost `ncclGroupEnd`, dropped
//! at `ncclGroupSimulateEnd`; they enqueue kernels on the caller's stream and never wait, so they
//! can be captured into CUDA graphs.

use crate::errors::{fail, ncclInternalError, ncclSuccess};
use crate::real;
use crate::settings;
use crate::table::idx;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};
use sucl_core::backend::{CollDesc, CollOp};
use sucl_core::wait::Backoff;
use sucl_core::{AbortState, DType, ReduceOp};
use sucl_cuda::cudarc::driver::sys as cu;
use sucl_cuda::cudarc::driver::CudaStream;
use sucl_cuda::ipc::plan;
use sucl_cuda::{Device, DeviceBackend, IpcBackend, IpcOptions};

/// A raw `ncclComm_t` as a table key.
pub type CommKey = usize;

/// sucl's side of one served communicator.
struct CommState {
    dev: Device,
    backend: IpcBackend,
    abort: Arc<AbortState>,
    /// Recorded after each uncaptured launch; a launch on another stream waits for it first
    /// (NCCL orders a communicator's calls whatever their streams; the kernels share buffers).
    done: cu::CUevent,
    last_stream: usize,
    /// The last stream wrapped for cudarc (wrapping allocates, so it is kept).
    wrapped: Option<(usize, Arc<CudaStream>)>,
    /// Calls served (for SUCL_NCCL_DEBUG).
    served: u64,
}

// SAFETY: the CUevent is a driver handle usable from any thread; the state is only used under
// its Mutex.
unsafe impl Send for CommState {}

fn comms() -> &'static RwLock<HashMap<CommKey, Arc<Mutex<CommState>>>> {
    static C: OnceLock<RwLock<HashMap<CommKey, Arc<Mutex<CommState>>>>> = OnceLock::new();
    C.get_or_init(Default::default)
}

/// Communicators made non-blocking: never served (their setup would have to wait for init).
fn non_blocking() -> &'static Mutex<HashSet<CommKey>> {
    static N: OnceLock<Mutex<HashSet<CommKey>>> = OnceLock::new();
    N.get_or_init(Default::default)
}

/// A served call waiting for the end of its group.
struct Queued {
    state: Arc<Mutex<CommState>>,
    desc: CollDesc,
    send: u64,
    recv: u64,
    stream: usize,
}

#[derive(Default)]
struct Group {
    depth: usize,
    /// Communicators made inside the group, to set up once it ends.
    created: Vec<CommKey>,
    queued: Vec<Queued>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// `ncclGroupStart` succeeded.
pub fn group_started() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// `ncclGroupEnd` (or, with `simulated`, `ncclGroupSimulateEnd`) returned `rc`: at the outermost
/// end, sets up the communicators made in the group and launches (or, simulated or failed, drops)
/// the queued calls. Returns the code for the caller.
pub fn group_ended(rc: c_int, simulated: bool) -> c_int {
    let done = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return None;
        }
        g.depth -= 1;
        (g.depth == 0).then(|| (std::mem::take(&mut g.created), std::mem::take(&mut g.queued)))
    });
    let Some((created, queued)) = done else { return rc };
    let ok = rc == ncclSuccess || rc == 7; // ncclInProgress: forwarded calls still on their way
    if !ok || simulated {
        return rc;
    }
    // One thread driving several ranks would need their setup exchanges interleaved: such
    // communicators stay forward-only (all of them, on every rank alike).
    if created.len() == 1 {
        set_up(created[0]);
    } else if !created.is_empty() {
        debug(&format!("{} communicators made in one group by one thread: forward-only", created.len()));
    }
    for q in queued {
        let code = launch(&q.state, &q.desc, q.send, q.recv, q.stream);
        if code != ncclSuccess {
            return code;
        }
    }
    rc
}

fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

fn debug(msg: &str) {
    if settings::get().debug {
        eprintln!("sucl-nccl: {msg}");
    }
}

/// A communicator was made (init, split, shrink, grow) with blocking mode `blocking` (None:
/// NCCL's default, or the parent's for split and shrink).
pub fn created(comm: CommKey, parent: Option<CommKey>, blocking: Option<bool>) {
    if comm == 0 {
        return;
    }
    let s = settings::get();
    let inherited = parent.is_some_and(|p| non_blocking().lock().unwrap_or_else(|e| e.into_inner()).contains(&p));
    let blocking = s.nccl_comm_blocking.or(blocking).unwrap_or(!inherited);
    if !blocking {
        non_blocking().lock().unwrap_or_else(|e| e.into_inner()).insert(comm);
        return;
    }
    if !s.serve {
        return;
    }
    if in_group() {
        GROUP.with(|g| g.borrow_mut().created.push(comm));
    } else {
        set_up(comm);
    }
}

/// The communicator is being destroyed (or, with `abort`, aborted or revoked): sucl's side goes.
pub fn forget(comm: CommKey, abort: bool) {
    non_blocking().lock().unwrap_or_else(|e| e.into_inner()).remove(&comm);
    let st = comms().write().unwrap_or_else(|e| e.into_inner()).remove(&comm);
    if let Some(shared) = st {
        // Dropping the backend binds its device's context: the caller's comes back after.
        let _keep = KeepContext::new();
        {
            let st = shared.lock().unwrap_or_else(|e| e.into_inner());
            if abort {
                // Kernels still waiting for a peer give up when the backend is dropped.
                st.abort.raise(sucl_core::AbortInfo { lost_rank: None, reason: "the NCCL communicator was aborted".into() });
            }
            debug(&format!("communicator {comm:#x}: {} calls served by sucl", st.served));
            // SAFETY: the event was made at setup and is destroyed once, here.
            unsafe { cu::cuEventDestroy_v2(st.done) };
        }
        // The backend goes here (before `_keep` restores the context).
        drop(shared);
    }
}

/// The current CUDA context, to put back after the shim's own driver calls (the caller's
/// device must not change under it).
struct KeepContext(cu::CUcontext);

impl KeepContext {
    fn new() -> KeepContext {
        let mut c: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle through a pointer to a live local.
        unsafe { cu::cuCtxGetCurrent(&mut c) };
        KeepContext(c)
    }
}

impl Drop for KeepContext {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the context was current on this thread on entry, so it is live.
            unsafe { cu::cuCtxSetCurrent(self.0) };
        }
    }
}

fn set_up(comm: CommKey) {
    let started = Instant::now();
    match std::panic::catch_unwind(|| try_set_up(comm)) {
        Ok(Ok(Some(st))) => {
            debug(&format!("communicator {comm:#x}: peer memory set up in {:?}", started.elapsed()));
            comms().write().unwrap_or_else(|e| e.into_inner()).insert(comm, Arc::new(Mutex::new(st)));
        }
        Ok(Ok(None)) => {}
        Ok(Err(why)) => debug(&format!("communicator {comm:#x}: forward-only: {why}")),
        Err(_) => debug(&format!("communicator {comm:#x}: forward-only: the setup panicked")),
    }
}

/// Typed access to a real NCCL function, or why not.
macro_rules! real_fn {
    ($i:expr, $t:ty) => {
        match real::get($i) {
            // SAFETY: the table entry is the real library's function of this signature (nccl.h).
            Ok(p) => unsafe { std::mem::transmute::<usize, $t>(p) },
            Err(_) => return Err(format!("{} unavailable", crate::table::NAMES[$i].to_string_lossy())),
        }
    };
}

fn comm_int(comm: CommKey, i: usize) -> Result<c_int, String> {
    let f = real_fn!(i, unsafe extern "C" fn(*mut c_void, *mut c_int) -> c_int);
    let mut v: c_int = -1;
    // SAFETY: a query of a live communicator writing one int to a live local.
    match unsafe { f(comm as *mut c_void, &mut v) } {
        0 => Ok(v),
        rc => Err(format!("{} failed ({rc})", crate::table::NAMES[i].to_string_lossy())),
    }
}

fn try_set_up(comm: CommKey) -> Result<Option<CommState>, String> {
    let n = comm_int(comm, idx::ncclCommCount)? as usize;
    if !(2..=plan::MAX_RANKS).contains(&n) {
        return Ok(None); // the same on every rank
    }
    let rank = comm_int(comm, idx::ncclCommUserRank)? as usize;
    let ordinal = comm_int(comm, idx::ncclCommCuDevice)? as usize;
    let s = settings::get();
    let _keep = KeepContext::new();
    let abort = AbortState::new();
    // This rank's own steps; whatever their outcome, it takes part in the exchanges below, so that
    // no peer is left waiting in an all-gather that never completes (without the exchange's few
    // bytes of device memory it cannot: then the peers' wait ends at the timeout).
    let dev = Device::open_for(ordinal, rank, s.timeout, Backoff::DEDICATED, abort.clone()).map_err(|e| e.to_string());
    if let Ok(d) = &dev {
        d.context().bind_to_thread().map_err(|e| format!("binding the context: {e:?}"))?;
    }
    let mut ex = Exchanger::new(comm, n, s.timeout)?;
    let local = dev.and_then(|d| Ok((d, IpcOptions::from_env(true)?, OwnedEvent::new()?)));
    let ready = ex.all_gather(&[local.is_ok() as u8])?;
    if let Some(r) = ready.iter().position(|v| v.as_slice() != [1]) {
        return Err(match local {
            Err(why) => why,
            Ok(_) => format!("rank {r} could not prepare its side"),
        });
    }
    let (dev, opts, done) = local?;
    let mut exchange = |_key: &str, bytes: &[u8]| {
        ex.all_gather(bytes).map_err(|why| sucl_core::Error::BackendUnavailable { rank, backend: "nccl".into(), why })
    };
    // Agreed on every rank alike: served everywhere or nowhere.
    let backend = IpcBackend::setup(&dev, rank, n, (0..n).collect(), abort.clone(), s.timeout, Backoff::DEDICATED, opts, &mut exchange)
        .map_err(|e| e.to_string())?
        .map_err(|why| format!("peer memory unavailable: {why}"))?;
    Ok(Some(CommState { dev, backend, abort, done: done.take(), last_stream: usize::MAX, wrapped: None, served: 0 }))
}

/// A CUDA event destroyed on drop unless taken.
struct OwnedEvent(cu::CUevent);

impl OwnedEvent {
    fn new() -> Result<OwnedEvent, String> {
        let mut e: cu::CUevent = std::ptr::null_mut();
        // SAFETY: a context is current (try_set_up); writes one handle to a live local.
        ok(unsafe { cu::cuEventCreate(&mut e, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) }, "cuEventCreate")?;
        Ok(OwnedEvent(e))
    }

    fn take(mut self) -> cu::CUevent {
        std::mem::replace(&mut self.0, std::ptr::null_mut())
    }
}

impl Drop for OwnedEvent {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: made in `new`, destroyed once.
            unsafe { cu::cuEventDestroy_v2(self.0) };
        }
    }
}

/// All-gathers small byte strings over the NCCL communicator, in fixed slots on the device.
struct Exchanger {
    comm: CommKey,
    n: usize,
    timeout: Duration,
    stream: cu::CUstream,
    buf: cu::CUdeviceptr,
}

/// Bytes of one rank's slot: a u32 length, then the bytes.
const SLOT: usize = 2048;

impl Exchanger {
    fn new(comm: CommKey, n: usize, timeout: Duration) -> Result<Exchanger, String> {
        let mut ex = Exchanger { comm, n, timeout, stream: std::ptr::null_mut(), buf: 0 };
        // SAFETY: the device's context is current (try_set_up); out-pointers are live fields,
        // released once in Drop.
        unsafe {
            ok(cu::cuStreamCreate(&mut ex.stream, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32), "cuStreamCreate")?;
            ok(cu::cuMemAlloc_v2(&mut ex.buf, (n + 1) * SLOT), "cuMemAlloc")?;
        }
        Ok(ex)
    }

    fn all_gather(&mut self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        if bytes.len() > SLOT - 4 {
            return Err(format!("{} bytes to exchange (at most {})", bytes.len(), SLOT - 4));
        }
        let mut slot = vec![0u8; SLOT];
        slot[..4].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
        slot[4..4 + bytes.len()].copy_from_slice(bytes);
        let gather = real_fn!(
            idx::ncclAllGather,
            unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, *mut c_void, cu::CUstream) -> c_int
        );
        let mut all = vec![0u8; self.n * SLOT];
        let recv = self.buf + SLOT as u64;
        // SAFETY: `buf` holds (n + 1) slots: ours first, then the n gathered; the host buffers
        // are live locals of the sizes copied; the stream is ours.
        unsafe {
            ok(cu::cuMemcpyHtoD_v2(self.buf, slot.as_ptr() as *const c_void, SLOT), "cuMemcpyHtoD")?;
            let rc =
                gather(self.buf as *const c_void, recv as *mut c_void, SLOT, 1 /* ncclUint8 */, self.comm as *mut c_void, self.stream);
            if rc != 0 {
                return Err(format!("ncclAllGather of the setup records failed ({rc})"));
            }
            let start = Instant::now();
            loop {
                match cu::cuStreamQuery(self.stream) {
                    cu::CUresult::CUDA_SUCCESS => break,
                    cu::CUresult::CUDA_ERROR_NOT_READY if start.elapsed() < self.timeout => std::thread::sleep(Duration::from_micros(50)),
                    cu::CUresult::CUDA_ERROR_NOT_READY => return Err(format!("the setup exchange took over {:?}", self.timeout)),
                    other => return Err(format!("the setup exchange failed: {other:?}")),
                }
            }
            ok(cu::cuMemcpyDtoH_v2(all.as_mut_ptr() as *mut c_void, recv, all.len()), "cuMemcpyDtoH")?;
        }
        all.chunks(SLOT)
            .enumerate()
            .map(|(r, s)| {
                let len = u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize;
                s.get(4..4 + len).map(<[u8]>::to_vec).ok_or_else(|| format!("rank {r} sent a slot claiming {len} bytes"))
            })
            .collect()
    }
}

impl Drop for Exchanger {
    fn drop(&mut self) {
        // SAFETY: each handle was made in `new` and is released once; the stream is idle (the
        // exchange waited for it) or, after a timeout, destroyed without waiting.
        unsafe {
            if self.buf != 0 && cu::cuStreamQuery(self.stream) == cu::CUresult::CUDA_SUCCESS {
                cu::cuMemFree_v2(self.buf);
            }
            if !self.stream.is_null() {
                cu::cuStreamDestroy_v2(self.stream);
            }
        }
    }
}

fn ok(rc: cu::CUresult, what: &str) -> Result<(), String> {
    if rc == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {rc:?}"))
    }
}

/// sucl's dtype for an NCCL dtype code (those the peer-memory kernels reduce).
fn dtype_of(nccl: c_int) -> Option<DType> {
    Some(match nccl {
        6 => DType::F16,
        7 => DType::F32,
        8 => DType::F64,
        9 => DType::BF16,
        _ => return None,
    })
}

/// sucl's reduce op for an NCCL built-in op (dynamic PreMulSum ops are forwarded).
fn redop_of(nccl: c_int) -> Option<ReduceOp> {
    Some(match nccl {
        0 => ReduceOp::Sum,
        1 => ReduceOp::Prod,
        2 => ReduceOp::Max,
        3 => ReduceOp::Min,
        4 => ReduceOp::Avg,
        _ => return None,
    })
}

/// The all_reduce to serve, if sucl serves it (values equal on every rank only).
fn all_reduce_desc(count: usize, dtype: c_int, op: c_int) -> Option<CollDesc> {
    let dtype = dtype_of(dtype)?;
    let redop = redop_of(op)?;
    let bytes = count.checked_mul(dtype.size())?;
    if count == 0 || bytes > settings::get().max_bytes {
        return None;
    }
    let d = CollDesc { op: CollOp::AllReduce, dtype, redop, root: 0, count };
    plan::supports(&d).then_some(d)
}

/// Serves `ncclAllReduce` if sucl takes it: Some(result), or None to forward.
pub fn all_reduce(send: u64, recv: u64, count: usize, dtype: c_int, op: c_int, comm: CommKey, stream: usize) -> Option<c_int> {
    if !settings::get().serve {
        return None;
    }
    let desc = all_reduce_desc(count, dtype, op)?;
    let state = comms().read().unwrap_or_else(|e| e.into_inner()).get(&comm)?.clone();
    if in_group() {
        GROUP.with(|g| g.borrow_mut().queued.push(Queued { state, desc, send, recv, stream }));
        return Some(ncclSuccess);
    }
    Some(launch(&state, &desc, send, recv, stream))
}

fn launch(state: &Mutex<CommState>, desc: &CollDesc, send: u64, recv: u64, stream: usize) -> c_int {
    let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
    let _keep = KeepContext::new();
    if let Err(e) = st.dev.context().bind_to_thread() {
        return fail(ncclInternalError, &format!("sucl-nccl: binding the device context: {e:?}"));
    }
    let raw = stream as cu::CUstream;
    let mut capturing = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `raw` is the caller's live stream of this device; writes one status to a local.
    let rc = unsafe { cu::cuStreamIsCapturing(raw, &mut capturing) };
    if rc != cu::CUresult::CUDA_SUCCESS {
        return fail(ncclInternalError, &format!("sucl-nccl: cuStreamIsCapturing: {rc:?}"));
    }
    let captured = capturing != cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    if !captured && st.last_stream != usize::MAX && st.last_stream != stream {
        // SAFETY: the event was recorded after our last uncaptured launch; `raw` is live.
        let rc = unsafe { cu::cuStreamWaitEvent(raw, st.done, 0) };
        if rc != cu::CUresult::CUDA_SUCCESS {
            return fail(ncclInternalError, &format!("sucl-nccl: cuStreamWaitEvent: {rc:?}"));
        }
    }
    let cs = match &st.wrapped {
        Some((s, w)) if *s == stream => w.clone(),
        _ => {
            // SAFETY: the caller's stream belongs to this device's primary context and outlives
            // the call (NCCL's contract); the wrapper never destroys it.
            let w = unsafe { st.dev.context().wrap_borrowed_stream(raw) };
            st.wrapped = Some((stream, w.clone()));
            w
        }
    };
    let send = (send != recv).then_some(send);
    // SAFETY: NCCL's contract for ncclAllReduce: `send` and `recv` hold `count` elements on this
    // device and stay valid until the stream reaches the call.
    if let Err(e) = unsafe { st.backend.collective(desc, send, recv, &cs) } {
        return fail(ncclInternalError, &format!("sucl-nccl: all_reduce over peer memory: {e}"));
    }
    if !captured {
        // SAFETY: the event and stream are live.
        let rc = unsafe { cu::cuEventRecord(st.done, raw) };
        if rc != cu::CUresult::CUDA_SUCCESS {
            return fail(ncclInternalError, &format!("sucl-nccl: cuEventRecord: {rc:?}"));
        }
        st.last_stream = stream;
    }
    st.served += 1;
    ncclSuccess
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_small_floating_all_reduces_with_built_in_ops_are_served() {
        let d = all_reduce_desc(1024, 7, 0).expect("4 KiB f32 sum");
        assert_eq!((d.dtype, d.redop, d.count), (DType::F32, ReduceOp::Sum, 1024));
        assert_eq!(all_reduce_desc(8, 9, 2).unwrap().redop, ReduceOp::Max);
        assert_eq!(all_reduce_desc(8, 9, 3).unwrap().redop, ReduceOp::Min);
        assert!(all_reduce_desc(1024, 2, 0).is_none(), "int32 is forwarded");
        assert!(all_reduce_desc(1024, 7, 5).is_none(), "a PreMulSum op is forwarded");
        assert!(all_reduce_desc(0, 7, 0).is_none(), "nothing to do: forwarded");
        let max = settings::DEFAULT_MAX_BYTES;
        assert!(all_reduce_desc(max / 4, 7, 0).is_some());
        assert!(all_reduce_desc(max / 4 + 1, 7, 0).is_none(), "over the size limit");
        assert!(all_reduce_desc(usize::MAX / 2, 7, 0).is_none(), "a count that overflows");
    }
}
