//! The client: a [`Remote`] is one server's session; its devices, queues, buffers and events
//! mirror the local device layer (`queue.upload`, `buffer.to_vec`, `buffer.copy_from_host`,
//! `queue.record`, `queue.wait_for`, `queue.synchronize`, kernel launches by name).
//!
//! Commands that return nothing (writes, fills, copies, launches, records, frees) are sent
//! without waiting, in order; a failure among them is reported by the next call that waits (a
//! read, a synchronize, an event wait), as a device queue reports asynchronous errors. Every
//! command carries a sequence number and stays in the client until its reply arrives, so that
//! after a lost connection the client re-attaches (within [`ClientOptions::reconnect_window`]),
//! learns the last number the server received, and re-sends exactly the ones after it.

use crate::auth::{random, Nonces, SessionSecret, Token};
use crate::transport::{self, Link, Pin, Tls};
use crate::wire::{
    self, read_frame, write_frame, Arg, Command, DeviceInfo, DeviceKind, Encoded, Frame, Outcome, PeerSpec, ReadError, SessionStats,
    HANDSHAKE_MAX_FRAME, VERSION,
};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{BufReader, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What went wrong, always naming the server.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RemoteError {
    /// The server could not be reached.
    #[error("server {server}: cannot connect: {why}")]
    Connect {
        /// The server's address.
        server: String,
        /// Why.
        why: String,
    },
    /// The server refused the handshake (wrong token, unknown session, version mismatch).
    #[error("server {server} refused the connection: {why}")]
    Refused {
        /// The server's address.
        server: String,
        /// Why.
        why: String,
    },
    /// The connection was lost and could not be re-established in time; the session is gone.
    #[error("server {server}: connection lost and not re-attached within {window:?}: {why}")]
    Lost {
        /// The server's address.
        server: String,
        /// The reconnect window.
        window: Duration,
        /// The last error.
        why: String,
    },
    /// A command failed on the server.
    #[error("server {server}: {what} failed: {message}")]
    Failed {
        /// The server's address.
        server: String,
        /// The command.
        what: String,
        /// Its [`crate::wire::code`].
        code: u16,
        /// The server's message.
        message: String,
    },
    /// No answer in time.
    #[error("server {server}: no answer to {what} within {after:?}")]
    Timeout {
        /// The server's address.
        server: String,
        /// The command.
        what: String,
        /// The time waited.
        after: Duration,
    },
    /// The server broke the protocol.
    #[error("server {server}: protocol error: {why}")]
    Protocol {
        /// The server's address.
        server: String,
        /// What was wrong.
        why: String,
    },
    /// A bad argument, caught before anything was sent.
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// Shorthand.
pub type Result<T> = std::result::Result<T, RemoteError>;

/// How a client connects.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// The daemon's token.
    pub token: Token,
    /// How long to keep trying to re-attach after a lost connection (the server keeps the
    /// session at least as long with its own window).
    pub reconnect_window: Duration,
    /// How long one call waits for its answer.
    pub call_timeout: Duration,
    /// The largest frame this client accepts.
    pub max_frame: u32,
    /// TLS (on by default: the servers' certificate pins must be set) or plain TCP.
    pub tls: Tls,
}

impl ClientOptions {
    /// Default timings (60 s window and call timeout) with `token`, TLS trusting no server
    /// yet (add pins with [`ClientOptions::pin`]).
    pub fn new(token: Token) -> ClientOptions {
        ClientOptions {
            token,
            reconnect_window: Duration::from_secs(60),
            call_timeout: Duration::from_secs(60),
            max_frame: wire::DEFAULT_MAX_FRAME,
            tls: Tls::Pinned(Vec::new()),
        }
    }

    /// Also trusts the server certificate with this SHA-256 pin (turns TLS on if it was off).
    pub fn pin(mut self, pin: Pin) -> ClientOptions {
        match &mut self.tls {
            Tls::Pinned(v) => v.push(pin),
            Tls::Off => self.tls = Tls::Pinned(vec![pin]),
        }
        self
    }

    /// TLS settings from the environment or the config: `SUCL_REMOTE_TLS=off` (plain TCP),
    /// `SUCL_REMOTE_TLS_PIN` (comma-separated SHA-256 pins), `SUCL_REMOTE_TLS_CERT`
    /// (comma-separated PEM certificate files to trust), else `remote_tls`, `remote_tls_pins`
    /// and `remote_tls_certs` in the config file.
    fn tls_from_env(mut self, config: Option<&RemoteConfig>) -> Result<ClientOptions> {
        let off = std::env::var("SUCL_REMOTE_TLS").map(|v| v == "off" || v == "0" || v == "false").ok();
        if off.or(config.and_then(|c| c.tls.map(|on| !on))) == Some(true) {
            self.tls = Tls::Off;
            return Ok(self);
        }
        let split = |s: &str| s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect::<Vec<_>>();
        let pins = std::env::var("SUCL_REMOTE_TLS_PIN")
            .map(|s| split(&s))
            .unwrap_or_else(|_| config.map(|c| c.tls_pins.clone()).unwrap_or_default());
        let certs = std::env::var("SUCL_REMOTE_TLS_CERT")
            .map(|s| split(&s).into_iter().map(PathBuf::from).collect())
            .unwrap_or_else(|_| config.map(|c| c.tls_certs.clone()).unwrap_or_default());
        for p in pins {
            self = self.pin(transport::parse_pin(&p).map_err(RemoteError::Invalid)?);
        }
        for c in certs {
            self = self.pin(transport::pin_of_pem_file(&c).map_err(RemoteError::Invalid)?);
        }
        Ok(self)
    }

    /// The token from `SUCL_REMOTE_TOKEN` (64 hex digits) or the file `SUCL_REMOTE_TOKEN_FILE`
    /// names, else from `token_file` in the config file, if one is given.
    /// Also the TLS settings (see `tls_from_env`).
    pub fn from_env(config: Option<&Path>) -> Result<ClientOptions> {
        let cfg = config.map(RemoteConfig::read).transpose()?;
        let token = if let Ok(hex) = std::env::var("SUCL_REMOTE_TOKEN") {
            Token::from_hex(&hex).map_err(|e| RemoteError::Invalid(format!("SUCL_REMOTE_TOKEN: {e}")))?
        } else if let Ok(path) = std::env::var("SUCL_REMOTE_TOKEN_FILE") {
            Token::read(Path::new(&path)).map_err(RemoteError::Invalid)?
        } else if let Some(path) = cfg.as_ref().and_then(|c| c.token_file.clone()) {
            Token::read(&path).map_err(RemoteError::Invalid)?
        } else {
            return Err(RemoteError::Invalid(
                "no token: set SUCL_REMOTE_TOKEN or SUCL_REMOTE_TOKEN_FILE, or name remote_token_file in the config".into(),
            ));
        };
        ClientOptions::new(token).tls_from_env(cfg.as_ref())
    }
}

/// The `[[remote]]` tables and `remote_token_file` of a sucl config file.
#[derive(Debug, Default, serde::Deserialize)]
pub struct RemoteConfig {
    /// `[[remote]] address = "host:port"`.
    #[serde(default)]
    pub remote: Vec<RemoteEntry>,
    /// `remote_token_file = "path"`.
    #[serde(default, rename = "remote_token_file")]
    pub token_file: Option<PathBuf>,
    /// `remote_tls = false` turns TLS off (only with daemons started with `--no-tls`).
    #[serde(default, rename = "remote_tls")]
    pub tls: Option<bool>,
    /// `remote_tls_pins = ["64 hex digits", ...]`: server certificates to trust.
    #[serde(default, rename = "remote_tls_pins")]
    pub tls_pins: Vec<String>,
    /// `remote_tls_certs = ["cert.pem", ...]`: server certificates to trust.
    #[serde(default, rename = "remote_tls_certs")]
    pub tls_certs: Vec<PathBuf>,
}

/// One `[[remote]]` table.
#[derive(Debug, serde::Deserialize)]
pub struct RemoteEntry {
    /// The server's `host:port`.
    pub address: String,
}

impl RemoteConfig {
    /// Reads the remote part of a config file (other keys are left to their owners).
    pub fn read(path: &Path) -> Result<RemoteConfig> {
        let s = std::fs::read_to_string(path).map_err(|e| RemoteError::Invalid(format!("reading {}: {e}", path.display())))?;
        toml::from_str(&s).map_err(|e| RemoteError::Invalid(format!("{}: {e}", path.display())))
    }
}

/// The servers to use: those in `arg` (comma-separated) if given, else in `SUCL_REMOTE`, else
/// the `[[remote]]` tables of `config`.
pub fn servers(arg: Option<&str>, config: Option<&Path>) -> Result<Vec<String>> {
    let split = |s: &str| s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect::<Vec<_>>();
    if let Some(a) = arg {
        return Ok(split(a));
    }
    if let Ok(e) = std::env::var("SUCL_REMOTE") {
        return Ok(split(&e));
    }
    match config {
        Some(c) => Ok(RemoteConfig::read(c)?.remote.into_iter().map(|r| r.address).collect()),
        None => Ok(Vec::new()),
    }
}

/// What the server knows of the session (fixed once opened).
struct SessionKeys {
    id: [u8; 16],
    secret: SessionSecret,
    max_frame: u32,
    max_inflight: u32,
    /// The features negotiated when the session was opened.
    features: u64,
}

struct State {
    keys: SessionKeys,
    /// The connection commands are written to (`None` while it is being made again).
    writer: Option<Link>,
    /// Frames not yet written to `writer`, oldest first (each is in `unanswered` too).
    outq: VecDeque<Arc<Encoded>>,
    /// Bytes in `outq`.
    outq_bytes: usize,
    /// A thread is writing `outq` (one at a time: frames go out in order).
    writing: bool,
    /// The pin of the certificate the server presented (all zero: plain TCP).
    pin: Pin,
    /// This server's mesh and index in it.
    mesh: Option<([u8; 16], u32)>,
    /// Bumped on every new connection; a reader thread of an older one changes nothing.
    generation: u64,
    /// Why the current connection broke (`None` while it works).
    broken: Option<String>,
    /// Why the session is over for good.
    dead: Option<RemoteError>,
    next_seq: u64,
    /// Commands sent whose replies have not arrived (encoded frames, oldest first; empty once
    /// the server said it holds them).
    unanswered: VecDeque<(u64, Arc<Encoded>)>,
    last_reply: u64,
    /// Sequence numbers someone waits on, and the replies that came for them.
    awaited: HashSet<u64>,
    replies: HashMap<u64, Outcome>,
    /// The first failure of a command nobody waited on.
    deferred: Option<RemoteError>,
    reconnects: u64,
    /// Re-attaches whose TLS session was resumed (no full handshake).
    resumed: u64,
    /// The read side of a connection made by a re-attach, for the reader thread.
    next_reader: Option<Link>,
}

struct Conn {
    server: String,
    /// Where the server's peers reach it.
    peer_address: Mutex<String>,
    opts: ClientOptions,
    state: Mutex<State>,
    changed: Condvar,
    /// Wakes the writer thread (frames queued by a re-attach; the session's end).
    wake_writer: Condvar,
    /// Bytes read from the server, over all connections (a call that times out while this
    /// stood still finds the connection stalled).
    received: AtomicU64,
    next_id: AtomicU64,
    /// Calls that waited for their answer (client round trips).
    round_trips: AtomicU64,
    /// The last reply the reader thread took in (its outcome is in `replies` if awaited): a
    /// caller spins on it a moment before sleeping (see [`spin_budget`]).
    answered: AtomicU64,
    /// Data buffers of writes whose replies came, for the next writes ([`Remote::data_buffer`]).
    spare: Mutex<Vec<Vec<u8>>>,
    /// Released events not yet told to the server ([`Remote::release_event`]).
    released: Mutex<Vec<(u64, u64)>>,
}

/// Released events go to the server in batches of this many (one frame, not one each).
const RELEASE_BATCH: usize = 64;

/// How long a call spins for its reply before it sleeps: `SUCL_REMOTE_SPIN_US` microseconds,
/// by default 50 where the machine has at least 4 cores and none where it has fewer (there the
/// spinning caller would take the core the reply's reader thread needs).
fn spin_budget() -> Duration {
    static BUDGET: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let default = if cores >= 4 { 50 } else { 0 };
        let us = std::env::var("SUCL_REMOTE_SPIN_US").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(default);
        Duration::from_micros(us.min(10_000))
    })
}

