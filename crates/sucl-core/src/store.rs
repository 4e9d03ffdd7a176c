//! The rendezvous store: a small TCP key-value server (like torch's TCPStore) through which ranks
//! exchange addresses, plus the job's liveness monitor.
//!
//! Every rank keeps one connection to the server. A connection that closes without a goodbye
//! means its rank died: the server tells every other rank (an abort naming the lost rank), so
//! ranks blocked anywhere in sucl fail promptly instead of waiting for their timeout.
//!
//! # Authentication
//!
//! Only processes that know the job's [`JobSecret`] may use the store. The server opens every
//! connection with a random 32-byte challenge; the client answers with its rank, its own nonce
//! and `HMAC-SHA256(secret, "sucl-store-hello" ‖ server nonce ‖ client nonce ‖ rank)`; the server
//! answers with `HMAC-SHA256(secret, "sucl-store-welcome" ‖ client nonce ‖ server nonce ‖ rank)`,
//! so each side proves it knows the secret without sending it. A connection that fails the
//! handshake (or stays silent for [`HANDSHAKE_TIMEOUT`]) is closed before it can read or write a
//! key or raise an abort, and it is never counted as a rank, so it cannot disturb the job.
//!
//! # Untrusted input
//!
//! Every frame is validated before use (`decode_request`-style checks in this module): lengths
//! are bounded before anything is allocated (a few hundred bytes before authentication, at most
//! [`MAX_STORE_VALUE`] after), key lengths, ranks and wait times are range-checked, and a malformed
//! request from an authenticated rank ends that rank's connection with a reason naming it.

use crate::error::{AbortInfo, AbortState, Error, Result};
use crate::wire::{Header, Kind, HEADER_LEN};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest value (and so frame payload) an authenticated client may send or receive.
pub const MAX_STORE_VALUE: u64 = 16 << 20;
/// Longest key accepted.
pub const MAX_KEY_LEN: usize = 4096;
/// Longest abort reason kept (longer ones are cut).
pub const MAX_REASON_LEN: usize = 4096;
/// Largest rank number a client may claim.
pub const MAX_RANK: u64 = u32::MAX as u64;
/// Longest wait a `get` may ask the server for (one day): larger requests are capped.
pub const MAX_GET_WAIT: Duration = Duration::from_secs(24 * 3600);
/// How long a new connection has to complete the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections allowed to be in the handshake at once; more are closed immediately.
pub const MAX_PENDING_HANDSHAKES: usize = 64;
/// The environment variable through which launchers hand ranks the job secret.
pub const SECRET_ENV: &str = "SUCL_JOB_SECRET";

const NONCE_LEN: usize = 32;
const MAC_LEN: usize = 32;
/// Largest frame a connection may send before it has authenticated (a hello).
const MAX_HANDSHAKE_FRAME: u64 = (NONCE_LEN + MAC_LEN) as u64;
const HELLO_LABEL: &[u8] = b"sucl-store-hello\0";
const WELCOME_LABEL: &[u8] = b"sucl-store-welcome\0";

/// Reply status words (meta0 of a [`Kind::StoreReply`]).
const STATUS_OK: u64 = 0;
const STATUS_TIMEOUT: u64 = 1;
const STATUS_ABORTED: u64 = 2;

/// Where a [`JobSecret`] came from (it decides how much it protects).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretSource {
    /// Given by the launcher or the user through `SUCL_JOB_SECRET` (`sucl run` makes a random
    /// one): only processes that were handed it can join.
    Given,
    /// Derived from launch variables every rank sees (store address, launcher job id): it keeps
    /// another job's ranks from joining by accident, but anyone who can read those variables can
    /// derive it, so it is no protection against an attacker.
    Derived,
    /// Random, made by this process for a store only it uses (a world of one).
    Random,
}

/// The key that authenticates store connections of one job. Its `Debug` form hides the key.
#[derive(Clone, PartialEq, Eq)]
pub struct JobSecret {
    key: String,
    source: SecretSource,
}

impl fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobSecret(<{} bytes, {:?}>)", self.key.len(), self.source)
    }
}

impl JobSecret {
    /// 32 random bytes from the kernel, hex-encoded.
    pub fn random() -> std::io::Result<JobSecret> {
        let bytes: [u8; 32] = random_bytes()?;
        let key = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(JobSecret { key, source: SecretSource::Random })
    }

    /// A secret handed over by a launcher or the user (the value of `SUCL_JOB_SECRET`).
    pub fn given(value: &str) -> JobSecret {
        JobSecret { key: value.to_string(), source: SecretSource::Given }
    }

    /// A secret derived from launch variables every rank of the job sees (see
    /// [`SecretSource::Derived`] for what it does and does not protect against).
    pub fn derived(material: &str) -> JobSecret {
        JobSecret { key: format!("sucl-derived-v1|{material}"), source: SecretSource::Derived }
    }

    /// Where the secret came from.
    pub fn source(&self) -> SecretSource {
        self.source
    }

    /// The secret itself, to hand to child processes through [`SECRET_ENV`]. Never log it.
    pub fn expose(&self) -> &str {
        &self.key
    }

    fn mac(&self, label: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(self.key.as_bytes()).expect("HMAC accepts keys of any length");
        m.update(label);
        for p in parts {
            m.update(p);
        }
        m
    }

    fn prove(&self, label: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
        self.mac(label, parts).finalize().into_bytes().into()
    }

