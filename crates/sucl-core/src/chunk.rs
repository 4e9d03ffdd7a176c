//! Partition arithmetic shared by the algorithms: how `count` elements split into blocks.

use std::ops::Range;

/// The `i`-th of `parts` near-equal contiguous blocks of `0..count`: the first `count % parts`
/// blocks get one element more. Blocks cover `0..count` exactly, in order.
#[inline]
pub fn block_range(count: usize, parts: usize, i: usize) -> Range<usize> {
    debug_assert!(parts > 0 && i < parts);
    let base = count / parts;
    let extra = count % parts;
    let start = i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    start..start + len
}

/// Splits `0..len` into consecutive pieces of at most `piece` (at least one piece, possibly empty).
pub fn pieces(len: usize, piece: usize) -> impl Iterator<Item = Range<usize>> {
    let piece = piece.max(1);
    let n = if len == 0 { 1 } else { len.div_ceil(piece) };
    (0..n).map(move |k| (k * piece).min(len)..((k + 1) * piece).min(len))
}

/// Scales an element range to a byte range.
#[inline]
pub fn bytes(r: Range<usize>, elem: usize) -> Range<usize> {
    r.start * elem..r.end * elem
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn blocks_cover_exactly(count in 0usize..100_000, parts in 1usize..70) {
            let mut next = 0;
            let mut sizes = vec![];
            for i in 0..parts {
                let r = block_range(count, parts, i);
                prop_assert_eq!(r.start, next);
                next = r.end;
                sizes.push(r.len());
            }
            prop_assert_eq!(next, count);
            let (mn, mx) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            prop_assert!(mx - mn <= 1);
        }

        #[test]
        fn pieces_cover_exactly(len in 0usize..1_000_000, piece in 1usize..100_000) {
            let mut next = 0;
            let mut n = 0;
            for r in pieces(len, piece) {
                prop_assert_eq!(r.start, next);
                prop_assert!(r.len() <= piece);
                next = r.end;
                n += 1;
            }
            prop_assert_eq!(next, len);
            prop_assert!(n >= 1);
        }
    }
}
