//! The DistrQueue API on one rank: bad input is a clear error before anything runs, kernels
//! that touch undeclared cells or panic become errors, worker threads split a chunk, and the
//! graph dump is written.

use sucl_graph::{mappers::*, DistrQueue, GraphError, GridBox, QueueOptions};

fn queue_opts(threads: usize, dump: Option<std::path::PathBuf>) -> QueueOptions {
    QueueOptions { horizon_step: 4, threads, dump_dir: dump, discovery: true }
}

#[test]
fn bad_buffers_and_command_groups_are_refused() {
    let comm = sucl_runtime::init().unwrap();
    let mut q = DistrQueue::with_options(&comm, queue_opts(1, None)).unwrap();
    let e = q.buffer_from::<f32, 2>([3, 4], vec![0.0; 11]).unwrap_err();
    assert!(e.to_string().contains("12 cells, the initial data has 11"), "{e}");
    let e = q.buffer::<f32, 2>([3, 0]).unwrap_err();
    assert!(e.to_string().contains("non-zero"), "{e}");
    let e = q.buffer::<f32, 4>([1, 1, 1, 1]).unwrap_err();
    assert!(e.to_string().contains("1 to 3"), "{e}");
    let a = q.buffer::<f32, 1>([8]).unwrap();
    let e = q.submit(|cgh| cgh.name("nothing")).unwrap_err();
    assert!(e.to_string().contains("'nothing' declares no action"), "{e}");
    let e = q
        .submit(|cgh| {
            cgh.parallel_for([8], |_, _| {});
            cgh.parallel_for([8], |_, _| {});
        })
        .unwrap_err();
    assert!(e.to_string().contains("more than one action"), "{e}");
    let e = q.fence(&a, GridBox::new([4, 0, 0], [9, 1, 1])).unwrap_err();
    assert!(e.to_string().contains("outside buffer 0"), "{e}");
    let e = q
        .submit(|cgh| {
            cgh.granularity(&[0]);
            cgh.parallel_for([8], |_, _| {});
        })
        .unwrap_err();
    assert!(e.to_string().contains("granularity"), "{e}");
    let mut other = DistrQueue::with_options(&comm, queue_opts(1, None)).unwrap();
    let e = other.fence_all(&a).unwrap_err();
    assert!(e.to_string().contains("does not belong to this queue"), "{e}");
    assert!(DistrQueue::with_options(&comm, queue_opts(0, None)).is_err(), "zero threads");
}

#[test]
fn undeclared_reads_and_panics_are_kernel_errors() {
    let comm = sucl_runtime::init().unwrap();
    let mut q = DistrQueue::with_options(&comm, queue_opts(2, None)).unwrap();
    let a = q.buffer_from::<f64, 1>([16], vec![1.0; 16]).unwrap();
    let b = q.buffer::<f64, 1>([16]).unwrap();
    let e = q
        .submit(|cgh| {
            cgh.name("peek");
            let a = cgh.read(&a, one_to_one());
            let b = cgh.discard_write(&b, one_to_one());
            cgh.parallel_for([16], move |c, k| {
                let (a, mut b) = (k.read(&a), k.write(&b));
                let i = c.offset[0];
                b.set([i], a.get([(i + c.range[0]) % 16]));
            })
        })
        .unwrap_err();
    match &e {
        GraphError::Kernel { task, message, .. } => {
            assert_eq!(task, "peek");
            assert!(message.contains("outside the cells its accessor declared"), "{message}");
        }
        other => panic!("want a kernel error, got {other}"),
    }
    let e = q
        .submit(|cgh| {
            cgh.name("boom");
            cgh.master_task([1], |_, _| panic!("host task fails"))
        })
        .unwrap_err();
    assert!(e.to_string().contains("'boom' failed: host task fails"), "{e}");
}

