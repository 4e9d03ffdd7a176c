//! sucl-nccl: a drop-in `libnccl.so.2`. It exports every function of NCCL's C API (2.26 through
//! 2.30.7, `ncclX` and the profiling alias `pncclX`), forwards each call to the real NCCL, loaded
//! by absolute path, and serves the calls sucl does better itself — small all_reduce among GPUs
//! that reach each other's memory — with sucl-cuda's peer-memory kernels, set up over the
//! program's own NCCL communicator.
//!
//! Loaded through `LD_PRELOAD` (PyTorch wheels, any program) or first on `LD_LIBRARY_PATH`
//! (programs linked with `-lnccl`); see docs/guide/nccl-dropin.md. Handles are never wrapped:
//! the real library's `ncclComm_t` goes back to the caller and sucl's state for a communicator
//! sits in a side table keyed by it, because the real library calls its own exported functions
//! (which resolve to this library) with handles the shim never returned.

#![warn(missing_docs)]

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod api;
mod errors;
mod real;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod serve;
mod settings;
pub mod table;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod trampoline;

pub use errors::{ncclInternalError, ncclInvalidArgument, ncclInvalidUsage, ncclSuccess, ncclSystemError};
