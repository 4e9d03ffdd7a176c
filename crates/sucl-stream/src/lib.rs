//! sucl-stream: stream-triggered communication. A [`CommQueue`] binds a communicator to one
//! in-order queue — a [`HostQueue`] or (feature `cuda`) a CUDA stream — and lets a program
//! *enqueue* point-to-point and collective operations that the queue itself triggers and waits
//! for, so the host never sits at a kernel boundary:
//!
//! ```no_run
//! use sucl_stream::{CommQueue, HostQueue, SharedBuf};
//! let comm = sucl_runtime::init()?;
//! let (rank, size) = (comm.rank(), comm.size());
//! let q = HostQueue::new();
//! let mut cq = CommQueue::on_host(comm, &q)?;
//! let out = SharedBuf::new(vec![rank as f64; 4]);
//! let got = SharedBuf::<f64>::zeroed(4);
//! let r = cq.enqueue_recv(&got, (rank + size - 1) % size, 7)?; // nothing moves yet
//! cq.enqueue_send(&out, (rank + 1) % size, 7)?;
//! cq.start()?; // the queue releases both when it reaches this point
//! cq.wait()?;  // later tasks on `q` see the received data; the host goes on
//! q.submit(move || println!("{:?}", got.read()[0]));
//! r.wait()?;   // host-side completion, bounded
//! cq.synchronize()?;
//! let _comm = cq.close()?;
//! # Ok::<(), sucl_runtime::Error>(())
//! ```
//!
//! Three ways underneath, one contract:
//! - host queues: `start` and `wait` are tasks on the queue; the queue's own progress thread
//!   (see `engine`) posts each started batch on the communicator's host backend;
//! - CUDA streams, staged (any host backend): trigger and completion counters in pinned,
//!   device-mapped host memory, written and awaited by the stream with
//!   `cuStreamWriteValue64`/`cuStreamWaitValue64`, the queue's progress thread between them;
//! - CUDA streams over NCCL: `start` marks the stream's point with an event; `wait` issues the
//!   batches of the starts since the last wait as NCCL groups on a side stream after that
//!   point and makes the stream wait for them (NCCL runs a communicator's kernels in issue
//!   order, so one group per start would hold later starts behind earlier ones).
//!
//! Rules, checked before anything moves: an explicit peer and tag (no wildcards); a
//! [`PROC_NULL`] peer completes at once; operations match per (peer, tag) in enqueue order and
//! match ordinary sends and receives of the same communicator; one buffer may serve two
//! operations of one batch only if both read it (a receive or a collective's result buffer
//! used by another operation of the same batch is refused at enqueue, naming both; across
//! batches, which MPI calls erroneous too, the later operation — and every one enqueued after
//! it — is posted once the earlier one gave the buffer back, so lend a second buffer where the
//! earlier one could only complete after them); `wait` with
//! operations enqueued and not started is refused, naming how many; the queue keeps every
//! buffer it was lent until its operation completed; closing (or dropping) a queue with
//! operations in flight is an error (see [`CommQueue::close`]).
//!
//! Each `start` releases its batch on its own: the operations of a later start are posted
//! without waiting for those of an earlier one to complete, and only `wait` orders later work
//! on the queue. Each host-backed queue has its own progress thread, so queues never wait for
//! each other (a collective of one queue does not hold up another queue's operations). A
//! received message must be a whole number of the buffer's elements, else its request fails.
//! A lost peer or a timeout releases every wait of the queue and surfaces as an error, naming
//! the peer, on every request.
//!
//! Depends on `sucl-runtime` (and `sucl-cuda` for streams) through their public APIs only.

#![warn(missing_docs)]
// Without `cuda` some dispatch has one arm and a few helpers serve only the device path.
#![cfg_attr(not(feature = "cuda"), allow(dead_code, irrefutable_let_patterns))]

mod buffer;
#[cfg(feature = "cuda")]
pub mod device;
mod engine;
pub mod faces;
#[cfg(feature = "cuda")]
pub mod faces_gpu;
mod hostq;
mod queue;
mod request;
mod shared;
mod slot_pool;
#[cfg(feature = "cuda")]
mod stream_queue;
mod wakeup;

pub use buffer::QueueBuffer;
pub use hostq::HostQueue;
pub use queue::CommQueue;
pub use request::Request;
pub use shared::{ReadGuard, SharedBuf, WriteGuard};
pub use sucl_runtime::{Error, Result};

/// The null peer (MPI's `MPI_PROC_NULL`): an operation with it completes at once, moving nothing
/// (the edges of a non-periodic grid).
pub const PROC_NULL: usize = usize::MAX;

/// A wildcard source (MPI's `MPI_ANY_SOURCE`). Stream-triggered receives refuse it.
pub const ANY_SOURCE: usize = usize::MAX - 1;

/// A wildcard tag (MPI's `MPI_ANY_TAG`). Stream-triggered operations refuse it.
pub const ANY_TAG: u32 = u32::MAX;

/// Most operations started and not yet complete on one queue (each start counting as one more
/// until its own operations completed, whatever earlier starts are doing);
/// `start` blocks (bounded) beyond
/// it, so the thread that triggers a queue never blocks inside the driver behind a full stream.
pub const MAX_IN_FLIGHT: u64 = 500;

/// Longest busy-poll of the progress engine and of a host queue's wait before they yield.
pub(crate) const SHORT_SPIN: std::time::Duration = std::time::Duration::from_micros(5);
