//! A client of PyTorch's c10d TCPStore: the store torchrun's agent serves on
//! `MASTER_ADDR:MASTER_PORT` and tells its workers to use (`TORCHELASTIC_USE_AGENT_STORE=True`).
//!
//! sucl only meets its peers there: rank 0 publishes the address of sucl's own store under a
//! key, the others wait for that key and read it. The wire format (torch ≥ 2.2): plain TCP; the
//! connection opens with VALIDATE and a magic number; each request is a one-byte opcode and its
//! fields; strings are a little-endian u64 length and raw bytes; replies come back in request
//! order with no framing of their own. SET sends no reply; WAIT's reply is deferred until every
//! key exists, and the server has no timeout, so the client bounds it and cancels. Every length
//! the server sends is checked against a limit before anything is allocated.

use crate::error::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const VALIDATE: u8 = 0;
const SET: u8 = 1;
const GET: u8 = 3;
const ADD: u8 = 4;
const CHECK: u8 = 5;
const WAIT: u8 = 6;
const DELETE_KEY: u8 = 8;
const CANCEL_WAIT: u8 = 12;
/// The number a client sends right after VALIDATE (little-endian), proving it speaks the protocol.
const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;
/// WAIT's replies: the keys exist, or the wait was cancelled. CHECK's: ready, not ready.
const STOP_WAITING: u8 = 0;
const WAIT_CANCELED: u8 = 1;
const READY: u8 = 0;
const NOT_READY: u8 = 1;
/// The largest value accepted from the server (torch's libuv server refuses larger ones too).
pub const MAX_VALUE_BYTES: u64 = 8 << 20;
/// How long to wait for the answer to CANCEL_WAIT before giving up on the connection.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// A connection to a c10d TCPStore. Every key is sent as `prefix + key`.
///
/// Requests on one connection are answered in order, so the connection is used by one request at
/// a time (a lock), and at most one WAIT is outstanding.
pub struct C10dClient {
    addr: String,
    rank: usize,
    prefix: String,
    timeout: Duration,
    conn: Mutex<TcpStream>,
}

