//! CUDA streams (feature `cuda`): a [`CommQueue`](crate::CommQueue) bound to a device [`Queue`].
//!
//! - **nccl**: the groups run on a side stream of the queue. `start` records an event on the
//!   stream (what the batch must see) and keeps the batch; `wait` (or `synchronize`) issues the
//!   batches of every start since the last wait (their sends and receives as one NCCL group)
//!   on the side stream after that event, and makes the stream wait for them with a second
//!   event (no host wait). NCCL runs a
//!   communicator's kernels one after the other whatever stream they are on, so a start issued
//!   as a group of its own would hold later starts behind it (`recv; start; send; start; wait`
//!   on two ranks could never complete); issued together at the wait, they complete as MPI's
//!   semantics say. Kernels enqueued between a start and its wait run while the groups do
//!   (they must not write what the batch sends nor read what it receives, as in MPI). With a
//!   collective among them, the batches are issued on the stream itself at the wait, in enqueue
//!   order (collectives use the buffers' stream and another NCCL communicator than the groups).
//!   NCCL has no tags: messages between two ranks match in enqueue order and must have the
//!   same length. A request of a start completes once a wait (or synchronize) issued it.
//! - **staged** (any host backend): two 64-bit counters in pinned, device-mapped host memory
//!   (not write-combined). `start` enqueues the device→host copies of the batch's sends and a
//!   `cuStreamWriteValue64` of the trigger; the progress thread (which makes no CUDA call) sees
//!   it, runs the batch on the host backend and stores the completion counter; `wait` enqueues
//!   `cuStreamWaitValue64` on it and the host→device copies of the receives. The device
//!   attribute for stream memory operations is not consulted (it reads 0 on H100 though they
//!   work): the first failing memory operation switches the queue to host functions.
//!
//! A lost peer or a timeout stores the completion counter anyway (a value above every epoch),
//! so no stream waits forever; the error is kept and reported by every request.

use crate::engine::{Batch, Channel, Lend, Mem, Op, Signal, Work};
use crate::request::{DevicePoll, OpState, StatePool, What};
use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use sucl_cuda::cudarc::driver::sys as cu;
use sucl_cuda::cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use sucl_cuda::{ForeignBuffer, StreamSignal};
use sucl_runtime::cuda::{Buffer, DeviceElement, Event, Queue};
use sucl_runtime::{Buf, BufMut, Communicator, Element, Error, ReduceOp, Result};

/// How a device queue moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// NCCL when the communicator set it up on every rank, else staged.
    Auto,
    /// NCCL groups on a side stream of the queue, issued at the wait.
    Nccl,
    /// Device ↔ pinned host copies, stream memory operations and the progress thread over the
    /// communicator's host backend.
    Staged,
}

/// A device buffer shared by handle between the program and a [`CommQueue`](crate::CommQueue) (which keeps a
/// handle until the operation completed, so the memory cannot be freed under a transfer).
/// Either a sucl [`Buffer`] ([`DeviceBuf::new`]; kernels reach it through [`DeviceBuf::lock`])
/// or memory sucl did not allocate ([`DeviceBuf::foreign`]: a torch tensor's, a C caller's),
/// kept alive with its owner. The stream orders kernels with the queue's transfers.
///
/// The queue takes the buffer's device address once, when the `DeviceBuf` is made (the stream
/// then waits for earlier work on the buffer, as cudarc tracks it), and uses it in its stream's
/// order from then on: no event is waited for or recorded per operation, so an enqueue costs
/// what the NCCL call itself costs. Work on *other* streams that touches the buffer must be
/// ordered with the queue explicitly ([`CommQueue::wait_on`](crate::CommQueue::wait_on), events).
pub struct DeviceBuf<T: Element> {
    inner: Arc<dyn Holder<T>>,
    len: usize,
}

impl<T: Element> Clone for DeviceBuf<T> {
    fn clone(&self) -> Self {
        DeviceBuf { inner: self.inner.clone(), len: self.len }
    }
}

impl<T: DeviceElement> DeviceBuf<T> {
    /// Shares `buf`.
    pub fn new(mut buf: Buffer<T>) -> Self {
        use sucl_cuda::DeviceMemoryMut;
        let len = buf.len();
        let stream = buf.queue().stream().clone();
        // The guard records this (notional) write on the stream as it drops here: later users
        // on other streams that cudarc orders wait for everything before it.
        let addr = DeviceMemoryMut::write_ptr(&mut buf, &stream).0;
        DeviceBuf { inner: Arc::new(Shared { mem: Memory::Own(Mutex::new(buf)), addr, stream }), len }
    }

    /// Shares device memory sucl did not allocate: `buf` (its address checked with the driver
    /// when it was made, see [`ForeignBuffer::new`]) and `owner`, whatever keeps that memory
    /// allocated (a tensor), both kept by the queue until the stream ran every operation lent
    /// them and then dropped on the thread of a later queue call (wait, synchronize, close),
    /// or with the last handle. `buf`'s queue must be the stream the [`CommQueue`](crate::CommQueue)
    /// is bound to (checked at enqueue, before anything moves); nothing orders other streams'
    /// work on the memory with the queue (no event is recorded), so order it explicitly.
    ///
    /// Two `DeviceBuf`s over the same memory (address and length) count as one buffer: an
    /// all_reduce from one into the other runs in place, and two operations of one batch that
    /// write it are refused as for one buffer.
    pub fn foreign(buf: ForeignBuffer<T>, owner: Box<dyn Any + Send + Sync>) -> Self {
        let (len, addr) = (buf.len(), buf.addr());
        let stream = sucl_cuda::DeviceMemory::queue(&buf).stream().clone();
        DeviceBuf { inner: Arc::new(Shared { mem: Memory::Foreign { buf: Mutex::new(buf), _owner: owner }, addr, stream }), len }
    }

