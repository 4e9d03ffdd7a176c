//! The host side's arithmetic for the peer-memory kernels, kept apart from CUDA so that it is
//! unit-tested without a GPU: flag epochs, two-shot chunks, the unit each launch moves, grids,
//! and how a call larger than the peer buffer splits into pieces.

use sucl_core::backend::{CollDesc, CollOp};
use sucl_core::{DType, ReduceOp};

/// Most ranks one peer-memory communicator serves (the kernels' `MAX_RANKS`).
pub const MAX_RANKS: usize = 8;
/// Most blocks a kernel may launch (the kernels' `MAX_BLOCKS`, defined from this value): each
/// block has its own flags, so this sizes the signal area. The grid actually launched is capped
/// lower by the `SUCL_IPC_BLOCKS` setting and by the smallest multiprocessor count of the ranks'
/// GPUs (every block must be resident at once: blocks spin on their peers' flags).
pub const MAX_BLOCKS: usize = 128;
/// Threads per block (the kernels' `__launch_bounds__`).
pub const THREADS: usize = 512;
/// Bytes in front of the data area: `MAX_BLOCKS × MAX_RANKS` flags, then `MAX_BLOCKS` epochs
/// (the kernels' `DATA_OFFSET`, defined from this value), rounded up to keep the data area
/// aligned for 16-byte vectors.
pub const SIGNAL_BYTES: usize = signal_bytes(MAX_BLOCKS, MAX_RANKS);
const _: () = assert!(SIGNAL_BYTES.is_multiple_of(4096) && SIGNAL_BYTES >= (PARITY_WORD + 1) * 4);
/// Slots per thread per loop iteration that the kernels may be compiled for (`SUCL_IPC_UNROLL`).
pub const UNROLLS: [usize; 4] = [1, 2, 4, 8];

/// Bytes of a signal area for `blocks` blocks of `ranks` ranks: a u32 flag per (block, rank),
/// a u32 epoch per block, the done count and the parity word, rounded up to whole 4 KiB.
pub const fn signal_bytes(blocks: usize, ranks: usize) -> usize {
    ((blocks * ranks + blocks + 2) * 4).next_multiple_of(4096)
}

/// Word index of the count of this rank's blocks that finished the current launch (the
/// kernels' `DONE_WORD`).
pub const DONE_WORD: usize = MAX_BLOCKS * MAX_RANKS + MAX_BLOCKS;
/// Word index of the parity that says which half of the data area the next launch uses (the
/// kernels' `PARITY_WORD`).
pub const PARITY_WORD: usize = DONE_WORD + 1;

/// Bytes of each half of a data area of `buffer_bytes` (launches alternate between the halves):
/// whole slots, so that the second half stays aligned for 16-byte vectors.
pub fn half_bytes(buffer_bytes: usize) -> usize {
    buffer_bytes / 2 / SLOT * SLOT
}

/// Byte offset of flag (`block`, `rank`) in the signal area (the kernels' barrier), and of
/// `block`'s epoch word (`rank == None`).
pub fn flag_offset(block: usize, rank: Option<usize>) -> usize {
    match rank {
        Some(r) => (block * MAX_RANKS + r) * 4,
        None => (MAX_BLOCKS * MAX_RANKS + block) * 4,
    }
}

/// The grid cap every rank uses: the requested cap, at most [`MAX_BLOCKS`], at most the
/// smallest multiprocessor count among the ranks' GPUs (so that every block is resident), at
/// least one. Computed from values every rank has from the setup exchange.
pub fn grid_cap(requested: usize, min_sms: usize) -> usize {
    requested.min(MAX_BLOCKS).min(min_sms).max(1)
}

/// Whether flag value `v` has reached epoch `e`: epochs only grow and wrap around at 2³², so
/// `v` counts as reached while it is at most 2³¹ − 1 ahead (the kernels' `reached`).
pub fn reached(v: u32, e: u32) -> bool {
    (v.wrapping_sub(e) as i32) >= 0
}

/// The epoch after `barriers` more barriers from `epoch` (what a block stores at its end).
pub fn advance(epoch: u32, barriers: u32) -> u32 {
    epoch.wrapping_add(barriers)
}

