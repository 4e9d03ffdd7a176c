//! Deterministic test data and serial references, shared by `sucl check` and `sucl bench`:
//! every rank can compute every other rank's input, so checking needs no extra communication.

use sucl::{CollOp, Element, ReduceOp};

/// Calls `$body` with `$t` bound to the Rust type of a runtime [`sucl::DType`].
#[macro_export]
macro_rules! with_dtype {
    ($dt:expr, $t:ident, $body:block) => {
        match $dt {
            sucl::DType::U8 => {
                type $t = u8;
                $body
            }
            sucl::DType::I8 => {
                type $t = i8;
                $body
            }
            sucl::DType::I32 => {
                type $t = i32;
                $body
            }
            sucl::DType::U32 => {
                type $t = u32;
                $body
            }
            sucl::DType::I64 => {
                type $t = i64;
                $body
            }
            sucl::DType::U64 => {
                type $t = u64;
                $body
            }
            sucl::DType::F16 => {
                type $t = sucl::f16;
                $body
            }
            sucl::DType::BF16 => {
                type $t = sucl::bf16;
                $body
            }
            sucl::DType::F32 => {
                type $t = f32;
                $body
            }
            sucl::DType::F64 => {
                type $t = f64;
                $body
            }
        }
    };
}

/// Input element `i` of `rank` for a run with `seed`. Values stay small integers (products
/// stay powers of two) so that every dtype represents every partial result exactly, and
/// results do not depend on the reduction order.
#[inline]
pub fn value<T: Element>(rank: usize, i: usize, seed: u64, op: Option<ReduceOp>) -> T {
    let (r, i, s) = (rank as i64, i as i64, seed as i64);
    let v = match op {
        Some(ReduceOp::Prod) => 1 + (r + i + s).rem_euclid(2),
        Some(_) => (r * 7 + i * 13 + s * 3).rem_euclid(11) - 3,
        None => r * 1_000_003 + i * 7 + s,
    };
    T::from_i64(v)
}

/// Fills `buf` with `rank`'s input, element `i` of the buffer having global index `base + i`.
pub fn fill<T: Element>(buf: &mut [T], rank: usize, base: usize, seed: u64, op: Option<ReduceOp>) {
    for (i, x) in buf.iter_mut().enumerate() {
        *x = value(rank, base + i, seed, op);
    }
}

/// The reduction over `n` ranks of element `i` (as the collective computes it).
pub fn reduced<T: Element>(n: usize, i: usize, seed: u64, op: ReduceOp) -> T {
    let mut acc: T = value(0, i, seed, Some(op));
    for r in 1..n {
        acc = T::combine(acc, value(r, i, seed, Some(op)), op);
    }
    if op == ReduceOp::Avg {
        acc = T::div_count(acc, n);
    }
    acc
}

/// Per-rank buffer sizes (elements) of a collective for a given per-rank `count` (see
/// [`sucl_core::CollDesc`]): `(send_len, recv_len)` on `rank`.
pub fn buffer_lens(op: CollOp, count: usize, n: usize, rank: usize, root: usize) -> (usize, usize) {
    let is_root = rank == root;
    match op {
        CollOp::Barrier => (0, 0),
        CollOp::Broadcast => (0, count),
        CollOp::AllReduce => (count, count),
        CollOp::Reduce => (count, if is_root { count } else { 0 }),
        CollOp::Gather => (count, if is_root { count * n } else { 0 }),
        CollOp::AllGather => (count, count * n),
        CollOp::Scatter => (if is_root { count * n } else { 0 }, count),
        CollOp::AllToAll => (count * n, count * n),
        CollOp::ReduceScatter => (count * n, count),
    }
}

/// Fills the send (or, for broadcast, the root's) buffer of `rank` for op `op`.
pub fn fill_input<T: Element>(op: CollOp, send: &mut [T], recv: &mut [T], rank: usize, root: usize, seed: u64, redop: ReduceOp) {
    let rop = op.reduces().then_some(redop);
    match op {
        CollOp::Broadcast => {
            if rank == root {
                fill(recv, rank, 0, seed, None)
            }
        }
        _ => fill(send, rank, 0, seed, rop),
    }
}

/// One checked call: the op and everything its expected result depends on.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub op: CollOp,
    /// Per-rank count as in [`buffer_lens`].
    pub count: usize,
    pub n: usize,
    pub rank: usize,
    pub root: usize,
    pub seed: u64,
    pub redop: ReduceOp,
}

/// Counts wrong elements in `recv` after `case` ran.
pub fn count_wrong<T: Element>(case: &Case, recv: &[T]) -> usize {
    let Case { op, count, n, rank, root, seed, redop } = *case;
    let bits = |a: &T, b: &T| bytemuck::bytes_of(a) != bytemuck::bytes_of(b);
    let mut wrong = 0;
    match op {
        CollOp::Barrier => {}
        CollOp::Broadcast => {
            for (i, x) in recv.iter().enumerate() {
                wrong += bits(x, &value(root, i, seed, None)) as usize;
            }
        }
        CollOp::AllReduce | CollOp::Reduce => {
            if op == CollOp::AllReduce || rank == root {
                for (i, x) in recv.iter().enumerate() {
                    wrong += bits(x, &reduced(n, i, seed, redop)) as usize;
                }
            }
        }
        CollOp::Gather | CollOp::AllGather => {
            if op == CollOp::AllGather || rank == root {
                for (k, x) in recv.iter().enumerate() {
                    wrong += bits(x, &value(k / count.max(1), k % count.max(1), seed, None)) as usize;
                }
            }
        }
        CollOp::Scatter => {
            for (i, x) in recv.iter().enumerate() {
                wrong += bits(x, &value(root, rank * count + i, seed, None)) as usize;
            }
        }
        CollOp::AllToAll => {
            // Block j of recv came from rank j's send block `rank`.
            for (k, x) in recv.iter().enumerate() {
                let (j, i) = (k / count.max(1), k % count.max(1));
                wrong += bits(x, &value(j, rank * count + i, seed, None)) as usize;
            }
        }
        CollOp::ReduceScatter => {
            for (i, x) in recv.iter().enumerate() {
                wrong += bits(x, &reduced(n, rank * count + i, seed, redop)) as usize;
            }
        }
    }
    wrong
}
