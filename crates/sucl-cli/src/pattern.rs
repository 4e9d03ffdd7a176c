//! Deterministic test data and serial references, shared by `sucl check` and `sucl bench`:
//! every rank can compute every other rank's input, so checking needs no extra communication.

use sucl::{CollOp, DType, Element, ReduceOp};

/// The most ranks the generators are designed for: sums over this many ranks stay exact.
#[cfg_attr(not(test), allow(dead_code))]
pub const MAX_RANKS: usize = 64;

/// Distinct values the order codes of `dt` use (see [`level`]): how many values of the type
/// can be told apart and are ordered like their codes.
fn levels(dt: DType) -> u64 {
    match dt {
        DType::U8 | DType::I8 => 256,
        DType::U32 | DType::I32 => 1 << 31,
        DType::U64 | DType::I64 | DType::F64 => 1 << 40,
        DType::F32 => 1 << 25,
        // Positive normal numbers, by bit pattern (0x0400..0x7C00).
        DType::F16 => 0x7800,
        // Positive normal numbers, by bit pattern (0x0080..0x7F80).
        DType::BF16 => 0x7F00,
    }
}

/// The value of order code `code` (< `levels`): exactly representable, finite, never -0, and
/// increasing with the code, so codes order values for min and max.
fn level<T: Element>(code: u64) -> T {
    let half = |l: u64| code as i64 - (l / 2) as i64;
    match T::DTYPE {
        DType::U8 | DType::U32 | DType::U64 => T::from_i64(code as i64),
        DType::F16 => bytemuck::pod_read_unaligned(&(0x0400 + code as u16).to_le_bytes()),
        DType::BF16 => bytemuck::pod_read_unaligned(&(0x0080 + code as u16).to_le_bytes()),
        dt => T::from_i64(half(levels(dt))),
    }
}

/// Codes of one rank per block: ranks get disjoint ranges of `block` codes each.
fn block(dt: DType, n: usize) -> u64 {
    (levels(dt) / n.max(1) as u64).max(1)
}

/// Position `i`'s code within a block of `p` codes: consecutive within each aligned run of `p`
/// elements (all distinct there), rotated by one from one run to the next so that data moved
/// by a whole number of runs is seen too.
fn in_block(i: usize, p: u64, seed: u64) -> u64 {
    let i = i as u64;
    (i + i / p + seed) % p
}

/// The integer range of `dt` in which sums are exact whatever the order of additions (for the
/// floats: every integer of the range is representable; for the integers: no wrap-around).
fn exact_range(dt: DType) -> (i64, i64) {
    match dt {
        DType::U8 => (0, 255),
        DType::I8 => (-128, 127),
        DType::U32 => (0, 1 << 31),
        DType::I32 => (-(1 << 30), 1 << 30),
        DType::U64 => (0, 1 << 40),
        DType::I64 | DType::F64 => (-(1 << 40), 1 << 40),
        DType::F32 => (-(1 << 24), 1 << 24),
        DType::F16 => (-2048, 2048),
        DType::BF16 => (-256, 256),
    }
}

/// How many ranks may contribute a factor of 2 or 3 to one product: 3^k stays exact.
fn prod_factors(dt: DType) -> usize {
    match dt {
        DType::U8 | DType::BF16 => 5,
        DType::I8 => 4,
        DType::F16 => 6,
        DType::U32 => 20,
        DType::I32 => 19,
        DType::F32 => 15,
        DType::U64 => 40,
        DType::I64 => 39,
        DType::F64 => 33,
    }
}

/// The sum over all ranks of element `i` for sum and avg: every value of the exact range in
/// turn (see [`in_block`]), so that neighbouring results differ.
pub fn sum_target(dt: DType, i: usize, seed: u64) -> i64 {
    let (lo, hi) = exact_range(dt);
    lo + in_block(i, (hi - lo + 1) as u64, seed) as i64
}

