//! Failure behaviour on real processes: lost ranks, disagreeing ranks, stalled ranks, and the
//! launcher's teardown. Every wait here is bounded; a hang fails the test.

mod common;
use common::*;
use std::process::Command;
use std::time::Duration;

/// Starts `n` ranks directly (torchrun's environment, rank 0 hosting the store), no launcher.
fn torchrun_world(n: usize, backend: &str, args: &[&str], timeout_s: &str) -> Vec<Reaped> {
    let port = free_port().to_string();
    (0..n)
        .map(|r| {
            let mut cmd = sucl();
            cmd.arg("check")
                .args(args)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("SUCL_BACKEND", backend)
                .env("SUCL_TIMEOUT", timeout_s)
                .env("TORCHELASTIC_RUN_ID", format!("t{port}"));
            spawn(cmd)
        })
        .collect()
}

fn lost_rank_is_reported(backend: &str, victim: usize, how: &str) {
    let flag = if how == "kill" { "--inject-kill" } else { "--inject-exit" };
    let v = victim.to_string();
    let ranks = torchrun_world(3, backend, &["--ops", "all_reduce,all_gather", "--dtypes", "f32", flag, &v, "--inject-after", "6"], "30");
    for (r, c) in ranks.into_iter().enumerate() {
        let out = finish(c, Duration::from_secs(60), &format!("rank {r}"));
        assert!(!out.status.success(), "rank {r} should fail: {}", out.stderr);
        if r != victim {
            assert!(
                out.stderr.contains(&format!("lost peer rank {victim}")),
                "{backend}/{how}: rank {r} must name lost rank {victim}:\n{}",
                out.stderr
            );
            assert!(out.elapsed < Duration::from_secs(30), "rank {r} waited for its full timeout instead of failing fast");
        }
    }
}

#[test]
fn killed_rank_is_an_error_on_every_rank_shm() {
    lost_rank_is_reported("shm", 1, "kill");
}

#[test]
fn killed_rank_is_an_error_on_every_rank_tcp() {
    lost_rank_is_reported("tcp", 1, "kill");
}

#[test]
fn exiting_store_host_is_an_error_on_every_rank() {
    lost_rank_is_reported("tcp", 0, "exit");
    lost_rank_is_reported("shm", 0, "kill");
}

fn mismatch_is_reported(backend: &str) {
    let ranks = torchrun_world(3, backend, &["--ops", "barrier", "--dtypes", "f32", "--inject-mismatch", "2", "--inject-after", "2"], "30");
    for (r, c) in ranks.into_iter().enumerate() {
        let out = finish(c, Duration::from_secs(60), &format!("rank {r}"));
        assert!(!out.status.success(), "rank {r}");
        assert!(out.stderr.contains("disagree"), "{backend}: rank {r} should report the disagreement:\n{}", out.stderr);
        assert!(!out.stderr.contains("was not detected"), "{}", out.stderr);
    }
}

#[test]
fn disagreeing_counts_are_an_error_not_a_hang_shm() {
    mismatch_is_reported("shm");
}

#[test]
fn disagreeing_counts_are_an_error_not_a_hang_tcp() {
    mismatch_is_reported("tcp");
}

#[test]
fn stalled_rank_times_out_on_the_others() {
    for backend in ["shm", "tcp"] {
        let ranks =
            torchrun_world(2, backend, &["--ops", "all_reduce", "--dtypes", "u8", "--inject-stall", "1", "--inject-after", "4"], "1");
        let mut it = ranks.into_iter();
        let r0 = it.next().unwrap();
        let out = finish(r0, Duration::from_secs(60), "rank 0");
        assert!(!out.status.success());
        assert!(out.stderr.contains("timed out after"), "{backend}: {}", out.stderr);
        // Dropping the stalled rank kills and reaps it.
    }
}

#[test]
fn stalled_rank_times_out_in_a_small_shm_step() {
    // 3 ranks, 7-byte all_reduces: every step travels in the mailboxes (the inline step), and the
    // ranks that wait for the stalled one must time out there, naming it. (The check's 5
    // point-to-point steps come first; rank 2 stops before the all_reduce.)
    let ranks = torchrun_world(
        3,
        "shm",
        &["--ops", "all_reduce", "--dtypes", "u8", "--redops", "sum", "--sizes", "7", "--inject-stall", "2", "--inject-after", "6"],
        "1",
    );
    for (r, c) in ranks.into_iter().enumerate().take(2) {
        let out = finish(c, Duration::from_secs(60), &format!("rank {r}"));
        assert!(!out.status.success(), "rank {r}: {}", out.stderr);
        assert!(out.stderr.contains("waiting for rank 2 in shared memory"), "rank {r}: {}", out.stderr);
        assert!(out.stderr.contains("timed out after"), "rank {r}: {}", out.stderr);
    }
}

