//! The staged path's progress thread (feature `cuda`): what makes an ordinary device
//! collective on the staged path return once enqueued, like one over NCCL.
//!
//! A staged collective is cut into chunks; per chunk the caller's stream runs the device→host
//! copies into a pinned slot and stores a trigger ([`StreamSignal::trigger_on`]); this thread,
//! which makes no CUDA call, sees the trigger, runs the chunk's host collective on the slot and
//! stores the completion; the stream waits for it ([`StreamSignal::wait_on`]) and copies the
//! result back. The same mechanism (the same counters and stream memory operations, from
//! `sucl-cuda`) drives the stream-triggered queues of `sucl-stream`.
//!
//! The thread owns a private duplicate of the communicator (made once, collectively, at the
//! first staged collective), so the program's own host calls never race it; all ranks issue
//! their device collectives in the same order, and the thread runs them in that order.
//!
//! A failed chunk (a lost peer, a timeout: the host collective is bounded like any other)
//! stores [`SIGNAL_FAILED`], which releases every stream waiting on this signal (the uploads
//! after it then copy whatever the slot holds); the error is kept, returned by every later
//! staged collective before anything is enqueued and by `Communicator::synchronize` — where
//! NCCL's asynchronous errors surface too — and raised as the job's abort, so every other
//! bounded wait fails as well.

use crate::{Communicator, Error, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use sucl_cuda::{StreamSignal, SIGNAL_FAILED};

/// One chunk's host collective, run on the thread's communicator. It may capture only plain
/// data (addresses, sizes): it is dropped on the progress thread, which frees no CUDA memory.
pub(crate) type Job = Box<dyn FnOnce(&Communicator) -> Result<()> + Send>;

struct Shared {
    jobs: Mutex<VecDeque<(u64, Job)>>,
    failed: Mutex<Option<Error>>,
    has_failed: AtomicBool,
    closed: AtomicBool,
    /// The thread returned (its communicator is gone).
    finished: AtomicBool,
    signal: &'static StreamSignal,
    spin: Duration,
    yield_for: Duration,
}

/// The progress thread of one communicator's staged collectives.
pub(crate) struct StagedProgress {
    shared: Arc<Shared>,
    thread: std::thread::Thread,
    /// The last epoch handed out.
    issued: u64,
    rank: usize,
    timeout: Duration,
}

impl StagedProgress {
    /// Starts the thread, which takes `comm` (a duplicate made for it) and watches `signal`.
    pub(crate) fn start(comm: Communicator, signal: &'static StreamSignal) -> Result<StagedProgress> {
        let rank = comm.world_rank_of(comm.rank()).unwrap_or(comm.rank());
        let (timeout, backoff) = (comm.config().host.timeout, comm.config().host.backoff);
        let shared = Arc::new(Shared {
            jobs: Mutex::default(),
            failed: Mutex::new(None),
            has_failed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            signal,
            spin: backoff.spin,
            yield_for: backoff.yield_for,
        });
        let sh = shared.clone();
        let handle = std::thread::Builder::new()
            .name("sucl-staged-progress".into())
            .spawn(move || {
                run(&sh, comm);
                sh.finished.store(true, Ordering::Release);
            })
            .map_err(|e| Error::io(rank, "starting the staged progress thread", e))?;
        Ok(StagedProgress { shared, thread: handle.thread().clone(), issued: 0, rank, timeout })
    }

    /// The counters the streams trigger and wait on.
    pub(crate) fn signal(&self) -> &'static StreamSignal {
        self.shared.signal
    }

    /// How long a host-function wait may hold a stream (the thread fails a chunk first).
    pub(crate) fn bound(&self) -> Duration {
        self.timeout + Duration::from_secs(2)
    }

    /// The error that failed this path, if any.
    pub(crate) fn error(&self) -> Option<Error> {
        if !self.shared.has_failed.load(Ordering::Acquire) {
            return None;
        }
        self.shared.failed.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(copy_error)
    }

    /// Hands `job` to the thread under a new epoch, which the caller then triggers on its
    /// stream (after the chunk's downloads) and waits for (before its uploads).
    pub(crate) fn submit(&mut self, job: Job) -> u64 {
        self.issued += 1;
        self.shared.jobs.lock().unwrap_or_else(|p| p.into_inner()).push_back((self.issued, job));
        self.thread.unpark();
        self.issued
    }
}

