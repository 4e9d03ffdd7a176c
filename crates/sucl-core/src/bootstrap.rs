//! Finding this process's place in the job from the launcher's environment.
//!
//! sucl's own launcher (`SUCL_*`), torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//! `MASTER_PORT`), Open MPI (`OMPI_COMM_WORLD_*`), Slurm (`SLURM_PROCID`, ...) and PMI
//! (`PMI_RANK`, `PMI_SIZE`) are recognized, in that order. No launcher means a world of one.
//!
//! Where the ranks meet (sucl's rendezvous store):
//! - under `sucl run`, the launcher's store (`SUCL_STORE_ADDR`);
//! - under torchrun with the agent's store (`TORCHELASTIC_USE_AGENT_STORE=True`), the agent owns
//!   `MASTER_PORT`: rank 0 starts sucl's store on a free port and publishes its address in the
//!   agent's c10d store ([`meet_through_agent_store`]);
//! - otherwise `MASTER_ADDR:MASTER_PORT`, hosted by rank 0;
//! - without `MASTER_ADDR` under an MPI launcher (mpirun, srun, hydra) in a build with the MPI
//!   backend: wherever rank 0 starts it, its address passed over MPI itself ([`detect_with`]
//!   returns no address then; `sucl_mpi::meet_over_mpi` does the exchange);
//! - without `MASTER_ADDR` otherwise: on one host, 127.0.0.1 and a port derived from the job id; across
//!   hosts, the first host of Slurm's node list, or an error at init that says what to set.
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
//! Under torchrun's agent store without `SUCL_JOB_SECRET`, rank 0 makes a random secret and
//! publishes it beside its store's address in the agent's store, which torch already trusts.

use crate::c10d::C10dClient;
use crate::error::{Error, Result};
use crate::store::{JobSecret, SecretSource, StoreClient, StoreServer, SECRET_ENV};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

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
    /// torchrun's agent store, when the ranks meet there instead of at `store_addr` (which is
    /// then `None` until [`meet_through_agent_store`] fills it in).
    pub agent_store: Option<AgentStore>,
}

/// torchrun's agent store (`TORCHELASTIC_USE_AGENT_STORE=True`): a c10d TCPStore on
/// `MASTER_ADDR:MASTER_PORT`, served by the agent, where sucl's ranks find sucl's own store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentStore {
    /// `MASTER_ADDR:MASTER_PORT`.
    pub addr: String,
    /// Prefix of sucl's keys there: `/sucl/<run id>/<restart count>/`, so that they collide
    /// with neither torch's keys nor a previous attempt's.
    pub prefix: String,
    /// Whether every rank runs on this host (`LOCAL_WORLD_SIZE == WORLD_SIZE`).
    pub one_host: bool,
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

fn parse_port(get: &dyn Fn(&str) -> Option<String>, var: &str) -> Result<Option<u16>> {
    match get(var) {
        None => Ok(None),
        Some(v) => match v.trim().parse::<u16>() {
            Ok(p) if p > 0 => Ok(Some(p)),
            _ => Err(Error::Config(format!("environment variable {var}={v:?} is not a port number (1-65535)"))),
        },
    }
}

/// `host:port`, with an IPv6 literal in brackets.
fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn default_port(job: &str) -> u16 {
    // FNV-1a of the job id: ranks of one job agree on a port without talking. The range stays
    // below Linux's ephemeral ports (32768-60999 by default), where any outgoing connection on
    // the host could already hold the port (seen: two concurrent mpirun jobs in CI).
    let mut h: u32 = 0x811c9dc5;
    for b in job.bytes() {
        h = (h ^ b as u32).wrapping_mul(0x01000193);
    }
    20000 + (h % 12000) as u16
}

/// A TCP port free on every local address now, below the kernel's ephemeral range: for a
/// store whose port must be named (`MASTER_PORT`) before rank 0 binds it.
///
/// A port from `bind(port 0)` is an ephemeral one, and between its release and the store's bind
/// any outgoing connection on the host may take it ("Address already in use"); a port below the
/// ephemeral range is only taken by whoever asks for it by number. Successive calls in one
/// process return different ports, and processes start at different places.
pub fn unused_loopback_port() -> std::io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CALLS: AtomicU32 = AtomicU32::new(0);
    // Linux's default ephemeral range starts at 32768; a host that lowered it gets what is left.
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u32, ephemeral_low.clamp(10_100, 65_536));
    let span = high - low;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let start = std::process::id().wrapping_mul(7919).wrapping_add(nanos);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    // Consecutive calls are 97 ports apart, so a test that uses a few ports above the one it
    // got (a port range) does not meet the next call's.
    for probe in 0..span.min(2048) {
        let port = low + start.wrapping_add(call.wrapping_mul(97)).wrapping_add(probe) % span;
        let port = port as u16;
        if std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok() {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("no free port in {low}-{}", high - 1)))
}

/// Detects the launch environment through `get` (normally `std::env::var`).
pub fn detect(get: &dyn Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
    detect_with(get, &|| false)
}

