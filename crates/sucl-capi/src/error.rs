//! Errors at the C boundary: every entry point runs inside [`entry`], which turns a sucl error,
//! a binding-level rejection or a caught panic into a result code and keeps the message for
//! `sucl_last_error()` (per thread).

use crate::types::*;
use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Why a C call failed.
pub(crate) enum Fail {
    /// An error from sucl itself.
    Sucl(sucl::Error),
    /// An argument the binding rejects before calling sucl (null, unknown code, overflow).
    Arg { arg: &'static str, why: String },
    /// A dead or foreign handle.
    Handle(String),
    /// An object in use elsewhere.
    Busy(String),
}

impl Fail {
    pub(crate) fn arg(arg: &'static str, why: impl Into<String>) -> Fail {
        Fail::Arg { arg, why: why.into() }
    }

    fn code(&self) -> sucl_result {
        use sucl::Error as E;
        match self {
            Fail::Arg { .. } => SUCL_ERR_INVALID_ARGUMENT,
            Fail::Handle(_) => SUCL_ERR_INVALID_HANDLE,
            Fail::Busy(_) => SUCL_ERR_BUSY,
            Fail::Sucl(e) => match e {
                E::InvalidArgument { .. } => SUCL_ERR_INVALID_ARGUMENT,
                E::LostPeer { .. } => SUCL_ERR_LOST_PEER,
                E::Timeout { .. } => SUCL_ERR_TIMEOUT,
                E::Mismatch { .. } => SUCL_ERR_MISMATCH,
                E::Unusable { .. } => SUCL_ERR_UNUSABLE,
                E::BackendUnavailable { .. } => SUCL_ERR_BACKEND_UNAVAILABLE,
                E::Config(_) => SUCL_ERR_CONFIG,
                E::Protocol { .. } => SUCL_ERR_PROTOCOL,
                E::Aborted { .. } => SUCL_ERR_ABORTED,
                E::Io { .. } => SUCL_ERR_IO,
            },
        }
    }

    fn message(&self) -> String {
        match self {
            Fail::Sucl(e) => e.to_string(),
            Fail::Arg { arg, why } => format!("invalid argument `{arg}`: {why}"),
            Fail::Handle(s) | Fail::Busy(s) => s.clone(),
        }
    }
}

impl From<sucl::Error> for Fail {
    fn from(e: sucl::Error) -> Fail {
        Fail::Sucl(e)
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    // A message with an interior NUL (from an OS error, say) is cut there rather than lost.
    let cut = msg.split('\0').next().unwrap_or("");
    let c = CString::new(cut).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs one C entry point: `f`'s error becomes a code and the thread's last error; a panic is
/// caught here (it never unwinds into C) and becomes `SUCL_ERR_INTERNAL`.
pub(crate) fn entry(f: impl FnOnce() -> Result<(), Fail>) -> sucl_result {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            set_last_error("");
            SUCL_OK
        }
        Ok(Err(fail)) => {
            set_last_error(&fail.message());
            fail.code()
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("internal error (a bug in sucl): {what}"));
            SUCL_ERR_INTERNAL
        }
    }
}

/// The message of the last failed sucl call on this thread ("" after a call that succeeded).
///
/// Thread safety: per thread; any thread may call it. Ownership: the string belongs to sucl and
/// stays valid until this thread's next sucl call; copy it to keep it. Never NULL.
#[no_mangle]
pub extern "C" fn sucl_last_error() -> *const c_char {
    // `with` fails only during thread teardown; a static empty string is returned then.
    LAST_ERROR.try_with(|e| e.borrow().as_ptr()).unwrap_or(c"".as_ptr())
}

/// A short constant name for a result code (`"SUCL_ERR_TIMEOUT"`), or `"unknown"`.
///
/// Thread safety: any thread. Ownership: a static string; never free it. Never NULL.
#[no_mangle]
pub extern "C" fn sucl_result_name(code: sucl_result) -> *const c_char {
    let s: &'static std::ffi::CStr = match code {
        SUCL_OK => c"SUCL_OK",
        SUCL_ERR_INVALID_ARGUMENT => c"SUCL_ERR_INVALID_ARGUMENT",
        SUCL_ERR_INVALID_HANDLE => c"SUCL_ERR_INVALID_HANDLE",
        SUCL_ERR_BUSY => c"SUCL_ERR_BUSY",
        SUCL_ERR_LOST_PEER => c"SUCL_ERR_LOST_PEER",
        SUCL_ERR_TIMEOUT => c"SUCL_ERR_TIMEOUT",
        SUCL_ERR_MISMATCH => c"SUCL_ERR_MISMATCH",
        SUCL_ERR_BACKEND_UNAVAILABLE => c"SUCL_ERR_BACKEND_UNAVAILABLE",
        SUCL_ERR_CONFIG => c"SUCL_ERR_CONFIG",
        SUCL_ERR_PROTOCOL => c"SUCL_ERR_PROTOCOL",
        SUCL_ERR_ABORTED => c"SUCL_ERR_ABORTED",
        SUCL_ERR_IO => c"SUCL_ERR_IO",
        SUCL_ERR_INTERNAL => c"SUCL_ERR_INTERNAL",
        SUCL_ERR_UNUSABLE => c"SUCL_ERR_UNUSABLE",
        _ => c"unknown",
    };
    s.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: sucl_last_error returns a valid NUL-terminated string owned by this thread.
        unsafe { CStr::from_ptr(sucl_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn a_panic_becomes_an_internal_error_with_its_message() {
        let rc = entry(|| panic!("boom in a test"));
        assert_eq!(rc, SUCL_ERR_INTERNAL);
        assert!(last().contains("boom in a test"), "{}", last());
    }

    #[test]
    fn the_last_error_is_per_thread_and_cleared_by_a_success() {
        assert_eq!(entry(|| Err(Fail::arg("count", "too big"))), SUCL_ERR_INVALID_ARGUMENT);
        assert_eq!(last(), "invalid argument `count`: too big");
        let other = std::thread::spawn(last).join().unwrap();
        assert_eq!(other, "");
        assert_eq!(entry(|| Ok(())), SUCL_OK);
        assert_eq!(last(), "");
    }

    #[test]
    fn sucl_errors_keep_their_kind() {
        let e = sucl::Error::Timeout { rank: 2, op: "recv".into(), after: std::time::Duration::from_secs(1) };
        assert_eq!(entry(|| Err(e.into())), SUCL_ERR_TIMEOUT);
        assert!(last().starts_with("rank 2: recv timed out"), "{}", last());
    }
}