#[test]
fn launcher_ends_the_job_when_a_rank_fails_and_leaves_nothing_behind() {
    let mut cmd = sucl();
    cmd.args([
        "run",
        "-n",
        "3",
        "--",
        env!("CARGO_BIN_EXE_sucl"),
        "check",
        "--ops",
        "all_reduce",
        "--inject-exit",
        "1",
        "--inject-after",
        "10",
    ])
    .env("SUCL_TIMEOUT", "60");
    let launcher = spawn(cmd);
    let pid = launcher.0.id();
    let out = finish(launcher, Duration::from_secs(60), "launcher");
    assert!(!out.status.success());
    assert!(out.stderr.contains("rank 1 exited with code 3"), "{}", out.stderr);
    assert_eq!(out.status.code(), Some(3), "the root cause's exit code: {}", out.stderr);
    assert!(out.elapsed < Duration::from_secs(30), "teardown took {:?}", out.elapsed);
    let marker = format!("SUCL_JOB_ID=j{pid}x");
    assert!(processes_with_env(&marker).is_empty(), "ranks left running: {:?}", processes_with_env(&marker));
    let seg = sucl::shm_prefix(&format!("j{pid}x"));
    assert!(segments_with_prefix(&seg).is_empty(), "segments left: {:?}", segments_with_prefix(&seg));
}

#[test]
fn launcher_kills_a_hung_rank_when_another_fails() {
    let mut cmd = sucl();
    cmd.args(["run", "-n", "2", "--grace", "0.5", "--", "sh", "-c", "if [ \"$SUCL_RANK\" = 1 ]; then exit 7; else sleep 300; fi"]);
    let launcher = spawn(cmd);
    let pid = launcher.0.id();
    let out = finish(launcher, Duration::from_secs(30), "launcher");
    assert_eq!(out.status.code(), Some(7), "{}", out.stderr);
    assert!(processes_with_env(&format!("SUCL_JOB_ID=j{pid}x")).is_empty());
}

#[test]
fn launcher_forwards_sigterm_and_prefixes_output() {
    let mut cmd = sucl();
    cmd.args(["run", "-n", "2", "--", "sh", "-c", "echo hello from $SUCL_RANK of $SUCL_WORLD_SIZE; exec sleep 300"]);
    let launcher = spawn(cmd);
    let pid = launcher.0.id();
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) has no memory preconditions; `pid` is our child, not yet reaped, so it
    // cannot name another process.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let out = finish(launcher, Duration::from_secs(30), "launcher");
    assert!(!out.status.success());
    assert!(out.stdout.contains("[0] hello from 0 of 2") && out.stdout.contains("[1] hello from 1 of 2"), "{}", out.stdout);
    assert!(processes_with_env(&format!("SUCL_JOB_ID=j{pid}x")).is_empty());
}

#[test]
fn launcher_reports_a_missing_program() {
    let out = Command::new(env!("CARGO_BIN_EXE_sucl")).args(["run", "-n", "2", "--", "/nonexistent/program"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot start rank 0"));
}

#[test]
fn bench_rejects_bad_options_before_starting() {
    for args in [
        &["bench", "all_reduce", "--max-bytes", "12Q"][..],
        &["bench", "teleport"],
        &["bench", "all_reduce", "--dtype", "f128"],
        &["bench", "all_reduce", "--min-bytes", "1M", "--max-bytes", "1K"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_sucl")).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty());
    }
}

#[test]
fn bench_json_has_the_documented_keys() {
    let out = Command::new(env!("CARGO_BIN_EXE_sucl"))
        .args(["bench", "all_reduce", "--ranks", "2", "--max-bytes", "1K", "--iters", "2", "--warmup", "1", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(lines.len(), 8, "8 B .. 1 KiB doubling: {text}");
    for l in lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        for k in ["op", "backend", "ranks", "bytes", "count", "dtype", "time_us", "algbw_gbps", "busbw_gbps", "wrong"] {
            assert!(v.get(k).is_some(), "missing {k} in {l}");
        }
        assert_eq!(v["wrong"], 0);
        assert_eq!(v["ranks"], 2);
    }
}

#[test]
fn launcher_binds_each_rank_to_its_own_block_of_cpus() {
    let allowed: Vec<usize> = {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")).unwrap().split(':').nth(1).unwrap().trim().to_string();
        parse_cpu_list(&line)
    };
    let mut cmd = sucl();
    cmd.args(["run", "-n", "2", "--", "sh", "-c", "grep Cpus_allowed_list /proc/self/status"]);
    let out = finish(spawn(cmd), Duration::from_secs(30), "launcher");
    assert!(out.status.success(), "{}", out.stderr);
    let sets: Vec<Vec<usize>> = (0..2)
        .map(|r| {
            let line = out.stdout.lines().find(|l| l.starts_with(&format!("[{r}]"))).unwrap_or_else(|| panic!("{}", out.stdout));
            parse_cpu_list(line.split(':').nth(1).unwrap().trim())
        })
        .collect();
    if allowed.len() < 2 {
        eprintln!("one CPU allowed: ranks are not bound");
        return;
    }
    let per = allowed.len() / 2;
    assert_eq!(sets[0], allowed[..per].to_vec(), "{}", out.stdout);
    assert_eq!(sets[1], allowed[per..2 * per].to_vec(), "{}", out.stdout);
}

/// "0-3,8,10-11" → [0, 1, 2, 3, 8, 10, 11].
fn parse_cpu_list(s: &str) -> Vec<usize> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .flat_map(|p| match p.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().unwrap()..=b.parse().unwrap()).collect::<Vec<_>>(),
            None => vec![p.parse().unwrap()],
        })
        .collect()
}
