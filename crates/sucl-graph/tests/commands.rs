//! Command generation at 1–8 simulated ranks: exact commands, regions and dependencies.

use sucl_graph::{
    AccessMode::*, CommandDep, CommandKind, DepKind, GraphError, GridBox, RangeMapper::*, Region, Scheduler, SplitHint, TaskSpec,
};

/// A 1D region from `[lo, hi)` pairs.
fn r1(spans: &[(usize, usize)]) -> Region {
    Region::from_boxes(spans.iter().map(|&(lo, hi)| GridBox::new([lo, 0, 0], [hi, 1, 1])))
}

/// A rank's commands as (kind, task, peers as (rank, region)) for compact assertions.
type Summary = (CommandKind, usize, Vec<(usize, Region)>);

fn summary(s: &Scheduler, rank: usize) -> Vec<Summary> {
    s.commands(rank).unwrap().iter().map(|c| (c.kind, c.task.0, c.peers.iter().map(|p| (p.rank, p.region.clone())).collect())).collect()
}

fn deps(s: &Scheduler, rank: usize, cmd: usize) -> Vec<(usize, DepKind)> {
    s.commands(rank).unwrap()[cmd].dependencies.iter().map(|d: &CommandDep| (d.command.0, d.kind)).collect()
}

use CommandKind::{AwaitPush, Execution, Push};

#[test]
fn one_to_one_chain_never_communicates_at_any_rank_count() {
    for n in 1..=8 {
        let mut s = p2p(n, 0);
        let a = s.create_buffer(&[16], false).unwrap();
        let b = s.create_buffer(&[16], false).unwrap();
        s.submit(TaskSpec::parallel_for("init", &[16]).access(a, OneToOne, DiscardWrite)).unwrap();
        s.submit(TaskSpec::parallel_for("step", &[16]).access(a, OneToOne, Read).access(b, OneToOne, DiscardWrite)).unwrap();
        s.submit(TaskSpec::parallel_for("back", &[16]).access(b, OneToOne, Read).access(a, OneToOne, ReadWrite)).unwrap();
        for r in 0..n {
            assert_eq!(summary(&s, r), vec![(Execution, 0, vec![]), (Execution, 1, vec![]), (Execution, 2, vec![])], "{n} ranks, rank {r}");
            let cmds = s.commands(r).unwrap();
            let lo = r * 16 / n;
            let hi = (r + 1) * 16 / n;
            assert_eq!(cmds[0].chunk, Some(GridBox::new([lo, 0, 0], [hi, 1, 1])));
            assert_eq!(deps(&s, r, 1), vec![(0, DepKind::True)]);
            assert_eq!(deps(&s, r, 2), vec![(0, DepKind::True), (1, DepKind::True)]);
        }
    }
}

#[test]
fn all_after_a_1d_split_pushes_each_slab_once_to_every_other_rank() {
    let mut s = p2p(3, 0);
    let a = s.create_buffer(&[12], false).unwrap();
    let b = s.create_buffer(&[12], false).unwrap();
    s.submit(TaskSpec::parallel_for("produce", &[12]).access(a, OneToOne, DiscardWrite)).unwrap();
    s.submit(TaskSpec::parallel_for("gather", &[12]).access(a, All, Read).access(b, OneToOne, DiscardWrite)).unwrap();
    s.submit(TaskSpec::parallel_for("again", &[12]).access(a, All, Read).access(b, OneToOne, ReadWrite)).unwrap();
    assert_eq!(
        summary(&s, 1),
        vec![
            (Execution, 0, vec![]),
            (Push, 1, vec![(0, r1(&[(4, 8)])), (2, r1(&[(4, 8)]))]),
            (AwaitPush, 1, vec![(0, r1(&[(0, 4)])), (2, r1(&[(8, 12)]))]),
            (Execution, 1, vec![]),
            (Execution, 2, vec![]),
        ],
        "the second reader of the same version gets no transfer"
    );
    let cmds = s.commands(1).unwrap();
    assert_eq!(cmds[2].region, r1(&[(0, 4), (8, 12)]));
    assert_eq!(cmds[1].buffer, Some(a));
    assert_eq!(deps(&s, 1, 1), vec![(0, DepKind::True)], "push waits for the producer");
    assert_eq!(deps(&s, 1, 3), vec![(0, DepKind::True), (2, DepKind::True)]);
    assert_eq!(deps(&s, 1, 4), vec![(0, DepKind::True), (2, DepKind::True), (3, DepKind::True)]);
    for n in 1..=8 {
        let mut s = p2p(n, 0);
        let a = s.create_buffer(&[16], false).unwrap();
        s.submit(TaskSpec::parallel_for("produce", &[16]).access(a, OneToOne, DiscardWrite)).unwrap();
        s.submit(TaskSpec::master_host_task("reduce", &[1]).access(a, All, Read)).unwrap();
        for r in 1..n {
            let lo = r * 16 / n;
            let hi = (r + 1) * 16 / n;
            let expect = if lo < hi { vec![(0, r1(&[(lo, hi)]))] } else { vec![] };
            let pushes: Vec<_> = summary(&s, r).into_iter().filter(|c| c.0 == Push).flat_map(|c| c.2).collect();
            assert_eq!(pushes, expect, "{n} ranks, rank {r} gathers to the master");
        }
    }
}

