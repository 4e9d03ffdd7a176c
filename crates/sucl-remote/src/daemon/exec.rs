//! The executor: runs a session's commands in order, each exactly once, and answers them.

use super::commands::run;
use super::mesh::*;
use super::notify;
use super::objects::*;
use super::peer_mem;
use super::state::*;
use crate::wire::{code, failed, Command, Frame, Outcome, SessionStats};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Whether `cmd` would have to wait for a peer (then the executor thread runs it).
pub(super) fn would_block(s: &Session, cmd: &Command) -> bool {
    let r = lock(&s.remote);
    match cmd {
        Command::MigrateIn { peer, transfer, .. } => {
            let key = (*peer, *transfer);
            !r.mem_offers.contains_key(&key) && r.inbox.get(&key).is_none_or(|i| i.received != i.total)
        }
        // Each wait subscribes and waits for its own notice.
        Command::WaitRemote { .. } => true,
        _ => false,
    }
}

/// Writes at least this large run on the session's executor thread, so that the connection's
/// thread goes on receiving (and decrypting) the next piece while this one is copied into
/// the device: a large upload keeps both busy instead of taking turns.
const HAND_OFF_WRITE: usize = 256 << 10;

fn carries_many_bytes(cmd: &Command) -> bool {
    matches!(cmd, Command::Write { data, .. } if data.len() >= HAND_OFF_WRITE)
}

/// Runs queued commands in order until the queue is empty. On the connection's thread
/// (`in_executor` false) it hands over to the executor at the first command that would block.
pub(super) fn drain(shared: &Arc<Shared>, s: &Arc<Session>, in_executor: bool) {
    loop {
        let (seq, cmd) = {
            let mut st = lock(&s.state);
            let Some((_, head)) = st.pending.front() else {
                st.draining = false;
                return;
            };
            if s.closed.load(Ordering::SeqCst) || s.retiring.load(Ordering::SeqCst) {
                st.draining = false;
                return;
            }
            if !in_executor && (would_block(s, head) || carries_many_bytes(head)) && hand_off(shared, s, &mut st) {
                return;
            }
            st.pending.pop_front().expect("a head was seen")
        };
        let outcome = execute(shared, s, cmd);
        // Read data goes out from the buffer it was read into, behind the reply's head.
        let reply = Frame::Reply { seq, outcome }.encode_split();
        let mut st = lock(&s.state);
        let conn = lock(&s.binding).conn.clone();
        if let Some(c) = conn {
            if c.write_parts(&reply.parts()).is_err() {
                c.shutdown(); // the client re-attaches; the reply stays retained
            }
        }
        st.retained.push_back((seq, reply));
    }
}

/// Hands the queue to the session's executor thread, starting one if none is alive; `false`
/// if none could be started (then the caller runs the command itself).
fn hand_off(shared: &Arc<Shared>, s: &Arc<Session>, st: &mut SessionState) -> bool {
    st.handoff = true;
    if st.executor {
        s.exec_cv.notify_all();
        return true;
    }
    let (sh, se) = (shared.clone(), s.clone());
    match std::thread::Builder::new().name("sucld-exec".into()).spawn(move || executor_loop(&sh, &se)) {
        Ok(_) => {
            st.executor = true;
            true
        }
        Err(e) => {
            tracing::warn!("cannot start an executor thread ({e}): the connection's thread runs the command");
            st.handoff = false;
            false
        }
    }
}

