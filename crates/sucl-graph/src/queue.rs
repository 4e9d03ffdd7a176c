//! The program API: a distributed queue ([`DistrQueue`]) over a communicator, typed buffers
//! ([`Buffer`]) and command groups that declare accessors and then run a kernel, a host task or
//! nothing (a fence hands data back instead).
//!
//! ```no_run
//! use sucl_graph::{DistrQueue, mappers::*};
//! let comm = sucl_runtime::init()?;
//! let mut q = DistrQueue::new(&comm)?;
//! let x = q.buffer_from::<f64, 1>([1024], (0..1024).map(|i| i as f64).collect())?;
//! let y = q.buffer::<f64, 1>([1024])?;
//! q.submit(|cgh| {
//!     let src = cgh.read(&x, all());
//!     let dst = cgh.discard_write(&y, one_to_one());
//!     cgh.parallel_for([1024], move |chunk, k| {
//!         let (src, mut dst) = (k.read(&src), k.write(&dst));
//!         let total: f64 = src.slice([0], 1024).iter().sum();
//!         for i in chunk.offset[0]..chunk.offset[0] + chunk.range[0] {
//!             dst.set([i], total - src.get([i]));
//!         }
//!     })
//! })?;
//! let result: Vec<f64> = q.fence_all(&y)?;
//! # Ok::<(), sucl_graph::GraphError>(())
//! ```
//!
//! Every rank runs the same program. Each submission becomes a task of the task graph; the
//! rank generates its own commands for it and runs them at once (in order, which respects every
//! dependency): the transfers of the task (pushes and await-pushes, every buffer) are posted
//! together and waited for together, then the rank's chunk of the kernel runs on worker threads
//! (the chunk is cut along dimension 0 into one piece per thread, when the pieces' accesses
//! are disjoint). Because every rank visits the tasks in the same order and every push of task
//! t meets an await-push of task t, no rank can wait on a peer that waits on it; every wait is
//! bounded by the communicator's timeout.
//!
//! Kernels see buffers only through views that check every index against the cells their
//! accessor declared for the piece being run, so a kernel that reads data it did not declare
//! fails loudly instead of reading stale cells on some rank counts.

use crate::command::{CollectiveOp, Command, CommandKind, Scheduler};
use crate::device::{CudaLaunch, CudaSource, DeviceRank, DeviceTransport, KernelArg};
use crate::geometry::{GridBox, Index, Region, MAX_DIMS};
use crate::mapper::{Chunk, RangeMapper};
use crate::task::{AccessMode, Accessor, BufferId, SplitHint, TaskId, TaskSpec};
use crate::GraphError;
use std::any::Any;
use std::cell::Cell;
use std::collections::BTreeSet;
use std::marker::PhantomData;
use std::path::PathBuf;
use sucl_runtime::{Communicator, Element, MAX_TAG};

/// Range mapper constructors, for `cgh.read(&buffer, one_to_one())` and the like.
pub mod mappers {
    use crate::geometry::{GridBox, MAX_DIMS};
    use crate::mapper::RangeMapper;

    /// The cells with the chunk's own indices.
    pub fn one_to_one() -> RangeMapper {
        RangeMapper::OneToOne
    }

    /// The whole buffer.
    pub fn all() -> RangeMapper {
        RangeMapper::All
    }

    /// The fixed box `[min, max)` (missing dimensions: 0..1).
    pub fn fixed(min: &[usize], max: &[usize]) -> RangeMapper {
        let mut lo = [0; MAX_DIMS];
        let mut hi = [1; MAX_DIMS];
        lo[..min.len().min(MAX_DIMS)].copy_from_slice(&min[..min.len().min(MAX_DIMS)]);
        hi[..max.len().min(MAX_DIMS)].copy_from_slice(&max[..max.len().min(MAX_DIMS)]);
        RangeMapper::Fixed(GridBox::new(lo, hi))
    }

    /// The chunk widened by `halo[d]` cells on both sides along dimension `d` (a bounding box,
    /// so the corners are included: the shape of a stencil with diagonals).
    pub fn neighborhood(halo: &[usize]) -> RangeMapper {
        let mut h = [0; MAX_DIMS];
        h[..halo.len().min(MAX_DIMS)].copy_from_slice(&halo[..halo.len().min(MAX_DIMS)]);
        RangeMapper::Neighborhood(h)
    }

    /// The chunk widened by `halo[d]` cells along one axis at a time (a cross: the shape of a
    /// stencil without diagonals).
    pub fn neighborhood_axes(halo: &[usize]) -> RangeMapper {
        let mut h = [0; MAX_DIMS];
        h[..halo.len().min(MAX_DIMS)].copy_from_slice(&halo[..halo.len().min(MAX_DIMS)]);
        RangeMapper::NeighborhoodAxes(h)
    }

    /// The chunk, extended to the whole buffer along dimension `dim`.
    pub fn slice(dim: usize) -> RangeMapper {
        RangeMapper::Slice(dim)
    }

    /// The chunk with dimensions `a` and `b` swapped.
    pub fn transposed(a: usize, b: usize) -> RangeMapper {
        RangeMapper::Transposed(a, b)
    }

    /// The chunk mirrored in the kernel's range along every dimension (item `i` of a range
    /// of `n` maps to cell `n - 1 - i`).
    pub fn reverse() -> RangeMapper {
        RangeMapper::Reverse
    }

    /// Dimension 0 of the buffer cut into one contiguous part per item of the kernel's range
    /// (boundaries on multiples of `granularity`), the other dimensions whole: with a
    /// collective host task, each rank's part of the buffer.
    pub fn even_split(granularity: usize) -> RangeMapper {
        RangeMapper::EvenSplit(granularity)
    }
}

/// A typed buffer of `D` (1–3) dimensions, known to every rank of a [`DistrQueue`]. A handle:
/// copying it does not copy data.
pub struct Buffer<T, const D: usize> {
    id: BufferId,
    extent: [usize; D],
    _elem: PhantomData<fn() -> T>,
}

impl<T, const D: usize> Clone for Buffer<T, D> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, const D: usize> Copy for Buffer<T, D> {}

impl<T, const D: usize> std::fmt::Debug for Buffer<T, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({}, {:?} of {})", self.id.0, self.extent, std::any::type_name::<T>())
    }
}

impl<T, const D: usize> Buffer<T, D> {
    /// The buffer's id in the task graph.
    pub fn id(&self) -> BufferId {
        self.id
    }

    /// The buffer's extent.
    pub fn extent(&self) -> [usize; D] {
        self.extent
    }

    /// The whole buffer as a box.
    pub fn full_box(&self) -> GridBox {
        GridBox::full(pad(self.extent, 1))
    }
}

fn pad<const D: usize>(idx: [usize; D], fill: usize) -> Index {
    let mut p = [fill; MAX_DIMS];
    p[..D].copy_from_slice(&idx);
    p
}

/// A declared read access, for use inside the kernel ([`Ctx::read`]).
pub struct ReadAcc<T, const D: usize> {
    slot: usize,
    _elem: PhantomData<fn() -> T>,
}

/// A declared write, read_write, discard_write or discard_read_write access, for use inside the
/// kernel ([`Ctx::write`]).
pub struct WriteAcc<T, const D: usize> {
    slot: usize,
    _elem: PhantomData<fn() -> T>,
}

impl<T, const D: usize> Clone for ReadAcc<T, D> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, const D: usize> Copy for ReadAcc<T, D> {}
impl<T, const D: usize> Clone for WriteAcc<T, D> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T, const D: usize> Copy for WriteAcc<T, D> {}

