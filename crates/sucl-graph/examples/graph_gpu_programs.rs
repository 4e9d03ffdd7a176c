// Task-graph programs on GPU ranks (DistrQueue::on_device, CUDA kernels compiled by NVRTC):
// the 1D and 2D stencils, all-reads, master and collective host tasks, the matrix transpose and
// the direct N-body and the Table 3 programs of graph_programs.rs, with the same arithmetic
// (compiled without fused multiply-add), plus a chain of one_to_one kernels. Rank 0 prints every result exactly in the
// host example's format, so the two can be compared line by line.
//
// `target/debug/sucl run -n 2 -- target/debug/examples/graph_gpu_programs`
//
// (Plain comments: tests/gpu.rs includes this file as a module and runs `run()` in its own
// re-executed ranks.)

use sucl_graph::{mappers::*, CudaSource, DistrQueue, GraphError, KernelArg, SplitHint};

const HELP: &str = "Usage: graph_gpu_programs (no arguments; one rank per GPU, started with `sucl run`)

The task-graph programs of graph_programs on GPU ranks (DistrQueue::on_device: buffers in
device memory, CUDA C kernels compiled at run time by NVRTC, transfers over NCCL or staged
through host memory), plus a chain of one_to_one kernels. Rank 0 prints every result exactly
in graph_programs' format, so the two can be compared line by line.

Example:
  target/debug/sucl run -n 2 -- target/debug/examples/graph_gpu_programs

Settings (environment): SUCL_GRAPH_CPD (0: no collective pattern discovery),
SUCL_GRAPH_DEVICE_TRANSPORT (auto, nccl or staged), CUDA_VISIBLE_DEVICES. Without a GPU (or CUDA
driver) every rank ends with a one-line error.
";

fn main() {
    if let Some(arg) = std::env::args().nth(1) {
        if arg == "--help" || arg == "-h" {
            print!("{HELP}");
            return;
        }
        eprintln!("graph_gpu_programs: takes no arguments, got {arg:?} (--help for usage)");
        std::process::exit(2);
    }
    if let Err(e) = run() {
        eprintln!("graph_gpu_programs: {e}");
        std::process::exit(1);
    }
}

