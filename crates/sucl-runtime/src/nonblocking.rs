//! Non-blocking point-to-point inside a scope that guarantees completion, as
//! `std::thread::scope` guarantees joins: buffers stay borrowed until the scope has waited for
//! every request, so a request that is dropped or forgotten can never write into freed memory.

use crate::{Communicator, Element, Error, Result};
use std::cell::{RefCell, RefMut};
use std::marker::PhantomData;
use sucl_core::backend::{Backend, ReqId};

/// Which of the communicator's host backends a request was posted on: its position in the
/// communicator's backend list, fixed for the communicator's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BackendSlot(usize);

/// A posted request and the backend that owns it. Request ids are private to a backend, so a
/// request is always waited for, tested or cancelled on the backend it was posted on — never on
/// whichever backend is pinned when it completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Posted {
    backend: BackendSlot,
    id: ReqId,
}

/// A scope of non-blocking operations; see [`Communicator::nonblocking`].
pub struct Scope<'scope, 'env: 'scope> {
    comm: &'env Communicator,
    pending: RefCell<Vec<Posted>>,
    _scope: PhantomData<&'scope mut &'env ()>,
}

/// A posted send or receive. [`Request::wait`] blocks until done; [`Request::test`] polls. Both
/// go to the backend the request was posted on, whatever [`Communicator::pin_backend`] says now.
pub struct Request<'scope> {
    posted: Posted,
    elem: usize,
    pending: &'scope RefCell<Vec<Posted>>,
    comm: &'scope Communicator,
    done: Option<usize>,
}

impl<'scope> Request<'scope> {
    fn retire(&self) {
        self.pending.borrow_mut().retain(|&p| p != self.posted);
    }

    /// Waits (bounded by the timeout) and returns the number of elements moved. On error the
    /// request is withdrawn at once, so the scope does not wait for it a second time.
    pub fn wait(mut self) -> Result<usize> {
        if let Some(n) = self.done.take() {
            return Ok(n);
        }
        let mut b = self.comm.backend_at(self.posted.backend);
        let r = b.wait(self.posted.id);
        if r.is_err() {
            b.cancel(self.posted.id);
        }
        drop(b);
        self.retire();
        r.map(|bytes| bytes / self.elem)
    }

    /// Makes progress; `Some(elements)` once complete.
    pub fn test(&mut self) -> Result<Option<usize>> {
        if let Some(n) = self.done {
            return Ok(Some(n));
        }
        let r = self.comm.backend_at(self.posted.backend).test(self.posted.id)?;
        if let Some(bytes) = r {
            self.retire();
            self.done = Some(bytes / self.elem);
        }
        Ok(self.done)
    }
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Posts a send of `buf` to `dest` with `tag`.
    pub fn isend<T: Element>(&'scope self, buf: &'scope [T], dest: usize, tag: u32) -> Result<Request<'scope>> {
        self.comm.validate_p2p("isend", dest, tag)?;
        let bytes: &[u8] = bytemuck::cast_slice(buf);
        let backend = self.comm.p2p_slot();
        // SAFETY: the backend may read `bytes` until the request completes or is cancelled.
        // `buf` stays borrowed for 'scope, and the scope completes or cancels every request
        // it recorded (on the backend it was posted on) before 'scope ends — also when `f`
        // panics (the guard in `nonblocking`).
        let id = unsafe { self.comm.backend_at(backend).post_send(dest, tag as u64, bytes.as_ptr(), bytes.len())? };
        Ok(self.track(Posted { backend, id }, std::mem::size_of::<T>()))
    }

    /// Posts a receive into `buf` from `src` with `tag`.
    pub fn irecv<T: Element>(&'scope self, buf: &'scope mut [T], src: usize, tag: u32) -> Result<Request<'scope>> {
        self.comm.validate_p2p("irecv", src, tag)?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
        let backend = self.comm.p2p_slot();
        // SAFETY: the backend may write `bytes` until the request completes or is cancelled.
        // `buf` stays mutably borrowed for 'scope (nothing else can read or free it), and the
        // scope completes or cancels every recorded request before 'scope ends, as in isend.
        let id = unsafe { self.comm.backend_at(backend).post_recv(src, tag as u64, bytes.as_mut_ptr(), bytes.len())? };
        Ok(self.track(Posted { backend, id }, std::mem::size_of::<T>()))
    }

    fn track(&'scope self, posted: Posted, elem: usize) -> Request<'scope> {
        self.pending.borrow_mut().push(posted);
        Request { posted, elem, pending: &self.pending, comm: self.comm, done: None }
    }

    /// Waits for every request still pending in this scope.
    pub fn wait_all(&self) -> Result<()> {
        finish(self.comm, &self.pending)
    }
}

/// Waits for every pending request, each on its own backend; after the first error the rest
/// are cancelled, so that no backend touches a scope's buffers once the scope is over.
fn finish(comm: &Communicator, pending: &RefCell<Vec<Posted>>) -> Result<()> {
    let all: Vec<Posted> = std::mem::take(&mut *pending.borrow_mut());
    let mut first: Option<Error> = None;
    for p in all {
        let mut b = comm.backend_at(p.backend);
        if first.is_none() {
            if let Err(e) = b.wait(p.id) {
                b.cancel(p.id);
                first = Some(e);
            }
        } else {
            b.cancel(p.id);
        }
    }
    first.map_or(Ok(()), Err)
}

struct Guard<'a> {
    comm: &'a Communicator,
    pending: &'a RefCell<Vec<Posted>>,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        // Reached only when unwinding: withdraw everything so no buffer is touched afterwards.
        let all: Vec<Posted> = std::mem::take(&mut *self.pending.borrow_mut());
        if let Ok(mut backends) = self.comm.backends.try_borrow_mut() {
            for p in all {
                backends[p.backend.0].cancel(p.id);
            }
        }
    }
}

impl Communicator {
    /// The backend that would take a point-to-point call posted now.
    fn p2p_slot(&self) -> BackendSlot {
        BackendSlot(self.p2p_index())
    }

    /// The backend in `slot`, whichever backend is pinned now.
    fn backend_at(&self, slot: BackendSlot) -> RefMut<'_, Box<dyn Backend>> {
        RefMut::map(self.backends.borrow_mut(), |v| &mut v[slot.0])
    }
}

impl Communicator {
    /// Runs `f` with a [`Scope`] in which `isend`/`irecv` post operations that overlap; when `f`
    /// returns, every request it left pending is waited for (an error there is returned).
    ///
    /// ```no_run
    /// # let comm = sucl_runtime::init()?;
    /// let (right, left) = ((comm.rank() + 1) % comm.size(), (comm.rank() + comm.size() - 1) % comm.size());
    /// let out = [comm.rank() as u32];
    /// let mut got = [0u32];
    /// comm.nonblocking(|s| {
    ///     let r = s.irecv(&mut got, left, 0)?;
    ///     s.isend(&out, right, 0)?;
    ///     r.wait()
    /// })?;
    /// assert_eq!(got[0] as usize, left);
    /// # Ok::<(), sucl_runtime::Error>(())
    /// ```
    pub fn nonblocking<'env, R>(&'env self, f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> Result<R>) -> Result<R> {
        let scope = Scope { comm: self, pending: RefCell::new(Vec::new()), _scope: PhantomData };
        let guard = Guard { comm: self, pending: &scope.pending };
        let r = f(&scope);
        std::mem::forget(guard);
        let fin = finish(self, &scope.pending);
        let r = r?;
        fin.map(|_| r)
    }
}
