//! NCCL's result codes and the shim's last-error text.
//!
//! NCCL keeps one process-wide 1024-byte buffer for `ncclGetLastError` (whatever the comm
//! argument), read by PyTorch's watchdog thread among others; the shim keeps its own of the same
//! shape and answers from it while the shim made the most recent error it knows of.

use std::cell::UnsafeCell;
use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicBool, Ordering};
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
    SHIM_MADE_LAST.store(true, Ordering::Release);
    code
}

/// Notes that the real library reported an error after the shim's own: from now on
/// `ncclGetLastError` answers with the real library's text.
pub fn real_failed() {
    SHIM_MADE_LAST.store(false, Ordering::Release);
}

/// The shim's last-error text, if the shim made the most recent error it knows of.
pub fn shim_last_error() -> Option<*const c_char> {
    SHIM_MADE_LAST.load(Ordering::Acquire).then(|| LAST.text.get() as *const c_char)
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
    use std::ffi::CStr;

    #[test]
    fn the_last_error_is_kept_truncated_and_a_panic_becomes_an_internal_error() {
        assert_eq!(fail(ncclInvalidUsage, "no such function"), ncclInvalidUsage);
        let p = shim_last_error().expect("the shim made the last error");
        // SAFETY: the buffer is static and NUL-terminated.
        assert_eq!(unsafe { CStr::from_ptr(p) }.to_str().unwrap(), "no such function");
        fail(ncclInternalError, &"x".repeat(5000));
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(shim_text()) }.to_bytes().len(), LEN - 1);
        assert_eq!(guard("a test", || panic!("boom")), ncclInternalError);
        // SAFETY: as above.
        let s = unsafe { CStr::from_ptr(shim_text()) }.to_str().unwrap().to_string();
        assert!(s.contains("a test") && s.contains("boom"), "{s}");
        real_failed();
        assert!(shim_last_error().is_none());
    }
}
