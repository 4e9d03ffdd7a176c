//! Builds the C shim with the MPI compiler wrapper and links the MPI library it names.

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-env-changed=MPICC");
    let mpicc = std::env::var("MPICC").unwrap_or_else(|_| "mpicc".to_string());
    println!("cargo::rustc-check-cfg=cfg(sucl_mpi_missing)");
    let link = Command::new(&mpicc)
        .arg("--showme:link")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .or_else(|| Command::new(&mpicc).arg("-link_info").output().ok().filter(|o| o.status.success()));
    let Some(link) = link else {
        // No MPI here: build a backend that reports why it is unavailable.
        println!("cargo:warning=sucl-mpi: `{mpicc}` not found; the MPI backend will report itself unavailable (install libopenmpi-dev openmpi-bin or set MPICC)");
        println!("cargo:rustc-cfg=sucl_mpi_missing");
        return;
    };
    cc::Build::new().compiler(&mpicc).file("src/shim.c").warnings(true).compile("sucl_mpi_shim");
    let flags = String::from_utf8_lossy(&link.stdout).into_owned();
    for tok in flags.split_whitespace() {
        if let Some(dir) = tok.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
        } else if let Some(lib) = tok.strip_prefix("-l") {
            println!("cargo:rustc-link-lib={lib}");
        } else if tok.starts_with("-Wl,") {
            println!("cargo:rustc-link-arg={tok}");
        }
    }
}
