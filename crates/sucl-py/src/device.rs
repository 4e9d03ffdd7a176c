//! Device (CUDA) regions as sucl sees them: the call's stream as a queue on the GPU of its
//! buffers, and each region as a [`ForeignBuffer`] on that queue (checked again by the driver:
//! device memory of that GPU). Calls on them are enqueued on the stream and return without
//! waiting for the GPU, as NCCL's calls do.

use crate::region::{static_name, OnDevice, Region};
use sucl::cuda::{CUstream, DeviceElement, ForeignBuffer, Queue};
use sucl::Communicator;

/// The stream of `at` as a queue on the GPU its buffers live on; `at == None` (every buffer
/// empty): the communicator's GPU and the legacy default stream.
pub fn queue(c: &Communicator, at: Option<OnDevice>, stream: u64) -> sucl::Result<Queue> {
    let dev = match at {
        Some(d) => c.cuda_device_at(d.ordinal)?,
        None => match c.attached_device() {
            Some(d) => d,
            None => c.cuda_device()?,
        },
    };
    // SAFETY: the stream came from torch (its current stream of this device) or from the
    // object's `__cuda_array_interface__`, whose producer keeps it alive while the object lives;
    // the queue is dropped when the call returns, and never destroys the stream.
    unsafe { dev.borrowed_queue(stream as CUstream) }
}

/// `r` as device memory on `q`, or an empty buffer for `None` (a rank that does not use it).
///
/// # Safety
/// `T` is `r`'s element type, and the region (its object kept alive by the call) is not used by
/// other work until `q` ran the call (the caller's contract, as with NCCL).
pub unsafe fn wrap<T: DeviceElement>(q: &Queue, arg: &str, r: Option<&Region>) -> sucl::Result<ForeignBuffer<T>> {
    match r {
        // SAFETY: forwarded to the caller; `ForeignBuffer::new` checks what the driver can tell.
        Some(r) => unsafe { ForeignBuffer::new(q, static_name(arg), r.addr() as u64, r.len) },
        // SAFETY: an empty buffer is never read or written.
        None => Ok(unsafe { ForeignBuffer::new_unchecked(q, 0, 0) }),
    }
}