    /// The buffer, for launching kernels on it or copying it back.
    ///
    /// # Panics
    /// If made by [`DeviceBuf::foreign`] (sucl holds no [`Buffer`] for it; use its owner).
    pub fn lock(&self) -> MutexGuard<'_, Buffer<T>> {
        match locked(&*self.inner) {
            Locked::Own(g) => g,
            Locked::Foreign(_) => panic!("DeviceBuf::lock on memory sucl did not allocate (DeviceBuf::foreign)"),
        }
    }
}

impl<T: Element> DeviceBuf<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A number naming the buffer (every handle of it gives the same; so do two foreign
    /// handles of the same memory).
    pub(crate) fn key(&self) -> usize {
        self.inner.key()
    }

    /// Whether both name the same memory (an operation from one into the other is in place).
    fn same(&self, other: &DeviceBuf<T>) -> bool {
        self.key() == other.key() && self.len == other.len
    }
}

/// What the queue needs of a device buffer whatever its element type.
trait Holder<T: Element>: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    /// The stream of its queue.
    fn stream(&self) -> &Arc<CudaStream>;
    /// Its device address (0 when empty), valid for use in its stream's order.
    fn address(&self) -> u64;
    /// A number naming the memory (see [`DeviceBuf::key`]).
    fn key(&self) -> usize;
    /// A collective over NCCL into this buffer (`send` None: in place).
    fn nccl_coll(&self, comm: &Communicator, send: Option<&dyn Holder<T>>, c: Coll) -> Result<()>;
    /// This handle with its element type erased, to keep the buffer alive (no allocation).
    fn keep(self: Arc<Self>) -> Handle;
}

/// A device buffer's memory, with its address and stream taken once.
struct Shared<T: DeviceElement> {
    mem: Memory<T>,
    addr: u64,
    stream: Arc<CudaStream>,
}

/// The two kinds of device memory a [`DeviceBuf`] shares.
enum Memory<T: DeviceElement> {
    /// A sucl-allocated buffer.
    Own(Mutex<Buffer<T>>),
    /// Memory sucl did not allocate, and what keeps it allocated (dropped after the buffer:
    /// field order).
    Foreign { buf: Mutex<ForeignBuffer<T>>, _owner: Box<dyn Any + Send + Sync> },
}

/// A device buffer's memory, locked for one call of the communicator.
enum Locked<'a, T: DeviceElement> {
    Own(MutexGuard<'a, Buffer<T>>),
    Foreign(MutexGuard<'a, ForeignBuffer<T>>),
}

fn locked<T: DeviceElement>(h: &dyn Holder<T>) -> Locked<'_, T> {
    let s = h.as_any().downcast_ref::<Shared<T>>().expect("a DeviceBuf holds a Shared of its element type");
    match &s.mem {
        Memory::Own(b) => Locked::Own(b.lock().unwrap_or_else(|p| p.into_inner())),
        Memory::Foreign { buf: b, .. } => Locked::Foreign(b.lock().unwrap_or_else(|p| p.into_inner())),
    }
}

impl<T: DeviceElement> Holder<T> for Shared<T> {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn address(&self) -> u64 {
        self.addr
    }

    fn key(&self) -> usize {
        match self.mem {
            // Under CUDA's unified addressing a device address is never a host address, so it
            // cannot collide with another buffer's key. Empty buffers (address 0) are told apart.
            Memory::Foreign { .. } if self.addr != 0 => self.addr as usize,
            _ => self as *const Self as usize,
        }
    }

    fn keep(self: Arc<Self>) -> Handle {
        self
    }

    fn nccl_coll(&self, comm: &Communicator, send: Option<&dyn Holder<T>>, c: Coll) -> Result<()> {
        nccl_coll(comm, self, send, c)
    }
}

/// A collective over NCCL into `recv` (`send` None: in place), whichever kind each buffer is.
fn nccl_coll<T: DeviceElement>(comm: &Communicator, recv: &dyn Holder<T>, send: Option<&dyn Holder<T>>, c: Coll) -> Result<()> {
    let mut r = locked(recv);
    let s = send.map(locked);
    match &mut r {
        Locked::Own(r) => coll_into(comm, &mut **r, s.as_ref(), c),
        Locked::Foreign(r) => coll_into(comm, &mut **r, s.as_ref(), c),
    }
}

fn coll_into<T: DeviceElement, R: BufMut<Elem = T> + ?Sized>(
    comm: &Communicator,
    r: &mut R,
    s: Option<&Locked<'_, T>>,
    c: Coll,
) -> Result<()> {
    match s {
        None => coll::<Buffer<T>, R>(comm, None, r, c, comm.rank()),
        Some(Locked::Own(s)) => coll(comm, Some(&**s), r, c, comm.rank()),
        Some(Locked::Foreign(s)) => coll(comm, Some(&**s), r, c, comm.rank()),
    }
}

/// Runs collective `c` from `send` (None: in place) into `recv`; `rank` names this rank in
/// errors. The one dispatch of both paths (device buffers over NCCL, staging slots on a host
/// backend).
fn coll<S: Buf + ?Sized, R: BufMut<Elem = S::Elem> + ?Sized>(
    comm: &Communicator,
    send: Option<&S>,
    recv: &mut R,
    c: Coll,
    rank: usize,
) -> Result<()> {
    match (c, send) {
        (Coll::AllReduce(op), Some(s)) => comm.all_reduce(s, recv, op),
        (Coll::AllReduce(op), None) => comm.all_reduce_in_place(recv, op),
        (Coll::Broadcast(root), _) => comm.broadcast(recv, root),
        (Coll::AllGather, Some(s)) => comm.all_gather(s, recv),
        (Coll::AllGather, None) => comm.all_gather_in_place(recv),
        (Coll::ReduceScatter(op), Some(s)) => comm.reduce_scatter(s, recv, op),
        (Coll::AllToAll, Some(s)) => comm.all_to_all(s, recv),
        (c, None) => Err(Error::invalid(rank, "send", format!("{} cannot run in place", c.name()))),
    }
}

