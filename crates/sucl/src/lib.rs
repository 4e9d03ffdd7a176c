//! sucl: a unified communication layer — the crate programs depend on.
//!
//! One API, [`Communicator`], moves data between ranks over pluggable backends (shared memory,
//! TCP, MPI for host memory; NCCL and a staged path for CUDA memory) that the runtime picks per
//! platform, operation and message size.
//!
//! ```no_run
//! let comm = sucl::init()?;
//! let mut v = vec![comm.rank() as f32; 4];
//! comm.all_reduce_in_place(&mut v, sucl::ReduceOp::Sum)?;
//! assert_eq!(v[0], (0..comm.size()).sum::<usize>() as f32);
//! # Ok::<(), sucl::Error>(())
//! ```
//!
//! This crate only gathers the layers under one name: the runtime (`sucl-runtime`: bootstrap,
//! selection, configuration, the typed API) is re-exported at the top level, and each later
//! design (stream-triggered queues, the task graph, remote devices) lives in a crate of its own
//! that builds on the runtime's public API and is re-exported here as a module. Nothing below
//! depends on this crate.

#![warn(missing_docs)]

pub use sucl_runtime::*;
/// Stream-triggered communication: `CommQueue` (enqueue, start, wait) on host queues and CUDA streams.
pub use sucl_stream as stream;

/// Remote devices: the `sucld` daemon library, its wire protocol and the client.
pub use sucl_remote as remote;

/// The distributed task graph: buffers, range mappers, task graph and per-rank command graphs.
pub use sucl_graph as graph;

/// The Rust samples of the README and the user guides, compiled as doctests of this crate (and
/// run where they need neither a GPU nor a second rank), so that a sample that no longer builds
/// fails `cargo test`.
#[cfg(doctest)]
pub mod doc_samples {
    #[doc = include_str!("../../../README.md")]
    pub struct Readme;
    #[doc = include_str!("../../../docs/guide/host.md")]
    pub struct GuideHost;
    #[doc = include_str!("../../../docs/guide/devices.md")]
    pub struct GuideDevices;
    #[doc = include_str!("../../../docs/guide/stream-triggered.md")]
    pub struct GuideStreamTriggered;
    #[doc = include_str!("../../../docs/guide/task-graph.md")]
    pub struct GuideTaskGraph;
    #[doc = include_str!("../../../docs/guide/remote.md")]
    pub struct GuideRemote;
    #[doc = include_str!("../../../docs/guide/launching.md")]
    pub struct GuideLaunching;
    #[doc = include_str!("../../../docs/guide/c.md")]
    pub struct GuideC;
    #[doc = include_str!("../../../docs/guide/python.md")]
    pub struct GuidePython;
    #[doc = include_str!("../../../docs/guide/nccl-dropin.md")]
    pub struct GuideNcclDropIn;
    #[doc = include_str!("../../../docs/guide/graph/queue.md")]
    pub struct GraphQueue;
    #[doc = include_str!("../../../docs/guide/graph/buffers.md")]
    pub struct GraphBuffers;
    #[doc = include_str!("../../../docs/guide/graph/range-mappers.md")]
    pub struct GraphRangeMappers;
    #[doc = include_str!("../../../docs/guide/graph/host-tasks.md")]
    pub struct GraphHostTasks;
}
