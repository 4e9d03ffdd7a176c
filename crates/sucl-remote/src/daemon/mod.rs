//! The daemon as a library: [`Daemon::start`] serves a node's devices on a TCP address until
//! [`Daemon::shutdown`]. The `sucld` binary is a thin command line over it; a program that wants
//! its own host kernels builds a [`DaemonConfig`] with its [`KernelRegistry`](crate::KernelRegistry) and starts one.
//!
//! A small pool of threads waits in `accept`; the thread that accepts a connection serves it
//! and then, while too few others wait, waits in `accept` again (so a new connection — a
//! client's re-attach above all — neither starts a thread nor waits for one to be handed it).
//! A session outlives its connection for the reconnect window: its buffers, queues and events
//! stay, and so do the replies the client has not acknowledged. Commands of a session run in
//! sequence-number order, each exactly once: a command whose number the session already
//! received is not run again. The connection's thread runs commands as they arrive; a command
//! that must wait for a peer (a migration's bytes, a remote event) is handed to the session's
//! executor thread, and the commands after it queue behind it.
//!
//! **Bounds.** A connection has [`DaemonConfig::handshake_timeout`] for its whole handshake,
//! and at most [`DaemonConfig::max_handshakes`] are in one at once; a frame's buffer grows
//! with the bytes that arrive, not with the length announced; the daemon holds at most
//! [`DaemonConfig::max_sessions`] sessions, and an executor thread lives only while its
//! session is attached or has a command to run.
//!
//! **Files.** `accept`: the accept pool and the handshake; `session`: opening, re-attaching
//! and receiving a session's commands; `exec`: running them in order and answering;
//! `commands`: the commands on the session's objects alone; `cl`: the OpenCL-only ones among
//! them; `notify`: the thread that tells members when events recorded behind running OpenCL
//! kernels complete; `objects`: buffers, queues, events, kernels, and finding them; `mesh` and
//! `links`: the peer mesh (its threads and transfers; its state); `waiters`:
//! which members wait for which local events, and when those are forgotten; `peer_mem`:
//! migrations GPU to GPU through peer memory; `state`: what the threads share; `config`: the
//! settings; `sync`: locking. Each imports only files listed after it, in the order accept,
//! session, exec, commands, cl, notify, peer_mem, mesh, state, links, waiters, objects, config, sync.
//!
//! **Peer mesh.** A client makes the servers of its sessions a mesh ([`Command::JoinMesh`](crate::wire::Command::JoinMesh):
//! indices, addresses, certificate pins and a key the client hands every member). Members open
//! links to each other on first use (TLS, then a proof that they hold the key), one outgoing
//! link per member and direction, each with its own sending thread. Over them go the bytes of
//! migrations ([`Command::MigrateOut`](crate::wire::Command::MigrateOut) on the source, [`Command::MigrateIn`](crate::wire::Command::MigrateIn) on the
//! destination, which answers the client) and completion notices: a member that reaches
//! [`Command::WaitRemote`](crate::wire::Command::WaitRemote) subscribes to that event at its owner, which notifies it — and only
//! it — when the event completes, without the client.
//!
//! **Data path.** Between GPU daemons of one host a migration goes GPU to GPU through peer
//! memory (`peer_mem`: IPC handles and interprocess events over the peer link, the copy on the
//! destination's stream; [`PeerPath`] turns it off). Otherwise a migration's source writes each
//! piece straight from the buffer (header and slice in one write) on the migrating command's
//! thread; the destination's link reads the piece off the socket into a pooled staging chunk,
//! and the receiving command copies chunks into the buffer as they come. The source's command
//! completes when the destination confirms it holds every byte ([`Frame::PeerReceived`](crate::wire::Frame::PeerReceived)).
//!
//! **Broken links.** The sending side makes a broken link again (authenticated as the first
//! time). Peer frames are idempotent and waits re-send what they wait for whenever a link with
//! that member broke or was made again: subscriptions again, and a migration's source asks how
//! much arrived ([`Frame::PeerResume`](crate::wire::Frame::PeerResume)) and sends the rest. A member that cannot be reached
//! within the peer timeout is lost: every wait on it fails, naming it.

