//! Long loops: a live rank's scheduler holds a bounded amount however many steps run —
//! horizons drop old tasks and fold old readers, executed commands are dropped — while a
//! recording scheduler keeps every command for dumps. Warnings are handed out once.

use sucl_graph::{mappers::*, AccessMode::*, DistrQueue, Footprint, QueueOptions, RangeMapper::*, Scheduler, TaskSpec};

/// The largest of each count over the run, sampled after every step.
fn max_of(a: Footprint, b: Footprint) -> Footprint {
    Footprint {
        tasks: a.tasks.max(b.tasks),
        task_readers: a.task_readers.max(b.task_readers),
        commands: a.commands.max(b.commands),
        command_readers: a.command_readers.max(b.command_readers),
        recorded_tasks: a.recorded_tasks.max(b.recorded_tasks),
    }
}

/// A stencil loop that also reads a constant input (host data, never written again) every
/// step: the pattern whose reader lists grew by one entry per step.
fn stencil_loop(s: &mut Scheduler, steps: usize, mut sample: impl FnMut(&mut Scheduler)) {
    let input = s.create_buffer(&[64], true).unwrap();
    let (mut a, mut b) = (s.create_buffer(&[64], true).unwrap(), s.create_buffer(&[64], false).unwrap());
    for _ in 0..steps {
        let t = TaskSpec::parallel_for("step", &[64]).access(input, All, Read).access(a, Neighborhood([1, 0, 0]), Read).access(
            b,
            OneToOne,
            DiscardWrite,
        );
        s.submit(t).unwrap();
        sample(s);
        std::mem::swap(&mut a, &mut b);
    }
}

#[test]
fn a_live_rank_holds_the_same_amount_after_200_and_after_2000_steps() {
    for (ranks, rank) in [(1, 0), (4, 1)] {
        let mut s = Scheduler::for_rank(ranks, rank, 4).unwrap();
        let (mut early, mut late) = (Footprint::default(), Footprint::default());
        let mut step = 0;
        let mut taken = 0;
        stencil_loop(&mut s, 2000, |s| {
            taken += s.take_commands(rank).unwrap().len();
            let f = s.footprint();
            if step < 200 {
                early = max_of(early, f);
            } else {
                late = max_of(late, f);
            }
            step += 1;
        });
        assert!(taken > 2000, "{ranks} ranks: every step's commands are handed out ({taken})");
        assert_eq!(late, early, "{ranks} ranks: the scheduler grew in a long loop");
        assert!(early.tasks <= 2 * 5 + 1 && early.commands == 0 && early.recorded_tasks == 0, "{early:?}");
        assert!(early.task_readers <= 16 && early.command_readers <= 16, "{early:?}");
    }
}

#[test]
fn a_recording_scheduler_keeps_every_command_and_task_for_dumps() {
    let mut s = Scheduler::simulate(2, 4).unwrap();
    let mut handed = 0;
    stencil_loop(&mut s, 100, |s| handed += s.take_commands(0).unwrap().len());
    let kept = s.commands(0).unwrap();
    assert_eq!(kept.len(), handed, "every command handed out is still there");
    assert!(kept.iter().enumerate().all(|(i, c)| c.id.0 == i), "kept in order from the first");
    assert!(s.footprint().recorded_tasks > 100 && s.footprint().task_readers <= 16);
}

#[test]
fn warnings_are_handed_out_once_and_kept_only_when_recording() {
    for record in [false, true] {
        let mut s = Scheduler::for_rank(2, 0, 4).unwrap();
        s.record_tasks(record);
        let never_written = s.create_buffer(&[8], false).unwrap();
        let out = s.create_buffer(&[8], false).unwrap();
        let mut seen = 0;
        for _ in 0..50 {
            s.submit(TaskSpec::parallel_for("r", &[8]).access(never_written, OneToOne, Read).access(out, OneToOne, DiscardWrite)).unwrap();
            let w = s.take_warnings();
            assert!(w.iter().all(|w| w.buffer == never_written));
            seen += w.len();
        }
        assert_eq!(seen, 50, "one warning per reading task, each handed out once");
        assert!(s.take_warnings().is_empty());
        assert_eq!(s.graph().warnings().len(), if record { 50 } else { 0 }, "record {record}");
    }
}

#[test]
fn a_live_queue_stays_bounded_and_computes_the_same() {
    let comm = sucl_runtime::init().unwrap();
    let opts = QueueOptions { horizon_step: 4, threads: 1, dump_dir: None, discovery: true };
    let mut q = DistrQueue::with_options(&comm, opts).unwrap();
    let input = q.buffer_from::<u64, 1>([16], (0..16).collect()).unwrap();
    let acc = q.buffer_from::<u64, 1>([16], vec![0; 16]).unwrap();
    let mut biggest = Footprint::default();
    for _ in 0..1000 {
        q.submit(|cgh| {
            let i = cgh.read(&input, all());
            let a = cgh.read_write(&acc, one_to_one());
            cgh.parallel_for([16], move |c, k| {
                let (i, mut a) = (k.read(&i), k.write(&a));
                for x in c.offset[0]..c.offset[0] + c.range[0] {
                    a.set([x], a.get([x]) + i.get([x]));
                }
            });
        })
        .unwrap();
        biggest = max_of(biggest, q.scheduler().footprint());
    }
    assert_eq!(q.fence_all(&acc).unwrap(), (0..16).map(|x| 1000 * x).collect::<Vec<u64>>());
    assert!(biggest.tasks <= 11 && biggest.commands == 0 && biggest.task_readers <= 16 && biggest.command_readers <= 16, "{biggest:?}");
}
