//! The daemon as a library: [`Daemon::start`] serves a node's devices on a TCP address until
//! [`Daemon::shutdown`]. The `sucld` binary is a thin command line over it; a program that wants
//! its own host kernels builds a [`DaemonConfig`] with its [`KernelRegistry`] and starts one.
//!
//! One thread accepts connections and one thread serves each connection. A session outlives its
//! connection for the reconnect window: its buffers, queues and events stay, and so do the
//! replies the client has not acknowledged. Commands of a session run in sequence-number order,
//! each exactly once: a command whose number the session already received is not run again.

use crate::auth::{random, Nonces, SessionSecret, Token};
use crate::kernels::{HostMem, KernelCall, KernelRegistry};
use crate::wire::{
    self, code, feature, read_frame, write_frame, Arg, Command, DeviceInfo, DeviceKind, Frame, Outcome, ReadError, SessionStats,
    HANDSHAKE_MAX_FRAME, MIN_MAX_FRAME, VERSION,
};
use std::collections::{HashMap, VecDeque};
use std::io::{self, BufReader};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
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
}

impl DaemonConfig {
    /// Loopback, any free port, one host device, the built-in kernels, default limits, a 60 s
    /// reconnect window.
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
    /// Host queues run each command before answering it, so their events are complete when
    /// recorded.
    Done,
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::CudaEv),
}

/// Where a session's replay state lives: guarded together with the objects, so that receiving a
/// command, running it and retaining its reply is one step.
struct SessionState {
    last_received: u64,
    /// Encoded reply frames the client has not acknowledged, oldest first.
    retained: VecDeque<(u64, Vec<u8>)>,
    objects: Objects,
}

/// The connection a session is bound to, guarded apart from the state so that a re-attaching
/// connection can cut off the old one even while the old one is blocked holding the state.
struct Binding {
    generation: u64,
    conn: Option<TcpStream>,
    detached_since: Option<Instant>,
}

struct Session {
    id: [u8; 16],
    secret: SessionSecret,
    binding: Mutex<Binding>,
    state: Mutex<SessionState>,
}

struct Shared {
    cfg: DaemonConfig,
    devices: Vec<Served>,
    sessions: Mutex<HashMap<[u8; 16], Arc<Session>>>,
    stop: AtomicBool,
    conns: Mutex<Vec<TcpStream>>,
}

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
        if !addr.ip().is_loopback() {
            warn!(%addr, "listening beyond loopback: traffic after the handshake is not encrypted");
        }
        info!(%addr, devices = devices.len(), kernels = ?cfg.kernels.names(), "sucld listening");
        let shared = Arc::new(Shared {
            cfg,
            devices,
            sessions: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new().name("sucld-accept".into()).spawn(move || accept_loop(&s, listener))?;
        let s = shared.clone();
        let reaper = std::thread::Builder::new().name("sucld-reaper".into()).spawn(move || reap_loop(&s))?;
        Ok(Daemon { addr, shared, threads: vec![accept, reaper] })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
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
        let _ = TcpStream::connect(self.addr); // wakes the accept loop
        for c in lock(&self.shared.conns).drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        lock(&self.shared.sessions).clear();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stop();
        }
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: TcpListener) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                warn!("accept failed: {e}");
                continue;
            }
        };
        if let Ok(c) = conn.try_clone() {
            let mut conns = lock(&shared.conns);
            conns.retain(|c| c.peer_addr().is_ok());
            conns.push(c);
        }
        let s = shared.clone();
        let spawned = std::thread::Builder::new().name("sucld-conn".into()).spawn(move || {
            let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
            match serve(&s, conn) {
                Ok(()) => debug!(%peer, "connection closed"),
                Err(e) => info!(%peer, "connection ended: {e}"),
            }
        });
        if let Err(e) = spawned {
            warn!("cannot start a connection thread: {e}");
        }
    }
}

