//! Device-buffer variants of `check` and `bench` (feature `cuda`): the correctness matrix on
//! CUDA buffers over every device backend, and sweeps of nccl, staged, auto and a raw NCCL
//! baseline that calls NCCL directly through cudarc, bypassing sucl.

use crate::bench::{sizes, BenchArgs, BenchOp, Row};
use crate::pattern::{buffer_lens, count_wrong, count_wrong_vs, fill_input, Case};
use std::time::Instant;
use sucl::cuda::{Buffer, Device, DeviceElement, Queue};
use sucl::{CollOp, Communicator, DType, ReduceOp, Result};
use sucl_core::Error;
use sucl_cuda::{DeviceMemory, DeviceMemoryMut, RawNccl};

fn dev_err(comm: &Communicator, e: impl std::fmt::Debug) -> Error {
    Error::BackendUnavailable { rank: comm.rank(), backend: "cuda".into(), why: format!("{e:?}") }
}

/// Time one device measurement may take (after warm-up), and the fewest iterations it runs.
const MEASURE_SECONDS: f64 = 0.3;
const MIN_ITERS: usize = 5;
/// Up to this size, `--compare` runs SMALL_ROUNDS_FACTOR times the rounds asked for.
const SMALL_BYTES: u64 = 1 << 20;
const SMALL_ROUNDS_FACTOR: usize = 3;
/// Most calls one CUDA graph of `bench --graph` captures.
const GRAPH_BATCH: usize = 20;

/// How `bench --graph` splits `iters` calls: (calls captured per graph, replays), covering at
/// least `iters` calls.
pub fn graph_batches(iters: usize) -> (usize, usize) {
    let per_graph = iters.clamp(1, GRAPH_BATCH);
    (per_graph, iters.max(1).div_ceil(per_graph))
}

/// One collective on device buffers through the very calls host buffers use.
fn run_dev<T: DeviceElement>(
    comm: &Communicator,
    q: &Queue,
    op: CollOp,
    s: &Buffer<T>,
    r: &mut Buffer<T>,
    redop: ReduceOp,
    root: usize,
) -> Result<()> {
    match op {
        CollOp::Barrier => comm.barrier_on(q),
        CollOp::Broadcast => comm.broadcast(r, root),
        CollOp::AllReduce => comm.all_reduce(s, r, redop),
        CollOp::Reduce => comm.reduce(s, r, redop, root),
        CollOp::Gather => comm.gather(s, r, root),
        CollOp::AllGather => comm.all_gather(s, r),
        CollOp::Scatter => comm.scatter(s, r, root),
        CollOp::AllToAll => comm.all_to_all(s, r),
        CollOp::ReduceScatter => comm.reduce_scatter(s, r, redop),
    }
}

fn check_case<T: DeviceElement>(comm: &Communicator, q: &Queue, case: &Case) -> Result<usize> {
    let (sl, rl) = buffer_lens(case.op, case.count, case.n, case.rank, case.root);
    let mut send = vec![T::from_i64(0); sl];
    let mut recv = vec![T::from_i64(-77); rl];
    fill_input(case.op, &mut send, &mut recv, case.rank, case.n, case.root, case.seed, case.redop);
    // The inputs are the host test pattern (exact and distinct in every dtype), uploaded.
    let ds = q.upload(&send)?;
    let mut dr = q.upload(&recv)?;
    run_dev(comm, q, case.op, &ds, &mut dr, case.redop, case.root)?;
    comm.synchronize(q)?;
    let back: Vec<T> = dr.to_vec()?;
    let got = &back[..];
    let wrong = count_wrong(case, got);
    if wrong > 0 {
        // Show the first differing elements, to tell rounding from unwritten or misplaced data.
        let mut want = vec![T::from_i64(-77); rl];
        crate::pattern::expected(case, &mut want);
        let diffs: Vec<String> = got
            .iter()
            .zip(&want)
            .enumerate()
            .filter(|(_, (g, w))| bytemuck::bytes_of(*g) != bytemuck::bytes_of(*w))
            .take(4)
            .map(|(i, (g, w))| format!("[{i}] got {g:?} want {w:?}"))
            .collect();
        eprintln!("  rank {}: {}", case.rank, diffs.join(", "));
    }
    Ok(wrong)
}

