//! Who to wake when a host thread starts waiting on a stream-triggered request: every queue's
//! progress thread registers here, and a host-side wait counts itself in [`HOST_WAITERS`] and
//! wakes them all, so that they poll even the batches a queue's wait task would drive later.
//! Below both the requests and the engine, so neither needs the other to reach it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::thread::{Thread, ThreadId};

/// Threads blocked in a host-side [`Request::wait`](crate::Request::wait) on an operation a
/// progress thread completes: while there are any, every progress thread polls its channel.
pub(crate) static HOST_WAITERS: AtomicU32 = AtomicU32::new(0);

/// The live progress threads.
static PROGRESS_THREADS: Mutex<Vec<Thread>> = Mutex::new(Vec::new());

/// Adds the calling thread to the progress threads.
pub(crate) fn register_progress_thread() {
    PROGRESS_THREADS.lock().unwrap_or_else(|p| p.into_inner()).push(std::thread::current());
}

/// Removes a progress thread that ends.
pub(crate) fn unregister_progress_thread(id: ThreadId) {
    PROGRESS_THREADS.lock().unwrap_or_else(|p| p.into_inner()).retain(|t| t.id() != id);
}

/// A host thread begins a blocking wait on a request: every progress thread polls until it ends.
pub(crate) fn host_wait_begins() {
    HOST_WAITERS.fetch_add(1, Ordering::AcqRel);
    for t in PROGRESS_THREADS.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        t.unpark();
    }
}

/// The blocking wait of [`host_wait_begins`] ended.
pub(crate) fn host_wait_ends() {
    HOST_WAITERS.fetch_sub(1, Ordering::AcqRel);
}
