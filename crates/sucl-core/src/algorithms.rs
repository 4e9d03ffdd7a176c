//! Generic collective algorithms over the point-to-point [`Engine`], chosen by message size:
//! recursive doubling and binomial trees for small messages (latency: log2 n steps), rings and
//! pipelined chains for large ones (bandwidth: every link busy, each byte sent ~once per rank).
//! Any backend with an engine gets every collective from here.

use crate::backend::{CollDesc, CollOp, ReqId};
use crate::chunk::{block_range, bytes, pieces};
use crate::dtype::{finish_reduce, reduce_bytes, reduce_bytes_into};
use crate::engine::Engine;
use crate::error::Result;

/// Tuning knobs of the generic algorithms.
#[derive(Clone, Copy, Debug)]
pub struct AlgoConfig {
    /// Messages up to this many bytes use latency-optimal algorithms.
    pub small_bytes: usize,
    /// Pipeline piece size of rings and chains.
    pub piece_bytes: usize,
}

impl Default for AlgoConfig {
    fn default() -> Self {
        AlgoConfig { small_bytes: 64 << 10, piece_bytes: 256 << 10 }
    }
}

/// Runs one collective over `e` (the `send`/`recv` convention of [`crate::Backend::collective`]).
pub fn run(e: &mut Engine, cfg: &AlgoConfig, desc: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
    e.check_usable(desc.op.name())?;
    e.set_activity(desc.op.name());
    let tag = e.begin_collective()?;
    let meta = desc.encode();
    let c = Ctx { tag, meta, desc: *desc, cfg: *cfg };
    let r = match desc.op {
        CollOp::Barrier => barrier(e, &c),
        CollOp::Broadcast => broadcast(e, &c, recv),
        CollOp::AllReduce => all_reduce(e, &c, send, recv),
        CollOp::Reduce => reduce(e, &c, send, recv),
        CollOp::Gather => gather(e, &c, send, recv),
        CollOp::AllGather => all_gather(e, &c, send, recv),
        CollOp::Scatter => scatter(e, &c, send, recv),
        CollOp::AllToAll => all_to_all(e, &c, send.expect("all_to_all needs a send buffer"), recv),
        CollOp::ReduceScatter => reduce_scatter(e, &c, send.expect("reduce_scatter needs a send buffer"), recv),
    };
    e.set_activity("point-to-point");
    r
}

struct Ctx {
    tag: u64,
    meta: [u64; 2],
    desc: CollDesc,
    cfg: AlgoConfig,
}

fn barrier(e: &mut Engine, c: &Ctx) -> Result<()> {
    let (r, n) = (e.rank(), e.size());
    let mut k = 1;
    while k < n {
        e.sendrecv((r + k) % n, &[], (r + n - k) % n, &mut [], c.tag, c.meta)?;
        k <<= 1;
    }
    Ok(())
}

fn broadcast(e: &mut Engine, c: &Ctx, buf: &mut [u8]) -> Result<()> {
    let (r, n) = (e.rank(), e.size());
    if n == 1 {
        return Ok(());
    }
    let root = c.desc.root;
    let vr = (r + n - root) % n;
    let real = |v: usize| (v + root) % n;
    if buf.len() <= c.cfg.small_bytes || n == 2 && buf.len() <= c.cfg.piece_bytes {
        // Binomial tree.
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                e.recv(real(vr - mask), c.tag, Some(c.meta), buf)?;
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if vr + mask < n {
                e.send(real(vr + mask), c.tag, c.meta, buf)?;
            }
            mask >>= 1;
        }
        return Ok(());
    }
    // Pipelined chain in virtual-rank order: piece k moves on while piece k+1 arrives.
    let next = (vr + 1 < n).then(|| real(vr + 1));
    let prev = (vr > 0).then(|| real(vr - 1));
    let mut recvs = std::mem::take(&mut e.reqs);
    recvs.clear();
    let mut sends = Vec::new();
    let res = (|| -> Result<()> {
        let ptr = buf.as_mut_ptr();
        if let Some(p) = prev {
            for rg in pieces(buf.len(), c.cfg.piece_bytes) {
                // SAFETY: piece `rg` lies inside `buf`, which stays mutably borrowed by this call;
                // every request is waited for or cancelled before the call returns.
                recvs.push(unsafe { e.post_recv(p, c.tag, Some(c.meta), ptr.add(rg.start), rg.len())? });
            }
        }
        for (k, rg) in pieces(buf.len(), c.cfg.piece_bytes).enumerate() {
            if prev.is_some() {
                e.wait(recvs[k])?;
                recvs[k] = 0;
            }
            if let Some(nx) = next {
                // SAFETY: piece `rg` lies inside `buf` and its receive (if any) completed above, so
                // no request writes it while this send reads it; waited for or cancelled before
                // the call returns.
                sends.push(unsafe { e.post_send(nx, c.tag, c.meta, ptr.add(rg.start), rg.len())? });
            }
        }
        for &s in &sends {
            e.wait(s)?;
        }
        sends.clear();
        Ok(())
    })();
    if res.is_err() {
        for &q in recvs.iter().chain(&sends) {
            e.cancel(q);
        }
    }
    e.reqs = recvs;
    res
}

