//! [`SharedBuf`]: host memory shared between the program, the tasks of a host queue and a
//! [`CommQueue`](crate::CommQueue). The queue keeps a handle from enqueue until the operation
//! completed, so the memory cannot go away early; while the backend uses it (from the trigger to
//! completion) it holds a lease, and a task that touches the buffer in that window waits for the
//! lease to end instead of racing the transfer.

use crate::engine::Lendable;
use std::cell::UnsafeCell;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use sucl_runtime::Element;

#[derive(Default)]
struct Access {
    readers: usize,
    writer: bool,
    /// Threads blocked in `acquire`: a release wakes them only if there are any (a condition
    /// variable's notify is a system call even with no one waiting).
    waiting: usize,
}

struct Inner<T> {
    len: usize,
    data: UnsafeCell<Box<[T]>>,
    access: Mutex<Access>,
    freed: Condvar,
}

// SAFETY: the data is only reached through guards that `Access` makes exclusive for writers and
// shared for readers (a reader/writer lock), so sharing the handle between threads is as safe
// as sharing an `RwLock<Box<[T]>>`; `T: Element` is plain data (Send + Sync).
unsafe impl<T: Element> Sync for Inner<T> {}
// SAFETY: as above; the box is owned data of a `Send` type.
unsafe impl<T: Element> Send for Inner<T> {}

/// A fixed-length host buffer shared by handle (cheap to clone). Read it with
/// [`SharedBuf::read`], write it with [`SharedBuf::write`]; both wait (bounded) while a
/// communication operation holds it.
pub struct SharedBuf<T: Element> {
    inner: Arc<Inner<T>>,
}

impl<T: Element> Clone for SharedBuf<T> {
    fn clone(&self) -> Self {
        SharedBuf { inner: self.inner.clone() }
    }
}

/// How long a task waits for an operation to release a buffer before giving up.
const ACCESS_BOUND: Duration = Duration::from_secs(300);

impl<T: Element> SharedBuf<T> {
    /// A buffer holding `data`.
    pub fn new(data: Vec<T>) -> Self {
        let inner =
            Inner { len: data.len(), data: UnsafeCell::new(data.into_boxed_slice()), access: Mutex::default(), freed: Condvar::new() };
        SharedBuf { inner: Arc::new(inner) }
    }

    /// A buffer of `len` zeroes.
    pub fn zeroed(len: usize) -> Self {
        Self::new(vec![<T as bytemuck::Zeroable>::zeroed(); len])
    }

    /// Number of elements (fixed at creation).
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether two handles name the same buffer.
    pub fn same(&self, other: &SharedBuf<T>) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Shared access; waits while an operation receives into the buffer.
    ///
    /// # Panics
    /// If an operation holds the buffer for more than 300 s.
    pub fn read(&self) -> ReadGuard<T> {
        assert!(self.acquire(Instant::now() + ACCESS_BOUND, false), "a communication operation held the buffer past {ACCESS_BOUND:?}");
        ReadGuard { buf: self.clone() }
    }

    /// Exclusive access; waits while any operation uses the buffer.
    ///
    /// # Panics
    /// If an operation holds the buffer for more than 300 s.
    pub fn write(&self) -> WriteGuard<T> {
        assert!(self.acquire(Instant::now() + ACCESS_BOUND, true), "a communication operation held the buffer past {ACCESS_BOUND:?}");
        WriteGuard { buf: self.clone() }
    }

    /// A copy of the contents.
    pub fn to_vec(&self) -> Vec<T> {
        self.read().to_vec()
    }

    /// An address that names this buffer (every handle of it gives the same), for telling
    /// buffers apart.
    pub(crate) fn key(&self) -> usize {
        Arc::as_ptr(&self.inner) as *const u8 as usize
    }

