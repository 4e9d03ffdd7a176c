//! Agreement between ranks on every collective call, and what a disagreement leaves behind.
//!
//! **Checking mode** (`SUCL_CHECK_COLLECTIVES=1` or `check_collectives = true`; rank 0's value
//! holds for every rank). Before each collective, every rank contributes a fixed-size
//! fingerprint — operation, element type, reduce op (for reducing ops), root (for rooted ops),
//! count and the communicator's collective sequence number — to an all_gather of
//! [`FINGERPRINT_WORDS`] u64 words per rank. That all_gather has the same shape on every rank
//! whatever the call about to run, so it matches even when the calls do not. Every rank then
//! compares the same table and, on any difference, returns the same [`Error::Mismatch`] naming
//! each differing field with the values and the ranks that passed them — before any of the
//! call's data moves, without waiting for a timeout, on every backend (shm, tcp, mpi; device
//! calls are checked over the host backends before they are enqueued).
//!
//! Cost: one extra all_gather of `32 × ranks` bytes per collective, on the backend the selector
//! picks for it — one more latency-bound step, nothing proportional to the message. Measured
//! with `sucl bench all_reduce --min-bytes 8 --max-bytes 4K --iters 500`, without and with the
//! mode, alternating, on the 2-core development machine under a load average of ~30 (so only
//! the order of magnitude holds): 2 ranks over shm 0.4–1.1 µs → 0.8–1.8 µs per call (about
//! +0.5 µs); 4 ranks over shm 7–31 µs → 15–140 µs (2–3×, ranks outnumber cores); 2 ranks over tcp
//! 58–310 µs → 180–350 µs (about +100 µs, one more round trip). Small collectives pay about
//! one extra small collective; large ones do not notice. Off by default: a debugging mode, like
//! torch's `TORCH_DISTRIBUTED_DEBUG=DETAIL`.
//!
//! **After a disagreement** the communicator is *poisoned*: the call that found it returns
//! [`Error::Mismatch`], and every later call on the communicator (collective or point-to-point)
//! returns [`Error::Unusable`], on every backend, without running: it names the refused call and
//! the one that failed, quotes the `Mismatch` and says what to do (free the communicator, make
//! a new one). A later call is never reported as if it had disagreed itself. Without checking mode a
//! backend may find the disagreement only in the middle of a transfer (tcp: a frame whose
//! descriptor differs from the receiver's); it then also aborts the job, because the
//! connections may still hold the disagreeing call's data — ranks that were waiting, or that had
//! already returned, get the `Mismatch` from the abort at their next call (communicators of the
//! job other than the poisoned one report `Mismatch` too, naming the same disagreement).

use crate::Communicator;
use sucl_core::backend::CollDesc;
use sucl_core::{CollOp, DType, Error, ReduceOp, Result};

/// Words of one rank's fingerprint in the checking mode's all_gather.
pub const FINGERPRINT_WORDS: usize = 4;

/// Identifies a fingerprint (and its layout version), so that stray bytes are not compared.
const FINGERPRINT_MAGIC: u64 = u64::from_le_bytes(*b"SUCLchk1");

/// What every Mismatch's message contains (`Error::Mismatch`'s Display): lets an abort caused by
/// a disagreement on another rank be reported as the Mismatch it is.
const MISMATCH_MARK: &str = "ranks disagree on ";

/// The descriptor of the checking mode's own exchange: the same on every rank, always.
const CHECK_DESC: CollDesc = CollDesc { op: CollOp::AllGather, dtype: DType::U64, redop: ReduceOp::Sum, root: 0, count: FINGERPRINT_WORDS };

/// The fingerprint of collective number `seq` described by `d` (fields that `d`'s op ignores are
/// zero, so they cannot differ).
pub fn fingerprint(d: &CollDesc, seq: u64) -> [u64; FINGERPRINT_WORDS] {
    let w = d.encode();
    let count = if d.op == CollOp::Barrier { 0 } else { w[1] };
    [w[0], count, seq, FINGERPRINT_MAGIC]
}

/// One field of a fingerprint: its name and how to print its value.
struct Field {
    name: &'static str,
    value: fn(&[u64]) -> String,
}