fn all_reduce(e: &mut Engine, c: &Ctx, send: Option<&[u8]>, buf: &mut [u8]) -> Result<()> {
    let n = e.size();
    let es = c.desc.dtype.size();
    if n == 1 || buf.len() <= c.cfg.small_bytes || c.desc.count < n {
        if let Some(s) = send {
            buf.copy_from_slice(s);
        }
        if n > 1 && !buf.is_empty() {
            recursive_doubling(e, c, buf)?;
        }
    } else {
        // No up-front copy of the input: the ring reads it where it lies.
        ring_reduce_scatter(e, c, send, buf)?;
        ring_all_gather(e, c, buf, es)?;
    }
    finish_reduce(buf, c.desc.dtype, c.desc.redop, n);
    Ok(())
}

fn recursive_doubling(e: &mut Engine, c: &Ctx, buf: &mut [u8]) -> Result<()> {
    let (r, n) = (e.rank(), e.size());
    let (dt, op) = (c.desc.dtype, c.desc.redop);
    let mut tmp = std::mem::take(&mut e.scratch);
    tmp.resize(buf.len(), 0);
    let res = (|| -> Result<()> {
        let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let rem = n - p;
        let newrank = if r < 2 * rem {
            if r % 2 == 0 {
                e.send(r + 1, c.tag, c.meta, buf)?;
                None
            } else {
                e.recv(r - 1, c.tag, Some(c.meta), &mut tmp)?;
                reduce_bytes(buf, &tmp, dt, op);
                Some(r / 2)
            }
        } else {
            Some(r - rem)
        };
        if let Some(nr) = newrank {
            let mut d = 1;
            while d < p {
                let pn = nr ^ d;
                let partner = if pn < rem { pn * 2 + 1 } else { pn + rem };
                e.sendrecv(partner, buf, partner, &mut tmp, c.tag, c.meta)?;
                reduce_bytes(buf, &tmp, dt, op);
                d <<= 1;
            }
        }
        if r < 2 * rem {
            if r % 2 == 1 {
                e.send(r - 1, c.tag, c.meta, buf)?;
            } else {
                e.recv(r + 1, c.tag, Some(c.meta), buf)?;
            }
        }
        Ok(())
    })();
    e.scratch = tmp;
    res
}

/// Ring reduce-scatter: afterwards rank r's block r of `buf` (blocks by [`block_range`] over the
/// element count) holds the reduction of every rank's block r. Inputs come from `input` (or from
/// `buf` itself when `None`); other blocks of `buf` are left holding partial sums.
fn ring_reduce_scatter(e: &mut Engine, c: &Ctx, input: Option<&[u8]>, buf: &mut [u8]) -> Result<()> {
    let (r, n) = (e.rank(), e.size());
    let es = c.desc.dtype.size();
    let count = buf.len() / es;
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let mut tmp = std::mem::take(&mut e.scratch);
    let mut reqs = std::mem::take(&mut e.reqs);
    let res = (|| -> Result<()> {
        for s in 0..n - 1 {
            let sb = bytes(block_range(count, n, (r + 2 * n - s - 1) % n), es);
            let rb = bytes(block_range(count, n, (r + 2 * n - s - 2) % n), es);
            tmp.resize(rb.len().max(tmp.len()), 0);
            reqs.clear();
            let base = buf.as_mut_ptr();
            // The first step sends our own input; later ones the partial sums we computed.
            let src = match (s, input) {
                (0, Some(inp)) => inp.as_ptr(),
                _ => base as *const u8,
            };
            // Post every piece of the incoming block first so no frame arrives unexpected, then
            // send ours; reduce each piece as soon as it lands, overlapping the rest's transfer.
            for pr in pieces(rb.len(), c.cfg.piece_bytes) {
                // SAFETY: `pr` lies inside `tmp`, which nothing else touches until its receive
                // completes; all requests are completed or cancelled before tmp/buf borrows end.
                reqs.push(unsafe { e.post_recv(left, c.tag, Some(c.meta), tmp.as_mut_ptr().add(pr.start), pr.len())? });
            }
            let nrecv = reqs.len();
            for pr in pieces(sb.len(), c.cfg.piece_bytes) {
                // SAFETY: the piece lies inside the send block `sb` of `src` (the input or `buf`),
                // which nothing writes while it is in flight: the block reduced in this step is
                // `rb`, disjoint from `sb`; completed or cancelled before the borrows end.
                reqs.push(unsafe { e.post_send(right, c.tag, c.meta, src.add(sb.start + pr.start), pr.len())? });
            }
            for (k, pr) in pieces(rb.len(), c.cfg.piece_bytes).enumerate() {
                if let Err(err) = e.wait(reqs[k]) {
                    for &q in &reqs[k..] {
                        e.cancel(q);
                    }
                    return Err(err);
                }
                // SAFETY: the piece lies inside block `rb` of `buf` (borrowed mutably by this
                // call); no request reads or writes `rb` (the in-flight sends read `sb`, receives
                // land in `tmp`), so this is the only reference to these bytes.
                let acc = unsafe { std::slice::from_raw_parts_mut(base.add(rb.start + pr.start), pr.len()) };
                let got = &tmp[pr.clone()];
                match input {
                    Some(inp) => reduce_bytes_into(acc, &inp[rb.start + pr.start..rb.start + pr.end], got, c.desc.dtype, c.desc.redop),
                    None => reduce_bytes(acc, got, c.desc.dtype, c.desc.redop),
                }
            }
            e.wait_all(&reqs[nrecv..])?;
        }
        Ok(())
    })();
    e.scratch = tmp;
    e.reqs = reqs;
    res
}