/// A host kernel: runs one piece of this rank's chunk (on a worker thread).
type KernelFn<'k> = Box<dyn Fn(&Chunk, &Ctx<'_>) + Send + Sync + 'k>;
/// A host task: runs once on its rank(s), on the queue's thread.
type HostFn<'k> = Box<dyn FnOnce(&Chunk, &Ctx<'_>) + 'k>;

enum Action<'k> {
    Kernel { range: Index, kernel: KernelFn<'k> },
    Master { range: Index, task: HostFn<'k> },
    Collective { task: HostFn<'k> },
    Cuda { range: Index, launch: CudaLaunch },
}

/// A command group being declared: accessors, split hint and granularity, then one action.
pub struct Handler<'k> {
    accessors: Vec<Accessor>,
    split: SplitHint,
    granularity: Vec<usize>,
    name: String,
    action: Option<Action<'k>>,
    error: Option<GraphError>,
}

impl<'k> Handler<'k> {
    fn access(&mut self, buffer: BufferId, mapper: RangeMapper, mode: AccessMode) -> usize {
        self.accessors.push(Accessor { buffer, mapper, mode });
        self.accessors.len() - 1
    }

    fn writer<T, const D: usize>(&mut self, b: &Buffer<T, D>, m: RangeMapper, mode: AccessMode) -> WriteAcc<T, D> {
        WriteAcc { slot: self.access(b.id, m, mode), _elem: PhantomData }
    }

    /// Reads the cells `mapper` names.
    pub fn read<T, const D: usize>(&mut self, b: &Buffer<T, D>, mapper: RangeMapper) -> ReadAcc<T, D> {
        ReadAcc { slot: self.access(b.id, mapper, AccessMode::Read), _elem: PhantomData }
    }

    /// Writes some of the cells `mapper` names; the others keep their values, so their prior
    /// contents are brought in first, as for [`Handler::read_write`] (Celerity's `write`). A
    /// kernel that overwrites every mapped cell should use [`Handler::discard_write`].
    pub fn write<T, const D: usize>(&mut self, b: &Buffer<T, D>, mapper: RangeMapper) -> WriteAcc<T, D> {
        self.writer(b, mapper, AccessMode::Write)
    }

    /// Reads and writes the cells `mapper` names.
    pub fn read_write<T, const D: usize>(&mut self, b: &Buffer<T, D>, mapper: RangeMapper) -> WriteAcc<T, D> {
        self.writer(b, mapper, AccessMode::ReadWrite)
    }

    /// Overwrites every cell `mapper` names; prior contents are not needed.
    pub fn discard_write<T, const D: usize>(&mut self, b: &Buffer<T, D>, mapper: RangeMapper) -> WriteAcc<T, D> {
        self.writer(b, mapper, AccessMode::DiscardWrite)
    }

    /// Reads and writes the cells `mapper` names, without their prior contents.
    pub fn discard_read_write<T, const D: usize>(&mut self, b: &Buffer<T, D>, mapper: RangeMapper) -> WriteAcc<T, D> {
        self.writer(b, mapper, AccessMode::DiscardReadWrite)
    }

    /// How the kernel's range is split across ranks (default: 1D, along dimension 0).
    pub fn split(&mut self, hint: SplitHint) {
        self.split = hint;
    }

    /// Chunk boundaries fall on multiples of `g[d]` along dimension `d`.
    pub fn granularity(&mut self, g: &[usize]) {
        self.granularity = g.to_vec();
    }

    /// Names the task (dumps, errors).
    pub fn name(&mut self, name: &str) {
        self.name = name.to_string();
    }

    fn set_action(&mut self, action: Action<'k>) {
        if self.action.is_some() {
            self.error = Some(GraphError::InvalidArgument(format!("command group '{}' has more than one action", self.name)));
        }
        self.action = Some(action);
    }

    /// Runs `kernel` over `range`, split across the ranks; each rank's chunk is cut again
    /// among its worker threads. The kernel gets a piece and a [`Ctx`] to open its accessors.
    pub fn parallel_for<const R: usize>(&mut self, range: [usize; R], kernel: impl Fn(&Chunk, &Ctx<'_>) + Send + Sync + 'k) {
        let range = self.range(&range);
        self.set_action(Action::Kernel { range, kernel: Box::new(kernel) });
    }

    /// Runs the CUDA kernel `kernel` of `source` over `range`, split across the ranks (a GPU
    /// queue only: [`DistrQueue::on_device`]). The kernel's parameters are this chunk, then each
    /// accessor's base pointer and extent in declaration order, then `args` (see
    /// [`crate::device`]); one thread per item.
    ///
    /// # Safety
    /// The kernel must declare exactly those parameters, with the accessors' element types, and
    /// touch only the cells its accessors declare for the chunk it gets: the GPU runs it with
    /// raw pointers that nothing checks.
    pub unsafe fn parallel_for_cuda<const R: usize>(&mut self, range: [usize; R], source: &CudaSource, kernel: &str, args: &[KernelArg]) {
        let range = self.range(&range);
        let launch = CudaLaunch { source: source.clone(), kernel: kernel.to_string(), args: args.to_vec() };
        self.set_action(Action::Cuda { range, launch });
    }

    /// Runs `task` once on the master rank (rank 0) over the whole `range`.
    pub fn master_task<const R: usize>(&mut self, range: [usize; R], task: impl FnOnce(&Chunk, &Ctx<'_>) + 'k) {
        let range = self.range(&range);
        self.set_action(Action::Master { range, task: Box::new(task) });
    }

    /// Runs `task` once on every rank (a collective host task: rank r gets the chunk [r, r+1)
    /// of `ranks`, and [`Ctx::comm`] gives it the communicator).
    pub fn collective_task(&mut self, task: impl FnOnce(&Chunk, &Ctx<'_>) + 'k) {
        self.set_action(Action::Collective { task: Box::new(task) });
    }

    fn range(&mut self, r: &[usize]) -> Index {
        if r.is_empty() || r.len() > MAX_DIMS {
            self.error = Some(GraphError::InvalidArgument(format!("a range has 1 to 3 dimensions, got {}", r.len())));
            return [1; MAX_DIMS];
        }
        crate::geometry::extent(r)
    }
}

/// One accessor's data for one piece of a kernel.
struct Slot {
    ptr: *mut u8,
    extent: Index,
    /// The cells the piece may touch: the bounding box of its mapped region, and the region's
    /// boxes when it has several (a cross-shaped halo leaves out the corners).
    allowed: GridBox,
    exact: Option<Vec<GridBox>>,
    /// No other accessor of the task writes this buffer (a read slot may hand out the whole
    /// buffer as a slice; a write slot may hand out `&mut` slices).
    sole: bool,
    taken: Cell<bool>,
}

/// What a kernel piece or host task sees: the views of its accessors.
pub struct Ctx<'a> {
    slots: Vec<Slot>,
    comm: Option<&'a Communicator>,
    _data: PhantomData<&'a mut [u8]>,
}

impl<'a> Ctx<'a> {
    /// Opens a read accessor.
    pub fn read<T: Element, const D: usize>(&self, a: &ReadAcc<T, D>) -> ReadView<'_, T, D> {
        let s = &self.slots[a.slot];
        ReadView {
            ptr: s.ptr as *const T,
            extent: s.extent,
            allowed: s.allowed,
            exact: s.exact.as_deref(),
            sole: s.sole,
            _data: PhantomData,
        }
    }

    /// Opens a write accessor (once per piece: a second view of the same accessor panics).
    pub fn write<T: Element, const D: usize>(&self, a: &WriteAcc<T, D>) -> WriteView<'_, T, D> {
        let s = &self.slots[a.slot];
        assert!(!s.taken.replace(true), "a kernel opened the same write accessor twice");
        WriteView {
            ptr: s.ptr as *mut T,
            extent: s.extent,
            allowed: s.allowed,
            exact: s.exact.as_deref(),
            sole: s.sole,
            _data: PhantomData,
        }
    }

    /// The communicator, in a collective host task (None elsewhere).
    pub fn comm(&self) -> Option<&'a Communicator> {
        self.comm
    }
}