/// The most data buffers kept for reuse: a large upload cycles through a few buffers instead
/// of mapping (and faulting in) fresh memory for every piece.
const SPARE_BUFFERS: usize = 8;
/// The largest data buffer kept (an idle session holds at most `SPARE_BUFFERS` of these).
const SPARE_BUFFER_MAX: usize = 2 << 20;

/// One server's session. Clones share it; when the last clone (buffers and meshes hold
/// clones too) is dropped, the session is closed: commands already posted get a bounded
/// moment to be answered, then the connection is shut and its reader thread ends.
#[derive(Clone)]
pub struct Remote {
    conn: Arc<Conn>,
    _open: Arc<OpenHandle>,
}

/// Closes its session when the last [`Remote`] holding it is dropped (the reader thread holds
/// the connection state itself, so without this nothing would ever close it).
struct OpenHandle(Arc<Conn>);

impl Drop for OpenHandle {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// How long dropping the last handle waits for answers to commands already posted.
const CLOSE_DRAIN: Duration = Duration::from_secs(2);

fn refused_or_protocol(server: &str, f: Frame) -> RemoteError {
    match f {
        Frame::Refused { reason } => RemoteError::Refused { server: server.into(), why: reason },
        Frame::Fatal { reason } => RemoteError::Refused { server: server.into(), why: reason },
        other => RemoteError::Protocol { server: server.into(), why: format!("unexpected frame {other:?} in the handshake") },
    }
}

/// Connects (TLS as `opts` say) with the handshake's reads bounded by `timeout`.
fn dial(server: &str, opts: &ClientOptions, timeout: Duration) -> Result<Link> {
    let connect_err = |why: String| RemoteError::Connect { server: server.into(), why };
    let s = transport::connect(server, &opts.tls, timeout).map_err(|e| connect_err(e.to_string()))?;
    s.set_read_timeout(Some(timeout.max(Duration::from_millis(1)))).map_err(|e| connect_err(e.to_string()))?;
    Ok(s)
}

fn hello(opts: &ClientOptions, nonce: [u8; 16]) -> Frame {
    Frame::Hello { min_version: VERSION, max_version: VERSION, features: wire::feature::ALL, max_frame: opts.max_frame, nonce }
}

/// What a welcome says: the server's nonce, the frame limit and the features in force.
struct Welcome {
    nonce: [u8; 16],
    max_frame: u32,
    features: u64,
}

/// Reads the server's answer to a hello and checks it.
fn read_welcome(server: &str, opts: &ClientOptions, s: &mut Link) -> Result<Welcome> {
    match read_handshake(server, s)? {
        Frame::Welcome { version, max_frame, nonce, features } => {
            if version != VERSION {
                return Err(RemoteError::Protocol {
                    server: server.into(),
                    why: format!("server chose version {version}; this client speaks {VERSION}"),
                });
            }
            if !(wire::MIN_MAX_FRAME..=opts.max_frame).contains(&max_frame) {
                return Err(RemoteError::Protocol { server: server.into(), why: format!("server chose frame limit {max_frame}") });
            }
            Ok(Welcome { nonce, max_frame, features })
        }
        other => Err(refused_or_protocol(server, other)),
    }
}

/// Connects and runs the hello/welcome exchange; returns the stream, nonces and welcome.
fn greet(server: &str, opts: &ClientOptions, timeout: Duration) -> Result<(Link, Nonces, Welcome)> {
    let mut s = dial(server, opts, timeout)?;
    let client: [u8; 16] = random();
    let mut out = Vec::new();
    write_frame(&mut s, &mut out, &hello(opts, client)).map_err(|e| RemoteError::Connect { server: server.into(), why: e.to_string() })?;
    let w = read_welcome(server, opts, &mut s)?;
    Ok((s, Nonces { client, server: w.nonce }, w))
}

/// The most bytes of unanswered commands sent along with an attach, before the server has
/// said which it already holds (those it holds it ignores; the rest go after its answer).
/// Small, so that the bytes always fit the sockets' buffers while the server writes its
/// answer and the replies it re-sends before it reads them.
const PIPELINE_BYTES: usize = 16 << 10;

/// Appends to `out` the frames at the front of `unanswered` (skipping placeholders of
/// commands the server already holds) that fit in [`PIPELINE_BYTES`]; returns the last
/// sequence number appended (0: none). The frames form an unbroken run of sequence numbers,
/// so the server never sees one skipped.
fn pipeline(unanswered: &VecDeque<(u64, Arc<Encoded>)>, out: &mut Vec<u8>) -> u64 {
    let mut budget = PIPELINE_BYTES;
    let mut upto = 0;
    for (seq, frame) in unanswered.iter().filter(|(_, f)| !f.is_empty()) {
        if frame.len() > budget {
            break;
        }
        budget -= frame.len();
        frame.append_to(out);
        upto = *seq;
    }
    upto
}

fn read_handshake(server: &str, s: &mut Link) -> Result<Frame> {
    let mut buf = Vec::new();
    read_frame(s, &mut buf, HANDSHAKE_MAX_FRAME).map_err(|e| match e {
        e if e.is_tls_record() => RemoteError::Connect {
            server: server.into(),
            why: "the daemon expects TLS (it answered with a TLS record) and this client connected without it: trust the \
                  daemon's certificate (SUCL_REMOTE_TLS_PIN or SUCL_REMOTE_TLS_CERT, ClientOptions::pin) instead of \
                  turning TLS off"
                .into(),
        },
        ReadError::Io(e) => RemoteError::Connect { server: server.into(), why: format!("during the handshake: {e}") },
        ReadError::Wire(w) => RemoteError::Protocol { server: server.into(), why: w.to_string() },
    })
}

impl Remote {
    /// Opens a session on the daemon at `server` (`host:port`).
    pub fn connect(server: &str, opts: ClientOptions) -> Result<Remote> {
        let (mut s, nonces, welcome) = greet(server, &opts, opts.call_timeout)?;
        let mut out = Vec::new();
        write_frame(&mut s, &mut out, &Frame::Open { mac: opts.token.open_proof(&nonces) })
            .map_err(|e| RemoteError::Connect { server: server.into(), why: e.to_string() })?;
        let (id, max_inflight) = match read_handshake(server, &mut s)? {
            Frame::Opened { session, max_inflight, mac } => {
                if !opts.token.check_opened(&nonces, &session, &mac) {
                    return Err(RemoteError::Refused {
                        server: server.into(),
                        why: "the server could not prove it holds the token".into(),
                    });
                }
                (session, max_inflight.max(1))
            }
            other => return Err(refused_or_protocol(server, other)),
        };
        let keys = SessionKeys {
            id,
            secret: opts.token.session_secret(&nonces, &id),
            max_frame: welcome.max_frame,
            max_inflight,
            features: welcome.features,
        };
        let pin = s.peer_pin().unwrap_or([0; 32]);
        let conn = Arc::new(Conn {
            server: server.into(),
            peer_address: Mutex::new(server.into()),
            opts,
            state: Mutex::new(State {
                keys,
                writer: None,
                outq: VecDeque::new(),
                outq_bytes: 0,
                writing: false,
                pin,
                mesh: None,
                generation: 0,
                broken: None,
                dead: None,
                next_seq: 1,
                unanswered: VecDeque::new(),
                last_reply: 0,
                awaited: HashSet::new(),
                replies: HashMap::new(),
                deferred: None,
                reconnects: 0,
                resumed: 0,
                next_reader: None,
            }),
            changed: Condvar::new(),
            wake_writer: Condvar::new(),
            received: AtomicU64::new(0),
            round_trips: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            spare: Mutex::new(Vec::new()),
            released: Mutex::new(Vec::new()),
        });
        {
            let mut st = conn.lock();
            conn.install(&mut st, s, 0).map_err(|why| RemoteError::Connect { server: server.into(), why })?;
        }
        Ok(Remote { _open: Arc::new(OpenHandle(conn.clone())), conn })
    }

