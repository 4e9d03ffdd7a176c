//! Range mappers: which part of a buffer a chunk of a kernel's range accesses.
//!
//! Each mapper carries [`MapperMeta`], the facts a later pass (collective pattern discovery)
//! needs to recognise communication patterns in constant time: whether the region is the same
//! for every chunk (constant), whether distinct chunks map to disjoint regions (non-overlapping),
//! and for each buffer dimension whether it follows a kernel dimension one to one (identity of
//! kernel dimension k) or is fixed regardless of the chunk (constant).

use crate::geometry::{GridBox, Index, Region, MAX_DIMS};
use serde::Serialize;
use std::fmt;
use std::sync::Arc;

/// A chunk of a kernel's range: the part one rank (or worker) executes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Chunk {
    /// First index of the chunk.
    pub offset: Index,
    /// Extent of the chunk.
    pub range: Index,
    /// Extent of the whole kernel range the chunk belongs to.
    pub global: Index,
}

impl Chunk {
    /// The chunk covering the whole range.
    pub fn whole(global: Index) -> Self {
        Chunk { offset: [0; MAX_DIMS], range: global, global }
    }

    /// The chunk's cells as a box of the kernel's index space.
    pub fn as_box(&self) -> GridBox {
        GridBox::from_subrange(self.offset, self.range)
    }
}

/// How one buffer dimension depends on the chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum DimMapping {
    /// Equal to the chunk's extent along kernel dimension `k` (identity when `k` is the same
    /// dimension, a permutation otherwise).
    Identity(usize),
    /// The same for every chunk.
    Constant,
    /// Anything else (e.g. a halo that widens the chunk).
    Other,
}

/// What a mapper guarantees about the regions it produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MapperMeta {
    /// Every chunk maps to the same region.
    pub constant: bool,
    /// Disjoint chunks map to disjoint regions.
    pub non_overlapping: bool,
    /// Per buffer dimension, how it follows the chunk.
    pub dims: [DimMapping; MAX_DIMS],
}

impl MapperMeta {
    /// Metadata that promises nothing (the default for custom mappers).
    pub const UNKNOWN: MapperMeta = MapperMeta { constant: false, non_overlapping: false, dims: [DimMapping::Other; MAX_DIMS] };
}

/// A user-supplied mapping from a chunk and the buffer's extent to the accessed region.
pub type CustomFn = dyn Fn(&Chunk, Index) -> Region + Send + Sync;

/// A range mapper. Results are always clipped to the buffer's extent.
#[derive(Clone)]
pub enum RangeMapper {
    /// The buffer cells with the chunk's indices.
    OneToOne,
    /// The whole buffer.
    All,
    /// A fixed box, whatever the chunk.
    Fixed(GridBox),
    /// The chunk widened by `h[d]` cells on each side along dimension `d` (bounding box).
    Neighborhood(Index),
    /// The chunk widened along one axis at a time (a cross: no diagonal neighbours).
    NeighborhoodAxes(Index),
    /// The chunk, but the whole of dimension `d`.
    Slice(usize),
    /// The chunk with dimensions `a` and `b` swapped.
    Transposed(usize, usize),
    /// The chunk mirrored in the kernel's range along every dimension: a chunk `[o, o + r)`
    /// of a range of extent `n` maps to `[n - o - r, n - o)` (Celerity's tests' reverse
    /// one-to-one).
    Reverse,
    /// Dimension 0 of the buffer cut into as many contiguous parts as the kernel's range has
    /// items along dimension 0 (part boundaries on multiples of the granularity, parts
    /// differing by at most one granule); a chunk gets the parts of its items and the whole
    /// buffer along the other dimensions (Celerity's `even_split`: e.g. each rank of a
    /// collective host task writes its part of a buffer to a file).
    EvenSplit(usize),
    /// A closure, with the metadata its author declares.
    Custom(Arc<CustomFn>, MapperMeta),
}

