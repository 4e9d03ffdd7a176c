//! The peer-memory path of a migration between two GPU daemons of one host: the bytes go GPU to
//! GPU, never through the peer link.
//!
//! The source records an interprocess event on its stream (after the work that produces the
//! bytes) and offers the transfer ([`Frame::PeerMemOffer`]: the buffer's IPC memory handle, the
//! range, the event's handle, its host and process); its migrating command completes at once,
//! and the answer is joined by the first later command that could touch what the copy reads
//! ([`Join`]), so that migrations to several members and the next step's work go out without
//! waiting a round trip each. The destination, when its receiving
//! command runs, opens the buffer and the event once (kept per member until the buffer is
//! freed, or the session ends), makes its stream wait for the event, queues the copy, records
//! its own interprocess event after it and answers [`Frame::PeerMemDone`]; the source makes its
//! stream wait for that event, so later work on its buffer comes after the copy. Neither CPU
//! waits for a GPU. A destination that cannot take the offer (another host, the same process,
//! a host buffer, a handle that does not open, `--peer-path network`) answers
//! [`Frame::PeerMemRefused`], and the source sends the bytes over the link as before; a refusal
//! for good makes the source stop offering to that member.
//!
//! **After a cut.** Offers and answers are idempotent: the source offers again whenever the link
//! was made again while it waits; a destination that already answered a transfer answers it
//! again alike (it never copies a transfer twice), one that has not yet run the receiving
//! command keeps the latest offer, and one whose receiving command is taking it ignores it. The
//! source keeps only answers to offers still waiting for one.
//!
//! **Unsettled offers.** An offer whose join failed is kept (to a lost member: until the session
//! ends), since its destination may still copy; a buffer freed meanwhile is held, not freed
//! ([`free_or_hold`]), until its offers are settled. A destination told that a buffer was freed
//! ([`Frame::PeerMemClose`]) refuses every offer of it.

use super::config::PeerPath;
use super::links::*;
use super::mesh::*;
use super::state::*;
use crate::wire::{code, failed, Command, Frame, Outcome};
use std::sync::Arc;
use tracing::{debug, info, warn};

/// Why a destination with peer path `path` on machine `my_node`, process `my_pid`, refuses
/// an offer from machine `node`, process `pid` whatever its buffers (`None`: it may take it).
pub(super) fn refusal(path: PeerPath, node: u64, pid: u32, my_node: u64, my_pid: u32) -> Option<String> {
    if path == PeerPath::Network {
        return Some(format!(
            "the destination daemon takes migrations over the peer link ({}=network or --peer-path network)",
            PeerPath::ENV
        ));
    }
    if node != my_node {
        return Some("the daemons run on different hosts".into());
    }
    if pid == my_pid {
        return Some("both daemons run in one process (an IPC handle opens only in another process)".into());
    }
    None
}

/// Destination: the address of `offer`'s first byte in a source allocation mapped at `base`
/// with `size` bytes, or why its range is not inside that allocation (checked against the size
/// the driver reports, never the member's word alone).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // without CUDA nothing is mapped
fn source_address(base: u64, size: usize, offer: &MemOffer) -> Result<u64, String> {
    match offer.offset.checked_add(offer.len) {
        Some(end) if end <= size as u64 => Ok(base + offer.offset),
        _ => {
            Err(format!("the offer's bytes {}..{}+{} are outside the source buffer's {size} bytes", offer.offset, offer.offset, offer.len))
        }
    }
}

