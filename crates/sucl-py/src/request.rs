//! `sucl.Request`: the handle of a non-blocking call or of an operation enqueued on a
//! `StreamQueue`, with `wait()` and `test()`.

use crate::errors::to_py;
use crate::exec::{lock, Completion, SLICE};
use crate::region::Region;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use sucl::{Communicator, UnscopedRequest};

/// A posted point-to-point message (its buffer held until it completes or is withdrawn).
pub struct P2p {
    comm: Arc<Mutex<Option<Communicator>>>,
    req: Option<UnscopedRequest>,
    _buf: Region,
    elem_size: usize,
    world_rank: usize,
}

impl P2p {
    pub fn new(comm: Arc<Mutex<Option<Communicator>>>, req: UnscopedRequest, buf: Region, world_rank: usize) -> P2p {
        let elem_size = buf.dtype.size();
        P2p { comm, req: Some(req), _buf: buf, elem_size, world_rank }
    }

    /// Tests (making progress) until done or `slice` passed. `Some` once complete.
    fn progress(&mut self, slice: std::time::Duration) -> Option<sucl::Result<usize>> {
        let start = Instant::now();
        loop {
            let g = lock(&self.comm);
            let Some(c) = g.as_ref() else {
                // Closing the communicator withdrew the message.
                self.req = None;
                return Some(Err(sucl::Error::invalid(self.world_rank, "request", "its communicator was closed")));
            };
            let req = self.req.as_ref()?;
            match c.test_unscoped(req) {
                Ok(Some(bytes)) => {
                    self.req = None;
                    return Some(Ok(bytes / self.elem_size));
                }
                Ok(None) => {}
                Err(e) => {
                    c.cancel_unscoped(self.req.take().expect("tested above"));
                    return Some(Err(e));
                }
            }
            drop(g);
            if start.elapsed() >= slice {
                return None;
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for P2p {
    fn drop(&mut self) {
        // Never leave the backend pointing at a buffer about to be released.
        if let Some(req) = self.req.take() {
            if let Some(c) = lock(&self.comm).as_ref() {
                c.cancel_unscoped(req);
            }
        }
    }
}

enum State {
    /// A collective on the worker thread, and what aborts the job if its wait is interrupted.
    Queued(Arc<Completion>, sucl::Interrupter),
    /// A send or receive in the backend.
    P2p(P2p),
    /// An operation of a `StreamQueue` (its buffers held by the queue).
    Stream(sucl::stream::Request),
    /// Finished: the element count for receives.
    Done(sucl::Result<usize>),
}

/// The handle of a non-blocking call. Its buffers stay referenced until the call completes;
/// dropping the handle does not cancel a collective (it completes in the background) but does
/// withdraw a send or receive that has not completed.
#[pyclass(module = "sucl")]
pub struct Request {
    state: Mutex<State>,
    /// Whether `wait()` returns an element count (receives) rather than `None`.
    counts: bool,
}

impl Request {
    pub fn queued(done: Arc<Completion>, interrupter: sucl::Interrupter) -> Request {
        Request { state: Mutex::new(State::Queued(done, interrupter)), counts: false }
    }

    pub fn p2p(p: P2p, counts: bool) -> Request {
        Request { state: Mutex::new(State::P2p(p)), counts }
    }

    pub fn stream(r: sucl::stream::Request, counts: bool) -> Request {
        Request { state: Mutex::new(State::Stream(r)), counts }
    }

    /// The stream-triggered operation this request waits for, if that is what it is.
    fn stream_request(&self) -> Option<sucl::stream::Request> {
        match &*lock(&self.state) {
            State::Stream(r) => Some(r.clone()),
            _ => None,
        }
    }

    /// Waits for a stream-triggered operation in slices (bounded by the queue's timeout),
    /// checking for signals between them. Ctrl-C leaves the operation enqueued.
    fn wait_stream(&self, py: Python<'_>, req: sucl::stream::Request) -> PyResult<Py<PyAny>> {
        let since = Instant::now();
        loop {
            if let Some(r) = py.detach(|| req.wait_slice(since, SLICE)) {
                *lock(&self.state) = State::Done(r.clone());
                return self.answer(py, r);
            }
            py.check_signals()?;
        }
    }

    /// One slice of waiting (without the GIL); `Some` once complete.
    ///
    /// The finished state is dropped after the state lock is released: a send's or receive's
    /// buffer is a Python object, and releasing it takes the GIL. Taking the GIL while holding
    /// the lock would deadlock with a thread that holds the GIL and waits for the lock (another
    /// `wait()` or `test()` on the same request), and with it the worker thread, which takes
    /// the GIL to release its calls' buffers.
    fn step(&self, slice: std::time::Duration) -> Option<sucl::Result<usize>> {
        let mut st = lock(&self.state);
        let r = match &mut *st {
            State::Done(r) => return Some(r.clone()),
            State::Queued(done, _) => done.wait_slice(slice)?,
            State::P2p(p) => p.progress(slice)?,
            State::Stream(r) => r.test().transpose()?,
        };
        let finished = std::mem::replace(&mut *st, State::Done(r.clone()));
        drop(st);
        drop(finished);
        Some(r)
    }

    /// A signal handler raised while waiting: abort the job if a collective is in flight.
    fn interrupted(&self) {
        if let State::Queued(done, interrupter) = &*lock(&self.state) {
            if done.peek().is_none() {
                interrupter.interrupt();
            }
        }
    }

    fn answer(&self, py: Python<'_>, r: sucl::Result<usize>) -> PyResult<Py<PyAny>> {
        let n = r.map_err(to_py)?;
        Ok(if self.counts { n.into_pyobject(py)?.into_any().unbind() } else { py.None() })
    }
}

#[pymethods]
impl Request {
    /// Blocks until the call completes, with the GIL released; raises the call's error.
    /// Returns the number of elements received for a receive, else None. Ctrl-C interrupts the
    /// wait: for a send or receive the message stays posted (wait again, or drop the request to
    /// withdraw it); a collective cannot be left half done, so the job is aborted (later calls
    /// raise `AbortedError`, as after Ctrl-C in a blocking call). An operation of a
    /// `StreamQueue` stays enqueued (it completes once its start and a wait or synchronize of
    /// the queue released it; waiting before that runs into the timeout).
    fn wait(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(req) = self.stream_request() {
            return self.wait_stream(py, req);
        }
        loop {
            if let Some(r) = py.detach(|| self.step(SLICE)) {
                return self.answer(py, r);
            }
            py.check_signals().inspect_err(|_| self.interrupted())?;
        }
    }

    /// Whether the call completed (makes progress on sends and receives); raises its error.
    fn test(&self, py: Python<'_>) -> PyResult<bool> {
        let r = match &*lock(&self.state) {
            State::Done(r) => Some(r.clone()),
            State::Queued(done, _) => done.peek(),
            State::P2p(_) | State::Stream(_) => None,
        };
        let r = match r {
            Some(r) => Some(r),
            None => py.detach(|| self.step(std::time::Duration::ZERO)),
        };
        match r {
            None => Ok(false),
            Some(r) => self.answer(py, r).map(|_| true),
        }
    }
}
