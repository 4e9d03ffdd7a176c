//! More generation cases at simulated ranks: reversed writes, 2D stencil halos with and
//! without diagonals, several buffers per task, collective host tasks and fences.

use sucl_graph::{AccessMode::*, CommandKind, GridBox, MapperMeta, RangeMapper, RangeMapper::*, Region, Scheduler, SplitHint, TaskSpec};

fn b2(x0: usize, x1: usize, y0: usize, y1: usize) -> GridBox {
    GridBox::new([x0, y0, 0], [x1, y1, 1])
}

fn r1(lo: usize, hi: usize) -> Region {
    Region::from_box(GridBox::new([lo, 0, 0], [hi, 1, 1]))
}

/// (kind, task, buffer, peers as (rank, region)) of a transfer.
type Transfer = (CommandKind, usize, usize, Vec<(usize, Region)>);

/// Every transfer of `rank`.
fn transfers(s: &Scheduler, rank: usize) -> Vec<Transfer> {
    s.commands(rank)
        .unwrap()
        .iter()
        .filter(|c| matches!(c.kind, CommandKind::Push | CommandKind::AwaitPush))
        .map(|c| (c.kind, c.task.0, c.buffer.unwrap().0, c.peers.iter().map(|p| (p.rank, p.region.clone())).collect()))
        .collect()
}

#[test]
fn reversed_writes_move_each_slab_to_its_mirror_rank() {
    let mut s = p2p(4, 0);
    let a = s.create_buffer(&[16], false).unwrap();
    let reversed = RangeMapper::custom(
        |c, ext| {
            let (lo, hi) = (c.offset[0], c.offset[0] + c.range[0]);
            Region::from_box(GridBox::new([ext[0] - hi, 0, 0], [ext[0] - lo, 1, 1]))
        },
        MapperMeta::UNKNOWN,
    );
    s.submit(TaskSpec::parallel_for("reverse", &[16]).access(a, reversed, DiscardWrite)).unwrap();
    s.submit(TaskSpec::parallel_for("read", &[16]).access(a, OneToOne, Read)).unwrap();
    use CommandKind::{AwaitPush, Push};
    for r in 0..4 {
        let mirror = 3 - r;
        assert_eq!(
            transfers(&s, r),
            vec![(Push, 1, 0, vec![(mirror, r1(4 * mirror, 4 * mirror + 4))]), (AwaitPush, 1, 0, vec![(mirror, r1(4 * r, 4 * r + 4))]),],
            "rank {r}"
        );
    }
}

#[test]
fn a_2d_stencil_gets_corners_only_with_diagonals() {
    for (mapper, corners) in [(Neighborhood([1, 1, 0]), true), (NeighborhoodAxes([1, 1, 0]), false)] {
        let mut s = p2p(4, 0);
        let u = s.create_buffer(&[8, 8], false).unwrap();
        let v = s.create_buffer(&[8, 8], false).unwrap();
        s.submit(TaskSpec::parallel_for("init", &[8, 8]).split(SplitHint::Split2D).access(u, OneToOne, DiscardWrite)).unwrap();
        s.submit(TaskSpec::parallel_for("step", &[8, 8]).split(SplitHint::Split2D).access(u, mapper.clone(), Read).access(
            v,
            OneToOne,
            DiscardWrite,
        ))
        .unwrap();
        // Rank 0 holds tile [0,4)x[0,4); rank 1 [0,4)x[4,8); rank 2 [4,8)x[0,4); rank 3 [4,8)x[4,8).
        let mut want = vec![(1, Region::from_box(b2(0, 4, 4, 5))), (2, Region::from_box(b2(4, 5, 0, 4)))];
        if corners {
            want.push((3, Region::from_box(b2(4, 5, 4, 5))));
        }
        let t = transfers(&s, 0);
        assert_eq!(t[1].0, CommandKind::AwaitPush);
        assert_eq!(t[1].3, want, "{mapper:?}");
        // And rank 3 pushes its corner cell to rank 0 only with diagonals.
        let pushes_to_0 = transfers(&s, 3).iter().any(|(k, _, _, peers)| *k == CommandKind::Push && peers.iter().any(|p| p.0 == 0));
        assert_eq!(pushes_to_0, corners, "{mapper:?}");
    }
}