fn linear(extent: Index, p: Index) -> usize {
    (p[0] * extent[1] + p[1]) * extent[2] + p[2]
}

#[inline]
fn check<const D: usize>(allowed: &GridBox, exact: Option<&[GridBox]>, p: Index, idx: [usize; D], what: &str) {
    let inside = allowed.contains_point(p) && exact.is_none_or(|boxes| boxes.iter().any(|b| b.contains_point(p)));
    assert!(inside, "kernel {what} cell {idx:?} outside the cells its accessor declared (within {:?}..{:?})", allowed.min, allowed.max);
}

/// [`check`] for the `len` cells from `p` along the last dimension (a slice): its ends, and
/// every cell where the accessor's region has several boxes (which may leave gaps in a row).
/// `what`: the verb for the first cell, the last, and those between.
fn check_run<const D: usize>(allowed: &GridBox, exact: Option<&[GridBox]>, p: Index, idx: [usize; D], len: usize, what: [&str; 3]) {
    if len == 0 {
        return;
    }
    let mut last = p;
    last[D - 1] += len - 1;
    check(allowed, exact, p, idx, what[0]);
    check(allowed, exact, last, idx, what[1]);
    if exact.is_some() {
        for k in 1..len {
            let mut q = p;
            q[D - 1] += k;
            check(allowed, exact, q, idx, what[2]);
        }
    }
}

/// A kernel's view of a read accessor.
pub struct ReadView<'a, T, const D: usize> {
    ptr: *const T,
    extent: Index,
    allowed: GridBox,
    exact: Option<&'a [GridBox]>,
    sole: bool,
    _data: PhantomData<&'a [T]>,
}

impl<T: Element, const D: usize> ReadView<'_, T, D> {
    /// The cell at `idx`.
    #[inline]
    pub fn get(&self, idx: [usize; D]) -> T {
        let p = pad(idx, 0);
        check(&self.allowed, self.exact, p, idx, "read");
        // SAFETY: `p` lies in the buffer (the allowed box is clipped to its extent) and in the
        // cells this piece declared; no other piece writes them while this one runs (the
        // executor cuts a chunk into pieces only when their accesses are disjoint), and this
        // thread holds no `&mut` to them (write slices exist only for a buffer's sole accessor).
        unsafe { *self.ptr.add(linear(self.extent, p)) }
    }

    /// `len` cells from `idx` along the last dimension, as a slice. Panics if the buffer is
    /// also written by this task (use [`ReadView::get`] then).
    #[inline]
    pub fn slice(&self, idx: [usize; D], len: usize) -> &[T] {
        assert!(self.sole, "slice() on a buffer this task also writes; use get()");
        let p = pad(idx, 0);
        check_run(&self.allowed, self.exact, p, idx, len, ["read", "read (slice end)", "read (inside a slice)"]);
        // SAFETY: the cells lie in the buffer and the allowed box; the buffer is not written by
        // any piece of this task (sole), so a shared slice for the view's lifetime is sound.
        unsafe { std::slice::from_raw_parts(self.ptr.add(linear(self.extent, p)), len) }
    }

    /// The whole buffer (row-major) as a slice. Panics unless the accessor declared every cell
    /// (e.g. `all()`) and the task does not also write the buffer.
    pub fn as_slice(&self) -> &[T] {
        let full = GridBox::full(self.extent);
        assert!(self.sole && self.allowed == full, "as_slice() needs a read of the whole buffer that the task does not write");
        // SAFETY: every cell is declared and nothing writes the buffer during the task.
        unsafe { std::slice::from_raw_parts(self.ptr, full.area()) }
    }
}

/// A kernel's view of a writing accessor (it may read what it may write).
pub struct WriteView<'a, T, const D: usize> {
    ptr: *mut T,
    extent: Index,
    allowed: GridBox,
    exact: Option<&'a [GridBox]>,
    sole: bool,
    _data: PhantomData<&'a mut [T]>,
}

impl<T: Element, const D: usize> WriteView<'_, T, D> {
    /// The cell at `idx`.
    #[inline]
    pub fn get(&self, idx: [usize; D]) -> T {
        let p = pad(idx, 0);
        check(&self.allowed, self.exact, p, idx, "read");
        // SAFETY: as in ReadView::get: in the buffer, in this piece's declared cells, which no
        // other piece touches; `&self` excludes a live slice from slice_mut.
        unsafe { *self.ptr.add(linear(self.extent, p)) }
    }

    /// Sets the cell at `idx`.
    #[inline]
    pub fn set(&mut self, idx: [usize; D], v: T) {
        let p = pad(idx, 0);
        check(&self.allowed, self.exact, p, idx, "wrote");
        // SAFETY: as in get; `&mut self` excludes any live slice of this view.
        unsafe { *self.ptr.add(linear(self.extent, p)) = v }
    }

    /// `len` cells from `idx` along the last dimension, writable. Panics unless this is the
    /// task's only accessor of the buffer.
    #[inline]
    pub fn slice_mut(&mut self, idx: [usize; D], len: usize) -> &mut [T] {
        assert!(self.sole, "slice_mut() on a buffer with several accessors in this task; use set()");
        let p = pad(idx, 0);
        check_run(&self.allowed, self.exact, p, idx, len, ["wrote", "wrote (slice end)", "wrote (inside a slice)"]);
        // SAFETY: the cells lie in the buffer and this piece's declared box, which no other
        // piece reads or writes (disjoint pieces) and no other view of this thread can reach
        // (sole accessor, opened once); `&mut self` keeps the slice unique within the view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(linear(self.extent, p)), len) }
    }
}

/// A rank's copy of one buffer (row-major over its 3D extent), type-erased.
trait Store: Send {
    fn elem_size(&self) -> usize;
    fn data_ptr(&mut self) -> *mut u8;
    fn pack(&self, region: &Region) -> Vec<u8>;
    /// Appends the cells of `region` (in [`Store::pack`] order) to `out`.
    fn pack_into(&self, region: &Region, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.pack(region));
    }
    fn unpack(&mut self, region: &Region, bytes: &[u8]);
    fn as_any(&self) -> &dyn Any;
}

struct HostStore<T> {
    extent: Index,
    data: Vec<T>,
}

impl<T: Element> Store for HostStore<T> {
    fn elem_size(&self) -> usize {
        std::mem::size_of::<T>()
    }

    fn data_ptr(&mut self) -> *mut u8 {
        self.data.as_mut_ptr() as *mut u8
    }

    fn pack(&self, region: &Region) -> Vec<u8> {
        let mut out = Vec::new();
        self.pack_into(region, &mut out);
        out
    }

    fn pack_into(&self, region: &Region, out: &mut Vec<u8>) {
        out.reserve(region.area() * std::mem::size_of::<T>());
        for_rows(region, self.extent, |at, len| out.extend_from_slice(bytemuck::cast_slice(&self.data[at..at + len])));
    }

