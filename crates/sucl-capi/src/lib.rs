//! sucl-capi: sucl's C ABI — `libsucl.so` / `libsucl.a` and `include/sucl.h` (generated from
//! this crate by cbindgen and checked in; `tests/header.rs` fails when it is stale).
//!
//! A thin translation over the `sucl` facade: C handles (checked 64-bit integers, never
//! pointers to Rust objects) for communicators, requests, host queues, shared buffers and
//! stream-triggered queues; `(pointer, count, dtype)` triples checked and turned into typed
//! slices; sucl's errors turned into result codes with the message kept per thread for
//! `sucl_last_error()`. Every entry point catches panics, so none crosses into C. No
//! algorithm, selection rule or wire format lives here: each call goes to one facade call.
//!
//! Depends on `sucl` (the facade) only.

#![allow(non_camel_case_types)]
#![warn(missing_docs)]

mod coll;
mod comm;
mod device;
mod error;
mod handles;
mod mem;
mod p2p;
mod registry;
mod request;
mod stream;
mod types;
mod vcoll;

pub use coll::*;
pub use comm::*;
pub use device::*;
pub use error::*;
pub use p2p::*;
pub use request::*;
pub use stream::*;
pub use types::*;
pub use vcoll::*;
