//! CUDA devices in the daemon, through sucl-cuda's device layer: one in-order stream per device
//! (every queue of every session on that GPU runs on it), kernels compiled from CUDA C by NVRTC
//! per session, and buffers in device memory. Buffers are plain `cuMemAlloc` allocations (not
//! the stream-ordered pool), because only those can be exported to another process
//! (`cuIpcGetMemHandle`): the peer-memory path of a migration between two daemons of one host
//! opens the source's buffer in the destination and copies GPU to GPU on the destination's
//! stream, ordered by interprocess events ([`IpcEvent`], [`OpenedEvent`], [`OpenedMem`]).
//! Compiled and type-checked here; it runs only on a machine with a GPU (see
//! `scripts/remote-gpu-check.sh`).

use crate::wire::failed;
use crate::wire::{code, Arg, DeviceInfo, DeviceKind, Outcome};
use std::ops::Range;
use std::sync::Arc;
use sucl_cuda::cudarc::driver::sys as cu;
use sucl_cuda::cudarc::driver::{CudaContext, CudaStream, LaunchConfig, PushKernelArg};
use sucl_cuda::{Device, Event, Kernel, Queue};

/// One GPU and the stream the daemon runs its work on.
pub(crate) struct CudaServed {
    dev: Device,
    queue: Queue,
}

/// A CUDA buffer of bytes: one `cuMemAlloc` allocation, used on its device's stream.
pub(crate) struct CudaMem {
    ptr: u64,
    len: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Its IPC handle, once exported (the same for the allocation's whole life).
    handle: Option<IpcHandle>,
}

// SAFETY: the allocation is owned by this value alone and used only through `&self`/`&mut self`
// on whichever thread holds it; CUDA driver calls may come from any thread once the context is
// bound (every method binds it).
unsafe impl Send for CudaMem {}

/// An IPC handle (of memory or of an event), as it crosses the peer link.
pub(crate) type IpcHandle = [u8; 64];

/// A recorded CUDA event.
pub(crate) type CudaEv = Event;

/// A kernel argument as the launch passes it.
pub(crate) enum LaunchArg {
    Ptr(u64),
    Scalar(Arg),
}

fn dev_err(during: &str, e: impl std::fmt::Display) -> Outcome {
    failed(code::DEVICE, format!("{during}: {e}"))
}

/// `Ok` for CUDA_SUCCESS, else the failure naming `during`.
fn check(rc: cu::CUresult, during: &str) -> Result<(), Outcome> {
    if rc == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(dev_err(during, format!("{rc:?}")))
    }
}

fn bind(ctx: &CudaContext) -> Result<(), Outcome> {
    ctx.bind_to_thread().map_err(|e| dev_err("binding the device's context", format!("{e:?}")))
}

/// Every GPU of this machine, or why there are none.
pub(crate) fn open_all() -> Result<Vec<CudaServed>, String> {
    let n = sucl_cuda::probe()?;
    (0..n)
        .map(|i| {
            let dev = Device::open(i).map_err(|e| e.to_string())?;
            let queue = dev.queue().map_err(|e| e.to_string())?;
            Ok(CudaServed { dev, queue })
        })
        .collect()
}

/// Waits for a CUDA event.
pub(crate) fn sync_event(e: &Event) -> Result<(), Outcome> {
    e.synchronize().map_err(|e| dev_err("waiting for an event", e))
}

impl CudaServed {
    pub(crate) fn info(&self) -> DeviceInfo {
        DeviceInfo { kind: DeviceKind::Cuda, name: self.dev.name(), memory: self.dev.total_memory() as u64 }
    }

    /// `len` zeroed bytes (at least one is allocated, so that every buffer has an address).
    pub(crate) fn alloc(&self, len: usize) -> Result<CudaMem, Outcome> {
        let ctx = self.dev.context().clone();
        bind(&ctx)?;
        let stream = self.queue.stream().clone();
        let mut ptr = 0u64;
        // SAFETY: the context is bound; `ptr` is a live local the call writes. The allocation is
        // owned by the CudaMem made right below (freed once, in its Drop); the memset covers
        // exactly the allocation, on the stream every later use of the buffer runs on.
        unsafe {
            check(cu::cuMemAlloc_v2(&mut ptr, len.max(1)), "allocating device memory")?;
            let mem = CudaMem { ptr, len, ctx, stream, handle: None };
            check(cu::cuMemsetD8Async(ptr, 0, len, mem.stream.cu_stream()), "zeroing device memory")?;
            Ok(mem)
        }
    }