    /// The server's address, as given.
    pub fn server(&self) -> &str {
        &self.conn.server
    }

    /// The session's id (public: it proves nothing without the session secret).
    pub fn session_id(&self) -> [u8; 16] {
        self.conn.lock().keys.id
    }

    /// How many commands this client has sent (sequence numbers used).
    pub fn commands_sent(&self) -> u64 {
        self.conn.lock().next_seq - 1
    }

    /// How many calls waited for their answer (client round trips: reads, synchronizes,
    /// allocations, …; posted commands are not counted).
    pub fn round_trips(&self) -> u64 {
        self.conn.round_trips.load(Ordering::Relaxed)
    }

    /// How many times the connection was re-established.
    pub fn reconnects(&self) -> u64 {
        self.conn.lock().reconnects
    }

    /// How many re-attaches resumed the TLS session (an abbreviated handshake).
    pub fn resumed_reconnects(&self) -> u64 {
        self.conn.lock().resumed
    }

    /// The server's devices.
    pub fn devices(&self) -> Result<Vec<RemoteDevice>> {
        match self.call(Command::Devices, "listing devices")? {
            Outcome::Devices(list) => {
                Ok(list.into_iter().enumerate().map(|(i, info)| RemoteDevice { remote: self.clone(), index: i as u32, info }).collect())
            }
            other => Err(self.unexpected("listing devices", other)),
        }
    }

    /// Sends one protocol command and waits for its answer (low level: the typed API above
    /// covers every command; this is for tools and tests that speak the protocol directly).
    pub fn call_raw(&self, cmd: Command) -> Result<Outcome> {
        self.call(cmd, "a raw command")
    }

    /// Sends one protocol command without waiting for its answer (low level, as
    /// [`Remote::call_raw`]); a failure is reported by the next call that waits.
    pub fn post_raw(&self, cmd: Command) -> Result<()> {
        self.post(cmd)
    }

    /// Sends one protocol command whose answer [`Remote::answer_raw`] collects later (low
    /// level, as [`Remote::call_raw`]): commands sent before the first answer is awaited go
    /// out back to back, and their answers come back the same way. Every sequence number
    /// this returns must be collected once.
    pub fn send_raw(&self, cmd: Command) -> Result<u64> {
        self.conn.round_trips.fetch_add(1, Ordering::Relaxed);
        self.conn.submit(cmd, true)
    }

    /// Waits for the answer to the command [`Remote::send_raw`] sent as `seq`.
    pub fn answer_raw(&self, seq: u64) -> Result<Outcome> {
        self.answer(seq, "a raw command")
    }

    /// Releases event `event` (made with raw commands) after `waits`
    /// [`Command::WaitRemote`]s for it were posted to other servers: the server learns of it
    /// with the next 64th release, in one command.
    pub fn release_event(&self, event: u64, waits: u64) -> Result<()> {
        let batch = {
            let mut r = self.conn.released.lock().unwrap_or_else(|p| p.into_inner());
            r.push((event, waits));
            if r.len() < RELEASE_BATCH {
                return Ok(());
            }
            std::mem::take(&mut *r)
        };
        self.post(Command::ReleaseEvents { events: batch })
    }

