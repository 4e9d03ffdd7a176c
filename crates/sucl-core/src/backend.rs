//! The `Backend` trait: what every transport implements, over bytes + count + dtype (SuCL's buffer
//! reinterpretation). Typed generics live in the facade crate above.

use crate::dtype::{DType, ReduceOp};
use crate::error::Result;

/// Handle of a posted non-blocking send or receive.
pub type ReqId = u64;

/// A collective operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CollOp {
    /// Synchronize all ranks.
    Barrier = 0,
    /// Root's buffer to every rank.
    Broadcast = 1,
    /// Reduce every rank's buffer onto root.
    Reduce = 2,
    /// Reduce every rank's buffer onto every rank.
    AllReduce = 3,
    /// Concatenate every rank's block on root.
    Gather = 4,
    /// Concatenate every rank's block on every rank.
    AllGather = 5,
    /// Root's blocks, one to each rank.
    Scatter = 6,
    /// Block j of rank i goes to block i of rank j.
    AllToAll = 7,
    /// Reduce, then rank r keeps block r.
    ReduceScatter = 8,
}

impl CollOp {
    /// Every collective.
    pub const ALL: [CollOp; 9] = [
        CollOp::Barrier,
        CollOp::Broadcast,
        CollOp::Reduce,
        CollOp::AllReduce,
        CollOp::Gather,
        CollOp::AllGather,
        CollOp::Scatter,
        CollOp::AllToAll,
        CollOp::ReduceScatter,
    ];

    /// snake_case name.
    pub const fn name(self) -> &'static str {
        match self {
            CollOp::Barrier => "barrier",
            CollOp::Broadcast => "broadcast",
            CollOp::Reduce => "reduce",
            CollOp::AllReduce => "all_reduce",
            CollOp::Gather => "gather",
            CollOp::AllGather => "all_gather",
            CollOp::Scatter => "scatter",
            CollOp::AllToAll => "all_to_all",
            CollOp::ReduceScatter => "reduce_scatter",
        }
    }

    /// Parses a name as printed by [`CollOp::name`].
    pub fn parse(s: &str) -> Option<CollOp> {
        CollOp::ALL.iter().copied().find(|o| o.name() == s)
    }

    /// Whether the op takes a root.
    pub const fn rooted(self) -> bool {
        matches!(self, CollOp::Broadcast | CollOp::Reduce | CollOp::Gather | CollOp::Scatter)
    }

    /// Whether the op reduces.
    pub const fn reduces(self) -> bool {
        matches!(self, CollOp::Reduce | CollOp::AllReduce | CollOp::ReduceScatter)
    }
}

/// What every rank must agree on for one collective call. `count` is per rank as the typed API
/// takes it: the element count of all_reduce, reduce and broadcast; one rank's block for gather,
/// all_gather, scatter, reduce_scatter; one peer's block for all_to_all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollDesc {
    /// The operation.
    pub op: CollOp,
    /// The element type.
    pub dtype: DType,
    /// The reduce op (ignored unless the op reduces).
    pub redop: ReduceOp,
    /// The root (ignored unless the op is rooted).
    pub root: usize,
    /// Elements, as above.
    pub count: usize,
}

impl CollDesc {
    /// A descriptor for a barrier.
    pub const BARRIER: CollDesc = CollDesc { op: CollOp::Barrier, dtype: DType::U8, redop: ReduceOp::Sum, root: 0, count: 0 };

    /// Element counts of the send and receive buffers on `rank` of `n` ranks: `(send, recv)`.
    /// Non-root ranks of rooted ops have empty buffers where they carry nothing.
    pub fn buffer_lens(&self, n: usize, rank: usize) -> (usize, usize) {
        let (c, root) = (self.count, rank == self.root);
        match self.op {
            CollOp::Barrier => (0, 0),
            CollOp::Broadcast => (0, c),
            CollOp::AllReduce => (c, c),
            CollOp::Reduce => (c, if root { c } else { 0 }),
            CollOp::Gather => (c, if root { c * n } else { 0 }),
            CollOp::AllGather => (c, c * n),
            CollOp::Scatter => (if root { c * n } else { 0 }, c),
            CollOp::AllToAll => (c * n, c * n),
            CollOp::ReduceScatter => (c * n, c),
        }
    }

