//! GPU checks and benchmarks of stream-triggered queues, for `scripts/gpu-stream.sh` (2 ranks,
//! one GPU each, under `sucl run -n 2`):
//!
//! `st_gpu order|apart|busy|many|killed|bench nccl|staged`
//!
//! - order: a kernel writes the send buffer just before `start`, the peer's kernel after `wait`
//!   checks what arrived; 20 rounds without a host sync; the values prove the order.
//! - apart: each round a receive is started on its own, then the matching send in a second
//!   start, then one wait (`recv; start; send; start; wait`, the same on both ranks): a start
//!   must not hold later starts behind its completion; the peer's kernel after the wait checks
//!   what arrived; 20 rounds without a host sync.
//! - busy: after a long kernel, enqueue + start + wait return while the stream is still busy.
//! - many: 1000 start/wait pairs without a host sync complete (no deadlock behind full streams).
//! - killed: rank 1 exits while rank 0's stream waits for it; rank 0's stream is released and
//!   the error names rank 1 (run without the launcher, which would end rank 0 first).
//! - bench: the trigger round trip (empty start + wait, serialized on the stream; on staged, beside
//!   it the same signal driven with no queue, its floor) and a batch of
//!   26 send/recv pairs through the queue vs the same NCCL group called directly, and vs that
//!   group issued as the queue issues it (on a side stream forked and joined with two events);
//!   the queue's host time per batch split into its enqueues, its start and its wait.
//!
//! Prints `st-gpu: <check> <transport>: ok` on success; exits non-zero otherwise.

use clap::{Parser, ValueEnum};
use std::time::Instant;
use sucl_cuda::cudarc::driver::{LaunchConfig, PushKernelArg};
use sucl_runtime::cuda::{Kernel, Queue};
use sucl_stream::device::{DeviceBuf, Transport};
use sucl_stream::CommQueue;

const SRC: &str = r#"
extern "C" __global__ void fill(double* out, long long n, double v, long long spin) {
    long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = v + (double)i;
}
extern "C" __global__ void check(const double* in, long long n, double v, unsigned long long* bad) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        if (in[i] != v + (double)i) atomicAdd(bad, 1ULL);
}
"#;

struct Kernels {
    fill: Kernel,
    check: Kernel,
}

fn cfg(n: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: ((n as u32).div_ceil(256).clamp(1, 1024), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

fn fill(k: &Kernels, q: &Queue, b: &DeviceBuf<f64>, v: f64, spin: i64) {
    let mut g = b.lock();
    let n = g.len() as i64;
    let mut l = q.stream().launch_builder(k.fill.function());
    let s = g.cuda_slice_mut().expect("non-empty");
    l.arg(s).arg(&n).arg(&v).arg(&spin);
    // SAFETY: the arguments match the kernel's signature; the buffer holds n doubles.
    unsafe { l.launch(cfg(n as usize)) }.expect("launching fill");
}

fn check(k: &Kernels, q: &Queue, b: &DeviceBuf<f64>, v: f64, bad: &DeviceBuf<u64>) {
    let g = b.lock();
    let mut bg = bad.lock();
    let n = g.len() as i64;
    let mut l = q.stream().launch_builder(k.check.function());
    l.arg(g.cuda_slice().expect("non-empty")).arg(&n).arg(&v).arg(bg.cuda_slice_mut().expect("non-empty"));
    // SAFETY: as for fill; `bad` holds one counter.
    unsafe { l.launch(cfg(n as usize)) }.expect("launching check");
}

/// GPU checks and benchmarks of stream-triggered queues on 2 ranks with one GPU each: a check
/// prints `st-gpu: <check> <transport>: ok` and exits 0, or says what failed and exits 1.
#[derive(Parser)]
#[command(
    name = "st_gpu",
    after_help = "Example:\n  sucl run -n 2 -- target/release/examples/st_gpu order staged\n\n\
      `killed` is run without the launcher (it would end rank 0 when rank 1 exits); see scripts/gpu-stream.sh."
)]
struct Args {
    /// What to run.
    #[arg(value_enum, default_value = "order")]
    check: Check,
    /// How the queue moves data.
    #[arg(value_enum, default_value = "auto")]
    transport: Via,
}