impl C10dClient {
    /// Connects to `addr` (`host:port`; the host may be a name with several addresses, all
    /// tried), retrying until `timeout` (the agent may start listening after this process
    /// starts), and sends the handshake. `rank` names this process in errors; `timeout` also
    /// bounds every later request.
    pub fn connect(addr: &str, prefix: &str, rank: usize, timeout: Duration) -> Result<C10dClient> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(10);
        let mut stream = loop {
            let last_error = match try_connect(addr)? {
                Ok(s) => break s,
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    rank,
                    op: format!("connecting to torchrun's store at {addr} ({last_error})"),
                    after: timeout,
                });
            }
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(Duration::from_millis(500));
        };
        let during = format!("the handshake with torchrun's store at {addr}");
        stream.set_nodelay(true).map_err(|e| Error::io(rank, during.clone(), e))?;
        let mut hello = vec![VALIDATE];
        hello.extend_from_slice(&VALIDATION_MAGIC.to_le_bytes());
        stream.write_all(&hello).map_err(|e| Error::io(rank, during, e))?;
        Ok(C10dClient { addr: addr.to_string(), rank, prefix: prefix.to_string(), timeout, conn: Mutex::new(stream) })
    }

    /// The key prefix this client puts in front of every key.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The local address of the connection: the interface through which this host reaches the
    /// store's host.
    pub fn local_ip(&self) -> Option<IpAddr> {
        self.lock().local_addr().ok().map(|a| a.ip())
    }

    /// Sets `key` to `value` (the server sends no reply).
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut req = vec![SET];
        self.put_key(&mut req, key);
        put_bytes(&mut req, value);
        let mut conn = self.lock();
        self.send(&mut conn, &req, "SET")
    }

    /// Waits (bounded by the timeout) until `key` exists, then returns its value.
    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        // Some servers close the connection on a GET of a missing key: wait for it first.
        self.wait(&[key])?;
        let mut req = vec![GET];
        self.put_key(&mut req, key);
        let mut conn = self.lock();
        self.send(&mut conn, &req, "GET")?;
        let deadline = Instant::now() + self.timeout;
        let len = u64::from_le_bytes(self.read_array(&mut conn, deadline, "GET")?);
        if len > MAX_VALUE_BYTES {
            return Err(self.malformed(format!("GET reply announces {len} bytes, more than the {MAX_VALUE_BYTES}-byte limit")));
        }
        let mut value = vec![0u8; len as usize];
        self.read_exact(&mut conn, &mut value, deadline, "GET")?;
        Ok(value)
    }

    /// Adds `delta` to the counter `key` (a missing key counts as 0) and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut req = vec![ADD];
        self.put_key(&mut req, key);
        req.extend_from_slice(&delta.to_le_bytes());
        let mut conn = self.lock();
        self.send(&mut conn, &req, "ADD")?;
        Ok(i64::from_le_bytes(self.read_array(&mut conn, Instant::now() + self.timeout, "ADD")?))
    }

    /// Whether every one of `keys` exists, without waiting.
    pub fn check(&self, keys: &[&str]) -> Result<bool> {
        let req = self.keys_request(CHECK, keys);
        let mut conn = self.lock();
        self.send(&mut conn, &req, "CHECK")?;
        match self.read_array::<1>(&mut conn, Instant::now() + self.timeout, "CHECK")?[0] {
            READY => Ok(true),
            NOT_READY => Ok(false),
            other => Err(self.malformed(format!("CHECK reply is {other}, neither READY (0) nor NOT_READY (1)"))),
        }
    }

    /// Deletes `key`; returns whether it existed.
    pub fn delete(&self, key: &str) -> Result<bool> {
        let mut req = vec![DELETE_KEY];
        self.put_key(&mut req, key);
        let mut conn = self.lock();
        self.send(&mut conn, &req, "DELETE_KEY")?;
        match i64::from_le_bytes(self.read_array(&mut conn, Instant::now() + self.timeout, "DELETE_KEY")?) {
            0 => Ok(false),
            1 => Ok(true),
            n => Err(self.malformed(format!("DELETE_KEY reply is {n}, not 0 or 1"))),
        }
    }

    /// Waits until every one of `keys` exists, at most the timeout; on expiry the wait is
    /// cancelled on the server and this is an [`Error::Timeout`].
    pub fn wait(&self, keys: &[&str]) -> Result<()> {
        let req = self.keys_request(WAIT, keys);
        let mut conn = self.lock();
        self.send(&mut conn, &req, "WAIT")?;
        let mut byte = [0u8; 1];
        match self.read_exact(&mut conn, &mut byte, Instant::now() + self.timeout, "WAIT") {
            Ok(()) if byte[0] == STOP_WAITING => Ok(()),
            Ok(()) => Err(self.malformed(format!("WAIT reply is {}, not STOP_WAITING (0)", byte[0]))),
            Err(Error::Timeout { .. }) => self.cancel_wait(&mut conn, keys),
            Err(e) => Err(e),
        }
    }

    /// Cancels the outstanding WAIT after its timeout. The keys may have appeared just before
    /// the cancel arrived: then the server's STOP_WAITING comes first, and the wait succeeded.
    fn cancel_wait(&self, conn: &mut TcpStream, keys: &[&str]) -> Result<()> {
        self.send(conn, &[CANCEL_WAIT], "CANCEL_WAIT")?;
        let deadline = Instant::now() + CANCEL_GRACE;
        let mut succeeded = false;
        loop {
            match self.read_array::<1>(conn, deadline, "CANCEL_WAIT")?[0] {
                STOP_WAITING if !succeeded => succeeded = true,
                WAIT_CANCELED if succeeded => return Ok(()),
                WAIT_CANCELED => {
                    let names: Vec<String> = keys.iter().map(|k| format!("`{}{k}`", self.prefix)).collect();
                    return Err(Error::Timeout {
                        rank: self.rank,
                        op: format!("waiting for {} in torchrun's store at {} (a rank did not arrive)", names.join(", "), self.addr),
                        after: self.timeout,
                    });
                }
                other => return Err(self.malformed(format!("reply to CANCEL_WAIT is {other}, not WAIT_CANCELED (1)"))),
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, TcpStream> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn put_key(&self, req: &mut Vec<u8>, key: &str) {
        req.extend_from_slice(&((self.prefix.len() + key.len()) as u64).to_le_bytes());
        req.extend_from_slice(self.prefix.as_bytes());
        req.extend_from_slice(key.as_bytes());
    }

    fn keys_request(&self, opcode: u8, keys: &[&str]) -> Vec<u8> {
        let mut req = vec![opcode];
        req.extend_from_slice(&(keys.len() as u64).to_le_bytes());
        for k in keys {
            self.put_key(&mut req, k);
        }
        req
    }

    fn send(&self, conn: &mut TcpStream, req: &[u8], op: &str) -> Result<()> {
        conn.set_write_timeout(Some(self.timeout)).and_then(|_| conn.write_all(req)).map_err(|e| self.io_error(op, e))
    }

    fn read_array<const N: usize>(&self, conn: &mut TcpStream, deadline: Instant, op: &str) -> Result<[u8; N]> {
        let mut buf = [0u8; N];
        self.read_exact(conn, &mut buf, deadline, op)?;
        Ok(buf)
    }

    /// Fills `buf` before `deadline`: a timeout is [`Error::Timeout`], an early end of the
    /// connection an I/O error saying the store closed it.
    fn read_exact(&self, conn: &mut TcpStream, buf: &mut [u8], deadline: Instant, op: &str) -> Result<()> {
        let mut got = 0;
        while got < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    rank: self.rank,
                    op: format!("{op} on torchrun's store at {}", self.addr),
                    after: self.timeout,
                });
            }
            conn.set_read_timeout(Some(left)).map_err(|e| self.io_error(op, e))?;
            match conn.read(&mut buf[got..]) {
                Ok(0) => {
                    let e =
                        std::io::Error::new(ErrorKind::UnexpectedEof, "the store closed the connection (bad request, or the agent exited)");
                    return Err(self.io_error(op, e));
                }
                Ok(n) => got += n,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
                Err(e) => return Err(self.io_error(op, e)),
            }
        }
        Ok(())
    }

    fn io_error(&self, op: &str, e: std::io::Error) -> Error {
        Error::io(self.rank, format!("{op} on torchrun's store at {}", self.addr), e)
    }

    fn malformed(&self, why: String) -> Error {
        Error::io(
            self.rank,
            format!("reading a reply from torchrun's store at {}", self.addr),
            std::io::Error::new(ErrorKind::InvalidData, why),
        )
    }
}