    /// Constant-time check of a proof.
    fn verify(&self, label: &[u8], parts: &[&[u8]], proof: &[u8]) -> bool {
        self.mac(label, parts).verify_slice(proof).is_ok()
    }

    /// `HMAC-SHA256(secret, label ‖ parts...)`: proves to another holder of the secret that
    /// this process knows it, without sending it (for handshakes beyond the store's, such as
    /// the tcp mesh's). Give each use its own `label`, so one proof never serves another.
    pub fn proof(&self, label: &[u8], parts: &[&[u8]]) -> [u8; PROOF_LEN] {
        self.prove(label, parts)
    }

    /// Whether `proof` is [`JobSecret::proof`] of the same label and parts (constant time).
    pub fn check_proof(&self, label: &[u8], parts: &[&[u8]], proof: &[u8]) -> bool {
        self.verify(label, parts, proof)
    }
}

/// Length of a [`JobSecret::proof`].
pub const PROOF_LEN: usize = MAC_LEN;
/// Length of a [`random_nonce`].
pub const NONCE_BYTES: usize = NONCE_LEN;

/// A fresh random nonce from the kernel, for a challenge.
pub fn random_nonce() -> std::io::Result<[u8; NONCE_BYTES]> {
    random_bytes()
}

/// `N` random bytes from the kernel.
fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}

fn write_frame(s: &mut impl Write, kind: Kind, tag: u64, meta: [u64; 2], payload: &[&[u8]]) -> std::io::Result<()> {
    let len: usize = payload.iter().map(|p| p.len()).sum();
    let mut buf = Vec::with_capacity(HEADER_LEN + len);
    buf.extend_from_slice(&Header { kind, tag, len: len as u64, meta }.encode());
    for p in payload {
        buf.extend_from_slice(p);
    }
    s.write_all(&buf)
}

/// Reads one frame whose payload may be at most `max_len` bytes (checked before allocating).
fn read_frame(s: &mut impl Read, max_len: u64) -> std::io::Result<(Header, Vec<u8>)> {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h)?;
    let hdr = Header::decode(&h, max_len).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    let mut payload = vec![0u8; hdr.len as usize];
    s.read_exact(&mut payload)?;
    Ok((hdr, payload))
}

/// A request from an authenticated client, validated.
#[derive(Debug, PartialEq, Eq)]
enum Request<'a> {
    Set { key: &'a [u8], value: &'a [u8] },
    Get { key: &'a [u8], wait: Duration },
    Add { key: &'a [u8], delta: i64 },
    Bye,
    Abort(AbortInfo),
}

fn check_key(key: &[u8]) -> std::result::Result<&[u8], String> {
    if key.len() > MAX_KEY_LEN {
        return Err(format!("key of {} bytes (at most {MAX_KEY_LEN})", key.len()));
    }
    Ok(key)
}

/// Decodes an abort's fields: meta0 = lost rank + 1 (0 = none), payload = reason (cut).
fn decode_abort(meta0: u64, payload: &[u8]) -> std::result::Result<AbortInfo, String> {
    let lost_rank = match meta0 {
        0 => None,
        m if m - 1 <= MAX_RANK => Some((m - 1) as usize),
        m => return Err(format!("abort names rank {} (at most {MAX_RANK})", m - 1)),
    };
    let reason = String::from_utf8_lossy(&payload[..payload.len().min(MAX_REASON_LEN)]).into_owned();
    Ok(AbortInfo { lost_rank, reason })
}

fn encode_lost(info: &AbortInfo) -> u64 {
    info.lost_rank.map(|r| (r as u64).min(MAX_RANK) + 1).unwrap_or(0)
}

/// Validates a request frame of an authenticated connection.
fn decode_request<'a>(hdr: &Header, payload: &'a [u8]) -> std::result::Result<Request<'a>, String> {
    if hdr.len != payload.len() as u64 {
        return Err(format!("frame announces {} bytes but carries {}", hdr.len, payload.len()));
    }
    match hdr.kind {
        Kind::StoreSet => {
            let klen = usize::try_from(hdr.tag)
                .ok()
                .filter(|&k| k <= payload.len())
                .ok_or_else(|| format!("set: key length {} exceeds the {} bytes sent", hdr.tag, payload.len()))?;
            let (key, value) = payload.split_at(klen);
            Ok(Request::Set { key: check_key(key)?, value })
        }
        Kind::StoreGet => {
            let wait = Duration::from_millis(hdr.meta[0]).min(MAX_GET_WAIT);
            Ok(Request::Get { key: check_key(payload)?, wait })
        }
        Kind::StoreAdd => Ok(Request::Add { key: check_key(payload)?, delta: hdr.meta[0] as i64 }),
        Kind::StoreBye => Ok(Request::Bye),
        Kind::StoreAbort => decode_abort(hdr.meta[0], payload).map(Request::Abort),
        k => Err(format!("frame kind {k:?} is not a store request")),
    }
}

/// A client's answer to the challenge: its rank, nonce and proof.
struct Hello {
    rank: usize,
    nonce: [u8; NONCE_LEN],
    proof: [u8; MAC_LEN],
}