    /// An interprocess event on this device (no timing), with its handle for a peer.
    pub(crate) fn ipc_event(&self) -> Result<IpcEvent, Outcome> {
        let ctx = self.dev.context().clone();
        bind(&ctx)?;
        let flags = cu::CUevent_flags::CU_EVENT_INTERPROCESS as u32 | cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        let mut ev: cu::CUevent = std::ptr::null_mut();
        let mut h = cu::CUipcEventHandle { reserved: [0; 64] };
        // SAFETY: the context is bound; out-pointers are live locals; the event is owned by
        // the IpcEvent made here (destroyed once, in its Drop), also when exporting fails.
        unsafe {
            check(cu::cuEventCreate(&mut ev, flags), "creating an interprocess event")?;
            let mut made = IpcEvent { ev, handle: [0; 64], ctx };
            check(cu::cuIpcGetEventHandle(&mut h, ev), "exporting an event (cuIpcGetEventHandle)")?;
            made.handle = h.reserved.map(|c| c as u8);
            Ok(made)
        }
    }

    /// Records `e` at the current end of this device's stream.
    pub(crate) fn record_ipc(&self, e: &IpcEvent) -> Result<(), Outcome> {
        bind(&e.ctx)?;
        // SAFETY: the event is live (owned by `e`) and belongs to this device's context, as
        // does the stream.
        check(unsafe { cu::cuEventRecord(e.ev, self.queue.stream().cu_stream()) }, "recording an interprocess event")
    }

    /// Makes later work on this device's stream wait for `e` (a peer's event, as recorded
    /// when this is called); the CPU does not wait.
    pub(crate) fn wait_opened(&self, e: &OpenedEvent) -> Result<(), Outcome> {
        bind(self.dev.context())?;
        // SAFETY: the opened event and the stream are live for the call.
        check(unsafe { cu::cuStreamWaitEvent(self.queue.stream().cu_stream(), e.ev, 0) }, "waiting for a peer's event")
    }

    /// Opens a peer's interprocess event.
    pub(crate) fn open_event(&self, handle: &IpcHandle) -> Result<OpenedEvent, Outcome> {
        let ctx = self.dev.context().clone();
        bind(&ctx)?;
        let mut ev: cu::CUevent = std::ptr::null_mut();
        let h = cu::CUipcEventHandle { reserved: handle.map(|b| b as std::ffi::c_char) };
        // SAFETY: the context is bound; `ev` is a live local; the opened event is owned by the
        // value returned (destroyed once, in its Drop).
        check(unsafe { cu::cuIpcOpenEventHandle(&mut ev, h) }, "opening a peer's event (cuIpcOpenEventHandle)")?;
        Ok(OpenedEvent { ev, ctx })
    }

    /// Maps a peer's buffer into this process (peer access enabled as needed).
    pub(crate) fn open_mem(&self, handle: &IpcHandle) -> Result<OpenedMem, Outcome> {
        let ctx = self.dev.context().clone();
        bind(&ctx)?;
        let mut ptr = 0u64;
        let h = cu::CUipcMemHandle { reserved: handle.map(|b| b as std::ffi::c_char) };
        let lazy = cu::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint;
        // SAFETY: the context is bound; `ptr` is a live local; the mapping is owned by the
        // value returned (closed once, in its Drop).
        check(unsafe { cu::cuIpcOpenMemHandle_v2(&mut ptr, h, lazy) }, "opening a peer's buffer (cuIpcOpenMemHandle)")?;
        // Owned from here: an error below closes the mapping (Drop).
        let mut opened = OpenedMem { ptr, size: 0, ctx };
        let (mut base, mut size) = (0u64, 0usize);
        // SAFETY: the context is bound; `base` and `size` are live locals; `ptr` was just
        // mapped in this context.
        check(unsafe { cu::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }, "sizing a peer's buffer (cuMemGetAddressRange)")?;
        // The bytes from `ptr` to the end of the mapped allocation.
        opened.size = (base + size as u64).saturating_sub(ptr) as usize;
        Ok(opened)
    }

    /// Copies `len` bytes from `src` (a peer's mapped buffer) to `dst` (this device's) on this
    /// device's stream.
    pub(crate) fn copy_peer(&self, dst: u64, src: u64, len: usize) -> Result<(), Outcome> {
        bind(self.dev.context())?;
        // SAFETY: the caller checked `dst..dst+len` against the destination buffer's length
        // and `src..src+len` against the mapped source allocation's size as the driver reports
        // it ([`OpenedMem::size`], never the peer's word), so the copy stays inside both. The
        // destination buffer and the mapping are kept until this stream has run the copy
        // (each is dropped only after synchronizing). Whether the peer still holds its bytes
        // there is its side's ordering: it frees a buffer only once its offers were answered
        // (a copy: after this side's completion event), or when its session ends and a member
        // stayed silent past the peer timeout or was lost. In that last case (or with a peer
        // that breaks the protocol) the copy may read stale or reused bytes of the mapped
        // allocation, never memory outside it.
        check(unsafe { cu::cuMemcpyDtoDAsync_v2(dst, src, len, self.queue.stream().cu_stream()) }, "copying from a peer's GPU")
    }

