//! The C-visible types: result codes, element types, reduce operations and handles, each a
//! fixed-width integer typedef with named constants (an out-of-range value from C is then a
//! value to reject, never undefined behaviour in Rust), and their translation to sucl's types.

use crate::error::Fail;
use sucl::{DType, ReduceOp};

/// What a call returned: `SUCL_OK` (0) or an error code; `sucl_last_error()` has the message.
pub type sucl_result = i32;
/// Success.
pub const SUCL_OK: sucl_result = 0;
/// An argument was invalid (a null pointer, an unknown dtype or op, a count that overflows, a
/// misaligned buffer, a rank out of range, ...); nothing was sent or received.
pub const SUCL_ERR_INVALID_ARGUMENT: sucl_result = 1;
/// A handle that is not live: never created, already freed, or of another kind.
pub const SUCL_ERR_INVALID_HANDLE: sucl_result = 2;
/// The object is in use: another thread is inside a call on it, or the communicator is bound to
/// a stream-triggered queue (close the queue first).
pub const SUCL_ERR_BUSY: sucl_result = 3;
/// A peer process died or closed its connections.
pub const SUCL_ERR_LOST_PEER: sucl_result = 4;
/// A bounded wait ran out (`SUCL_TIMEOUT`).
pub const SUCL_ERR_TIMEOUT: sucl_result = 5;
/// Ranks called a collective with different arguments; the communicator is now unusable (every
/// later call on it returns `SUCL_ERR_UNUSABLE`).
pub const SUCL_ERR_MISMATCH: sucl_result = 6;
/// No backend can serve this communicator or call.
pub const SUCL_ERR_BACKEND_UNAVAILABLE: sucl_result = 7;
/// A configuration or launch-environment problem.
pub const SUCL_ERR_CONFIG: sucl_result = 8;
/// A peer sent bytes that do not follow the wire format.
pub const SUCL_ERR_PROTOCOL: sucl_result = 9;
/// The job was aborted because some rank failed.
pub const SUCL_ERR_ABORTED: sucl_result = 10;
/// An operating-system error.
pub const SUCL_ERR_IO: sucl_result = 11;
/// A bug in sucl (a Rust panic, caught at the C boundary).
pub const SUCL_ERR_INTERNAL: sucl_result = 12;
/// The communicator is unusable since an earlier call on it failed (`SUCL_ERR_MISMATCH`); this
/// call did nothing. `sucl_last_error()` names that call and quotes its error. Free the
/// communicator (`sucl_comm_free`) and create a new one.
pub const SUCL_ERR_UNUSABLE: sucl_result = 13;

/// An element type.
pub type sucl_dtype = i32;
/// `uint8_t`.
pub const SUCL_UINT8: sucl_dtype = 0;
/// `int8_t`.
pub const SUCL_INT8: sucl_dtype = 1;
/// `int32_t`.
pub const SUCL_INT32: sucl_dtype = 2;
/// `uint32_t`.
pub const SUCL_UINT32: sucl_dtype = 3;
/// `int64_t`.
pub const SUCL_INT64: sucl_dtype = 4;
/// `uint64_t`.
pub const SUCL_UINT64: sucl_dtype = 5;
/// IEEE half precision (`_Float16`, two bytes).
pub const SUCL_FLOAT16: sucl_dtype = 6;
/// bfloat16 (two bytes).
pub const SUCL_BFLOAT16: sucl_dtype = 7;
/// `float`.
pub const SUCL_FLOAT32: sucl_dtype = 8;
/// `double`.
pub const SUCL_FLOAT64: sucl_dtype = 9;

/// A reduction operator.
pub type sucl_op = i32;
/// Sum (integers wrap).
pub const SUCL_SUM: sucl_op = 0;
/// Product (integers wrap).
pub const SUCL_PROD: sucl_op = 1;
/// Minimum.
pub const SUCL_MIN: sucl_op = 2;
/// Maximum.
pub const SUCL_MAX: sucl_op = 3;
/// Sum divided by the number of ranks (integer division for integer types).
pub const SUCL_AVG: sucl_op = 4;

/// A communicator handle. `SUCL_COMM_NULL` (0) names none.
pub type sucl_comm = u64;
/// No communicator (what `sucl_comm_split` returns to a rank that passes `SUCL_UNDEFINED`).
pub const SUCL_COMM_NULL: sucl_comm = 0;
/// A request handle: a non-blocking send or receive, or an operation enqueued on a
/// stream-triggered queue. `SUCL_REQUEST_NULL` (0) names none.
pub type sucl_request = u64;
/// No request.
pub const SUCL_REQUEST_NULL: sucl_request = 0;
/// A host queue handle: an in-order queue of host tasks run by one worker thread.
pub type sucl_host_queue = u64;
/// A shared host buffer handle: typed host memory that host queues and stream-triggered
/// queues share safely.
pub type sucl_buffer = u64;
/// A stream-triggered queue handle (a communicator bound to a host queue).
pub type sucl_stream = u64;

/// The `color` that joins no sub-communicator in `sucl_comm_split`.
pub const SUCL_UNDEFINED: i32 = -1;
/// The null peer of stream-triggered operations: the operation completes at once, moving nothing.
pub const SUCL_PROC_NULL: i32 = -2;

/// Translates a C dtype.
pub(crate) fn dtype(d: sucl_dtype) -> Result<DType, Fail> {
    Ok(match d {
        SUCL_UINT8 => DType::U8,
        SUCL_INT8 => DType::I8,
        SUCL_INT32 => DType::I32,
        SUCL_UINT32 => DType::U32,
        SUCL_INT64 => DType::I64,
        SUCL_UINT64 => DType::U64,
        SUCL_FLOAT16 => DType::F16,
        SUCL_BFLOAT16 => DType::BF16,
        SUCL_FLOAT32 => DType::F32,
        SUCL_FLOAT64 => DType::F64,
        other => return Err(Fail::arg("dtype", format!("{other} is no sucl_dtype (SUCL_UINT8 = 0 ... SUCL_FLOAT64 = 9)"))),
    })
}

/// Translates a C reduce operator.
pub(crate) fn op(o: sucl_op) -> Result<ReduceOp, Fail> {
    Ok(match o {
        SUCL_SUM => ReduceOp::Sum,
        SUCL_PROD => ReduceOp::Prod,
        SUCL_MIN => ReduceOp::Min,
        SUCL_MAX => ReduceOp::Max,
        SUCL_AVG => ReduceOp::Avg,
        other => return Err(Fail::arg("op", format!("{other} is no sucl_op (SUCL_SUM = 0 ... SUCL_AVG = 4)"))),
    })
}

/// A rank, root or peer given as a C `int`: negative values are invalid.
pub(crate) fn rank(arg: &'static str, r: i32) -> Result<usize, Fail> {
    usize::try_from(r).map_err(|_| Fail::arg(arg, format!("{r} is negative")))
}

/// A message tag given as a C `int` (0 ... INT_MAX).
pub(crate) fn tag(t: i32) -> Result<u32, Fail> {
    u32::try_from(t).map_err(|_| Fail::arg("tag", format!("{t} is negative")))
}

pub(crate) use sucl::with_dtype;
