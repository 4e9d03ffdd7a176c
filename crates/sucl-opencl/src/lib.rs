//! sucl-opencl: an OpenCL ICD (`libsucl_opencl.so`) over sucl-remote, as PoCL-R's client
//! driver is over its protocol. Loaded by the ordinary ICD loaders (a `.icd` file naming this
//! library, or `OCL_ICD_VENDORS=/path/libsucl_opencl.so`), it offers one platform, "sucl"
//! (`cl_khr_icd`, suffix `sucl`), whose devices are the OpenCL devices of the `sucld` daemons
//! named by `SUCL_REMOTE` (or the `[[remote]]` tables of `SUCL_CONFIG`).
//!
//! It is a thin client of [`sucl_remote::client`]: every OpenCL call becomes the wire's
//! commands (programs are built on the daemons; NDRanges, reads, writes, copies and fills
//! run there), posted at once with their waits; a buffer used on another daemon's device
//! moves server to server. OpenCL 1.2 without images, samplers, native kernels, binaries and
//! separate compilation (refused with the specification's codes); see `docs/guide/opencl.md`.
//!
//! - [`cl`]: the OpenCL types and constants used.
//! - `dispatch`: the ICD dispatch table layout (`CL/cl_icd.h`).
//! - `object`: handles (dispatch pointer first), reference counts, the registry of live ones.
//! - `platform`: the daemons and their devices.
//! - `model`: contexts, queues, memory coherence, programs, kernels, events.
//! - `icd`: the C entry points, each under a panic guard.

#![warn(missing_docs)]

pub mod cl;
mod dispatch;
mod error;
mod icd;
mod model;
mod object;
mod platform;

pub use icd::{clGetExtensionFunctionAddress, clGetExtensionFunctionAddressForPlatform, clIcdGetPlatformIDsKHR};
