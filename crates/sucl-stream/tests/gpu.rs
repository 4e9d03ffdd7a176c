//! GPU tests of stream ordering through the trigger/progress mechanism, on real processes:
//! ordinary device collectives on the staged path (which return once enqueued, like NCCL's)
//! are ordered with the kernels around them on the stream, and a lost peer releases the stream
//! with an error naming it.
//!
//! Without a GPU (CI) they skip, and `gpu_tests_skipped_no_gpu` says so; with
//! `SUCL_REQUIRE_GPU=1` (scripts/gpu-check.sh, GPU_TESTS) every skip is a failure.

#![cfg(feature = "cuda")]

mod common;

use std::time::{Duration, Instant};
use sucl_cuda::cudarc::driver::sys as cu;
use sucl_cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use sucl_runtime::cuda::{Buffer, Kernel, Queue};
use sucl_runtime::{Communicator, ReduceOp};

const LIMIT: Duration = Duration::from_secs(180);

use common::{gpu_required, gpus_or_skip as gpu_or_skip};

#[test]
fn gpu_tests_skipped_no_gpu() {
    let r = sucl_cuda::probe();
    assert!(r.is_err(), "{r:?} GPUs are present, so the GPU tests ran: this test passes only where they were skipped");
    assert!(!gpu_required(), "SUCL_REQUIRE_GPU=1 but no GPU here, so the GPU tests were skipped: {r:?}");
}

fn run(name: &str, env: &[(&str, &str)], body: fn(usize)) {
    match common::child_rank() {
        Some(rank) => body(rank),
        None => {
            // Two ranks: one GPU each where there are two, else both on GPU 0 (the communicator
            // then leaves NCCL out, which refuses two ranks on one GPU, and stages).
            let Some(_gpus) = gpu_or_skip() else { return };
            common::all_passed(&common::launch(name, 2, env, LIMIT))
        }
    }
}

const SRC: &str = r#"
extern "C" __global__ void fill(double* out, long long n, double v, long long spin) {
    long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = v + (double)(i % 1000);
}
// Counts the elements of `in` that are not `v + scale * (j % 1000)`, where j is the index
// within its segment of `seg` elements and v is v0 in the first segment, v1 after it.
extern "C" __global__ void check(const double* in, long long n, long long seg, double v0, double v1, double scale,
                                 unsigned long long* bad) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        double v = (i / seg == 0) ? v0 : v1;
        if (in[i] != v + scale * (double)((i % seg) % 1000)) atomicAdd(bad, 1ULL);
    }
}
"#;