/// Two-shot all_reduce: the slots of rank `k`'s chunk, out of `count` units over `n` ranks.
/// Chunks are `ceil(count / n)` long (the last ones shorter or empty), cover every unit once.
pub fn chunk_len(count: usize, n: usize) -> usize {
    count.div_ceil(n.max(1))
}

/// The slot range rank `k` reduces in a two-shot all_reduce of `count` slots over `n` ranks.
pub fn chunk_range(count: usize, n: usize, k: usize) -> std::ops::Range<usize> {
    let c = chunk_len(count, n);
    (k * c).min(count)..((k + 1) * c).min(count)
}

/// Blocks for a launch whose longest loop covers `units` slots: enough for one slot per
/// thread, at least one, at most `cap` (from [`grid_cap`]); a launch with more slots than
/// threads has each thread take several per loop iteration (the kernels' `UNROLL`). Depends
/// only on arguments every rank shares (never on the alignment of a rank's buffers), so every
/// rank launches the same grid.
pub fn blocks(units: usize, cap: usize) -> usize {
    units.div_ceil(THREADS).clamp(1, cap.clamp(1, MAX_BLOCKS))
}

/// The slot indices one thread handles in the loop iteration that starts at `i`, with
/// `stride` threads in the grid, `unroll` slots per iteration, `hi` the loop's end (the
/// kernels' `for (i = lo + first; i < hi; i += stride * UNROLL)` with `i + u·stride < hi`).
pub fn unrolled_slots(i: usize, stride: usize, unroll: usize, hi: usize) -> impl Iterator<Item = usize> {
    (0..unroll).map(move |u| i + u * stride).filter(move |&j| j < hi)
}

/// The kernel family serving one piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// all_reduce, every rank reads every rank's input.
    OneShot,
    /// all_reduce as reduce-scatter then all-gather through peer memory.
    TwoShot,
    /// reduce_scatter.
    ReduceScatter,
    /// broadcast.
    Broadcast,
    /// all_gather.
    AllGather,
}

impl Kind {
    /// The kernel's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::OneShot => "ipc_one_shot",
            Kind::TwoShot => "ipc_two_shot",
            Kind::ReduceScatter => "ipc_reduce_scatter",
            Kind::Broadcast => "ipc_broadcast",
            Kind::AllGather => "ipc_all_gather",
        }
    }

    /// Whether the kernel reduces (one module per dtype and reduce op) or only copies bytes.
    pub fn reduces(self) -> bool {
        matches!(self, Kind::OneShot | Kind::TwoShot | Kind::ReduceScatter)
    }
}

/// Whether the peer-memory kernels serve `d`: all_reduce and reduce_scatter of f32, f64, f16
/// and bf16 with sum, prod, min, max or avg; broadcast and all_gather of any type.
pub fn supports(d: &CollDesc) -> bool {
    let float = matches!(d.dtype, DType::F32 | DType::F64 | DType::F16 | DType::BF16);
    match d.op {
        CollOp::AllReduce | CollOp::ReduceScatter => float,
        CollOp::Broadcast | CollOp::AllGather => true,
        _ => false,
    }
}

/// Bytes of one slot: data moves between data areas in 16-byte vectors (the kernels' `SLOT`).
pub const SLOT: usize = 16;

/// Slots of a row of `bytes` bytes (the last one may be partly used).
pub fn slots(bytes: usize) -> usize {
    bytes.div_ceil(SLOT)
}

/// One launch: columns `start..start + len` (elements) of every row of the call's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// First element (column) of the piece.
    pub start: usize,
    /// Elements (columns) in the piece.
    pub len: usize,
}

/// Splits a call of `count` elements of `elem` bytes per row into pieces whose rows, each
/// padded to whole slots, fit `capacity` bytes of a rank's data area `rows_in_buffer` times.
/// Piece lengths are whole slots (so pieces keep the callers' alignment), except the last.
/// `capacity` must hold `rows_in_buffer` slots.
pub fn pieces(count: usize, elem: usize, rows_in_buffer: usize, capacity: usize) -> impl Iterator<Item = Piece> {
    let per_row = capacity / rows_in_buffer.max(1) / SLOT * SLOT;
    let max = (per_row / elem.max(1)).max(1);
    (0..count).step_by(max).map(move |start| Piece { start, len: max.min(count - start) })
}

