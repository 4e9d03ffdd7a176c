//! The daemon as a library: [`Daemon::start`] serves a node's devices on a TCP address until
//! [`Daemon::shutdown`]. The `sucld` binary is a thin command line over it; a program that wants
//! its own host kernels builds a [`DaemonConfig`] with its [`KernelRegistry`] and starts one.
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
//! **Peer mesh.** A client makes the servers of its sessions a mesh ([`Command::JoinMesh`]:
//! indices, addresses, certificate pins and a key the client hands every member). Members open
//! links to each other on first use (TLS, then a proof that they hold the key), one outgoing
//! link per member and direction, each with its own sending thread. Over them go the bytes of
//! migrations ([`Command::MigrateOut`] on the source, [`Command::MigrateIn`] on the
//! destination, which answers the client) and completion notices: a member that reaches
//! [`Command::WaitRemote`] subscribes to that event at its owner, which notifies it — and only
//! it — when the event completes, without the client.
//!
//! **Data path.** A migration's source writes each piece straight from the buffer (header and
//! slice in one write) on the migrating command's thread; the destination's link reads the
//! piece off the socket into a pooled staging chunk, and the receiving command copies chunks
//! into the buffer as they come. The source's command completes when the destination confirms
//! it holds every byte ([`Frame::PeerReceived`]).
//!
//! **Broken links.** The sending side makes a broken link again (authenticated as the first
//! time). Peer frames are idempotent and waits re-send what they wait for whenever a link with
//! that member broke or was made again: subscriptions again, and a migration's source asks how
//! much arrived ([`Frame::PeerResume`]) and sends the rest. A member that cannot be reached
//! within the peer timeout is lost: every wait on it fails, naming it.

use crate::auth::{random, MeshKey, Nonces, SessionSecret, Token};
use crate::kernels::{HostMem, KernelCall, KernelRegistry};
use crate::transport::{self, Link, Pin, Tls, TlsIdentity};
use crate::wire::{
    self, code, feature, read_frame, write_frame, Arg, Command, DeviceInfo, DeviceKind, Frame, Outcome, PeerSpec, ReadError, SessionStats,
    HANDSHAKE_MAX_FRAME, MIN_MAX_FRAME, VERSION,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

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
    /// Host memory each host device reports (sessions are limited by [`Limits::max_bytes`]).
    pub host_memory: u64,
    /// The host kernels clients may launch.
    pub kernels: KernelRegistry,
    /// How long a new connection may take to complete its handshake.
    pub handshake_timeout: Duration,
    /// The TLS identity clients and peers see (`None`: plain TCP).
    pub tls: Option<TlsIdentity>,
    /// How long a command waits for a peer (a migration's bytes, a remote event, a link).
    pub peer_timeout: Duration,
}

impl DaemonConfig {
    /// Loopback, any free port, one host device, the built-in kernels, default limits, a 60 s
    /// reconnect window, TLS with a fresh self-signed certificate, a 30 s peer timeout.
    pub fn new(token: Token) -> DaemonConfig {
        DaemonConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            token,
            limits: Limits::default(),
            reconnect_window: Duration::from_secs(60),
            max_frame: wire::DEFAULT_MAX_FRAME,
            host_devices: 1,
            cuda: false,
            host_memory: 1 << 34,
            kernels: KernelRegistry::with_builtins(),
            handshake_timeout: Duration::from_secs(5),
            tls: Some(TlsIdentity::generate().expect("generating a TLS certificate")),
            peer_timeout: Duration::from_secs(30),
        }
    }
}

/// One device the daemon serves.
enum Served {
    Host {
        name: String,
        memory: u64,
    },
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::CudaServed),
}

impl Served {
    fn info(&self) -> DeviceInfo {
        match self {
            Served::Host { name, memory } => DeviceInfo { kind: DeviceKind::Host, name: name.clone(), memory: *memory },
            #[cfg(feature = "cuda")]
            Served::Cuda(c) => c.info(),
        }
    }
}

/// Device memory of one buffer.
pub(crate) enum Mem {
    Host(HostMem),
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::CudaMem),
}

impl Mem {
    fn len(&self) -> usize {
        match self {
            Mem::Host(m) => m.len(),
            #[cfg(feature = "cuda")]
            Mem::Cuda(m) => m.len(),
        }
    }
}

struct Buf {
    device: u32,
    mem: Mem,
    /// The buffer holding how many of this one's bytes are meaningful (content size).
    content: Option<u64>,
}

/// The objects of one session and its counters.
#[derive(Default)]
struct Objects {
    buffers: HashMap<u64, Buf>,
    queues: HashMap<u64, u32>,
    events: HashMap<u64, Ev>,
    /// CUDA kernels this session compiled, by device and name.
    #[cfg(feature = "cuda")]
    cuda_kernels: HashMap<(u32, String), sucl_cuda::Kernel>,
    stats: SessionStats,
}

enum Ev {
    /// Commands of a session run in order, so a host event is complete when recorded.
    Done,
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::CudaEv),
}

/// Receipt and replay state: guarded together, so that receiving a command, queueing it and
/// retaining its reply each happen in one step.
struct SessionState {
    last_received: u64,
    /// Received commands not yet run, in sequence order.
    pending: VecDeque<(u64, Command)>,
    /// Someone (the connection's thread or the executor) is running `pending`.
    draining: bool,
    /// The head of `pending` may block: the executor thread takes over.
    handoff: bool,
    /// Encoded reply frames the client has not acknowledged, oldest first.
    retained: VecDeque<(u64, Vec<u8>)>,
}

/// The connection a session is bound to, guarded apart from the state so that a re-attaching
/// connection can cut off the old one even while the old one is blocked holding the state.
struct Binding {
    generation: u64,
    conn: Option<Link>,
    detached_since: Option<Instant>,
}

/// This session's place in a peer mesh.
struct MeshInfo {
    id: [u8; 16],
    key: MeshKey,
    index: u32,
    peers: HashMap<u32, PeerSpec>,
}

/// A transfer arriving from a peer: pieces staged as they come (in pooled chunks), taken by
/// the receiving command as soon as it runs, so that its copy into the buffer overlaps the
/// link's next reads.
struct Incoming {
    total: u64,
    /// Bytes staged so far (pieces received in order; a re-sent prefix is skipped).
    received: u64,
    /// Staged pieces not yet taken: (chunk, bytes used in it).
    chunks: VecDeque<(Vec<u8>, usize)>,
}

/// The bytes of one staging chunk (and the largest piece a migration sends).
const STAGE_CHUNK: usize = 256 << 10;
/// Staging chunks a session keeps for reuse.
const STAGE_POOL: usize = 32;
/// Completed incoming transfers a session remembers (to acknowledge a re-sent one again).
const FINISHED_KEPT: usize = 1 << 16;

/// One outgoing link to a mesh member. Its thread (re)connects it and writes the small frames
/// queued here (notices, subscriptions, acknowledgements), so that no thread that reads (a
/// peer link, a client connection) ever blocks on a peer's socket; a migrating command writes
/// its data straight from the buffer instead, holding `write` for each whole frame.
struct PeerOut {
    st: Mutex<OutState>,
    cv: Condvar,
    write: Mutex<()>,
}

#[derive(Default)]
struct OutState {
    /// The connection in use (`None` while it is being made or re-made).
    link: Option<Link>,
    /// Counts connections made; a break reported for an older one changes nothing.
    generation: u64,
    frames: VecDeque<Vec<u8>>,
    max_frame: u32,
    /// Why the member cannot be reached any more (the link will not be re-made).
    error: Option<String>,
    closed: bool,
}

impl PeerOut {
    /// Connection `generation` broke: drop it (its thread makes a new one).
    fn broken(&self, generation: u64) {
        let mut st = lock(&self.st);
        if st.generation == generation {
            if let Some(l) = st.link.take() {
                l.shutdown();
            }
        }
        drop(st);
        self.cv.notify_all();
    }
}

/// What a session knows of its mesh: links, local events peers wait for, remote events and
/// transfers it waits for, peers it lost.
#[derive(Default)]
struct RemoteState {
    mesh: Option<MeshInfo>,
    outs: HashMap<u32, Arc<PeerOut>>,
    ins: Vec<Link>,
    /// Local events that completed (kept for peers that subscribe later).
    done: HashSet<u64>,
    /// Peers waiting for local events.
    subscribers: HashMap<u64, Vec<u32>>,
    /// Events of peers that completed, or (false) never will.
    remote_done: HashMap<(u32, u64), bool>,
    inbox: HashMap<(u32, u64), Incoming>,
    /// Bytes staged in `inbox`.
    staged: u64,
    /// Incoming transfers taken by their command, with their sizes, oldest first (bounded).
    finished: HashMap<(u32, u64), u64>,
    finished_order: VecDeque<(u32, u64)>,
    /// Outgoing transfers: the bytes the destination said it holds.
    progress: HashMap<(u32, u64), u64>,
    /// Members that have opened a link to this session (a later one is a re-made link).
    linked_from: HashSet<u32>,
    /// Per member: bumped whenever a link with it breaks or a new one from it opens (frames
    /// in flight may have been lost: waiters re-send what they are waiting on).
    epoch: HashMap<u32, u64>,
    /// Staging chunks for reuse.
    pool: Vec<Vec<u8>>,
    lost: HashMap<u32, String>,
}