/// [`detect`], for a process that may meet the other ranks over MPI: when the launcher is an
/// MPI one (Open MPI, Slurm, PMI), the world has several ranks, no address was given
/// (`SUCL_STORE_ADDR`, `MASTER_ADDR`) and `mpi_usable()` says MPI works here (it is asked only
/// then), the environment comes back with no store address (`store_addr: None`,
/// `rank0_hosts_store: true`): rank 0 is to start the store and pass its address over MPI.
/// Otherwise the same as [`detect`].
pub fn detect_with(get: &dyn Fn(&str) -> Option<String>, mpi_usable: &dyn Fn() -> bool) -> Result<LaunchEnv> {
    // An interface name that matches nothing, or a bad port range, is an error now, not at the
    // first listener.
    Network::from_settings(get, &interface_addrs())?;
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
            agent_store: None,
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
    check_local_size(get, launcher, size, lv)?;
    let agent_store = agent_store(get, launcher, size)?;
    let job_id = get("SUCL_JOB_ID")
        .or_else(|| torchrun_job_id(get))
        .or_else(|| get("OMPI_MCA_ess_base_jobid"))
        .or_else(|| get("SLURM_JOB_ID").map(|j| format!("{j}.{}", get("SLURM_STEP_ID").unwrap_or_default())))
        .or_else(|| get("PMI_JOBID"))
        .unwrap_or_else(|| "default".to_string());
    let over_mpi = || {
        matches!(launcher, Launcher::OpenMpi | Launcher::Slurm | Launcher::Pmi)
            && size > 1
            && get("SUCL_STORE_ADDR").is_none()
            && get("MASTER_ADDR").is_none()
            && mpi_usable()
    };
    let (store_addr, rank0_hosts_store) =
        if agent_store.is_some() || over_mpi() { (None, true) } else { store_address(get, launcher, rank, size, &job_id)? };
    let job_secret = match get(SECRET_ENV).filter(|s| !s.is_empty()) {
        Some(s) => JobSecret::given(&s),
        None => JobSecret::derived(&format!("{}|{}|{job_id}", launcher.name(), store_addr.as_deref().unwrap_or(""))),
    };
    Ok(LaunchEnv { launcher, rank, size, local_rank, store_addr, rank0_hosts_store, job_id, job_secret, agent_store })
}

/// The variable holding the number of ranks on this host, per launcher.
fn local_size_var(launcher: Launcher) -> Option<&'static str> {
    match launcher {
        Launcher::Torchrun => Some("LOCAL_WORLD_SIZE"),
        Launcher::OpenMpi => Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
        Launcher::Pmi => Some("MPI_LOCALNRANKS"),
        Launcher::Sucl | Launcher::Slurm | Launcher::None => None,
    }
}

/// The number of ranks on this host must fit the world, and the local rank (`local_var`, when
/// set) that number.
fn check_local_size(get: &dyn Fn(&str) -> Option<String>, launcher: Launcher, size: usize, local_var: &str) -> Result<()> {
    let Some(var) = local_size_var(launcher) else { return Ok(()) };
    let Some(local_size) = parse_num(get, var)? else { return Ok(()) };
    if local_size == 0 || local_size > size {
        return Err(Error::Config(format!("{var}={local_size} does not fit a world of {size} ranks")));
    }
    match parse_num(get, local_var)? {
        Some(local_rank) if local_rank >= local_size => {
            Err(Error::Config(format!("{local_var}={local_rank} is out of range for {var}={local_size}")))
        }
        _ => Ok(()),
    }
}

/// torchrun's job: its run id plus `MASTER_PORT` (two jobs on one host cannot share a port,
/// but may share the default run id `none`) and the restart count (a restarted attempt must
/// not meet the previous attempt's leftovers).
fn torchrun_job_id(get: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let run = get("TORCHELASTIC_RUN_ID")?;
    let mut id = run;
    if get("TORCHELASTIC_USE_AGENT_STORE").is_some() {
        id = format!("{id}.{}.{}", get("MASTER_PORT").unwrap_or_default(), get("TORCHELASTIC_RESTART_COUNT").unwrap_or_default());
    }
    Some(id)
}

/// torchrun's agent store, when the workers are told to use it.
fn agent_store(get: &dyn Fn(&str) -> Option<String>, launcher: Launcher, size: usize) -> Result<Option<AgentStore>> {
    if launcher != Launcher::Torchrun || get("TORCHELASTIC_USE_AGENT_STORE").as_deref() != Some("True") {
        return Ok(None);
    }
    let host = get("MASTER_ADDR")
        .ok_or_else(|| Error::Config("TORCHELASTIC_USE_AGENT_STORE=True but MASTER_ADDR is not set (the agent store's host)".into()))?;
    let port = parse_port(get, "MASTER_PORT")?
        .ok_or_else(|| Error::Config("TORCHELASTIC_USE_AGENT_STORE=True but MASTER_PORT is not set (the agent store's port)".into()))?;
    let run = get("TORCHELASTIC_RUN_ID").unwrap_or_else(|| "none".into());
    let restart = parse_num(get, "TORCHELASTIC_RESTART_COUNT")?.unwrap_or(0);
    let one_host = parse_num(get, "LOCAL_WORLD_SIZE")? == Some(size);
    Ok(Some(AgentStore { addr: host_port(&host, port), prefix: format!("/sucl/{run}/{restart}/"), one_host }))
}

