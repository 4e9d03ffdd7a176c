//! Index-space geometry: boxes of 1–3 dimensions, regions (sets of disjoint boxes) and a region
//! map that stores one value per cell as a list of boxes (used for last writers).
//!
//! Everything is three-dimensional internally; a 1D or 2D object has extent 1 (min 0, max 1) in
//! the unused dimensions, so the algebra never needs to know the dimensionality.

use serde::Serialize;

/// The most dimensions a buffer or a kernel range can have.
pub const MAX_DIMS: usize = 3;

/// A point or an extent in index space (unused dimensions: 0 for points, 1 for extents).
pub type Index = [usize; MAX_DIMS];

/// Pads a 1–3 element slice to a 3D extent (missing dimensions have extent 1).
pub fn extent(dims: &[usize]) -> Index {
    assert!((1..=MAX_DIMS).contains(&dims.len()), "an extent has 1 to 3 dimensions, got {}", dims.len());
    let mut e = [1; MAX_DIMS];
    e[..dims.len()].copy_from_slice(dims);
    e
}

/// An axis-aligned box `[min, max)` in index space; empty if any `max[d] <= min[d]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct GridBox {
    /// Inclusive lower corner.
    pub min: Index,
    /// Exclusive upper corner.
    pub max: Index,
}

impl GridBox {
    /// The box `[min, max)`.
    pub fn new(min: Index, max: Index) -> Self {
        GridBox { min, max }
    }

    /// The box of `range` elements starting at `offset` (a subrange).
    pub fn from_subrange(offset: Index, range: Index) -> Self {
        let mut max = offset;
        for d in 0..MAX_DIMS {
            max[d] += range[d];
        }
        GridBox { min: offset, max }
    }

    /// The box `[0, extent)`.
    pub fn full(extent: Index) -> Self {
        GridBox { min: [0; MAX_DIMS], max: extent }
    }

    /// True if the box holds no cell.
    pub fn is_empty(&self) -> bool {
        (0..MAX_DIMS).any(|d| self.max[d] <= self.min[d])
    }

    /// The number of cells.
    pub fn area(&self) -> usize {
        if self.is_empty() {
            return 0;
        }
        (0..MAX_DIMS).map(|d| self.max[d] - self.min[d]).product()
    }

    /// The extent of the box per dimension.
    pub fn range(&self) -> Index {
        std::array::from_fn(|d| self.max[d].saturating_sub(self.min[d]))
    }

    /// True if the cell `p` lies in the box.
    pub fn contains_point(&self, p: Index) -> bool {
        (0..MAX_DIMS).all(|d| self.min[d] <= p[d] && p[d] < self.max[d])
    }

    /// The common cells of both boxes (possibly empty).
    pub fn intersection(&self, other: &GridBox) -> GridBox {
        let mut b = *self;
        for d in 0..MAX_DIMS {
            b.min[d] = self.min[d].max(other.min[d]);
            b.max[d] = self.max[d].min(other.max[d]);
        }
        b
    }

    /// True if the boxes share a cell.
    pub fn intersects(&self, other: &GridBox) -> bool {
        !self.intersection(other).is_empty()
    }

    /// The smallest box holding both (an empty box is ignored).
    pub fn bounding(&self, other: &GridBox) -> GridBox {
        if self.is_empty() {
            return *other;
        }
        if other.is_empty() {
            return *self;
        }
        let mut b = *self;
        for d in 0..MAX_DIMS {
            b.min[d] = self.min[d].min(other.min[d]);
            b.max[d] = self.max[d].max(other.max[d]);
        }
        b
    }

    /// `self \ other` as at most six disjoint boxes: slabs are cut off dimension by dimension.
    pub fn difference(&self, other: &GridBox) -> Vec<GridBox> {
        if self.is_empty() {
            return Vec::new();
        }
        let cut = self.intersection(other);
        if cut.is_empty() {
            return vec![*self];
        }
        let mut out = Vec::new();
        let mut rest = *self;
        for d in 0..MAX_DIMS {
            if rest.min[d] < cut.min[d] {
                let mut slab = rest;
                slab.max[d] = cut.min[d];
                out.push(slab);
                rest.min[d] = cut.min[d];
            }
            if cut.max[d] < rest.max[d] {
                let mut slab = rest;
                slab.min[d] = cut.max[d];
                out.push(slab);
                rest.max[d] = cut.max[d];
            }
        }
        out
    }

    /// If the two disjoint boxes together form a box (they share a whole face), that box.
    fn merged(&self, other: &GridBox) -> Option<GridBox> {
        let mut differing = None;
        for d in 0..MAX_DIMS {
            if self.min[d] != other.min[d] || self.max[d] != other.max[d] {
                if differing.is_some() {
                    return None;
                }
                differing = Some(d);
            }
        }
        let d = differing?;
        if self.max[d] == other.min[d] || other.max[d] == self.min[d] {
            Some(self.bounding(other))
        } else {
            None
        }
    }
}