    /// Takes shared or exclusive access, waiting until `deadline`; false if it ran out.
    fn acquire(&self, deadline: Instant, exclusive: bool) -> bool {
        let mut a = self.inner.access.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if Self::take(&mut a, exclusive) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            a.waiting += 1;
            a = self.inner.freed.wait_timeout(a, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
            a.waiting -= 1;
        }
    }

    /// Takes the access if it is free now.
    fn take(a: &mut Access, exclusive: bool) -> bool {
        let free = if exclusive { !a.writer && a.readers == 0 } else { !a.writer };
        if free {
            if exclusive {
                a.writer = true;
            } else {
                a.readers += 1;
            }
        }
        free
    }

    fn release(&self, exclusive: bool) {
        self.inner.release(exclusive);
    }

    /// This buffer as memory an operation lends to the backend (a handle, no allocation).
    pub(crate) fn lendable(&self) -> std::sync::Arc<dyn Lendable> {
        self.inner.clone()
    }

    /// Shared access if no one writes the buffer now (never waits).
    pub(crate) fn read_now(&self) -> Option<ReadGuard<T>> {
        let mut a = self.inner.access.lock().unwrap_or_else(|p| p.into_inner());
        Self::take(&mut a, false).then(|| ReadGuard { buf: self.clone() })
    }

    /// Exclusive access if no one uses the buffer now (never waits).
    pub(crate) fn write_now(&self) -> Option<WriteGuard<T>> {
        let mut a = self.inner.access.lock().unwrap_or_else(|p| p.into_inner());
        Self::take(&mut a, true).then(|| WriteGuard { buf: self.clone() })
    }
}

impl<T: Element> Lendable for Inner<T> {
    fn try_take(&self, exclusive: bool) -> Option<(*mut u8, usize)> {
        let mut a = self.access.lock().unwrap_or_else(|p| p.into_inner());
        if !SharedBuf::<T>::take(&mut a, exclusive) {
            return None;
        }
        drop(a);
        let bytes = self.len * std::mem::size_of::<T>();
        let p = if exclusive {
            // SAFETY: the access just taken is exclusive (no reader, no other writer) until
            // `release`.
            unsafe { (*self.data.get()).as_mut_ptr() as *mut u8 }
        } else {
            // SAFETY: shared access: no writer until `release`; the memory is only read.
            unsafe { (*self.data.get()).as_ptr() as *mut u8 }
        };
        Some((p, bytes))
    }

    fn release(&self, exclusive: bool) {
        Inner::release(self, exclusive);
    }
}

impl<T: Element> Inner<T> {
    fn release(&self, exclusive: bool) {
        let mut a = self.access.lock().unwrap_or_else(|p| p.into_inner());
        if exclusive {
            a.writer = false;
        } else {
            a.readers -= 1;
        }
        let wake = a.waiting > 0;
        drop(a);
        if wake {
            self.freed.notify_all();
        }
    }
}

/// Shared access to a [`SharedBuf`] (owned: it may move between threads and outlive borrows).
pub struct ReadGuard<T: Element> {
    buf: SharedBuf<T>,
}

/// Exclusive access to a [`SharedBuf`].
pub struct WriteGuard<T: Element> {
    buf: SharedBuf<T>,
}

impl<T: Element> std::ops::Deref for ReadGuard<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: this guard counts as a reader, so no writer exists until it drops.
        unsafe { &*self.buf.inner.data.get() }
    }
}

impl<T: Element> std::ops::Deref for WriteGuard<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: this guard is the only writer and no reader exists until it drops.
        unsafe { &*self.buf.inner.data.get() }
    }
}

impl<T: Element> std::ops::DerefMut for WriteGuard<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` keeps this guard's own borrows exclusive.
        unsafe { &mut *self.buf.inner.data.get() }
    }
}

impl<T: Element> Drop for ReadGuard<T> {
    fn drop(&mut self) {
        self.buf.release(false);
    }
}

impl<T: Element> Drop for WriteGuard<T> {
    fn drop(&mut self) {
        self.buf.release(true);
    }
}