    /// Packs into the two meta words carried by every frame of the collective.
    pub fn encode(&self) -> [u64; 2] {
        let root = if self.op.rooted() { self.root as u64 } else { 0 };
        let redop = if self.op.reduces() { self.redop as u64 } else { 0 };
        [(self.op as u64) | (self.dtype as u64) << 8 | redop << 16 | (root & 0xffff_ffff) << 32, self.count as u64]
    }

    /// Unpacks [`CollDesc::encode`]'s words.
    pub fn decode(w: [u64; 2]) -> Option<CollDesc> {
        Some(CollDesc {
            op: *CollOp::ALL.get((w[0] & 0xff) as usize)?,
            dtype: DType::from_code((w[0] >> 8 & 0xff) as u8)?,
            redop: ReduceOp::from_code((w[0] >> 16 & 0xff) as u8)?,
            root: (w[0] >> 32) as usize,
            count: w[1] as usize,
        })
    }

    /// Says how `theirs` (from rank `peer`) differs from `self` (this rank's).
    pub fn describe_mismatch(&self, me: usize, theirs: [u64; 2], peer: usize) -> String {
        let Some(t) = CollDesc::decode(theirs) else {
            return format!("{} arguments: rank {peer} sent an undecodable descriptor", self.op.name());
        };
        let mut diffs = vec![];
        if t.op != self.op {
            diffs.push(format!("operation (rank {me}: {}, rank {peer}: {})", self.op.name(), t.op.name()));
        }
        if t.count != self.count {
            diffs.push(format!("count (rank {me}: {}, rank {peer}: {})", self.count, t.count));
        }
        if t.dtype != self.dtype {
            diffs.push(format!("dtype (rank {me}: {}, rank {peer}: {})", self.dtype, t.dtype));
        }
        if self.op.reduces() && t.redop != self.redop {
            diffs.push(format!("reduce op (rank {me}: {}, rank {peer}: {})", self.redop, t.redop));
        }
        if self.op.rooted() && t.root != self.root {
            diffs.push(format!("root (rank {me}: {}, rank {peer}: {})", self.root, t.root));
        }
        format!("{} {}", self.op.name(), diffs.join(", "))
    }
}

/// A transport for one memory kind. A backend serves one communicator (a fixed group of ranks).
///
/// In the collective call, `send == None` means in place: the input already sits in `recv` (for
/// all_gather and gather: this rank's block at its position). Non-root ranks of a rooted op pass
/// an empty `recv` where they receive nothing. Buffer sizes are validated by the caller.
pub trait Backend: Send {
    /// Short name (`shm`, `tcp`, ...).
    fn name(&self) -> &'static str;
    /// This rank in the backend's communicator.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn size(&self) -> usize;

    /// Posts a send of `len` bytes at `ptr` to `peer` with `tag`.
    ///
    /// # Safety
    /// The memory must stay valid and unmodified until the request completes or is cancelled.
    unsafe fn post_send(&mut self, peer: usize, tag: u64, ptr: *const u8, len: usize) -> Result<ReqId>;

    /// Posts a receive of at most `cap` bytes into `ptr` from `peer` with `tag`.
    ///
    /// # Safety
    /// The memory must stay valid and otherwise untouched until the request completes or is
    /// cancelled.
    unsafe fn post_recv(&mut self, peer: usize, tag: u64, ptr: *mut u8, cap: usize) -> Result<ReqId>;

    /// Makes progress; `Some(bytes)` and the request is retired once it completed.
    fn test(&mut self, req: ReqId) -> Result<Option<usize>>;

    /// Blocks (bounded by the timeout) until the request completes; returns its byte count.
    fn wait(&mut self, req: ReqId) -> Result<usize>;

    /// Withdraws a request whose memory is about to go away. Afterwards the backend never touches
    /// that memory; if that is impossible without corrupting the stream, the communicator aborts.
    fn cancel(&mut self, req: ReqId);

    /// Whether this backend can serve `desc` (for example, MPI has no 16-bit float reductions).
    /// Calls it cannot serve go to the communicator's default backend.
    fn supports(&self, _desc: &CollDesc) -> bool {
        true
    }

