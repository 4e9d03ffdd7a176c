//! The watchdog that bounds blocking MPI collectives.
//!
//! A blocking MPI call cannot be interrupted, so the thread that runs it cannot notice a timeout
//! or another rank's failure. Each backend shares a [`Watch`] with one process-wide watchdog
//! thread: the caller marks the start and the end of every blocking call (two atomic stores, no
//! clock read, no lock), and the watchdog, waking every few milliseconds, ends the whole job with
//! `MPI_Abort` when a call has run longer than the backend's timeout, or is still running
//! [`ABORT_GRACE`] after the job's abort flag was raised (a lost rank, an error on another rank).
//! A call that completes in time returns normally; the caller then sees any raised abort at its
//! next call. Since the job ends while the call is still inside MPI, no buffer MPI may still
//! write is ever handed back.
//!
//! MPI is initialized asking for `MPI_THREAD_MULTIPLE`, under which calling `MPI_Abort` from the
//! watchdog while the caller is inside MPI is allowed. Where MPI grants less, it is outside what
//! the standard promises; Open MPI and MPICH end the process there without touching the running
//! call's state, which is what this then relies on.

use crate::abort_job;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};
use sucl_core::{AbortState, CollOp, Error};

/// How long a blocking call may go on after the job's abort flag was raised before the job is
/// ended: a call whose ranks are all alive finishes in that time and returns normally.
pub const ABORT_GRACE: Duration = Duration::from_secs(1);

/// The code [`Watch::enter_code`] takes for the bootstrap's exchanges (not a [`CollOp`]).
pub(crate) const BOOTSTRAP_OP: u8 = 0xfe;

/// The longest the watchdog sleeps between looks.
const MAX_TICK: Duration = Duration::from_millis(20);

/// One backend's blocking calls, as the watchdog sees them.
pub(crate) struct Watch {
    /// Even while no call runs; odd (and different for every call) while one does.
    seq: AtomicU64,
    /// The running call's [`CollOp`] code.
    op: AtomicU8,
    timeout: Duration,
    abort: Arc<AbortState>,
    world_rank: usize,
    /// The watchdog's own notes: the call it last saw running and since when. Only the watchdog
    /// thread locks it.
    seen: Mutex<Option<(u64, Instant)>>,
}

impl Watch {
    /// A watch for a backend of world rank `world_rank`, registered with the watchdog (which
    /// starts with the first watch of the process).
    pub(crate) fn new(world_rank: usize, timeout: Duration, abort: Arc<AbortState>) -> Arc<Watch> {
        let w = Arc::new(Watch { seq: AtomicU64::new(0), op: AtomicU8::new(0), timeout, abort, world_rank, seen: Mutex::new(None) });
        let reg = registry();
        reg.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::downgrade(&w));
        w
    }

    /// Marks the start of a blocking call of `op`; returns the token for [`Watch::leave`].
    #[inline]
    pub(crate) fn enter(&self, op: CollOp) -> u64 {
        self.enter_code(op as u8)
    }

    /// [`Watch::enter`] for a call named by its code: a [`CollOp`]'s or [`BOOTSTRAP_OP`].
    #[inline]
    pub(crate) fn enter_code(&self, code: u8) -> u64 {
        // Only the backend's (single) caller thread writes `seq`.
        let running = self.seq.load(Ordering::Relaxed) + 1;
        self.op.store(code, Ordering::Relaxed);
        self.seq.store(running, Ordering::Release);
        running
    }

    /// Marks the end of the call `enter` returned `running` for.
    #[inline]
    pub(crate) fn leave(&self, running: u64) {
        self.seq.store(running + 1, Ordering::Release);
    }

    /// The watchdog's look at this backend: ends the job if its running call overstayed.
    fn inspect(&self, now: Instant) {
        let running = self.seq.load(Ordering::Acquire);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if running.is_multiple_of(2) {
            *seen = None;
            return;
        }
        let since = match *seen {
            Some((s, t)) if s == running => t,
            _ => {
                *seen = Some((running, now));
                now
            }
        };
        let after = now - since;
        let what = match self.op.load(Ordering::Relaxed) {
            BOOTSTRAP_OP => "meeting the other ranks over MPI (bootstrap)".to_string(),
            code => format!("{} (mpi)", CollOp::ALL.get(code as usize).map_or("collective", |o| o.name())),
        };
        if after >= self.timeout {
            let e = Error::Timeout { rank: self.world_rank, op: what, after };
            self.abort.raise(e.abort_info());
            abort_job(&e);
        }
        if self.abort.is_set() && after >= ABORT_GRACE.min(self.timeout) {
            let e = self.abort.info().map_or_else(
                || Error::Aborted { rank: self.world_rank, reason: "the job was aborted".into() },
                |i| i.to_error(self.world_rank, &what),
            );
            abort_job(&e);
        }
    }
}

/// The watches of every live backend of this process; the first call starts the watchdog.
fn registry() -> &'static Mutex<Vec<Weak<Watch>>> {
    static REGISTRY: OnceLock<Mutex<Vec<Weak<Watch>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        std::thread::Builder::new().name("sucl-mpi-watchdog".into()).spawn(watch_forever).expect("starting the MPI watchdog thread");
        Mutex::new(vec![])
    })
}

fn watch_forever() {
    loop {
        let live: Vec<Arc<Watch>> = {
            let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
            reg.retain(|w| w.strong_count() > 0);
            reg.iter().filter_map(Weak::upgrade).collect()
        };
        let now = Instant::now();
        for w in &live {
            w.inspect(now);
        }
        // A tenth of the shortest timeout, so that a call ends at most 10% past its bound.
        let tick = live.iter().map(|w| w.timeout / 10).min().unwrap_or(MAX_TICK).clamp(Duration::from_millis(1), MAX_TICK);
        drop(live);
        std::thread::sleep(tick);
    }
}
