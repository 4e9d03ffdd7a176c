//! Connections: plain TCP, or TLS (rustls, on by default) over TCP, behind one handle.
//!
//! A [`Link`] is shared by a reading thread and writing threads at once (the client's reader
//! and its submitters; the daemon's command loop and its executor). A TLS connection is one
//! state machine for both directions, so it sits behind a mutex that is never held while
//! blocking: after the handshake the socket is non-blocking, a reader holds the lock only to
//! feed received records in and take plaintext out, and a writer only to encrypt and push
//! records out; each waits for the socket in `poll(2)` with the lock released. (Holding it
//! across a blocking write could deadlock two peers that both write while neither reads.)
//!
//! Certificates: the daemon has one (generated with rcgen at first start, or given by path);
//! clients and peers trust a server by *pinning* the SHA-256 of its certificate — there is no
//! certificate authority. Authentication of the client to the server stays in [`crate::auth`].

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use sha2::{Digest, Sha256};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The SHA-256 of a certificate's DER bytes: what clients pin.
pub type Pin = [u8; 32];

/// The SHA-256 pin of a DER certificate.
pub fn pin_of(cert_der: &[u8]) -> Pin {
    Sha256::digest(cert_der).into()
}

/// A pin written as 64 hex digits.
pub fn pin_hex(p: &Pin) -> String {
    p.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses 64 hex digits into a pin.
pub fn parse_pin(s: &str) -> Result<Pin, String> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return Err(format!("a certificate pin is 64 hex digits (a SHA-256); got {:?}", s));
    }
    let mut p = [0u8; 32];
    for (i, b) in p.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| format!("a certificate pin is 64 hex digits; found {s:?}"))?;
    }
    Ok(p)
}

/// The pin of the (first) certificate in a PEM file.
pub fn pin_of_pem_file(path: &Path) -> Result<Pin, String> {
    use rustls::pki_types::pem::PemObject;
    let c = CertificateDer::from_pem_file(path).map_err(|e| format!("reading the certificate {}: {e}", path.display()))?;
    Ok(pin_of(&c))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    // TLS 1.3's mandatory suite first (AES-128-GCM with SHA-256): 128-bit security, and its
    // key schedule hashes with SHA-256 rather than SHA-384, which is most of a resumed
    // handshake's symmetric work — the critical path of every re-attach. The other suites stay
    // offered, after it.
    p.cipher_suites.sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    for g in p.kx_groups.iter_mut() {
        if g.name() == rustls::NamedGroup::X25519 {
            *g = x25519_ahead();
        }
    }
    Arc::new(p)
}

use rustls::crypto::{ActiveKeyExchange, SupportedKxGroup};

/// X25519 with its ephemeral key pairs made ahead of need by a background thread, so that
/// neither a client's hello nor a server's answer to one waits for a key pair to be made (one
/// scalar multiplication, on the critical path of every handshake on each side). Each pair
/// serves exactly one handshake, as one made on the spot would (forward secrecy is unchanged);
/// pairs made in another process (before a `fork`) are dropped, never used twice.
struct KxAhead {
    inner: &'static dyn SupportedKxGroup,
    /// Pairs made, with the id of the process that made them.
    ready: Mutex<Vec<(u32, Box<dyn ActiveKeyExchange>)>>,
    wanted: std::sync::Condvar,
    refiller: std::sync::Once,
}

/// Key pairs kept ready.
const KX_AHEAD: usize = 4;

impl std::fmt::Debug for KxAhead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KxAhead({:?})", self.inner.name())
    }
}

fn x25519_ahead() -> &'static KxAhead {
    static GROUP: std::sync::OnceLock<KxAhead> = std::sync::OnceLock::new();
    GROUP.get_or_init(|| KxAhead {
        inner: rustls::crypto::ring::kx_group::X25519,
        ready: Mutex::new(Vec::with_capacity(KX_AHEAD)),
        wanted: std::sync::Condvar::new(),
        refiller: std::sync::Once::new(),
    })
}