#[test]
fn stencil_halo_exchanges_one_cell_with_each_neighbour() {
    let mut s = p2p(4, 0);
    let u = s.create_buffer(&[16], false).unwrap();
    let v = s.create_buffer(&[16], false).unwrap();
    s.submit(TaskSpec::parallel_for("init", &[16]).access(u, OneToOne, DiscardWrite)).unwrap();
    s.submit(TaskSpec::parallel_for("jacobi", &[16]).access(u, Neighborhood([1, 0, 0]), Read).access(v, OneToOne, DiscardWrite)).unwrap();
    assert_eq!(
        summary(&s, 1),
        vec![
            (Execution, 0, vec![]),
            (Push, 1, vec![(0, r1(&[(4, 5)])), (2, r1(&[(7, 8)]))]),
            (AwaitPush, 1, vec![(0, r1(&[(3, 4)])), (2, r1(&[(8, 9)]))]),
            (Execution, 1, vec![]),
        ]
    );
    assert_eq!(
        summary(&s, 0),
        vec![(Execution, 0, vec![]), (Push, 1, vec![(1, r1(&[(3, 4)]))]), (AwaitPush, 1, vec![(1, r1(&[(4, 5)]))]), (Execution, 1, vec![]),]
    );
    assert_eq!(
        summary(&s, 3),
        vec![
            (Execution, 0, vec![]),
            (Push, 1, vec![(2, r1(&[(12, 13)]))]),
            (AwaitPush, 1, vec![(2, r1(&[(11, 12)]))]),
            (Execution, 1, vec![]),
        ]
    );
    let exec = &s.commands(1).unwrap()[3];
    assert_eq!(exec.accesses[0].region, r1(&[(3, 9)]), "the chunk's halo region");
}

#[test]
fn master_producer_scatters_to_the_readers() {
    let mut s = p2p(3, 0);
    let a = s.create_buffer(&[6], false).unwrap();
    s.submit(TaskSpec::master_host_task("load", &[6]).access(a, OneToOne, DiscardWrite)).unwrap();
    s.submit(TaskSpec::parallel_for("use", &[6]).access(a, OneToOne, Read)).unwrap();
    assert_eq!(
        summary(&s, 0),
        vec![(Execution, 0, vec![]), (Push, 1, vec![(1, r1(&[(2, 4)])), (2, r1(&[(4, 6)]))]), (Execution, 1, vec![])]
    );
    assert_eq!(summary(&s, 2), vec![(AwaitPush, 1, vec![(0, r1(&[(4, 6)]))]), (Execution, 1, vec![])]);
    assert_eq!(deps(&s, 2, 1), vec![(0, DepKind::True)], "the kernel waits for its data");
    assert_eq!(deps(&s, 0, 2), vec![(0, DepKind::True)]);
}

#[test]
fn overlapping_writes_are_an_error_naming_task_and_region() {
    let mut s = p2p(2, 0);
    let a = s.create_buffer(&[8], false).unwrap();
    s.submit(TaskSpec::parallel_for("ok", &[8]).access(a, OneToOne, DiscardWrite)).unwrap();
    let err = s.submit(TaskSpec::parallel_for("clash", &[8]).access(a, Neighborhood([1, 0, 0]), Write)).unwrap_err();
    match &err {
        GraphError::OverlappingWrites { task, name, buffer, ranks, region } => {
            assert_eq!((*task, name.as_str(), *buffer, *ranks), (1, "clash", 0, (0, 1)));
            assert_eq!(Region::from_boxes(region.iter().copied()), r1(&[(3, 5)]));
        }
        other => panic!("wrong error {other}"),
    }
    assert!(err.to_string().contains("task 1 ('clash')"), "{err}");
}

#[test]
fn unwritten_data_never_moves_and_warns() {
    let mut s = p2p(4, 0);
    let a = s.create_buffer(&[8], false).unwrap();
    let h = s.create_buffer(&[8], true).unwrap();
    s.submit(TaskSpec::parallel_for("read", &[8]).access(a, All, Read).access(h, All, Read)).unwrap();
    for r in 0..4 {
        assert_eq!(summary(&s, r), vec![(Execution, 0, vec![])]);
    }
    assert_eq!(s.graph().warnings().len(), 1, "only the uninitialised buffer warns");
}

