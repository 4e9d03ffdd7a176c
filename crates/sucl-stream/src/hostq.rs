//! [`HostQueue`]: an in-order queue of host tasks run by one worker thread — the host stand-in
//! for a CUDA stream. Tasks run one at a time in submission order; the submitting thread goes on
//! at once.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use sucl_runtime::{Error, Result};

type Task = Box<dyn FnOnce() + Send>;

struct State {
    submitted: AtomicU64,
    finished: AtomicU64,
    /// Threads blocked in `synchronize` (counted under `sleep`): the worker notifies `ran` only
    /// when there are any, not after every task.
    sleepers: AtomicU32,
    /// The smallest `finished` count a thread blocked in `synchronize` waits for (`u64::MAX`:
    /// none): the worker wakes them when it gets there, not after every task — a wake-up per
    /// task would cost the worker's core a context switch each time.
    wake_at: AtomicU64,
    sleep: Mutex<()>,
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
            finished: AtomicU64::new(0),
            sleepers: AtomicU32::new(0),
            wake_at: AtomicU64::new(u64::MAX),
            sleep: Mutex::new(()),
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
                    let finished = st.finished.fetch_add(1, Ordering::SeqCst) + 1;
                    // A sleeper counts itself and stores its target before it checks
                    // `finished` (all SeqCst), so it either sees this count or is seen here.
                    if st.sleepers.load(Ordering::SeqCst) > 0 && finished >= st.wake_at.load(Ordering::SeqCst) {
                        let _g = st.sleep.lock().unwrap_or_else(|p| p.into_inner());
                        // Every sleeper wakes and registers its target again if it wants more.
                        st.wake_at.store(u64::MAX, Ordering::SeqCst);
                        st.ran.notify_all();
                    }
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
        let done = self.state.finished.load(Ordering::Acquire);
        self.state.submitted.load(Ordering::Acquire).saturating_sub(done)
    }

    /// Waits (at most `bound`) until every task submitted so far has run. A task that panicked
    /// is an error here.
    pub fn synchronize(&self, bound: Duration) -> Result<()> {
        let target = self.state.submitted.load(Ordering::Acquire);
        let deadline = Instant::now() + bound;
        let st = &self.state;
        let mut g = st.sleep.lock().unwrap_or_else(|p| p.into_inner());
        st.sleepers.fetch_add(1, Ordering::SeqCst);
        let mut late = None;
        loop {
            st.wake_at.fetch_min(target, Ordering::SeqCst);
            let done = st.finished.load(Ordering::SeqCst);
            if done >= target {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                late = Some(target - done);
                break;
            }
            g = st.ran.wait_timeout(g, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        st.sleepers.fetch_sub(1, Ordering::SeqCst);
        drop(g);
        if let Some(pending) = late {
            return Err(Error::Timeout { rank: 0, op: format!("host queue synchronize ({pending} tasks pending)"), after: bound });
        }
        if self.state.panicked.load(Ordering::Acquire) {
            return Err(Error::Config("a task on the host queue panicked".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opens when its sender sends (or drops): a task that waits on it holds the queue.
    fn gate() -> (mpsc::Sender<()>, impl FnOnce() + Send + 'static) {
        let (tx, rx) = mpsc::channel::<()>();
        (tx, move || {
            let _ = rx.recv_timeout(Duration::from_secs(30));
        })
    }

    #[test]
    fn each_synchronize_returns_when_its_own_tasks_ran() {
        let q = HostQueue::new();
        let (open1, task1) = gate();
        q.submit(task1);
        // A waits for task 1 only.
        let (qa, (done_a, got_a)) = (q.clone(), mpsc::channel());
        std::thread::spawn(move || done_a.send(qa.synchronize(Duration::from_secs(60))).unwrap());
        // Let A block first, then B, which waits for task 2 too (a larger target).
        std::thread::sleep(Duration::from_millis(50));
        let (open2, task2) = gate();
        q.submit(task2);
        let (qb, (done_b, got_b)) = (q.clone(), mpsc::channel());
        std::thread::spawn(move || done_b.send(qb.synchronize(Duration::from_secs(60))).unwrap());
        std::thread::sleep(Duration::from_millis(50));
        open1.send(()).unwrap();
        // A's tasks ran: A returns although B's target (task 2, still held) is not reached.
        let a = got_a.recv_timeout(Duration::from_secs(10)).expect("synchronize did not return once its tasks had run");
        a.expect("synchronize A");
        assert!(got_b.try_recv().is_err(), "B returned before its task ran");
        assert_eq!(q.pending(), 1);
        open2.send(()).unwrap();
        got_b.recv_timeout(Duration::from_secs(10)).expect("synchronize B did not return").expect("synchronize B");
        assert_eq!(q.pending(), 0);
    }

    #[test]
    fn synchronize_is_bounded() {
        let q = HostQueue::new();
        let (open, task) = gate();
        q.submit(task);
        let e = q.synchronize(Duration::from_millis(20)).unwrap_err().to_string();
        assert!(e.contains("1 tasks pending"), "{e}");
        open.send(()).unwrap();
        q.synchronize(Duration::from_secs(10)).unwrap();
    }
}