/// Source: offers transfer `transfer` (bytes `range` of buffer `id`) to member `peer` through
/// peer memory, without waiting for the answer: `true` when offered (the answer is joined by a
/// later command, see [`join`]); `false` when the bytes must go over the link now.
pub(super) fn offer(
    shared: &Arc<Shared>,
    s: &Arc<Session>,
    id: u64,
    range: std::ops::Range<usize>,
    peer: u32,
    transfer: u64,
) -> Result<bool, Outcome> {
    let retiring = s.retiring.load(std::sync::atomic::Ordering::SeqCst);
    if retiring || shared.cfg.peer_path == PeerPath::Network || lock(&s.remote).mem_refused_by.contains_key(&peer) {
        return Ok(false);
    }
    let Some((frame, device)) = cuda::prepare_offer(shared, s, id, range.clone(), peer, transfer)? else {
        return Ok(false);
    };
    // Live before it is sent, so that an answer that comes at once is kept.
    lock(&s.remote).offered.push(Offered { peer, transfer, device, buffer: id, range, frame: frame.clone() });
    if let Err(e) = peer_send(shared, s, peer, frame) {
        // Not queued, so never seen: nobody can copy from it.
        lock(&s.remote).offered.retain(|o| (o.peer, o.transfer) != (peer, transfer));
        return Err(failed(code::PEER, format!("migrating to mesh member {peer}: {e}")));
    }
    Ok(true)
}

/// Which answered offers a command must join before it runs.
pub(super) enum Join {
    /// Every one (the command may touch any buffer or queue work on any GPU).
    All,
    /// None (the command touches no buffer and queues no GPU work).
    Nothing,
    /// Those to this member (a migration to it: its ready event is reused).
    To(u32),
    /// Those from this buffer whose bytes overlap this range (a migration into it).
    Overlapping(u64, std::ops::Range<u64>),
}

impl Join {
    /// What command `cmd` must join.
    pub(super) fn before(cmd: &Command) -> Join {
        match cmd {
            Command::MigrateOut { peer, .. } => Join::To(*peer),
            Command::MigrateIn { buffer, offset, len, .. } => Join::Overlapping(*buffer, *offset..offset.saturating_add(*len)),
            Command::Nop | Command::Devices | Command::Stats | Command::ReleaseEvents { .. } => Join::Nothing,
            _ => Join::All,
        }
    }

    fn takes(&self, o: &Offered) -> bool {
        match self {
            Join::All => true,
            Join::Nothing => false,
            Join::To(p) => o.peer == *p,
            Join::Overlapping(b, r) => o.buffer == *b && (o.range.start as u64) < r.end && r.start < o.range.end as u64,
        }
    }
}

/// Joins the offers `which` selects, oldest first: waits for each answer; a copy orders later
/// work on the source's GPU after it; a refusal sends the bytes over the link now (the buffer
/// is as it was: every command that could change it joins first). Returns the nanoseconds
/// spent waiting.
pub(super) fn join(shared: &Arc<Shared>, s: &Arc<Session>, which: Join) -> Result<u64, Outcome> {
    let due: Vec<Offered> = {
        let mut r = lock(&s.remote);
        if r.offered.is_empty() {
            return Ok(0);
        }
        let (due, keep): (Vec<Offered>, _) = std::mem::take(&mut r.offered).into_iter().partition(|o| which.takes(o));
        r.offered = keep;
        r.joining.extend(due.iter().map(|o| (o.peer, o.transfer)));
        due
    };
    let keys: Vec<(u32, u64)> = due.iter().map(|o| (o.peer, o.transfer)).collect();
    let started = std::time::Instant::now();
    let joined = join_in_order(due, |o| join_one(shared, s, o));
    let mut r = lock(&s.remote);
    for k in &keys {
        r.joining.remove(k);
    }
    if let Err((e, unjoined)) = joined {
        put_back(&mut r, unjoined);
        return Err(e);
    }
    Ok(started.elapsed().as_nanos() as u64)
}

/// Joins `due` in order with `one`; on the first failure, the error and the offers not joined
/// (the failed one first), so that they are not forgotten: the destination may still copy
/// from their buffers.
fn join_in_order(due: Vec<Offered>, mut one: impl FnMut(&Offered) -> Result<(), Outcome>) -> Result<(), (Outcome, Vec<Offered>)> {
    let mut due = due.into_iter();
    while let Some(o) = due.next() {
        if let Err(e) = one(&o) {
            return Err((e, std::iter::once(o).chain(due).collect()));
        }
    }
    Ok(())
}

