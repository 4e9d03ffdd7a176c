//! The peer mesh: links between the servers of one client, migrations over them and
//! completion notices.

use super::links::*;
use super::objects::*;
use super::state::*;
use super::waiters::Subscribed;
use crate::auth::{random, MeshKey, Nonces};
use crate::transport::{self, Link, Tls};
use crate::wire::{self, code, failed, read_frame, write_frame, Frame, Outcome, PeerSpec, HANDSHAKE_MAX_FRAME, VERSION};
use std::collections::{HashMap, VecDeque};
use std::io::{self, BufReader, Read, Write};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// The outgoing link to mesh member `to`, started (connected by its own thread) on first use.
pub(super) fn peer_out(shared: &Arc<Shared>, s: &Arc<Session>, r: &mut RemoteState, to: u32) -> Result<Arc<PeerOut>, String> {
    if let Some(o) = r.outs.get(&to) {
        return Ok(o.clone());
    }
    if let Some(why) = r.lost.get(&to) {
        return Err(why.clone());
    }
    let m = r.mesh.as_ref().ok_or("this session is not in a mesh (JoinMesh first)")?;
    let spec = m.peers.get(&to).ok_or_else(|| format!("mesh member {to} does not exist"))?.clone();
    let out = Arc::new(PeerOut { st: Mutex::new(OutState::default()), cv: Condvar::new(), write: Mutex::new(()) });
    let (sh, se, o2, id, key, from) = (shared.clone(), s.clone(), out.clone(), m.id, m.key.clone(), m.index);
    std::thread::Builder::new()
        .name("sucld-peer-out".into())
        .spawn(move || peer_link_loop(&sh, &se, &o2, to, &spec, id, &key, from))
        .map_err(|e| e.to_string())?;
    r.outs.insert(to, out.clone());
    Ok(out)
}

/// Keeps the link to member `to` up: connects, sends queued frames, and when the connection
/// breaks, connects again (authenticated as the first time) — until the session closes or the
/// member cannot be reached within the peer timeout (then it is lost: every wait on it fails,
/// naming it).
#[allow(clippy::too_many_arguments)]
pub(super) fn peer_link_loop(
    shared: &Arc<Shared>,
    s: &Arc<Session>,
    out: &Arc<PeerOut>,
    to: u32,
    spec: &PeerSpec,
    id: [u8; 16],
    key: &MeshKey,
    from: u32,
) {
    let mut first = true;
    let why = loop {
        let (link, max_frame) = match peer_connect(shared, spec, id, key, from, first) {
            Ok(x) => x,
            Err(why) if first => break why,
            Err(why) => break format!("the link broke and could not be made again: {why}"),
        };
        let generation = {
            let mut st = lock(&out.st);
            if st.closed {
                link.shutdown();
                break String::new();
            }
            st.generation += 1;
            st.link = Some(link.clone());
            st.max_frame = max_frame;
            st.generation
        };
        out.cv.notify_all();
        if !first {
            info!(peer = %spec.address, "peer link to mesh member {to} re-established");
        }
        watch_link(out, generation, link.clone());
        send_queued(out, generation, link.clone());
        out.broken(generation);
        if lock(&out.st).closed {
            break String::new();
        }
        debug!(peer = %spec.address, "peer link to mesh member {to} broke; reconnecting");
        link_changed(s, to);
        first = false;
    };
    if why.is_empty() || s.closed.load(Ordering::SeqCst) {
        return;
    }
    warn!(peer = %spec.address, "peer link to mesh member {to} lost: {why}");
    let why = format!("peer server {} (mesh member {to}): {why}", spec.address);
    let mut st = lock(&out.st);
    st.error = Some(why.clone());
    st.frames.clear();
    drop(st);
    out.cv.notify_all();
    mark_lost(s, to, why);
}

