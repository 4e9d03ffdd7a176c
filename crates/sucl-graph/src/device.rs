//! GPU ranks: a [`DistrQueue`](crate::DistrQueue) bound to a CUDA device
//! ([`DistrQueue::on_device`](crate::DistrQueue::on_device)).
//!
//! On a GPU rank every buffer lives in device memory, whole-extent like the host ranks' copies
//! (a rank holds valid data only where it wrote or received it); the host keeps a copy that is
//! brought up to date only for fences and host tasks. Kernels are CUDA C compiled at run time
//! by NVRTC ([`CudaSource`], compiled once per queue and source, at submission on every rank so
//! that a compile error ends every rank alike) and launched on the rank's stream in command
//! order, which respects every dependency. A kernel gets, in this order:
//!
//! ```c
//! extern "C" __global__ void name(sucl_chunk chunk,            // this rank's chunk
//!                                 T0* acc0, sucl_extent ext0,  // each accessor, in declaration
//!                                 T1* acc1, sucl_extent ext1,  // order: the buffer's base
//!                                 ...,                         // pointer and its extent
//!                                 user arguments...)           // the KernelArgs, in order
//! ```
//!
//! One thread per item of the chunk (blocks of 256); [`PRELUDE`] (prepended to every source)
//! defines `sucl_chunk`, `sucl_extent`, `sucl_item(chunk, i)` (this thread's global index,
//! false for the threads past the end) and `sucl_at(extent, i0, i1, i2)` (a cell's linear
//! position). Buffers are indexed with global indices, as host kernels index them.
//!
//! Pushes and await-pushes move device memory: over NCCL when the communicator set it up on
//! every rank (one NCCL group per task, sends and receives in an order both sides derive from
//! the commands, so no tags are needed), or staged through host memory (device → host, the
//! communicator's nonblocking host point-to-point with the executor's tags, host → device)
//! where NCCL is not there, where two ranks share one GPU (NCCL refuses that), or where
//! `SUCL_GRAPH_DEVICE_TRANSPORT=staged` asks for it. The communicator's own staged device
//! send/recv is blocking, one message at a time, so the executor stages itself to keep every
//! transfer of a task posted together (deadlock-free, as on host ranks). Regions that are one
//! contiguous run of memory move straight from and into the buffer; others are packed by a
//! copy kernel into a scratch buffer first.
//!
//! Every wait is bounded: a horizon waits for the device work of two horizons back (so the host
//! runs at most that far ahead), fences and `sync` wait for the stream through the
//! communicator (which watches NCCL for errors and lost ranks), and staged transfers use the
//! communicator's timeout.
//!
//! Without the `cuda` feature the types here exist (programs still compile) and
//! `DistrQueue::on_device` is not there.

// Without `cuda`, the setup and transfer planning here have no caller.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use crate::command::{Command, CommandKind, PeerRegion};
use crate::geometry::{GridBox, Index, Region, MAX_DIMS};
use crate::task::BufferId;
use crate::GraphError;
use std::sync::Arc;
use sucl_runtime::MAX_TAG;

/// Definitions prepended to every [`CudaSource`] (a `#line 1` after it keeps NVRTC's line
/// numbers those of the user's source).
pub const PRELUDE: &str = r#"
typedef unsigned long long sucl_size;
struct sucl_chunk { sucl_size offset[3]; sucl_size range[3]; sucl_size global[3]; };
struct sucl_extent { sucl_size e[3]; };
/* This thread's item of the chunk, as global indices i[0..3]; false past the chunk's end. */
__device__ __forceinline__ bool sucl_item(const sucl_chunk& c, sucl_size* i) {
    sucl_size t = (sucl_size)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= c.range[0] * c.range[1] * c.range[2]) return false;
    if (((t | c.range[1] | c.range[2]) >> 32) == 0) {
        unsigned int u = (unsigned int)t, r1 = (unsigned int)c.range[1], r2 = (unsigned int)c.range[2];
        i[2] = c.offset[2] + u % r2; u /= r2;
        i[1] = c.offset[1] + u % r1;
        i[0] = c.offset[0] + u / r1;
    } else {
        i[2] = c.offset[2] + t % c.range[2]; t /= c.range[2];
        i[1] = c.offset[1] + t % c.range[1];
        i[0] = c.offset[0] + t / c.range[1];
    }
    return true;
}
/* The linear position of cell (i0, i1, i2) of a buffer of extent x (row-major). */
__device__ __forceinline__ sucl_size sucl_at(const sucl_extent& x, sucl_size i0, sucl_size i1 = 0, sucl_size i2 = 0) {
    return (i0 * x.e[1] + i1) * x.e[2] + i2;
}
"#;

/// The executor's own kernel: copies a box of a buffer into a packed run or back.
const COPY_SRC: &str = r#"
extern "C" __global__ void sucl_box_copy(const unsigned char* src, unsigned char* dst, sucl_extent ext, sucl_chunk box,
                                         unsigned int es, int into_box) {
    sucl_size n = box.range[0] * box.range[1] * box.range[2];
    for (sucl_size t = (sucl_size)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (sucl_size)gridDim.x * blockDim.x) {
        sucl_size k = t % box.range[2], q = t / box.range[2];
        sucl_size j = q % box.range[1], i = q / box.range[1];
        sucl_size cell = sucl_at(ext, box.offset[0] + i, box.offset[1] + j, box.offset[2] + k);
        sucl_size a = into_box ? t : cell, b = into_box ? cell : t;
        switch (es) {
        case 8: ((unsigned long long*)dst)[b] = ((const unsigned long long*)src)[a]; break;
        case 4: ((unsigned int*)dst)[b] = ((const unsigned int*)src)[a]; break;
        case 2: ((unsigned short*)dst)[b] = ((const unsigned short*)src)[a]; break;
        default: for (unsigned int x = 0; x < es; x++) dst[b * es + x] = src[a * es + x];
        }
    }
}
"#;

/// Threads per block of every launch.
pub const BLOCK: u32 = 256;

/// CUDA C source of one or more kernels, with NVRTC options. Cheap to clone; a queue compiles
/// each source (this value and its clones) once and keeps the module.
#[derive(Clone, Debug)]
pub struct CudaSource {
    text: Arc<str>,
    options: Arc<[String]>,
}

impl CudaSource {
    /// Source compiled with NVRTC's default options.
    pub fn new(text: impl Into<String>) -> Self {
        Self::with_options(text, &[])
    }

    /// Source compiled with extra NVRTC options, e.g. `--fmad=false` (no fused multiply-add,
    /// for results bit-identical to the same arithmetic on the host).
    pub fn with_options(text: impl Into<String>, options: &[&str]) -> Self {
        CudaSource { text: Arc::from(text.into()), options: options.iter().map(|s| s.to_string()).collect() }
    }

    /// The user's source (without [`PRELUDE`]).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The NVRTC options.
    pub fn options(&self) -> &[String] {
        &self.options
    }

    /// The text NVRTC compiles: the prelude, a `#line 1`, the user's source.
    pub fn full_text(&self) -> String {
        format!("{PRELUDE}\n#line 1\n{}", self.text)
    }