impl Drop for StagedProgress {
    /// Lets the thread finish the chunks handed to it (bounded: a chunk whose trigger never
    /// comes is failed), then ends it; its communicator goes with it.
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.thread.unpark();
        let deadline = Instant::now() + self.bound();
        while !self.shared.finished.load(Ordering::Acquire) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
        if !self.shared.finished.load(Ordering::Acquire) {
            tracing::warn!(rank = self.rank, "the staged progress thread did not finish in time; left to end on its own");
        }
    }
}

fn run(sh: &Shared, comm: Communicator) {
    let rank = comm.world_rank_of(comm.rank()).unwrap_or(comm.rank());
    let timeout = comm.config().host.timeout;
    let mut idle_since: Option<Instant> = None;
    let mut rounds = 0u32;
    let mut idle = Duration::ZERO;
    loop {
        let front = sh.jobs.lock().unwrap_or_else(|p| p.into_inner()).front().map(|(e, _)| *e);
        let Some(epoch) = front else {
            if sh.closed.load(Ordering::Acquire) {
                return;
            }
            idle_since = None;
            std::thread::park_timeout(Duration::from_millis(20));
            continue;
        };
        if sh.signal.triggered() >= epoch {
            let job = sh.jobs.lock().unwrap_or_else(|p| p.into_inner()).pop_front().map(|(_, j)| j);
            idle_since = None;
            let Some(job) = job else { continue };
            if sh.has_failed.load(Ordering::Acquire) {
                continue;
            }
            match job(&comm) {
                Ok(()) => sh.signal.complete(epoch),
                Err(e) => {
                    // The job is broken (as when NCCL loses a peer): every bounded wait of
                    // this process that is still waiting fails too, not just later calls.
                    comm.ctx.abort.raise(e.abort_info());
                    fail(sh, e, rank);
                }
            }
            continue;
        }
        // Waiting for the stream to reach the trigger: poll (a device store comes with no
        // wake-up), spinning then yielding by the communicator's backoff, then napping.
        let since = *idle_since.get_or_insert_with(|| {
            rounds = 0;
            idle = Duration::ZERO;
            Instant::now()
        });
        rounds = rounds.wrapping_add(1);
        if rounds % 32 == 1 {
            idle = since.elapsed();
        }
        if sh.closed.load(Ordering::Acquire) && idle > timeout {
            // The owner is gone and the stream never reached this chunk.
            fail(sh, Error::Timeout { rank, op: "a staged collective whose stream never reached it".into(), after: idle }, rank);
            sh.jobs.lock().unwrap_or_else(|p| p.into_inner()).clear();
            continue;
        }
        if idle < sh.spin {
            std::hint::spin_loop();
        } else if idle < sh.spin + sh.yield_for.max(Duration::from_millis(2)) {
            std::thread::yield_now();
        } else {
            std::thread::park_timeout(Duration::from_micros(50));
        }
    }
}

/// Keeps the first error and releases every stream waiting on the signal.
fn fail(sh: &Shared, e: Error, rank: usize) {
    tracing::error!(rank, error = %e, "a staged collective failed; releasing every stream waiting on it");
    let mut f = sh.failed.lock().unwrap_or_else(|p| p.into_inner());
    if f.is_none() {
        *f = Some(e);
    }
    sh.has_failed.store(true, Ordering::Release);
    drop(f);
    sh.signal.complete(SIGNAL_FAILED);
}

/// A copy of an error (its `io::Error` source is not `Clone`), to report one failure on every
/// later call.
fn copy_error(e: &Error) -> Error {
    match e {
        Error::InvalidArgument { rank, arg, why } => Error::InvalidArgument { rank: *rank, arg, why: why.clone() },
        Error::LostPeer { rank, peer, during } => Error::LostPeer { rank: *rank, peer: *peer, during: during.clone() },
        Error::Timeout { rank, op, after } => Error::Timeout { rank: *rank, op: op.clone(), after: *after },
        Error::Mismatch { rank, what } => Error::Mismatch { rank: *rank, what: what.clone() },
        Error::BackendUnavailable { rank, backend, why } => {
            Error::BackendUnavailable { rank: *rank, backend: backend.clone(), why: why.clone() }
        }
        Error::Config(s) => Error::Config(s.clone()),
        Error::Protocol { rank, peer, why } => Error::Protocol { rank: *rank, peer: *peer, why: why.clone() },
        Error::Aborted { rank, reason } => Error::Aborted { rank: *rank, reason: reason.clone() },
        Error::Io { rank, during, source } => {
            Error::Io { rank: *rank, during: during.clone(), source: std::io::Error::new(source.kind(), source.to_string()) }
        }
    }
}