/// The calls the matrix does not cover, on device buffers: point-to-point (sendrecv ring,
/// send/recv pairs, a message shorter than the receive buffer when staged), in-place forms, a
/// collective on a sub-communicator, and calls that must be refused before anything moves
/// (host and device memory mixed, a buffer too short). Each entry: (what, passed).
fn api_checks(comm: &Communicator, q: &Queue) -> Result<Vec<(String, bool)>> {
    let (n, r) = (comm.size(), comm.rank());
    let staged = comm.device_backend_for(CollOp::AllReduce, 1 << 20) == "staged";
    let mut out = vec![];
    let val = |rank: usize, i: usize| (rank * 1000 + i % 997) as f32;
    let pattern = |rank: usize, len: usize| (0..len).map(|i| val(rank, i)).collect::<Vec<f32>>();
    // A ring: everyone sends to the right and receives from the left at once.
    let len = 70_001;
    let (right, left) = ((r + 1) % n, (r + n - 1) % n);
    let s = q.upload(&pattern(r, len))?;
    let mut d = q.alloc::<f32>(len)?;
    let st = comm.sendrecv(&s, right, &mut d, left, 7)?;
    comm.synchronize(q)?;
    out.push(("sendrecv ring".into(), st.count == len && d.to_vec()? == pattern(left, len)));
    // Pairs: even ranks send, odd ranks receive (a staged receive may be longer than the message).
    if n >= 2 && (r % 2 == 1 || r + 1 < n) {
        let msg = 4099;
        if r % 2 == 0 {
            comm.send(&q.upload(&pattern(r, msg))?, r + 1, 3)?;
            comm.synchronize(q)?;
            out.push(("send".into(), true));
        } else {
            let cap = if staged { msg + 5 } else { msg };
            let mut d = q.alloc::<f32>(cap)?;
            let st = comm.recv(&mut d, r - 1, 3)?;
            comm.synchronize(q)?;
            let got = d.to_vec()?;
            out.push((format!("recv (count {})", st.count), st.count == msg && got[..msg] == pattern(r - 1, msg)[..]));
        }
    }
    // In place.
    let len = 3 * n + 2;
    let mut b = q.upload(&pattern(r, len))?;
    comm.all_reduce_in_place(&mut b, ReduceOp::Max)?;
    comm.synchronize(q)?;
    out.push(("all_reduce_in_place max".into(), b.to_vec()? == pattern(n - 1, len)));
    let mut host = vec![0f32; n * 5];
    host[r * 5..r * 5 + 5].copy_from_slice(&pattern(r, 5));
    let mut b = q.upload(&host)?;
    comm.all_gather_in_place(&mut b)?;
    comm.synchronize(q)?;
    let want: Vec<f32> = (0..n).flat_map(|j| pattern(j, 5)).collect();
    out.push(("all_gather_in_place".into(), b.to_vec()? == want));
    let mut b = q.upload(&[1f32 + r as f32; 9])?;
    comm.reduce_in_place(&mut b, ReduceOp::Sum, n - 1)?;
    comm.synchronize(q)?;
    let got = b.to_vec()?;
    let want = if r == n - 1 { (n * (n + 1) / 2) as f32 } else { 1f32 + r as f32 };
    out.push(("reduce_in_place".into(), got.iter().all(|&v| v == want)));
    // Buckets: a collective on a range of a larger buffer leaves the rest alone.
    let len = 4099;
    let mut b = q.upload(&pattern(r, len))?;
    comm.all_reduce_in_place(&mut b.slice_mut(1000..3000)?, ReduceOp::Max)?;
    let src = q.upload(&pattern(r, len))?;
    let mut dst = q.alloc::<f32>(len)?;
    comm.all_gather(&src.slice(..len / n)?, &mut dst.slice_mut(..len / n * n)?)?;
    comm.synchronize(q)?;
    let (got, mine) = (b.to_vec()?, pattern(r, len));
    let top = pattern(n - 1, len);
    let ok = got[..1000] == mine[..1000] && got[1000..3000] == top[1000..3000] && got[3000..] == mine[3000..];
    out.push(("all_reduce on a slice".into(), ok));
    let want: Vec<f32> = (0..n).flat_map(|j| pattern(j, len / n)).collect();
    let got = dst.to_vec()?;
    out.push(("all_gather on slices".into(), got[..want.len()] == want[..] && got[want.len()..].iter().all(|&v| v == 0.0)));
    out.push(("slice out of range refused".into(), matches!(b.slice(10..len + 1), Err(sucl::Error::InvalidArgument { .. }))));
    // Refused before anything moves: host and device memory in one call, a short buffer.
    let dev = q.upload(&[1f32; 4])?;
    let mut host = vec![0f32; 4];
    let e = comm.all_reduce(&dev, &mut host, ReduceOp::Sum);
    out.push((format!("mixed memory refused ({e:?})"), matches!(e, Err(sucl::Error::InvalidArgument { .. })) && host == [0.0; 4]));
    let mut short = q.alloc::<f32>(3)?;
    let e = comm.all_reduce(&dev, &mut short, ReduceOp::Sum);
    out.push((format!("short recv refused ({e:?})"), matches!(e, Err(sucl::Error::InvalidArgument { .. }))));
    // A sub-communicator sets up its own device side at its first call on device memory.
    if let Some(sub) = comm.split(Some((r % 2) as u32), 0)? {
        let mut b = q.upload(&[r as f64; 33])?;
        sub.all_reduce_in_place(&mut b, ReduceOp::Sum)?;
        sub.synchronize(q)?;
        let want: usize = (0..n).filter(|j| j % 2 == r % 2).sum();
        out.push((format!("split all_reduce over {}", sub.device_backends().join(",")), b.to_vec()?.iter().all(|&v| v == want as f64)));
    }
    // Host and calls on device memory interleaved on one communicator still match up.
    let mut h = [r as u64 + 1];
    comm.all_reduce_in_place(&mut h, ReduceOp::Sum)?;
    out.push(("host call between calls on device memory".into(), h[0] == (n * (n + 1) / 2) as u64));
    Ok(out)
}

