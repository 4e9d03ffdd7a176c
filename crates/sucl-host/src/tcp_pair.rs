//! Large all_reduce between exactly two ranks over tcp: both halves in flight at once, the
//! reduction of each piece overlapping the wire, and no message ever landing before its receive.
//!
//! Rank r owns half r of the buffer. Each rank posts every receive of the call up front (the
//! peer's raw pieces of its own half, then the peer's reduced pieces of the other half), tells
//! the peer it is ready with an empty frame, and once the peer said the same sends its raw
//! pieces of the peer's half. Every raw piece that arrives is reduced at once and its result
//! queued back behind the raw pieces. One connection carries both kinds of piece in a fixed
//! order (the engine's send queue is first in, first out and receives of one tag match in
//! posting order), so both sides agree on which frame is which without extra tags.
//!
//! Up to [`WHOLE_EXCHANGE_MAX`] bytes the ranks swap whole buffers instead (after the same
//! handshake) and each reduces all of it: one one-way trip fewer than halves and reduced halves,
//! for the same bytes on the wire each way, at the price of reducing twice the elements. Both
//! reduce in rank order (rank 0's operand on the left), so both hold the same bits.
//!
//! The ready handshake costs one small one-way message; it buys that no payload byte of this
//! call is ever read before its receive is posted. Without it a rank still finishing the
//! previous call would read the next call's pieces into unexpected-message buffers (an
//! allocation, zero-fill and extra copy per piece, the bulk of the gap to Open MPI's tcp).

use sucl_core::algorithms::AlgoConfig;
use sucl_core::backend::{CollDesc, ReqId};
use sucl_core::chunk::{block_range, bytes, pieces};
use sucl_core::dtype::{finish_reduce, reduce_bytes, reduce_bytes_into, reduce_bytes_left};
use sucl_core::engine::Engine;
use sucl_core::Result;

/// Largest call (bytes) whose ranks swap whole buffers rather than halves: below it a call is
/// bound by its one-way trips (three for halves: ready, raw, reduced), above it by copies and
/// reductions. A constant, so every rank picks the same protocol for a call.
pub(crate) const WHOLE_EXCHANGE_MAX: usize = 256 << 10;

/// Whether [`all_reduce`] serves this call: two ranks, a reduction past the latency-bound
/// sizes, at least one element per half.
pub(crate) fn serves(size: usize, cfg: &AlgoConfig, desc: &CollDesc) -> bool {
    size == 2 && desc.count >= 2 && desc.count * desc.dtype.size() > cfg.small_bytes
}

/// All-reduce of `buf` (input in `send`, or in `buf` itself when `None`) between the two ranks
/// of `e` (see the module documentation).
pub(crate) fn all_reduce(e: &mut Engine, cfg: &AlgoConfig, desc: &CollDesc, send: Option<&[u8]>, buf: &mut [u8]) -> Result<()> {
    let name = desc.op.name();
    e.check_usable(name)?;
    e.set_activity(name);
    let r = if buf.len() <= WHOLE_EXCHANGE_MAX { exchange_whole(e, desc, send, buf) } else { exchange(e, cfg, desc, send, buf) };
    e.set_activity("point-to-point");
    r?;
    finish_reduce(buf, desc.dtype, desc.redop, 2);
    Ok(())
}