/// Whether two handles name one CUDA stream: the same handle, or the same `CUstream` of the same
/// context (a stream sucl did not create, wrapped more than once).
fn same_stream(a: &Arc<CudaStream>, b: &Arc<CudaStream>) -> bool {
    Arc::ptr_eq(a, b) || (a.cu_stream() == b.cu_stream() && a.context().cu_ctx() == b.context().cu_ctx())
}

/// The collectives a queue takes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Coll {
    AllReduce(ReduceOp),
    Broadcast(usize),
    AllGather,
    ReduceScatter(ReduceOp),
    AllToAll,
}

impl Coll {
    fn name(self) -> &'static str {
        match self {
            Coll::AllReduce(_) => "all_reduce",
            Coll::Broadcast(_) => "broadcast",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter(_) => "reduce_scatter",
            Coll::AllToAll => "all_to_all",
        }
    }
}

/// Pinned host memory: a staging slot (not write-combined: the CPU reads it).
struct Pinned {
    host: *mut u8,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the allocation is plain host memory owned by this value until drop; every access
// goes through raw pointers whose users order themselves (stream order, the epoch protocol).
unsafe impl Send for Pinned {}
// SAFETY: as above.
unsafe impl Sync for Pinned {}

impl Pinned {
    fn new(ctx: &Arc<CudaContext>, bytes: usize, rank: usize) -> Result<Pinned> {
        ctx.bind_to_thread().map_err(|e| sucl_cuda::cuda_err(rank, "binding the context", e))?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: allocating; the pointer is checked before use.
        check(unsafe { cu::cuMemHostAlloc(&mut p, bytes.max(8), cu::CU_MEMHOSTALLOC_PORTABLE) }, rank, "allocating pinned host memory")?;
        Ok(Pinned { host: p as *mut u8, bytes, ctx: ctx.clone() })
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by cuMemHostAlloc; no stream work uses it any more (its owners keep
        // it until their copies ran: see the slot pool and the queue's shutdown).
        unsafe { cu::cuMemFreeHost(self.host as *mut std::ffi::c_void) };
    }
}

fn check(rc: cu::CUresult, rank: usize, during: &str) -> Result<()> {
    if rc == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::BackendUnavailable { rank, backend: "cuda".into(), why: format!("{during}: {rc:?}") })
    }
}

/// A device buffer's handle with its element type erased: what keeps the memory alive until the
/// stream ran every use of it (a reference count, not an allocation per operation).
type Handle = Arc<dyn Send + Sync>;

/// The handles one operation keeps: its result buffer and, for a collective with a distinct
/// input, that one.
type Keep = (Handle, Option<Handle>);

impl<T: Element> DeviceBuf<T> {
    /// The handles an operation on this buffer (and `also`, if another buffer) keeps.
    fn keep(&self, also: Option<&DeviceBuf<T>>) -> Keep {
        (self.inner.clone().keep(), also.map(|a| a.inner.clone().keep()))
    }
}

/// The staged queue's free pinned slots (see `slot_pool`).
type SlotPool = crate::slot_pool::SlotPool<Pinned, Event>;

impl crate::slot_pool::Slot for Pinned {
    fn bytes(&self) -> usize {
        self.bytes
    }
}

impl crate::slot_pool::Done for Event {
    fn is_complete(&self) -> bool {
        Event::is_complete(self)
    }
}

/// The trigger and completion counters of a staged queue (see `sucl_cuda::StreamSignal`,
/// shared with the runtime's staged collectives).
impl Signal for &'static StreamSignal {
    fn triggered(&self) -> u64 {
        StreamSignal::triggered(self)
    }
    fn complete(&self, epoch: u64) {
        StreamSignal::complete(self, epoch)
    }
    fn polled(&self) -> bool {
        true
    }
}

/// A pinned staging slot lent to the host backend.
struct SlotLend(Arc<Pinned>, usize);

impl Lend for SlotLend {
    fn try_lend(&mut self) -> Option<(*mut u8, usize)> {
        Some((self.0.host, self.1))
    }
    fn give_back(&mut self) {}
}

/// A copy between a device buffer and its slot.
struct Copy {
    dev: u64,
    slot: Arc<Pinned>,
    bytes: usize,
}

/// A staged operation between enqueue and start.
struct StagedOp {
    downloads: Vec<Copy>,
    uploads: Vec<Copy>,
    op: Op,
    /// Keeps the device buffers alive until the stream ran every copy of them. Released on the
    /// program's thread (after the event recorded at the covering wait), never by the progress
    /// thread, which must not free CUDA memory.
    hold: Keep,
}

/// Uploads that wait for a stream wait, with the handles that keep their buffers alive.
struct AwaitingUpload {
    epoch: u64,
    copies: Vec<Copy>,
    keep: Vec<Keep>,
}

/// A collective issued on the stream over NCCL.
type NcclColl = Box<dyn FnOnce(&Communicator) -> Result<()> + Send>;

/// Device buffer handles kept until the event after their last stream use completed.
type HeldHandles = Vec<(Arc<Event>, Vec<Keep>)>;

/// An NCCL-path operation between enqueue and start.
enum NcclOp {
    Send {
        addr: u64,
        bytes: usize,
        peer: usize,
    },
    Recv {
        addr: u64,
        bytes: usize,
        peer: usize,
    },
    Coll(NcclColl),
    /// A collective already issued (its closure consumed).
    Spent,
}

/// An NCCL-path operation with its request's state and the handles that keep its buffers.
type NcclEntry = (NcclOp, Arc<OpState>, Keep);

/// Lists the NCCL path reuses from one wait to the next, so that issuing a batch allocates
/// nothing once they have grown: the group's sends and receives, and emptied lists of held
/// handles.
#[derive(Default)]
struct IssueScratch {
    sends: Vec<(u64, usize, usize)>,
    recvs: Vec<(u64, usize, usize)>,
    spare_keeps: Vec<Vec<Keep>>,
}