/// all_reduce calls captured into a CUDA graph (after a warm-up call that sets everything up)
/// and replayed: every replay must redo the reduction (the output is poisoned in between).
/// Shows that the backend in use keeps no per-call host state (peer memory: epochs in device
/// memory, fixed pointers). Each entry: (what, passed).
fn graph_checks(comm: &Communicator, q: &Queue) -> Result<Vec<(String, bool)>> {
    use sucl_cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let (n, r) = (comm.size(), comm.rank());
    let mut out = vec![];
    for count in [5usize, 70_001, (1 << 20) + 8] {
        let input: Vec<f32> = (0..count).map(|i| (r * 3 + i % 7) as f32).collect();
        let want: Vec<f32> = (0..count).map(|i| (0..n).map(|j| (j * 3 + i % 7) as f32).sum()).collect();
        let src = q.upload(&input)?;
        let mut dst = q.alloc::<f32>(count)?;
        comm.all_reduce(&src, &mut dst, ReduceOp::Sum)?;
        comm.synchronize(q)?;
        let stream = q.stream().clone();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(|e| dev_err(comm, e))?;
        let captured = (0..3).try_for_each(|_| comm.all_reduce(&src, &mut dst, ReduceOp::Sum));
        let graph = stream.end_capture(CUgraphInstantiate_flags(0)).map_err(|e| dev_err(comm, e))?;
        captured?;
        let Some(graph) = graph else {
            out.push((format!("graph capture of all_reduce of {count} f32: nothing captured"), false));
            continue;
        };
        let mut ok = true;
        for replay in 0..4 {
            let poison = vec![-77f32; count];
            stream.memcpy_htod(&poison, dst.cuda_slice_mut().expect("non-empty")).map_err(|e| dev_err(comm, e))?;
            graph.launch().map_err(|e| dev_err(comm, e))?;
            comm.synchronize(q)?;
            let got = dst.to_vec()?;
            if got != want {
                let bad = got.iter().zip(&want).filter(|(g, w)| g != w).count();
                eprintln!("  rank {r}: graph replay {replay} of all_reduce of {count} f32: {bad} wrong");
                ok = false;
            }
        }
        out.push((format!("graph capture of 3 all_reduce of {count} f32, 4 replays"), ok));
    }
    Ok(out)
}

