//! Remote devices on loopback, each figure side by side with its baseline measured in the same
//! run (a benchmark, not a test):
//!
//! ```sh
//! cargo run --release -p sucl-remote --example remote_bench -- [--only latency,reconnect,migrate,chain,jacobi,matmul]
//!     [--iters 20000] [--reconnects 100] [--migrate-mib 64] [--jacobi-n 96 --jacobi-nz 96 --jacobi-steps 30]
//!     [--jacobi-weak] [--jacobi-f32] [--matmul-n 480] [--servers A,B,...] [--cuda] [--out FILE.md]
//! ```
//!
//! `--servers A,B,...` runs the migration, the stencil and the matmul on running `sucld`s
//! instead (e.g. one per GPU; the token and pins come from the environment as for any client;
//! the migration moves the first CUDA device's buffer if a server has one); `--cuda` runs the
//! applications on the servers' CUDA devices with the CUDA C kernels of
//! `sucl_remote::kernels::cuda_src`, checked against and timed with the same kernels run on
//! this process's GPU 0.
//!
//! Daemons run in this process (the same library `sucld` runs; every byte still crosses real
//! loopback TCP, TLS unless a row says plain).
//!
//! - **latency**: raw TCP round trip (a no-op command's and reply's sizes) vs a no-op command
//!   (enqueue + wait) over TLS and over plain TCP, and a kernel launch + synchronize;
//!   median, p99, mean.
//! - **reconnect**: the connection is cut, then a no-op re-attaches and runs (median of 100);
//!   the same with 8 launches posted after the cut; and each step of a re-attach alone (TCP
//!   connect, hello, full and resumed TLS, the resumed TLS handshake without a frame).
//! - **migrate**: 64 MiB from daemon A to daemon B, the client's links throttled to 1 Gbit/s
//!   per direction by a pacing proxy: server to server (TLS and plain) vs through the client
//!   (read from A, write to B); and S2S vs raw TCP streams (two threads; two processes) and a
//!   raw rustls stream between two processes.
//! - **chain**: kernel on A → migrate to B → kernel on B → read, with 5 ms added to the
//!   client's round trip by a delay proxy: submitted at once with the servers ordering it
//!   among themselves, vs the client waiting for each step.
//! - **jacobi**: a 7-point Jacobi 3D stencil split in z over 1–4 daemons (or, with
//!   `--jacobi-weak`, `--jacobi-nz` planes on every daemon), halo planes migrated S2S every
//!   step, the whole run submitted at once; checked cell by cell, bit for bit, against the same
//!   kernel run locally on the whole domain (`#wrong`); which path the migrations took, and a
//!   breakdown of one step from the servers' counters.
//! - **matmul**: a blocked `C = A·B` over 1–4 daemons, rows of A and C split, B's column blocks
//!   passed round a ring S2S; checked bit for bit against the same kernel run locally.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use sucl_remote::kernels::jacobi3d;
use sucl_remote::{Arg, ClientOptions, Daemon, DaemonConfig, Mesh, Remote, RemoteBuffer, RemoteError, Tls, Token};

fn stats(mut v: Vec<Duration>) -> (f64, f64, f64) {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let median = us(v[v.len() / 2]);
    let p99 = us(v[(v.len() * 99 / 100).min(v.len() - 1)]);
    let mean = v.iter().map(|d| us(*d)).sum::<f64>() / v.len() as f64;
    (median, p99, mean)
}

fn time(iters: usize, warmup: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..warmup {
        f();
    }
    (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

fn raw_tcp_rtt(iters: usize) -> Vec<Duration> {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let total = iters + iters / 10;
    let echo = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let (mut req, reply) = ([0u8; 22], [0u8; 14]);
        for _ in 0..total {
            s.read_exact(&mut req).unwrap();
            s.write_all(&reply).unwrap();
        }
    });
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_nodelay(true).unwrap();
    let (req, mut reply) = ([0u8; 22], [0u8; 14]);
    let v = time(iters, iters / 10, || {
        c.write_all(&req).unwrap();
        c.read_exact(&mut reply).unwrap();
    });
    echo.join().unwrap();
    v
}

/// Seconds to stream `bytes` between two threads over one loopback TCP connection.
fn raw_tcp_stream(bytes: usize) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let rx = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < bytes {
            got += s.read(&mut buf).unwrap();
        }
        s.write_all(&[1]).unwrap();
    });
    let mut c = TcpStream::connect(addr).unwrap();
    let data = vec![7u8; 1 << 20];
    let t = Instant::now();
    let mut sent = 0;
    while sent < bytes {
        let n = data.len().min(bytes - sent);
        c.write_all(&data[..n]).unwrap();
        sent += n;
    }
    c.read_exact(&mut [0u8; 1]).unwrap();
    let dt = t.elapsed().as_secs_f64();
    rx.join().unwrap();
    dt
}

/// A verifier that trusts any certificate: only for the raw rustls baseline, which measures
/// the cipher, not authentication.
#[derive(Debug)]
struct TrustAll(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for TrustAll {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The receiving process of a raw stream (`remote_bench --stream-sink tcp|tls BYTES`): prints
/// its port, takes one connection, reads BYTES, answers one byte, exits.
fn stream_sink(tls: bool, bytes: usize) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    println!("port {}", l.local_addr().unwrap().port());
    std::io::stdout().flush().unwrap();
    let (s, _) = l.accept().unwrap();
    let mut s: Box<dyn ReadWrite> = if tls {
        let ck = rcgen::generate_simple_self_signed(vec!["sink".to_string()]).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
        let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![ck.cert.der().clone()], key)
            .unwrap();
        Box::new(rustls::StreamOwned::new(rustls::ServerConnection::new(Arc::new(cfg)).unwrap(), s))
    } else {
        Box::new(s)
    };
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0;
    while got < bytes {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended early");
        got += n;
    }
    s.write_all(&[1]).unwrap();
    s.flush().unwrap();
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Seconds to stream `bytes` from this process to another over one loopback TCP connection,
/// plain or TLS (rustls as an application would use it, AES-GCM on one core per side).
fn raw_stream(bytes: usize, tls: bool) -> f64 {
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--stream-sink", if tls { "tls" } else { "tcp" }, &bytes.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("starting the sink process");
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let port: u16 = line.trim().strip_prefix("port ").and_then(|p| p.parse().ok()).expect("the sink's port");
    let sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut c: Box<dyn ReadWrite> = if tls {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(TrustAll(provider)))
            .with_no_client_auth();
        let conn = rustls::ClientConnection::new(Arc::new(cfg), "sink".try_into().unwrap()).unwrap();
        let mut s = rustls::StreamOwned::new(conn, sock);
        while s.conn.is_handshaking() {
            s.conn.complete_io(&mut s.sock).unwrap();
        }
        Box::new(s)
    } else {
        Box::new(sock)
    };
    let data = vec![7u8; 1 << 20];
    let t = Instant::now();
    let mut sent = 0;
    while sent < bytes {
        let n = data.len().min(bytes - sent);
        c.write_all(&data[..n]).unwrap();
        sent += n;
    }
    c.flush().unwrap();
    c.read_exact(&mut [0u8; 1]).unwrap();
    let dt = t.elapsed().as_secs_f64();
    child.wait().unwrap();
    dt
}

