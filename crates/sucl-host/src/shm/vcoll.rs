//! Native v-collectives of the shm backend (gatherv, all_gatherv, scatterv, all_to_allv): the
//! same step protocol as the plain collectives, fused with the runtime's agreement step.
//!
//! **Slots.** In every step each rank copies part of its outgoing blocks into its own staging
//! memory (a *window*: the mailbox payload, or an arena half), all pass one synchronization,
//! then each copies its parts out of the others' windows. Where a block goes in a window is a
//! *slot*: `per` bytes at offset `at`, block bytes `k × per ..` in step `k`. gatherv's and
//! all_gatherv's blocks go to everyone alike, so a rank's window is one slot that all readers
//! share. scatterv's root and all_to_allv's ranks send a different block to each rank: their
//! window is cut into one slot per destination, sized in proportion to the blocks, so that every
//! destination reads in every step (all ranks copy at once, and every block finishes in about
//! the same step). Every rank derives every slot, and the number of steps, from the agreed
//! counts table alone ([`VCollDesc::table`]). A rank's own block never goes through shared
//! memory (one copy, send to recv).
//!
//! **The first step is the agreement.** Its mailbox payload carries the runtime's agreement
//! words, then — when every rank's outgoing bytes fit the rest of the mailbox ([`INLINE_MAX`]
//! bytes in all; slots then hold whole blocks) — the data: a small call costs one
//! synchronization, like a small plain collective; else the first step's slots go into the
//! arena half of its parity and the call takes as many steps as its largest block needs
//! (`shm.chunk_bytes` windows). Nobody copies anything out before it has compared every rank's
//! agreement words with its own; if any differ, nothing is delivered and the caller reports the
//! disagreement. A rank whose own arguments were invalid takes the first step only (publishing
//! no data): the step's shape (publish, then raise the mailbox's and the barrier's words, then
//! wait for every peer's mailbox) does not depend on where the data goes. The descriptor words
//! of the first step (op, root, whether the data is inline, step count) must match too: ranks
//! that agreed on the table but planned differently fail with `Mismatch` instead of waiting
//! for each other, and a peer inside a plain collective sees a descriptor it cannot decode and
//! reports that.

use super::{copy_bytes, ShmBackend, INLINE_MAX};
use sucl_core::backend::{VAgreement, VCollDesc, VCollOp};
use sucl_core::{Error, Result};

/// Op byte of a v-collective step's descriptor: above every `CollOp` code, so that a peer in a
/// plain collective sees a descriptor it cannot decode (and reports it) rather than a match.
const V_DESC: u64 = 0xf0;

/// One block in the windows of a call: `len` bytes at `buf` in this rank's send buffer (an
/// outgoing block) or receive buffer (an incoming one), `per` bytes a step in the slot at
/// offset `at` of the sender's window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Slot {
    buf: usize,
    len: usize,
    at: usize,
    per: usize,
}

impl Slot {
    /// The piece `(offset in the block, bytes)` that travels in step `k`, if any.
    #[inline]
    fn piece(&self, k: usize) -> Option<(usize, usize)> {
        let a = k.checked_mul(self.per)?;
        (a < self.len).then(|| (a, self.per.min(self.len - a)))
    }

    #[cfg(test)]
    fn steps(&self) -> usize {
        if self.len == 0 {
            0
        } else {
            self.len.div_ceil(self.per)
        }
    }
}

/// What one rank moves in one v-collective, derived from the agreed table (reused between
/// calls: planning allocates nothing once the vectors have grown).
#[derive(Default)]
pub(super) struct VPlan {
    /// This rank's outgoing blocks (send offsets), except its own.
    outs: Vec<Slot>,
    /// Per source rank: the block this rank reads from it (receive offset; `len` 0: none).
    ins: Vec<Slot>,
    /// This rank's own block: `(offset in send, offset in recv, bytes)`.
    own: Option<(usize, usize, usize)>,
    /// Whether the data travels in the mailbox (one step).
    inline: bool,
    /// Steps of the call (0: nothing moves between ranks).
    steps: usize,
    /// `(at, per)` of each destination in one sender's window (scratch).
    row: Vec<(usize, usize)>,
}