impl IssueScratch {
    /// Most emptied handle lists kept.
    const SPARE: usize = 8;

    /// Takes back the handle lists of released starts (their handles dropped here).
    fn recycle(&mut self, released: impl Iterator<Item = Vec<Keep>>) {
        for mut k in released {
            k.clear();
            if self.spare_keeps.len() < Self::SPARE {
                self.spare_keeps.push(k);
            }
        }
    }
}

/// Where the NCCL path issues its groups: a stream of its own, forked from the queue's stream
/// at the last start that had operations and joined back into it at the wait. Both events are
/// made once and re-recorded (a stream wait takes the record current when it is enqueued), so a
/// batch allocates nothing here.
struct SideStream {
    queue: Queue,
    /// Recorded on the queue's stream at each start with operations: what the batch must see.
    fork: CudaEvent,
    /// Recorded on the side stream after the groups issued at a wait.
    join: CudaEvent,
}

impl SideStream {
    fn new(queue: &Queue, rank: usize) -> Result<SideStream> {
        let ctx = queue.device().context();
        let err = |during: &'static str| move |e| sucl_cuda::cuda_err(rank, during, e);
        let fork = ctx.new_event(None).map_err(err("creating the fork event"))?;
        let join = ctx.new_event(None).map_err(err("creating the join event"))?;
        Ok(SideStream { queue: queue.device().queue()?, fork, join })
    }
}

enum Mode {
    Nccl {
        comm: Box<Communicator>,
        pending: Vec<NcclEntry>,
        /// Operations of the starts since the last wait, issued together at the next wait (or
        /// synchronize): NCCL runs a communicator's kernels one after the other whatever stream
        /// they are on, so a start issued as its own group could hold the groups of later
        /// starts behind a receive whose send is in one of them.
        posted: Vec<NcclEntry>,
        /// The last start whose operations are in `posted`.
        posted_epoch: u64,
        side: SideStream,
        /// Handles of started operations by start epoch, released once the tracker saw it
        /// complete.
        held: Vec<(u64, Vec<Keep>)>,
        /// The length of `held` at which the next wait asks the tracker what completed (one
        /// event query per [`HELD_CHECK`] waits at most, not one per wait).
        check_at: usize,
        scratch: Box<IssueScratch>,
        tracker: Arc<Tracker>,
        /// The completion of the next start, shared by the requests of its operations (made at
        /// its first enqueue).
        mark: Option<Arc<dyn DevicePoll>>,
        failed: Option<Error>,
    },
    Staged {
        ch: Arc<Channel>,
        signal: &'static StreamSignal,
        pending: Vec<StagedOp>,
        /// An emptied operation list (handed back by the engine) for the next start's batch.
        spare_ops: Vec<Op>,
        awaiting: Vec<AwaitingUpload>,
        /// Slots not in use, with the event after their last upload.
        pool: SlotPool,
        /// The epoch the last stream wait covered.
        waited: u64,
        /// Handles of buffers whose uploads were enqueued, released once their event completed.
        held: HeldHandles,
    },
    /// After `close`.
    Closed,
}

/// A CUDA stream's side of a [`CommQueue`](crate::CommQueue).
pub(crate) struct DevicePath {
    queue: Queue,
    mode: Mode,
    rank: usize,
}

impl DevicePath {
    /// Binds `comm` to the CUDA stream of `queue`. Collective (it sets up the communicator's
    /// device side on `queue`'s GPU). `Transport::Auto` takes NCCL when every rank has it.
    pub(crate) fn new(comm: Communicator, queue: &Queue, transport: Transport) -> Result<DevicePath> {
        comm.attach_device(queue.device())?;
        let nccl = match transport {
            Transport::Auto => comm.device_backends().contains(&"nccl"),
            Transport::Nccl => true,
            Transport::Staged => false,
        };
        let rank = comm.world_rank_of(comm.rank()).unwrap_or(comm.rank());
        let mode = if nccl {
            comm.pin_backend(Some("nccl"))?;
            let tracker = Arc::new(Tracker::new(queue.clone()));
            let side = SideStream::new(queue, rank)?;
            Mode::Nccl {
                comm: Box::new(comm),
                pending: vec![],
                posted: vec![],
                posted_epoch: 0,
                side,
                held: vec![],
                check_at: HELD_CHECK,
                scratch: Box::default(),
                tracker,
                mark: None,
                failed: None,
            }
        } else {
            let signal = StreamSignal::leak(queue.device())?;
            let ch = Channel::new(comm, Box::new(signal))?;
            Mode::Staged {
                ch,
                signal,
                pending: vec![],
                spare_ops: vec![],
                awaiting: vec![],
                pool: SlotPool::default(),
                waited: 0,
                held: vec![],
            }
        };
        Ok(DevicePath { queue: queue.clone(), mode, rank })
    }

    /// Which transport this queue uses (`None` once closed).
    pub(crate) fn transport(&self) -> Option<Transport> {
        match self.mode {
            Mode::Nccl { .. } => Some(Transport::Nccl),
            Mode::Staged { .. } => Some(Transport::Staged),
            Mode::Closed => None,
        }
    }

    /// The communicator the NCCL path issues its groups on.
    pub(crate) fn nccl_communicator(&self) -> Option<&Communicator> {
        match &self.mode {
            Mode::Nccl { comm, .. } => Some(comm),
            _ => None,
        }
    }

    /// The channel of the staged path (whose batches the progress thread runs).
    pub(crate) fn channel(&self) -> Option<&Arc<Channel>> {
        match &self.mode {
            Mode::Staged { ch, .. } => Some(ch),
            _ => None,
        }
    }

    /// The bound device queue.
    pub(crate) fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Whether the bound stream has run everything enqueued on it (no wait).
    pub(crate) fn stream_idle(&self) -> bool {
        // SAFETY: querying a live stream.
        let rc = unsafe { cu::cuStreamQuery(self.queue.stream().cu_stream()) };
        rc == cu::CUresult::CUDA_SUCCESS
    }

