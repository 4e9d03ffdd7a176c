//! Native v-collectives of the shm backend (gatherv, all_gatherv, scatterv, all_to_allv): the
//! same step protocol as the plain collectives, fused with the runtime's agreement step.
//!
//! **Streams.** Each rank's outgoing bytes form one *stream*: its own block (gatherv,
//! all_gatherv), or its blocks for every other rank concatenated in rank order (scatterv's
//! root, all_to_allv). Every rank derives every stream's length, and where in each stream its
//! own part lies, from the agreed counts table alone ([`VCollDesc::table`]). A step moves a
//! window of every stream at once: each rank copies its window into its own staging memory,
//! all pass one flag barrier, then each copies its parts out of the others' windows. A rank's
//! own block never goes through shared memory (one copy, send to recv).
//!
//! **The first step is the agreement.** Its mailbox payload carries the runtime's agreement
//! words, then — when every stream fits the rest of the mailbox ([`INLINE_MAX`] bytes in all)
//! — the whole streams: a small call costs one barrier, like a small plain collective; else
//! the streams' first window goes into the arena half of the step's parity. Nobody copies
//! anything out before it has compared every rank's agreement words with its own; if any
//! differ, nothing is delivered and the caller reports the disagreement. A call takes
//! `ceil(longest stream / window)` steps in all, as many as its data needs. A rank whose own
//! arguments were invalid takes the first step only (publishing no data): the step's shape
//! (publish, then raise the mailbox's and the barrier's words, then wait for every peer's
//! mailbox) does not depend on where the data goes. The descriptor words of the first step
//! (op, whether the data is inline, longest stream) must match too: ranks that agreed on the
//! table but planned differently fail with `Mismatch` instead of waiting for each other, and
//! a peer inside a plain collective sees a descriptor it cannot decode and reports that.

use super::{copy_bytes, ShmBackend, INLINE_MAX};
use sucl_core::backend::{VAgreement, VCollDesc, VCollOp};
use sucl_core::{Error, Result};

/// Op byte of a v-collective step's descriptor: above every `CollOp` code, so that a peer in a
/// plain collective sees a descriptor it cannot decode (and reports it) rather than a match.
const V_DESC: u64 = 0xf0;

/// What one rank moves in one v-collective, derived from the agreed table (reused between
/// calls: planning allocates nothing once the vectors have grown).
#[derive(Default)]
pub(super) struct VPlan {
    /// Bytes of each rank's stream.
    totals: Vec<usize>,
    /// This rank's stream: `(offset in send, bytes)` of each block, in stream order.
    segs: Vec<(usize, usize)>,
    /// Per source rank: `(offset in its stream, bytes, offset in recv)` of what this rank reads.
    reads: Vec<(usize, usize, usize)>,
    /// This rank's own block: `(offset in send, offset in recv, bytes)`.
    own: Option<(usize, usize, usize)>,
    /// The longest stream.
    longest: usize,
}

impl VPlan {
    /// Plans `d` for rank `me` of `n`, checking every block against the buffers' lengths.
    fn make(&mut self, d: &VCollDesc<'_>, n: usize, me: usize, send_len: usize, recv_len: usize) -> std::result::Result<(), String> {
        self.totals.clear();
        self.totals.resize(n, 0);
        self.segs.clear();
        self.reads.clear();
        self.reads.resize(n, (0, 0, 0));
        self.own = None;
        let t = d.table;
        let want = if d.op == VCollOp::AllToAllv { n * n } else { n };
        if t.len() != want {
            return Err(format!("a counts table of {} entries for {n} ranks", t.len()));
        }
        if d.root >= n {
            return Err(format!("root {} of {n} ranks", d.root));
        }
        let at = |v: &[usize], i: usize, what: &str| v.get(i).copied().ok_or_else(|| format!("no {what} entry {i}"));
        match d.op {
            VCollOp::Gatherv | VCollOp::AllGatherv => {
                // Every rank's stream is its block; all_gatherv's ranks read every other's,
                // gatherv's root alone reads (and publishes nothing: its block stays home).
                let all = d.op == VCollOp::AllGatherv;
                for (i, &c) in t.iter().enumerate() {
                    self.totals[i] = if all || i != d.root { c } else { 0 };
                }
                let s = at(d.send_displs, 0, "send")?;
                if all || me != d.root {
                    self.segs.push((s, t[me]));
                }
                if all || me == d.root {
                    for (i, &c) in t.iter().enumerate() {
                        let r = at(d.recv_displs, i, "recv")?;
                        if i == me {
                            self.own = Some((s, r, c));
                        } else {
                            self.reads[i] = (0, c, r);
                        }
                    }
                }
            }
            VCollOp::Scatterv => {
                let root = d.root;
                self.totals[root] = t.iter().enumerate().filter(|&(j, _)| j != root).map(|(_, &c)| c).sum();
                if me == root {
                    for (j, &c) in t.iter().enumerate() {
                        let s = at(d.send_displs, j, "send")?;
                        if j == root {
                            self.own = Some((s, at(d.recv_displs, 0, "recv")?, c));
                        } else {
                            self.segs.push((s, c));
                        }
                    }
                } else {
                    let before: usize = t[..me].iter().enumerate().filter(|&(j, _)| j != root).map(|(_, &c)| c).sum();
                    self.reads[root] = (before, t[me], at(d.recv_displs, 0, "recv")?);
                }
            }
            VCollOp::AllToAllv => {
                for i in 0..n {
                    let row = &t[i * n..(i + 1) * n];
                    self.totals[i] = row.iter().sum::<usize>() - row[i];
                    if i != me {
                        let before: usize = row[..me].iter().sum::<usize>() - if i < me { row[i] } else { 0 };
                        self.reads[i] = (before, row[me], at(d.recv_displs, i, "recv")?);
                    }
                }
                for j in 0..n {
                    let (s, c) = (at(d.send_displs, j, "send")?, t[me * n + j]);
                    if j == me {
                        self.own = Some((s, at(d.recv_displs, me, "recv")?, c));
                    } else {
                        self.segs.push((s, c));
                    }
                }
            }
        }
        if n == 1 {
            self.totals[0] = 0; // nobody reads it
        }
        self.longest = self.totals.iter().copied().max().unwrap_or(0);
        self.check(send_len, recv_len)
    }