/// Offers a join gave up on: those to a lost member go to `orphaned` (no answer will come,
/// yet the member may still copy: their buffers are freed only when the session ends); the
/// rest go back in front of `offered`, for the next command to join again.
fn put_back(r: &mut RemoteState, unjoined: Vec<Offered>) {
    let (orphaned, again): (Vec<Offered>, Vec<Offered>) = unjoined.into_iter().partition(|o| r.lost.contains_key(&o.peer));
    r.orphaned.extend(orphaned);
    let later = std::mem::replace(&mut r.offered, again);
    r.offered.extend(later);
}

/// Waits for the answer to offer `o`: a copy orders later work on the source's GPU after it;
/// a refusal sends the bytes over the link now.
fn join_one(shared: &Arc<Shared>, s: &Arc<Session>, o: &Offered) -> Result<(), Outcome> {
    let (peer, transfer) = (o.peer, o.transfer);
    let what = format!("migrating to mesh member {peer} through peer memory");
    let key = (peer, transfer);
    let answer =
        wait_remote(shared, s, peer, &what, |r| r.mem_answers.remove(&key).map(Ok), || peer_send(shared, s, peer, o.frame.clone()))?;
    match answer {
        MemAnswer::Copied(event) => cuda::order_after(shared, s, peer, o.device, &event),
        MemAnswer::Refused { permanent, reason } => {
            if !permanent {
                debug!("transfer {transfer} to mesh member {peer} goes over the peer link: {reason}");
            } else if lock(&s.remote).mem_refused_by.insert(peer, reason.clone()).is_none() {
                info!("migrations to mesh member {peer} go over the peer link: {reason}");
            }
            let mut guard = lock(&s.objects);
            let ob = &mut *guard;
            let mem = match ob.held.iter().find(|(id, _)| *id == o.buffer) {
                Some((_, b)) => &b.mem,
                None => &super::objects::buffer(ob, o.buffer)?.mem,
            };
            send_transfer(shared, s, mem, o.range.clone(), peer, transfer)
        }
    }
}

/// Whether a member may still copy from buffer `id` (an offer of it not yet joined, or
/// orphaned by a lost member).
pub(super) fn exposed(r: &RemoteState, id: u64) -> bool {
    r.offered.iter().chain(&r.orphaned).any(|o| o.buffer == id)
}

/// Frees buffer `id` for command `Free`: at once when no member may still copy from it, else
/// its memory is held (the buffer is gone for the client) until [`release_held`] finds its
/// offers settled, or the session ends. `Ok(true)`: held.
pub(super) fn free_or_hold(s: &Session, id: u64) -> Result<bool, Outcome> {
    let mut o = lock(&s.objects);
    if !exposed(&lock(&s.remote), id) {
        return Ok(false);
    }
    let b = o.buffers.remove(&id).ok_or_else(|| failed(code::INVALID, format!("buffer {id} does not exist in this session")))?;
    o.stats.bytes_in_use -= b.mem.len() as u64;
    o.stats.buffers = o.buffers.len() as u32;
    o.held.push((id, b));
    Ok(true)
}

/// Frees the held buffers no member may copy from any more, and tells the members to close
/// their mappings of them.
pub(super) fn release_held(shared: &Arc<Shared>, s: &Arc<Session>) {
    let released = {
        let mut o = lock(&s.objects);
        if o.held.is_empty() {
            return;
        }
        let r = lock(&s.remote);
        let (gone, keep) = std::mem::take(&mut o.held).into_iter().partition::<Vec<_>, _>(|(id, _)| !exposed(&r, *id));
        o.held = keep;
        gone
    };
    for (id, b) in released {
        drop(b);
        freed(shared, s, id);
    }
}