impl KxAhead {
    /// A pair made by process `pid` (else one made now), and a wake-up for the refiller.
    fn take(&self, pid: u32) -> Result<Box<dyn ActiveKeyExchange>, rustls::Error> {
        let taken = lock(&self.ready).pop();
        self.wanted.notify_one();
        match taken {
            Some((made_by, kx)) if made_by == pid => Ok(kx),
            _ => self.inner.start(),
        }
    }

    /// Keeps [`KX_AHEAD`] pairs ready (runs for the life of the process, asleep while they are),
    /// at the lowest scheduling priority: on a busy machine it yields to the handshakes it
    /// serves rather than compete with them for a core.
    fn refill(&self) {
        // SAFETY: plain system calls on this thread's own id; a failure leaves the priority as is.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
        loop {
            let mut ready = lock(&self.ready);
            while ready.len() >= KX_AHEAD {
                ready = self.wanted.wait(ready).unwrap_or_else(|p| p.into_inner());
            }
            drop(ready);
            match self.inner.start() {
                Ok(kx) => lock(&self.ready).push((std::process::id(), kx)),
                Err(_) => return, // the group cannot make keys: handshakes make their own (and fail)
            }
        }
    }
}

impl SupportedKxGroup for KxAhead {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, rustls::Error> {
        let me = x25519_ahead();
        me.refiller.call_once(|| {
            // Without the thread, every handshake makes its own pair, as rustls would.
            let _ = std::thread::Builder::new().name("sucl-tls-keys".into()).spawn(move || me.refill());
        });
        self.take(std::process::id())
    }

    fn name(&self) -> rustls::NamedGroup {
        self.inner.name()
    }

    fn fips(&self) -> bool {
        self.inner.fips()
    }

    fn usable_for_version(&self, version: rustls::ProtocolVersion) -> bool {
        self.inner.usable_for_version(version)
    }
}

/// A daemon's TLS certificate and key.
#[derive(Clone)]
pub struct TlsIdentity {
    cert: CertificateDer<'static>,
    config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TlsIdentity(pin {})", pin_hex(&self.pin()))
    }
}

impl TlsIdentity {
    /// A fresh self-signed certificate (rcgen; the names do not matter, clients pin it).
    pub fn generate() -> Result<TlsIdentity, String> {
        let ck = rcgen::generate_simple_self_signed(vec!["sucld".to_string(), "localhost".to_string()])
            .map_err(|e| format!("generating a certificate: {e}"))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.key_pair.serialize_der()));
        TlsIdentity::from_der(ck.cert.der().clone(), key)
    }

    fn from_der(cert: CertificateDer<'static>, key: PrivateKeyDer<'static>) -> Result<TlsIdentity, String> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key.clone_key())
            .map_err(|e| format!("the certificate and key do not make a TLS identity: {e}"))?;
        // One session ticket per handshake (rustls sends two by default): a reconnect uses one
        // and receives the next, and the server makes it between the client's Finished and
        // the client's first frame — on the critical path of every re-attach.
        config.send_tls13_tickets = 1;
        Ok(TlsIdentity { cert, config: Arc::new(config) })
    }

    /// Reads a PEM certificate and PEM private key.
    pub fn load(cert: &Path, key: &Path) -> Result<TlsIdentity, String> {
        use rustls::pki_types::pem::PemObject;
        let c = CertificateDer::from_pem_file(cert).map_err(|e| format!("reading the certificate {}: {e}", cert.display()))?;
        let k = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("reading the private key {}: {e}", key.display()))?;
        TlsIdentity::from_der(c, k)
    }

    /// Loads `DIR/cert.pem` and `DIR/key.pem`, generating and writing them (the key with mode
    /// 0600) when neither exists.
    pub fn load_or_generate(dir: &Path) -> Result<TlsIdentity, String> {
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        if cert.exists() || key.exists() {
            return TlsIdentity::load(&cert, &key);
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let ck = rcgen::generate_simple_self_signed(vec!["sucld".to_string(), "localhost".to_string()])
            .map_err(|e| format!("generating a certificate: {e}"))?;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&key)
            .map_err(|e| format!("creating {}: {e}", key.display()))?;
        f.write_all(ck.key_pair.serialize_pem().as_bytes()).map_err(|e| format!("writing {}: {e}", key.display()))?;
        std::fs::write(&cert, ck.cert.pem()).map_err(|e| format!("writing {}: {e}", cert.display()))?;
        TlsIdentity::load(&cert, &key)
    }

    /// The pin clients use to trust this identity.
    pub fn pin(&self) -> Pin {
        pin_of(&self.cert)
    }

    /// The certificate in PEM.
    pub fn cert_pem(&self) -> String {
        use std::fmt::Write;
        let b64 = base64_encode(&self.cert);
        let mut s = String::from("-----BEGIN CERTIFICATE-----\n");
        for line in b64.as_bytes().chunks(64) {
            let _ = writeln!(s, "{}", std::str::from_utf8(line).unwrap_or_default());
        }
        s.push_str("-----END CERTIFICATE-----\n");
        s
    }
}

