//! How a daemon runs: its address, token, limits and timeouts.

use crate::auth::Token;
use crate::kernels::KernelRegistry;
use crate::transport::TlsIdentity;
use crate::wire::{self};
use std::net::SocketAddr;
use std::time::Duration;

/// What one session may hold at once.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of device memory over all its buffers.
    pub max_bytes: u64,
    /// Buffers.
    pub max_buffers: u32,
    /// Commands sent but not yet answered and acknowledged.
    pub max_inflight: u32,
    /// Queues.
    pub max_queues: u32,
    /// Events.
    pub max_events: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_bytes: 1 << 30, max_buffers: 4096, max_inflight: 1024, max_queues: 64, max_events: 65536 }
    }
}

/// How migrations between two GPU daemons of one host go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerPath {
    /// GPU to GPU through peer memory (CUDA IPC) when both daemons run on one host and can
    /// open each other's buffers; over the peer link otherwise.
    Auto,
    /// Always over the peer link (TLS or TCP), through host memory.
    Network,
}

impl PeerPath {
    /// The environment variable that sets it (`auto` or `network`).
    pub const ENV: &'static str = "SUCL_REMOTE_PEER_PATH";

    /// `auto` or `network`.
    pub fn parse(s: &str) -> Result<PeerPath, String> {
        match s.trim() {
            "auto" => Ok(PeerPath::Auto),
            "network" => Ok(PeerPath::Network),
            other => Err(format!("peer path {other:?}: want `auto` or `network`")),
        }
    }

    /// [`PeerPath::ENV`] if set, else [`PeerPath::Auto`].
    pub fn from_env() -> Result<PeerPath, String> {
        match std::env::var(Self::ENV) {
            Ok(v) => Self::parse(&v).map_err(|e| format!("{}: {e}", Self::ENV)),
            Err(_) => Ok(PeerPath::Auto),
        }
    }
}

/// How a daemon runs.
#[derive(Clone)]
pub struct DaemonConfig {
    /// Where to listen (loopback unless told otherwise; port 0 = any free port).
    pub listen: SocketAddr,
    /// The shared secret clients must prove they hold.
    pub token: Token,
    /// Per-session limits.
    pub limits: Limits,
    /// How long a session whose connection was lost waits for its client to re-attach.
    pub reconnect_window: Duration,
    /// The largest frame this daemon accepts or sends.
    pub max_frame: u32,
    /// How many host devices to offer.
    pub host_devices: u32,
    /// Whether to offer the machine's CUDA GPUs too.
    pub cuda: bool,
    /// Whether to offer the devices of the machine's OpenCL platforms too (loaded at run time
    /// through `libOpenCL.so.1`).
    pub opencl: bool,
    /// Host memory each host device reports (sessions are limited by [`Limits::max_bytes`]).
    pub host_memory: u64,
    /// The host kernels clients may launch.
    pub kernels: KernelRegistry,
    /// How long a new connection may take to complete its whole handshake (TLS, hello, open
    /// or attach); it is cut at this deadline however slowly its bytes trickle in.
    pub handshake_timeout: Duration,
    /// Connections in their handshake at once; more are closed as they arrive (each costs a
    /// thread until its handshake ends).
    pub max_handshakes: usize,
    /// Sessions this daemon holds at once (attached, or waiting for their client to
    /// re-attach). When a new one would exceed it, the session detached longest is freed;
    /// with none detached, the new one is refused.
    pub max_sessions: usize,
    /// The TLS identity clients and peers see (`None`: plain TCP).
    pub tls: Option<TlsIdentity>,
    /// How long a command waits for a peer (a migration's bytes, a remote event, a link).
    pub peer_timeout: Duration,
    /// How migrations between GPU daemons of one host go.
    pub peer_path: PeerPath,
}

impl DaemonConfig {
    /// Loopback, any free port, one host device, the built-in kernels, default limits, a 60 s
    /// reconnect window, TLS with a fresh self-signed certificate, a 30 s peer timeout, the
    /// peer path from [`PeerPath::ENV`] (`auto` when unset or not understood; `sucld` refuses a
    /// value it does not understand).
    pub fn new(token: Token) -> DaemonConfig {
        DaemonConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            token,
            limits: Limits::default(),
            reconnect_window: Duration::from_secs(60),
            max_frame: wire::DEFAULT_MAX_FRAME,
            host_devices: 1,
            cuda: false,
            opencl: false,
            host_memory: 1 << 34,
            kernels: KernelRegistry::with_builtins(),
            handshake_timeout: Duration::from_secs(5),
            max_handshakes: 64,
            max_sessions: 256,
            tls: Some(TlsIdentity::generate().expect("generating a TLS certificate")),
            peer_timeout: Duration::from_secs(30),
            peer_path: PeerPath::from_env().unwrap_or(PeerPath::Auto),
        }
    }
}
