//! The rendezvous store: a small TCP key-value server (like torch's TCPStore) through which ranks
//! exchange addresses, plus the job's liveness monitor.
//!
//! Every rank keeps one connection to the server. A connection that closes without a goodbye
//! means its rank died: the server tells every other rank (an abort naming the lost rank), so
//! ranks blocked anywhere in sucl fail promptly instead of waiting for their timeout.

use crate::error::{AbortInfo, AbortState, Error, Result};
use crate::wire::{Header, Kind, HEADER_LEN};
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MAX_STORE_VALUE: u64 = 16 << 20;

fn write_frame(s: &mut impl Write, kind: Kind, tag: u64, meta: [u64; 2], payload: &[&[u8]]) -> std::io::Result<()> {
    let len: usize = payload.iter().map(|p| p.len()).sum();
    let mut buf = Vec::with_capacity(HEADER_LEN + len);
    buf.extend_from_slice(&Header { kind, tag, len: len as u64, meta }.encode());
    for p in payload {
        buf.extend_from_slice(p);
    }
    s.write_all(&buf)
}

fn read_frame(s: &mut impl Read) -> std::io::Result<(Header, Vec<u8>)> {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h)?;
    let hdr = Header::decode(&h, MAX_STORE_VALUE).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))?;
    let mut payload = vec![0u8; hdr.len as usize];
    s.read_exact(&mut payload)?;
    Ok((hdr, payload))
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
}