/// How many hosts the ranks run on, as far as the launcher says.
enum HostCount {
    One,
    /// Several; the text says how we know.
    Several(String),
    /// The launcher did not say: the variable that should have told.
    Unknown(&'static str),
}

fn host_count(get: &dyn Fn(&str) -> Option<String>, launcher: Launcher, size: usize) -> Result<HostCount> {
    let nodes = |vars: &[&'static str]| -> Result<Option<(&'static str, usize)>> {
        for &v in vars {
            if let Some(n) = parse_num(get, v)? {
                return Ok(Some((v, n)));
            }
        }
        Ok(None)
    };
    let by_nodes = |found: Option<(&'static str, usize)>, missing: &'static str| match found {
        Some((_, n)) if n <= 1 => HostCount::One,
        Some((v, n)) => HostCount::Several(format!("{v}={n}")),
        None => HostCount::Unknown(missing),
    };
    Ok(match launcher {
        // `sucl run` starts every rank on its own host (and always sets SUCL_STORE_ADDR).
        Launcher::Sucl | Launcher::None => HostCount::One,
        Launcher::Slurm => by_nodes(nodes(&["SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"])?, "SLURM_STEP_NUM_NODES"),
        Launcher::OpenMpi if get("OMPI_MCA_orte_num_nodes").is_some() => by_nodes(nodes(&["OMPI_MCA_orte_num_nodes"])?, ""),
        Launcher::OpenMpi | Launcher::Pmi | Launcher::Torchrun => {
            let var = local_size_var(launcher).unwrap_or("LOCAL_WORLD_SIZE");
            match parse_num(get, var)? {
                Some(n) if n == size => HostCount::One,
                Some(n) => HostCount::Several(format!("{var}={n} of {size} ranks")),
                None => HostCount::Unknown(var),
            }
        }
    })
}

/// Where sucl's store is when no agent store is in use: `(address, whether rank 0 hosts it)`.
fn store_address(
    get: &dyn Fn(&str) -> Option<String>,
    launcher: Launcher,
    rank: usize,
    size: usize,
    job_id: &str,
) -> Result<(Option<String>, bool)> {
    if let Some(a) = get("SUCL_STORE_ADDR") {
        return Ok((Some(a), get("SUCL_STORE_HOST").as_deref() != Some("launcher")));
    }
    if launcher == Launcher::Sucl && size > 1 {
        return Err(Error::Config("SUCL_RANK is set but SUCL_STORE_ADDR is not (start the ranks with `sucl run`)".into()));
    }
    let port = parse_port(get, "MASTER_PORT")?;
    if let Some(host) = get("MASTER_ADDR") {
        // torch's default port for torch's launchers; for the others one derived from the job,
        // so that two jobs sharing a host do not meet.
        let port = port.unwrap_or_else(|| if launcher == Launcher::Torchrun { 29500 } else { default_port(job_id) });
        // All ranks on this host: the store need not be reachable from anywhere else.
        let host = if matches!(host_count(get, launcher, size)?, HostCount::One) { "127.0.0.1".to_string() } else { host };
        return Ok((Some(host_port(&host, port)), true));
    }
    if size == 1 {
        return Ok((None, false));
    }
    if launcher == Launcher::Torchrun {
        return Err(Error::Config("RANK/WORLD_SIZE are set but MASTER_ADDR is not".into()));
    }
    let port = port.unwrap_or_else(|| default_port(job_id));
    let several = match host_count(get, launcher, size)? {
        HostCount::One => return Ok((Some(format!("127.0.0.1:{port}")), true)),
        HostCount::Several(why) => why,
        HostCount::Unknown(var) => format!("{var} is not set, so they may be on several hosts"),
    };
    let Some((var, list)) = ["SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"].iter().find_map(|v| get(v).map(|l| (*v, l)))
    else {
        return Err(Error::Config(format!(
            "the {size} ranks may run on several hosts ({several}) and no rendezvous address is known: \
             set MASTER_ADDR to an address of rank 0's host (and MASTER_PORT to a free port there)"
        )));
    };
    let first = slurm_first_host(&list).map_err(|why| Error::Config(format!("{var}={list:?} is not a Slurm host list: {why}")))?;
    if rank == 0 {
        // Rank 0 hosts the store on the first host; under any other placement it must be told.
        // srun sets SLURMD_NODENAME per task; under mpirun it is the batch host's, inherited.
        let here = if launcher == Launcher::Slurm { get("SLURMD_NODENAME").unwrap_or_else(hostname) } else { hostname() };
        if short_name(&here) != short_name(&first) {
            return Err(Error::Config(format!(
                "rank 0 runs on `{here}`, not on `{first}`, the first host of {var}, where the other ranks look for it: \
                 set MASTER_ADDR to an address of rank 0's host (and MASTER_PORT)"
            )));
        }
    }
    Ok((Some(host_port(&first, port)), true))
}

fn short_name(host: &str) -> &str {
    host.split('.').next().unwrap_or(host)
}

/// The first host of a Slurm host list (`node[01-03,07],gpu5` → `node01`), without expanding it.
pub fn slurm_first_host(list: &str) -> std::result::Result<String, String> {
    let first_item = split_top_level(list)?.into_iter().next().ok_or("the list is empty")?;
    let mut out = String::new();
    let mut rest = first_item;
    while let Some(open) = rest.find('[') {
        let close = rest[open..].find(']').ok_or("a `[` has no `]`")? + open;
        out.push_str(&rest[..open]);
        let ranges = parse_ranges(&rest[open + 1..close])?;
        out.push_str(&ranges[0].0);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Every host of a Slurm host list, in order; an error past `limit` hosts.
pub fn slurm_hostlist(list: &str, limit: usize) -> std::result::Result<Vec<String>, String> {
    let mut hosts = vec![];
    for item in split_top_level(list)? {
        let mut partial = vec![String::new()];
        let mut rest = item;
        loop {
            let (text, group) = match rest.find('[') {
                None => (rest, None),
                Some(open) => {
                    let close = rest[open..].find(']').ok_or("a `[` has no `]`")? + open;
                    (&rest[..open], Some((&rest[open + 1..close], close)))
                }
            };
            partial.iter_mut().for_each(|p| p.push_str(text));
            let Some((inner, close)) = group else { break };
            let mut next = vec![];
            for p in &partial {
                for (lo, hi) in parse_ranges(inner)? {
                    let width = lo.len();
                    let (a, b) = (lo.parse::<u64>().map_err(|e| e.to_string())?, hi.parse::<u64>().map_err(|e| e.to_string())?);
                    for n in a..=b {
                        if hosts.len() + next.len() >= limit {
                            return Err(format!("more than {limit} hosts"));
                        }
                        next.push(format!("{p}{n:0width$}"));
                    }
                }
            }
            partial = next;
            rest = &rest[close + 1..];
        }
        hosts.extend(partial);
        if hosts.len() > limit {
            return Err(format!("more than {limit} hosts"));
        }
    }
    Ok(hosts)
}

/// Splits at commas outside brackets; every item must be a non-empty host pattern.
fn split_top_level(list: &str) -> std::result::Result<Vec<&str>, String> {
    let (mut items, mut depth, mut start) = (vec![], 0usize, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err("nested `[`".into()),
            ']' if depth == 1 => depth = 0,
            ']' => return Err("a `]` has no `[`".into()),
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            c if c.is_whitespace() => return Err("whitespace in a host name".into()),
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a `[` has no `]`".into());
    }
    items.push(&list[start..]);
    if items.iter().any(|i| i.is_empty()) {
        return Err("an empty host name".into());
    }
    Ok(items)
}

/// `01-03,07` → `[("01", "03"), ("07", "07")]`: bounds as written (their width is the padding).
fn parse_ranges(inner: &str) -> std::result::Result<Vec<(String, String)>, String> {
    let mut out = vec![];
    for part in inner.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let digits = |s: &str| !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo) || !digits(hi) {
            return Err(format!("`[{inner}]` is not a list of numbers and ranges"));
        }
        if lo.parse::<u64>().map_err(|e| e.to_string())? > hi.parse::<u64>().map_err(|e| e.to_string())? {
            return Err(format!("the range `{part}` runs backwards"));
        }
        out.push((lo.to_string(), hi.to_string()));
    }
    Ok(out)
}

/// The key-value operations bootstrap needs from a store: sucl's own ([`StoreClient`]) or
/// torch's ([`C10dClient`]).
pub trait Rendezvous {
    /// Sets `key` to `value`.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Waits, bounded, until `key` exists and returns its value.
    fn get(&self, key: &str) -> Result<Vec<u8>>;
    /// Adds `delta` to the counter `key` and returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
}

impl Rendezvous for StoreClient {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        StoreClient::set(self, key, value)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        StoreClient::get(self, key)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        StoreClient::add(self, key, delta)
    }
}

impl Rendezvous for C10dClient {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        C10dClient::set(self, key, value)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        C10dClient::get(self, key)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        C10dClient::add(self, key, delta)
    }
}

