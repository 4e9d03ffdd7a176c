//! NCCL's result codes and the shim's last-error text.
//!
//! NCCL keeps one process-wide 1024-byte buffer for `ncclGetLastError` (whatever the comm
//! argument), read by PyTorch's watchdog thread among others; the shim keeps its own of the same
//! shape and answers from it while the shim made the most recent error: when the shim records an
//! error it also keeps a copy of the real library's text at that moment, and once the real text
//! differs from that copy (or an own function saw the real library fail), the real one is newer.

use std::cell::UnsafeCell;
use std::ffi::CStr;
use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// `ncclSuccess`.
#[allow(non_upper_case_globals)]
pub const ncclSuccess: c_int = 0;
/// `ncclSystemError`: the real library could not be loaded.
#[allow(non_upper_case_globals)]
pub const ncclSystemError: c_int = 2;
/// `ncclInternalError`: a failure inside the shim.
#[allow(non_upper_case_globals)]
pub const ncclInternalError: c_int = 3;
/// `ncclInvalidArgument`.
#[allow(non_upper_case_globals)]
pub const ncclInvalidArgument: c_int = 4;
/// `ncclInvalidUsage`: the loaded real library lacks the function called.
#[allow(non_upper_case_globals)]
pub const ncclInvalidUsage: c_int = 5;

const LEN: usize = 1024;

struct Buffer {
    text: UnsafeCell<[u8; LEN]>,
    write: Mutex<()>,
}

// SAFETY: writers hold `write`; readers get a pointer to a NUL-terminated buffer that is never
// freed (as with NCCL's own buffer, a reader racing a writer may see a mix of two messages, but
// always a terminating NUL within the buffer: the last byte is never written).
unsafe impl Sync for Buffer {}

static LAST: Buffer = Buffer { text: UnsafeCell::new([0; LEN]), write: Mutex::new(()) };
static SHIM_MADE_LAST: AtomicBool = AtomicBool::new(false);
/// The real library's text when the shim last recorded an error.
static REAL_AT_SHIM_ERROR: Mutex<Vec<u8>> = Mutex::new(Vec::new());
/// The real `ncclGetLastError`, once the real library is loaded (0 before).
static REAL_GETTER: AtomicUsize = AtomicUsize::new(0);

/// Tells this module where the real `ncclGetLastError` is (`addr` 0: nowhere).
pub fn set_real_getter(addr: usize) {
    REAL_GETTER.store(addr, Ordering::Release);
}

/// The real library's last-error text, if it is loaded and has the function.
pub fn real_text() -> Option<*const c_char> {
    match REAL_GETTER.load(Ordering::Acquire) {
        0 => None,
        p => {
            // SAFETY: `p` is the real ncclGetLastError(ncclComm_t) -> const char*, which ignores
            // its argument and returns a static buffer.
            let f: unsafe extern "C" fn(*mut std::ffi::c_void) -> *const c_char = unsafe { std::mem::transmute(p) };
            Some(unsafe { f(std::ptr::null_mut()) }).filter(|t| !t.is_null())
        }
    }
}

fn bytes_of(text: *const c_char) -> Vec<u8> {
    // SAFETY: `text` is a non-null, NUL-terminated string (the real library's buffer).
    unsafe { CStr::from_ptr(text) }.to_bytes().to_vec()
}

/// Records `msg` as the last error (truncated to 1023 bytes) and returns `code`.
pub fn fail(code: c_int, msg: &str) -> c_int {
    let _g = LAST.write.lock().unwrap_or_else(|e| e.into_inner());
    let n = msg.len().min(LEN - 1);
    // SAFETY: the writer lock is held; the copy stays inside the buffer and leaves its last byte 0.
    unsafe {
        let buf = &mut *LAST.text.get();
        buf[..n].copy_from_slice(&msg.as_bytes()[..n]);
        buf[n] = 0;
    }
    *REAL_AT_SHIM_ERROR.lock().unwrap_or_else(|e| e.into_inner()) = real_text().map(bytes_of).unwrap_or_default();
    SHIM_MADE_LAST.store(true, Ordering::Release);
    code
}

/// Notes that the real library reported an error after the shim's own: from now on
/// `ncclGetLastError` answers with the real library's text.
pub fn real_failed() {
    SHIM_MADE_LAST.store(false, Ordering::Release);
}

/// What `ncclGetLastError` answers: the shim's text while the shim made the most recent error,
/// else the real library's (`real`: its current text, None when there is no real library).
pub fn last_error(real: Option<*const c_char>) -> *const c_char {
    if SHIM_MADE_LAST.load(Ordering::Acquire) {
        let unchanged = match real {
            None => true,
            Some(t) => *REAL_AT_SHIM_ERROR.lock().unwrap_or_else(|e| e.into_inner()) == bytes_of(t),
        };
        if unchanged {
            return shim_text();
        }
        real_failed();
    }
    real.unwrap_or_else(shim_text)
}

/// The shim's text whatever made the last error (for when there is no real library to ask).
pub fn shim_text() -> *const c_char {
    LAST.text.get() as *const c_char
}

/// Runs `f`, turning a panic into `ncclInternalError` with a message: no panic crosses the C
/// boundary.
pub fn guard(what: &str, f: impl FnOnce() -> c_int) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(code) => code,
        Err(p) => {
            let why = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_default();
            fail(ncclInternalError, &format!("sucl-nccl: internal failure in {what}: {why}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_error_is_kept_truncated_and_a_panic_becomes_an_internal_error() {
        assert_eq!(fail(ncclInvalidUsage, "no such function"), ncclInvalidUsage);
        let real = c"real text";
        // SAFETY: the buffer is static and NUL-terminated.
        assert_eq!(unsafe { CStr::from_ptr(last_error(None)) }.to_str().unwrap(), "no such function");
        // No real getter was set: the real text at the shim's error was empty, so any real text
        // now is newer.
        assert_eq!(last_error(Some(real.as_ptr())), real.as_ptr());
        assert_eq!(last_error(None), shim_text(), "no real library: the shim's text");
        fail(ncclInternalError, &"x".repeat(5000));
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(shim_text()) }.to_bytes().len(), LEN - 1);
        assert_eq!(guard("a test", || panic!("boom")), ncclInternalError);
        // SAFETY: as above.
        let s = unsafe { CStr::from_ptr(shim_text()) }.to_str().unwrap().to_string();
        assert!(s.contains("a test") && s.contains("boom"), "{s}");
        assert_eq!(last_error(Some(c"".as_ptr())), shim_text(), "the real text is as it was: the shim's is newer");
        real_failed();
        assert_eq!(last_error(Some(real.as_ptr())), real.as_ptr());
    }
}