impl fmt::Debug for RangeMapper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RangeMapper::OneToOne => write!(f, "one_to_one"),
            RangeMapper::All => write!(f, "all"),
            RangeMapper::Fixed(b) => write!(f, "fixed({:?}..{:?})", b.min, b.max),
            RangeMapper::Neighborhood(h) => write!(f, "neighborhood({h:?})"),
            RangeMapper::NeighborhoodAxes(h) => write!(f, "neighborhood_axes({h:?})"),
            RangeMapper::Slice(d) => write!(f, "slice({d})"),
            RangeMapper::Transposed(a, b) => write!(f, "transposed({a}, {b})"),
            RangeMapper::Reverse => write!(f, "reverse"),
            RangeMapper::EvenSplit(g) => write!(f, "even_split({g})"),
            RangeMapper::Custom(_, m) => write!(f, "custom({m:?})"),
        }
    }
}

impl RangeMapper {
    /// A custom mapper; `meta` must hold for every chunk (use [`MapperMeta::UNKNOWN`] if unsure).
    pub fn custom(f: impl Fn(&Chunk, Index) -> Region + Send + Sync + 'static, meta: MapperMeta) -> Self {
        RangeMapper::Custom(Arc::new(f), meta)
    }

    /// The region of a buffer of extent `buffer` that `chunk` accesses.
    pub fn map(&self, chunk: &Chunk, buffer: Index) -> Region {
        let full = GridBox::full(buffer);
        if chunk.as_box().is_empty() {
            return Region::empty();
        }
        let b = match self {
            RangeMapper::OneToOne => chunk.as_box(),
            RangeMapper::All => full,
            RangeMapper::Fixed(b) => *b,
            RangeMapper::Neighborhood(h) => {
                let mut b = chunk.as_box();
                for (d, &halo) in h.iter().enumerate() {
                    b.min[d] = b.min[d].saturating_sub(halo);
                    b.max[d] += halo;
                }
                b
            }
            RangeMapper::NeighborhoodAxes(h) => {
                let c = chunk.as_box();
                let arms = (0..MAX_DIMS).map(|d| {
                    let mut b = c;
                    b.min[d] = b.min[d].saturating_sub(h[d]);
                    b.max[d] += h[d];
                    b.intersection(&full)
                });
                return Region::from_boxes(arms.chain(std::iter::once(c.intersection(&full))));
            }
            RangeMapper::Slice(d) => {
                let mut b = chunk.as_box();
                b.min[*d] = 0;
                b.max[*d] = buffer[*d];
                b
            }
            RangeMapper::Transposed(a, c) => {
                let mut b = chunk.as_box();
                b.min.swap(*a, *c);
                b.max.swap(*a, *c);
                b
            }
            RangeMapper::Reverse => {
                let mut b = chunk.as_box();
                for d in 0..MAX_DIMS {
                    b.min[d] = chunk.global[d].saturating_sub(chunk.offset[d] + chunk.range[d]);
                    b.max[d] = chunk.global[d].saturating_sub(chunk.offset[d]);
                }
                b
            }
            RangeMapper::EvenSplit(g) => {
                let mut b = full;
                let part = |k: usize| even_part_start(buffer[0], chunk.global[0], k, *g);
                b.min[0] = part(chunk.offset[0]);
                b.max[0] = part(chunk.offset[0] + chunk.range[0]);
                b
            }
            RangeMapper::Custom(f, _) => {
                return f(chunk, buffer).intersection(&Region::from_box(full));
            }
        };
        Region::from_box(b.intersection(&full))
    }

    /// True if both mappers map every chunk to the same region (custom mappers: the same closure).
    pub fn same_as(&self, other: &RangeMapper) -> bool {
        use RangeMapper::*;
        match (self, other) {
            (OneToOne, OneToOne) | (All, All) => true,
            (Fixed(a), Fixed(b)) => a == b,
            (Neighborhood(a), Neighborhood(b)) | (NeighborhoodAxes(a), NeighborhoodAxes(b)) => a == b,
            (Slice(a), Slice(b)) => a == b,
            (Transposed(a, b), Transposed(c, d)) => (a, b) == (c, d),
            (Reverse, Reverse) => true,
            (EvenSplit(a), EvenSplit(b)) => a == b,
            (Custom(f, _), Custom(g, _)) => Arc::ptr_eq(f, g),
            _ => false,
        }
    }

