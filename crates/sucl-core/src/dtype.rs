//! Element types, reduce operations and the byte-level reduction kernels.

use half::{bf16, f16};
use std::fmt;

/// The element type of a buffer reinterpreted as bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// Unsigned 8-bit integer.
    U8 = 0,
    /// Signed 8-bit integer.
    I8 = 1,
    /// Signed 32-bit integer.
    I32 = 2,
    /// Unsigned 32-bit integer.
    U32 = 3,
    /// Signed 64-bit integer.
    I64 = 4,
    /// Unsigned 64-bit integer.
    U64 = 5,
    /// IEEE half precision.
    F16 = 6,
    /// bfloat16.
    BF16 = 7,
    /// IEEE single precision.
    F32 = 8,
    /// IEEE double precision.
    F64 = 9,
}

impl DType {
    /// Every element type, in wire-code order.
    pub const ALL: [DType; 10] =
        [DType::U8, DType::I8, DType::I32, DType::U32, DType::I64, DType::U64, DType::F16, DType::BF16, DType::F32, DType::F64];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    /// The lower-case name used on the command line and in JSON (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::U64 => "u64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// Decodes a wire code.
    pub fn from_code(code: u8) -> Option<DType> {
        DType::ALL.get(code as usize).copied()
    }

    /// Parses a name as printed by [`DType::name`] (also accepts `float`, `double`, `half`, `int`).
    pub fn parse(s: &str) -> Option<DType> {
        let s = s.to_ascii_lowercase();
        DType::ALL.iter().copied().find(|d| d.name() == s).or(match s.as_str() {
            "float" | "float32" => Some(DType::F32),
            "double" | "float64" => Some(DType::F64),
            "half" | "float16" => Some(DType::F16),
            "bfloat16" => Some(DType::BF16),
            "int" | "int32" => Some(DType::I32),
            "int64" => Some(DType::I64),
            "uint8" => Some(DType::U8),
            "int8" => Some(DType::I8),
            _ => None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum (integers wrap).
    Sum = 0,
    /// Product (integers wrap).
    Prod = 1,
    /// Minimum.
    Min = 2,
    /// Maximum.
    Max = 3,
    /// Sum divided by the number of ranks (integer division for integer types).
    Avg = 4,
}

impl ReduceOp {
    /// Every reduce operation.
    pub const ALL: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Decodes a wire code.
    pub fn from_code(code: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(code as usize).copied()
    }

    /// Parses a name as printed by [`ReduceOp::name`].
    pub fn parse(s: &str) -> Option<ReduceOp> {
        let s = s.to_ascii_lowercase();
        ReduceOp::ALL.iter().copied().find(|o| o.name() == s)
    }

    /// The operation used while combining partial results (`avg` combines as `sum`, then divides).
    pub const fn combiner(self) -> ReduceOp {
        match self {
            ReduceOp::Avg => ReduceOp::Sum,
            o => o,
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A type sucl can move and reduce. Implemented for the ten element types of [`DType`].
pub trait Element: bytemuck::Pod + PartialEq + fmt::Debug + Send + Sync + 'static {
    /// The matching [`DType`].
    const DTYPE: DType;
    /// Combines two values with `op` (`avg` behaves as `sum`; see [`Element::div_count`]).
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self;
    /// Divides by a rank count (used to finish `avg`).
    fn div_count(a: Self, n: usize) -> Self;
    /// Converts a small integer, used to build test patterns.
    fn from_i64(v: i64) -> Self;
}

macro_rules! int_element {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline(always)]
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                }
            }
            fn div_count(a: Self, n: usize) -> Self {
                a / (n as $t)
            }
            fn from_i64(v: i64) -> Self {
                v as $t
            }
        }
    };
}
int_element!(u8, DType::U8);
int_element!(i8, DType::I8);
int_element!(i32, DType::I32);
int_element!(u32, DType::U32);
int_element!(i64, DType::I64);
int_element!(u64, DType::U64);

