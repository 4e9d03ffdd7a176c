//! The CUDA device layer: [`Device`], [`Queue`] (an in-order CUDA stream), typed device
//! [`Buffer`]s, [`PinnedBuffer`]s and [`Event`]s — the minimum of a compute layer that the
//! communication layers above order their work on. Every wait here is bounded and watches the
//! job's abort flag, so a lost rank surfaces as an error instead of a hang.

use crate::{cuda_err, probe};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, PinnedHostSlice, SyncOnDrop,
    ValidAsZeroBits,
};
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::time::Duration;
use sucl_core::wait::{Backoff, Waiter};
use sucl_core::{AbortState, Element, Error, Result};

/// Element types a device buffer can hold: sucl's element types, as CUDA sees them.
pub trait DeviceElement: Element + DeviceRepr + ValidAsZeroBits {}
impl<T: Element + DeviceRepr + ValidAsZeroBits> DeviceElement for T {}

/// How long device waits may take and whom they report as; shared by a device's queues.
#[derive(Clone)]
struct Watch {
    rank: usize,
    timeout: Duration,
    backoff: Backoff,
    abort: Arc<AbortState>,
}

impl Watch {
    fn until(&self, what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
        let mut w = Waiter::new(self.timeout, self.backoff);
        loop {
            if done()? {
                return Ok(());
            }
            w.pause(&self.abort, self.rank, &|| what.to_string(), false)?;
        }
    }
}

/// One CUDA GPU: its ordinal, name and memory, and the context work on it runs in.
#[derive(Clone)]
pub struct Device {
    ctx: Arc<CudaContext>,
    watch: Watch,
}

impl Device {
    /// Opens GPU `ordinal`. Waits on it are bounded by 300 s and report as rank 0; use
    /// [`Device::open_for`] to tie them to a job's rank, timeout and abort flag.
    pub fn open(ordinal: usize) -> Result<Device> {
        Self::open_for(ordinal, 0, Duration::from_secs(300), Backoff::DEDICATED, AbortState::new())
    }

    /// Opens GPU `ordinal` for `rank`, bounding every wait by `timeout` and failing it as soon as
    /// `abort` is raised (a lost peer).
    pub fn open_for(ordinal: usize, rank: usize, timeout: Duration, backoff: Backoff, abort: Arc<AbortState>) -> Result<Device> {
        let n = probe().map_err(|why| Error::BackendUnavailable { rank, backend: "cuda".into(), why })?;
        if ordinal >= n {
            return Err(Error::invalid(rank, "device", format!("CUDA device {ordinal} does not exist ({n} found)")));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| cuda_err(rank, "opening the device", e))?;
        Ok(Device { ctx, watch: Watch { rank, timeout, backoff, abort } })
    }

    /// The CUDA ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The GPU's name.
    pub fn name(&self) -> String {
        self.ctx.name().unwrap_or_else(|_| "unknown".into())
    }

    /// The GPU's UUID as 32 hex digits: the same physical GPU reads the same in every process,
    /// whatever `CUDA_VISIBLE_DEVICES` renumbered it to.
    pub fn uuid_hex(&self) -> Result<String> {
        let u = self.ctx.uuid().map_err(|e| cuda_err(self.rank(), "reading the GPU's UUID", e))?;
        Ok(u.bytes.iter().map(|b| format!("{:02x}", *b as u8)).collect())
    }

    /// Total device memory in bytes.
    pub fn total_memory(&self) -> usize {
        self.ctx.total_mem().unwrap_or(0)
    }

    /// The rank errors from this device name.
    pub fn rank(&self) -> usize {
        self.watch.rank
    }

    /// The cudarc context, for work sucl does not wrap.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// A new in-order queue (CUDA stream) on this device.
    pub fn queue(&self) -> Result<Queue> {
        let stream = self.ctx.new_stream().map_err(|e| cuda_err(self.rank(), "creating a stream", e))?;
        Ok(Queue { dev: self.clone(), stream })
    }