    /// A fresh id for an object of this session (buffers, queues, events, programs, kernels
    /// made with the raw commands).
    pub fn new_id(&self) -> u64 {
        self.id()
    }

    /// An empty buffer with room for `len` bytes, for the data of a [`Command::Write`]: one
    /// whose write was answered when there is one that big, else a new one.
    pub fn data_buffer(&self, len: usize) -> Vec<u8> {
        let mut spare = self.conn.spare.lock().unwrap_or_else(|p| p.into_inner());
        match spare.iter().position(|b| b.capacity() >= len) {
            Some(i) => spare.swap_remove(i),
            None => Vec::with_capacity(len),
        }
    }

    /// The largest frame in force on this session (split writes and reads to fit).
    pub fn max_frame(&self) -> usize {
        self.room()
    }

    /// This server's index in its [`Mesh`], if it is in one.
    pub fn mesh_index(&self) -> Option<u32> {
        self.mesh().map(|(_, i)| i)
    }

    /// A no-op round trip (a latency probe).
    pub fn nop(&self) -> Result<()> {
        self.call(Command::Nop, "nop").map(|_| ())
    }

    /// The session's counters on the server.
    pub fn stats(&self) -> Result<SessionStats> {
        match self.call(Command::Stats, "stats")? {
            Outcome::Stats(s) => Ok(s),
            other => Err(self.unexpected("stats", other)),
        }
    }

    /// Cuts the current connection (as a network fault would); the next call re-attaches.
    pub fn drop_connection(&self) {
        if let Some(w) = &self.conn.lock().writer {
            w.shutdown();
        }
    }

    /// The SHA-256 pin of the certificate the server presented (`None`: plain TCP).
    pub fn tls_pin(&self) -> Option<Pin> {
        let p = self.conn.lock().pin;
        (p != [0; 32]).then_some(p)
    }

    /// Where the server's peers reach it (by default the address this client uses); set it
    /// before [`Mesh::new`] when servers see each other at other addresses.
    pub fn set_peer_address(&self, address: &str) {
        *self.conn.peer_address.lock().unwrap_or_else(|p| p.into_inner()) = address.into();
    }