fn decode_hello(hdr: &Header, payload: &[u8]) -> std::result::Result<Hello, String> {
    if hdr.kind != Kind::StoreHello {
        return Err(format!("expected a hello, got {:?}", hdr.kind));
    }
    if payload.len() != NONCE_LEN + MAC_LEN {
        return Err(format!("hello of {} bytes (expected {})", payload.len(), NONCE_LEN + MAC_LEN));
    }
    if hdr.meta[0] > MAX_RANK {
        return Err(format!("hello claims rank {} (at most {MAX_RANK})", hdr.meta[0]));
    }
    let nonce = payload[..NONCE_LEN].try_into().expect("length checked");
    let proof = payload[NONCE_LEN..].try_into().expect("length checked");
    Ok(Hello { rank: hdr.meta[0] as usize, nonce, proof })
}

/// What the server sends a client after the handshake.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    Reply { status: u64, value: Vec<u8> },
    Abort(AbortInfo),
}

fn decode_event(hdr: &Header, payload: Vec<u8>) -> std::result::Result<Event, String> {
    match hdr.kind {
        Kind::StoreReply if hdr.meta[0] <= STATUS_ABORTED => Ok(Event::Reply { status: hdr.meta[0], value: payload }),
        Kind::StoreReply => Err(format!("reply with unknown status {}", hdr.meta[0])),
        Kind::StoreAbort => decode_abort(hdr.meta[0], &payload).map(Event::Abort),
        k => Err(format!("frame kind {k:?} is not a store reply")),
    }
}

#[derive(Default)]
struct ServerState {
    kv: HashMap<Vec<u8>, Vec<u8>>,
    clients: HashMap<usize, TcpStream>,
    byes: HashSet<usize>,
    abort: Option<AbortInfo>,
}

struct Shared {
    state: Mutex<ServerState>,
    cond: Condvar,
    stop: AtomicBool,
    secret: JobSecret,
    pending: AtomicUsize,
}