#[test]
fn several_buffers_in_one_task_get_one_transfer_each() {
    let mut s = p2p(2, 0);
    let a = s.create_buffer(&[8], false).unwrap();
    let b = s.create_buffer(&[8], false).unwrap();
    let c = s.create_buffer(&[8], false).unwrap();
    s.submit(TaskSpec::parallel_for("ab", &[8]).access(a, OneToOne, DiscardWrite).access(b, OneToOne, DiscardWrite)).unwrap();
    s.submit(TaskSpec::parallel_for("use", &[8]).access(a, All, Read).access(b, Neighborhood([1, 0, 0]), Read).access(
        c,
        OneToOne,
        DiscardWrite,
    ))
    .unwrap();
    use CommandKind::{AwaitPush, Push};
    assert_eq!(
        transfers(&s, 1),
        vec![
            (Push, 1, 0, vec![(0, r1(4, 8))]),
            (AwaitPush, 1, 0, vec![(0, r1(0, 4))]),
            (Push, 1, 1, vec![(0, r1(4, 5))]),
            (AwaitPush, 1, 1, vec![(0, r1(3, 4))]),
        ]
    );
    let exec = s.commands(1).unwrap().last().unwrap();
    assert_eq!(exec.kind, CommandKind::Execution);
    let deps: Vec<usize> = exec.dependencies.iter().map(|d| d.command.0).collect();
    assert_eq!(deps, vec![0, 2, 4], "the kernel waits for its producer and both await-pushes");
}

#[test]
fn collective_host_tasks_and_fences_bring_data_to_every_rank() {
    let mut s = p2p(3, 0);
    let a = s.create_buffer(&[9], false).unwrap();
    s.submit(TaskSpec::parallel_for("w", &[9]).access(a, OneToOne, DiscardWrite)).unwrap();
    s.submit(TaskSpec::collective_host_task("report").access(a, All, Read)).unwrap();
    for r in 0..3 {
        let cmds = s.commands(r).unwrap();
        let exec = cmds.iter().rfind(|c| c.kind == CommandKind::Execution).unwrap();
        assert_eq!(exec.chunk, Some(GridBox::new([r, 0, 0], [r + 1, 1, 1])), "one chunk per rank");
        let received: Vec<usize> =
            transfers(&s, r).iter().filter(|t| t.0 == CommandKind::AwaitPush).flat_map(|t| t.3.iter().map(|p| p.0)).collect();
        assert_eq!(received, (0..3).filter(|&o| o != r).collect::<Vec<_>>(), "rank {r}");
    }
    // A fence of a region that every rank already holds moves nothing.
    s.submit(TaskSpec::fence("fence", a, GridBox::new([2, 0, 0], [7, 1, 1]))).unwrap();
    for r in 0..3 {
        assert!(transfers(&s, r).iter().all(|t| t.1 != 2), "rank {r}: no transfer for the fence");
    }
    // After a new write, a fence of part of the buffer gathers exactly that part everywhere.
    s.submit(TaskSpec::parallel_for("w2", &[9]).access(a, OneToOne, ReadWrite)).unwrap();
    s.submit(TaskSpec::fence("fence2", a, GridBox::new([2, 0, 0], [7, 1, 1]))).unwrap();
    assert_eq!(
        transfers(&s, 1).into_iter().filter(|t| t.1 == 4).collect::<Vec<_>>(),
        vec![
            (CommandKind::Push, 4, 0, vec![(0, r1(3, 6)), (2, r1(3, 6))]),
            (CommandKind::AwaitPush, 4, 0, vec![(0, r1(2, 3)), (2, r1(6, 7))])
        ]
    );
}

/// A simulation with collective pattern discovery off: these tests check push / await-push
/// generation itself (tests/collectives.rs checks discovery).
fn p2p(ranks: usize, horizon_step: usize) -> Scheduler {
    let mut s = Scheduler::simulate(ranks, horizon_step).unwrap();
    s.set_discovery(false);
    s
}
