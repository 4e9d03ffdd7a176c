//! GPU ranks on real processes: the example programs on GPU queues print bit-identical results
//! to the host-rank programs (1 rank; 2 ranks sharing GPU 0, which goes through the staged
//! path; 2 ranks on 2 GPUs over NCCL and forced staged, where there are 2 GPUs); an NVRTC
//! compile error ends every rank with NVRTC's log; a kernel that faults is an error, not a
//! hang; a lost rank is an error on the survivor.
//!
//! Without a GPU (CI) they skip, and `gpu_tests_skipped_no_gpu` says so; with
//! `SUCL_REQUIRE_GPU=1` (scripts/graph-gpu.sh) every skip is a failure.

#![cfg(feature = "cuda")]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[allow(dead_code)]
mod host {
    include!("../examples/graph_programs.rs");
}

#[allow(dead_code)]
mod gpu {
    include!("../examples/graph_gpu_programs.rs");
}

/// A child killed and reaped when dropped, so a failing test leaves no process behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn gpu_required() -> bool {
    std::env::var("SUCL_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// The number of GPUs, or None (a skip, said on stderr) where there is none; fails under
/// SUCL_REQUIRE_GPU=1.
fn gpus_or_skip(test: &str) -> Option<usize> {
    match sucl_runtime::cuda::probe() {
        Ok(n) => Some(n),
        Err(why) => {
            assert!(!gpu_required(), "SUCL_REQUIRE_GPU=1 but no GPU here: {why}");
            eprintln!("{test}: SKIPPED, no GPU: {why}");
            None
        }
    }
}

#[test]
fn gpu_tests_skipped_no_gpu() {
    let r = sucl_runtime::cuda::probe();
    assert!(r.is_err(), "{r:?} GPUs are present, so the GPU tests ran: this test passes only where they were skipped");
    assert!(!gpu_required(), "SUCL_REQUIRE_GPU=1 but no GPU here, so the GPU tests were skipped: {r:?}");
}

/// How to start the ranks of one run.
struct Launch<'a> {
    ranks: usize,
    rank_test: &'a str,
    /// CUDA_VISIBLE_DEVICES for every rank (None: inherit).
    visible: Option<&'a str>,
    /// SUCL_GRAPH_DEVICE_TRANSPORT (None: unset, auto).
    transport: Option<&'a str>,
    timeout_s: &'a str,
    /// SUCL_GRAPH_CPD, collective pattern discovery on ("1") or off ("0") (None: unset, on).
    cpd: Option<&'a str>,
}

fn start(l: &Launch<'_>) -> Vec<Reaped> {
    let port = sucl_runtime::unused_loopback_port().expect("a free port for the store");
    (0..l.ranks)
        .map(|r| {
            let mut cmd = Command::new(std::env::current_exe().unwrap());
            cmd.args([l.rank_test, "--exact", "--ignored", "--nocapture", "--test-threads=1"]);
            if l.ranks > 1 {
                cmd.env("RANK", r.to_string())
                    .env("WORLD_SIZE", l.ranks.to_string())
                    .env("LOCAL_RANK", r.to_string())
                    .env("LOCAL_WORLD_SIZE", l.ranks.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string());
            }
            if let Some(v) = l.visible {
                cmd.env("CUDA_VISIBLE_DEVICES", v);
            }
            match l.transport {
                Some(t) => cmd.env("SUCL_GRAPH_DEVICE_TRANSPORT", t),
                None => cmd.env_remove("SUCL_GRAPH_DEVICE_TRANSPORT"),
            };
            match l.cpd {
                Some(c) => cmd.env("SUCL_GRAPH_CPD", c),
                None => cmd.env_remove("SUCL_GRAPH_CPD"),
            };
            cmd.env("SUCL_TIMEOUT", l.timeout_s)
                .env("SUCL_GRAPH_THREADS", "1")
                .env("NCCL_NVLS_ENABLE", "0")
                .env_remove("SUCL_GRAPH_DUMP")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            Reaped(cmd.spawn().expect("start a rank (this test binary again)"))
        })
        .collect()
}