/// The kernels (the prelude's sucl_chunk, sucl_extent, sucl_item come first).
pub const SRC: &str = r#"
extern "C" __global__ void chain_fill(sucl_chunk c, double* a, sucl_extent ae) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    a[i[0]] = (double)(i[0] + 1);
}
extern "C" __global__ void chain_scale(sucl_chunk c, const double* a, sucl_extent ae, double* b, sucl_extent be, double k) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    b[i[0]] = a[i[0]] * k;
}
extern "C" __global__ void chain_mix(sucl_chunk c, const double* a, sucl_extent ae, const double* b, sucl_extent be, double* d, sucl_extent de) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    d[i[0]] = b[i[0]] + a[ae.e[0] - 1 - i[0]];
}
extern "C" __global__ void stencil1d(sucl_chunk c, const double* src, sucl_extent se, double* dst, sucl_extent de) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    sucl_size n = se.e[0], x = i[0];
    sucl_size lo = x == 0 ? 0 : x - 1, hi = x + 1 > n - 1 ? n - 1 : x + 1;
    dst[x] = (src[lo] + src[x] + src[hi]) / 3.0;
}
extern "C" __global__ void fill_squares(sucl_chunk c, double* a, sucl_extent ae) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    a[i[0]] = (double)(i[0] * i[0]) + 0.5;
}
extern "C" __global__ void all_sum(sucl_chunk c, const double* a, sucl_extent ae, double* s, sucl_extent se) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    double total = 0.0;
    for (sucl_size j = 0; j < ae.e[0]; j++) total += a[j];
    s[i[0]] = total / (double)(i[0] + 1);
}
extern "C" __global__ void scale_in_place(sucl_chunk c, double* m, sucl_extent me, double k) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    m[i[0]] = m[i[0]] * k;
}
extern "C" __global__ void stencil2d(sucl_chunk c, const float* src, sucl_extent se, float* dst, sucl_extent de) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    sucl_size n = se.e[0], m = se.e[1];
    float acc = 0.0f;
    for (int di = 0; di < 3; di++) {
        for (int dj = 0; dj < 3; dj++) {
            sucl_size x = i[0] + di, y = i[1] + dj;
            x = x == 0 ? 0 : x - 1; if (x > n - 1) x = n - 1;
            y = y == 0 ? 0 : y - 1; if (y > m - 1) y = m - 1;
            acc += src[sucl_at(se, x, y)] * ((di == 1 && dj == 1) ? 0.5f : 0.0625f);
        }
    }
    dst[sucl_at(de, i[0], i[1])] = acc;
}
extern "C" __global__ void fill_index(sucl_chunk c, double* x, sucl_extent xe) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    x[sucl_at(xe, i[0], i[1])] = (double)(i[0] * 10 + i[1]);
}
extern "C" __global__ void transpose(sucl_chunk c, const double* x, sucl_extent xe, double* t, sucl_extent te) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    t[sucl_at(te, i[0], i[1])] = x[sucl_at(xe, i[1], i[0])];
}
extern "C" __global__ void t3_fill(sucl_chunk c, double* a, sucl_extent ae, double k0) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    a[i[0]] = k0 + (double)((i[0] * i[0]) % 11);
}
extern "C" __global__ void t3_allgather(sucl_chunk c, const double* a, sucl_extent ae, double* b, sucl_extent be) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    double sum = 0.0;
    for (sucl_size j = 0; j < ae.e[0]; j++) sum += a[j];
    b[i[0]] = sum - a[i[0]];
}
extern "C" __global__ void t3_prefix(sucl_chunk c, double* a, sucl_extent ae) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    double acc = 0.0;
    for (sucl_size j = 0; j < ae.e[0]; j++) { acc += a[j]; a[j] = acc; }
}
extern "C" __global__ void t3_scatter(sucl_chunk c, double* a, sucl_extent ae) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    a[i[0]] = a[i[0]] * 0.5 + (double)i[0];
}
extern "C" __global__ void t3_bcast(sucl_chunk c, const double* d, sucl_extent de, double* e, sucl_extent ee) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    e[i[0]] = d[de.e[0] - 1 - i[0]] - d[i[0]];
}
extern "C" __global__ void t3_rows(sucl_chunk c, double* x, sucl_extent xe) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    x[sucl_at(xe, i[0], i[1])] = (double)(i[0] * 100 + i[1]);
}
extern "C" __global__ void nbody_vel(sucl_chunk c, const double* p, sucl_extent pe, double* v, sucl_extent ve, double dt) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    sucl_size n = pe.e[0], b = i[0];
    double me0 = p[3 * b], me1 = p[3 * b + 1], me2 = p[3 * b + 2];
    double a0 = 0.0, a1 = 0.0, a2 = 0.0;
    for (sucl_size j = 0; j < n; j++) {
        double d0 = p[3 * j] - me0, d1 = p[3 * j + 1] - me1, d2 = p[3 * j + 2] - me2;
        double r2 = d0 * d0 + d1 * d1 + d2 * d2 + 1e-3;
        double inv = 1.0 / (r2 * sqrt(r2));
        a0 += d0 * inv; a1 += d1 * inv; a2 += d2 * inv;
    }
    v[3 * b] += a0 * dt; v[3 * b + 1] += a1 * dt; v[3 * b + 2] += a2 * dt;
}
extern "C" __global__ void nbody_pos(sucl_chunk c, double* p, sucl_extent pe, const double* v, sucl_extent ve, double dt) {
    sucl_size i[3]; if (!sucl_item(c, i)) return;
    sucl_size b = i[0];
    for (int a = 0; a < 3; a++) p[3 * b + a] += v[3 * b + a] * dt;
}
"#;

/// The kernels as one source, compiled without fused multiply-add (bit-identical to the host
/// programs' arithmetic).
pub fn source() -> CudaSource {
    CudaSource::with_options(SRC, &["--fmad=false"])
}

fn print<T: std::fmt::Debug>(comm: &sucl_runtime::Communicator, name: &str, v: &[T]) {
    if comm.rank() == 0 {
        let cells: Vec<String> = v.iter().map(|x| format!("{x:?}")).collect();
        println!("{name}: {}", cells.join(" "));
    }
}