macro_rules! float_element {
    ($t:ty, $d:expr, $from:expr, $to:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            #[inline(always)]
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Min => {
                        if b < a {
                            b
                        } else {
                            a
                        }
                    }
                    ReduceOp::Max => {
                        if b > a {
                            b
                        } else {
                            a
                        }
                    }
                }
            }
            fn div_count(a: Self, n: usize) -> Self {
                let f: fn(f64) -> Self = $from;
                let t: fn(Self) -> f64 = $to;
                f(t(a) / n as f64)
            }
            fn from_i64(v: i64) -> Self {
                let f: fn(f64) -> Self = $from;
                f(v as f64)
            }
        }
    };
}
float_element!(f32, DType::F32, |x| x as f32, |x| x as f64);
float_element!(f64, DType::F64, |x| x, |x| x);
float_element!(f16, DType::F16, f16::from_f64, f16::to_f64);
float_element!(bf16, DType::BF16, bf16::from_f64, bf16::to_f64);

#[inline(always)]
fn combine_typed<T: Element>(acc: &mut [u8], src: &[u8], op: ReduceOp) {
    // Buffers arriving from the network or shared memory need not be aligned for T.
    let n = acc.len() / std::mem::size_of::<T>();
    let sz = std::mem::size_of::<T>();
    if let (Ok(a), Ok(s)) = (bytemuck::try_cast_slice_mut::<u8, T>(acc), bytemuck::try_cast_slice::<u8, T>(src)) {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => a.iter_mut().zip(s).for_each(|(x, y)| *x = T::combine(*x, *y, ReduceOp::Sum)),
            ReduceOp::Prod => a.iter_mut().zip(s).for_each(|(x, y)| *x = T::combine(*x, *y, ReduceOp::Prod)),
            ReduceOp::Min => a.iter_mut().zip(s).for_each(|(x, y)| *x = T::combine(*x, *y, ReduceOp::Min)),
            ReduceOp::Max => a.iter_mut().zip(s).for_each(|(x, y)| *x = T::combine(*x, *y, ReduceOp::Max)),
        }
        return;
    }
    for i in 0..n {
        let r = i * sz..(i + 1) * sz;
        let x: T = bytemuck::pod_read_unaligned(&acc[r.clone()]);
        let y: T = bytemuck::pod_read_unaligned(&src[r.clone()]);
        acc[r].copy_from_slice(bytemuck::bytes_of(&T::combine(x, y, op)));
    }
}

fn combine_left_typed<T: Element>(acc: &mut [u8], left: &[u8], op: ReduceOp) {
    let sz = std::mem::size_of::<T>();
    if let (Ok(a), Ok(l)) = (bytemuck::try_cast_slice_mut::<u8, T>(acc), bytemuck::try_cast_slice::<u8, T>(left)) {
        a.iter_mut().zip(l).for_each(|(x, y)| *x = T::combine(*y, *x, op));
        return;
    }
    for (x, y) in acc.chunks_exact_mut(sz).zip(left.chunks_exact(sz)) {
        let (a, l): (T, T) = (bytemuck::pod_read_unaligned(x), bytemuck::pod_read_unaligned(y));
        x.copy_from_slice(bytemuck::bytes_of(&T::combine(l, a, op)));
    }
}

/// `acc[i] = left[i] op acc[i]` (the left operand from `left`): the same bits as
/// [`reduce_bytes_into`] of `(left, acc)`, in place, for callers that must keep a rank order of
/// operands while the right one already sits in the output (`avg` adds).
pub fn reduce_bytes_left(acc: &mut [u8], left: &[u8], dtype: DType, op: ReduceOp) {
    debug_assert_eq!(acc.len(), left.len());
    let op = op.combiner();
    match dtype {
        DType::U8 => combine_left_typed::<u8>(acc, left, op),
        DType::I8 => combine_left_typed::<i8>(acc, left, op),
        DType::I32 => combine_left_typed::<i32>(acc, left, op),
        DType::U32 => combine_left_typed::<u32>(acc, left, op),
        DType::I64 => combine_left_typed::<i64>(acc, left, op),
        DType::U64 => combine_left_typed::<u64>(acc, left, op),
        DType::F16 => combine_left_typed::<f16>(acc, left, op),
        DType::BF16 => combine_left_typed::<bf16>(acc, left, op),
        DType::F32 => combine_left_typed::<f32>(acc, left, op),
        DType::F64 => combine_left_typed::<f64>(acc, left, op),
    }
}