    pub(crate) fn compile(&self, name: &str, source: &str) -> Result<Kernel, Outcome> {
        Kernel::compile(&self.dev, source, name).map_err(|e| failed(code::KERNEL, e.to_string()))
    }

    pub(crate) fn record(&self) -> Result<Event, Outcome> {
        self.queue.record().map_err(|e| dev_err("recording an event", e))
    }

    pub(crate) fn wait_for(&self, e: &Event) -> Result<(), Outcome> {
        self.queue.wait_for(e).map_err(|e| dev_err("waiting for an event", e))
    }

    pub(crate) fn synchronize(&self) -> Result<(), Outcome> {
        self.queue.synchronize().map_err(|e| dev_err("synchronizing", e))
    }

    /// Launches `kernel` over `range` threads (blocks of 256) with `args` in order: buffers as
    /// device pointers, integers as 64-bit, floats as their own width.
    pub(crate) fn launch(&self, kernel: &Kernel, args: &[LaunchArg], range: u64) -> Result<(), Outcome> {
        let blocks = range.div_ceil(256).clamp(1, u32::MAX as u64) as u32;
        // The values must outlive the builder, which keeps pointers to them.
        let (mut words, mut floats) = (Vec::with_capacity(args.len()), Vec::with_capacity(args.len()));
        for a in args {
            match a {
                LaunchArg::Ptr(p) => words.push(*p),
                LaunchArg::Scalar(Arg::U64(v)) => words.push(*v),
                LaunchArg::Scalar(Arg::I64(v)) => words.push(*v as u64),
                LaunchArg::Scalar(Arg::F64(v)) => words.push(v.to_bits()),
                LaunchArg::Scalar(Arg::F32(v)) => floats.push(*v),
                LaunchArg::Scalar(Arg::Buffer(_)) => unreachable!("buffers are resolved to pointers"),
            }
        }
        let stream = self.queue.stream();
        let mut b = stream.launch_builder(kernel.function());
        let (mut wi, mut fi) = (0, 0);
        for a in args {
            match a {
                LaunchArg::Scalar(Arg::F32(_)) => {
                    b.arg(&floats[fi]);
                    fi += 1;
                }
                _ => {
                    b.arg(&words[wi]);
                    wi += 1;
                }
            }
        }
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the client names the kernel's parameters; each is passed as a 64-bit word (a
        // device pointer of a live buffer of this session, or an integer/double) or a 32-bit
        // float. A kernel whose signature disagrees reads wrong values but no host memory.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| dev_err("launching", format!("{e:?}")))
    }
}

impl CudaMem {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn device_ptr(&self) -> u64 {
        self.ptr
    }

    fn cu_stream(&self) -> cu::CUstream {
        self.stream.cu_stream()
    }

    fn sync(&self, during: &str) -> Result<(), Outcome> {
        // SAFETY: the stream is live (held by `self`).
        check(unsafe { cu::cuStreamSynchronize(self.cu_stream()) }, during)
    }

    /// The allocation's IPC handle (exported on first use).
    pub(crate) fn ipc_handle(&mut self) -> Result<IpcHandle, Outcome> {
        if let Some(h) = self.handle {
            return Ok(h);
        }
        bind(&self.ctx)?;
        let mut h = cu::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: the context is bound; `ptr` is the base of a live cuMemAlloc allocation; `h`
        // is a live local.
        check(unsafe { cu::cuIpcGetMemHandle(&mut h, self.ptr) }, "exporting a buffer (cuIpcGetMemHandle)")?;
        let h = h.reserved.map(|c| c as u8);
        self.handle = Some(h);
        Ok(h)
    }

    pub(crate) fn write(&mut self, offset: usize, data: &[u8]) -> Result<(), Outcome> {
        if data.is_empty() {
            return Ok(());
        }
        bind(&self.ctx)?;
        // SAFETY: callers checked `offset + data.len() <= len`; from pageable memory the copy
        // has taken the bytes when the call returns (the driver stages them), so `data` may go.
        check(unsafe { cu::cuMemcpyHtoDAsync_v2(self.ptr + offset as u64, data.as_ptr().cast(), data.len(), self.cu_stream()) }, "writing")
    }

    pub(crate) fn read(&self, r: Range<usize>) -> Result<Vec<u8>, Outcome> {
        let mut v = vec![0u8; r.len()];
        self.read_into(r, &mut v)?;
        Ok(v)
    }