pub fn run() -> Result<(), GraphError> {
    let comm = sucl_runtime::init()?;
    let dev = comm.cuda_device()?;
    let mut q = DistrQueue::on_device(&comm, &dev)?;
    if comm.rank() == 0 {
        let t = q.device_transport().map_or("none", |t| t.name());
        eprintln!("graph_gpu_programs: {} ranks, GPU {} ({}), transport {t}", comm.size(), dev.ordinal(), dev.name());
    }
    let src = source();
    chain(&mut q, &src)?;
    stencil_1d(&mut q, &src)?;
    all_and_host_tasks(&mut q, &src)?;
    stencil_2d(&mut q, &src)?;
    transpose(&mut q, &src)?;
    nbody(&mut q, &src)?;
    table3::<24, 10>(&mut q, &src, "")?;
    table3::<23, 11>(&mut q, &src, "-odd")?;
    q.sync()?;
    Ok(())
}

/// Length of the chain's buffers.
pub const CHAIN: usize = 37;

/// a = i + 1; b = 3a; d[i] = b[i] + a[N-1-i] (one_to_one, then a read of all).
fn chain(q: &mut DistrQueue<'_>, src: &CudaSource) -> Result<(), GraphError> {
    let (a, b, d) = (q.buffer::<f64, 1>([CHAIN])?, q.buffer::<f64, 1>([CHAIN])?, q.buffer::<f64, 1>([CHAIN])?);
    // SAFETY (every launch below): the kernels declare the chunk, then (pointer, extent) per
    // accessor in order with the accessors' element types, then the KernelArgs; they touch
    // only the cells their accessors name for the chunk.
    q.submit(|cgh| {
        cgh.discard_write(&a, one_to_one());
        unsafe { cgh.parallel_for_cuda([CHAIN], src, "chain_fill", &[]) }
    })?;
    q.submit(|cgh| {
        cgh.read(&a, one_to_one());
        cgh.discard_write(&b, one_to_one());
        unsafe { cgh.parallel_for_cuda([CHAIN], src, "chain_scale", &[KernelArg::F64(3.0)]) }
    })?;
    q.submit(|cgh| {
        cgh.read(&a, all());
        cgh.read(&b, one_to_one());
        cgh.discard_write(&d, one_to_one());
        unsafe { cgh.parallel_for_cuda([CHAIN], src, "chain_mix", &[]) }
    })?;
    print(q.comm(), "chain", &q.fence_all(&d)?);
    Ok(())
}

/// graph_programs.rs's stencil_1d.
fn stencil_1d(q: &mut DistrQueue<'_>, src: &CudaSource) -> Result<(), GraphError> {
    const N: usize = 32;
    let init: Vec<f64> = (0..N).map(|i| (i * i % 7) as f64).collect();
    let mut u = q.buffer_from::<f64, 1>([N], init)?;
    let mut v = q.buffer::<f64, 1>([N])?;
    for _ in 0..5 {
        q.submit(|cgh| {
            cgh.read(&u, neighborhood(&[1]));
            cgh.discard_write(&v, one_to_one());
            unsafe { cgh.parallel_for_cuda([N], src, "stencil1d", &[]) }
        })?;
        std::mem::swap(&mut u, &mut v);
    }
    print(q.comm(), "stencil", &q.fence_all(&u)?);
    Ok(())
}