#[derive(Clone, Copy, ValueEnum)]
enum Check {
    /// A kernel writes the send buffer right before `start`, the peer's kernel after `wait`
    /// checks what arrived (20 rounds, no host sync).
    Order,
    /// `recv; start; send; start; wait` on both ranks (20 rounds, no host sync): each start
    /// releases its batch on its own; the kernel after the wait checks what arrived.
    Apart,
    /// After a long kernel, enqueue + start + wait return while the stream is still busy.
    Busy,
    /// 1000 start/wait pairs without a host sync complete.
    Many,
    /// Rank 1 exits while rank 0's stream waits for it: rank 0's stream is released and the
    /// error names rank 1.
    Killed,
    /// The trigger round trip, and 26 send/recv pairs through the queue vs NCCL called directly.
    Bench,
}

#[derive(Clone, Copy, ValueEnum)]
enum Via {
    /// NCCL where every rank has it, else staged.
    Auto,
    /// NCCL groups on a side stream of the queue, issued at the wait.
    Nccl,
    /// Stream memory operations and the progress thread over the host backend.
    Staged,
}

fn main() {
    let args = Args::parse();
    let what = args.check.to_possible_value().expect("no variant is skipped").get_name().to_string();
    let transport = match args.transport {
        Via::Auto => Transport::Auto,
        Via::Nccl => Transport::Nccl,
        Via::Staged => Transport::Staged,
    };
    if let Err(e) = run(&what, transport) {
        eprintln!("st-gpu: {what} {transport:?}: FAILED: {e}");
        std::process::exit(1);
    }
}

fn run(what: &str, transport: Transport) -> sucl_runtime::Result<()> {
    let comm = sucl_runtime::init()?;
    let (rank, size) = (comm.rank(), comm.size());
    if size != 2 {
        return Err(sucl_runtime::Error::Config(format!("st_gpu runs on 2 ranks (sucl run -n 2), not {size}")));
    }
    let peer = 1 - rank;
    let dev = comm.cuda_device()?;
    let q = dev.queue()?;
    let k = Kernels { fill: Kernel::compile(&dev, SRC, "fill")?, check: Kernel::compile(&dev, SRC, "check")? };
    let mut cq = CommQueue::on_stream(comm, &q, transport)?;
    let t = format!("{:?}", cq.transport().expect("device queue")).to_lowercase();
    let bad = DeviceBuf::new(q.upload(&[0u64])?);
    match what {
        "order" | "apart" => {
            let apart = what == "apart";
            let n = 1 << 16;
            let out = DeviceBuf::new(q.alloc::<f64>(n)?);
            let got = DeviceBuf::new(q.alloc::<f64>(n)?);
            for round in 0..20 {
                // A slow kernel writes the send buffer right before the start: the data sent
                // must be this round's, and the checking kernel after the wait must see it.
                fill(&k, &q, &out, (rank * 1_000_000 + round * 1000) as f64, 2_000_000);
                if apart {
                    // Both ranks receive first, in a start of its own: the receive completes
                    // only once the peer's send, in its second start, ran.
                    cq.enqueue_recv(&got, peer, round as u32)?;
                    cq.start()?;
                    cq.enqueue_send(&out, peer, round as u32)?;
                } else {
                    cq.enqueue_send(&out, peer, round as u32)?;
                    cq.enqueue_recv(&got, peer, round as u32)?;
                }
                cq.start()?;
                cq.wait()?;
                check(&k, &q, &got, (peer * 1_000_000 + round * 1000) as f64, &bad);
            }
            cq.synchronize()?;
            let wrong = bad.lock().to_vec()?[0];
            if wrong != 0 {
                return Err(sucl_runtime::Error::Mismatch { rank, what: format!("{wrong} values arrived out of order") });
            }
            let how = if apart { "recv; start; send; start; wait" } else { "kernel → start and wait → kernel" };
            println!("st-gpu: {what} {t}: ok (rank {rank}, 20 rounds of {n} doubles, {how})");
        }
        "busy" => {
            let out = DeviceBuf::new(q.alloc::<f64>(1024)?);
            let got = DeviceBuf::new(q.alloc::<f64>(1024)?);
            // One exchange first, so that the transport's one-time setup (NCCL's connection to
            // the peer) is not what the host waits for below.
            cq.enqueue_send(&out, peer, 0)?;
            cq.enqueue_recv(&got, peer, 0)?;
            cq.start()?;
            cq.wait()?;
            cq.synchronize()?;
            // About a second of spinning on the stream before the communication.
            fill(&k, &q, &out, rank as f64, 2_000_000_000);
            cq.enqueue_send(&out, peer, 1)?;
            cq.enqueue_recv(&got, peer, 1)?;
            cq.start()?;
            cq.wait()?;
            check(&k, &q, &got, peer as f64, &bad);
            let idle = cq.stream_idle().expect("device queue");
            if idle {
                return Err(sucl_runtime::Error::Mismatch { rank, what: "the stream was already idle when start/wait returned".into() });
            }
            cq.synchronize()?;
            let wrong = bad.lock().to_vec()?[0];
            if wrong != 0 {
                return Err(sucl_runtime::Error::Mismatch { rank, what: format!("{wrong} wrong values") });
            }
            println!("st-gpu: busy {t}: ok (rank {rank}: enqueue/start/wait returned with the stream still busy)");
        }
        "many" => {
            let out = DeviceBuf::new(q.alloc::<f64>(8)?);
            let got = DeviceBuf::new(q.alloc::<f64>(8)?);
            for i in 0..1000 {
                fill(&k, &q, &out, (rank * 10_000 + i) as f64, 0);
                cq.enqueue_send(&out, peer, 2)?;
                cq.enqueue_recv(&got, peer, 2)?;
                cq.start()?;
                cq.wait()?;
                check(&k, &q, &got, (peer * 10_000 + i) as f64, &bad);
            }
            cq.synchronize()?;
            let wrong = bad.lock().to_vec()?[0];
            if wrong != 0 {
                return Err(sucl_runtime::Error::Mismatch { rank, what: format!("{wrong} wrong values over 1000 rounds") });
            }
            println!("st-gpu: many {t}: ok (rank {rank}: 1000 start/wait pairs without a host sync)");
        }
        "killed" => {
            let got = DeviceBuf::new(q.alloc::<f64>(1024)?);
            if rank == 1 {
                std::thread::sleep(std::time::Duration::from_millis(500));
                std::process::exit(7);
            }
            let r = cq.enqueue_recv(&got, 1, 3)?;
            // The loss may surface at start/wait already (NCCL connects to the peer there), or
            // later through the request and synchronize: either way it must name rank 1.
            let posted = cq.start().and_then(|_| cq.wait());
            if posted.is_ok() {
                check(&k, &q, &got, 0.0, &bad);
            }
            let p = posted.err().map(|e| e.to_string()).unwrap_or_default();
            let e = r.wait().err().map(|e| e.to_string()).unwrap_or_default();
            let s = cq.synchronize().err().map(|e| e.to_string()).unwrap_or_default();
            println!("st-gpu: killed {t}: start/wait error: {p}");
            println!("st-gpu: killed {t}: request error: {e}");
            println!("st-gpu: killed {t}: synchronize error: {s}");
            if !(p.contains("rank 1") || e.contains("rank 1") || s.contains("rank 1")) {
                return Err(sucl_runtime::Error::Mismatch { rank, what: "the lost rank 1 was not named".into() });
            }
            // The stream was released: everything after the wait ran.
            q.synchronize()?;
            println!("st-gpu: killed {t}: ok (rank 0: stream released, error names rank 1)");
            std::process::exit(0);
        }
        "bench" => return bench(cq, &q, rank, peer, &t),
        other => return Err(sucl_runtime::Error::invalid(rank, "check", format!("unknown: {other}"))),
    }
    cq.synchronize()?;
    cq.close()?;
    Ok(())
}

