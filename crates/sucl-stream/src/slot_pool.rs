//! The free staging slots of a staged stream queue, by size class, and the rule for taking one:
//! a slot is reused once nothing holds it but the pool and the stream ran past its last upload.
//! Kept apart from the device path (which supplies pinned slots and CUDA events) so the rule can
//! be tested on any machine.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// How many of a class's oldest free slots `take` looks at. One slot held a little longer (a
/// send the host backend has not finished) must not make every later enqueue allocate a new
/// slot while free ones wait behind it; looking at a few bounds the event queries per enqueue.
pub(crate) const SCAN: usize = 4;

/// A staging slot: its size.
pub(crate) trait Slot {
    fn bytes(&self) -> usize;
}

/// What a slot waits for before reuse (the event after its last upload).
pub(crate) trait Done {
    fn is_complete(&self) -> bool;
}

/// A free slot and the event after its last upload (if any).
type Free<S, E> = (Arc<S>, Option<Arc<E>>);

/// Free staging slots by size class (powers of two, at least [`SlotPool::MIN_BYTES`]), oldest
/// first in each, each with the event after its last upload (if any).
pub(crate) struct SlotPool<S, E> {
    classes: BTreeMap<u32, VecDeque<Free<S, E>>>,
    /// The newest event seen complete (the slots recycled at one wait share one event).
    seen_done: Option<Arc<E>>,
}

impl<S, E> Default for SlotPool<S, E> {
    fn default() -> Self {
        SlotPool { classes: BTreeMap::new(), seen_done: None }
    }
}

impl<S: Slot, E: Done> SlotPool<S, E> {
    pub(crate) const MIN_BYTES: usize = 64;

    fn class(bytes: usize) -> u32 {
        bytes.max(Self::MIN_BYTES).next_power_of_two().trailing_zeros()
    }

    /// What a slot for `bytes` allocates: its class's size.
    pub(crate) fn class_bytes(bytes: usize) -> usize {
        bytes.max(Self::MIN_BYTES).next_power_of_two()
    }

    /// A free slot of `bytes`'s class — the oldest among the class's [`SCAN`] oldest that nothing
    /// uses any more (no handle but the pool's: the progress thread let go; its event, if any,
    /// complete) — or `None`. At most one event query per slot looked at (none for an event
    /// already seen complete).
    pub(crate) fn take(&mut self, bytes: usize) -> Option<Arc<S>> {
        let q = self.classes.get_mut(&Self::class(bytes))?;
        let seen = &mut self.seen_done;
        let free = q.iter().take(SCAN).position(|(s, ev)| {
            Arc::strong_count(s) == 1
                && match ev {
                    None => true,
                    Some(e) if seen.as_ref().is_some_and(|d| Arc::ptr_eq(d, e)) => true,
                    Some(e) => {
                        let done = e.is_complete();
                        if done {
                            *seen = Some(e.clone());
                        }
                        done
                    }
                }
        })?;
        q.remove(free).map(|(s, _)| s)
    }

    /// Returns a slot (free once `ev`, if any, completed and no one else holds it).
    pub(crate) fn put(&mut self, s: Arc<S>, ev: Option<Arc<E>>) {
        self.classes.entry(Self::class(s.bytes())).or_default().push_back((s, ev));
    }

    /// After a host synchronize of the stream: every upload ran.
    pub(crate) fn synchronized(&mut self) {
        for q in self.classes.values_mut() {
            for (_, ev) in q.iter_mut() {
                *ev = None;
            }
        }
        self.seen_done = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    struct FakeSlot(usize);
    impl Slot for FakeSlot {
        fn bytes(&self) -> usize {
            self.0
        }
    }

    /// An event whose completion the test sets; counts its queries.
    #[derive(Default)]
    struct FakeEvent {
        done: AtomicBool,
        queries: AtomicU32,
    }
    impl Done for FakeEvent {
        fn is_complete(&self) -> bool {
            self.queries.fetch_add(1, Ordering::Relaxed);
            self.done.load(Ordering::Relaxed)
        }
    }

    type Pool = SlotPool<FakeSlot, FakeEvent>;

    #[test]
    fn a_held_oldest_slot_does_not_hide_a_free_one_behind_it() {
        let mut pool = Pool::default();
        let held = Arc::new(FakeSlot(1 << 20));
        let _progress_thread = held.clone(); // a send the host backend still holds
        pool.put(held, None);
        let free = Arc::new(FakeSlot(1 << 20));
        let free_ptr = Arc::as_ptr(&free);
        pool.put(free, None);
        let got = pool.take(1 << 20).expect("the free slot behind the held one is taken");
        assert_eq!(Arc::as_ptr(&got), free_ptr);
        assert!(pool.take(1 << 20).is_none(), "the held one is not");
    }

    #[test]
    fn a_slot_waits_for_its_upload_and_classes_stay_apart() {
        let mut pool = Pool::default();
        let ev = Arc::new(FakeEvent::default());
        pool.put(Arc::new(FakeSlot(100)), Some(ev.clone()));
        assert!(pool.take(100).is_none(), "its upload has not run");
        assert!(pool.take(1000).is_none(), "another class");
        ev.done.store(true, Ordering::Relaxed);
        assert!(pool.take(128).is_some(), "128 B is the same class as 100 B");
        assert_eq!(Pool::class_bytes(100), 128);
        assert_eq!(Pool::class_bytes(1), Pool::MIN_BYTES);
    }

    #[test]
    fn at_most_scan_slots_are_looked_at_and_a_seen_event_is_not_queried_again() {
        let mut pool = Pool::default();
        let pending = Arc::new(FakeEvent::default());
        for _ in 0..SCAN {
            pool.put(Arc::new(FakeSlot(64)), Some(pending.clone()));
        }
        pool.put(Arc::new(FakeSlot(64)), None); // free, but beyond the scan
        assert!(pool.take(64).is_none());
        assert_eq!(pending.queries.load(Ordering::Relaxed), SCAN as u32, "one query per slot looked at");
        pending.done.store(true, Ordering::Relaxed);
        assert!(pool.take(64).is_some());
        let before = pending.queries.load(Ordering::Relaxed);
        assert!(pool.take(64).is_some(), "the next slot shares the event seen complete");
        assert_eq!(pending.queries.load(Ordering::Relaxed), before, "not queried again");
        pool.synchronized();
        assert!(pool.take(64).is_some());
    }
}
