//! Accepting connections: the pool of threads that wait in `accept`, and the handshake that
//! makes a connection a session's, or a peer link.

use super::mesh::*;
use super::session::*;
use super::state::*;
use crate::auth::{random, Nonces};
use crate::transport::Link;
use crate::wire::{feature, read_frame, write_frame, DeviceKind, Frame, ReadError, HANDSHAKE_MAX_FRAME, MIN_MAX_FRAME, VERSION};
use std::io::{self};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Threads kept waiting in `accept`: one takes the next connection while another may still be
/// on its way back from the connection it served (a reconnect meets one waiting).
pub(super) const SPARE_ACCEPTORS: usize = 2;

/// Starts one more thread waiting in `accept`.
pub(super) fn start_acceptor(shared: &Arc<Shared>) -> io::Result<()> {
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
pub(super) struct Leaving<'a>(&'a Shared);

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        lock(&self.0.acceptors).live -= 1;
        self.0.acceptors_cv.notify_all();
    }
}

/// One thread of the accept pool: accepts a connection and serves it; then waits for the next
/// one unless [`SPARE_ACCEPTORS`] threads wait already (then it ends).
pub(super) fn acceptor(shared: &Arc<Shared>) {
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

/// A connection in its handshake, counted and given a deadline while this lives.
pub(super) struct Handshaking<'a> {
    shared: &'a Shared,
    number: u64,
}

impl<'a> Handshaking<'a> {
    /// Counts connection `number` in, unless [`DaemonConfig::max_handshakes`] are under way.
    fn begin(shared: &'a Shared, number: u64) -> Option<Handshaking<'a>> {
        let mut h = lock(&shared.handshakes);
        if h.len() >= shared.cfg.max_handshakes {
            return None;
        }
        h.insert(number, Instant::now() + shared.cfg.handshake_timeout);
        Some(Handshaking { shared, number })
    }
}

impl Drop for Handshaking<'_> {
    fn drop(&mut self) {
        lock(&self.shared.handshakes).remove(&self.number);
    }
}

/// Cuts every connection whose handshake passed its deadline (its thread then ends it).
pub(super) fn cut_late_handshakes(shared: &Shared) {
    let now = Instant::now();
    let late: Vec<u64> = lock(&shared.handshakes).iter().filter(|(_, d)| **d <= now).map(|(n, _)| *n).collect();
    if late.is_empty() {
        return;
    }
    let conns = lock(&shared.conns);
    for n in late {
        if let Some(c) = conns.get(&n) {
            debug!(peer = ?c.peer_addr().ok(), "handshake not done within {:?}: connection cut", shared.cfg.handshake_timeout);
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

/// Serves one accepted connection to its end.
pub(super) fn serve_connection(shared: &Arc<Shared>, conn: TcpStream) {
    let number = shared.next_conn.fetch_add(1, Ordering::Relaxed);
    let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let Some(handshaking) = Handshaking::begin(shared, number) else {
        warn!(%peer, "{} connections are in their handshake (the limit): this one is closed", shared.cfg.max_handshakes);
        let _ = conn.shutdown(Shutdown::Both);
        return;
    };
    if let Ok(c) = conn.try_clone() {
        lock(&shared.conns).insert(number, c);
    }
    if shared.stop.load(Ordering::SeqCst) {
        lock(&shared.conns).remove(&number); // shutdown has begun: it closed the others already
        return;
    }
    let closer = conn.try_clone();
    match serve(shared, conn, handshaking) {
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

pub(super) fn handshake_err(e: ReadError) -> io::Error {
    match e {
        ReadError::Io(e) => e,
        ReadError::Wire(w) => io::Error::new(io::ErrorKind::InvalidData, w.to_string()),
    }
}

/// TLS (unless off), the handshake, then the command loop of one connection (or the receiving
/// loop of a peer link).
pub(super) fn serve(shared: &Arc<Shared>, sock: TcpStream, handshaking: Handshaking) -> io::Result<()> {
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
        Ok(other) => return Err(refuse(&mut conn, &mut out, format!("expected a hello, got {}", other.name()))),
        Err(e) if e.is_tls_record() => {
            let why = "the client speaks TLS; this daemon was started without it (--no-tls): connect with TLS off".to_string();
            return Err(refuse(&mut conn, &mut out, why));
        }
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
            drop(handshaking);
            conn.set_read_timeout(None)?;
            lock(&s.remote).ins.push(conn.clone());
            let result = peer_receive(shared, &s, from, conn.clone(), max_frame);
            lock(&s.remote).ins.retain(|l| !l.same(&conn)); // a re-made link must not pile up sockets
            return result;
        }
        Ok(other) => return Err(refuse(&mut conn, &mut out, format!("expected open or attach, got {}", other.name()))),
        Err(ReadError::Wire(w)) => return Err(refuse(&mut conn, &mut out, format!("malformed handshake: {w}"))),
        Err(e) => return Err(handshake_err(e)),
    };
    drop(handshaking);
    conn.set_read_timeout(None)?;
    let generation = lock(&session.binding).generation;
    let result = command_loop(shared, &session, &mut conn, generation);
    let mut b = lock(&session.binding);
    if b.generation == generation {
        b.conn = None;
        b.detached_since = Some(Instant::now());
        debug!(session = %hex(&session.id), "detached; waiting for the client to re-attach");
        drop(b);
        // An idle executor ends now (under the state lock, so it cannot miss this).
        drop(lock(&session.state));
        session.exec_cv.notify_all();
    }
    result
}