fn put_bytes(req: &mut Vec<u8>, value: &[u8]) {
    req.extend_from_slice(&(value.len() as u64).to_le_bytes());
    req.extend_from_slice(value);
}

/// One connection attempt to every address `addr` resolves to. A name that does not resolve is
/// an [`Error::Config`] (no retry helps); a refused or failed connection is the inner error, and
/// worth retrying.
fn try_connect(addr: &str) -> Result<std::io::Result<TcpStream>> {
    let targets: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| Error::Config(format!("cannot resolve torchrun's store address `{addr}` (MASTER_ADDR:MASTER_PORT): {e}")))?
        .collect();
    if targets.is_empty() {
        return Err(Error::Config(format!("torchrun's store address `{addr}` (MASTER_ADDR:MASTER_PORT) resolves to no address")));
    }
    let mut last = None;
    for t in &targets {
        match TcpStream::connect_timeout(t, Duration::from_millis(500)) {
            Ok(s) => return Ok(Ok(s)),
            Err(e) => last = Some(e),
        }
    }
    Ok(Err(last.unwrap_or_else(|| std::io::Error::new(ErrorKind::NotFound, "no address to try"))))
}

#[cfg(test)]
pub(crate) mod tests {
    //! The client against a small fake c10d server written from the protocol notes (the real
    //! TCPStore needs torch, which CI does not install), a conversation recorded from torch 2.11,
    //! and scripted servers that send malformed replies.

    use super::*;
    use std::collections::HashMap;
    use std::net::TcpListener;
    use std::sync::{Arc, Condvar};

    type Kv = Arc<(Mutex<HashMap<Vec<u8>, Vec<u8>>>, Condvar)>;