struct Served {
    daemon: Daemon,
    token: Token,
}

impl Served {
    fn start(tls: bool) -> Served {
        let token = Token::generate();
        let mut cfg = DaemonConfig::new(token.clone());
        // Its memory is this process's own: the sizes asked for decide it.
        cfg.limits.max_bytes = u64::MAX;
        if !tls {
            cfg.tls = None;
        }
        Served { daemon: Daemon::start(cfg).expect("starting a daemon"), token }
    }
    fn addr(&self) -> String {
        self.daemon.local_addr().to_string()
    }
    fn options(&self) -> ClientOptions {
        let mut o = ClientOptions::new(self.token.clone());
        o.tls = match self.daemon.tls_pin() {
            Some(p) => Tls::Pinned(vec![p]),
            None => Tls::Off,
        };
        o
    }
    /// A session, reached at `via` (a proxy) or directly; peers reach it directly.
    fn connect(&self, via: Option<&str>) -> Remote {
        let r = Remote::connect(via.unwrap_or(&self.addr()), self.options()).expect("connecting");
        r.set_peer_address(&self.addr());
        r
    }
}

/// What a proxy does to each direction of the bytes it forwards.
#[derive(Clone)]
enum Shape {
    /// Holds each piece back this long (one way).
    Delay(Duration),
    /// Paces the bytes at this rate (bytes/s), shared by all connections in one direction
    /// (a client's NIC).
    Throttle { rate: f64, up: Arc<Mutex<Instant>>, down: Arc<Mutex<Instant>> },
}

/// A TCP proxy to `target` shaping its traffic; runs until the process ends.
fn proxy(target: String, shape: Shape) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { continue };
            let Ok(s) = TcpStream::connect(&target) else { continue };
            let _ = (c.set_nodelay(true), s.set_nodelay(true));
            for (from, to, upward) in [(c.try_clone().unwrap(), s.try_clone().unwrap(), true), (s, c, false)] {
                let shape = shape.clone();
                std::thread::spawn(move || pump(from, to, shape, upward));
            }
        }
    });
    addr
}