/// The session's executor: runs the queue whenever a command at its head may block. It ends
/// when the session closes, or when it has nothing to run and the session is detached (an
/// abandoned session holds no thread; a command that must wait starts one again).
pub(super) fn executor_loop(shared: &Arc<Shared>, s: &Arc<Session>) {
    loop {
        let mut st = lock(&s.state);
        while !st.handoff {
            if s.closed.load(Ordering::SeqCst) || lock(&s.binding).conn.is_none() {
                st.executor = false;
                return;
            }
            st = s.exec_cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if s.closed.load(Ordering::SeqCst) {
            st.executor = false;
            return;
        }
        st.handoff = false;
        drop(st);
        drain(shared, s, true);
    }
}

pub(super) fn execute(shared: &Arc<Shared>, s: &Arc<Session>, cmd: Command) -> Outcome {
    match exec(shared, s, cmd) {
        Ok(x) | Err(x) => x,
    }
}

/// Commands that involve peers; the rest run on the session's objects. Peer-memory offers the
/// command could depend on are joined first.
pub(super) fn exec(shared: &Arc<Shared>, s: &Arc<Session>, cmd: Command) -> Result<Outcome, Outcome> {
    let waited = peer_mem::join(shared, s, peer_mem::Join::before(&cmd));
    // Freeing a buffer a member may still copy from (its offer unsettled, or orphaned by a lost
    // member) holds its memory instead.
    if let Command::Free { buffer } = cmd {
        if peer_mem::free_or_hold(s, buffer)? {
            lock(&s.objects).stats.executed += 1;
            return Ok(Outcome::Done);
        }
    }
    match waited {
        Ok(0) => {}
        Ok(ns) => lock(&s.objects).stats.peer_wait_ns += ns,
        // No member copies from this buffer: freeing it does not depend on the failed join
        // (its offers are kept; the next command that joins them reports the failure).
        Err(_) if matches!(cmd, Command::Free { .. }) => {}
        Err(e) => {
            lock(&s.objects).stats.executed += 1;
            return Err(e);
        }
    }
    peer_mem::release_held(shared, s);
    match cmd {
        Command::JoinMesh { mesh, key, index, peers } => {
            lock(&s.objects).stats.executed += 1;
            join_mesh(shared, s, mesh, key, index, peers)
        }
        Command::WaitRemote { peer, event } => {
            lock(&s.objects).stats.executed += 1;
            check_peer(s, peer)?;
            let started = Instant::now();
            let what = format!("waiting for event {event} of mesh member {peer}");
            // Notices are taken only while a wait for them runs (one at a time: a session's
            // commands run in order), so a late one is dropped, not kept.
            let wait = lock(&s.remote).waiting_for(peer, event);
            let waited = wait_remote(
                shared,
                s,
                peer,
                &what,
                |r| {
                    r.remote_done.get(&(peer, event)).map(|ok| {
                        if *ok {
                            Ok(())
                        } else {
                            Err(format!("event {event} of mesh member {peer} failed"))
                        }
                    })
                },
                || peer_send(shared, s, peer, Frame::PeerSubscribe { event, wait }.encode()),
            );
            lock(&s.remote).waited_for(peer, event);
            waited?;
            lock(&s.objects).stats.peer_wait_ns += started.elapsed().as_nanos() as u64;
            Ok(Outcome::Done)
        }
        Command::MigrateIn { buffer: id, offset, len, peer, transfer } => {
            lock(&s.objects).stats.executed += 1;
            check_peer(s, peer)?;
            // A link to the source, though nothing goes out on it: if the source dies, its
            // re-connection is refused and this wait fails at once.
            peer_out(shared, s, &mut lock(&s.remote), peer).map_err(|e| failed(code::PEER, e))?;
            let started = Instant::now();
            let (total, through_memory) = match peer_mem::receive_offer(shared, s, (peer, transfer), id, offset, len)? {
                Some(n) => (n, true),
                None => (receive_transfer(shared, s, (peer, transfer), id, offset, len)?, false),
            };
            let mut o = lock(&s.objects);
            let st = &mut o.stats;
            st.peer_wait_ns += started.elapsed().as_nanos() as u64;
            st.migrated_bytes += total;
            if through_memory {
                st.migrations_peer_memory += 1;
            } else {
                st.migrations_network += 1;
            }
            if let Some(sb) = buffer(&mut o, id)?.content {
                set_content_len(&mut o, sb, offset + total)?;
            }
            Ok(Outcome::Done)
        }
        Command::MigrateOut { buffer: id, offset, len, peer, transfer } => {
            let started = Instant::now();
            let r = {
                let mut o = lock(&s.objects);
                o.stats.executed += 1;
                check_peer(s, peer)?;
                let len = trimmed(&mut o, id, offset, len)?;
                span("migration source", offset, len, buffer(&mut o, id)?.mem.len())?
            };
            if !peer_mem::offer(shared, s, id, r.clone(), peer, transfer)? {
                let mut o = lock(&s.objects);
                send_transfer(shared, s, &buffer(&mut o, id)?.mem, r, peer, transfer)?;
            }
            lock(&s.objects).stats.peer_wait_ns += started.elapsed().as_nanos() as u64;
            Ok(Outcome::Done)
        }
        Command::Stats => {
            let mut o = lock(&s.objects);
            o.stats.executed += 1;
            Ok(Outcome::Stats(SessionStats { peer_frames: s.peer_frames.load(Ordering::Relaxed), ..o.stats }))
        }
        other => {
            let record = match other {
                Command::Record { event, .. } => Some(event),
                _ => None,
            };
            let freed = match other {
                Command::Free { buffer } => Some(buffer),
                _ => None,
            };
            let released = match &other {
                Command::ReleaseEvents { events } => events.clone(),
                _ => Vec::new(),
            };
            let in_mesh = lock(&s.remote).mesh.is_some();
            let ctx = Ctx { devices: &shared.devices, cfg: &shared.cfg, max_frame: s.max_frame, in_mesh };
            let mut o = lock(&s.objects);
            o.stats.executed += 1;
            let outcome = run(&ctx, &mut o, other)?;
            // Numbered only once recorded: a refused Record leaves the earlier recording's notice due.
            let recording = record.map(|event| event_recorded(s, event));
            let launch = record.and_then(|event| match o.events.get(&event) {
                Some(Ev::Cl(l)) => Some(l.clone()),
                _ => None,
            });
            drop(o);
            if let (Some(event), Some(recording)) = (record, recording) {
                match launch {
                    Some(launch) if in_mesh => notify::when_over(shared, s, Recorded { launch, event, recording }),
                    _ => event_done(shared, s, event, recording, true),
                }
            }
            if let Some(id) = freed {
                peer_mem::freed(shared, s, id);
            }
            for (event, waits) in released {
                event_released(shared, s, event, waits);
            }
            Ok(outcome)
        }
    }
}