/// The store server. Dropping it stops accepting; connections end when their clients leave.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Binds the first of `addr`'s addresses that can be bound (port 0 picks a free port) and
    /// serves, in background threads, the clients that prove they know `secret`.
    pub fn start(addr: impl ToSocketAddrs, secret: JobSecret) -> std::io::Result<StoreServer> {
        let listener = TcpListener::bind(addr)?;
        let local = listener.local_addr()?;
        if !local.ip().is_loopback() {
            tracing::info!(addr = %local, secret = ?secret.source(), "rendezvous store listening beyond this host");
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(ServerState::default()),
            cond: Condvar::new(),
            stop: AtomicBool::new(false),
            secret,
            pending: AtomicUsize::new(0),
        });
        let sh = shared.clone();
        let acceptor = std::thread::Builder::new().name("sucl-store".into()).spawn(move || {
            for conn in listener.incoming() {
                if sh.stop.load(Ordering::Acquire) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                // Bound the threads strangers can make us keep: a flood of silent connections is
                // closed at once instead of each holding a thread for the handshake timeout.
                if sh.pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING_HANDSHAKES {
                    sh.pending.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
                let _ = conn.set_nodelay(true);
                let sh2 = sh.clone();
                let spawned = std::thread::Builder::new().name("sucl-store-conn".into()).spawn(move || serve(sh2, conn));
                if spawned.is_err() {
                    sh.pending.fetch_sub(1, Ordering::AcqRel);
                }
            }
        })?;
        Ok(StoreServer { addr: local, shared, acceptor: Some(acceptor) })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The abort the server saw, if any (for the launcher's report).
    pub fn abort_info(&self) -> Option<AbortInfo> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner()).abort.clone()
    }

    /// Waits until `n` ranks said goodbye (or one failed), at most `timeout`.
    pub fn wait_all_bye(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now().checked_add(timeout);
        let mut g = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        while g.byes.len() < n && g.abort.is_none() {
            let left = deadline.map_or(Duration::from_secs(3600), |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return false;
            }
            g = self.shared.cond.wait_timeout(g, left).unwrap_or_else(|e| e.into_inner()).0;
        }
        g.byes.len() >= n
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wake the acceptor with a throwaway connection.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        let g = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        for c in g.clients.values() {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

fn push_abort(g: &mut ServerState, info: &AbortInfo, except: Option<usize>) {
    let lost = encode_lost(info);
    for (&r, c) in g.clients.iter_mut() {
        if Some(r) != except && !g.byes.contains(&r) {
            let _ = write_frame(c, Kind::StoreAbort, 0, [lost, 0], &[info.reason.as_bytes()]);
        }
    }
}

/// Runs the server side of the handshake; returns the authenticated rank, or why not.
fn authenticate(sh: &Shared, conn: &mut TcpStream) -> std::result::Result<usize, String> {
    conn.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(|e| e.to_string())?;
    conn.set_write_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(|e| e.to_string())?;
    let challenge: [u8; NONCE_LEN] = random_bytes().map_err(|e| format!("no randomness: {e}"))?;
    write_frame(conn, Kind::StoreChallenge, 0, [0, 0], &[&challenge]).map_err(|e| e.to_string())?;
    let (hdr, payload) = read_frame(conn, MAX_HANDSHAKE_FRAME).map_err(|e| e.to_string())?;
    let hello = decode_hello(&hdr, &payload)?;
    let rank_le = (hello.rank as u64).to_le_bytes();
    if !sh.secret.verify(HELLO_LABEL, &[&challenge, &hello.nonce, &rank_le], &hello.proof) {
        return Err(format!("a client claiming rank {} does not know the job secret", hello.rank));
    }
    let welcome = sh.secret.prove(WELCOME_LABEL, &[&hello.nonce, &challenge, &rank_le]);
    write_frame(conn, Kind::StoreReply, 0, [STATUS_OK, 0], &[&welcome]).map_err(|e| e.to_string())?;
    conn.set_read_timeout(None).map_err(|e| e.to_string())?;
    conn.set_write_timeout(None).map_err(|e| e.to_string())?;
    Ok(hello.rank)
}

fn serve(sh: Arc<Shared>, mut conn: TcpStream) {
    let auth = authenticate(&sh, &mut conn);
    sh.pending.fetch_sub(1, Ordering::AcqRel);
    let rank = match auth {
        Ok(r) => r,
        Err(why) => {
            let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
            tracing::warn!(%peer, %why, "rendezvous store refused a connection");
            let _ = conn.shutdown(Shutdown::Both);
            return;
        }
    };
    let mut writer = match conn.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    {
        let mut g = sh.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(c) = conn.try_clone() {
            g.clients.insert(rank, c);
        }
        if let Some(info) = g.abort.clone() {
            let _ = write_frame(&mut writer, Kind::StoreAbort, 0, [encode_lost(&info), 0], &[info.reason.as_bytes()]);
        }
    }
    let mut malformed = None;
    while let Ok((hdr, payload)) = read_frame(&mut conn, MAX_STORE_VALUE + MAX_KEY_LEN as u64) {
        let req = match decode_request(&hdr, &payload) {
            Ok(r) => r,
            Err(why) => {
                malformed = Some(why);
                break;
            }
        };
        if handle(&sh, rank, req, &mut writer).is_err() {
            break;
        }
    }
    // The connection ended: without a goodbye, its rank is lost.
    let mut g = sh.state.lock().unwrap_or_else(|e| e.into_inner());
    g.clients.remove(&rank);
    if !g.byes.contains(&rank) && g.abort.is_none() && !sh.stop.load(Ordering::Acquire) {
        let reason = match malformed {
            Some(why) => format!("rank {rank} sent a malformed store request ({why})"),
            None => format!("rank {rank} exited or closed its connection without finishing"),
        };
        let info = AbortInfo { lost_rank: Some(rank), reason };
        g.abort = Some(info.clone());
        push_abort(&mut g, &info, Some(rank));
    }
    drop(g);
    sh.cond.notify_all();
}

/// Serves one validated request of an authenticated `rank`. Replies are written under the state
/// lock, so they never interleave with an abort that another connection pushes to this client.
fn handle(sh: &Shared, rank: usize, req: Request<'_>, w: &mut TcpStream) -> std::io::Result<()> {
    let reply = |w: &mut TcpStream, status: u64, v: &[u8]| write_frame(w, Kind::StoreReply, 0, [status, 0], &[v]);
    let mut g = sh.state.lock().unwrap_or_else(|e| e.into_inner());
    let res = match req {
        Request::Set { key, value } => {
            g.kv.insert(key.to_vec(), value.to_vec());
            reply(w, STATUS_OK, &[])
        }
        Request::Add { key, delta } => {
            let cur = g.kv.get(key).and_then(|v| v.as_slice().try_into().ok()).map(i64::from_le_bytes).unwrap_or(0);
            let new = cur.wrapping_add(delta);
            g.kv.insert(key.to_vec(), new.to_le_bytes().to_vec());
            reply(w, STATUS_OK, &new.to_le_bytes())
        }
        Request::Get { key, wait } => {
            // `wait` is capped by the decoder, so this cannot overflow; checked all the same.
            let deadline = Instant::now().checked_add(wait).unwrap_or_else(Instant::now);
            loop {
                if let Some(v) = g.kv.get(key) {
                    break reply(w, STATUS_OK, v);
                }
                if g.abort.is_some() {
                    break reply(w, STATUS_ABORTED, &[]);
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break reply(w, STATUS_TIMEOUT, &[]);
                }
                g = sh.cond.wait_timeout(g, left.min(Duration::from_millis(200))).unwrap_or_else(|e| e.into_inner()).0;
            }
        }
        Request::Bye => {
            g.byes.insert(rank);
            reply(w, STATUS_OK, &[])
        }
        Request::Abort(info) => {
            if g.abort.is_none() {
                g.abort = Some(info.clone());
                push_abort(&mut g, &info, Some(rank));
            }
            Ok(())
        }
    };
    drop(g);
    sh.cond.notify_all();
    res
}

/// A rank's connection to the store. Server-pushed aborts raise the process's [`AbortState`].
pub struct StoreClient {
    rank: usize,
    writer: Mutex<TcpStream>,
    replies: Mutex<mpsc::Receiver<(u64, Vec<u8>)>>,
    closing: Arc<AtomicBool>,
    reader: Mutex<Option<JoinHandle<()>>>,
    timeout: Duration,
    abort: Arc<AbortState>,
}

/// The client side of the handshake (see the module documentation). The server gets at least
/// [`HANDSHAKE_TIMEOUT`] to answer, as it gives the client.
fn prove_to_server(stream: &mut TcpStream, addr: &str, rank: usize, secret: &JobSecret, wait: Duration) -> Result<()> {
    let wait = wait.max(HANDSHAKE_TIMEOUT);
    let op = || format!("the rendezvous store handshake with {addr}");
    let io = |e: std::io::Error| Error::io(rank, op(), e);
    stream.set_read_timeout(Some(wait)).map_err(io)?;
    stream.set_write_timeout(Some(wait)).map_err(io)?;
    // A read that times out is a slow server; one that ends is a refusal.
    let failed = |e: std::io::Error, what: &str| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::Timeout { rank, op: op(), after: wait },
        _ => refused(addr, rank, format!("{what} ({e})")),
    };
    let (hdr, challenge) = read_frame(stream, NONCE_LEN as u64).map_err(|e| failed(e, "no challenge"))?;
    if hdr.kind != Kind::StoreChallenge || challenge.len() != NONCE_LEN {
        return Err(refused(addr, rank, format!("expected a challenge, got a {:?} frame of {} bytes", hdr.kind, challenge.len())));
    }
    let nonce: [u8; NONCE_LEN] = random_bytes().map_err(io)?;
    let rank_le = (rank as u64).to_le_bytes();
    let proof = secret.prove(HELLO_LABEL, &[&challenge, &nonce, &rank_le]);
    write_frame(stream, Kind::StoreHello, 0, [rank as u64, 0], &[&nonce, &proof]).map_err(io)?;
    let (hdr, welcome) = read_frame(stream, MAC_LEN as u64).map_err(|e| failed(e, "it closed the connection"))?;
    if hdr.kind != Kind::StoreReply || hdr.meta[0] != STATUS_OK || !secret.verify(WELCOME_LABEL, &[&nonce, &challenge, &rank_le], &welcome)
    {
        return Err(refused(addr, rank, "the server does not know the job secret (another job's store on this port?)".into()));
    }
    stream.set_read_timeout(None).map_err(io)?;
    stream.set_write_timeout(None).map_err(io)?;
    Ok(())
}

fn refused(addr: &str, rank: usize, why: String) -> Error {
    Error::Config(format!(
        "the rendezvous store at {addr} refused rank {rank}: {why} (every rank of a job must share the job secret: \
         the same {SECRET_ENV}, or the same launcher variables it is derived from)"
    ))
}

impl StoreClient {
    /// Connects (retrying until `timeout`, as the server may start later), proves that it knows
    /// the job's `secret` and checks that the server does too. `server_rank` names the rank
    /// hosting the server, for the error if the connection drops.
    pub fn connect(
        addr: &str,
        rank: usize,
        server_rank: Option<usize>,
        timeout: Duration,
        abort: Arc<AbortState>,
        secret: &JobSecret,
    ) -> Result<StoreClient> {
        let start = Instant::now();
        let mut stream = loop {
            let attempt = addr
                .to_socket_addrs()
                .map_err(|e| Error::Config(format!("cannot resolve store address `{addr}`: {e}")))
                .and_then(|mut it| it.next().ok_or_else(|| Error::Config(format!("store address `{addr}` resolves to nothing"))))?;
            match TcpStream::connect_timeout(&attempt, Duration::from_millis(500)) {
                Ok(s) => break s,
                Err(e) => {
                    if start.elapsed() >= timeout {
                        return Err(Error::Timeout {
                            rank,
                            op: format!("connecting to the rendezvous store at {addr} ({e})"),
                            after: timeout,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        };
        stream.set_nodelay(true).map_err(|e| Error::io(rank, "store connect", e))?;
        prove_to_server(&mut stream, addr, rank, secret, timeout.saturating_sub(start.elapsed()))?;
        let mut rd = stream.try_clone().map_err(|e| Error::io(rank, "store connect", e))?;
        let (tx, rx) = mpsc::channel();
        let closing = Arc::new(AtomicBool::new(false));
        let (cl, ab) = (closing.clone(), abort.clone());
        let reader = std::thread::Builder::new()
            .name("sucl-store-watch".into())
            .spawn(move || loop {
                let event = read_frame(&mut rd, MAX_STORE_VALUE).map_err(|e| e.to_string()).and_then(|(h, p)| decode_event(&h, p));
                match event {
                    Ok(Event::Reply { status, value }) => {
                        if tx.send((status, value)).is_err() {
                            return;
                        }
                    }
                    Ok(Event::Abort(info)) => ab.set_remote(info),
                    Err(why) => {
                        if !cl.load(Ordering::Acquire) {
                            let reason = match server_rank {
                                Some(r) => format!("rank {r} (hosting the rendezvous store) exited ({why})"),
                                None => format!("lost the connection to the rendezvous store (launcher gone: {why})"),
                            };
                            ab.set_remote(AbortInfo { lost_rank: server_rank, reason });
                        }
                        return;
                    }
                }
            })
            .map_err(|e| Error::io(rank, "spawning the store watcher", e))?;
        let w = stream.try_clone().map_err(|e| Error::io(rank, "store", e))?;
        let c = StoreClient {
            rank,
            writer: Mutex::new(stream),
            replies: Mutex::new(rx),
            closing,
            reader: Mutex::new(Some(reader)),
            timeout,
            abort,
        };
        let w = Mutex::new(w);
        c.abort.set_notifier(Box::new(move |info: &AbortInfo| {
            if let Ok(mut w) = w.lock() {
                let _ = write_frame(&mut *w, Kind::StoreAbort, 0, [encode_lost(info), 0], &[info.reason.as_bytes()]);
            }
        }));
        Ok(c)
    }

    fn request(&self, kind: Kind, tag: u64, meta: [u64; 2], payload: &[&[u8]], what: &str) -> Result<(u64, Vec<u8>)> {
        let replies = self.replies.lock().unwrap_or_else(|e| e.into_inner());
        {
            let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
            write_frame(&mut *w, kind, tag, meta, payload).map_err(|e| Error::io(self.rank, what.to_string(), e))?;
        }
        let wait = Duration::from_millis(meta[0].min(u32::MAX as u64)).max(self.timeout) + Duration::from_secs(2);
        let start = Instant::now();
        loop {
            match replies.recv_timeout(Duration::from_millis(100)) {
                Ok(r) => return Ok(r),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.abort.check(self.rank, what)?;
                    return Err(Error::Aborted { rank: self.rank, reason: "the rendezvous store connection closed".into() });
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if kind != Kind::StoreBye {
                        self.abort.check(self.rank, what)?;
                    }
                    if start.elapsed() >= wait {
                        return Err(Error::Timeout { rank: self.rank, op: what.to_string(), after: wait });
                    }
                }
            }
        }
    }

    fn check_key(&self, key: &str) -> Result<()> {
        if key.len() > MAX_KEY_LEN {
            return Err(Error::invalid(self.rank, "key", format!("store key of {} bytes (at most {MAX_KEY_LEN})", key.len())));
        }
        Ok(())
    }

    /// Sets `key` to `value`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.check_key(key)?;
        if value.len() as u64 > MAX_STORE_VALUE {
            return Err(Error::invalid(self.rank, "value", format!("store value of {} bytes (at most {MAX_STORE_VALUE})", value.len())));
        }
        self.request(Kind::StoreSet, key.len() as u64, [0, 0], &[key.as_bytes(), value], "store set").map(|_| ())
    }

    /// Waits (bounded by the timeout) until `key` exists and returns its value.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        self.check_key(key)?;
        let ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let (status, v) = self.request(Kind::StoreGet, 0, [ms, 0], &[key.as_bytes()], "store get")?;
        match status {
            STATUS_OK => Ok(v),
            STATUS_ABORTED => {
                self.abort.check(self.rank, &format!("waiting for store key `{key}`"))?;
                Err(Error::Aborted { rank: self.rank, reason: "job aborted".into() })
            }
            _ => Err(Error::Timeout {
                rank: self.rank,
                op: format!("waiting for store key `{key}` (a rank did not arrive)"),
                after: self.timeout,
            }),
        }
    }

    /// Adds `delta` to the counter `key` and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.check_key(key)?;
        let (_, v) = self.request(Kind::StoreAdd, 0, [delta as u64, 0], &[key.as_bytes()], "store add")?;
        let b: [u8; 8] = v.as_slice().try_into().map_err(|_| Error::Aborted { rank: self.rank, reason: "malformed store reply".into() })?;
        Ok(i64::from_le_bytes(b))
    }

    /// A barrier among `n` ranks under a unique `name`.
    pub fn barrier(&self, name: &str, n: usize) -> Result<()> {
        let v = self.add(&format!("{name}/count"), 1)?;
        if v as usize == n {
            self.set(&format!("{name}/done"), b"1")?;
        }
        self.get(&format!("{name}/done")).map(|_| ())
    }

    /// Says goodbye: from now on this rank's disconnect is not a failure.
    pub fn bye(&self) -> Result<()> {
        self.request(Kind::StoreBye, 0, [0, 0], &[], "store goodbye")?;
        self.closing.store(true, Ordering::Release);
        Ok(())
    }

    /// The local address of the store connection: the interface through which this host
    /// reaches the rendezvous host, used to advertise this rank's listeners.
    pub fn local_ip(&self) -> Option<std::net::IpAddr> {
        self.writer.lock().ok()?.local_addr().ok().map(|a| a.ip())
    }
}

impl Drop for StoreClient {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Release);
        if let Ok(w) = self.writer.lock() {
            let _ = w.shutdown(Shutdown::Both);
        }
        if let Some(h) = self.reader.lock().ok().and_then(|mut g| g.take()) {
            let _ = h.join();
        }
    }
}

