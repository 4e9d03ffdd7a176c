//! Stream triggers: two 64-bit counters in pinned, device-mapped host memory (not
//! write-combined: the CPU reads them) that a CUDA stream and a host progress thread use to hand
//! work to each other without the host waiting on the stream or the stream on a host call.
//!
//! - the stream stores the *trigger* ([`StreamSignal::trigger_on`], `cuStreamWriteValue64`) when
//!   it reaches a point (after the device→host copies of a batch); the progress thread sees it
//!   with a plain load ([`StreamSignal::triggered`]) and runs the batch on a host backend;
//! - the progress thread stores the *completion* ([`StreamSignal::complete`]); the stream waits
//!   for it ([`StreamSignal::wait_on`], `cuStreamWaitValue64` with `>=`) before the host→device
//!   copies and the kernels after them.
//!
//! The device attribute for stream memory operations is not consulted (it reads 0 on H100
//! though the operations work): the first failing memory operation switches the signal to host
//! functions (`cuLaunchHostFunc`), which do the same with the CPU. A progress thread that fails
//! stores [`SIGNAL_FAILED`], above every epoch, so that no stream waits forever.
//!
//! Used by the staged device path of `sucl-runtime` (ordinary device collectives) and by the
//! stream-triggered queues of `sucl-stream`: one mechanism, two users.

use crate::{cuda_err, Device};
use cudarc::driver::sys as cu;
use cudarc::driver::CudaStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use sucl_core::{Error, Result};

/// The completion a failed progress thread stores: above every epoch (so a stream waiting with
/// the cyclic `>=` of `cuStreamWaitValue64` is released), far below the wrap-around point.
pub const SIGNAL_FAILED: u64 = 1 << 62;

/// Byte offsets of the two counters (separate 128-byte lines).
const TRIGGER: usize = 0;
const DONE: usize = 128;
const BYTES: usize = 256;

/// A trigger and a completion counter shared by one stream and one progress thread. See the
/// module documentation.
///
/// Made with [`StreamSignal::leak`]: a signal lives as long as the process (256 bytes of
/// pinned memory each), because host functions and progress threads may still read it after
/// its owner went away, and the progress thread must never be the one to free CUDA memory (it
/// makes no CUDA call, so it can never block behind a stream that waits for it).
pub struct StreamSignal {
    host: *mut u8,
    dev: u64,
    /// Stream memory operations failed once: use host functions.
    host_functions: AtomicBool,
    rank: usize,
}

// SAFETY: the counters are only reached as atomics (CPU) or by stream memory operations
// (device); the pointers stay valid for the life of the process (the memory is never freed).
unsafe impl Send for StreamSignal {}
// SAFETY: as above.
unsafe impl Sync for StreamSignal {}

fn check(rc: cu::CUresult, rank: usize, during: &str) -> Result<()> {
    if rc == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::BackendUnavailable { rank, backend: "cuda".into(), why: format!("{during}: {rc:?}") })
    }
}

