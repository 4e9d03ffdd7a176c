//! What sucl's NCCL users share: sucl's types in NCCL's terms, and NCCL errors in words — the
//! call, the rank, NCCL's name for the code, its text (`ncclGetErrorString`) and its last
//! message (`ncclGetLastError`, which usually says what went wrong, e.g. a CUDA error text).

use cudarc::nccl::sys as ncclsys;
use std::ffi::CStr;
use sucl_core::backend::CollOp;
use sucl_core::{DType, Error, ReduceOp};

/// NCCL's element type for `d`.
pub(crate) fn nccl_type(d: DType) -> ncclsys::ncclDataType_t {
    use ncclsys::ncclDataType_t as T;
    match d {
        DType::U8 => T::ncclUint8,
        DType::I8 => T::ncclInt8,
        DType::I32 => T::ncclInt32,
        DType::U32 => T::ncclUint32,
        DType::I64 => T::ncclInt64,
        DType::U64 => T::ncclUint64,
        DType::F16 => T::ncclFloat16,
        DType::BF16 => T::ncclBfloat16,
        DType::F32 => T::ncclFloat32,
        DType::F64 => T::ncclFloat64,
    }
}

/// NCCL's reduce op for `o`.
pub(crate) fn nccl_op(o: ReduceOp) -> ncclsys::ncclRedOp_t {
    use ncclsys::ncclRedOp_t as O;
    match o {
        ReduceOp::Sum => O::ncclSum,
        ReduceOp::Prod => O::ncclProd,
        ReduceOp::Min => O::ncclMin,
        ReduceOp::Max => O::ncclMax,
        ReduceOp::Avg => O::ncclAvg,
    }
}

/// The NCCL call(s) that serve `op`, as errors name them.
pub(crate) fn nccl_call(op: CollOp) -> &'static str {
    match op {
        CollOp::Barrier => "ncclAllReduce (barrier)",
        CollOp::Broadcast => "ncclBroadcast",
        CollOp::AllReduce => "ncclAllReduce",
        CollOp::Reduce => "ncclReduce",
        CollOp::AllGather => "ncclAllGather",
        CollOp::ReduceScatter => "ncclReduceScatter",
        CollOp::Gather => "ncclSend/ncclRecv group (gather)",
        CollOp::Scatter => "ncclSend/ncclRecv group (scatter)",
        CollOp::AllToAll => "ncclSend/ncclRecv group (all_to_all)",
    }
}

/// A string NCCL returned (static, or its thread's last message), if any.
fn nccl_string(p: *const std::ffi::c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: NCCL returns NUL-terminated strings that stay valid at least until the next NCCL
    // call on this thread; this copies it at once.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().trim().to_string())
}

/// What went wrong in NCCL `call`, which returned `code` (see the module documentation).
/// `comm` is the communicator of the call, or null. Take it before anything else calls NCCL
/// (an abort, say), which may replace the last message; only once NCCL is loaded (it returned
/// `code`).
pub(crate) fn nccl_call_text(call: &str, code: ncclsys::ncclResult_t, comm: ncclsys::ncclComm_t) -> String {
    // SAFETY: both take any code / any communicator handle or null (NCCL keeps the last message
    // per thread) and return strings owned by NCCL; NCCL is loaded (the call returned `code`).
    let (text, last) = unsafe { (nccl_string(ncclsys::ncclGetErrorString(code)), nccl_string(ncclsys::ncclGetLastError(comm))) };
    describe_nccl_error(call, &format!("{code:?}"), text.as_deref(), last.as_deref())
}

/// The error of NCCL `call` that returned `code` on world rank `rank` ([`nccl_call_text`]).
pub(crate) fn nccl_call_err(rank: usize, call: &str, code: ncclsys::ncclResult_t, comm: ncclsys::ncclComm_t) -> Error {
    Error::BackendUnavailable { rank, backend: "nccl".into(), why: nccl_call_text(call, code, comm) }
}

/// `CALL failed: CODE (TEXT): LAST`, leaving out what NCCL did not say (or said twice).
pub(crate) fn describe_nccl_error(call: &str, code: &str, text: Option<&str>, last: Option<&str>) -> String {
    let mut s = format!("{call} failed: {code}");
    let text = text.filter(|t| !t.is_empty());
    if let Some(t) = text {
        s += &format!(" ({t})");
    }
    if let Some(l) = last.filter(|l| !l.is_empty() && Some(*l) != text) {
        s += &format!(": {l}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_nccl_error_names_the_call_the_code_and_what_nccl_said() {
        let s = describe_nccl_error(
            "ncclAllReduce",
            "ncclUnhandledCudaError",
            Some("unhandled cuda error (run with NCCL_DEBUG=INFO for details)"),
            Some("Cuda failure 900 'operation not permitted when stream is capturing'"),
        );
        assert_eq!(
            s,
            "ncclAllReduce failed: ncclUnhandledCudaError (unhandled cuda error (run with NCCL_DEBUG=INFO for details)): \
             Cuda failure 900 'operation not permitted when stream is capturing'"
        );
        // What NCCL did not say (or said twice) is left out.
        assert_eq!(describe_nccl_error("ncclGroupEnd", "ncclInternalError", None, Some("")), "ncclGroupEnd failed: ncclInternalError");
        assert_eq!(describe_nccl_error("ncclSend", "ncclInvalidUsage", Some("x"), Some("x")), "ncclSend failed: ncclInvalidUsage (x)");
    }

    #[test]
    fn the_code_is_named_as_nccl_names_it() {
        // cudarc's NcclError prints as a bare "NcclError": errors take the code's own name.
        let e = cudarc::nccl::result::NcclError(ncclsys::ncclResult_t::ncclSystemError);
        assert_eq!(format!("{e:?}"), "NcclError");
        let s = Error::BackendUnavailable {
            rank: 3,
            backend: "nccl".into(),
            why: describe_nccl_error("ncclCommInitRank", &format!("{:?}", e.0), Some("unhandled system error"), None),
        }
        .to_string();
        assert!(s.contains("rank 3") && s.contains("ncclCommInitRank failed: ncclSystemError (unhandled system error)"), "{s}");
    }
}