/// graph_programs.rs's all_and_host_tasks: kernels on the GPU, host tasks on the host copy.
fn all_and_host_tasks(q: &mut DistrQueue<'_>, src: &CudaSource) -> Result<(), GraphError> {
    let a = q.buffer::<f64, 1>([16])?;
    let s = q.buffer::<f64, 1>([16])?;
    q.submit(|cgh| {
        cgh.discard_write(&a, one_to_one());
        unsafe { cgh.parallel_for_cuda([16], src, "fill_squares", &[]) }
    })?;
    q.submit(|cgh| {
        cgh.read(&a, all());
        cgh.discard_write(&s, one_to_one());
        unsafe { cgh.parallel_for_cuda([16], src, "all_sum", &[]) }
    })?;
    print(q.comm(), "all", &q.fence_all(&s)?);

    let m = q.buffer::<f64, 1>([10])?;
    q.submit(|cgh| {
        let w = cgh.discard_write(&m, all());
        cgh.master_task([1], move |_, k| {
            let mut m = k.write(&w);
            for (i, x) in m.slice_mut([0], 10).iter_mut().enumerate() {
                *x = 7.0 * i as f64 - 3.25;
            }
        })
    })?;
    q.submit(|cgh| {
        cgh.read_write(&m, one_to_one());
        unsafe { cgh.parallel_for_cuda([10], src, "scale_in_place", &[KernelArg::F64(1.5)]) }
    })?;
    q.submit(|cgh| {
        let m = cgh.read(&m, all());
        cgh.collective_task(move |_, k| {
            let comm = k.comm().expect("a collective host task has the communicator");
            let sum: f64 = k.read(&m).slice([0], 10).iter().sum();
            let (mut lo, mut hi) = ([sum], [sum]);
            comm.all_reduce_in_place(&mut lo, sucl_runtime::ReduceOp::Min).unwrap();
            comm.all_reduce_in_place(&mut hi, sucl_runtime::ReduceOp::Max).unwrap();
            assert_eq!(lo, hi, "ranks disagree on the collective task's input");
            if comm.rank() == 0 {
                println!("collective: {sum:?}");
            }
        })
    })?;
    print(q.comm(), "master", &q.fence_all(&m)?);
    Ok(())
}

/// graph_programs.rs's stencil_2d: a 2D split, so column halos are not contiguous (packed).
fn stencil_2d(q: &mut DistrQueue<'_>, src: &CudaSource) -> Result<(), GraphError> {
    const N: usize = 24;
    const M: usize = 17;
    let init: Vec<f32> = (0..N * M).map(|i| ((i * 37) % 11) as f32 * 0.25).collect();
    let mut u = q.buffer_from::<f32, 2>([N, M], init)?;
    let mut v = q.buffer::<f32, 2>([N, M])?;
    for _ in 0..4 {
        q.submit(|cgh| {
            cgh.read(&u, neighborhood(&[1, 1]));
            cgh.discard_write(&v, one_to_one());
            cgh.split(SplitHint::Split2D);
            unsafe { cgh.parallel_for_cuda([N, M], src, "stencil2d", &[]) }
        })?;
        std::mem::swap(&mut u, &mut v);
    }
    print(q.comm(), "stencil2d", &q.fence_all(&u)?);
    Ok(())
}

/// graph_programs.rs's transpose (2D splits on both sides).
fn transpose(q: &mut DistrQueue<'_>, src: &CudaSource) -> Result<(), GraphError> {
    let (rows, cols) = (6, 4);
    let x = q.buffer::<f64, 2>([rows, cols])?;
    let t = q.buffer::<f64, 2>([cols, rows])?;
    q.submit(|cgh| {
        cgh.discard_write(&x, one_to_one());
        cgh.split(SplitHint::Split2D);
        unsafe { cgh.parallel_for_cuda([rows, cols], src, "fill_index", &[]) }
    })?;
    q.submit(|cgh| {
        cgh.read(&x, transposed(0, 1));
        cgh.discard_write(&t, one_to_one());
        cgh.split(SplitHint::Split2D);
        unsafe { cgh.parallel_for_cuda([cols, rows], src, "transpose", &[]) }
    })?;
    print(q.comm(), "transpose", &q.fence_all(&t)?);
    Ok(())
}

/// graph_programs.rs's nbody.
fn nbody(q: &mut DistrQueue<'_>, src: &CudaSource) -> Result<(), GraphError> {
    const N: usize = 40;
    let pos0: Vec<f64> = (0..N * 3).map(|i| ((i * 7919) % 101) as f64 / 10.0).collect();
    let pos = q.buffer_from::<f64, 2>([N, 3], pos0)?;
    let vel = q.buffer_from::<f64, 2>([N, 3], vec![0.0; N * 3])?;
    for _ in 0..3 {
        nbody_step(q, src, pos, vel, N, 0.01)?;
    }
    print(q.comm(), "nbody", &q.fence_all(&pos)?);
    Ok(())
}

