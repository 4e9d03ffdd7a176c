//! [`SharedBuf`]: host memory shared between the program, the tasks of a host queue and a
//! [`CommQueue`](crate::CommQueue). The queue keeps a handle from enqueue until the operation
//! completed, so the memory cannot go away early; while the backend uses it (from the trigger to
//! completion) it holds a lease, and a task that touches the buffer in that window waits for the
//! lease to end instead of racing the transfer.

use std::cell::UnsafeCell;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use sucl_runtime::{Element, Error, Result};

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
    pub fn read(&self) -> ReadGuard<T> {
        self.try_read(Instant::now() + ACCESS_BOUND).expect("a communication operation held the buffer past the bound")
    }

    /// Exclusive access; waits while any operation uses the buffer.
    pub fn write(&self) -> WriteGuard<T> {
        self.try_write(Instant::now() + ACCESS_BOUND).expect("a communication operation held the buffer past the bound")
    }

    /// A copy of the contents.
    pub fn to_vec(&self) -> Vec<T> {
        self.read().to_vec()
    }

    fn acquire(&self, deadline: Instant, exclusive: bool) -> Result<()> {
        let mut a = self.inner.access.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let free = if exclusive { !a.writer && a.readers == 0 } else { !a.writer };
            if free {
                if exclusive {
                    a.writer = true;
                } else {
                    a.readers += 1;
                }
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout { rank: 0, op: "waiting for access to a shared buffer".into(), after: ACCESS_BOUND });
            }
            a.waiting += 1;
            a = self.inner.freed.wait_timeout(a, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
            a.waiting -= 1;
        }
    }

    fn release(&self, exclusive: bool) {
        let mut a = self.inner.access.lock().unwrap_or_else(|p| p.into_inner());
        if exclusive {
            a.writer = false;
        } else {
            a.readers -= 1;
        }
        let wake = a.waiting > 0;
        drop(a);
        if wake {
            self.inner.freed.notify_all();
        }
    }

    pub(crate) fn try_read(&self, deadline: Instant) -> Result<ReadGuard<T>> {
        self.acquire(deadline, false)?;
        Ok(ReadGuard { buf: self.clone() })
    }

    pub(crate) fn try_write(&self, deadline: Instant) -> Result<WriteGuard<T>> {
        self.acquire(deadline, true)?;
        Ok(WriteGuard { buf: self.clone() })
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
