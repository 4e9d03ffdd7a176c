//! Checks a `sucld --cuda` daemon's CUDA devices end to end (run by
//! `scripts/remote-gpu-check.sh` on a GPU machine): for every CUDA device the server offers,
//! upload, fill, copy, read back, compile a kernel with NVRTC on the server, launch it, record
//! and wait for events. Exits non-zero, saying what differed, on any failure — and when the
//! server offers no CUDA device at all.
//!
//! ```sh
//! SUCL_REMOTE=127.0.0.1:7787 SUCL_REMOTE_TOKEN_FILE=token cargo run -p sucl-remote --example remote_cuda_check
//! ```

use sucl_remote::client::servers;
use sucl_remote::{Arg, ClientOptions, DeviceKind, Remote};

const SRC: &str = r#"
extern "C" __global__ void add_index(unsigned long long* p, unsigned long long n, double scale) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) p[i] += (unsigned long long)(i * scale);
}
"#;

const HELP: &str = "\
remote_cuda_check: checks a `sucld --cuda` daemon's CUDA devices end to end.

For every CUDA device the server offers: upload, fill, copy, read back, compile a kernel with
NVRTC on the server, launch it, record and wait for events. Exits non-zero, saying what
differed, on any failure, and when the server offers no CUDA device. Takes no arguments: the
server is the first of SUCL_REMOTE, the token and pins come from SUCL_REMOTE_TOKEN(_FILE) and
SUCL_REMOTE_TLS_PIN (or SUCL_REMOTE_TLS=off).

Example:
  SUCL_REMOTE=127.0.0.1:7787 SUCL_REMOTE_TOKEN_FILE=token SUCL_REMOTE_TLS_PIN=<pin> \\
      cargo run -p sucl-remote --example remote_cuda_check";

fn main() {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{HELP}");
        return;
    }
    if let Err(e) = run() {
        eprintln!("remote_cuda_check: FAILED: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let servers = servers(None, None).map_err(|e| e.to_string())?;
    let server = servers.first().ok_or("set SUCL_REMOTE to the daemon's host:port")?;
    let r = Remote::connect(server, ClientOptions::from_env(None).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    let cuda: Vec<_> = r.devices().map_err(|e| e.to_string())?.into_iter().filter(|d| d.kind() == DeviceKind::Cuda).collect();
    if cuda.is_empty() {
        return Err(format!("server {server} offers no CUDA device (is sucld running with --cuda?)"));
    }
    for dev in &cuda {
        let e = |e: sucl_remote::RemoteError| format!("{}: {e}", dev.name());
        let q = dev.queue().map_err(e)?;
        let n = 1_000_003usize;
        let host: Vec<u64> = (0..n as u64).map(|i| i * 3).collect();
        let a = q.upload(&host).map_err(e)?;
        let mut b = q.alloc::<u64>(n).map_err(e)?;
        b.fill(7).map_err(e)?;
        if b.read(n - 2, 2).map_err(e)? != [7, 7] {
            return Err(format!("{}: fill", dev.name()));
        }
        b.copy_from(&a).map_err(e)?;
        dev.compile(SRC, "add_index").map_err(e)?;
        q.launch("add_index", &[b.arg(), Arg::U64(n as u64), Arg::F64(2.0)], n as u64).map_err(e)?;
        let ev = q.record().map_err(e)?;
        let q2 = dev.queue().map_err(e)?;
        q2.wait_for(&ev).map_err(e)?;
        ev.synchronize().map_err(e)?;
        q.synchronize().map_err(e)?;
        let got = b.to_vec().map_err(e)?;
        if let Some(i) = (0..n).find(|&i| got[i] != host[i] + 2 * i as u64) {
            return Err(format!("{}: element {i} is {}, want {}", dev.name(), got[i], host[i] + 2 * i as u64));
        }
        println!("remote CUDA device {} ({}): upload, fill, copy, NVRTC kernel, events: OK", dev.index(), dev.name());
    }
    Ok(())
}