    /// A queue over a CUDA stream sucl did not create (a C caller's `cudaStream_t`): work sucl
    /// enqueues on it runs in the stream's order, and dropping the queue leaves the stream alone.
    /// A null `stream` is the legacy default stream. A stream of another context (another GPU,
    /// or a context other than the device's primary one, which the CUDA runtime uses) is refused.
    ///
    /// # Safety
    /// `stream` must be a live stream (or null) and stay alive while the queue, its clones and
    /// the work enqueued on it through sucl live.
    pub unsafe fn borrowed_queue(&self, stream: cudarc::driver::sys::CUstream) -> Result<Queue> {
        use cudarc::driver::sys as cu;
        // Null, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) name the current context's
        // default streams: no context to compare.
        if stream as usize > 2 {
            let mut ctx: cu::CUcontext = std::ptr::null_mut();
            // SAFETY: `stream` is live (this function's contract) and `ctx` a local the call writes.
            let rc = unsafe { cu::cuStreamGetCtx(stream, &mut ctx) };
            if rc != cu::CUresult::CUDA_SUCCESS {
                return Err(Error::invalid(self.rank(), "stream", format!("{stream:p} is not a usable CUDA stream: {rc:?}")));
            }
            if ctx != self.ctx.cu_ctx() {
                return Err(Error::invalid(
                    self.rank(),
                    "stream",
                    format!("{stream:p} belongs to another CUDA context than GPU {}'s primary context", self.ordinal()),
                ));
            }
        }
        // SAFETY: the stream is live for the queue's life (this function's contract) and belongs
        // to this context (checked above, or a default stream of it); cudarc does not destroy
        // a wrapped stream.
        let stream = unsafe { self.ctx.wrap_borrowed_stream(stream) };
        Ok(Queue { dev: self.clone(), stream })
    }

    /// `len` elements of page-locked host memory, which device copies read and write
    /// asynchronously.
    pub fn alloc_pinned<T: DeviceElement>(&self, len: usize) -> Result<PinnedBuffer<T>> {
        // SAFETY: the memory starts uninitialized; we zero it before handing it out, and every
        // sucl element type is valid as zero bits (Pod).
        let mut p = unsafe { self.ctx.alloc_pinned::<T>(len.max(1)) }.map_err(|e| cuda_err(self.rank(), "allocating pinned memory", e))?;
        p.as_mut_slice().map_err(|e| cuda_err(self.rank(), "pinned memory", e))?.fill(<T as bytemuck::Zeroable>::zeroed());
        Ok(PinnedBuffer { inner: p, len })
    }
}

/// An in-order queue of device work (a CUDA stream). Communication on device buffers is
/// enqueued on the queue of the buffer it writes, after the kernels enqueued before it.
#[derive(Clone)]
pub struct Queue {
    dev: Device,
    stream: Arc<CudaStream>,
}

