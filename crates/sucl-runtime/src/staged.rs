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
//! their device collectives in the same order, and the thread runs them in that order. Each
//! stream gets its own signal (a trigger word must be written by one stream only, in epoch
//! order); a chunk waits for its own stream's trigger, and chunks run strictly in the order
//! they were handed over, so a stream's trigger never waits on a later chunk.
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
use sucl_cuda::cudarc::driver::CudaStream;
use sucl_cuda::{Device, StreamSignal, SIGNAL_FAILED};

/// One chunk's host collective, run on the thread's communicator. It may capture only plain
/// data (addresses, sizes): it is dropped on the progress thread, which frees no CUDA memory.
pub(crate) type Job = Box<dyn FnOnce(&Communicator) -> Result<()> + Send>;

struct Shared {
    /// Chunks in the order they were handed over, each with its stream's signal and epoch.
    jobs: Mutex<VecDeque<(&'static StreamSignal, u64, Job)>>,
    /// Every signal handed out, to release all their streams on a failure.
    signals: Mutex<Vec<&'static StreamSignal>>,
    failed: Mutex<Option<Error>>,
    has_failed: AtomicBool,
    closed: AtomicBool,
    /// The thread returned (its communicator is gone).
    finished: AtomicBool,
    spin: Duration,
    yield_for: Duration,
}

/// The progress thread of one communicator's staged collectives.
pub(crate) struct StagedProgress {
    shared: Arc<Shared>,
    thread: std::thread::Thread,
    /// Per stream used (by its handle): its signal and the last epoch handed out on it. A
    /// signal is never freed (see [`StreamSignal`]): 256 bytes per stream ever used.
    streams: Vec<(usize, &'static StreamSignal, u64)>,
    rank: usize,
    timeout: Duration,
}

impl StagedProgress {
    /// Starts the thread, which takes `comm` (a duplicate made for it).
    pub(crate) fn start(comm: Communicator) -> Result<StagedProgress> {
        let rank = comm.world_rank_of(comm.rank()).unwrap_or(comm.rank());
        let (timeout, backoff) = (comm.config().host.timeout, comm.config().host.backoff);
        let shared = Arc::new(Shared {
            jobs: Mutex::default(),
            signals: Mutex::default(),
            failed: Mutex::new(None),
            has_failed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            finished: AtomicBool::new(false),
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
        Ok(StagedProgress { shared, thread: handle.thread().clone(), streams: vec![], rank, timeout })
    }

    /// The signal of `stream` (made on `dev` at its first use), as an index for [`submit`].
    ///
    /// [`submit`]: StagedProgress::submit
    pub(crate) fn stream_index(&mut self, dev: &Device, stream: &CudaStream) -> Result<usize> {
        let key = stream.cu_stream() as usize;
        if let Some(i) = self.streams.iter().position(|s| s.0 == key) {
            return Ok(i);
        }
        let signal = StreamSignal::leak(dev)?;
        self.shared.signals.lock().unwrap_or_else(|p| p.into_inner()).push(signal);
        if self.shared.has_failed.load(Ordering::Acquire) {
            signal.complete(SIGNAL_FAILED);
        }
        self.streams.push((key, signal, 0));
        Ok(self.streams.len() - 1)
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
        self.shared.failed.lock().unwrap_or_else(|p| p.into_inner()).as_ref().cloned()
    }

    /// Hands `job` to the thread under the next epoch of stream `index`, which the caller
    /// then triggers on that stream (after the chunk's downloads) and waits for (before its
    /// uploads) through the signal returned.
    pub(crate) fn submit(&mut self, index: usize, job: Job) -> (&'static StreamSignal, u64) {
        let s = &mut self.streams[index];
        s.2 += 1;
        let (signal, epoch) = (s.1, s.2);
        self.shared.jobs.lock().unwrap_or_else(|p| p.into_inner()).push_back((signal, epoch, job));
        self.thread.unpark();
        (signal, epoch)
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
        let front = sh.jobs.lock().unwrap_or_else(|p| p.into_inner()).front().map(|(s, e, _)| (*s, *e));
        let Some((signal, epoch)) = front else {
            if sh.closed.load(Ordering::Acquire) {
                return;
            }
            idle_since = None;
            std::thread::park_timeout(Duration::from_millis(20));
            continue;
        };
        if signal.triggered() >= epoch {
            let job = sh.jobs.lock().unwrap_or_else(|p| p.into_inner()).pop_front().map(|(_, _, j)| j);
            idle_since = None;
            let Some(job) = job else { continue };
            if sh.has_failed.load(Ordering::Acquire) {
                continue;
            }
            match job(&comm) {
                Ok(()) => signal.complete(epoch),
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

/// Keeps the first error and releases every stream waiting on a signal of this thread.
fn fail(sh: &Shared, e: Error, rank: usize) {
    tracing::error!(rank, error = %e, "a staged collective failed; releasing every stream waiting on it");
    let mut f = sh.failed.lock().unwrap_or_else(|p| p.into_inner());
    if f.is_none() {
        *f = Some(e);
    }
    sh.has_failed.store(true, Ordering::Release);
    drop(f);
    for s in sh.signals.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        s.complete(SIGNAL_FAILED);
    }
}
