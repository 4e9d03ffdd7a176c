//! Where calls run: inline on the caller's thread (blocking calls, the GIL released), or on the
//! communicator's worker thread (non-blocking collectives), in the order they were made. A
//! non-blocking call returns a [`Completion`] the caller waits on in short slices, so that
//! Ctrl-C (a pending Python signal) interrupts the wait.

use crate::call::Call;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use sucl::Communicator;

/// How long one slice of a wait lasts before pending signals are checked.
pub const SLICE: Duration = Duration::from_millis(50);

/// The result of a call that runs elsewhere, once it is known.
#[derive(Default)]
pub struct Completion {
    result: Mutex<Option<sucl::Result<usize>>>,
    ready: Condvar,
}

impl Completion {
    fn set(&self, r: sucl::Result<usize>) {
        *lock(&self.result) = Some(r);
        self.ready.notify_all();
    }

    /// Waits at most `slice`; the result (cloned: a request may be waited on twice) if known.
    pub fn wait_slice(&self, slice: Duration) -> Option<sucl::Result<usize>> {
        let g = lock(&self.result);
        let (g, _) = self.ready.wait_timeout_while(g, slice, |r| r.is_none()).unwrap_or_else(|e| e.into_inner());
        g.clone()
    }

    /// The result, if known, without waiting.
    pub fn peek(&self) -> Option<sucl::Result<usize>> {
        lock(&self.result).clone()
    }
}

/// The error for a call on a closed communicator, naming `rank`.
pub fn closed(rank: usize) -> sucl::Error {
    sucl::Error::invalid(rank, "communicator", "is closed")
}

/// Locks `m`, ignoring poisoning (every critical section leaves its data consistent).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Job {
    call: Call,
    done: Arc<Completion>,
}

/// A communicator with its worker thread. `None` inside once closed.
pub struct Executor {
    pub comm: Arc<Mutex<Option<Communicator>>>,
    pending: Arc<AtomicUsize>,
    queue: Mutex<Option<(Sender<Job>, JoinHandle<()>)>>,
    last: Mutex<Option<Arc<Completion>>>,
    rank: usize,
    /// Aborts the job from the thread that waits for a queued call (Ctrl-C).
    pub interrupter: sucl::Interrupter,
}

impl Executor {
    pub fn new(comm: Communicator) -> Executor {
        // Errors name the world rank, as sucl's own do.
        let (rank, interrupter) = (comm.world_rank_of(comm.rank()).unwrap_or(comm.rank()), comm.interrupter());
        Executor {
            comm: Arc::new(Mutex::new(Some(comm))),
            pending: Arc::default(),
            queue: Mutex::new(None),
            last: Mutex::new(None),
            rank,
            interrupter,
        }
    }

    /// The error for a call on a closed communicator.
    pub fn closed(&self) -> sucl::Error {
        closed(self.rank)
    }

    /// Runs `f` on the communicator on this thread (call without the GIL).
    pub fn with_comm<R>(&self, f: impl FnOnce(&Communicator) -> sucl::Result<R>) -> sucl::Result<R> {
        match lock(&self.comm).as_ref() {
            Some(c) => f(c),
            None => Err(self.closed()),
        }
    }

    /// The last non-blocking call still queued or running, if any: a blocking call must wait
    /// for it first, so that every rank sees the calls in the same order.
    pub fn unfinished(&self) -> Option<Arc<Completion>> {
        if self.pending.load(Ordering::Acquire) == 0 {
            return None;
        }
        lock(&self.last).clone()
    }

    /// Queues `call` on the worker thread (started on first use).
    pub fn submit(&self, call: Call) -> sucl::Result<Arc<Completion>> {
        let done = Arc::new(Completion::default());
        let mut q = lock(&self.queue);
        if q.is_none() {
            *q = Some(self.start_worker()?);
        }
        self.pending.fetch_add(1, Ordering::AcqRel);
        *lock(&self.last) = Some(done.clone());
        let (tx, _) = q.as_ref().expect("worker started above");
        tx.send(Job { call, done: done.clone() }).expect("the worker lives until close");
        Ok(done)
    }

    fn start_worker(&self) -> sucl::Result<(Sender<Job>, JoinHandle<()>)> {
        let (tx, rx) = channel::<Job>();
        let (comm, pending, rank) = (self.comm.clone(), self.pending.clone(), self.rank);
        let handle = std::thread::Builder::new()
            .name(format!("sucl-py-worker-{rank}"))
            .spawn(move || {
                while let Ok(Job { call, done }) = rx.recv() {
                    let r = match lock(&comm).as_ref() {
                        Some(c) => call.run(c),
                        None => Err(closed(rank)),
                    };
                    // Release the buffers (this takes the GIL briefly) before reporting.
                    drop(call);
                    pending.fetch_sub(1, Ordering::AcqRel);
                    done.set(r);
                }
            })
            .map_err(|e| sucl::Error::io(self.rank, "starting the non-blocking worker thread", e))?;
        Ok((tx, handle))
    }

    /// Finishes the queued calls, stops the worker and leaves the job (call without the GIL).
    pub fn close(&self) {
        if let Some((tx, handle)) = lock(&self.queue).take() {
            drop(tx);
            let _ = handle.join();
        }
        let comm = lock(&self.comm).take();
        drop(comm);
    }
}