impl RemoteState {
    fn epoch(&self, peer: u32) -> u64 {
        self.epoch.get(&peer).copied().unwrap_or(0)
    }
    fn chunk(&mut self, len: usize) -> Vec<u8> {
        match self.pool.pop() {
            Some(c) if c.len() >= len => c,
            _ => vec![0u8; len.max(STAGE_CHUNK)],
        }
    }
    fn recycle(&mut self, c: Vec<u8>) {
        if self.pool.len() < STAGE_POOL && c.len() == STAGE_CHUNK {
            self.pool.push(c);
        }
    }
    fn finish(&mut self, key: (u32, u64), total: u64) {
        if self.finished.insert(key, total).is_none() {
            self.finished_order.push_back(key);
            if self.finished_order.len() > FINISHED_KEPT {
                let old = self.finished_order.pop_front().expect("non-empty");
                self.finished.remove(&old);
            }
        }
    }
}

struct Session {
    id: [u8; 16],
    secret: SessionSecret,
    max_frame: u32,
    /// The features negotiated when it was opened (they decide how a re-attach is proved).
    features: u64,
    binding: Mutex<Binding>,
    state: Mutex<SessionState>,
    exec_cv: Condvar,
    objects: Mutex<Objects>,
    remote: Mutex<RemoteState>,
    remote_cv: Condvar,
    closed: AtomicBool,
    /// Frames received over peer links.
    peer_frames: AtomicU64,
}

impl Session {
    /// Frees the session: stops its executor and its peer links and closes its connection.
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        drop(lock(&self.state));
        self.exec_cv.notify_all();
        if let Some(c) = lock(&self.binding).conn.take() {
            c.shutdown();
        }
        let mut r = lock(&self.remote);
        for out in r.outs.values() {
            let mut st = lock(&out.st);
            st.closed = true;
            if let Some(l) = st.link.take() {
                l.shutdown();
            }
            drop(st);
            out.cv.notify_all();
        }
        for l in r.ins.drain(..) {
            l.shutdown();
        }
        r.inbox.clear();
        r.pool.clear();
        drop(r);
        self.remote_cv.notify_all();
    }
}

struct Shared {
    cfg: DaemonConfig,
    devices: Vec<Served>,
    sessions: Mutex<HashMap<[u8; 16], Arc<Session>>>,
    meshes: Mutex<HashMap<[u8; 16], Weak<Session>>>,
    stop: AtomicBool,
    /// A handle on every open connection (to close it at shutdown), by a number of its own.
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
    listener: TcpListener,
    acceptors: Mutex<Acceptors>,
    acceptors_cv: Condvar,
}

/// Bytes of retained replies gathered into one write when a client re-attaches.
const RESEND_BATCH: usize = 64 << 10;

/// The threads that serve connections.
#[derive(Default)]
struct Acceptors {
    /// Waiting in `accept` now.
    idle: usize,
    /// Alive (waiting or serving).
    live: usize,
}

/// Threads kept waiting in `accept`: one takes the next connection while another may still be
/// on its way back from the connection it served (a reconnect meets one waiting).
const SPARE_ACCEPTORS: usize = 2;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in one connection's thread must not take the daemon down with it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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
        let listener = TcpListener::bind(cfg.listen)?;
        let addr = listener.local_addr()?;
        if !addr.ip().is_loopback() && cfg.tls.is_none() {
            warn!(%addr, "listening beyond loopback without TLS: traffic after the handshake is not encrypted");
        }
        info!(%addr, devices = devices.len(), tls = cfg.tls.is_some(), kernels = ?cfg.kernels.names(), "sucld listening");
        let shared = Arc::new(Shared {
            cfg,
            devices,
            sessions: Mutex::new(HashMap::new()),
            meshes: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            listener,
            acceptors: Mutex::new(Acceptors::default()),
            acceptors_cv: Condvar::new(),
        });
        let s = shared.clone();
        let reaper = std::thread::Builder::new().name("sucld-reaper".into()).spawn(move || reap_loop(&s))?;
        let mut daemon = Daemon { addr, shared, threads: vec![reaper] };
        for _ in 0..SPARE_ACCEPTORS {
            if let Err(e) = start_acceptor(&daemon.shared) {
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

/// Starts one more thread waiting in `accept`.
fn start_acceptor(shared: &Arc<Shared>) -> io::Result<()> {
    {
        let mut a = lock(&shared.acceptors);
        a.idle += 1;
        a.live += 1;
    }
    let s = shared.clone();
    match std::thread::Builder::new().name("sucld-conn".into()).spawn(move || acceptor(&s)) {
        Ok(_) => Ok(()),
        Err(e) => {
            let mut a = lock(&shared.acceptors);
            a.idle -= 1;
            a.live -= 1;
            warn!("cannot start a connection thread: {e}");
            Err(e)
        }
    }
}

/// Counts a connection thread out when it ends, however it ends.
struct Leaving<'a>(&'a Shared);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        lock(&self.0.acceptors).live -= 1;
        self.0.acceptors_cv.notify_all();
    }
}

/// One thread of the accept pool: accepts a connection and serves it; then waits for the next
/// one unless [`SPARE_ACCEPTORS`] threads wait already (then it ends).
fn acceptor(shared: &Arc<Shared>) {
    let _leaving = Leaving(shared);
    loop {
        let accepted = shared.listener.accept();
        let spares_left = {
            let mut a = lock(&shared.acceptors);
            a.idle -= 1;
            a.idle
        };
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        if spares_left == 0 {
            // Someone must wait for the next connection while this one is served.
            let _ = start_acceptor(shared);
        }
        match accepted {
            Ok((conn, _)) => serve_connection(shared, conn),
            Err(e) => {
                warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10)); // out of descriptors: no hot loop
            }
        }
        let mut a = lock(&shared.acceptors);
        if a.idle >= SPARE_ACCEPTORS || shared.stop.load(Ordering::SeqCst) {
            return;
        }
        a.idle += 1;
    }
}

/// Serves one accepted connection to its end.
fn serve_connection(shared: &Arc<Shared>, conn: TcpStream) {
    let number = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    if let Ok(c) = conn.try_clone() {
        lock(&shared.conns).insert(number, c);
    }
    if shared.stop.load(Ordering::SeqCst) {
        lock(&shared.conns).remove(&number); // shutdown has begun: it closed the others already
        return;
    }
    let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let closer = conn.try_clone();
    match serve(shared, conn) {
        Ok(()) => debug!(%peer, "connection closed"),
        Err(e) => info!(%peer, "connection ended: {e}"),
    }
    // Other handles on the socket (the daemon keeps one to close it at shutdown) must not keep
    // it open: the other side learns at once that it ended.
    if let Ok(c) = closer {
        let _ = c.shutdown(Shutdown::Both);
    }
    lock(&shared.conns).remove(&number);
}

fn reap_loop(shared: &Arc<Shared>) {
    let tick = (shared.cfg.reconnect_window / 4).clamp(Duration::from_millis(10), Duration::from_millis(500));
    while !shared.stop.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
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
            s.close();
        }
        lock(&shared.meshes).retain(|_, w| w.strong_count() > 0 && !w.upgrade().is_some_and(|s| s.closed.load(Ordering::SeqCst)));
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn refuse(conn: &mut Link, buf: &mut Vec<u8>, reason: String) -> io::Error {
    let _ = write_frame(conn, buf, &Frame::Refused { reason: reason.clone() });
    conn.shutdown();
    io::Error::new(io::ErrorKind::PermissionDenied, reason)
}

fn handshake_err(e: ReadError) -> io::Error {
    match e {
        ReadError::Io(e) => e,
        ReadError::Wire(w) => io::Error::new(io::ErrorKind::InvalidData, w.to_string()),
    }
}

