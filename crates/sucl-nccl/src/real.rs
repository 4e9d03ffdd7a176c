//! Finding and loading the real NCCL, and resolving the table's functions in it.
//!
//! The real library is opened by absolute path (RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) and never
//! closed (NCCL keeps threads): by the name this library carries, the loader would hand back this
//! library itself. In order: `SUCL_NCCL_REAL_PATH` (nothing else when set); a libnccl already
//! loaded by absolute path (PyTorch preloads the nvidia-nccl wheel's); the wheel beside a loaded
//! `libtorch_cuda.so`; `LD_LIBRARY_PATH`; the system's library directories. A candidate that is
//! this very file is skipped.

use crate::errors::{fail, ncclInvalidUsage, ncclSystemError};
use crate::settings;
use crate::table::{Ret, COUNT, NAMES, RETURNS};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Each function's address in the real library, by table index (0 until loaded, or missing).
/// The trampolines jump through these.
pub static SLOTS: [AtomicUsize; COUNT] = [const { AtomicUsize::new(0) }; COUNT];

/// The loaded real library.
pub struct Real {
    /// Where it was loaded from.
    pub path: String,
    /// Its `ncclGetVersion` code, if it answered.
    pub version: Option<c_int>,
}

static REAL: OnceLock<Result<Real, String>> = OnceLock::new();

/// The real library, loaded (and every slot resolved) at the first call.
pub fn library() -> Result<&'static Real, &'static str> {
    REAL.get_or_init(load).as_ref().map_err(|e| e.as_str())
}

/// The real address of table function `idx`, or the error code to return (with the last-error
/// text set) when the real library is missing or lacks the function.
pub fn get(idx: usize) -> Result<usize, c_int> {
    match library() {
        Ok(real) => match SLOTS[idx].load(Ordering::Acquire) {
            0 => Err(fail(ncclInvalidUsage, &lacks(real, idx))),
            p => Ok(p),
        },
        Err(e) => Err(fail(ncclSystemError, e)),
    }
}

fn lacks(real: &Real, idx: usize) -> String {
    format!(
        "sucl-nccl: {} is not in the real NCCL {}({}): it needs a newer NCCL",
        NAMES[idx].to_string_lossy(),
        real.version.map(|v| format!("{} ", version_string(v))).unwrap_or_default(),
        real.path
    )
}

/// "2.28.9" for NCCL's version code 22809 (and "2.8.4" for the old encoding 2804).
pub fn version_string(code: c_int) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, code / 100 % 10, code % 100)
    }
}

/// Called by the trampolines' slow path (a slot still 0): loads the library if needed and
/// returns where to jump — the real function, or a stand-in that returns an error.
pub extern "C" fn resolve_slot(idx: usize) -> usize {
    let idx = idx.min(COUNT - 1);
    std::panic::catch_unwind(|| match get(idx) {
        Ok(p) => p,
        Err(_) => stand_in(RETURNS[idx], library().is_ok()),
    })
    .unwrap_or_else(|_| stand_in(RETURNS[idx], false))
}

extern "C" fn missing_result() -> c_int {
    ncclInvalidUsage
}
extern "C" fn unloaded_result() -> c_int {
    ncclSystemError
}
extern "C" fn missing_string() -> *const c_char {
    crate::errors::shim_text()
}
extern "C" fn missing_void() {}
extern "C" fn missing_int() -> c_int {
    -1
}
/// `ncclTeam_t`: `{int nRanks, rank, stride}`, returned in registers.
#[repr(C)]
pub struct Team {
    n_ranks: c_int,
    rank: c_int,
    stride: c_int,
}
extern "C" fn missing_team() -> Team {
    Team { n_ranks: 0, rank: 0, stride: 0 }
}

/// The stand-in for a function that cannot be forwarded (it ignores its arguments, so it can be
/// jumped to whatever the signature).
fn stand_in(ret: Ret, loaded: bool) -> usize {
    match ret {
        Ret::Result if loaded => missing_result as *const () as usize,
        Ret::Result => unloaded_result as *const () as usize,
        Ret::Str => missing_string as *const () as usize,
        Ret::Void => missing_void as *const () as usize,
        Ret::Int => missing_int as *const () as usize,
        Ret::Team => missing_team as *const () as usize,
    }
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl* call on
    // this thread; it is copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

/// (device, inode) of a file.
fn file_id(path: &str) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        (m.dev(), m.ino())
    })
}

/// This library's own file.
fn own_path() -> Option<String> {
    // SAFETY: dladdr only reads the loader's tables; `info` is a live local it fills; the name
    // it returns is copied at once.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(resolve_slot as *const c_void, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        Some(CStr::from_ptr(info.dli_fname).to_string_lossy().into_owned())
    }
}