/// Ring all-gather in place of blocks by [`block_range`]: rank r contributes block r.
fn ring_all_gather(e: &mut Engine, c: &Ctx, buf: &mut [u8], es: usize) -> Result<()> {
    let (r, n) = (e.rank(), e.size());
    let count = buf.len() / es;
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let base = buf.as_mut_ptr();
    for s in 0..n - 1 {
        let sb = bytes(block_range(count, n, (r + n - s) % n), es);
        let rb = bytes(block_range(count, n, (r + 2 * n - s - 1) % n), es);
        // SAFETY: the two blocks are disjoint parts of buf.
        let (sv, rv) = unsafe {
            (std::slice::from_raw_parts(base.add(sb.start), sb.len()), std::slice::from_raw_parts_mut(base.add(rb.start), rb.len()))
        };
        e.sendrecv(right, sv, left, rv, c.tag, c.meta)?;
    }
    Ok(())
}

fn reduce(e: &mut Engine, c: &Ctx, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
    let (r, n) = (e.rank(), e.size());
    let root = c.desc.root;
    let (dt, op) = (c.desc.dtype, c.desc.redop);
    let len = c.desc.count * dt.size();
    // Work in recv on the root and in scratch elsewhere.
    let mut work = std::mem::take(&mut e.scratch2);
    let res = (|| -> Result<()> {
        let acc: &mut [u8] = if r == root {
            if let Some(s) = send {
                recv.copy_from_slice(s);
            }
            recv
        } else {
            work.clear();
            work.extend_from_slice(send.expect("non-root reduce needs a send buffer"));
            &mut work[..]
        };
        if n == 1 || len == 0 {
        } else if len <= c.cfg.small_bytes || c.desc.count < n {
            let vr = (r + n - root) % n;
            let mut tmp = std::mem::take(&mut e.scratch);
            tmp.resize(len, 0);
            let res = (|| -> Result<()> {
                let mut mask = 1;
                while mask < n {
                    if vr & mask == 0 {
                        let src = vr | mask;
                        if src < n {
                            e.recv((src + root) % n, c.tag, Some(c.meta), &mut tmp)?;
                            reduce_bytes(acc, &tmp, dt, op);
                        }
                    } else {
                        e.send((vr - mask + root) % n, c.tag, c.meta, acc)?;
                        break;
                    }
                    mask <<= 1;
                }
                Ok(())
            })();
            e.scratch = tmp;
            res?;
        } else {
            ring_reduce_scatter(e, c, None, acc)?;
            let es = dt.size();
            if r == root {
                for j in (0..n).filter(|&j| j != root) {
                    let b = bytes(block_range(c.desc.count, n, j), es);
                    e.recv(j, c.tag, Some(c.meta), &mut acc[b])?;
                }
            } else {
                let b = bytes(block_range(c.desc.count, n, r), es);
                e.send(root, c.tag, c.meta, &acc[b])?;
            }
        }
        if r == root {
            finish_reduce(acc, dt, op, n);
        }
        Ok(())
    })();
    e.scratch2 = work;
    res
}