fn pump(mut from: TcpStream, mut to: TcpStream, shape: Shape, upward: bool) {
    match shape {
        Shape::Delay(d) => {
            let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
            let mut to2 = to.try_clone().unwrap();
            let writer = std::thread::spawn(move || {
                for (due, bytes) in rx {
                    let now = Instant::now();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    if to2.write_all(&bytes).is_err() {
                        break;
                    }
                }
                let _ = to2.shutdown(std::net::Shutdown::Both);
            });
            let mut buf = vec![0u8; 1 << 16];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 || tx.send((Instant::now() + d, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
            drop(tx);
            let _ = writer.join();
        }
        Shape::Throttle { rate, up, down } => {
            let clock = if upward { up } else { down };
            let mut buf = vec![0u8; 1 << 16];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 {
                    break;
                }
                // The link is busy until `free`; this piece leaves when it has been serialized.
                let done = {
                    let mut free = clock.lock().unwrap();
                    let start = (*free).max(Instant::now());
                    *free = start + Duration::from_secs_f64(n as f64 / rate);
                    *free
                };
                let now = Instant::now();
                if done > now {
                    std::thread::sleep(done - now);
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

fn latency(md: &mut String, iters: usize) {
    let (tls, plain) = (Served::start(true), Served::start(false));
    let (rt, rp) = (tls.connect(None), plain.connect(None));
    let q = rt.devices().unwrap()[0].queue().unwrap();
    let mut rows = vec![("raw TCP round trip (22 B → 14 B)", stats(raw_tcp_rtt(iters)))];
    rows.push(("nop command, TLS (enqueue + wait)", stats(time(iters, iters / 10, || rt.nop().unwrap()))));
    rows.push(("nop command, plain TCP", stats(time(iters, iters / 10, || rp.nop().unwrap()))));
    rows.push((
        "launch noop + synchronize, TLS",
        stats(time(iters, iters / 10, || {
            q.launch("noop", &[], 0).unwrap();
            q.synchronize().unwrap();
        })),
    ));
    let raw = rows[0].1 .0;
    md.push_str(&format!("\n## No-op latency ({iters} iterations each, after {} warm-up)\n\n", iters / 10));
    md.push_str("| what | median µs | p99 µs | mean µs | median − raw TCP µs |\n|---|---:|---:|---:|---:|\n");
    for (name, (median, p99, mean)) in rows {
        md.push_str(&format!("| {name} | {median:.1} | {p99:.1} | {mean:.1} | {:+.1} |\n", median - raw));
    }
}

fn reconnect(md: &mut String, n: usize) {
    md.push_str(&format!("\n## Reconnect (connection cut → re-attached → a no-op runs), {n} times\n\n"));
    md.push_str("| link | median µs | p99 µs | mean µs |\n|---|---:|---:|---:|\n");
    for tls in [true, false] {
        let d = Served::start(tls);
        let r = d.connect(None);
        let v = time(n, 5, || {
            r.drop_connection();
            r.nop().unwrap();
        });
        let (m, p, a) = stats(v);
        md.push_str(&format!("| {} | {m:.1} | {p:.1} | {a:.1} |\n", if tls { "TLS (session resumed)" } else { "plain TCP" }));
    }
    // Several commands in flight across the cut: 8 kernel launches posted (not waited for)
    // right after it, then a no-op waited for.
    for tls in [true, false] {
        let d = Served::start(tls);
        let r = d.connect(None);
        let q = r.devices().unwrap()[0].queue().unwrap();
        let v = time(n, 5, || {
            r.drop_connection();
            for _ in 0..8 {
                q.launch("noop", &[], 0).unwrap();
            }
            r.nop().unwrap();
        });
        let (m, p, a) = stats(v);
        let link = if tls { "TLS (session resumed)" } else { "plain TCP" };
        md.push_str(&format!("| {link}, 8 launches posted + a no-op after the cut | {m:.1} | {p:.1} | {a:.1} |\n"));
    }
    // Where the time goes: each step of a re-attach alone, against one daemon of each kind.
    let (d, plain) = (Served::start(true), Served::start(false));
    let (addr, plain_addr) = (d.addr(), plain.addr());
    let pin = d.daemon.tls_pin().unwrap();
    let t = Duration::from_secs(5);
    let mut rows = vec![(
        "TCP connect",
        stats(time(n, 5, || {
            let s = TcpStream::connect(&plain_addr).unwrap();
            s.set_nodelay(true).unwrap();
        })),
    )];
    rows.push(("TCP connect + hello / welcome (plain)", stats(time(n, 5, || drop(hello(&plain_addr, &Tls::Off, t, true))))));
    rows.push((
        "TCP connect + full TLS 1.3 handshake + hello / welcome",
        stats(time(n, 5, || {
            // A pin list no earlier connection used: a fresh client config, no ticket to resume.
            let fresh = Tls::Pinned(vec![pin, sucl_remote::auth::random()]);
            assert!(!hello(&addr, &fresh, t, true).resumed());
        })),
    ));
    let pinned = Tls::Pinned(vec![pin]);
    drop(hello(&addr, &pinned, t, true)); // a first full handshake leaves tickets
    rows.push((
        "TCP connect + resumed TLS 1.3 handshake + hello / welcome",
        stats(time(n, 5, || assert!(hello(&addr, &pinned, t, true).resumed(), "the TLS session was not resumed"))),
    ));
    // Without a frame, the client may close before its ticket arrives: take a fresh one each time.
    rows.push((
        "TCP connect + resumed TLS 1.3 handshake alone (no frame)",
        stats(
            (0..n + 5)
                .map(|_| {
                    drop(hello(&addr, &pinned, t, true)); // leaves the next ticket (not timed)
                    let start = Instant::now();
                    let l = hello(&addr, &pinned, t, false);
                    let took = start.elapsed();
                    assert!(l.resumed(), "the TLS session was not resumed");
                    took
                })
                .skip(5)
                .collect(),
        ),
    ));
    rows.push((
        "resumed TLS 1.3 handshake in memory, no sockets (both sides' CPU, one thread; rustls + ring defaults)",
        stats(tls_in_memory(n)),
    ));
    md.push_str("\nWhere a re-attach spends its time (each step measured alone; the rest of a reconnect is the attach exchange, the re-sent command and its reply):\n\n");
    md.push_str("| step | median µs | p99 µs | mean µs |\n|---|---:|---:|---:|\n");
    for (name, (m, p, a)) in rows {
        md.push_str(&format!("| {name} | {m:.1} | {p:.1} | {a:.1} |\n"));
    }
}

/// Resumed TLS 1.3 handshakes between a client and a server in this thread, records passed in
/// memory: the handshake's computation (key exchange, key schedule, ticket) without any I/O.
fn tls_in_memory(n: usize) -> Vec<Duration> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let ck = rcgen::generate_simple_self_signed(vec!["sucld".to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into());
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![ck.cert.der().clone()], key)
        .unwrap();
    server.send_tls13_tickets = 1;
    let server = Arc::new(server);
    let client = Arc::new(
        rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(TrustAll(provider)))
            .with_no_client_auth(),
    );
    let handshake = || {
        let mut c = rustls::ClientConnection::new(client.clone(), "sucld".try_into().unwrap()).unwrap();
        let mut s = rustls::ServerConnection::new(server.clone()).unwrap();
        let mut buf = Vec::new();
        // Until neither side has more to say (the ticket included): the whole exchange.
        loop {
            buf.clear();
            while c.wants_write() {
                c.write_tls(&mut buf).unwrap();
            }
            if !buf.is_empty() {
                s.read_tls(&mut &buf[..]).unwrap();
                s.process_new_packets().unwrap();
            }
            let sent = !buf.is_empty();
            buf.clear();
            while s.wants_write() {
                s.write_tls(&mut buf).unwrap();
            }
            if !buf.is_empty() {
                c.read_tls(&mut &buf[..]).unwrap();
                c.process_new_packets().unwrap();
            }
            if !sent && buf.is_empty() && !c.is_handshaking() && !s.is_handshaking() {
                return c.handshake_kind();
            }
        }
    };
    handshake(); // a full one leaves the first ticket
    (0..n + 5)
        .map(|_| {
            let t = Instant::now();
            let kind = handshake();
            let took = t.elapsed();
            assert_eq!(kind, Some(rustls::HandshakeKind::Resumed));
            took
        })
        .skip(5)
        .collect()
}

/// Connects (TLS as `tls` says) and, if `greet`, exchanges hello and welcome.
fn hello(addr: &str, tls: &Tls, t: Duration, greet: bool) -> sucl_remote::transport::Link {
    let mut l = sucl_remote::transport::connect(addr, tls, t).unwrap();
    if greet {
        use sucl_remote::wire::{read_frame, Frame};
        let f = Frame::Hello {
            min_version: sucl_remote::wire::VERSION,
            max_version: sucl_remote::wire::VERSION,
            features: 0,
            max_frame: 1 << 20,
            nonce: [1; 16],
        };
        l.write_all(&f.encode()).unwrap();
        assert!(matches!(read_frame(&mut l, &mut Vec::new(), 1024).unwrap(), Frame::Welcome { .. }));
    }
    l
}

fn median_secs(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The first CUDA device of a server, else its first device (a queue on it).
fn pick_queue(r: &Remote) -> sucl_remote::RemoteQueue {
    let devs = r.devices().unwrap();
    let d = devs.iter().find(|d| d.kind() == sucl_remote::DeviceKind::Cuda).unwrap_or(&devs[0]);
    d.queue().unwrap()
}

/// `external`: two running daemons (`--servers A,B`; token and pins from the environment as
/// for any client) instead of two in this process.
fn migrate(md: &mut String, mib: usize, reps: usize, external: Option<&[String]>) {
    let bytes = mib << 20;
    let n = bytes / 8;
    let gbit = 1e9 / 8.0;
    md.push_str(&format!(
        "\n## Migration of {mib} MiB from daemon A to daemon B (median of {reps}; client links paced at 1 Gbit/s per direction)\n\n"
    ));
    md.push_str(
        "| path | device | time ms | GB/s | vs via client | vs raw TCP, 2 threads | vs raw TCP, 2 processes | vs raw TLS, 2 processes |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let raw_threads = median_secs((0..reps).map(|_| raw_tcp_stream(bytes)).collect());
    let raw = median_secs((0..reps).map(|_| raw_stream(bytes, false)).collect());
    let raw_tls = median_secs((0..reps).map(|_| raw_stream(bytes, true)).collect());
    let mut rows = Vec::new();
    let mut via_client = 0.0;
    // Running servers: TLS or plain as the environment says (SUCL_REMOTE_TLS=off for daemons
    // started with --no-tls).
    let external_tls = external.map(|_| ClientOptions::from_env(None).map(|o| o.tls != Tls::Off).unwrap_or(true));
    let modes: Vec<bool> = match external_tls {
        Some(t) => vec![t],
        None => vec![true, false],
    };
    for tls in modes {
        let served: Vec<Served> = if external.is_some() { Vec::new() } else { vec![Served::start(tls), Served::start(tls)] };
        let targets: Vec<(String, ClientOptions)> = match external {
            Some(list) => {
                let o = ClientOptions::from_env(None).expect("SUCL_REMOTE_TOKEN(_FILE) and SUCL_REMOTE_TLS_PIN for --servers");
                list.iter().map(|a| (a.clone(), o.clone())).collect()
            }
            None => served.iter().map(|s| (s.addr(), s.options())).collect(),
        };
        let now = Instant::now();
        let shape = Shape::Throttle { rate: gbit, up: Arc::new(Mutex::new(now)), down: Arc::new(Mutex::new(now)) };
        let rs: Vec<Remote> = targets
            .iter()
            .map(|(addr, o)| {
                let r = Remote::connect(&proxy(addr.clone(), shape.clone()), o.clone()).expect("connecting");
                r.set_peer_address(addr);
                r
            })
            .collect();
        let (ra, rb) = (&rs[0], &rs[1]);
        let _mesh = Mesh::new(&rs).unwrap();
        let (qa, qb) = (pick_queue(ra), pick_queue(rb));
        let device = format!("{:?} → {:?}", qa.device().kind(), qb.device().kind());
        let src: Vec<u64> = (0..n as u64).collect();
        let xa = placed(qa.upload(&src));
        let mut xb = placed(qb.alloc::<u64>(n));
        qa.synchronize().unwrap();
        let mut s2s = Vec::new();
        for _ in 0..reps + 1 {
            let t = Instant::now();
            xb.migrate_from(&xa).unwrap();
            qb.synchronize().unwrap();
            s2s.push(t.elapsed().as_secs_f64());
        }
        s2s.remove(0); // warm-up (opens the peer link)
        assert!(xb.read(n - 4, 4).unwrap() == src[n - 4..], "the migrated bytes are wrong");
        let label = if tls { "TLS" } else { "plain TCP" };
        rows.push((format!("server to server, {label}"), device.clone(), median_secs(s2s)));
        if via_client == 0.0 {
            let mut via = Vec::new();
            for _ in 0..reps.min(3) {
                let t = Instant::now();
                let host = xa.to_vec().unwrap();
                xb.copy_from_host(&host).unwrap();
                qb.synchronize().unwrap();
                via.push(t.elapsed().as_secs_f64());
            }
            via_client = median_secs(via);
            rows.push((format!("via the client (read A, write B), {label}"), device, via_client));
        }
    }
    rows.push(("raw TCP stream between two threads of one process (no proxy)".into(), "host".into(), raw_threads));
    rows.push(("raw TCP stream between two processes (no proxy)".into(), "host".into(), raw));
    rows.push(("raw TLS stream (rustls, AES-GCM) between two processes".into(), "host".into(), raw_tls));
    for (name, device, t) in rows {
        md.push_str(&format!(
            "| {name} | {device} | {:.1} | {:.2} | {:.1}× | {:.2}× | {:.2}× | {:.2}× |\n",
            t * 1e3,
            bytes as f64 / t / 1e9,
            via_client / t,
            raw_threads / t,
            raw / t,
            raw_tls / t
        ));
    }
}

fn chain(md: &mut String, reps: usize) {
    let (a, b) = (Served::start(true), Served::start(true));
    let delay = Shape::Delay(Duration::from_micros(2500)); // +5 ms per client round trip
    let (pa, pb) = (proxy(a.addr(), delay.clone()), proxy(b.addr(), delay));
    let (ra, rb) = (a.connect(Some(&pa)), b.connect(Some(&pb)));
    let _mesh = Mesh::new(&[ra.clone(), rb.clone()]).unwrap();
    let (qa, qb) = (ra.devices().unwrap()[0].queue().unwrap(), rb.devices().unwrap()[0].queue().unwrap());
    let xa = qa.upload(&vec![0u64; 1024]).unwrap();
    let mut xb = placed(qb.alloc::<u64>(1024));
    qa.synchronize().unwrap();
    qb.synchronize().unwrap();
    let rtt = time(reps, 2, || ra.nop().unwrap());
    let mut expect = 0u64;
    let at_once = time(reps, 2, || {
        qa.launch("increment_u64", &[xa.arg()], 0).unwrap();
        xb.migrate_from(&xa).unwrap();
        qb.launch("increment_u64", &[xb.arg()], 0).unwrap();
        let v = xb.read(0, 1).unwrap();
        assert!(v[0] > 0);
    });
    let stepwise = time(reps, 2, || {
        qa.launch("increment_u64", &[xa.arg()], 0).unwrap();
        qa.synchronize().unwrap();
        xb.migrate_from(&xa).unwrap();
        qb.synchronize().unwrap();
        qb.launch("increment_u64", &[xb.arg()], 0).unwrap();
        qb.synchronize().unwrap();
        let v = xb.read(0, 1).unwrap();
        assert!(v[0] > 0);
    });
    expect += (2 * (reps + 2)) as u64;
    let last = xb.read(0, 1).unwrap()[0];
    assert_eq!(last, expect + 1, "the chain computed something else");
    let (r, c, s) = (stats(rtt).0 / 1e3, stats(at_once).0 / 1e3, stats(stepwise).0 / 1e3);
    md.push_str(&format!("\n## Dependent chain across two daemons, 5 ms added to the client's round trip (median of {reps})\n\n"));
    md.push_str("kernel on A → migrate A→B → kernel on B → read on B\n\n| how | time ms | client round trips |\n|---|---:|---:|\n");
    md.push_str(&format!("| client round trip (nop through the delay proxy) | {r:.2} | 1 |\n"));
    md.push_str(&format!("| decentralized: submitted at once, servers order it (S2S data, notices) | {c:.2} | {:.2} |\n", c / r));
    md.push_str(&format!("| client-driven: the client waits for each step | {s:.2} | {:.2} |\n", s / r));
}

/// Where an application runs: `d` daemons in this process serving host devices, or the first
/// `d` of running servers (`--servers`), on their first CUDA device with `--cuda`.
struct Cluster {
    _served: Vec<Served>,
    remotes: Vec<Remote>,
    queues: Vec<sucl_remote::RemoteQueue>,
    cuda: bool,
    _mesh: Option<Mesh>,
}

impl Cluster {
    fn new(d: usize, external: Option<&[String]>, cuda: bool, kernels: &[(&str, &str)]) -> Cluster {
        let served: Vec<Served> = if external.is_some() { Vec::new() } else { (0..d).map(|_| Served::start(true)).collect() };
        let remotes: Vec<Remote> = match external {
            Some(list) => {
                let o = ClientOptions::from_env(None).expect("SUCL_REMOTE_TOKEN(_FILE) and SUCL_REMOTE_TLS_PIN for --servers");
                list[..d].iter().map(|a| Remote::connect(a, o.clone()).unwrap_or_else(|e| fail(&e.to_string()))).collect()
            }
            None => served.iter().map(|s| s.connect(None)).collect(),
        };
        let mesh = (d > 1).then(|| Mesh::new(&remotes).unwrap_or_else(|e| fail(&e.to_string())));
        let queues: Vec<_> = remotes
            .iter()
            .map(|r| {
                let devs = r.devices().unwrap();
                let want = if cuda { sucl_remote::DeviceKind::Cuda } else { sucl_remote::DeviceKind::Host };
                let dev =
                    devs.into_iter().find(|x| x.kind() == want).unwrap_or_else(|| panic!("server {} has no {want:?} device", r.server()));
                if cuda {
                    for (src, name) in kernels {
                        dev.compile(src, name).unwrap();
                    }
                }
                dev.queue().unwrap()
            })
            .collect();
        Cluster { _served: served, remotes, queues, cuda, _mesh: mesh }
    }
    fn sync(&self) {
        self.queues.iter().for_each(|q| q.synchronize().unwrap_or_else(|e| fail(&e.to_string())));
    }
    fn device(&self) -> String {
        if self.cuda {
            format!("{} GPU(s), one per daemon: {}", self.queues.len(), self.queues[0].device().name())
        } else {
            "host".into()
        }
    }
}

/// The same kernels run in this process on the first local GPU (the reference the remote GPU
/// runs are checked and timed against).
#[cfg(feature = "cuda")]
mod local_gpu {
    use sucl_cuda::cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};
    use sucl_cuda::{Buffer, Device, Kernel, Queue};

    pub struct Gpu {
        dev: Device,
        q: Queue,
    }

    fn e(x: impl std::fmt::Display) -> String {
        x.to_string()
    }

    pub fn open() -> Result<Gpu, String> {
        sucl_cuda::probe()?;
        let dev = Device::open(0).map_err(e)?;
        let q = dev.queue().map_err(e)?;
        Ok(Gpu { dev, q })
    }

    fn ptr<T: sucl_cuda::DeviceElement>(b: &Buffer<T>) -> u64 {
        let s = b.cuda_slice().expect("a non-empty buffer");
        let (p, _sync) = s.device_ptr(b.queue().stream());
        p
    }

    impl Gpu {
        fn launch(&self, k: &Kernel, words: &[u64], threads: u64) -> Result<(), String> {
            let mut b = self.q.stream().launch_builder(k.function());
            for w in words {
                b.arg(w);
            }
            let cfg = LaunchConfig { grid_dim: (threads.div_ceil(256) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: every parameter of these kernels is a 64-bit word (a device pointer of a
            // live buffer of this queue, or an integer), passed in order.
            unsafe { b.launch(cfg) }.map(|_| ()).map_err(|x| format!("{x:?}"))
        }

        /// `steps` Jacobi steps on the whole domain (`nz` interior planes); the result and the
        /// seconds the kernels took.
        #[allow(clippy::too_many_arguments)]
        pub fn jacobi<T: sucl_cuda::DeviceElement>(
            &self,
            src: &str,
            name: &str,
            init: &[T],
            nx: usize,
            ny: usize,
            nz: usize,
            steps: usize,
        ) -> Result<(Vec<T>, f64), String> {
            let k = Kernel::compile(&self.dev, src, name).map_err(e)?;
            let (mut a, mut b) = (self.q.upload(init).map_err(e)?, self.q.upload(init).map_err(e)?);
            self.q.synchronize().map_err(e)?;
            let t = std::time::Instant::now();
            for _ in 0..steps {
                self.launch(&k, &[ptr(&b), ptr(&a), nx as u64, ny as u64, nz as u64], (nx * ny * nz) as u64)?;
                std::mem::swap(&mut a, &mut b);
            }
            self.q.synchronize().map_err(e)?;
            let dt = t.elapsed().as_secs_f64();
            Ok((a.to_vec().map_err(e)?, dt))
        }

        /// `C = A·B` (n×n, whole); the result and the seconds the kernel took.
        pub fn gemm(&self, a: &[f64], b: &[f64], n: usize) -> Result<(Vec<f64>, f64), String> {
            let k = Kernel::compile(&self.dev, sucl_remote::kernels::cuda_src::GEMM_F64, "gemm_f64").map_err(e)?;
            let (da, db, dc) = (self.q.upload(a).map_err(e)?, self.q.upload(b).map_err(e)?, self.q.alloc::<f64>(n * n).map_err(e)?);
            self.q.synchronize().map_err(e)?;
            let t = std::time::Instant::now();
            let n64 = n as u64;
            self.launch(&k, &[ptr(&dc), ptr(&da), ptr(&db), n64, n64, n64, n64, 0], sucl_remote::kernels::cuda_src::gemm_range(n64, n64))?;
            self.q.synchronize().map_err(e)?;
            let dt = t.elapsed().as_secs_f64();
            Ok((dc.to_vec().map_err(e)?, dt))
        }
    }
}

/// The local reference of an application on GPU (`None` without one).
#[cfg(feature = "cuda")]
fn local_gpu_run<T>(f: impl FnOnce() -> Result<(Vec<T>, f64), String>) -> (Vec<T>, f64) {
    f().unwrap_or_else(|e| fail(&format!("the local GPU reference run failed: {e}")))
}

fn daemon_counts(max: usize, external: Option<&[String]>) -> Vec<usize> {
    let max = external.map_or(max, |l| l.len().min(max));
    (1..=max).collect()
}

/// What the local GPU reference needs of a cell type (nothing without CUDA).
#[cfg(feature = "cuda")]
trait OnGpu: sucl_cuda::DeviceElement {}
#[cfg(feature = "cuda")]
impl<T: sucl_cuda::DeviceElement> OnGpu for T {}
#[cfg(not(feature = "cuda"))]
trait OnGpu {}
#[cfg(not(feature = "cuda"))]
impl<T> OnGpu for T {}

/// A cell type of the stencil: its CUDA kernel and how a value is made.
trait Cell: bytemuck::Pod + PartialEq + Send + Sync + std::fmt::Debug + OnGpu {
    const NAME: &'static str;
    const CUDA_SRC: &'static str;
    const CUDA_KERNEL: &'static str;
    fn of(x: f64) -> Self;
    fn same_bits(self, other: Self) -> bool;
}

impl Cell for f64 {
    const NAME: &'static str = "f64";
    const CUDA_SRC: &'static str = sucl_remote::kernels::cuda_src::JACOBI3D_F64;
    const CUDA_KERNEL: &'static str = "jacobi3d_f64";
    fn of(x: f64) -> f64 {
        x
    }
    fn same_bits(self, other: f64) -> bool {
        self.to_bits() == other.to_bits()
    }
}

impl Cell for f32 {
    const NAME: &'static str = "f32";
    const CUDA_SRC: &'static str = sucl_remote::kernels::cuda_src::JACOBI3D_F32;
    const CUDA_KERNEL: &'static str = "jacobi3d_f32";
    fn of(x: f64) -> f32 {
        x as f32
    }
    fn same_bits(self, other: f32) -> bool {
        self.to_bits() == other.to_bits()
    }
}

/// How the servers of a run moved data and waited: the sums of their counters' changes.
#[derive(Default, Clone, Copy)]
struct Moves {
    peer_memory: u64,
    network: u64,
    bytes: u64,
    wait_ns: u64,
    migration_commands: u64,
    round_trips: u64,
    servers: u64,
}

impl Moves {
    fn of(c: &Cluster) -> Moves {
        let mut m = Moves::default();
        for r in &c.remotes {
            m.servers += 1;
            m.round_trips += r.round_trips(); // before this snapshot's own call
            let s = r.stats().unwrap_or_else(|e| fail(&e.to_string()));
            m.peer_memory += s.migrations_peer_memory;
            m.network += s.migrations_network;
            m.bytes += s.migrated_bytes;
            m.wait_ns += s.peer_wait_ns;
        }
        m.migration_commands = 2 * (m.peer_memory + m.network);
        m
    }
    fn since(self, before: Moves) -> Moves {
        Moves {
            peer_memory: self.peer_memory - before.peer_memory,
            network: self.network - before.network,
            bytes: self.bytes - before.bytes,
            wait_ns: self.wait_ns - before.wait_ns,
            migration_commands: self.migration_commands - before.migration_commands,
            // less the earlier snapshot's own stats call, one per server
            round_trips: (self.round_trips - before.round_trips).saturating_sub(before.servers),
            servers: self.servers,
        }
    }
    /// Which path the run's migrations took.
    fn path(&self) -> String {
        match (self.peer_memory, self.network) {
            (0, 0) => "—".into(),
            (_, 0) => "peer memory".into(),
            (0, _) => "network".into(),
            (p, n) => format!("mixed ({p} peer memory, {n} network)"),
        }
    }
    /// A breakdown row per step: migrations, bytes, host wait per migration command, client
    /// round trips.
    fn row(&self, steps: usize) -> String {
        let per = |x: u64| x as f64 / steps as f64;
        let wait = if self.migration_commands == 0 { 0.0 } else { self.wait_ns as f64 / self.migration_commands as f64 / 1e3 };
        format!("{:.1} | {:.0} | {wait:.0} | {:.2}", per(self.peer_memory + self.network), per(self.bytes) / 1024.0, per(self.round_trips))
    }
}

fn jacobi(md: &mut String, a: &JacobiArgs, external: Option<&[String]>, cuda: bool) {
    if a.f32 {
        if !cuda {
            fail("--jacobi-f32 runs the CUDA kernel: add --cuda");
        }
        jacobi_run::<f32>(md, a, external, cuda)
    } else {
        jacobi_run::<f64>(md, a, external, cuda)
    }
}

/// What the stencil runs.
struct JacobiArgs {
    nx: usize,
    nz: usize,
    steps: usize,
    /// Every daemon holds `nz` planes (weak scaling) instead of `nz / d` (strong scaling).
    weak: bool,
    f32: bool,
}

/// The stencil's reference: `steps` steps on the whole domain of `planes` interior planes, on
/// this process's GPU 0 (with `cuda`) or one thread; the result and its time.
fn jacobi_local<T: Cell + JacobiHost>(whole: &[T], nx: usize, planes: usize, steps: usize, cuda: bool) -> (Vec<T>, f64) {
    if cuda {
        #[cfg(feature = "cuda")]
        return local_gpu_run(|| local_gpu::open()?.jacobi(T::CUDA_SRC, T::CUDA_KERNEL, whole, nx, nx, planes, steps));
        #[cfg(not(feature = "cuda"))]
        return no_cuda(planes);
    }
    let (mut a, mut b) = (whole.to_vec(), whole.to_vec());
    let t = Instant::now();
    for _ in 0..steps {
        T::host_step(&mut b, &a, nx);
        std::mem::swap(&mut a, &mut b);
    }
    (a, t.elapsed().as_secs_f64())
}

/// The host kernel of a cell type (f64 only: the registry's `jacobi3d_f64`).
trait JacobiHost: Sized {
    fn host_step(out: &mut [Self], input: &[Self], nx: usize);
}
impl JacobiHost for f64 {
    fn host_step(out: &mut [f64], input: &[f64], nx: usize) {
        jacobi3d(out, input, nx, nx).unwrap();
    }
}
impl JacobiHost for f32 {
    fn host_step(_: &mut [f32], _: &[f32], _: usize) {
        unreachable!("f32 runs on CUDA only")
    }
}

fn jacobi_run<T: Cell + JacobiHost>(md: &mut String, ja: &JacobiArgs, external: Option<&[String]>, cuda: bool) {
    let (nx, nz, steps) = (ja.nx, ja.nz, ja.steps);
    let ny = nx;
    let plane = nx * ny;
    // Cell (x, y, z) starts at (7x + 13y + 31z) mod 97: planes made from one base plane, fast
    // enough for domains of billions of cells.
    let base: Vec<usize> = (0..plane).map(|i| (i % nx) * 7 + (i / nx) * 13).collect();
    let planes_from = |z: std::ops::Range<usize>| -> Vec<T> {
        let mut v = Vec::with_capacity(z.len() * plane);
        for z in z {
            v.extend(base.iter().map(|b| T::of(((b + z * 31) % 97) as f64)));
        }
        v
    };
    let local_where = if cuda { "this process's GPU 0, same CUDA kernel" } else { "one thread, same kernel" };
    let scaling = if ja.weak { format!("weak scaling: {nz} planes per daemon") } else { format!("strong scaling: {nz} planes split in z") };
    md.push_str(&format!(
        "\n## Jacobi 3D (7-point, {}), {nx}×{ny} planes, {steps} steps, {scaling}, over 1–4 daemons; halos migrated S2S every step\n\n",
        T::NAME
    ));
    md.push_str(&format!(
        "Local runs ({local_where}) of each whole domain are the reference (bit for bit) and the time base. This machine has {} CPU cores. Times: first step to every queue synchronized (uploads and the final read not counted); the whole run is submitted at once.\n\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
    ));
    let mut rows = String::from("| daemons | device | path | time ms | MLUP/s | speedup vs 1 daemon | efficiency vs 1 daemon | local ms | efficiency vs local | #wrong |\n|---:|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    let mut breakdown = String::from("| daemons | path | step ms | local step ms (one GPU, whole domain) | migrations / step | halo KiB / step | host wait per migration command µs | client round trips / step |\n|---:|---|---:|---:|---:|---:|---:|---:|\n");
    let mut one = 0.0;
    for d in daemon_counts(4, external) {
        // Weak scaling: 1, 2 and 4 daemons (3 adds a run, not a point of the figure).
        if (!ja.weak && !nz.is_multiple_of(d)) || (ja.weak && d == 3) {
            continue;
        }
        let nzl = if ja.weak { nz } else { nz / d };
        let planes = nzl * d;
        // The local reference: the whole domain, its interior planes plus two fixed boundary planes.
        let whole: Vec<T> = planes_from(0..planes + 2);
        let (want, local) = jacobi_local(&whole, nx, planes, steps, cuda);
        drop(whole);
        let kernels: &[(&str, &str)] = &[(T::CUDA_SRC, T::CUDA_KERNEL)];
        let c = Cluster::new(d, external, cuda, kernels);
        let qs = &c.queues;
        // Block k holds global planes k·nzl ..= (k+1)·nzl + 1 (its interior and two halos).
        let block = |k: usize| -> Vec<T> { planes_from(k * nzl..(k + 1) * nzl + 2) };
        let mut ins: Vec<RemoteBuffer<T>> = (0..d).map(|k| placed(qs[k].upload(&block(k)))).collect();
        let mut outs: Vec<RemoteBuffer<T>> = (0..d).map(|k| placed(qs[k].alloc::<T>((nzl + 2) * plane))).collect();
        for (o, i) in outs.iter_mut().zip(&ins) {
            o.copy_from(i).unwrap_or_else(|e| fail(&e.to_string()));
        }
        // Warm-up, untimed: every halo migration of both buffer sets once (the halos already
        // hold their neighbours' planes, so nothing changes), which opens the peer links and,
        // on the peer-memory path, each buffer's mapping in its neighbour (kept for later runs).
        for set in [&mut ins, &mut outs] {
            for k in 0..d.saturating_sub(1) {
                let (lo, hi) = set.split_at_mut(k + 1);
                hi[0].migrate_range_from(0, &lo[k], nzl * plane, plane).unwrap_or_else(|e| fail(&e.to_string()));
                lo[k].migrate_range_from((nzl + 1) * plane, &hi[0], plane, plane).unwrap_or_else(|e| fail(&e.to_string()));
            }
        }
        c.sync();
        let before = Moves::of(&c);
        let t = Instant::now();
        for _ in 0..steps {
            for k in 0..d {
                let result = if cuda {
                    let args = [outs[k].arg(), ins[k].arg(), Arg::U64(nx as u64), Arg::U64(ny as u64), Arg::U64(nzl as u64)];
                    qs[k].launch(T::CUDA_KERNEL, &args, (plane * nzl) as u64)
                } else {
                    let args = [outs[k].arg(), ins[k].arg(), Arg::U64(nx as u64), Arg::U64(ny as u64)];
                    qs[k].launch("jacobi3d_f64", &args, 0)
                };
                result.unwrap_or_else(|e| fail(&e.to_string()));
            }
            for k in 0..d.saturating_sub(1) {
                let (lo, hi) = outs.split_at_mut(k + 1);
                // k's top interior plane → k+1's bottom halo; k+1's bottom interior → k's top halo.
                hi[0].migrate_range_from(0, &lo[k], nzl * plane, plane).unwrap_or_else(|e| fail(&e.to_string()));
                lo[k].migrate_range_from((nzl + 1) * plane, &hi[0], plane, plane).unwrap_or_else(|e| fail(&e.to_string()));
            }
            std::mem::swap(&mut ins, &mut outs);
        }
        c.sync();
        let dt = t.elapsed().as_secs_f64();
        let moves = Moves::of(&c).since(before);
        let result: Vec<Vec<T>> = ins.iter().map(|b| b.read(plane, nzl * plane).unwrap_or_else(|e| fail(&e.to_string()))).collect();
        let wrong = result
            .iter()
            .enumerate()
            .map(|(k, r)| r.iter().zip(&want[(1 + k * nzl) * plane..]).filter(|(x, y)| !x.same_bits(**y)).count())
            .sum::<usize>();
        if d == 1 {
            one = dt;
        }
        let cells = (nx * ny * planes * steps) as f64;
        // Weak scaling: one daemon's time is the ideal; strong: a d-th of it.
        let ideal = if ja.weak { one } else { one / d as f64 };
        rows.push_str(&format!(
            "| {d} | {} | {} | {:.1} | {:.0} | {:.2}× | {:.0}% | {:.1} | {:.0}% | {wrong} |\n",
            c.device(),
            moves.path(),
            dt * 1e3,
            cells / dt / 1e6,
            one / dt,
            100.0 * ideal / dt,
            local * 1e3,
            100.0 * local / dt / d as f64
        ));
        breakdown.push_str(&format!(
            "| {d} | {} | {:.3} | {:.3} | {} |\n",
            moves.path(),
            dt * 1e3 / steps as f64,
            local * 1e3 / steps as f64,
            moves.row(steps)
        ));
    }
    md.push_str(&rows);
    md.push_str("\nOne step, where the time goes (counters of the servers over the timed run; a migration is two commands, one per server; host wait: the time those commands spent waiting for their peer — an offer, the bytes or the confirmation — which the GPUs overlap when the run is submitted ahead):\n\n");
    md.push_str(&breakdown);
}

/// A blocked matrix product `C = A·B` (n×n, f64) over `d` daemons: daemon k holds rows
/// `k·n/d ..` of A and C and one column block of B at a time; in step s it multiplies by
/// block `(k+s) mod d` while passing that block on to daemon `k−1` server to server (a ring),
/// so every B block visits every daemon once. The whole run is submitted at once.
fn matmul(md: &mut String, n: usize, external: Option<&[String]>, cuda: bool) {
    use sucl_remote::kernels::{cuda_src, gemm, Gemm};
    let a: Vec<f64> = (0..n * n).map(|i| ((i * 37 % 101) as f64 - 50.0) / 50.0).collect();
    let b: Vec<f64> = (0..n * n).map(|i| ((i * 53 % 89) as f64 - 44.0) / 44.0).collect();
    let (want, local, local_where) = if cuda {
        #[cfg(feature = "cuda")]
        let (r, t) = local_gpu_run(|| local_gpu::open()?.gemm(&a, &b, n));
        #[cfg(not(feature = "cuda"))]
        let (r, t): (Vec<f64>, f64) = no_cuda(n);
        (r, t, "this process's GPU 0, same CUDA kernel")
    } else {
        let mut c = vec![0.0; n * n];
        let t = Instant::now();
        gemm(&mut c, &a, &b, Gemm { m: n, n, k: n, ldc: n, col0: 0 }).unwrap();
        (c, t.elapsed().as_secs_f64(), "one thread, same kernel")
    };
    let flops = 2.0 * (n as f64).powi(3);
    md.push_str(&format!(
        "\n## Blocked matmul (f64), {n}×{n}, rows of A and C split over 1–4 daemons, B's column blocks passed round a ring S2S\n\n"
    ));
    md.push_str(&format!(
        "Local run ({local_where}): {:.1} ms, {:.2} GFLOP/s. Times: first multiply to every queue synchronized (uploads and the final read not counted).\n\n",
        local * 1e3,
        flops / local / 1e9
    ));
    md.push_str("| daemons | device | path | time ms | GFLOP/s | speedup vs 1 daemon | vs local | efficiency vs local | #wrong |\n|---:|---|---|---:|---:|---:|---:|---:|---:|\n");
    let mut breakdown = String::from("| daemons | path | step ms | migrations / step | block KiB / step | host wait per migration command µs | client round trips / step |\n|---:|---|---:|---:|---:|---:|---:|\n");
    let mut one = 0.0;
    for d in daemon_counts(4, external) {
        if !n.is_multiple_of(d) {
            continue;
        }
        let w = n / d; // rows of A per daemon, columns per B block
        let c = Cluster::new(d, external, cuda, &[(cuda_src::GEMM_F64, "gemm_f64")]);
        let qs = &c.queues;
        let a_rows = |k: usize| a[k * w * n..(k + 1) * w * n].to_vec();
        let b_cols = |j: usize| -> Vec<f64> { (0..n).flat_map(|r| b[r * n + j * w..r * n + (j + 1) * w].to_vec()).collect() };
        let ak: Vec<RemoteBuffer<f64>> = (0..d).map(|k| placed(qs[k].upload(&a_rows(k)))).collect();
        let ck: Vec<RemoteBuffer<f64>> = (0..d).map(|k| placed(qs[k].alloc::<f64>(w * n))).collect();
        let mut cur: Vec<RemoteBuffer<f64>> = (0..d).map(|k| placed(qs[k].upload(&b_cols(k)))).collect();
        let mut next: Vec<RemoteBuffer<f64>> = (0..d).map(|k| placed(qs[k].alloc::<f64>(n * w))).collect();
        // Warm-up, untimed: each B buffer migrates once to its ring neighbour (`next` is scratch
        // until the first step fills it; `next` itself goes to a spare block), which opens the
        // peer links and, on the peer-memory path, each buffer's mapping there.
        if d > 1 {
            let mut spare: Vec<RemoteBuffer<f64>> = (0..d).map(|k| placed(qs[k].alloc::<f64>(n * w))).collect();
            for k in 0..d {
                next[(k + d - 1) % d].migrate_from(&cur[k]).unwrap_or_else(|e| fail(&e.to_string()));
            }
            for k in 0..d {
                spare[(k + d - 1) % d].migrate_from(&next[k]).unwrap_or_else(|e| fail(&e.to_string()));
            }
            c.sync();
        }
        c.sync();
        let before = Moves::of(&c);
        let t = Instant::now();
        for s in 0..d {
            // Pass each block on to the previous daemon, then multiply by it (the commands of a
            // session run in order, so on each daemon the transfer and the multiply take turns).
            if s + 1 < d {
                for (k, block) in cur.iter().enumerate() {
                    next[(k + d - 1) % d].migrate_from(block).unwrap_or_else(|e| fail(&e.to_string()));
                }
            }
            for k in 0..d {
                let j = (k + s) % d; // the B block daemon k holds in step s
                let (m64, w64, n64) = (w as u64, w as u64, n as u64);
                let args = [
                    ck[k].arg(),
                    ak[k].arg(),
                    cur[k].arg(),
                    Arg::U64(m64),
                    Arg::U64(w64),
                    Arg::U64(n64),
                    Arg::U64(n64),
                    Arg::U64((j * w) as u64),
                ];
                let range = if cuda { cuda_src::gemm_range(m64, w64) } else { 0 };
                qs[k].launch("gemm_f64", &args, range).unwrap_or_else(|e| fail(&e.to_string()));
            }
            std::mem::swap(&mut cur, &mut next);
        }
        c.sync();
        let dt = t.elapsed().as_secs_f64();
        let moves = Moves::of(&c).since(before);
        let wrong: usize = (0..d)
            .map(|k| {
                ck[k]
                    .to_vec()
                    .unwrap_or_else(|e| fail(&e.to_string()))
                    .iter()
                    .zip(&want[k * w * n..])
                    .filter(|(x, y)| x.to_bits() != y.to_bits())
                    .count()
            })
            .sum();
        if d == 1 {
            one = dt;
        }
        md.push_str(&format!(
            "| {d} | {} | {} | {:.1} | {:.2} | {:.2}× | {:.2}× | {:.0}% | {wrong} |\n",
            c.device(),
            moves.path(),
            dt * 1e3,
            flops / dt / 1e9,
            one / dt,
            local / dt,
            100.0 * local / dt / d as f64
        ));
        breakdown.push_str(&format!("| {d} | {} | {:.2} | {} |\n", moves.path(), dt * 1e3 / d as f64, moves.row(d)));
    }
    md.push_str("\nOne ring step (of d), where the time goes (as for Jacobi 3D):\n\n");
    md.push_str(&breakdown);
}

/// The usage text (`--help`).
const HELP: &str = "\
remote_bench: remote devices on loopback, each figure beside its baseline from the same run.

Usage: remote_bench [--only latency,reconnect,migrate,chain,jacobi,matmul] [--iters N]
                    [--reconnects N] [--migrate-mib N] [--migrate-reps N] [--chain-reps N]
                    [--jacobi-n N --jacobi-nz N --jacobi-steps N] [--jacobi-weak] [--jacobi-f32]
                    [--matmul-n N]
                    [--servers HOST:PORT,...] [--cuda] [--out FILE.md]

Without --servers the daemons run in this process (every byte still crosses loopback TCP).
--servers runs the migration, Jacobi 3D and the matmul on running sucld's (token and pins from
SUCL_REMOTE_TOKEN(_FILE) and SUCL_REMOTE_TLS_PIN); --cuda runs them on the servers' GPUs,
checked against the same kernels on this machine's GPU 0. A server's per-session memory
limit (sucld --max-session-bytes) must hold each daemon's share of the problem.
--jacobi-weak gives every daemon --jacobi-nz planes (weak scaling) instead of splitting them;
--jacobi-f32 runs the stencil in single precision (CUDA only). Each application's table says
which path its migrations took (peer memory or network: sucld --peer-path) and breaks one step
down (migrations, bytes, host wait per migration command, client round trips).

Example:
  cargo run --release -p sucl-remote --example remote_bench -- --only latency,jacobi --iters 2000";

/// A buffer the server placed, or — when it refused — a one-line error naming the setting to
/// raise, and the end of the run.
fn placed<T: bytemuck::Pod>(r: Result<RemoteBuffer<T>, RemoteError>) -> RemoteBuffer<T> {
    match r {
        Ok(b) => b,
        Err(e @ RemoteError::Failed { code: sucl_remote::wire::code::LIMIT, .. }) => {
            fail(&format!("{e}; start the daemons with a larger --max-session-bytes (or choose smaller sizes)"))
        }
        Err(e) => fail(&e.to_string()),
    }
}

/// Says why the run cannot go on, and ends it.
/// A GPU reference asked of a build without the `cuda` feature: a one-line error (`_size` only
/// names what the reference would have covered).
#[cfg(not(feature = "cuda"))]
fn no_cuda<T>(_size: usize) -> (Vec<T>, f64) {
    fail("this remote_bench was built without the `cuda` feature: no GPU reference (rebuild with it, or drop --cuda)")
}

fn fail(why: &str) -> ! {
    eprintln!("remote_bench: {why}");
    std::process::exit(1)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{HELP}");
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--stream-sink") {
        return stream_sink(args[i + 1] == "tls", args[i + 2].parse().expect("--stream-sink tcp|tls BYTES"));
    }
    let opt = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let num = |name: &str, default: usize| {
        opt(name).map(|s| s.parse().unwrap_or_else(|_| fail(&format!("{name} takes a whole number, not {s:?}")))).unwrap_or(default)
    };
    let only = opt("--only").unwrap_or_else(|| "latency,reconnect,migrate,chain,jacobi,matmul".into());
    let on = |s: &str| only.split(',').any(|x| x == s);
    let mut md = format!("# sucl remote devices on loopback\n\nCommand: `{}`\n", args.join(" "));
    if on("latency") {
        latency(&mut md, num("--iters", 20_000));
        eprint!("{md}");
    }
    if on("reconnect") {
        reconnect(&mut md, num("--reconnects", 100));
    }
    if on("migrate") {
        let external: Option<Vec<String>> = opt("--servers").map(|s| s.split(',').map(String::from).collect());
        migrate(&mut md, num("--migrate-mib", 64), num("--migrate-reps", 5), external.as_deref());
    }
    if on("chain") {
        chain(&mut md, num("--chain-reps", 20));
    }
    let external: Option<Vec<String>> = opt("--servers").map(|s| s.split(',').map(String::from).collect());
    let cuda = args.iter().any(|a| a == "--cuda");
    if on("jacobi") {
        let ja = JacobiArgs {
            nx: num("--jacobi-n", 96),
            nz: num("--jacobi-nz", 96),
            steps: num("--jacobi-steps", 30),
            weak: args.iter().any(|a| a == "--jacobi-weak"),
            f32: args.iter().any(|a| a == "--jacobi-f32"),
        };
        jacobi(&mut md, &ja, external.as_deref(), cuda);
    }
    if on("matmul") {
        matmul(&mut md, num("--matmul-n", 480), external.as_deref(), cuda);
    }
    print!("{md}");
    if let Some(path) = opt("--out") {
        std::fs::write(&path, &md).expect("writing the results");
        eprintln!("wrote {path}");
    }
}
