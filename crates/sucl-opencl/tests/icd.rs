//! The ICD under real programs: `tests/c/cltest.c`, compiled with the system C compiler
//! against Debian's ICD loader (`-lOpenCL`), run against `sucld` daemons on loopback that
//! serve PoCL's CPU device (TLS and a token on every link). Each test spawns its daemons
//! (killed and reaped on drop) and checks the program's exit status; the program checks its
//! results against references it computes on the host.
//!
//! Needs `sucld` and `libsucl_opencl.so` built (`cargo build -p sucl-remote --bin sucld -p
//! sucl-opencl`), a C compiler, ocl-icd and PoCL (`scripts/ci-opencl.sh` sees to all of it
//! and sets `SUCL_OPENCL_TESTS_REQUIRED=1`). Without a local OpenCL device the tests say so
//! and do nothing, unless `SUCL_OPENCL_TESTS_REQUIRED` is set: then they fail.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The build directory (`target/debug`) holding `sucld` and the ICD library.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent().and_then(Path::parent).expect("target/<profile>/deps/..").to_path_buf()
}

fn sucld() -> PathBuf {
    let p = target_dir().join("sucld");
    assert!(p.exists(), "{} is missing: cargo build -p sucl-remote --bin sucld", p.display());
    p
}

/// The ICD library: the one `cargo test` just built (in `deps/`; cargo copies it up only on
/// `cargo build`), or the built one if newer.
fn icd_library() -> PathBuf {
    let candidates = [target_dir().join("deps/libsucl_opencl.so"), target_dir().join("libsucl_opencl.so")];
    let newest = candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p.clone())))
        .max_by_key(|(t, _)| *t)
        .map(|(_, p)| p);
    newest.unwrap_or_else(|| panic!("libsucl_opencl.so is missing: cargo build -p sucl-opencl"))
}

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("sucl-opencl-{tag}-{}-{:?}", std::process::id(), Instant::now()));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The compiled C scenarios (built once per test binary).
fn cltest() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let out = target_dir().join("sucl-opencl-cltest");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/cltest.c");
        let st = Command::new("cc").args(["-O1", "-o"]).arg(&out).arg(&src).args(["-lOpenCL", "-lm"]).status().expect("running cc");
        assert!(st.success(), "compiling {} failed", src.display());
        out
    })
}

/// A `sucld` serving the local OpenCL platform, killed and reaped on drop.
struct Daemon {
    child: Child,
    address: String,
    pin: String,
}