fn base64_encode(b: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut s = String::with_capacity(b.len().div_ceil(3) * 4);
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                s.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                s.push('=');
            }
        }
    }
    s
}

/// Trusts exactly the certificates whose SHA-256 is in the list (names are not checked: a pin
/// names one certificate).
#[derive(Debug)]
struct PinVerifier {
    pins: Vec<Pin>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let pin = pin_of(end_entity);
        if self.pins.contains(&pin) {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(format!("the server's certificate (sha256 {}) is not pinned", pin_hex(&pin))))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// How a client (or a peer) secures a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tls {
    /// Plain TCP (only with a daemon started with `--no-tls`).
    Off,
    /// TLS, trusting the certificates with these SHA-256 pins.
    Pinned(Vec<Pin>),
}

/// The client configuration that trusts `pins`, one per set of pins for the life of the
/// process: its session store is what lets a reconnect to the same server *resume* its TLS
/// session (an abbreviated handshake: no certificate, no signature) instead of a full one.
fn client_config(pins: &[Pin]) -> Arc<rustls::ClientConfig> {
    static CONFIGS: Mutex<Vec<(Vec<Pin>, Arc<rustls::ClientConfig>)>> = Mutex::new(Vec::new());
    let mut configs = lock(&CONFIGS);
    if let Some((_, c)) = configs.iter().find(|(p, _)| p == pins) {
        return c.clone();
    }
    let c = new_client_config(pins);
    if configs.len() >= 1024 {
        configs.remove(0); // a process that trusts ever new servers keeps a bounded list
    }
    configs.push((pins.to_vec(), c.clone()));
    c
}

fn new_client_config(pins: &[Pin]) -> Arc<rustls::ClientConfig> {
    let provider = provider();
    let verifier = Arc::new(PinVerifier { pins: pins.to_vec(), provider: provider.clone() });
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Arc::new(cfg)
}

struct TlsSide {
    conn: Mutex<TlsState>,
}

/// A TLS connection and the socket bytes read for it but not yet fed to it: rustls asks for
/// at most 4 KiB per read, so reads from the socket go through this buffer (one system call
/// per buffer's worth instead of one per 4 KiB).
struct TlsState {
    conn: rustls::Connection,
    rbuf: Vec<u8>,
    rpos: usize,
    rlen: usize,
}

/// The read buffer's first size (two whole TLS records): a link that carries small frames
/// (a client's commands, a re-attach) never needs more, and a new link costs no large zeroed
/// allocation.
const TLS_READ_FIRST: usize = 34 << 10;
/// The read buffer's largest size: a read that fills the buffer (bulk data arriving) doubles
/// it, up to this.
const TLS_READ_BUFFER: usize = 256 << 10;

/// The socket as rustls reads it: through the link's read buffer.
struct Buffered<'a> {
    sock: &'a TcpStream,
    buf: &'a mut Vec<u8>,
    pos: &'a mut usize,
    len: &'a mut usize,
}

impl Read for Buffered<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if *self.pos == *self.len {
            if self.buf.is_empty() {
                self.buf.resize(TLS_READ_FIRST, 0);
            }
            let n = (&mut &*self.sock).read(self.buf)?;
            *self.pos = 0;
            *self.len = n;
            if n == 0 {
                return Ok(0);
            }
            if n == self.buf.len() && n < TLS_READ_BUFFER {
                self.buf.resize((2 * n).min(TLS_READ_BUFFER), 0); // keeps the bytes just read
            }
        }
        let n = out.len().min(*self.len - *self.pos);
        out[..n].copy_from_slice(&self.buf[*self.pos..*self.pos + n]);
        *self.pos += n;
        Ok(n)
    }
}