mod accept;
mod cl;
mod commands;
mod config;
mod exec;
mod links;
mod mesh;
mod notify;
mod objects;
mod peer_mem;
mod session;
mod state;
mod sync;
mod waiters;

use crate::transport::{Pin, TlsIdentity};
use crate::wire::MIN_MAX_FRAME;
pub use config::{DaemonConfig, Limits, PeerPath};
use objects::*;
use state::*;
use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// A running daemon.
pub struct Daemon {
    addr: SocketAddr,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Daemon {
    /// Opens the devices, binds the address and starts serving.
    pub fn start(cfg: DaemonConfig) -> io::Result<Daemon> {
        if cfg.max_frame < MIN_MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("max frame {} is under the minimum {MIN_MAX_FRAME}", cfg.max_frame),
            ));
        }
        #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
        let mut devices: Vec<Served> =
            (0..cfg.host_devices).map(|i| Served::Host { name: format!("host{i}"), memory: cfg.host_memory }).collect();
        if cfg.cuda {
            #[cfg(feature = "cuda")]
            devices
                .extend(crate::cuda::open_all().map_err(|e| io::Error::other(format!("CUDA devices: {e}")))?.into_iter().map(Served::Cuda));
            #[cfg(not(feature = "cuda"))]
            return Err(io::Error::other("this sucld was built without the `cuda` feature"));
        }
        if cfg.opencl {
            let found =
                crate::opencl::open_all(&[crate::opencl::SUCL_PLATFORM]).map_err(|e| io::Error::other(format!("OpenCL devices: {e}")))?;
            if found.is_empty() {
                warn!("--opencl: no local OpenCL platform offers a device (is an ICD such as pocl-opencl-icd installed?)");
            }
            devices.extend(found.into_iter().map(Served::OpenCl));
        }
        let listener = TcpListener::bind(cfg.listen)?;
        let addr = listener.local_addr()?;
        if !addr.ip().is_loopback() && cfg.tls.is_none() {
            warn!(%addr, "listening beyond loopback without TLS: traffic after the handshake is not encrypted");
        }
        info!(%addr, devices = devices.len(), tls = cfg.tls.is_some(), kernels = ?cfg.kernels.names(), peer_path = ?cfg.peer_path, "sucld listening");
        let shared = Arc::new(Shared {
            cfg,
            devices,
            sessions: Mutex::new(HashMap::new()),
            meshes: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            handshakes: Mutex::new(HashMap::new()),
            listener,
            acceptors: Mutex::new(Acceptors::default()),
            acceptors_cv: Condvar::new(),
        });
        let s = shared.clone();
        let reaper = std::thread::Builder::new().name("sucld-reaper".into()).spawn(move || reap_loop(&s))?;
        let mut daemon = Daemon { addr, shared, threads: vec![reaper] };
        for _ in 0..accept::SPARE_ACCEPTORS {
            if let Err(e) = accept::start_acceptor(&daemon.shared) {
                daemon.stop();
                return Err(e);
            }
        }
        Ok(daemon)
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The pin of its TLS certificate (`None`: plain TCP).
    pub fn tls_pin(&self) -> Option<Pin> {
        self.shared.cfg.tls.as_ref().map(TlsIdentity::pin)
    }

    /// How many threads serve connections or wait in `accept` for one (each connection has
    /// one; a few more wait, and a thread whose connection ended waits again only while fewer
    /// than two others do).
    pub fn connection_threads(&self) -> usize {
        lock(&self.shared.acceptors).live
    }

    /// How many sessions it holds (attached or waiting for their client to re-attach).
    pub fn session_count(&self) -> usize {
        lock(&self.shared.sessions).len()
    }

    /// Blocks until the daemon stops (it stops only through [`Daemon::shutdown`] from another
    /// handle, so the binary calls this to serve forever).
    pub fn wait(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Stops accepting, closes every connection and frees every session.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Shutting the listening socket down closes the port and wakes every thread waiting in
        // `accept` (with an error); a connection wakes one where that does not.
        // SAFETY: the descriptor is the listener's, open for as long as `shared` lives.
        unsafe { libc::shutdown(self.shared.listener.as_raw_fd(), libc::SHUT_RDWR) };
        for (_, c) in lock(&self.shared.conns).drain() {
            let _ = c.shutdown(Shutdown::Both);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while lock(&self.shared.acceptors).idle > 0 && Instant::now() < deadline {
            let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(100));
            let a = lock(&self.shared.acceptors);
            drop(self.shared.acceptors_cv.wait_timeout(a, Duration::from_millis(10)));
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for (_, s) in lock(&self.shared.sessions).drain() {
            s.close();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stop();
        }
    }
}