    fn check_buffer<T: Element>(&self, b: &DeviceBuf<T>) -> Result<()> {
        if !same_stream(b.inner.stream(), self.queue.stream()) {
            return Err(Error::invalid(self.rank, "buffer", "belongs to another stream than the one this CommQueue is bound to"));
        }
        Ok(())
    }

    /// A staging slot of at least `bytes`: a free one from the pool, else a new allocation.
    fn slot(&mut self, bytes: usize) -> Result<Arc<Pinned>> {
        let Mode::Staged { pool, .. } = &mut self.mode else { unreachable!("staged") };
        if let Some(s) = pool.take(bytes) {
            return Ok(s);
        }
        let s = Arc::new(Pinned::new(self.queue.device().context(), SlotPool::class_bytes(bytes), self.rank)?);
        Ok(s)
    }

    fn recycle(&mut self, slots: impl IntoIterator<Item = Arc<Pinned>>, ev: &Arc<Event>) {
        let Mode::Staged { pool, .. } = &mut self.mode else { return };
        for s in slots {
            pool.put(s, Some(ev.clone()));
        }
    }

    pub(crate) fn failure(&self) -> Option<Error> {
        match &self.mode {
            Mode::Nccl { failed, .. } => failed.as_ref().cloned(),
            Mode::Staged { ch, .. } => ch.error(),
            Mode::Closed => None,
        }
    }

    /// Synchronizes the stream. Returns whether every started operation is now known to have
    /// completed without an error of its own (NCCL: a failed issue fails the queue, and a
    /// group's completion is the stream's), so that the queue need not ask each request.
    pub(crate) fn synchronize(&mut self) -> Result<bool> {
        let r = match &mut self.mode {
            Mode::Nccl { .. } => {
                // Starts not waited for are issued now (the host waits for them below).
                let issued = self.issue_posted();
                let Mode::Nccl { comm, held, failed, tracker, scratch, check_at, .. } = &mut self.mode else { unreachable!("nccl") };
                let r = comm.synchronize(&self.queue).and(issued);
                match &r {
                    Err(e) => {
                        failed.get_or_insert(e.clone());
                    }
                    Ok(()) => tracker.synchronized(),
                }
                scratch.recycle(held.drain(..).map(|(_, k)| k));
                *check_at = HELD_CHECK;
                r.map(|()| failed.is_none())
            }
            Mode::Staged { held, .. } => {
                let r = self.queue.synchronize();
                held.clear();
                r.map(|()| false)
            }
            Mode::Closed => Ok(false),
        };
        if let Mode::Staged { pool, .. } = &mut self.mode {
            pool.synchronized();
        }
        r
    }

    pub(crate) fn take_comm(&mut self, bound: Duration) -> Result<Communicator> {
        let _ = self.queue.synchronize();
        match std::mem::replace(&mut self.mode, Mode::Closed) {
            Mode::Closed => Err(Error::Config("the queue's communicator was already taken".into())),
            Mode::Nccl { comm, .. } => {
                let _ = comm.pin_backend(None);
                Ok(*comm)
            }
            Mode::Staged { ch, .. } => ch.take_comm(bound),
        }
    }
}

/// Completion of the NCCL path's starts, learned from events recorded only when someone asks
/// (a request's test or wait, releasing held buffers, synchronize) — a start records none, so
/// it issues exactly what a direct NCCL group issues. One event recorded after start `e` was
/// issued covers every start up to `e` (stream order), so it serves every request of them.
struct Tracker {
    queue: Queue,
    /// The last start whose group was issued on the stream.
    issued: AtomicU64,
    /// Every start up to this one completed.
    completed: AtomicU64,
    /// The newest event recorded, with the last start issued before it was.
    latest: Mutex<Option<(u64, Event)>>,
}

impl Tracker {
    fn new(queue: Queue) -> Tracker {
        Tracker { queue, issued: AtomicU64::new(0), completed: AtomicU64::new(0), latest: Mutex::new(None) }
    }

    /// Whether every start up to `epoch` (already issued) completed; records an event if none
    /// recorded so far covers `epoch`.
    fn done_up_to(&self, epoch: u64) -> Result<bool> {
        if self.completed.load(Ordering::Acquire) >= epoch {
            return Ok(true);
        }
        if self.issued.load(Ordering::Acquire) < epoch {
            // Not issued yet (its operations were enqueued, their start not reached).
            return Ok(false);
        }
        let mut g = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        if g.as_ref().is_none_or(|(covers, _)| *covers < epoch) {
            // Read before recording: the event then follows every group issued up to `covers`.
            let covers = self.issued.load(Ordering::Acquire);
            *g = Some((covers, self.queue.record()?));
        }
        let (covers, ev) = g.as_ref().expect("set above");
        if ev.is_complete() {
            self.completed.fetch_max(*covers, Ordering::AcqRel);
            return Ok(true);
        }
        Ok(false)
    }

    /// After a host synchronize of the stream: everything issued completed.
    fn synchronized(&self) {
        self.completed.fetch_max(self.issued.load(Ordering::Acquire), Ordering::AcqRel);
    }
}

/// The completion of one NCCL-path start, for its requests.
struct Mark {
    tracker: Arc<Tracker>,
    epoch: u64,
}

impl DevicePoll for Mark {
    fn poll(&self) -> Result<bool> {
        self.tracker.done_up_to(self.epoch)
    }
    fn known_done(&self) -> bool {
        self.tracker.completed.load(Ordering::Acquire) >= self.epoch
    }
}

/// Held handles beyond which a start releases those of completed starts.
const HELD_CHECK: usize = 64;