    /// A fake TCPStore: VALIDATE, SET, GET (empty for a missing key, as the libuv server),
    /// ADD (decimal text values), CHECK, WAIT (deferred, cancellable), DELETE_KEY; anything
    /// else, or a wrong handshake, closes the connection.
    pub(crate) fn fake_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let kv: Kv = Arc::new((Mutex::new(HashMap::new()), Condvar::new()));
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let kv = kv.clone();
                std::thread::spawn(move || {
                    let _ = fake_serve(conn, kv);
                });
            }
        });
        addr
    }

    fn read_u64(c: &mut TcpStream) -> std::io::Result<u64> {
        let mut b = [0u8; 8];
        c.read_exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn read_str(c: &mut TcpStream) -> std::io::Result<Vec<u8>> {
        let n = read_u64(c)?;
        if n > 1 << 20 {
            return Err(std::io::Error::new(ErrorKind::InvalidData, "too long"));
        }
        let mut v = vec![0u8; n as usize];
        c.read_exact(&mut v)?;
        Ok(v)
    }

    fn read_keys(c: &mut TcpStream) -> std::io::Result<Vec<Vec<u8>>> {
        let n = read_u64(c)?.min(1024);
        (0..n).map(|_| read_str(c)).collect()
    }

    fn fake_serve(mut c: TcpStream, kv: Kv) -> std::io::Result<()> {
        let mut hello = [0u8; 5];
        c.read_exact(&mut hello)?;
        if hello[0] != VALIDATE || hello[1..] != VALIDATION_MAGIC.to_le_bytes() {
            return Ok(());
        }
        let (map, cond) = &*kv;
        loop {
            let mut op = [0u8; 1];
            c.read_exact(&mut op)?;
            match op[0] {
                SET => {
                    let (k, v) = (read_str(&mut c)?, read_str(&mut c)?);
                    map.lock().unwrap().insert(k, v);
                    cond.notify_all();
                }
                GET => {
                    let k = read_str(&mut c)?;
                    let v = map.lock().unwrap().get(&k).cloned().unwrap_or_default();
                    c.write_all(&(v.len() as u64).to_le_bytes())?;
                    c.write_all(&v)?;
                }
                ADD => {
                    let k = read_str(&mut c)?;
                    let delta = read_u64(&mut c)? as i64;
                    let mut g = map.lock().unwrap();
                    let cur: i64 = g.get(&k).map(|v| String::from_utf8_lossy(v).parse().unwrap()).unwrap_or(0);
                    g.insert(k, (cur + delta).to_string().into_bytes());
                    drop(g);
                    cond.notify_all();
                    c.write_all(&(cur + delta).to_le_bytes())?;
                }
                CHECK => {
                    let keys = read_keys(&mut c)?;
                    let g = map.lock().unwrap();
                    c.write_all(&[if keys.iter().all(|k| g.contains_key(k)) { READY } else { NOT_READY }])?;
                }
                WAIT => {
                    let keys = read_keys(&mut c)?;
                    // Deferred: answer when every key exists, or WAIT_CANCELED on CANCEL_WAIT.
                    c.set_read_timeout(Some(Duration::from_millis(10)))?;
                    loop {
                        if keys.iter().all(|k| map.lock().unwrap().contains_key(k)) {
                            c.write_all(&[STOP_WAITING])?;
                            break;
                        }
                        let mut b = [0u8; 1];
                        match c.read(&mut b) {
                            Ok(1) if b[0] == CANCEL_WAIT => {
                                c.write_all(&[WAIT_CANCELED])?;
                                break;
                            }
                            Ok(_) => return Ok(()),
                            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    c.set_read_timeout(None)?;
                }
                DELETE_KEY => {
                    let k = read_str(&mut c)?;
                    let gone = map.lock().unwrap().remove(&k).is_some();
                    c.write_all(&(gone as i64).to_le_bytes())?;
                }
                _ => return Ok(()),
            }
        }
    }

    /// A server that records what it receives: after the handshake, for each `(n, reply)` it
    /// reads a request of exactly `n` bytes and answers `reply`; then it holds the connection
    /// open without answering more.
    fn scripted_server(script: Vec<(usize, Vec<u8>)>) -> (String, std::sync::mpsc::Receiver<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            let mut hello = [0u8; 5];
            c.read_exact(&mut hello).unwrap();
            let _ = tx.send(hello.to_vec());
            for (n, reply) in script {
                let mut req = vec![0u8; n];
                if c.read_exact(&mut req).is_err() {
                    return;
                }
                let _ = tx.send(req);
                if c.write_all(&reply).is_err() {
                    return;
                }
            }
            std::thread::sleep(Duration::from_secs(3));
        });
        (addr, rx)
    }

    /// Request sizes for the key "k" under the tests' prefix `/sucl/test/0/` (14 key bytes).
    const KEY: usize = 8 + 14;
    const ONE_KEY_REQ: usize = 1 + 8 + KEY; // WAIT, CHECK
    const KEY_REQ: usize = 1 + KEY; // GET, DELETE_KEY
    const ADD_REQ: usize = 1 + KEY + 8;

    fn client(addr: &str, timeout_ms: u64) -> C10dClient {
        C10dClient::connect(addr, "/sucl/test/0/", 0, Duration::from_millis(timeout_ms)).unwrap()
    }

    #[test]
    fn talks_like_torch_2_11() {
        // Recorded from torch 2.11: store.set("K", b"v") then store.get("K"); the TCPStore
        // client's prefix is "/".
        let mut get_reply = 1u64.to_le_bytes().to_vec();
        get_reply.push(b'v');
        let (addr, sent) = scripted_server(vec![(20, vec![]), (19, vec![STOP_WAITING]), (11, get_reply)]);
        let c = C10dClient::connect(&addr, "/", 0, Duration::from_secs(5)).unwrap();
        c.set("K", b"v").unwrap();
        assert_eq!(c.get("K").unwrap(), b"v");
        let key = [&2u64.to_le_bytes()[..], b"/K"].concat();
        assert_eq!(sent.recv().unwrap(), [0x00, 0xce, 0xf7, 0x85, 0x3c]);
        assert_eq!(sent.recv().unwrap(), [&[SET][..], &key, &1u64.to_le_bytes(), b"v"].concat());
        assert_eq!(sent.recv().unwrap(), [&[WAIT][..], &1u64.to_le_bytes(), &key].concat());
        assert_eq!(sent.recv().unwrap(), [&[GET][..], &key].concat());
    }

    #[test]
    fn set_get_add_check_wait_delete_against_a_fake_store() {
        let addr = fake_server();
        let a = client(&addr, 5000);
        let b = client(&addr, 5000);
        assert!(!a.check(&["addr"]).unwrap());
        let waiter = std::thread::spawn(move || b.get("addr").map(|v| (v, b)));
        std::thread::sleep(Duration::from_millis(50));
        a.set("addr", b"10.0.0.1:4000").unwrap();
        let (v, b) = waiter.join().unwrap().unwrap();
        assert_eq!(v, b"10.0.0.1:4000");
        assert!(b.check(&["addr"]).unwrap());
        assert_eq!(a.add("count", 5).unwrap(), 5);
        assert_eq!(b.add("count", -2).unwrap(), 3);
        // The server keeps counters as decimal text.
        assert_eq!(a.get("count").unwrap(), b"3");
        assert!(a.delete("addr").unwrap());
        assert!(!a.delete("addr").unwrap());
        // Another prefix is another namespace.
        let other = C10dClient::connect(&addr, "/other/", 1, Duration::from_millis(200)).unwrap();
        assert!(!other.check(&["count"]).unwrap());
    }

    #[test]
    fn a_wait_that_runs_out_is_cancelled_and_the_connection_stays_usable() {
        let addr = fake_server();
        let c = client(&addr, 300);
        let err = c.get("never").unwrap_err().to_string();
        assert!(err.contains("waiting for `/sucl/test/0/never`") && err.contains("timed out after"), "{err}");
        c.set("k", b"1").unwrap();
        assert_eq!(c.get("k").unwrap(), b"1");
    }

    #[test]
    fn connecting_retries_until_the_store_listens() {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let l = TcpListener::bind(addr).unwrap();
            let (mut c, _) = l.accept().unwrap();
            let mut hello = [0u8; 5];
            c.read_exact(&mut hello).unwrap();
            hello
        });
        let c = C10dClient::connect(&addr.to_string(), "/", 0, Duration::from_secs(10));
        assert!(c.is_ok(), "{:?}", c.err());
        assert_eq!(late.join().unwrap()[0], VALIDATE);
        let err = C10dClient::connect(&addr.to_string(), "/", 3, Duration::from_millis(200)).err().unwrap().to_string();
        assert!(err.starts_with("rank 3: connecting to torchrun's store at"), "{err}");
    }

    #[test]
    fn malformed_replies_are_errors_not_allocations_or_panics() {
        let huge = (1u64 << 40).to_le_bytes().to_vec();
        let (addr, _s) = scripted_server(vec![(ONE_KEY_REQ, vec![STOP_WAITING]), (KEY_REQ, huge)]);
        let err = client(&addr, 2000).get("k").unwrap_err().to_string();
        assert!(err.contains("announces 1099511627776 bytes, more than the 8388608-byte limit"), "{err}");

        let (addr, _s) = scripted_server(vec![(ONE_KEY_REQ, vec![7])]);
        let err = client(&addr, 2000).wait(&["k"]).unwrap_err().to_string();
        assert!(err.contains("WAIT reply is 7"), "{err}");

        let (addr, _s) = scripted_server(vec![(ONE_KEY_REQ, vec![9])]);
        let err = client(&addr, 2000).check(&["k"]).unwrap_err().to_string();
        assert!(err.contains("CHECK reply is 9"), "{err}");

        let (addr, _s) = scripted_server(vec![(KEY_REQ, 5i64.to_le_bytes().to_vec())]);
        let err = client(&addr, 2000).delete("k").unwrap_err().to_string();
        assert!(err.contains("DELETE_KEY reply is 5"), "{err}");

        // A truncated ADD reply, then the server goes away.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            let mut buf = [0u8; 5 + ADD_REQ];
            let _ = c.read_exact(&mut buf);
            let _ = c.write_all(&[1, 2, 3]);
        });
        let err = client(&addr, 2000).add("k", 1).unwrap_err().to_string();
        assert!(err.contains("ADD on torchrun's store") && err.contains("closed the connection"), "{err}");

        // A server that never answers: bounded by the timeout.
        let (addr, _s) = scripted_server(vec![(ADD_REQ, vec![])]);
        let err = client(&addr, 200).add("k", 1).unwrap_err().to_string();
        assert!(err.contains("ADD on torchrun's store") && err.contains("timed out"), "{err}");

        // WAIT cancelled, but the cancel's answer is garbage.
        let (addr, _s) = scripted_server(vec![(ONE_KEY_REQ, vec![]), (1, vec![9])]);
        let c = client(&addr, 200);
        let err = c.wait(&["k"]).unwrap_err().to_string();
        assert!(err.contains("reply to CANCEL_WAIT is 9"), "{err}");
    }
}