    /// Whether `other` is this source or a clone of it (the compile cache's key).
    pub fn same(&self, other: &CudaSource) -> bool {
        Arc::ptr_eq(&self.text, &other.text) && Arc::ptr_eq(&self.options, &other.options)
    }
}

/// A scalar argument of a CUDA kernel, passed after the accessors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelArg {
    /// `int`
    I32(i32),
    /// `unsigned int`
    U32(u32),
    /// `long long`
    I64(i64),
    /// `unsigned long long`
    U64(u64),
    /// `float`
    F32(f32),
    /// `double`
    F64(f64),
}

macro_rules! arg_from {
    ($t:ty, $v:ident) => {
        impl From<$t> for KernelArg {
            fn from(x: $t) -> Self {
                KernelArg::$v(x)
            }
        }
    };
}
arg_from!(i32, I32);
arg_from!(u32, U32);
arg_from!(i64, I64);
arg_from!(u64, U64);
arg_from!(f32, F32);
arg_from!(f64, F64);

/// A CUDA kernel launch declared by a command group (`Handler::parallel_for_cuda`).
#[derive(Clone, Debug)]
pub struct CudaLaunch {
    /// The source holding the kernel.
    pub source: CudaSource,
    /// The kernel's name (`extern "C"`).
    pub kernel: String,
    /// Its scalar arguments.
    pub args: Vec<KernelArg>,
}

/// How a GPU queue moves device memory between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceTransport {
    /// One rank: nothing moves.
    Local,
    /// NCCL point-to-point, enqueued on the rank's stream (no host wait).
    Nccl,
    /// Device → host, the communicator's host point-to-point, host → device.
    Staged,
}

impl DeviceTransport {
    /// `local`, `nccl` or `staged`.
    pub fn name(&self) -> &'static str {
        match self {
            DeviceTransport::Local => "local",
            DeviceTransport::Nccl => "nccl",
            DeviceTransport::Staged => "staged",
        }
    }
}

/// Which transport a GPU queue asks for (`SUCL_GRAPH_DEVICE_TRANSPORT`: auto, nccl, staged).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TransportChoice {
    /// NCCL where the communicator has it and no two ranks share a GPU, else staged.
    #[default]
    Auto,
    /// NCCL or an error saying why not.
    Nccl,
    /// Staged through host memory.
    Staged,
}

impl TransportChoice {
    /// Parses `auto`, `nccl` or `staged`.
    pub fn parse(s: &str) -> Result<TransportChoice, GraphError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(TransportChoice::Auto),
            "nccl" => Ok(TransportChoice::Nccl),
            "staged" => Ok(TransportChoice::Staged),
            other => Err(GraphError::InvalidArgument(format!("SUCL_GRAPH_DEVICE_TRANSPORT={other:?}: want auto, nccl or staged"))),
        }
    }

    /// From `SUCL_GRAPH_DEVICE_TRANSPORT` (auto when unset).
    pub fn from_env() -> Result<TransportChoice, GraphError> {
        std::env::var("SUCL_GRAPH_DEVICE_TRANSPORT").map_or(Ok(TransportChoice::Auto), |v| Self::parse(&v))
    }

    fn code(self) -> u64 {
        match self {
            TransportChoice::Auto => 0,
            TransportChoice::Nccl => 1,
            TransportChoice::Staged => 2,
        }
    }
}

/// What a GPU queue does to set up its transport, decided identically on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Setup {
    /// Use this transport without touching the communicator's device side.
    Use(DeviceTransport),
    /// Set up the communicator's device side; NCCL if it has it, else staged (or an error
    /// when NCCL is required).
    Attach {
        /// NCCL was asked for explicitly.
        nccl_required: bool,
    },
}

/// Words each rank contributes to the setup agreement: host, GPU ordinal, choice.
pub(crate) const ID_WORDS: usize = 3;

/// A rank's agreement words.
pub(crate) fn identity(host: &str, ordinal: usize, choice: TransportChoice) -> [u64; ID_WORDS] {
    // FNV-1a: the same on every rank of one build, unlike a randomly seeded hasher.
    let h = host.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    [h, ordinal as u64, choice.code()]
}

/// Decides the setup from every rank's [`identity`] words (all-gathered, rank order).
pub(crate) fn decide(ids: &[u64]) -> Result<Setup, GraphError> {
    let ranks: Vec<&[u64]> = ids.chunks_exact(ID_WORDS).collect();
    if let Some(r) = ranks.iter().position(|w| w[2] != ranks[0][2]) {
        return Err(GraphError::InvalidArgument(format!(
            "ranks 0 and {r} ask for different device transports (SUCL_GRAPH_DEVICE_TRANSPORT must be the same on every rank)"
        )));
    }
    if ranks.len() <= 1 {
        return Ok(Setup::Use(DeviceTransport::Local));
    }
    let choice = ranks[0][2];
    if choice == TransportChoice::Staged.code() {
        return Ok(Setup::Use(DeviceTransport::Staged));
    }
    let shared = (0..ranks.len()).find_map(|a| (a + 1..ranks.len()).find(|&b| ranks[a][..2] == ranks[b][..2]).map(|b| (a, b)));
    match shared {
        Some((a, b)) if choice == TransportChoice::Nccl.code() => Err(GraphError::InvalidArgument(format!(
            "ranks {a} and {b} share GPU {} of one host, which NCCL refuses; use SUCL_GRAPH_DEVICE_TRANSPORT=staged or auto",
            ranks[a][1]
        ))),
        Some(_) => Ok(Setup::Use(DeviceTransport::Staged)),
        None => Ok(Setup::Attach { nccl_required: choice == TransportChoice::Nccl.code() }),
    }
}

/// The linear position of cell `p` in a buffer of `extent` (row-major).
fn linear(extent: Index, p: Index) -> usize {
    (p[0] * extent[1] + p[1]) * extent[2] + p[2]
}

/// If box `b` of a buffer of `extent` is one contiguous run of memory: its first cell and
/// number of cells. (Every dimension after the first that spans more than one index is full.)
pub(crate) fn contiguous(b: &GridBox, extent: Index) -> Option<(usize, usize)> {
    if b.is_empty() {
        return Some((0, 0));
    }
    let r = b.range();
    let first = (0..MAX_DIMS).find(|&d| r[d] > 1).unwrap_or(MAX_DIMS - 1);
    ((first + 1)..MAX_DIMS).all(|d| b.min[d] == 0 && b.max[d] == extent[d]).then(|| (linear(extent, b.min), b.area()))
}

/// If `region` is one contiguous run of memory: its first cell and number of cells.
pub(crate) fn region_span(region: &Region, extent: Index) -> Option<(usize, usize)> {
    match region.boxes() {
        [b] => contiguous(b, extent),
        _ => None,
    }
}

/// One point-to-point message of a transfer batch.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Message {
    /// The other rank.
    pub peer: usize,
    /// The buffer.
    pub buffer: BufferId,
    /// Part of a collective command (lowered to point-to-point), not a push.
    pub collective: bool,
    /// The cells, packed in the order of the region's boxes, row-major within each.
    pub region: Region,
}

/// The messages of one task in a transfer batch.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TaskTransfers {
    /// The task.
    pub task: usize,
    /// Outgoing, ordered by (peer, buffer, collective).
    pub sends: Vec<Message>,
    /// Incoming, ordered the same way.
    pub recvs: Vec<Message>,
}

