//! The drop-in's forwarding, against a stand-in library (tests/c/fake_nccl.c, compiled here with
//! the system C compiler; not NCCL) loaded through SUCL_NCCL_REAL_PATH, driven by a C program
//! (tests/c/driver.c) linked against the drop-in as a program built for NCCL would be.
// The drop-in is built for x86-64 Linux only (its forwarding trampolines are x86-64 code).
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The drop-in cargo built for this test run: beside the test executable (target/*/deps).
fn shim_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent().expect("deps dir").join("libnccl.so")
}

fn cc(args: &[&str]) {
    let out = Command::new("cc").args(args).output().expect("running the C compiler (cc)");
    assert!(out.status.success(), "cc {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

struct Built {
    dir: tempdir::Dir,
}

mod tempdir {
    /// A scratch directory removed on drop (also when a test fails).
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new(tag: &str) -> Dir {
            let p = std::env::temp_dir().join(format!("sucl-nccl-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("scratch dir");
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Compiles the stand-in library and the driver (linked against the drop-in).
fn build(tag: &str) -> Built {
    let dir = tempdir::Dir::new(tag);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
    let d = dir.0.to_str().unwrap();
    // The drop-in under its SONAME, as a program finds it.
    let shim = shim_path();
    assert!(shim.exists(), "{} not built", shim.display());
    std::fs::copy(&shim, dir.0.join("libnccl.so.2")).expect("copying the drop-in");
    cc(&["-shared", "-fPIC", "-o", &format!("{d}/libfake_nccl.so"), src.join("fake_nccl.c").to_str().unwrap()]);
    cc(&["-o", &format!("{d}/driver"), src.join("driver.c").to_str().unwrap(), &format!("{d}/libnccl.so.2"), &format!("-Wl,-rpath,{d}")]);
    Built { dir }
}

/// Runs the driver with `env`; returns (stdout, the stand-in's call log, exit status).
fn run(b: &Built, env: &[(&str, String)]) -> (String, String, std::process::ExitStatus) {
    let log = b.dir.0.join("calls.log");
    let _ = std::fs::remove_file(&log);
    let mut cmd = Command::new(b.dir.0.join("driver"));
    cmd.env_remove("SUCL_NCCL_REAL_PATH").env("FAKE_NCCL_LOG", &log).env("LD_LIBRARY_PATH", "");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("running the driver");
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    (String::from_utf8_lossy(&out.stdout).into_owned(), calls, out.status)
}

fn line<'a>(out: &'a str, what: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(what).and_then(|r| r.strip_prefix(" = ")))
        .unwrap_or_else(|| panic!("no `{what} = ` line in:\n{out}"))
}

#[test]
fn calls_are_forwarded_to_the_real_library_and_missing_functions_return_errors() {
    let b = build("fwd");
    let fake = b.dir.0.join("libfake_nccl.so").to_str().unwrap().to_string();
    let (out, calls, status) = run(&b, &[("SUCL_NCCL_REAL_PATH", fake.clone())]);
    assert!(status.success(), "driver failed: {status}\n{out}");
    // The real library's version, not the drop-in's.
    assert_eq!(line(&out, "GetVersion"), "0 22809");
    // The 128-byte id passes by value intact: sum of (i * 7) mod 256 over 0..128.
    let idsum: u32 = (0..128u32).map(|i| (i * 7) % 256).sum();
    assert!(calls.contains(&format!("CommInitRank n=1 rank=0 idsum={idsum}")), "{calls}");
    assert_eq!(line(&out, "CommInitRank"), "0 0xc0ffee");
    // The own all_reduce forwards what it does not serve, arguments untouched; the alias too.
    assert!(calls.contains("AllReduce 0x10 0x20 12345 7 0 0xc0ffee 0x30"), "{calls}");
    assert!(calls.contains("AllReduce 0x11 0x21 99 9 4 0xc0ffee 0x31"), "{calls}");
    // Trampolines pass register arguments, and the real code comes back.
    assert!(calls.contains("Broadcast 0x12 0x22 7 2 1 0xc0ffee 0x32"), "{calls}");
    assert_eq!(line(&out, "Broadcast"), "4");
    // Eleven arguments: five on the stack.
    assert!(calls.contains("PutSignal 0x13 8 7 1 0x40 16 2 3 4 0xc0ffee 0x33"), "{calls}");
    assert_eq!(line(&out, "Group"), "0 0");
    assert!(calls.contains("GroupStart\nGroupEnd"), "{calls}");
    // A struct returned in registers.
    assert_eq!(line(&out, "TeamWorld"), "5 3 1");
    assert_eq!(line(&out, "GetErrorString"), "fake error string");
    // Functions the stand-in lacks: an error code (ncclInvalidUsage) and a message naming
    // them, never a crash; own (CommRevoke) and forwarded (CommSuspend) alike.
    assert_eq!(line(&out, "CommRevoke"), "5");
    let e = line(&out, "LastError after CommRevoke");
    assert!(e.contains("ncclCommRevoke is not in the real NCCL 2.28.9") && e.contains(&fake), "{e}");
    assert_eq!(line(&out, "CommSuspend"), "5");
    assert!(line(&out, "LastError after CommSuspend").contains("ncclCommSuspend"), "{out}");
    // A later error of the real library (a forwarded call): its text, not the shim's older one.
    assert_eq!(line(&out, "LastError after a real error"), "fake: broadcast 2 failed");
    assert_eq!(line(&out, "TeamLsa"), "0 0 0");
    assert_eq!(line(&out, "LLA2ACalcSlots"), "-1");
    assert!(calls.contains("CommDestroy 0xc0ffee"), "{calls}");
    assert_eq!(line(&out, "CommDestroy"), "0");
    // One rank: no peer-memory setup was tried beyond asking the size.
    assert!(calls.contains("CommCount 0xc0ffee") && !calls.contains("CommCuDevice"), "{calls}");
    assert!(out.ends_with("done\n"), "{out}");
}

#[test]
fn without_a_real_library_every_call_fails_cleanly() {
    let b = build("none");
    for (path, says) in [
        ("/nonexistent/libnccl.so.2".to_string(), "cannot load the real NCCL"),
        ("libnccl.so.2".to_string(), "want an absolute path"),
        (b.dir.0.join("libnccl.so.2").to_str().unwrap().to_string(), "is this drop-in library itself"),
    ] {
        let (out, calls, status) = run(&b, &[("SUCL_NCCL_REAL_PATH", path.clone())]);
        assert!(status.success(), "{path}: driver failed: {status}\n{out}");
        assert!(calls.is_empty(), "{calls}");
        // ncclSystemError from every forwarded and own function; the text says why.
        assert_eq!(line(&out, "GetVersion"), "2 -1", "{path}");
        assert_eq!(line(&out, "CommInitRank"), "2 (nil)", "{path}");
        assert_eq!(line(&out, "AllReduce"), "2");
        assert_eq!(line(&out, "Broadcast"), "2");
        let e = line(&out, "LastError after CommRevoke");
        assert!(e.contains(says), "{path}: {e}");
        assert!(line(&out, "GetErrorString").contains(says), "{out}");
        assert!(out.ends_with("done\n"), "{out}");
    }
}