struct Inner {
    sock: TcpStream,
    tls: Option<TlsSide>,
    read_timeout: Mutex<Option<Duration>>,
    /// How long a write may wait for room without any byte going out.
    write_timeout: Mutex<Option<Duration>>,
}

/// One connection, plain or TLS; clones share it (one reader and any number of writers).
#[derive(Clone)]
pub struct Link {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn tls_err(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

/// Waits until `fd` is readable (`POLLIN`) or writable (`POLLOUT`), or `timeout` passes.
fn wait_fd(sock: &TcpStream, events: i16, timeout: Option<Duration>) -> io::Result<bool> {
    let mut p = libc::pollfd { fd: sock.as_raw_fd(), events, revents: 0 };
    let ms = timeout.map(|t| t.as_millis().clamp(1, i32::MAX as u128) as i32).unwrap_or(-1);
    loop {
        // SAFETY: `p` is one valid pollfd that lives across the call; nfds is 1.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(r > 0);
    }
}

impl Link {
    /// A plain TCP link.
    pub fn plain(sock: TcpStream) -> Link {
        Link { inner: Arc::new(Inner { sock, tls: None, read_timeout: Mutex::new(None), write_timeout: Mutex::new(None) }) }
    }

    /// The client side of a TLS link over `sock` that trusts `pins`; the handshake finishes
    /// within `timeout`.
    pub fn tls_client(sock: TcpStream, pins: &[Pin], timeout: Duration) -> io::Result<Link> {
        if pins.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "TLS is on but no server certificate is pinned (set a pin or certificate file for this server, or turn TLS off on both sides)",
            ));
        }
        let name = ServerName::try_from("sucld").expect("a valid DNS name");
        let conn = rustls::ClientConnection::new(client_config(pins), name).map_err(tls_err)?;
        Link::handshake(sock, rustls::Connection::Client(conn), timeout)
    }

    /// The server side of a TLS link over `sock`.
    pub fn tls_server(sock: TcpStream, id: &TlsIdentity, timeout: Duration) -> io::Result<Link> {
        let conn = rustls::ServerConnection::new(id.config.clone()).map_err(tls_err)?;
        Link::handshake(sock, rustls::Connection::Server(conn), timeout)
    }

    /// Runs the handshake on the (from now on non-blocking) socket within `timeout`. Its last
    /// records (the client's Finished; the server's session ticket) are not sent here: they go
    /// out with the first frame written on the link, in the same segment (the protocol always
    /// has the client write first, and the server answer it).
    fn handshake(sock: TcpStream, mut conn: rustls::Connection, timeout: Duration) -> io::Result<Link> {
        let deadline = Instant::now() + timeout;
        sock.set_nonblocking(true)?;
        let wait = |events: i16| -> io::Result<()> {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"));
            }
            wait_fd(&sock, events, Some(left)).map(|_| ())
        };
        while conn.is_handshaking() {
            while conn.wants_write() {
                match conn.write_tls(&mut &sock) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(libc::POLLOUT)?,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            match conn.read_tls(&mut &sock) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection closed during the TLS handshake")),
                Ok(_) => {
                    if let Err(e) = conn.process_new_packets() {
                        let _ = conn.write_tls(&mut &sock); // the alert that says why, if it fits
                        if matches!((&conn, &e), (rustls::Connection::Client(_), rustls::Error::InvalidMessage(_))) {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!("TLS: {e}: the server did not answer in TLS (a daemon started with --no-tls needs clients with TLS off: SUCL_REMOTE_TLS=off)"),
                            ));
                        }
                        return Err(tls_err(e));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait(libc::POLLIN)?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        conn.set_buffer_limit(None);
        let state = TlsState { conn, rbuf: Vec::new(), rpos: 0, rlen: 0 };
        Ok(Link {
            inner: Arc::new(Inner {
                sock,
                tls: Some(TlsSide { conn: Mutex::new(state) }),
                read_timeout: Mutex::new(None),
                write_timeout: Mutex::new(None),
            }),
        })
    }

    /// The pin of the certificate the other side presented (TLS client links only).
    pub fn peer_pin(&self) -> Option<Pin> {
        let t = self.inner.tls.as_ref()?;
        let c = lock(&t.conn);
        c.conn.peer_certificates().and_then(|certs| certs.first()).map(|c| pin_of(c))
    }

    /// A value only the two ends of this TLS 1.3 connection can compute: an exporter value
    /// (RFC 8446 §7.5), derived from both sides' handshake randomness and key exchange. A
    /// proof that covers it cannot be replayed on any other connection. `None` on plain TCP
    /// (and on TLS 1.2, whose exporter is not bound to one connection without extensions).
    pub fn channel_binding(&self) -> Option<[u8; 32]> {
        let t = self.inner.tls.as_ref()?;
        let c = lock(&t.conn);
        if c.conn.protocol_version() != Some(rustls::ProtocolVersion::TLSv1_3) {
            return None;
        }
        c.conn.export_keying_material([0u8; 32], b"EXPORTER-sucl-channel-binding", None).ok()
    }

    /// Whether the TLS handshake resumed an earlier session (no certificate, no signature).
    pub fn resumed(&self) -> bool {
        self.inner.tls.as_ref().is_some_and(|t| lock(&t.conn).conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed))
    }

    /// Whether two handles are the same connection.
    pub fn same(&self, other: &Link) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether the link is encrypted.
    pub fn is_tls(&self) -> bool {
        self.inner.tls.is_some()
    }

    /// Another handle on the same connection.
    pub fn try_clone(&self) -> io::Result<Link> {
        Ok(self.clone())
    }

    /// Closes both directions (wakes a blocked reader and writers).
    pub fn shutdown(&self) {
        let _ = self.inner.sock.shutdown(Shutdown::Both);
    }

    /// The remote address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.sock.peer_addr()
    }

    /// Bounds each read (`None`: reads wait for ever).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        *lock(&self.inner.read_timeout) = t;
        if self.inner.tls.is_none() {
            self.inner.sock.set_read_timeout(t)?;
        }
        Ok(())
    }

    /// Bounds how long a write waits while no byte can go out (`None`: for ever); a write
    /// that waits longer fails with [`io::ErrorKind::TimedOut`] (plain TCP: `WouldBlock`),
    /// leaving the link unusable.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        *lock(&self.inner.write_timeout) = t;
        if self.inner.tls.is_none() {
            self.inner.sock.set_write_timeout(t)?;
        }
        Ok(())
    }

    /// Flushes encrypted records without blocking; `Ok(true)` once nothing is left.
    fn flush_tls(sock: &TcpStream, conn: &mut rustls::Connection) -> io::Result<bool> {
        while conn.wants_write() {
            match conn.write_tls(&mut &*sock) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    fn tls_read(&self, t: &TlsSide, buf: &mut [u8]) -> io::Result<usize> {
        let timeout = *lock(&self.inner.read_timeout);
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            {
                let mut g = lock(&t.conn);
                let st = &mut *g;
                match st.conn.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                let mut from = Buffered { sock: &self.inner.sock, buf: &mut st.rbuf, pos: &mut st.rpos, len: &mut st.rlen };
                match st.conn.read_tls(&mut from) {
                    Ok(0) => return Ok(0),
                    Ok(_) => {
                        // Records already waiting to go (the handshake's last ones, or a writer's
                        // that is waiting for room) go with the next write; what reading
                        // produces (alerts, key updates) goes now.
                        let waiting = st.conn.wants_write();
                        st.conn.process_new_packets().map_err(tls_err)?;
                        if !waiting {
                            let _ = Link::flush_tls(&self.inner.sock, &mut st.conn);
                        }
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
            let left = match deadline {
                Some(d) => {
                    let l = d.saturating_duration_since(Instant::now());
                    if l.is_zero() {
                        return Err(io::Error::new(io::ErrorKind::WouldBlock, "read timed out"));
                    }
                    Some(l)
                }
                None => None,
            };
            wait_fd(&self.inner.sock, libc::POLLIN, left)?;
        }
    }

    fn tls_write_all(&self, t: &TlsSide, parts: &[&[u8]]) -> io::Result<()> {
        let mut c = lock(&t.conn);
        let mut parts = Parts::new(parts);
        while !parts.is_empty() {
            // One vectored write: the parts share TLS records (a frame's header does not make
            // a record of its own).
            let n = c.conn.writer().write_vectored(&parts.slices()[..parts.count()])?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "TLS would not take more data"));
            }
            parts.advance(n);
        }
        loop {
            if Link::flush_tls(&self.inner.sock, &mut c.conn)? {
                return Ok(());
            }
            drop(c);
            let timeout = *lock(&self.inner.write_timeout);
            if !wait_fd(&self.inner.sock, libc::POLLOUT, timeout)? {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no room to write within the write timeout"));
            }
            c = lock(&t.conn);
        }
    }

    fn plain_write_all(&self, parts: &[&[u8]]) -> io::Result<()> {
        let mut parts = Parts::new(parts);
        while !parts.is_empty() {
            match (&self.inner.sock).write_vectored(&parts.slices()[..parts.count()]) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "the connection took no more data")),
                Ok(n) => parts.advance(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Queues `bytes` to go out with the next write on this link, in the same segment (an
    /// answer that another answer follows at once); on plain TCP, writes them now. Whoever
    /// calls this writes again (or closes the link) without waiting to read first.
    pub fn write_deferred(&self, bytes: &[u8]) -> io::Result<()> {
        match &self.inner.tls {
            None => self.plain_write_all(&[bytes]),
            Some(t) => lock(&t.conn).conn.writer().write_all(bytes),
        }
    }

    /// Whether decrypted bytes are waiting to be read (TLS links; plain ones say `false`): the
    /// peer sent more than what was read so far without waiting for an answer.
    pub fn has_buffered_input(&self) -> bool {
        let Some(t) = &self.inner.tls else { return false };
        lock(&t.conn).conn.process_new_packets().is_ok_and(|io| io.plaintext_bytes_to_read() > 0)
    }

    /// Writes `parts` one after the other as one write (a frame's header and its data from
    /// wherever they lie, without first copying them together).
    pub fn write_parts(&self, parts: &[&[u8]]) -> io::Result<()> {
        match &self.inner.tls {
            None => self.plain_write_all(parts),
            Some(t) => self.tls_write_all(t, parts),
        }
    }
}

impl Read for Link {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.inner.tls {
            None => (&self.inner.sock).read(buf),
            Some(t) => self.tls_read(t, buf),
        }
    }
}

impl Write for Link {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match &self.inner.tls {
            None => (&self.inner.sock).write_all(buf),
            Some(t) => self.tls_write_all(t, &[buf]),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Up to [`MAX_PARTS`] byte slices written in order, with what was already written cut off
/// the front (kept on the stack: no allocation per write).
struct Parts<'a> {
    parts: [&'a [u8]; MAX_PARTS],
    first: usize,
}

/// The most slices one [`Link::write_parts`] takes.
pub const MAX_PARTS: usize = 8;

impl<'a> Parts<'a> {
    fn new(parts: &[&'a [u8]]) -> Parts<'a> {
        assert!(parts.len() <= MAX_PARTS, "at most {MAX_PARTS} parts per write");
        let mut p = Parts { parts: [&[]; MAX_PARTS], first: MAX_PARTS - parts.len() };
        p.parts[p.first..].copy_from_slice(parts);
        p.skip_empty();
        p
    }
    fn skip_empty(&mut self) {
        while self.first < MAX_PARTS && self.parts[self.first].is_empty() {
            self.first += 1;
        }
    }
    fn is_empty(&self) -> bool {
        self.first == MAX_PARTS
    }
    fn slices(&self) -> [io::IoSlice<'a>; MAX_PARTS] {
        let mut out = [io::IoSlice::new(&[]); MAX_PARTS];
        for (o, p) in out.iter_mut().zip(&self.parts[self.first..]) {
            *o = io::IoSlice::new(p);
        }
        out
    }
    fn count(&self) -> usize {
        MAX_PARTS - self.first
    }
    fn advance(&mut self, mut n: usize) {
        while n > 0 && !self.is_empty() {
            let p = self.parts[self.first];
            let k = n.min(p.len());
            self.parts[self.first] = &p[k..];
            n -= k;
            self.skip_empty();
        }
    }
}

/// Connects to `addr` within `timeout` with `TCP_NODELAY`, then secures the link as `tls` says
/// (the TLS handshake's last flight goes out with the first write: write before reading).
pub fn connect(addr: &str, tls: &Tls, timeout: Duration) -> io::Result<Link> {
    use std::net::ToSocketAddrs;
    let a = addr.to_socket_addrs()?.next().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address"))?;
    let s = TcpStream::connect_timeout(&a, timeout.max(Duration::from_millis(1)))?;
    s.set_nodelay(true)?;
    match tls {
        Tls::Off => Ok(Link::plain(s)),
        Tls::Pinned(pins) => Link::tls_client(s, pins, timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aes_128_gcm_is_offered_first_and_the_others_stay() {
        let suites: Vec<_> = provider().cipher_suites.iter().map(|s| s.suite()).collect();
        assert_eq!(suites[0], rustls::CipherSuite::TLS13_AES_128_GCM_SHA256, "{suites:?}");
        assert!(suites.contains(&rustls::CipherSuite::TLS13_AES_256_GCM_SHA384), "{suites:?}");
        assert_eq!(suites.len(), rustls::crypto::ring::default_provider().cipher_suites.len());
    }

    #[test]
    fn a_key_pair_made_ahead_serves_one_handshake_of_the_process_that_made_it() {
        let group = KxAhead {
            inner: rustls::crypto::ring::kx_group::X25519,
            ready: Mutex::new(Vec::new()),
            wanted: std::sync::Condvar::new(),
            refiller: std::sync::Once::new(),
        };
        let me = std::process::id();
        let made = |pid: u32| {
            let kx = group.inner.start().unwrap();
            let public = kx.pub_key().to_vec();
            lock(&group.ready).push((pid, kx));
            public
        };
        // Made here: taken as it is, once.
        let ours = made(me);
        assert_eq!(group.take(me).unwrap().pub_key(), &ours[..]);
        assert!(lock(&group.ready).is_empty());
        // Made by another process (this one's parent before a fork): dropped, a fresh one made.
        let theirs = made(me.wrapping_add(1));
        let fresh = group.take(me).unwrap();
        assert_ne!(fresh.pub_key(), &theirs[..]);
        assert!(lock(&group.ready).is_empty(), "the other process's pair is gone");
        // Each handshake gets its own pair; one made on the spot completes an exchange.
        let other = group.take(me).unwrap();
        assert_ne!(other.pub_key(), fresh.pub_key());
        let (a, b) = (fresh.pub_key().to_vec(), other.pub_key().to_vec());
        assert_eq!(fresh.complete(&b).unwrap().secret_bytes(), other.complete(&a).unwrap().secret_bytes());
    }

    #[test]
    fn a_pinned_tls_link_carries_bytes_both_ways_and_an_unpinned_one_is_refused() {
        let id = TlsIdentity::generate().unwrap();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let id2 = id.clone();
        let server = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let mut link = Link::tls_server(s, &id2, Duration::from_secs(5)).unwrap();
            let mut buf = vec![0u8; 3 << 20];
            link.read_exact(&mut buf).unwrap();
            link.write_all(&buf).unwrap();
            let (s, _) = l.accept().unwrap();
            assert!(Link::tls_server(s, &id2, Duration::from_secs(5)).is_err());
        });
        let mut c = connect(&addr, &Tls::Pinned(vec![id.pin()]), Duration::from_secs(5)).unwrap();
        let data: Vec<u8> = (0..3u32 << 20).map(|i| (i * 7) as u8).collect();
        let mut w = c.clone();
        let d2 = data.clone();
        let writer = std::thread::spawn(move || w.write_all(&d2).unwrap());
        let mut back = vec![0u8; data.len()];
        c.read_exact(&mut back).unwrap();
        writer.join().unwrap();
        assert_eq!(back, data);
        let e = connect(&addr, &Tls::Pinned(vec![[7; 32]]), Duration::from_secs(5)).err().expect("an unpinned server");
        assert!(e.to_string().contains("is not pinned"), "{e}");
        server.join().unwrap();
    }
}
