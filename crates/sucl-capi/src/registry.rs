//! Handles: C holds 64-bit integers, never pointers to Rust objects, so that a freed, foreign or
//! made-up handle is an error instead of undefined behaviour. A handle packs a kind tag (bits
//! 56-63), the slot's generation (bits 32-55, bumped when the slot is freed) and the slot index
//! plus one (bits 0-31); 0 is the null handle of every kind.
//!
//! A call *checks out* the object out of its slot for its duration ([`Registry::checkout`]), so a
//! second thread using the same handle meanwhile gets `SUCL_ERR_BUSY` rather than a data race,
//! and freeing a handle in use is refused the same way.

use crate::error::Fail;
use std::sync::{Mutex, MutexGuard};

enum State<T> {
    Free,
    Here(T),
    /// Checked out; the text says to whom (for the BUSY message).
    Out(&'static str),
}

struct Slot<T> {
    generation: u32,
    state: State<T>,
}

/// Live objects of one kind, addressed by handle.
pub(crate) struct Registry<T> {
    kind: &'static str,
    tag: u8,
    slots: Mutex<Vec<Slot<T>>>,
}

const GEN_MASK: u32 = (1 << 24) - 1;

impl<T> Registry<T> {
    pub(crate) const fn new(kind: &'static str, tag: u8) -> Self {
        Registry { kind, tag, slots: Mutex::new(Vec::new()) }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot<T>>> {
        // A panic while holding the lock leaves the slots consistent (every change is one
        // assignment), so a poisoned lock is used as is.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn handle(&self, index: usize, generation: u32) -> u64 {
        (u64::from(self.tag) << 56) | (u64::from(generation & GEN_MASK) << 32) | (index as u64 + 1)
    }

    /// The slot index a handle names, if it is of this kind and its generation is current.
    fn index(&self, slots: &[Slot<T>], h: u64) -> Result<usize, Fail> {
        if h == 0 {
            return Err(Fail::Handle(format!("null {} handle", self.kind)));
        }
        if (h >> 56) as u8 != self.tag {
            return Err(Fail::Handle(format!("handle {h:#x} is not a {} handle", self.kind)));
        }
        let index = (h & 0xffff_ffff) as usize;
        let generation = ((h >> 32) as u32) & GEN_MASK;
        match index.checked_sub(1).and_then(|i| slots.get(i).map(|s| (i, s))) {
            Some((i, s)) if s.generation & GEN_MASK == generation && !matches!(s.state, State::Free) => Ok(i),
            _ => Err(Fail::Handle(format!("{} handle {h:#x} is not live (freed, or never created)", self.kind))),
        }
    }

    /// Stores `value`; returns its handle.
    pub(crate) fn insert(&self, value: T) -> u64 {
        let mut slots = self.lock();
        let i = match slots.iter().position(|s| matches!(s.state, State::Free)) {
            Some(i) => i,
            None => {
                slots.push(Slot { generation: 1, state: State::Free });
                slots.len() - 1
            }
        };
        slots[i].state = State::Here(value);
        self.handle(i, slots[i].generation)
    }

    /// Takes the object out for one call; the checkout puts it back when dropped.
    pub(crate) fn checkout(&self, h: u64) -> Result<Checkout<'_, T>, Fail> {
        let value = self.take_out(h, "a call on another thread")?;
        Ok(Checkout { reg: self, h, value: Some(value) })
    }

    /// Takes the object out and leaves the slot marked as held by `holder` until
    /// [`Registry::put_back`] or [`Registry::retire`].
    pub(crate) fn take_out(&self, h: u64, holder: &'static str) -> Result<T, Fail> {
        let mut slots = self.lock();
        let i = self.index(&slots, h)?;
        match std::mem::replace(&mut slots[i].state, State::Out(holder)) {
            State::Here(v) => Ok(v),
            State::Out(who) => {
                slots[i].state = State::Out(who);
                Err(Fail::Busy(format!("{} {h:#x} is in use by {who}", self.kind)))
            }
            State::Free => unreachable!("index() refuses free slots"),
        }
    }