/// Writes the queued frames on connection `generation` until it breaks or the session closes.
pub(super) fn send_queued(out: &PeerOut, generation: u64, mut link: Link) {
    loop {
        let frame = {
            let mut st = lock(&out.st);
            loop {
                if st.closed || st.generation != generation || st.link.is_none() {
                    return;
                }
                if let Some(f) = st.frames.pop_front() {
                    break f;
                }
                st = out.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        let _w = lock(&out.write);
        if link.write_all(&frame).is_err() {
            // Goes again on the next connection (every peer frame may arrive twice).
            lock(&out.st).frames.push_front(frame);
            return;
        }
    }
}

/// The receiving end of an outgoing link sends nothing back: a read that returns means the
/// link broke (or the peer died), which starts a reconnect at once, even while nothing is
/// being sent.
pub(super) fn watch_link(out: &Arc<PeerOut>, generation: u64, mut link: Link) {
    let out = out.clone();
    let spawned = std::thread::Builder::new().name("sucld-peer-watch".into()).spawn(move || {
        let mut b = [0u8; 64];
        let _ = link.read(&mut b);
        out.broken(generation);
    });
    if let Err(e) = spawned {
        warn!("cannot watch a peer link: {e}");
    }
}

/// A link with `peer` broke or a new one opened: whatever was in flight on the old one may be
/// lost, so the waits on that peer re-send what they wait on.
pub(super) fn link_changed(s: &Session, peer: u32) {
    *lock(&s.remote).epoch.entry(peer).or_default() += 1;
    s.remote_cv.notify_all();
}

pub(super) fn mark_lost(s: &Session, peer: u32, why: String) {
    lock(&s.remote).lost.entry(peer).or_insert(why);
    s.remote_cv.notify_all();
}

/// Connects to a mesh member and proves this server holds the mesh key. The first time it
/// retries while the member has not joined the mesh yet, up to the peer timeout; when it
/// re-connects a link that broke, a refused connection or an unknown mesh means the member
/// (or its session) is gone, and ends it at once.
pub(super) fn peer_connect(
    shared: &Shared,
    spec: &PeerSpec,
    mesh: [u8; 16],
    key: &MeshKey,
    from: u32,
    first: bool,
) -> Result<(Link, u32), String> {
    let deadline = Instant::now() + shared.cfg.peer_timeout;
    let tls = if spec.pin == [0; 32] { Tls::Off } else { Tls::Pinned(vec![spec.pin]) };
    let mut pause = Duration::from_millis(1);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let r = (|| -> Result<(Link, u32), (bool, String)> {
            let mut l = transport::connect(&spec.address, &tls, left.max(Duration::from_millis(1)))
                .map_err(|e| (first || e.kind() != io::ErrorKind::ConnectionRefused, e.to_string()))?;
            l.set_read_timeout(Some(left.max(Duration::from_millis(1)))).map_err(|e| (true, e.to_string()))?;
            let (mut buf, mut out) = (Vec::new(), Vec::new());
            let client: [u8; 16] = random();
            let hello =
                Frame::Hello { min_version: VERSION, max_version: VERSION, features: 0, max_frame: shared.cfg.max_frame, nonce: client };
            write_frame(&mut l, &mut out, &hello).map_err(|e| (true, e.to_string()))?;
            let (max_frame, server) = match read_frame(&mut l, &mut buf, HANDSHAKE_MAX_FRAME) {
                Ok(Frame::Welcome { max_frame, nonce, .. }) => (max_frame, nonce),
                Ok(Frame::Refused { reason }) => return Err((false, reason)),
                Ok(f) => return Err((false, format!("unexpected {} in the handshake", f.name()))),
                Err(e) => return Err((true, e.to_string())),
            };
            let n = Nonces { client, server };
            let to = spec.index;
            write_frame(&mut l, &mut out, &Frame::PeerOpen { mesh, from, to, mac: key.open_proof(&n, &mesh, from, to) })
                .map_err(|e| (true, e.to_string()))?;
            match read_frame(&mut l, &mut buf, HANDSHAKE_MAX_FRAME) {
                Ok(Frame::PeerOpened { mac }) if key.check_opened(&n, &mesh, &mac) => {}
                Ok(Frame::PeerOpened { .. }) => return Err((false, "the peer could not prove it holds the mesh key".into())),
                Ok(Frame::Refused { reason }) => return Err((first && reason.contains("no such mesh"), reason)),
                Ok(f) => return Err((false, format!("unexpected {} in the handshake", f.name()))),
                Err(e) => return Err((true, e.to_string())),
            }
            l.set_read_timeout(None).map_err(|e| (true, e.to_string()))?;
            Ok((l, max_frame))
        })();
        match r {
            Ok(x) => return Ok(x),
            Err((retry, why)) => {
                if !retry || Instant::now() + pause >= deadline {
                    return Err(why);
                }
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Queues a small `frame` for member `to` (never waits: reading threads call it).
pub(super) fn peer_send(shared: &Arc<Shared>, s: &Arc<Session>, to: u32, frame: Vec<u8>) -> Result<(), String> {
    let out = peer_out(shared, s, &mut lock(&s.remote), to)?;
    let mut st = lock(&out.st);
    if let Some(e) = &st.error {
        return Err(e.clone());
    }
    if st.closed {
        return Err("the session is closing".into());
    }
    st.frames.push_back(frame);
    drop(st);
    out.cv.notify_all();
    Ok(())
}

/// Waits (at most `within` in all) until the frames queued for every member were handed to
/// their links, so that what was queued last (the notices to close mappings) goes out before
/// the session closes its links. A member that is lost or has no link is not waited for past
/// the bound. Returns whether every queue emptied.
pub(super) fn flush_peers(s: &Session, within: Duration) -> bool {
    let outs: Vec<Arc<PeerOut>> = lock(&s.remote).outs.values().cloned().collect();
    let deadline = Instant::now() + within;
    let mut flushed = true;
    for out in outs {
        let mut st = lock(&out.st);
        while !st.frames.is_empty() && st.error.is_none() && !st.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            // The sending thread does not signal an empty queue (no wake-up per frame): poll.
            st = out.cv.wait_timeout(st, left.min(Duration::from_millis(2))).unwrap_or_else(|p| p.into_inner()).0;
        }
        flushed &= st.frames.is_empty();
        drop(st);
        // A frame taken from the queue is written holding `write`: wait for that write.
        drop(lock(&out.write));
    }
    flushed
}

/// The link to member `to` as it is now (waiting, up to the peer timeout, while it is being
/// made): the link, its generation and the largest frame the member accepts.
pub(super) fn peer_link(shared: &Arc<Shared>, s: &Arc<Session>, to: u32) -> Result<(Arc<PeerOut>, Link, u64, u32), String> {
    let out = peer_out(shared, s, &mut lock(&s.remote), to)?;
    let deadline = Instant::now() + shared.cfg.peer_timeout;
    let mut st = lock(&out.st);
    loop {
        if let Some(e) = &st.error {
            return Err(e.clone());
        }
        if st.closed {
            return Err("the session is closing".into());
        }
        if let Some(l) = &st.link {
            let (l, generation, max_frame) = (l.clone(), st.generation, st.max_frame);
            drop(st);
            return Ok((out, l, generation, max_frame));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            drop(st); // peer_name takes the remote lock, which is taken before this one elsewhere
            return Err(format!("no link to {} within {:?}", peer_name(s, to), shared.cfg.peer_timeout));
        }
        st = out.cv.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
    }
}

/// Starts a recording of local event `event`: peers that subscribe from now on wait for this
/// recording, and those waiting for an earlier one still for theirs. Returns the recording's
/// number, for [`event_done`] (0 outside a mesh, where no one can wait for it).
pub(super) fn event_recorded(s: &Session, event: u64) -> u64 {
    let mut r = lock(&s.remote);
    if r.mesh.is_none() {
        return 0;
    }
    r.waiters.recorded(event)
}

/// Recording `recording` of local event `event` completed (`ok`) or failed: tells the peers
/// waiting for it.
pub(super) fn event_done(shared: &Arc<Shared>, s: &Arc<Session>, event: u64, recording: u64, ok: bool) {
    let waiting = {
        let mut r = lock(&s.remote);
        // Outside a mesh a Record is not waited for before it is called done (a CUDA event
        // is synchronized only in a mesh): nothing may be told of it.
        if r.mesh.is_none() || recording == 0 {
            return;
        }
        r.waiters.completed(event, recording, ok)
    };
    tell(shared, s, event, ok, waiting);
}

/// The client released local event `event`, having posted `waits` waits for it.
pub(super) fn event_released(shared: &Arc<Shared>, s: &Arc<Session>, event: u64, waits: u64) {
    let waiting = {
        let mut r = lock(&s.remote);
        if r.mesh.is_none() {
            return;
        }
        r.waiters.released(event, waits)
    };
    tell(shared, s, event, false, waiting);
}

fn tell(shared: &Arc<Shared>, s: &Arc<Session>, event: u64, ok: bool, members: Vec<u32>) {
    for p in members {
        let _ = peer_send(shared, s, p, Frame::PeerNotice { event, ok }.encode());
    }
}

/// What to do with a data piece that arrived.
pub(super) enum Piece {
    /// Read it into this chunk and stage what is new of it.
    Stage(Vec<u8>),
    /// All of it was had before (a re-sent transfer): read and drop it.
    Drop,
}

/// The receiving side of a peer link from member `from`. Data pieces go from the socket
/// straight into staging chunks (no frame buffer); once a transfer is complete the source is
/// told ([`Frame::PeerReceived`]).
pub(super) fn peer_receive(shared: &Arc<Shared>, s: &Arc<Session>, from: u32, conn: Link, max_frame: u32) -> io::Result<()> {
    // Small: headers and notices come through it; data bypasses it.
    let mut reader = BufReader::with_capacity(8 << 10, conn.clone());
    let mut buf = Vec::new();
    let mut scratch = Vec::new();
    let limit = shared.cfg.limits.max_bytes;
    if !lock(&s.remote).linked_from.insert(from) {
        link_changed(s, from); // a link made again: what went over the old one may be lost
    }
    let result = loop {
        let f = match wire::read_peer_frame(&mut reader, &mut buf, max_frame) {
            Ok(f) => f,
            Err(e) => break Err(io::Error::other(e.to_string())),
        };
        s.peer_frames.fetch_add(1, Ordering::Relaxed);
        let h = match f {
            wire::PeerRead::Data(h) => h,
            wire::PeerRead::Frame(Frame::PeerSubscribe { event, wait }) => {
                let answer = lock(&s.remote).waiters.subscribe(event, from, wait);
                if let Subscribed::Now(ok) = answer {
                    let _ = peer_send(shared, s, from, Frame::PeerNotice { event, ok }.encode());
                }
                continue;
            }
            wire::PeerRead::Frame(Frame::PeerNotice { event, ok }) => {
                lock(&s.remote).notice(from, event, ok);
                s.remote_cv.notify_all();
                continue;
            }
            wire::PeerRead::Frame(Frame::PeerReceived { transfer, received }) => {
                let mut r = lock(&s.remote);
                let p = r.progress.entry((from, transfer)).or_default();
                *p = (*p).max(received);
                drop(r);
                s.remote_cv.notify_all();
                continue;
            }
            wire::PeerRead::Frame(Frame::PeerResume { transfer }) => {
                let held = {
                    let r = lock(&s.remote);
                    match (r.finished.get(&(from, transfer)), r.inbox.get(&(from, transfer))) {
                        (Some(total), _) => *total,
                        (None, Some(i)) => i.received,
                        (None, None) => 0,
                    }
                };
                let _ = peer_send(shared, s, from, Frame::PeerReceived { transfer, received: held }.encode());
                continue;
            }
            wire::PeerRead::Frame(Frame::PeerMemOffer { transfer, node, pid, handle, offset, len, event }) => {
                let arrival = lock(&s.remote).mem_offered((from, transfer), MemOffer { node, pid, handle, offset, len, event });
                match arrival {
                    OfferArrival::AnswerAgain(a) => {
                        let _ = peer_send(shared, s, from, a.frame(transfer).encode());
                    }
                    OfferArrival::Kept => s.remote_cv.notify_all(),
                    OfferArrival::BeingTaken => {}
                    OfferArrival::Dropped => {
                        warn!("mesh member {from}: more than {MEM_PENDING_KEPT} peer-memory offers pending; transfer {transfer}'s dropped")
                    }
                }
                continue;
            }
            wire::PeerRead::Frame(f @ (Frame::PeerMemDone { .. } | Frame::PeerMemRefused { .. })) => {
                let (transfer, answer) = match f {
                    Frame::PeerMemDone { transfer, event } => (transfer, MemAnswer::Copied(event)),
                    Frame::PeerMemRefused { transfer, permanent, reason } => (transfer, MemAnswer::Refused { permanent, reason }),
                    _ => unreachable!("matched above"),
                };
                if lock(&s.remote).mem_answered((from, transfer), answer) {
                    s.remote_cv.notify_all();
                } else {
                    debug!("mesh member {from} answered transfer {transfer}, which waits for no answer (a duplicate): dropped");
                }
                continue;
            }
            wire::PeerRead::Frame(Frame::PeerMemClose { handle }) => {
                let refused = lock(&s.remote).mem_closed(from, handle);
                for (transfer, answer) in refused {
                    debug!("mesh member {from} freed the buffer of transfer {transfer}'s offer: refused");
                    let _ = peer_send(shared, s, from, answer.frame(transfer).encode());
                }
                s.remote_cv.notify_all();
                continue;
            }
            wire::PeerRead::Frame(other) => break Err(io::Error::other(format!("unexpected {} on a peer link", other.name()))),
        };
        let key = (from, h.transfer);
        let end = h.offset.checked_add(h.len as u64).filter(|e| *e <= h.total);
        let piece = {
            let mut r = lock(&s.remote);
            if end.is_none() || h.total > limit {
                break Err(io::Error::other(format!(
                    "transfer {}: a piece at {} of {} bytes does not fit its {} bytes (or the session's limit {limit})",
                    h.transfer, h.offset, h.len, h.total
                )));
            }
            if r.finished.contains_key(&key) {
                Piece::Drop
            } else {
                let staged = r.staged;
                let inc = r.inbox.entry(key).or_insert_with(|| Incoming { total: h.total, received: 0, chunks: VecDeque::new() });
                if inc.total != h.total || h.offset > inc.received {
                    break Err(io::Error::other(format!(
                        "transfer {}: a piece at {} does not follow the {} bytes received",
                        h.transfer, h.offset, inc.received
                    )));
                }
                let skip = (inc.received - h.offset).min(h.len as u64) as usize;
                if skip == h.len {
                    Piece::Drop
                } else if staged + (h.len - skip) as u64 > limit {
                    break Err(io::Error::other(format!("more than the session's limit of {limit} bytes staged for transfers")));
                } else {
                    Piece::Stage(r.chunk(h.len))
                }
            }
        };
        match piece {
            Piece::Drop => {
                scratch.resize(h.len.min(STAGE_CHUNK), 0);
                let mut left = h.len;
                while left > 0 {
                    let n = left.min(scratch.len());
                    if let Err(e) = reader.read_exact(&mut scratch[..n]) {
                        return peer_receive_end(s, from, Err(e));
                    }
                    left -= n;
                }
            }
            Piece::Stage(mut chunk) => {
                // Read it all; if the link breaks part way, what did arrive is staged still (in
                // order and, over TLS, authenticated), so a resumed transfer goes on from there.
                let mut got = 0;
                let mut broke = None;
                while got < h.len {
                    match reader.read(&mut chunk[got..h.len]) {
                        Ok(0) => broke = Some(io::Error::new(io::ErrorKind::UnexpectedEof, "the link closed inside a data piece")),
                        Ok(n) => got += n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => broke = Some(e),
                    }
                    if broke.is_some() {
                        break;
                    }
                }
                let mut r = lock(&s.remote);
                let Some(inc) = r.inbox.get_mut(&key) else {
                    continue; // the session is closing, or the transfer was given up
                };
                // What is new of it now (the old link's reader may have staged some meanwhile:
                // after a reconnect, pieces can come over two links).
                let skip = (inc.received.saturating_sub(h.offset)).min(got as u64) as usize;
                let n = got - skip;
                if skip > 0 {
                    chunk.copy_within(skip..got, 0);
                }
                inc.received += n as u64;
                if n > 0 {
                    inc.chunks.push_back((chunk, n));
                    r.staged += n as u64;
                } else {
                    r.recycle(chunk);
                }
                drop(r);
                s.remote_cv.notify_all();
                if let Some(e) = broke {
                    return peer_receive_end(s, from, Err(e));
                }
            }
        }
        if end == Some(h.total) && r_complete(s, key) {
            let _ = peer_send(shared, s, from, Frame::PeerReceived { transfer: h.transfer, received: h.total }.encode());
        }
    };
    peer_receive_end(s, from, result)
}

/// Whether every byte of incoming transfer `key` arrived (staged, or already taken).
pub(super) fn r_complete(s: &Session, key: (u32, u64)) -> bool {
    let r = lock(&s.remote);
    r.finished.contains_key(&key) || r.inbox.get(&key).is_some_and(|i| i.received == i.total)
}

pub(super) fn peer_receive_end(s: &Session, from: u32, result: io::Result<()>) -> io::Result<()> {
    if !s.closed.load(Ordering::SeqCst) {
        // The source re-connects and re-sends; waits here see the change.
        link_changed(s, from);
    }
    result
}

/// Waits (up to the peer timeout) until `ready` says yes or a failure ends the wait. `resend`
/// runs first and again whenever a link with `peer` broke or was made again (what it sent may
/// have been lost on the way; every peer frame may arrive twice).
pub(super) fn wait_remote<T>(
    shared: &Shared,
    s: &Session,
    peer: u32,
    what: &str,
    mut ready: impl FnMut(&mut RemoteState) -> Option<Result<T, String>>,
    mut resend: impl FnMut() -> Result<(), String>,
) -> Result<T, Outcome> {
    let deadline = Instant::now() + shared.cfg.peer_timeout;
    let mut seen = None;
    let mut r = lock(&s.remote);
    loop {
        if let Some(x) = ready(&mut r) {
            return x.map_err(|e| failed(code::PEER, e));
        }
        if let Some(why) = r.lost.get(&peer) {
            return Err(failed(code::PEER, format!("{what}: {why}")));
        }
        if s.closed.load(Ordering::SeqCst) {
            return Err(failed(code::PEER, format!("{what}: the session is closing")));
        }
        let epoch = r.epoch(peer);
        if seen != Some(epoch) {
            seen = Some(epoch);
            drop(r);
            resend().map_err(|e| failed(code::PEER, format!("{what}: {e}")))?;
            r = lock(&s.remote);
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            drop(r); // peer_name takes the remote lock
            return Err(failed(code::PEER, format!("{what}: nothing from {} within {:?}", peer_name(s, peer), shared.cfg.peer_timeout)));
        }
        r = s.remote_cv.wait_timeout(r, left).unwrap_or_else(|p| p.into_inner()).0;
    }
}

/// Gives up incoming transfer `key`: its staged bytes are freed and later pieces dropped.
pub(super) fn abandon(s: &Session, key: (u32, u64)) {
    let mut r = lock(&s.remote);
    if let Some(inc) = r.inbox.remove(&key) {
        r.staged -= inc.chunks.iter().map(|c| c.1 as u64).sum::<u64>();
        for (c, _) in inc.chunks {
            r.recycle(c);
        }
        r.finish(key, inc.total);
    }
}

/// Receives transfer `key` into buffer `id` at `offset` (at most `len` bytes), copying each
/// staged piece into the buffer as soon as it is there (while the link reads the next ones).
/// Returns the transfer's size.
pub(super) fn receive_transfer(shared: &Shared, s: &Session, key: (u32, u64), id: u64, offset: u64, len: u64) -> Result<u64, Outcome> {
    let (peer, transfer) = key;
    let what = format!("receiving transfer {transfer} from mesh member {peer}");
    let mut copied = 0u64;
    let mut checked = false;
    loop {
        let (pieces, total) = wait_remote(
            shared,
            s,
            peer,
            &what,
            |r| {
                let inc = r.inbox.get_mut(&key)?;
                if inc.chunks.is_empty() && inc.received != inc.total {
                    return None;
                }
                let total = inc.total;
                let pieces = std::mem::take(&mut inc.chunks);
                r.staged -= pieces.iter().map(|c| c.1 as u64).sum::<u64>();
                Some(Ok((pieces, total)))
            },
            || Ok(()),
        )?;
        let r = (|| {
            let mut o = lock(&s.objects);
            let b = buffer(&mut o, id)?;
            if !checked {
                if total > len {
                    return Err(failed(code::INVALID, format!("transfer {transfer} brings {total} bytes, more than the {len} expected")));
                }
                span("migration destination", offset, total, b.mem.len())?;
                checked = true;
            }
            for (chunk, n) in &pieces {
                let at = (offset + copied) as usize;
                match &mut b.mem {
                    Mem::Host(m) => m.bytes_mut()[at..at + n].copy_from_slice(&chunk[..*n]),
                    #[cfg(feature = "cuda")]
                    Mem::Cuda(m) => m.write(at, &chunk[..*n])?,
                    Mem::OpenCl(m) => {
                        m.write(at, &chunk[..*n])?;
                    }
                }
                copied += *n as u64;
            }
            Ok(())
        })();
        let mut rs = lock(&s.remote);
        for (c, _) in pieces {
            rs.recycle(c);
        }
        drop(rs);
        if let Err(e) = r {
            abandon(s, key);
            return Err(e);
        }
        if copied == total {
            abandon(s, key); // nothing is left: only marks it finished
            return Ok(total);
        }
    }
}

/// Sends bytes `range` of `mem` to member `peer` as transfer `transfer`, straight from the
/// buffer (a frame header, then the bytes, in one write), and waits until the member confirms
/// it holds them all. When the link breaks on the way, it asks the member (over the link made
/// again) how much arrived and sends the rest.
pub(super) fn send_transfer(
    shared: &Arc<Shared>,
    s: &Arc<Session>,
    mem: &Mem,
    range: std::ops::Range<usize>,
    peer: u32,
    transfer: u64,
) -> Result<(), Outcome> {
    let what = format!("migrating to mesh member {peer}");
    let key = (peer, transfer);
    let total = range.len() as u64;
    let mut from = 0u64; // what the member holds
    let mut resumed = false;
    let mut staging = Vec::new();
    loop {
        let (out, link, generation, max_frame) = peer_link(shared, s, peer).map_err(|e| failed(code::PEER, format!("{what}: {e}")))?;
        let epoch = lock(&s.remote).epoch(peer);
        if resumed {
            lock(&s.remote).progress.remove(&key);
            let q = Frame::PeerResume { transfer }.encode();
            let sent = {
                let _w = lock(&out.write);
                link.write_parts(&[&q])
            };
            if sent.is_err() {
                out.broken(generation);
                continue;
            }
            // The answer, or `None` when the link broke again before it came (ask again).
            let held = wait_remote(
                shared,
                s,
                peer,
                &what,
                |r| match r.progress.get(&key) {
                    Some(n) => Some(Ok(Some(*n))),
                    None => (r.epoch(peer) != epoch).then_some(Ok(None)),
                },
                || Ok(()),
            )?;
            match held {
                Some(n) if n <= total => from = n,
                Some(n) => return Err(failed(code::PEER, format!("{what}: the member holds {n} bytes of a {total}-byte transfer"))),
                None => continue,
            }
        }
        let piece = (max_frame as usize).saturating_sub(wire::PEER_DATA_OVERHEAD).clamp(1, STAGE_CHUNK);
        let mut at = range.start + from as usize;
        let mut broke = false;
        loop {
            let end = (at + piece).min(range.end);
            let head = wire::peer_data_head(transfer, total, (at - range.start) as u64, end - at);
            let data: &[u8] = match mem {
                Mem::Host(m) => &m.bytes()[at..end],
                #[cfg(feature = "cuda")]
                Mem::Cuda(m) => {
                    staging.resize(end - at, 0);
                    m.read_into(at..end, &mut staging)?;
                    &staging
                }
                Mem::OpenCl(m) => {
                    let (bytes, _) = m.read(at..end)?;
                    staging.clear();
                    staging.extend_from_slice(&bytes);
                    &staging
                }
            };
            let w = {
                let _w = lock(&out.write);
                link.write_parts(&[&head, data])
            };
            if w.is_err() {
                out.broken(generation);
                broke = true;
                break;
            }
            at = end;
            if at >= range.end {
                break;
            }
        }
        resumed = true;
        if broke {
            continue;
        }
        let confirmed = wait_remote(
            shared,
            s,
            peer,
            &what,
            |r| {
                if r.progress.get(&key) == Some(&total) {
                    r.progress.remove(&key);
                    return Some(Ok(true));
                }
                (r.epoch(peer) != epoch).then_some(Ok(false))
            },
            || Ok(()),
        )?;
        if confirmed {
            return Ok(());
        }
    }
}

/// How errors name mesh member `peer`: its address and index.
pub(super) fn peer_name(s: &Session, peer: u32) -> String {
    let r = lock(&s.remote);
    match r.mesh.as_ref().and_then(|m| m.peers.get(&peer)) {
        Some(p) => format!("peer server {} (mesh member {peer})", p.address),
        None => format!("mesh member {peer}"),
    }
}

/// The mesh member `peer` of this session, or why there is none.
pub(super) fn check_peer(s: &Session, peer: u32) -> Result<(), Outcome> {
    let r = lock(&s.remote);
    match &r.mesh {
        None => Err(failed(code::INVALID, "this session is not in a mesh (JoinMesh first)")),
        Some(m) if !m.peers.contains_key(&peer) => Err(failed(code::INVALID, format!("mesh member {peer} does not exist"))),
        Some(_) => Ok(()),
    }
}

pub(super) fn join_mesh(
    shared: &Arc<Shared>,
    s: &Arc<Session>,
    mesh: [u8; 16],
    key: [u8; 32],
    index: u32,
    peers: Vec<PeerSpec>,
) -> Result<Outcome, Outcome> {
    let mut map = HashMap::new();
    for p in peers {
        if p.index == index {
            return Err(failed(code::INVALID, format!("mesh member {index} is this server; it cannot be its own peer")));
        }
        if map.insert(p.index, p).is_some() {
            return Err(failed(code::INVALID, "two mesh members with one index"));
        }
    }
    let mut r = lock(&s.remote);
    if r.mesh.is_some() {
        return Err(failed(code::INVALID, "this session is already in a mesh"));
    }
    {
        let mut meshes = lock(&shared.meshes);
        if meshes.get(&mesh).is_some_and(|w| w.strong_count() > 0) {
            return Err(failed(code::INVALID, "this mesh id is already in use on this server"));
        }
        meshes.insert(mesh, Arc::downgrade(s));
    }
    r.mesh = Some(MeshInfo { id: mesh, key: MeshKey(key), index, peers: map });
    Ok(Outcome::Done)
}
