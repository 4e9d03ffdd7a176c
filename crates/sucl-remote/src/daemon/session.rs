//! Sessions: opening one, re-attaching to one, and receiving its commands in order.

use super::exec::*;
use super::links::*;
use super::objects::*;
use super::state::*;
use crate::auth::{random, Nonces};
use crate::transport::Link;
use crate::wire::{read_frame, write_frame, Frame, ReadError};
use std::io::{self, BufReader, Write};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};
use tracing::{debug, info};

/// Bytes of retained replies gathered into one write when a client re-attaches.
pub(super) const RESEND_BATCH: usize = 64 << 10;

pub(super) fn open_session(
    shared: &Arc<Shared>,
    conn: &mut Link,
    out: &mut Vec<u8>,
    nonces: &Nonces,
    max_frame: u32,
    features: u64,
) -> io::Result<Arc<Session>> {
    let id: [u8; 16] = random();
    let s = Arc::new(Session {
        id,
        secret: shared.cfg.token.session_secret(nonces, &id),
        max_frame,
        features,
        binding: Mutex::new(Binding { generation: 1, conn: Some(conn.clone()), detached_since: None }),
        state: Mutex::new(SessionState::default()),
        exec_cv: Condvar::new(),
        objects: Mutex::new(Objects::default()),
        remote: Mutex::new(RemoteState::default()),
        remote_cv: Condvar::new(),
        closed: AtomicBool::new(false),
        retiring: AtomicBool::new(false),
        peer_frames: AtomicU64::new(0),
        notices: Mutex::new(None),
    });
    if let Err(why) = admit(shared, &s) {
        return Err(refuse(conn, out, why)); // nothing of the session started yet
    }
    info!(session = %hex(&id), peer = ?conn.peer_addr().ok(), "session opened");
    let mac = shared.cfg.token.opened_proof(nonces, &id);
    write_frame(conn, out, &Frame::Opened { session: id, max_inflight: shared.cfg.limits.max_inflight, mac })?;
    Ok(s)
}

/// Adds `s` to the daemon's sessions within [`DaemonConfig::max_sessions`]: at the limit, the
/// session detached longest is freed to make room (its client is most likely gone); with none
/// detached, `s` is refused.
fn admit(shared: &Arc<Shared>, s: &Arc<Session>) -> Result<(), String> {
    let mut sessions = lock(&shared.sessions);
    let mut evicted = None;
    if sessions.len() >= shared.cfg.max_sessions {
        let detached = |x: &Session| {
            let b = lock(&x.binding);
            b.detached_since.filter(|_| b.conn.is_none())
        };
        let oldest = sessions.iter().filter_map(|(id, x)| detached(x).map(|since| (since, *id))).min();
        let Some((_, id)) = oldest else {
            let n = shared.cfg.max_sessions;
            return Err(format!("this server holds {n} sessions, all attached: its limit (sucld --max-sessions raises it)"));
        };
        evicted = sessions.remove(&id);
    }
    sessions.insert(s.id, s.clone());
    drop(sessions);
    if let Some(old) = evicted {
        info!(session = %hex(&old.id), "session freed before its reconnect window ended: the daemon holds {} sessions (its limit)", shared.cfg.max_sessions);
        super::retire(shared, old);
    }
    Ok(())
}

/// Refuses the handshake on `conn`, saying why, and closes it.
pub(super) fn refuse(conn: &mut Link, buf: &mut Vec<u8>, reason: String) -> io::Error {
    let _ = write_frame(conn, buf, &Frame::Refused { reason: reason.clone() });
    conn.shutdown();
    io::Error::new(io::ErrorKind::PermissionDenied, reason)
}

/// Binds `conn` to `s` (cutting off the connection it had), says the last sequence number
/// received (with `proof` of it), then re-sends the replies the client has not received.
pub(super) fn attach_session(
    s: &Session,
    conn: &mut Link,
    out: &mut Vec<u8>,
    last_reply: u64,
    proof: impl Fn(u64) -> crate::auth::Tag,
) -> io::Result<()> {
    {
        // Cut the old connection first (without the state lock, which its threads may hold
        // while blocked on it).
        let mut b = lock(&s.binding);
        if let Some(old) = b.conn.take() {
            old.shutdown();
        }
        b.generation += 1;
        b.detached_since = None;
    }
    // Under the state lock no reply is written or retained, so the attach answer comes first
    // and every retained reply follows it in order.
    let mut st = lock(&s.state);
    lock(&s.binding).conn = Some(conn.clone());
    forget_replies(&mut st, last_reply);
    let last_received = st.last_received;
    // The answer and the retained replies in as few writes as they fit (one, usually).
    out.clear();
    Frame::Attached { last_received, mac: proof(last_received) }.encode_into(out);
    for (_, reply) in &st.retained {
        if out.len() + reply.len() > RESEND_BATCH {
            conn.write_all(out)?;
            out.clear();
            if reply.len() > RESEND_BATCH {
                conn.write_parts(&reply.parts())?; // a large reply goes as it is, not copied
                continue;
            }
        }
        reply.append_to(out);
    }
    if !out.is_empty() {
        conn.write_all(out)?;
    }
    info!(session = %hex(&s.id), last_received, resent = st.retained.len(), "session re-attached");
    Ok(())
}

pub(super) fn fatal(conn: &mut Link, reason: String) -> io::Error {
    let mut out = Vec::new();
    let _ = write_frame(conn, &mut out, &Frame::Fatal { reason: reason.clone() });
    conn.shutdown();
    io::Error::new(io::ErrorKind::InvalidData, reason)
}

/// Receives commands: each is checked (sequence, in-flight limit), queued, and — unless
/// another thread is already running the queue — run right here, so that a command that does
/// not wait for anything costs no thread switch.
pub(super) fn command_loop(shared: &Arc<Shared>, s: &Arc<Session>, conn: &mut Link, generation: u64) -> io::Result<()> {
    let mut reader = BufReader::with_capacity(1 << 16, conn.clone());
    let mut buf = Vec::new();
    loop {
        let frame = match read_frame(&mut reader, &mut buf, s.max_frame) {
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
            other => return Err(fatal(conn, format!("expected a command, got {}", other.name()))),
        };
        forget_replies(&mut st, ack);
        if seq <= st.last_received {
            debug!(seq, "duplicate command ignored");
            continue;
        }
        if seq != st.last_received + 1 {
            return Err(fatal(conn, format!("command {seq} after {}: sequence numbers must not skip", st.last_received)));
        }
        if st.retained.len() + st.pending.len() >= shared.cfg.limits.max_inflight as usize {
            let n = shared.cfg.limits.max_inflight;
            return Err(fatal(conn, format!("more than {n} commands in flight (the session's limit)")));
        }
        st.last_received = seq;
        st.pending.push_back((seq, cmd));
        if st.draining {
            continue;
        }
        st.draining = true;
        drop(st);
        drain(shared, s, false);
    }
}

pub(super) fn forget_replies(st: &mut SessionState, upto: u64) {
    while st.retained.front().is_some_and(|(seq, _)| *seq <= upto) {
        st.retained.pop_front();
    }
}