/// The key under which rank 0 publishes the address of sucl's store.
const STORE_ADDR_KEY: &str = "store_addr";

/// The key under which rank 0 publishes the job secret (torchrun's agent store only).
const STORE_SECRET_KEY: &str = "store_secret";

/// Rank 0 publishes `secret`; every other rank waits for it and checks it looks like one.
fn share_secret(kv: &dyn Rendezvous, rank: usize, secret: Option<&str>) -> Result<String> {
    if let Some(s) = secret {
        kv.set(STORE_SECRET_KEY, s.as_bytes())?;
        return Ok(s.to_string());
    }
    let raw = kv.get(STORE_SECRET_KEY)?;
    std::str::from_utf8(&raw)
        .ok()
        .filter(|s| !s.is_empty() && s.len() <= 256 && s.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_string)
        .ok_or_else(|| Error::Aborted { rank, reason: "rank 0 published an unreadable job secret".into() })
}

/// Rank 0 publishes `addr` (its store's address); every other rank waits for it. Returns the
/// address, checked to be a socket address before anyone connects to it.
pub fn share_store_addr(kv: &dyn Rendezvous, rank: usize, addr: Option<&str>) -> Result<String> {
    if let Some(a) = addr {
        kv.set(STORE_ADDR_KEY, a.as_bytes())?;
        return Ok(a.to_string());
    }
    let raw = kv.get(STORE_ADDR_KEY)?;
    std::str::from_utf8(&raw).ok().filter(|s| s.parse::<SocketAddr>().is_ok()).map(str::to_string).ok_or_else(|| Error::Aborted {
        rank,
        reason: format!("rank 0 published an unreadable store address {:?}", String::from_utf8_lossy(&raw)),
    })
}

/// Under torchrun's agent store: rank 0 starts sucl's store on a free port and publishes its
/// address there; every rank returns that address (rank 0 also its server). Unless the secret
/// was given (`SUCL_JOB_SECRET`), rank 0 replaces it with a random one and publishes it there
/// too, and every other rank takes it from there.
/// The store binds and advertises the address `net` chooses, if it chooses one.
pub fn meet_through_agent_store(
    rank: usize,
    agent: &AgentStore,
    net: &Network,
    timeout: Duration,
    secret: &mut JobSecret,
) -> Result<(String, Option<StoreServer>)> {
    let c10d = C10dClient::connect(&agent.addr, &agent.prefix, rank, timeout)?;
    if rank != 0 {
        let addr = share_store_addr(&c10d, rank, None)?;
        if secret.source() != SecretSource::Given {
            *secret = JobSecret::given(&share_secret(&c10d, rank, None)?);
        }
        return Ok((addr, None));
    }
    if secret.source() != SecretSource::Given {
        *secret = JobSecret::random().map_err(|e| Error::io(0, "making the job secret", e))?;
        share_secret(&c10d, 0, Some(secret.expose()))?;
    }
    let (advertise, bind) = match net.interface {
        Some((_, ip)) => (ip, ip),
        None if agent.one_host => (IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4(Ipv4Addr::LOCALHOST)),
        None => {
            let ip = reachable_ip(c10d.local_ip())?;
            (ip, if ip.is_ipv4() { IpAddr::V4(Ipv4Addr::UNSPECIFIED) } else { IpAddr::V6(Ipv6Addr::UNSPECIFIED) })
        }
    };
    let server = net
        .bind_port(bind, |a| StoreServer::start(a, secret.clone()))
        .map_err(|e| Error::io(0, format!("starting the rendezvous store on {bind}"), e))?;
    let addr = SocketAddr::new(advertise, server.addr().port()).to_string();
    share_store_addr(&c10d, 0, Some(&addr))?;
    Ok((addr, Some(server)))
}

/// The address other hosts can reach rank 0 at: the one its connection to the agent store
/// left from, unless that is a loopback address (MASTER_ADDR naming this host as 127.0.x.x),
/// then the first non-loopback address of an interface that is up.
fn reachable_ip(via_agent: Option<IpAddr>) -> Result<IpAddr> {
    match via_agent {
        Some(ip) if !ip.is_loopback() => Ok(ip),
        _ => {
            interface_addrs().into_iter().map(|(_, ip)| ip).find(|ip| !ip.is_loopback() && ip.is_ipv4()).ok_or_else(|| {
                Error::Config("the ranks span several hosts, but this host has no network address other than loopback".into())
            })
        }
    }
}