/// Destination: waits until transfer `key` arrives, as a peer-memory offer or as bytes over the
/// link. An offer is copied GPU to GPU into buffer `id` at `offset` (at most `len` bytes) and
/// answered: `Some(bytes)`. `None`: the bytes come over the link (an offer that could not be
/// taken was refused first, saying why).
pub(super) fn receive_offer(
    shared: &Arc<Shared>,
    s: &Arc<Session>,
    key: (u32, u64),
    id: u64,
    offset: u64,
    len: u64,
) -> Result<Option<u64>, Outcome> {
    let (peer, transfer) = key;
    let what = format!("receiving transfer {transfer} from mesh member {peer}");
    let offer = wait_remote(
        shared,
        s,
        peer,
        &what,
        |r| match r.mem_take(key) {
            Some(o) => Some(Ok(Some(o))),
            None => (r.inbox.contains_key(&key) || r.finished.contains_key(&key)).then_some(Ok(None)),
        },
        || Ok(()),
    )?;
    let Some(offer) = offer else { return Ok(None) };
    let dead = lock(&s.remote).mem_is_dead(peer, &offer.handle);
    let answer = match refusal(shared.cfg.peer_path, offer.node, offer.pid, this_node(), std::process::id()) {
        Some(reason) => MemAnswer::Refused { permanent: true, reason },
        None if dead => freed_refusal(),
        None => match cuda::take_offer(shared, s, peer, id, offset, len, &offer) {
            Ok(event) => MemAnswer::Copied(event),
            Err((permanent, reason)) => MemAnswer::Refused { permanent, reason },
        },
    };
    if let MemAnswer::Refused { reason, .. } = &answer {
        debug!("transfer {transfer} from mesh member {peer} refused peer memory: {reason}");
    }
    let frame = answer.frame(transfer).encode();
    lock(&s.remote).mem_finish(key, answer.clone());
    peer_send(shared, s, peer, frame).map_err(|e| failed(code::PEER, format!("{what}: {e}")))?;
    Ok(matches!(answer, MemAnswer::Copied(_)).then_some(offer.len))
}

/// Before a session that is going (expired or evicted) frees its buffers: waits, each member
/// within the peer timeout, for the answers to the offers no command joined, and orders its
/// GPUs after each copy queued from them (freeing a buffer synchronizes its stream first, so
/// the memory outlives every copy from it); then tells the members to close their mappings of
/// its buffers, so that an offer still unanswered is refused rather than copied from freed
/// memory. Returns how many offers stayed unanswered.
pub(super) fn settle(shared: &Arc<Shared>, s: &Arc<Session>) -> usize {
    let offered = {
        let mut r = lock(&s.remote);
        let offered = std::mem::take(&mut r.offered);
        r.joining.extend(offered.iter().map(|o| (o.peer, o.transfer)));
        offered
    };
    let unanswered = settle_offers(
        offered,
        |o| {
            let (what, key) = (format!("settling transfer {} to mesh member {} at session end", o.transfer, o.peer), (o.peer, o.transfer));
            wait_remote(shared, s, o.peer, &what, |r| r.mem_answers.remove(&key).map(Ok), || peer_send(shared, s, o.peer, o.frame.clone()))
        },
        |o, event| cuda::order_after(shared, s, o.peer, o.device, event),
    );
    for id in cuda::exported(s) {
        freed(shared, s, id);
    }
    if !flush_peers(s, shared.cfg.peer_timeout) {
        warn!("session end: not every member was told to close its mappings within {:?}", shared.cfg.peer_timeout);
    }
    unanswered
}

/// Settles `offered` in order: `answer` waits for an offer's answer, `copied` orders the
/// source after a copy. A member that fails to answer one offer (its timeout passed, or it is
/// lost) is not waited for again. Returns how many offers were left unsettled.
fn settle_offers(
    offered: Vec<Offered>,
    mut answer: impl FnMut(&Offered) -> Result<MemAnswer, Outcome>,
    mut copied: impl FnMut(&Offered, &[u8; 64]) -> Result<(), Outcome>,
) -> usize {
    let (mut silent, mut unsettled) = (Vec::new(), 0);
    for o in offered {
        if silent.contains(&o.peer) {
            unsettled += 1;
            continue;
        }
        let settled = match answer(&o) {
            Ok(MemAnswer::Copied(event)) => copied(&o, &event),
            Ok(MemAnswer::Refused { .. }) => Ok(()),
            Err(e) => {
                silent.push(o.peer);
                Err(e)
            }
        };
        if let Err(e) = settled {
            warn!("session end: transfer {} to mesh member {} unsettled, its buffer is freed anyway: {e:?}", o.transfer, o.peer);
            unsettled += 1;
        }
    }
    unsettled
}