/// The device correctness matrix (over the device backends in `only`, else every one set up);
/// returns the process exit code.
#[allow(clippy::too_many_arguments)]
pub fn check(
    comm: &Communicator,
    ops: &[CollOp],
    dtypes: &[DType],
    redops: &[ReduceOp],
    big_mib: usize,
    inject_kill: Option<(usize, usize)>,
    inject_stall: Option<(usize, usize)>,
    only: Option<&str>,
    graph: bool,
) -> Result<i32> {
    let dev = comm.cuda_device()?;
    comm.attach_device(&dev)?;
    let q = dev.queue()?;
    let n = comm.size();
    let t0 = Instant::now();
    let (mut checks, mut failures) = (0u64, 0u64);
    let mut seed = 1000;
    let mut backends = comm.device_backends();
    if let Some(list) = only {
        let want: Vec<&str> = list.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        if let Some(missing) = want.iter().find(|w| !backends.contains(w)) {
            let why = if *missing == "ipc" { comm.ipc_unavailable_reason() } else { None };
            return Err(Error::BackendUnavailable {
                rank: comm.rank(),
                backend: missing.to_string(),
                why: why.unwrap_or_else(|| format!("not set up by this communicator (device backends: {})", backends.join(","))),
            });
        }
        backends.retain(|b| want.contains(b));
    }
    for backend in backends {
        comm.pin_backend(Some(backend))?;
        if backend == "nccl" {
            let (c, f) = crate::vcheck::run_device(comm, &q)?;
            checks += c;
            failures += f;
        }
        for &op in ops {
            for &dt in dtypes {
                let rops: &[ReduceOp] = if op.reduces() { redops } else { &[ReduceOp::Sum] };
                for &redop in rops {
                    for count in [0usize, 1, 7, 3 * n + 1, 70_001, (1 << 20) + 3] {
                        seed += 1;
                        if inject_kill.is_some_and(|(r, after)| r == comm.rank() && seed as usize == 1000 + after) {
                            eprintln!("injected fault: rank {} kills itself now", comm.rank());
                            // SAFETY: raise(2) has no memory preconditions; SIGKILL ends this process at once.
                            unsafe { libc::raise(libc::SIGKILL) };
                        }
                        if inject_stall.is_some_and(|(r, after)| r == comm.rank() && seed as usize == 1000 + after) {
                            eprintln!("injected fault: rank {} stops answering", comm.rank());
                            std::thread::sleep(std::time::Duration::from_secs(120));
                            std::process::exit(5);
                        }
                        let case = Case { op, count, n, rank: comm.rank(), root: (count + seed as usize) % n, seed, redop };
                        let wrong = sucl::with_dtype!(dt, T => check_case::<T>(comm, &q, &case)?);
                        checks += 1;
                        if wrong > 0 {
                            failures += 1;
                            eprintln!("WRONG device {backend} {} {dt} {redop} count={count}: {wrong} wrong elements", op.name());
                        }
                    }
                }
            }
        }
        if big_mib > 0 {
            for op in [CollOp::AllReduce, CollOp::Broadcast, CollOp::AllGather, CollOp::ReduceScatter] {
                let total = (big_mib << 20) / 4;
                let count = if matches!(op, CollOp::AllGather | CollOp::ReduceScatter) { total / n } else { total };
                seed += 1;
                let case = Case { op, count, n, rank: comm.rank(), root: n - 1, seed, redop: ReduceOp::Sum };
                let wrong = check_case::<f32>(comm, &q, &case)?;
                checks += 1;
                if wrong > 0 {
                    failures += 1;
                    eprintln!("WRONG device {backend} {} f32 {big_mib} MiB: {wrong} wrong elements", op.name());
                }
            }
        }
        // The staged path waits on the host inside calls: it cannot be captured.
        let graphs = if graph && backend != "staged" { graph_checks(comm, &q)? } else { vec![] };
        for (what, ok) in api_checks(comm, &q)?.into_iter().chain(graphs) {
            checks += 1;
            if !ok {
                failures += 1;
                eprintln!("WRONG device {backend} {what}");
            }
        }
    }
    comm.pin_backend(None)?;
    // Through the rendezvous store: a broken backend must not be the one adding up its failures.
    let totals = [crate::ops::oob_sum(comm, "gpu-check/checks", checks)?, crate::ops::oob_sum(comm, "gpu-check/failures", failures)?];
    if comm.rank() == 0 {
        println!(
            "sucl check --device cuda: {n} ranks, device backends {}: {} checks, {} wrong ({:.1} s)",
            comm.device_backends().join(","),
            totals[0],
            totals[1],
            t0.elapsed().as_secs_f64()
        );
    }
    crate::ops::reported(comm)?;
    Ok(if totals[1] == 0 { 0 } else { 1 })
}