impl Queue {
    /// The device the queue runs on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The CUDA stream, for launching kernels (`stream().launch_builder(kernel.function())`).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn err(&self, during: &str) -> impl Fn(cudarc::driver::DriverError) -> Error + '_ {
        let (rank, during) = (self.dev.rank(), during.to_string());
        move |e| cuda_err(rank, &during, e)
    }

    /// A zeroed device buffer of `len` elements (no allocation for `len == 0`).
    pub fn alloc<T: DeviceElement>(&self, len: usize) -> Result<Buffer<T>> {
        if len == 0 {
            return Ok(Buffer { slice: None, queue: self.clone() });
        }
        // SAFETY: zeroed right below, on the same stream, before anything can read it.
        let s = unsafe { self.stream.alloc::<T>(len) }.map_err(self.err("allocating device memory"))?;
        let (p, _g) = s.device_ptr(&self.stream);
        // SAFETY: `p` is the allocation just made, `len * size_of::<T>()` bytes.
        unsafe { cudarc::driver::result::memset_d8_async(p, 0, len * std::mem::size_of::<T>(), self.stream.cu_stream()) }
            .map_err(self.err("zeroing device memory"))?;
        drop(_g);
        Ok(Buffer { slice: Some(s), queue: self.clone() })
    }

    /// A device buffer holding a copy of `host` (the copy is enqueued; `host` may be reused
    /// when this returns).
    pub fn upload<T: DeviceElement>(&self, host: &[T]) -> Result<Buffer<T>> {
        if host.is_empty() {
            return Ok(Buffer { slice: None, queue: self.clone() });
        }
        let s = self.stream.clone_htod(host).map_err(self.err("copying to the device"))?;
        Ok(Buffer { slice: Some(s), queue: self.clone() })
    }

    /// Waits (bounded, watching for lost ranks) until everything enqueued so far has run.
    pub fn synchronize(&self) -> Result<()> {
        let s = self.stream.cu_stream();
        self.dev.watch.until("waiting for a device queue", || {
            // SAFETY: `s` is this queue's stream, which `self` keeps alive for the call.
            match unsafe { cudarc::driver::sys::cuStreamQuery(s) } {
                cudarc::driver::sys::CUresult::CUDA_SUCCESS => Ok(true),
                cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
                other => Err(Error::BackendUnavailable {
                    rank: self.dev.rank(),
                    backend: "cuda".into(),
                    why: format!("the stream failed: {other:?}"),
                }),
            }
        })
    }

    /// Marks the current end of the queue.
    pub fn record(&self) -> Result<Event> {
        let e = self.stream.record_event(None).map_err(self.err("recording an event"))?;
        Ok(Event { inner: e, watch: self.dev.watch.clone() })
    }

    /// Makes later work on this queue wait for `event` (the CPU does not wait).
    pub fn wait_for(&self, event: &Event) -> Result<()> {
        self.stream.wait(&event.inner).map_err(self.err("waiting for an event"))
    }
}

/// A point in a queue's work, to order other queues after it or to time it.
pub struct Event {
    inner: CudaEvent,
    watch: Watch,
}

impl Event {
    /// Waits (bounded) until the work before the event has run.
    pub fn synchronize(&self) -> Result<()> {
        self.watch.until("waiting for a device event", || {
            self.inner.try_is_complete().map_err(|e| cuda_err(self.watch.rank, "querying an event", e))
        })
    }

    /// Whether the work before the event has run.
    pub fn is_complete(&self) -> bool {
        self.inner.is_complete()
    }

    /// Milliseconds from `self` to `end` (both complete; created with timing, see cudarc).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.inner.elapsed_ms(&end.inner).map_err(|e| cuda_err(self.watch.rank, "timing events", e))
    }

    /// The cudarc event.
    pub fn cuda_event(&self) -> &CudaEvent {
        &self.inner
    }
}

/// `len` elements of `T` in one device's memory, tied to the queue that allocated it.
pub struct Buffer<T: DeviceElement> {
    slice: Option<CudaSlice<T>>,
    queue: Queue,
}

impl<T: DeviceElement> Buffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.slice.as_ref().map_or(0, |s| s.len())
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The queue it was allocated on; communication that writes it is enqueued there.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// The cudarc slice, to pass to kernels (`None` when empty).
    pub fn cuda_slice(&self) -> Option<&CudaSlice<T>> {
        self.slice.as_ref()
    }

    /// The cudarc slice, mutable, to pass to kernels that write it (`None` when empty).
    pub fn cuda_slice_mut(&mut self) -> Option<&mut CudaSlice<T>> {
        self.slice.as_mut()
    }

    /// Enqueues a copy of `host` into the buffer (same length).
    pub fn copy_from_host(&mut self, host: &[T]) -> Result<()> {
        if host.len() != self.len() {
            return Err(Error::invalid(self.queue.dev.rank(), "host", format!("has {} elements, the buffer {}", host.len(), self.len())));
        }
        match &mut self.slice {
            None => Ok(()),
            Some(s) => self.queue.stream.memcpy_htod(host, s).map_err(|e| cuda_err(self.queue.dev.rank(), "copying to the device", e)),
        }
    }

    /// Waits (bounded) for the buffer's queue, then copies the buffer to the host.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let Some(s) = &self.slice else { return Ok(vec![]) };
        self.queue.synchronize()?;
        self.queue.stream.clone_dtoh(s).map_err(|e| cuda_err(self.queue.dev.rank(), "copying to the host", e))
    }
}

