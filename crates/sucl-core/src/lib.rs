//! sucl-core: the foundation every other sucl crate builds on.
//!
//! It holds what all layers share and nothing that touches a particular memory kind's transport:
//! element types and reduce operations ([`DType`], [`ReduceOp`]), the user-facing [`Error`], the
//! versioned wire header ([`wire`]), the [`Backend`] trait, the point-to-point [`engine`] that frames
//! and matches messages over any byte channel, the generic collective [`algorithms`] built on it,
//! the rendezvous [`store`], launch-environment [`bootstrap`] and a client of torch's store ([`c10d`]). It depends on no other sucl crate.

#![warn(missing_docs)]

pub mod algorithms;
pub mod backend;
pub mod bootstrap;
pub mod c10d;
pub mod chunk;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod store;
pub mod wait;
pub mod wire;

pub use backend::{Backend, CollDesc, CollOp};
pub use dtype::{DType, Element, ReduceOp};
pub use error::{AbortInfo, AbortState, Error, Result};
