//! C buffers to Rust slices: a `(pointer, count)` pair is checked (null, count × element size
//! overflowing or past `isize::MAX`, misalignment, wrapping the address space) before any slice
//! is made, and a send buffer that overlaps the receive buffer is copied first (Rust may not
//! hold `&[T]` and `&mut [T]` over the same bytes), which is also what makes every in-place
//! form of the C API work.

use crate::error::Fail;
use std::ffi::c_void;
use std::ptr::NonNull;
use sucl::Element;

/// A checked C buffer: `count` elements of `T` at `ptr` (which is non-null and aligned, or the
/// buffer is empty).
pub(crate) struct Region<T> {
    ptr: *mut T,
    count: usize,
}

impl<T: Element> Region<T> {
    /// Checks `count` elements of `T` at `ptr`, the argument named `arg`.
    pub(crate) fn new(arg: &'static str, ptr: *const c_void, count: usize) -> Result<Self, Fail> {
        let size = std::mem::size_of::<T>();
        let bytes = count
            .checked_mul(size)
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| Fail::arg(arg, format!("{count} elements of {size} bytes do not fit in memory")))?;
        if ptr.is_null() {
            if count > 0 {
                return Err(Fail::arg(arg, format!("is NULL but must hold {count} elements")));
            }
            return Ok(Region { ptr: NonNull::<T>::dangling().as_ptr(), count: 0 });
        }
        if !ptr.cast::<T>().is_aligned() {
            return Err(Fail::arg(arg, format!("{ptr:p} is not aligned for {} ({} bytes)", T::DTYPE, std::mem::align_of::<T>())));
        }
        if (ptr as usize).checked_add(bytes).is_none() {
            return Err(Fail::arg(arg, format!("{ptr:p} + {bytes} bytes wraps around the address space")));
        }
        Ok(Region { ptr: ptr as *mut T, count })
    }

    /// A region that a rank does not use (non-root buffers of rooted collectives): any pointer,
    /// NULL included, becomes an empty buffer.
    pub(crate) fn unused() -> Self {
        Region { ptr: NonNull::<T>::dangling().as_ptr(), count: 0 }
    }

    fn span(&self) -> (usize, usize) {
        let start = self.ptr as usize;
        (start, start + self.count * std::mem::size_of::<T>())
    }

    /// Whether the two regions share a byte.
    pub(crate) fn overlaps(&self, other: &Region<T>) -> bool {
        let ((a0, a1), (b0, b1)) = (self.span(), other.span());
        a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1
    }

    /// Whether the region starts where `other` starts, `offset` elements in.
    pub(crate) fn starts_at(&self, other: &Region<T>, offset: usize) -> bool {
        offset.checked_mul(std::mem::size_of::<T>()).and_then(|o| (other.ptr as usize).checked_add(o)) == Some(self.ptr as usize)
    }

    /// The elements, for reading.
    ///
    /// # Safety
    /// The C caller's contract: the memory is valid for reads of `count` elements and nobody
    /// writes it while the slice lives (no `&mut` made by [`Region::slice_mut`] overlaps it).
    pub(crate) unsafe fn slice<'a>(&self) -> &'a [T] {
        // SAFETY: non-null and aligned (checked in `new`, dangling when empty), in bounds of
        // one allocation by the caller's contract, size ≤ isize::MAX (checked in `new`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.count) }
    }

    /// The elements, for writing.
    ///
    /// # Safety
    /// The C caller's contract: the memory is valid for writes of `count` elements, and no other
    /// slice of it lives meanwhile (overlapping inputs go through [`Input::of`] first).
    pub(crate) unsafe fn slice_mut<'a>(&self) -> &'a mut [T] {
        // SAFETY: as in `slice`, and exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.count) }
    }
}

/// A send buffer as a call reads it: borrowed, or copied when it overlaps the receive buffer.
pub(crate) enum Input<'a, T> {
    Borrowed(&'a [T]),
    Copied(Vec<T>),
}

impl<'a, T: Element> Input<'a, T> {
    /// `send`, borrowed when it shares no byte with `recv`, else copied.
    ///
    /// # Safety
    /// As [`Region::slice`] for `send`; `recv` is only compared, not read.
    pub(crate) unsafe fn of(send: &Region<T>, recv: &Region<T>) -> Input<'a, T> {
        // SAFETY: forwarded to the caller; when the regions overlap the copy is made before
        // any `&mut` over `recv` exists.
        let s = unsafe { send.slice() };
        if send.overlaps(recv) {
            Input::Copied(s.to_vec())
        } else {
            Input::Borrowed(s)
        }
    }
}

impl<T> std::ops::Deref for Input<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Input::Borrowed(s) => s,
            Input::Copied(v) => v,
        }
    }
}

/// Reads a C array of `len` `size_t` values (a counts or displacements table).
///
/// # Safety
/// `ptr` must be valid for reads of `len` values (checked for NULL and overflow here).
pub(crate) unsafe fn table<'a>(arg: &'static str, ptr: *const usize, len: usize) -> Result<&'a [usize], Fail> {
    // `usize` has the size and alignment of `u64` here (checked below at compile time), so
    // the checks for a `u64` buffer are the checks for this one.
    Region::<u64>::new(arg, ptr as *const c_void, len)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: non-null, aligned and in range (checked just above); validity of the memory for
    // `len` reads is the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