const FIELDS: [Field; 6] = [
    Field {
        name: "operation",
        value: |w| CollOp::ALL.get((w[0] & 0xff) as usize).map_or_else(|| format!("#{}", w[0] & 0xff), |o| o.name().into()),
    },
    Field {
        name: "dtype",
        value: |w| DType::from_code((w[0] >> 8 & 0xff) as u8).map_or_else(|| format!("#{}", w[0] >> 8 & 0xff), |d| d.to_string()),
    },
    Field {
        name: "reduce op",
        value: |w| ReduceOp::from_code((w[0] >> 16 & 0xff) as u8).map_or_else(|| format!("#{}", w[0] >> 16 & 0xff), |o| o.to_string()),
    },
    Field { name: "root", value: |w| (w[0] >> 32).to_string() },
    Field { name: "count", value: |w| w[1].to_string() },
    Field { name: "collective sequence number", value: |w| w[2].to_string() },
];

/// Compares every rank's fingerprint (`all`: `FINGERPRINT_WORDS` words per rank, in rank order).
/// `None` when all agree; otherwise the same text on every rank that holds the same table: each
/// differing field with every value and the ranks that passed it.
pub fn describe_disagreement(all: &[u64], mine: &[u64; FINGERPRINT_WORDS]) -> Option<String> {
    let ranks: Vec<&[u64]> = all.chunks_exact(FINGERPRINT_WORDS).collect();
    if ranks.iter().all(|w| *w == ranks[0]) {
        return None;
    }
    let op = (FIELDS[0].value)(mine);
    if let Some(bad) = ranks.iter().position(|w| w[3] != FINGERPRINT_MAGIC) {
        return Some(format!("{op}: rank {bad} sent no valid collective fingerprint (different sucl versions?)"));
    }
    let mut diffs = vec![];
    for f in &FIELDS {
        // Values in order of first appearance, each with the ranks that passed it.
        let mut groups: Vec<(String, Vec<usize>)> = vec![];
        for (r, w) in ranks.iter().enumerate() {
            let v = (f.value)(w);
            match groups.iter_mut().find(|(g, _)| *g == v) {
                Some((_, rs)) => rs.push(r),
                None => groups.push((v, vec![r])),
            }
        }
        if groups.len() > 1 {
            let parts: Vec<String> = groups.iter().map(|(v, rs)| format!("{v} on {}", rank_list(rs))).collect();
            diffs.push(format!("{} ({})", f.name, parts.join("; ")));
        }
    }
    let first = (FIELDS[0].value)(ranks[0]);
    Some(format!("the arguments of a collective ({first} on rank 0): {}", diffs.join(", ")))
}

/// "rank 3" or "ranks 0, 2".
fn rank_list(rs: &[usize]) -> String {
    let list: Vec<String> = rs.iter().map(|r| r.to_string()).collect();
    format!("{} {}", if rs.len() == 1 { "rank" } else { "ranks" }, list.join(", "))
}

/// What poisoned a communicator: the operation that failed on this rank and its error's text.
#[derive(Debug)]
pub(crate) struct Poisoned {
    failed_op: &'static str,
    first: std::sync::Arc<str>,
}

impl Communicator {
    /// Before a collective: fails if the communicator is poisoned, numbers the call and, in
    /// checking mode, compares its descriptor with every other rank's. Inlined into every call:
    /// the usual case (not poisoned, not checking) only counts.
    #[inline]
    pub(crate) fn enter_collective(&self, d: &CollDesc) -> Result<()> {
        self.current_op.set(d.op.name());
        if self.checking || self.poisoned.get().is_some() {
            return self.enter_collective_checked(d);
        }
        self.coll_seq.set(self.coll_seq.get() + 1);
        Ok(())
    }

    /// [`Communicator::enter_collective`] when poisoned or in checking mode.
    #[inline(never)]
    fn enter_collective_checked(&self, d: &CollDesc) -> Result<()> {
        self.check_poisoned(d.op.name())?;
        let seq = self.coll_seq.get() + 1;
        self.coll_seq.set(seq);
        if self.checking {
            let r = self.compare_fingerprints(d, seq);
            return r.map_err(|e| self.poison(e));
        }
        Ok(())
    }

    fn compare_fingerprints(&self, d: &CollDesc, seq: u64) -> Result<()> {
        let mine = fingerprint(d, seq);
        let mut all = vec![0u64; FINGERPRINT_WORDS * self.size];
        self.coll_unhooked(CHECK_DESC, Some(bytemuck::cast_slice(&mine)), bytemuck::cast_slice_mut(&mut all))?;
        match describe_disagreement(&all, &mine) {
            None => Ok(()),
            Some(what) => Err(Error::Mismatch { rank: self.wr(), what }),
        }
    }