impl StreamSignal {
    /// A new signal on `dev` (both counters 0), never freed. Errors name `dev`'s rank.
    pub fn leak(dev: &Device) -> Result<&'static StreamSignal> {
        let rank = dev.rank();
        dev.context().bind_to_thread().map_err(|e| cuda_err(rank, "binding the context", e))?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        let flags = cu::CU_MEMHOSTALLOC_PORTABLE | cu::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: allocating; the pointer is checked before use.
        check(unsafe { cu::cuMemHostAlloc(&mut p, BYTES, flags) }, rank, "allocating pinned host memory")?;
        let mut dev_ptr: cu::CUdeviceptr = 0;
        // SAFETY: `p` was just allocated with DEVICEMAP in the current context.
        let mapped = check(unsafe { cu::cuMemHostGetDevicePointer_v2(&mut dev_ptr, p, 0) }, rank, "mapping pinned memory for the device");
        if let Err(e) = mapped {
            // SAFETY: allocated above and not used by anything yet.
            unsafe { cu::cuMemFreeHost(p) };
            return Err(e);
        }
        // SAFETY: fresh allocation of BYTES bytes; zeroed so the counters start at 0.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, BYTES) };
        Ok(Box::leak(Box::new(StreamSignal { host: p as *mut u8, dev: dev_ptr, host_functions: AtomicBool::new(false), rank })))
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset + 8 <= BYTES && offset.is_multiple_of(8));
        // SAFETY: in bounds, 8-aligned (the allocation is page-aligned), valid for the life of
        // the process; the device only writes it with 64-bit stream memory operations.
        unsafe { AtomicU64::from_ptr(self.host.add(offset) as *mut u64) }
    }

    /// The highest epoch a stream has triggered (a CPU load; no CUDA call).
    pub fn triggered(&self) -> u64 {
        self.word(TRIGGER).load(Ordering::Acquire)
    }

    /// The highest epoch completed (or [`SIGNAL_FAILED`]).
    pub fn done(&self) -> u64 {
        self.word(DONE).load(Ordering::Acquire)
    }

    /// Records on the CPU that every batch up to `epoch` completed (no CUDA call).
    pub fn complete(&self, epoch: u64) {
        self.word(DONE).fetch_max(epoch, Ordering::AcqRel);
    }

    /// Whether this signal fell back to host functions.
    pub fn uses_host_functions(&self) -> bool {
        self.host_functions.load(Ordering::Acquire)
    }

    /// Enqueues on `stream` a store of `epoch` into the trigger (a stream memory operation, or
    /// a host function where those fail). Returns at once.
    pub fn trigger_on(&'static self, stream: &CudaStream, epoch: u64) -> Result<()> {
        let cs = stream.cu_stream();
        if !self.uses_host_functions() {
            let addr = self.dev + TRIGGER as u64;
            // SAFETY: `addr` is the device mapping of the trigger word, alive for the process.
            let rc =
                unsafe { cu::cuStreamWriteValue64_v2(cs, addr, epoch, cu::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32) };
            if rc == cu::CUresult::CUDA_SUCCESS {
                return Ok(());
            }
            tracing::warn!(rank = self.rank, ?rc, "stream memory operations failed; triggering with host functions");
            self.host_functions.store(true, Ordering::Release);
        }
        let data = Box::into_raw(Box::new(HostFnData { signal: self, epoch, bound: Duration::ZERO }));
        // SAFETY: `store_trigger` takes the box back exactly once, when the stream runs it.
        let rc = unsafe { cu::cuLaunchHostFunc(cs, Some(store_trigger), data as *mut std::ffi::c_void) };
        if rc != cu::CUresult::CUDA_SUCCESS {
            // SAFETY: the launch failed, so the callback will never run: reclaim the box.
            drop(unsafe { Box::from_raw(data) });
        }
        check(rc, self.rank, "enqueueing the trigger")
    }

    /// Enqueues on `stream` a wait until the completion reaches `epoch`: later work on the
    /// stream runs after it. A host-function fallback gives up after `bound` (the progress
    /// thread stores the completion on success, failure and timeout alike, so it should never
    /// come to that). Returns at once.
    pub fn wait_on(&'static self, stream: &CudaStream, epoch: u64, bound: Duration) -> Result<()> {
        let cs = stream.cu_stream();
        if !self.uses_host_functions() {
            let addr = self.dev + DONE as u64;
            // SAFETY: the device mapping of the completion word, alive for the process.
            let rc = unsafe { cu::cuStreamWaitValue64_v2(cs, addr, epoch, cu::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32) };
            if rc == cu::CUresult::CUDA_SUCCESS {
                return Ok(());
            }
            tracing::warn!(rank = self.rank, ?rc, "stream memory operations failed; waiting with host functions");
            self.host_functions.store(true, Ordering::Release);
        }
        let data = Box::into_raw(Box::new(HostFnData { signal: self, epoch, bound }));
        // SAFETY: `await_done` takes the box back exactly once.
        let rc = unsafe { cu::cuLaunchHostFunc(cs, Some(await_done), data as *mut std::ffi::c_void) };
        if rc != cu::CUresult::CUDA_SUCCESS {
            // SAFETY: never launched: reclaim.
            drop(unsafe { Box::from_raw(data) });
        }
        check(rc, self.rank, "enqueueing the stream wait")
    }
}

struct HostFnData {
    signal: &'static StreamSignal,
    epoch: u64,
    bound: Duration,
}

unsafe extern "C" fn store_trigger(data: *mut std::ffi::c_void) {
    // SAFETY: `data` is the box `trigger_on` leaked for this call.
    let b = unsafe { Box::from_raw(data as *mut HostFnData) };
    b.signal.word(TRIGGER).fetch_max(b.epoch, Ordering::AcqRel);
}

unsafe extern "C" fn await_done(data: *mut std::ffi::c_void) {
    // SAFETY: `data` is the box `wait_on` leaked for this call.
    let b = unsafe { Box::from_raw(data as *mut HostFnData) };
    let deadline = Instant::now() + b.bound;
    // Bounded: the progress thread stores the counter on success, failure and timeout alike.
    while b.signal.done() < b.epoch && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(5));
    }
}