    /// Returns an object taken out with [`Registry::take_out`].
    pub(crate) fn put_back(&self, h: u64, value: T) {
        let mut slots = self.lock();
        if let Ok(i) = self.index(&slots, h) {
            slots[i].state = State::Here(value);
        }
    }

    /// Frees the slot of an object taken out (its handle dies).
    pub(crate) fn retire(&self, h: u64) {
        let mut slots = self.lock();
        if let Ok(i) = self.index(&slots, h) {
            slots[i].state = State::Free;
            slots[i].generation = slots[i].generation.wrapping_add(1) & GEN_MASK;
        }
    }

    /// Removes the object (its handle dies); refused while it is checked out.
    pub(crate) fn remove(&self, h: u64) -> Result<T, Fail> {
        let v = self.take_out(h, "being freed")?;
        self.retire(h);
        Ok(v)
    }

    /// Runs `f` on the object under the registry's lock: for quick looks and clones only.
    pub(crate) fn with<R>(&self, h: u64, f: impl FnOnce(&mut T) -> R) -> Result<R, Fail> {
        let mut slots = self.lock();
        let i = self.index(&slots, h)?;
        match &mut slots[i].state {
            State::Here(v) => Ok(f(v)),
            State::Out(who) => Err(Fail::Busy(format!("{} {h:#x} is in use by {who}", self.kind))),
            State::Free => unreachable!("index() refuses free slots"),
        }
    }

    /// Removes and returns every object (with its handle) that `pick` selects.
    pub(crate) fn drain_where(&self, mut pick: impl FnMut(&T) -> bool) -> Vec<(u64, T)> {
        let mut slots = self.lock();
        let mut out = vec![];
        for i in 0..slots.len() {
            if matches!(&slots[i].state, State::Here(v) if pick(v)) {
                let State::Here(v) = std::mem::replace(&mut slots[i].state, State::Free) else { unreachable!() };
                out.push((self.handle(i, slots[i].generation), v));
                slots[i].generation = slots[i].generation.wrapping_add(1) & GEN_MASK;
            }
        }
        out
    }

    /// Whether any live object satisfies `pick`.
    pub(crate) fn any(&self, mut pick: impl FnMut(&T) -> bool) -> bool {
        self.lock().iter().any(|s| matches!(&s.state, State::Here(v) if pick(v)))
    }
}

/// An object checked out of its registry for one call.
pub(crate) struct Checkout<'r, T> {
    reg: &'r Registry<T>,
    h: u64,
    value: Option<T>,
}

impl<T> std::ops::Deref for Checkout<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value.as_ref().expect("a checkout holds its value until dropped")
    }
}

impl<T> std::ops::DerefMut for Checkout<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value.as_mut().expect("a checkout holds its value until dropped")
    }
}

impl<T> Drop for Checkout<'_, T> {
    fn drop(&mut self) {
        if let Some(v) = self.value.take() {
            self.reg.put_back(self.h, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_foreign_and_null_handles_are_refused() {
        let r: Registry<u32> = Registry::new("thing", 7);
        let other: Registry<u32> = Registry::new("other", 8);
        let h = r.insert(5);
        assert_eq!(*r.checkout(h).ok().unwrap(), 5);
        assert!(matches!(r.checkout(0), Err(Fail::Handle(_))));
        let foreign = other.insert(1);
        assert!(matches!(r.checkout(foreign), Err(Fail::Handle(_))));
        assert_eq!(r.remove(h).ok(), Some(5));
        assert!(matches!(r.checkout(h), Err(Fail::Handle(_))));
        // The slot is reused under a new generation: the old handle stays dead.
        let h2 = r.insert(6);
        assert_ne!(h, h2);
        assert!(matches!(r.checkout(h), Err(Fail::Handle(_))));
        assert_eq!(*r.checkout(h2).ok().unwrap(), 6);
    }

    #[test]
    fn a_checked_out_object_is_busy_until_returned() {
        let r: Registry<u32> = Registry::new("thing", 7);
        let h = r.insert(5);
        let l = r.checkout(h).ok().unwrap();
        assert!(matches!(r.checkout(h), Err(Fail::Busy(_))));
        assert!(matches!(r.remove(h), Err(Fail::Busy(_))));
        drop(l);
        assert_eq!(r.remove(h).ok(), Some(5));
    }
}