#[test]
fn worker_threads_get_disjoint_pieces_on_granule_boundaries() {
    let comm = sucl_runtime::init().unwrap();
    let mut q = DistrQueue::with_options(&comm, queue_opts(3, None)).unwrap();
    let a = q.buffer::<u64, 2>([20, 3]).unwrap();
    q.submit(|cgh| {
        let w = cgh.discard_write(&a, slice(1));
        cgh.granularity(&[4]);
        cgh.parallel_for([20], move |c, k| {
            let mut w = k.write(&w);
            let id = std::thread::current().id();
            let tag = format!("{id:?}").bytes().map(u64::from).sum::<u64>();
            for i in c.offset[0]..c.offset[0] + c.range[0] {
                w.slice_mut([i, 0], 3).copy_from_slice(&[c.offset[0] as u64, c.range[0] as u64, tag]);
            }
        })
    })
    .unwrap();
    let v = q.fence_all(&a).unwrap();
    let pieces: std::collections::BTreeSet<(u64, u64)> = v.chunks(3).map(|r| (r[0], r[1])).collect();
    assert_eq!(pieces.into_iter().collect::<Vec<_>>(), vec![(0, 4), (4, 8), (12, 8)], "3 pieces of 5 granules of 4");
    let threads: std::collections::BTreeSet<u64> = v.chunks(3).map(|r| r[2]).collect();
    assert_eq!(threads.len(), 3, "each piece on its own thread");
}

#[test]
fn overlapping_pieces_run_on_one_thread() {
    let comm = sucl_runtime::init().unwrap();
    let mut q = DistrQueue::with_options(&comm, queue_opts(4, None)).unwrap();
    let a = q.buffer::<u32, 1>([8]).unwrap();
    q.submit(|cgh| {
        // Every piece would write the whole buffer: the chunk must not be cut.
        let w = cgh.discard_write(&a, all());
        cgh.parallel_for([8], move |c, k| {
            let mut w = k.write(&w);
            for x in w.slice_mut([0], 8) {
                *x = c.range[0] as u32;
            }
        })
    })
    .unwrap();
    assert_eq!(q.fence_all(&a).unwrap(), vec![8; 8]);
}

#[test]
fn the_dump_lists_tasks_and_this_ranks_commands() {
    let dir = std::env::temp_dir().join(format!("sucl-graph-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    {
        let comm = sucl_runtime::init().unwrap();
        let mut q = DistrQueue::with_options(&comm, queue_opts(1, Some(dir.clone()))).unwrap();
        let a = q.buffer::<f32, 1>([4]).unwrap();
        q.submit(|cgh| {
            cgh.name("produce");
            cgh.discard_write(&a, one_to_one());
            cgh.parallel_for([4], |_, _| {})
        })
        .unwrap();
        q.fence_all(&a).unwrap();
    }
    let text = std::fs::read_to_string(dir.join("rank-0.json")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["tasks"][0]["name"], "produce");
    assert_eq!(v["tasks"][1]["kind"], "fence");
    assert_eq!(v["command_graphs"][0]["rank"], 0);
    assert_eq!(v["command_graphs"][0]["commands"][0]["kind"], "execution");
    assert_eq!(v["command_graphs"][0]["commands"][1]["dependencies"][0]["command"], 0);
}

#[test]
fn a_region_of_several_boxes_does_not_allow_the_gap_between_them() {
    use sucl_graph::{MapperMeta, RangeMapper, Region};
    let comm = sucl_runtime::init().unwrap();
    let mut q = DistrQueue::with_options(&comm, queue_opts(1, None)).unwrap();
    let a = q.buffer_from::<f32, 1>([6], vec![1.0; 6]).unwrap();
    let b = q.buffer::<f32, 1>([1]).unwrap();
    let ends = || {
        RangeMapper::custom(
            |_, _| Region::from_boxes([GridBox::new([0, 0, 0], [2, 1, 1]), GridBox::new([4, 0, 0], [6, 1, 1])]),
            MapperMeta::UNKNOWN,
        )
    };
    let read = |q: &mut DistrQueue<'_>, cells: &'static [usize], as_slice: bool| {
        q.submit(|cgh| {
            let a = cgh.read(&a, ends());
            let b = cgh.discard_write(&b, all());
            cgh.master_task([1], move |_, k| {
                let (a, mut b) = (k.read(&a), k.write(&b));
                let v: f32 = if as_slice { a.slice([cells[0]], cells.len()).iter().sum() } else { cells.iter().map(|&i| a.get([i])).sum() };
                b.set([0], v);
            })
        })
    };
    read(&mut q, &[0, 1, 4, 5], false).unwrap();
    let e = read(&mut q, &[3], false).unwrap_err();
    assert!(e.to_string().contains("cell [3] outside the cells its accessor declared"), "{e}");
    let e = read(&mut q, &[1, 2, 3, 4], true).unwrap_err();
    assert!(e.to_string().contains("inside a slice"), "{e}");
}