/// Entry point of the coverage-guided fuzz target `store_frames` (`fuzz/`) and of the tests
/// that replay its corpus: not part of the API.
#[doc(hidden)]
pub mod fuzz {
    use super::*;
    use std::io::Cursor;

    /// Reads `bytes` as the store's peers would send them: a handshake frame as the server reads
    /// it before authentication, then frames as the server reads requests and as a client reads
    /// replies, until the bytes run out or one is refused. Panics when a decoder accepts what
    /// breaks its bounds (lengths, keys, ranks, waits, reasons).
    pub fn frames(bytes: &[u8]) {
        let mut r = Cursor::new(bytes);
        if let Ok((hdr, payload)) = read_frame(&mut r, MAX_HANDSHAKE_FRAME) {
            assert!(payload.len() as u64 <= MAX_HANDSHAKE_FRAME);
            if let Ok(h) = decode_hello(&hdr, &payload) {
                assert!(h.rank as u64 <= MAX_RANK);
            }
        }
        let mut r = Cursor::new(bytes);
        while let Ok((hdr, payload)) = read_frame(&mut r, MAX_STORE_VALUE + MAX_KEY_LEN as u64) {
            assert_eq!(payload.len() as u64, hdr.len);
            if let Ok(req) = decode_request(&hdr, &payload) {
                check_request(&req, &payload);
            }
            if let Ok(Event::Abort(info)) = decode_event(&hdr, payload) {
                check_abort(&info);
            }
        }
    }