/// One collective through NCCL called directly (the `raw` choice). The addresses are taken
/// as sucl's own backends take them: inside a stream capture without cudarc's cross-stream
/// event waits, which would cross the capture's boundary and make NCCL fail.
fn raw_op<T: DeviceElement>(rawc: &RawNccl, q: &Queue, d: &sucl_core::CollDesc, s: &Buffer<T>, r: &mut Buffer<T>) -> Result<()> {
    let stream = q.stream();
    let (sp, _read) = s.read_ptr(stream);
    let (rp, _write) = r.write_ptr(stream);
    // SAFETY: both buffers hold the sizes `d` gives this rank (measure sizes them from it) and
    // outlive the call: they are dropped only after the queue is synchronized.
    unsafe { rawc.collective(d, sp, rp, stream) }
}

/// Measures one size on device buffers, checked as host measurements are (see
/// [`crate::bench::measure`]): the inputs are the test pattern, uploaded; the outputs of the
/// first call (before warm-up) and of the last timed call are downloaded and compared with the
/// serial reference outside the timed loop; `wrong` adds up every rank's count through the
/// rendezvous store.
fn measure<T: DeviceElement>(
    comm: &Communicator,
    q: &Queue,
    rawc: Option<&RawNccl>,
    a: &BenchArgs,
    bytes: u64,
    label: &str,
) -> Result<Row> {
    let (n, r) = (comm.size(), comm.rank());
    let BenchOp::Coll(op) = a.op else { return Err(Error::invalid(r, "op", "device benchmarks run collectives")) };
    let es = std::mem::size_of::<T>();
    let total = (bytes as usize / es).max(n);
    let count = match op {
        CollOp::AllGather | CollOp::Gather | CollOp::Scatter | CollOp::AllToAll | CollOp::ReduceScatter => total / n,
        _ => total,
    };
    let root = a.root % n;
    let (sl, rl) = buffer_lens(op, count, n, r, root);
    let case = Case { op, count, n, rank: r, root, seed: bytes ^ 0x5eed, redop: a.redop };
    // Buffers of at least one element (NCCL is not handed null pointers).
    let crate::pattern::Inputs { mut send, mut recv, want } =
        crate::pattern::inputs::<T>("device", &case, sl, rl, a.check, |snd, rcv| fill_input(op, snd, rcv, r, n, root, case.seed, a.redop));
    send.resize(sl.max(1), T::from_i64(0));
    recv.resize(rl.max(1), T::from_i64(-77));
    let recv_is_input = op == CollOp::Broadcast && r == root;
    let ds = q.upload(&send)?;
    let mut dr = q.upload(&recv)?;
    let poison = vec![T::from_i64(-77); rl.max(1)];
    let raw_desc = sucl_core::CollDesc { op, dtype: T::DTYPE, redop: a.redop, root, count };
    let once = |dr: &mut Buffer<T>| -> Result<()> {
        match rawc {
            Some(c) => raw_op(c, q, &raw_desc, &ds, dr),
            None => run_dev(comm, q, op, &ds, dr, a.redop, root),
        }
    };
    // Checks the output of the calls since the last poisoning (after the queue is drained).
    let wrong_in = |dr: &Buffer<T>| -> Result<u64> {
        let Some(w) = &want else { return Ok(0) };
        comm.synchronize(q)?;
        let got: Vec<T> = dr.to_vec()?;
        Ok(count_wrong_vs(&case, w, &got[..rl]) as u64)
    };
    once(&mut dr)?;
    let mut wrong = wrong_in(&dr)?;
    for _ in 0..a.warmup {
        once(&mut dr)?;
    }
    comm.synchronize(q)?;
    // One timed call bounds the iterations to about MEASURE_SECONDS (slow staged sizes would
    // otherwise take minutes); the slowest rank decides, since every rank must run as many.
    let t = Instant::now();
    once(&mut dr)?;
    comm.synchronize(q)?;
    let mut one = [t.elapsed().as_secs_f64()];
    comm.all_reduce_in_place(&mut one, ReduceOp::Max)?;
    let iters = a.iters.count(one[0]).min(((MEASURE_SECONDS / one[0]) as usize).max(MIN_ITERS)).max(1);
    // --graph: capture a batch of calls once; the graph holds dr's address, so it is poisoned
    // in place from here on.
    let (per_graph, replays) = graph_batches(iters);
    let graph = if a.graph { Some(capture(comm, q, per_graph, || once(&mut dr))?) } else { None };
    let iters = if a.graph { per_graph * replays } else { iters };
    if want.is_some() && !recv_is_input {
        if a.graph {
            let slice = dr.cuda_slice_mut().expect("non-empty");
            q.stream().memcpy_htod(&poison, slice).map_err(|e| dev_err(comm, e))?;
        } else {
            dr = q.upload(&poison)?;
        }
        comm.synchronize(q)?;
    }
    comm.barrier()?;
    let t = Instant::now();
    match &graph {
        Some(g) => {
            for _ in 0..replays {
                g.launch().map_err(|e| dev_err(comm, e))?;
            }
        }
        None => {
            for _ in 0..iters {
                once(&mut dr)?;
            }
        }
    }
    comm.synchronize(q)?;
    let mut time = [t.elapsed().as_secs_f64() / iters as f64];
    wrong += wrong_in(&dr)?;
    comm.all_reduce_in_place(&mut time, ReduceOp::Max)?;
    let wrong = if a.check { Some(crate::ops::oob_sum(comm, "gpu-bench/wrong", wrong)?) } else { None };
    let shown = count
        * if matches!(op, CollOp::AllGather | CollOp::Gather | CollOp::Scatter | CollOp::AllToAll | CollOp::ReduceScatter) { n } else { 1 };
    Ok(Row::new(a, label, n, shown, T::DTYPE, time[0], wrong, iters))
}

