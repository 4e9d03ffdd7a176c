//! The TCP backend: a full mesh of persistent non-blocking connections, framed by the core wire
//! header, with the core engine's matching and the generic collective algorithms. Each
//! connection reads a little ahead (a small frame in one syscall), and with several peers a wait
//! asks poll(2) which sockets have bytes before reading any. A connection joins the mesh only
//! after proving that it knows the job secret (the `tcp_auth` module).

use crate::tcp_auth;
use crate::HostConfig;
use std::io::{self, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};
use sucl_core::algorithms::{self, AlgoConfig};
use sucl_core::backend::{Backend, CollDesc, CollOp};
use sucl_core::engine::{Channel, Engine};
use sucl_core::store::{JobSecret, StoreClient, HANDSHAKE_TIMEOUT};
use sucl_core::{AbortState, Error, Result};

/// Default of [`crate::HostConfig::tcp_read_ahead`]: a small frame (header and payload) arrives
/// in one `recv` rather than two, as Open MPI's tcp reads into its endpoint cache. Small,
/// because read-ahead bytes of a large payload are copied once more on their way out.
pub const DEFAULT_READ_AHEAD: usize = 8 << 10;

/// Largest read-ahead a connection takes (it is allocated per connection).
pub const MAX_READ_AHEAD: usize = 1 << 20;

/// A non-blocking TCP stream as an engine channel, with a small read-ahead buffer.
///
/// A read shorter than the read-ahead fills the buffer with whatever the socket has (one
/// syscall for the 40-byte header the engine asks for and the small payload behind it) and
/// serves later reads from it; a longer read with the buffer empty goes straight into the
/// caller's memory. A read returns 0 only with the buffer empty, so the engine, which drains a
/// channel until it reads 0 before it blocks in poll(2), never sleeps on bytes it already has.
pub struct TcpChannel {
    stream: TcpStream,
    ahead: Box<[u8]>,
    /// The unread bytes of `ahead` are `ahead[start..end]`.
    start: usize,
    end: usize,
    /// The last socket read filled less than it was offered, so the socket was empty then: the
    /// next read that would go to the socket returns 0 instead (once), which spares the engine's
    /// drain loop a syscall that almost always fails. The engine then polls the descriptor.
    drained: bool,
}

impl TcpChannel {
    /// A channel over `stream`, which must already be non-blocking, reading up to
    /// `read_ahead` bytes ahead (0: never; capped at [`MAX_READ_AHEAD`]).
    pub fn new(stream: TcpStream, read_ahead: usize) -> TcpChannel {
        let ahead = vec![0; read_ahead.min(MAX_READ_AHEAD)].into_boxed_slice();
        TcpChannel { stream, ahead, start: 0, end: 0, drained: false }
    }

    /// One non-blocking read into `buf`: `Ok(0)` when the socket has nothing now, or had less
    /// than the last read was offered (then this call skips the syscall; see `drained`).
    fn read_socket(&mut self, into_ahead: bool, buf: &mut [u8]) -> io::Result<usize> {
        if std::mem::take(&mut self.drained) {
            return Ok(0);
        }
        let buf = if into_ahead { &mut self.ahead[..] } else { buf };
        match self.stream.read(buf) {
            Ok(0) => Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                self.drained = n < buf.len();
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e),
        }
    }
}

impl Channel for TcpChannel {
    fn try_write(&mut self, parts: &[&[u8]]) -> io::Result<usize> {
        let slices: [IoSlice<'_>; 2] = [IoSlice::new(parts[0]), IoSlice::new(parts.get(1).copied().unwrap_or(&[]))];
        let n = if parts.len() == 1 { 1 } else { 2 };
        match self.stream.write_vectored(&slices[..n]) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e),
        }
    }

    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.start == self.end {
            if buf.len() >= self.ahead.len() {
                return self.read_socket(false, buf);
            }
            let got = self.read_socket(true, &mut [])?;
            (self.start, self.end) = (0, got);
        }
        let n = buf.len().min(self.end - self.start);
        buf[..n].copy_from_slice(&self.ahead[self.start..self.start + n]);
        self.start += n;
        // The rest of a large payload in this same call, straight into place: a frame past the
        // read-ahead still costs the two reads it did without one. An error waits for the next
        // call, which meets it again, so the bytes served here are not lost with it.
        let rest = &mut buf[n..];
        if self.start == self.end && rest.len() >= self.ahead.len() {
            return Ok(n + self.read_socket(false, rest).unwrap_or(0));
        }
        Ok(n)
    }

    fn raw_fd(&self) -> Option<RawFd> {
        Some(self.stream.as_raw_fd())
    }

    fn has_buffered(&self) -> bool {
        self.start < self.end
    }
}

