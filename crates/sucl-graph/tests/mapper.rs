//! Range mappers: regions and metadata.

use sucl_graph::{Chunk, DimMapping, GridBox, MapperMeta, RangeMapper, Region};

fn chunk(offset: [usize; 3], range: [usize; 3], global: [usize; 3]) -> Chunk {
    Chunk { offset, range, global }
}

fn boxed(min: [usize; 3], max: [usize; 3]) -> Region {
    Region::from_box(GridBox::new(min, max))
}

#[test]
fn built_in_mappers_give_the_documented_regions() {
    let c = chunk([2, 3, 0], [2, 4, 1], [8, 8, 1]);
    let buf = [8, 8, 1];
    assert_eq!(RangeMapper::OneToOne.map(&c, buf), boxed([2, 3, 0], [4, 7, 1]));
    assert_eq!(RangeMapper::All.map(&c, buf), boxed([0, 0, 0], [8, 8, 1]));
    let fixed = GridBox::new([1, 1, 0], [3, 9, 1]);
    assert_eq!(RangeMapper::Fixed(fixed).map(&c, buf), boxed([1, 1, 0], [3, 8, 1]), "clipped to the buffer");
    assert_eq!(RangeMapper::Neighborhood([1, 1, 0]).map(&c, buf), boxed([1, 2, 0], [5, 8, 1]));
    assert_eq!(RangeMapper::Slice(1).map(&c, buf), boxed([2, 0, 0], [4, 8, 1]));
    assert_eq!(RangeMapper::Transposed(0, 1).map(&c, buf), boxed([3, 2, 0], [7, 4, 1]));
    let edge = chunk([0, 0, 0], [2, 8, 1], [8, 8, 1]);
    assert_eq!(RangeMapper::Neighborhood([1, 0, 0]).map(&edge, buf), boxed([0, 0, 0], [3, 8, 1]));
    let empty = chunk([0, 0, 0], [0, 8, 1], [8, 8, 1]);
    assert!(RangeMapper::All.map(&empty, buf).is_empty(), "an empty chunk accesses nothing");
}

#[test]
fn custom_mapper_is_clipped_and_keeps_its_metadata() {
    let meta = MapperMeta { constant: true, ..MapperMeta::UNKNOWN };
    let m = RangeMapper::custom(|_, _| Region::from_box(GridBox::new([6, 0, 0], [12, 1, 1])), meta);
    let c = chunk([0, 0, 0], [4, 1, 1], [4, 1, 1]);
    assert_eq!(m.map(&c, [8, 1, 1]), boxed([6, 0, 0], [8, 1, 1]));
    assert_eq!(m.meta(), meta);
}

#[test]
fn metadata_of_built_in_mappers() {
    use DimMapping::*;
    let one = RangeMapper::OneToOne.meta();
    assert!(!one.constant && one.non_overlapping);
    assert_eq!(one.dims, [Identity(0), Identity(1), Identity(2)]);
    let all = RangeMapper::All.meta();
    assert!(all.constant && !all.non_overlapping);
    assert_eq!(all.dims, [Constant; 3]);
    assert!(RangeMapper::Fixed(GridBox::full([1, 1, 1])).meta().constant);
    assert_eq!(RangeMapper::Transposed(0, 1).meta().dims, [Identity(1), Identity(0), Identity(2)]);
    assert!(RangeMapper::Transposed(0, 1).meta().non_overlapping);
    assert_eq!(RangeMapper::Slice(0).meta().dims, [Constant, Identity(1), Identity(2)]);
    let halo = RangeMapper::Neighborhood([1, 0, 0]).meta();
    assert_eq!(halo.dims, [Other, Identity(1), Identity(2)]);
    assert!(!halo.non_overlapping);
}

#[test]
fn reverse_mirrors_the_chunk_in_the_kernel_range() {
    let buf = [16, 1, 1];
    assert_eq!(RangeMapper::Reverse.map(&chunk([0, 0, 0], [4, 1, 1], [16, 1, 1]), buf), boxed([12, 0, 0], [16, 1, 1]));
    assert_eq!(RangeMapper::Reverse.map(&chunk([5, 0, 0], [3, 1, 1], [16, 1, 1]), buf), boxed([8, 0, 0], [11, 1, 1]));
    // 2D: mirrored along both dimensions.
    let c = chunk([0, 1, 0], [2, 2, 1], [4, 6, 1]);
    assert_eq!(RangeMapper::Reverse.map(&c, [4, 6, 1]), boxed([2, 3, 0], [4, 5, 1]));
    let meta = RangeMapper::Reverse.meta();
    assert!(meta.non_overlapping && !meta.constant);
}

#[test]
fn even_split_gives_each_item_its_part_of_dimension_0() {
    let parts = |len: usize, items: usize, g: usize| -> Vec<Region> {
        (0..items).map(|i| RangeMapper::EvenSplit(g).map(&chunk([i, 0, 0], [1, 1, 1], [items, 1, 1]), [len, 2, 1])).collect()
    };
    let rows = |lo: usize, hi: usize| boxed([lo, 0, 0], [hi, 2, 1]);
    assert_eq!(parts(10, 3, 1), vec![rows(0, 3), rows(3, 6), rows(6, 10)]);
    assert_eq!(parts(10, 3, 4), vec![rows(0, 4), rows(4, 8), rows(8, 10)], "boundaries on multiples of 4");
    let few = parts(2, 3, 1);
    assert_eq!(few.iter().filter(|r| r.is_empty()).count(), 1, "more items than rows: one gets nothing");
    // A chunk of several items gets their parts together.
    assert_eq!(RangeMapper::EvenSplit(1).map(&chunk([1, 0, 0], [2, 1, 1], [3, 1, 1]), [10, 2, 1]), rows(3, 10));
}
