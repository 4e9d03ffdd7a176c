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
    /// The fewest finished tasks any blocked `synchronize` waits for (`u64::MAX`: none): the
    /// worker notifies once that many ran, not after every task (a wake-up per task would have
    /// the waiting thread take turns with the worker through the whole backlog).
    wake_at: AtomicU64,
    sleep: Mutex<()>,
    ran: Condvar,
    panicked: AtomicBool,
    /// Nanoseconds the worker (and `synchronize`) busy-polls before blocking: 0 until a
    /// [`CommQueue`](crate::CommQueue) sets it from its communicator's backoff.
    spin_ns: AtomicU64,
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
            spin_ns: AtomicU64::new(0),
        });
        let st = state.clone();
        std::thread::Builder::new()
            .name("sucl-host-queue".into())
            .spawn(move || {
                while let Some(task) = next_task(&rx, &st) {
                    if std::panic::catch_unwind(AssertUnwindSafe(task)).is_err() {
                        st.panicked.store(true, Ordering::Release);
                    }
                    let finished = st.finished.fetch_add(1, Ordering::SeqCst) + 1;
                    // A sleeper registers its target before it checks `finished` (both SeqCst),
                    // so either it sees this count or this sees its target.
                    if finished >= st.wake_at.load(Ordering::SeqCst) {
                        let _g = st.sleep.lock().unwrap_or_else(|p| p.into_inner());
                        // Sleepers still short of their targets register them again.
                        st.wake_at.store(u64::MAX, Ordering::SeqCst);
                        st.ran.notify_all();
                    }
                }
            })
            .expect("spawning a host queue worker");
        HostQueue { tx, state }
    }

    /// Lets the worker and `synchronize` busy-poll for `spin` before they block (a submitter's
    /// wake-up of a blocked worker is a system call on its side and a scheduling delay on the
    /// worker's; zero never spins).
    pub(crate) fn set_spin(&self, spin: Duration) {
        self.state.spin_ns.store(spin.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
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
        let st = &self.state;
        let spin = Duration::from_nanos(st.spin_ns.load(Ordering::Relaxed));
        spin_until(spin, || st.finished.load(Ordering::Acquire) >= target);
        let deadline = Instant::now() + bound;
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
        if st.sleepers.fetch_sub(1, Ordering::SeqCst) == 1 {
            st.wake_at.store(u64::MAX, Ordering::SeqCst);
        }
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

/// Busy-polls `ready` for at most `spin`; whether it became true.
fn spin_until(spin: Duration, mut ready: impl FnMut() -> bool) -> bool {
    if ready() {
        return true;
    }
    if spin.is_zero() {
        return false;
    }
    let t0 = Instant::now();
    let mut rounds = 0u32;
    loop {
        std::hint::spin_loop();
        if ready() {
            return true;
        }
        rounds = rounds.wrapping_add(1);
        // Reading the clock costs more than a round on some virtual machines.
        if rounds.is_multiple_of(32) && t0.elapsed() >= spin {
            return false;
        }
    }
}

/// The worker's next task: at once if one is queued, else after a short busy-poll (the
/// queue's spin), else blocking. `None` once every handle was dropped.
fn next_task(rx: &mpsc::Receiver<Task>, st: &State) -> Option<Task> {
    let mut got = None;
    let spin = Duration::from_nanos(st.spin_ns.load(Ordering::Relaxed));
    let gone = spin_until(spin, || match rx.try_recv() {
        Ok(t) => {
            got = Some(t);
            true
        }
        Err(mpsc::TryRecvError::Empty) => false,
        Err(mpsc::TryRecvError::Disconnected) => true,
    });
    match got {
        Some(t) => Some(t),
        None if gone => None,
        None => rx.recv().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::mpsc::channel;

    /// Threads synchronizing at different points of a backlog are each released once their own
    /// tasks ran, while later tasks still hold the queue: each later "gate" task blocks until
    /// its synchronizer returned, so a synchronize woken only after a later task ran (or only
    /// at its timeout) leaves a gate closed, which the gate reports.
    #[test]
    fn synchronize_returns_at_its_own_target_while_later_tasks_block() {
        for spin in [Duration::ZERO, Duration::from_micros(5)] {
            let q = HostQueue::new();
            q.set_spin(spin);
            let ran = Arc::new(AtomicUsize::new(0));
            let opened = Arc::new(AtomicUsize::new(0));
            // Hold the worker until every synchronizer is blocked with its target.
            let (go, hold) = channel::<()>();
            q.submit(move || {
                let _ = hold.recv_timeout(Duration::from_secs(10));
            });
            let mut waiters = vec![];
            for k in 1..=3usize {
                for _ in 0..20 {
                    let ran = ran.clone();
                    q.submit(move || {
                        ran.fetch_add(1, Ordering::SeqCst);
                    });
                }
                let (q2, ran2) = (q.clone(), ran.clone());
                let (tx, rx) = channel::<()>();
                waiters.push(std::thread::spawn(move || {
                    q2.synchronize(Duration::from_secs(20)).unwrap();
                    assert!(ran2.load(Ordering::SeqCst) >= 20 * k, "synchronize returned before its tasks ran");
                    let _ = tx.send(());
                }));
                while q.state.sleepers.load(Ordering::SeqCst) < k as u32 {
                    std::thread::yield_now();
                }
                let opened = opened.clone();
                q.submit(move || {
                    if rx.recv_timeout(Duration::from_secs(3)).is_ok() {
                        opened.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
            go.send(()).unwrap();
            for w in waiters {
                w.join().unwrap();
            }
            q.synchronize(Duration::from_secs(20)).unwrap();
            assert_eq!(ran.load(Ordering::SeqCst), 60);
            assert_eq!(opened.load(Ordering::SeqCst), 3, "a synchronize was not released before the task behind its target ran");
        }
    }
}
