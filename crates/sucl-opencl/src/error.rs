//! sucl-remote errors as OpenCL error codes, and the guard that keeps panics out of C.

use crate::cl::{self, Int};
use sucl_remote::client::RemoteError;
use sucl_remote::wire::code;

/// The OpenCL code for a failed remote call: the platform's own code when the daemon's
/// OpenCL platform reported one, `fallback` for other refusals, and `CL_OUT_OF_RESOURCES`
/// for a lost or silent daemon.
pub(crate) fn code(e: &RemoteError, fallback: Int) -> Int {
    match e {
        RemoteError::Failed { code: c, .. } => match code::as_opencl(*c) {
            Some(cl) => cl,
            None if *c == code::LIMIT => cl::OUT_OF_RESOURCES,
            None => fallback,
        },
        RemoteError::Invalid(_) => fallback,
        _ => cl::OUT_OF_RESOURCES,
    }
}

/// The message of a failed call (a build log, for a failed build).
pub(crate) fn message(e: &RemoteError) -> String {
    match e {
        RemoteError::Failed { message, .. } => message.clone(),
        other => other.to_string(),
    }
}

/// Logs a failure the application will only see as a code (`SUCL_OPENCL_QUIET` silences it).
pub(crate) fn report(what: &str, e: &RemoteError) {
    if std::env::var_os("SUCL_OPENCL_QUIET").is_none() {
        eprintln!("sucl OpenCL: {what}: {e}");
    }
}

/// Runs `f`, turning a panic into `on_panic` (no panic may cross the C ABI).
pub(crate) fn guard<R>(on_panic: R, f: impl FnOnce() -> R) -> R {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(on_panic)
}

/// Runs `f` for an entry point that returns a code.
pub(crate) fn status(f: impl FnOnce() -> Result<(), Int>) -> Int {
    guard(cl::OUT_OF_HOST_MEMORY, || match f() {
        Ok(()) => cl::SUCCESS,
        Err(e) => e,
    })
}

/// Runs `f` for an entry point that returns an object and writes its code to `errcode_ret`.
pub(crate) fn create(errcode_ret: *mut Int, f: impl FnOnce() -> Result<cl::Handle, Int>) -> cl::Handle {
    let (h, e) = guard((std::ptr::null_mut(), cl::OUT_OF_HOST_MEMORY), || match f() {
        Ok(h) => (h, cl::SUCCESS),
        Err(e) => (std::ptr::null_mut(), e),
    });
    if !errcode_ret.is_null() {
        // SAFETY: the application passed a pointer to a cl_int (or null, checked).
        unsafe { *errcode_ret = e };
    }
    h
}

/// Writes an info answer the OpenCL way: `value` into `param_value` if it has room for it
/// (`CL_INVALID_VALUE` if not), its size into `param_value_size_ret`.
pub(crate) fn answer(value: &[u8], size: usize, out: *mut std::ffi::c_void, size_ret: *mut usize) -> Result<(), Int> {
    if !out.is_null() {
        if size < value.len() {
            return Err(cl::INVALID_VALUE);
        }
        // SAFETY: the application says `out` has `size` bytes, at least value.len().
        unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), out.cast::<u8>(), value.len()) };
    }
    if !size_ret.is_null() {
        // SAFETY: a pointer to a size_t (or null, checked).
        unsafe { *size_ret = value.len() };
    }
    Ok(())
}

/// The bytes of a plain value.
pub(crate) fn bytes<T: Copy>(v: T) -> Vec<u8> {
    // SAFETY: T is a plain Copy value (integers, handles); its bytes are initialized.
    unsafe { std::slice::from_raw_parts((&v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }.to_vec()
}

/// A NUL-terminated string's bytes.
pub(crate) fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}