/// Input element `i` of `rank` (of `n`) for a run with `seed`, for `op` (`None`: data that
/// is only moved). Every value is exactly representable in `T`, and:
///
/// - moved data: rank r's values are the order codes r·p .. r·p+p−1 (p = levels / n), so no
///   two ranks share a value and one rank's values are distinct within every aligned run of p
///   elements (p ≥ 4 for 8-bit types at 64 ranks, 480 for f16, 2^18 for f32; runs shifted
///   against each other);
/// - min and max: the same codes with the ranks permuted per element, so the extreme comes
///   from a different rank at each element;
/// - sum and avg: the sum of element i over the ranks is [`sum_target`], split into shares of
///   one sign (so every partial sum, in any order, lies between 0 and the target and is exact
///   in every dtype for up to [`MAX_RANKS`] ranks);
/// - prod: at most [`prod_factors`] ranks contribute 2 or 3, the others ±1, so the product is
///   exact and does not wrap.
#[inline]
pub fn value<T: Element>(rank: usize, i: usize, n: usize, seed: u64, op: Option<ReduceOp>) -> T {
    let dt = T::DTYPE;
    let n = n.max(1);
    match op {
        None => {
            let p = block(dt, n);
            level((rank as u64 % n as u64) * p + in_block(i, p, seed))
        }
        Some(ReduceOp::Min | ReduceOp::Max) => {
            let p = block(dt, n);
            let k = (rank + i) % n;
            level(k as u64 * p + in_block(i, p, seed))
        }
        Some(ReduceOp::Sum | ReduceOp::Avg) => {
            let t = sum_target(dt, i, seed);
            let (a, nn) = (t.unsigned_abs(), n as u64);
            // The remainder goes to the ranks after element i's "first" rank, one unit each.
            let turn = ((rank + n - i % n) % n) as u64;
            let share = (a / nn + u64::from(turn < a % nn)) as i64;
            T::from_i64(if t < 0 { -share } else { share })
        }
        Some(ReduceOp::Prod) => {
            let k = prod_factors(dt).min(n);
            let signed = !matches!(dt, DType::U8 | DType::U32 | DType::U64);
            let v = if (rank + i) % n < k {
                2 + ((rank * 5 + i * 3 + seed as usize) / 2 % 2) as i64
            } else if signed && (rank + i / n + seed as usize).is_multiple_of(3) {
                -1
            } else {
                1
            };
            T::from_i64(v)
        }
    }
}

/// Fills `buf` with `rank`'s input, element `i` of the buffer having global index `base + i`.
pub fn fill<T: Element>(buf: &mut [T], rank: usize, n: usize, base: usize, seed: u64, op: Option<ReduceOp>) {
    for (i, x) in buf.iter_mut().enumerate() {
        *x = value(rank, base + i, n, seed, op);
    }
}