/// Captures `calls` calls of `once` on `q`'s stream into a CUDA graph (none of them runs now).
fn capture(
    comm: &Communicator,
    q: &Queue,
    calls: usize,
    mut once: impl FnMut() -> Result<()>,
) -> Result<sucl_cuda::cudarc::driver::CudaGraph> {
    use sucl_cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let stream = q.stream().clone();
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(|e| dev_err(comm, e))?;
    let captured = (0..calls).try_for_each(|_| once());
    // End the capture whatever happened, so that the stream is usable again.
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).map_err(|e| dev_err(comm, e));
    captured?;
    graph?.ok_or_else(|| dev_err(comm, "stream capture recorded nothing (does this backend run on the stream?)"))
}

fn raw_comm(comm: &Communicator, q: &Queue) -> Result<RawNccl> {
    let mut id = if comm.rank() == 0 {
        sucl_cuda::nccl_unique_id().map_err(|why| Error::BackendUnavailable { rank: 0, backend: "nccl".into(), why })?
    } else {
        vec![0u8; 128]
    };
    comm.broadcast(&mut id, 0)?;
    RawNccl::join(q.stream(), &id, comm.rank(), comm.size())
}

fn measure_any(comm: &Communicator, q: &Queue, rawc: Option<&RawNccl>, a: &BenchArgs, bytes: u64, label: &str) -> Result<Row> {
    match a.dtype {
        DType::F32 => measure::<f32>(comm, q, rawc, a, bytes, label),
        DType::F64 => measure::<f64>(comm, q, rawc, a, bytes, label),
        DType::F16 => measure::<half::f16>(comm, q, rawc, a, bytes, label),
        DType::BF16 => measure::<half::bf16>(comm, q, rawc, a, bytes, label),
        DType::I32 => measure::<i32>(comm, q, rawc, a, bytes, label),
        other => Err(Error::invalid(comm.rank(), "dtype", format!("device benchmarks support f32, f64, f16, bf16, i32 (not {other})"))),
    }
}

/// This rank's GPU with the communicator's device side set up, and a queue on it.
fn open(comm: &Communicator) -> Result<(Device, Queue)> {
    let dev = comm.cuda_device()?;
    comm.attach_device(&dev)?;
    let q = dev.queue()?;
    Ok((dev, q))
}