/// TLS (unless off), the handshake, then the command loop of one connection (or the receiving
/// loop of a peer link).
fn serve(shared: &Arc<Shared>, sock: TcpStream) -> io::Result<()> {
    sock.set_nodelay(true)?;
    let mut conn = match &shared.cfg.tls {
        Some(id) => Link::tls_server(sock, id, shared.cfg.handshake_timeout)?,
        None => Link::plain(sock),
    };
    conn.set_read_timeout(Some(shared.cfg.handshake_timeout))?;
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let hello = read_frame(&mut conn, &mut buf, HANDSHAKE_MAX_FRAME);
    let (min_version, max_version, features, max_frame, client_nonce) = match hello {
        Ok(Frame::Hello { min_version, max_version, features, max_frame, nonce }) => (min_version, max_version, features, max_frame, nonce),
        Ok(other) => return Err(refuse(&mut conn, &mut out, format!("expected a hello, got {}", frame_name(&other)))),
        Err(ReadError::Wire(w)) => return Err(refuse(&mut conn, &mut out, format!("malformed hello: {w}"))),
        Err(e) => return Err(handshake_err(e)),
    };
    if !(min_version..=max_version).contains(&VERSION) {
        return Err(refuse(
            &mut conn,
            &mut out,
            format!("the client speaks versions {min_version}..={max_version}; this server speaks {VERSION}"),
        ));
    }
    let max_frame = max_frame.min(shared.cfg.max_frame);
    if max_frame < MIN_MAX_FRAME {
        return Err(refuse(&mut conn, &mut out, format!("frame limit {max_frame} is under the minimum {MIN_MAX_FRAME}")));
    }
    let mut ours = feature::HOST_KERNELS | feature::MESH | feature::CONTENT_SIZE | feature::CHANNEL_BOUND_ATTACH;
    if shared.devices.iter().any(|d| d.info().kind == DeviceKind::Cuda) {
        ours |= feature::CUDA_KERNELS;
    }
    let nonces = Nonces { client: client_nonce, server: random() };
    let features = features & ours;
    let welcome = Frame::Welcome { version: VERSION, features, max_frame, nonce: nonces.server };
    if conn.has_buffered_input() {
        // The client did not wait for the welcome (a channel-bound attach follows its hello):
        // the welcome goes out with the answer to what follows, in one segment.
        out.clear();
        welcome.encode_into(&mut out);
        conn.write_deferred(&out)?;
    } else {
        write_frame(&mut conn, &mut out, &welcome)?;
    }
    let session = match read_frame(&mut conn, &mut buf, HANDSHAKE_MAX_FRAME) {
        Ok(Frame::Open { mac }) => {
            if !shared.cfg.token.check_open(&nonces, &mac) {
                return Err(refuse(&mut conn, &mut out, "authentication failed: the client does not hold this server's token".into()));
            }
            open_session(shared, &mut conn, &mut out, &nonces, max_frame, features)?
        }
        Ok(Frame::Attach { session, last_reply, mac }) => {
            let found = lock(&shared.sessions).get(&session).cloned();
            let Some(s) = found else {
                return Err(refuse(&mut conn, &mut out, "no such session (it expired or never existed)".into()));
            };
            // On a TLS link of a session that negotiated it, the proofs are bound to the TLS
            // channel (the client sent this without waiting for our nonce); else to the nonces.
            let channel = if s.features & feature::CHANNEL_BOUND_ATTACH != 0 { conn.channel_binding() } else { None };
            let proved = match &channel {
                Some(ch) => s.secret.check_attach_channel(ch, &nonces.client, &session, last_reply, &mac),
                None => s.secret.check_attach(&nonces, &session, last_reply, &mac),
            };
            if !proved {
                return Err(refuse(&mut conn, &mut out, "authentication failed: wrong proof for this session".into()));
            }
            if max_frame != s.max_frame {
                return Err(refuse(&mut conn, &mut out, format!("frame limit {max_frame} differs from the session's {}", s.max_frame)));
            }
            attach_session(&s, &mut conn, &mut out, last_reply, |last_received| match &channel {
                Some(ch) => s.secret.attached_proof_channel(ch, &nonces.client, last_received),
                None => s.secret.attached_proof(&nonces, last_received),
            })?;
            s
        }
        Ok(Frame::PeerOpen { mesh, from, to, mac }) => {
            let s = lock(&shared.meshes).get(&mesh).and_then(Weak::upgrade);
            let Some(s) = s.filter(|s| !s.closed.load(Ordering::SeqCst)) else {
                return Err(refuse(&mut conn, &mut out, "no such mesh on this server (not joined yet, or its session is gone)".into()));
            };
            let accepted = {
                let r = lock(&s.remote);
                let m = r.mesh.as_ref().expect("a registered mesh has its info");
                if !m.key.check_open(&nonces, &mesh, from, to, &mac) {
                    Err("authentication failed: the peer does not hold this mesh's key".to_string())
                } else if to != m.index || !m.peers.contains_key(&from) {
                    Err(format!("peer link {from} → {to} does not fit this member (index {})", m.index))
                } else {
                    Ok(m.key.opened_proof(&nonces, &mesh))
                }
            };
            let mac = accepted.map_err(|why| refuse(&mut conn, &mut out, why))?;
            write_frame(&mut conn, &mut out, &Frame::PeerOpened { mac })?;
            conn.set_read_timeout(None)?;
            lock(&s.remote).ins.push(conn.clone());
            let result = peer_receive(shared, &s, from, conn.clone(), max_frame);
            lock(&s.remote).ins.retain(|l| !l.same(&conn)); // a re-made link must not pile up sockets
            return result;
        }
        Ok(other) => return Err(refuse(&mut conn, &mut out, format!("expected open or attach, got {}", frame_name(&other)))),
        Err(ReadError::Wire(w)) => return Err(refuse(&mut conn, &mut out, format!("malformed handshake: {w}"))),
        Err(e) => return Err(handshake_err(e)),
    };
    conn.set_read_timeout(None)?;
    let generation = lock(&session.binding).generation;
    let result = command_loop(shared, &session, &mut conn, generation);
    let mut b = lock(&session.binding);
    if b.generation == generation {
        b.conn = None;
        b.detached_since = Some(Instant::now());
        debug!(session = %hex(&session.id), "detached; waiting for the client to re-attach");
    }
    result
}

fn frame_name(f: &Frame) -> &'static str {
    match f {
        Frame::Hello { .. } => "hello",
        Frame::Welcome { .. } => "welcome",
        Frame::Open { .. } => "open",
        Frame::Attach { .. } => "attach",
        Frame::Opened { .. } => "opened",
        Frame::Attached { .. } => "attached",
        Frame::Refused { .. } => "refused",
        Frame::Command { .. } => "command",
        Frame::Reply { .. } => "reply",
        Frame::Ack { .. } => "ack",
        Frame::Fatal { .. } => "fatal",
        Frame::PeerOpen { .. } => "peer open",
        Frame::PeerOpened { .. } => "peer opened",
        Frame::PeerSubscribe { .. } => "peer subscribe",
        Frame::PeerNotice { .. } => "peer notice",
        Frame::PeerData { .. } => "peer data",
        Frame::PeerReceived { .. } => "peer received",
        Frame::PeerResume { .. } => "peer resume",
    }
}

fn open_session(
    shared: &Arc<Shared>,
    conn: &mut Link,
    out: &mut Vec<u8>,
    nonces: &Nonces,
    max_frame: u32,
    features: u64,
) -> io::Result<Arc<Session>> {
    let id: [u8; 16] = random();
    let s = Arc::new(Session {
        id,
        secret: shared.cfg.token.session_secret(nonces, &id),
        max_frame,
        features,
        binding: Mutex::new(Binding { generation: 1, conn: Some(conn.clone()), detached_since: None }),
        state: Mutex::new(SessionState {
            last_received: 0,
            pending: VecDeque::new(),
            draining: false,
            handoff: false,
            retained: VecDeque::new(),
        }),
        exec_cv: Condvar::new(),
        objects: Mutex::new(Objects::default()),
        remote: Mutex::new(RemoteState::default()),
        remote_cv: Condvar::new(),
        closed: AtomicBool::new(false),
        peer_frames: AtomicU64::new(0),
    });
    let (sh, se) = (shared.clone(), s.clone());
    std::thread::Builder::new().name("sucld-exec".into()).spawn(move || executor_loop(&sh, &se))?;
    lock(&shared.sessions).insert(id, s.clone());
    info!(session = %hex(&id), peer = ?conn.peer_addr().ok(), "session opened");
    let mac = shared.cfg.token.opened_proof(nonces, &id);
    write_frame(conn, out, &Frame::Opened { session: id, max_inflight: shared.cfg.limits.max_inflight, mac })?;
    Ok(s)
}

/// Binds `conn` to `s` (cutting off the connection it had), says the last sequence number
/// received (with `proof` of it), then re-sends the replies the client has not received.
fn attach_session(
    s: &Session,
    conn: &mut Link,
    out: &mut Vec<u8>,
    last_reply: u64,
    proof: impl Fn(u64) -> crate::auth::Tag,
) -> io::Result<()> {
    {
        // Cut the old connection first (without the state lock, which its threads may hold
        // while blocked on it).
        let mut b = lock(&s.binding);
        if let Some(old) = b.conn.take() {
            old.shutdown();
        }
        b.generation += 1;
        b.detached_since = None;
    }
    // Under the state lock no reply is written or retained, so the attach answer comes first
    // and every retained reply follows it in order.
    let mut st = lock(&s.state);
    lock(&s.binding).conn = Some(conn.clone());
    forget_replies(&mut st, last_reply);
    let last_received = st.last_received;
    // The answer and the retained replies in as few writes as they fit (one, usually).
    out.clear();
    Frame::Attached { last_received, mac: proof(last_received) }.encode_into(out);
    for (_, reply) in &st.retained {
        if out.len() + reply.len() > RESEND_BATCH {
            conn.write_all(out)?;
            out.clear();
            if reply.len() > RESEND_BATCH {
                conn.write_all(reply)?; // a large reply goes as it is, not copied
                continue;
            }
        }
        out.extend_from_slice(reply);
    }
    if !out.is_empty() {
        conn.write_all(out)?;
    }
    info!(session = %hex(&s.id), last_received, resent = st.retained.len(), "session re-attached");
    Ok(())
}

fn fatal(conn: &mut Link, reason: String) -> io::Error {
    let mut out = Vec::new();
    let _ = write_frame(conn, &mut out, &Frame::Fatal { reason: reason.clone() });
    conn.shutdown();
    io::Error::new(io::ErrorKind::InvalidData, reason)
}

/// Receives commands: each is checked (sequence, in-flight limit), queued, and — unless
/// another thread is already running the queue — run right here, so that a command that does
/// not wait for anything costs no thread switch.
fn command_loop(shared: &Arc<Shared>, s: &Arc<Session>, conn: &mut Link, generation: u64) -> io::Result<()> {
    let mut reader = BufReader::with_capacity(1 << 16, conn.clone());
    let mut buf = Vec::new();
    loop {
        let frame = match read_frame(&mut reader, &mut buf, s.max_frame) {
            Ok(f) => f,
            Err(ReadError::Io(e)) => return Err(e),
            Err(ReadError::Wire(w)) => return Err(fatal(conn, format!("malformed frame: {w}"))),
        };
        let mut st = lock(&s.state);
        if lock(&s.binding).generation != generation {
            return Ok(()); // a newer connection took the session over
        }
        let (seq, ack, cmd) = match frame {
            Frame::Command { seq, ack, cmd } => (seq, ack, cmd),
            Frame::Ack { upto } => {
                forget_replies(&mut st, upto);
                continue;
            }
            other => return Err(fatal(conn, format!("expected a command, got {}", frame_name(&other)))),
        };
        forget_replies(&mut st, ack);
        if seq <= st.last_received {
            debug!(seq, "duplicate command ignored");
            continue;
        }
        if seq != st.last_received + 1 {
            return Err(fatal(conn, format!("command {seq} after {}: sequence numbers must not skip", st.last_received)));
        }
        if st.retained.len() + st.pending.len() >= shared.cfg.limits.max_inflight as usize {
            let n = shared.cfg.limits.max_inflight;
            return Err(fatal(conn, format!("more than {n} commands in flight (the session's limit)")));
        }
        st.last_received = seq;
        st.pending.push_back((seq, cmd));
        if st.draining {
            continue;
        }
        st.draining = true;
        drop(st);
        drain(shared, s, false);
    }
}