fn reap_loop(shared: &Arc<Shared>) {
    let tick = (shared.cfg.reconnect_window / 4).clamp(Duration::from_millis(10), Duration::from_millis(500));
    while !shared.stop.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
        let window = shared.cfg.reconnect_window;
        lock(&shared.sessions).retain(|id, s| {
            let b = lock(&s.binding);
            let expired = b.conn.is_none() && b.detached_since.is_some_and(|t| t.elapsed() > window);
            if expired {
                info!(session = %hex(id), "session expired: its client did not re-attach within {window:?}; resources freed");
            }
            !expired
        });
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn refuse(conn: &mut TcpStream, buf: &mut Vec<u8>, reason: String) -> io::Error {
    let _ = write_frame(conn, buf, &Frame::Refused { reason: reason.clone() });
    let _ = conn.shutdown(Shutdown::Both);
    io::Error::new(io::ErrorKind::PermissionDenied, reason)
}

fn handshake_err(e: ReadError) -> io::Error {
    match e {
        ReadError::Io(e) => e,
        ReadError::Wire(w) => io::Error::new(io::ErrorKind::InvalidData, w.to_string()),
    }
}

/// The handshake, then the command loop of one connection.
fn serve(shared: &Arc<Shared>, mut conn: TcpStream) -> io::Result<()> {
    conn.set_nodelay(true)?;
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
    let mut ours = feature::HOST_KERNELS;
    if shared.devices.iter().any(|d| d.info().kind == DeviceKind::Cuda) {
        ours |= feature::CUDA_KERNELS;
    }
    let nonces = Nonces { client: client_nonce, server: random() };
    write_frame(&mut conn, &mut out, &Frame::Welcome { version: VERSION, features: features & ours, max_frame, nonce: nonces.server })?;
    let session = match read_frame(&mut conn, &mut buf, HANDSHAKE_MAX_FRAME) {
        Ok(Frame::Open { mac }) => {
            if !shared.cfg.token.check_open(&nonces, &mac) {
                return Err(refuse(&mut conn, &mut out, "authentication failed: the client does not hold this server's token".into()));
            }
            open_session(shared, &mut conn, &mut out, &nonces)?
        }
        Ok(Frame::Attach { session, last_reply, mac }) => {
            let found = lock(&shared.sessions).get(&session).cloned();
            let Some(s) = found else {
                return Err(refuse(&mut conn, &mut out, "no such session (it expired or never existed)".into()));
            };
            if !s.secret.check_attach(&nonces, &session, last_reply, &mac) {
                return Err(refuse(&mut conn, &mut out, "authentication failed: wrong proof for this session".into()));
            }
            attach_session(&s, &mut conn, &mut out, &nonces, last_reply)?;
            s
        }
        Ok(other) => return Err(refuse(&mut conn, &mut out, format!("expected open or attach, got {}", frame_name(&other)))),
        Err(ReadError::Wire(w)) => return Err(refuse(&mut conn, &mut out, format!("malformed handshake: {w}"))),
        Err(e) => return Err(handshake_err(e)),
    };
    conn.set_read_timeout(None)?;
    let generation = lock(&session.binding).generation;
    let result = command_loop(shared, &session, &mut conn, max_frame, generation);
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
    }
}

fn open_session(shared: &Arc<Shared>, conn: &mut TcpStream, out: &mut Vec<u8>, nonces: &Nonces) -> io::Result<Arc<Session>> {
    let id: [u8; 16] = random();
    let s = Arc::new(Session {
        id,
        secret: shared.cfg.token.session_secret(nonces, &id),
        binding: Mutex::new(Binding { generation: 1, conn: Some(conn.try_clone()?), detached_since: None }),
        state: Mutex::new(SessionState { last_received: 0, retained: VecDeque::new(), objects: Objects::default() }),
    });
    lock(&shared.sessions).insert(id, s.clone());
    info!(session = %hex(&id), peer = ?conn.peer_addr().ok(), "session opened");
    let mac = shared.cfg.token.opened_proof(nonces, &id);
    write_frame(conn, out, &Frame::Opened { session: id, max_inflight: shared.cfg.limits.max_inflight, mac })?;
    Ok(s)
}

