//! One set of settings per communicator, and shared memory that is there when init says so:
//! ranks started with different algorithm/layout settings all use rank 0's (and say so), and a
//! segment that does not fit its filesystem is an init error on every rank, not a SIGBUS later.
//! Real processes, every wait bounded.

mod common;
use common::*;
use std::os::unix::process::ExitStatusExt;
use std::process::Command;
use std::time::Duration;

/// Starts `n` ranks directly (torchrun's environment, rank 0 hosting the store), rank `r`
/// with the extra variables `env(r)`, each running `sucl check` on a small matrix.
fn world(n: usize, backend: &str, env: &dyn Fn(usize) -> Vec<(&'static str, &'static str)>) -> Vec<Reaped> {
    let port = free_port().to_string();
    (0..n)
        .map(|r| {
            let mut cmd = sucl();
            cmd.args(["check", "--ops", "all_reduce,reduce,broadcast,all_gather,reduce_scatter,all_to_all"])
                .args(["--dtypes", "f32,u8", "--sizes", "0,1,7,1000,5000,70001"])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("TORCHELASTIC_RUN_ID", format!("settings{port}"))
                .env("SUCL_BACKEND", backend)
                .env("SUCL_TIMEOUT", "30")
                .env("RUST_LOG", "sucl_runtime=warn");
            for (k, v) in env(r) {
                cmd.env(k, v);
            }
            spawn(cmd)
        })
        .collect()
}

/// Rank 1 has different settings: every rank must finish with every result right, and rank 1
/// must say which of its values it replaced by rank 0's.
fn odd_rank_uses_rank_0s_settings(backend: &str, odd: Vec<(&'static str, &'static str)>, expected: &[&str]) {
    let ranks = world(3, backend, &|r| if r == 1 { odd.clone() } else { vec![] });
    for (r, c) in ranks.into_iter().enumerate() {
        let out = finish(c, Duration::from_secs(90), &format!("{backend} rank {r}"));
        assert!(out.status.success(), "{backend}: rank {r} failed ({:?}):\n{}\n{}", out.status, out.stdout, out.stderr);
        assert!(!out.stderr.contains("WRONG"), "{backend}: rank {r} got wrong results:\n{}", out.stderr);
        if r == 0 {
            assert!(out.stdout.contains(" 0 wrong"), "{backend}: no clean summary:\n{}", out.stdout);
        }
        if r == 1 {
            for e in expected {
                assert!(out.stderr.contains(e), "{backend}: rank 1 must say `{e}`:\n{}", out.stderr);
            }
        } else {
            assert!(!out.stderr.contains("differs from rank 0"), "{backend}: rank {r} had rank 0's settings:\n{}", out.stderr);
        }
    }
}

#[test]
fn shm_ranks_with_different_settings_use_rank_0s() {
    // Different inline/small thresholds take different algorithms (a hang or wrong data), and
    // different ring/arena sizes map different layouts (a SIGBUS), unless rank 0's win.
    odd_rank_uses_rank_0s_settings(
        "shm",
        vec![("SUCL_SHM_SMALL_BYTES", "0"), ("SUCL_SHM_RING_BYTES", "1M"), ("SUCL_SHM_ARENA_BYTES", "64K"), ("SUCL_SHM_CHUNK_BYTES", "8K")],
        &[
            "setting shm.small_bytes differs from rank 0's: using rank 0's 16384 instead of this rank's 0",
            "setting shm.ring_bytes differs from rank 0's: using rank 0's 524288 instead of this rank's 1048576",
            "setting shm.arena_bytes differs from rank 0's: using rank 0's 8388608 instead of this rank's 65536",
            "setting shm.chunk_bytes differs from rank 0's: using rank 0's 262144 instead of this rank's 8192",
        ],
    );
}

#[test]
fn tcp_ranks_with_different_settings_use_rank_0s() {
    odd_rank_uses_rank_0s_settings(
        "tcp",
        vec![("SUCL_TCP_SMALL_BYTES", "0"), ("SUCL_TCP_PIECE_BYTES", "1K")],
        &[
            "setting tcp.small_bytes differs from rank 0's: using rank 0's 65536 instead of this rank's 0",
            "setting tcp.piece_bytes differs from rank 0's: using rank 0's 262144 instead of this rank's 1024",
        ],
    );
}