/// The store server. Dropping it stops accepting; connections end when their clients leave.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Binds `addr` (port 0 picks a free port) and serves in background threads.
    pub fn start(addr: impl ToSocketAddrs) -> std::io::Result<StoreServer> {
        let listener = TcpListener::bind(addr)?;
        let local = listener.local_addr()?;
        let shared = Arc::new(Shared { state: Mutex::new(ServerState::default()), cond: Condvar::new(), stop: AtomicBool::new(false) });
        let sh = shared.clone();
        let acceptor = std::thread::Builder::new().name("sucl-store".into()).spawn(move || {
            for conn in listener.incoming() {
                if sh.stop.load(Ordering::Acquire) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let _ = conn.set_nodelay(true);
                let sh2 = sh.clone();
                let _ = std::thread::Builder::new().name("sucl-store-conn".into()).spawn(move || serve(sh2, conn));
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
        let deadline = Instant::now() + timeout;
        let mut g = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        while g.byes.len() < n && g.abort.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
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
    let lost = info.lost_rank.map(|r| r as u64 + 1).unwrap_or(0);
    for (&r, c) in g.clients.iter_mut() {
        if Some(r) != except && !g.byes.contains(&r) {
            let _ = write_frame(c, Kind::StoreAbort, 0, [lost, 0], &[info.reason.as_bytes()]);
        }
    }
}

fn serve(sh: Arc<Shared>, mut conn: TcpStream) {
    let mut rank: Option<usize> = None;
    let mut writer = match conn.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    while let Ok((hdr, payload)) = read_frame(&mut conn) {
        let reply = |w: &mut TcpStream, status: u64, v: &[u8]| write_frame(w, Kind::StoreReply, 0, [status, 0], &[v]);
        let ok = match hdr.kind {
            Kind::StoreHello => {
                let r = hdr.meta[0] as usize;
                rank = Some(r);
                let mut g = sh.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Ok(c) = conn.try_clone() {
                    g.clients.insert(r, c);
                }
                let ab = g.abort.clone();
                drop(g);
                let r1 = reply(&mut writer, 0, &[]);
                if let Some(info) = ab {
                    let lost = info.lost_rank.map(|r| r as u64 + 1).unwrap_or(0);
                    let _ = write_frame(&mut writer, Kind::StoreAbort, 0, [lost, 0], &[info.reason.as_bytes()]);
                }
                r1
            }
            Kind::StoreSet => {
                let klen = (hdr.tag as usize).min(payload.len());
                let mut g = sh.state.lock().unwrap_or_else(|e| e.into_inner());
                g.kv.insert(payload[..klen].to_vec(), payload[klen..].to_vec());
                drop(g);
                sh.cond.notify_all();
                reply(&mut writer, 0, &[])
            }
            Kind::StoreAdd => {
                let mut g = sh.state.lock().unwrap_or_else(|e| e.into_inner());
                let cur = g.kv.get(&payload).and_then(|v| v.as_slice().try_into().ok()).map(i64::from_le_bytes).unwrap_or(0);
                let new = cur.wrapping_add(hdr.meta[0] as i64);
                g.kv.insert(payload.clone(), new.to_le_bytes().to_vec());
                drop(g);
                sh.cond.notify_all();
                reply(&mut writer, 0, &new.to_le_bytes())
            }
            Kind::StoreGet => {
                let deadline = Instant::now() + Duration::from_millis(hdr.meta[0]);
                let mut g = sh.state.lock().unwrap_or_else(|e| e.into_inner());
                let res = loop {
                    if let Some(v) = g.kv.get(&payload) {
                        break Ok(v.clone());
                    }
                    if g.abort.is_some() {
                        break Err(2);
                    }
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break Err(1);
                    }
                    g = sh.cond.wait_timeout(g, left.min(Duration::from_millis(200))).unwrap_or_else(|e| e.into_inner()).0;
                };
                drop(g);
                match res {
                    Ok(v) => reply(&mut writer, 0, &v),
                    Err(code) => reply(&mut writer, code, &[]),
                }
            }
            Kind::StoreBye => {
                let mut g = sh.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(r) = rank {
                    g.byes.insert(r);
                }
                drop(g);
                sh.cond.notify_all();
                reply(&mut writer, 0, &[])
            }
            Kind::StoreAbort => {
                let info = AbortInfo {
                    lost_rank: (hdr.meta[0] > 0).then(|| hdr.meta[0] as usize - 1),
                    reason: String::from_utf8_lossy(&payload).into_owned(),
                };
                let mut g = sh.state.lock().unwrap_or_else(|e| e.into_inner());
                if g.abort.is_none() {
                    g.abort = Some(info.clone());
                    push_abort(&mut g, &info, rank);
                }
                drop(g);
                sh.cond.notify_all();
                Ok(())
            }
            _ => break,
        };
        if ok.is_err() {
            break;
        }
    }
    // The connection ended: without a goodbye, its rank is lost.
    let mut g = sh.state.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = rank {
        g.clients.remove(&r);
        if !g.byes.contains(&r) && g.abort.is_none() && !sh.stop.load(Ordering::Acquire) {
            let info = AbortInfo { lost_rank: Some(r), reason: format!("rank {r} exited or closed its connection without finishing") };
            g.abort = Some(info.clone());
            push_abort(&mut g, &info, Some(r));
        }
    }
    drop(g);
    sh.cond.notify_all();
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

impl StoreClient {
    /// Connects (retrying until `timeout`, as the server may start later) and says hello.
    /// `server_rank` names the rank hosting the server, for the error if the connection drops.
    pub fn connect(addr: &str, rank: usize, server_rank: Option<usize>, timeout: Duration, abort: Arc<AbortState>) -> Result<StoreClient> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            let attempt = addr
                .to_socket_addrs()
                .map_err(|e| Error::Config(format!("cannot resolve store address `{addr}`: {e}")))
                .and_then(|mut it| it.next().ok_or_else(|| Error::Config(format!("store address `{addr}` resolves to nothing"))))?;
            match TcpStream::connect_timeout(&attempt, Duration::from_millis(500)) {
                Ok(s) => break s,
                Err(e) => {
                    if Instant::now() >= deadline {
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
        let mut rd = stream.try_clone().map_err(|e| Error::io(rank, "store connect", e))?;
        let (tx, rx) = mpsc::channel();
        let closing = Arc::new(AtomicBool::new(false));
        let (cl, ab) = (closing.clone(), abort.clone());
        let reader = std::thread::Builder::new()
            .name("sucl-store-watch".into())
            .spawn(move || loop {
                match read_frame(&mut rd) {
                    Ok((h, p)) if h.kind == Kind::StoreReply => {
                        if tx.send((h.meta[0], p)).is_err() {
                            return;
                        }
                    }
                    Ok((h, p)) if h.kind == Kind::StoreAbort => {
                        let lost_rank = (h.meta[0] > 0).then(|| h.meta[0] as usize - 1);
                        ab.set_remote(AbortInfo { lost_rank, reason: String::from_utf8_lossy(&p).into_owned() });
                    }
                    _ => {
                        if !cl.load(Ordering::Acquire) {
                            let reason = match server_rank {
                                Some(r) => format!("rank {r} (hosting the rendezvous store) exited"),
                                None => "lost the connection to the rendezvous store (launcher gone)".to_string(),
                            };
                            ab.set_remote(AbortInfo { lost_rank: server_rank, reason });
                        }
                        return;
                    }
                }
            })
            .map_err(|e| Error::io(rank, "spawning the store watcher", e))?;
        let c = StoreClient {
            rank,
            writer: Mutex::new(stream),
            replies: Mutex::new(rx),
            closing,
            reader: Mutex::new(Some(reader)),
            timeout,
            abort,
        };
        c.request(Kind::StoreHello, 0, [rank as u64, 0], &[], "store hello")?;
        let ab = c.abort.clone();
        let w = c.writer.lock().unwrap().try_clone().map_err(|e| Error::io(rank, "store", e))?;
        let w = Mutex::new(w);
        ab.set_notifier(Box::new(move |info: &AbortInfo| {
            let lost = info.lost_rank.map(|r| r as u64 + 1).unwrap_or(0);
            if let Ok(mut w) = w.lock() {
                let _ = write_frame(&mut *w, Kind::StoreAbort, 0, [lost, 0], &[info.reason.as_bytes()]);
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
        let deadline = Instant::now() + wait;
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
                    if Instant::now() >= deadline {
                        return Err(Error::Timeout { rank: self.rank, op: what.to_string(), after: wait });
                    }
                }
            }
        }
    }

    /// Sets `key` to `value`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.request(Kind::StoreSet, key.len() as u64, [0, 0], &[key.as_bytes(), value], "store set").map(|_| ())
    }

    /// Waits (bounded by the timeout) until `key` exists and returns its value.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        let ms = self.timeout.as_millis() as u64;
        let (status, v) = self.request(Kind::StoreGet, 0, [ms, 0], &[key.as_bytes()], "store get")?;
        match status {
            0 => Ok(v),
            2 => {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_add_barrier_and_loss() {
        let server = StoreServer::start("127.0.0.1:0").unwrap();
        let addr = server.addr().to_string();
        let t = Duration::from_secs(5);
        let a0 = AbortState::new();
        let c0 = StoreClient::connect(&addr, 0, None, t, a0.clone()).unwrap();
        let a1 = AbortState::new();
        let c1 = StoreClient::connect(&addr, 1, None, t, a1.clone()).unwrap();
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
        let start = Instant::now();
        while !a0.is_set() && start.elapsed() < t {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(a0.info().unwrap().lost_rank, Some(1));
        assert!(c0.get("never").is_err());
    }
}