impl Daemon {
    /// `pocl_devices`: PoCL's `POCL_DEVICES` (how many CPU devices the daemon serves).
    fn start(token: &Path, extra: &[&str], pocl_devices: &str) -> Daemon {
        let mut child = Command::new(sucld())
            .args(["--listen", "127.0.0.1:0", "--opencl", "--host-devices", "0", "--tls-ephemeral", "--print-address", "--token-file"])
            .arg(token)
            .args(extra)
            .env_remove("OCL_ICD_VENDORS")
            .env("POCL_MAX_PTHREAD_COUNT", "2")
            .env("POCL_DEVICES", pocl_devices)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting sucld");
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let mut next = |prefix: &str| -> String {
            let line = lines.next().and_then(Result::ok).unwrap_or_default();
            line.strip_prefix(prefix).unwrap_or_else(|| panic!("sucld said {line:?}, expected {prefix:?}")).to_string()
        };
        let address = next("listening on ");
        let pin = next("tls pin ");
        Daemon { child, address, pin }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Daemons, a token, and the environment a client program needs to see them.
struct Cluster {
    dir: TempDir,
    daemons: Vec<Daemon>,
}

impl Cluster {
    fn new(n: usize) -> Option<Cluster> {
        Cluster::with_args(n, &[])
    }

    /// `n` daemons started with the extra options `extra`, each serving one PoCL CPU device.
    fn with_args(n: usize, extra: &[&str]) -> Option<Cluster> {
        Cluster::start(n, extra, "pthread")
    }

    /// `n` daemons started with the extra options `extra`, PoCL serving `pocl_devices`.
    fn start(n: usize, extra: &[&str], pocl_devices: &str) -> Option<Cluster> {
        if !has_opencl() {
            return None;
        }
        let dir = TempDir::new("cluster");
        let token = dir.0.join("token");
        let st = Command::new(sucld()).arg("--gen-token").arg(&token).stdout(Stdio::null()).status().expect("sucld --gen-token");
        assert!(st.success());
        let daemons = (0..n).map(|_| Daemon::start(&token, extra, pocl_devices)).collect();
        Some(Cluster { dir, daemons })
    }

    fn command(&self, scenario: &str) -> Command {
        let mut c = Command::new(cltest());
        c.arg(scenario)
            .env("OCL_ICD_VENDORS", icd_library())
            .env("SUCL_REMOTE", self.daemons.iter().map(|d| d.address.as_str()).collect::<Vec<_>>().join(","))
            .env("SUCL_REMOTE_TLS_PIN", self.daemons.iter().map(|d| d.pin.as_str()).collect::<Vec<_>>().join(","))
            .env("SUCL_REMOTE_TOKEN_FILE", self.dir.0.join("token"))
            .env("SUCL_OPENCL_TIMEOUT", "20")
            .env_remove("SUCL_REMOTE_TOKEN")
            .env_remove("SUCL_CONFIG");
        c
    }

    /// Runs a scenario to its end (bounded) and returns its output.
    fn run(&self, scenario: &str) -> Output {
        run_bounded(self.command(scenario), Duration::from_secs(120))
    }
}

/// Runs `c`, killing it after `limit`.
fn run_bounded(mut c: Command, limit: Duration) -> Output {
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawning cltest");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("waiting").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("collecting output")
}

/// Whether this machine has an OpenCL device for sucld to serve.
fn has_opencl() -> bool {
    let ok = Command::new("clinfo").arg("-l").env_remove("OCL_ICD_VENDORS").output().is_ok_and(|o| {
        let s = String::from_utf8_lossy(&o.stdout).into_owned();
        s.contains("Device")
    });
    if !ok {
        assert!(
            std::env::var_os("SUCL_OPENCL_TESTS_REQUIRED").is_none(),
            "no local OpenCL device (install pocl-opencl-icd and clinfo; scripts/ci-opencl.sh does)"
        );
        eprintln!("no local OpenCL device: the OpenCL ICD tests did nothing (scripts/ci-opencl.sh runs them)");
    }
    ok
}

fn assert_ran(o: &Output, scenario: &str) {
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "scenario {scenario} failed ({}):\n{out}\n{err}", o.status);
    assert!(out.contains("ok"), "scenario {scenario} said nothing: {out}");
}

fn scenario(name: &str, daemons: usize) {
    let Some(c) = Cluster::new(daemons) else { return };
    let o = c.run(name);
    assert_ran(&o, name);
}

#[test]
fn platform_and_device_queries() {
    let Some(c) = Cluster::new(1) else { return };
    let o = c.run("info");
    assert!(o.status.success(), "{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    // clinfo, an unmodified program, lists the platform and its device.
    let clinfo = c.command("");
    let mut cl = Command::new("clinfo");
    cl.arg("-l");
    for (k, v) in clinfo.get_envs() {
        match v {
            Some(v) => cl.env(k, v),
            None => cl.env_remove(k),
        };
    }
    let o = run_bounded(cl, Duration::from_secs(60));
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("Platform #0: sucl") && s.contains("Device #0"), "clinfo -l said: {s}");
}

#[test]
fn vector_add() {
    scenario("vadd", 1);
}

#[test]
fn ndranges_in_two_and_three_dimensions_with_offsets_and_local_memory() {
    scenario("ndrange", 1);
}

#[test]
fn buffer_operations_rect_fill_map_and_sub_buffers() {
    scenario("buffers", 1);
}

#[test]
fn events_user_events_callbacks_profiling_and_an_out_of_order_queue() {
    scenario("events", 1);
}

#[test]
fn a_kernel_released_while_its_launch_is_held_still_runs() {
    scenario("held_release", 1);
}

#[test]
fn a_failing_build_returns_its_log() {
    scenario("build_fail", 1);
}

#[test]
fn separate_compilation_and_linking_with_headers_libraries_and_failures() {
    scenario("compile_link", 1);
}

#[test]
fn device_memory_sizes_are_those_the_daemons_session_limit_allows() {
    let limit = (48u64 << 20).to_string();
    let Some(c) = Cluster::with_args(1, &["--max-session-bytes", &limit]) else { return };
    let mut cmd = c.command("mem_limit");
    cmd.arg(&limit);
    let o = run_bounded(cmd, Duration::from_secs(120));
    assert_ran(&o, "mem_limit");
}

#[test]
fn copy_rect_overlap_follows_the_specifications_test() {
    scenario("copy_rect_overlap", 1);
}

#[test]
fn bad_input_gets_the_specifications_codes() {
    scenario("bad_input", 1);
}

#[test]
fn a_context_over_two_daemons_migrates_buffers_between_them() {
    scenario("multi", 2);
}

#[test]
fn reads_and_migrations_wait_for_the_kernel_that_wrote_the_buffer() {
    scenario("overlap", 2);
}

#[test]
fn a_wait_on_another_daemon_waits_for_this_event_not_an_earlier_one() {
    scenario("events_again", 2);
}

#[test]
fn a_command_waits_for_an_event_of_another_device_of_the_same_daemon() {
    let Some(c) = Cluster::start(1, &[], "pthread pthread") else { return };
    let o = c.run("same_daemon");
    assert_ran(&o, "same_daemon");
}

#[test]
fn a_wrong_token_offers_no_platform() {
    let Some(c) = Cluster::new(1) else { return };
    let mut cmd = c.command("no_platform");
    let wrong = c.dir.0.join("wrong");
    std::fs::write(&wrong, "11".repeat(32)).expect("token file");
    cmd.env("SUCL_REMOTE_TOKEN_FILE", &wrong).env("SUCL_OPENCL_QUIET", "1");
    let o = run_bounded(cmd, Duration::from_secs(60));
    assert_ran(&o, "no_platform");
}

#[test]
fn a_daemon_killed_mid_command_fails_the_event_and_clfinish() {
    let Some(mut c) = Cluster::new(1) else { return };
    let mut cmd = c.command("kill");
    cmd.env("SUCL_OPENCL_TIMEOUT", "3");
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("cltest");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("line");
        seen.push(line.clone());
        if line == "READY" {
            break;
        }
    }
    assert_eq!(seen.last().map(String::as_str), Some("READY"), "the program never got going: {seen:?}");
    std::thread::sleep(Duration::from_millis(300));
    c.daemons[0].kill();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    while child.try_wait().expect("waiting").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("clFinish did not return within 30 s of the daemon's death");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    seen.extend(lines.map_while(Result::ok));
    let st = child.wait().expect("status");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    assert!(st.success(), "{seen:?}\n{err}");
    assert!(seen.iter().any(|l| l == "kill ok"), "{seen:?}");
}
