//! Helpers for the remote tests: daemons as real processes (killed and reaped on drop), a fault
//! proxy that cuts connections at random byte counts, and a raw handshake for hostile clients.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use sucl_remote::auth::{random, Nonces, SessionSecret};
use sucl_remote::transport::{self, parse_pin, Link, Pin, Tls};
use sucl_remote::wire::{self, Frame};
use sucl_remote::{ClientOptions, Token};

/// A `sucld` process on loopback with an ephemeral port; killed and reaped when dropped.
pub struct Sucld {
    pub child: Child,
    pub addr: String,
    pub token: Token,
    /// The pin of its TLS certificate (`None`: started with `--no-tls`).
    pub pin: Option<Pin>,
}

impl Sucld {
    pub fn start(extra: &[&str]) -> Sucld {
        let token = Token::generate();
        let mut child = Command::new(env!("CARGO_BIN_EXE_sucld"))
            .args(["--listen", "127.0.0.1:0", "--print-address", "--log", "warn"])
            .args(if extra.contains(&"--no-tls") { &[][..] } else { &["--tls-ephemeral"][..] })
            .args(extra)
            .env("SUCLD_TOKEN", token.to_hex())
            .env_remove("SUCLD_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning sucld");
        let (mut line, mut tls) = (String::new(), String::new());
        let mut out = BufReader::new(child.stdout.take().unwrap());
        out.read_line(&mut line).expect("reading sucld's address");
        out.read_line(&mut tls).expect("reading sucld's TLS pin");
        let (addr, pin) = match (line.trim().strip_prefix("listening on "), tls.trim()) {
            (Some(a), "tls off") => (a.to_string(), None),
            (Some(a), t) if t.starts_with("tls pin ") => (a.to_string(), Some(parse_pin(&t[8..]).unwrap())),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("sucld did not start: {line:?} {tls:?}");
            }
        };
        Sucld { child, addr, token, pin }
    }

    pub fn tls(&self) -> Tls {
        match self.pin {
            Some(p) => Tls::Pinned(vec![p]),
            None => Tls::Off,
        }
    }

    pub fn options(&self) -> ClientOptions {
        let mut o = ClientOptions::new(self.token.clone());
        o.tls = self.tls();
        o.call_timeout = Duration::from_secs(20);
        o.reconnect_window = Duration::from_secs(10);
        o
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Sucld {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A TCP proxy that cuts each connection (both directions, both sockets) after a random number
/// of forwarded bytes, `1..=2*mean_bytes`, counted over both directions — so cuts land in the
/// middle of frames, between them, in handshakes and in replies alike.
pub struct FaultProxy {
    pub addr: String,
    pub cuts: Arc<AtomicU64>,
    /// Bytes forwarded, both directions.
    pub bytes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    enabled: Arc<AtomicBool>,
    severed: Arc<AtomicBool>,
    live: Arc<Mutex<Vec<TcpStream>>>,
    /// Connections opened before the last [`FaultProxy::stall`] forward nothing more.
    stalls: Arc<AtomicU64>,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

impl FaultProxy {
    pub fn start(target: &str, mean_bytes: u64, seed: u64) -> FaultProxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let (cuts, stop, enabled) =
            (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(mean_bytes > 0)));
        let bytes = Arc::new(AtomicU64::new(0));
        let (severed, live) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
        let (target, c2, s2, e2, b2) = (target.to_string(), cuts.clone(), stop.clone(), enabled.clone(), bytes.clone());
        let (sv2, l2) = (severed.clone(), live.clone());
        let stalls = Arc::new(AtomicU64::new(0));
        let (st2, stop2) = (stalls.clone(), stop.clone());
        let rng = Arc::new(Mutex::new(Rng(seed | 1)));
        std::thread::spawn(move || {
            for client in l.incoming() {
                if s2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                if sv2.load(Ordering::SeqCst) {
                    continue; // dropped: the client cannot get through
                }
                let Ok(server) = TcpStream::connect(&target) else { continue };
                l2.lock().unwrap().extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let budget = if e2.load(Ordering::SeqCst) { 1 + rng.lock().unwrap().next() % (2 * mean_bytes) } else { u64::MAX };
                let stall = Stall { epochs: st2.clone(), born: st2.load(Ordering::SeqCst), stop: stop2.clone() };
                pump_pair(client, server, budget, c2.clone(), b2.clone(), stall);
            }
        });
        FaultProxy { addr, cuts, bytes, stop, enabled, severed, live, stalls }
    }

    /// Cuts every connection and drops every new one (the network between is gone).
    pub fn sever(&self) {
        self.severed.store(true, Ordering::SeqCst);
        for s in self.live.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Stalls every open connection: both ends stay open, but no byte goes through any more
    /// (neither read nor forwarded, so the senders' buffers fill); new connections work.
    pub fn stall(&self) {
        self.stalls.fetch_add(1, Ordering::SeqCst);
    }

    /// A proxy that cuts nothing and only counts the bytes it forwards.
    pub fn counting(target: &str) -> FaultProxy {
        FaultProxy::start(target, 0, 1)
    }

    /// Stops cutting new connections.
    pub fn calm(&self) {
        self.enabled.store(false, Ordering::SeqCst);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
    }
}

/// Whether a connection made at stall epoch `born` is stalled now.
#[derive(Clone)]
struct Stall {
    epochs: Arc<AtomicU64>,
    born: u64,
    stop: Arc<AtomicBool>,
}

impl Stall {
    /// Holds the calling pump while its connection is stalled; `false` once the proxy stops.
    fn hold(&self) -> bool {
        while self.epochs.load(Ordering::SeqCst) > self.born {
            if self.stop.load(Ordering::SeqCst) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }
}

fn pump_pair(a: TcpStream, b: TcpStream, budget: u64, cuts: Arc<AtomicU64>, bytes: Arc<AtomicU64>, stall: Stall) {
    let left = Arc::new(AtomicU64::new(budget));
    let cut = Arc::new(AtomicBool::new(false));
    for (from, to) in [(a.try_clone().unwrap(), b.try_clone().unwrap()), (b, a)] {
        let (left, cut, cuts, bytes, stall) = (left.clone(), cut.clone(), cuts.clone(), bytes.clone(), stall.clone());
        std::thread::spawn(move || {
            let (mut from, mut to) = (from, to);
            let mut buf = [0u8; 4096];
            loop {
                if !stall.hold() {
                    break;
                }
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if !stall.hold() {
                    break; // stalled with these bytes in hand: they never go through
                }
                let have = left.fetch_sub((n as u64).min(left.load(Ordering::SeqCst)), Ordering::SeqCst);
                let pass = (n as u64).min(have) as usize;
                bytes.fetch_add(pass as u64, Ordering::Relaxed);
                if to.write_all(&buf[..pass]).is_err() {
                    break;
                }
                if pass < n || have == n as u64 {
                    if !cut.swap(true, Ordering::SeqCst) {
                        cuts.fetch_add(1, Ordering::SeqCst);
                    }
                    break;
                }
            }
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
        });
    }
}

/// Connects (TLS as `tls` says) without speaking yet.
pub fn raw_connect(addr: &str, tls: &Tls) -> Link {
    let s = transport::connect(addr, tls, Duration::from_secs(10)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Connects and exchanges hello/welcome by hand; returns the stream and the nonces.
pub fn raw_greet(addr: &str, tls: &Tls) -> (Link, Nonces) {
    let mut s = raw_connect(addr, tls);
    let client: [u8; 16] = random();
    let hello = Frame::Hello { min_version: wire::VERSION, max_version: wire::VERSION, features: 0, max_frame: 1 << 20, nonce: client };
    s.write_all(&hello.encode()).unwrap();
    match read(&mut s) {
        Some(Frame::Welcome { nonce, .. }) => (s, Nonces { client, server: nonce }),
        other => panic!("expected a welcome, got {other:?}"),
    }
}

/// Greets and opens a session by hand; returns the stream, the nonces, the session id and its
/// secret.
pub fn raw_open(d: &Sucld) -> (Link, Nonces, [u8; 16], SessionSecret) {
    let (mut s, n) = raw_greet(&d.addr, &d.tls());
    s.write_all(&Frame::Open { mac: d.token.open_proof(&n) }.encode()).unwrap();
    let Some(Frame::Opened { session, .. }) = read(&mut s) else { panic!("not opened") };
    let secret = d.token.session_secret(&n, &session);
    (s, n, session, secret)
}

/// The next frame, or `None` once the server closed the connection.
pub fn read(s: &mut impl Read) -> Option<Frame> {
    let mut buf = Vec::new();
    wire::read_frame(s, &mut buf, 1 << 20).ok()
}
