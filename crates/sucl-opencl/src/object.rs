//! OpenCL objects as the loader sees them: a heap block that starts with the dispatch-table
//! pointer, a kind tag and a reference count, then the object's data. Every live handle is in
//! one registry, so a released, foreign or wrong-kind handle is recognised (and refused with
//! the specification's code) before anything reads through it.

use crate::dispatch::Dispatch;
use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{LazyLock, Mutex, MutexGuard};

/// The kinds of object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Platform,
    Device,
    Context,
    Queue,
    Mem,
    Program,
    Kernel,
    Event,
}

/// Data that lives in an object of one kind.
pub(crate) trait Data: Send + Sync + Sized + 'static {
    /// Its kind.
    const KIND: Kind;
}

/// The layout every handle points to (`repr(C)`: the dispatch pointer must come first).
#[repr(C)]
pub(crate) struct Obj<T> {
    dispatch: *const Dispatch,
    kind: Kind,
    /// References in all: the application's (counted as one while it holds any) and the
    /// library's own.
    refs: AtomicU32,
    /// The application's references (what `CL_*_REFERENCE_COUNT` reports).
    app: AtomicU32,
    data: T,
}

static LIVE: LazyLock<Mutex<HashMap<usize, Kind>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Live handles and their kinds.
fn live() -> MutexGuard<'static, HashMap<usize, Kind>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// A counted reference to an object (the application's references and the library's own
/// are counted alike: an event keeps its queue, a queue its context, as the specification
/// says they must).
pub(crate) struct Ref<T: Data>(NonNull<Obj<T>>);

// SAFETY: the data is Send + Sync and the count is atomic; the block is freed only when the
// last reference goes, under the registry lock.
unsafe impl<T: Data> Send for Ref<T> {}
// SAFETY: as for Send.
unsafe impl<T: Data> Sync for Ref<T> {}

impl<T: Data> Ref<T> {
    /// A new object with one reference.
    pub(crate) fn new(data: T) -> Ref<T> {
        let b = Box::new(Obj { dispatch: crate::icd::dispatch(), kind: T::KIND, refs: AtomicU32::new(1), app: AtomicU32::new(1), data });
        let p = NonNull::from(Box::leak(b));
        live().insert(p.as_ptr() as usize, T::KIND);
        Ref(p)
    }

    /// The object `h` names, with a new reference, if it is a live object of this kind.
    pub(crate) fn from_handle(h: *mut c_void) -> Option<Ref<T>> {
        let reg = live();
        if reg.get(&(h as usize)) != Some(&T::KIND) {
            return None;
        }
        let p = NonNull::new(h.cast::<Obj<T>>())?;
        // SAFETY: the registry holds only live blocks of this kind; the count cannot reach
        // zero while the registry lock is held (releases take it).
        unsafe { p.as_ref() }.refs.fetch_add(1, Ordering::AcqRel);
        drop(reg);
        Some(Ref(p))
    }

    /// The handle the application sees.
    pub(crate) fn handle(&self) -> *mut c_void {
        self.0.as_ptr().cast()
    }

    /// The handle of a new object, whose first reference becomes the application's.
    pub(crate) fn into_handle(self) -> *mut c_void {
        let h = self.handle();
        std::mem::forget(self);
        h
    }

    /// The application's `clRetain*`.
    pub(crate) fn retain_app(&self) {
        self.obj().app.fetch_add(1, Ordering::AcqRel);
    }

    /// The application's `clRelease*`. When its last reference goes, the handle leaves the
    /// registry (later calls with it are refused) and the object lives on only as long as
    /// the library's own references (an event's queue, a kernel's program).
    pub(crate) fn release_app(&self) {
        let mut reg = live();
        if self.obj().app.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        reg.remove(&(self.0.as_ptr() as usize));
        drop(reg);
        release(self.0);
    }

    /// The application's reference count.
    pub(crate) fn count(&self) -> u32 {
        self.obj().app.load(Ordering::Acquire)
    }

    fn obj(&self) -> &Obj<T> {
        // SAFETY: a Ref holds a reference, so the block is alive.
        unsafe { self.0.as_ref() }
    }

    /// Whether two references name one object.
    pub(crate) fn same(&self, other: &Ref<T>) -> bool {
        self.0 == other.0
    }
}

fn release<T: Data>(p: NonNull<Obj<T>>) {
    let mut reg = live();
    // SAFETY: the caller held a reference, so the block is alive.
    let last = unsafe { p.as_ref() }.refs.fetch_sub(1, Ordering::AcqRel) == 1;
    if !last {
        return;
    }
    reg.remove(&(p.as_ptr() as usize));
    drop(reg);
    // SAFETY: the last reference is gone and the handle left the registry: nothing can reach
    // the block any more; it came from Box::leak in `new`.
    drop(unsafe { Box::from_raw(p.as_ptr()) });
}

impl<T: Data> Clone for Ref<T> {
    fn clone(&self) -> Ref<T> {
        self.obj().refs.fetch_add(1, Ordering::AcqRel);
        Ref(self.0)
    }
}

impl<T: Data> Drop for Ref<T> {
    fn drop(&mut self) {
        release(self.0);
    }
}

impl<T: Data> std::ops::Deref for Ref<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.obj().data
    }
}