    /// What a request the server accepted may hold.
    pub(super) fn check_request(req: &Request<'_>, payload: &[u8]) {
        match req {
            Request::Set { key, value } => {
                assert!(key.len() <= MAX_KEY_LEN);
                assert_eq!(key.len() + value.len(), payload.len());
            }
            Request::Get { key, wait } => assert!(key.len() <= MAX_KEY_LEN && *wait <= MAX_GET_WAIT),
            Request::Add { key, .. } => assert!(key.len() <= MAX_KEY_LEN),
            Request::Bye => {}
            Request::Abort(info) => check_abort(info),
        }
    }

    fn check_abort(info: &AbortInfo) {
        if let Some(r) = info.lost_rank {
            assert!(r as u64 <= MAX_RANK);
        }
        assert!(info.reason.chars().count() <= MAX_REASON_LEN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Cursor;

    fn secret() -> JobSecret {
        JobSecret::given("test-secret")
    }

    fn wait_until(what: impl Fn() -> bool, limit: Duration) -> bool {
        let start = Instant::now();
        while !what() && start.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(5));
        }
        what()
    }

    #[test]
    fn set_get_add_barrier_and_loss() {
        let server = StoreServer::start("127.0.0.1:0", secret()).unwrap();
        let addr = server.addr().to_string();
        let t = Duration::from_secs(5);
        let a0 = AbortState::new();
        let c0 = StoreClient::connect(&addr, 0, None, t, a0.clone(), &secret()).unwrap();
        let a1 = AbortState::new();
        let c1 = StoreClient::connect(&addr, 1, None, t, a1.clone(), &secret()).unwrap();
        c0.set("k", b"v").unwrap();
        assert_eq!(c1.get("k").unwrap(), b"v");
        assert_eq!(c0.add("n", 2).unwrap(), 2);
        assert_eq!(c1.add("n", 3).unwrap(), 5);
        let h = std::thread::spawn(move || {
            c1.barrier("b", 2).unwrap();
            c1
        });
        c0.barrier("b", 2).unwrap();
        let c1 = h.join().unwrap();
        // Rank 1 vanishes without goodbye: rank 0 learns it was lost.
        drop(c1);
        assert!(wait_until(|| a0.is_set(), t));
        assert_eq!(a0.info().unwrap().lost_rank, Some(1));
        assert!(c0.get("never").is_err());
    }