const _: () = assert!(
    std::mem::size_of::<usize>() == 8 && std::mem::align_of::<usize>() == std::mem::align_of::<u64>(),
    "sucl's C API is built for 64-bit targets"
);

/// The number of elements a buffer with blocks `counts[i]` at `displs[i]` must hold: the end of
/// its last block (checked arithmetic).
pub(crate) fn extent(arg: &'static str, counts: impl Iterator<Item = usize>, displs: &[usize]) -> Result<usize, Fail> {
    let mut end = 0usize;
    for (i, c) in counts.enumerate() {
        let d = *displs.get(i).ok_or_else(|| Fail::arg(arg, "shorter than the counts table"))?;
        let e = d.checked_add(c).ok_or_else(|| Fail::arg(arg, format!("block {i} ends past the address space ({d} + {c})")))?;
        end = end.max(e);
    }
    Ok(end)
}

/// An output parameter (`T *out`), checked before the call does any work and written once it
/// succeeded.
pub(crate) struct Out<T> {
    ptr: *mut T,
}

impl<T> Out<T> {
    pub(crate) fn new(arg: &'static str, ptr: *mut T) -> Result<Self, Fail> {
        if ptr.is_null() {
            return Err(Fail::arg(arg, "is NULL (an output parameter)"));
        }
        if !ptr.cast::<T>().is_aligned() {
            return Err(Fail::arg(arg, format!("{ptr:p} is misaligned")));
        }
        Ok(Out { ptr })
    }

    /// An output parameter that may be NULL (the caller does not want the value).
    pub(crate) fn optional(arg: &'static str, ptr: *mut T) -> Result<Option<Self>, Fail> {
        if ptr.is_null() {
            Ok(None)
        } else {
            Out::new(arg, ptr).map(Some)
        }
    }

    pub(crate) fn set(self, value: T) {
        // SAFETY: non-null and aligned (checked in `new`); valid for a write by the C caller's
        // contract for output parameters.
        unsafe { self.ptr.write(value) }
    }
}

/// Reads a NUL-terminated C string argument.
///
/// # Safety
/// `ptr` is NULL or points to a NUL-terminated string that stays valid during the call.
pub(crate) unsafe fn c_str(arg: &'static str, ptr: *const std::ffi::c_char) -> Result<Option<String>, Fail> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let s = unsafe { std::ffi::CStr::from_ptr(ptr) };
    s.to_str().map(|s| Some(s.to_string())).map_err(|_| Fail::arg(arg, "is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(ptr: usize, count: usize) -> Result<Region<u32>, Fail> {
        Region::<u32>::new("buf", ptr as *const c_void, count)
    }

    #[test]
    fn bad_buffers_are_refused_before_any_slice_exists() {
        assert!(matches!(region(0, 1), Err(Fail::Arg { .. })));
        assert!(region(0, 0).is_ok());
        assert!(matches!(region(0x1002, 1), Err(Fail::Arg { .. })), "misaligned");
        assert!(matches!(region(0x1000, usize::MAX / 2), Err(Fail::Arg { .. })), "overflowing size");
        assert!(matches!(region(usize::MAX - 7, 4), Err(Fail::Arg { .. })), "wrapping the address space");
    }

    #[test]
    fn overlap_and_offsets() {
        let (a, b) = (region(0x1000, 4).ok().unwrap(), region(0x1008, 4).ok().unwrap());
        assert!(a.overlaps(&b) && b.overlaps(&a));
        let c = region(0x1010, 4).ok().unwrap();
        assert!(!a.overlaps(&c));
        assert!(!a.overlaps(&region(0x1000, 0).ok().unwrap()), "an empty buffer overlaps nothing");
        assert!(b.starts_at(&a, 2) && !b.starts_at(&a, 1));
        assert!(!b.starts_at(&a, usize::MAX), "an offset that overflows matches nothing");
    }

    #[test]
    fn an_overlapping_input_is_copied() {
        let mut v = [1u32, 2, 3, 4];
        let p = v.as_mut_ptr() as usize;
        let (s, r) = (region(p, 3).ok().unwrap(), region(p + 4, 3).ok().unwrap());
        // SAFETY: `v` lives through the test and nothing writes it while `input` is read.
        let input = unsafe { Input::of(&s, &r) };
        assert!(matches!(input, Input::Copied(_)));
        assert_eq!(&*input, &[1, 2, 3]);
    }

    #[test]
    fn extent_is_the_end_of_the_last_block() {
        assert_eq!(extent("displs", [2, 3].into_iter(), &[5, 0]).ok(), Some(7));
        assert!(matches!(extent("displs", [1].into_iter(), &[usize::MAX]), Err(Fail::Arg { .. })));
        assert!(matches!(extent("displs", [1, 1].into_iter(), &[0]), Err(Fail::Arg { .. })));
    }
}