fn exchange(e: &mut Engine, cfg: &AlgoConfig, desc: &CollDesc, send: Option<&[u8]>, buf: &mut [u8]) -> Result<()> {
    let tag = e.begin_collective()?;
    let meta = desc.encode();
    let (me, peer) = (e.rank(), 1 - e.rank());
    let es = desc.dtype.size();
    let count = buf.len() / es;
    let mine = bytes(block_range(count, 2, me), es);
    let theirs = bytes(block_range(count, 2, peer), es);
    let piece = cfg.piece_bytes.max(es) / es * es;
    // In place, the peer's raw pieces need a landing place of their own; otherwise they land
    // in our half of `buf` directly and our input is read from `send`.
    let mut tmp = std::mem::take(&mut e.scratch);
    if send.is_none() && tmp.len() < mine.len() {
        tmp.resize(mine.len(), 0);
    }
    let mut reqs = std::mem::take(&mut e.reqs);
    reqs.clear();
    let base = buf.as_mut_ptr();
    let src: *const u8 = send.map_or(base as *const u8, <[u8]>::as_ptr);
    let raw_dst = if send.is_some() { base.wrapping_add(mine.start) } else { tmp.as_mut_ptr() };
    let mut ready_byte = [0u8; 0];
    let res = (|| -> Result<()> {
        // SAFETY (every post below): each range lies inside `buf`, `tmp` or `send`, all of which
        // outlive this closure; every request is waited for here or cancelled below before they
        // go away. Receives target disjoint ranges (`mine` pieces in `raw_dst`, `theirs` pieces
        // of `buf`). In place, the reduced pieces of `theirs` land where our raw pieces of
        // `theirs` are read from: a reduced piece exists only after the peer received the whole
        // raw piece, so its bytes arrive after the send of that range completed (a peer breaking
        // the protocol could only spoil the values, never touch memory outside these ranges).
        let ready = unsafe { e.post_recv(peer, tag, Some(meta), ready_byte.as_mut_ptr(), 0)? };
        reqs.push(ready);
        for p in pieces(mine.len(), piece) {
            reqs.push(unsafe { e.post_recv(peer, tag, Some(meta), raw_dst.add(p.start), p.len())? });
        }
        for p in pieces(theirs.len(), piece) {
            reqs.push(unsafe { e.post_recv(peer, tag, Some(meta), base.add(theirs.start + p.start), p.len())? });
        }
        reqs.push(unsafe { e.post_send(peer, tag, meta, ready_byte.as_ptr(), 0)? });
        e.wait(ready)?;
        reqs[0] = DONE;
        for p in pieces(theirs.len(), piece) {
            reqs.push(unsafe { e.post_send(peer, tag, meta, src.add(theirs.start + p.start), p.len())? });
        }
        for (k, p) in pieces(mine.len(), piece).enumerate() {
            e.wait(reqs[1 + k])?;
            reqs[1 + k] = DONE;
            // SAFETY: the piece lies in our half of `buf`; no request reads or writes it now (its
            // receive completed above when it landed here, and its reduced send is posted only
            // after this), so this is the only reference to these bytes.
            let acc = unsafe { std::slice::from_raw_parts_mut(base.add(mine.start + p.start), p.len()) };
            match send {
                Some(s) => reduce_bytes(acc, &s[mine.start + p.start..mine.start + p.end], desc.dtype, desc.redop),
                None => reduce_bytes(acc, &tmp[p.clone()], desc.dtype, desc.redop),
            }
            reqs.push(unsafe { e.post_send(peer, tag, meta, base.add(mine.start + p.start), p.len())? });
        }
        for q in reqs.iter_mut() {
            if *q != DONE {
                e.wait(*q)?;
                *q = DONE;
            }
        }
        Ok(())
    })();
    finish(e, tmp, reqs, res)
}

/// Both ranks send their whole input after the ready handshake and reduce everything received
/// with their own, rank 0's operand on the left.
fn exchange_whole(e: &mut Engine, desc: &CollDesc, send: Option<&[u8]>, buf: &mut [u8]) -> Result<()> {
    let tag = e.begin_collective()?;
    let meta = desc.encode();
    let (me, peer) = (e.rank(), 1 - e.rank());
    let len = buf.len();
    let mut tmp = std::mem::take(&mut e.scratch);
    if tmp.len() < len {
        tmp.resize(len, 0);
    }
    let mut reqs = std::mem::take(&mut e.reqs);
    reqs.clear();
    let src: *const u8 = send.map_or(buf.as_ptr(), <[u8]>::as_ptr);
    let mut ready_byte = [0u8; 0];
    let res = (|| -> Result<()> {
        // SAFETY (every post below): the peer's input lands in `tmp[..len]`, our input is read
        // from `send` or `buf`; all outlive this closure, and every request is waited for here
        // or cancelled below before they go away. Nothing writes `buf` until our send of it
        // completed (in place, `src` is `buf`).
        let ready = unsafe { e.post_recv(peer, tag, Some(meta), ready_byte.as_mut_ptr(), 0)? };
        reqs.push(ready);
        let theirs = unsafe { e.post_recv(peer, tag, Some(meta), tmp.as_mut_ptr(), len)? };
        reqs.push(theirs);
        reqs.push(unsafe { e.post_send(peer, tag, meta, ready_byte.as_ptr(), 0)? });
        e.wait(ready)?;
        reqs[0] = DONE;
        reqs.push(unsafe { e.post_send(peer, tag, meta, src, len)? });
        for q in reqs.iter_mut() {
            if *q != DONE {
                e.wait(*q)?;
                *q = DONE;
            }
        }
        let (t, dt, op) = (&tmp[..len], desc.dtype, desc.redop);
        match (me, send) {
            (0, Some(s)) => reduce_bytes_into(buf, s, t, dt, op),
            (0, None) => reduce_bytes(buf, t, dt, op),
            (_, Some(s)) => reduce_bytes_into(buf, t, s, dt, op),
            (_, None) => reduce_bytes_left(buf, t, dt, op),
        }
        Ok(())
    })();
    finish(e, tmp, reqs, res)
}

/// Ends a call: withdraws what is still outstanding if it failed, and gives the engine its
/// scratch and request list back.
fn finish(e: &mut Engine, tmp: Vec<u8>, reqs: Vec<ReqId>, res: Result<()>) -> Result<()> {
    if res.is_err() {
        cancel_all(e, &reqs);
    }
    e.scratch = tmp;
    e.reqs = reqs;
    res
}

/// Marks a request that completed (no live request has this id: its slot index would be 2^32-1).
const DONE: ReqId = ReqId::MAX;

/// Withdraws every request still outstanding.
fn cancel_all(e: &mut Engine, reqs: &[ReqId]) {
    for &q in reqs.iter().filter(|&&q| q != DONE) {
        e.cancel(q);
    }
}