/// Entry `i` of a displacement table, or why there is none.
fn at(v: &[usize], i: usize, what: &str) -> std::result::Result<usize, String> {
    v.get(i).copied().ok_or_else(|| format!("no {what} displacement {i}"))
}

/// `a × b / c` without overflow (c > 0, result ≤ a when b ≤ c).
fn mul_div(a: usize, b: usize, c: usize) -> usize {
    (a as u128 * b as u128 / c as u128) as usize
}

/// Cuts a window into the slots of one sender's blocks `counts(0..n)` (0 for none), in rank
/// order, into `row`; returns the steps they take. Inline, every slot holds its whole block
/// (the caller checked that they fit). Otherwise `win` bytes are shared in proportion to the
/// blocks, in multiples of a granule (64 bytes, less for very many ranks) with one granule
/// more each: `per_j = g × (⌊B × c_j / (total × g)⌋ + 1)` with `B = win − g × blocks`, so the
/// slots fit (`Σ per ≤ B + g × blocks = win`) and no block needs more than `⌈total / B⌉` steps.
/// A window cannot be cut for more blocks than half its bytes (thousands of ranks): an error.
fn cut_window(
    row: &mut Vec<(usize, usize)>,
    n: usize,
    counts: impl Fn(usize) -> usize,
    inline: bool,
    win: usize,
) -> std::result::Result<usize, String> {
    row.clear();
    let (total, blocks) = (0..n).map(&counts).fold((0, 0), |(t, b), c| (t + c, b + usize::from(c > 0)));
    if !inline && 2 * blocks > win {
        return Err(format!("{blocks} blocks from one rank do not fit a {win}-byte window (raise shm.chunk_bytes)"));
    }
    let g = (win / (2 * blocks.max(1))).clamp(1, 64);
    let budget = win - g * blocks;
    let (mut at, mut steps) = (0, 0);
    for j in 0..n {
        let c = counts(j);
        let per = match (c, inline) {
            (0, _) => 0,
            (_, true) => c,
            (_, false) => g * (mul_div(budget, c, total) / g + 1),
        };
        row.push((at, per));
        at += per;
        if c > 0 {
            steps = steps.max(c.div_ceil(per));
        }
    }
    Ok(steps)
}

impl VPlan {
    /// Plans `d` for rank `me` of `n`: inline if every rank's outgoing bytes fit `cap`, else in
    /// windows of `win` bytes; checks every block against the buffers' lengths.
    #[allow(clippy::too_many_arguments)]
    fn make(
        &mut self,
        d: &VCollDesc<'_>,
        n: usize,
        me: usize,
        send_len: usize,
        recv_len: usize,
        cap: usize,
        win: usize,
    ) -> std::result::Result<(), String> {
        self.outs.clear();
        self.ins.clear();
        self.ins.resize(n, Slot::default());
        self.own = None;
        let t = d.table;
        let want = if d.op == VCollOp::AllToAllv { n * n } else { n };
        if t.len() != want {
            return Err(format!("a counts table of {} entries for {n} ranks", t.len()));
        }
        if d.root >= n {
            return Err(format!("root {} of {n} ranks", d.root));
        }
        match d.op {
            VCollOp::Gatherv | VCollOp::AllGatherv => self.plan_shared(d, n, me, cap, win)?,
            VCollOp::Scatterv | VCollOp::AllToAllv => self.plan_personal(d, n, me, cap, win)?,
        }
        self.check(send_len, recv_len)
    }

    /// gatherv and all_gatherv: each rank's block, one slot read by all (all_gatherv) or by
    /// the root (gatherv, whose own block stays home).
    fn plan_shared(&mut self, d: &VCollDesc<'_>, n: usize, me: usize, cap: usize, win: usize) -> std::result::Result<(), String> {
        let (t, all) = (d.table, d.op == VCollOp::AllGatherv);
        let sends = |i: usize| n > 1 && (all || i != d.root);
        let longest = (0..n).filter(|&i| sends(i)).map(|i| t[i]).max().unwrap_or(0);
        self.inline = longest <= cap;
        let per = |c: usize| if self.inline { c } else { win };
        self.steps = (0..n).filter(|&i| sends(i) && t[i] > 0).map(|i| t[i].div_ceil(per(t[i]))).max().unwrap_or(0);
        let s = at(d.send_displs, 0, "send")?;
        if sends(me) && t[me] > 0 {
            self.outs.push(Slot { buf: s, len: t[me], at: 0, per: per(t[me]) });
        }
        if all || me == d.root {
            for (i, &c) in t.iter().enumerate() {
                let r = at(d.recv_displs, i, "recv")?;
                if i == me {
                    self.own = Some((s, r, c));
                } else if c > 0 {
                    self.ins[i] = Slot { buf: r, len: c, at: 0, per: per(c) };
                }
            }
        }
        Ok(())
    }