impl DevicePath {
    /// On the NCCL path, the state of a new operation of the start `epoch` (the next one):
    /// complete (with `bytes`) once the stream ran that start's group. `None` on the staged path.
    fn nccl_state(&mut self, elem: usize, what: What, bytes: usize, epoch: u64, states: &mut StatePool) -> Option<Arc<OpState>> {
        let Mode::Nccl { tracker, mark, .. } = &mut self.mode else { return None };
        let poll = mark.get_or_insert_with(|| Arc::new(Mark { tracker: tracker.clone(), epoch })).clone();
        Some(states.make(elem, what, self.rank, Some((poll, bytes))))
    }

    /// Enqueues a send or receive of a device buffer (not to `PROC_NULL`) for start `epoch`
    /// (the next one); returns the operation's state for its request.
    pub(crate) fn enqueue_p2p<T: Element>(
        &mut self,
        b: &DeviceBuf<T>,
        peer: usize,
        tag: u32,
        send: bool,
        epoch: u64,
        states: &mut StatePool,
    ) -> Result<Arc<OpState>> {
        self.check_buffer(b)?;
        let es = std::mem::size_of::<T>();
        let bytes = b.len() * es;
        let what = if send { What::Send { peer, tag } } else { What::Recv { peer, tag } };
        let keep = b.keep(None);
        if let Some(state) = self.nccl_state(es, what, bytes, epoch, states) {
            let addr = b.inner.address();
            let op = if send { NcclOp::Send { addr, bytes, peer } } else { NcclOp::Recv { addr, bytes, peer } };
            if let Mode::Nccl { pending, .. } = &mut self.mode {
                pending.push((op, state.clone(), keep));
            }
            return Ok(state);
        }
        let state = states.make(es, what, self.rank, None);
        let slot = self.slot(bytes)?;
        let copy = Copy { dev: b.inner.address(), slot: slot.clone(), bytes };
        let mem = Mem::Other(Box::new(SlotLend(slot, bytes)));
        let staged = if send {
            StagedOp { downloads: vec![copy], uploads: vec![], op: Op::new(Work::Send { peer, tag, mem }, state.clone(), None), hold: keep }
        } else {
            // The upload is enqueued before the length is known: the message must fill the
            // buffer (NCCL's rule too), or stale slot bytes would reach the device.
            StagedOp {
                downloads: vec![],
                uploads: vec![copy],
                op: Op::new(Work::Recv { peer, tag, mem }, state.clone(), Some(bytes)),
                hold: keep,
            }
        };
        if let Mode::Staged { pending, .. } = &mut self.mode {
            pending.push(staged);
        }
        Ok(state)
    }

    /// Enqueues a collective over device buffers (`recv` is the result; `send` may be `recv`)
    /// for start `epoch` (the next one); returns the operation's state for its request.
    pub(crate) fn enqueue_coll<T: Element>(
        &mut self,
        c: Coll,
        send: &DeviceBuf<T>,
        recv: &DeviceBuf<T>,
        epoch: u64,
        states: &mut StatePool,
    ) -> Result<Arc<OpState>> {
        self.check_buffer(send)?;
        self.check_buffer(recv)?;
        let in_place = send.same(recv) || matches!(c, Coll::Broadcast(_));
        if in_place && matches!(c, Coll::ReduceScatter(_) | Coll::AllToAll) {
            return Err(Error::invalid(self.rank, "recv", format!("{} cannot run in place: pass two buffers", c.name())));
        }
        let es = std::mem::size_of::<T>();
        let (sb, rb) = (send.len() * es, recv.len() * es);
        let keep = recv.keep((!send.same(recv)).then_some(send));
        if let Some(state) = self.nccl_state(es, What::Coll(c.name()), 0, epoch, states) {
            let (s, r) = (send.clone(), recv.clone());
            let f = move |comm: &Communicator| r.inner.nccl_coll(comm, if in_place { None } else { Some(&*s.inner) }, c);
            if let Mode::Nccl { pending, .. } = &mut self.mode {
                pending.push((NcclOp::Coll(Box::new(f)), state.clone(), keep));
            }
            return Ok(state);
        }
        let state = states.make(es, What::Coll(c.name()), self.rank, None);
        let rslot = self.slot(rb)?;
        let sslot = if in_place { None } else { Some(self.slot(sb)?) };
        let download = match &sslot {
            Some(ss) => Copy { dev: send.inner.address(), slot: ss.clone(), bytes: sb },
            None => Copy { dev: recv.inner.address(), slot: rslot.clone(), bytes: rb },
        };
        let upload = Copy { dev: recv.inner.address(), slot: rslot.clone(), bytes: rb };
        let (slen, rlen, rank) = (send.len(), recv.len(), self.rank);
        let work = Work::Coll(Box::new(move |comm: &Communicator, _deadline| {
            // SAFETY: the slots are pinned host memory of at least these sizes, kept alive by
            // this closure; between the trigger (after the device→host copies) and the
            // completion store (before the host→device copies) nothing else touches them.
            let r = unsafe { std::slice::from_raw_parts_mut(rslot.host as *mut T, rlen) };
            let s = sslot.as_ref().map(|ss| {
                // SAFETY: as above; a distinct slot from `r`.
                unsafe { std::slice::from_raw_parts(ss.host as *const T, slen) }
            });
            coll::<[T], [T]>(comm, s, r, c, rank)?;
            Ok(Some(rlen * std::mem::size_of::<T>()))
        }));
        let op = Op::new(work, state.clone(), None);
        if let Mode::Staged { pending, .. } = &mut self.mode {
            pending.push(StagedOp { downloads: vec![download], uploads: vec![upload], op, hold: keep });
        }
        Ok(state)
    }

