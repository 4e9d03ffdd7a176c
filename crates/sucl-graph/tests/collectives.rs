//! Collective pattern discovery: the paper's Table 3 programs and a few more at 2–8 simulated
//! ranks. Each test checks the collective chosen, its root and per-rank regions on every rank,
//! that no push / await-push is left for the forwarded buffer, and (for the cases that must stay
//! point-to-point) that no collective appears.

use sucl_graph::{
    AccessMode::*, BufferId, Chunk, Collective, CollectiveOp, CommandKind, DimMapping, GridBox, MapperMeta, RangeMapper, Region, Scheduler,
    SplitHint, TaskId, TaskSpec,
};

const N: usize = 48;

fn sim(ranks: usize) -> Scheduler {
    Scheduler::simulate(ranks, 0).unwrap()
}

/// The collective of `task` on `buffer` on every rank (panics if a rank lacks it), after
/// checking that it is the same op, root and parts everywhere and that no push / await-push of
/// that task and buffer remains.
fn collective_everywhere(s: &Scheduler, task: TaskId, buffer: BufferId) -> Collective {
    let mut first: Option<Collective> = None;
    for g in s.rank_graphs() {
        let mine: Vec<_> = g.commands.iter().filter(|c| c.task == task && c.buffer == Some(buffer)).collect();
        assert!(
            mine.iter().all(|c| c.kind == CommandKind::Collective),
            "rank {}: a push / await-push remains for task {} buffer {}: {:?}",
            g.rank,
            task.0,
            buffer.0,
            mine.iter().map(|c| c.kind).collect::<Vec<_>>()
        );
        assert_eq!(mine.len(), 1, "rank {}: one collective for task {} buffer {}", g.rank, task.0, buffer.0);
        let coll = mine[0].collective.clone().expect("a collective command carries its pattern");
        // What this rank receives is what the others send it.
        let received = coll.recvs(g.rank).iter().fold(Region::empty(), |a, p| a.union(&p.region));
        assert_eq!(received, mine[0].region, "rank {}: region = what it receives", g.rank);
        match &first {
            None => first = Some(coll),
            Some(f) => {
                assert_eq!((f.op, f.root, f.parts()), (coll.op, coll.root, coll.parts()), "rank {} disagrees", g.rank);
                assert_eq!(f, &coll, "rank {} disagrees", g.rank);
            }
        }
    }
    first.expect("at least one rank")
}

fn no_collective(s: &Scheduler) {
    for g in s.rank_graphs() {
        assert!(g.commands.iter().all(|c| c.kind != CommandKind::Collective), "rank {}: an unexpected collective", g.rank);
    }
}

fn pushes(s: &Scheduler, task: TaskId) -> usize {
    s.rank_graphs().iter().flat_map(|g| g.commands.iter()).filter(|c| c.task == task && c.kind == CommandKind::Push).count()
}

fn slab(r: usize, ranks: usize) -> Region {
    Region::from_box(GridBox::new([r * N / ranks, 0, 0], [(r + 1) * N / ranks, 1, 1]))
}

/// The rank whose chunk of a `[1]` kernel is not empty.
fn single_rank(s: &Scheduler, task: TaskId) -> usize {
    let g = s.rank_graphs();
    let with: Vec<usize> =
        g.iter().filter(|g| g.commands.iter().any(|c| c.task == task && c.kind == CommandKind::Execution)).map(|g| g.rank).collect();
    assert_eq!(with.len(), 1);
    with[0]
}