/// After buffer `id` was freed: tells the members it was exported to, so that they close their
/// mappings of it.
pub(super) fn freed(shared: &Arc<Shared>, s: &Arc<Session>, id: u64) {
    if let Some((handle, peers)) = cuda::forget_export(s, id) {
        for p in peers {
            let _ = peer_send(shared, s, p, Frame::PeerMemClose { handle }.encode());
        }
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::super::links::*;
    use super::super::objects::*;
    use super::super::state::*;
    use crate::wire::{Frame, Outcome};
    use std::collections::hash_map::{Entry, HashMap};
    use tracing::debug;

    /// The value under `key`, made by `open` the first time.
    fn cached<K: std::hash::Hash + Eq, V, E>(map: &mut HashMap<K, V>, key: K, open: impl FnOnce() -> Result<V, E>) -> Result<&mut V, E> {
        Ok(match map.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(v) => v.insert(open()?),
        })
    }

    fn text(o: Outcome) -> String {
        match o {
            Outcome::Failed { message, .. } => message,
            other => format!("{other:?}"),
        }
    }

    /// The CUDA device `device` of this daemon.
    fn gpu(shared: &Shared, device: u32) -> Option<&crate::cuda::CudaServed> {
        match shared.devices.get(device as usize) {
            Some(Served::Cuda(c)) => Some(c),
            _ => None,
        }
    }

    /// Records the ready event after the work queued so far and makes the offer frame; `None`
    /// when buffer `id` is not GPU memory or cannot be exported (then the link carries it).
    pub(super) fn prepare_offer(
        shared: &Shared,
        s: &Session,
        id: u64,
        range: std::ops::Range<usize>,
        peer: u32,
        transfer: u64,
    ) -> Result<Option<(Vec<u8>, u32)>, Outcome> {
        let mut guard = lock(&s.objects);
        let o = &mut *guard;
        let b = buffer(o, id)?;
        let device = b.device;
        let Mem::Cuda(m) = &mut b.mem else { return Ok(None) };
        let Some(c) = gpu(shared, device) else { return Ok(None) };
        let handle = match m.ipc_handle() {
            Ok(h) => h,
            Err(e) => {
                debug!("buffer {id} cannot be exported, it migrates over the link: {}", text(e));
                return Ok(None);
            }
        };
        let ev = match cached(&mut o.peer_mem.ready, (peer, device), || c.ipc_event()) {
            Ok(e) => e,
            Err(e) => {
                debug!("no interprocess event, migrations go over the link: {}", text(e));
                return Ok(None);
            }
        };
        c.record_ipc(ev)?;
        let event = ev.handle;
        let told = &mut o.peer_mem.shared.entry(id).or_insert_with(|| (handle, Vec::new())).1;
        if !told.contains(&peer) {
            told.push(peer);
        }
        let frame = Frame::PeerMemOffer {
            transfer,
            node: this_node(),
            pid: std::process::id(),
            handle,
            offset: range.start as u64,
            len: range.len() as u64,
            event,
        };
        Ok(Some((frame.encode(), device)))
    }

    /// Source, once the copy is queued: later work on `device` waits for the destination's
    /// event `event`.
    pub(super) fn order_after(shared: &Shared, s: &Session, peer: u32, device: u32, event: &[u8; 64]) -> Result<(), Outcome> {
        let c = gpu(shared, device).expect("offers are made from GPU buffers only");
        let mut o = lock(&s.objects);
        let e = cached(&mut o.peer_mem.opened_events, (peer, device, *event), || c.open_event(event))?;
        c.wait_opened(e)
    }

    /// Destination: queues the copy of `offer` into buffer `id` at `offset` (at most `len`
    /// bytes) after the source's event, then its own event; that event's handle, or whether
    /// the refusal is for good and why.
    pub(super) fn take_offer(
        shared: &Shared,
        s: &Session,
        peer: u32,
        id: u64,
        offset: u64,
        len: u64,
        offer: &MemOffer,
    ) -> Result<[u8; 64], (bool, String)> {
        close_freed(s);
        let mut guard = lock(&s.objects);
        let o = &mut *guard;
        let b = buffer(o, id).map_err(|e| (false, text(e)))?;
        let device = b.device;
        let Mem::Cuda(m) = &b.mem else { return Err((false, "the destination buffer is host memory".into())) };
        if offer.len > len {
            return Err((false, format!("the offer brings {} bytes, more than the {len} expected", offer.len)));
        }
        let dst = m.device_ptr() + span("migration destination", offset, offer.len, m.len()).map_err(|e| (false, text(e)))?.start as u64;
        let c = gpu(shared, device).ok_or((false, "the destination buffer's device is not a GPU".to_string()))?;
        let pm = &mut o.peer_mem;
        let opened = cached(&mut pm.opened_mem, (peer, device, offer.handle), || c.open_mem(&offer.handle)).map_err(|e| (true, text(e)))?;
        let src = super::source_address(opened.ptr, opened.size, offer).map_err(|e| (false, e))?;
        let ready =
            cached(&mut pm.opened_events, (peer, device, offer.event), || c.open_event(&offer.event)).map_err(|e| (true, text(e)))?;
        c.wait_opened(ready).map_err(|e| (false, text(e)))?;
        c.copy_peer(dst, src, offer.len as usize).map_err(|e| (false, text(e)))?;
        let done = cached(&mut pm.done, (peer, device), || c.ipc_event()).map_err(|e| (true, text(e)))?;
        c.record_ipc(done).map_err(|e| (false, text(e)))?;
        Ok(done.handle)
    }

    /// Closes the mappings of members' buffers that were freed.
    fn close_freed(s: &Session) {
        let closing = std::mem::take(&mut lock(&s.remote).mem_closing);
        if closing.is_empty() {
            return;
        }
        let mut o = lock(&s.objects);
        o.peer_mem.opened_mem.retain(|(p, _, h), _| !closing.contains(&(*p, *h)));
    }

    /// Forgets that buffer `id` was exported: its handle and the members told of it.
    pub(super) fn forget_export(s: &Session, id: u64) -> Option<([u8; 64], Vec<u32>)> {
        lock(&s.objects).peer_mem.shared.remove(&id)
    }

    /// The buffers exported to members.
    pub(super) fn exported(s: &Session) -> Vec<u64> {
        lock(&s.objects).peer_mem.shared.keys().copied().collect()
    }
}

