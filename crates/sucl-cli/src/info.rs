//! `sucl info`: what this machine, build and environment offer, and where settings came from.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use sucl::config::Config;
use sucl_core::bootstrap::{interface_addrs, Network};

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
            ("hier", _) => {
                println!("  hier  available for collectives where ranks span hosts, the same number (≥ 2) on each: shm inside, tcp between")
            }
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
    println!("  host identity {} ({})", sucl::host_identity(), host_identity_source());
    println!("network:");
    let net_ok = match Network::from_env() {
        Ok(net) => {
            for line in network_lines(&env, &net, &interface_addrs()) {
                println!("  {line}");
            }
            true
        }
        Err(e) => {
            println!("  error: {e}");
            false
        }
    };
    i32::from(cfg.is_err() || !net_ok) * 2
}

fn host_identity_source() -> &'static str {
    if std::env::var("SUCL_HOSTNAME").is_ok_and(|h| !h.trim().is_empty()) {
        "SUCL_HOSTNAME: ranks with the same name share memory"
    } else {
        "the hostname; SUCL_HOSTNAME overrides it"
    }
}

/// The local address this host's packets to `addr` (`host:port`) leave from (no packet is sent).
fn route_to(addr: &str) -> Option<IpAddr> {
    let target = addr.to_socket_addrs().ok()?.next()?;
    let any: SocketAddr = if target.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    let s = UdpSocket::bind(any).ok()?;
    s.connect(target).ok()?;
    Some(s.local_addr().ok()?.ip())
}

/// Names the interface holding `ip`, as `name ip` (or just the address).
fn with_interface(ip: IpAddr, ifs: &[(String, IpAddr)]) -> String {
    match ifs.iter().find(|(_, a)| *a == ip) {
        Some((name, _)) => format!("{name} {ip}"),
        None => ip.to_string(),
    }
}

/// What the store and the tcp endpoints bind and advertise, and why (the same rules as
/// `sucl_core::bootstrap` and the tcp backend follow).
pub fn network_lines(env: &sucl::LaunchEnv, net: &Network, ifs: &[(String, IpAddr)]) -> Vec<String> {
    let chosen = || {
        net.interface.as_ref().map(|(name, ip)| {
            let spec = std::env::var("SUCL_SOCKET_IFNAME").unwrap_or_default();
            format!("{name} {ip}, chosen by SUCL_SOCKET_IFNAME={spec:?}")
        })
    };
    let ports = match net.ports {
        Some((lo, hi)) => format!("ports {lo}-{hi} (SUCL_PORT_RANGE)"),
        None => "any free port (SUCL_PORT_RANGE unset)".to_string(),
    };
    let mut out = vec![];
    let store = match (&env.agent_store, &env.store_addr) {
        (Some(agent), _) => {
            let why = chosen().unwrap_or_else(|| {
                if agent.one_host {
                    "127.0.0.1, all ranks on one host".to_string()
                } else {
                    match route_to(&agent.addr) {
                        Some(ip) if !ip.is_loopback() => {
                            format!("{}, the address this host reaches the agent store from", with_interface(ip, ifs))
                        }
                        _ => "this host's first non-loopback address (the agent store is reached over loopback)".to_string(),
                    }
                }
            });
            format!("store: torchrun's agent store at {} introduces sucl's store, which rank 0 starts on {why}; {ports}", agent.addr)
        }
        (None, None) => "store: none (not a launched job): a world of one starts a private store on 127.0.0.1".to_string(),
        (None, Some(addr)) if env.rank0_hosts_store => match sucl_core::bootstrap::store_bind_addrs(addr) {
            Ok(bind) => {
                let bind: Vec<String> = bind.iter().map(|a| a.to_string()).collect();
                format!(
                    "store: {addr} from the launch environment, hosted by rank 0, which listens on {} (the first that binds)",
                    bind.join(", ")
                )
            }
            Err(e) => format!("store: {addr}: {e}"),
        },
        (None, Some(addr)) => format!("store: {addr}, hosted by the launcher"),
    };
    out.push(store);
    let tcp = match chosen() {
        Some(c) => c,
        None => match env.store_addr.as_deref().or(env.agent_store.as_ref().map(|a| a.addr.as_str())) {
            Some(addr) => match route_to(addr) {
                Some(ip) => format!("{}, the address this host reaches the store from", with_interface(ip, ifs)),
                None => format!("the address this host reaches the store at {addr} from (no route found now)"),
            },
            None => "lo 127.0.0.1, the private store's loopback (a world of one)".to_string(),
        },
    };
    out.push(format!("tcp endpoints: {tcp}; {ports}"));
    out
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
    match sucl::cuda::peer_access_report() {
        Ok(what) => println!("  ipc   available ({what}) for CUDA buffers of ranks on one machine"),
        Err(why) => println!("  ipc   unavailable: {why}"),
    }
}

#[cfg(not(feature = "cuda"))]
fn nccl_line() {
    println!("  nccl  unavailable: built without the `cuda` feature");
    println!("  ipc   unavailable: built without the `cuda` feature");
}