/// Closes a session that is going (expired, or evicted for room). Its commands stop first
/// (none runs after the one running now, and none offers peer memory); once the executor is
/// idle (within the peer timeout), its peer-memory offers that no command joined are settled
/// ([`peer_mem::settle`], each member within the peer timeout) until none is left, on a thread
/// of its own when there is anything to wait for, so that neither the reaper nor a handshake
/// waits; the session's buffers are freed when its last user lets go.
fn retire(shared: &Arc<Shared>, s: Arc<Session>) {
    s.retiring.store(true, Ordering::SeqCst);
    if !lock(&s.state).draining && lock(&s.remote).offered.is_empty() {
        return s.close();
    }
    let (sh, ses) = (shared.clone(), s.clone());
    let settle = move || {
        settle_retiring(&sh, &ses);
        ses.close();
    };
    if let Err(e) = std::thread::Builder::new().name("sucld-retire".into()).spawn(settle) {
        warn!("no thread to settle a closing session's peer-memory offers ({e}): settling them here");
        settle_retiring(shared, &s);
        s.close();
    }
}

/// Rounds of settling a retiring session's offers: after the first, only an offer made by a
/// command still running past the wait for idleness is left (offers stop once it retires).
const SETTLE_ROUNDS: usize = 3;

/// Waits (within the peer timeout) until the retiring session `s` runs no command, then
/// settles its peer-memory offers until none is left.
fn settle_retiring(shared: &Arc<Shared>, s: &Arc<Session>) {
    let deadline = Instant::now() + shared.cfg.peer_timeout;
    while lock(&s.state).draining {
        if Instant::now() >= deadline {
            warn!("a retiring session still runs a command after {:?}: its offers are settled now", shared.cfg.peer_timeout);
            break;
        }
        // The executor signals nothing when it stops: poll (a session retires once).
        std::thread::sleep(Duration::from_millis(2));
    }
    for _ in 0..SETTLE_ROUNDS {
        peer_mem::settle(shared, s);
        if lock(&s.remote).offered.is_empty() {
            return;
        }
    }
    warn!("a retiring session still had peer-memory offers after {SETTLE_ROUNDS} rounds of settling");
}

/// Frees sessions whose client did not re-attach in time, and cuts connections whose
/// handshake ran past its deadline.
fn reap_loop(shared: &Arc<Shared>) {
    let tick =
        (shared.cfg.reconnect_window.min(shared.cfg.handshake_timeout) / 4).clamp(Duration::from_millis(10), Duration::from_millis(500));
    while !shared.stop.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
        accept::cut_late_handshakes(shared);
        let window = shared.cfg.reconnect_window;
        let mut expired = Vec::new();
        lock(&shared.sessions).retain(|id, s| {
            let b = lock(&s.binding);
            let gone = b.conn.is_none() && b.detached_since.is_some_and(|t| t.elapsed() > window);
            if gone {
                info!(session = %hex(id), "session expired: its client did not re-attach within {window:?}; resources freed");
                expired.push(s.clone());
            }
            !gone
        });
        for s in expired {
            retire(shared, s);
        }
        lock(&shared.meshes).retain(|_, w| w.strong_count() > 0 && !w.upgrade().is_some_and(|s| s.closed.load(Ordering::SeqCst)));
    }
}

#[cfg(test)]
mod tests {
    use super::links::Offered;
    use super::*;
    use crate::auth::{Nonces, Token};
    use crate::wire::{Command, Frame, Outcome};