/// Entry point of the coverage-guided fuzz target `c10d_replies` (`fuzz/`) and of the tests
/// that replay its corpus: not part of the API.
#[doc(hidden)]
pub mod fuzz {
    use super::*;
    use std::net::{Shutdown, TcpListener};

    /// Replies of a c10d TCPStore as the client reads them: a loopback server sends `bytes`
    /// after the first, then closes; the client runs up to four requests (GET, ADD, CHECK,
    /// DELETE_KEY, two bits each of the first byte) until one fails. A reply is checked before
    /// use, and one cut short is an error, never a hang.
    pub fn replies(bytes: &[u8]) {
        let Some((&ops, replies)) = bytes.split_first() else { return };
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = listener.local_addr().expect("its address").to_string();
        let replies = replies.to_vec();
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().expect("the client connects");
            let _ = c.write_all(&replies);
            let _ = c.shutdown(Shutdown::Write);
            let _ = c.read_to_end(&mut Vec::new());
        });
        let client = C10dClient::connect(&addr, "fuzz/", 0, Duration::from_secs(5)).expect("connects");
        for i in 0..4 {
            let r = match (ops >> (2 * i)) & 3 {
                0 => client.get("k").map(|v| assert!(v.len() as u64 <= MAX_VALUE_BYTES)),
                1 => client.add("k", 1).map(drop),
                2 => client.check(&["a", "b"]).map(drop),
                _ => client.delete("k").map(drop),
            };
            if r.is_err() {
                break;
            }
        }
        drop(client);
        server.join().expect("the server thread ends");
    }
}
