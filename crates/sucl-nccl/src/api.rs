//! The functions the shim implements itself (mode `own` in api/nccl-api.txt): group tracking,
//! communicator creation and teardown (sucl's setup and cleanup around the real calls),
//! `ncclAllReduce` (served or forwarded) and `ncclGetLastError`. Each is exported as `ncclX` and
//! as its profiling alias `pncclX`, both calling one private function, so a tool that defines
//! `ncclX` and calls `pncclX` reaches the shim without recursion.

#![allow(non_snake_case)]

use crate::errors::{guard, last_error, real_failed, real_text};
use crate::real;
use crate::serve::{self, CommKey};
use crate::table::idx;
use std::ffi::{c_char, c_int, c_void};

type Comm = *mut c_void;
type Stream = *mut c_void;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    internal: [c_char; 128],
}

/// The real function `$i` of type `$t`, or return its error code (with the text set).
macro_rules! real {
    ($i:expr, $t:ty) => {
        match real::get($i) {
            // SAFETY: the table entry is the real library's function of this signature (nccl.h).
            Ok(p) => unsafe { std::mem::transmute::<usize, $t>(p) },
            Err(code) => return code,
        }
    };
}

/// Exports `$name` and `$pname` with the parameters given, both calling `$imp`.
macro_rules! export {
    ($name:ident, $pname:ident => $imp:ident($($a:ident: $t:ty),*) -> $r:ty) => {
        #[doc = concat!("`", stringify!($name), "` (see docs/guide/nccl-dropin.md).")]
        ///
        /// # Safety
        /// NCCL's contract for this function (nccl.h).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> $r {
            $imp($($a),*)
        }
        #[doc = concat!("`", stringify!($pname), "`: the profiling alias of `", stringify!($name), "`.")]
        ///
        /// # Safety
        /// As the function it aliases.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $pname($($a: $t),*) -> $r {
            $imp($($a),*)
        }
    };
}

/// Notes a real error (so that `ncclGetLastError` answers with the real library's text).
fn seen(rc: c_int) -> c_int {
    if rc != 0 && rc != 7 {
        real_failed();
    }
    rc
}

export!(ncclGetLastError, pncclGetLastError => get_last_error(comm: Comm) -> *const c_char);
fn get_last_error(_comm: Comm) -> *const c_char {
    let answer = || {
        // Loads the real library if this is the first call (NCCL ignores the comm argument).
        if let Err(e) = real::library() {
            crate::errors::fail(crate::errors::ncclSystemError, e);
        }
        last_error(real_text())
    };
    std::panic::catch_unwind(answer).unwrap_or_else(|_| crate::errors::shim_text())
}

export!(ncclGroupStart, pncclGroupStart => group_start() -> c_int);
fn group_start() -> c_int {
    guard("ncclGroupStart", || {
        let f = real!(idx::ncclGroupStart, unsafe extern "C" fn() -> c_int);
        // SAFETY: no arguments.
        let rc = seen(unsafe { f() });
        if rc == 0 {
            serve::group_started();
        }
        rc
    })
}

export!(ncclGroupEnd, pncclGroupEnd => group_end() -> c_int);
fn group_end() -> c_int {
    guard("ncclGroupEnd", || {
        let f = real!(idx::ncclGroupEnd, unsafe extern "C" fn() -> c_int);
        // SAFETY: no arguments.
        let rc = seen(unsafe { f() });
        serve::group_ended(rc, false)
    })
}

export!(ncclGroupSimulateEnd, pncclGroupSimulateEnd => group_simulate_end(info: *mut c_void) -> c_int);
fn group_simulate_end(info: *mut c_void) -> c_int {
    guard("ncclGroupSimulateEnd", || {
        let f = real!(idx::ncclGroupSimulateEnd, unsafe extern "C" fn(*mut c_void) -> c_int);
        // SAFETY: the caller's ncclSimInfo_t, passed on untouched.
        let rc = seen(unsafe { f(info) });
        serve::group_ended(rc, true)
    })
}

