//! Locking that outlives a panicked thread.

use std::sync::{Mutex, MutexGuard};

/// Locks `m` even if a thread panicked while holding it: a panic in one connection's thread
/// must not take the daemon down with it.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