    /// scatterv and all_to_allv: every sender's window cut into one slot per destination.
    fn plan_personal(&mut self, d: &VCollDesc<'_>, n: usize, me: usize, cap: usize, win: usize) -> std::result::Result<(), String> {
        let t = d.table;
        let a2a = d.op == VCollOp::AllToAllv;
        // Bytes from sender `i` to `j`, the own block excluded; scatterv's root alone sends.
        let count = |i: usize, j: usize| match (i == j, a2a) {
            (true, _) => 0,
            (false, true) => t[i * n + j],
            (false, false) if i == d.root => t[j],
            _ => 0,
        };
        let senders = if a2a { 0..n } else { d.root..d.root + 1 };
        let longest = senders.clone().map(|i| (0..n).map(|j| count(i, j)).sum::<usize>()).max().unwrap_or(0);
        self.inline = longest <= cap;
        self.steps = 0;
        let mut row = std::mem::take(&mut self.row);
        for i in senders {
            let steps = cut_window(&mut row, n, |j| count(i, j), self.inline, win);
            let Ok(steps) = steps else {
                self.row = row;
                return steps.map(|_| ());
            };
            self.steps = self.steps.max(steps);
            if i == me {
                for (j, &(w, per)) in row.iter().enumerate().filter(|&(j, _)| j != me) {
                    let s = at(d.send_displs, j, "send")?;
                    self.outs.push(Slot { buf: s, len: count(me, j), at: w, per });
                }
            } else if count(i, me) > 0 {
                let r = at(d.recv_displs, if a2a { i } else { 0 }, "recv")?;
                let (w, per) = row[me];
                self.ins[i] = Slot { buf: r, len: count(i, me), at: w, per };
            }
        }
        self.row = row;
        let own = if a2a { Some(t[me * n + me]) } else { (me == d.root).then(|| t[me]) };
        if let Some(c) = own {
            self.own = Some((at(d.send_displs, me, "send")?, at(d.recv_displs, if a2a { me } else { 0 }, "recv")?, c));
        }
        Ok(())
    }