/// What a communication backend needs of device memory it reads, whatever its element type:
/// where it lives, how many bytes, and its address ordered on the stream an operation runs on.
pub trait DeviceMemory {
    /// The queue the memory belongs to.
    fn queue(&self) -> &Queue;
    /// Size in bytes.
    fn num_bytes(&self) -> usize;
    /// The address for reading on `stream`; the guard orders later writers after this use.
    fn read_ptr<'s>(&'s self, stream: &'s CudaStream) -> (u64, Option<SyncOnDrop<'s>>);
}

/// Device memory a backend may also write.
pub trait DeviceMemoryMut: DeviceMemory {
    /// The address for writing on `stream`; the guard orders later users after this write.
    fn write_ptr<'s>(&'s mut self, stream: &'s CudaStream) -> (u64, Option<SyncOnDrop<'s>>);
}

impl<T: DeviceElement> DeviceMemory for Buffer<T> {
    fn queue(&self) -> &Queue {
        &self.queue
    }

    fn num_bytes(&self) -> usize {
        self.len() * std::mem::size_of::<T>()
    }

    fn read_ptr<'s>(&'s self, stream: &'s CudaStream) -> (u64, Option<SyncOnDrop<'s>>) {
        read_at(self.slice.as_ref(), stream)
    }
}

impl<T: DeviceElement> DeviceMemoryMut for Buffer<T> {
    fn write_ptr<'s>(&'s mut self, stream: &'s CudaStream) -> (u64, Option<SyncOnDrop<'s>>) {
        write_at(self.slice.as_mut(), stream)
    }
}

impl<T: DeviceElement> Buffer<T> {
    fn bounds(&self, range: impl RangeBounds<usize>) -> Result<(usize, usize)> {
        let start = match range.start_bound() {
            Bound::Included(&s) => s,
            Bound::Excluded(&s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(&e) => e.saturating_add(1),
            Bound::Excluded(&e) => e,
            Bound::Unbounded => self.len(),
        };
        if start > end || end > self.len() {
            return Err(Error::invalid(
                self.queue.dev.rank(),
                "range",
                format!("{start}..{end} is outside a buffer of {} elements", self.len()),
            ));
        }
        Ok((start, end))
    }

    /// Elements `range` of the buffer, for calls that read them (a bucket of a larger buffer).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<BufferView<'_, T>> {
        let (start, end) = self.bounds(range)?;
        let view = self.slice.as_ref().filter(|_| end > start).map(|s| s.slice(start..end));
        Ok(BufferView { view, queue: &self.queue })
    }

    /// Elements `range` of the buffer, for calls that write them.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<BufferViewMut<'_, T>> {
        let (start, end) = self.bounds(range)?;
        let view = self.slice.as_mut().filter(|_| end > start).map(|s| s.slice_mut(start..end));
        Ok(BufferViewMut { view, queue: &self.queue })
    }
}

/// A range of a device [`Buffer`], read by a call.
pub struct BufferView<'a, T: DeviceElement> {
    view: Option<CudaView<'a, T>>,
    queue: &'a Queue,
}

/// A range of a device [`Buffer`], written by a call.
pub struct BufferViewMut<'a, T: DeviceElement> {
    view: Option<CudaViewMut<'a, T>>,
    queue: &'a Queue,
}

/// What both views share: their length and how a backend reads them.
macro_rules! view_common {
    ($view:ident) => {
        impl<T: DeviceElement> $view<'_, T> {
            /// Number of elements.
            pub fn len(&self) -> usize {
                self.view.as_ref().map_or(0, |v| v.len())
            }

            /// Whether it holds no elements.
            pub fn is_empty(&self) -> bool {
                self.len() == 0
            }
        }

        impl<T: DeviceElement> DeviceMemory for $view<'_, T> {
            fn queue(&self) -> &Queue {
                self.queue
            }

            fn num_bytes(&self) -> usize {
                self.len() * std::mem::size_of::<T>()
            }

            fn read_ptr<'s>(&'s self, stream: &'s CudaStream) -> (u64, Option<SyncOnDrop<'s>>) {
                read_at(self.view.as_ref(), stream)
            }
        }
    };
}

