//! sucl-graph: a distributed task graph over sucl (the Celerity design).
//!
//! A program is a sequence of tasks over buffers. Each task declares how it accesses buffers
//! through range mappers (which part of a buffer a chunk of the kernel's range touches). Every
//! rank builds the same task graph from the program without communicating, splits every task's
//! range across the ranks and generates, for itself alone, a command graph: execution commands
//! for its chunk, push commands for data it owns that other ranks read, and await-push commands
//! for data it reads that other ranks wrote. A push or await-push carries the full per-peer
//! regions of a (task, buffer) transfer.
//!
//! Access modes follow Celerity: `read`, `write` and `read_write` consume the prior contents of
//! the mapped cells (a `write` keeps the cells the kernel leaves alone, so they are brought in
//! like a `read_write`'s), `discard_write` and `discard_read_write` do not; every mode but
//! `read` produces.
//!
//! Collective pattern discovery (on by default; `QueueOptions::discovery`, `SUCL_GRAPH_CPD=0`,
//! `sucl graph --no-cpd` turn it off): the task graph marks each read that is the first
//! dependency on one producer's region as a [`Forward`] (unless producer and consumer share
//! geometry and mapper), and each rank's generator turns a forward into [`Collective`] commands
//! (gather, all-gather, broadcast, scatter, all-to-all) from the producer and consumer chunk
//! counts and the mappers' metadata refined by each task's split
//! ([`RangeMapper::meta_for_split`]: `slice(d)` along a split that cuts only `d` is constant),
//! or leaves it to push / await-push. A task that reads the buffer through several accessors
//! gets one collective for them all when one accessor is constant and covers every forwarded
//! cell, else one per accessor that needs data (their cells disjoint), else point to point. A
//! collective command carries the producer's and consumer's split accesses rather than per-rank
//! regions, so its generation costs no per-rank work; the executor lowers it to the
//! communicator's (v-)collectives.
//!
//! Programs use [`DistrQueue`] ([`queue`]): typed [`Buffer`]s, command groups that declare
//! accessors with range mappers ([`mappers`]) and run a kernel (`parallel_for`, Rust closures
//! on worker threads), a master or collective host task, or a fence. [`Scheduler`] alone
//! builds the graphs without running anything (simulated ranks: tests, benchmarks and
//! `sucl graph`, which reads [`scenario`] files); [`dump`] prints them as text, JSON or dot,
//! and `SUCL_GRAPH_DUMP=dir` writes each rank's graphs from a running program.
//!
//! Layers: this crate depends on `sucl-runtime`'s public API only (for the executor); the graph
//! modules themselves are pure and need no communicator. GPU ranks ([`device`],
//! `DistrQueue::on_device`, feature `cuda`): buffers in device memory, CUDA C kernels compiled
//! at run time by NVRTC (`Handler::parallel_for_cuda`), transfers over NCCL or staged through
//! host memory; this crate then also uses `sucl-cuda`'s public API (devices, streams, NVRTC).

#![warn(missing_docs)]

pub mod geometry;

pub use geometry::{extent, GridBox, Index, Region, RegionMap, MAX_DIMS};
pub mod mapper;

pub use mapper::{Chunk, DimMapping, MapperMeta, RangeMapper};
pub mod task;

pub use task::{
    AccessMode, Accessor, BufferId, BufferInfo, DepKind, Forward, SplitHint, Target, Task, TaskDep, TaskGraph, TaskId, TaskKind, TaskSpec,
    Warning,
};

/// Errors of graph construction and command generation.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// A program error found before anything runs: what was wrong.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Two ranks write the same cells in one task.
    #[error("task {task} ('{name}'): ranks {ranks:?} both write buffer {buffer} region {region:?}")]
    OverlappingWrites {
        /// The task's id.
        task: usize,
        /// The task's name.
        name: String,
        /// The buffer.
        buffer: usize,
        /// Two ranks that write the same cells.
        ranks: (usize, usize),
        /// The cells both write.
        region: Vec<GridBox>,
    },
    /// A kernel or host task failed (panicked) on this rank.
    #[error("rank {rank}: task '{task}' failed: {message}")]
    Kernel {
        /// The rank it failed on.
        rank: usize,
        /// The task's name.
        task: String,
        /// What went wrong.
        message: String,
    },
    /// Ranks submitted different programs (found where they synchronise).
    #[error(
        "rank {rank}: ranks {ranks:?} submitted a different program from rank 0 (compared after {steps} submissions on this rank); \
         every rank must create the same buffers and submit the same command groups in the same order"
    )]
    ProgramMismatch {
        /// This rank.
        rank: usize,
        /// The ranks whose program differs from rank 0's.
        ranks: Vec<usize>,
        /// Buffers, tasks and epochs this rank submitted.
        steps: u64,
    },
    /// The transfers of a task (pushes, await-pushes, collectives) failed.
    #[error("rank {rank}: the transfers of task {task} ('{name}') failed: {source}{hint}")]
    Transfer {
        /// This rank.
        rank: usize,
        /// The task whose data was moving.
        task: usize,
        /// Its name.
        name: String,
        /// What else may be behind it (for timeouts).
        hint: &'static str,
        /// The communication error.
        #[source]
        source: sucl_runtime::Error,
    },
    /// A communication error of the executor.
    #[error(transparent)]
    Comm(#[from] sucl_runtime::Error),
}
pub mod command;

pub use command::{
    chunk_of, Collective, CollectiveOp, Command, CommandAccess, CommandDep, CommandGraphGenerator, CommandId, CommandKind, Footprint,
    PeerRegion, RankGraph, Scheduler, SplitAccess,
};
pub mod device;
pub mod dump;
pub mod queue;
pub mod scenario;

pub use device::{CudaSource, DeviceTransport, KernelArg, TransportChoice};
pub use queue::{mappers, Buffer, Ctx, DistrQueue, Handler, QueueOptions, ReadAcc, ReadView, WriteAcc, WriteView};