    fn unpack(&mut self, region: &Region, bytes: &[u8]) {
        let mut i = 0;
        let es = std::mem::size_of::<T>();
        for_rows(region, self.extent, |at, len| {
            let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut self.data[at..at + len]);
            dst.copy_from_slice(&bytes[i..i + len * es]);
            i += len * es;
        });
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Visits the rows (runs along the last dimension) of `region`: boxes in order, row-major
/// within a box; `f(first cell's position, cells)`. Rows that are contiguous in memory (a box
/// spanning the whole last dimension, or the whole last two) are visited as one run, so a 2D
/// buffer's slab is one copy, not one per cell.
fn for_rows(region: &Region, extent: Index, mut f: impl FnMut(usize, usize)) {
    for b in region.boxes() {
        let [x, y, z] = b.range();
        if z == extent[2] && y == extent[1] {
            f(linear(extent, b.min), x * y * z);
        } else if z == extent[2] {
            for i in b.min[0]..b.max[0] {
                f(linear(extent, [i, b.min[1], 0]), y * z);
            }
        } else {
            for i in b.min[0]..b.max[0] {
                for j in b.min[1]..b.max[1] {
                    f(linear(extent, [i, j, b.min[2]]), z);
                }
            }
        }
    }
}

/// Settings of a [`DistrQueue`].
#[derive(Clone, Debug)]
pub struct QueueOptions {
    /// Insert a horizon every this many tasks (0: never).
    pub horizon_step: usize,
    /// Worker threads per rank for kernels.
    pub threads: usize,
    /// Write the task and command graphs here (`SUCL_GRAPH_DUMP`) when the queue is dropped.
    pub dump_dir: Option<PathBuf>,
    /// Collective pattern discovery: replace push cascades with collective commands
    /// (`SUCL_GRAPH_CPD=0` turns it off; on by default).
    pub discovery: bool,
}

impl QueueOptions {
    /// Defaults: a horizon every 4 tasks, threads from `SUCL_GRAPH_THREADS` (default: the
    /// machine's cores divided among the local ranks, at least 1), dump from `SUCL_GRAPH_DUMP`.
    pub fn from_env(comm: &Communicator) -> Result<QueueOptions, GraphError> {
        let threads = match std::env::var("SUCL_GRAPH_THREADS") {
            Ok(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| GraphError::InvalidArgument(format!("SUCL_GRAPH_THREADS={v:?}: want a positive number of threads")))?,
            Err(_) => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                (cores / local_ranks(comm)).max(1)
            }
        };
        let dump_dir = std::env::var_os("SUCL_GRAPH_DUMP").filter(|v| !v.is_empty()).map(PathBuf::from);
        let discovery = match std::env::var("SUCL_GRAPH_CPD") {
            Ok(v) => match v.trim() {
                "0" | "off" | "false" => false,
                "1" | "on" | "true" | "" => true,
                _ => return Err(GraphError::InvalidArgument(format!("SUCL_GRAPH_CPD={v:?}: want 0 or 1"))),
            },
            Err(_) => true,
        };
        Ok(QueueOptions { horizon_step: 4, threads, dump_dir, discovery })
    }
}

/// Ranks on this host, from the launcher's environment (1 if unknown).
fn local_ranks(comm: &Communicator) -> usize {
    ["LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "SUCL_LOCAL_SIZE"]
        .iter()
        .find_map(|k| std::env::var(k).ok()?.trim().parse::<usize>().ok())
        .unwrap_or(if comm.size() > 1 { comm.size() } else { 1 })
        .max(1)
}

/// A distributed queue: every rank of a communicator submits the same command groups; each
/// rank generates and runs its own commands.
pub struct DistrQueue<'c> {
    comm: &'c Communicator,
    scheduler: Scheduler,
    stores: Vec<Box<dyn Store>>,
    options: QueueOptions,
    /// Buffers already warned about (a loop re-reading unwritten cells warns once).
    warned: BTreeSet<BufferId>,
    /// A GPU rank's device side ([`DistrQueue::on_device`]).
    device: Option<DeviceRank>,
}

impl<'c> DistrQueue<'c> {
    /// A queue over `comm` with settings from the environment ([`QueueOptions::from_env`]).
    pub fn new(comm: &'c Communicator) -> Result<Self, GraphError> {
        Self::with_options(comm, QueueOptions::from_env(comm)?)
    }

    /// A queue over `comm` with explicit settings.
    pub fn with_options(comm: &'c Communicator, options: QueueOptions) -> Result<Self, GraphError> {
        if options.threads == 0 {
            return Err(GraphError::InvalidArgument("a queue needs at least one worker thread".into()));
        }
        let mut scheduler = Scheduler::for_rank(comm.size(), comm.rank(), options.horizon_step)?;
        scheduler.set_discovery(options.discovery);
        if options.dump_dir.is_some() {
            scheduler.record_tasks(true);
        }
        Ok(DistrQueue { comm, scheduler, stores: Vec::new(), options, warned: BTreeSet::new(), device: None })
    }

    /// A queue whose rank runs on GPU `device` (collective), settings from the environment
    /// ([`QueueOptions::from_env`], `SUCL_GRAPH_DEVICE_TRANSPORT`). See [`crate::device`].
    #[cfg(feature = "cuda")]
    pub fn on_device(comm: &'c Communicator, device: &sucl_runtime::cuda::Device) -> Result<Self, GraphError> {
        Self::on_device_with(comm, QueueOptions::from_env(comm)?, device, crate::device::TransportChoice::from_env()?)
    }

    /// [`DistrQueue::on_device`] with explicit settings.
    #[cfg(feature = "cuda")]
    pub fn on_device_with(
        comm: &'c Communicator,
        options: QueueOptions,
        device: &sucl_runtime::cuda::Device,
        transport: crate::device::TransportChoice,
    ) -> Result<Self, GraphError> {
        let mut q = Self::with_options(comm, options)?;
        q.device = Some(DeviceRank::new(comm, device, transport)?);
        Ok(q)
    }

    /// How this GPU queue moves device memory (None: a host queue).
    pub fn device_transport(&self) -> Option<DeviceTransport> {
        self.device.as_ref().map(|d| d.transport())
    }

    /// The GPU queue's stream (None: a host queue).
    #[cfg(feature = "cuda")]
    pub fn device_queue(&self) -> Option<&sucl_runtime::cuda::Queue> {
        self.device.as_ref().map(|d| d.queue())
    }