    /// A job of one rank-0 client, and a way to check it is untouched.
    struct Job {
        server: StoreServer,
        abort: Arc<AbortState>,
        client: StoreClient,
    }

    impl Job {
        fn start() -> Job {
            let server = StoreServer::start("127.0.0.1:0", secret()).unwrap();
            let abort = AbortState::new();
            let addr = server.addr().to_string();
            let client = StoreClient::connect(&addr, 0, None, Duration::from_millis(150), abort.clone(), &secret()).unwrap();
            client.set("k", b"v").unwrap();
            Job { server, abort, client }
        }

        fn addr(&self) -> String {
            self.server.addr().to_string()
        }

        /// No abort anywhere, the real client still works, and nothing an outsider tried to
        /// write is there.
        fn assert_unaffected(&self) {
            std::thread::sleep(Duration::from_millis(50));
            assert!(!self.abort.is_set(), "the job saw an abort: {:?}", self.abort.info());
            assert_eq!(self.server.abort_info(), None);
            assert_eq!(self.client.get("k").unwrap(), b"v");
            assert_eq!(self.client.add("n", 1).unwrap(), 1);
            assert!(matches!(self.client.get("injected"), Err(Error::Timeout { .. })), "an outsider wrote a key");
        }
    }

    #[test]
    fn a_client_with_a_wrong_secret_is_refused_and_the_job_is_unaffected() {
        let job = Job::start();
        let t = Duration::from_secs(2);
        let err = StoreClient::connect(&job.addr(), 1, None, t, AbortState::new(), &JobSecret::given("wrong")).err().expect("refused");
        let msg = err.to_string();
        assert!(msg.contains("refused rank 1") && msg.contains(SECRET_ENV), "{msg}");
        // Claiming the rank of a live client with a wrong secret does not take its place.
        assert!(StoreClient::connect(&job.addr(), 0, None, t, AbortState::new(), &JobSecret::given("")).is_err());
        job.assert_unaffected();
    }

    /// Frames an outsider might send, each on its own connection, without the secret.
    fn outsider_frames() -> Vec<Vec<u8>> {
        let frame = |kind, tag, meta: [u64; 2], payload: &[u8]| {
            let mut v = Header { kind, tag, len: payload.len() as u64, meta }.encode().to_vec();
            v.extend_from_slice(payload);
            v
        };
        let reason = b"injected abort";
        let mut forged_hello = frame(Kind::StoreHello, 0, [1, 0], &[7u8; 64]);
        forged_hello.extend(frame(Kind::StoreAbort, 0, [1, 0], reason));
        vec![
            frame(Kind::StoreAbort, 0, [1, 0], reason),
            frame(Kind::StoreAbort, 0, [0, 0], reason),
            frame(Kind::StoreSet, 8, [0, 0], b"injectedevil"),
            forged_hello,
            frame(Kind::StoreBye, 0, [0, 0], b""),
        ]
    }