    /// Every block this rank touches lies inside its buffers.
    fn check(&self, send_len: usize, recv_len: usize) -> std::result::Result<(), String> {
        let fits = |off: usize, len: usize, cap: usize| off.checked_add(len).is_some_and(|e| e <= cap);
        if let Some((s, _)) = self.segs.iter().find(|&&(s, c)| !fits(s, c, send_len)) {
            return Err(format!("a send block at byte {s} past the {send_len}-byte send buffer"));
        }
        if let Some((_, _, r)) = self.reads.iter().find(|&&(_, c, r)| !fits(r, c, recv_len)) {
            return Err(format!("a receive block at byte {r} past the {recv_len}-byte receive buffer"));
        }
        if let Some((s, r, c)) = self.own {
            if !fits(s, c, send_len) || !fits(r, c, recv_len) {
                return Err(format!("this rank's own block ({c} bytes, send {s}, recv {r}) outside its buffers"));
            }
        }
        Ok(())
    }
}

/// Calls `f(from, to, len)` for the part of this rank's stream (its `segs`) inside the window
/// `[a, b)`: `from` indexes the send buffer, `to` the window.
fn window_of(segs: &[(usize, usize)], a: usize, b: usize, mut f: impl FnMut(usize, usize, usize)) {
    let mut pos = 0;
    for &(s, c) in segs {
        let (lo, hi) = (pos.max(a), (pos + c).min(b));
        if lo < hi {
            f(s + lo - pos, lo - a, hi - lo);
        }
        pos += c;
        if pos >= b {
            break;
        }
    }
}

/// The part `(offset in window, offset in recv, len)` of a read `(stream offset, len, recv
/// offset)` inside the window `[a, b)`, if any.
#[inline]
fn clip(read: (usize, usize, usize), a: usize, b: usize) -> Option<(usize, usize, usize)> {
    let (p, c, r) = read;
    let (lo, hi) = (p.max(a), (p + c).min(b));
    (lo < hi).then(|| (lo - a, r + lo - p, hi - lo))
}

impl ShmBackend {
    /// See [`sucl_core::Backend::v_collective_agreeing`] and the module documentation.
    pub(super) fn v_agreeing(&mut self, agree: VAgreement<'_>, desc: Option<&VCollDesc<'_>>, send: &[u8], recv: &mut [u8]) -> Result<bool> {
        let name = desc.map_or("v-collective", |d| d.op.name());
        if self.abort.is_set() {
            self.abort.check(self.world_rank, name)?;
        }
        let (n, fw) = (self.lay.n, agree.mine.len());
        if fw == 0 || fw * 8 > INLINE_MAX || agree.all.len() != n * fw {
            return Err(Error::invalid(self.world_rank, "agreement words", format!("{fw} words per rank, {} in all", agree.all.len())));
        }
        let mut plan = std::mem::take(&mut self.vplan);
        let planned = desc.map(|d| plan.make(d, n, self.rank, send.len(), recv.len()));
        let r = self.v_run(&plan, planned, agree, desc, send, recv, name);
        self.vplan = plan;
        r
    }