    /// What this mapper guarantees (see [`MapperMeta`]).
    pub fn meta(&self) -> MapperMeta {
        let identity = [DimMapping::Identity(0), DimMapping::Identity(1), DimMapping::Identity(2)];
        match self {
            RangeMapper::OneToOne => MapperMeta { constant: false, non_overlapping: true, dims: identity },
            RangeMapper::All | RangeMapper::Fixed(_) => {
                MapperMeta { constant: true, non_overlapping: false, dims: [DimMapping::Constant; MAX_DIMS] }
            }
            RangeMapper::Neighborhood(h) | RangeMapper::NeighborhoodAxes(h) => {
                let mut dims = identity;
                for d in 0..MAX_DIMS {
                    if h[d] != 0 {
                        dims[d] = DimMapping::Other;
                    }
                }
                let exact = h.iter().all(|&x| x == 0);
                MapperMeta { constant: false, non_overlapping: exact, dims }
            }
            RangeMapper::Slice(d) => {
                let mut dims = identity;
                dims[*d] = DimMapping::Constant;
                // Chunks split along `d` map to the same slab: overlap depends on the split.
                MapperMeta { constant: false, non_overlapping: false, dims }
            }
            RangeMapper::Transposed(a, b) => {
                let mut dims = identity;
                dims.swap(*a, *b);
                MapperMeta { constant: false, non_overlapping: true, dims }
            }
            // Mirrored: each buffer dimension follows the chunk, but not as an identity.
            RangeMapper::Reverse => MapperMeta { constant: false, non_overlapping: true, dims: [DimMapping::Other; MAX_DIMS] },
            // Chunks that differ only along kernel dimensions 1 and 2 map to the same part:
            // disjoint only for splits along dimension 0 (see `meta_for_split`).
            RangeMapper::EvenSplit(_) => MapperMeta {
                constant: false,
                non_overlapping: false,
                dims: [DimMapping::Other, DimMapping::Constant, DimMapping::Constant],
            },
            RangeMapper::Custom(_, m) => *m,
        }
    }

    /// What this mapper guarantees for the chunks of a split that cuts the kernel dimensions
    /// marked in `cut` (and leaves the others whole): [`RangeMapper::meta`], refined where
    /// the split decides it. `slice(d)` takes dimension `d` whole and follows the chunk in the
    /// others, so when the split cuts no dimension but `d` every chunk maps to the same cells
    /// (constant: the whole slab, which is what makes a broadcast or all-gather of it
    /// possible), and when the split leaves `d` whole distinct chunks map to disjoint cells.
    /// `even_split` follows kernel dimension 0 alone: disjoint for splits along 0 only,
    /// constant when 0 is not cut.
    pub fn meta_for_split(&self, cut: [bool; MAX_DIMS]) -> MapperMeta {
        let mut meta = self.meta();
        match self {
            RangeMapper::Slice(d) => {
                let cut_elsewhere = (0..MAX_DIMS).any(|k| k != *d && cut[k]);
                meta.constant = !cut_elsewhere;
                meta.non_overlapping = !cut[*d];
            }
            // Only the chunk's position along kernel dimension 0 matters.
            RangeMapper::EvenSplit(_) => {
                meta.constant = !cut[0];
                meta.non_overlapping = !cut[1] && !cut[2];
            }
            _ => {}
        }
        meta
    }
}

/// Where part `k` of `parts` of `[0, len)` starts (`k == parts`: `len`): boundaries on
/// multiples of `granularity` (the last part ends at `len`), parts differing by at most one
/// granule. Parts beyond the granules are empty.
pub(crate) fn even_part_start(len: usize, parts: usize, k: usize, granularity: usize) -> usize {
    let g = granularity.max(1);
    let units = len.div_ceil(g);
    if parts == 0 {
        return 0;
    }
    (k.min(parts) * units / parts * g).min(len)
}
