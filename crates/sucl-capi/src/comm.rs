//! Communicators from C: init (from the launch environment or explicit), rank, size, split, free.

use crate::error::{entry, Fail};
use crate::handles::{AnyRequest, COMMS, REQUESTS};
use crate::mem::{c_str, Out};
use crate::types::*;
use std::ffi::c_char;
use sucl::{Config, JobSecret, LaunchEnv, Launcher};

/// Joins the job this process was started in and returns its world communicator: `sucl run`,
/// torchrun, Open MPI's mpirun, Slurm's srun or a PMI launcher, found from the environment
/// (see the user guide); a process with no launcher is a world of one. Settings come from
/// `SUCL_*` variables and `SUCL_CONFIG`. Collective over the world.
///
/// Thread safety: any thread. Ownership: the caller owns `*comm` and frees it with
/// `sucl_comm_free` before the process exits (rank 0 hosts the rendezvous store and waits there
/// for the others to leave).
///
/// # Safety
/// `comm` must point to writable memory for one `sucl_comm`.
#[no_mangle]
pub unsafe extern "C" fn sucl_init(comm: *mut sucl_comm) -> sucl_result {
    entry(|| {
        let out = Out::new("comm", comm)?;
        let c = sucl::init()?;
        out.set(COMMS.insert(Box::new(c)));
        Ok(())
    })
}

/// Joins a job of `size` ranks as `rank`, meeting at `addr` (`"host:port"`; rank 0 listens
/// there). `local_rank` is this process's index among the ranks on its host (it picks the GPU).
/// `secret` (NULL: derived from `addr`) must be the same on every rank: store connections prove
/// they know it. Settings come from `SUCL_*` variables and `SUCL_CONFIG`. Collective over the
/// world.
///
/// Thread safety: any thread. Ownership: as `sucl_init`; `addr` and `secret` are only read
/// during the call.
///
/// # Safety
/// `addr` must be a NUL-terminated string, `secret` NULL or one, `comm` writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_init_explicit(
    rank: i32,
    size: i32,
    local_rank: i32,
    addr: *const c_char,
    secret: *const c_char,
    comm: *mut sucl_comm,
) -> sucl_result {
    entry(|| {
        let out = Out::new("comm", comm)?;
        let (rank, size, local_rank) = (self::rank("rank", rank)?, self::rank("size", size)?, self::rank("local_rank", local_rank)?);
        if size == 0 || rank >= size {
            return Err(Fail::arg("rank", format!("{rank} is out of range for a world of {size}")));
        }
        // SAFETY: the caller's contract for `addr` and `secret`.
        let addr = unsafe { c_str("addr", addr)? }.ok_or_else(|| Fail::arg("addr", "is NULL"))?;
        // SAFETY: as above.
        let secret = unsafe { c_str("secret", secret)? };
        let job_secret = match secret {
            Some(s) => JobSecret::given(&s),
            None => JobSecret::derived(&format!("explicit|{addr}")),
        };
        let env = LaunchEnv {
            launcher: Launcher::None,
            rank,
            size,
            local_rank,
            store_addr: Some(addr.clone()),
            rank0_hosts_store: true,
            job_id: format!("explicit-{addr}"),
            job_secret,
            agent_store: None,
        };
        let c = sucl::init_with(env, Config::from_env()?)?;
        out.set(COMMS.insert(Box::new(c)));
        Ok(())
    })
}

/// This process's rank in `comm`.
///
/// Thread safety: a communicator is used by one thread at a time; a call while another thread
/// is inside a call on `comm` returns `SUCL_ERR_BUSY` (true of every function taking a
/// `sucl_comm`). Ownership: nothing changes hands.
///
/// # Safety
/// `rank` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_comm_rank(comm: sucl_comm, rank: *mut i32) -> sucl_result {
    entry(|| {
        let out = Out::new("rank", rank)?;
        let r = COMMS.checkout(comm)?.rank();
        out.set(r as i32);
        Ok(())
    })
}

/// The number of ranks in `comm`.
///
/// Thread safety: as `sucl_comm_rank`. Ownership: nothing changes hands.
///
/// # Safety
/// `size` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_comm_size(comm: sucl_comm, size: *mut i32) -> sucl_result {
    entry(|| {
        let out = Out::new("size", size)?;
        let s = COMMS.checkout(comm)?.size();
        out.set(s as i32);
        Ok(())
    })
}

/// Splits `comm`: ranks passing the same `color` (≥ 0) form one new communicator, ordered by
/// `key` then by rank; a rank passing `SUCL_UNDEFINED` joins none and gets `SUCL_COMM_NULL`.
/// Collective over `comm`.
///
/// Thread safety: as `sucl_comm_rank`. Ownership: the caller owns `*newcomm` (free it with
/// `sucl_comm_free`); it stays valid after `comm` is freed.
///
/// # Safety
/// `newcomm` must be writable.
#[no_mangle]
pub unsafe extern "C" fn sucl_comm_split(comm: sucl_comm, color: i32, key: i32, newcomm: *mut sucl_comm) -> sucl_result {
    entry(|| {
        let out = Out::new("newcomm", newcomm)?;
        let color = match color {
            SUCL_UNDEFINED => None,
            c => Some(u32::try_from(c).map_err(|_| Fail::arg("color", format!("{c} is negative and not SUCL_UNDEFINED")))?),
        };
        let c = COMMS.checkout(comm)?;
        let sub = c.split(color, i64::from(key))?;
        drop(c);
        out.set(sub.map_or(SUCL_COMM_NULL, |s| COMMS.insert(Box::new(s))));
        Ok(())
    })
}

/// Frees `comm`: non-blocking requests still pending on it are cancelled (their handles die;
/// the memory they were lent is no longer touched), then the communicator is dropped. The
/// handle is dead afterwards: any call with it returns `SUCL_ERR_INVALID_HANDLE`. Local.
///
/// Thread safety: refused with `SUCL_ERR_BUSY` while another thread is inside a call on `comm`
/// or while it is bound to a stream-triggered queue. Ownership: ends the caller's ownership.
#[no_mangle]
pub extern "C" fn sucl_comm_free(comm: sucl_comm) -> sucl_result {
    entry(|| {
        let c = COMMS.remove(comm)?;
        for (_, r) in REQUESTS.drain_where(|r| matches!(r, AnyRequest::P2p { comm: owner, .. } if *owner == comm)) {
            if let AnyRequest::P2p { req, .. } = r {
                c.cancel_unscoped(req);
            }
        }
        drop(c);
        Ok(())
    })
}