    /// The communicator.
    pub fn comm(&self) -> &'c Communicator {
        self.comm
    }

    /// The scheduler (task graph and this rank's commands so far).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// A buffer of extent `extent`, contents undefined until a task writes them.
    pub fn buffer<T: Element, const D: usize>(&mut self, extent: [usize; D]) -> Result<Buffer<T, D>, GraphError> {
        self.make_buffer(extent, None)
    }

    /// A buffer holding `data` (row-major), the same on every rank.
    pub fn buffer_from<T: Element, const D: usize>(&mut self, extent: [usize; D], data: Vec<T>) -> Result<Buffer<T, D>, GraphError> {
        self.make_buffer(extent, Some(data))
    }

    fn make_buffer<T: Element, const D: usize>(&mut self, extent: [usize; D], data: Option<Vec<T>>) -> Result<Buffer<T, D>, GraphError> {
        if D == 0 || D > MAX_DIMS || extent.contains(&0) {
            return Err(GraphError::InvalidArgument(format!("a buffer has 1 to 3 non-zero dimensions, got {extent:?}")));
        }
        let cells: usize = extent
            .iter()
            .try_fold(1usize, |a, &x| a.checked_mul(x))
            .ok_or_else(|| GraphError::InvalidArgument(format!("buffer extent {extent:?} overflows the address space")))?;
        let host_initialized = data.is_some();
        let data = match data {
            Some(d) if d.len() != cells => {
                return Err(GraphError::InvalidArgument(format!(
                    "buffer of extent {extent:?} has {cells} cells, the initial data has {}",
                    d.len()
                )))
            }
            Some(d) => d,
            None => vec![T::zeroed(); cells],
        };
        let id = self.scheduler.create_buffer(&extent, host_initialized)?;
        if let Some(d) = self.device.as_mut() {
            d.add_buffer(pad(extent, 1), std::mem::size_of::<T>(), host_initialized.then(|| bytemuck::cast_slice::<T, u8>(&data)))?;
        }
        self.stores.push(Box::new(HostStore { extent: pad(extent, 1), data }));
        Ok(Buffer { id, extent, _elem: PhantomData })
    }

    /// Declares a command group and runs this rank's part of it: `group` declares accessors
    /// and one action ([`Handler::parallel_for`], [`Handler::master_task`],
    /// [`Handler::collective_task`]). Returns the task's id.
    pub fn submit<'k>(&mut self, group: impl FnOnce(&mut Handler<'k>)) -> Result<TaskId, GraphError> {
        let mut h = Handler {
            accessors: Vec::new(),
            split: SplitHint::Split1D,
            granularity: vec![1],
            name: String::new(),
            action: None,
            error: None,
        };
        group(&mut h);
        if let Some(e) = h.error {
            return Err(e);
        }
        let action = h.action.ok_or_else(|| GraphError::InvalidArgument(format!("command group '{}' declares no action", h.name)))?;
        let name = if h.name.is_empty() { format!("task{}", self.scheduler.graph().next_task_id().0) } else { h.name };
        let (mut spec, mut action) = match action {
            Action::Kernel { range, kernel } => (TaskSpec::parallel_for(&name, &range).split(h.split), Some(Run::Kernel(kernel))),
            Action::Master { range, task } => (TaskSpec::master_host_task(&name, &range), Some(Run::Host(task))),
            Action::Collective { task } => (TaskSpec::collective_host_task(&name), Some(Run::Host(task))),
            Action::Cuda { range, launch } => {
                match self.device.as_mut() {
                    Some(d) => d.prepare(&name, &launch)?,
                    None => {
                        return Err(GraphError::InvalidArgument(format!(
                            "task '{name}': parallel_for_cuda needs a GPU queue (DistrQueue::on_device)"
                        )))
                    }
                }
                (TaskSpec::parallel_for(&name, &range).split(h.split), Some(Run::Cuda(launch)))
            }
        };
        spec = spec.granularity(&h.granularity);
        spec.accessors = h.accessors;
        for a in &spec.accessors {
            self.check_buffer(a.buffer)?;
        }
        let id = self.scheduler.submit(spec)?;
        self.log_warnings();
        self.run_pending(&mut action)?;
        Ok(id)
    }

    /// Names the task whose transfers failed with a communication error (other errors already
    /// say what they are about). A timeout, an abort or a mismatch also says that ranks which
    /// submitted different programs end this way.
    fn transfer_failed(&self, first: &Command, e: GraphError) -> GraphError {
        let GraphError::Comm(source) = e else { return e };
        let task = first.task;
        let name = self.scheduler.graph().task(task).map_or_else(String::new, |t| t.name.clone());
        let hint = match source {
            sucl_runtime::Error::Timeout { .. } | sucl_runtime::Error::Aborted { .. } => {
                " (a lost or stalled rank, or ranks that submitted different programs, end this way; DistrQueue::sync compares the programs)"
            }
            sucl_runtime::Error::Mismatch { .. } => {
                " (ranks that submitted different programs end this way; DistrQueue::sync compares the programs)"
            }
            _ => "",
        };
        GraphError::Transfer { rank: self.comm.rank(), task: task.0, name, hint, source }
    }

    /// Logs reads of never-written cells: the first per buffer as a warning, later ones at
    /// debug level (a loop would repeat it every step).
    fn log_warnings(&mut self) {
        for w in self.scheduler.take_warnings() {
            let (rank, task, buffer) = (self.comm.rank(), w.task.0, w.buffer.0);
            if self.warned.insert(w.buffer) {
                tracing::warn!(rank, task, buffer, region = ?w.region, "the task reads cells of the buffer that nothing wrote (a `write` accessor reads the cells it keeps: say discard_write if the kernel overwrites them all)");
            } else {
                tracing::debug!(rank, task, buffer, region = ?w.region, "the task reads cells of the buffer that nothing wrote");
            }
        }
    }

    fn check_buffer(&self, b: BufferId) -> Result<(), GraphError> {
        if b.0 >= self.stores.len() {
            return Err(GraphError::InvalidArgument(format!("buffer {} does not belong to this queue", b.0)));
        }
        Ok(())
    }

    /// Waits for every earlier task and returns this rank's copy of `region` of `b` (every rank
    /// gets it; row-major within the box).
    pub fn fence<T: Element, const D: usize>(&mut self, b: &Buffer<T, D>, region: GridBox) -> Result<Vec<T>, GraphError> {
        self.check_buffer(b.id)?;
        let clipped = region.intersection(&b.full_box());
        if clipped != region || region.is_empty() {
            return Err(GraphError::InvalidArgument(format!(
                "fence region {:?}..{:?} is empty or outside buffer {} of extent {:?}",
                region.min, region.max, b.id.0, b.extent
            )));
        }
        self.scheduler.submit(TaskSpec::fence("fence", b.id, region))?;
        self.run_pending(&mut None)?;
        if let Some(d) = self.device.as_mut() {
            let bytes = d.download(self.comm, b.id, &Region::from_box(region))?;
            let mut out = vec![T::zeroed(); region.area()];
            bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes);
            return Ok(out);
        }
        let store = self.stores[b.id.0].as_any().downcast_ref::<HostStore<T>>().expect("a buffer's store has its element type");
        let bytes = store.pack(&Region::from_box(region));
        Ok(bytemuck::cast_slice(&bytes).to_vec())
    }

    /// [`DistrQueue::fence`] of the whole buffer.
    pub fn fence_all<T: Element, const D: usize>(&mut self, b: &Buffer<T, D>) -> Result<Vec<T>, GraphError> {
        self.fence(b, b.full_box())
    }

    /// An epoch: every later task depends on everything before it (bounds the graph).
    pub fn epoch(&mut self) -> Result<TaskId, GraphError> {
        let id = self.scheduler.epoch()?;
        self.run_pending(&mut None)?;
        Ok(id)
    }

    /// An epoch followed by a barrier of all ranks: when it returns, every rank has finished
    /// every earlier task. The barrier is an all_gather of every rank's program fingerprint
    /// (as cheap): ranks that submitted different programs get
    /// [`GraphError::ProgramMismatch`] here instead of wrong data.
    pub fn sync(&mut self) -> Result<(), GraphError> {
        self.epoch()?;
        if let Some(d) = self.device.as_mut() {
            d.synchronize(self.comm)?;
        }
        let mine = self.scheduler.program_print();
        let mut all = vec![0u64; 2 * self.comm.size()];
        self.comm.all_gather(&[mine.steps, mine.hash][..], &mut all[..])?;
        let ranks: Vec<usize> = (1..self.comm.size()).filter(|&r| all[2 * r..2 * r + 2] != all[..2]).collect();
        if !ranks.is_empty() {
            return Err(GraphError::ProgramMismatch { rank: self.comm.rank(), ranks, steps: mine.steps });
        }
        Ok(())
    }

    /// The task graph and this rank's command graph, as `sucl graph --json` prints them.
    pub fn dump_json(&self) -> String {
        crate::dump::to_json(&self.scheduler)
    }

    fn run_pending(&mut self, action: &mut Option<Run<'_>>) -> Result<(), GraphError> {
        let commands = self.scheduler.take_commands(self.comm.rank()).unwrap_or_default();
        let mut i = 0;
        while i < commands.len() {
            let c = &commands[i];
            match c.kind {
                CommandKind::Push | CommandKind::AwaitPush | CommandKind::Collective => {
                    let end = commands[i..]
                        .iter()
                        .position(|c| !matches!(c.kind, CommandKind::Push | CommandKind::AwaitPush | CommandKind::Collective))
                        .map_or(commands.len(), |n| i + n);
                    self.transfer(&commands[i..end]).map_err(|e| self.transfer_failed(&commands[i], e))?;
                    i = end;
                    continue;
                }
                CommandKind::Execution => self.execute(c, action)?,
                CommandKind::Horizon => {
                    if let Some(d) = self.device.as_mut() {
                        d.horizon()?;
                    }
                }
                CommandKind::Epoch => {}
            }
            i += 1;
        }
        Ok(())
    }

    fn execute(&mut self, c: &Command, action: &mut Option<Run<'_>>) -> Result<(), GraphError> {
        let Some(chunk_box) = c.chunk else { return Ok(()) };
        let task = self.scheduler.graph().task(c.task).ok_or_else(|| GraphError::InvalidArgument(format!("task {} is gone", c.task.0)))?;
        let chunk = Chunk { offset: chunk_box.min, range: chunk_box.range(), global: task.range };
        let accessors = task.accessors.clone();
        let granularity = task.granularity[0];
        let name = task.name.clone();
        let collective = task.target == crate::task::Target::Collective;
        match action.take() {
            None => Ok(()), // a fence: the data is in place once its transfers are done
            Some(Run::Cuda(launch)) => {
                let buffers: Vec<BufferId> = accessors.iter().map(|a| a.buffer).collect();
                let d = self.device.as_mut().expect("a CUDA task was accepted on a GPU queue only");
                d.launch(&name, &launch, &chunk, &buffers)
            }
            Some(Run::Host(f)) => {
                self.host_copy_in(&accessors, &chunk)?;
                let comm = collective.then_some(self.comm);
                let ctx = self.context(&accessors, &chunk, comm);
                catch(&name, self.comm.rank(), || f(&chunk, &ctx))?;
                self.host_copy_out(&accessors, &chunk)
            }
            Some(Run::Kernel(k)) => {
                self.host_copy_in(&accessors, &chunk)?;
                self.run_kernel(&name, &chunk, &accessors, granularity, k.as_ref())?;
                self.host_copy_out(&accessors, &chunk)
            }
        }
    }

    /// On a GPU queue, brings the host copy of every cell `accessors` name for `chunk` up to
    /// date before host code runs on it.
    fn host_copy_in(&mut self, accessors: &[Accessor], chunk: &Chunk) -> Result<(), GraphError> {
        let Some(d) = self.device.as_mut() else { return Ok(()) };
        for a in accessors {
            let region = a.mapper.map(chunk, self.scheduler.graph().buffer(a.buffer).map_or([1; MAX_DIMS], |i| i.extent));
            let bytes = d.download(self.comm, a.buffer, &region)?;
            self.stores[a.buffer.0].unpack(&region, &bytes);
        }
        Ok(())
    }

    /// On a GPU queue, copies what host code wrote back to the device.
    fn host_copy_out(&mut self, accessors: &[Accessor], chunk: &Chunk) -> Result<(), GraphError> {
        let Some(d) = self.device.as_mut() else { return Ok(()) };
        for a in accessors.iter().filter(|a| a.mode.writes()) {
            let region = a.mapper.map(chunk, self.scheduler.graph().buffer(a.buffer).map_or([1; MAX_DIMS], |i| i.extent));
            d.upload(a.buffer, &region, &self.stores[a.buffer.0].pack(&region))?;
        }
        Ok(())
    }

    /// Cuts `chunk` into one piece per worker thread along dimension 0 (when the pieces'
    /// accesses are disjoint) and runs them.
    fn run_kernel(
        &mut self,
        name: &str,
        chunk: &Chunk,
        accessors: &[Accessor],
        granularity: usize,
        kernel: &(dyn Fn(&Chunk, &Ctx<'_>) + Send + Sync),
    ) -> Result<(), GraphError> {
        let pieces = pieces(chunk, self.options.threads, granularity);
        let rank = self.comm.rank();
        if pieces.len() <= 1 || !disjoint(&pieces, accessors, &self.extents()) {
            let ctx = self.context(accessors, chunk, None);
            return catch(name, rank, || kernel(chunk, &ctx));
        }
        let contexts: Vec<Ctx<'_>> = pieces.iter().map(|p| self.context(accessors, p, None)).collect();
        let contexts: Vec<SendCtx<'_>> = contexts.into_iter().map(SendCtx).collect();
        std::thread::scope(|s| {
            let mut handles = Vec::new();
            for (piece, ctx) in pieces.iter().zip(&contexts).skip(1) {
                handles.push(s.spawn(move || catch(name, rank, || kernel(piece, &ctx.0))));
            }
            let mut result = catch(name, rank, || kernel(&pieces[0], &contexts[0].0));
            for h in handles {
                let r = h
                    .join()
                    .unwrap_or_else(|_| Err(GraphError::Kernel { rank, task: name.to_string(), message: "worker thread died".into() }));
                result = result.and(r);
            }
            result
        })
    }

    fn extents(&self) -> Vec<Index> {
        (0..self.stores.len()).map(|b| self.scheduler.graph().buffer(BufferId(b)).map_or([0; MAX_DIMS], |i| i.extent)).collect()
    }

    /// The views of `accessors` for `chunk`.
    fn context(&mut self, accessors: &[Accessor], chunk: &Chunk, comm: Option<&'c Communicator>) -> Ctx<'c> {
        let extents = self.extents();
        let slots = accessors
            .iter()
            .map(|a| {
                let extent = extents[a.buffer.0];
                let region = a.mapper.map(chunk, extent);
                let allowed = region.bounding_box();
                let exact = (region.boxes().len() > 1).then(|| region.boxes().to_vec());
                let writers = accessors.iter().filter(|o| o.buffer == a.buffer && o.mode.writes()).count();
                let others = accessors.iter().filter(|o| o.buffer == a.buffer).count();
                let sole = if a.mode.writes() { others == 1 } else { writers == 0 };
                Slot { ptr: self.stores[a.buffer.0].data_ptr(), extent, allowed, exact, sole, taken: Cell::new(false) }
            })
            .collect();
        Ctx { slots, comm, _data: PhantomData }
    }

    /// Runs one run of consecutive transfer commands. Point-to-point commands between two
    /// collectives are posted together and waited for together; each collective command then
    /// runs as the communicator's (v-)collective, in command order.
    ///
    /// Why this cannot deadlock: every rank gets the same collective commands in the same order
    /// (the generator emits them for every rank, whatever its chunk), so the collectives split
    /// every rank's transfers into the same sequence of segments. A push of a segment meets its
    /// await-push in the same segment on the peer, and a rank finishes a segment only after
    /// everything before it, which by induction every peer finishes too.
    fn transfer(&mut self, commands: &[Command]) -> Result<(), GraphError> {
        if let Some(d) = self.device.as_mut() {
            return d.transfer(self.comm, commands);
        }
        let mut rest = commands;
        while !rest.is_empty() {
            let p2p = rest.iter().position(|c| c.kind == CommandKind::Collective).unwrap_or(rest.len());
            if p2p > 0 {
                self.point_to_point(&rest[..p2p])?;
            }
            if let Some(c) = rest.get(p2p) {
                self.collective(c)?;
            }
            rest = &rest[(p2p + 1).min(rest.len())..];
        }
        Ok(())
    }

    /// Posts every push and await-push of `commands` at once and waits for all of them.
    fn point_to_point(&mut self, commands: &[Command]) -> Result<(), GraphError> {
        let nbuf = self.stores.len().max(1) as u64;
        let tag = |c: &Command| -> u32 {
            let id = c.task.0 as u64 * nbuf + c.buffer.map_or(0, |b| b.0 as u64);
            (id % (MAX_TAG as u64 + 1)) as u32
        };
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for c in commands {
            let buffer = c.buffer.ok_or_else(|| GraphError::InvalidArgument("a transfer names no buffer".into()))?;
            let store = &self.stores[buffer.0];
            match c.kind {
                CommandKind::Push => {
                    for p in &c.peers {
                        sends.push((p.rank, tag(c), store.pack(&p.region)));
                    }
                }
                CommandKind::AwaitPush => {
                    for p in &c.peers {
                        recvs.push((p.rank, tag(c), buffer, p.region.clone(), vec![0u8; p.region.area() * store.elem_size()]));
                    }
                }
                other => return Err(GraphError::InvalidArgument(format!("command {} ({other:?}) is not a transfer", c.id.0))),
            }
        }
        let rank = self.comm.rank();
        self.comm.nonblocking(|scope| {
            let mut requests = Vec::new();
            for (peer, tag, _, _, data) in recvs.iter_mut() {
                let want = data.len();
                requests.push((*peer, want, scope.irecv(data.as_mut_slice(), *peer, *tag)?));
            }
            for (peer, tag, data) in &sends {
                scope.isend(data.as_slice(), *peer, *tag)?;
            }
            crate::device::wait_exact(rank, requests)?;
            scope.wait_all()
        })?;
        for (_, _, buffer, region, data) in recvs {
            self.stores[buffer.0].unpack(&region, &data);
        }
        Ok(())
    }

    /// Runs a collective command as the communicator's collective of its pattern: broadcast,
    /// gather(v), scatter(v), all_gather(v) or all_to_all(v) over the packed bytes of the
    /// cells — the plain form when every rank's block has the same size, the v-form otherwise.
    /// The per-rank counts and displacements come from the command's producer and consumer
    /// split accesses here (the generator computed none); the v-collectives check that every
    /// rank derived the same counts table before anything moves.
    fn collective(&mut self, c: &Command) -> Result<(), GraphError> {
        let coll =
            c.collective.as_ref().ok_or_else(|| GraphError::InvalidArgument(format!("collective command {} has no pattern", c.id.0)))?;
        let buffer = c.buffer.ok_or_else(|| GraphError::InvalidArgument("a transfer names no buffer".into()))?;
        let (me, n) = (self.comm.rank(), self.comm.size());
        if coll.ranks != n {
            return Err(GraphError::InvalidArgument(format!("collective command {} is for {} ranks, not {n}", c.id.0, coll.ranks)));
        }
        let root = || coll.root.ok_or_else(|| GraphError::InvalidArgument(format!("collective command {} has no root", c.id.0)));
        let store = &mut self.stores[buffer.0];
        let es = store.elem_size();
        let bytes = |r: &Region| r.area() * es;
        let prefix = |counts: &[usize]| -> Vec<usize> {
            counts
                .iter()
                .scan(0, |at, &k| {
                    let d = *at;
                    *at += k;
                    Some(d)
                })
                .collect()
        };
        match coll.op {
            CollectiveOp::Broadcast => {
                let root = root()?;
                // Every consumer reads the same cells: the root puts what it wrote on the wire.
                let wire = coll.written(root);
                let mut data = if me == root { store.pack(&wire) } else { vec![0u8; bytes(&wire)] };
                self.comm.broadcast(&mut data, root)?;
                let mine = coll.block(root, me);
                if !mine.is_empty() {
                    unpack_part(store.as_mut(), &wire, &data, &mine);
                }
            }
            CollectiveOp::AllGather => {
                let parts: Vec<Region> = (0..n).map(|r| coll.written(r)).collect();
                let counts: Vec<usize> = parts.iter().map(&bytes).collect();
                let displs = prefix(&counts);
                let mut recv = vec![0u8; counts.iter().sum()];
                let send = store.pack(&parts[me]);
                if counts.iter().all(|&k| k == counts[0]) {
                    self.comm.all_gather(&send, &mut recv)?;
                } else {
                    self.comm.all_gatherv(&send, &mut recv, &counts, &displs)?;
                }
                for src in (0..n).filter(|&s| s != me) {
                    let mine = coll.block(src, me);
                    if !mine.is_empty() {
                        unpack_part(store.as_mut(), &parts[src], &recv[displs[src]..displs[src] + counts[src]], &mine);
                    }
                }
            }
            CollectiveOp::Gather => {
                let root = root()?;
                let read = coll.read(root);
                // The root's own block rides along when that makes every block the same size
                // (the plain gather); it is not unpacked.
                let full: Vec<Region> = (0..n).map(|r| coll.written(r).intersection(&read)).collect();
                let plain = full.iter().all(|b| b.area() == full[0].area());
                let blocks: Vec<Region> = (0..n).map(|r| if r == root && !plain { Region::empty() } else { full[r].clone() }).collect();
                let counts: Vec<usize> = blocks.iter().map(&bytes).collect();
                let displs = prefix(&counts);
                let mut recv = vec![0u8; if me == root { counts.iter().sum() } else { 0 }];
                let send = store.pack(&blocks[me]);
                if plain {
                    self.comm.gather(&send, &mut recv, root)?;
                } else {
                    self.comm.gatherv(&send, &mut recv, &counts, &displs, root)?;
                }
                if me == root {
                    for (src, b) in blocks.iter().enumerate().filter(|(s, b)| *s != root && !b.is_empty()) {
                        store.unpack(b, &recv[displs[src]..displs[src] + counts[src]]);
                    }
                }
            }
            CollectiveOp::Scatter => {
                let root = root()?;
                let written = coll.written(root);
                let full: Vec<Region> = (0..n).map(|r| written.intersection(&coll.read(r))).collect();
                let plain = full.iter().all(|b| b.area() == full[0].area());
                let blocks: Vec<Region> = (0..n).map(|r| if r == root && !plain { Region::empty() } else { full[r].clone() }).collect();
                let counts: Vec<usize> = blocks.iter().map(&bytes).collect();
                let displs = prefix(&counts);
                let mut send = Vec::new();
                if me == root {
                    blocks.iter().for_each(|b| store.pack_into(b, &mut send));
                }
                let mut recv = vec![0u8; counts[me]];
                if plain {
                    self.comm.scatter(&send, &mut recv, root)?;
                } else {
                    self.comm.scatterv(&send, &mut recv, &counts, &displs, root)?;
                }
                if me != root && !blocks[me].is_empty() {
                    store.unpack(&blocks[me], &recv);
                }
            }
            CollectiveOp::AllToAll => {
                // The whole counts table (every rank passes it): O(ranks²) box intersections,
                // each rank's producer and consumer regions mapped once. Diagonal blocks ride
                // along (not unpacked) when that makes every block the same size.
                let written: Vec<Region> = (0..n).map(|r| coll.written(r)).collect();
                let read: Vec<Region> = (0..n).map(|r| coll.read(r)).collect();
                let full = |i: usize, j: usize| written[i].intersection(&read[j]);
                let size0 = bytes(&full(0, 0));
                let plain = (0..n).all(|i| (0..n).all(|j| bytes(&full(i, j)) == size0));
                let block = |i: usize, j: usize| if i == j && !plain { Region::empty() } else { full(i, j) };
                let mut counts = vec![0; n * n];
                for i in 0..n {
                    for j in 0..n {
                        counts[i * n + j] = bytes(&block(i, j));
                    }
                }
                let row: Vec<usize> = counts[me * n..(me + 1) * n].to_vec();
                let col: Vec<usize> = (0..n).map(|i| counts[i * n + me]).collect();
                let (sdispls, rdispls) = (prefix(&row), prefix(&col));
                let mut send = Vec::with_capacity(row.iter().sum());
                (0..n).for_each(|j| store.pack_into(&block(me, j), &mut send));
                let mut recv = vec![0u8; col.iter().sum()];
                if plain {
                    self.comm.all_to_all(&send, &mut recv)?;
                } else {
                    self.comm.all_to_allv(&send, &sdispls, &mut recv, &rdispls, &counts)?;
                }
                for src in (0..n).filter(|&s| s != me && col[s] > 0) {
                    store.unpack(&block(src, me), &recv[rdispls[src]..rdispls[src] + col[src]]);
                }
            }
        }
        Ok(())
    }
}

/// Unpacks the cells of `want` (a part of `packed`) from `bytes`, the cells of `packed` in
/// [`Store::pack`] order.
fn unpack_part(store: &mut dyn Store, packed: &Region, bytes: &[u8], want: &Region) {
    if packed == want {
        store.unpack(want, bytes);
        return;
    }
    let es = store.elem_size();
    let mut at = 0;
    for b in packed.boxes() {
        for x in b.min[0]..b.max[0] {
            for y in b.min[1]..b.max[1] {
                let (z0, z1) = (b.min[2], b.max[2]);
                for w in want.boxes() {
                    let (lo, hi) = (z0.max(w.min[2]), z1.min(w.max[2]));
                    if (w.min[0]..w.max[0]).contains(&x) && (w.min[1]..w.max[1]).contains(&y) && lo < hi {
                        let row = Region::from_box(GridBox::new([x, y, lo], [x + 1, y + 1, hi]));
                        store.unpack(&row, &bytes[at + (lo - z0) * es..at + (hi - z0) * es]);
                    }
                }
                at += (z1 - z0) * es;
            }
        }
    }
}

impl Drop for DistrQueue<'_> {
    fn drop(&mut self) {
        if let Some(dir) = &self.options.dump_dir {
            let path = dir.join(format!("rank-{}.json", self.comm.rank()));
            let written = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, self.dump_json()));
            if let Err(e) = written {
                eprintln!("sucl-graph: rank {}: cannot write the graph dump {}: {e}", self.comm.rank(), path.display());
            }
        }
    }
}