/// Waits at most `limit` for a child: (exit code, stdout, stderr). Panics (killing it) after.
fn wait(c: &mut Reaped, limit: Duration, what: &str) -> (Option<i32>, String, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = c.0.try_wait().unwrap() {
            let (mut out, mut err) = (String::new(), String::new());
            std::io::Read::read_to_string(c.0.stdout.as_mut().unwrap(), &mut out).unwrap();
            std::io::Read::read_to_string(c.0.stderr.as_mut().unwrap(), &mut err).unwrap();
            return (status.code(), out, err);
        }
        assert!(start.elapsed() < limit, "{what} still running after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The programs' lines of rank 0's stdout, after every rank succeeded.
fn program_lines(l: &Launch<'_>) -> Vec<String> {
    let mut ranks = start(l);
    let mut out0 = String::new();
    for (r, c) in ranks.iter_mut().enumerate() {
        let (code, out, err) = wait(c, Duration::from_secs(180), &format!("{} rank {r}", l.rank_test));
        assert_eq!(code, Some(0), "{} ranks ({:?}, transport {:?}): rank {r} failed: {err}", l.ranks, l.visible, l.transport);
        eprint!("{err}");
        if r == 0 {
            out0 = out;
        }
    }
    let names = || std::iter::once("chain:").chain(host::PROGRAMS);
    out0.lines().filter_map(|l| names().filter_map(|p| l.find(p)).min().map(|at| l[at..].to_string())).collect()
}

#[test]
#[ignore = "a rank of the GPU program tests, started by them"]
fn gpu_programs_rank() {
    gpu::run().unwrap();
}

#[test]
#[ignore = "a rank of the GPU program tests (the host reference), started by them"]
fn host_programs_rank() {
    host::run().unwrap();
}

/// The chain's expected line: a = i + 1, b = 3a, d[i] = b[i] + a[N-1-i] (exact in f64).
fn chain_line() -> String {
    let n = gpu::CHAIN;
    let d: Vec<String> = (0..n).map(|i| format!("{:?}", 3.0 * (i + 1) as f64 + (n - i) as f64)).collect();
    format!("chain: {}", d.join(" "))
}

#[test]
fn gpu_programs_match_the_host_ranks_bit_for_bit() {
    let Some(n) = gpus_or_skip("gpu_programs_match_the_host_ranks_bit_for_bit") else { return };
    let host =
        program_lines(&Launch { ranks: 1, rank_test: "host_programs_rank", visible: None, transport: None, timeout_s: "30", cpd: None });
    let mut want: Vec<String> = vec![chain_line()];
    // The host example prints more programs than the GPU one (a second `all:` line, for `all`
    // after a 2D split, comes last): take each program's first line.
    want.extend(host::PROGRAMS.iter().filter_map(|p| host.iter().find(|l| l.starts_with(p)).cloned()));
    assert_eq!(want.len(), 1 + host::PROGRAMS.len(), "the host reference printed every program: {want:#?}");
    let mut runs = vec![
        ("1 rank", Launch { ranks: 1, rank_test: "gpu_programs_rank", visible: Some("0"), transport: None, timeout_s: "60", cpd: None }),
        (
            "2 ranks sharing GPU 0 (staged)",
            Launch { ranks: 2, rank_test: "gpu_programs_rank", visible: Some("0"), transport: None, timeout_s: "60", cpd: None },
        ),
    ];
    if n >= 2 {
        runs.push((
            "2 ranks on 2 GPUs (auto: nccl)",
            Launch { ranks: 2, rank_test: "gpu_programs_rank", visible: None, transport: None, timeout_s: "60", cpd: None },
        ));
        runs.push((
            "2 ranks on 2 GPUs, nccl",
            Launch { ranks: 2, rank_test: "gpu_programs_rank", visible: None, transport: Some("nccl"), timeout_s: "60", cpd: None },
        ));
        runs.push((
            "2 ranks on 2 GPUs, staged",
            Launch { ranks: 2, rank_test: "gpu_programs_rank", visible: None, transport: Some("staged"), timeout_s: "60", cpd: None },
        ));
        // The Table 3 programs with collective pattern discovery off and on, on 2 GPUs.
        runs.push((
            "2 ranks on 2 GPUs, discovery off",
            Launch { ranks: 2, rank_test: "gpu_programs_rank", visible: None, transport: None, timeout_s: "60", cpd: Some("0") },
        ));
        runs.push((
            "2 ranks on 2 GPUs, discovery on",
            Launch { ranks: 2, rank_test: "gpu_programs_rank", visible: None, transport: None, timeout_s: "60", cpd: Some("1") },
        ));
    } else {
        assert!(!gpu_required() || std::env::var("SUCL_REQUIRE_GPUS").map_or(true, |v| v != "2"), "SUCL_REQUIRE_GPUS=2 but only {n} GPU");
        eprintln!("gpu_programs_match_the_host_ranks_bit_for_bit: only {n} GPU: the runs on 2 GPUs are SKIPPED");
    }
    for (what, l) in &runs {
        let got = program_lines(l);
        let mut sorted_got = got.clone();
        let mut sorted_want = want.clone();
        sorted_got.sort();
        sorted_want.sort();
        assert_eq!(sorted_got, sorted_want, "{what}: GPU results differ from the host ranks'");
        eprintln!("{what}: {} programs bit-identical to the host ranks", got.len());
    }
}

#[test]
#[ignore = "a rank of a_compile_error_ends_every_rank_with_nvrtcs_log, started by it"]
fn compile_error_rank() {
    use sucl_graph::{mappers::*, CudaSource, DistrQueue};
    let comm = sucl_runtime::init().unwrap();
    let dev = comm.cuda_device().unwrap();
    let mut q = DistrQueue::on_device(&comm, &dev).unwrap();
    let a = q.buffer::<f64, 1>([64]).unwrap();
    let bad =
        CudaSource::new("extern \"C\" __global__ void broken(sucl_chunk c, double* a, sucl_extent e) {\n    a[0] = undefined_thing;\n}\n");
    let err = q
        .submit(|cgh| {
            cgh.discard_write(&a, one_to_one());
            cgh.name("broken");
            // SAFETY: never launched (it does not compile).
            unsafe { cgh.parallel_for_cuda([64], &bad, "broken", &[]) }
        })
        .unwrap_err();
    eprintln!("COMPILE-ERROR rank {}: {err}", comm.rank());
    std::process::exit(7);
}

#[test]
fn a_compile_error_ends_every_rank_with_nvrtcs_log() {
    if gpus_or_skip("a_compile_error_ends_every_rank_with_nvrtcs_log").is_none() {
        return;
    }
    let mut ranks =
        start(&Launch { ranks: 2, rank_test: "compile_error_rank", visible: Some("0"), transport: None, timeout_s: "20", cpd: None });
    for (r, c) in ranks.iter_mut().enumerate() {
        let (code, _, err) = wait(c, Duration::from_secs(60), &format!("rank {r}"));
        assert_eq!(code, Some(7), "rank {r} must report the compile error: {err}");
        assert!(
            err.contains(&format!("COMPILE-ERROR rank {r}: rank {r}: task 'broken' failed: NVRTC could not compile")),
            "rank {r}: {err}"
        );
        // NVRTC's log, with the user's own line number (2).
        assert!(err.contains("(2): error") && err.contains("undefined_thing"), "rank {r}: NVRTC's log is missing: {err}");
    }
}

#[test]
#[ignore = "a rank of a_faulting_kernel_is_an_error_not_a_hang, started by it"]
fn faulting_kernel_rank() {
    use sucl_graph::{mappers::*, CudaSource, DistrQueue};
    let comm = sucl_runtime::init().unwrap();
    let dev = comm.cuda_device().unwrap();
    let mut q = DistrQueue::on_device(&comm, &dev).unwrap();
    let a = q.buffer::<f64, 1>([64]).unwrap();
    let wild = CudaSource::new(
        "extern \"C\" __global__ void wild(sucl_chunk c, double* a, sucl_extent e) {\n    sucl_size i[3]; if (!sucl_item(c, i)) return;\n    ((double*)16)[i[0] * 1000003] = 1.0;\n}\n",
    );
    // SAFETY: deliberately not: the kernel writes through a wild pointer; the GPU faults, which
    // must come back as an error (the context is lost, the process ends right after).
    q.submit(|cgh| {
        cgh.discard_write(&a, one_to_one());
        unsafe { cgh.parallel_for_cuda([64], &wild, "wild", &[]) }
    })
    .unwrap();
    let err = q.fence_all(&a).unwrap_err();
    eprintln!("FAULT-ERROR: {err}");
    std::process::exit(7);
}

#[test]
fn a_faulting_kernel_is_an_error_not_a_hang() {
    if gpus_or_skip("a_faulting_kernel_is_an_error_not_a_hang").is_none() {
        return;
    }
    let mut ranks =
        start(&Launch { ranks: 1, rank_test: "faulting_kernel_rank", visible: Some("0"), transport: None, timeout_s: "20", cpd: None });
    let (code, _, err) = wait(&mut ranks[0], Duration::from_secs(60), "the faulting rank");
    assert_eq!(code, Some(7), "the fault must come back from the fence as an error: {err}");
    assert!(err.contains("FAULT-ERROR") && err.contains("ILLEGAL_ADDRESS"), "{err}");
}

#[test]
#[ignore = "a rank of a_lost_gpu_rank_is_an_error_not_a_hang, started by it"]
fn lost_gpu_rank() {
    use sucl_graph::{mappers::*, DistrQueue};
    let comm = sucl_runtime::init().unwrap();
    let dev = comm.cuda_device().unwrap();
    let mut q = DistrQueue::on_device(&comm, &dev).unwrap();
    if comm.rank() == 1 {
        std::process::exit(0);
    }
    let src = gpu::source();
    let a = q.buffer::<f64, 1>([64]).unwrap();
    let s = q.buffer::<f64, 1>([64]).unwrap();
    let run = (|| -> Result<Vec<f64>, sucl_graph::GraphError> {
        q.submit(|cgh| {
            cgh.discard_write(&a, one_to_one());
            // SAFETY: fill_squares declares (chunk, a, extent), the accessor's f64 buffer.
            unsafe { cgh.parallel_for_cuda([64], &src, "fill_squares", &[]) }
        })?;
        q.submit(|cgh| {
            cgh.read(&a, all());
            cgh.discard_write(&s, one_to_one());
            // SAFETY: all_sum declares (chunk, a, extent, s, extent), both f64.
            unsafe { cgh.parallel_for_cuda([64], &src, "all_sum", &[]) }
        })?;
        q.fence_all(&s)
    })();
    eprintln!("LOST-PEER-ERROR: {}", run.unwrap_err());
    std::process::exit(7);
}

#[test]
fn a_lost_gpu_rank_is_an_error_not_a_hang() {
    let Some(n) = gpus_or_skip("a_lost_gpu_rank_is_an_error_not_a_hang") else { return };
    let mut cases = vec![Some("0")];
    if n >= 2 {
        cases.push(None); // one GPU each: NCCL
    }
    for visible in cases {
        let mut ranks = start(&Launch { ranks: 2, rank_test: "lost_gpu_rank", visible, transport: None, timeout_s: "5", cpd: None });
        let _ = wait(&mut ranks[1], Duration::from_secs(60), "rank 1");
        let (code, _, err) = wait(&mut ranks[0], Duration::from_secs(90), "rank 0 after losing rank 1");
        assert_eq!(code, Some(7), "visible {visible:?}: rank 0 must fail with an error: {err}");
        assert!(err.contains("LOST-PEER-ERROR"), "{err}");
    }
}

/// Runs everywhere (no GPU needed): a CUDA kernel on a host queue is a clear error at submit.
#[test]
fn parallel_for_cuda_on_a_host_queue_is_an_error() {
    use sucl_graph::{mappers::*, DistrQueue};
    let comm = sucl_runtime::init().unwrap();
    let mut q = DistrQueue::new(&comm).unwrap();
    assert_eq!(q.device_transport(), None);
    let a = q.buffer::<f64, 1>([8]).unwrap();
    let src = gpu::source();
    let err = q
        .submit(|cgh| {
            cgh.discard_write(&a, one_to_one());
            cgh.name("fill");
            // SAFETY: refused before anything runs.
            unsafe { cgh.parallel_for_cuda([8], &src, "fill_squares", &[]) }
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("task 'fill': parallel_for_cuda needs a GPU queue (DistrQueue::on_device)"), "{err}");
}