/// Without CUDA there is no GPU memory to offer or take.
#[cfg(not(feature = "cuda"))]
mod cuda {
    use super::super::links::MemOffer;
    use super::super::state::*;
    use crate::wire::Outcome;

    pub(super) fn prepare_offer(
        _: &Shared,
        _: &Session,
        _: u64,
        _: std::ops::Range<usize>,
        _: u32,
        _: u64,
    ) -> Result<Option<(Vec<u8>, u32)>, Outcome> {
        Ok(None)
    }
    pub(super) fn order_after(_: &Shared, _: &Session, _: u32, _: u32, _: &[u8; 64]) -> Result<(), Outcome> {
        Ok(())
    }
    pub(super) fn take_offer(_: &Shared, _: &Session, _: u32, _: u64, _: u64, _: u64, _: &MemOffer) -> Result<[u8; 64], (bool, String)> {
        Err((true, "the destination daemon was built without CUDA".into()))
    }
    pub(super) fn forget_export(_: &Session, _: u64) -> Option<([u8; 64], Vec<u32>)> {
        None
    }
    pub(super) fn exported(_: &Session) -> Vec<u64> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_joins_exactly_the_offers_whose_copy_it_could_race() {
        let offered = |peer, buffer, range| Offered { peer, transfer: 1, device: 0, buffer, range, frame: Vec::new() };
        let (a, b) = (offered(1, 10, 0..100), offered(2, 11, 100..200));
        let joins = |cmd: Command| [&a, &b].map(|o| Join::before(&cmd).takes(o));
        // Anything that may write a buffer or queue GPU work joins every offer.
        assert_eq!(joins(Command::Launch { queue: 1, kernel: "k".into(), args: vec![], range: 1 }), [true, true]);
        assert_eq!(joins(Command::Free { buffer: 12 }), [true, true]);
        assert_eq!(joins(Command::Finish { queue: 1 }), [true, true]);
        // Another migration to a member joins the offers to that member only.
        assert_eq!(joins(Command::MigrateOut { buffer: 10, offset: 0, len: 8, peer: 2, transfer: 5 }), [false, true]);
        // A migration into a buffer joins the offers of bytes it overwrites only.
        let into = |buffer, offset, len| Command::MigrateIn { buffer, offset, len, peer: 3, transfer: 6 };
        assert_eq!(joins(into(10, 50, 10)), [true, false]);
        assert_eq!(joins(into(10, 100, 8)), [false, false], "bytes 100.. do not overlap 0..100");
        assert_eq!(joins(into(11, 96, 8)), [false, true]);
        // Commands that touch nothing join nothing.
        assert_eq!(joins(Command::Stats), [false, false]);
    }