/// The blocking mode a config asks for, reading no field past its `size` or newer than its
/// `version` (layout: size_t size; u32 magic; u32 version; int blocking; ...).
///
/// # Safety
/// `config` is null or points at an `ncclConfig_t` whose leading `size` is right.
unsafe fn config_blocking(config: *const c_void) -> Option<bool> {
    if config.is_null() {
        return None;
    }
    // SAFETY: the caller's contract; each read is inside the first `size` bytes.
    unsafe {
        let size = (config as *const usize).read_unaligned();
        if size < 20 {
            return None;
        }
        let version = (config.byte_add(12) as *const u32).read_unaligned();
        let blocking = (config.byte_add(16) as *const c_int).read_unaligned();
        (version >= 21400 && blocking != c_int::MIN).then_some(blocking != 0)
    }
}

/// The communicator just written to `*out`, if any.
///
/// # Safety
/// `out` is null or readable.
unsafe fn made(out: *const Comm) -> CommKey {
    // SAFETY: the caller's contract.
    if out.is_null() {
        0
    } else {
        unsafe { *out as CommKey }
    }
}

export!(ncclCommInitRank, pncclCommInitRank => comm_init_rank(out: *mut Comm, nranks: c_int, id: UniqueId, rank: c_int) -> c_int);
fn comm_init_rank(out: *mut Comm, nranks: c_int, id: UniqueId, rank: c_int) -> c_int {
    guard("ncclCommInitRank", || {
        let f = real!(idx::ncclCommInitRank, unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> c_int);
        // SAFETY: the caller's arguments, passed on untouched.
        let rc = seen(unsafe { f(out, nranks, id, rank) });
        if rc == 0 {
            // SAFETY: NCCL wrote the new communicator to `out`.
            serve::created(unsafe { made(out) }, None, None);
        }
        rc
    })
}

export!(ncclCommInitRankConfig, pncclCommInitRankConfig => comm_init_rank_config(out: *mut Comm, nranks: c_int, id: UniqueId, rank: c_int, config: *mut c_void) -> c_int);
fn comm_init_rank_config(out: *mut Comm, nranks: c_int, id: UniqueId, rank: c_int, config: *mut c_void) -> c_int {
    guard("ncclCommInitRankConfig", || {
        let f = real!(idx::ncclCommInitRankConfig, unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int, *mut c_void) -> c_int);
        // SAFETY: the caller's arguments, passed on untouched.
        let rc = seen(unsafe { f(out, nranks, id, rank, config) });
        if rc == 0 {
            // SAFETY: NCCL accepted the config (so its size is right) and wrote `out`.
            serve::created(unsafe { made(out) }, None, unsafe { config_blocking(config) });
        }
        rc
    })
}

export!(ncclCommSplit, pncclCommSplit => comm_split(comm: Comm, color: c_int, key: c_int, out: *mut Comm, config: *mut c_void) -> c_int);
fn comm_split(comm: Comm, color: c_int, key: c_int, out: *mut Comm, config: *mut c_void) -> c_int {
    guard("ncclCommSplit", || {
        let f = real!(idx::ncclCommSplit, unsafe extern "C" fn(Comm, c_int, c_int, *mut Comm, *mut c_void) -> c_int);
        // SAFETY: the caller's arguments, passed on untouched.
        let rc = seen(unsafe { f(comm, color, key, out, config) });
        if rc == 0 {
            // SAFETY: as for init; a rank split off (NCCL_SPLIT_NOCOLOR) gets NULL: nothing made.
            serve::created(unsafe { made(out) }, Some(comm as CommKey), unsafe { config_blocking(config) });
        }
        rc
    })
}

export!(ncclCommShrink, pncclCommShrink => comm_shrink(comm: Comm, exclude: *mut c_int, n_exclude: c_int, out: *mut Comm, config: *mut c_void, flags: c_int) -> c_int);
fn comm_shrink(comm: Comm, exclude: *mut c_int, n_exclude: c_int, out: *mut Comm, config: *mut c_void, flags: c_int) -> c_int {
    guard("ncclCommShrink", || {
        let f = real!(idx::ncclCommShrink, unsafe extern "C" fn(Comm, *mut c_int, c_int, *mut Comm, *mut c_void, c_int) -> c_int);
        // SAFETY: the caller's arguments, passed on untouched.
        let rc = seen(unsafe { f(comm, exclude, n_exclude, out, config, flags) });
        if rc == 0 {
            // SAFETY: as for split.
            serve::created(unsafe { made(out) }, Some(comm as CommKey), unsafe { config_blocking(config) });
        }
        rc
    })
}