#[test]
fn a_2d_split_tiles_the_range_and_all_gathers_every_tile() {
    let mut s = p2p(4, 0);
    let a = s.create_buffer(&[4, 4], false).unwrap();
    s.submit(TaskSpec::parallel_for("tile", &[4, 4]).split(SplitHint::Split2D).access(a, OneToOne, DiscardWrite)).unwrap();
    s.submit(TaskSpec::parallel_for("all", &[4, 4]).split(SplitHint::Split2D).access(a, All, Read)).unwrap();
    let tile = |i: usize, j: usize| Region::from_box(GridBox::new([2 * i, 2 * j, 0], [2 * i + 2, 2 * j + 2, 1]));
    let cmds = s.commands(3).unwrap();
    assert_eq!(cmds[0].chunk, Some(GridBox::new([2, 2, 0], [4, 4, 1])));
    assert_eq!(cmds[1].kind, Push);
    assert_eq!(
        cmds[1].peers.iter().map(|p| (p.rank, p.region.clone())).collect::<Vec<_>>(),
        vec![(0, tile(1, 1)), (1, tile(1, 1)), (2, tile(1, 1))]
    );
    assert_eq!(cmds[2].kind, AwaitPush);
    assert_eq!(
        cmds[2].peers.iter().map(|p| (p.rank, p.region.clone())).collect::<Vec<_>>(),
        vec![(0, tile(0, 0)), (1, tile(0, 1)), (2, tile(1, 0))]
    );
}

#[test]
fn horizons_and_epochs_appear_on_every_rank_and_json_lists_commands() {
    let mut s = p2p(2, 2);
    let a = s.create_buffer(&[4], false).unwrap();
    s.submit(TaskSpec::parallel_for("w", &[4]).access(a, OneToOne, DiscardWrite)).unwrap();
    s.submit(TaskSpec::parallel_for("r", &[4]).access(a, All, Read)).unwrap();
    s.epoch().unwrap();
    s.submit(TaskSpec::parallel_for("after", &[4]).access(a, OneToOne, ReadWrite)).unwrap();
    let kinds: Vec<_> = s.commands(0).unwrap().iter().map(|c| c.kind).collect();
    use CommandKind::*;
    assert_eq!(kinds, vec![Execution, Push, AwaitPush, Execution, Horizon, Epoch, Execution]);
    assert_eq!(deps(&s, 0, 4), vec![(1, DepKind::Order), (3, DepKind::Order)], "the horizon waits for the front");
    assert_eq!(deps(&s, 0, 6), vec![(5, DepKind::True)], "the epoch stands for older producers");
    let json: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
    let push = &json["command_graphs"][1]["commands"][1];
    assert_eq!(json["command_graphs"][1]["rank"], 1);
    assert_eq!(push["kind"], "push");
    assert_eq!(push["task"], 1);
    assert_eq!(push["buffer"], 0);
    assert_eq!(push["targets"][0]["rank"], 0);
    assert_eq!(push["targets"][0]["region"][0]["min"][0], 2);
    let await_push = &json["command_graphs"][0]["commands"][2];
    assert_eq!(await_push["kind"], "await_push");
    assert_eq!(await_push["sources"][0]["rank"], 1);
    assert_eq!(json["tasks"][1]["dependencies"][0]["task"], 0);
    assert_eq!(json["tasks"][1]["dependencies"][0]["kind"], "true");
    assert_eq!(push["dependencies"][0]["command"], 0);
    assert_eq!(push["dependencies"][0]["kind"], "true");
}

#[test]
fn granularity_puts_chunk_boundaries_on_multiples() {
    let mut s = p2p(3, 0);
    let a = s.create_buffer(&[16, 10], false).unwrap();
    s.submit(TaskSpec::parallel_for("g", &[16, 10]).granularity(&[4, 1]).access(a, OneToOne, DiscardWrite)).unwrap();
    let chunks: Vec<_> = (0..3).map(|r| s.commands(r).unwrap()[0].chunk.unwrap()).collect();
    assert_eq!(
        chunks,
        vec![GridBox::new([0, 0, 0], [4, 10, 1]), GridBox::new([4, 0, 0], [8, 10, 1]), GridBox::new([8, 0, 0], [16, 10, 1])]
    );
    let mut s = p2p(4, 0);
    let a = s.create_buffer(&[6], false).unwrap();
    s.submit(TaskSpec::parallel_for("coarse", &[6]).granularity(&[4]).access(a, OneToOne, DiscardWrite)).unwrap();
    let got: Vec<_> = (0..4).map(|r| s.commands(r).unwrap().first().and_then(|c| c.chunk)).collect();
    assert_eq!(
        got,
        vec![None, Some(GridBox::new([0, 0, 0], [4, 1, 1])), None, Some(GridBox::new([4, 0, 0], [6, 1, 1]))],
        "two granules for four ranks"
    );
    assert!(s.submit(TaskSpec::parallel_for("bad", &[6]).granularity(&[0])).is_err());
}

/// A simulation with collective pattern discovery off: these tests check push / await-push
/// generation itself (tests/collectives.rs checks discovery).
fn p2p(ranks: usize, horizon_step: usize) -> Scheduler {
    let mut s = Scheduler::simulate(ranks, horizon_step).unwrap();
    s.set_discovery(false);
    s
}