/// Where sucl's listeners (the store under torchrun's agent, tcp endpoints) bind and what they
/// advertise: `SUCL_SOCKET_IFNAME` (NCCL_SOCKET_IFNAME's syntax: names or prefixes separated by
/// commas, `^` in front to exclude them, `=` in front to match names exactly) and
/// `SUCL_PORT_RANGE` (`low-high`, inclusive, or one port). Unset, both leave today's choice: the
/// address through which this host reaches the store, and any free port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Network {
    /// The interface chosen by `SUCL_SOCKET_IFNAME` and its address.
    pub interface: Option<(String, IpAddr)>,
    /// The ports listeners may bind.
    pub ports: Option<(u16, u16)>,
}

impl Network {
    /// Reads the settings through `get`, choosing among `interfaces` (name, address).
    pub fn from_settings(get: &dyn Fn(&str) -> Option<String>, interfaces: &[(String, IpAddr)]) -> Result<Network> {
        let interface = match get("SUCL_SOCKET_IFNAME") {
            None => None,
            Some(spec) => {
                Some(choose_interface(&spec, interfaces).map_err(|why| Error::Config(format!("SUCL_SOCKET_IFNAME={spec:?} {why}")))?)
            }
        };
        let ports = match get("SUCL_PORT_RANGE") {
            None => None,
            Some(r) => Some(parse_port_range(&r).ok_or_else(|| {
                Error::Config(format!("SUCL_PORT_RANGE={r:?} is not a port range like 50000-50100 (1-65535, low first)"))
            })?),
        };
        Ok(Network { interface, ports })
    }

    /// The settings of this process's environment, against this host's interfaces.
    pub fn from_env() -> Result<Network> {
        Network::from_settings(&|k| std::env::var(k).ok(), &interface_addrs())
    }

    /// The address to bind and advertise: the chosen interface's, else `fallback`.
    pub fn ip_or(&self, fallback: IpAddr) -> IpAddr {
        self.interface.as_ref().map_or(fallback, |(_, ip)| *ip)
    }

    /// Runs `bind` on `ip` and each port of the range in turn until one is free (port 0, any,
    /// without a range).
    pub fn bind_port<T>(&self, ip: IpAddr, mut bind: impl FnMut(SocketAddr) -> std::io::Result<T>) -> std::io::Result<T> {
        let Some((low, high)) = self.ports else { return bind(SocketAddr::new(ip, 0)) };
        for port in low..=high {
            match bind(SocketAddr::new(ip, port)) {
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                other => return other,
            }
        }
        Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("every port of SUCL_PORT_RANGE={low}-{high} is in use on {ip}")))
    }

    /// A listener on `ip` (or the chosen interface's address) at a port of the range.
    pub fn listen(&self, ip: IpAddr) -> std::io::Result<std::net::TcpListener> {
        self.bind_port(self.ip_or(ip), std::net::TcpListener::bind)
    }
}

fn parse_port_range(r: &str) -> Option<(u16, u16)> {
    let (lo, hi) = r.trim().split_once('-').unwrap_or((r.trim(), r.trim()));
    let (lo, hi) = (lo.trim().parse::<u16>().ok()?, hi.trim().parse::<u16>().ok()?);
    (lo > 0 && lo <= hi).then_some((lo, hi))
}

/// The first usable address of an interface `spec` selects: IPv4 first, then IPv6 that is not
/// link-local (that needs a scope to be reached).
fn choose_interface(spec: &str, interfaces: &[(String, IpAddr)]) -> std::result::Result<(String, IpAddr), String> {
    let (exclude, rest) = spec.strip_prefix('^').map_or((false, spec), |r| (true, r));
    let (exact, rest) = rest.strip_prefix('=').map_or((false, rest), |r| (true, r));
    let names: Vec<&str> = rest.split(',').map(str::trim).filter(|n| !n.is_empty()).collect();
    if names.is_empty() {
        return Err("names no interface".into());
    }
    let listed = |name: &str| names.iter().any(|n| if exact { name == *n } else { name.starts_with(n) });
    let usable = |ip: &IpAddr| match ip {
        IpAddr::V4(_) => true,
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) != 0xfe80,
    };
    let candidates: Vec<&(String, IpAddr)> = interfaces.iter().filter(|(n, ip)| listed(n) != exclude && usable(ip)).collect();
    candidates.iter().find(|(_, ip)| ip.is_ipv4()).or_else(|| candidates.first()).map(|(n, ip)| (n.clone(), *ip)).ok_or_else(|| {
        let mut all: Vec<&str> = interfaces.iter().map(|(n, _)| n.as_str()).collect();
        all.dedup();
        format!("matches no interface that is up with a usable address (interfaces here: {})", all.join(", "))
    })
}