/// A set of cells, kept as disjoint non-empty boxes. Equality is equality of the cell sets.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(transparent)]
pub struct Region {
    boxes: Vec<GridBox>,
}

impl PartialEq for Region {
    fn eq(&self, other: &Self) -> bool {
        self.area() == other.area() && self.difference(other).is_empty()
    }
}
impl Eq for Region {}

impl From<GridBox> for Region {
    fn from(b: GridBox) -> Self {
        Region::from_box(b)
    }
}

impl Region {
    /// The empty region.
    pub fn empty() -> Self {
        Region { boxes: Vec::new() }
    }

    /// The cells of one box.
    pub fn from_box(b: GridBox) -> Self {
        let boxes = if b.is_empty() { Vec::new() } else { vec![b] };
        Region { boxes }
    }

    /// The union of any boxes (they may overlap).
    pub fn from_boxes(boxes: impl IntoIterator<Item = GridBox>) -> Self {
        let mut r = Region::empty();
        for b in boxes {
            r = r.union(&Region::from_box(b));
        }
        r
    }

    /// The disjoint boxes of the region.
    pub fn boxes(&self) -> &[GridBox] {
        &self.boxes
    }

    /// True if the region holds no cell.
    pub fn is_empty(&self) -> bool {
        self.boxes.is_empty()
    }

    /// The number of cells.
    pub fn area(&self) -> usize {
        self.boxes.iter().map(GridBox::area).sum()
    }

    /// True if the cell `p` is in the region.
    pub fn contains_point(&self, p: Index) -> bool {
        self.boxes.iter().any(|b| b.contains_point(p))
    }

    /// The smallest box holding the region (an empty box for an empty region).
    pub fn bounding_box(&self) -> GridBox {
        self.boxes.iter().fold(GridBox::new([0; MAX_DIMS], [0; MAX_DIMS]), |acc, b| acc.bounding(b))
    }

    /// Cells in `self` or `other`.
    pub fn union(&self, other: &Region) -> Region {
        // Fast paths (common in command generation): one side empty or covered by the other.
        let covers = |big: &Region, small: &Region| {
            small.boxes.iter().all(|s| big.boxes.iter().any(|b| (0..MAX_DIMS).all(|d| b.min[d] <= s.min[d] && s.max[d] <= b.max[d])))
        };
        if covers(other, self) {
            return other.clone();
        }
        if covers(self, other) {
            return self.clone();
        }
        let mut boxes = self.boxes.clone();
        boxes.extend(other.difference(self).boxes);
        Region::normalized(boxes)
    }

    /// Cells in both.
    pub fn intersection(&self, other: &Region) -> Region {
        let mut boxes = Vec::new();
        for a in &self.boxes {
            for b in &other.boxes {
                let c = a.intersection(b);
                if !c.is_empty() {
                    boxes.push(c);
                }
            }
        }
        Region::normalized(boxes)
    }

    /// Cells in `self` but not in `other`.
    pub fn difference(&self, other: &Region) -> Region {
        let mut boxes = self.boxes.clone();
        for cut in &other.boxes {
            boxes = boxes.iter().flat_map(|b| b.difference(cut)).collect();
            if boxes.is_empty() {
                break;
            }
        }
        Region::normalized(boxes)
    }

    /// True if the regions share a cell.
    pub fn intersects(&self, other: &Region) -> bool {
        self.boxes.iter().any(|a| other.boxes.iter().any(|b| a.intersects(b)))
    }

    /// Merges boxes that share a whole face (keeps box counts small) and sorts them, so that
    /// equal regions built the same way print the same.
    fn normalized(mut boxes: Vec<GridBox>) -> Region {
        boxes.retain(|b| !b.is_empty());
        let mut merged_any = true;
        while merged_any {
            merged_any = false;
            'outer: for i in 0..boxes.len() {
                for j in i + 1..boxes.len() {
                    if let Some(m) = boxes[i].merged(&boxes[j]) {
                        boxes[i] = m;
                        boxes.swap_remove(j);
                        merged_any = true;
                        break 'outer;
                    }
                }
            }
        }
        boxes.sort();
        Region { boxes }
    }
}

/// A map from every cell of a fixed extent to a value, stored as disjoint boxes.
#[derive(Clone, Debug)]
pub struct RegionMap<T> {
    extent: Index,
    entries: Vec<(GridBox, T)>,
}

impl<T: Clone + PartialEq> RegionMap<T> {
    /// A map over `[0, extent)` with every cell holding `initial`.
    pub fn new(extent: Index, initial: T) -> Self {
        RegionMap { extent, entries: vec![(GridBox::full(extent), initial)] }
    }

    /// The extent the map covers.
    pub fn extent(&self) -> Index {
        self.extent
    }