    #[test]
    fn a_session_end_waits_for_every_answer_orders_after_each_copy_and_skips_silent_members() {
        let offered = |peer, transfer| Offered { peer, transfer, device: 0, buffer: 1, range: 0..8, frame: Vec::new() };
        let (mut asked, mut ordered) = (Vec::new(), Vec::new());
        let unsettled = settle_offers(
            vec![offered(1, 10), offered(2, 11), offered(1, 12), offered(3, 13)],
            |o| {
                asked.push(o.transfer);
                match o.peer {
                    1 => Err(failed(code::PEER, "nothing within the peer timeout")),
                    2 => Ok(MemAnswer::Copied([7; 64])),
                    _ => Ok(MemAnswer::Refused { permanent: false, reason: "host buffer".into() }),
                }
            },
            |o, event| {
                ordered.push((o.transfer, event[0]));
                Ok(())
            },
        );
        assert_eq!(asked, [10, 11, 13], "every answer is awaited, a silent member's only once");
        assert_eq!(ordered, [(11, 7)], "the GPU waits for the copy's event before the buffer is freed");
        assert_eq!(unsettled, 2, "both offers to the silent member stay unsettled");
    }

    #[test]
    fn a_failed_join_keeps_the_offers_it_did_not_join_and_their_buffers_stay_exposed() {
        let offered = |peer, transfer, buffer| Offered { peer, transfer, device: 0, buffer, range: 0..8, frame: Vec::new() };
        let mut joined = Vec::new();
        let (e, unjoined) = join_in_order(vec![offered(1, 10, 5), offered(2, 11, 6), offered(1, 12, 7)], |o| {
            if o.transfer == 11 {
                return Err(failed(code::PEER, "nothing within the peer timeout"));
            }
            joined.push(o.transfer);
            Ok(())
        })
        .expect_err("transfer 11 fails");
        assert!(matches!(e, Outcome::Failed { .. }));
        assert_eq!(joined, [10], "joining stops at the first failure");
        assert_eq!(unjoined.iter().map(|o| o.transfer).collect::<Vec<_>>(), [11, 12], "the failed offer and every later one");
        let mut r = RemoteState { offered: vec![offered(3, 13, 8)], ..Default::default() };
        r.lost.insert(1, "gone".into());
        put_back(&mut r, unjoined);
        assert_eq!(r.offered.iter().map(|o| o.transfer).collect::<Vec<_>>(), [11, 13], "joined again by the next command, oldest first");
        assert_eq!(r.orphaned.iter().map(|o| o.transfer).collect::<Vec<_>>(), [12], "a lost member's offer is orphaned, not forgotten");
        assert!(!exposed(&r, 5), "a joined offer's buffer may be freed");
        assert!(exposed(&r, 6) && exposed(&r, 7) && exposed(&r, 8), "a buffer with an unsettled offer is held when freed");
    }

