//! Finding this process's place in the job from the launcher's environment.
//!
//! sucl's own launcher (`SUCL_*`), torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//! `MASTER_PORT`), Open MPI (`OMPI_COMM_WORLD_*`), Slurm (`SLURM_PROCID`, ...) and PMI
//! (`PMI_RANK`, `PMI_SIZE`) are recognized, in that order. No launcher means a world of one.
//!
//! # Where the store listens, and who may use it
//!
//! A job whose ranks are all on one host (the launcher says so: `SUCL_LOCAL_SIZE`,
//! `LOCAL_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_SIZE`, `MPI_LOCALNRANKS` equal to the world size, or
//! `SLURM_NNODES=1`), or whose `MASTER_ADDR` is a loopback address, uses a store on 127.0.0.1 that
//! no other host can reach. Otherwise rank 0 listens on the address given ([`store_bind_addrs`]).
//!
//! Every store connection proves it knows the job secret ([`crate::store`]): `SUCL_JOB_SECRET`
//! when set (`sucl run` sets a random one for its ranks; set it yourself, the same on every rank,
//! under other launchers to keep others out), otherwise a secret derived from the launcher's name,
//! the store address and the launcher's job id (`TORCHELASTIC_RUN_ID`, `OMPI_MCA_ess_base_jobid`,
//! `SLURM_JOB_ID`.`SLURM_STEP_ID`, `PMI_JOBID`). A derived secret only keeps another job's ranks
//! from joining by accident (a stale job on the same port, say): anyone who can read those
//! variables can derive it, so it is no protection against an attacker.

use crate::error::{Error, Result};
use crate::store::{JobSecret, SECRET_ENV};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};

/// Who started this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// `sucl run`.
    Sucl,
    /// torchrun / torch.distributed.launch.
    Torchrun,
    /// Open MPI's mpirun.
    OpenMpi,
    /// Slurm's srun.
    Slurm,
    /// A PMI launcher (MPICH's hydra, ...).
    Pmi,
    /// None: a single process.
    None,
}

impl Launcher {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Sucl => "sucl",
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "openmpi",
            Launcher::Slurm => "slurm",
            Launcher::Pmi => "pmi",
            Launcher::None => "none",
        }
    }
}

/// The launch environment of this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Who launched us.
    pub launcher: Launcher,
    /// World rank.
    pub rank: usize,
    /// World size.
    pub size: usize,
    /// Rank among the processes on this host.
    pub local_rank: usize,
    /// `host:port` of the rendezvous store (None for a world of one).
    pub store_addr: Option<String>,
    /// Whether rank 0 hosts the store (false when the launcher does).
    pub rank0_hosts_store: bool,
    /// A job identifier, unique per job on a host (names shared-memory segments).
    pub job_id: String,
    /// The key every store connection of this job must prove it knows (see the module docs).
    pub job_secret: JobSecret,
}

fn parse_num(get: &dyn Fn(&str) -> Option<String>, var: &str) -> Result<Option<usize>> {
    match get(var) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<usize>()
            .map(Some)
            .map_err(|_| Error::Config(format!("environment variable {var}={v:?} is not a non-negative integer"))),
    }
}

fn default_port(job: &str) -> u16 {
    // FNV-1a of the job id: ranks of one job agree on a port without talking.
    let mut h: u32 = 0x811c9dc5;
    for b in job.bytes() {
        h = (h ^ b as u32).wrapping_mul(0x01000193);
    }
    29500 + (h % 20000) as u16
}