fn forget_replies(st: &mut SessionState, upto: u64) {
    while st.retained.front().is_some_and(|(seq, _)| *seq <= upto) {
        st.retained.pop_front();
    }
}

/// Whether `cmd` would have to wait for a peer (then the executor thread runs it).
fn would_block(s: &Session, cmd: &Command) -> bool {
    let r = lock(&s.remote);
    match cmd {
        Command::MigrateIn { peer, transfer, .. } => r.inbox.get(&(*peer, *transfer)).is_none_or(|i| i.received != i.total),
        Command::WaitRemote { peer, event } => !r.remote_done.contains_key(&(*peer, *event)),
        _ => false,
    }
}

/// Runs queued commands in order until the queue is empty. On the connection's thread
/// (`in_executor` false) it hands over to the executor at the first command that would block.
fn drain(shared: &Arc<Shared>, s: &Arc<Session>, in_executor: bool) {
    loop {
        let (seq, cmd) = {
            let mut st = lock(&s.state);
            let Some((_, head)) = st.pending.front() else {
                st.draining = false;
                return;
            };
            if s.closed.load(Ordering::SeqCst) {
                st.draining = false;
                return;
            }
            if !in_executor && would_block(s, head) {
                st.handoff = true;
                drop(st);
                s.exec_cv.notify_all();
                return;
            }
            st.pending.pop_front().expect("a head was seen")
        };
        let outcome = execute(shared, s, cmd);
        let mut reply = Vec::new();
        Frame::Reply { seq, outcome }.encode_into(&mut reply);
        let mut st = lock(&s.state);
        let conn = lock(&s.binding).conn.clone();
        if let Some(mut c) = conn {
            if c.write_all(&reply).is_err() {
                c.shutdown(); // the client re-attaches; the reply stays retained
            }
        }
        st.retained.push_back((seq, reply));
    }
}