/// One direct N-body step over `n` bodies on the GPU (shared with the benchmark).
pub fn nbody_step(
    q: &mut DistrQueue<'_>,
    src: &CudaSource,
    pos: sucl_graph::Buffer<f64, 2>,
    vel: sucl_graph::Buffer<f64, 2>,
    n: usize,
    dt: f64,
) -> Result<(), GraphError> {
    q.submit(|cgh| {
        cgh.read(&pos, all());
        cgh.read_write(&vel, slice(1));
        unsafe { cgh.parallel_for_cuda([n], src, "nbody_vel", &[KernelArg::F64(dt)]) }
    })?;
    q.submit(|cgh| {
        cgh.read_write(&pos, slice(1));
        cgh.read(&vel, slice(1));
        unsafe { cgh.parallel_for_cuda([n], src, "nbody_pos", &[KernelArg::F64(dt)]) }
    })?;
    Ok(())
}

/// graph_programs.rs's Table 3 programs (all-gather, gather-scatter, gather-broadcast,
/// all-to-all; collectives when discovery is on) over `N` cells and an `M`×`M` matrix.
fn table3<const N: usize, const M: usize>(q: &mut DistrQueue<'_>, src: &CudaSource, suffix: &str) -> Result<(), GraphError> {
    // SAFETY (every launch below): the t3_* kernels and transpose declare the chunk, then
    // (double*, extent) per accessor in order, then the KernelArgs; each touches only the cells
    // its accessors name for its item (t3_allgather and t3_bcast read `all`/mirrored cells of
    // an `all` accessor; t3_prefix is a 1-item task reading and writing `all`).
    let fill = |q: &mut DistrQueue<'_>, a: &sucl_graph::Buffer<f64, 1>, k0: f64| {
        q.submit(|cgh| {
            cgh.discard_write(a, one_to_one());
            unsafe { cgh.parallel_for_cuda([N], src, "t3_fill", &[KernelArg::F64(k0)]) }
        })
    };
    // A 1-item kernel reading and writing all (a running sum), as the host's one_item.
    let prefix = |q: &mut DistrQueue<'_>, a: &sucl_graph::Buffer<f64, 1>| {
        q.submit(|cgh| {
            cgh.read_write(a, all());
            unsafe { cgh.parallel_for_cuda([1], src, "t3_prefix", &[]) }
        })
    };
    let (a, b) = (q.buffer::<f64, 1>([N])?, q.buffer::<f64, 1>([N])?);
    fill(q, &a, 1.0)?;
    q.submit(|cgh| {
        cgh.read(&a, all());
        cgh.discard_write(&b, one_to_one());
        unsafe { cgh.parallel_for_cuda([N], src, "t3_allgather", &[]) }
    })?;
    print(q.comm(), &format!("allgather{suffix}"), &q.fence_all(&b)?);
    let c = q.buffer::<f64, 1>([N])?;
    fill(q, &c, 2.0)?;
    prefix(q, &c)?;
    q.submit(|cgh| {
        cgh.read_write(&c, one_to_one());
        unsafe { cgh.parallel_for_cuda([N], src, "t3_scatter", &[]) }
    })?;
    print(q.comm(), &format!("gatherscatter{suffix}"), &q.fence_all(&c)?);
    let (d, e) = (q.buffer::<f64, 1>([N])?, q.buffer::<f64, 1>([N])?);
    fill(q, &d, 3.0)?;
    prefix(q, &d)?;
    q.submit(|cgh| {
        cgh.read(&d, all());
        cgh.discard_write(&e, one_to_one());
        unsafe { cgh.parallel_for_cuda([N], src, "t3_bcast", &[]) }
    })?;
    print(q.comm(), &format!("gatherbcast{suffix}"), &q.fence_all(&e)?);
    let (x, t) = (q.buffer::<f64, 2>([M, M])?, q.buffer::<f64, 2>([M, M])?);
    q.submit(|cgh| {
        cgh.discard_write(&x, one_to_one());
        unsafe { cgh.parallel_for_cuda([M, M], src, "t3_rows", &[]) }
    })?;
    q.submit(|cgh| {
        cgh.read(&x, transposed(0, 1));
        cgh.discard_write(&t, one_to_one());
        unsafe { cgh.parallel_for_cuda([M, M], src, "transpose", &[]) }
    })?;
    print(q.comm(), &format!("alltoall{suffix}"), &q.fence_all(&t)?);
    Ok(())
}
