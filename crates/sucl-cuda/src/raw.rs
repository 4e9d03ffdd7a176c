//! NCCL called directly, nothing of sucl around it: the baseline `sucl bench --device cuda
//! --compare raw,...` measures sucl's device backends against. One blocking communicator made
//! the way an NCCL program makes it (`ncclCommInitRank`); each call goes straight to NCCL on the
//! caller's stream with the addresses the caller gives, so it can be captured into a CUDA graph
//! like any other stream work (no event waits, no query, no synchronization inside a call).

use crate::nccl_api::{nccl_call, nccl_call_err, nccl_op, nccl_type};
use cudarc::driver::CudaStream;
use cudarc::nccl::sys as ncclsys;
use sucl_core::backend::{CollDesc, CollOp};
use sucl_core::{Error, Result};

/// A raw NCCL communicator (see the module documentation).
pub struct RawNccl {
    comm: ncclsys::ncclComm_t,
    /// This process's rank in the communicator (and the rank errors name).
    rank: usize,
}

// SAFETY: the handle is only used through `&self` calls that NCCL allows from any thread one at
// a time; RawNccl is not Sync, so calls never overlap.
unsafe impl Send for RawNccl {}

impl RawNccl {
    /// Joins the communicator named by `id` (128 bytes from [`crate::nccl_unique_id`]) as `rank`
    /// of `size`, on the device whose context `stream` belongs to. Collective over the ranks.
    pub fn join(stream: &CudaStream, id: &[u8], rank: usize, size: usize) -> Result<RawNccl> {
        if id.len() != 128 {
            return Err(Error::Protocol { rank, peer: 0, why: format!("NCCL id of {} bytes (want 128)", id.len()) });
        }
        stream.context().bind_to_thread().map_err(|e| crate::cuda_err(rank, "binding the context", e))?;
        let mut internal = [0 as std::ffi::c_char; 128];
        for (d, s) in internal.iter_mut().zip(id) {
            *d = *s as std::ffi::c_char;
        }
        let mut comm: ncclsys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is a writable local; the id is 128 bytes as NCCL's type; the device's
        // context is bound to this thread (above).
        let rc = unsafe { ncclsys::ncclCommInitRank(&mut comm, size as i32, ncclsys::ncclUniqueId { internal }, rank as i32) };
        if rc != ncclsys::ncclResult_t::ncclSuccess || comm.is_null() {
            return Err(nccl_call_err(rank, "ncclCommInitRank (raw baseline)", rc, comm));
        }
        Ok(RawNccl { comm, rank })
    }

    /// Enqueues collective `d` on `stream`: all_reduce, reduce_scatter and all_gather from `send`
    /// into `recv`, broadcast in place in `recv` (the baseline measures these four).
    ///
    /// # Safety
    /// `send` and `recv` must be device allocations on `stream`'s device covering the sizes `d`
    /// gives this rank, kept allocated until `stream` has run the call.
    pub unsafe fn collective(&self, d: &CollDesc, send: u64, recv: u64, stream: &CudaStream) -> Result<()> {
        let (t, s, c) = (nccl_type(d.dtype), stream.cu_stream() as ncclsys::cudaStream_t, self.comm);
        let (src, dst) = (send as *const std::ffi::c_void, recv as *mut std::ffi::c_void);
        // SAFETY: `c` is live until drop; the caller guarantees the addresses (this method's
        // contract).
        let rc = unsafe {
            match d.op {
                CollOp::AllReduce => ncclsys::ncclAllReduce(src, dst, d.count, t, nccl_op(d.redop), c, s),
                CollOp::ReduceScatter => ncclsys::ncclReduceScatter(src, dst, d.count, t, nccl_op(d.redop), c, s),
                CollOp::AllGather => ncclsys::ncclAllGather(src, dst, d.count, t, c, s),
                CollOp::Broadcast => ncclsys::ncclBroadcast(dst, dst, d.count, t, d.root as i32, c, s),
                other => return Err(Error::invalid(self.rank, "op", format!("the raw NCCL baseline has no {}", other.name()))),
            }
        };
        if rc != ncclsys::ncclResult_t::ncclSuccess {
            return Err(nccl_call_err(self.rank, nccl_call(d.op), rc, c));
        }
        Ok(())
    }
}

impl Drop for RawNccl {
    fn drop(&mut self) {
        // SAFETY: the handle is live and destroyed once; nothing uses it afterwards.
        let rc = unsafe { ncclsys::ncclCommDestroy(self.comm) };
        if rc != ncclsys::ncclResult_t::ncclSuccess {
            tracing::warn!(rank = self.rank, "raw NCCL baseline: ncclCommDestroy failed: {rc:?}");
        }
    }
}
