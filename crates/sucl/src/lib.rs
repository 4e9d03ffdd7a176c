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