    /// Runs a collective (see the trait's documentation for `send`/`recv`).
    fn collective(&mut self, desc: &CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()>;

    /// Runs a v-collective natively, if this backend has one: `None` means "not offered here"
    /// (the caller then runs the generic algorithm over point-to-point). Arguments are already
    /// validated and agreed on by every rank.
    fn v_collective(&mut self, _desc: &VCollDesc<'_>, _send: &[u8], _recv: &mut [u8]) -> Option<Result<()>> {
        None
    }

    /// Runs a v-collective together with its agreement step, if this backend can (one
    /// synchronization where the agreement and a small call would otherwise take two).
    ///
    /// Every rank exchanges `agree.mine` (the same number of words on every rank) into
    /// `agree.all` (rank-major) *before* any of the call's data reaches another rank's buffers;
    /// then, only if every rank's words equal this rank's and `desc` is `Some`, the data moves
    /// and the result is `Some(Ok(true))`. Otherwise nothing is delivered, `agree.all` holds
    /// every rank's words and the result is `Some(Ok(false))`: the caller reports the
    /// disagreement. `desc == None` means this rank's own arguments were invalid: it takes part
    /// in the exchange only. `None` means "not offered here" (then the caller runs the agreement
    /// as a collective of its own); whether it is offered must not depend on the arguments, so
    /// that every rank takes the same path.
    fn v_collective_agreeing(
        &mut self,
        _agree: VAgreement<'_>,
        _desc: Option<&VCollDesc<'_>>,
        _send: &[u8],
        _recv: &mut [u8],
    ) -> Option<Result<bool>> {
        None
    }
}

/// The agreement words of one v-collective call (see [`Backend::v_collective_agreeing`]).
#[derive(Debug)]
pub struct VAgreement<'a> {
    /// This rank's words.
    pub mine: &'a [u64],
    /// Every rank's words, `size × mine.len()`, rank-major; written by the backend.
    pub all: &'a mut [u64],
}

/// Which v-collective a [`VCollDesc`] describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VCollOp {
    /// Per-rank blocks to the root.
    Gatherv,
    /// Per-rank blocks to every rank.
    AllGatherv,
    /// Per-rank blocks from the root.
    Scatterv,
    /// Per-pair blocks between every two ranks.
    AllToAllv,
}

impl VCollOp {
    /// snake_case name.
    pub const fn name(self) -> &'static str {
        match self {
            VCollOp::Gatherv => "gatherv",
            VCollOp::AllGatherv => "all_gatherv",
            VCollOp::Scatterv => "scatterv",
            VCollOp::AllToAllv => "all_to_allv",
        }
    }
}

/// A validated v-collective in bytes, MPI style: `send_counts`/`send_displs` index `send` by
/// destination (one entry — this rank's block — for gatherv and all_gatherv, empty off the
/// root for scatterv), `recv_counts`/`recv_displs` index `recv` by source (one entry for
/// scatterv, empty off the root for gatherv). `table` is the whole agreed counts table in
/// bytes, the same on every rank: `size` entries (bytes of rank `r`'s block) for gatherv,
/// all_gatherv and scatterv, `size × size` row-major (bytes from `i` to `j` at `i * size + j`)
/// for all_to_allv — what a backend needs to know about the blocks of other ranks.
#[derive(Clone, Copy, Debug)]
pub struct VCollDesc<'a> {
    /// The operation.
    pub op: VCollOp,
    /// The root of gatherv and scatterv (0 otherwise).
    pub root: usize,
    /// Bytes of each block sent.
    pub send_counts: &'a [usize],
    /// Byte offset in `send` of each block sent.
    pub send_displs: &'a [usize],
    /// Bytes of each block received.
    pub recv_counts: &'a [usize],
    /// Byte offset in `recv` of each block received.
    pub recv_displs: &'a [usize],
    /// The whole counts table in bytes (see above).
    pub table: &'a [usize],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desc_round_trip_and_mismatch_text() {
        let d = CollDesc { op: CollOp::Reduce, dtype: DType::BF16, redop: ReduceOp::Max, root: 3, count: 1 << 40 };
        assert_eq!(CollDesc::decode(d.encode()), Some(d));
        let other = CollDesc { count: 7, root: 1, ..d };
        let s = d.describe_mismatch(0, other.encode(), 2);
        assert!(s.contains("count (rank 0: 1099511627776, rank 2: 7)"), "{s}");
        assert!(s.contains("root (rank 0: 3, rank 2: 1)"), "{s}");
    }
}
