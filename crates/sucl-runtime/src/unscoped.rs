//! Point-to-point requests outside a [`Scope`](crate::Scope), for layers that keep operations in
//! flight across calls (the stream-triggered queues of `sucl-stream`, whose progress thread owns
//! the buffers it lends to the backend). The caller takes over the scope's promise: the memory
//! stays valid until the request completed or was cancelled.

use crate::{Communicator, Result};
use sucl_core::backend::ReqId;

/// A posted send or receive that no scope waits for: complete it with
/// [`Communicator::test_unscoped`] / [`Communicator::wait_unscoped`] or withdraw it with
/// [`Communicator::cancel_unscoped`].
#[derive(Debug)]
#[must_use = "a posted request must be completed or cancelled before its memory goes away"]
pub struct UnscopedRequest {
    id: ReqId,
    backend: usize,
}

impl Communicator {
    /// Posts a send of `len` bytes at `ptr` to `dest` with `tag` on the point-to-point backend.
    ///
    /// # Safety
    /// The `len` bytes at `ptr` must stay valid and unmodified until the request completed or
    /// was cancelled, and the request must be completed or cancelled on this communicator.
    pub unsafe fn post_send_unscoped(&self, ptr: *const u8, len: usize, dest: usize, tag: u32) -> Result<UnscopedRequest> {
        self.validate_p2p("isend", dest, tag)?;
        let backend = self.p2p_index();
        // SAFETY: forwarded to the caller's promise above.
        let id = unsafe { self.backends.borrow_mut()[backend].post_send(dest, tag as u64, ptr, len)? };
        Ok(UnscopedRequest { id, backend })
    }

    /// Posts a receive of at most `cap` bytes into `ptr` from `src` with `tag`.
    ///
    /// # Safety
    /// The `cap` bytes at `ptr` must stay valid and otherwise untouched until the request
    /// completed or was cancelled, and the request must be completed or cancelled here.
    pub unsafe fn post_recv_unscoped(&self, ptr: *mut u8, cap: usize, src: usize, tag: u32) -> Result<UnscopedRequest> {
        self.validate_p2p("irecv", src, tag)?;
        let backend = self.p2p_index();
        // SAFETY: forwarded to the caller's promise above.
        let id = unsafe { self.backends.borrow_mut()[backend].post_recv(src, tag as u64, ptr, cap)? };
        Ok(UnscopedRequest { id, backend })
    }

    /// Makes progress; `Some(bytes)` once `req` completed (it is then retired: do not test it
    /// again).
    pub fn test_unscoped(&self, req: &UnscopedRequest) -> Result<Option<usize>> {
        self.backends.borrow_mut()[req.backend].test(req.id)
    }

    /// Waits (bounded by the timeout) for `req` and returns its byte count.
    pub fn wait_unscoped(&self, req: UnscopedRequest) -> Result<usize> {
        self.backends.borrow_mut()[req.backend].wait(req.id)
    }

    /// Withdraws `req`: afterwards the backend never touches its memory.
    pub fn cancel_unscoped(&self, req: UnscopedRequest) {
        self.backends.borrow_mut()[req.backend].cancel(req.id)
    }
}