/// Measures several device choices side by side in one job (`raw`, `nccl`, `staged`, `auto`):
/// per size, `rounds` interleaved rounds; the best time of each counts. Rank 0 prints JSON rows
/// (with `json`) or a table with sucl's overhead over raw NCCL. Every measurement is checked;
/// a row's `wrong` counts the wrong elements of every round of its choice. Returns the wrong
/// elements of all measurements.
pub fn compare(comm: &Communicator, a: &BenchArgs, choices: &[String], rounds: usize) -> Result<u64> {
    let (dev, q) = open(comm)?;
    let rawc = if choices.iter().any(|c| c == "raw") { Some(raw_comm(comm, &q)?) } else { None };
    let lead = comm.rank() == 0;
    if lead && !a.json {
        println!(
            "# sucl bench {} --device cuda --compare: {} ranks on {}, best of {rounds} interleaved rounds, time (µs){}",
            a.op.name(),
            comm.size(),
            dev.name(),
            if a.graph { ", CUDA-graph replays" } else { "" }
        );
        let mut h = format!("{:>12}", "bytes");
        for c in choices {
            h += &format!(" {c:>10}");
        }
        println!("{h} {:>7}", "#wrong");
    }
    let mut all_wrong = 0;
    for bytes in sizes(a.min_bytes, a.max_bytes, a.factor) {
        let mut best: Vec<Option<Row>> = vec![None; choices.len()];
        let mut wrong: Vec<Option<u64>> = vec![None; choices.len()];
        // Rounds of small sizes cost milliseconds, and their noise (±1 µs from the CPU side of
        // every launch) is as large as the differences measured: take more of them there.
        let rounds = if bytes <= SMALL_BYTES { rounds * SMALL_ROUNDS_FACTOR } else { rounds };
        for round in 0..rounds.max(1) {
            for k in crate::bench::round_order(choices.len(), round) {
                let c = &choices[k];
                let row = if c == "raw" {
                    measure_any(comm, &q, rawc.as_ref(), a, bytes, c)?
                } else {
                    comm.pin_backend((c != "auto").then_some(c.as_str()))?;
                    measure_any(comm, &q, None, a, bytes, c)?
                };
                if let Some(w) = row.wrong {
                    wrong[k] = Some(wrong[k].unwrap_or(0) + w);
                }
                if best[k].as_ref().is_none_or(|b| row.time_us < b.time_us) {
                    best[k] = Some(row);
                }
            }
        }
        comm.pin_backend(None)?;
        for (b, w) in best.iter_mut().zip(&wrong) {
            if let Some(b) = b {
                b.wrong = *w;
            }
        }
        all_wrong += wrong.iter().flatten().sum::<u64>();
        if lead {
            if a.json {
                for r in best.iter().flatten() {
                    println!("{}", serde_json::to_string(r).expect("row serializes"));
                }
            } else {
                let mut line = format!("{bytes:>12}");
                for r in best.iter().flatten() {
                    line += &format!(" {:>10.2}", r.time_us);
                }
                let w: Option<u64> = wrong.iter().flatten().copied().reduce(|x, y| x + y);
                println!("{line} {:>7}", crate::bench::wrong_cell(w));
            }
        }
    }
    Ok(all_wrong)
}

