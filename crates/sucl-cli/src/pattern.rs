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
    sucl_core::CollDesc { op, dtype: sucl::DType::U8, redop: ReduceOp::Sum, root, count }.buffer_lens(n, rank)
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

/// Fills `out` (the receive buffer of `case.rank`) with the expected result. Returns false where
/// the receive buffer carries no result on this rank (non-root reduce and gather).
pub fn expected<T: Element>(case: &Case, out: &mut [T]) -> bool {
    let Case { op, count, n, rank, root, seed, redop } = *case;
    let c = count.max(1);
    match op {
        CollOp::Barrier => {}
        CollOp::Broadcast => out.iter_mut().enumerate().for_each(|(i, x)| *x = value(root, i, seed, None)),
        CollOp::AllReduce | CollOp::Reduce => {
            if op == CollOp::Reduce && rank != root {
                return false;
            }
            out.iter_mut().enumerate().for_each(|(i, x)| *x = reduced(n, i, seed, redop));
        }
        CollOp::Gather | CollOp::AllGather => {
            if op == CollOp::Gather && rank != root {
                return false;
            }
            out.iter_mut().enumerate().for_each(|(k, x)| *x = value(k / c, k % c, seed, None));
        }
        CollOp::Scatter => out.iter_mut().enumerate().for_each(|(i, x)| *x = value(root, rank * count + i, seed, None)),
        // Block j of recv came from rank j's send block `rank`.
        CollOp::AllToAll => out.iter_mut().enumerate().for_each(|(k, x)| *x = value(k / c, rank * count + k % c, seed, None)),
        CollOp::ReduceScatter => out.iter_mut().enumerate().for_each(|(i, x)| *x = reduced(n, rank * count + i, seed, redop)),
    }
    true
}

/// Counts wrong elements in `recv` after `case` ran: bit-exact, except that a float average
/// may round differently when a backend scales each input by 1/n before summing (NCCL does),
/// so there one unit in the last place is allowed.
pub fn count_wrong<T: Element>(case: &Case, recv: &[T]) -> usize {
    let mut want = vec![T::from_i64(0); recv.len()];
    if !expected(case, &mut want) {
        return 0;
    }
    let avg_float = case.redop == ReduceOp::Avg && T::DTYPE.is_float() && case.op.reduces();
    recv.iter()
        .zip(&want)
        .filter(|(a, b)| bytemuck::bytes_of(*a) != bytemuck::bytes_of(*b) && !(avg_float && within_one_ulp(*a, *b)))
        .count()
}

/// Whether two floats of the same type are at most one unit in the last place apart.
fn within_one_ulp<T: Element>(a: &T, b: &T) -> bool {
    let (x, y) = (bytemuck::bytes_of(a), bytemuck::bytes_of(b));
    let as_int = |v: &[u8]| -> i64 {
        match v.len() {
            2 => i16::from_le_bytes([v[0], v[1]]) as i64,
            4 => i32::from_le_bytes(v.try_into().unwrap()) as i64,
            8 => i64::from_le_bytes(v.try_into().unwrap()),
            _ => i64::MIN,
        }
    };
    let (i, j) = (as_int(x), as_int(y));
    // Same sign and adjacent bit patterns (or both zero).
    (i >= 0) == (j >= 0) && (i - j).abs() <= 1 || (i & i64::MAX) == 0 && (j & i64::MAX) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use sucl::{bf16, f16};

    #[test]
    fn one_ulp_tolerance_is_one_ulp() {
        let a = 1.0f32;
        let next = f32::from_bits(a.to_bits() + 1);
        let two = f32::from_bits(a.to_bits() + 2);
        assert!(within_one_ulp(&a, &next) && !within_one_ulp(&a, &two) && !within_one_ulp(&a, &-a));
        assert!(within_one_ulp(&0.0f64, &-0.0f64));
        let h = f16::from_f32(3.0);
        assert!(within_one_ulp(&h, &f16::from_bits(h.to_bits() + 1)) && !within_one_ulp(&h, &f16::from_bits(h.to_bits() + 2)));
        let b = bf16::from_f32(-2.0);
        assert!(within_one_ulp(&b, &bf16::from_bits(b.to_bits() - 1)));
    }

    #[test]
    fn expected_results_and_wrong_counts() {
        let case = Case { op: CollOp::AllReduce, count: 5, n: 3, rank: 1, root: 0, seed: 4, redop: ReduceOp::Sum };
        let mut want = vec![0i32; 5];
        assert!(expected(&case, &mut want));
        for (i, w) in want.iter().enumerate() {
            let sum: i32 = (0..3).map(|r| value::<i32>(r, i, 4, Some(ReduceOp::Sum))).sum();
            assert_eq!(*w, sum);
        }
        let mut got = want.clone();
        assert_eq!(count_wrong(&case, &got), 0);
        got[2] += 1;
        assert_eq!(count_wrong(&case, &got), 1);
        // Non-root reduce carries no result.
        let nr = Case { op: CollOp::Reduce, ..case };
        assert!(!expected(&nr, &mut want));
        assert_eq!(count_wrong(&nr, &[99i32; 5]), 0);
    }
}