    /// Reads bytes `r` into `out` (of the same length), without allocating.
    pub(crate) fn read_into(&self, r: Range<usize>, out: &mut [u8]) -> Result<(), Outcome> {
        if r.is_empty() {
            return Ok(());
        }
        debug_assert_eq!(r.len(), out.len());
        bind(&self.ctx)?;
        // SAFETY: callers checked `r` against the buffer; `out` holds `r.len()` bytes and is
        // borrowed until the stream is synchronized below.
        check(
            unsafe { cu::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), self.ptr + r.start as u64, r.len(), self.cu_stream()) },
            "reading",
        )?;
        self.sync("reading")
    }

    pub(crate) fn fill(&mut self, r: Range<usize>, pattern: &[u8]) -> Result<(), Outcome> {
        let host: Vec<u8> = pattern.iter().copied().cycle().take(r.len()).collect();
        self.write(r.start, &host)
    }

    pub(crate) fn copy_within(&mut self, r: Range<usize>, dst: usize) -> Result<(), Outcome> {
        // Device-to-device copies may not overlap; go through the host.
        let host = self.read(r)?;
        self.write(dst, &host)
    }

    pub(crate) fn copy_from(&mut self, src: &CudaMem, r: Range<usize>, dst: usize) -> Result<(), Outcome> {
        if r.is_empty() {
            return Ok(());
        }
        bind(&self.ctx)?;
        // SAFETY: callers checked both ranges against their buffers, which are distinct
        // allocations of one device (so they do not overlap); the copy runs on that device's
        // stream, in order with every other use of both.
        check(unsafe { cu::cuMemcpyDtoDAsync_v2(self.ptr + dst as u64, src.ptr + r.start as u64, r.len(), self.cu_stream()) }, "copying")
    }
}

impl Drop for CudaMem {
    fn drop(&mut self) {
        if bind(&self.ctx).is_err() {
            return;
        }
        // SAFETY: the stream is synchronized first, so no work queued on it (a kernel, or a
        // wait on a peer's completion event ordered before later work) still uses the
        // allocation; it is freed once, here. A peer's copy *from* it runs on the peer's stream,
        // which this synchronization does not cover: the daemon drops a buffer exported to a
        // peer only after every offer of it was answered and ordered (see
        // `daemon::peer_mem`), or after the peer was lost or the peer timeout passed, in which
        // case the freed memory stays mapped in the peer until it closes the handle and a late
        // copy may read reused bytes (never outside the allocation).
        unsafe {
            let _ = cu::cuStreamSynchronize(self.cu_stream());
            let _ = cu::cuMemFree_v2(self.ptr);
        }
    }
}

/// An interprocess event of this process: recorded here, waited for by a peer.
pub(crate) struct IpcEvent {
    ev: cu::CUevent,
    /// What a peer opens it with.
    pub(crate) handle: IpcHandle,
    ctx: Arc<CudaContext>,
}

/// A peer's interprocess event, opened here.
pub(crate) struct OpenedEvent {
    ev: cu::CUevent,
    ctx: Arc<CudaContext>,
}

/// A peer's buffer mapped into this process.
pub(crate) struct OpenedMem {
    /// Its base address here.
    pub(crate) ptr: u64,
    /// The bytes mapped from `ptr` (the exported allocation's size, as the driver reports it).
    pub(crate) size: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: each owns its driver handle alone and releases it once in Drop (after binding its
// context); driver handles may be used from any thread.
unsafe impl Send for IpcEvent {}
// SAFETY: as above.
unsafe impl Send for OpenedEvent {}
// SAFETY: as above.
unsafe impl Send for OpenedMem {}

impl Drop for IpcEvent {
    fn drop(&mut self) {
        if bind(&self.ctx).is_ok() {
            // SAFETY: the event is owned here and destroyed once.
            let _ = unsafe { cu::cuEventDestroy_v2(self.ev) };
        }
    }
}

impl Drop for OpenedEvent {
    fn drop(&mut self) {
        if bind(&self.ctx).is_ok() {
            // SAFETY: the opened event is owned here and destroyed once.
            let _ = unsafe { cu::cuEventDestroy_v2(self.ev) };
        }
    }
}

impl Drop for OpenedMem {
    fn drop(&mut self) {
        if bind(&self.ctx).is_ok() {
            // SAFETY: the mapping is owned here and closed once; the device is synchronized
            // first so that no copy queued on it still reads the peer's memory.
            unsafe {
                let _ = cu::cuCtxSynchronize();
                let _ = cu::cuIpcCloseMemHandle(self.ptr);
            }
        }
    }
}