/// `acc[i] = acc[i] op src[i]` over byte buffers holding `dtype` elements (`avg` adds).
///
/// Both slices must have the same length, a multiple of the element size.
pub fn reduce_bytes(acc: &mut [u8], src: &[u8], dtype: DType, op: ReduceOp) {
    debug_assert_eq!(acc.len(), src.len());
    debug_assert_eq!(acc.len() % dtype.size(), 0);
    let op = op.combiner();
    match dtype {
        DType::U8 => combine_typed::<u8>(acc, src, op),
        DType::I8 => combine_typed::<i8>(acc, src, op),
        DType::I32 => combine_typed::<i32>(acc, src, op),
        DType::U32 => combine_typed::<u32>(acc, src, op),
        DType::I64 => combine_typed::<i64>(acc, src, op),
        DType::U64 => combine_typed::<u64>(acc, src, op),
        DType::F16 => combine_typed::<f16>(acc, src, op),
        DType::BF16 => combine_typed::<bf16>(acc, src, op),
        DType::F32 => combine_typed::<f32>(acc, src, op),
        DType::F64 => combine_typed::<f64>(acc, src, op),
    }
}

#[inline(always)]
fn combine3_typed<T: Element>(dst: &mut [u8], a: &[u8], b: &[u8], op: ReduceOp) {
    if let (Ok(d), Ok(x), Ok(y)) =
        (bytemuck::try_cast_slice_mut::<u8, T>(dst), bytemuck::try_cast_slice::<u8, T>(a), bytemuck::try_cast_slice::<u8, T>(b))
    {
        macro_rules! go {
            ($op:expr) => {
                d.iter_mut().zip(x.iter().zip(y)).for_each(|(o, (p, q))| *o = T::combine(*p, *q, $op))
            };
        }
        match op {
            ReduceOp::Sum | ReduceOp::Avg => go!(ReduceOp::Sum),
            ReduceOp::Prod => go!(ReduceOp::Prod),
            ReduceOp::Min => go!(ReduceOp::Min),
            ReduceOp::Max => go!(ReduceOp::Max),
        }
        return;
    }
    dst.copy_from_slice(a);
    combine_typed::<T>(dst, b, op);
}

/// `dst[i] = a[i] op b[i]` in one pass (the out-of-place form of [`reduce_bytes`]).
pub fn reduce_bytes_into(dst: &mut [u8], a: &[u8], b: &[u8], dtype: DType, op: ReduceOp) {
    debug_assert!(dst.len() == a.len() && a.len() == b.len());
    let op = op.combiner();
    match dtype {
        DType::U8 => combine3_typed::<u8>(dst, a, b, op),
        DType::I8 => combine3_typed::<i8>(dst, a, b, op),
        DType::I32 => combine3_typed::<i32>(dst, a, b, op),
        DType::U32 => combine3_typed::<u32>(dst, a, b, op),
        DType::I64 => combine3_typed::<i64>(dst, a, b, op),
        DType::U64 => combine3_typed::<u64>(dst, a, b, op),
        DType::F16 => combine3_typed::<f16>(dst, a, b, op),
        DType::BF16 => combine3_typed::<bf16>(dst, a, b, op),
        DType::F32 => combine3_typed::<f32>(dst, a, b, op),
        DType::F64 => combine3_typed::<f64>(dst, a, b, op),
    }
}

fn divide_typed<T: Element>(buf: &mut [u8], n: usize) {
    let sz = std::mem::size_of::<T>();
    for c in buf.chunks_exact_mut(sz) {
        let x: T = bytemuck::pod_read_unaligned(c);
        c.copy_from_slice(bytemuck::bytes_of(&T::div_count(x, n)));
    }
}