    fn peer_address(&self) -> String {
        self.conn.peer_address.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn mesh(&self) -> Option<([u8; 16], u32)> {
        self.conn.lock().mesh
    }

    /// Whether two handles are the same session.
    pub fn same(&self, other: &Remote) -> bool {
        Arc::ptr_eq(&self.conn, &other.conn)
    }

    fn unexpected(&self, what: &str, o: Outcome) -> RemoteError {
        RemoteError::Protocol { server: self.conn.server.clone(), why: format!("unexpected answer to {what}: {o:?}") }
    }

    fn id(&self) -> u64 {
        self.conn.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends `cmd` and waits for its answer; a failure of an earlier command nobody waited on
    /// is reported first.
    fn call(&self, cmd: Command, what: &str) -> Result<Outcome> {
        self.conn.round_trips.fetch_add(1, Ordering::Relaxed);
        let seq = self.conn.submit(cmd, true)?;
        self.answer(seq, what)
    }

    /// Waits for the answer to command `seq`; a failure of an earlier command nobody waited
    /// on is reported first.
    fn answer(&self, seq: u64, what: &str) -> Result<Outcome> {
        let o = self.conn.wait(seq, what)?;
        if let Some(e) = self.conn.lock().deferred.take() {
            return Err(e);
        }
        match o {
            Outcome::Failed { code, message } => {
                Err(RemoteError::Failed { server: self.conn.server.clone(), what: what.into(), code, message })
            }
            o => Ok(o),
        }
    }

    /// Sends `cmd` without waiting.
    fn post(&self, cmd: Command) -> Result<()> {
        self.conn.submit(cmd, false).map(|_| ())
    }

    fn room(&self) -> usize {
        self.conn.lock().keys.max_frame as usize
    }
}

impl Conn {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `s` the connection and queues every unanswered command after `sent` (those up
    /// to it went with the attach) for the writer thread. The first connection starts the
    /// session's reader and writer threads; later ones are handed to them (the reader is the
    /// thread that re-attaches), so a reconnect starts no thread.
    fn install(self: &Arc<Self>, st: &mut State, s: Link, sent: u64) -> std::result::Result<(), String> {
        s.set_read_timeout(None).map_err(|e| e.to_string())?;
        // A write that makes no progress for a call's time finds the connection stalled.
        s.set_write_timeout(Some(self.opts.call_timeout)).map_err(|e| e.to_string())?;
        st.generation += 1;
        if s.resumed() {
            st.resumed += 1;
        }
        if st.generation == 1 {
            let (me, reader, max_frame) = (self.clone(), s.clone(), st.keys.max_frame);
            std::thread::Builder::new()
                .name("sucl-remote-reader".into())
                .spawn(move || me.read_loop(reader, 1, max_frame))
                .map_err(|e| e.to_string())?;
            let me = self.clone();
            std::thread::Builder::new().name("sucl-remote-writer".into()).spawn(move || me.write_loop()).map_err(|e| e.to_string())?;
        } else {
            st.next_reader = Some(s.clone());
        }
        // Commands the server already received are kept as empty placeholders.
        st.outq = st.unanswered.iter().filter(|(seq, f)| *seq > sent && !f.is_empty()).map(|(_, f)| f.clone()).collect();
        st.outq_bytes = st.outq.iter().map(|f| f.len()).sum();
        st.writer = Some(s);
        st.broken = None;
        self.wake_writer.notify_all();
        Ok(())
    }

    /// The connection broke (or stalled): it is shut, which ends its reads and writes; the
    /// reader thread re-attaches.
    fn broke(&self, st: &mut State, why: String) {
        st.broken.get_or_insert(why);
        if let Some(w) = st.writer.take() {
            w.shutdown();
        }
        st.outq.clear();
        st.outq_bytes = 0;
        self.changed.notify_all();
    }

    /// Writes the queued frames unless another thread is writing them already. No lock is
    /// held while a write blocks: the reader thread goes on reading replies, so the server,
    /// which may be writing replies while this side writes commands, goes on reading too.
    fn flush<'a>(&'a self, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        if st.writing {
            return st;
        }
        st.writing = true;
        while let Some(link) = st.writer.clone().filter(|_| !st.outq.is_empty()) {
            let generation = st.generation;
            // Up to four frames (two parts each) in one vectored write, without copying them
            // together.
            let mut batch: [Option<Arc<Encoded>>; transport::MAX_PARTS / 2] = Default::default();
            for slot in batch.iter_mut() {
                match st.outq.pop_front() {
                    Some(f) => *slot = Some(f),
                    None => break,
                }
            }
            let full = st.outq_bytes >= OUTQ_LIMIT;
            st.outq_bytes -= batch.iter().flatten().map(|f| f.len()).sum::<usize>();
            if full && st.outq_bytes < OUTQ_LIMIT {
                self.changed.notify_all(); // room for senders that wait for it
            }
            drop(st);
            let mut parts: [&[u8]; transport::MAX_PARTS] = [&[]; transport::MAX_PARTS];
            let mut n = 0;
            for f in batch.iter().flatten() {
                for part in f.parts() {
                    parts[n] = part;
                    n += 1;
                }
            }
            let written = link.write_parts(&parts[..n]);
            st = self.lock();
            if let Err(e) = written {
                if st.generation == generation {
                    self.broke(&mut st, format!("sending: {e}"));
                }
            }
        }
        st.writing = false;
        st
    }

    /// Writes what a re-attach queued: no caller is there to write it, and the reader thread
    /// that re-attached must go back to reading at once (the server writes the replies it
    /// re-sends before it reads again).
    fn write_loop(self: Arc<Self>) {
        let mut st = self.lock();
        while st.dead.is_none() {
            if !st.writing && st.writer.is_some() && !st.outq.is_empty() {
                st = self.flush(st);
                continue;
            }
            st = self.wake_writer.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Ends the session on this side: waits (at most [`CLOSE_DRAIN`]) for answers to commands
    /// already posted, then marks the session over and shuts the connection, which ends the
    /// reader and writer threads. The server drops the session when its re-attach window passes.
    fn close(&self) {
        let deadline = Instant::now() + CLOSE_DRAIN.min(self.opts.call_timeout);
        let mut st = self.lock();
        while !st.unanswered.is_empty() && st.dead.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self.changed.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        st.dead.get_or_insert_with(|| RemoteError::Invalid(format!("the session with {} was closed", self.server)));
        st.next_reader = None;
        if let Some(w) = st.writer.take() {
            w.shutdown();
        }
        self.changed.notify_all();
        self.wake_writer.notify_all();
    }

    /// Reads replies until the connection breaks, then re-attaches at once — rather than at
    /// the next call on this server: another server may be waiting (for a migration's bytes,
    /// for an event) on commands this one has not received yet — and reads the new one.
    fn read_loop(self: Arc<Self>, mut s: Link, mut generation: u64, max_frame: u32) {
        loop {
            let why = self.read_replies(s, generation, max_frame);
            {
                let mut st = self.lock();
                if st.generation != generation {
                    return;
                }
                self.broke(&mut st, why);
                if st.dead.is_some() {
                    self.wake_writer.notify_all();
                    return;
                }
            }
            // Without the lock: calls keep their deadlines while the connection is made again.
            self.reattach();
            let mut st = self.lock();
            match st.next_reader.take() {
                Some(next) if st.dead.is_none() => {
                    s = next;
                    generation = st.generation;
                }
                _ => {
                    self.wake_writer.notify_all();
                    return;
                }
            }
        }
    }

    /// Reads replies from `s` until it breaks; returns why.
    fn read_replies(&self, s: Link, generation: u64, max_frame: u32) -> String {
        let mut r = BufReader::with_capacity(1 << 16, Counted { link: s, count: &self.received });
        let mut buf = Vec::new();
        loop {
            let f = read_frame(&mut r, &mut buf, max_frame);
            let mut st = self.lock();
            if st.generation != generation {
                return "replaced".into();
            }
            return match f {
                Ok(Frame::Reply { seq, outcome }) if seq == st.last_reply + 1 => {
                    st.last_reply = seq;
                    // Senders may wait for room below the in-flight limit.
                    let was_full = st.unanswered.len() >= st.keys.max_inflight as usize;
                    while st.unanswered.front().is_some_and(|(s, _)| *s <= seq) {
                        if let Some((_, frame)) = st.unanswered.pop_front() {
                            self.keep_spare(frame);
                        }
                    }
                    let awaited = st.awaited.remove(&seq);
                    if awaited {
                        st.replies.insert(seq, outcome);
                        self.answered.store(seq, Ordering::Release);
                    } else if let Outcome::Failed { code, message } = outcome {
                        if st.deferred.is_none() {
                            st.deferred =
                                Some(RemoteError::Failed { server: self.server.clone(), what: format!("command {seq}"), code, message });
                        }
                    }
                    // Only a reply someone waits for, room for a sender, or the last answer
                    // (which `close` waits for) wakes the waiting threads: a reply to a posted
                    // command alone would wake a caller that then sleeps again.
                    if awaited || was_full || st.unanswered.is_empty() {
                        // Woken after the lock is let go, the waiter does not block on it at once.
                        drop(st);
                        self.changed.notify_all();
                    }
                    continue;
                }
                Ok(Frame::Reply { seq, .. }) if seq <= st.last_reply => continue, // already had it
                Ok(Frame::Reply { seq, .. }) => format!("reply {seq} after {}: the server skipped replies", st.last_reply),
                Ok(Frame::Fatal { reason }) => {
                    st.dead = Some(RemoteError::Protocol {
                        server: self.server.clone(),
                        why: format!("the server closed the session: {reason}"),
                    });
                    reason
                }
                Ok(other) => format!("unexpected frame {other:?}"),
                Err(e) => e.to_string(),
            };
        }
    }

    /// Keeps an answered write's data buffer for [`Remote::data_buffer`] (within bounds).
    fn keep_spare(&self, frame: Arc<Encoded>) {
        let Ok(Encoded { mut bulk, .. }) = Arc::try_unwrap(frame) else { return };
        if bulk.capacity() == 0 || bulk.capacity() > SPARE_BUFFER_MAX {
            return;
        }
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < SPARE_BUFFERS {
            bulk.clear();
            spare.push(bulk);
        }
    }

    fn submit(self: &Arc<Self>, cmd: Command, awaited: bool) -> Result<u64> {
        let deadline = Instant::now() + self.opts.call_timeout;
        let seen = self.received.load(Ordering::Relaxed);
        let mut st = self.lock();
        // Stay within the server's in-flight limit, and within [`OUTQ_LIMIT`] bytes waiting
        // to be written: wait for answers and writes first.
        while st.unanswered.len() >= st.keys.max_inflight as usize || (st.outq_bytes >= OUTQ_LIMIT && st.writer.is_some()) {
            st = self.progress(st, deadline, "sending a command", seen)?;
        }
        if let Some(e) = &st.dead {
            return Err(e.clone());
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        // Write data stays in its own buffer, sent behind the frame's head.
        let frame = Arc::new(Frame::Command { seq, ack: st.last_reply, cmd }.encode_split());
        if awaited {
            st.awaited.insert(seq);
        }
        // Without a connection the command waits in `unanswered`; a re-attach sends it.
        if st.writer.is_some() {
            st.outq_bytes += frame.len();
            st.outq.push_back(frame.clone());
        }
        st.unanswered.push_back((seq, frame));
        drop(self.flush(st));
        Ok(seq)
    }

    fn wait(self: &Arc<Self>, seq: u64, what: &str) -> Result<Outcome> {
        let deadline = Instant::now() + self.opts.call_timeout;
        let seen = self.received.load(Ordering::Relaxed);
        self.spin_for(seq);
        let mut st = self.lock();
        loop {
            if let Some(o) = st.replies.remove(&seq) {
                return Ok(o);
            }
            match self.progress(st, deadline, what, seen) {
                Ok(s) => st = s,
                Err(e) => {
                    let mut st = self.lock();
                    st.awaited.remove(&seq);
                    return Err(e);
                }
            }
        }
    }

    /// Spins (at most [`spin_budget`]) until the reply to `seq` is in: a reply that comes
    /// within it is taken without the caller being put to sleep and woken again, which costs
    /// more than a short round trip.
    fn spin_for(&self, seq: u64) {
        let budget = spin_budget();
        if budget.is_zero() {
            return;
        }
        let start = Instant::now();
        while self.answered.load(Ordering::Acquire) < seq && start.elapsed() < budget {
            std::hint::spin_loop();
        }
    }

    /// Waits for something to change: a reply, a break (then re-attaches), or the deadline.
    /// A deadline that passes with no byte received since `seen` means the connection stalled
    /// (the server may be alive, but bytes stopped): it is cut, and the reader re-attaches as
    /// after any other cut.
    fn progress<'a>(
        self: &'a Arc<Self>,
        mut st: MutexGuard<'a, State>,
        deadline: Instant,
        what: &str,
        seen: u64,
    ) -> Result<MutexGuard<'a, State>> {
        if let Some(e) = &st.dead {
            return Err(e.clone());
        }
        let now = Instant::now();
        if now >= deadline {
            if self.received.load(Ordering::Relaxed) == seen && st.writer.is_some() {
                tracing::warn!(server = %self.server, "nothing received within {:?}: the connection stalled; re-attaching", self.opts.call_timeout);
                self.broke(&mut st, format!("stalled: nothing received within {:?}", self.opts.call_timeout));
            }
            return Err(RemoteError::Timeout { server: self.server.clone(), what: what.into(), after: self.opts.call_timeout });
        }
        Ok(self.changed.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner()).0)
    }

    /// Re-attaches to the session, retrying until the reconnect window closes; marks the
    /// session dead if it cannot. Holds the state lock only between network steps.
    fn reattach(self: &Arc<Self>) {
        let window = self.opts.reconnect_window;
        let give_up = Instant::now() + window;
        let mut pause = Duration::from_micros(200);
        let mut last = self.lock().broken.clone().unwrap_or_default();
        loop {
            let left = give_up.saturating_duration_since(Instant::now());
            let attempt = if left.is_zero() { None } else { Some(self.try_attach(left.min(Duration::from_secs(2)))) };
            let failed = match attempt {
                None => Some(RemoteError::Lost { server: self.server.clone(), window, why: last.clone() }),
                Some(Ok(())) => return,
                // The session is gone or the proof is wrong: retrying will not help.
                Some(Err(e @ RemoteError::Refused { .. })) => Some(e),
                Some(Err(e)) => {
                    last = e.to_string();
                    None
                }
            };
            let mut st = self.lock();
            if st.dead.is_some() {
                return; // closed meanwhile
            }
            if let Some(e) = failed {
                st.dead = Some(e);
                self.changed.notify_all();
                return;
            }
            drop(st);
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// Connects and re-attaches: hello, attach (with the front of the unanswered commands
    /// behind it) and the server's answer. On a TLS link of a session that negotiated
    /// [`wire::feature::CHANNEL_BOUND_ATTACH`] the attach's proof is bound to the TLS channel
    /// and goes with the hello in one write: one round trip after the TLS handshake. Else it
    /// is bound to the server's nonce and waits for the welcome: two.
    fn try_attach(self: &Arc<Self>, timeout: Duration) -> Result<()> {
        let server = self.server.as_str();
        let send_err = |e: std::io::Error| RemoteError::Connect { server: server.into(), why: e.to_string() };
        let mut s = dial(server, &self.opts, timeout)?;
        let client: [u8; 16] = random();
        let features = self.lock().keys.features;
        let channel = if features & wire::feature::CHANNEL_BOUND_ATTACH != 0 { s.channel_binding() } else { None };
        // The attach and the unanswered commands that go with it (the session's keys and
        // commands are read under the lock; nothing is written under it).
        let attach = |out: &mut Vec<u8>, nonces: Option<&Nonces>| -> u64 {
            let st = self.lock();
            let (id, last_reply) = (st.keys.id, st.last_reply);
            let mac = match (&channel, nonces) {
                (Some(ch), _) => st.keys.secret.attach_proof_channel(ch, &client, &id, last_reply),
                (None, Some(n)) => st.keys.secret.attach_proof(n, &id, last_reply),
                (None, None) => unreachable!("an attach without a channel binding waits for the server's nonce"),
            };
            Frame::Attach { session: id, last_reply, mac }.encode_into(out);
            pipeline(&st.unanswered, out)
        };
        let mut out = Vec::new();
        hello(&self.opts, client).encode_into(&mut out);
        let (welcome, sent) = match &channel {
            Some(_) => {
                let sent = attach(&mut out, None);
                s.write_all(&out).map_err(send_err)?;
                (read_welcome(server, &self.opts, &mut s)?, sent)
            }
            None => {
                s.write_all(&out).map_err(send_err)?;
                let welcome = read_welcome(server, &self.opts, &mut s)?;
                out.clear();
                let sent = attach(&mut out, Some(&Nonces { client, server: welcome.nonce }));
                s.write_all(&out).map_err(send_err)?;
                (welcome, sent)
            }
        };
        let max_frame = self.lock().keys.max_frame;
        if welcome.max_frame != max_frame {
            return Err(RemoteError::Protocol {
                server: server.into(),
                why: format!("frame limit changed from {max_frame} to {}", welcome.max_frame),
            });
        }
        match read_handshake(server, &mut s)? {
            Frame::Attached { last_received, mac } => {
                let mut st = self.lock();
                let proved = match &channel {
                    Some(ch) => st.keys.secret.check_attached_channel(ch, &client, last_received, &mac),
                    None => st.keys.secret.check_attached(&Nonces { client, server: welcome.nonce }, last_received, &mac),
                };
                if !proved {
                    return Err(RemoteError::Refused {
                        server: server.into(),
                        why: "the server could not prove it holds the session".into(),
                    });
                }
                if last_received >= st.next_seq {
                    return Err(RemoteError::Protocol {
                        server: server.into(),
                        why: format!("server received command {last_received}, never sent"),
                    });
                }
                if st.dead.is_some() {
                    return Ok(()); // closed meanwhile: nothing to install
                }
                // Everything up to `last_received` arrived and runs (or ran) once; the server
                // re-sends the replies we lack. Only what it never received goes again (less
                // what went with the attach) — but those it received stay counted as
                // unanswered until their replies come.
                for (seq, frame) in st.unanswered.iter_mut() {
                    if *seq <= last_received && !frame.is_empty() {
                        *frame = Arc::new(Encoded::default());
                    }
                }
                self.install(&mut st, s, sent.max(last_received)).map_err(|why| RemoteError::Connect { server: server.into(), why })?;
                st.reconnects += 1;
                tracing::debug!(server = %self.server, "re-attached");
                self.changed.notify_all();
                Ok(())
            }
            other => Err(refused_or_protocol(server, other)),
        }
    }
}

/// The most bytes of commands waiting to be written before a sender waits for room (a frame
/// larger than this still goes, alone).
const OUTQ_LIMIT: usize = 8 << 20;

/// A connection's reads, counted (see [`Conn::received`]).
struct Counted<'a> {
    link: Link,
    count: &'a AtomicU64,
}

impl std::io::Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.link.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// One device of a server.
#[derive(Clone)]
pub struct RemoteDevice {
    remote: Remote,
    index: u32,
    info: DeviceInfo,
}

impl RemoteDevice {
    /// The server it belongs to.
    pub fn remote(&self) -> &Remote {
        &self.remote
    }
    /// Its index in the server's list.
    pub fn index(&self) -> u32 {
        self.index
    }
    /// Its name.
    pub fn name(&self) -> &str {
        &self.info.name
    }
    /// Host or CUDA.
    pub fn kind(&self) -> DeviceKind {
        self.info.kind
    }
    /// Its memory in bytes.
    pub fn total_memory(&self) -> u64 {
        self.info.memory
    }

    /// A new in-order queue on this device.
    pub fn queue(&self) -> Result<RemoteQueue> {
        let id = self.remote.id();
        self.remote.call(Command::CreateQueue { queue: id, device: self.index }, "creating a queue")?;
        Ok(RemoteQueue { device: self.clone(), id })
    }

    /// Compiles CUDA C `source` on this (CUDA) device; `name` can then be launched.
    pub fn compile(&self, source: &str, name: &str) -> Result<()> {
        let cmd = Command::CompileCuda { device: self.index, name: name.into(), source: source.into() };
        self.remote.call(cmd, &format!("compiling `{name}`")).map(|_| ())
    }
}

/// An in-order queue of a remote device.
#[derive(Clone)]
pub struct RemoteQueue {
    device: RemoteDevice,
    id: u64,
}

/// A point in a remote queue's work. Dropping it releases it on its server (which forgets it
/// once the other servers that were told to wait for it have asked).
pub struct RemoteEvent {
    remote: Remote,
    id: u64,
    /// Waits for it posted to other servers ([`RemoteQueue::wait_for`]).
    remote_waits: AtomicU64,
}

impl Drop for RemoteEvent {
    fn drop(&mut self) {
        let waits = self.remote_waits.load(Ordering::Relaxed);
        // A session already over has nothing left to release.
        let _ = self.remote.release_event(self.id, waits);
    }
}

impl RemoteEvent {
    /// Waits until the work before the event has run.
    pub fn synchronize(&self) -> Result<()> {
        self.remote.call(Command::SyncEvent { event: self.id }, "waiting for an event").map(|_| ())
    }
}

impl RemoteQueue {
    /// The device.
    pub fn device(&self) -> &RemoteDevice {
        &self.device
    }

    fn remote(&self) -> &Remote {
        &self.device.remote
    }

    /// A zeroed buffer of `len` elements (waits for the server, so limits fail here).
    pub fn alloc<T: bytemuck::Pod>(&self, len: usize) -> Result<RemoteBuffer<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| RemoteError::Invalid(format!("{len} elements overflow")))?;
        let id = self.remote().id();
        self.remote()
            .call(Command::Alloc { buffer: id, device: self.device.index, bytes: bytes as u64 }, &format!("allocating {bytes} bytes"))?;
        Ok(RemoteBuffer { queue: self.clone(), id, len, _t: PhantomData })
    }

    /// A buffer holding a copy of `host`.
    pub fn upload<T: bytemuck::Pod>(&self, host: &[T]) -> Result<RemoteBuffer<T>> {
        let mut b = self.alloc(host.len())?;
        b.copy_from_host(host)?;
        Ok(b)
    }

    /// Runs host kernel (or compiled CUDA kernel) `name` with `args` over `range` items.
    pub fn launch(&self, name: &str, args: &[Arg], range: u64) -> Result<()> {
        if name.len() > wire::MAX_NAME || args.len() > wire::MAX_ARGS {
            return Err(RemoteError::Invalid(format!(
                "kernel `{name}`: a name of at most {} bytes and {} arguments",
                wire::MAX_NAME,
                wire::MAX_ARGS
            )));
        }
        self.remote().post(Command::Launch { queue: self.id, kernel: name.into(), args: args.to_vec(), range })
    }

    /// Marks the current end of the queue.
    pub fn record(&self) -> Result<RemoteEvent> {
        let id = self.remote().id();
        self.remote().post(Command::Record { queue: self.id, event: id })?;
        Ok(RemoteEvent { remote: self.remote().clone(), id, remote_waits: AtomicU64::new(0) })
    }

    /// Makes later work on this queue wait for `event`. An event of another server of the same
    /// [`Mesh`] is waited for on this server, which learns of its completion from that server
    /// directly (the client is not involved): the call returns at once.
    pub fn wait_for(&self, event: &RemoteEvent) -> Result<()> {
        if event.remote.same(self.remote()) {
            return self.remote().post(Command::WaitEvent { queue: self.id, event: event.id });
        }
        let (peer, _) = same_mesh(&event.remote, self.remote())?;
        self.remote().post(Command::WaitRemote { peer, event: event.id })?;
        event.remote_waits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Waits until everything enqueued so far has run; reports any earlier failure.
    pub fn synchronize(&self) -> Result<()> {
        self.remote().call(Command::Finish { queue: self.id }, "synchronizing a queue").map(|_| ())
    }
}

/// `len` elements of `T` in a remote device's memory.
pub struct RemoteBuffer<T: bytemuck::Pod> {
    queue: RemoteQueue,
    id: u64,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: bytemuck::Pod> RemoteBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The kernel argument naming this buffer.
    pub fn arg(&self) -> Arg {
        Arg::Buffer(self.id)
    }
    fn remote(&self) -> &Remote {
        self.queue.remote()
    }
    fn check(&self, offset: usize, n: usize) -> Result<()> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(RemoteError::Invalid(format!("elements {offset}..{offset}+{n} are outside a buffer of {}", self.len))),
        }
    }