    /// Sets every cell of `region` (clipped to the extent) to `value`.
    pub fn update(&mut self, region: &Region, value: T) {
        if region.is_empty() {
            return;
        }
        let mut entries = Vec::with_capacity(self.entries.len() + region.boxes().len());
        let bounds = region.bounding_box();
        for (b, v) in self.entries.drain(..) {
            if !b.intersects(&bounds) {
                entries.push((b, v));
                continue;
            }
            for rest in Region::from_box(b).difference(region).boxes {
                entries.push((rest, v.clone()));
            }
        }
        // Cut boxes are pieces of boxes that could not merge before, so only boxes next to
        // the new value can merge now: try those (O(entries) per new box, not O(entries²)).
        let first_new = entries.len();
        let clipped = region.intersection(&Region::from_box(GridBox::full(self.extent)));
        for b in clipped.boxes {
            entries.push((b, value.clone()));
        }
        self.entries = entries;
        self.merge_from(first_new);
    }

    /// Sets several disjoint regions at once, each to its value: one pass over the map instead
    /// of one per region (a task's writes on every rank).
    pub fn update_many(&mut self, writes: &[(Region, T)]) {
        let all = writes.iter().fold(Region::empty(), |acc, (r, _)| acc.union(r));
        if all.is_empty() {
            return;
        }
        let bounds = all.bounding_box();
        let mut entries = Vec::with_capacity(self.entries.len() + writes.len());
        for (b, v) in self.entries.drain(..) {
            if !b.intersects(&bounds) {
                entries.push((b, v));
                continue;
            }
            for rest in Region::from_box(b).difference(&all).boxes {
                entries.push((rest, v.clone()));
            }
        }
        let first_new = entries.len();
        let full = Region::from_box(GridBox::full(self.extent));
        for (r, v) in writes {
            for b in r.intersection(&full).boxes {
                entries.push((b, v.clone()));
            }
        }
        self.entries = entries;
        self.merge_from(first_new);
    }

    /// Merges each entry at or after `first` with equal-valued neighbours (greedily, each
    /// against every other entry), so the map stays small without an all-pairs pass.
    fn merge_from(&mut self, first: usize) {
        let pending = self.entries.split_off(first);
        for (mut b, v) in pending {
            while let Some(j) = self.entries.iter().position(|(o, w)| *w == v && b.merged(o).is_some()) {
                let (o, _) = self.entries.swap_remove(j);
                b = b.merged(&o).expect("checked");
            }
            self.entries.push((b, v));
        }
    }

    /// The values over `region`: disjoint boxes covering `region ∩ extent`, each with its value.
    pub fn query(&self, region: &Region) -> Vec<(GridBox, T)> {
        let mut out = Vec::new();
        for (b, v) in &self.entries {
            for q in region.boxes() {
                let c = b.intersection(q);
                if !c.is_empty() {
                    out.push((c, v.clone()));
                }
            }
        }
        out
    }

    /// The cells of `region` whose value satisfies `pred`.
    pub fn region_where(&self, region: &Region, pred: impl Fn(&T) -> bool) -> Region {
        let mut boxes = Vec::new();
        for (b, _) in self.entries.iter().filter(|(_, v)| pred(v)) {
            for q in region.boxes() {
                let c = b.intersection(q);
                if !c.is_empty() {
                    boxes.push(c);
                }
            }
        }
        Region::normalized(boxes)
    }

    /// Applies `f` to every stored value (e.g. to redirect old task ids to a horizon).
    pub fn map_values(&mut self, f: impl Fn(&T) -> T) {
        for (_, v) in &mut self.entries {
            *v = f(v);
        }
        self.merge_equal_neighbours();
    }

    /// All entries (disjoint boxes covering the extent).
    pub fn entries(&self) -> &[(GridBox, T)] {
        &self.entries
    }

    fn merge_equal_neighbours(&mut self) {
        let mut merged_any = true;
        while merged_any {
            merged_any = false;
            'outer: for i in 0..self.entries.len() {
                for j in i + 1..self.entries.len() {
                    if self.entries[i].1 == self.entries[j].1 {
                        if let Some(m) = self.entries[i].0.merged(&self.entries[j].0) {
                            self.entries[i].0 = m;
                            self.entries.swap_remove(j);
                            merged_any = true;
                            break 'outer;
                        }
                    }
                }
            }
        }
    }
}

/// Folds the readers of `readers` up to `epoch` (whose ids a horizon just redirected to it) into
/// one entry: without this, a buffer that is read every step but never written again would
/// gain an entry per step, and every later write would scan them all.
pub(crate) fn fold_old_readers<T: Copy + Ord>(readers: &mut Vec<(T, Region)>, epoch: T) {
    let mut folded = Region::empty();
    readers.retain(|(t, r)| {
        let old = *t <= epoch;
        if old {
            folded = folded.union(r);
        }
        !old
    });
    if !folded.is_empty() {
        readers.insert(0, (epoch, folded));
    }
}