/// Size in bytes of the filesystem holding `dir`.
fn filesystem_bytes(dir: &str) -> u64 {
    let out = Command::new("stat").args(["-f", "-c", "%b %S", dir]).output().expect("stat -f");
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = text.split_whitespace().map(|x| x.parse().expect("a number")).collect();
    v[0] * v[1]
}

/// `sucl check` on 2 ranks must fail at init on every rank, rank 0 naming the bytes needed and
/// free in `dir`, with an exit code (no signal: no SIGBUS), leaving no segment behind.
fn init_fails_for_want_of_space(launcher: Reaped, dir: &str) {
    let pid = launcher.0.id();
    let out = finish(launcher, Duration::from_secs(60), "sucl check");
    assert!(!out.status.success(), "init must fail:\n{}\n{}", out.stdout, out.stderr);
    assert_eq!(out.status.signal(), None, "killed by a signal: {:?}\n{}", out.status, out.stderr);
    assert!(!out.stderr.contains("SIGBUS") && !out.stderr.contains("signal 7"), "{}", out.stderr);
    assert!(out.stderr.contains("the shared-memory segment needs"), "rank 0 must name the bytes needed:\n{}", out.stderr);
    assert!(out.stderr.contains(&format!("but {dir} has only")) && out.stderr.contains("bytes free"), "{}", out.stderr);
    // Rank 1 says why, unless the launcher ended it first (it ends the job at rank 0's failure).
    assert!(
        out.stderr.contains("rank 0 could not set up the shared-memory segment") || out.stderr.contains("ending the other ranks"),
        "rank 1 must say why or be ended by the launcher:\n{}",
        out.stderr
    );
    let left: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&sucl::shm_prefix(&format!("j{pid}x"))))
        .collect();
    assert!(left.is_empty(), "segments left behind: {left:?}");
}

#[test]
fn segment_larger_than_its_filesystem_is_an_init_error() {
    // Always possible, unprivileged: ask for arenas larger than all of /dev/shm.
    let arena = filesystem_bytes("/dev/shm").to_string();
    let mut cmd = sucl();
    cmd.args(["check", "--ranks", "2", "--backend", "shm", "--ops", "all_reduce"])
        .env("SUCL_SHM_ARENA_BYTES", &arena)
        .env("SUCL_TIMEOUT", "30");
    init_fails_for_want_of_space(spawn(cmd), "/dev/shm");
}

#[test]
fn tiny_tmpfs_shm_dir_is_an_init_error() {
    // A 1 MiB tmpfs as SUCL_SHM_DIR, mounted in a private mount namespace (gone with the job).
    /// Removes the mount point when the test ends, passing or failing.
    struct RemoveDir(std::path::PathBuf);
    impl Drop for RemoveDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let dir = std::env::temp_dir().join(format!("sucl-tiny-shm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _remove = RemoveDir(dir.clone());
    let d = dir.to_string_lossy().into_owned();
    let probe = Command::new("unshare").args(["-m", "sh", "-c", &format!("mount -t tmpfs -o size=1m sucl-test {d}")]).output();
    let Some(true) = probe.as_ref().ok().map(|o| o.status.success()) else {
        println!("SKIPPED tiny_tmpfs_shm_dir_is_an_init_error: cannot mount a tmpfs here ({probe:?}); segment_larger_than_its_filesystem_is_an_init_error covers the reservation");
        return;
    };
    let mut cmd = Command::new("unshare");
    cmd.args([
        "-m",
        "sh",
        "-c",
        &format!("mount -t tmpfs -o size=1m sucl-test {d} && exec \"$0\" check --ranks 2 --backend shm --ops all_reduce"),
    ])
    .arg(env!("CARGO_BIN_EXE_sucl"))
    .env("SUCL_SHM_DIR", &d)
    .env("SUCL_TIMEOUT", "30");
    init_fails_for_want_of_space(spawn(cmd), &d);
}
