//! The example programs (1D and 2D stencils, all-reads, master and collective host tasks, a
//! matrix transpose, a direct N-body) on 1, 2, 3 and 4 real host ranks (separate processes
//! meeting through the torchrun-style environment), with one or several worker threads per
//! rank, print bit-identical results to one rank with one thread.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child killed and reaped when dropped, so a failing test leaves no process behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[allow(dead_code)]
mod program {
    include!("../examples/graph_programs.rs");
}

/// One rank of the programs: the parent test starts this test binary again, running only this.
#[test]
#[ignore = "a rank of programs_give_identical_results_on_1_to_4_ranks, started by it"]
fn graph_programs_rank() {
    program::run().unwrap();
}

/// A rank of the lost-peer test: rank 1 leaves right after start-up, rank 0 then needs its data.
#[test]
#[ignore = "a rank of a_lost_rank_is_an_error_not_a_hang, started by it"]
fn lost_peer_rank() {
    use sucl_graph::{mappers::*, DistrQueue};
    let comm = sucl_runtime::init().unwrap();
    if comm.rank() == 1 {
        std::process::exit(0);
    }
    let mut q = DistrQueue::new(&comm).unwrap();
    let a = q.buffer::<f64, 1>([8]).unwrap();
    q.submit(|cgh| {
        cgh.discard_write(&a, one_to_one());
        cgh.parallel_for([8], |_, _| {})
    })
    .unwrap();
    let err = q
        .submit(|cgh| {
            cgh.read(&a, all());
            cgh.parallel_for([8], |_, _| {})
        })
        .unwrap_err();
    eprintln!("LOST-PEER-ERROR: {err}");
    std::process::exit(7);
}

/// Runs the example on `n` ranks with `threads` worker threads each; rank 0's stdout. Panics
/// on a failure or after 60 s.
fn run(n: usize, threads: usize) -> String {
    run_cpd(n, threads, None)
}

/// [`run`] with `SUCL_GRAPH_CPD` set to `cpd` if given (discovery on by default).
fn run_cpd(n: usize, threads: usize, cpd: Option<&str>) -> String {
    let mut ranks = start_env(n, "graph_programs_rank", "20", threads, None, cpd);
    for (r, c) in ranks.iter_mut().enumerate() {
        let (ok, err) = wait(c, Duration::from_secs(60), &format!("{n} ranks: rank {r}"));
        assert!(ok, "{n} ranks: rank {r} failed: {err}");
    }
    let mut out = String::new();
    std::io::Read::read_to_string(ranks[0].0.stdout.as_mut().unwrap(), &mut out).unwrap();
    // Only the programs' lines, not the test harness's ("test graph_programs_rank ... " may
    // precede the first one on its line).
    out.lines().filter_map(|l| program::PROGRAMS.iter().filter_map(|p| l.find(p)).min().map(|at| format!("{}\n", &l[at..]))).collect()
}

