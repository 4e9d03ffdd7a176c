//! sucl-remote: remote devices — a daemon (`sucld`) that serves a node's devices over TCP, and a
//! client for which those devices look like local ones.
//!
//! - [`wire`]: the versioned, little-endian, length-prefixed protocol; every length checked
//!   against a negotiated limit before anything is allocated for it.
//! - [`transport`]: TLS (rustls, on by default) on every client and peer connection; daemons
//!   present a certificate (self-signed with rcgen, or given) that clients pin by SHA-256.
//! - [`auth`]: a shared token, HMAC-SHA256 challenge-response over fresh nonces, a random
//!   128-bit session id and a derived 128-bit session secret; each connection is bound to its
//!   session in the handshake; peer links prove they hold the key the client handed the mesh.
//! - [`daemon`]: the daemon as a library (sessions with buffers, queues, events; host kernels
//!   from a [`KernelRegistry`]; CUDA kernels compiled by NVRTC; per-session limits;
//!   exactly-once execution across reconnects; peer meshes: server-to-server migration —
//!   GPU to GPU through peer memory between daemons of one host, over the link otherwise — and
//!   completion notices between servers; content size; OpenCL devices of the local platforms,
//!   loaded at run time, with programs built from OpenCL C on the server).
//! - [`client`]: [`Remote`] servers and their devices, queues, buffers and events; a [`Mesh`]
//!   of servers that migrate buffers and wait for each other's events directly.
//!
//! Depends on `sucl-cuda` (feature `cuda`, for the daemon's GPUs) through its public API only.

#![warn(missing_docs)]

pub mod auth;
pub mod client;
#[cfg(feature = "cuda")]
mod cuda;
pub mod daemon;
pub mod kernels;
mod opencl;
pub mod transport;
pub mod wire;

pub use auth::Token;
pub use client::{ClientOptions, Mesh, Remote, RemoteBuffer, RemoteDevice, RemoteError, RemoteEvent, RemoteQueue};
pub use daemon::{Daemon, DaemonConfig, Limits, PeerPath};
pub use kernels::{KernelCall, KernelRegistry};
pub use transport::{Tls, TlsIdentity};
pub use wire::{Arg, ClArg, DeviceKind};