    #[test]
    fn only_answers_to_live_offers_are_kept_and_an_offer_sent_again_while_taken_is_not_left_behind() {
        let mut r = RemoteState {
            offered: vec![Offered { peer: 1, transfer: 10, device: 0, buffer: 5, range: 0..8, frame: Vec::new() }],
            ..Default::default()
        };
        r.joining.insert((2, 20));
        let copied = MemAnswer::Copied([7; 64]);
        assert!(r.mem_answered((1, 10), copied.clone()), "an answer to an offer not yet joined is kept");
        assert!(r.mem_answered((2, 20), copied.clone()), "an answer to an offer being joined is kept");
        assert!(!r.mem_answered((1, 11), copied.clone()), "an answer to no live offer (a duplicate) is dropped");
        assert_eq!(r.mem_answers.len(), 2);
        // Destination: the offer taken, then the same offer again (sent after a cut) before
        // it is answered, then after.
        let offer = MemOffer { node: 0, pid: 0, handle: [0; 64], offset: 0, len: 8, event: [0; 64] };
        assert_eq!(r.mem_offered((1, 30), offer.clone()), OfferArrival::Kept);
        assert!(r.mem_take((1, 30)).is_some());
        assert_eq!(r.mem_offered((1, 30), offer.clone()), OfferArrival::BeingTaken);
        assert!(r.mem_offers.is_empty(), "an offer sent again while it is taken is not kept for a command that never comes");
        r.mem_finish((1, 30), copied.clone());
        assert_eq!(r.mem_offered((1, 30), offer), OfferArrival::AnswerAgain(copied));
        assert!(r.mem_offers.is_empty() && r.mem_taking.is_empty());
    }

    #[test]
    fn a_closed_handle_refuses_its_pending_offers_and_any_that_come_later() {
        let mut r = RemoteState::default();
        let offer = |handle| MemOffer { node: 0, pid: 0, handle: [handle; 64], offset: 0, len: 8, event: [0; 64] };
        assert_eq!(r.mem_offered((1, 30), offer(3)), OfferArrival::Kept);
        assert_eq!(r.mem_offered((1, 31), offer(4)), OfferArrival::Kept);
        assert_eq!(r.mem_offered((2, 32), offer(3)), OfferArrival::Kept, "another member's handle");
        let refused = r.mem_closed(1, [3; 64]);
        assert_eq!(refused, [(30, freed_refusal())], "the pending offer of the freed buffer is answered refused");
        assert_eq!(r.mem_offers.len(), 2, "it is no longer pending; the others are");
        assert!(r.mem_take((1, 30)).is_none(), "its receiving command takes the bytes over the link");
        assert!(r.mem_is_dead(1, &[3; 64]) && !r.mem_is_dead(2, &[3; 64]));
        assert_eq!(r.mem_offered((1, 30), offer(3)), OfferArrival::AnswerAgain(freed_refusal()), "sent again: refused alike");
        assert_eq!(r.mem_offered((1, 33), offer(3)), OfferArrival::AnswerAgain(freed_refusal()), "a later offer of it is refused");
        assert_eq!(r.mem_closing, [(1, [3; 64])], "its mapping is closed by the next migrating command");
    }

    #[test]
    fn an_offer_is_taken_only_when_its_source_range_lies_inside_the_mapped_allocation() {
        let offer = |offset, len| MemOffer { node: 0, pid: 0, handle: [0; 64], offset, len, event: [0; 64] };
        assert_eq!(source_address(0x1000, 256, &offer(0, 256)), Ok(0x1000));
        assert_eq!(source_address(0x1000, 256, &offer(200, 56)), Ok(0x1000 + 200));
        for (offset, len) in [(0, 257), (200, 57), (256, 1), (u64::MAX, 2)] {
            let e = source_address(0x1000, 256, &offer(offset, len)).expect_err("outside the allocation");
            assert!(e.contains("outside the source buffer's 256 bytes"), "{e}");
        }
    }

    #[test]
    fn only_daemons_of_one_host_in_two_processes_with_peer_memory_on_take_offers() {
        assert_eq!(refusal(PeerPath::Auto, 7, 100, 7, 200), None);
        let network = refusal(PeerPath::Network, 7, 100, 7, 200).expect("forced to the network");
        assert!(network.contains(PeerPath::ENV), "the refusal names the setting: {network}");
        assert!(refusal(PeerPath::Auto, 7, 100, 8, 200).expect("two hosts").contains("different hosts"));
        assert!(refusal(PeerPath::Auto, 7, 100, 7, 100).expect("one process").contains("one process"));
    }
}