/// Rows of the call's data each rank's data area holds per column for a launch of `kind` on
/// `n` ranks: n for reduce_scatter (its whole input) and for a pushing one-shot all_reduce
/// (every rank's input, pushed by its owner), else one.
pub fn rows_in_buffer(kind: Kind, n: usize, push: bool) -> usize {
    match kind {
        Kind::ReduceScatter => n,
        Kind::OneShot if push => n,
        _ => 1,
    }
}

/// The kernel for `d` on `n` ranks: all_reduce is two-shot from `two_shot_bytes` on (and only
/// with more than one rank).
pub fn kind(d: &CollDesc, n: usize, two_shot_bytes: usize) -> Option<Kind> {
    Some(match d.op {
        CollOp::AllReduce if n > 1 && d.count * d.dtype.size() >= two_shot_bytes => Kind::TwoShot,
        CollOp::AllReduce => Kind::OneShot,
        CollOp::ReduceScatter => Kind::ReduceScatter,
        CollOp::Broadcast => Kind::Broadcast,
        CollOp::AllGather => Kind::AllGather,
        _ => return None,
    })
}

/// The name of `redop` in kernel module keys.
pub fn redop_name(r: ReduceOp) -> &'static str {
    match r {
        ReduceOp::Sum => "sum",
        ReduceOp::Prod => "prod",
        ReduceOp::Min => "min",
        ReduceOp::Max => "max",
        ReduceOp::Avg => "avg",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_compare_across_wrap_around() {
        assert!(reached(5, 5));
        assert!(reached(6, 5), "a peer one barrier ahead has reached it");
        assert!(!reached(4, 5));
        assert!(reached(0, u32::MAX), "0 follows u32::MAX");
        assert!(reached(3, u32::MAX - 2));
        assert!(!reached(u32::MAX, 0), "u32::MAX is before 0 after a wrap");
        assert_eq!(advance(u32::MAX, 2), 1);
        // Every epoch within half the range ahead counts as reached, none behind.
        for e in [0u32, 1, 1 << 31, u32::MAX - 7] {
            for ahead in [0u32, 1, 2, 1000, (1 << 31) - 1] {
                assert!(reached(advance(e, ahead), e), "e={e} ahead={ahead}");
            }
            for behind in [1u32, 2, 1000, 1 << 31] {
                assert!(!reached(e.wrapping_sub(behind), e), "e={e} behind={behind}");
            }
        }
    }

    #[test]
    fn two_shot_chunks_cover_every_unit_exactly_once() {
        for n in 1..=MAX_RANKS {
            for count in [0usize, 1, 2, 3, 7, 8, 9, 15, 16, 17, 1000, 1001, 65_537] {
                let mut seen = vec![0u8; count];
                for k in 0..n {
                    let r = chunk_range(count, n, k);
                    assert!(r.start <= r.end && r.end <= count, "n={n} count={count} k={k}: {r:?}");
                    assert!(r.len() <= chunk_len(count, n));
                    // The kernel's loop bounds: lo = k·chunk, hi = min(lo + chunk, count).
                    let lo = k * chunk_len(count, n);
                    assert_eq!(r.end, (lo + chunk_len(count, n)).min(count));
                    for i in r {
                        seen[i] += 1;
                    }
                }
                assert!(seen.iter().all(|&s| s == 1), "n={n} count={count}");
            }
        }
    }

    #[test]
    fn grids_stay_within_the_flag_area() {
        for cap in [1, 32, 64, MAX_BLOCKS, MAX_BLOCKS + 5] {
            assert_eq!(blocks(0, cap), 1);
            assert_eq!(blocks(1, cap), 1);
            assert_eq!(blocks(THREADS, cap), 1);
            assert_eq!(blocks(THREADS + 1, cap), 2.min(cap));
            assert_eq!(blocks(usize::MAX / 2, cap), cap.min(MAX_BLOCKS), "a huge launch takes the whole cap");
            for units in [0, 1, 511, 512, 513, 16_384, 65_536, 1 << 20, 1 << 30] {
                let b = blocks(units, cap);
                assert!((1..=MAX_BLOCKS).contains(&b) && b <= cap.max(1), "units={units} cap={cap}: {b}");
            }
        }
        // The cap: the request, at most MAX_BLOCKS and the least multiprocessor count.
        assert_eq!(grid_cap(64, 132), 64);
        assert_eq!(grid_cap(128, 132), MAX_BLOCKS);
        assert_eq!(grid_cap(1000, 1000), MAX_BLOCKS);
        assert_eq!(grid_cap(128, 78), 78, "a smaller GPU limits every rank's grid");
        assert_eq!(grid_cap(0, 132), 1);
        // Every flag and epoch of every block the grid may use lies inside the signal area,
        // none overlapping another.
        let mut words = std::collections::HashSet::new();
        for b in 0..MAX_BLOCKS {
            for r in 0..MAX_RANKS {
                assert!(words.insert(flag_offset(b, Some(r))));
            }
            assert!(words.insert(flag_offset(b, None)));
        }
        assert!(words.insert(DONE_WORD * 4) && words.insert(PARITY_WORD * 4), "the done and parity words are apart");
        assert!(words.iter().all(|&o| o % 4 == 0 && o + 4 <= SIGNAL_BYTES));
        assert_eq!(SIGNAL_BYTES % SLOT, 0, "the data area stays aligned for vectors");
        assert_eq!(signal_bytes(32, 8), 4096, "the old layout's size");
        assert_eq!(signal_bytes(128, 8), 8192);
    }

    #[test]
    fn two_shot_chunk_copies_keep_every_slot_on_its_thread() {
        // The kernels' copy_chunks walks chunk offsets (unrolled) and touches that offset in
        // every chunk; each thread must get exactly the slots that per-chunk grid-stride loops
        // give it (so that every slot keeps its block across the two-shot phases).
        for n in [1usize, 2, 3, 8] {
            for count in [1usize, 2, 5, 16, 17, 100, 1001] {
                let (chunk, stride) = (chunk_len(count, n), 8);
                for unroll in UNROLLS {
                    for first in 0..stride {
                        let mut walked = vec![];
                        for o in (first..chunk).step_by(stride * unroll) {
                            for off in unrolled_slots(o, stride, unroll, chunk) {
                                walked.extend((0..n).map(|k| k * chunk + off).filter(|&j| j < count));
                            }
                        }
                        let mut per_chunk: Vec<usize> =
                            (0..n).flat_map(|k| (k * chunk + first..((k + 1) * chunk).min(count)).step_by(stride)).collect();
                        walked.sort_unstable();
                        per_chunk.sort_unstable();
                        assert_eq!(walked, per_chunk, "n={n} count={count} unroll={unroll} first={first}");
                    }
                }
            }
        }
    }

    #[test]
    fn halves_keep_vectors_aligned_and_hold_a_reduce_scatter_slot_row() {
        for b in [4096usize, 4112, 65_536, 32 << 20, (32 << 20) + 48] {
            let h = half_bytes(b);
            assert_eq!(h % SLOT, 0, "{b}");
            assert!(2 * h <= b && b - 2 * h < 2 * SLOT, "{b}: {h}");
            assert!(h >= MAX_RANKS * SLOT, "pieces need one slot per row");
            // A piece planned for one half fits it.
            for p in pieces(1_000_000, 4, MAX_RANKS, h) {
                assert!(p.len * 4 * MAX_RANKS <= h || p.len == 1);
            }
        }
    }

    #[test]
    fn unrolled_loops_visit_the_plain_grid_stride_slots() {
        // Every thread of every grid, for every unroll, visits exactly the slots the plain
        // grid-stride loop gives it, each once (so a slot's block is the same in every phase and
        // whatever the unroll), tails shorter than the unroll included.
        for (lo, hi) in [(0usize, 0usize), (0, 1), (0, 7), (5, 5), (3, 100), (0, 4096), (1000, 5001)] {
            for (grid, threads) in [(1usize, 4usize), (3, 4), (2, 8)] {
                let stride = grid * threads;
                for unroll in UNROLLS {
                    let mut seen = vec![0u8; hi];
                    for first in 0..stride {
                        let plain: Vec<usize> = (lo + first..hi).step_by(stride).collect();
                        let mut mine = vec![];
                        let mut i = lo + first;
                        while i < hi {
                            mine.extend(unrolled_slots(i, stride, unroll, hi));
                            i += stride * unroll;
                        }
                        assert_eq!(mine, plain, "lo={lo} hi={hi} stride={stride} unroll={unroll} first={first}");
                        for j in mine {
                            seen[j] += 1;
                        }
                    }
                    assert!(seen[lo.min(hi)..].iter().all(|&s| s == 1), "lo={lo} hi={hi} unroll={unroll}");
                }
            }
        }
    }

    #[test]
    fn pushed_rows_fit_the_half_they_are_planned_for() {
        // A pushing one-shot piece keeps n rows of its padded row in every rank's data-area
        // half; they must fit it.
        for half in [4096usize, 65_536, 16 << 20] {
            for n in 1..=MAX_RANKS {
                for elem in [2usize, 4, 8] {
                    for count in [1usize, 7, 1000, 1 << 20, 5 << 20] {
                        for p in pieces(count, elem, rows_in_buffer(Kind::OneShot, n, true), half) {
                            let used = n * slots(p.len * elem) * SLOT;
                            assert!(used <= half, "n={n} elem={elem} count={count} half={half}: {used}");
                        }
                    }
                }
            }
        }
        assert_eq!(rows_in_buffer(Kind::OneShot, 4, true), 4);
        assert_eq!(rows_in_buffer(Kind::OneShot, 4, false), 1, "pulling one-shot keeps only its own row");
        assert_eq!(rows_in_buffer(Kind::ReduceScatter, 4, false), 4);
        assert_eq!(rows_in_buffer(Kind::TwoShot, 4, true), 1, "two-shot never pushes");
    }

    #[test]
    fn pieces_fit_the_buffer_and_cover_the_call() {
        for (count, elem, rows, cap) in
            [(0usize, 4usize, 1usize, 1024usize), (1000, 4, 1, 1024), (1000, 2, 3, 1000), (7, 8, 8, 16), (5, 4, 1, 1 << 20)]
        {
            let ps: Vec<Piece> = pieces(count, elem, rows, cap).collect();
            let mut next = 0;
            for (i, p) in ps.iter().enumerate() {
                assert_eq!(p.start, next);
                assert!(p.len > 0);
                assert!(p.len * elem * rows <= cap.max(elem * rows), "{count} {elem} {rows} {cap}: {p:?}");
                if i + 1 < ps.len() && p.len * elem >= 16 {
                    assert_eq!(p.len * elem % 16, 0, "inner pieces keep the vector width");
                }
                next += p.len;
            }
            assert_eq!(next, count);
        }
    }

    #[test]
    fn what_the_kernels_serve() {
        let d = |op, dtype| CollDesc { op, dtype, redop: ReduceOp::Sum, root: 0, count: 10 };
        assert!(supports(&d(CollOp::AllReduce, DType::BF16)));
        assert!(!supports(&d(CollOp::AllReduce, DType::I32)), "integer reductions go elsewhere");
        assert!(supports(&d(CollOp::AllGather, DType::U8)));
        assert!(!supports(&d(CollOp::AllToAll, DType::F32)));
        assert_eq!(kind(&d(CollOp::AllReduce, DType::F32), 2, 40), Some(Kind::TwoShot));
        assert_eq!(kind(&d(CollOp::AllReduce, DType::F32), 2, 41), Some(Kind::OneShot));
        assert_eq!(kind(&d(CollOp::AllReduce, DType::F32), 1, 0), Some(Kind::OneShot));
    }
}
