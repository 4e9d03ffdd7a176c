//! sucl-host: the host-memory backends.
//!
//! - [`tcp::TcpBackend`]: any ranks on any hosts, one persistent `TCP_NODELAY` connection per
//!   pair, driven by the core engine and its generic algorithms.
//! - [`shm::ShmBackend`]: ranks on one host, over one POSIX shared-memory segment: lock-free
//!   byte rings for point-to-point, and per-rank arenas where collectives let every rank copy
//!   and reduce its share in parallel, synchronized by flag barriers (no syscall on the fast path).
//!
//! Depends only on `sucl-core`.

#![warn(missing_docs)]

pub mod shm;
mod shm_sync;
pub mod tcp;
mod tcp_auth;
#[doc(hidden)]
pub use tcp_auth::fuzz as tcp_auth_fuzz;
mod tcp_pair;

use std::time::Duration;
use sucl_core::algorithms::AlgoConfig;
use sucl_core::wait::Backoff;

/// Settings shared by the host backends.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Bound of every wait.
    pub timeout: Duration,
    /// Largest payload a peer may announce on the wire.
    pub max_message: u64,
    /// Most bytes of unmatched (unexpected) messages a rank holds at once.
    pub max_unexpected: u64,
    /// Generic-algorithm tuning (tcp).
    pub algo: AlgoConfig,
    /// Bytes of each shared-memory point-to-point ring (rounded up to a power of two).
    pub shm_ring_bytes: usize,
    /// Bytes of each rank's shared-memory collective arena (two halves used alternately).
    pub shm_arena_bytes: usize,
    /// Collectives up to this size use the single-barrier shared-memory algorithms.
    pub shm_small_bytes: usize,
    /// SO_SNDBUF/SO_RCVBUF of tcp connections (0: leave the kernel's autotuning).
    pub tcp_sockbuf: usize,
    /// Busy-poll of a tcp wait before it blocks in poll(2), where the host backoff spins at all
    /// (it should outlast a blocked peer's wake-up; see the tcp module).
    pub tcp_spin: Duration,
    /// With this many peer sockets or more, tcp progress asks poll(2) which have bytes before
    /// reading any; 0: never (see [`sucl_core::engine::EngineConfig::poll_first_from`]).
    pub tcp_poll_first: usize,
    /// Bytes each tcp connection reads ahead per receive syscall (0: none; at most
    /// [`tcp::MAX_READ_AHEAD`]; see [`tcp::TcpChannel`]).
    pub tcp_read_ahead: usize,
    /// Pipeline chunk of large shared-memory reductions (kept cache-sized).
    pub shm_chunk_bytes: usize,
    /// How waits poll before blocking (set from the number of ranks on this host).
    pub backoff: Backoff,
    /// Directory (a tmpfs) holding shared-memory segments while ranks map them.
    pub shm_dir: String,
}

impl HostConfig {
    /// The engine settings these host settings imply.
    pub fn engine(&self) -> sucl_core::engine::EngineConfig {
        sucl_core::engine::EngineConfig {
            timeout: self.timeout,
            max_message: self.max_message,
            max_unexpected: self.max_unexpected,
            backoff: self.backoff,
            poll_first_from: 0,
        }
    }
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            timeout: Duration::from_secs(300),
            max_message: 1 << 40,
            max_unexpected: sucl_core::engine::DEFAULT_MAX_UNEXPECTED,
            algo: AlgoConfig::default(),
            shm_ring_bytes: 512 << 10,
            shm_arena_bytes: 8 << 20,
            shm_small_bytes: 16 << 10,
            shm_chunk_bytes: 256 << 10,
            tcp_sockbuf: 0,
            tcp_spin: Duration::from_micros(250),
            tcp_poll_first: 2,
            tcp_read_ahead: tcp::DEFAULT_READ_AHEAD,
            backoff: Backoff::DEDICATED,
            shm_dir: "/dev/shm".into(),
        }
    }
}