    /// After a call: a disagreement (found here, or by another rank and sent as an abort)
    /// poisons the communicator and is returned as [`Error::Mismatch`]; other results pass.
    #[inline]
    pub(crate) fn settle<T>(&self, r: Result<T>) -> Result<T> {
        r.map_err(|e| self.poison(e))
    }

    /// Records `e` if it reports a disagreement (see the module documentation), naming the
    /// operation running now; returns it as the `Mismatch` it is. A communicator poisoned
    /// already returns [`Error::Unusable`] instead (a second disagreement is not news).
    #[cold]
    pub(crate) fn poison(&self, e: Error) -> Error {
        let what = match &e {
            Error::Mismatch { what, .. } => what.clone(),
            Error::Aborted { reason, .. } => match reason.split_once(MISMATCH_MARK) {
                Some((_, w)) => w.to_string(),
                None => return e,
            },
            _ => return e,
        };
        if let Err(unusable) = self.check_poisoned(self.current_op.get()) {
            return unusable;
        }
        let mismatch = Error::Mismatch { rank: self.wr(), what };
        let first = Poisoned { failed_op: self.current_op.get(), first: mismatch.to_string().into() };
        // Set just above unless poisoned in between, which a `&self` call on one thread cannot be.
        let _ = self.poisoned.set(first);
        mismatch
    }

    /// Fails with [`Error::Unusable`] (refusing operation `op`) if an earlier call poisoned the
    /// communicator.
    #[inline]
    pub(crate) fn check_poisoned(&self, op: &'static str) -> Result<()> {
        match self.poisoned.get() {
            Some(p) => Err(self.unusable(op, p)),
            None => Ok(()),
        }
    }

    #[cold]
    fn unusable(&self, op: &'static str, p: &Poisoned) -> Error {
        Error::Unusable { rank: self.wr(), op, failed_op: p.failed_op, first: p.first.clone() }
    }

    /// Whether ranks compare each collective's descriptor before running it (rank 0's setting).
    pub fn checks_collectives(&self) -> bool {
        self.ctx.check_collectives
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(ds: &[(CollDesc, u64)]) -> Vec<u64> {
        ds.iter().flat_map(|(d, s)| fingerprint(d, *s)).collect()
    }

    #[test]
    fn equal_fingerprints_agree_and_ignored_fields_do_not_count() {
        let d = CollDesc { op: CollOp::Broadcast, dtype: DType::F32, redop: ReduceOp::Sum, root: 1, count: 8 };
        // The reduce op means nothing to a broadcast.
        let e = CollDesc { redop: ReduceOp::Max, ..d };
        assert_eq!(describe_disagreement(&table(&[(d, 3), (e, 3), (d, 3)]), &fingerprint(&d, 3)), None);
    }

    #[test]
    fn every_differing_field_is_named_with_values_and_ranks() {
        let d = CollDesc { op: CollOp::Reduce, dtype: DType::F32, redop: ReduceOp::Sum, root: 0, count: 8 };
        let e = CollDesc { root: 1, count: 9, ..d };
        let all = table(&[(d, 5), (e, 5), (d, 6)]);
        let s = describe_disagreement(&all, &fingerprint(&d, 5)).expect("a disagreement");
        assert!(s.contains("root (0 on ranks 0, 2; 1 on rank 1)"), "{s}");
        assert!(s.contains("count (8 on ranks 0, 2; 9 on rank 1)"), "{s}");
        assert!(s.contains("collective sequence number (5 on ranks 0, 1; 6 on rank 2)"), "{s}");
        assert!(!s.contains("dtype") && !s.contains("reduce op"), "{s}");
        // Every rank, whatever its own call, prints the same text.
        assert_eq!(Some(s), describe_disagreement(&all, &fingerprint(&e, 5)));
    }

    #[test]
    fn a_garbled_fingerprint_is_a_disagreement() {
        let d = CollDesc::BARRIER;
        let mut all = table(&[(d, 1), (d, 1)]);
        all[7] = 0;
        let s = describe_disagreement(&all, &fingerprint(&d, 1)).unwrap();
        assert!(s.contains("rank 1 sent no valid"), "{s}");
    }

    #[test]
    fn the_mark_matches_the_error_text() {
        let e = Error::Mismatch { rank: 3, what: "x".into() };
        assert!(e.to_string().contains(MISMATCH_MARK), "{e}");
    }
}
