//! The drop-in's dynamic symbol table: exactly NCCL's exports (every `ncclX` of
//! api/nccl-api.txt and its `pncclX` alias), a superset of what PyTorch imports, and the SONAME
//! `libnccl.so.2`. Read with binutils (`nm`, `readelf`).
// The drop-in is built for x86-64 Linux only (its forwarding trampolines are x86-64 code).
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn shim_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent().expect("deps dir").join("libnccl.so")
}

fn tool(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("running {cmd} (binutils): {e}"));
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn api_file(name: &str) -> Vec<String> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("api").join(name);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split('|').next().unwrap().trim().to_string())
        .collect()
}

fn exports() -> BTreeSet<String> {
    let shim = shim_path();
    tool("nm", &["-D", "--defined-only", shim.to_str().unwrap()])
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect()
}

#[test]
fn exports_are_exactly_nccls_functions_and_their_profiling_aliases() {
    let table = api_file("nccl-api.txt");
    assert_eq!(table.len(), 83, "82 API functions of NCCL 2.30.7 and ncclResetDebugInitInternal");
    let mut want: BTreeSet<String> = BTreeSet::new();
    for n in &table {
        want.insert(n.clone());
        if n != "ncclResetDebugInitInternal" {
            want.insert(format!("p{n}"));
        }
    }
    let got = exports();
    assert_eq!(got.len(), 165, "NCCL 2.30.7 exports 165 functions");
    // NCCL 2.28.9 (torch 2.11's) exports 105: 52 API functions, their aliases and
    // ncclResetDebugInitInternal; the table's third column says which.
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("api/nccl-api.txt");
    let in_2_28: Vec<String> = std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let c: Vec<&str> = l.split('|').map(str::trim).collect();
            let v: Vec<u32> = c.get(2)?.split('.').map(|x| x.parse().unwrap()).collect();
            (v.as_slice() <= [2, 28, 9].as_slice()).then(|| c[0].to_string())
        })
        .collect();
    assert_eq!(in_2_28.len(), 53, "{in_2_28:?}");
    assert!(in_2_28.iter().all(|n| got.contains(n)));
    let missing: Vec<_> = want.difference(&got).collect();
    let extra: Vec<_> = got.difference(&want).collect();
    assert!(missing.is_empty() && extra.is_empty(), "missing exports {missing:?}; exports NCCL lacks {extra:?}");
}

#[test]
fn everything_pytorch_imports_is_exported() {
    let got = exports();
    for (list, n) in [("torch-2.11.txt", 38), ("torch-2.15.txt", 51)] {
        let need = api_file(list);
        assert_eq!(need.len(), n, "{list}");
        let missing: Vec<_> = need.iter().filter(|s| !got.contains(*s)).collect();
        assert!(missing.is_empty(), "{list}: not exported: {missing:?}");
    }
}

#[test]
fn the_library_carries_nccls_soname_and_needs_no_cuda_library() {
    let shim = shim_path();
    let dynamic = tool("readelf", &["-d", shim.to_str().unwrap()]);
    assert!(dynamic.contains("Library soname: [libnccl.so.2]"), "{dynamic}");
    for l in dynamic.lines().filter(|l| l.contains("(NEEDED)")) {
        assert!(!l.contains("libcuda") && !l.contains("libnccl") && !l.contains("libnvrtc"), "loaded lazily, never needed: {l}");
    }
}
