//! Completing requests: non-blocking point-to-point and stream-triggered operations alike.

use crate::error::entry;
use crate::handles::{AnyRequest, COMMS, REQUESTS};
use crate::mem::Out;
use crate::p2p::elements;
use crate::types::{sucl_request, sucl_result, SUCL_REQUEST_NULL};

/// Waits (bounded by `SUCL_TIMEOUT`) until `request` completed; `*count` (if not NULL) gets the
/// elements it moved (received, for a receive). The handle dies, also when the wait fails.
/// `SUCL_REQUEST_NULL` completes at once with count 0.
///
/// A failed wait on a non-blocking send or receive may leave it in flight: free its
/// communicator (which withdraws everything posted on it) before reusing or freeing the buffer.
///
/// Thread safety: any thread, one at a time per request; a non-blocking send or receive also
/// uses its communicator (`SUCL_ERR_BUSY` while another thread is in a call on it).
/// Ownership: ends the caller's ownership of `request` and sucl's borrow of its buffer.
///
/// # Safety
/// `count` must be NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_wait(request: sucl_request, count: *mut usize) -> sucl_result {
    entry(|| {
        let out = Out::optional("count", count)?;
        if request == SUCL_REQUEST_NULL {
            if let Some(o) = out {
                o.set(0);
            }
            return Ok(());
        }
        let n = match REQUESTS.take_out(request, "a wait or test on another thread")? {
            AnyRequest::P2p { comm, req, elem } => {
                let c = match COMMS.checkout(comm) {
                    Ok(c) => c,
                    Err(e) => {
                        REQUESTS.put_back(request, AnyRequest::P2p { comm, req, elem });
                        return Err(e);
                    }
                };
                REQUESTS.retire(request);
                elements(c.wait_unscoped(req)?, elem)?
            }
            AnyRequest::Stream(r) => {
                REQUESTS.retire(request);
                r.wait()?
            }
        };
        if let Some(o) = out {
            o.set(n);
        }
        Ok(())
    })
}

/// Makes progress on `request` without blocking: `*done` becomes 1 once it completed (the handle
/// then dies and `*count`, if not NULL, gets the elements moved), else 0. An operation that
/// failed returns its error (and the handle dies).
///
/// Thread safety: as `sucl_wait`. Ownership: as `sucl_wait` once `*done` is 1.
///
/// # Safety
/// `done` must be writable; `count` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_test(request: sucl_request, done: *mut i32, count: *mut usize) -> sucl_result {
    entry(|| {
        let flag = Out::new("done", done)?;
        let out = Out::optional("count", count)?;
        let polled = match REQUESTS.take_out(request, "a wait or test on another thread")? {
            AnyRequest::P2p { comm, req, elem } => {
                let polled = COMMS.checkout(comm).and_then(|c| Ok(c.test_unscoped(&req)?));
                match polled {
                    Ok(Some(bytes)) => {
                        REQUESTS.retire(request);
                        Ok(Some(elements(bytes, elem)?))
                    }
                    Ok(None) => {
                        REQUESTS.put_back(request, AnyRequest::P2p { comm, req, elem });
                        Ok(None)
                    }
                    Err(e) => {
                        // Still posted: keep the handle so that it can be waited for or freed.
                        REQUESTS.put_back(request, AnyRequest::P2p { comm, req, elem });
                        return Err(e);
                    }
                }
            }
            AnyRequest::Stream(r) => {
                let polled = r.test();
                if matches!(polled, Ok(None)) {
                    REQUESTS.put_back(request, AnyRequest::Stream(r));
                }
                polled
            }
        };
        let polled = match polled {
            Ok(p) => p,
            Err(e) => {
                REQUESTS.retire(request);
                return Err(e.into());
            }
        };
        if polled.is_some() {
            REQUESTS.retire(request);
        }
        flag.set(i32::from(polled.is_some()));
        if let (Some(o), Some(n)) = (out, polled) {
            o.set(n);
        }
        Ok(())
    })
}

/// Releases `request` without waiting: a non-blocking send or receive is withdrawn (sucl no
/// longer touches its buffer afterwards; whether its message went is unknown); a
/// stream-triggered operation goes on, and only the handle dies. Local.
///
/// Thread safety: as `sucl_wait`. Ownership: ends the caller's ownership of `request`.
#[no_mangle]
pub extern "C" fn sucl_request_free(request: sucl_request) -> sucl_result {
    entry(|| {
        match REQUESTS.take_out(request, "a wait or test on another thread")? {
            AnyRequest::P2p { comm, req, elem } => match COMMS.checkout(comm) {
                Ok(c) => {
                    REQUESTS.retire(request);
                    c.cancel_unscoped(req);
                }
                Err(e) => {
                    REQUESTS.put_back(request, AnyRequest::P2p { comm, req, elem });
                    return Err(e);
                }
            },
            AnyRequest::Stream(_) => REQUESTS.retire(request),
        }
        Ok(())
    })
}
