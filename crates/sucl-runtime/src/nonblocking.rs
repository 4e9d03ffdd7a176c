//! Non-blocking point-to-point inside a scope that guarantees completion, as
//! `std::thread::scope` guarantees joins: buffers stay borrowed until the scope has waited for
//! every request, so a request that is dropped or forgotten can never write into freed memory.

use crate::{Communicator, Element, Error, Result};
use std::cell::RefCell;
use std::marker::PhantomData;
use sucl_core::backend::ReqId;

/// A scope of non-blocking operations; see [`Communicator::nonblocking`].
pub struct Scope<'scope, 'env: 'scope> {
    comm: &'env Communicator,
    pending: RefCell<Vec<ReqId>>,
    _scope: PhantomData<&'scope mut &'env ()>,
}

/// A posted send or receive. [`Request::wait`] blocks until done; [`Request::test`] polls.
pub struct Request<'scope> {
    id: ReqId,
    elem: usize,
    pending: &'scope RefCell<Vec<ReqId>>,
    comm: &'scope Communicator,
    done: Option<usize>,
}

impl<'scope> Request<'scope> {
    fn retire(&self) {
        self.pending.borrow_mut().retain(|&r| r != self.id);
    }

    /// Waits (bounded by the timeout) and returns the number of elements moved.
    pub fn wait(mut self) -> Result<usize> {
        if let Some(n) = self.done.take() {
            return Ok(n);
        }
        let r = self.comm.backend_mut().wait(self.id);
        if r.is_ok() {
            self.retire();
        }
        r.map(|b| b / self.elem)
    }

    /// Makes progress; `Some(elements)` once complete.
    pub fn test(&mut self) -> Result<Option<usize>> {
        if let Some(n) = self.done {
            return Ok(Some(n));
        }
        let r = self.comm.backend_mut().test(self.id)?;
        if let Some(b) = r {
            self.retire();
            self.done = Some(b / self.elem);
        }
        Ok(self.done)
    }
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Posts a send of `buf` to `dest` with `tag`.
    pub fn isend<T: Element>(&'scope self, buf: &'scope [T], dest: usize, tag: u32) -> Result<Request<'scope>> {
        self.comm.validate_p2p(dest, tag)?;
        let bytes: &[u8] = bytemuck::cast_slice(buf);
        // SAFETY: `buf` is borrowed for 'scope and the scope waits for or cancels the request
        // before it ends.
        let id = unsafe { self.comm.backend_mut().post_send(dest, tag as u64, bytes.as_ptr(), bytes.len())? };
        self.pending.borrow_mut().push(id);
        Ok(Request { id, elem: std::mem::size_of::<T>(), pending: &self.pending, comm: self.comm, done: None })
    }

    /// Posts a receive into `buf` from `src` with `tag`.
    pub fn irecv<T: Element>(&'scope self, buf: &'scope mut [T], src: usize, tag: u32) -> Result<Request<'scope>> {
        self.comm.validate_p2p(src, tag)?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(buf);
        // SAFETY: as in isend.
        let id = unsafe { self.comm.backend_mut().post_recv(src, tag as u64, bytes.as_mut_ptr(), bytes.len())? };
        self.pending.borrow_mut().push(id);
        Ok(Request { id, elem: std::mem::size_of::<T>(), pending: &self.pending, comm: self.comm, done: None })
    }

    /// Waits for every request still pending in this scope.
    pub fn wait_all(&self) -> Result<()> {
        finish(self.comm, &self.pending)
    }
}

fn finish(comm: &Communicator, pending: &RefCell<Vec<ReqId>>) -> Result<()> {
    let ids: Vec<ReqId> = std::mem::take(&mut *pending.borrow_mut());
    let mut b = comm.backend_mut();
    let mut first: Option<Error> = None;
    for id in ids {
        if first.is_none() {
            if let Err(e) = b.wait(id) {
                b.cancel(id);
                first = Some(e);
            }
        } else {
            b.cancel(id);
        }
    }
    first.map_or(Ok(()), Err)
}

struct Guard<'a> {
    comm: &'a Communicator,
    pending: &'a RefCell<Vec<ReqId>>,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        // Reached only when unwinding: withdraw everything so no buffer is touched afterwards.
        let ids: Vec<ReqId> = std::mem::take(&mut *self.pending.borrow_mut());
        if self.comm.backends.try_borrow_mut().is_ok() {
            let mut b = self.comm.backend_mut();
            for id in ids {
                b.cancel(id);
            }
        }
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
