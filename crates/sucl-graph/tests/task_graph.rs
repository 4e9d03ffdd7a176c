//! Task graph: dependencies from last writers and readers, epochs, horizons, warnings.

use sucl_graph::{AccessMode::*, DepKind, GridBox, RangeMapper::*, TaskDep, TaskGraph, TaskId, TaskSpec};

fn dep(t: usize, kind: DepKind) -> TaskDep {
    TaskDep { task: TaskId(t), kind }
}

#[test]
fn true_anti_and_output_dependencies_per_region() {
    let mut g = TaskGraph::new(2, 0);
    let a = g.create_buffer(&[16], false).unwrap();
    let w0 = g.submit(TaskSpec::parallel_for("w_lo", &[8]).access(a, OneToOne, DiscardWrite)).unwrap();
    let w1 = g.submit(TaskSpec::parallel_for("w_hi", &[8]).access(a, Fixed(GridBox::new([8, 0, 0], [16, 1, 1])), DiscardWrite)).unwrap();
    let r = g.submit(TaskSpec::parallel_for("read_lo", &[8]).access(a, OneToOne, Read)).unwrap();
    assert_eq!(g.task(r).unwrap().deps, vec![dep(w0.0, DepKind::True)], "reads only the low half");
    let w2 = g.submit(TaskSpec::parallel_for("rewrite_all", &[16]).access(a, OneToOne, DiscardWrite)).unwrap();
    assert_eq!(g.task(w2).unwrap().deps, vec![dep(w0.0, DepKind::Output), dep(w1.0, DepKind::Output), dep(r.0, DepKind::Anti)]);
    let rw = g.submit(TaskSpec::parallel_for("rw", &[16]).access(a, OneToOne, ReadWrite)).unwrap();
    assert_eq!(g.task(rw).unwrap().deps, vec![dep(w2.0, DepKind::True)], "true wins over output");
    assert!(g.warnings().is_empty());
}

#[test]
fn reading_unwritten_data_warns_and_host_data_does_not() {
    let mut g = TaskGraph::new(2, 0);
    let a = g.create_buffer(&[8], false).unwrap();
    let h = g.create_buffer(&[8], true).unwrap();
    g.submit(TaskSpec::parallel_for("w", &[4]).access(a, OneToOne, DiscardWrite)).unwrap();
    let r = g.submit(TaskSpec::parallel_for("r", &[8]).access(a, All, Read).access(h, All, Read)).unwrap();
    let fresh = g.create_buffer(&[8], false).unwrap();
    g.submit(TaskSpec::parallel_for("produce", &[8]).access(fresh, OneToOne, DiscardWrite)).unwrap();
    assert_eq!(g.warnings().len(), 1, "discard_write is a producer only: {:?}", g.warnings());
    assert_eq!(g.warnings()[0].task, r);
    assert_eq!(g.warnings()[0].region, GridBox::new([4, 0, 0], [8, 1, 1]).into());
    // `write` keeps the cells it does not change, so it consumes them (as in Celerity).
    let other = g.create_buffer(&[8], false).unwrap();
    let w = g.submit(TaskSpec::parallel_for("write", &[8]).access(other, OneToOne, Write)).unwrap();
    assert_eq!(g.warnings().len(), 2, "write consumes: {:?}", g.warnings());
    assert_eq!((g.warnings()[1].task, &g.warnings()[1].region), (w, &GridBox::new([0, 0, 0], [8, 1, 1]).into()));
}

#[test]
fn epochs_order_everything_and_horizons_bound_the_graph() {
    let mut g = TaskGraph::new(4, 0);
    let a = g.create_buffer(&[8], false).unwrap();
    let b = g.create_buffer(&[8], false).unwrap();
    let t0 = g.submit(TaskSpec::parallel_for("a", &[8]).access(a, OneToOne, DiscardWrite)).unwrap();
    let t1 = g.submit(TaskSpec::parallel_for("b", &[8]).access(b, OneToOne, DiscardWrite)).unwrap();
    let e = g.epoch();
    assert_eq!(g.task(e).unwrap().deps, vec![dep(t0.0, DepKind::Order), dep(t1.0, DepKind::Order)]);
    let r = g.submit(TaskSpec::parallel_for("r", &[8]).access(a, OneToOne, Read)).unwrap();
    assert_eq!(g.task(r).unwrap().deps, vec![dep(e.0, DepKind::True)], "the epoch stands for older writers");
    assert!(g.task(t0).is_none(), "tasks before an epoch are dropped");

    let mut g = TaskGraph::new(4, 5);
    let a = g.create_buffer(&[64], false).unwrap();
    let mut max_live = 0;
    for i in 0..500 {
        let mode = if i == 0 { DiscardWrite } else { ReadWrite };
        g.submit(TaskSpec::parallel_for("step", &[64]).access(a, Neighborhood([1, 0, 0]), Read).access(a, OneToOne, mode)).unwrap();
        max_live = max_live.max(g.live_tasks());
    }
    assert!(max_live <= 2 * 6 + 1, "horizons keep the graph small, saw {max_live} live tasks");
    let horizons = g.tasks().filter(|t| t.kind == sucl_graph::TaskKind::Horizon).count();
    assert!(horizons >= 1);
}

#[test]
fn bad_programs_are_rejected_before_anything_is_added() {
    let mut g = TaskGraph::new(2, 0);
    assert!(g.create_buffer(&[1, 2, 3, 4], false).is_err());
    assert!(g.create_buffer(&[0], false).is_err());
    let a = g.create_buffer(&[8], false).unwrap();
    let err = g.submit(TaskSpec::parallel_for("bad", &[8]).access(sucl_graph::BufferId(7), All, Read)).unwrap_err();
    assert!(err.to_string().contains("no buffer 7"), "{err}");
    assert!(g.submit(TaskSpec::parallel_for("bad", &[8]).access(a, Slice(3), Read)).is_err());
    assert_eq!(g.live_tasks(), 0);
}