/// One timed round of `batches` batches: (wall µs per batch after a host synchronize, host µs
/// per batch spent in the issuing calls).
fn timed(
    batches: usize,
    mut issue: impl FnMut() -> sucl_runtime::Result<()>,
    sync: impl FnOnce() -> sucl_runtime::Result<()>,
) -> sucl_runtime::Result<(f64, f64)> {
    let t0 = Instant::now();
    let mut issuing = std::time::Duration::ZERO;
    for _ in 0..batches {
        let t = Instant::now();
        issue()?;
        issuing += t.elapsed();
    }
    sync()?;
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / batches as f64;
    Ok((per(t0.elapsed()), per(issuing)))
}

/// The floor under the staged trigger round trip: the same pinned counters
/// (`sucl_cuda::StreamSignal`) driven with no queue around them — the stream stores trigger `i`
/// and waits for completion `i`, a host thread that spins on the trigger completes it at once.
/// Returns (µs per round trip, µs of the host's two calls per round trip).
fn signal_floor(q: &Queue, iters: usize) -> sucl_runtime::Result<(f64, f64)> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use sucl_cuda::StreamSignal;
    let signal = StreamSignal::leak(q.device())?;
    let stop = AtomicBool::new(false);
    let bound = std::time::Duration::from_secs(10);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Answers every trigger at once; bounded by `stop` (set on every path below).
            while !stop.load(Ordering::Acquire) {
                let t = signal.triggered();
                if t > signal.done() {
                    signal.complete(t);
                }
                std::hint::spin_loop();
            }
        });
        let mut epoch = 0u64;
        let mut round = |n: usize| -> sucl_runtime::Result<(f64, f64)> {
            let stream = q.stream();
            timed(
                n,
                || {
                    epoch += 1;
                    signal.trigger_on(stream, epoch)?;
                    signal.wait_on(stream, epoch, bound)
                },
                || q.synchronize(),
            )
        };
        let result = round(50).and_then(|_| round(iters));
        stop.store(true, Ordering::Release);
        result
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn bench(mut cq: CommQueue, q: &Queue, rank: usize, peer: usize, t: &str) -> sucl_runtime::Result<()> {
    let iters = 1000;
    // Trigger round trip: empty batches, each start → progress thread → completion → stream.
    for _ in 0..50 {
        cq.start()?;
        cq.wait()?;
    }
    cq.synchronize()?;
    // The host time of the calls themselves, beside: where it is near the round trip, the
    // program's thread (start's and wait's driver calls) bounds it, not the stream and the
    // progress thread.
    let (rt, rt_issue) = timed(
        iters,
        || {
            cq.start()?;
            cq.wait()
        },
        || Ok(()),
    )?;
    let rt = {
        let t1 = Instant::now();
        cq.synchronize()?;
        rt + t1.elapsed().as_secs_f64() * 1e6 / iters as f64
    };
    println!(
        "st-gpu: bench {t}: trigger round trip (empty start+wait, serialized on the stream): {rt:.2} us, of which the host's start+wait calls {rt_issue:.2} us (rank {rank})"
    );
    if t == "staged" {
        let (floor, floor_issue) = signal_floor(q, iters)?;
        println!(
            "st-gpu: bench {t}: the signal alone (stream write + wait value, a host thread answering at once, no queue): {floor:.2} us, of which the host's two calls {floor_issue:.2} us (rank {rank})"
        );
    }
    // 26 send/recv pairs with Faces-like sizes (6 faces, 12 edges, 8 corners of 14x13x12 elements, n = 12).
    let sizes: Vec<usize> = (0..26)
        .map(|i| {
            if i < 6 {
                12 * 12 * 14 * 13
            } else if i < 18 {
                12 * 14
            } else {
                1
            }
        })
        .collect();
    let sends: Vec<DeviceBuf<f64>> = sizes.iter().map(|&n| q.alloc::<f64>(n).map(DeviceBuf::new)).collect::<Result<_, _>>()?;
    let recvs: Vec<DeviceBuf<f64>> = sizes.iter().map(|&n| q.alloc::<f64>(n).map(DeviceBuf::new)).collect::<Result<_, _>>()?;
    // The direct group: the same buffers' addresses, taken once.
    let ptr = |b: &DeviceBuf<f64>, write: bool| -> u64 {
        use sucl_cuda::{DeviceMemory, DeviceMemoryMut};
        let mut g = b.lock();
        if write {
            DeviceMemoryMut::write_ptr(&mut *g, q.stream()).0
        } else {
            DeviceMemory::read_ptr(&*g, q.stream()).0
        }
    };
    let s_list: Vec<(u64, usize, usize)> = sends.iter().map(|b| (ptr(b, false), b.len() * 8, peer)).collect();
    let r_list: Vec<(u64, usize, usize)> = recvs.iter().map(|b| (ptr(b, true), b.len() * 8, peer)).collect();
    let (rounds, warm, batches) = (5, 20, 200);
    let (mut st, mut st_issue, mut direct, mut direct_issue) = (vec![], vec![], vec![], vec![]);
    // Where the queue's host time goes (per batch): the 52 enqueues, the start, the wait
    // (which issues the group on the side stream between the fork and join events).
    let (mut st_enq, mut st_start, mut st_wait) = (vec![], vec![], vec![]);
    // The direct group issued as the queue issues it: on a side stream after a fork event
    // recorded on the queue's stream, joined back with a second event.
    let (mut forked, mut forked_issue) = (vec![], vec![]);
    let nccl = cq.transport() == Some(Transport::Nccl);
    let side = q.device().queue()?;
    let ctx = q.device().context();
    let ev_err = |e| sucl_cuda::cuda_err(rank, "an event of the forked direct group", e);
    let (fork, join) = (ctx.new_event(None).map_err(ev_err)?, ctx.new_event(None).map_err(ev_err)?);
    let us = |d: std::time::Duration, n: usize| d.as_secs_f64() * 1e6 / n as f64;
    // Rounds alternate the queue and the direct groups on the same communicator, stream and
    // buffers, so drift of the machine hits both alike.
    for round in 0..=rounds {
        let n = if round == 0 { warm } else { batches };
        let (mut enq, mut start, mut wait) = (std::time::Duration::ZERO, std::time::Duration::ZERO, std::time::Duration::ZERO);
        let (w, i) = timed(
            n,
            || {
                let t = Instant::now();
                for (i, (s, r)) in sends.iter().zip(&recvs).enumerate() {
                    cq.enqueue_send(s, peer, i as u32)?;
                    cq.enqueue_recv(r, peer, i as u32)?;
                }
                let t1 = Instant::now();
                cq.start()?;
                let t2 = Instant::now();
                cq.wait()?;
                let t3 = Instant::now();
                (enq, start, wait) = (enq + (t1 - t), start + (t2 - t1), wait + (t3 - t2));
                Ok(())
            },
            || Ok(()),
        )?;
        let (w, i) = {
            let t1 = Instant::now();
            cq.synchronize()?;
            (w + t1.elapsed().as_secs_f64() * 1e6 / n as f64, i)
        };
        if round > 0 {
            st.push(w);
            st_issue.push(i);
            st_enq.push(us(enq, n));
            st_start.push(us(start, n));
            st_wait.push(us(wait, n));
        }
        if nccl {
            let comm = cq.nccl_communicator().expect("nccl queue");
            let (w, i) = timed(
                n,
                // SAFETY: the buffers live (held by `sends`/`recvs`) until the stream is
                // synchronized right after.
                || unsafe { comm.nccl_group_p2p(&s_list, &r_list, q) },
                || comm.synchronize(q),
            )?;
            if round > 0 {
                direct.push(w);
                direct_issue.push(i);
            }
            let (w, i) = timed(
                n,
                || {
                    fork.record(q.stream()).map_err(ev_err)?;
                    side.stream().wait(&fork).map_err(ev_err)?;
                    // SAFETY: as above; the side stream is joined back into the queue's stream,
                    // which is synchronized right after.
                    unsafe { comm.nccl_group_p2p(&s_list, &r_list, &side)? };
                    join.record(side.stream()).map_err(ev_err)?;
                    q.stream().wait(&join).map_err(ev_err)
                },
                || comm.synchronize(q),
            )?;
            if round > 0 {
                forked.push(w);
                forked_issue.push(i);
            }
        }
    }
    let (st_m, st_i) = (median(&mut st), median(&mut st_issue));
    println!(
        "st-gpu: bench {t}: 26 send/recv pairs through the queue: {st_m:.2} us per batch, host issue {st_i:.2} us (median of {rounds} rounds of {batches}; rank {rank})"
    );
    let mut json = format!(
        "{{\"bench\":\"st_batch\",\"transport\":\"{t}\",\"rank\":{rank},\"trigger_rtt_us\":{rt:.3},\"trigger_issue_us\":{rt_issue:.3},\"queue_us\":{st_m:.3},\"queue_issue_us\":{st_i:.3}"
    );
    if nccl {
        let (d_m, d_i) = (median(&mut direct), median(&mut direct_issue));
        println!(
            "st-gpu: bench {t}: the same NCCL group called directly (same communicator: the queue's NCCL point-to-point one; called on the queue's stream, where the queue issues on its side stream and joins it; same buffers; rounds alternated): {d_m:.2} us per batch, host issue {d_i:.2} us; queue - direct = {:.2} us per batch, host issue {:.2} us (rank {rank})",
            st_m - d_m,
            st_i - d_i
        );
        json += &format!(",\"direct_us\":{d_m:.3},\"direct_issue_us\":{d_i:.3}");
        let (f_m, f_i) = (median(&mut forked), median(&mut forked_issue));
        let (e, s0, w0) = (median(&mut st_enq), median(&mut st_start), median(&mut st_wait));
        println!(
            "st-gpu: bench {t}: the same group on a side stream forked and joined with two events, as the queue issues it: {f_m:.2} us per batch, host issue {f_i:.2} us; queue host time per batch: enqueues {e:.2} us, start {s0:.2} us, wait (issues the group) {w0:.2} us (rank {rank})"
        );
        json += &format!(
            ",\"forked_us\":{f_m:.3},\"forked_issue_us\":{f_i:.3},\"queue_enqueue_us\":{e:.3},\"queue_start_us\":{s0:.3},\"queue_wait_us\":{w0:.3}"
        );
    }
    println!("{json}}}");
    cq.close()?;
    Ok(())
}