    /// Overwrites the whole buffer with `host` (same length).
    pub fn copy_from_host(&mut self, host: &[T]) -> Result<()> {
        if host.len() != self.len {
            return Err(RemoteError::Invalid(format!("{} elements into a buffer of {}", host.len(), self.len)));
        }
        self.write(0, host)
    }

    /// Writes `host` at element `offset` (split into frames as needed; sent without waiting).
    pub fn write(&mut self, offset: usize, host: &[T]) -> Result<()> {
        self.check(offset, host.len())?;
        let bytes: &[u8] = bytemuck::cast_slice(host);
        let chunk = self.remote().room() - wire::WRITE_OVERHEAD - 4;
        let base = (offset * std::mem::size_of::<T>()) as u64;
        for (i, part) in bytes.chunks(chunk.max(1)).enumerate() {
            self.remote().post(Command::Write { buffer: self.id, offset: base + (i * chunk) as u64, data: part.to_vec() })?;
        }
        Ok(())
    }

    /// Names `size` (a one-element `u64` buffer of the same server and device) as holding how
    /// many bytes of this buffer are meaningful: reads ([`RemoteBuffer::read_content`]),
    /// copies and migrations then move only those; a migration into a buffer that has one sets
    /// it to the bytes received. `None` clears it.
    pub fn set_content_size<S: bytemuck::Pod>(&mut self, size: Option<&RemoteBuffer<S>>) -> Result<()> {
        let size_buffer = match size {
            Some(b) if !b.remote().same(self.remote()) => {
                return Err(RemoteError::Invalid("the size buffer lives on another server".into()))
            }
            Some(b) => b.id,
            None => 0,
        };
        self.remote().post(Command::SetContentSize { buffer: self.id, size_buffer })
    }

