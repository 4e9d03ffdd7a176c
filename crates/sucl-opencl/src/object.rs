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
    data: std::mem::ManuallyDrop<T>,
}

/// Blocks of released objects, by kind, kept for the next object of that kind. A released
/// block keeps its dispatch pointer: a loader that dispatches through a stale handle (as
/// ocl-icd does before the library can check it) reaches this library, which refuses it.
static FREE: LazyLock<Mutex<HashMap<u8, Vec<usize>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

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
        let obj = Obj {
            dispatch: crate::icd::dispatch(),
            kind: T::KIND,
            refs: AtomicU32::new(1),
            app: AtomicU32::new(1),
            data: std::mem::ManuallyDrop::new(data),
        };
        let reused = FREE.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&(T::KIND as u8)).and_then(Vec::pop);
        let p = match reused {
            Some(addr) => {
                let p = addr as *mut Obj<T>;
                // SAFETY: a block of this kind (so of this layout) whose data was dropped and
                // that nothing references (it left the registry before it was freed).
                unsafe { p.write(obj) };
                NonNull::new(p).expect("a freed block is not null")
            }
            None => NonNull::from(Box::leak(Box::new(obj))),
        };
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

    /// The handle of a new buffer (which remembers it for its destructor callbacks).
    pub(crate) fn into_mem_handle(self) -> *mut c_void
    where
        T: MemHandle,
    {
        self.remember(self.handle());
        self.into_handle()
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
    // SAFETY: the last reference is gone and the handle left the registry: nothing reads
    // the data any more; it is dropped once, and the block (its dispatch pointer intact) is
    // kept for reuse.
    unsafe { std::mem::ManuallyDrop::drop(&mut (*p.as_ptr()).data) };
    FREE.lock().unwrap_or_else(|p| p.into_inner()).entry(T::KIND as u8).or_default().push(p.as_ptr() as usize);
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

/// Objects that remember their own handle.
pub(crate) trait MemHandle {
    /// Stores the handle.
    fn remember(&self, h: *mut c_void);
}

impl MemHandle for crate::model::Mem {
    fn remember(&self, h: *mut c_void) {
        self.handle.store(h as usize, Ordering::Release);
    }
}