/// The session's executor: runs the queue whenever a command at its head may block.
fn executor_loop(shared: &Arc<Shared>, s: &Arc<Session>) {
    loop {
        let mut st = lock(&s.state);
        while !st.handoff && !s.closed.load(Ordering::SeqCst) {
            st = s.exec_cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if s.closed.load(Ordering::SeqCst) {
            return;
        }
        st.handoff = false;
        drop(st);
        drain(shared, s, true);
    }
}

// ---------------------------------------------------------------------------------------------
// Peer links

/// The outgoing link to mesh member `to`, started (connected by its own thread) on first use.
fn peer_out(shared: &Arc<Shared>, s: &Arc<Session>, r: &mut RemoteState, to: u32) -> Result<Arc<PeerOut>, String> {
    if let Some(o) = r.outs.get(&to) {
        return Ok(o.clone());
    }
    if let Some(why) = r.lost.get(&to) {
        return Err(why.clone());
    }
    let m = r.mesh.as_ref().ok_or("this session is not in a mesh (JoinMesh first)")?;
    let spec = m.peers.get(&to).ok_or_else(|| format!("mesh member {to} does not exist"))?.clone();
    let out = Arc::new(PeerOut { st: Mutex::new(OutState::default()), cv: Condvar::new(), write: Mutex::new(()) });
    let (sh, se, o2, id, key, from) = (shared.clone(), s.clone(), out.clone(), m.id, m.key.clone(), m.index);
    std::thread::Builder::new()
        .name("sucld-peer-out".into())
        .spawn(move || peer_link_loop(&sh, &se, &o2, to, &spec, id, &key, from))
        .map_err(|e| e.to_string())?;
    r.outs.insert(to, out.clone());
    Ok(out)
}

/// Keeps the link to member `to` up: connects, sends queued frames, and when the connection
/// breaks, connects again (authenticated as the first time) — until the session closes or the
/// member cannot be reached within the peer timeout (then it is lost: every wait on it fails,
/// naming it).
#[allow(clippy::too_many_arguments)]
fn peer_link_loop(
    shared: &Arc<Shared>,
    s: &Arc<Session>,
    out: &Arc<PeerOut>,
    to: u32,
    spec: &PeerSpec,
    id: [u8; 16],
    key: &MeshKey,
    from: u32,
) {
    let mut first = true;
    let why = loop {
        let (link, max_frame) = match peer_connect(shared, spec, id, key, from, first) {
            Ok(x) => x,
            Err(why) if first => break why,
            Err(why) => break format!("the link broke and could not be made again: {why}"),
        };
        let generation = {
            let mut st = lock(&out.st);
            if st.closed {
                link.shutdown();
                break String::new();
            }
            st.generation += 1;
            st.link = Some(link.clone());
            st.max_frame = max_frame;
            st.generation
        };
        out.cv.notify_all();
        if !first {
            info!(peer = %spec.address, "peer link to mesh member {to} re-established");
        }
        watch_link(out, generation, link.clone());
        send_queued(out, generation, link.clone());
        out.broken(generation);
        if lock(&out.st).closed {
            break String::new();
        }
        debug!(peer = %spec.address, "peer link to mesh member {to} broke; reconnecting");
        link_changed(s, to);
        first = false;
    };
    if why.is_empty() || s.closed.load(Ordering::SeqCst) {
        return;
    }
    warn!(peer = %spec.address, "peer link to mesh member {to} lost: {why}");
    let why = format!("peer server {} (mesh member {to}): {why}", spec.address);
    let mut st = lock(&out.st);
    st.error = Some(why.clone());
    st.frames.clear();
    drop(st);
    out.cv.notify_all();
    mark_lost(s, to, why);
}

/// Writes the queued frames on connection `generation` until it breaks or the session closes.
fn send_queued(out: &PeerOut, generation: u64, mut link: Link) {
    loop {
        let frame = {
            let mut st = lock(&out.st);
            loop {
                if st.closed || st.generation != generation || st.link.is_none() {
                    return;
                }
                if let Some(f) = st.frames.pop_front() {
                    break f;
                }
                st = out.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        let _w = lock(&out.write);
        if link.write_all(&frame).is_err() {
            // Goes again on the next connection (every peer frame may arrive twice).
            lock(&out.st).frames.push_front(frame);
            return;
        }
    }
}

/// The receiving end of an outgoing link sends nothing back: a read that returns means the
/// link broke (or the peer died), which starts a reconnect at once, even while nothing is
/// being sent.
fn watch_link(out: &Arc<PeerOut>, generation: u64, mut link: Link) {
    let out = out.clone();
    let spawned = std::thread::Builder::new().name("sucld-peer-watch".into()).spawn(move || {
        let mut b = [0u8; 64];
        let _ = link.read(&mut b);
        out.broken(generation);
    });
    if let Err(e) = spawned {
        warn!("cannot watch a peer link: {e}");
    }
}

/// A link with `peer` broke or a new one opened: whatever was in flight on the old one may be
/// lost, so the waits on that peer re-send what they wait on.
fn link_changed(s: &Session, peer: u32) {
    *lock(&s.remote).epoch.entry(peer).or_default() += 1;
    s.remote_cv.notify_all();
}

fn mark_lost(s: &Session, peer: u32, why: String) {
    lock(&s.remote).lost.entry(peer).or_insert(why);
    s.remote_cv.notify_all();
}

/// Connects to a mesh member and proves this server holds the mesh key. The first time it
/// retries while the member has not joined the mesh yet, up to the peer timeout; when it
/// re-connects a link that broke, a refused connection or an unknown mesh means the member
/// (or its session) is gone, and ends it at once.
fn peer_connect(shared: &Shared, spec: &PeerSpec, mesh: [u8; 16], key: &MeshKey, from: u32, first: bool) -> Result<(Link, u32), String> {
    let deadline = Instant::now() + shared.cfg.peer_timeout;
    let tls = if spec.pin == [0; 32] { Tls::Off } else { Tls::Pinned(vec![spec.pin]) };
    let mut pause = Duration::from_millis(1);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = (|| -> Result<(Link, u32), (bool, String)> {
            let mut l = transport::connect(&spec.address, &tls, left.max(Duration::from_millis(1)))
                .map_err(|e| (first || e.kind() != io::ErrorKind::ConnectionRefused, e.to_string()))?;
            l.set_read_timeout(Some(left.max(Duration::from_millis(1)))).map_err(|e| (true, e.to_string()))?;
            let (mut buf, mut out) = (Vec::new(), Vec::new());
            let client: [u8; 16] = random();
            let hello =
                Frame::Hello { min_version: VERSION, max_version: VERSION, features: 0, max_frame: shared.cfg.max_frame, nonce: client };
            write_frame(&mut l, &mut out, &hello).map_err(|e| (true, e.to_string()))?;
            let (max_frame, server) = match read_frame(&mut l, &mut buf, HANDSHAKE_MAX_FRAME) {
                Ok(Frame::Welcome { max_frame, nonce, .. }) => (max_frame, nonce),
                Ok(Frame::Refused { reason }) => return Err((false, reason)),
                Ok(f) => return Err((false, format!("unexpected {} in the handshake", frame_name(&f)))),
                Err(e) => return Err((true, e.to_string())),
            };
            let n = Nonces { client, server };
            let to = spec.index;
            write_frame(&mut l, &mut out, &Frame::PeerOpen { mesh, from, to, mac: key.open_proof(&n, &mesh, from, to) })
                .map_err(|e| (true, e.to_string()))?;
            match read_frame(&mut l, &mut buf, HANDSHAKE_MAX_FRAME) {
                Ok(Frame::PeerOpened { mac }) if key.check_opened(&n, &mesh, &mac) => {}
                Ok(Frame::PeerOpened { .. }) => return Err((false, "the peer could not prove it holds the mesh key".into())),
                Ok(Frame::Refused { reason }) => return Err((first && reason.contains("no such mesh"), reason)),
                Ok(f) => return Err((false, format!("unexpected {} in the handshake", frame_name(&f)))),
                Err(e) => return Err((true, e.to_string())),
            }
            l.set_read_timeout(None).map_err(|e| (true, e.to_string()))?;
            Ok((l, max_frame))
        })();
        match r {
            Ok(x) => return Ok(x),
            Err((retry, why)) => {
                if !retry || Instant::now() + pause >= deadline {
                    return Err(why);
                }
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Queues a small `frame` for member `to` (never waits: reading threads call it).
fn peer_send(shared: &Arc<Shared>, s: &Arc<Session>, to: u32, frame: Vec<u8>) -> Result<(), String> {
    let out = peer_out(shared, s, &mut lock(&s.remote), to)?;
    let mut st = lock(&out.st);
    if let Some(e) = &st.error {
        return Err(e.clone());
    }
    if st.closed {
        return Err("the session is closing".into());
    }
    st.frames.push_back(frame);
    drop(st);
    out.cv.notify_all();
    Ok(())
}

/// The link to member `to` as it is now (waiting, up to the peer timeout, while it is being
/// made): the link, its generation and the largest frame the member accepts.
fn peer_link(shared: &Arc<Shared>, s: &Arc<Session>, to: u32) -> Result<(Arc<PeerOut>, Link, u64, u32), String> {
    let out = peer_out(shared, s, &mut lock(&s.remote), to)?;
    let deadline = Instant::now() + shared.cfg.peer_timeout;
    let mut st = lock(&out.st);
    loop {
        if let Some(e) = &st.error {
            return Err(e.clone());
        }
        if st.closed {
            return Err("the session is closing".into());
        }
        if let Some(l) = &st.link {
            let (l, generation, max_frame) = (l.clone(), st.generation, st.max_frame);
            drop(st);
            return Ok((out, l, generation, max_frame));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            drop(st); // peer_name takes the remote lock, which is taken before this one elsewhere
            return Err(format!("no link to {} within {:?}", peer_name(s, to), shared.cfg.peer_timeout));
        }
        st = out.cv.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
    }
}

/// Tells the peers waiting for local event `event` that it completed.
fn event_done(shared: &Arc<Shared>, s: &Arc<Session>, event: u64) {
    let waiting = {
        let mut r = lock(&s.remote);
        if r.mesh.is_none() {
            return;
        }
        r.done.insert(event);
        r.subscribers.remove(&event).unwrap_or_default()
    };
    for p in waiting {
        let _ = peer_send(shared, s, p, Frame::PeerNotice { event, ok: true }.encode());
    }
}

/// What to do with a data piece that arrived.
enum Piece {
    /// Read it into this chunk and stage what is new of it.
    Stage(Vec<u8>),
    /// All of it was had before (a re-sent transfer): read and drop it.
    Drop,
}

/// The receiving side of a peer link from member `from`. Data pieces go from the socket
/// straight into staging chunks (no frame buffer); once a transfer is complete the source is
/// told ([`Frame::PeerReceived`]).
fn peer_receive(shared: &Arc<Shared>, s: &Arc<Session>, from: u32, conn: Link, max_frame: u32) -> io::Result<()> {
    // Small: headers and notices come through it; data bypasses it.
    let mut reader = BufReader::with_capacity(8 << 10, conn.clone());
    let mut buf = Vec::new();
    let mut scratch = Vec::new();
    let limit = shared.cfg.limits.max_bytes;
    if !lock(&s.remote).linked_from.insert(from) {
        link_changed(s, from); // a link made again: what went over the old one may be lost
    }
    let result = loop {
        let f = match wire::read_peer_frame(&mut reader, &mut buf, max_frame) {
            Ok(f) => f,
            Err(e) => break Err(io::Error::other(e.to_string())),
        };
        s.peer_frames.fetch_add(1, Ordering::Relaxed);
        let h = match f {
            wire::PeerRead::Data(h) => h,
            wire::PeerRead::Frame(Frame::PeerSubscribe { event }) => {
                let done = {
                    let mut r = lock(&s.remote);
                    let done = r.done.contains(&event);
                    if !done {
                        let subs = r.subscribers.entry(event).or_default();
                        if !subs.contains(&from) {
                            subs.push(from);
                        }
                    }
                    done
                };
                if done {
                    let _ = peer_send(shared, s, from, Frame::PeerNotice { event, ok: true }.encode());
                }
                continue;
            }
            wire::PeerRead::Frame(Frame::PeerNotice { event, ok }) => {
                lock(&s.remote).remote_done.insert((from, event), ok);
                s.remote_cv.notify_all();
                continue;
            }
            wire::PeerRead::Frame(Frame::PeerReceived { transfer, received }) => {
                let mut r = lock(&s.remote);
                let p = r.progress.entry((from, transfer)).or_default();
                *p = (*p).max(received);
                drop(r);
                s.remote_cv.notify_all();
                continue;
            }
            wire::PeerRead::Frame(Frame::PeerResume { transfer }) => {
                let held = {
                    let r = lock(&s.remote);
                    match (r.finished.get(&(from, transfer)), r.inbox.get(&(from, transfer))) {
                        (Some(total), _) => *total,
                        (None, Some(i)) => i.received,
                        (None, None) => 0,
                    }
                };
                let _ = peer_send(shared, s, from, Frame::PeerReceived { transfer, received: held }.encode());
                continue;
            }
            wire::PeerRead::Frame(other) => break Err(io::Error::other(format!("unexpected {} on a peer link", frame_name(&other)))),
        };
        let key = (from, h.transfer);
        let end = h.offset.checked_add(h.len as u64).filter(|e| *e <= h.total);
        let piece = {
            let mut r = lock(&s.remote);
            if end.is_none() || h.total > limit {
                break Err(io::Error::other(format!(
                    "transfer {}: a piece at {} of {} bytes does not fit its {} bytes (or the session's limit {limit})",
                    h.transfer, h.offset, h.len, h.total
                )));
            }
            if r.finished.contains_key(&key) {
                Piece::Drop
            } else {
                let staged = r.staged;
                let inc = r.inbox.entry(key).or_insert_with(|| Incoming { total: h.total, received: 0, chunks: VecDeque::new() });
                if inc.total != h.total || h.offset > inc.received {
                    break Err(io::Error::other(format!(
                        "transfer {}: a piece at {} does not follow the {} bytes received",
                        h.transfer, h.offset, inc.received
                    )));
                }
                let skip = (inc.received - h.offset).min(h.len as u64) as usize;
                if skip == h.len {
                    Piece::Drop
                } else if staged + (h.len - skip) as u64 > limit {
                    break Err(io::Error::other(format!("more than the session's limit of {limit} bytes staged for transfers")));
                } else {
                    Piece::Stage(r.chunk(h.len))
                }
            }
        };
        match piece {
            Piece::Drop => {
                scratch.resize(h.len.min(STAGE_CHUNK), 0);
                let mut left = h.len;
                while left > 0 {
                    let n = left.min(scratch.len());
                    if let Err(e) = reader.read_exact(&mut scratch[..n]) {
                        return peer_receive_end(s, from, Err(e));
                    }
                    left -= n;
                }
            }
            Piece::Stage(mut chunk) => {
                // Read it all; if the link breaks part way, what did arrive is staged still (in
                // order and, over TLS, authenticated), so a resumed transfer goes on from there.
                let mut got = 0;
                let mut broke = None;
                while got < h.len {
                    match reader.read(&mut chunk[got..h.len]) {
                        Ok(0) => broke = Some(io::Error::new(io::ErrorKind::UnexpectedEof, "the link closed inside a data piece")),
                        Ok(n) => got += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => broke = Some(e),
                    }
                    if broke.is_some() {
                        break;
                    }
                }
                let mut r = lock(&s.remote);
                let Some(inc) = r.inbox.get_mut(&key) else {
                    continue; // the session is closing, or the transfer was given up
                };
                // What is new of it now (the old link's reader may have staged some meanwhile:
                // after a reconnect, pieces can come over two links).
                let skip = (inc.received.saturating_sub(h.offset)).min(got as u64) as usize;
                let n = got - skip;
                if skip > 0 {
                    chunk.copy_within(skip..got, 0);
                }
                inc.received += n as u64;
                if n > 0 {
                    inc.chunks.push_back((chunk, n));
                    r.staged += n as u64;
                } else {
                    r.recycle(chunk);
                }
                drop(r);
                s.remote_cv.notify_all();
                if let Some(e) = broke {
                    return peer_receive_end(s, from, Err(e));
                }
            }
        }
        if end == Some(h.total) && r_complete(s, key) {
            let _ = peer_send(shared, s, from, Frame::PeerReceived { transfer: h.transfer, received: h.total }.encode());
        }
    };
    peer_receive_end(s, from, result)
}

/// Whether every byte of incoming transfer `key` arrived (staged, or already taken).
fn r_complete(s: &Session, key: (u32, u64)) -> bool {
    let r = lock(&s.remote);
    r.finished.contains_key(&key) || r.inbox.get(&key).is_some_and(|i| i.received == i.total)
}

fn peer_receive_end(s: &Session, from: u32, result: io::Result<()>) -> io::Result<()> {
    if !s.closed.load(Ordering::SeqCst) {
        // The source re-connects and re-sends; waits here see the change.
        link_changed(s, from);
    }
    result
}

/// Waits (up to the peer timeout) until `ready` says yes or a failure ends the wait. `resend`
/// runs first and again whenever a link with `peer` broke or was made again (what it sent may
/// have been lost on the way; every peer frame may arrive twice).
fn wait_remote<T>(
    shared: &Shared,
    s: &Session,
    peer: u32,
    what: &str,
    mut ready: impl FnMut(&mut RemoteState) -> Option<Result<T, String>>,
    mut resend: impl FnMut() -> Result<(), String>,
) -> Result<T, Outcome> {
    let deadline = Instant::now() + shared.cfg.peer_timeout;
    let mut seen = None;
    let mut r = lock(&s.remote);
    loop {
        if let Some(x) = ready(&mut r) {
            return x.map_err(|e| failed(code::PEER, e));
        }
        if let Some(why) = r.lost.get(&peer) {
            return Err(failed(code::PEER, format!("{what}: {why}")));
        }
        if s.closed.load(Ordering::SeqCst) {
            return Err(failed(code::PEER, format!("{what}: the session is closing")));
        }
        let epoch = r.epoch(peer);
        if seen != Some(epoch) {
            seen = Some(epoch);
            drop(r);
            resend().map_err(|e| failed(code::PEER, format!("{what}: {e}")))?;
            r = lock(&s.remote);
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            drop(r); // peer_name takes the remote lock
            return Err(failed(code::PEER, format!("{what}: nothing from {} within {:?}", peer_name(s, peer), shared.cfg.peer_timeout)));
        }
        r = s.remote_cv.wait_timeout(r, left).unwrap_or_else(|p| p.into_inner()).0;
    }
}

/// Gives up incoming transfer `key`: its staged bytes are freed and later pieces dropped.
fn abandon(s: &Session, key: (u32, u64)) {
    let mut r = lock(&s.remote);
    if let Some(inc) = r.inbox.remove(&key) {
        r.staged -= inc.chunks.iter().map(|c| c.1 as u64).sum::<u64>();
        for (c, _) in inc.chunks {
            r.recycle(c);
        }
        r.finish(key, inc.total);
    }
}

/// Receives transfer `key` into buffer `id` at `offset` (at most `len` bytes), copying each
/// staged piece into the buffer as soon as it is there (while the link reads the next ones).
/// Returns the transfer's size.
fn receive_transfer(shared: &Shared, s: &Session, key: (u32, u64), id: u64, offset: u64, len: u64) -> Result<u64, Outcome> {
    let (peer, transfer) = key;
    let what = format!("receiving transfer {transfer} from mesh member {peer}");
    let mut copied = 0u64;
    let mut checked = false;
    loop {
        let (pieces, total) = wait_remote(
            shared,
            s,
            peer,
            &what,
            |r| {
                let inc = r.inbox.get_mut(&key)?;
                if inc.chunks.is_empty() && inc.received != inc.total {
                    return None;
                }
                let total = inc.total;
                let pieces = std::mem::take(&mut inc.chunks);
                r.staged -= pieces.iter().map(|c| c.1 as u64).sum::<u64>();
                Some(Ok((pieces, total)))
            },
            || Ok(()),
        )?;
        let r = (|| {
            let mut o = lock(&s.objects);
            let b = buffer(&mut o, id)?;
            if !checked {
                if total > len {
                    return Err(failed(code::INVALID, format!("transfer {transfer} brings {total} bytes, more than the {len} expected")));
                }
                span("migration destination", offset, total, b.mem.len())?;
                checked = true;
            }
            for (chunk, n) in &pieces {
                let at = (offset + copied) as usize;
                match &mut b.mem {
                    Mem::Host(m) => m.bytes_mut()[at..at + n].copy_from_slice(&chunk[..*n]),
                    #[cfg(feature = "cuda")]
                    Mem::Cuda(m) => m.write(at, &chunk[..*n])?,
                }
                copied += *n as u64;
            }
            Ok(())
        })();
        let mut rs = lock(&s.remote);
        for (c, _) in pieces {
            rs.recycle(c);
        }
        drop(rs);
        if let Err(e) = r {
            abandon(s, key);
            return Err(e);
        }
        if copied == total {
            abandon(s, key); // nothing is left: only marks it finished
            return Ok(total);
        }
    }
}

/// Sends bytes `range` of `mem` to member `peer` as transfer `transfer`, straight from the
/// buffer (a frame header, then the bytes, in one write), and waits until the member confirms
/// it holds them all. When the link breaks on the way, it asks the member (over the link made
/// again) how much arrived and sends the rest.
fn send_transfer(
    shared: &Arc<Shared>,
    s: &Arc<Session>,
    mem: &Mem,
    range: std::ops::Range<usize>,
    peer: u32,
    transfer: u64,
) -> Result<(), Outcome> {
    let what = format!("migrating to mesh member {peer}");
    let key = (peer, transfer);
    let total = range.len() as u64;
    let mut from = 0u64; // what the member holds
    let mut resumed = false;
    #[cfg(feature = "cuda")]
    let mut staging = Vec::new();
    loop {
        let (out, link, generation, max_frame) = peer_link(shared, s, peer).map_err(|e| failed(code::PEER, format!("{what}: {e}")))?;
        let epoch = lock(&s.remote).epoch(peer);
        if resumed {
            lock(&s.remote).progress.remove(&key);
            let q = Frame::PeerResume { transfer }.encode();
            let sent = {
                let _w = lock(&out.write);
                link.write_parts(&[&q])
            };
            if sent.is_err() {
                out.broken(generation);
                continue;
            }
            // The answer, or `None` when the link broke again before it came (ask again).
            let held = wait_remote(
                shared,
                s,
                peer,
                &what,
                |r| match r.progress.get(&key) {
                    Some(n) => Some(Ok(Some(*n))),
                    None => (r.epoch(peer) != epoch).then_some(Ok(None)),
                },
                || Ok(()),
            )?;
            match held {
                Some(n) if n <= total => from = n,
                Some(n) => return Err(failed(code::PEER, format!("{what}: the member holds {n} bytes of a {total}-byte transfer"))),
                None => continue,
            }
        }
        let piece = (max_frame as usize).saturating_sub(wire::PEER_DATA_OVERHEAD).clamp(1, STAGE_CHUNK);
        let mut at = range.start + from as usize;
        let mut broke = false;
        loop {
            let end = (at + piece).min(range.end);
            let head = wire::peer_data_head(transfer, total, (at - range.start) as u64, end - at);
            let data: &[u8] = match mem {
                Mem::Host(m) => &m.bytes()[at..end],
                #[cfg(feature = "cuda")]
                Mem::Cuda(m) => {
                    staging.resize(end - at, 0);
                    m.read_into(at..end, &mut staging)?;
                    &staging
                }
            };
            let w = {
                let _w = lock(&out.write);
                link.write_parts(&[&head, data])
            };
            if w.is_err() {
                out.broken(generation);
                broke = true;
                break;
            }
            at = end;
            if at >= range.end {
                break;
            }
        }
        resumed = true;
        if broke {
            continue;
        }
        let confirmed = wait_remote(
            shared,
            s,
            peer,
            &what,
            |r| {
                if r.progress.get(&key) == Some(&total) {
                    r.progress.remove(&key);
                    return Some(Ok(true));
                }
                (r.epoch(peer) != epoch).then_some(Ok(false))
            },
            || Ok(()),
        )?;
        if confirmed {
            return Ok(());
        }
    }
}

pub(crate) fn failed(code: u16, message: impl Into<String>) -> Outcome {
    Outcome::Failed { code, message: message.into() }
}

/// `offset..offset+len` inside a buffer of `size` bytes, or why not.
fn span(what: &str, offset: u64, len: u64, size: usize) -> Result<std::ops::Range<usize>, Outcome> {
    match offset.checked_add(len) {
        Some(end) if end <= size as u64 => Ok(offset as usize..end as usize),
        _ => Err(failed(code::INVALID, format!("{what}: bytes {offset}..{offset}+{len} are outside the buffer's {size} bytes"))),
    }
}

fn execute(shared: &Arc<Shared>, s: &Arc<Session>, cmd: Command) -> Outcome {
    match exec(shared, s, cmd) {
        Ok(x) | Err(x) => x,
    }
}

/// How errors name mesh member `peer`: its address and index.
fn peer_name(s: &Session, peer: u32) -> String {
    let r = lock(&s.remote);
    match r.mesh.as_ref().and_then(|m| m.peers.get(&peer)) {
        Some(p) => format!("peer server {} (mesh member {peer})", p.address),
        None => format!("mesh member {peer}"),
    }
}

/// The mesh member `peer` of this session, or why there is none.
fn check_peer(s: &Session, peer: u32) -> Result<(), Outcome> {
    let r = lock(&s.remote);
    match &r.mesh {
        None => Err(failed(code::INVALID, "this session is not in a mesh (JoinMesh first)")),
        Some(m) if !m.peers.contains_key(&peer) => Err(failed(code::INVALID, format!("mesh member {peer} does not exist"))),
        Some(_) => Ok(()),
    }
}

/// Commands that involve peers; the rest run on the session's objects.
fn exec(shared: &Arc<Shared>, s: &Arc<Session>, cmd: Command) -> Result<Outcome, Outcome> {
    match cmd {
        Command::JoinMesh { mesh, key, index, peers } => {
            lock(&s.objects).stats.executed += 1;
            join_mesh(shared, s, mesh, key, index, peers)
        }
        Command::WaitRemote { peer, event } => {
            lock(&s.objects).stats.executed += 1;
            check_peer(s, peer)?;
            let what = format!("waiting for event {event} of mesh member {peer}");
            wait_remote(
                shared,
                s,
                peer,
                &what,
                |r| {
                    r.remote_done.get(&(peer, event)).map(|ok| {
                        if *ok {
                            Ok(())
                        } else {
                            Err(format!("event {event} of mesh member {peer} failed"))
                        }
                    })
                },
                || peer_send(shared, s, peer, Frame::PeerSubscribe { event }.encode()),
            )?;
            Ok(Outcome::Done)
        }
        Command::MigrateIn { buffer: id, offset, len, peer, transfer } => {
            lock(&s.objects).stats.executed += 1;
            check_peer(s, peer)?;
            // A link to the source, though nothing goes out on it: if the source dies, its
            // re-connection is refused and this wait fails at once.
            peer_out(shared, s, &mut lock(&s.remote), peer).map_err(|e| failed(code::PEER, e))?;
            let total = receive_transfer(shared, s, (peer, transfer), id, offset, len)?;
            let mut o = lock(&s.objects);
            if let Some(sb) = buffer(&mut o, id)?.content {
                set_content_len(&mut o, sb, offset + total)?;
            }
            Ok(Outcome::Done)
        }
        Command::MigrateOut { buffer: id, offset, len, peer, transfer } => {
            let mut o = lock(&s.objects);
            o.stats.executed += 1;
            check_peer(s, peer)?;
            let len = trimmed(&mut o, id, offset, len)?;
            let b = buffer(&mut o, id)?;
            let r = span("migration source", offset, len, b.mem.len())?;
            send_transfer(shared, s, &b.mem, r, peer, transfer)?;
            Ok(Outcome::Done)
        }
        other => {
            let mut o = lock(&s.objects);
            o.stats.executed += 1;
            run(shared, s, &mut o, other)
        }
    }
}

fn join_mesh(
    shared: &Arc<Shared>,
    s: &Arc<Session>,
    mesh: [u8; 16],
    key: [u8; 32],
    index: u32,
    peers: Vec<PeerSpec>,
) -> Result<Outcome, Outcome> {
    let mut map = HashMap::new();
    for p in peers {
        if p.index == index {
            return Err(failed(code::INVALID, format!("mesh member {index} is this server; it cannot be its own peer")));
        }
        if map.insert(p.index, p).is_some() {
            return Err(failed(code::INVALID, "two mesh members with one index"));
        }
    }
    let mut r = lock(&s.remote);
    if r.mesh.is_some() {
        return Err(failed(code::INVALID, "this session is already in a mesh"));
    }
    {
        let mut meshes = lock(&shared.meshes);
        if meshes.get(&mesh).is_some_and(|w| w.strong_count() > 0) {
            return Err(failed(code::INVALID, "this mesh id is already in use on this server"));
        }
        meshes.insert(mesh, Arc::downgrade(s));
    }
    r.mesh = Some(MeshInfo { id: mesh, key: MeshKey(key), index, peers: map });
    Ok(Outcome::Done)
}

/// The content size of buffer `id` if it has a size buffer.
fn content_len(o: &mut Objects, id: u64) -> Result<Option<u64>, Outcome> {
    let Some(sb) = buffer(o, id)?.content else { return Ok(None) };
    let b = buffer(o, sb).map_err(|_| failed(code::INVALID, format!("the size buffer {sb} of buffer {id} was freed")))?;
    let mut v = [0u8; 8];
    match &b.mem {
        Mem::Host(m) => v.copy_from_slice(&m.bytes()[..8]),
        #[cfg(feature = "cuda")]
        Mem::Cuda(m) => v.copy_from_slice(&m.read(0..8)?),
    }
    Ok(Some(u64::from_le_bytes(v)))
}

fn set_content_len(o: &mut Objects, sb: u64, n: u64) -> Result<(), Outcome> {
    let b = buffer(o, sb)?;
    match &mut b.mem {
        Mem::Host(m) => m.bytes_mut()[..8].copy_from_slice(&n.to_le_bytes()),
        #[cfg(feature = "cuda")]
        Mem::Cuda(m) => m.write(0, &n.to_le_bytes())?,
    }
    Ok(())
}

/// `len` trimmed to the buffer's meaningful bytes after `offset` (content size).
fn trimmed(o: &mut Objects, id: u64, offset: u64, len: u64) -> Result<u64, Outcome> {
    Ok(match content_len(o, id)? {
        Some(c) => len.min(c.saturating_sub(offset)),
        None => len,
    })
}

fn device(shared: &Shared, device: u32) -> Result<&Served, Outcome> {
    shared
        .devices
        .get(device as usize)
        .ok_or_else(|| failed(code::INVALID, format!("device {device} does not exist ({} offered)", shared.devices.len())))
}

fn buffer(o: &mut Objects, id: u64) -> Result<&mut Buf, Outcome> {
    o.buffers.get_mut(&id).ok_or_else(|| failed(code::INVALID, format!("buffer {id} does not exist in this session")))
}

fn run(shared: &Arc<Shared>, s: &Arc<Session>, o: &mut Objects, cmd: Command) -> Result<Outcome, Outcome> {
    let max_frame = s.max_frame;
    let limits = &shared.cfg.limits;
    match cmd {
        Command::Nop => Ok(Outcome::Done),
        Command::Devices => Ok(Outcome::Devices(shared.devices.iter().map(Served::info).collect())),
        Command::Stats => Ok(Outcome::Stats(SessionStats { peer_frames: s.peer_frames.load(Ordering::Relaxed), ..o.stats })),
        Command::CreateQueue { queue, device: d } => {
            device(shared, d)?;
            if o.queues.contains_key(&queue) {
                return Err(failed(code::INVALID, format!("queue {queue} already exists")));
            }
            if o.queues.len() >= limits.max_queues as usize {
                return Err(failed(code::LIMIT, format!("the session already holds {} queues (its limit)", limits.max_queues)));
            }
            o.queues.insert(queue, d);
            Ok(Outcome::Done)
        }
        Command::Alloc { buffer: id, device: d, bytes } => {
            let dev = device(shared, d)?;
            if o.buffers.contains_key(&id) {
                return Err(failed(code::INVALID, format!("buffer {id} already exists")));
            }
            if o.buffers.len() >= limits.max_buffers as usize {
                return Err(failed(code::LIMIT, format!("the session already holds {} buffers (its limit)", limits.max_buffers)));
            }
            let in_use = o.stats.bytes_in_use;
            if in_use.saturating_add(bytes) > limits.max_bytes {
                return Err(failed(
                    code::LIMIT,
                    format!("allocating {bytes} bytes would exceed the session's memory limit: {in_use} in use of {}", limits.max_bytes),
                ));
            }
            let mem = match dev {
                Served::Host { .. } => Mem::Host(HostMem::zeroed(bytes as usize)),
                #[cfg(feature = "cuda")]
                Served::Cuda(c) => Mem::Cuda(c.alloc(bytes as usize)?),
            };
            o.buffers.insert(id, Buf { device: d, mem, content: None });
            o.stats.bytes_in_use += bytes;
            o.stats.buffers = o.buffers.len() as u32;
            Ok(Outcome::Done)
        }
        Command::Free { buffer: id } => {
            let b = o.buffers.remove(&id).ok_or_else(|| failed(code::INVALID, format!("buffer {id} does not exist in this session")))?;
            o.stats.bytes_in_use -= b.mem.len() as u64;
            o.stats.buffers = o.buffers.len() as u32;
            Ok(Outcome::Done)
        }
        Command::Write { buffer: id, offset, data } => {
            let b = buffer(o, id)?;
            let r = span("write", offset, data.len() as u64, b.mem.len())?;
            match &mut b.mem {
                Mem::Host(m) => m.bytes_mut()[r].copy_from_slice(&data),
                #[cfg(feature = "cuda")]
                Mem::Cuda(m) => m.write(r.start, &data)?,
            }
            Ok(Outcome::Done)
        }
        Command::Read { buffer: id, offset, len } => {
            let room = (max_frame as usize).saturating_sub(wire::READ_REPLY_OVERHEAD) as u64;
            if len > room {
                return Err(failed(code::INVALID, format!("a read of {len} bytes does not fit one frame (at most {room}); split it")));
            }
            let len = trimmed(o, id, offset, len)?;
            let b = buffer(o, id)?;
            let r = span("read", offset, len, b.mem.len())?;
            match &b.mem {
                Mem::Host(m) => Ok(Outcome::Data(m.bytes()[r].to_vec())),
                #[cfg(feature = "cuda")]
                Mem::Cuda(m) => Ok(Outcome::Data(m.read(r)?)),
            }
        }
        Command::Copy { src, src_offset, dst, dst_offset, len } => {
            let len = trimmed(o, src, src_offset, len)?;
            copy(o, src, src_offset, dst, dst_offset, len)
        }
        Command::SetContentSize { buffer: id, size_buffer } => {
            if size_buffer != 0 {
                let dev = buffer(o, id)?.device;
                let sb = buffer(o, size_buffer)?;
                if size_buffer == id || sb.mem.len() < 8 || sb.device != dev {
                    return Err(failed(
                        code::INVALID,
                        format!("size buffer {size_buffer}: must be another buffer of at least 8 bytes on the same device as buffer {id}"),
                    ));
                }
            }
            buffer(o, id)?.content = (size_buffer != 0).then_some(size_buffer);
            Ok(Outcome::Done)
        }
        Command::JoinMesh { .. } | Command::MigrateIn { .. } | Command::MigrateOut { .. } | Command::WaitRemote { .. } => {
            unreachable!("peer commands run in exec")
        }
        Command::Fill { buffer: id, offset, len, pattern } => {
            if pattern.is_empty() || len % pattern.len() as u64 != 0 {
                return Err(failed(code::INVALID, format!("fill: {len} bytes are not a whole number of {}-byte patterns", pattern.len())));
            }
            let b = buffer(o, id)?;
            let r = span("fill", offset, len, b.mem.len())?;
            match &mut b.mem {
                Mem::Host(m) => {
                    for chunk in m.bytes_mut()[r].chunks_exact_mut(pattern.len()) {
                        chunk.copy_from_slice(&pattern);
                    }
                }
                #[cfg(feature = "cuda")]
                Mem::Cuda(m) => m.fill(r, &pattern)?,
            }
            Ok(Outcome::Done)
        }
        Command::Launch { queue, kernel, args, range } => launch(shared, o, queue, &kernel, &args, range),
        #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
        Command::CompileCuda { device: d, name, source } => match device(shared, d)? {
            Served::Host { .. } => Err(failed(code::UNSUPPORTED, format!("device {d} is a host device; CUDA kernels need a CUDA device"))),
            #[cfg(feature = "cuda")]
            Served::Cuda(c) => {
                let k = c.compile(&name, &source)?;
                o.cuda_kernels.insert((d, name), k);
                Ok(Outcome::Done)
            }
        },
        Command::Record { queue, event } => {
            let d = *o.queues.get(&queue).ok_or_else(|| failed(code::INVALID, format!("queue {queue} does not exist")))?;
            if o.events.len() >= limits.max_events as usize && !o.events.contains_key(&event) {
                return Err(failed(code::LIMIT, format!("the session already holds {} events (its limit)", limits.max_events)));
            }
            let ev = match device(shared, d)? {
                Served::Host { .. } => Ev::Done,
                #[cfg(feature = "cuda")]
                Served::Cuda(c) => Ev::Cuda(c.record()?),
            };
            // A peer may wait for it: tell it once complete (CUDA: synchronize first, only when
            // this session is in a mesh).
            #[cfg(feature = "cuda")]
            if let Ev::Cuda(e) = &ev {
                if lock(&s.remote).mesh.is_some() {
                    crate::cuda::sync_event(e)?;
                }
            }
            o.events.insert(event, ev); // re-recording an event id moves it, as in CUDA
            event_done(shared, s, event);
            Ok(Outcome::Done)
        }
        Command::WaitEvent { queue, event } => {
            let d = *o.queues.get(&queue).ok_or_else(|| failed(code::INVALID, format!("queue {queue} does not exist")))?;
            let ev = o.events.get(&event).ok_or_else(|| failed(code::INVALID, format!("event {event} does not exist")))?;
            match (device(shared, d)?, ev) {
                (_, Ev::Done) => Ok(Outcome::Done),
                #[cfg(feature = "cuda")]
                (Served::Cuda(c), Ev::Cuda(e)) => c.wait_for(e).map(|_| Outcome::Done),
                #[cfg(feature = "cuda")]
                (Served::Host { .. }, Ev::Cuda(e)) => crate::cuda::sync_event(e).map(|_| Outcome::Done),
            }
        }
        Command::SyncEvent { event } => {
            match o.events.get(&event).ok_or_else(|| failed(code::INVALID, format!("event {event} does not exist")))? {
                Ev::Done => Ok(Outcome::Done),
                #[cfg(feature = "cuda")]
                Ev::Cuda(e) => crate::cuda::sync_event(e).map(|_| Outcome::Done),
            }
        }
        Command::Finish { queue } => {
            let d = *o.queues.get(&queue).ok_or_else(|| failed(code::INVALID, format!("queue {queue} does not exist")))?;
            match device(shared, d)? {
                Served::Host { .. } => Ok(Outcome::Done),
                #[cfg(feature = "cuda")]
                Served::Cuda(c) => c.synchronize().map(|_| Outcome::Done),
            }
        }
    }
}

fn copy(o: &mut Objects, src: u64, src_offset: u64, dst: u64, dst_offset: u64, len: u64) -> Result<Outcome, Outcome> {
    let (sd, sl) = {
        let b = buffer(o, src)?;
        (b.device, b.mem.len())
    };
    let rs = span("copy source", src_offset, len, sl)?;
    let (dd, dl) = {
        let b = buffer(o, dst)?;
        (b.device, b.mem.len())
    };
    let rd = span("copy destination", dst_offset, len, dl)?;
    if sd != dd {
        return Err(failed(code::INVALID, format!("copy between devices {sd} and {dd}: copies stay on one device")));
    }
    if src == dst {
        match &mut buffer(o, src)?.mem {
            Mem::Host(m) => m.bytes_mut().copy_within(rs, rd.start),
            #[cfg(feature = "cuda")]
            Mem::Cuda(m) => m.copy_within(rs, rd.start)?,
        }
        return Ok(Outcome::Done);
    }
    let s = o.buffers.remove(&src).expect("checked above");
    let r = match (&s.mem, &mut buffer(o, dst)?.mem) {
        (Mem::Host(a), Mem::Host(b)) => {
            b.bytes_mut()[rd].copy_from_slice(&a.bytes()[rs]);
            Ok(Outcome::Done)
        }
        #[cfg(feature = "cuda")]
        (Mem::Cuda(a), Mem::Cuda(b)) => b.copy_from(a, rs, rd.start).map(|_| Outcome::Done),
        #[cfg(feature = "cuda")]
        _ => Err(failed(code::INVALID, "copy between a host and a CUDA buffer")),
    };
    o.buffers.insert(src, s);
    r
}

fn launch(shared: &Shared, o: &mut Objects, queue: u64, kernel: &str, args: &[Arg], range: u64) -> Result<Outcome, Outcome> {
    let d = *o.queues.get(&queue).ok_or_else(|| failed(code::INVALID, format!("queue {queue} does not exist")))?;
    o.stats.launches += 1;
    match device(shared, d)? {
        Served::Host { .. } => {
            let f = shared
                .cfg
                .kernels
                .get(kernel)
                .ok_or_else(|| failed(code::KERNEL, format!("no host kernel named `{kernel}` in this daemon")))?;
            // Take each buffer argument out of the session for the call (so each is borrowed once),
            // and put every one back whatever happens.
            let mut taken: Vec<Option<(u64, Buf)>> = Vec::with_capacity(args.len());
            let mut problem = None;
            for (i, a) in args.iter().enumerate() {
                taken.push(None);
                if let Arg::Buffer(id) = a {
                    match o.buffers.remove(id) {
                        Some(b) if b.device == d && matches!(b.mem, Mem::Host(_)) => taken[i] = Some((*id, b)),
                        Some(b) => {
                            problem = Some(format!("argument {i}: buffer {id} lives on device {}, the queue on device {d}", b.device));
                            o.buffers.insert(*id, b);
                        }
                        None if taken.iter().flatten().any(|(t, _)| t == id) => {
                            problem = Some(format!("argument {i}: buffer {id} is passed twice"))
                        }
                        None => problem = Some(format!("argument {i}: buffer {id} does not exist in this session")),
                    }
                }
                if problem.is_some() {
                    break;
                }
            }
            let result = match problem {
                Some(p) => Err(p),
                None => {
                    let mems = taken
                        .iter_mut()
                        .map(|t| match t {
                            Some((_, Buf { mem: Mem::Host(m), .. })) => Some(m),
                            _ => None,
                        })
                        .collect();
                    f(&mut KernelCall::new(args, mems, range))
                }
            };
            for (id, b) in taken.into_iter().flatten() {
                o.buffers.insert(id, b);
            }
            result.map(|_| Outcome::Done).map_err(|e| failed(code::KERNEL, format!("kernel `{kernel}`: {e}")))
        }
        #[cfg(feature = "cuda")]
        Served::Cuda(c) => {
            let mut ptrs = Vec::with_capacity(args.len());
            for (i, a) in args.iter().enumerate() {
                ptrs.push(match a {
                    Arg::Buffer(id) => match o.buffers.get(id) {
                        Some(Buf { mem: Mem::Cuda(m), device, .. }) if *device == d => crate::cuda::LaunchArg::Ptr(m.device_ptr()),
                        _ => return Err(failed(code::INVALID, format!("argument {i}: buffer {id} is not a CUDA buffer of device {d}"))),
                    },
                    other => crate::cuda::LaunchArg::Scalar(*other),
                });
            }
            let k = o
                .cuda_kernels
                .get(&(d, kernel.to_string()))
                .ok_or_else(|| failed(code::KERNEL, format!("no CUDA kernel `{kernel}` was compiled on device {d} in this session")))?;
            c.launch(k, &ptrs, range).map(|_| Outcome::Done)
        }
    }
}