    /// A session of `shared` opened by hand, detached, with `pending` queued.
    fn session(shared: &Shared, pending: Vec<Command>) -> Arc<Session> {
        let id = [9; 16];
        Arc::new(Session {
            id,
            secret: shared.cfg.token.session_secret(&Nonces { client: [1; 16], server: [2; 16] }, &id),
            max_frame: shared.cfg.max_frame,
            features: 0,
            binding: Mutex::new(Binding { generation: 1, conn: None, detached_since: Some(Instant::now()) }),
            state: Mutex::new(SessionState {
                last_received: pending.len() as u64,
                pending: pending.into_iter().enumerate().map(|(i, c)| (i as u64 + 1, c)).collect(),
                ..SessionState::default()
            }),
            exec_cv: Condvar::new(),
            objects: Mutex::new(Objects::default()),
            remote: Mutex::new(links::RemoteState::default()),
            remote_cv: Condvar::new(),
            closed: AtomicBool::new(false),
            retiring: AtomicBool::new(false),
            peer_frames: AtomicU64::new(0),
            notices: Mutex::new(None),
        })
    }

    fn waits_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "{what}: not within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn daemon() -> Daemon {
        let mut cfg = DaemonConfig::new(Token::generate());
        cfg.tls = None;
        cfg.peer_timeout = Duration::from_secs(5);
        Daemon::start(cfg).unwrap()
    }

    #[test]
    fn a_freed_buffer_a_member_may_still_copy_from_is_held_until_its_offers_are_settled() {
        let daemon = daemon();
        let shared = daemon.shared.clone();
        let s = session(&shared, vec![]);
        let buf = || Buf { device: 0, mem: Mem::Host(crate::kernels::HostMem::zeroed(8)), content: None };
        {
            let mut o = lock(&s.objects);
            o.buffers.extend([(3, buf()), (4, buf())]);
            o.stats.bytes_in_use = 16;
        }
        // An offer of buffer 3 whose join fails (to a member of no mesh).
        let offer =
            Offered { peer: 1, transfer: 7, device: 0, buffer: 3, range: 0..8, frame: Frame::PeerMemClose { handle: [0; 64] }.encode() };
        lock(&s.remote).offered.push(offer);
        assert_eq!(exec::exec(&shared, &s, Command::Free { buffer: 3 }), Ok(Outcome::Done), "the client's free succeeds");
        {
            let o = lock(&s.objects);
            assert!(!o.buffers.contains_key(&3), "the buffer is gone for the client");
            assert_eq!(o.held.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [3], "its memory is held");
        }
        assert_eq!(lock(&s.remote).offered.len(), 1, "its offer is kept for the next join");
        // A buffer no member may copy from is freed at once, even while another's offer is unsettled.
        let _ = exec::exec(&shared, &s, Command::Free { buffer: 4 });
        assert!(!lock(&s.objects).buffers.contains_key(&4));
        assert_eq!(lock(&s.objects).held.len(), 1, "buffer 4 was not held");
        // Once the offer is settled, the next command releases the memory.
        lock(&s.remote).offered.clear();
        assert!(matches!(exec::exec(&shared, &s, Command::Stats), Ok(Outcome::Stats(_))));
        assert!(lock(&s.objects).held.is_empty(), "released once no member may copy from it");
        s.close();
    }

    #[test]
    fn a_retiring_session_runs_no_further_command_and_settles_its_offers_only_once_idle() {
        let daemon = daemon();
        let shared = daemon.shared.clone();
        let s = session(&shared, vec![Command::Stats]);
        // An offer no command joined (to a member of no mesh: its settling fails at once), and
        // a command running (the executor is not idle).
        let offer =
            Offered { peer: 1, transfer: 7, device: 0, buffer: 3, range: 0..8, frame: Frame::PeerMemClose { handle: [0; 64] }.encode() };
        lock(&s.remote).offered.push(offer);
        lock(&s.state).draining = true;
        retire(&shared, s.clone());
        assert!(s.retiring.load(Ordering::SeqCst));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!s.closed.load(Ordering::SeqCst), "the session closes only after its running command ends");
        assert_eq!(lock(&s.remote).offered.len(), 1, "offers are settled only once no command runs");
        // The running command ends; the queued one is not run.
        lock(&s.state).draining = false;
        exec::drain(&shared, &s, true);
        assert_eq!(lock(&s.state).pending.len(), 1, "no command runs once the session retires");
        assert_eq!(lock(&s.objects).stats.executed, 0);
        waits_for("the retiring session settles and closes", || s.closed.load(Ordering::SeqCst));
        assert!(lock(&s.remote).offered.is_empty(), "every offer was settled before the session closed");
        drop(daemon);
    }
}