/// Detects the launch environment through `get` (normally `std::env::var`).
pub fn detect(get: &dyn Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
    let candidates: [(Launcher, &str, &str, &str); 5] = [
        (Launcher::Sucl, "SUCL_RANK", "SUCL_WORLD_SIZE", "SUCL_LOCAL_RANK"),
        (Launcher::Torchrun, "RANK", "WORLD_SIZE", "LOCAL_RANK"),
        (Launcher::OpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        (Launcher::Slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        (Launcher::Pmi, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ];
    let Some(&(launcher, rv, sv, lv)) = candidates.iter().find(|c| get(c.1).is_some()) else {
        return Ok(LaunchEnv {
            launcher: Launcher::None,
            rank: 0,
            size: 1,
            local_rank: 0,
            store_addr: None,
            rank0_hosts_store: false,
            job_id: format!("solo-{}", std::process::id()),
            // A world of one makes a private store with a random secret of its own.
            job_secret: JobSecret::derived("solo"),
        });
    };
    let rank = parse_num(get, rv)?.unwrap_or(0);
    let size = parse_num(get, sv)?.ok_or_else(|| Error::Config(format!("{rv} is set but {sv} is not")))?;
    if size == 0 {
        return Err(Error::Config(format!("{sv} must be at least 1")));
    }
    if rank >= size {
        return Err(Error::Config(format!("{rv}={rank} is out of range for {sv}={size}")));
    }
    let local_rank = parse_num(get, lv)?.unwrap_or(if launcher == Launcher::Pmi { rank } else { 0 });
    let job_id = get("SUCL_JOB_ID")
        .or_else(|| get("TORCHELASTIC_RUN_ID"))
        .or_else(|| get("OMPI_MCA_ess_base_jobid"))
        .or_else(|| get("SLURM_JOB_ID").map(|j| format!("{j}.{}", get("SLURM_STEP_ID").unwrap_or_default())))
        .or_else(|| get("PMI_JOBID"))
        .unwrap_or_else(|| "default".to_string());
    let (store_addr, rank0_hosts_store) = if let Some(a) = get("SUCL_STORE_ADDR") {
        (Some(a), get("SUCL_STORE_HOST").as_deref() != Some("launcher"))
    } else if let Some(host) = get("MASTER_ADDR") {
        let port = parse_num(get, "MASTER_PORT")?.unwrap_or(29500);
        // All ranks on this host: the store need not be reachable from anywhere else.
        let host = if all_ranks_local(get, launcher, size)? { "127.0.0.1".to_string() } else { host };
        (Some(format!("{host}:{port}")), true)
    } else if size == 1 {
        (None, false)
    } else if launcher == Launcher::Torchrun {
        return Err(Error::Config("RANK/WORLD_SIZE are set but MASTER_ADDR is not".into()));
    } else {
        // One host assumed; set MASTER_ADDR (and MASTER_PORT) for jobs across hosts.
        (Some(format!("127.0.0.1:{}", default_port(&job_id))), true)
    };
    let job_secret = match get(SECRET_ENV).filter(|s| !s.is_empty()) {
        Some(s) => JobSecret::given(&s),
        None => JobSecret::derived(&format!("{}|{}|{job_id}", launcher.name(), store_addr.as_deref().unwrap_or(""))),
    };
    Ok(LaunchEnv { launcher, rank, size, local_rank, store_addr, rank0_hosts_store, job_id, job_secret })
}

/// Whether the launcher says that every rank runs on this host.
fn all_ranks_local(get: &dyn Fn(&str) -> Option<String>, launcher: Launcher, size: usize) -> Result<bool> {
    if launcher == Launcher::Slurm {
        let nodes = match get("SLURM_STEP_NUM_NODES") {
            Some(_) => parse_num(get, "SLURM_STEP_NUM_NODES")?,
            None => parse_num(get, "SLURM_NNODES")?,
        };
        return Ok(nodes == Some(1));
    }
    let var = match launcher {
        Launcher::Sucl => "SUCL_LOCAL_SIZE",
        Launcher::Torchrun => "LOCAL_WORLD_SIZE",
        Launcher::OpenMpi => "OMPI_COMM_WORLD_LOCAL_SIZE",
        Launcher::Pmi => "MPI_LOCALNRANKS",
        Launcher::Slurm | Launcher::None => return Ok(false),
    };
    Ok(parse_num(get, var)? == Some(size))
}

/// The addresses the rank hosting the store tries to listen on for `store_addr` (`host:port`),
/// in order: a loopback host (`localhost`, 127.0.0.0/8, ::1) gives only itself; a numeric
/// address gives itself, then the wildcard of its family as a last resort (the address is not
/// on this host: NAT or a forwarded port); a host name gives the non-loopback addresses it
/// resolves to, then the wildcard. A name that resolves only to loopback addresses here but is
/// not `localhost` (Debian maps the host's own name to 127.0.1.1) gives the wildcard: the other
/// hosts reach this one under that name by another address.
pub fn store_bind_addrs(store_addr: &str) -> Result<Vec<SocketAddr>> {
    let bad = |why: &str| Error::Config(format!("store address `{store_addr}`: {why}"));
    let (host, port) = store_addr.rsplit_once(':').ok_or_else(|| bad("no port (expected host:port)"))?;
    let port: u16 = port.parse().map_err(|_| bad("the port is not a number from 0 to 65535"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let wildcard = |v6: bool| SocketAddr::new(if v6 { IpAddr::V6(Ipv6Addr::UNSPECIFIED) } else { IpAddr::V4(Ipv4Addr::UNSPECIFIED) }, port);
    if host.eq_ignore_ascii_case("localhost") || host.to_ascii_lowercase().ends_with(".localhost") {
        return Ok(vec![SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port)]);
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        let given = SocketAddr::new(ip, port);
        return Ok(if ip.is_loopback() || ip.is_unspecified() { vec![given] } else { vec![given, wildcard(ip.is_ipv6())] });
    }
    let resolved: Vec<SocketAddr> = (host, port).to_socket_addrs().map_err(|e| bad(&format!("cannot resolve `{host}`: {e}")))?.collect();
    let mut addrs: Vec<SocketAddr> = resolved.iter().copied().filter(|a| !a.ip().is_loopback()).collect();
    addrs.push(wildcard(false));
    Ok(addrs)
}

/// This host's name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for its length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn launchers() {
        let e = detect(&env(&[])).unwrap();
        assert_eq!((e.launcher, e.size), (Launcher::None, 1));
        let e =
            detect(&env(&[("RANK", "2"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "7")])).unwrap();
        assert_eq!((e.launcher, e.rank, e.size, e.local_rank, e.store_addr.as_deref()), (Launcher::Torchrun, 2, 4, 1, Some("h:7")));
        let e = detect(&env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_MCA_ess_base_jobid", "9"),
        ]))
        .unwrap();
        assert_eq!((e.launcher, e.rank, e.size), (Launcher::OpenMpi, 1, 2));
        assert!(e.store_addr.unwrap().starts_with("127.0.0.1:"));
        let e = detect(&env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "3"), ("SLURM_LOCALID", "0"), ("SLURM_JOB_ID", "5")])).unwrap();
        assert_eq!((e.launcher, e.size), (Launcher::Slurm, 3));
        let e = detect(&env(&[("PMI_RANK", "1"), ("PMI_SIZE", "2")])).unwrap();
        assert_eq!((e.launcher, e.rank), (Launcher::Pmi, 1));
        let e = detect(&env(&[
            ("SUCL_RANK", "0"),
            ("SUCL_WORLD_SIZE", "2"),
            ("SUCL_STORE_ADDR", "127.0.0.1:5"),
            ("SUCL_STORE_HOST", "launcher"),
        ]))
        .unwrap();
        assert!(!e.rank0_hosts_store);
    }

    #[test]
    fn one_host_jobs_use_a_loopback_store() {
        let torch = [("RANK", "1"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "node7"), ("MASTER_PORT", "7000")];
        let e = detect(&env(&[&torch[..], &[("LOCAL_WORLD_SIZE", "4")]].concat())).unwrap();
        assert_eq!(e.store_addr.as_deref(), Some("127.0.0.1:7000"));
        let e = detect(&env(&[&torch[..], &[("LOCAL_WORLD_SIZE", "2")]].concat())).unwrap();
        assert_eq!(e.store_addr.as_deref(), Some("node7:7000"));
        let ompi = [("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2"), ("MASTER_ADDR", "10.1.2.3")];
        let e = detect(&env(&[&ompi[..], &[("OMPI_COMM_WORLD_LOCAL_SIZE", "2")]].concat())).unwrap();
        assert_eq!(e.store_addr.as_deref(), Some("127.0.0.1:29500"));
        let slurm = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("MASTER_ADDR", "10.1.2.3"), ("MASTER_PORT", "5")];
        let e = detect(&env(&[&slurm[..], &[("SLURM_NNODES", "1")]].concat())).unwrap();
        assert_eq!(e.store_addr.as_deref(), Some("127.0.0.1:5"));
        let e = detect(&env(&[&slurm[..], &[("SLURM_NNODES", "2")]].concat())).unwrap();
        assert_eq!(e.store_addr.as_deref(), Some("10.1.2.3:5"));
    }

    #[test]
    fn the_store_binds_only_where_needed() {
        let v4 = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert_eq!(store_bind_addrs("127.0.0.1:9").unwrap(), vec![v4("127.0.0.1:9")]);
        assert_eq!(store_bind_addrs("localhost:9").unwrap(), vec![v4("127.0.0.1:9")]);
        assert_eq!(store_bind_addrs("[::1]:9").unwrap(), vec![v4("[::1]:9")]);
        assert_eq!(store_bind_addrs("10.1.2.3:9").unwrap(), vec![v4("10.1.2.3:9"), v4("0.0.0.0:9")]);
        assert!(store_bind_addrs("10.1.2.3").unwrap_err().to_string().contains("no port"));
        assert!(store_bind_addrs("10.1.2.3:x").unwrap_err().to_string().contains("port"));
    }

    #[test]
    fn the_job_secret_is_given_or_derived_per_job() {
        let base = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "7")];
        let given = detect(&env(&[&base[..], &[(SECRET_ENV, "s3cret")]].concat())).unwrap().job_secret;
        assert_eq!((given.expose(), given.source()), ("s3cret", crate::store::SecretSource::Given));
        assert!(!format!("{given:?}").contains("s3cret"), "Debug must not print the secret");
        let a = detect(&env(&[&base[..], &[("TORCHELASTIC_RUN_ID", "a")]].concat())).unwrap().job_secret;
        let a2 = detect(&env(&[&base[..], &[("TORCHELASTIC_RUN_ID", "a"), ("RANK", "1")]].concat())).unwrap().job_secret;
        let b = detect(&env(&[&base[..], &[("TORCHELASTIC_RUN_ID", "b")]].concat())).unwrap().job_secret;
        assert_eq!(a.source(), crate::store::SecretSource::Derived);
        assert_eq!(a, a2, "ranks of one job derive the same secret");
        assert_ne!(a, b, "two jobs derive different secrets");
    }

    #[test]
    fn bad_environment_is_a_clear_error() {
        let err = detect(&env(&[("RANK", "4"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "h")])).unwrap_err().to_string();
        assert!(err.contains("RANK=4 is out of range"), "{err}");
        let err = detect(&env(&[("RANK", "x"), ("WORLD_SIZE", "4")])).unwrap_err().to_string();
        assert!(err.contains("RANK=\"x\""), "{err}");
        let err = detect(&env(&[("RANK", "0"), ("WORLD_SIZE", "2")])).unwrap_err().to_string();
        assert!(err.contains("MASTER_ADDR"), "{err}");
    }
}