/// Paths of every object loaded in the process.
fn loaded_objects() -> Vec<String> {
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid info for the call; `data` is the Vec handed to
        // dl_iterate_phdr below, alive for its whole duration.
        unsafe {
            let v = &mut *(data as *mut Vec<String>);
            let name = (*info).dlpi_name;
            if !name.is_null() && *name != 0 {
                v.push(CStr::from_ptr(name).to_string_lossy().into_owned());
            }
        }
        0
    }
    let mut v: Vec<String> = Vec::new();
    // SAFETY: the callback only reads the info it is given and pushes onto `v`.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut v as *mut Vec<String> as *mut c_void) };
    v
}

fn base_name(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// Where to look for the real library, in order (without the explicit setting).
fn candidates() -> Vec<String> {
    let loaded = loaded_objects();
    let mut c: Vec<String> = loaded.iter().filter(|p| base_name(p).starts_with("libnccl.so")).cloned().collect();
    for p in loaded.iter().filter(|p| base_name(p) == "libtorch_cuda.so") {
        if let Some(dir) = p.rsplit_once('/').map(|(d, _)| d) {
            c.push(format!("{dir}/../../nvidia/nccl/lib/libnccl.so.2"));
        }
    }
    if let Ok(lp) = std::env::var("LD_LIBRARY_PATH") {
        c.extend(lp.split(':').filter(|d| d.starts_with('/')).map(|d| format!("{d}/libnccl.so.2")));
    }
    for d in ["/usr/lib/x86_64-linux-gnu", "/usr/local/cuda/lib64", "/usr/lib64", "/usr/local/lib", "/usr/lib", "/usr/local/nccl/lib"] {
        c.push(format!("{d}/libnccl.so.2"));
    }
    c
}

fn open(path: &str) -> Result<*mut c_void, String> {
    let c = CString::new(path).map_err(|_| format!("{path:?}: a NUL in the path"))?;
    // SAFETY: `c` is NUL-terminated and outlives the call; RTLD_NODELETE keeps the object mapped
    // for the process's life, so addresses taken from it stay valid.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_NODELETE) };
    if h.is_null() {
        Err(format!("{path}: {}", dlerror_text()))
    } else {
        Ok(h)
    }
}

fn load() -> Result<Real, String> {
    let s = settings::get();
    if let Some(e) = &s.error {
        return Err(format!("sucl-nccl: {e}"));
    }
    let own = own_path().and_then(|p| file_id(&p));
    let (handle, path) = match &s.real_path {
        Some(p) => {
            if file_id(p).is_some() && file_id(p) == own {
                return Err(format!("sucl-nccl: SUCL_NCCL_REAL_PATH={p} is this drop-in library itself, not the real NCCL"));
            }
            (open(p).map_err(|e| format!("sucl-nccl: cannot load the real NCCL (SUCL_NCCL_REAL_PATH): {e}"))?, p.clone())
        }
        None => {
            let mut tried = vec![];
            let mut found = None;
            for p in candidates() {
                let id = file_id(&p);
                if id.is_none() || id == own || tried.contains(&p) {
                    continue;
                }
                match open(&p) {
                    Ok(h) => {
                        found = Some((h, p));
                        break;
                    }
                    Err(e) => tried.push(e),
                }
            }
            found.ok_or_else(|| {
                format!(
                    "sucl-nccl: no real NCCL found (set SUCL_NCCL_REAL_PATH to its libnccl.so.2){}",
                    if tried.is_empty() { String::new() } else { format!("; tried: {}", tried.join("; ")) }
                )
            })?
        }
    };
    for (i, name) in NAMES.iter().enumerate() {
        // SAFETY: `handle` is a live dlopen handle (never closed); `name` is NUL-terminated.
        let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
        SLOTS[i].store(p as usize, Ordering::Release);
    }
    crate::errors::set_real_getter(SLOTS[crate::table::idx::ncclGetLastError].load(Ordering::Acquire));
    let version = match SLOTS[crate::table::idx::ncclGetVersion].load(Ordering::Acquire) {
        0 => None,
        p => {
            let mut v: c_int = 0;
            // SAFETY: `p` is the real ncclGetVersion(int*), which writes one int through a
            // pointer to a live local.
            let f: unsafe extern "C" fn(*mut c_int) -> c_int = unsafe { std::mem::transmute(p) };
            (unsafe { f(&mut v) } == 0).then_some(v)
        }
    };
    if s.debug {
        eprintln!("sucl-nccl: forwarding to {path} (NCCL {})", version.map(version_string).unwrap_or_else(|| "of unknown version".into()));
    }
    Ok(Real { path, version })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_codes_decode_in_both_encodings() {
        assert_eq!(version_string(22809), "2.28.9");
        assert_eq!(version_string(23007), "2.30.7");
        assert_eq!(version_string(2804), "2.8.4");
    }
}