    /// The steps of [`ShmBackend::v_agreeing`] once planned (`planned`: None when this rank's
    /// arguments were invalid, `Some(Err)` when its plan was).
    #[allow(clippy::too_many_arguments)]
    fn v_run(
        &mut self,
        plan: &VPlan,
        planned: Option<std::result::Result<(), String>>,
        agree: VAgreement<'_>,
        desc: Option<&VCollDesc<'_>>,
        send: &[u8],
        recv: &mut [u8],
        name: &'static str,
    ) -> Result<bool> {
        let fb = agree.mine.len() * 8;
        let good = matches!(planned, Some(Ok(())));
        let inline = good && plan.longest <= INLINE_MAX - fb;
        let w = match desc {
            Some(d) if good => [V_DESC | (d.op as u64) << 8 | (inline as u64) << 16 | (d.root as u64) << 32, plan.longest as u64],
            _ => [V_DESC | 1 << 17, 0], // never equal to a good rank's words
        };
        let h = self.begin_inline(w);
        for (k, words) in agree.mine.chunks(16).enumerate() {
            let mut b = [0u8; 128];
            for (d, w) in b.chunks_exact_mut(8).zip(words) {
                d.copy_from_slice(&w.to_ne_bytes());
            }
            self.write_inline(h, 128 * k, &b[..8 * words.len()]);
        }
        let win = self.v_window();
        if inline {
            window_of(&plan.segs, 0, plan.longest, |from, to, len| self.write_inline(h, fb + to, &send[from..from + len]));
        } else if good {
            // The first window goes with the agreement too, in the arena half of this step's
            // parity (published before the mailbox, so whoever sees the mailbox sees it).
            window_of(&plan.segs, 0, win, |from, to, len| self.publish(h, to, &send[from..from + len]));
        }
        let differs = self.end_inline(h, w, name)?;
        // Everyone's agreement words, before anything is delivered.
        let fw = agree.mine.len();
        for (j, row) in agree.all.chunks_exact_mut(fw).enumerate() {
            for (w, b) in row.iter_mut().zip(self.inline_at(j, h, 0, fb).chunks_exact(8)) {
                *w = u64::from_ne_bytes(b.try_into().expect("8 bytes"));
            }
        }
        let same = agree.all.chunks(fw).all(|row| row == agree.mine);
        let Some(Ok(())) = planned else {
            return match planned {
                Some(Err(why)) if same => Err(Error::invalid(self.world_rank, "v-collective blocks", why)),
                _ => Ok(false),
            };
        };
        if !same {
            return Ok(false);
        }
        if differs {
            return Err(self.v_plan_mismatch(h, w, name));
        }
        if inline {
            self.v_read_window(plan, recv, 0, plan.longest, |me, j, at, len| me.inline_at(j, h, fb + at, len));
        } else {
            self.v_read_window(plan, recv, 0, win, |me, j, at, len| me.peek(j, h, at, len));
            self.v_arena_steps(plan, send, recv, name)?;
        }
        if let Some((s, r, c)) = plan.own {
            copy_bytes(&mut recv[r..r + c], &send[s..s + c]);
        }
        Ok(true)
    }

    /// Ranks that agreed on the table but not on the steps: names the first that differs.
    #[cold]
    fn v_plan_mismatch(&self, h: usize, w: [u64; 2], name: &str) -> Error {
        let peer = (0..self.lay.n).find(|&j| {
            let m = self.ctl.mailbox(j, h);
            [m[1].load(std::sync::atomic::Ordering::Relaxed), m[2].load(std::sync::atomic::Ordering::Relaxed)] != w
        });
        let peer = self.engine.world_rank(peer.unwrap_or(self.rank));
        Error::Mismatch {
            rank: self.world_rank,
            what: format!("{name}: rank {peer} planned other steps (descriptor differs from rank {}'s)", self.world_rank),
        }
    }

    /// Copies this rank's parts of every other stream's window `[a, b)` into `recv`; `src(self,
    /// rank, at, len)` gives bytes of a rank's published window.
    #[inline]
    fn v_read_window<'s>(
        &'s self,
        plan: &VPlan,
        recv: &mut [u8],
        a: usize,
        b: usize,
        src: impl Fn(&'s Self, usize, usize, usize) -> &'s [u8],
    ) {
        for (j, &read) in plan.reads.iter().enumerate() {
            if j == self.rank || read.1 == 0 {
                continue;
            }
            if let Some((at, to, len)) = clip(read, a, b) {
                copy_bytes(&mut recv[to..to + len], src(self, j, at, len));
            }
        }
    }

    /// Bytes of a v-collective arena step's window per rank: `shm.chunk_bytes` (the same on
    /// every rank), large enough that the barrier is a small part of a step, small enough that a
    /// window one core wrote is still in cache when the others copy it out. Measured at 2 ranks
    /// (bench/results/vcoll): 128 KiB to 512 KiB windows take 0.6–0.8× the time of whole
    /// 4 MiB halves from 1 MiB to 64 MiB.
    fn v_window(&self) -> usize {
        self.cfg.shm_chunk_bytes.clamp(4096, self.half_bytes())
    }