    /// Issues the operations enqueued since the last start as start `epoch` (see
    /// [`CommQueue::start`](crate::CommQueue::start)).
    pub(crate) fn start(&mut self, epoch: u64, bound: Duration) -> Result<()> {
        // A buffer this batch sends from that an earlier start not yet waited for receives
        // into: the staged path uploads received data at a wait, so put that wait on the stream
        // first (the NCCL path's groups run in stream order, which gives the same order).
        if let Some(writer) = self.earlier_upload_read() {
            self.wait(writer, bound)?;
        }
        let d = self;
        let rank = d.rank;
        let stream = d.queue.stream().clone();
        let cs = stream.cu_stream();
        match &mut d.mode {
            Mode::Nccl { pending, posted, posted_epoch, side, mark, failed, .. } => {
                // The requests already hold this start's completion (made at enqueue).
                mark.take();
                if pending.is_empty() {
                    return Ok(());
                }
                // What the batch sends was written by the stream's work up to here; the groups
                // issued at the wait start from this point, not from the wait's.
                if let Err(e) = side.fork.record(&stream) {
                    let e = sucl_cuda::cuda_err(rank, "recording the start on the stream", e);
                    for (_, state, _) in pending.drain(..) {
                        state.complete(Err(e.clone()));
                    }
                    failed.get_or_insert(e.clone());
                    return Err(e);
                }
                if posted.is_empty() {
                    // The usual case (one start per wait): hand the list over, keeping both
                    // lists' capacities, instead of copying the batch.
                    std::mem::swap(posted, pending);
                } else {
                    posted.append(pending);
                }
                *posted_epoch = epoch;
                Ok(())
            }
            Mode::Staged { ch, signal, pending, spare_ops, awaiting, pool, .. } => {
                d.queue.device().context().bind_to_thread().map_err(|e| sucl_cuda::cuda_err(rank, "binding the context", e))?;
                let mut uploads = vec![];
                let mut holds = vec![];
                let mut sent_slots = vec![];
                let mut batch = std::mem::take(spare_ops);
                for so in pending.drain(..) {
                    for c in &so.downloads {
                        // SAFETY: the device buffer and the slot are kept alive by the operation
                        // until the stream ran the copy (the slot returns to the pool only after
                        // the host backend completed, which follows the trigger after this copy).
                        let rc = unsafe { cu::cuMemcpyDtoHAsync_v2(c.slot.host as *mut std::ffi::c_void, c.dev, c.bytes, cs) };
                        check(rc, rank, "enqueueing a device→host copy")?;
                    }
                    // Slots only read by the host backend go back to the pool now (the pool keeps a
                    // reference, so the progress thread never frees them); they are reused once
                    // the engine let go of them. Slots also uploaded return at the wait.
                    for c in so.downloads {
                        if !so.uploads.iter().any(|u| Arc::ptr_eq(&u.slot, &c.slot)) {
                            sent_slots.push(c.slot);
                        }
                    }
                    uploads.extend(so.uploads);
                    holds.push(so.hold);
                    batch.push(so.op);
                }
                for s in sent_slots {
                    pool.put(s, None);
                }
                *spare_ops = ch.submit(Batch { epoch, ops: batch });
                awaiting.push(AwaitingUpload { epoch, copies: uploads, keep: holds });
                signal.trigger_on(&stream, epoch)
            }
            Mode::Closed => Err(Error::Config("the queue was closed".into())),
        }
    }
}

impl DevicePath {
    /// NCCL: issues the operations of every start since the last wait as one batch on the side
    /// stream, after the stream's work up to the last of those starts (the fork event), and
    /// makes the queue's stream wait for them (the join event). Neither the host nor the
    /// queue's stream waits for them before this, so the kernels enqueued between a start and
    /// its wait run while the groups do. With a collective among them, the batch is issued on
    /// the queue's stream instead, in enqueue order.
    fn issue_posted(&mut self) -> Result<()> {
        let rank = self.rank;
        let Mode::Nccl { comm, posted, posted_epoch, side, held, check_at, scratch, tracker, failed, .. } = &mut self.mode else {
            return Ok(());
        };
        if posted.is_empty() {
            return Ok(());
        }
        let epoch = *posted_epoch;
        let (keeps, issued) = if posted.iter().any(|(op, ..)| matches!(op, NcclOp::Coll(_))) {
            // Collectives run on the buffers' stream (this one), and on another NCCL
            // communicator than the groups: kept in enqueue order with them on this stream, so
            // a collective and a send or receive of two starts never race on a buffer.
            issue_nccl(comm, &self.queue, posted, epoch, scratch)
        } else {
            issue_on_side(comm, side, &self.queue, posted, epoch, rank, scratch)
        };
        // Whatever was issued of these starts precedes any event recorded on the queue's
        // stream from now on.
        tracker.issued.store(epoch, Ordering::Release);
        if !keeps.is_empty() {
            held.push((epoch, keeps));
        }
        if let Err(e) = issued {
            failed.get_or_insert(e.clone());
            return Err(e);
        }
        if held.len() >= *check_at {
            // The oldest start's event is usually recorded already (one query).
            tracker.done_up_to(held[0].0)?;
            let done = tracker.completed.load(Ordering::Acquire);
            // `held` is in start order.
            let released = held.iter().take_while(|(e, _)| *e <= done).count();
            scratch.recycle(held.drain(..released).map(|(_, k)| k));
            *check_at = held.len() + HELD_CHECK;
        }
        Ok(())
    }
}

/// Issues `posted` on the side stream after the fork event and makes `queue`'s stream wait for
/// it (the join event); returns what [`issue_nccl`] returns.
fn issue_on_side(
    comm: &Communicator,
    side: &SideStream,
    queue: &Queue,
    posted: &mut Vec<NcclEntry>,
    epoch: u64,
    rank: usize,
    scratch: &mut IssueScratch,
) -> (Vec<Keep>, Result<()>) {
    let cuda = |during: &'static str| move |e| sucl_cuda::cuda_err(rank, during, e);
    let (keeps, issued) = match side.queue.stream().wait(&side.fork) {
        Ok(()) => issue_nccl(comm, &side.queue, posted, epoch, scratch),
        Err(e) => {
            let e = cuda("ordering the side stream after the start")(e);
            for (_, state, _) in posted.drain(..) {
                state.complete(Err(e.clone()));
            }
            return (vec![], Err(e));
        }
    };
    // Later work on the queue's stream runs after the groups (also after a failed issue: what
    // was issued before the failure may still use the buffers).
    let joined = side
        .join
        .record(side.queue.stream())
        .and_then(|()| queue.stream().wait(&side.join))
        .map_err(cuda("ordering the stream after the side stream"));
    (keeps, issued.and(joined))
}