/// Binds `conn` to `s` (cutting off the connection it had), says the last sequence number
/// received, then re-sends the replies the client has not received.
fn attach_session(s: &Session, conn: &mut TcpStream, out: &mut Vec<u8>, nonces: &Nonces, last_reply: u64) -> io::Result<()> {
    {
        let mut b = lock(&s.binding);
        if let Some(old) = b.conn.take() {
            let _ = old.shutdown(Shutdown::Both);
        }
        b.generation += 1;
        b.conn = Some(conn.try_clone()?);
        b.detached_since = None;
    }
    let mut st = lock(&s.state);
    while st.retained.front().is_some_and(|(seq, _)| *seq <= last_reply) {
        st.retained.pop_front();
    }
    let last_received = st.last_received;
    write_frame(conn, out, &Frame::Attached { last_received, mac: s.secret.attached_proof(nonces, last_received) })?;
    use std::io::Write;
    for (_, reply) in &st.retained {
        conn.write_all(reply)?;
    }
    info!(session = %hex(&s.id), last_received, resent = st.retained.len(), "session re-attached");
    Ok(())
}

fn fatal(conn: &mut TcpStream, reason: String) -> io::Error {
    let mut out = Vec::new();
    let _ = write_frame(conn, &mut out, &Frame::Fatal { reason: reason.clone() });
    let _ = conn.shutdown(Shutdown::Both);
    io::Error::new(io::ErrorKind::InvalidData, reason)
}

fn command_loop(shared: &Shared, s: &Session, conn: &mut TcpStream, max_frame: u32, generation: u64) -> io::Result<()> {
    use std::io::Write;
    let mut reader = BufReader::with_capacity(1 << 16, conn.try_clone()?);
    let mut buf = Vec::new();
    let mut reply = Vec::new();
    loop {
        let frame = match read_frame(&mut reader, &mut buf, max_frame) {
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
        if st.retained.len() >= shared.cfg.limits.max_inflight as usize {
            let n = shared.cfg.limits.max_inflight;
            return Err(fatal(conn, format!("more than {n} commands in flight (the session's limit)")));
        }
        st.last_received = seq;
        st.objects.stats.executed += 1;
        let outcome = execute(shared, &mut st.objects, cmd, max_frame);
        reply.clear();
        Frame::Reply { seq, outcome }.encode_into(&mut reply);
        let frame = std::mem::take(&mut reply);
        let written = conn.write_all(&frame);
        st.retained.push_back((seq, frame));
        written?;
    }
}

fn forget_replies(st: &mut SessionState, upto: u64) {
    while st.retained.front().is_some_and(|(seq, _)| *seq <= upto) {
        st.retained.pop_front();
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

fn execute(shared: &Shared, o: &mut Objects, cmd: Command, max_frame: u32) -> Outcome {
    match run(shared, o, cmd, max_frame) {
        Ok(x) | Err(x) => x,
    }
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

fn run(shared: &Shared, o: &mut Objects, cmd: Command, max_frame: u32) -> Result<Outcome, Outcome> {
    let limits = &shared.cfg.limits;
    match cmd {
        Command::Nop => Ok(Outcome::Done),
        Command::Devices => Ok(Outcome::Devices(shared.devices.iter().map(Served::info).collect())),
        Command::Stats => Ok(Outcome::Stats(o.stats)),
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
            o.buffers.insert(id, Buf { device: d, mem });
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
            let b = buffer(o, id)?;
            let r = span("read", offset, len, b.mem.len())?;
            match &b.mem {
                Mem::Host(m) => Ok(Outcome::Data(m.bytes()[r].to_vec())),
                #[cfg(feature = "cuda")]
                Mem::Cuda(m) => Ok(Outcome::Data(m.read(r)?)),
            }
        }
        Command::Copy { src, src_offset, dst, dst_offset, len } => copy(o, src, src_offset, dst, dst_offset, len),
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
            o.events.insert(event, ev); // re-recording an event id moves it, as in CUDA
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
                        Some(Buf { mem: Mem::Cuda(m), device }) if *device == d => crate::cuda::LaunchArg::Ptr(m.device_ptr()),
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