    /// The meaningful elements (as the content size says; all of them without one).
    pub fn read_content(&self) -> Result<Vec<T>> {
        let size = std::mem::size_of::<T>();
        let total = self.len * size;
        let chunk = self.remote().room() - wire::READ_REPLY_OVERHEAD - 4;
        let mut bytes = Vec::new();
        while bytes.len() < total {
            let take = chunk.min(total - bytes.len());
            let cmd = Command::Read { buffer: self.id, offset: bytes.len() as u64, len: take as u64 };
            match self.remote().call(cmd, "reading a buffer")? {
                Outcome::Data(d) if d.len() <= take => {
                    let short = d.len() < take;
                    bytes.extend_from_slice(&d);
                    if short {
                        break;
                    }
                }
                other => return Err(self.remote().unexpected("reading a buffer", other)),
            }
        }
        if !bytes.len().is_multiple_of(size) {
            return Err(RemoteError::Invalid(format!(
                "the content size ({} bytes) is not a whole number of {size}-byte elements",
                bytes.len()
            )));
        }
        let mut out = vec![T::zeroed(); bytes.len() / size];
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes);
        Ok(out)
    }

    /// Moves all of `src` (a buffer of another server of the same [`Mesh`], same length) into
    /// this one: the source server sends the bytes straight to this buffer's server (only the
    /// meaningful ones if `src` has a content size), which then answers the client. Returns
    /// once both commands are sent; later work on this buffer's server runs after the bytes
    /// arrived, and work on the source's server before the migration is what it sends.
    pub fn migrate_from(&mut self, src: &RemoteBuffer<T>) -> Result<()> {
        if src.len != self.len {
            return Err(RemoteError::Invalid(format!("migrating {} elements into a buffer of {}", src.len, self.len)));
        }
        let len = (self.len * std::mem::size_of::<T>()) as u64;
        if src.remote().same(self.remote()) {
            return self.remote().post(Command::Copy { src: src.id, src_offset: 0, dst: self.id, dst_offset: 0, len });
        }
        let (src_index, dst_index) = same_mesh(src.remote(), self.remote())?;
        let transfer = next_transfer();
        src.remote().post(Command::MigrateOut { buffer: src.id, offset: 0, len, peer: dst_index, transfer })?;
        self.remote().post(Command::MigrateIn { buffer: self.id, offset: 0, len, peer: src_index, transfer })
    }