/// Issues a batch over NCCL (emptying `posted`): runs of sends and receives as one group each
/// (a batch of point-to-point operations is exactly one group), collectives where they stand.
/// If an issue fails, every operation of the batch fails with its error (none is left to time
/// out). Returns the handles that keep the batch's buffers alive — also on failure, since
/// groups issued before the failing call may still use them. Allocates nothing once
/// `scratch`'s lists have grown.
fn issue_nccl(
    comm: &Communicator,
    queue: &Queue,
    posted: &mut Vec<NcclEntry>,
    epoch: u64,
    scratch: &mut IssueScratch,
) -> (Vec<Keep>, Result<()>) {
    let r = issue_runs(comm, queue, posted, &mut scratch.sends, &mut scratch.recvs);
    if let Err(e) = &r {
        tracing::error!(rank = comm.rank(), epoch, error = %e, "issuing a stream-triggered NCCL batch failed");
        for (_, state, _) in posted.iter() {
            state.complete(Err(e.clone()));
        }
    }
    let mut keeps = scratch.spare_keeps.pop().unwrap_or_default();
    keeps.extend(posted.drain(..).map(|(_, _, keep)| keep));
    (keeps, r)
}

fn issue_runs(
    comm: &Communicator,
    queue: &Queue,
    posted: &mut [NcclEntry],
    sends: &mut Vec<(u64, usize, usize)>,
    recvs: &mut Vec<(u64, usize, usize)>,
) -> Result<()> {
    sends.clear();
    recvs.clear();
    let flush = |sends: &mut Vec<(u64, usize, usize)>, recvs: &mut Vec<(u64, usize, usize)>| -> Result<()> {
        if sends.is_empty() && recvs.is_empty() {
            return Ok(());
        }
        // SAFETY: every address comes from a DeviceBuf on `queue` that the queue holds until
        // the event recorded after this group completed.
        let r = unsafe { comm.nccl_group_p2p(sends, recvs, queue) };
        sends.clear();
        recvs.clear();
        r
    };
    for (op, ..) in posted.iter_mut() {
        match op {
            NcclOp::Send { addr, bytes, peer } => sends.push((*addr, *bytes, *peer)),
            NcclOp::Recv { addr, bytes, peer } => recvs.push((*addr, *bytes, *peer)),
            NcclOp::Coll(_) => {
                flush(sends, recvs)?;
                if let NcclOp::Coll(f) = std::mem::replace(op, NcclOp::Spent) {
                    f(comm)?;
                }
            }
            NcclOp::Spent => {}
        }
    }
    flush(sends, recvs)
}

impl DevicePath {
    /// The newest start not yet waited for whose uploads write device memory that an
    /// operation enqueued since the last start reads (staged path only; `None` in the usual
    /// program, which waits before reusing a buffer).
    fn earlier_upload_read(&self) -> Option<u64> {
        let Mode::Staged { pending, awaiting, .. } = &self.mode else { return None };
        let overlaps = |a: &Copy, b: &Copy| a.dev < b.dev + b.bytes as u64 && b.dev < a.dev + a.bytes as u64;
        awaiting
            .iter()
            .rev()
            .find(|a| a.copies.iter().any(|up| pending.iter().flat_map(|so| &so.downloads).any(|down| overlaps(up, down))))
            .map(|a| a.epoch)
    }

    /// Holds later work on the stream until every operation started up to `epoch` completed
    /// (bounded by `bound`), then uploads the received data (see
    /// [`CommQueue::wait`](crate::CommQueue::wait)).
    pub(crate) fn wait(&mut self, epoch: u64, bound: Duration) -> Result<()> {
        let d = self;
        let rank = d.rank;
        let cs = d.queue.stream().cu_stream();
        if let Mode::Nccl { .. } = d.mode {
            return d.issue_posted();
        }
        let Mode::Staged { signal, awaiting, waited, held, .. } = &mut d.mode else {
            return Ok(());
        };
        if epoch <= *waited {
            return Ok(());
        }
        d.queue.device().context().bind_to_thread().map_err(|e| sucl_cuda::cuda_err(rank, "binding the context", e))?;
        signal.wait_on(d.queue.stream(), epoch, bound)?;
        *waited = epoch;
        let mut slots = vec![];
        let mut keeps: Vec<Keep> = vec![];
        // In start order: those up to `epoch` leave the list (which keeps its capacity, so an
        // empty start + wait allocates nothing).
        let ready = awaiting.iter().take_while(|a| a.epoch <= epoch).count();
        for a in awaiting.drain(..ready) {
            for c in a.copies {
                // SAFETY: the slot and the device buffer stay alive until the event recorded below
                // completed (slot pool, `held`); the stream runs this copy after the wait above.
                let rc = unsafe { cu::cuMemcpyHtoDAsync_v2(c.dev, c.slot.host as *const std::ffi::c_void, c.bytes, cs) };
                check(rc, rank, "enqueueing a host→device copy")?;
                slots.push(c.slot);
            }
            keeps.extend(a.keep);
        }
        if slots.is_empty() && keeps.is_empty() {
            // Nothing was uploaded and no buffer handle waits for its release (empty batches): no
            // event to record, so an empty start + wait is one stream write and one stream wait.
            return Ok(());
        }
        let ev = Arc::new(d.queue.record()?);
        // Events complete in stream order: release from the front, one query for the first one
        // still pending instead of one for each.
        let done = held.iter().position(|(e, _)| !e.is_complete()).unwrap_or(held.len());
        held.drain(..done);
        held.push((ev.clone(), keeps));
        d.recycle(slots, &ev);
        Ok(())
    }
}
