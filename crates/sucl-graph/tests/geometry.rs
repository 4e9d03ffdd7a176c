//! Region algebra against a brute-force set of cells.

use proptest::prelude::*;
use std::collections::BTreeSet;
use sucl_graph::{GridBox, Region, RegionMap};

const SIDE: usize = 6;

fn cells(r: &Region) -> BTreeSet<[usize; 3]> {
    let mut s = BTreeSet::new();
    for x in 0..SIDE {
        for y in 0..SIDE {
            for z in 0..SIDE {
                if r.contains_point([x, y, z]) {
                    s.insert([x, y, z]);
                }
            }
        }
    }
    s
}

fn box_cells(b: &GridBox) -> BTreeSet<[usize; 3]> {
    cells(&Region::from_box(*b))
}

fn arb_box(dims: usize) -> impl Strategy<Value = GridBox> {
    prop::collection::vec((0..SIDE, 0..SIDE), 3).prop_map(move |v| {
        let mut min = [0; 3];
        let mut max = [1; 3];
        for d in 0..dims {
            min[d] = v[d].0.min(v[d].1);
            max[d] = v[d].0.max(v[d].1) + 1;
        }
        GridBox::new(min, max)
    })
}

fn arb_region() -> impl Strategy<Value = Region> {
    (1usize..=3).prop_flat_map(|dims| prop::collection::vec(arb_box(dims), 0..4).prop_map(Region::from_boxes))
}

fn disjoint(r: &Region) -> bool {
    let b = r.boxes();
    (0..b.len()).all(|i| (i + 1..b.len()).all(|j| !b[i].intersects(&b[j]))) && b.iter().all(|x| !x.is_empty())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn algebra_matches_cell_sets(a in arb_region(), b in arb_region()) {
        let (ca, cb) = (cells(&a), cells(&b));
        let u = a.union(&b);
        let i = a.intersection(&b);
        let d = a.difference(&b);
        prop_assert!(disjoint(&u) && disjoint(&i) && disjoint(&d));
        prop_assert_eq!(cells(&u), &ca | &cb);
        prop_assert_eq!(cells(&i), &ca & &cb);
        prop_assert_eq!(cells(&d), &ca - &cb);
        prop_assert_eq!(u.area(), (&ca | &cb).len());
        prop_assert_eq!(a.intersects(&b), !(&ca & &cb).is_empty());
        prop_assert_eq!(a == b, ca == cb);
    }

    #[test]
    fn box_difference_is_disjoint_and_exact(a in arb_box(3), b in arb_box(3)) {
        let parts = a.difference(&b);
        let mut seen = BTreeSet::new();
        for p in &parts {
            for c in box_cells(p) {
                prop_assert!(seen.insert(c), "pieces overlap at {:?}", c);
            }
        }
        prop_assert_eq!(seen, &box_cells(&a) - &box_cells(&b));
    }

    #[test]
    fn region_map_matches_cell_map(updates in prop::collection::vec((arb_region(), 0u8..4), 0..6)) {
        let extent = [SIDE, SIDE, SIDE];
        let mut map = RegionMap::new(extent, 255u8);
        let mut brute = std::collections::BTreeMap::new();
        for (r, v) in &updates {
            map.update(r, *v);
            for c in cells(r) {
                brute.insert(c, *v);
            }
        }
        let whole = Region::from_box(GridBox::full(extent));
        let mut covered = 0;
        for (b, v) in map.query(&whole) {
            for c in box_cells(&b) {
                covered += 1;
                prop_assert_eq!(brute.get(&c).copied().unwrap_or(255), v, "cell {:?}", c);
            }
        }
        prop_assert_eq!(covered, SIDE * SIDE * SIDE);
    }

    #[test]
    fn update_many_matches_updates_one_by_one(
        before in prop::collection::vec((arb_region(), 0u8..4), 0..4),
        batch in prop::collection::vec((arb_region(), 4u8..8), 1..5),
    ) {
        let extent = [SIDE, SIDE, SIDE];
        let mut one = RegionMap::new(extent, 255u8);
        for (r, v) in &before {
            one.update(r, *v);
        }
        let mut many = one.clone();
        // A task's writes are disjoint: make the batch so.
        let mut taken = Region::empty();
        let mut disjoint_batch = Vec::new();
        for (r, v) in &batch {
            let r = r.difference(&taken);
            taken = taken.union(&r);
            disjoint_batch.push((r, *v));
        }
        for (r, v) in &disjoint_batch {
            one.update(r, *v);
        }
        many.update_many(&disjoint_batch);
        let whole = Region::from_box(GridBox::full(extent));
        for v in 0u8..8 {
            prop_assert_eq!(one.region_where(&whole, |x| *x == v), many.region_where(&whole, |x| *x == v), "value {}", v);
        }
    }
}