/// Waits at most `limit` for a child; (success, stderr). Panics (killing it) after `limit`.
fn wait(c: &mut Reaped, limit: Duration, what: &str) -> (bool, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = c.0.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(c.0.stderr.as_mut().unwrap(), &mut err).unwrap();
            return (status.success(), err);
        }
        assert!(start.elapsed() < limit, "{what} still running after {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts `n` ranks running the ignored test `rank_test` of this binary.
fn start(n: usize, rank_test: &str, timeout_s: &str, threads: usize) -> Vec<Reaped> {
    start_with(n, rank_test, timeout_s, threads, None)
}

/// [`start`], with `SUCL_GRAPH_DUMP` set to `dump` if given.
fn start_with(n: usize, rank_test: &str, timeout_s: &str, threads: usize, dump: Option<&std::path::Path>) -> Vec<Reaped> {
    start_env(n, rank_test, timeout_s, threads, dump, None)
}

/// [`start_with`], with `SUCL_GRAPH_CPD` set to `cpd` if given.
fn start_env(n: usize, rank_test: &str, timeout_s: &str, threads: usize, dump: Option<&std::path::Path>, cpd: Option<&str>) -> Vec<Reaped> {
    let port = sucl_runtime::unused_loopback_port().expect("a free port for the store");
    let ranks: Vec<Reaped> = (0..n)
        .map(|r| {
            let mut cmd = Command::new(std::env::current_exe().unwrap());
            cmd.args([rank_test, "--exact", "--ignored", "--nocapture", "--test-threads=1"]);
            if n > 1 {
                cmd.env("RANK", r.to_string())
                    .env("WORLD_SIZE", n.to_string())
                    .env("LOCAL_RANK", r.to_string())
                    .env("LOCAL_WORLD_SIZE", n.to_string())
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", port.to_string());
            }
            match dump {
                Some(d) => cmd.env("SUCL_GRAPH_DUMP", d),
                None => cmd.env_remove("SUCL_GRAPH_DUMP"),
            };
            match cpd {
                Some(v) => cmd.env("SUCL_GRAPH_CPD", v),
                None => cmd.env_remove("SUCL_GRAPH_CPD"),
            };
            cmd.env("SUCL_TIMEOUT", timeout_s)
                .env("SUCL_GRAPH_THREADS", threads.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            Reaped(cmd.spawn().expect("start a rank (this test binary again)"))
        })
        .collect();
    ranks
}

#[test]
fn programs_give_identical_results_on_1_to_4_ranks() {
    let one = run(1, 1);
    assert_eq!(one.lines().count(), program::PROGRAMS.len(), "every program prints: {one}");
    assert!(one.contains("transpose: 0.0 10.0 20.0 30.0 40.0 50.0 1.0 11.0"), "{one}");
    assert_eq!(run(1, 3), one, "1 rank, 3 threads against 1 thread");
    for n in 2..=4 {
        assert_eq!(run(n, 2), one, "{n} ranks against 1");
    }
}

#[test]
fn collective_discovery_on_and_off_give_identical_results_on_1_to_4_ranks() {
    let reference = run_cpd(1, 1, Some("0"));
    assert_eq!(reference.lines().count(), program::PROGRAMS.len(), "every program prints: {reference}");
    for n in 1..=4 {
        assert_eq!(run_cpd(n, 1, Some("0")), reference, "{n} ranks without discovery");
        assert_eq!(run_cpd(n, 1, Some("1")), reference, "{n} ranks with discovery");
    }
}

/// A rank of the divergent-program test: rank 2 writes a buffer with a task of another range
/// (no transfer depends on it, so nothing waits for data that never comes).
#[test]
#[ignore = "a rank of divergent_programs_are_a_mismatch_at_sync, started by it"]
fn divergent_program_rank() {
    use sucl_graph::{mappers::*, DistrQueue, GraphError};
    let comm = sucl_runtime::init().unwrap();
    let mut q = DistrQueue::new(&comm).unwrap();
    let a = q.buffer::<f64, 1>([12]).unwrap();
    let range = if comm.rank() == 2 { 6 } else { 12 };
    q.submit(|cgh| {
        cgh.discard_write(&a, one_to_one());
        cgh.parallel_for([range], |_, _| {})
    })
    .unwrap();
    match q.sync() {
        Err(GraphError::ProgramMismatch { ranks, .. }) => eprintln!("PROGRAM-MISMATCH {ranks:?}"),
        other => eprintln!("NO-MISMATCH {other:?}"),
    }
}

/// A rank of the divergent-transfer test: rank 0 reads all of `a` (it awaits rank 1's half),
/// rank 1 reads only its own half, so its graph pushes nothing.
#[test]
#[ignore = "a rank of a_divergent_program_that_waits_for_data_names_the_task, started by it"]
fn divergent_transfer_rank() {
    use sucl_graph::{mappers::*, DistrQueue};
    let comm = sucl_runtime::init().unwrap();
    let mut q = DistrQueue::new(&comm).unwrap();
    let a = q.buffer::<f64, 1>([8]).unwrap();
    q.submit(|cgh| {
        cgh.name("fill");
        cgh.discard_write(&a, one_to_one());
        cgh.parallel_for([8], |_, _| {})
    })
    .unwrap();
    let mapper = if comm.rank() == 0 { all() } else { one_to_one() };
    let r = q
        .submit(|cgh| {
            cgh.name("use");
            cgh.read(&a, mapper);
            cgh.parallel_for([8], |_, _| {})
        })
        .and_then(|_| q.sync());
    eprintln!("RESULT rank {}: {r:?}", comm.rank());
    eprintln!("ERROR rank {}: {}", comm.rank(), r.map_or_else(|e| e.to_string(), |_| "none".into()));
}

#[test]
fn a_divergent_program_that_waits_for_data_names_the_task() {
    // With discovery rank 0 expects an all-gather (rank 1's sync meets it: a mismatch at
    // once); without, an await-push that never comes (a timeout).
    for (cpd, cause) in [("1", "disagree"), ("0", "timed out")] {
        let mut ranks = start_env(2, "divergent_transfer_rank", "3", 1, None, Some(cpd));
        let (_, zero) = wait(&mut ranks[0], Duration::from_secs(60), "rank 0");
        let (_, one) = wait(&mut ranks[1], Duration::from_secs(60), "rank 1");
        let named = zero.contains("ERROR rank 0: rank 0: the transfers of task 1 ('use') failed");
        assert!(
            named && zero.contains(cause) && zero.contains("submitted different programs"),
            "cpd {cpd}: rank 0 must name the task, {cause:?} and the likely cause: {zero}"
        );
        assert!(
            one.contains("ERROR rank 1:") && !one.contains("ERROR rank 1: none"),
            "cpd {cpd}: rank 1 must end with an error too: {one}"
        );
    }
}

#[test]
fn divergent_programs_are_a_mismatch_at_sync() {
    let mut ranks = start(3, "divergent_program_rank", "20", 1);
    for (r, c) in ranks.iter_mut().enumerate() {
        let (ok, out) = wait(c, Duration::from_secs(60), &format!("rank {r}"));
        assert!(ok && out.contains("PROGRAM-MISMATCH [2]"), "rank {r} must name rank 2: {out}");
    }
}

#[test]
fn a_lost_rank_is_an_error_not_a_hang() {
    let mut ranks = start(2, "lost_peer_rank", "3", 1);
    let (_, _) = wait(&mut ranks[1], Duration::from_secs(30), "rank 1");
    let (ok, err) = wait(&mut ranks[0], Duration::from_secs(30), "rank 0 after losing rank 1");
    assert!(!ok && err.contains("LOST-PEER-ERROR"), "rank 0 must fail with an error: {err}");
}

#[test]
fn sucl_graph_dump_writes_every_ranks_graph_from_a_running_program() {
    let dir = std::env::temp_dir().join(format!("sucl-graph-exec-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut ranks = start_with(2, "graph_programs_rank", "20", 1, Some(&dir));
    for (r, c) in ranks.iter_mut().enumerate() {
        let (ok, err) = wait(c, Duration::from_secs(60), &format!("rank {r}"));
        assert!(ok, "rank {r} failed: {err}");
    }
    let read = |r: usize| -> serde_json::Value {
        let text = std::fs::read_to_string(dir.join(format!("rank-{r}.json"))).unwrap_or_else(|e| panic!("rank {r}'s dump: {e}"));
        serde_json::from_str(&text).unwrap()
    };
    let (zero, one) = (read(0), read(1));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(zero["tasks"], one["tasks"], "every rank builds the same task graph");
    assert_eq!(zero["tasks"][0]["name"], "task0");
    for (r, v) in [(0, &zero), (1, &one)] {
        let cmds = v["command_graphs"][0]["commands"].as_array().unwrap();
        assert_eq!(v["command_graphs"][0]["rank"], r);
        let peer = 1 - r;
        assert!(cmds.iter().any(|c| c["kind"] == "push" && c["targets"][0]["rank"] == peer), "rank {r} pushes to {peer}");
        assert!(cmds.iter().any(|c| c["kind"] == "await_push" && c["sources"][0]["rank"] == peer), "rank {r} awaits {peer}");
        // The Table 3 programs ran as collectives (discovery is on by default).
        for op in ["all_gather", "gather", "scatter", "broadcast", "all_to_all"] {
            assert!(cmds.iter().any(|c| c["kind"] == "collective" && c["collective"] == op), "rank {r} ran a {op}");
        }
    }
}

/// The side of the matrix of [`square_and_write_rank`].
const SQ: usize = 5;

/// The matrix's cells as first written.
fn square_input(i: usize, j: usize) -> f64 {
    ((i * SQ + j) % 7) as f64 - 2.0
}

/// A rank of the square-and-write test. A master task changes one cell of A through a `write`
/// accessor mapped to all of A (a consumer, as in Celerity: the cells it leaves alone keep
/// their values, so rank 0 first receives the other ranks' rows); then B = A·A reads A through
/// two accessors at once (rows by `slice(1)`, columns by `slice(0)`), and the master rank
/// reads B's first and last rows through two more. Rank 0 prints what it read, then B.
#[test]
#[ignore = "a rank of square_and_write_give_the_sequential_result_on_1_to_3_ranks, started by it"]
fn square_and_write_rank() {
    use sucl_graph::{mappers::*, DistrQueue};
    let comm = sucl_runtime::init().unwrap();
    let mut q = DistrQueue::new(&comm).unwrap();
    let a = q.buffer::<f64, 2>([SQ, SQ]).unwrap();
    let b = q.buffer::<f64, 2>([SQ, SQ]).unwrap();
    q.submit(|cgh| {
        let a = cgh.discard_write(&a, one_to_one());
        cgh.parallel_for([SQ, SQ], move |c, k| {
            let mut a = k.write(&a);
            for i in c.offset[0]..c.offset[0] + c.range[0] {
                for j in c.offset[1]..c.offset[1] + c.range[1] {
                    a.set([i, j], square_input(i, j));
                }
            }
        })
    })
    .unwrap();
    q.submit(|cgh| {
        let w = cgh.write(&a, all());
        cgh.master_task([1], move |_, k| k.write(&w).set([0, 0], 100.0))
    })
    .unwrap();
    q.submit(|cgh| {
        let rows = cgh.read(&a, slice(1));
        let cols = cgh.read(&a, slice(0));
        let b = cgh.discard_write(&b, one_to_one());
        cgh.parallel_for([SQ, SQ], move |c, k| {
            let (rows, cols, mut b) = (k.read(&rows), k.read(&cols), k.write(&b));
            for i in c.offset[0]..c.offset[0] + c.range[0] {
                for j in c.offset[1]..c.offset[1] + c.range[1] {
                    b.set([i, j], (0..SQ).map(|l| rows.get([i, l]) * cols.get([l, j])).sum());
                }
            }
        })
    })
    .unwrap();
    // Two disjoint rows of B read by the master rank through two accessors: a gather each
    // (with discovery), run one after the other.
    q.submit(|cgh| {
        let first = cgh.read(&b, fixed(&[0, 0], &[1, SQ]));
        let last = cgh.read(&b, fixed(&[SQ - 1, 0], &[SQ, SQ]));
        cgh.master_task([1], move |_, k| {
            let (first, last) = (k.read(&first), k.read(&last));
            let ends: Vec<f64> = (0..SQ).map(|j| first.get([0, j]) - last.get([SQ - 1, j])).collect();
            println!("ENDS {ends:?}");
        })
    })
    .unwrap();
    let b = q.fence_all(&b).unwrap();
    if comm.rank() == 0 {
        println!("SQUARE {b:?}");
    }
}

/// A·A of the matrix with cell [0, 0] set to 100, computed here in the kernel's order.
fn square_expected() -> String {
    let a = |i: usize, j: usize| if (i, j) == (0, 0) { 100.0 } else { square_input(i, j) };
    let b: Vec<f64> = (0..SQ * SQ).map(|x| (0..SQ).map(|l| a(x / SQ, l) * a(l, x % SQ)).sum()).collect();
    let ends: Vec<f64> = (0..SQ).map(|j| b[j] - b[(SQ - 1) * SQ + j]).collect();
    format!("ENDS {ends:?}\nSQUARE {b:?}")
}

#[test]
fn square_and_write_give_the_sequential_result_on_1_to_3_ranks() {
    let want = square_expected();
    for n in 1..=3 {
        for cpd in ["0", "1"] {
            let mut ranks = start_env(n, "square_and_write_rank", "20", 1, None, Some(cpd));
            for (r, c) in ranks.iter_mut().enumerate() {
                let (ok, err) = wait(c, Duration::from_secs(60), &format!("{n} ranks: rank {r}"));
                assert!(ok, "{n} ranks, discovery {cpd}: rank {r} failed: {err}");
            }
            let mut out = String::new();
            std::io::Read::read_to_string(ranks[0].0.stdout.as_mut().unwrap(), &mut out).unwrap();
            let lines: Vec<&str> =
                out.lines().filter_map(|l| ["ENDS", "SQUARE"].iter().filter_map(|p| l.find(p)).min().map(|at| &l[at..])).collect();
            assert_eq!(lines.join("\n"), want, "{n} ranks, discovery {cpd}");
        }
    }
}
