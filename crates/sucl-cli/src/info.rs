//! `sucl info`: what this machine, build and environment offer, and where settings came from.

use sucl::config::Config;

fn meminfo_gib() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: f64 = text.lines().find(|l| l.starts_with("MemTotal:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / (1 << 20) as f64)
}

/// Prints the report; returns the exit code.
pub fn run() -> i32 {
    let env = match sucl_core::bootstrap::detect(&|k| std::env::var(k).ok()) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("sucl info: {e}");
            return 2;
        }
    };
    let cfg = Config::from_env();
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    println!("devices:");
    println!(
        "  host  {}: {} CPUs, {} memory",
        sucl_core::bootstrap::hostname(),
        cpus,
        meminfo_gib().map(|g| format!("{g:.1} GiB")).unwrap_or_else(|| "unknown".into())
    );
    cuda_devices();
    remote_devices();
    println!("backends:");
    for (name, r) in sucl::backend_report(&env) {
        match (name, r) {
            ("shm", _) => println!("  shm   available (ranks on one host)"),
            ("mpi", Ok(())) => println!("  mpi   available ({})", sucl::mpi_version().unwrap_or_default()),
            (n, Ok(())) => println!("  {n:<5} available"),
            (n, Err(why)) => println!("  {n:<5} unavailable: {why}"),
        }
    }
    nccl_line();
    println!("config:");
    match &cfg {
        Ok(c) => {
            println!("  file: {}", c.file.as_deref().unwrap_or("none (set SUCL_CONFIG or --config)"));
            for s in &c.sources {
                println!("  {:<20} = {:<50} ({})", s.key, s.value, s.from);
            }
        }
        Err(e) => println!("  error: {e}"),
    }
    println!("launch:");
    println!("  launcher {}, rank {}, world size {}, local rank {}", env.launcher.name(), env.rank, env.size, env.local_rank);
    if let Some(a) = &env.store_addr {
        println!("  rendezvous store {a} ({})", if env.rank0_hosts_store { "hosted by rank 0" } else { "hosted by the launcher" });
    }
    i32::from(cfg.is_err()) * 2
}

/// Remote devices: every server named by `SUCL_REMOTE` or the config's `[[remote]]` tables,
/// with its state, its measured round-trip latency and its devices.
fn remote_devices() {
    let config = std::env::var("SUCL_CONFIG").ok().map(std::path::PathBuf::from);
    let servers = match sucl_remote::client::servers(None, config.as_deref()) {
        Ok(s) => s,
        Err(e) => return println!("  remote: {e}"),
    };
    if servers.is_empty() {
        return;
    }
    let opts = match sucl_remote::ClientOptions::from_env(config.as_deref()) {
        Ok(mut o) => {
            o.call_timeout = std::time::Duration::from_secs(3);
            o.reconnect_window = std::time::Duration::from_secs(1);
            o
        }
        Err(e) => return println!("  remote: {} server(s) named, but {e}", servers.len()),
    };
    for server in servers {
        let probe = || -> Result<(f64, Vec<sucl_remote::RemoteDevice>), sucl_remote::RemoteError> {
            let r = sucl_remote::Remote::connect(&server, opts.clone())?;
            let mut t: Vec<f64> = (0..7)
                .map(|_| {
                    let t0 = std::time::Instant::now();
                    r.nop().map(|_| t0.elapsed().as_secs_f64() * 1e6)
                })
                .collect::<Result<_, _>>()?;
            t.sort_by(f64::total_cmp);
            Ok((t[t.len() / 2], r.devices()?))
        };
        match probe() {
            Ok((us, devs)) => {
                for d in devs {
                    println!(
                        "  remote {server} #{}: {:?} {}, {:.1} GiB; state up, latency {us:.0} µs",
                        d.index(),
                        d.kind(),
                        d.name(),
                        d.total_memory() as f64 / (1u64 << 30) as f64
                    );
                }
            }
            Err(e) => println!("  remote {server}: state unreachable: {e}"),
        }
    }
}

#[cfg(feature = "cuda")]
fn cuda_devices() {
    match sucl::cuda::probe() {
        Ok(n) => {
            let drv = sucl::cuda::driver_version().map(|v| format!("driver API {}.{}", v / 1000, v % 1000 / 10)).unwrap_or_default();
            for i in 0..n {
                match sucl::cuda::Device::open(i) {
                    Ok(d) => {
                        println!("  cuda:{i} {} ({:.1} GiB, {drv})", d.name(), d.total_memory() as f64 / (1u64 << 30) as f64)
                    }
                    Err(e) => println!("  cuda:{i} unusable: {e}"),
                }
            }
        }
        Err(why) => println!("  cuda  unavailable: {why}"),
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_devices() {
    println!("  cuda  unavailable: built without the `cuda` feature");
}

#[cfg(feature = "cuda")]
fn nccl_line() {
    match sucl::cuda::nccl_version() {
        Ok(v) => println!(
            "  nccl  available (NCCL {}.{}.{}) for CUDA buffers; staged available where CUDA is",
            v / 10000,
            v / 100 % 100,
            v % 100
        ),
        Err(why) => println!("  nccl  unavailable: {why}"),
    }
}

#[cfg(not(feature = "cuda"))]
fn nccl_line() {
    println!("  nccl  unavailable: built without the `cuda` feature");
}
