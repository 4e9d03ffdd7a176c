//! Ctrl-C while sucl waits. A blocking call runs under [`run`]: when one of its waits has lasted
//! a while, sucl asks (every 50 ms, see `Communicator::interruptible`) whether to stop; the
//! answer re-takes the GIL and runs Python's pending signal handlers. If a handler raised (the
//! default SIGINT handler raises KeyboardInterrupt), sucl aborts the job, the call ends, and
//! [`result`] raises the handler's exception instead of sucl's error. The abort is job-wide, as
//! NCCL's abort is: the interrupted collective cannot be left half done, so later calls raise
//! `AbortedError` ("rank R was interrupted") and the other ranks' waits end with that error.

use crate::errors::to_py;
use pyo3::prelude::*;
use std::cell::RefCell;
use sucl::Communicator;

thread_local! {
    /// The exception a signal handler raised during the current call on this thread.
    static RAISED: RefCell<Option<PyErr>> = const { RefCell::new(None) };
}

/// Runs `f` on `c` (call without the GIL) so that Python signals interrupt its long waits.
pub fn run<R>(c: &Communicator, f: impl FnOnce() -> sucl::Result<R>) -> sucl::Result<R> {
    c.interruptible(&signal_handler_raised, f)
}

/// Runs the pending Python signal handlers (only the main thread has any); whether one raised.
fn signal_handler_raised() -> bool {
    Python::attach(|py| match py.check_signals() {
        Ok(()) => false,
        Err(e) => {
            RAISED.with(|r| *r.borrow_mut() = Some(e));
            true
        }
    })
}

/// The Python outcome of a call made under [`run`]: the signal handler's exception if one was
/// raised (even if the call then completed: the job is aborted either way), else the call's.
pub fn result<R>(r: sucl::Result<R>) -> PyResult<R> {
    match RAISED.with(|r| r.borrow_mut().take()) {
        Some(e) => Err(e),
        None => r.map_err(to_py),
    }
}