    /// The arena steps of a call whose streams do not fit the mailbox, after the first (which
    /// moved window 0 with the agreement): window `k` of every stream in step `k`.
    fn v_arena_steps(&mut self, plan: &VPlan, send: &[u8], recv: &mut [u8], name: &'static str) -> Result<()> {
        let win = self.v_window();
        let steps = plan.longest.div_ceil(win);
        for k in 1..steps {
            let (a, b) = (k * win, (k + 1) * win);
            let h = self.begin_step(None);
            window_of(&plan.segs, a, b, |from, to, len| self.publish(h, to, &send[from..from + len]));
            self.barrier(name)?;
            self.v_read_window(plan, recv, a, b, |me, j, at, len| me.peek(j, h, at, len));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(op: VCollOp, root: usize, me: usize, n: usize, table: &[usize], sd: &[usize], rd: &[usize]) -> VPlan {
        let mut p = VPlan::default();
        let d = VCollDesc { op, root, send_counts: &[], send_displs: sd, recv_counts: &[], recv_displs: rd, table };
        p.make(&d, n, me, 1 << 20, 1 << 20).expect("plan");
        p
    }

    #[test]
    fn all_to_allv_reads_its_part_of_each_stream() {
        // 3 ranks; row i = what i sends to 0, 1, 2.
        let t = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        let p = plan(VCollOp::AllToAllv, 0, 1, 3, &t, &[100, 200, 300], &[10, 20, 30]);
        assert_eq!(p.totals, vec![2 + 3, 4 + 6, 7 + 8]);
        // From rank 0: its stream is [to 1: 2 bytes][to 2: 3 bytes]; ours starts at 0.
        assert_eq!(p.reads[0], (0, 2, 10));
        // From rank 2: [to 0: 7][to 1: 8]; ours starts at 7.
        assert_eq!(p.reads[2], (7, 8, 30));
        assert_eq!(p.segs, vec![(100, 4), (300, 6)]);
        assert_eq!(p.own, Some((200, 20, 5)));
        assert_eq!(p.longest, 15);
    }

    #[test]
    fn scatterv_and_gatherv_skip_the_roots_own_block() {
        let t = [3, 0, 5, 2];
        let s = plan(VCollOp::Scatterv, 2, 3, 4, &t, &[], &[0]);
        assert_eq!(s.totals, vec![0, 0, 5, 0], "the root's stream: blocks for 0, 1, 3");
        assert_eq!(s.reads[2], (3, 2, 0), "rank 3's block follows rank 0's and 1's");
        let r = plan(VCollOp::Scatterv, 2, 2, 4, &t, &[9, 8, 7, 6], &[0]);
        assert_eq!(r.segs, vec![(9, 3), (8, 0), (6, 2)]);
        assert_eq!(r.own, Some((7, 0, 5)));
        let g = plan(VCollOp::Gatherv, 1, 1, 4, &t, &[0], &[40, 30, 20, 10]);
        assert_eq!(g.totals, vec![3, 0, 5, 2]);
        assert!(g.segs.is_empty(), "the root publishes nothing");
        assert_eq!((g.reads[0], g.reads[3], g.own), ((0, 3, 40), (0, 2, 10), Some((0, 30, 0))));
    }

    #[test]
    fn windows_split_streams_at_any_boundary() {
        let segs = [(100, 3), (0, 0), (200, 4)];
        let mut got = vec![];
        for (a, b) in [(0, 2), (2, 5), (5, 100)] {
            window_of(&segs, a, b, |from, to, len| got.push((a, from, to, len)));
        }
        assert_eq!(got, vec![(0, 100, 0, 2), (2, 102, 0, 1), (2, 200, 1, 2), (5, 202, 0, 2)]);
        assert_eq!(clip((3, 4, 50), 0, 5), Some((3, 50, 2)));
        assert_eq!(clip((3, 4, 50), 5, 10), Some((0, 52, 2)));
        assert_eq!(clip((3, 4, 50), 7, 10), None);
    }

    #[test]
    fn blocks_outside_the_buffers_are_refused() {
        let mut p = VPlan::default();
        let t = [4, 4];
        let d = VCollDesc {
            op: VCollOp::AllGatherv,
            root: 0,
            send_counts: &[],
            send_displs: &[0],
            recv_counts: &[],
            recv_displs: &[0, 6],
            table: &t,
        };
        let e = p.make(&d, 2, 0, 4, 8).unwrap_err();
        assert!(e.contains("past the 8-byte receive buffer"), "{e}");
        let short = [4];
        let d = VCollDesc { table: &short, ..d };
        assert!(p.make(&d, 2, 0, 4, 16).is_err());
    }
}
