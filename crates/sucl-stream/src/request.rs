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
        self.wait_until(Instant::now() + bound).unwrap_or_else(|| Err(self.timed_out(bound)))
    }

    /// The error of a host wait that lasted `bound` without an outcome.
    fn timed_out(&self, bound: Duration) -> Error {
        Error::Timeout {
            rank: self.rank,
            op: format!("waiting on the host for the stream-triggered {} (was its start reached?)", self.what),
            after: bound,
        }
    }

    /// Waits until `deadline` for the outcome; `None` if it passed first.
    fn wait_until(&self, deadline: Instant) -> Option<Result<usize>> {
        let mut g = self.result.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let polled = self.device.get().is_some();
            if polled && g.is_none() {
                drop(g);
                self.poll_device();
                g = self.result.lock().unwrap_or_else(|p| p.into_inner());
            }
            if let Some(r) = g.as_ref() {
                return Some(r.as_ref().map(|&b| b / self.elem).map_err(Error::clone));
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
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

/// States of completed operations kept for reuse, so that an enqueue allocates none once a
/// queue runs: the queue hands a state back when it drops its request of a completed operation,
/// and reuses it once nothing else holds it (not the program's `Request`, not the engine).
#[derive(Default)]
pub(crate) struct StatePool {
    free: Vec<Arc<OpState>>,
}

impl StatePool {
    /// Most states kept.
    const MAX: usize = 4096;

    /// A state for a new operation: a free one reset, else a new one. `device`: the poll and
    /// the bytes of an operation the device completes (see [`OpState::on_device`]).
    pub(crate) fn make(&mut self, elem: usize, what: What, rank: usize, device: Option<(Arc<dyn DevicePoll>, usize)>) -> Arc<OpState> {
        while let Some(mut s) = self.free.pop() {
            // Only this pool holds it (no weak references exist): nothing can observe the reset.
            if let Some(st) = Arc::get_mut(&mut s) {
                *st.result.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
                *st.waiters.get_mut() = 0;
                st.elem = elem.max(1);
                st.what = what;
                st.rank = rank;
                st.device = device.map_or_else(OnceLock::new, OnceLock::from);
                return s;
            }
            // Still held elsewhere (a request the program keeps): its last holder frees it.
        }
        match device {
            Some((poll, bytes)) => OpState::on_device(elem, what, rank, poll, bytes),
            None => OpState::new(elem, what, rank),
        }
    }

    /// Takes back the state of an operation that completed (or failed).
    pub(crate) fn give(&mut self, s: Arc<OpState>) {
        if self.free.len() < Self::MAX {
            self.free.push(s);
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

    /// One slice of a wait that began at `since`, for callers that must do something between
    /// slices (a binding checking for Ctrl-C): the outcome once known (as [`Request::wait`]
    /// returns it), `None` after at most `slice` while the operation is in flight, and the
    /// timeout error of [`Request::wait`] once its bound has passed since `since`.
    pub fn wait_slice(&self, since: Instant, slice: Duration) -> Option<Result<usize>> {
        let end = since + self.bound;
        match self.state.wait_until((Instant::now() + slice).min(end)) {
            Some(r) => Some(r),
            None if Instant::now() >= end => Some(Err(self.state.timed_out(self.bound))),
            None => None,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_reuses_a_state_only_once_no_one_else_holds_it_and_resets_it() {
        let mut pool = StatePool::default();
        let a = pool.make(8, What::Send { peer: 1, tag: 3 }, 0, None);
        a.complete(Ok(64));
        let held = Request { state: a.clone(), bound: Duration::from_secs(1) };
        pool.give(a);
        // The program still holds the request: a new state, and the old one keeps its outcome.
        let b = pool.make(4, What::Recv { peer: 2, tag: 5 }, 0, None);
        assert!(!Arc::ptr_eq(&b, &held.state));
        assert_eq!(held.wait().unwrap(), 8);
        assert!(b.outcome().is_none(), "a fresh state has no outcome");
        // Given back and held by no one else: the same allocation, reset.
        let addr = Arc::as_ptr(&b);
        b.complete(Err(Error::Config("failed".into())));
        pool.give(b);
        let c = pool.make(2, What::Coll("all_reduce"), 3, None);
        assert_eq!(Arc::as_ptr(&c), addr, "reused");
        assert!(c.outcome().is_none(), "the old outcome is gone");
        assert_eq!((c.elem(), c.what, c.rank), (2, What::Coll("all_reduce"), 3));
        c.complete(Ok(6));
        assert_eq!(c.outcome().unwrap().unwrap(), 3);
    }

    #[test]
    fn a_sliced_wait_returns_none_in_flight_the_timeout_after_the_bound_and_the_outcome_once_known() {
        let state = OpState::new(4, What::Recv { peer: 1, tag: 2 }, 0);
        let req = Request { state: state.clone(), bound: Duration::from_millis(150) };
        let since = Instant::now();
        assert!(req.wait_slice(since, Duration::from_millis(5)).is_none(), "in flight, within the bound");
        let mut slices = 1;
        let timed_out = loop {
            if let Some(r) = req.wait_slice(since, Duration::from_millis(20)) {
                break r.unwrap_err();
            }
            slices += 1;
            assert!(slices < 1000, "the bound never ended the wait");
        };
        assert!(since.elapsed() >= Duration::from_millis(150));
        assert!(matches!(timed_out, Error::Timeout { .. }), "{timed_out}");
        assert!(timed_out.to_string().contains("receive from rank 1 (tag 2)"), "{timed_out}");
        state.complete(Ok(12));
        assert_eq!(req.wait_slice(Instant::now(), Duration::ZERO).unwrap().unwrap(), 3);
    }
}