view_common!(BufferView);
view_common!(BufferViewMut);

impl<T: DeviceElement> DeviceMemoryMut for BufferViewMut<'_, T> {
    fn write_ptr<'s>(&'s mut self, stream: &'s CudaStream) -> (u64, Option<SyncOnDrop<'s>>) {
        write_at(self.view.as_mut(), stream)
    }
}

/// The address of optional device memory for reading on `stream` (0 when empty).
fn read_at<'s, T, P: DevicePtr<T>>(mem: Option<&'s P>, stream: &'s CudaStream) -> (u64, Option<SyncOnDrop<'s>>) {
    mem.map_or((0, None), |m| {
        if capturing(stream) {
            return (untracked(stream, || m.device_ptr(stream).0), None);
        }
        let (p, g) = m.device_ptr(stream);
        (p, Some(g))
    })
}

/// The address of optional device memory for writing on `stream` (0 when empty).
fn write_at<'s, T, P: DevicePtrMut<T>>(mem: Option<&'s mut P>, stream: &'s CudaStream) -> (u64, Option<SyncOnDrop<'s>>) {
    mem.map_or((0, None), |m| {
        if capturing(stream) {
            return (untracked(stream, || m.device_ptr_mut(stream).0), None);
        }
        let (p, g) = m.device_ptr_mut(stream);
        (p, Some(g))
    })
}

/// Whether `stream` is recording a CUDA graph (stream capture).
fn capturing(stream: &CudaStream) -> bool {
    use cudarc::driver::sys::{cuStreamIsCapturing, CUresult, CUstreamCaptureStatus};
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: the stream is borrowed, so the CUstream it wraps is live; `status` is a local the
    // call writes. cuStreamIsCapturing is one of the calls allowed during a capture.
    let rc = unsafe { cuStreamIsCapturing(stream.cu_stream(), &mut status) };
    rc == CUresult::CUDA_SUCCESS && status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}

/// The address `take` returns, with cudarc's cross-stream event tracking off for the call: during
/// a capture, waiting on an event recorded before it (cudarc waits on the buffer's last write)
/// would cross the capture's boundary and invalidate it, and an event recorded inside it could
/// not be waited on afterwards. Inside a capture, order is the stream's own: work captured after
/// earlier work on the same stream depends on it; a buffer last written on another stream must
/// be ordered before the capture begins (CUDA's rule for captures, which sucl documents).
fn untracked(stream: &CudaStream, take: impl FnOnce() -> u64) -> u64 {
    let ctx = stream.context();
    let was_on = ctx.is_event_tracking();
    if was_on {
        // SAFETY: tracking is off only for this call, which neither allocates nor frees a
        // slice; the address is used by work on `stream` alone (the captured graph).
        unsafe { ctx.disable_event_tracking() };
    }
    let p = take();
    if was_on {
        // SAFETY: restores the state found above.
        unsafe { ctx.enable_event_tracking() };
    }
    p
}

/// Page-locked host memory: the staging area of device ↔ host copies that overlap other work.
pub struct PinnedBuffer<T: DeviceElement> {
    inner: PinnedHostSlice<T>,
    len: usize,
}

impl<T: DeviceElement> PinnedBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The elements (waits for copies into it that are still in flight).
    pub fn as_slice(&self) -> Result<&[T]> {
        Ok(&self.inner.as_slice().map_err(|e| cuda_err(0, "pinned memory", e))?[..self.len])
    }

    /// The elements, mutable (waits for copies from it that are still in flight).
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        let len = self.len;
        Ok(&mut self.inner.as_mut_slice().map_err(|e| cuda_err(0, "pinned memory", e))?[..len])
    }
}