enum Run<'k> {
    Kernel(KernelFn<'k>),
    Host(HostFn<'k>),
    Cuda(CudaLaunch),
}

/// A context handed to one worker thread.
struct SendCtx<'a>(Ctx<'a>);
// SAFETY: a Ctx holds raw pointers into the queue's buffers. The executor gives each worker
// thread its own Ctx, for a piece whose accessed cells are disjoint from every other piece's
// writes (checked by `disjoint` before spawning), and the queue does not touch the buffers
// until every thread has joined (thread::scope). The Cell flags are used by that thread only.
unsafe impl Sync for SendCtx<'_> {}
// SAFETY: as above; moving the Ctx to the thread moves only pointers whose targets outlive it.
unsafe impl Send for SendCtx<'_> {}

/// Runs `f`, turning a panic into a kernel error.
fn catch(task: &str, rank: usize, f: impl FnOnce()) -> Result<(), GraphError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        let message = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".into());
        GraphError::Kernel { rank, task: task.to_string(), message }
    })
}

/// `chunk` cut into at most `n` pieces along dimension 0, boundaries on multiples of `g`.
fn pieces(chunk: &Chunk, n: usize, g: usize) -> Vec<Chunk> {
    let len = chunk.range[0];
    let g = g.max(1);
    let units = len.div_ceil(g);
    let n = n.min(units).max(1);
    let at = |k: usize| (k * units / n * g).min(len);
    (0..n)
        .filter_map(|i| {
            let (lo, hi) = (at(i), at(i + 1));
            (hi > lo).then(|| {
                let mut c = *chunk;
                c.offset[0] += lo;
                c.range[0] = hi - lo;
                c
            })
        })
        .collect()
}