/// Device sweep for `choice` (`nccl`, `staged`, `auto` or `raw`); rank 0 prints rows.
pub fn bench(comm: &Communicator, a: &BenchArgs, choice: &str) -> Result<Vec<Row>> {
    let (dev, q) = open(comm)?;
    let rawc = if choice == "raw" {
        Some(raw_comm(comm, &q)?)
    } else {
        comm.pin_backend((choice != "auto").then_some(choice))?;
        None
    };
    let lead = comm.rank() == 0;
    if lead && !a.json {
        let how = if a.graph { ", CUDA-graph replays" } else { "" };
        println!(
            "# sucl bench {} --device cuda: {} ranks, backend {choice} ({}), {}{how}",
            a.op.name(),
            comm.size(),
            dev.name(),
            a.iters.describe()
        );
        println!(
            "{:>12} {:>12} {:>6} {:>12} {:>10} {:>10} {:>7} {:>8}",
            "bytes", "count", "type", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "iters"
        );
    }
    let mut rows = vec![];
    for bytes in sizes(a.min_bytes, a.max_bytes, a.factor) {
        let row = measure_any(comm, &q, rawc.as_ref(), a, bytes, choice)?;
        if lead {
            if a.json {
                println!("{}", serde_json::to_string(&row).expect("row serializes"));
            } else {
                println!(
                    "{:>12} {:>12} {:>6} {:>12.2} {:>10.3} {:>10.3} {:>7} {:>8}",
                    row.bytes,
                    row.count,
                    row.dtype,
                    row.time_us,
                    row.algbw_gbps,
                    row.busbw_gbps,
                    crate::bench::wrong_cell(row.wrong),
                    row.iters
                );
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

/// One size on every device backend, interleaved rounds (more of them up to [`SMALL_BYTES`]);
/// wrong elements are added to `wrong` and reported by rank 0.
fn tune_point(
    comm: &Communicator,
    q: &Queue,
    args: &BenchArgs,
    names: &[&str],
    rounds: usize,
    bytes: u64,
    wrong: &mut u64,
) -> Result<crate::tune::Measured> {
    let mut times = vec![vec![]; names.len()];
    let rounds = if bytes <= SMALL_BYTES { rounds * SMALL_ROUNDS_FACTOR } else { rounds };
    for round in 0..rounds.max(1) {
        for k in crate::bench::round_order(names.len(), round) {
            let name = names[k];
            comm.pin_backend(Some(name))?;
            let row = measure_any(comm, q, None, args, bytes, name)?;
            times[k].push(row.time_us);
            if let Some(w) = row.wrong.filter(|&w| w > 0) {
                *wrong += w;
                if comm.rank() == 0 {
                    eprintln!("sucl tune: WRONG {} {bytes} B on {name}: {w} wrong elements", args.op.name());
                }
            }
        }
    }
    Ok(crate::tune::Measured { bytes, times })
}

/// `sucl tune --device cuda`: per op and size, the device backend to use (nccl, ipc, staged),
/// from the median of `rounds` interleaved rounds (three times as many up to 1 MiB, where a
/// call's noise is as large as the differences), with near-ties going to the built-in rules'
/// choice (see [`crate::tune::choose`]); written as tuning rules that collectives on device buffers
/// follow under `--config`.
pub fn tune(comm: &Communicator, a: &BenchArgs, ops: &[CollOp], rounds: usize, out: &str) -> Result<i32> {
    let (dev, q) = open(comm)?;
    let names = comm.device_backends();
    let lead = comm.rank() == 0;
    let mut file = format!(
        "# Device tuning table written by `sucl tune --device cuda` for {} ranks on {} ({}).\n# Per op and size range, the backend chosen from the median of {rounds} interleaved rounds ({}x as many up to {SMALL_BYTES} B); near-ties (within {:.0} %) go to the built-in rules' choice.\n",
        comm.size(),
        dev.name(),
        names.join(", "),
        SMALL_ROUNDS_FACTOR,
        crate::tune::TIE_MARGIN * 100.0
    );
    // Every measurement is checked; a backend that computes wrong results wins nothing.
    let mut wrong = 0;
    for &op in ops {
        let args = BenchArgs { op: BenchOp::Coll(op), ..*a };
        let builtin = |bytes| {
            let default = sucl::select::default_device_choice(&names, comm.size(), op, bytes);
            default.and_then(|d| names.iter().position(|n| *n == d))
        };
        let sizes = sizes(a.min_bytes, a.max_bytes, a.factor);
        let (points, builtin) =
            crate::tune::sweep(&sizes, builtin, |bytes| tune_point(comm, &q, &args, &names, rounds, bytes, &mut wrong))?;
        comm.pin_backend(None)?;
        if lead {
            file += &crate::tune::report(op, comm.size(), &names, &points, &builtin);
        }
    }
    if wrong > 0 {
        if lead {
            eprintln!("sucl tune: some results were wrong; {out} not written");
        }
        return crate::tune::fail_together(comm);
    }
    if lead {
        if let Err(e) = std::fs::write(out, file) {
            eprintln!("sucl tune: cannot write {out}: {e}");
            return Ok(1);
        }
        println!("# wrote {out}");
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graph_batches_cover_the_iterations() {
        assert_eq!(graph_batches(0), (1, 1));
        assert_eq!(graph_batches(1), (1, 1));
        assert_eq!(graph_batches(7), (7, 1));
        assert_eq!(graph_batches(GRAPH_BATCH), (GRAPH_BATCH, 1));
        assert_eq!(graph_batches(100), (20, 5));
        for iters in 1..300 {
            let (per, replays) = graph_batches(iters);
            assert!((1..=GRAPH_BATCH).contains(&per));
            assert!(per * replays >= iters && per * (replays - 1) < iters, "iters={iters}: {per} x {replays}");
        }
    }
}