fn gather(e: &mut Engine, c: &Ctx, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
    let (r, n) = (e.rank(), e.size());
    let root = c.desc.root;
    let blk = c.desc.count * c.desc.dtype.size();
    if r != root {
        return e.send(root, c.tag, c.meta, send.expect("non-root gather needs a send buffer"));
    }
    if let Some(s) = send {
        recv[r * blk..(r + 1) * blk].copy_from_slice(s);
    }
    let base = recv.as_mut_ptr();
    exchange(e, |e, reqs| {
        for j in (0..n).filter(|&j| j != root) {
            // SAFETY: exchange waits for or cancels every request before recv's borrow ends.
            reqs.push(unsafe { e.post_recv(j, c.tag, Some(c.meta), base.add(j * blk), blk)? });
        }
        Ok(())
    })
}

fn all_gather(e: &mut Engine, c: &Ctx, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
    let (r, n) = (e.rank(), e.size());
    let blk = c.desc.count * c.desc.dtype.size();
    if let Some(s) = send {
        recv[r * blk..(r + 1) * blk].copy_from_slice(s);
    }
    if n == 1 || blk == 0 {
        return Ok(());
    }
    // Blocks are equal here, so the ring over "n blocks of blk bytes" is block_range over n*blk
    // units of one byte.
    ring_all_gather(e, c, recv, 1).map(|_| ())
}

fn scatter(e: &mut Engine, c: &Ctx, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
    let (r, n) = (e.rank(), e.size());
    let root = c.desc.root;
    let blk = c.desc.count * c.desc.dtype.size();
    if r != root {
        e.recv(root, c.tag, Some(c.meta), recv)?;
        return Ok(());
    }
    let send = send.expect("root scatter needs a send buffer");
    recv.copy_from_slice(&send[r * blk..(r + 1) * blk]);
    exchange(e, |e, reqs| {
        for k in 1..n {
            let j = (root + k) % n;
            // SAFETY: exchange waits for or cancels every request before send's borrow ends.
            reqs.push(unsafe { e.post_send(j, c.tag, c.meta, send.as_ptr().add(j * blk), blk)? });
        }
        Ok(())
    })
}

fn all_to_all(e: &mut Engine, c: &Ctx, send: &[u8], recv: &mut [u8]) -> Result<()> {
    let (r, n) = (e.rank(), e.size());
    let blk = c.desc.count * c.desc.dtype.size();
    recv[r * blk..(r + 1) * blk].copy_from_slice(&send[r * blk..(r + 1) * blk]);
    let base = recv.as_mut_ptr();
    exchange(e, |e, reqs| {
        for k in 1..n {
            let j = (r + n - k) % n;
            // SAFETY: block j of `recv` (n blocks of `blk` bytes, checked by the caller) gets one
            // receive only; exchange waits for or cancels every request before the borrows end.
            reqs.push(unsafe { e.post_recv(j, c.tag, Some(c.meta), base.add(j * blk), blk)? });
        }
        for k in 1..n {
            let j = (r + k) % n;
            // SAFETY: block j of `send` (n blocks) is only read, and `send` is a shared borrow
            // that outlives the requests (exchange completes or cancels them first).
            reqs.push(unsafe { e.post_send(j, c.tag, c.meta, send.as_ptr().add(j * blk), blk)? });
        }
        Ok(())
    })
}

/// Posts a batch of requests with `post`, then waits for all of them; if posting or any wait
/// fails, every request of the batch is cancelled so no buffer is touched afterwards.
fn exchange(e: &mut Engine, post: impl FnOnce(&mut Engine, &mut Vec<ReqId>) -> Result<()>) -> Result<()> {
    let mut reqs = std::mem::take(&mut e.reqs);
    reqs.clear();
    let res = match post(e, &mut reqs) {
        Ok(()) => e.wait_all(&reqs),
        Err(err) => {
            for &q in &reqs {
                e.cancel(q);
            }
            Err(err)
        }
    };
    e.reqs = reqs;
    res
}

fn reduce_scatter(e: &mut Engine, c: &Ctx, send: &[u8], recv: &mut [u8]) -> Result<()> {
    let (r, n) = (e.rank(), e.size());
    let blk = c.desc.count * c.desc.dtype.size();
    let mut work = std::mem::take(&mut e.scratch2);
    work.resize(send.len().max(work.len()), 0);
    // Blocks are equal: treat the whole buffer as n*count elements so block_range(.., n, j)
    // is exactly block j. Partial sums go to `work`, inputs are read from `send`.
    let res = if n > 1 && blk > 0 {
        ring_reduce_scatter(e, c, Some(send), &mut work[..send.len()])
    } else {
        work[..send.len()].copy_from_slice(send);
        Ok(())
    };
    if res.is_ok() {
        recv.copy_from_slice(&work[r * blk..(r + 1) * blk]);
        finish_reduce(recv, c.desc.dtype, c.desc.redop, n);
    }
    e.scratch2 = work;
    res
}
