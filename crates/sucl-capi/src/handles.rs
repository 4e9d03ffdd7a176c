//! The registries behind every C handle, and the objects they hold.

use crate::registry::Registry;
use crate::types::with_dtype;
use std::any::Any;
use std::sync::Arc;
use sucl::stream::{CommQueue, HostQueue, SharedBuf};
use sucl::{Communicator, DType, Element, UnscopedRequest};

/// Live communicators.
pub(crate) static COMMS: Registry<Box<Communicator>> = Registry::new("communicator", 1);
/// Live requests (non-blocking point-to-point and stream-triggered operations).
pub(crate) static REQUESTS: Registry<AnyRequest> = Registry::new("request", 2);
/// Live host queues.
pub(crate) static HOST_QUEUES: Registry<HostQueue> = Registry::new("host queue", 3);
/// Live shared buffers.
pub(crate) static BUFFERS: Registry<AnyBuffer> = Registry::new("buffer", 4);
/// Live stream-triggered queues.
pub(crate) static STREAMS: Registry<StreamEntry> = Registry::new("stream-triggered queue", 5);

/// What a request handle names.
pub(crate) enum AnyRequest {
    /// A non-blocking send or receive posted on communicator `comm`; `elem` bytes per element.
    P2p { comm: u64, req: UnscopedRequest, elem: usize },
    /// An operation enqueued on a stream-triggered queue.
    Stream(sucl::stream::Request),
}

/// A shared buffer of any element type.
#[derive(Clone)]
pub(crate) struct AnyBuffer {
    pub(crate) dtype: DType,
    buf: Arc<dyn Any + Send + Sync>,
}

impl AnyBuffer {
    pub(crate) fn zeroed(dtype: DType, len: usize) -> AnyBuffer {
        let buf: Arc<dyn Any + Send + Sync> = with_dtype!(dtype, T => Arc::new(SharedBuf::<T>::zeroed(len)));
        AnyBuffer { dtype, buf }
    }

    /// The typed buffer, if it holds `T`.
    pub(crate) fn get<T: Element>(&self) -> Option<&SharedBuf<T>> {
        self.buf.downcast_ref::<SharedBuf<T>>()
    }

    pub(crate) fn len(&self) -> usize {
        with_dtype!(self.dtype, T => self.get::<T>().map_or(0, |b| b.len()))
    }
}

/// A stream-triggered queue and the communicator handle it holds (given back at close).
pub(crate) struct StreamEntry {
    pub(crate) queue: CommQueue,
    pub(crate) comm: u64,
}