    #[test]
    fn an_abort_without_the_secret_has_no_effect() {
        let job = Job::start();
        for bytes in outsider_frames() {
            let mut s = TcpStream::connect(job.addr()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            // The server speaks first (its challenge); then it must close on us.
            let (hdr, _) = read_frame(&mut s, 64).unwrap();
            assert_eq!(hdr.kind, Kind::StoreChallenge);
            let _ = s.write_all(&bytes);
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            assert!(rest.is_empty(), "the server answered an outsider: {rest:?}");
        }
        job.assert_unaffected();
    }

    #[test]
    fn the_client_refuses_a_server_without_the_secret() {
        // A listener that plays server but cannot prove the secret (another job's store, say).
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            write_frame(&mut s, Kind::StoreChallenge, 0, [0, 0], &[&[1u8; NONCE_LEN]]).unwrap();
            let _ = read_frame(&mut s, MAX_HANDSHAKE_FRAME);
            let _ = write_frame(&mut s, Kind::StoreReply, 0, [0, 0], &[&[0u8; MAC_LEN]]);
            std::thread::sleep(Duration::from_millis(200));
        });
        let err = StoreClient::connect(&addr, 0, None, Duration::from_secs(2), AbortState::new(), &secret()).err().expect("refused");
        assert!(err.to_string().contains("does not know the job secret"), "{err}");
        fake.join().unwrap();
    }

    /// An authenticated raw connection, for sending what a real client never would.
    fn login(addr: &str, rank: usize) -> TcpStream {
        let mut s = TcpStream::connect(addr).unwrap();
        prove_to_server(&mut s, addr, rank, &secret(), Duration::from_secs(2)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    #[test]
    fn a_malformed_request_ends_its_rank_with_a_reason() {
        let job = Job::start();
        let mut s = login(&job.addr(), 5);
        // A key length beyond the bytes sent.
        write_frame(&mut s, Kind::StoreSet, 1000, [0, 0], &[b"short"]).unwrap();
        assert!(wait_until(|| job.abort.is_set(), Duration::from_secs(5)));
        let info = job.abort.info().unwrap();
        assert_eq!(info.lost_rank, Some(5));
        assert!(info.reason.contains("malformed store request") && info.reason.contains("key length 1000"), "{}", info.reason);
    }

    use super::fuzz::check_request;

    fn store_kind() -> impl Strategy<Value = Kind> {
        prop::sample::select(vec![
            Kind::Data,
            Kind::StoreSet,
            Kind::StoreGet,
            Kind::StoreAdd,
            Kind::StoreReply,
            Kind::StoreHello,
            Kind::StoreBye,
            Kind::StoreAbort,
            Kind::StoreChallenge,
        ])
    }

    proptest! {
        /// Arbitrary bytes never panic the store's decoders, and what they accept is in bounds.
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400), limit in 0u64..300) {
            let mut r = Cursor::new(&bytes);
            if let Ok((hdr, payload)) = read_frame(&mut r, limit) {
                prop_assert!(payload.len() as u64 <= limit);
                if let Ok(req) = decode_request(&hdr, &payload) { check_request(&req, &payload) }
                let _ = decode_hello(&hdr, &payload);
                let _ = decode_event(&hdr, payload);
            }
        }

        /// Well-formed headers with arbitrary fields: every field is validated (key lengths,
        /// ranks, waits), nothing panics, and an announced length over the limit is refused
        /// before the payload is allocated.
        #[test]
        fn arbitrary_fields_are_validated(kind in store_kind(), tag in any::<u64>(), len in any::<u64>(), m0 in any::<u64>(), m1 in any::<u64>(),
                                          payload in proptest::collection::vec(any::<u8>(), 0..200)) {
            let hdr = Header { kind, tag, len: payload.len() as u64, meta: [m0, m1] };
            if let Ok(req) = decode_request(&hdr, &payload) { check_request(&req, &payload) }
            let _ = decode_hello(&hdr, &payload);
            let _ = decode_event(&hdr, payload.clone());
            // The same header announcing `len` bytes: over the limit is an error up front.
            let mut bytes = Header { len, ..hdr }.encode().to_vec();
            bytes.extend_from_slice(&payload);
            let limit = MAX_STORE_VALUE + MAX_KEY_LEN as u64;
            match read_frame(&mut Cursor::new(&bytes), limit) {
                Ok((h, p)) => prop_assert!(h.len <= limit && p.len() as u64 == h.len),
                Err(e) => prop_assert!(len > limit || len > payload.len() as u64, "{e}"),
            }
        }
    }

    proptest! {
        // Each case starts a server: 16 at most (fewer with PROPTEST_CASES).
        #![proptest_config(ProptestConfig { cases: ProptestConfig::default().cases.min(16), ..ProptestConfig::default() })]

        /// Arbitrary bytes sent to a live server by an outsider never disturb the job.
        #[test]
        fn a_live_server_survives_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..300), valid_header in any::<bool>()) {
            let job = Job::start();
            let mut s = TcpStream::connect(job.addr()).unwrap();
            let mut bytes = bytes;
            if valid_header && bytes.len() >= HEADER_LEN {
                // Make it past the magic and version checks, to reach the field checks.
                bytes[..6].copy_from_slice(&Header::data(0, 0, [0, 0]).encode()[..6]);
            }
            let _ = s.write_all(&bytes);
            let _ = s.shutdown(Shutdown::Write);
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest);
            job.assert_unaffected();
        }
    }
}