/// One transfer command's messages as this rank sees them.
#[derive(Clone, Debug)]
pub(crate) struct TransferLists {
    task: usize,
    buffer: BufferId,
    collective: bool,
    sends: Vec<PeerRegion>,
    recvs: Vec<PeerRegion>,
}

/// Waits for every receive of a graph transfer, `(peer, bytes the region needs, request)`:
/// a message of another length is a `Mismatch` naming the peer (host and GPU executors).
pub(crate) fn wait_exact(rank: usize, waits: Vec<(usize, usize, sucl_runtime::Request<'_>)>) -> sucl_runtime::Result<()> {
    for (peer, want, r) in waits {
        let got = r.wait()?;
        if got != want {
            return Err(sucl_runtime::Error::Mismatch {
                rank,
                what: format!("graph transfer from rank {peer}: {got} bytes, the region has {want}"),
            });
        }
    }
    Ok(())
}

/// Groups a batch of push, await-push and collective commands of rank `me` into messages per
/// task (tasks ascending); see [`group_messages`]. A collective's parts are worked out here, for
/// this rank alone (the command carries the producer's and consumer's splits, not per-rank lists).
pub(crate) fn plan_transfers(commands: &[Command], me: usize) -> Result<Vec<TaskTransfers>, GraphError> {
    let mut lists = Vec::with_capacity(commands.len());
    for c in commands {
        let buffer = c.buffer.ok_or_else(|| GraphError::InvalidArgument(format!("transfer command {} names no buffer", c.id.0)))?;
        let (sends, recvs) = match (c.kind, &c.collective) {
            (CommandKind::Push, _) => (c.peers.clone(), vec![]),
            (CommandKind::AwaitPush, _) => (vec![], c.peers.clone()),
            (CommandKind::Collective, Some(coll)) => (coll.sends(me), coll.recvs(me)),
            (CommandKind::Collective, None) => {
                return Err(GraphError::InvalidArgument(format!("collective command {} has no pattern", c.id.0)))
            }
            (k, _) => return Err(GraphError::InvalidArgument(format!("command {} ({k:?}) is not a transfer", c.id.0))),
        };
        lists.push(TransferLists { task: c.task.0, buffer, collective: c.kind == CommandKind::Collective, sends, recvs });
    }
    group_messages(lists)
}

/// Messages per task (tasks ascending). Within a task, a (peer, buffer, collective) triple names
/// at most one message each way, and sender and receiver sort by it, so messages between two
/// ranks meet in the same order on both sides (NCCL matches by order, not by tag). Empty regions
/// move nothing. A task may have several collectives on one buffer (one per reading accessor,
/// over disjoint cells): their messages with one peer become one message, the union of their
/// regions taken in command order, which sender and receiver list alike.
pub(crate) fn group_messages(lists: Vec<TransferLists>) -> Result<Vec<TaskTransfers>, GraphError> {
    let mut out: Vec<TaskTransfers> = Vec::new();
    for l in lists {
        let at = match out.iter().position(|t| t.task == l.task) {
            Some(i) => i,
            None => {
                out.push(TaskTransfers { task: l.task, sends: vec![], recvs: vec![] });
                out.len() - 1
            }
        };
        let (buffer, collective) = (l.buffer, l.collective);
        let msg = |p: &PeerRegion| Message { peer: p.rank, buffer, collective, region: p.region.clone() };
        out[at].sends.extend(l.sends.iter().filter(|p| !p.region.is_empty()).map(msg));
        out[at].recvs.extend(l.recvs.iter().filter(|p| !p.region.is_empty()).map(msg));
    }
    out.sort_by_key(|t| t.task);
    for t in &mut out {
        t.sends.sort_by_key(|m| (m.peer, m.buffer.0, m.collective));
        t.recvs.sort_by_key(|m| (m.peer, m.buffer.0, m.collective));
        merge_collective_messages(&mut t.sends);
        merge_collective_messages(&mut t.recvs);
        for list in [&t.sends, &t.recvs] {
            if let Some(w) =
                list.windows(2).find(|w| (w[0].peer, w[0].buffer, w[0].collective) == (w[1].peer, w[1].buffer, w[1].collective))
            {
                return Err(GraphError::InvalidArgument(format!(
                    "task {}: two messages with rank {} for buffer {} in one direction",
                    t.task, w[0].peer, w[0].buffer.0
                )));
            }
        }
    }
    Ok(out)
}

/// Merges neighbouring collective messages of a sorted list that share (peer, buffer): the
/// sort is stable, so they stand in command order on both sides of the transfer.
fn merge_collective_messages(list: &mut Vec<Message>) {
    let mut merged: Vec<Message> = Vec::with_capacity(list.len());
    for m in list.drain(..) {
        match merged.last_mut() {
            Some(last) if m.collective && (last.peer, last.buffer, last.collective) == (m.peer, m.buffer, true) => {
                last.region = last.region.union(&m.region);
            }
            _ => merged.push(m),
        }
    }
    *list = merged;
}

/// The tag of a message of `task` on a GPU queue's staged path: task, buffer and whether it
/// belongs to a collective command (both sides of a transfer run this same function).
pub(crate) fn transfer_tag(task: usize, m: &Message, buffers: usize) -> u32 {
    let id = (task as u64 * buffers.max(1) as u64 + m.buffer.0 as u64) * 2 + u64::from(m.collective);
    (id % (MAX_TAG as u64 + 1)) as u32
}

/// Blocks of [`BLOCK`] threads for a chunk of `range` (None: an empty chunk, nothing to launch).
pub(crate) fn launch_blocks(range: Index) -> Result<Option<u32>, String> {
    let items = range.iter().try_fold(1u64, |a, &r| a.checked_mul(r as u64)).ok_or("the chunk's item count overflows")?;
    if items == 0 {
        return Ok(None);
    }
    let blocks = items.div_ceil(u64::from(BLOCK));
    u32::try_from(blocks)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .map(Some)
        .ok_or_else(|| format!("a chunk of {items} items needs {blocks} blocks of {BLOCK}, more than a CUDA grid holds ({})", i32::MAX))
}

/// The error of a failed NVRTC compilation, with NVRTC's log.
pub(crate) fn compile_error(rank: usize, task: &str, kernel: &str, log: &str) -> GraphError {
    GraphError::Kernel {
        rank,
        task: task.to_string(),
        message: format!("NVRTC could not compile the source of kernel `{kernel}`:\n{}", log.trim_end()),
    }
}

/// Offsets of packed runs laid out one after another, each aligned to 256 bytes; the total.
pub(crate) fn layout(sizes: impl IntoIterator<Item = usize>) -> (Vec<usize>, usize) {
    let mut at = 0usize;
    let offsets = sizes
        .into_iter()
        .map(|s| {
            let o = at;
            at = (at + s).next_multiple_of(256);
            o
        })
        .collect();
    (offsets, at)
}

#[cfg(feature = "cuda")]
pub(crate) use gpu::DeviceRank;

/// Without the `cuda` feature no queue has a device: an uninhabited type keeps the executor's
/// device hooks compiling.
#[cfg(not(feature = "cuda"))]
pub(crate) enum DeviceRank {}

#[cfg(not(feature = "cuda"))]
#[allow(clippy::unused_self)]
impl DeviceRank {
    pub(crate) fn transport(&self) -> DeviceTransport {
        match *self {}
    }
    pub(crate) fn add_buffer(&mut self, _: Index, _: usize, _: Option<&[u8]>) -> Result<(), GraphError> {
        match *self {}
    }
    pub(crate) fn synchronize(&mut self, _: &sucl_runtime::Communicator) -> Result<(), GraphError> {
        match *self {}
    }
    pub(crate) fn horizon(&mut self) -> Result<(), GraphError> {
        match *self {}
    }
    pub(crate) fn prepare(&mut self, _: &str, _: &CudaLaunch) -> Result<(), GraphError> {
        match *self {}
    }
    pub(crate) fn launch(&mut self, _: &str, _: &CudaLaunch, _: &crate::mapper::Chunk, _: &[BufferId]) -> Result<(), GraphError> {
        match *self {}
    }
    pub(crate) fn transfer(&mut self, _: &sucl_runtime::Communicator, _: &[Command]) -> Result<(), GraphError> {
        match *self {}
    }
    pub(crate) fn download(&mut self, _: &sucl_runtime::Communicator, _: BufferId, _: &Region) -> Result<Vec<u8>, GraphError> {
        match *self {}
    }
    pub(crate) fn upload(&mut self, _: BufferId, _: &Region, _: &[u8]) -> Result<(), GraphError> {
        match *self {}
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    use super::*;
    use crate::mapper::Chunk;
    use std::collections::VecDeque;
    use sucl_cuda::cudarc::driver::{result as cures, CudaFunction, CudaModule, DeviceRepr, DriverError, LaunchConfig, PushKernelArg};
    use sucl_cuda::cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};
    use sucl_cuda::{cuda_err, Buffer, Device, DeviceMemoryMut, Event, Queue};
    use sucl_runtime::Communicator;

    /// The prelude's `sucl_chunk`.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct ChunkArg {
        offset: [u64; 3],
        range: [u64; 3],
        global: [u64; 3],
    }
    // SAFETY: nine u64 in C layout, the layout of the prelude's `struct sucl_chunk`; plain data.
    unsafe impl DeviceRepr for ChunkArg {}

    /// The prelude's `sucl_extent`.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct ExtentArg {
        e: [u64; 3],
    }
    // SAFETY: three u64 in C layout, the layout of the prelude's `struct sucl_extent`.
    unsafe impl DeviceRepr for ExtentArg {}

    fn wide(i: Index) -> [u64; 3] {
        [i[0] as u64, i[1] as u64, i[2] as u64]
    }

    /// One buffer's device copy.
    struct DevBuf {
        /// Owns the allocation (freed when the rank is dropped, after its stream ran).
        _mem: Buffer<u8>,
        /// Its base address, fixed for the allocation's life.
        ptr: u64,
        extent: Index,
        elem: usize,
    }

    /// A growable device scratch area for packed messages.
    #[derive(Default)]
    struct Scratch {
        mem: Option<Buffer<u8>>,
        ptr: u64,
        cap: usize,
    }

    impl Scratch {
        /// The base address of at least `bytes` bytes. Growing drops the old allocation, which
        /// cudarc frees in stream order (after the work already enqueued that uses it).
        fn ensure(&mut self, queue: &Queue, bytes: usize) -> sucl_runtime::Result<u64> {
            if bytes > self.cap {
                let cap = bytes.max(self.cap * 2);
                let mut mem = queue.alloc::<u8>(cap)?;
                self.ptr = mem.write_ptr(queue.stream()).0;
                self.mem = Some(mem);
                self.cap = cap;
            }
            Ok(self.ptr)
        }
    }

    /// A GPU rank's device side: its stream, buffers, compiled kernels and transport.
    pub(crate) struct DeviceRank {
        rank: usize,
        queue: Queue,
        transport: DeviceTransport,
        bufs: Vec<DevBuf>,
        modules: Vec<(CudaSource, Arc<CudaModule>)>,
        functions: Vec<(usize, String, CudaFunction)>,
        copy: Option<CudaFunction>,
        out: Scratch,
        inn: Scratch,
        horizons: VecDeque<Event>,
    }

    impl Drop for DeviceRank {
        /// Buffers are freed only after the stream ran the work that uses them; if it does not
        /// finish (bounded wait), they are leaked rather than freed under a kernel.
        fn drop(&mut self) {
            if self.queue.synchronize().is_err() {
                std::mem::forget(std::mem::take(&mut self.bufs));
                std::mem::forget(std::mem::take(&mut self.out));
                std::mem::forget(std::mem::take(&mut self.inn));
            }
        }
    }

    impl DeviceRank {
        /// Sets up this rank's side (collective: every rank of `comm` calls it).
        pub(crate) fn new(comm: &Communicator, device: &Device, choice: TransportChoice) -> Result<DeviceRank, GraphError> {
            let mine = identity(&sucl_runtime::host_identity(), device.ordinal(), choice);
            let mut all = vec![0u64; ID_WORDS * comm.size()];
            comm.all_gather(&mine[..], &mut all[..])?;
            let transport = match decide(&all)? {
                Setup::Use(t) => t,
                Setup::Attach { nccl_required } => {
                    comm.attach_device(device)?;
                    if comm.device_backends().contains(&"nccl") {
                        DeviceTransport::Nccl
                    } else if nccl_required {
                        return Err(GraphError::InvalidArgument(format!(
                            "rank {}: SUCL_GRAPH_DEVICE_TRANSPORT=nccl, but the communicator has no NCCL (device backends: {:?})",
                            comm.rank(),
                            comm.device_backends()
                        )));
                    } else {
                        DeviceTransport::Staged
                    }
                }
            };
            let queue = device.queue()?;
            Ok(DeviceRank {
                rank: comm.rank(),
                queue,
                transport,
                bufs: vec![],
                modules: vec![],
                functions: vec![],
                copy: None,
                out: Scratch::default(),
                inn: Scratch::default(),
                horizons: VecDeque::new(),
            })
        }

        pub(crate) fn transport(&self) -> DeviceTransport {
            self.transport
        }

        pub(crate) fn queue(&self) -> &Queue {
            &self.queue
        }

        fn err(&self, during: &str) -> impl Fn(DriverError) -> GraphError + '_ {
            let during = during.to_string();
            move |e| GraphError::Comm(cuda_err(self.rank, &during, e))
        }

        fn bind(&self) -> Result<(), GraphError> {
            self.queue.device().context().bind_to_thread().map_err(self.err("binding the device"))
        }

        /// Allocates buffer `bufs.len()` (zeroed), with `init` (its bytes) copied in if given.
        pub(crate) fn add_buffer(&mut self, extent: Index, elem: usize, init: Option<&[u8]>) -> Result<(), GraphError> {
            let bytes = extent.iter().product::<usize>() * elem;
            let mut mem = self.queue.alloc::<u8>(bytes)?;
            if let Some(host) = init {
                mem.copy_from_host(host)?;
            }
            let ptr = mem.write_ptr(self.queue.stream()).0;
            self.bufs.push(DevBuf { _mem: mem, ptr, extent, elem });
            Ok(())
        }

        /// Waits (bounded) for everything enqueued so far, through the communicator (which also
        /// reports NCCL's asynchronous errors and lost ranks).
        pub(crate) fn synchronize(&mut self, comm: &Communicator) -> Result<(), GraphError> {
            comm.synchronize(&self.queue)?;
            self.horizons.clear();
            Ok(())
        }

        /// A horizon: marks the stream and waits for the mark of two horizons back.
        pub(crate) fn horizon(&mut self) -> Result<(), GraphError> {
            self.horizons.push_back(self.queue.record()?);
            while self.horizons.len() > 2 {
                let e = self.horizons.pop_front().expect("more than two");
                e.synchronize()?;
            }
            Ok(())
        }

        /// The module of `source`, compiled on first use.
        fn module(&mut self, source: &CudaSource, task: &str, kernel: &str) -> Result<usize, GraphError> {
            if let Some(i) = self.modules.iter().position(|(s, _)| s.same(source)) {
                return Ok(i);
            }
            let opts = CompileOptions { options: source.options().to_vec(), ..Default::default() };
            let ptx = compile_ptx_with_opts(source.full_text(), opts).map_err(|e| match e {
                CompileError::CompileError { log, .. } => compile_error(self.rank, task, kernel, &log.to_string_lossy()),
                other => compile_error(self.rank, task, kernel, &format!("{other:?}")),
            })?;
            let module = self.queue.device().context().load_module(ptx).map_err(self.err("loading a compiled module"))?;
            self.modules.push((source.clone(), module));
            Ok(self.modules.len() - 1)
        }

        /// Kernel `name` of `source`, compiled and loaded on first use.
        pub(crate) fn function(&mut self, source: &CudaSource, task: &str, name: &str) -> Result<CudaFunction, GraphError> {
            let m = self.module(source, task, name)?;
            if let Some((_, _, f)) = self.functions.iter().find(|(i, n, _)| *i == m && n == name) {
                return Ok(f.clone());
            }
            let f = self.modules[m].1.load_function(name).map_err(|e| GraphError::Kernel {
                rank: self.rank,
                task: task.to_string(),
                message: format!("kernel `{name}` is not in its source (is it `extern \"C\" __global__`?): {e:?}"),
            })?;
            self.functions.push((m, name.to_string(), f.clone()));
            Ok(f)
        }

        /// Compiles and loads the kernel of `launch` (at submission, on every rank, so that a
        /// compile error ends every rank alike).
        pub(crate) fn prepare(&mut self, task: &str, launch: &CudaLaunch) -> Result<(), GraphError> {
            self.function(&launch.source, task, &launch.kernel).map(|_| ())
        }

        /// Launches `launch` over `chunk` with the accessors' buffers, in declaration order.
        pub(crate) fn launch(&mut self, task: &str, launch: &CudaLaunch, chunk: &Chunk, buffers: &[BufferId]) -> Result<(), GraphError> {
            let f = self.function(&launch.source, task, &launch.kernel)?;
            let kernel_err = |message: String| GraphError::Kernel { rank: self.rank, task: task.to_string(), message };
            let Some(blocks) = launch_blocks(chunk.range).map_err(kernel_err)? else { return Ok(()) };
            self.bind()?;
            let c = ChunkArg { offset: wide(chunk.offset), range: wide(chunk.range), global: wide(chunk.global) };
            let ptrs: Vec<u64> = buffers.iter().map(|b| self.bufs[b.0].ptr).collect();
            let exts: Vec<ExtentArg> = buffers.iter().map(|b| ExtentArg { e: wide(self.bufs[b.0].extent) }).collect();
            let stream = self.queue.stream();
            let mut l = stream.launch_builder(&f);
            l.arg(&c);
            for (p, e) in ptrs.iter().zip(&exts) {
                l.arg(p).arg(e);
            }
            for a in &launch.args {
                match a {
                    KernelArg::I32(v) => l.arg(v),
                    KernelArg::U32(v) => l.arg(v),
                    KernelArg::I64(v) => l.arg(v),
                    KernelArg::U64(v) => l.arg(v),
                    KernelArg::F32(v) => l.arg(v),
                    KernelArg::F64(v) => l.arg(v),
                };
            }
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: the arguments are the documented list (`parallel_for_cuda`'s contract: the
            // kernel declares exactly these parameters); every pointer is a live allocation of
            // this queue's device, sized by the extent passed with it; they all outlive `l`.
            unsafe { l.launch(cfg) }.map_err(|e| kernel_err(format!("launching kernel `{}`: {e:?}", launch.kernel)))?;
            Ok(())
        }

        /// Enqueues copies of `region` of buffer `b` into packed device memory at `dst`
        /// (`into_box == false`) or from packed memory at `dst` into the region.
        fn stage(&mut self, b: BufferId, region: &Region, packed: u64, into_box: bool) -> Result<(), GraphError> {
            let (base, extent, es) = (self.bufs[b.0].ptr, self.bufs[b.0].extent, self.bufs[b.0].elem);
            let mut at = packed;
            for bx in region.boxes() {
                let bytes = bx.area() * es;
                if bytes == 0 {
                    continue;
                }
                let stream = self.queue.stream().cu_stream();
                if let Some((start, _)) = contiguous(bx, extent) {
                    let cell = base + (start * es) as u64;
                    let (dst, src) = if into_box { (cell, at) } else { (at, cell) };
                    // SAFETY: both ranges lie in live allocations of this device (the buffer's
                    // box, a scratch run sized for the message), ordered on this stream.
                    unsafe { cures::memcpy_dtod_async(dst, src, bytes, stream) }.map_err(self.err("copying a region"))?;
                } else {
                    let f = match &self.copy {
                        Some(f) => f.clone(),
                        None => {
                            let f = self.function(&copy_source(), "transfer", "sucl_box_copy")?;
                            self.copy = Some(f.clone());
                            f
                        }
                    };
                    let (src, dst) = if into_box { (at, base) } else { (base, at) };
                    let ext = ExtentArg { e: wide(extent) };
                    let bxa = ChunkArg { offset: wide(bx.min), range: wide(bx.range()), global: wide(extent) };
                    let (es32, into) = (es as u32, i32::from(into_box));
                    let blocks = (bx.area() as u64).div_ceil(u64::from(BLOCK)).min(4096) as u32;
                    let mut l = self.queue.stream().launch_builder(&f);
                    l.arg(&src).arg(&dst).arg(&ext).arg(&bxa).arg(&es32).arg(&into);
                    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
                    // SAFETY: sucl_box_copy's parameters, in order; the box lies in the buffer
                    // (regions are clipped to the extent) and the packed side has its bytes.
                    unsafe { l.launch(cfg) }.map_err(self.err("launching the region copy"))?;
                }
                at += bytes as u64;
            }
            Ok(())
        }

        /// Enqueues copies of every message's cells into packed device memory (the ones that are
        /// not one contiguous run); returns each message's device address.
        fn pack_all(&mut self, msgs: &[Message]) -> Result<Vec<u64>, GraphError> {
            let spans: Vec<Option<(usize, usize)>> = msgs.iter().map(|m| region_span(&m.region, self.bufs[m.buffer.0].extent)).collect();
            let (offs, total) = layout(msgs.iter().zip(&spans).map(|(m, s)| if s.is_some() { 0 } else { self.bytes(m) }));
            let scratch = self.out.ensure(&self.queue, total)?;
            let mut addrs = Vec::with_capacity(msgs.len());
            for ((m, s), o) in msgs.iter().zip(&spans).zip(offs) {
                match s {
                    Some((start, _)) => addrs.push(self.bufs[m.buffer.0].ptr + (start * self.bufs[m.buffer.0].elem) as u64),
                    None => {
                        let at = scratch + o as u64;
                        self.stage(m.buffer, &m.region, at, false)?;
                        addrs.push(at);
                    }
                }
            }
            Ok(addrs)
        }

        /// Each message's receiving device address (in place when contiguous, else a scratch
        /// run) and whether it must be unpacked from there.
        fn landing(&mut self, msgs: &[Message]) -> Result<Vec<(u64, bool)>, GraphError> {
            let spans: Vec<Option<(usize, usize)>> = msgs.iter().map(|m| region_span(&m.region, self.bufs[m.buffer.0].extent)).collect();
            let (offs, total) = layout(msgs.iter().zip(&spans).map(|(m, s)| if s.is_some() { 0 } else { self.bytes(m) }));
            let scratch = self.inn.ensure(&self.queue, total)?;
            Ok(msgs
                .iter()
                .zip(&spans)
                .zip(offs)
                .map(|((m, s), o)| match s {
                    Some((start, _)) => (self.bufs[m.buffer.0].ptr + (start * self.bufs[m.buffer.0].elem) as u64, false),
                    None => (scratch + o as u64, true),
                })
                .collect())
        }

        fn bytes(&self, m: &Message) -> usize {
            m.region.area() * self.bufs[m.buffer.0].elem
        }

        /// Runs a batch of transfer commands (pushes, await-pushes, collectives lowered to
        /// point-to-point).
        pub(crate) fn transfer(&mut self, comm: &Communicator, commands: &[Command]) -> Result<(), GraphError> {
            let plan = plan_transfers(commands, comm.rank())?;
            if plan.iter().all(|t| t.sends.is_empty() && t.recvs.is_empty()) {
                return Ok(());
            }
            self.bind()?;
            match self.transport {
                DeviceTransport::Local => Err(GraphError::InvalidArgument("a one-rank queue has a transfer".into())),
                DeviceTransport::Nccl => plan.iter().try_for_each(|t| self.nccl_task(comm, t)),
                DeviceTransport::Staged => self.staged(comm, &plan),
            }
        }

        /// One task's messages as one NCCL group on the stream (no host wait).
        fn nccl_task(&mut self, comm: &Communicator, t: &TaskTransfers) -> Result<(), GraphError> {
            let out = self.pack_all(&t.sends)?;
            let inn = self.landing(&t.recvs)?;
            let sends: Vec<(u64, usize, usize)> = t.sends.iter().zip(&out).map(|(m, &a)| (a, self.bytes(m), m.peer)).collect();
            let recvs: Vec<(u64, usize, usize)> = t.recvs.iter().zip(&inn).map(|(m, &(a, _))| (a, self.bytes(m), m.peer)).collect();
            // SAFETY: every address is this queue's device memory (a buffer's cells or a scratch
            // run) holding the byte count given, alive until the stream ran the group (buffers
            // live as long as the rank; scratch is freed in stream order); everything that
            // writes them is ordered on this same stream.
            unsafe { comm.nccl_group_p2p(&sends, &recvs, &self.queue)? };
            for (m, &(at, packed)) in t.recvs.iter().zip(&inn) {
                if packed {
                    self.stage(m.buffer, &m.region, at, true)?;
                }
            }
            Ok(())
        }

        /// Every message of the batch through host memory: download, the communicator's
        /// nonblocking host point-to-point (all posted at once, tagged), upload.
        fn staged(&mut self, comm: &Communicator, plan: &[TaskTransfers]) -> Result<(), GraphError> {
            let nbuf = self.bufs.len();
            let sends: Vec<(usize, Message)> = plan.iter().flat_map(|t| t.sends.iter().map(|m| (t.task, m.clone()))).collect();
            let recvs: Vec<(usize, Message)> = plan.iter().flat_map(|t| t.recvs.iter().map(|m| (t.task, m.clone()))).collect();
            let send_msgs: Vec<Message> = sends.iter().map(|(_, m)| m.clone()).collect();
            let addrs = self.pack_all(&send_msgs)?;
            let mut out: Vec<Vec<u8>> = Vec::with_capacity(sends.len());
            for (m, &a) in send_msgs.iter().zip(&addrs) {
                let mut host = vec![0u8; self.bytes(m)];
                // SAFETY: `a` addresses the message's bytes on this device (see pack_all);
                // `host` has exactly that length and outlives the synchronize below.
                unsafe { cures::memcpy_dtoh_async(&mut host[..], a, self.queue.stream().cu_stream()) }
                    .map_err(self.err("copying a message to the host"))?;
                out.push(host);
            }
            self.queue.synchronize()?;
            let mut inc: Vec<Vec<u8>> = recvs.iter().map(|(_, m)| vec![0u8; self.bytes(m)]).collect();
            let rank = comm.rank();
            comm.nonblocking(|scope| {
                let mut waits = Vec::new();
                for ((task, m), data) in recvs.iter().zip(inc.iter_mut()) {
                    let want = data.len();
                    waits.push((m.peer, want, scope.irecv(data.as_mut_slice(), m.peer, transfer_tag(*task, m, nbuf))?));
                }
                for ((task, m), data) in sends.iter().zip(&out) {
                    scope.isend(data.as_slice(), m.peer, transfer_tag(*task, m, nbuf))?;
                }
                wait_exact(rank, waits)?;
                scope.wait_all()
            })?;
            let recv_msgs: Vec<Message> = recvs.into_iter().map(|(_, m)| m).collect();
            let land = self.landing(&recv_msgs)?;
            for ((m, &(at, packed)), data) in recv_msgs.iter().zip(&land).zip(&inc) {
                // SAFETY: `at` addresses `data.len()` bytes of this device (the message's cells
                // or its scratch run); `data` lives until the synchronize below.
                unsafe { cures::memcpy_htod_async(at, &data[..], self.queue.stream().cu_stream()) }
                    .map_err(self.err("copying a message to the device"))?;
                if packed {
                    self.stage(m.buffer, &m.region, at, true)?;
                }
            }
            // The host copies must not be freed under an asynchronous upload.
            self.queue.synchronize()?;
            Ok(())
        }

        /// `region` of buffer `b`, packed (boxes in order, row-major within each), read after
        /// every earlier device work.
        pub(crate) fn download(&mut self, comm: &Communicator, b: BufferId, region: &Region) -> Result<Vec<u8>, GraphError> {
            self.bind()?;
            let m = Message { peer: self.rank, buffer: b, collective: false, region: region.clone() };
            let mut host = vec![0u8; self.bytes(&m)];
            if !host.is_empty() {
                let a = self.pack_all(std::slice::from_ref(&m))?[0];
                // SAFETY: as in `staged`: `a` holds the region's bytes, `host` as many.
                unsafe { cures::memcpy_dtoh_async(&mut host[..], a, self.queue.stream().cu_stream()) }
                    .map_err(self.err("copying a region to the host"))?;
            }
            self.synchronize(comm)?;
            Ok(host)
        }

        /// Writes packed `bytes` into `region` of buffer `b` (ordered before later device work).
        pub(crate) fn upload(&mut self, b: BufferId, region: &Region, bytes: &[u8]) -> Result<(), GraphError> {
            self.bind()?;
            let m = Message { peer: self.rank, buffer: b, collective: false, region: region.clone() };
            if bytes.len() != self.bytes(&m) {
                return Err(GraphError::InvalidArgument(format!("{} bytes for a region of {} bytes", bytes.len(), self.bytes(&m))));
            }
            if bytes.is_empty() {
                return Ok(());
            }
            let (at, packed) = self.landing(std::slice::from_ref(&m))?[0];
            // SAFETY: `at` addresses the region's bytes (or its scratch run); `bytes` lives until
            // the synchronize below.
            unsafe { cures::memcpy_htod_async(at, bytes, self.queue.stream().cu_stream()) }
                .map_err(self.err("copying a region to the device"))?;
            if packed {
                self.stage(b, region, at, true)?;
            }
            self.queue.synchronize()?;
            Ok(())
        }
    }

    /// The copy kernel's source (one per process, so every queue's cache sees the same value).
    fn copy_source() -> CudaSource {
        static SRC: std::sync::OnceLock<CudaSource> = std::sync::OnceLock::new();
        SRC.get_or_init(|| CudaSource::new(COPY_SRC)).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::CommandId;
    use crate::task::TaskId;

    fn bx(min: [usize; 3], max: [usize; 3]) -> GridBox {
        GridBox::new(min, max)
    }

    #[test]
    fn contiguous_boxes_are_recognised() {
        let e = [4, 5, 6];
        // Whole rows of the last two dimensions: contiguous.
        assert_eq!(contiguous(&bx([1, 0, 0], [3, 5, 6]), e), Some((30, 60)));
        // One row of the last dimension, partial: contiguous (a single run).
        assert_eq!(contiguous(&bx([2, 3, 1], [3, 4, 5]), e), Some((2 * 30 + 3 * 6 + 1, 4)));
        // A partial last dimension over several rows: not contiguous.
        assert_eq!(contiguous(&bx([0, 0, 1], [1, 2, 6]), e), None);
        // Several planes of partial middle dimension: not contiguous.
        assert_eq!(contiguous(&bx([0, 1, 0], [2, 5, 6]), e), None);
        // One plane, a band of full rows: contiguous.
        assert_eq!(contiguous(&bx([3, 1, 0], [4, 4, 6]), e), Some((3 * 30 + 6, 18)));
        // A 2D buffer's column halo: not contiguous; its row halo is.
        let e2 = [8, 8, 1];
        assert_eq!(contiguous(&bx([0, 3, 0], [8, 4, 1]), e2), None);
        assert_eq!(contiguous(&bx([3, 0, 0], [4, 8, 1]), e2), Some((24, 8)));
        assert_eq!(contiguous(&bx([3, 2, 0], [3, 4, 1]), e2), Some((0, 0)), "empty");
        let two = Region::from_boxes([bx([0, 0, 0], [1, 8, 1]), bx([5, 0, 0], [6, 8, 1])]);
        assert_eq!(region_span(&two, e2), None, "two boxes are never one span");
    }

    fn cmd(id: usize, kind: CommandKind, task: usize, buffer: usize, peers: &[(usize, GridBox)]) -> Command {
        Command {
            id: CommandId(id),
            kind,
            task: TaskId(task),
            buffer: Some(BufferId(buffer)),
            region: Region::empty(),
            peers: peers.iter().map(|&(rank, b)| PeerRegion { rank, region: Region::from_box(b) }).collect(),
            chunk: None,
            accesses: vec![],
            dependencies: vec![],
            collective: None,
        }
    }

    #[test]
    fn transfers_group_by_task_and_sort_the_same_way_on_both_sides() {
        let r = bx([0, 0, 0], [2, 1, 1]);
        let s = bx([2, 0, 0], [4, 1, 1]);
        // Rank 0 lists its commands in one order, rank 1 in another: both sides must sort
        // their messages to each other identically.
        let rank0 = vec![
            cmd(0, CommandKind::Push, 7, 2, &[(1, r)]),
            cmd(1, CommandKind::Push, 7, 1, &[(1, s), (2, s)]),
            cmd(2, CommandKind::AwaitPush, 5, 1, &[(1, r)]),
        ];
        let plan = plan_transfers(&rank0, 0).unwrap();
        assert_eq!(plan.iter().map(|t| t.task).collect::<Vec<_>>(), vec![5, 7], "tasks ascending");
        assert_eq!(plan[0].recvs.len(), 1);
        assert!(plan[0].sends.is_empty());
        let order: Vec<(usize, usize)> = plan[1].sends.iter().map(|m| (m.peer, m.buffer.0)).collect();
        assert_eq!(order, vec![(1, 1), (1, 2), (2, 1)]);
        let rank1 = vec![cmd(0, CommandKind::AwaitPush, 7, 2, &[(0, r)]), cmd(1, CommandKind::AwaitPush, 7, 1, &[(0, s)])];
        let p1 = plan_transfers(&rank1, 1).unwrap();
        let from0: Vec<usize> = p1[0].recvs.iter().filter(|m| m.peer == 0).map(|m| m.buffer.0).collect();
        let to1: Vec<usize> = plan[1].sends.iter().filter(|m| m.peer == 1).map(|m| m.buffer.0).collect();
        assert_eq!(from0, to1, "receiver and sender agree on the order of their messages");
    }

    #[test]
    fn collectives_lower_to_messages_of_their_own_and_empty_regions_move_nothing() {
        let r = bx([0, 0, 0], [3, 1, 1]);
        let mut c = cmd(4, CommandKind::Collective, 3, 0, &[]);
        // A collective's parts as rank 0 sees them: it sends r to rank 1, receives r from rank 1
        // and nothing from rank 2.
        let coll = TransferLists {
            task: 3,
            buffer: BufferId(0),
            collective: true,
            sends: vec![PeerRegion { rank: 1, region: Region::from_box(r) }],
            recvs: vec![PeerRegion { rank: 1, region: Region::from_box(r) }, PeerRegion { rank: 2, region: Region::empty() }],
        };
        let push = TransferLists {
            task: 3,
            buffer: BufferId(0),
            collective: false,
            sends: vec![PeerRegion { rank: 1, region: Region::from_box(r) }],
            recvs: vec![],
        };
        let plan = group_messages(vec![coll, push]).unwrap();
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].sends.len(), 2, "the push and the collective's send to rank 1 are distinct messages");
        assert_ne!(transfer_tag(3, &plan[0].sends[0], 4), transfer_tag(3, &plan[0].sends[1], 4));
        assert_eq!(plan[0].recvs.len(), 1, "the empty part from rank 2 moves nothing");
        c.collective = None;
        assert!(plan_transfers(&[c], 0).is_err(), "a collective without its pattern is an error");
        let mut exec = cmd(6, CommandKind::Execution, 3, 0, &[]);
        assert!(plan_transfers(std::slice::from_ref(&exec), 0).is_err(), "an execution command is not a transfer");
        exec.kind = CommandKind::Push;
        exec.buffer = None;
        assert!(plan_transfers(&[exec], 0).is_err(), "a transfer without a buffer");
        let dup = [cmd(0, CommandKind::Push, 1, 0, &[(1, r)]), cmd(1, CommandKind::Push, 1, 0, &[(1, r)])];
        assert!(plan_transfers(&dup, 0).is_err(), "two pushes of one task and buffer to one rank would be ambiguous");
    }

    /// Two collectives of one task on one buffer (two accessors over disjoint cells) in which
    /// rank 1 sends rank 0 cells: one message, the union, listed alike on both sides.
    #[test]
    fn collectives_of_one_task_and_buffer_share_one_message_per_peer() {
        let parts = [bx([0, 0, 0], [2, 1, 1]), bx([6, 0, 0], [8, 1, 1])];
        let lists = |me: usize| -> Vec<TransferLists> {
            parts
                .iter()
                .map(|&b| {
                    let part = vec![PeerRegion { rank: 1 - me, region: Region::from_box(b) }];
                    let (sends, recvs) = if me == 1 { (part, vec![]) } else { (vec![], part) };
                    TransferLists { task: 4, buffer: BufferId(0), collective: true, sends, recvs }
                })
                .collect()
        };
        let (sender, receiver) = (group_messages(lists(1)).unwrap(), group_messages(lists(0)).unwrap());
        let both = Region::from_box(parts[0]).union(&Region::from_box(parts[1]));
        assert_eq!(sender[0].sends.len(), 1, "one message to rank 0");
        assert_eq!(sender[0].sends[0].region, both);
        assert_eq!(receiver[0].recvs.len(), 1, "one message from rank 1");
        assert_eq!(receiver[0].recvs[0].region.boxes(), sender[0].sends[0].region.boxes(), "packed in the same order");
    }

    #[test]
    fn tags_match_the_host_executors_scheme() {
        let m = |b: usize, collective: bool| Message { peer: 1, buffer: BufferId(b), collective, region: Region::empty() };
        assert_eq!(transfer_tag(3, &m(1, false), 4), (3 * 4 + 1) * 2);
        assert_eq!(transfer_tag(3, &m(1, true), 4), (3 * 4 + 1) * 2 + 1);
        assert!(transfer_tag(usize::MAX / 16, &m(3, false), 4) <= MAX_TAG);
    }

    #[test]
    fn the_setup_is_agreed_from_every_ranks_identity() {
        let ids = |v: &[(&str, usize, TransportChoice)]| v.iter().flat_map(|&(h, o, c)| identity(h, o, c)).collect::<Vec<u64>>();
        use TransportChoice::*;
        assert_eq!(decide(&ids(&[("a", 0, Auto)])).unwrap(), Setup::Use(DeviceTransport::Local));
        assert_eq!(decide(&ids(&[("a", 0, Auto), ("a", 1, Auto)])).unwrap(), Setup::Attach { nccl_required: false });
        assert_eq!(decide(&ids(&[("a", 0, Auto), ("b", 0, Auto)])).unwrap(), Setup::Attach { nccl_required: false });
        assert_eq!(decide(&ids(&[("a", 0, Nccl), ("a", 1, Nccl)])).unwrap(), Setup::Attach { nccl_required: true });
        // Two ranks on one GPU: staged, or an error naming them when NCCL is required.
        assert_eq!(decide(&ids(&[("a", 0, Auto), ("a", 1, Auto), ("a", 0, Auto)])).unwrap(), Setup::Use(DeviceTransport::Staged));
        let e = decide(&ids(&[("a", 0, Nccl), ("a", 1, Nccl), ("a", 1, Nccl)])).unwrap_err().to_string();
        assert!(e.contains("ranks 1 and 2 share GPU 1"), "{e}");
        assert_eq!(decide(&ids(&[("a", 0, Staged), ("a", 1, Staged)])).unwrap(), Setup::Use(DeviceTransport::Staged));
        let e = decide(&ids(&[("a", 0, Auto), ("a", 1, Staged)])).unwrap_err().to_string();
        assert!(e.contains("ranks 0 and 1 ask for different device transports"), "{e}");
        assert_ne!(identity("a", 0, Auto), identity("b", 0, Auto));
    }

    #[test]
    fn transport_choice_parses_and_rejects() {
        assert_eq!(TransportChoice::parse("NCCL").unwrap(), TransportChoice::Nccl);
        assert_eq!(TransportChoice::parse(" staged ").unwrap(), TransportChoice::Staged);
        assert_eq!(TransportChoice::parse("").unwrap(), TransportChoice::Auto);
        let e = TransportChoice::parse("ipc").unwrap_err().to_string();
        assert!(e.contains("want auto, nccl or staged"), "{e}");
    }

    #[test]
    fn launch_blocks_cover_the_chunk_and_reject_what_a_grid_cannot_hold() {
        assert_eq!(launch_blocks([0, 5, 1]).unwrap(), None);
        assert_eq!(launch_blocks([1, 1, 1]).unwrap(), Some(1));
        assert_eq!(launch_blocks([256, 1, 1]).unwrap(), Some(1));
        assert_eq!(launch_blocks([257, 1, 1]).unwrap(), Some(2));
        assert_eq!(launch_blocks([8192, 8192, 1]).unwrap(), Some(8192 * 32));
        let e = launch_blocks([1 << 30, 1 << 12, 1]).unwrap_err();
        assert!(e.contains("more than a CUDA grid holds"), "{e}");
        assert!(launch_blocks([usize::MAX, 2, 1]).unwrap_err().contains("overflows"));
    }

    #[test]
    fn layout_aligns_every_run() {
        assert_eq!(layout([10, 0, 300, 4]), (vec![0, 256, 256, 768], 1024));
        assert_eq!(layout(std::iter::empty()), (vec![], 0));
    }

    #[test]
    fn sources_compile_with_the_prelude_and_keep_user_line_numbers() {
        let s = CudaSource::with_options("extern \"C\" __global__ void k(sucl_chunk c) {}", &["--fmad=false"]);
        let full = s.full_text();
        assert!(full.starts_with(PRELUDE));
        assert!(full.contains("\n#line 1\nextern \"C\""), "the user's first line is line 1");
        assert_eq!(s.options(), ["--fmad=false"]);
        assert!(s.same(&s.clone()));
        assert!(!s.same(&CudaSource::new(s.text())), "an equal text is another source (compiled again)");
        let e = compile_error(2, "step", "k", "k.cu(3): error: identifier \"x\" is undefined\n\n").to_string();
        assert_eq!(
            e,
            "rank 2: task 'step' failed: NVRTC could not compile the source of kernel `k`:\nk.cu(3): error: identifier \"x\" is undefined"
        );
        assert_eq!(KernelArg::from(1.5f64), KernelArg::F64(1.5));
        assert_eq!(KernelArg::from(7u32), KernelArg::U32(7));
    }
}