#[test]
fn all_gather_program() {
    for ranks in 2..=8 {
        let mut s = sim(ranks);
        let (a, b) = (s.create_buffer(&[N], false).unwrap(), s.create_buffer(&[N], false).unwrap());
        s.submit(TaskSpec::parallel_for("init", &[N]).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
        let t = s
            .submit(TaskSpec::parallel_for("use", &[N]).access(a, RangeMapper::All, Read).access(b, RangeMapper::OneToOne, DiscardWrite))
            .unwrap();
        let c = collective_everywhere(&s, t, a);
        assert_eq!((c.op, c.root), (CollectiveOp::AllGather, None), "{ranks} ranks");
        for (r, p) in c.parts().iter().enumerate() {
            assert_eq!((p.rank, &p.region), (r, &slab(r, ranks)), "{ranks} ranks: part of rank {r}");
        }
        assert_eq!(pushes(&s, t), 0);
    }
}

/// A kernel over `range` that reads `a` through `mapper` and writes `b` one to one.
fn read_into(name: &str, range: &[usize], a: BufferId, mapper: RangeMapper, b: BufferId) -> TaskSpec {
    TaskSpec::parallel_for(name, range).access(a, mapper, Read).access(b, RangeMapper::OneToOne, DiscardWrite)
}

/// The 1-item kernel that reads and writes all of `a`.
fn one_item(a: BufferId) -> TaskSpec {
    TaskSpec::parallel_for("one", &[1]).access(a, RangeMapper::All, ReadWrite)
}

#[test]
fn gather_scatter_program() {
    for ranks in 2..=8 {
        let mut s = sim(ranks);
        let a = s.create_buffer(&[N], false).unwrap();
        s.submit(TaskSpec::parallel_for("init", &[N]).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
        let t1 = s.submit(one_item(a)).unwrap();
        let root = single_rank(&s, t1);
        let g = collective_everywhere(&s, t1, a);
        assert_eq!((g.op, g.root), (CollectiveOp::Gather, Some(root)), "{ranks} ranks");
        assert_eq!(g.parts()[0].region, slab(0, ranks));
        let t2 = s.submit(TaskSpec::parallel_for("back", &[N]).access(a, RangeMapper::OneToOne, ReadWrite)).unwrap();
        let sc = collective_everywhere(&s, t2, a);
        assert_eq!((sc.op, sc.root), (CollectiveOp::Scatter, Some(root)), "{ranks} ranks");
        for (r, p) in sc.parts().iter().enumerate() {
            assert_eq!(p.region, slab(r, ranks), "{ranks} ranks: piece of rank {r}");
        }
    }
}

#[test]
fn gather_broadcast_program() {
    for ranks in 2..=8 {
        let mut s = sim(ranks);
        let (a, b) = (s.create_buffer(&[N], false).unwrap(), s.create_buffer(&[N], false).unwrap());
        s.submit(TaskSpec::parallel_for("init", &[N]).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
        let t1 = s.submit(one_item(a)).unwrap();
        let root = single_rank(&s, t1);
        assert_eq!(collective_everywhere(&s, t1, a).op, CollectiveOp::Gather);
        let t2 = s
            .submit(TaskSpec::parallel_for("use", &[N]).access(a, RangeMapper::All, Read).access(b, RangeMapper::OneToOne, DiscardWrite))
            .unwrap();
        let bc = collective_everywhere(&s, t2, a);
        assert_eq!((bc.op, bc.root), (CollectiveOp::Broadcast, Some(root)), "{ranks} ranks");
        let whole = Region::from_box(GridBox::full([N, 1, 1]));
        assert!(bc.parts().iter().all(|p| p.region == whole));
        assert_eq!(pushes(&s, t2), 0);
    }
}

#[test]
fn all_to_all_program() {
    for ranks in 2..=8 {
        let mut s = sim(ranks);
        let (a, b) = (s.create_buffer(&[N, N], false).unwrap(), s.create_buffer(&[N, N], false).unwrap());
        s.submit(TaskSpec::parallel_for("init", &[N, N]).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
        let t = s
            .submit(TaskSpec::parallel_for("t", &[N, N]).access(a, RangeMapper::Transposed(0, 1), Read).access(
                b,
                RangeMapper::OneToOne,
                DiscardWrite,
            ))
            .unwrap();
        let c = collective_everywhere(&s, t, a);
        assert_eq!((c.op, c.root), (CollectiveOp::AllToAll, None), "{ranks} ranks");
        for g in s.rank_graphs() {
            let coll = g.commands.iter().find(|c| c.task == t).and_then(|c| c.collective.clone()).unwrap();
            let me = g.rank;
            // Rank `me` sends rows of its slab × columns of the peer's slab.
            for p in &coll.sends(me) {
                let (lo, hi) = (me * N / ranks, (me + 1) * N / ranks);
                let (clo, chi) = (p.rank * N / ranks, (p.rank + 1) * N / ranks);
                assert_eq!(p.region, Region::from_box(GridBox::new([lo, clo, 0], [hi, chi, 1])), "{ranks} ranks: {me} → {}", p.rank);
            }
            assert_eq!(coll.sends(me).len(), ranks - 1);
            assert_eq!(coll.recvs(me).len(), ranks - 1);
        }
    }
}

#[test]
fn stencil_control_has_no_collective() {
    for ranks in 2..=8 {
        let mut s = sim(ranks);
        let (u, v) = (s.create_buffer(&[N, N], true).unwrap(), s.create_buffer(&[N, N], false).unwrap());
        for i in 0..4 {
            let (src, dst) = if i % 2 == 0 { (u, v) } else { (v, u) };
            s.submit(TaskSpec::parallel_for("jacobi", &[N, N]).access(src, RangeMapper::Neighborhood([1, 1, 0]), Read).access(
                dst,
                RangeMapper::OneToOne,
                DiscardWrite,
            ))
            .unwrap();
        }
        no_collective(&s);
        assert!(s.rank_graphs().iter().flat_map(|g| &g.commands).any(|c| c.kind == CommandKind::Push), "halos still move");
    }
}

#[test]
fn tiled_producer_read_with_all_is_an_all_gather_of_tiles() {
    for ranks in [4, 6, 8] {
        let mut s = sim(ranks);
        let (a, b) = (s.create_buffer(&[N, N], false).unwrap(), s.create_buffer(&[N], false).unwrap());
        let t0 = s
            .submit(TaskSpec::parallel_for("tiles", &[N, N]).split(SplitHint::Split2D).access(a, RangeMapper::OneToOne, DiscardWrite))
            .unwrap();
        let t1 = s
            .submit(TaskSpec::parallel_for("sum", &[N]).access(a, RangeMapper::All, Read).access(b, RangeMapper::OneToOne, DiscardWrite))
            .unwrap();
        let c = collective_everywhere(&s, t1, a);
        assert_eq!(c.op, CollectiveOp::AllGather);
        let task = s.graph().task(t0).unwrap();
        for (r, p) in c.parts().iter().enumerate() {
            let tile = sucl_graph::chunk_of(task, ranks, r).as_box();
            assert_eq!(p.region, Region::from_box(tile), "{ranks} ranks: tile of rank {r}");
            assert!(tile.max[1] - tile.min[1] < N, "a real 2D tiling");
        }
    }
}

#[test]
fn striped_matmul_all_gathers_b_and_moves_nothing_of_a() {
    for ranks in 2..=8 {
        let mut s = sim(ranks);
        let (a, b, c) =
            (s.create_buffer(&[N, N], false).unwrap(), s.create_buffer(&[N, N], false).unwrap(), s.create_buffer(&[N, N], false).unwrap());
        s.submit(TaskSpec::parallel_for("a", &[N, N]).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
        s.submit(TaskSpec::parallel_for("b", &[N, N]).access(b, RangeMapper::OneToOne, DiscardWrite)).unwrap();
        let mm = s
            .submit(TaskSpec::parallel_for("mm", &[N, N]).access(a, RangeMapper::Slice(1), Read).access(b, RangeMapper::All, Read).access(
                c,
                RangeMapper::OneToOne,
                DiscardWrite,
            ))
            .unwrap();
        assert_eq!(collective_everywhere(&s, mm, b).op, CollectiveOp::AllGather);
        for g in s.rank_graphs() {
            assert!(!g.commands.iter().any(|x| x.task == mm && x.buffer == Some(a)), "rank {}: A's stripe is local", g.rank);
        }
    }
}

#[test]
fn custom_producer_without_metadata_stays_point_to_point() {
    for ranks in 2..=8 {
        let mut s = sim(ranks);
        let (a, b) = (s.create_buffer(&[N], false).unwrap(), s.create_buffer(&[N], false).unwrap());
        let custom = RangeMapper::custom(|c: &Chunk, _| Region::from_box(c.as_box()), MapperMeta::UNKNOWN);
        s.submit(TaskSpec::parallel_for("init", &[N]).access(a, custom, DiscardWrite)).unwrap();
        let t = s
            .submit(TaskSpec::parallel_for("use", &[N]).access(a, RangeMapper::All, Read).access(b, RangeMapper::OneToOne, DiscardWrite))
            .unwrap();
        no_collective(&s);
        assert_eq!(pushes(&s, t), ranks, "every rank pushes its slab");
        // The same closure with declared metadata is an all-gather.
        let mut s = sim(ranks);
        let (a, b) = (s.create_buffer(&[N], false).unwrap(), s.create_buffer(&[N], false).unwrap());
        let meta = MapperMeta {
            constant: false,
            non_overlapping: true,
            dims: [DimMapping::Identity(0), DimMapping::Identity(1), DimMapping::Identity(2)],
        };
        let declared = RangeMapper::custom(|c: &Chunk, _| Region::from_box(c.as_box()), meta);
        s.submit(TaskSpec::parallel_for("init", &[N]).access(a, declared, DiscardWrite)).unwrap();
        let t = s
            .submit(TaskSpec::parallel_for("use", &[N]).access(a, RangeMapper::All, Read).access(b, RangeMapper::OneToOne, DiscardWrite))
            .unwrap();
        assert_eq!(collective_everywhere(&s, t, a).op, CollectiveOp::AllGather);
    }
}

#[test]
fn tiled_transpose_stays_point_to_point() {
    for ranks in [4, 6, 8] {
        let mut s = sim(ranks);
        let (a, b) = (s.create_buffer(&[N, N], false).unwrap(), s.create_buffer(&[N, N], false).unwrap());
        s.submit(TaskSpec::parallel_for("init", &[N, N]).split(SplitHint::Split2D).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
        let t = s
            .submit(TaskSpec::parallel_for("t", &[N, N]).split(SplitHint::Split2D).access(a, RangeMapper::Transposed(0, 1), Read).access(
                b,
                RangeMapper::OneToOne,
                DiscardWrite,
            ))
            .unwrap();
        no_collective(&s);
        assert!(pushes(&s, t) > 0, "{ranks} ranks: tiles move point to point");
    }
}

#[test]
fn communication_free_edges_get_no_forward_and_a_second_reader_no_transfer() {
    let mut s = sim(4);
    let (a, b) = (s.create_buffer(&[N], false).unwrap(), s.create_buffer(&[N], false).unwrap());
    s.submit(TaskSpec::parallel_for("init", &[N]).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
    let same = s
        .submit(TaskSpec::parallel_for("same", &[N]).access(a, RangeMapper::OneToOne, Read).access(b, RangeMapper::OneToOne, DiscardWrite))
        .unwrap();
    assert!(s.graph().task(same).unwrap().forwards.is_empty(), "same geometry, same mapper: no forward");
    let all = s
        .submit(TaskSpec::parallel_for("all", &[N]).access(a, RangeMapper::All, Read).access(b, RangeMapper::OneToOne, DiscardWrite))
        .unwrap();
    // Not the first reader of init's region any more: no forward, point-to-point.
    assert!(s.graph().task(all).unwrap().forwards.is_empty());
    assert_eq!(pushes(&s, all), 4);
}

#[test]
fn discovery_off_gives_push_cascades() {
    let mut s = sim(4);
    s.set_discovery(false);
    let (a, b) = (s.create_buffer(&[N], false).unwrap(), s.create_buffer(&[N], false).unwrap());
    s.submit(TaskSpec::parallel_for("init", &[N]).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
    let t = s
        .submit(TaskSpec::parallel_for("use", &[N]).access(a, RangeMapper::All, Read).access(b, RangeMapper::OneToOne, DiscardWrite))
        .unwrap();
    assert!(!s.graph().task(t).unwrap().forwards.is_empty(), "the forward is in the task graph either way");
    no_collective(&s);
    assert_eq!(pushes(&s, t), 4);
}

/// What a collective delivered is never sent again: after an all-gather (and after a gather
/// and a broadcast), later reads of the same cells move nothing, whatever mapper they use.
#[test]
fn a_replica_delivered_by_a_collective_is_not_sent_again() {
    for ranks in 2..=8 {
        let mut s = sim(ranks);
        let (a, b) = (s.create_buffer(&[N], false).unwrap(), s.create_buffer(&[N], false).unwrap());
        s.submit(TaskSpec::parallel_for("init", &[N]).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
        let t = s
            .submit(TaskSpec::parallel_for("use", &[N]).access(a, RangeMapper::All, Read).access(b, RangeMapper::OneToOne, DiscardWrite))
            .unwrap();
        assert_eq!(collective_everywhere(&s, t, a).op, CollectiveOp::AllGather);
        let again = s
            .submit(TaskSpec::parallel_for("again", &[N]).access(a, RangeMapper::All, Read).access(b, RangeMapper::OneToOne, DiscardWrite))
            .unwrap();
        let halo = s
            .submit(TaskSpec::parallel_for("halo", &[N]).access(a, RangeMapper::Neighborhood([1, 0, 0]), Read).access(
                b,
                RangeMapper::OneToOne,
                DiscardWrite,
            ))
            .unwrap();
        for task in [again, halo] {
            for g in s.rank_graphs() {
                assert!(!g.commands.iter().any(|c| c.task == task && c.buffer == Some(a)), "{ranks} ranks: rank {} moves A again", g.rank);
            }
        }
        // Gather to one rank, broadcast back: afterwards every rank holds the root's version.
        s.submit(TaskSpec::parallel_for("init", &[N]).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
        let t1 = s.submit(one_item(a)).unwrap();
        assert_eq!(collective_everywhere(&s, t1, a).op, CollectiveOp::Gather);
        let t2 = s
            .submit(TaskSpec::parallel_for("use", &[N]).access(a, RangeMapper::All, Read).access(b, RangeMapper::OneToOne, DiscardWrite))
            .unwrap();
        assert_eq!(collective_everywhere(&s, t2, a).op, CollectiveOp::Broadcast);
        let t3 = s
            .submit(TaskSpec::parallel_for("slab", &[N]).access(a, RangeMapper::OneToOne, Read).access(
                b,
                RangeMapper::OneToOne,
                DiscardWrite,
            ))
            .unwrap();
        for g in s.rank_graphs() {
            assert!(!g.commands.iter().any(|c| c.task == t3 && c.buffer == Some(a)), "{ranks} ranks: rank {} moves A again", g.rank);
        }
    }
}

/// `slice(d)` takes dimension `d` whole: for a split that cuts only `d`, every chunk maps to
/// the same cells (constant), and for a split that leaves `d` whole, distinct chunks map to
/// disjoint cells.
#[test]
fn slice_along_the_split_dimension_is_constant() {
    let only_0 = [true, false, false];
    let tiles = [true, true, false];
    let meta = |d: usize, cut: [bool; 3]| RangeMapper::Slice(d).meta_for_split(cut);
    assert!(meta(0, only_0).constant, "slice(0) of a 1D split is the whole buffer for every chunk");
    assert!(!meta(0, only_0).non_overlapping);
    assert!(!meta(1, only_0).constant, "slice(1) of a 1D split follows the chunk along 0");
    assert!(meta(1, only_0).non_overlapping);
    assert!(!meta(0, tiles).constant && !meta(0, tiles).non_overlapping, "a 2D split cuts dimension 1 too");
    assert!(meta(0, [false; 3]).constant, "one chunk: constant");
    assert_eq!(RangeMapper::OneToOne.meta_for_split(only_0), RangeMapper::OneToOne.meta(), "other mappers: as declared");
}

/// So a kernel that reads a buffer through `slice(0)` along its 1D split gets an all-gather
/// (producers on every rank) or a broadcast (one producer), not a push cascade.
#[test]
fn slice_along_the_split_becomes_all_gather_or_broadcast() {
    for ranks in 2..=8 {
        let mut s = sim(ranks);
        let (a, b) = (s.create_buffer(&[N, 4], false).unwrap(), s.create_buffer(&[N, 4], false).unwrap());
        s.submit(TaskSpec::parallel_for("init", &[N, 4]).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
        let t = s.submit(read_into("cols", &[N, 4], a, RangeMapper::Slice(0), b)).unwrap();
        let c = collective_everywhere(&s, t, a);
        assert_eq!((c.op, c.root), (CollectiveOp::AllGather, None), "{ranks} ranks");
        for (r, p) in c.parts().iter().enumerate() {
            let slab = GridBox::new([r * N / ranks, 0, 0], [(r + 1) * N / ranks, 4, 1]);
            assert_eq!(p.region, Region::from_box(slab), "{ranks} ranks: part of rank {r}");
        }
        // One producer (a master task): a broadcast of the whole buffer from rank 0.
        s.submit(TaskSpec::master_host_task("load", &[1]).access(a, RangeMapper::All, DiscardWrite)).unwrap();
        let t = s.submit(read_into("cols", &[N, 4], a, RangeMapper::Slice(0), b)).unwrap();
        let c = collective_everywhere(&s, t, a);
        assert_eq!((c.op, c.root), (CollectiveOp::Broadcast, Some(0)), "{ranks} ranks");
        assert_eq!(pushes(&s, t), 0);
    }
}

/// A = A·A: the product reads A by rows (`slice(1)`) and by columns (`slice(0)`). The column
/// accessor is constant along the 1D split and covers every cell read, so one all-gather of
/// A serves both accessors; nothing moves point to point.
#[test]
fn a_task_reading_one_buffer_through_two_accessors_keeps_discovery() {
    for ranks in 2..=8 {
        let mut s = sim(ranks);
        let (a, c) = (s.create_buffer(&[N, N], false).unwrap(), s.create_buffer(&[N, N], false).unwrap());
        s.submit(TaskSpec::parallel_for("a", &[N, N]).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
        let mm = s
            .submit(
                TaskSpec::parallel_for("square", &[N, N])
                    .access(a, RangeMapper::Slice(1), Read)
                    .access(a, RangeMapper::Slice(0), Read)
                    .access(c, RangeMapper::OneToOne, DiscardWrite),
            )
            .unwrap();
        let coll = collective_everywhere(&s, mm, a);
        assert_eq!(coll.op, CollectiveOp::AllGather, "{ranks} ranks");
        let whole = Region::from_box(GridBox::full([N, N, 1]));
        for g in s.rank_graphs() {
            let got = g.commands.iter().find(|x| x.task == mm && x.kind == CommandKind::Collective).unwrap();
            let own = Region::from_box(GridBox::new([g.rank * N / ranks, 0, 0], [(g.rank + 1) * N / ranks, N, 1]));
            assert_eq!(got.region, whole.difference(&own), "{ranks} ranks: rank {} receives every other slab", g.rank);
        }
        assert_eq!(pushes(&s, mm), 0);
    }
}

/// Accessors that read disjoint cells get a collective each (a master task reading two
/// separate ranges: two gathers); one that reads only what each rank wrote needs nothing;
/// accessors whose cells overlap (no one of them constant and covering) go point to point,
/// so no cell can arrive twice.
#[test]
fn several_accessors_get_a_collective_each_or_none() {
    let fixed = |lo: usize, hi: usize| RangeMapper::Fixed(GridBox::new([lo, 0, 0], [hi, 1, 1]));
    for ranks in 2..=8 {
        let mut s = sim(ranks);
        let (a, b) = (s.create_buffer(&[N], false).unwrap(), s.create_buffer(&[N], false).unwrap());
        s.submit(TaskSpec::parallel_for("init", &[N]).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
        let t = s
            .submit(TaskSpec::master_host_task("ends", &[1]).access(a, fixed(0, N / 4), Read).access(a, fixed(3 * N / 4, N), Read).access(
                b,
                RangeMapper::All,
                DiscardWrite,
            ))
            .unwrap();
        let mut seen = Vec::new();
        for g in s.rank_graphs() {
            let mine: Vec<_> = g.commands.iter().filter(|c| c.task == t && c.buffer == Some(a)).collect();
            assert!(mine.iter().all(|c| c.kind == CommandKind::Collective), "{ranks} ranks, rank {}: {mine:?}", g.rank);
            let ops: Vec<_> = mine.iter().map(|c| c.collective.as_ref().map(|x| (x.op, x.root, x.region.clone())).unwrap()).collect();
            seen.push(ops);
        }
        let want = vec![
            (CollectiveOp::Gather, Some(0), Region::from_box(GridBox::new([0, 0, 0], [N / 4, 1, 1]))),
            (CollectiveOp::Gather, Some(0), Region::from_box(GridBox::new([3 * N / 4, 0, 0], [N, 1, 1]))),
        ];
        assert!(seen.iter().all(|ops| *ops == want), "{ranks} ranks: {seen:?}");
        // Own cells plus a cell that every rank reads (of a fresh version): the own cells need
        // nothing, the shared cell is one collective.
        s.submit(TaskSpec::parallel_for("init", &[N]).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
        let t = s
            .submit(TaskSpec::parallel_for("own+head", &[N]).access(a, RangeMapper::OneToOne, Read).access(a, fixed(0, 1), Read).access(
                b,
                RangeMapper::OneToOne,
                DiscardWrite,
            ))
            .unwrap();
        assert_eq!(collective_everywhere(&s, t, a).region, Region::from_box(GridBox::new([0, 0, 0], [1, 1, 1])), "{ranks} ranks");
        // Overlapping reads, no accessor covering them all: point to point.
        let mut s = sim(ranks);
        let (a, b) = (s.create_buffer(&[N], false).unwrap(), s.create_buffer(&[N], false).unwrap());
        s.submit(TaskSpec::parallel_for("init", &[N]).access(a, RangeMapper::OneToOne, DiscardWrite)).unwrap();
        let t = s
            .submit(
                TaskSpec::parallel_for("overlap", &[N]).access(a, fixed(0, N / 2), Read).access(a, fixed(N / 4, 3 * N / 4), Read).access(
                    b,
                    RangeMapper::OneToOne,
                    DiscardWrite,
                ),
            )
            .unwrap();
        no_collective(&s);
        assert!(pushes(&s, t) > 0, "{ranks} ranks");
    }
}

/// Reversed writes are disjoint per chunk: read with `all`, they are an all-gather of the
/// mirrored slabs. A reversed read of one-to-one writes stays point to point (each rank needs
/// its mirror rank's slab: no pattern).
#[test]
fn reverse_writes_all_gather_and_reverse_reads_go_point_to_point() {
    for ranks in 2..=8 {
        let mut s = sim(ranks);
        let (a, b) = (s.create_buffer(&[N], false).unwrap(), s.create_buffer(&[N], false).unwrap());
        s.submit(TaskSpec::parallel_for("mirror", &[N]).access(a, RangeMapper::Reverse, DiscardWrite)).unwrap();
        let t = s.submit(read_into("use", &[N], a, RangeMapper::All, b)).unwrap();
        let c = collective_everywhere(&s, t, a);
        assert_eq!(c.op, CollectiveOp::AllGather, "{ranks} ranks");
        for (r, p) in c.parts().iter().enumerate() {
            let (lo, hi) = (r * N / ranks, (r + 1) * N / ranks);
            assert_eq!(p.region, Region::from_box(GridBox::new([N - hi, 0, 0], [N - lo, 1, 1])), "{ranks} ranks: rank {r}");
        }
        let t = s
            .submit(TaskSpec::parallel_for("init", &[N]).access(b, RangeMapper::OneToOne, DiscardWrite))
            .and_then(|_| s.submit(read_into("back", &[N], b, RangeMapper::Reverse, a)))
            .unwrap();
        assert!(!s.rank_graphs().iter().flat_map(|g| &g.commands).any(|c| c.task == t && c.kind == CommandKind::Collective));
        if N.is_multiple_of(ranks) {
            // Equal slabs: each rank pushes its slab to its mirror rank (itself in the middle of
            // an odd count, which moves nothing).
            assert_eq!(pushes(&s, t), ranks - ranks % 2, "{ranks} ranks");
        } else {
            assert!(pushes(&s, t) >= ranks - 1, "{ranks} ranks");
        }
    }
}