    /// Moves elements `src_offset..src_offset + n` of `src` (a buffer of another server of
    /// the same mesh) to elements `offset..offset + n` of this one, server to server, as
    /// [`RemoteBuffer::migrate_from`] does for whole buffers (a halo exchange, for instance).
    pub fn migrate_range_from(&mut self, offset: usize, src: &RemoteBuffer<T>, src_offset: usize, n: usize) -> Result<()> {
        self.check(offset, n)?;
        src.check(src_offset, n)?;
        let size = std::mem::size_of::<T>() as u64;
        let (len, at, src_at) = (n as u64 * size, offset as u64 * size, src_offset as u64 * size);
        if src.remote().same(self.remote()) {
            return self.remote().post(Command::Copy { src: src.id, src_offset: src_at, dst: self.id, dst_offset: at, len });
        }
        let (src_index, dst_index) = same_mesh(src.remote(), self.remote())?;
        let transfer = next_transfer();
        src.remote().post(Command::MigrateOut { buffer: src.id, offset: src_at, len, peer: dst_index, transfer })?;
        self.remote().post(Command::MigrateIn { buffer: self.id, offset: at, len, peer: src_index, transfer })
    }

    /// Reads elements `offset..offset + n`.
    pub fn read(&self, offset: usize, n: usize) -> Result<Vec<T>> {
        self.check(offset, n)?;
        let size = std::mem::size_of::<T>();
        let mut out: Vec<T> = vec![T::zeroed(); n];
        let dst: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
        let chunk = self.remote().room() - wire::READ_REPLY_OVERHEAD - 4;
        let base = (offset * size) as u64;
        let mut done = 0;
        while done < dst.len() {
            let take = chunk.min(dst.len() - done);
            match self.remote().call(Command::Read { buffer: self.id, offset: base + done as u64, len: take as u64 }, "reading a buffer")? {
                Outcome::Data(d) if d.len() == take => dst[done..done + take].copy_from_slice(&d),
                other => return Err(self.remote().unexpected("reading a buffer", other)),
            }
            done += take;
        }
        Ok(out)
    }

    /// The whole buffer.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.read(0, self.len)
    }

    /// Sets every element to `value`.
    pub fn fill(&mut self, value: T) -> Result<()> {
        let pattern = bytemuck::bytes_of(&value).to_vec();
        if pattern.len() > wire::MAX_PATTERN {
            return Err(RemoteError::Invalid(format!("a fill value of {} bytes (at most {})", pattern.len(), wire::MAX_PATTERN)));
        }
        let len = (self.len * pattern.len()) as u64;
        self.remote().post(Command::Fill { buffer: self.id, offset: 0, len, pattern })
    }

    /// Copies all of `src` (same server and device, same length) into this buffer.
    pub fn copy_from(&mut self, src: &RemoteBuffer<T>) -> Result<()> {
        if !Arc::ptr_eq(&src.remote().conn, &self.remote().conn) || src.len != self.len {
            return Err(RemoteError::Invalid("copies need two buffers of one server and one length".into()));
        }
        let len = (self.len * std::mem::size_of::<T>()) as u64;
        self.remote().post(Command::Copy { src: src.id, src_offset: 0, dst: self.id, dst_offset: 0, len })
    }
}

impl<T: bytemuck::Pod> Drop for RemoteBuffer<T> {
    fn drop(&mut self) {
        let _ = self.remote().post(Command::Free { buffer: self.id });
    }
}

/// A fresh transfer id for a [`Command::MigrateOut`] / [`Command::MigrateIn`] pair.
pub fn next_transfer() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The mesh indices of `a` and `b`, which must be members of one mesh.
fn same_mesh(a: &Remote, b: &Remote) -> Result<(u32, u32)> {
    match (a.mesh(), b.mesh()) {
        (Some((ma, ia)), Some((mb, ib))) if ma == mb => Ok((ia, ib)),
        _ => Err(RemoteError::Invalid(format!(
            "servers {} and {} are not members of one mesh (make one with Mesh::new)",
            a.server(),
            b.server()
        ))),
    }
}

/// Servers of one client made a peer mesh: each can send buffers to the others directly
/// ([`RemoteBuffer::migrate_from`]) and wait for their events ([`RemoteQueue::wait_for`]),
/// learning of completions from each other, not through the client.
///
/// The client hands every member a fresh random key; peer links prove they hold it (and are
/// TLS, trusting the certificate each member presented to this client).
pub struct Mesh {
    members: Vec<Remote>,
}

impl Mesh {
    /// Makes `members` (sessions on different servers) one mesh; waits until each has joined.
    pub fn new(members: &[Remote]) -> Result<Mesh> {
        if members.len() > wire::MAX_PEERS {
            return Err(RemoteError::Invalid(format!("{} members; a mesh has at most {}", members.len(), wire::MAX_PEERS)));
        }
        for (i, a) in members.iter().enumerate() {
            if a.mesh().is_some() {
                return Err(RemoteError::Invalid(format!("server {} is already in a mesh", a.server())));
            }
            if members[..i].iter().any(|b| b.same(a)) {
                return Err(RemoteError::Invalid(format!("server {} is listed twice", a.server())));
            }
        }
        let (mesh, key): ([u8; 16], [u8; 32]) = (random(), random());
        let specs: Vec<PeerSpec> = members
            .iter()
            .enumerate()
            .map(|(i, r)| PeerSpec { index: i as u32, address: r.peer_address(), pin: r.conn.lock().pin })
            .collect();
        for (i, r) in members.iter().enumerate() {
            let peers = specs.iter().filter(|p| p.index != i as u32).cloned().collect();
            r.call(Command::JoinMesh { mesh, key, index: i as u32, peers }, "joining a mesh")?;
            r.conn.lock().mesh = Some((mesh, i as u32));
        }
        Ok(Mesh { members: members.to_vec() })
    }

    /// Its members, in index order.
    pub fn members(&self) -> &[Remote] {
        &self.members
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attach_carries_an_unbroken_run_of_unanswered_commands_within_its_budget() {
        // Commands 1-2 the server holds (placeholders); 3-6 wait for it; 5 is too big to fit
        // after 3 and 4, so 6 (which would fit) must not go either: the server would see 5
        // skipped.
        // Frames with data are two parts (head and data); others one.
        let frame = |n: usize| Arc::new(Encoded { head: vec![7u8; n.min(40)], bulk: vec![8u8; n.saturating_sub(40)] });
        let q: VecDeque<(u64, Arc<Encoded>)> = VecDeque::from(vec![
            (1, Arc::default()),
            (2, Arc::default()),
            (3, frame(100)),
            (4, frame(200)),
            (5, frame(PIPELINE_BYTES)),
            (6, frame(10)),
        ]);
        let mut out = vec![9u8];
        assert_eq!(pipeline(&q, &mut out), 4);
        assert_eq!(out.len(), 1 + 100 + 200, "the frames of 3 and 4, after what was there");
        let whole = |n: usize| [vec![7u8; n.min(40)], vec![8u8; n.saturating_sub(40)]].concat();
        assert_eq!(out, [vec![9u8], whole(100), whole(200)].concat(), "each frame's head, then its data");
        // Nothing to send, or a first command over the budget: none go.
        let mut out = Vec::new();
        assert_eq!(pipeline(&VecDeque::from(vec![(1, Arc::default())]), &mut out), 0);
        assert_eq!(pipeline(&VecDeque::from(vec![(8, frame(PIPELINE_BYTES + 1)), (9, frame(1))]), &mut out), 0);
        assert!(out.is_empty());
        // Exactly the budget fits.
        assert_eq!(pipeline(&VecDeque::from(vec![(3, frame(PIPELINE_BYTES))]), &mut out), 3);
    }
}