/// Finishes a reduction: for `avg`, divides every element by `nranks`; other ops are untouched.
pub fn finish_reduce(buf: &mut [u8], dtype: DType, op: ReduceOp, nranks: usize) {
    if op != ReduceOp::Avg {
        return;
    }
    match dtype {
        DType::U8 => divide_typed::<u8>(buf, nranks),
        DType::I8 => divide_typed::<i8>(buf, nranks),
        DType::I32 => divide_typed::<i32>(buf, nranks),
        DType::U32 => divide_typed::<u32>(buf, nranks),
        DType::I64 => divide_typed::<i64>(buf, nranks),
        DType::U64 => divide_typed::<u64>(buf, nranks),
        DType::F16 => divide_typed::<f16>(buf, nranks),
        DType::BF16 => divide_typed::<bf16>(buf, nranks),
        DType::F32 => divide_typed::<f32>(buf, nranks),
        DType::F64 => divide_typed::<f64>(buf, nranks),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.name()), Some(d));
            assert_eq!(DType::from_code(d as u8), Some(d));
        }
        for o in ReduceOp::ALL {
            assert_eq!(ReduceOp::parse(o.name()), Some(o));
        }
        assert_eq!(DType::parse("nope"), None);
    }

    #[test]
    fn reduce_unaligned_matches_aligned() {
        let a: Vec<f32> = (0..17).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..17).map(|i| (i * 2) as f32).collect();
        let mut acc = [0u8; 1 + 17 * 4];
        acc[1..].copy_from_slice(bytemuck::cast_slice(&a));
        let mut src = [0u8; 1 + 17 * 4];
        src[1..].copy_from_slice(bytemuck::cast_slice(&b));
        reduce_bytes(&mut acc[1..], &src[1..], DType::F32, ReduceOp::Sum);
        for i in 0..17 {
            let v: f32 = bytemuck::pod_read_unaligned(&acc[1 + i * 4..5 + i * 4]);
            assert_eq!(v, (i * 3) as f32);
        }
    }

    #[test]
    fn reduce_left_gives_the_bits_of_the_operands_in_order() {
        // Operands whose order shows: non-commutative bit patterns (NaNs with payloads of
        // either side, signed zeros, mixed signs), at aligned and unaligned offsets.
        for dt in DType::ALL {
            let n = 37;
            let bytes = |seed: u64| -> Vec<u8> {
                let mut x = seed;
                (0..n * dt.size())
                    .map(|_| {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        (x >> 56) as u8
                    })
                    .collect()
            };
            let (a, b) = (bytes(1), bytes(2));
            for op in ReduceOp::ALL {
                let mut want = vec![0u8; a.len()];
                reduce_bytes_into(&mut want, &a, &b, dt, op);
                for shift in [0, 1] {
                    let mut acc = vec![0u8; a.len() + shift];
                    acc[shift..].copy_from_slice(&b);
                    reduce_bytes_left(&mut acc[shift..], &a, dt, op);
                    assert_eq!(&acc[shift..], &want[..], "{dt} {op} at offset {shift}");
                }
            }
        }
    }

    /// Whether the element in `b` is a floating-point NaN.
    fn is_nan(dt: DType, b: &[u8]) -> bool {
        match dt {
            DType::F16 => f16::from_le_bytes(b.try_into().unwrap()).is_nan(),
            DType::BF16 => bf16::from_le_bytes(b.try_into().unwrap()).is_nan(),
            DType::F32 => f32::from_le_bytes(b.try_into().unwrap()).is_nan(),
            DType::F64 => f64::from_le_bytes(b.try_into().unwrap()).is_nan(),
            _ => false,
        }
    }

    #[test]
    fn three_operand_matches_two_operand() {
        for dt in DType::ALL {
            for op in ReduceOp::ALL {
                let a: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37)).collect();
                let b: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(11).wrapping_add(3)).collect();
                let mut two = a.clone();
                reduce_bytes(&mut two, &b, dt, op);
                let mut three = vec![0u8; 64];
                reduce_bytes_into(&mut three, &a, &b, dt, op);
                // Element by element: bitwise equal, or (floats only) both NaN, whose payloads
                // may differ between the two kernels.
                for (i, (x, y)) in two.chunks(dt.size()).zip(three.chunks(dt.size())).enumerate() {
                    assert!(
                        x == y || is_nan(dt, x) && is_nan(dt, y),
                        "{dt} {op} element {i}: {x:?} (two-operand) != {y:?} (three-operand)"
                    );
                }
            }
        }
    }

    #[test]
    fn avg_and_wrapping() {
        let mut acc = vec![250u8, 3];
        reduce_bytes(&mut acc, &[10, 4], DType::U8, ReduceOp::Sum);
        assert_eq!(acc, vec![4, 7]);
        let mut buf: Vec<u8> = bytemuck::cast_slice(&[9i32, -9]).to_vec();
        finish_reduce(&mut buf, DType::I32, ReduceOp::Avg, 2);
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&buf), &[4, -4]);
    }
}