    /// Every block this rank touches lies inside its buffers.
    fn check(&self, send_len: usize, recv_len: usize) -> std::result::Result<(), String> {
        let fits = |off: usize, len: usize, cap: usize| off.checked_add(len).is_some_and(|e| e <= cap);
        if let Some(o) = self.outs.iter().find(|o| !fits(o.buf, o.len, send_len)) {
            return Err(format!("a send block at byte {} past the {send_len}-byte send buffer", o.buf));
        }
        if let Some(i) = self.ins.iter().find(|i| !fits(i.buf, i.len, recv_len)) {
            return Err(format!("a receive block at byte {} past the {recv_len}-byte receive buffer", i.buf));
        }
        if let Some((s, r, c)) = self.own {
            if !fits(s, c, send_len) || !fits(r, c, recv_len) {
                return Err(format!("this rank's own block ({c} bytes, send {s}, recv {r}) outside its buffers"));
            }
        }
        Ok(())
    }
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
        let (cap, win) = (INLINE_MAX - fw * 8, self.v_window());
        let planned = desc.map(|d| plan.make(d, n, self.rank, send.len(), recv.len(), cap, win));
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
        let w = match desc {
            Some(d) if good => [V_DESC | (d.op as u64) << 8 | (plan.inline as u64) << 16 | (d.root as u64) << 32, plan.steps as u64],
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
        if good && plan.inline {
            self.v_write(plan, send, 0, |me, at, src| me.write_inline(h, fb + at, src));
        } else if good {
            // The first step's slots go with the agreement, in the arena half of its parity
            // (published before the mailbox, so whoever sees the mailbox sees them).
            self.v_write(plan, send, 0, |me, at, src| me.publish(h, at, src));
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
        if plan.inline {
            self.v_read(plan, recv, 0, |me, j, at, len| me.inline_at(j, h, fb + at, len));
        } else {
            self.v_read(plan, recv, 0, |me, j, at, len| me.peek(j, h, at, len));
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

    /// Step `k`'s pieces of this rank's outgoing blocks: `put(self, at, bytes)` copies one to
    /// offset `at` of this rank's window.
    #[inline]
    fn v_write(&self, plan: &VPlan, send: &[u8], k: usize, put: impl Fn(&Self, usize, &[u8])) {
        for o in &plan.outs {
            if let Some((a, len)) = o.piece(k) {
                put(self, o.at, &send[o.buf + a..o.buf + a + len]);
            }
        }
    }

    /// Step `k`'s pieces of the blocks this rank reads, into `recv`; `src(self, rank, at, len)`
    /// gives bytes of a rank's published window.
    #[inline]
    fn v_read<'s>(&'s self, plan: &VPlan, recv: &mut [u8], k: usize, src: impl Fn(&'s Self, usize, usize, usize) -> &'s [u8]) {
        for (j, i) in plan.ins.iter().enumerate() {
            if let Some((a, len)) = i.piece(k) {
                copy_bytes(&mut recv[i.buf + a..i.buf + a + len], src(self, j, i.at, len));
            }
        }
    }

    /// Bytes of a v-collective arena step's window per rank: `shm.chunk_bytes` (the same on
    /// every rank), large enough that the barrier is a small part of a step, small enough that a
    /// window one core wrote is still in cache when the others copy it out. Measured at 2 ranks
    /// (docs/results.md, "History"): 128 KiB to 512 KiB windows take 0.6–0.8× the time of
    /// whole 4 MiB halves from 1 MiB to 64 MiB.
    fn v_window(&self) -> usize {
        self.cfg.shm_chunk_bytes.clamp(4096, self.half_bytes())
    }

    /// The arena steps after the first (which moved with the agreement).
    fn v_arena_steps(&mut self, plan: &VPlan, send: &[u8], recv: &mut [u8], name: &'static str) -> Result<()> {
        for k in 1..plan.steps {
            let h = self.begin_step(None);
            self.v_write(plan, send, k, |me, at, src| me.publish(h, at, src));
            self.barrier(name)?;
            self.v_read(plan, recv, k, |me, j, at, len| me.peek(j, h, at, len));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: usize = 4000;
    const WIN: usize = 4096;

    fn plan(op: VCollOp, root: usize, me: usize, n: usize, table: &[usize], sd: &[usize], rd: &[usize]) -> VPlan {
        let mut p = VPlan::default();
        let d = VCollDesc { op, root, send_counts: &[], send_displs: sd, recv_counts: &[], recv_displs: rd, table };
        p.make(&d, n, me, 1 << 30, 1 << 30, CAP, WIN).expect("plan");
        p
    }

    #[test]
    fn inline_all_to_allv_packs_each_senders_blocks_in_rank_order() {
        // 3 ranks; row i = what i sends to 0, 1, 2.
        let t = [1, 2, 3, 4, 5, 6, 7, 8, 9];
        let p = plan(VCollOp::AllToAllv, 0, 1, 3, &t, &[100, 200, 300], &[10, 20, 30]);
        assert!(p.inline && p.steps == 1);
        // Rank 0's window: [to 1: 2 bytes][to 2: 3 bytes]; ours first.
        assert_eq!(p.ins[0], Slot { buf: 10, len: 2, at: 0, per: 2 });
        // Rank 2's window: [to 0: 7][to 1: 8]; ours after rank 0's.
        assert_eq!(p.ins[2], Slot { buf: 30, len: 8, at: 7, per: 8 });
        assert_eq!(p.outs, vec![Slot { buf: 100, len: 4, at: 0, per: 4 }, Slot { buf: 300, len: 6, at: 4, per: 6 }]);
        assert_eq!(p.own, Some((200, 20, 5)));
    }

    #[test]
    fn large_all_to_allv_gives_every_destination_a_slot_in_every_step() {
        // Rank 0 sends 30000 bytes to 1 and 10000 to 2: slots of about 3:1 of the window.
        let t = [0, 30000, 10000, 5000, 0, 5000, 1, 1, 0];
        let p = plan(VCollOp::AllToAllv, 0, 0, 3, &t, &[0, 0, 0], &[0, 0, 0]);
        assert!(!p.inline);
        let [a, b] = [p.outs[0], p.outs[1]];
        assert!(a.at == 0 && b.at == a.per && a.per + b.per <= WIN, "{a:?} {b:?}");
        assert!(a.per > 2 * b.per && b.per > 0, "proportional: {a:?} {b:?}");
        assert_eq!(p.steps, a.steps().max(b.steps()));
        assert!(p.steps <= 40000usize.div_ceil(WIN - 2 * 64), "no more steps than the window needs: {}", p.steps);
        // Each block's pieces tile it exactly.
        for s in [a, b] {
            let got: usize = (0..p.steps).filter_map(|k| s.piece(k)).map(|(_, len)| len).sum();
            assert_eq!(got, s.len);
        }
    }

    #[test]
    fn scatterv_and_gatherv_keep_the_roots_own_block_home() {
        let t = [3, 0, 5, 2];
        let s = plan(VCollOp::Scatterv, 2, 3, 4, &t, &[], &[0]);
        assert_eq!(s.ins[2], Slot { buf: 0, len: 2, at: 3, per: 2 }, "rank 3's block follows rank 0's");
        assert!(s.outs.is_empty() && s.own.is_none());
        let r = plan(VCollOp::Scatterv, 2, 2, 4, &t, &[9, 8, 7, 6], &[0]);
        assert_eq!(r.outs.iter().map(|o| (o.buf, o.len)).collect::<Vec<_>>(), vec![(9, 3), (8, 0), (6, 2)]);
        assert_eq!(r.own, Some((7, 0, 5)));
        let g = plan(VCollOp::Gatherv, 1, 1, 4, &t, &[0], &[40, 30, 20, 10]);
        assert!(g.outs.is_empty(), "the root publishes nothing");
        assert_eq!((g.ins[0].len, g.ins[3].buf, g.own), (3, 10, Some((0, 30, 0))));
        let big = [9000, 20, 0, 1];
        let g = plan(VCollOp::AllGatherv, 0, 3, 4, &big, &[0], &[0, 9000, 9020, 9020]);
        assert!(!g.inline);
        assert_eq!((g.steps, g.ins[0].per, g.ins[1].per), (3, WIN, WIN), "one shared slot: the whole window");
    }

    #[test]
    fn windows_cut_for_many_ranks_still_fit() {
        let mut row = vec![];
        for n in [1, 2, 7, 64, 3000] {
            let counts = |j: usize| if j.is_multiple_of(3) { 0 } else { 1 + j * 1000 };
            let steps = cut_window(&mut row, n, counts, false, WIN).expect("fits");
            let used: usize = row.iter().map(|r| r.1).sum();
            assert!(used <= WIN, "{n} ranks: slots of {used} bytes in a {WIN}-byte window");
            let total: usize = (0..n).map(counts).sum();
            let need = (0..n).filter(|&j| counts(j) > 0).map(|j| counts(j).div_ceil(row[j].1)).max().unwrap_or(0);
            assert_eq!(steps, need);
            if total > 0 && n <= 64 {
                assert!(steps <= total.div_ceil(WIN / 2), "{n} ranks: {steps} steps for {total} bytes");
            }
        }
        let e = cut_window(&mut row, 9000, |_| 5, false, WIN).unwrap_err();
        assert!(e.contains("9000 blocks from one rank do not fit a 4096-byte window"), "{e}");
        assert_eq!(cut_window(&mut row, 9000, |j| usize::from(j == 7), true, WIN), Ok(1), "inline: whole blocks, no cut");
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
        let e = p.make(&d, 2, 0, 4, 8, CAP, WIN).unwrap_err();
        assert!(e.contains("past the 8-byte receive buffer"), "{e}");
        let short = [4];
        let d = VCollDesc { table: &short, ..d };
        assert!(p.make(&d, 2, 0, 4, 16, CAP, WIN).is_err());
    }
}
