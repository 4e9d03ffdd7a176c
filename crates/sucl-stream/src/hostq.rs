//! [`HostQueue`]: an in-order queue of host tasks run by one worker thread — the host stand-in
//! for a CUDA stream. Tasks run one at a time in submission order; the submitting thread goes on
//! at once.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use sucl_runtime::{Error, Result};

type Task = Box<dyn FnOnce() + Send>;

struct State {
    submitted: AtomicU64,
    finished: Mutex<u64>,
    ran: Condvar,
    panicked: AtomicBool,
}

/// An in-order host task queue (cheap to clone; every clone feeds the same worker, which ends
/// when the last clone is dropped).
#[derive(Clone)]
pub struct HostQueue {
    tx: mpsc::Sender<Task>,
    state: Arc<State>,
}

impl Default for HostQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl HostQueue {
    /// A queue with its own worker thread.
    pub fn new() -> HostQueue {
        let (tx, rx) = mpsc::channel::<Task>();
        let state = Arc::new(State {
            submitted: AtomicU64::new(0),
            finished: Mutex::new(0),
            ran: Condvar::new(),
            panicked: AtomicBool::new(false),
        });
        let st = state.clone();
        std::thread::Builder::new()
            .name("sucl-host-queue".into())
            .spawn(move || {
                for task in rx {
                    if std::panic::catch_unwind(AssertUnwindSafe(task)).is_err() {
                        st.panicked.store(true, Ordering::Release);
                    }
                    *st.finished.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                    st.ran.notify_all();
                }
            })
            .expect("spawning a host queue worker");
        HostQueue { tx, state }
    }

    /// Appends a task; it runs after every task submitted before it.
    pub fn submit(&self, task: impl FnOnce() + Send + 'static) {
        self.state.submitted.fetch_add(1, Ordering::AcqRel);
        if self.tx.send(Box::new(task)).is_err() {
            // The worker is gone only if it panicked outside a task, which catch_unwind rules out.
            self.state.panicked.store(true, Ordering::Release);
        }
    }

    /// Tasks submitted and not yet finished.
    pub fn pending(&self) -> u64 {
        let done = *self.state.finished.lock().unwrap_or_else(|p| p.into_inner());
        self.state.submitted.load(Ordering::Acquire).saturating_sub(done)
    }

    /// Waits (at most `bound`) until every task submitted so far has run. A task that panicked
    /// is an error here.
    pub fn synchronize(&self, bound: Duration) -> Result<()> {
        let target = self.state.submitted.load(Ordering::Acquire);
        let deadline = Instant::now() + bound;
        let mut done = self.state.finished.lock().unwrap_or_else(|p| p.into_inner());
        while *done < target {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    rank: 0,
                    op: format!("host queue synchronize ({} tasks pending)", target - *done),
                    after: bound,
                });
            }
            done = self.state.ran.wait_timeout(done, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        if self.state.panicked.load(Ordering::Acquire) {
            return Err(Error::Config("a task on the host queue panicked".into()));
        }
        Ok(())
    }
}