fn cfg(n: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: ((n as u32).div_ceil(256).clamp(1, 1024), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

struct Gpu {
    comm: Communicator,
    q: Queue,
    fill: Kernel,
    check: Kernel,
}

/// The world with its device side set up and every call on device buffers pinned to the staged path.
fn gpu() -> Gpu {
    let comm = sucl_runtime::init().expect("init");
    let dev = comm.cuda_device().expect("device");
    comm.attach_device(&dev).expect("attach");
    comm.pin_backend(Some("staged")).expect("pin staged");
    let q = dev.queue().expect("queue");
    let fill = Kernel::compile(&dev, SRC, "fill").expect("fill");
    let check = Kernel::compile(&dev, SRC, "check").expect("check");
    Gpu { comm, q, fill, check }
}

impl Gpu {
    /// Enqueues `out[i] = v + i % 1000` after `spin` clock cycles.
    fn fill(&self, out: &mut Buffer<f64>, v: f64, spin: i64) {
        let n = out.len() as i64;
        let mut l = self.q.stream().launch_builder(self.fill.function());
        l.arg(out.cuda_slice_mut().expect("non-empty")).arg(&n).arg(&v).arg(&spin);
        // SAFETY: the arguments match `fill`; the buffer holds n doubles.
        unsafe { l.launch(cfg(n as usize)) }.expect("launching fill");
    }

    /// Enqueues a count, into `bad`, of the elements of `got` off the pattern (see `check`).
    fn check(&self, got: &Buffer<f64>, seg: usize, v: [f64; 2], scale: f64, bad: &mut Buffer<u64>) {
        let (n, seg) = (got.len() as i64, seg as i64);
        let mut l = self.q.stream().launch_builder(self.check.function());
        l.arg(got.cuda_slice().expect("non-empty"))
            .arg(&n)
            .arg(&seg)
            .arg(&v[0])
            .arg(&v[1])
            .arg(&scale)
            .arg(bad.cuda_slice_mut().expect("counter"));
        // SAFETY: the arguments match `check`; `bad` holds one counter.
        unsafe { l.launch(cfg(n as usize)) }.expect("launching check");
    }

    fn stream_idle(&self) -> bool {
        // SAFETY: querying a live stream.
        unsafe { cu::cuStreamQuery(self.q.stream().cu_stream()) == cu::CUresult::CUDA_SUCCESS }
    }

    /// Waits (bounded) until the stream ran everything, with plain stream queries: a stream
    /// left waiting on a counter fails this, and no abort flag cuts the wait short.
    fn stream_released(&self, within: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if self.stream_idle() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }
}

#[test]
fn staged_collectives_are_ordered_with_kernels_on_the_stream() {
    run("staged_collectives_are_ordered_with_kernels_on_the_stream", &[], |rank| {
        let g = gpu();
        assert_eq!(g.comm.device_backend_for(sucl_runtime::CollOp::AllReduce, 8), "staged");
        let mut bad = g.q.upload(&[0u64]).unwrap();
        let value = |r: usize, round: usize| (r * 100_000 + round * 10) as f64;
        // 1000 doubles, and 2^20 + 3: several 4 MiB stages, the last one short.
        for n in [1000usize, (1 << 20) + 3] {
            let mut inp = g.q.alloc::<f64>(n).unwrap();
            let mut sum = g.q.alloc::<f64>(n).unwrap();
            let mut gathered = g.q.alloc::<f64>(2 * n).unwrap();
            for round in 0..10 {
                // A slow kernel writes the input right before each call and a kernel right
                // after it checks the result, with no host sync anywhere: the values prove
                // that each call ran after the kernel before it and before the one after it.
                g.fill(&mut inp, value(rank, round), 1_000_000);
                g.comm.all_reduce(&inp, &mut sum, ReduceOp::Sum).expect("all_reduce");
                g.check(&sum, n, [value(0, round) + value(1, round); 2], 2.0, &mut bad);
                g.comm.all_gather(&inp, &mut gathered).expect("all_gather");
                // Overwrites the input right after: must not reach what was gathered.
                g.fill(&mut inp, -1.0, 0);
                g.check(&gathered, n, [value(0, round), value(1, round)], 1.0, &mut bad);
            }
        }
        g.comm.synchronize(&g.q).expect("synchronize");
        let wrong = bad.to_vec().unwrap()[0];
        assert_eq!(wrong, 0, "rank {rank}: {wrong} values show a staged collective out of order with its kernels");
        println!("rank {rank}: ok");
    });
}

#[test]
fn a_staged_collective_returns_once_enqueued() {
    run("a_staged_collective_returns_once_enqueued", &[], |rank| {
        let g = gpu();
        let mut inp = g.q.alloc::<f64>(4096).unwrap();
        let mut out = g.q.alloc::<f64>(4096).unwrap();
        // One call first, so the one-time setup (the progress thread's communicator) is done.
        g.comm.all_reduce(&inp, &mut out, ReduceOp::Sum).expect("warm-up");
        g.comm.synchronize(&g.q).expect("synchronize");
        // About a second of spinning on the stream, then the call: the host gets it back with
        // the stream still busy (it would be idle had the call waited for its data).
        g.fill(&mut inp, rank as f64, 2_000_000_000);
        g.comm.all_reduce(&inp, &mut out, ReduceOp::Sum).expect("all_reduce");
        let idle = g.stream_idle();
        assert!(!idle, "rank {rank}: the stream was idle when the staged all_reduce returned: the call waited for it");
        let mut bad = g.q.upload(&[0u64]).unwrap();
        g.check(&out, 4096, [1.0; 2], 2.0, &mut bad);
        g.comm.synchronize(&g.q).expect("synchronize");
        assert_eq!(bad.to_vec().unwrap()[0], 0, "rank {rank}: wrong result");
        println!("rank {rank}: ok");
    });
}

#[test]
fn a_lost_peer_releases_the_stream_with_an_error_naming_it() {
    run("a_lost_peer_releases_the_stream_with_an_error_naming_it", &[("SUCL_TIMEOUT", "10")], |rank| {
        let g = gpu();
        let inp = g.q.alloc::<f64>(1 << 16).unwrap();
        let mut out = g.q.alloc::<f64>(1 << 16).unwrap();
        g.comm.all_reduce(&inp, &mut out, ReduceOp::Sum).expect("warm-up");
        g.comm.synchronize(&g.q).expect("synchronize");
        if rank == 1 {
            // Gone while rank 0's stream will wait for it.
            std::process::exit(0);
        }
        std::thread::sleep(Duration::from_millis(300));
        // Enqueued (or refused at once if the loss is already known): either way, no hang.
        let call = g.comm.all_reduce(&inp, &mut out, ReduceOp::Sum);
        let released = g.stream_released(Duration::from_secs(60));
        assert!(released, "rank 0: the stream still waits 60 s after its peer was lost");
        let sync = g.comm.synchronize(&g.q);
        let e = call.err().or(sync.err()).expect("rank 0: the lost peer was reported by neither the call nor synchronize");
        let text = e.to_string();
        assert!(text.contains("rank 1"), "rank 0: the error does not name the lost rank 1: {text}");
        println!("rank 0: ok ({text})");
    });
}