export!(ncclCommGrow, pncclCommGrow => comm_grow(comm: Comm, nranks: c_int, id: *const UniqueId, rank: c_int, out: *mut Comm, config: *mut c_void) -> c_int);
fn comm_grow(comm: Comm, nranks: c_int, id: *const UniqueId, rank: c_int, out: *mut Comm, config: *mut c_void) -> c_int {
    guard("ncclCommGrow", || {
        let f = real!(idx::ncclCommGrow, unsafe extern "C" fn(Comm, c_int, *const UniqueId, c_int, *mut Comm, *mut c_void) -> c_int);
        // SAFETY: the caller's arguments, passed on untouched.
        let rc = seen(unsafe { f(comm, nranks, id, rank, out, config) });
        if rc == 0 {
            // SAFETY: as for split.
            serve::created(unsafe { made(out) }, Some(comm as CommKey), unsafe { config_blocking(config) });
        }
        rc
    })
}

export!(ncclCommDestroy, pncclCommDestroy => comm_destroy(comm: Comm) -> c_int);
fn comm_destroy(comm: Comm) -> c_int {
    guard("ncclCommDestroy", || {
        let f = real!(idx::ncclCommDestroy, unsafe extern "C" fn(Comm) -> c_int);
        serve::forget(comm as CommKey, false);
        // SAFETY: the caller's communicator, passed on.
        seen(unsafe { f(comm) })
    })
}

export!(ncclCommAbort, pncclCommAbort => comm_abort(comm: Comm) -> c_int);
fn comm_abort(comm: Comm) -> c_int {
    guard("ncclCommAbort", || {
        let f = real!(idx::ncclCommAbort, unsafe extern "C" fn(Comm) -> c_int);
        // SAFETY: the caller's communicator, passed on. NCCL's kernels stop first, then ours.
        let rc = seen(unsafe { f(comm) });
        serve::forget(comm as CommKey, true);
        rc
    })
}

export!(ncclCommRevoke, pncclCommRevoke => comm_revoke(comm: Comm, flags: c_int) -> c_int);
fn comm_revoke(comm: Comm, flags: c_int) -> c_int {
    guard("ncclCommRevoke", || {
        let f = real!(idx::ncclCommRevoke, unsafe extern "C" fn(Comm, c_int) -> c_int);
        // SAFETY: the caller's arguments, passed on.
        let rc = seen(unsafe { f(comm, flags) });
        // A revoked communicator serves nothing more through sucl.
        serve::forget(comm as CommKey, true);
        rc
    })
}

export!(ncclAllReduce, pncclAllReduce => all_reduce(send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, op: c_int, comm: Comm, stream: Stream) -> c_int);
fn all_reduce(send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, op: c_int, comm: Comm, stream: Stream) -> c_int {
    guard("ncclAllReduce", || {
        if let Some(rc) = serve::all_reduce(send as u64, recv as u64, count, dtype, op, comm as CommKey, stream as usize) {
            return rc;
        }
        let f = real!(idx::ncclAllReduce, unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int);
        // SAFETY: the caller's arguments, passed on untouched.
        seen(unsafe { f(send, recv, count, dtype, op, comm, stream) })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The leading fields of `ncclConfig_t` (every version has them).
    #[repr(C)]
    struct ConfigHead {
        size: usize,
        magic: u32,
        version: u32,
        blocking: c_int,
    }

    fn blocking_of(size: usize, version: u32, blocking: c_int) -> Option<bool> {
        let c = ConfigHead { size, magic: 0xcafebeef, version, blocking };
        // SAFETY: `c` is a live value whose leading fields are those read.
        unsafe { config_blocking(&c as *const ConfigHead as *const c_void) }
    }

    #[test]
    fn the_blocking_mode_is_read_only_where_the_config_has_it() {
        assert_eq!(blocking_of(80, 22809, 0), Some(false), "2.28's config, non-blocking");
        assert_eq!(blocking_of(96, 23007, 1), Some(true));
        assert_eq!(blocking_of(80, 22809, c_int::MIN), None, "NCCL_CONFIG_UNDEF_INT: NCCL's default");
        assert_eq!(blocking_of(80, 21300, 0), None, "older than 2.14: no blocking field yet");
        assert_eq!(blocking_of(16, 22809, 0), None, "a size that ends before the field");
        // SAFETY: a null config is allowed.
        assert_eq!(unsafe { config_blocking(std::ptr::null()) }, None);
    }
}
