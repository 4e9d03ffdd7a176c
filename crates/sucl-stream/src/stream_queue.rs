//! [`CommQueue`] on a CUDA stream (feature `cuda`): binding a communicator to a stream and the
//! methods that only stream queues have. The stream path itself is `device`.

use crate::device::{DevicePath, Transport};
use crate::queue::{CommQueue, Path};
use sucl_runtime::cuda::Queue;
use sucl_runtime::{Communicator, Result};

impl CommQueue {
    /// Binds `comm` to the CUDA stream of `queue`. Collective (it sets up the communicator's
    /// device side on `queue`'s GPU). `Transport::Auto` takes NCCL when every rank has it.
    /// Every buffer lent to the queue must belong to `queue`.
    pub fn on_stream(comm: Communicator, queue: &Queue, transport: Transport) -> Result<CommQueue> {
        let (rank, size, timeout) = (comm.rank(), comm.size(), comm.config().host.timeout);
        let world_rank = comm.world_rank_of(rank).unwrap_or(rank);
        let path = DevicePath::new(comm, queue, transport)?;
        Ok(CommQueue::with_path(Path::Device(Box::new(path)), rank, size, world_rank, timeout))
    }

    /// Which transport this device queue uses (`None` on a host queue).
    pub fn transport(&self) -> Option<Transport> {
        match &self.path {
            Path::Device(d) => d.transport(),
            Path::Host { .. } => None,
        }
    }

    /// The communicator a queue on the NCCL path issues its groups on (`None` otherwise), for
    /// comparing the queue with NCCL called directly on the same communicator and stream.
    /// Calls on it are ordered with the queue's groups only by the stream they are issued on.
    pub fn nccl_communicator(&self) -> Option<&Communicator> {
        match &self.path {
            Path::Device(d) => d.nccl_communicator(),
            Path::Host { .. } => None,
        }
    }

    /// Makes `other` (another stream) wait for every operation started so far (an event; the
    /// host does not block). On the queue's own stream use [`CommQueue::wait`].
    pub fn wait_on(&mut self, other: &Queue) -> Result<()> {
        self.wait()?;
        match &self.path {
            Path::Device(d) => {
                let ev = d.queue().record()?;
                other.wait_for(&ev)
            }
            Path::Host { .. } => Err(self.invalid("queue", "wait_on orders CUDA streams; this queue is a host queue")),
        }
    }

    /// Whether the bound stream has run everything enqueued on it (no wait).
    pub fn stream_idle(&self) -> Option<bool> {
        match &self.path {
            Path::Device(d) => Some(d.stream_idle()),
            Path::Host { .. } => None,
        }
    }
}