/// Where ranks have cores of their own, a tcp wait busy-polls for `tcp_spin` before it blocks
/// in poll(2); where they do not (the host backoff does not spin), it blocks at once.
///
/// The spin must outlast the time a peer blocked in poll(2) takes to wake up: a waiter that
/// blocks sooner wakes up late, so its peers wait past their own spin, block and wake up late
/// in turn, and the ranks lock into a mode where every step of a collective costs a wake-up
/// (~100 µs on virtual machines, against ~10 µs for the step itself). With 50 µs of spin, 4
/// tcp ranks on a quiet 16-CPU machine ran 8 B–16 KiB all_reduces at ~20 µs in some runs and
/// ~200 µs in others; a spin longer than the wake-up brings a late rank's peers back in step.
fn tcp_engine(cfg: &HostConfig) -> sucl_core::engine::EngineConfig {
    let mut e = cfg.engine();
    if !e.backoff.spin.is_zero() {
        e.backoff.spin = cfg.tcp_spin;
    }
    e.backoff.yield_for = std::time::Duration::ZERO;
    e.poll_first_from = cfg.tcp_poll_first;
    e
}

fn set_buffers(s: &TcpStream, bytes: usize) -> io::Result<()> {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: setsockopt on an open socket with a pointer to a c_int of the right size.
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &v as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The TCP backend of one communicator.
pub struct TcpBackend {
    engine: Engine,
    algo: AlgoConfig,
}

fn ctx_hash(prefix: &str) -> u64 {
    prefix.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// Connections that may be in the mesh handshake at once on one listener; more are closed at
/// once (a flood of strangers costs no more than this many short-lived threads).
const MAX_PENDING_HELLOS: usize = 64;

/// Accepting connections from higher ranks: each in the handshake on a thread of its own, so
/// that a stranger that connects and stays silent holds up no rank of the job.
struct Doorman {
    listener: std::net::TcpListener,
    ends: tcp_auth::Ends,
    peers: std::ops::Range<usize>,
    secret: Arc<JobSecret>,
    wait: Duration,
    pending: Arc<std::sync::atomic::AtomicUsize>,
    /// Where a connection that passed the handshake goes, with the rank it proved to be.
    done: std::sync::mpsc::Sender<(usize, TcpStream)>,
}

impl Doorman {
    /// Takes the connections waiting on the listener (non-blocking) into the handshake.
    fn admit(&self) -> io::Result<()> {
        use std::sync::atomic::Ordering;
        loop {
            let (mut s, from) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if self.pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING_HELLOS {
                self.pending.fetch_sub(1, Ordering::AcqRel);
                tracing::warn!(%from, "tcp mesh: too many connections in the handshake; closed one");
                continue;
            }
            let (ends, peers, secret, wait) = (self.ends, self.peers.clone(), self.secret.clone(), self.wait);
            let (pending, done) = (self.pending.clone(), self.done.clone());
            let spawned = std::thread::Builder::new().name("sucl-tcp-hello".into()).spawn(move || {
                let r =
                    s.set_nonblocking(false).map_err(|e| e.to_string()).and_then(|_| tcp_auth::accept(&mut s, ends, peers, &secret, wait));
                pending.fetch_sub(1, Ordering::AcqRel);
                match r {
                    Ok(peer) => {
                        let _ = done.send((peer, s));
                    }
                    Err(why) => tracing::warn!(comm_rank = ends.acceptor, %from, %why, "tcp mesh: refused a connection"),
                }
            });
            if spawned.is_err() {
                self.pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

impl TcpBackend {
    /// Builds the mesh: every rank listens, publishes its address under `prefix` in the store,
    /// connects to lower ranks and accepts higher ones. Each connection proves in a handshake
    /// that it belongs to the job (see `tcp_auth`: it knows `secret`, the job secret
    /// the store checks) before any frame of it is read; one that fails is closed, logged and
    /// otherwise ignored, so a stranger neither joins nor disturbs the job.
    #[allow(clippy::too_many_arguments)]
    pub fn connect(
        store: &StoreClient,
        prefix: &str,
        rank: usize,
        world_ranks: Vec<usize>,
        abort: Arc<AbortState>,
        cfg: &HostConfig,
        secret: &JobSecret,
    ) -> Result<TcpBackend> {
        let n = world_ranks.len();
        let wr = world_ranks[rank];
        let io = |what: &str| {
            let what = what.to_string();
            move |e: io::Error| Error::io(wr, format!("tcp setup: {what}"), e)
        };
        let ip = store.local_ip().unwrap_or_else(|| [127, 0, 0, 1].into());
        // SUCL_SOCKET_IFNAME / SUCL_PORT_RANGE, when set, choose the address and port.
        let listener = sucl_core::bootstrap::Network::from_env()?.listen(ip).map_err(io("bind"))?;
        let addr = listener.local_addr().map_err(io("local addr"))?;
        listener.set_nonblocking(true).map_err(io("listener"))?;
        store.set(&format!("{prefix}/tcp/{rank}"), addr.to_string().as_bytes())?;
        let ctx = ctx_hash(prefix);
        let (done, arrived) = std::sync::mpsc::channel();
        let doorman = Doorman {
            listener,
            ends: tcp_auth::Ends { ctx, acceptor: rank },
            peers: rank + 1..n,
            secret: Arc::new(secret.clone()),
            wait: HANDSHAKE_TIMEOUT.min(cfg.timeout),
            pending: Default::default(),
            done,
        };
        let mut streams: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        for (j, slot) in streams.iter_mut().enumerate().take(rank) {
            let a = String::from_utf8_lossy(&store.get(&format!("{prefix}/tcp/{j}"))?).into_owned();
            let sa: SocketAddr =
                a.parse().map_err(|_| Error::Protocol { rank: wr, peer: world_ranks[j], why: format!("bad advertised address {a:?}") })?;
            let mut s = TcpStream::connect_timeout(&sa, cfg.timeout).map_err(io(&format!("connect to rank {} at {sa}", world_ranks[j])))?;
            // Higher ranks waiting meanwhile are taken into their handshake.
            doorman.admit().map_err(io("accept"))?;
            tcp_auth::connect(&mut s, tcp_auth::Ends { ctx, acceptor: j }, rank, secret, cfg.timeout).map_err(|why| Error::Protocol {
                rank: wr,
                peer: world_ranks[j],
                why: format!("tcp mesh handshake with rank {} at {sa}: {why}", world_ranks[j]),
            })?;
            *slot = Some(s);
        }
        let deadline = Instant::now() + cfg.timeout;
        let mut missing = n - 1 - rank;
        while missing > 0 {
            abort.check(wr, "tcp setup")?;
            doorman.admit().map_err(io("accept"))?;
            match arrived.try_recv() {
                Ok((peer, s)) if streams[peer].is_none() => {
                    streams[peer] = Some(s);
                    missing -= 1;
                }
                Ok((peer, _)) => tracing::warn!(rank = wr, peer, "tcp mesh: a second connection from one rank; closed it"),
                Err(_) => {
                    if Instant::now() >= deadline {
                        return Err(Error::Timeout {
                            rank: wr,
                            op: "tcp setup (waiting for higher ranks to connect)".into(),
                            after: cfg.timeout,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        let mut channels: Vec<Option<Box<dyn Channel>>> = Vec::with_capacity(n);
        for s in streams {
            match s {
                Some(s) => {
                    s.set_nodelay(true).map_err(io("nodelay"))?;
                    if cfg.tcp_sockbuf > 0 {
                        set_buffers(&s, cfg.tcp_sockbuf).map_err(io("socket buffers"))?;
                    }
                    s.set_nonblocking(true).map_err(io("nonblocking"))?;
                    channels.push(Some(Box::new(TcpChannel::new(s, cfg.tcp_read_ahead))));
                }
                None => channels.push(None),
            }
        }
        let engine = Engine::new(rank, channels, world_ranks, abort, tcp_engine(cfg));
        Ok(TcpBackend { engine, algo: cfg.algo })
    }

    /// A backend over already-connected streams (`streams[rank]` is `None`); used by tests.
    pub fn from_streams(rank: usize, streams: Vec<Option<TcpStream>>, abort: Arc<AbortState>, cfg: &HostConfig) -> io::Result<TcpBackend> {
        let n = streams.len();
        let mut channels: Vec<Option<Box<dyn Channel>>> = Vec::with_capacity(n);
        for s in streams {
            channels.push(match s {
                Some(s) => {
                    s.set_nodelay(true)?;
                    s.set_nonblocking(true)?;
                    Some(Box::new(TcpChannel::new(s, cfg.tcp_read_ahead)))
                }
                None => None,
            });
        }
        let engine = Engine::new(rank, channels, (0..n).collect(), abort, tcp_engine(cfg));
        Ok(TcpBackend { engine, algo: cfg.algo })
    }
}

impl Backend for TcpBackend {
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn rank(&self) -> usize {
        self.engine.rank()
    }
    fn size(&self) -> usize {
        self.engine.size()
    }
    sucl_core::delegate_p2p_to_engine!(engine);

    fn collective(&mut self, desc: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        if desc.op == CollOp::AllReduce && crate::tcp_pair::serves(self.engine.size(), &self.algo, desc) {
            return crate::tcp_pair::all_reduce(&mut self.engine, &self.algo, desc, send, recv);
        }
        algorithms::run(&mut self.engine, &self.algo, desc, send, recv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use sucl_core::wire::Header;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn backend(s: TcpStream) -> TcpBackend {
        let cfg = HostConfig { timeout: Duration::from_secs(5), ..Default::default() };
        TcpBackend::from_streams(0, vec![None, Some(s)], AbortState::new(), &cfg).unwrap()
    }

    fn recv_one(b: &mut TcpBackend) -> Result<usize> {
        let mut buf = [0u8; 64];
        // SAFETY: the request is waited for, or cancelled on error, before `buf` goes out of
        // scope, so the backend never writes it afterwards.
        let r = unsafe { b.post_recv(1, 5, buf.as_mut_ptr(), buf.len())? };
        b.wait(r).inspect_err(|_| b.cancel(r))
    }

    /// Reads `want` bytes from `c` with read sizes cycling through `sizes`, bounded in time.
    fn read_all(c: &mut TcpChannel, want: usize, sizes: &[usize]) -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::with_capacity(want);
        let mut k = 0;
        while got.len() < want {
            assert!(Instant::now() < deadline, "only {} of {want} bytes arrived", got.len());
            let mut buf = vec![0u8; sizes[k % sizes.len()].min(want - got.len())];
            k += 1;
            let n = c.try_read(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        got
    }

    #[test]
    fn read_ahead_keeps_every_byte_in_order() {
        let (a, mut raw) = pair();
        a.set_nonblocking(true).unwrap();
        let mut c = TcpChannel::new(a, DEFAULT_READ_AHEAD);
        // Small and large reads interleaved, so bytes are served from the read-ahead, straight
        // from the socket and from both in one call.
        let data: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        let writer = std::thread::spawn(move || {
            for part in data.chunks(7_777) {
                raw.write_all(part).unwrap();
            }
            data
        });
        let got = read_all(&mut c, 300_000, &[40, 3, DEFAULT_READ_AHEAD + 5, 100, 64 << 10, 1, 9_000]);
        let data = writer.join().unwrap();
        assert!(got == data, "bytes differ from byte {:?}", got.iter().zip(&data).position(|(x, y)| x != y));
    }

    #[test]
    fn read_ahead_bytes_come_before_the_end_of_stream() {
        let (a, mut raw) = pair();
        a.set_nonblocking(true).unwrap();
        let mut c = TcpChannel::new(a, DEFAULT_READ_AHEAD);
        raw.write_all(&[7u8; 100]).unwrap();
        drop(raw);
        // The first read takes all 100 bytes into the read-ahead; the other 60 must follow.
        assert_eq!(read_all(&mut c, 100, &[40]), vec![7u8; 100]);
        let mut one = [0u8; 1];
        let deadline = Instant::now() + Duration::from_secs(10);
        let err = loop {
            match c.try_read(&mut one) {
                Ok(0) if Instant::now() < deadline => std::thread::yield_now(),
                Ok(n) => panic!("read {n} bytes past the end of the stream"),
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn polling_first_over_several_peers_misses_no_frame() {
        // Rank 0 of 4 with poll-first on (3 peer sockets >= 2); the peers' frames arrive in an
        // order unrelated to the receives, some only while rank 0 already waits.
        let (mut raws, mut streams) = (vec![], vec![None]);
        for _ in 0..3 {
            let (a, raw) = pair();
            streams.push(Some(a));
            raws.push(raw);
        }
        let cfg = HostConfig { timeout: Duration::from_secs(5), tcp_poll_first: 2, ..Default::default() };
        let mut b = TcpBackend::from_streams(0, streams, AbortState::new(), &cfg).unwrap();
        let writer = std::thread::spawn(move || {
            for round in 0..20u8 {
                for (k, raw) in raws.iter_mut().enumerate().rev() {
                    let len = 1 + (round as usize * 37 + k * 11) % 200;
                    raw.write_all(&Header::data(round as u64, len, [0, 0]).encode()).unwrap();
                    raw.write_all(&vec![round ^ k as u8; len]).unwrap();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            raws
        });
        for round in 0..20u8 {
            for k in 0..3usize {
                let mut buf = [0u8; 256];
                // SAFETY: waited for (or cancelled on error) before `buf` goes out of scope.
                let r = unsafe { b.post_recv(k + 1, round as u64, buf.as_mut_ptr(), buf.len()).unwrap() };
                let n = b.wait(r).inspect_err(|_| b.cancel(r)).unwrap_or_else(|e| panic!("round {round} peer {}: {e}", k + 1));
                assert_eq!(n, 1 + (round as usize * 37 + k * 11) % 200);
                assert!(buf[..n].iter().all(|&x| x == round ^ k as u8), "round {round} peer {}", k + 1);
            }
        }
        drop(writer.join().unwrap());
    }

    #[test]
    fn garbage_frame_is_rejected() {
        let (a, mut raw) = pair();
        let mut b = backend(a);
        raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nxxxxxxxxxxxxxxxx").unwrap();
        let err = recv_one(&mut b).unwrap_err().to_string();
        assert!(err.contains("protocol error") && err.contains("bad magic"), "{err}");
    }

    #[test]
    fn truncated_frame_is_an_error() {
        let (a, mut raw) = pair();
        let mut b = backend(a);
        raw.write_all(&Header::data(5, 32, [0, 0]).encode()).unwrap();
        raw.write_all(&[1, 2, 3]).unwrap();
        drop(raw);
        let err = recv_one(&mut b).unwrap_err().to_string();
        assert!(err.contains("lost peer rank 1"), "{err}");
    }

    #[test]
    fn oversized_and_unknown_version_rejected() {
        let (a, mut raw) = pair();
        let mut b = backend(a);
        let mut h = Header::data(5, 8, [0, 0]).encode();
        h[4] = 99;
        raw.write_all(&h).unwrap();
        let err = recv_one(&mut b).unwrap_err().to_string();
        assert!(err.contains("unsupported wire version 99"), "{err}");

        let (a, mut raw) = pair();
        let cfg = HostConfig { timeout: Duration::from_secs(5), max_message: 1024, ..Default::default() };
        let mut b = TcpBackend::from_streams(0, vec![None, Some(a)], AbortState::new(), &cfg).unwrap();
        raw.write_all(&Header::data(5, 1 << 40, [0, 0]).encode()).unwrap();
        let err = recv_one(&mut b).unwrap_err().to_string();
        assert!(err.contains("exceeds the limit 1024"), "{err}");
    }

    #[test]
    fn message_larger_than_buffer_is_an_error() {
        let (a, mut raw) = pair();
        let mut b = backend(a);
        raw.write_all(&Header::data(5, 100, [0, 0]).encode()).unwrap();
        raw.write_all(&[0u8; 100]).unwrap();
        let err = recv_one(&mut b).unwrap_err().to_string();
        assert!(err.contains("does not fit in 64 bytes"), "{err}");
    }
}