/// Every (interface name, address) of an interface that is up, in the system's order.
pub fn interface_addrs() -> Vec<(String, IpAddr)> {
    let mut out = vec![];
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & libc::IFF_UP as libc::c_uint == 0 {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points at a sockaddr whose family says its layout.
        let ip = unsafe {
            match (*ifa.ifa_addr).sa_family as libc::c_int {
                libc::AF_INET => {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
                }
                _ => continue,
            }
        };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        out.push((name, ip));
    }
    // SAFETY: head came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    out
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
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_MCA_ess_base_jobid", "9"),
        ]))
        .unwrap();
        assert_eq!((e.launcher, e.rank, e.size), (Launcher::OpenMpi, 1, 2));
        assert!(e.store_addr.unwrap().starts_with("127.0.0.1:"));
        let e = detect(&env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "3"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_JOB_ID", "5"),
            ("SLURM_NNODES", "1"),
        ]))
        .unwrap();
        assert_eq!((e.launcher, e.size), (Launcher::Slurm, 3));
        let e = detect(&env(&[("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("MPI_LOCALNRANKS", "2")])).unwrap();
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
        // Without MASTER_PORT, a launcher other than torchrun gets a port derived from its job.
        assert_eq!(e.store_addr, Some(format!("127.0.0.1:{}", default_port(&e.job_id))));
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

    fn config_error(pairs: &[(&str, &str)]) -> String {
        detect(&env(pairs)).unwrap_err().to_string()
    }

    #[test]
    fn launcher_variables_that_contradict_each_other_are_named() {
        let err = config_error(&[("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "2"), ("LOCAL_WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]);
        assert!(err.contains("LOCAL_RANK=2 is out of range for LOCAL_WORLD_SIZE=2"), "{err}");
        let err = config_error(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "3")]);
        assert!(err.contains("OMPI_COMM_WORLD_LOCAL_SIZE=3 does not fit a world of 2"), "{err}");
        let err = config_error(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "70000")]);
        assert!(err.contains("MASTER_PORT=\"70000\" is not a port"), "{err}");
        let err = config_error(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("TORCHELASTIC_USE_AGENT_STORE", "True"), ("MASTER_PORT", "29500")]);
        assert!(err.contains("TORCHELASTIC_USE_AGENT_STORE=True but MASTER_ADDR is not set"), "{err}");
        let err = config_error(&[("SUCL_RANK", "0"), ("SUCL_WORLD_SIZE", "2")]);
        assert!(err.contains("SUCL_RANK is set but SUCL_STORE_ADDR is not"), "{err}");
        let err = config_error(&[("SLURM_PROCID", "0")]);
        assert!(err.contains("SLURM_PROCID is set but SLURM_NTASKS is not"), "{err}");
    }

    #[test]
    fn mpi_launchers_without_an_address_meet_over_mpi_when_it_works() {
        let asked = std::cell::Cell::new(0);
        let works = || {
            asked.set(asked.get() + 1);
            true
        };
        let several = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_MCA_orte_num_nodes", "2")];
        let e = detect_with(&env(&several), &works).unwrap();
        assert_eq!((e.store_addr, e.rank0_hosts_store, asked.get()), (None, true, 1));
        // srun and hydra too, on one host or several.
        let srun = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_NNODES", "1")];
        assert_eq!(detect_with(&env(&srun), &works).unwrap().store_addr, None);
        let hydra = [("PMI_RANK", "0"), ("PMI_SIZE", "2")];
        assert_eq!(detect_with(&env(&hydra), &works).unwrap().store_addr, None);
        // MPI not usable: today's derivation and its error.
        let err = detect_with(&env(&several), &|| false).unwrap_err().to_string();
        assert!(err.contains("set MASTER_ADDR"), "{err}");
        // A given address wins, and MPI is not even asked.
        asked.set(0);
        let given = [&several[..], &[("MASTER_ADDR", "head"), ("MASTER_PORT", "7")]].concat();
        assert_eq!(detect_with(&env(&given), &works).unwrap().store_addr.as_deref(), Some("head:7"));
        let store = [&several[..], &[("SUCL_STORE_ADDR", "10.1.1.1:5")]].concat();
        assert_eq!(detect_with(&env(&store), &works).unwrap().store_addr.as_deref(), Some("10.1.1.1:5"));
        // Not an MPI launcher, or a world of one: MPI is not asked either.
        let torch = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")];
        assert!(detect_with(&env(&torch), &works).unwrap().store_addr.is_some());
        let solo = [("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1")];
        assert_eq!(detect_with(&env(&solo), &works).unwrap().store_addr, None);
        assert_eq!(asked.get(), 0);
    }

    #[test]
    fn ranks_across_hosts_never_meet_at_loopback() {
        let ompi = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "4"), ("OMPI_MCA_ess_base_jobid", "9")];
        // Open MPI 4 says how many nodes; Open MPI in general how many ranks share this host.
        let err = config_error(&[&ompi[..], &[("OMPI_MCA_orte_num_nodes", "2")]].concat());
        assert!(err.contains("several hosts (OMPI_MCA_orte_num_nodes=2)") && err.contains("set MASTER_ADDR"), "{err}");
        let err = config_error(&[&ompi[..], &[("OMPI_COMM_WORLD_LOCAL_SIZE", "2")]].concat());
        assert!(err.contains("OMPI_COMM_WORLD_LOCAL_SIZE=2 of 4 ranks"), "{err}");
        let err = config_error(&ompi);
        assert!(err.contains("OMPI_COMM_WORLD_LOCAL_SIZE is not set"), "{err}");
        let one = detect(&env(&[&ompi[..], &[("OMPI_MCA_orte_num_nodes", "1")]].concat())).unwrap();
        assert!(one.store_addr.unwrap().starts_with("127.0.0.1:"));
        let err = config_error(&[("PMI_RANK", "0"), ("PMI_SIZE", "4"), ("MPI_LOCALNRANKS", "2")]);
        assert!(err.contains("MPI_LOCALNRANKS=2 of 4 ranks"), "{err}");
        // MASTER_ADDR wins, with a port derived from the job when MASTER_PORT is not set.
        let e = detect(&env(&[&ompi[..], &[("OMPI_MCA_orte_num_nodes", "2"), ("MASTER_ADDR", "head")]].concat())).unwrap();
        assert_eq!(e.store_addr.unwrap(), format!("head:{}", default_port("9")));
        // mpirun inside a Slurm allocation: the allocation's first host.
        let e = detect(&env(&[&ompi[..], &[("OMPI_COMM_WORLD_LOCAL_SIZE", "2"), ("SLURM_NODELIST", "gpu[07-08]")]].concat())).unwrap();
        assert_eq!(e.store_addr.unwrap(), format!("gpu07:{}", default_port("9")));

        let srun = |rank: &'static str, node: &'static str| {
            vec![
                ("SLURM_PROCID", rank),
                ("SLURM_NTASKS", "6"),
                ("SLURM_JOB_ID", "77"),
                ("SLURM_STEP_ID", "0"),
                ("SLURM_STEP_NUM_NODES", "3"),
                ("SLURM_STEP_NODELIST", "node[01-02,07]"),
                ("SLURM_NODELIST", "node[00-09]"),
                ("SLURMD_NODENAME", node),
            ]
        };
        let e = detect(&env(&srun("0", "node01"))).unwrap();
        assert_eq!(e.store_addr.unwrap(), format!("node01:{}", default_port("77.0")));
        assert!(e.rank0_hosts_store);
        let e = detect(&env(&srun("4", "node07"))).unwrap();
        assert_eq!(e.store_addr.unwrap(), format!("node01:{}", default_port("77.0")));
        let err = config_error(&srun("0", "node02"));
        assert!(err.contains("rank 0 runs on `node02`, not on `node01`, the first host of SLURM_STEP_NODELIST"), "{err}");
        let err = config_error(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")]);
        assert!(err.contains("SLURM_STEP_NUM_NODES is not set") && err.contains("set MASTER_ADDR"), "{err}");
        let err = config_error(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2"), ("SLURM_NNODES", "2"), ("SLURM_NODELIST", "a[1-")]);
        assert!(err.contains("SLURM_NODELIST=\"a[1-\" is not a Slurm host list"), "{err}");
    }

    #[test]
    fn torchrun_with_the_agent_store() {
        let vars = [
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCHELASTIC_RUN_ID", "none"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
        ];
        let e = detect(&env(&vars)).unwrap();
        assert_eq!(e.store_addr, None, "MASTER_PORT belongs to the agent");
        assert_eq!(e.agent_store, Some(AgentStore { addr: "node0:29500".into(), prefix: "/sucl/none/2/".into(), one_host: false }));
        assert_eq!(e.job_id, "none.29500.2");
        // Without the agent store (torch.distributed.launch style), rank 0 hosts the store on MASTER_PORT.
        let e = detect(&env(&vars[..6])).unwrap();
        assert_eq!((e.store_addr.as_deref(), e.agent_store), (Some("node0:29500"), None));
    }

    #[test]
    fn ranks_meet_through_a_c10d_store() {
        let agent = AgentStore { addr: crate::c10d::tests::fake_server(), prefix: "/sucl/none/0/".into(), one_host: true };
        let t = Duration::from_secs(10);
        let others: Vec<_> = (1..3)
            .map(|r| {
                let agent = agent.clone();
                std::thread::spawn(move || {
                    let mut secret = JobSecret::derived("torchrun||none");
                    meet_through_agent_store(r, &agent, &Network::default(), t, &mut secret).map(|(a, s)| (a, s.is_none(), secret))
                })
            })
            .collect();
        let mut secret = JobSecret::derived("torchrun||none");
        let (addr, server) = meet_through_agent_store(0, &agent, &Network::default(), t, &mut secret).unwrap();
        let server = server.expect("rank 0 hosts sucl's store");
        assert_eq!(addr, format!("127.0.0.1:{}", server.addr().port()));
        // Rank 0 replaced the derived secret with a random one, and every rank took it.
        assert_eq!(secret.source(), SecretSource::Random);
        for h in others {
            let (a, no_server, theirs) = h.join().unwrap().unwrap();
            assert_eq!((a, no_server, theirs.expose()), (addr.clone(), true, secret.expose()));
        }
        // The derived secret no longer opens the store.
        let derived = JobSecret::derived("torchrun||none");
        assert!(StoreClient::connect(&addr, 1, Some(0), Duration::from_secs(2), crate::AbortState::new(), &derived).is_err());
        // The published address is sucl's own store: the same exchange works over it.
        let client = StoreClient::connect(&addr, 0, Some(0), t, crate::AbortState::new(), &secret).unwrap();
        assert_eq!(share_store_addr(&client, 0, Some("10.1.2.3:4")).unwrap(), "10.1.2.3:4");
        assert_eq!(share_store_addr(&client, 1, None).unwrap(), "10.1.2.3:4");
        client.set(STORE_ADDR_KEY, b"10.1.2.3").unwrap();
        let err = share_store_addr(&client, 1, None).unwrap_err().to_string();
        assert!(err.contains("unreadable store address \"10.1.2.3\""), "{err}");
        client.bye().unwrap();
        // Across hosts, rank 0 advertises an address other hosts can reach.
        let agent = AgentStore { one_host: false, prefix: "/sucl/none/1/".into(), ..agent };
        match meet_through_agent_store(0, &agent, &Network::default(), t, &mut JobSecret::given("s")) {
            Ok((addr, _server)) => assert!(!addr.parse::<SocketAddr>().unwrap().ip().is_loopback(), "{addr}"),
            Err(e) => assert!(e.to_string().contains("no network address other than loopback"), "{e}"),
        }
    }

    #[test]
    fn slurm_host_lists() {
        let table: &[(&str, &[&str])] = &[
            ("node01", &["node01"]),
            ("node[01-03,07],gpu5", &["node01", "node02", "node03", "node07", "gpu5"]),
            ("a[8-11]", &["a8", "a9", "a10", "a11"]),
            ("rack[1-2]-n[009-010]", &["rack1-n009", "rack1-n010", "rack2-n009", "rack2-n010"]),
            ("x[3],y-z.dom", &["x3", "y-z.dom"]),
        ];
        for (list, want) in table {
            assert_eq!(slurm_hostlist(list, 100).unwrap(), *want, "{list}");
            assert_eq!(slurm_first_host(list).unwrap(), want[0], "{list}");
        }
        for bad in ["", "a,,b", "a[1-", "a]", "a[x]", "a[3-1]", "a[[1]]", "a b", "a[]"] {
            assert!(slurm_first_host(bad).is_err() && slurm_hostlist(bad, 100).is_err(), "{bad:?} must be rejected");
        }
        assert!(slurm_hostlist("n[1-100000000]", 1000).unwrap_err().contains("more than 1000 hosts"));
        assert_eq!(slurm_first_host("n[1-100000000]").unwrap(), "n1");
    }

    proptest::proptest! {
        #[test]
        fn the_first_host_is_the_first_of_the_expansion(
            groups in proptest::collection::vec(("[a-z]{1,4}", proptest::collection::vec((0u32..200, 0u32..5, 1usize..4), 0..3)), 1..4)
        ) {
            let list = groups
                .iter()
                .map(|(name, ranges)| {
                    if ranges.is_empty() {
                        return name.clone();
                    }
                    let inner: Vec<String> =
                        ranges.iter().map(|&(lo, len, w)| format!("{lo:0w$}-{:0w$}", lo + len)).collect();
                    format!("{name}[{}]", inner.join(","))
                })
                .collect::<Vec<_>>()
                .join(",");
            let all = slurm_hostlist(&list, 100_000).unwrap();
            let want: usize = groups.iter().map(|(_, r)| if r.is_empty() { 1 } else { r.iter().map(|&(_, len, _)| len as usize + 1).sum() }).sum();
            proptest::prop_assert_eq!(all.len(), want);
            proptest::prop_assert_eq!(&slurm_first_host(&list).unwrap(), &all[0]);
        }
    }

    fn ifs() -> Vec<(String, IpAddr)> {
        [("lo", "127.0.0.1"), ("lo", "::1"), ("eth0", "fe80::1"), ("eth0", "10.0.0.5"), ("eth1", "fe80::2"), ("ib0", "192.168.1.2")]
            .iter()
            .chain([("ib0", "fd00::7"), ("docker0", "172.17.0.1"), ("v6only", "fd00::9")].iter())
            .map(|(n, a)| (n.to_string(), a.parse().unwrap()))
            .collect()
    }

    #[test]
    fn socket_ifname_follows_nccl_syntax() {
        let table: &[(&str, Option<&str>)] = &[
            ("eth", Some("10.0.0.5")),
            ("eth0", Some("10.0.0.5")),
            ("=eth0", Some("10.0.0.5")),
            ("=eth", None),
            ("ib,eth", Some("10.0.0.5")),
            ("ib", Some("192.168.1.2")),
            ("^lo,eth", Some("192.168.1.2")),
            ("^=lo,eth0,ib0,docker0", Some("fd00::9")),
            ("v6only", Some("fd00::9")),
            ("eth1", None),
            ("^", None),
            ("", None),
            ("nosuch", None),
        ];
        for (spec, want) in table {
            let got = Network::from_settings(&env(&[("SUCL_SOCKET_IFNAME", spec)]), &ifs());
            match want {
                Some(ip) => assert_eq!(got.unwrap().interface.unwrap().1, ip.parse::<IpAddr>().unwrap(), "{spec:?}"),
                None => {
                    let err = got.unwrap_err().to_string();
                    assert!(err.starts_with(&format!("config error: SUCL_SOCKET_IFNAME={spec:?}")), "{spec:?}: {err}");
                }
            }
        }
        let err = Network::from_settings(&env(&[("SUCL_SOCKET_IFNAME", "nosuch")]), &ifs()).unwrap_err().to_string();
        assert!(
            err.contains("matches no interface that is up with a usable address (interfaces here: lo, eth0, eth1, ib0, docker0, v6only)"),
            "{err}"
        );
        // At init: the whole launch environment is refused, naming the variable.
        let err = config_error(&[("SUCL_SOCKET_IFNAME", "=nosuchif0")]);
        assert!(err.contains("SUCL_SOCKET_IFNAME=\"=nosuchif0\" matches no interface"), "{err}");
        assert!(detect(&env(&[("SUCL_SOCKET_IFNAME", "lo")])).is_ok(), "loopback is always there");
    }

    #[test]
    fn port_ranges() {
        for (r, want) in [("50000-50010", Some((50000, 50010))), (" 7 - 9 ", Some((7, 9))), ("50000", Some((50000, 50000)))] {
            assert_eq!(Network::from_settings(&env(&[("SUCL_PORT_RANGE", r)]), &[]).unwrap().ports, want, "{r:?}");
        }
        for r in ["x", "10-5", "0-3", "1-70000", "1-", ""] {
            let err = Network::from_settings(&env(&[("SUCL_PORT_RANGE", r)]), &[]).unwrap_err().to_string();
            assert!(err.contains(&format!("SUCL_PORT_RANGE={r:?} is not a port range")), "{err}");
        }
        // A port in use is skipped; a range wholly in use is an error that names it.
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = held.local_addr().unwrap().port();
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let net = Network { interface: None, ports: Some((p, p.saturating_add(40))) };
        let got = net.listen(lo).unwrap().local_addr().unwrap().port();
        assert!(got > p && got <= p.saturating_add(40), "{got} outside {p}+1..={p}+40");
        let err = Network { interface: None, ports: Some((p, p)) }.listen(lo).unwrap_err().to_string();
        assert!(err.contains(&format!("every port of SUCL_PORT_RANGE={p}-{p} is in use")), "{err}");
        // The store under torchrun's agent binds in the range, at the chosen interface.
        let agent = AgentStore { addr: crate::c10d::tests::fake_server(), prefix: "/sucl/none/0/".into(), one_host: false };
        let net = Network { interface: Some(("lo".into(), lo)), ports: Some((p, p.saturating_add(40))) };
        let (addr, _server) = meet_through_agent_store(0, &agent, &net, Duration::from_secs(5), &mut JobSecret::given("s")).unwrap();
        let addr: SocketAddr = addr.parse().unwrap();
        assert!(addr.ip() == lo && addr.port() > p && addr.port() <= p.saturating_add(40), "{addr}");
    }

    #[test]
    fn unused_loopback_ports_are_free_distinct_and_below_the_ephemeral_range() {
        let ephemeral_low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .map_or(32768, |s| s.split_whitespace().next().unwrap().parse().unwrap());
        let ports: Vec<u16> = (0..64).map(|_| unused_loopback_port().unwrap()).collect();
        for &p in &ports {
            assert!((10_000..ephemeral_low.max(10_100)).contains(&p), "{p} is not below the ephemeral range");
            std::net::TcpListener::bind(("127.0.0.1", p)).unwrap_or_else(|e| panic!("{p} is not free: {e}"));
        }
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "one process got a port twice: {ports:?}");
    }
}
