//! Host-side completion of stream-triggered operations.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};
use sucl_runtime::{Error, Result};

/// A completion the host learns by asking the device (an event after an NCCL group).
pub(crate) trait DevicePoll: Send + Sync {
    /// Whether the work is done; an error if the device failed.
    fn poll(&self) -> Result<bool>;
    /// Whether the work is known to be done without asking the device (no CUDA call, no lock).
    fn known_done(&self) -> bool;
}

/// What an operation is, formatted only when an error or a debug print needs it (no string is
/// built per enqueued operation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum What {
    /// A send to a peer (`PROC_NULL` included) with a tag.
    Send { peer: usize, tag: u32 },
    /// A receive from a peer with a tag.
    Recv { peer: usize, tag: u32 },
    /// A collective, by name.
    Coll(&'static str),
}

impl std::fmt::Display for What {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peer = |p: usize| if p == crate::PROC_NULL { "PROC_NULL".to_string() } else { p.to_string() };
        match *self {
            What::Send { peer: p, tag } => write!(f, "send to rank {} (tag {tag})", peer(p)),
            What::Recv { peer: p, tag } => write!(f, "receive from rank {} (tag {tag})", peer(p)),
            What::Coll(name) => f.write_str(name),
        }
    }
}

/// What the engine and the requests share about one operation.
pub(crate) struct OpState {
    result: Mutex<Option<Result<usize>>>,
    done: Condvar,
    /// Threads blocked on `done`, counted under `result`'s lock: completing notifies only when
    /// there are any (a notify is a system call even with no waiter, and the engine completes
    /// every operation of a batch).
    waiters: AtomicU32,
    /// Bytes per element, to report element counts.
    elem: usize,
    /// "send to rank 3 (tag 7)", for errors.
    pub(crate) what: What,
    /// The rank that saw it (world rank).
    pub(crate) rank: usize,
    /// Set when the device, not the engine, completes the operation: the poll and the bytes.
    device: OnceLock<(Arc<dyn DevicePoll>, usize)>,
}

impl OpState {
    pub(crate) fn new(elem: usize, what: What, rank: usize) -> Arc<OpState> {
        Self::with_device(elem, what, rank, OnceLock::new())
    }

    fn with_device(elem: usize, what: What, rank: usize, device: OnceLock<(Arc<dyn DevicePoll>, usize)>) -> Arc<OpState> {
        Arc::new(OpState {
            result: Mutex::new(None),
            done: Condvar::new(),
            waiters: AtomicU32::new(0),
            elem: elem.max(1),
            what,
            rank,
            device,
        })
    }

    /// An operation the device completes: done (with `bytes`) once `poll` says so. Set at
    /// creation, so starting it costs nothing per operation.
    pub(crate) fn on_device(elem: usize, what: What, rank: usize, poll: Arc<dyn DevicePoll>, bytes: usize) -> Arc<OpState> {
        Self::with_device(elem, what, rank, OnceLock::from((poll, bytes)))
    }

    /// Bytes per element.
    pub(crate) fn elem(&self) -> usize {
        self.elem
    }

    /// Records the outcome (the first one wins) and wakes every waiter.
    pub(crate) fn complete(&self, r: Result<usize>) {
        let mut g = self.result.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(r);
        }
        drop(g);
        self.wake();
    }

    /// Wakes blocked waiters, if any. A waiter counts itself under the result's lock before it
    /// checks the result and blocks, and the outcome is stored under that lock before this
    /// reads the count, so a waiter either sees the outcome or is counted here.
    fn wake(&self) {
        if self.waiters.load(Ordering::Acquire) > 0 {
            let _g = self.result.lock().unwrap_or_else(|p| p.into_inner());
            self.done.notify_all();
        }
    }

    /// Asks the device, if it completes this operation.
    fn poll_device(&self) {
        if let Some((p, bytes)) = self.device.get() {
            if self.result.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
                match p.poll() {
                    Ok(true) => self.complete(Ok(*bytes)),
                    Ok(false) => {}
                    Err(e) => self.complete(Err(e)),
                }
            }
        }
    }

    pub(crate) fn outcome(&self) -> Option<Result<usize>> {
        self.poll_device();
        let g = self.result.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref().map(|r| r.as_ref().map(|&b| b / self.elem).map_err(Error::clone))
    }

    /// Whether the operation is known to be complete without asking the device: the device's
    /// completion already seen (one atomic load), else the recorded outcome.
    pub(crate) fn known_done(&self) -> bool {
        if self.device.get().is_some_and(|(p, _)| p.known_done()) {
            return true;
        }
        self.result.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    pub(crate) fn is_done(&self) -> bool {
        self.poll_device();
        self.result.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Waits at most `bound` for the outcome.
    pub(crate) fn wait(&self, bound: Duration) -> Result<usize> {
        let deadline = Instant::now() + bound;
        let mut g = self.result.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let polled = self.device.get().is_some();
            if polled && g.is_none() {
                drop(g);
                self.poll_device();
                g = self.result.lock().unwrap_or_else(|p| p.into_inner());
            }
            if let Some(r) = g.as_ref() {
                return r.as_ref().map(|&b| b / self.elem).map_err(Error::clone);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    rank: self.rank,
                    op: format!("waiting on the host for the stream-triggered {} (was its start reached?)", self.what),
                    after: bound,
                });
            }
            let nap = if polled { (deadline - now).min(Duration::from_micros(200)) } else { deadline - now };
            self.waiters.fetch_add(1, Ordering::AcqRel);
            if !polled {
                // A progress thread completes this operation: it must poll even batches that
                // a queue's wait task would drive later.
                crate::wakeup::host_wait_begins();
            }
            g = self.done.wait_timeout(g, nap).unwrap_or_else(|p| p.into_inner()).0;
            if !polled {
                crate::wakeup::host_wait_ends();
            }
            self.waiters.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// One enqueued operation, for host-side completion. It does not own the buffers: the queue
/// does, until the operation completed.
#[derive(Clone)]
pub struct Request {
    pub(crate) state: Arc<OpState>,
    pub(crate) bound: Duration,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("op", &self.state.what).field("done", &self.state.is_done()).finish()
    }
}

impl Request {
    /// Blocks (bounded by the communicator's timeout) until the operation completed; returns the
    /// number of elements moved (received, for a receive; 0 for a `PROC_NULL` peer).
    pub fn wait(&self) -> Result<usize> {
        self.state.wait(self.bound)
    }

    /// `Some(elements)` once complete, an error if it failed, `None` while in flight.
    pub fn test(&self) -> Result<Option<usize>> {
        self.state.outcome().transpose()
    }

    /// What the operation is, e.g. `receive from rank 1 (tag 5)`.
    pub fn describe(&self) -> String {
        self.state.what.to_string()
    }
}