/// The reduction over `n` ranks of element `i` (the serial reference, in rank order).
pub fn reduced<T: Element>(n: usize, i: usize, seed: u64, op: ReduceOp) -> T {
    let mut acc: T = value(0, i, n, seed, Some(op));
    for r in 1..n {
        acc = T::combine(acc, value(r, i, n, seed, Some(op)), op);
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
#[allow(clippy::too_many_arguments)]
pub fn fill_input<T: Element>(op: CollOp, send: &mut [T], recv: &mut [T], rank: usize, n: usize, root: usize, seed: u64, redop: ReduceOp) {
    let rop = op.reduces().then_some(redop);
    match op {
        CollOp::Broadcast => {
            if rank == root {
                fill(recv, rank, n, 0, seed, None)
            }
        }
        _ => fill(send, rank, n, 0, seed, rop),
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
        CollOp::Broadcast => out.iter_mut().enumerate().for_each(|(i, x)| *x = value(root, i, n, seed, None)),
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
            out.iter_mut().enumerate().for_each(|(k, x)| *x = value(k / c, k % c, n, seed, None));
        }
        CollOp::Scatter => out.iter_mut().enumerate().for_each(|(i, x)| *x = value(root, rank * count + i, n, seed, None)),
        // Block j of recv came from rank j's send block `rank`.
        CollOp::AllToAll => out.iter_mut().enumerate().for_each(|(k, x)| *x = value(k / c, rank * count + k % c, n, seed, None)),
        CollOp::ReduceScatter => out.iter_mut().enumerate().for_each(|(i, x)| *x = reduced(n, rank * count + i, seed, redop)),
    }
    true
}

/// The expected receive buffer of `case` (`len` elements), or None where the receive buffer
/// carries no result on this rank (non-root reduce and gather).
pub fn expected_vec<T: Element>(case: &Case, len: usize) -> Option<Vec<T>> {
    let mut want = vec![T::from_i64(0); len];
    expected(case, &mut want).then_some(want)
}

/// Counts wrong elements in `recv` after `case` ran (see [`count_wrong_vs`]).
pub fn count_wrong<T: Element>(case: &Case, recv: &[T]) -> usize {
    expected_vec(case, recv.len()).map_or(0, |want| count_wrong_vs(case, &want, recv))
}

/// Counts the elements of `got` that differ from `want`: bit for bit, except for a float
/// average, whose exact value (the sum / n) is rarely representable and which backends round
/// differently (NCCL scales every input by 1/n before summing): there the result may be up to
/// n + 1 units in the last place (of the type) away from the exact quotient.
pub fn count_wrong_vs<T: Element>(case: &Case, want: &[T], got: &[T]) -> usize {
    let avg_float = case.redop == ReduceOp::Avg && T::DTYPE.is_float() && case.op.reduces();
    if got.len() != want.len() {
        return got.len().max(want.len());
    }
    if !avg_float {
        return got.iter().zip(want).filter(|(a, b)| bytemuck::bytes_of(*a) != bytemuck::bytes_of(*b)).count();
    }
    // The exact averages: the targets over n (each rank's element is its share of the target).
    let base = match case.op {
        CollOp::ReduceScatter => case.rank * case.count,
        _ => 0,
    };
    got.iter()
        .enumerate()
        .filter(|(i, g)| {
            let exact = sum_target(T::DTYPE, base + i, case.seed) as f64 / case.n as f64;
            (to_f64(*g) - exact).abs() > (case.n + 1) as f64 * ulp(T::DTYPE, exact)
        })
        .count()
}

/// A float element's value.
fn to_f64<T: Element>(x: &T) -> f64 {
    let b = bytemuck::bytes_of(x);
    match T::DTYPE {
        DType::F16 => sucl::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::BF16 => sucl::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::F32 => f32::from_le_bytes(b.try_into().expect("4 bytes")) as f64,
        DType::F64 => f64::from_le_bytes(b.try_into().expect("8 bytes")),
        _ => f64::NAN,
    }
}

/// The spacing of float type `dt`'s values around `x` (0 at 0: zero must be exact).
fn ulp(dt: DType, x: f64) -> f64 {
    let mantissa_bits = match dt {
        DType::F16 => 10,
        DType::BF16 => 7,
        DType::F32 => 23,
        _ => 52,
    };
    if x == 0.0 {
        return 0.0;
    }
    2f64.powi(x.abs().log2().floor() as i32 - mantissa_bits)
}

/// A benchmark's buffers as filled before its first call, and the expected receive buffer.
pub struct Inputs<T> {
    pub send: Vec<T>,
    pub recv: Vec<T>,
    pub want: Option<Vec<T>>,
}

/// Cached [`Inputs`]: the key, the send and receive buffers and the expected output, as bytes.
type CachedInputs = (String, Vec<u8>, Vec<u8>, Option<Vec<u8>>);

thread_local! {
    /// The last [`Inputs`] made (as bytes), by what they depend on: `--compare` and `tune`
    /// measure the same case once per backend and round, and computing the reference of a
    /// large reduction takes longer than the measurement.
    static LAST_INPUTS: std::cell::RefCell<Option<CachedInputs>> = const { std::cell::RefCell::new(None) };
}

/// Elements from their bytes (as [`inputs`] keeps them).
fn from_bytes<T: Element>(b: &[u8]) -> Vec<T> {
    let mut v = vec![T::from_i64(0); b.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(b);
    v
}

/// The inputs of `case` (`sl` and `rl` elements) that `fill` writes into zeroed buffers, and
/// with `check` the expected receive buffer; `kind` names the fill. Reuses the last ones made
/// for the same arguments.
pub fn inputs<T: Element>(kind: &str, case: &Case, sl: usize, rl: usize, check: bool, fill: impl FnOnce(&mut [T], &mut [T])) -> Inputs<T> {
    let key = format!("{kind} {case:?} {} {sl} {rl} {check}", T::DTYPE);
    let hit = LAST_INPUTS.with_borrow(|c| match c {
        Some((k, s, r, w)) if *k == key => {
            Some(Inputs { send: from_bytes(s), recv: from_bytes(r), want: w.as_ref().map(|w| from_bytes(w)) })
        }
        _ => None,
    });
    if let Some(i) = hit {
        return i;
    }
    let mut send = vec![T::from_i64(0); sl];
    let mut recv = vec![T::from_i64(0); rl];
    fill(&mut send, &mut recv);
    let want = if check { expected_vec(case, rl) } else { None };
    let bytes = |v: &[T]| bytemuck::cast_slice::<T, u8>(v).to_vec();
    LAST_INPUTS.with_borrow_mut(|c| *c = Some((key, bytes(&send), bytes(&recv), want.as_deref().map(bytes))));
    Inputs { send, recv, want }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    const RANKS: [usize; 6] = [1, 2, 3, 5, 8, MAX_RANKS];

    /// The element's value as an integer, if it is one (floats included).
    fn as_int<T: Element>(x: T) -> Option<i128> {
        let b = bytemuck::bytes_of(&x);
        let v = match T::DTYPE {
            DType::U8 => b[0] as i128,
            DType::I8 => b[0] as i8 as i128,
            DType::U32 => u32::from_le_bytes(b.try_into().unwrap()) as i128,
            DType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as i128,
            DType::U64 => u64::from_le_bytes(b.try_into().unwrap()) as i128,
            DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as i128,
            _ => {
                let f = to_f64(&x);
                if f.fract() != 0.0 || !f.is_finite() {
                    return None;
                }
                f as i128
            }
        };
        Some(v)
    }

    fn sums_exact<T: Element>() {
        let dt = T::DTYPE;
        for n in RANKS {
            let mut seen = HashSet::new();
            for i in 0..3000 {
                let shares: Vec<T> = (0..n).map(|r| value(r, i, n, 7, Some(ReduceOp::Sum))).collect();
                let target = sum_target(dt, i, 7);
                // Every share is the integer it stands for, and all have the target's sign.
                let ints: Vec<i128> = shares.iter().map(|&s| as_int(s).expect("an exact integer")).collect();
                assert_eq!(ints.iter().sum::<i128>(), target as i128, "{dt} n={n} i={i}");
                assert!(ints.iter().all(|&v| v == 0 || (v < 0) == (target < 0)), "{dt} n={n} i={i}: {ints:?}");
                // Any order of additions gives the target exactly.
                let fwd = shares.iter().copied().reduce(|a, b| T::combine(a, b, ReduceOp::Sum)).unwrap();
                let back = shares.iter().rev().copied().reduce(|a, b| T::combine(a, b, ReduceOp::Sum)).unwrap();
                assert_eq!(as_int(fwd), Some(target as i128), "{dt} n={n} i={i}");
                assert_eq!(bytemuck::bytes_of(&fwd), bytemuck::bytes_of(&back));
                assert_eq!(bytemuck::bytes_of(&fwd), bytemuck::bytes_of(&reduced::<T>(n, i, 7, ReduceOp::Sum)));
                seen.insert(target);
            }
            // Neighbouring results differ: all distinct over the exact range (bf16: 513 values).
            let (lo, hi) = exact_range(dt);
            assert_eq!(seen.len() as i64, (hi - lo + 1).min(3000), "{dt} n={n}");
        }
    }

    fn moved_data_distinct<T: Element>() {
        let dt = T::DTYPE;
        for n in RANKS {
            let p = block(dt, n).min(2000) as usize;
            let mut seen = HashSet::new();
            for r in 0..n {
                for i in 0..p {
                    let v: T = value(r, i, n, 3, None);
                    if dt.is_float() {
                        assert!(
                            to_f64(&v).is_finite() && to_f64(&v) != 0.0
                                || to_f64(&v) == 0.0 && bytemuck::bytes_of(&v).iter().all(|&b| b == 0)
                        );
                    }
                    assert!(seen.insert(bytemuck::bytes_of(&v).to_vec()), "{dt} n={n}: rank {r} element {i} repeats a value");
                }
            }
            // The next run of p elements is not a copy of the first.
            let p = block(dt, n) as usize;
            let a: T = value(0, 0, n, 3, None);
            let b: T = value(0, p, n, 3, None);
            assert_ne!(bytemuck::bytes_of(&a), bytemuck::bytes_of(&b), "{dt} n={n}");
        }
        assert!(block(dt, MAX_RANKS) >= 4);
    }

    fn min_max_vary<T: Element>() {
        for n in [2, 3, 8, MAX_RANKS] {
            let mut winners = HashSet::new();
            for i in 0..n {
                let vals: Vec<T> = (0..n).map(|r| value(r, i, n, 1, Some(ReduceOp::Max))).collect();
                let set: HashSet<Vec<u8>> = vals.iter().map(|v| bytemuck::bytes_of(v).to_vec()).collect();
                assert_eq!(set.len(), n, "{} n={n}: ranks share a value", T::DTYPE);
                let max = vals.iter().copied().reduce(|a, b| T::combine(a, b, ReduceOp::Max)).unwrap();
                winners.insert(vals.iter().position(|v| bytemuck::bytes_of(v) == bytemuck::bytes_of(&max)).unwrap());
            }
            assert_eq!(winners.len(), n, "{} n={n}: the max does not come from every rank in turn", T::DTYPE);
        }
    }

    fn prod_exact<T: Element>() {
        for n in RANKS {
            for i in 0..200 {
                let vals: Vec<T> = (0..n).map(|r| value(r, i, n, 5, Some(ReduceOp::Prod))).collect();
                let exact: i128 = vals.iter().map(|&v| as_int(v).unwrap()).product();
                let fwd = vals.iter().copied().reduce(|a, b| T::combine(a, b, ReduceOp::Prod)).unwrap();
                let back = vals.iter().rev().copied().reduce(|a, b| T::combine(a, b, ReduceOp::Prod)).unwrap();
                assert_eq!(as_int(fwd), Some(exact), "{} n={n} i={i}", T::DTYPE);
                assert_eq!(as_int(back), Some(exact), "{} n={n} i={i}", T::DTYPE);
            }
        }
    }

    #[test]
    fn every_dtype_exact_and_distinct() {
        macro_rules! all {
            ($($t:ty),*) => {$(
                sums_exact::<$t>();
                moved_data_distinct::<$t>();
                min_max_vary::<$t>();
                prod_exact::<$t>();
            )*};
        }
        all!(u8, i8, i32, u32, i64, u64, sucl::f16, sucl::bf16, f32, f64);
    }

    #[test]
    fn avg_tolerance_is_n_plus_one_ulps() {
        let case = Case { op: CollOp::AllReduce, count: 4, n: 3, rank: 0, root: 0, seed: 9, redop: ReduceOp::Avg };
        let want: Vec<f32> = (0..4).map(|i| (sum_target(DType::F32, i, 9) as f64 / 3.0) as f32).collect();
        assert_eq!(count_wrong_vs(&case, &want, &want), 0);
        let mut got = want.clone();
        got[1] = f32::from_bits(got[1].to_bits() + 3);
        assert_eq!(count_wrong_vs(&case, &want, &got), 0, "3 ulps off is within n + 1 = 4");
        got[1] = f32::from_bits(want[1].to_bits() + 6);
        assert_eq!(count_wrong_vs(&case, &want, &got), 1);
    }

    #[test]
    fn expected_results_and_wrong_counts() {
        let case = Case { op: CollOp::AllReduce, count: 5, n: 3, rank: 1, root: 0, seed: 4, redop: ReduceOp::Sum };
        let mut want = vec![0i32; 5];
        assert!(expected(&case, &mut want));
        for (i, w) in want.iter().enumerate() {
            let sum: i32 = (0..3).map(|r| value::<i32>(r, i, 3, 4, Some(ReduceOp::Sum))).sum();
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
