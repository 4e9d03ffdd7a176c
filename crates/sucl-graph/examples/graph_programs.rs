// Small task-graph programs run on host ranks; rank 0 prints every result exactly, so runs on
// different rank counts can be compared byte for byte.
//
// `target/debug/sucl run -n 3 -- target/debug/examples/graph_programs`
//
// (Plain comments: tests/execution.rs includes this file as a module and runs `run()` in its
// own re-executed ranks, so the test never runs a stale example binary.)

use sucl_graph::{AccessMode::*, GraphError, GridBox, HostQueue, RangeMapper::*, SplitHint, TaskSpec};

fn main() {
    if let Err(e) = run() {
        eprintln!("graph_programs: {e}");
        std::process::exit(1);
    }
}

fn print(comm: &sucl_runtime::Communicator, name: &str, v: &[f64]) {
    if comm.rank() == 0 {
        let cells: Vec<String> = v.iter().map(|x| format!("{x:?}")).collect();
        println!("{name}: {}", cells.join(" "));
    }
}

pub fn run() -> Result<(), GraphError> {
    let comm = sucl_runtime::init()?;
    let mut q: HostQueue<f64> = HostQueue::new(&comm, 4)?;

    // A 1D three-point stencil, ping-ponging between two buffers (halo exchange every step).
    const N: usize = 32;
    let init: Vec<f64> = (0..N).map(|i| (i * i % 7) as f64).collect();
    let mut u = q.create_buffer(&[N], Some(init))?;
    let mut v = q.create_buffer(&[N], None)?;
    for _ in 0..5 {
        let (src, dst) = (u, v);
        let spec = TaskSpec::parallel_for("stencil", &[N]).access(src, Neighborhood([1, 0, 0]), Read).access(dst, OneToOne, DiscardWrite);
        q.submit(spec, &mut |c, b| {
            for i in c.offset[0]..c.offset[0] + c.range[0] {
                let at = |j: usize| b[src.0].data[j.min(N - 1)];
                let left = at(i.saturating_sub(1));
                b[dst.0].data[i] = (left + at(i) + at(i + 1)) / 3.0;
            }
        })?;
        std::mem::swap(&mut u, &mut v);
    }
    print(&comm, "stencil", &q.fence(u, GridBox::full([N, 1, 1]))?);

    // Every rank reads all of a buffer that was written in slabs.
    let a = q.create_buffer(&[16], None)?;
    let s = q.create_buffer(&[16], None)?;
    q.submit(TaskSpec::parallel_for("squares", &[16]).access(a, OneToOne, DiscardWrite), &mut |c, b| {
        for i in c.offset[0]..c.offset[0] + c.range[0] {
            b[a.0].data[i] = (i * i) as f64 + 0.5;
        }
    })?;
    let spec = TaskSpec::parallel_for("sum_all", &[16]).access(a, All, Read).access(s, OneToOne, DiscardWrite);
    q.submit(spec, &mut |c, b| {
        let total: f64 = b[a.0].data.iter().sum();
        for i in c.offset[0]..c.offset[0] + c.range[0] {
            b[s.0].data[i] = total / (i + 1) as f64;
        }
    })?;
    print(&comm, "all", &q.fence(s, GridBox::full([16, 1, 1]))?);

    // The master rank produces, everyone updates its slab in place.
    let m = q.create_buffer(&[10], None)?;
    q.submit(TaskSpec::master_host_task("load", &[10]).access(m, OneToOne, DiscardWrite), &mut |_, b| {
        for (i, x) in b[m.0].data.iter_mut().enumerate() {
            *x = 7.0 * i as f64 - 3.25;
        }
    })?;
    q.submit(TaskSpec::parallel_for("scale", &[10]).access(m, OneToOne, ReadWrite), &mut |c, b| {
        for i in c.offset[0]..c.offset[0] + c.range[0] {
            b[m.0].data[i] *= 1.5;
        }
    })?;
    print(&comm, "master", &q.fence(m, GridBox::full([10, 1, 1]))?);

    // A 2D transpose with a 2D split: t[i][j] = x[j][i].
    let (rows, cols) = (6, 4);
    let x = q.create_buffer(&[rows, cols], None)?;
    let t = q.create_buffer(&[cols, rows], None)?;
    let fill = TaskSpec::parallel_for("fill", &[rows, cols]).split(SplitHint::Split2D).access(x, OneToOne, DiscardWrite);
    q.submit(fill, &mut |c, b| {
        for i in c.offset[0]..c.offset[0] + c.range[0] {
            for j in c.offset[1]..c.offset[1] + c.range[1] {
                let o = b[x.0].offset([i, j, 0]);
                b[x.0].data[o] = (i * 10 + j) as f64;
            }
        }
    })?;
    let tr = TaskSpec::parallel_for("transpose", &[cols, rows]).split(SplitHint::Split2D).access(x, Transposed(0, 1), Read).access(
        t,
        OneToOne,
        DiscardWrite,
    );
    q.submit(tr, &mut |c, b| {
        for i in c.offset[0]..c.offset[0] + c.range[0] {
            for j in c.offset[1]..c.offset[1] + c.range[1] {
                let from = b[x.0].data[b[x.0].offset([j, i, 0])];
                let o = b[t.0].offset([i, j, 0]);
                b[t.0].data[o] = from;
            }
        }
    })?;
    print(&comm, "transpose", &q.fence(t, GridBox::full([cols, rows, 1]))?);
    Ok(())
}