/// True if no piece writes a cell (bounding boxes) that another piece reads or writes.
fn disjoint(pieces: &[Chunk], accessors: &[Accessor], extents: &[Index]) -> bool {
    let boxes: Vec<Vec<(BufferId, bool, GridBox)>> = pieces
        .iter()
        .map(|p| accessors.iter().map(|a| (a.buffer, a.mode.writes(), a.mapper.map(p, extents[a.buffer.0]).bounding_box())).collect())
        .collect();
    for (i, mine) in boxes.iter().enumerate() {
        for theirs in boxes.iter().skip(i + 1) {
            for &(b, w, x) in mine {
                for &(c, v, y) in theirs {
                    if b == c && (w || v) && x.intersects(&y) {
                        return false;
                    }
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A part of a packed region lands in the right cells, the rest of the buffer untouched.
    #[test]
    fn unpack_part_takes_the_cells_of_a_sub_region() {
        let extent = [3, 4, 6];
        let at = |x: usize, y: usize, z: usize| (x * 4 + y) * 6 + z;
        let source = HostStore { extent, data: (0..72u32).collect::<Vec<u32>>() };
        let packed = Region::from_boxes([GridBox::new([0, 0, 0], [2, 4, 6]), GridBox::new([2, 1, 1], [3, 3, 5])]);
        let bytes = source.pack(&packed);
        let want = Region::from_boxes([GridBox::new([1, 1, 2], [2, 3, 5]), GridBox::new([2, 2, 3], [3, 3, 5])]);
        let mut target = HostStore { extent, data: vec![u32::MAX; 72] };
        unpack_part(&mut target, &packed, &bytes, &want);
        for x in 0..3 {
            for y in 0..4 {
                for z in 0..6 {
                    let expect = if want.contains_point([x, y, z]) { at(x, y, z) as u32 } else { u32::MAX };
                    assert_eq!(target.data[at(x, y, z)], expect, "cell ({x}, {y}, {z})");
                }
            }
        }
    }

    /// Packing visits each box's cells in row-major order, whichever runs it merges.
    #[test]
    fn pack_is_row_major_per_box_and_unpack_inverts_it() {
        for extent in [[4, 5, 1], [3, 4, 6], [7, 1, 1]] {
            let cells = extent.iter().product::<usize>();
            let source = HostStore { extent, data: (0..cells as u32).collect::<Vec<u32>>() };
            let boxes = [
                GridBox::full(extent),
                GridBox::new([1, 0, 0], [3.min(extent[0]), extent[1], extent[2]]),
                GridBox::new([0, 1.min(extent[1] - 1), 0], [2, extent[1], extent[2]]),
                GridBox::new([1, 0, 1.min(extent[2] - 1)], [2, extent[1], extent[2]]),
            ];
            for b in boxes {
                let region = Region::from_box(b);
                let mut expect = Vec::new();
                for x in b.min[0]..b.max[0] {
                    for y in b.min[1]..b.max[1] {
                        for z in b.min[2]..b.max[2] {
                            expect.push(source.data[linear(extent, [x, y, z])]);
                        }
                    }
                }
                let packed = source.pack(&region);
                assert_eq!(bytemuck::cast_slice::<u8, u32>(&packed), &expect[..], "{extent:?} {b:?}");
                let mut target = HostStore { extent, data: vec![u32::MAX; cells] };
                target.unpack(&region, &packed);
                for (i, v) in target.data.iter().enumerate() {
                    let p = [i / (extent[1] * extent[2]), i / extent[2] % extent[1], i % extent[2]];
                    assert_eq!(*v, if b.contains_point(p) { i as u32 } else { u32::MAX }, "{extent:?} {b:?} cell {p:?}");
                }
            }
        }
    }
}
