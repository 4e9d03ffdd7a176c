//! sucl-runtime: the runtime layer of sucl. [`Communicator`] and its typed API over pluggable
//! backends (shared memory, TCP, MPI; NCCL and staged for CUDA memory), bootstrap from the launch
//! environment, backend selection (config, thresholds, tuning rules), argument validation.
//!
//! ```no_run
//! let comm = sucl_runtime::init()?;
//! let mut v = vec![comm.rank() as f32; 4];
//! comm.all_reduce_in_place(&mut v, sucl_runtime::ReduceOp::Sum)?;
//! assert_eq!(v[0], (0..comm.size()).sum::<usize>() as f32);
//! # Ok::<(), sucl_runtime::Error>(())
//! ```
//!
//! Programs use it through the `sucl` crate, which re-exports everything here. It depends on
//! `sucl-core` (types, engine, store), `sucl-host` (shm, tcp) and, by feature, `sucl-mpi` and
//! `sucl-cuda`; the layers above it (stream-triggered queues, task graph, remote devices) depend
//! on it, never the other way round.

#![warn(missing_docs)]

mod agree;
pub mod buf;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "fault-hook")]
mod fault;
mod hier;
mod interrupt;
mod nonblocking;
pub mod select;
pub mod settings;
#[cfg(feature = "cuda")]
mod staged;
mod unscoped;
pub mod vcoll;

pub use buf::{Buf, BufMut, Mem, MemMut};
pub use config::{BackendChoice, Config};
pub use half::{bf16, f16};

/// Runs `$body` with `$T` bound to the Rust element type of a runtime [`DType`] value, for code
/// that receives its element type at run time (the C and Python bindings).
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DType::I8 => {
                type $T = i8;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::U32 => {
                type $T = u32;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::U64 => {
                type $T = u64;
                $body
            }
            $crate::DType::F16 => {
                type $T = $crate::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = $crate::bf16;
                $body
            }
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
        }
    };
}
pub use interrupt::Interrupter;
pub use nonblocking::{Request, Scope};
pub use sucl_core::bootstrap::{unused_loopback_port, LaunchEnv, Launcher};
pub use sucl_core::store::{JobSecret, SecretSource};
pub use sucl_core::{CollOp, DType, Element, Error, ReduceOp, Result};
pub use unscoped::UnscopedRequest;

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use sucl_core::backend::{Backend, CollDesc};
use sucl_core::store::{StoreClient, StoreServer};
use sucl_core::AbortState;
use sucl_host::shm::ShmBackend;
use sucl_host::tcp::TcpBackend;

/// Largest user tag (as MPI's `MPI_TAG_UB` guarantees at least).
pub const MAX_TAG: u32 = i32::MAX as u32;

/// What every communicator of a job shares: the store connection, the abort flag, settings.
struct Context {
    env: LaunchEnv,
    cfg: Config,
    abort: Arc<AbortState>,
    hosts: Vec<String>,
    /// Per world rank: the backends its configuration allows and its process can load.
    avail: Vec<Vec<String>>,
    /// Rank 0's selection policy, used by every rank.
    policy: select::Policy,
    /// Rank 0's checking mode (see [`agree`]), used by every rank.
    check_collectives: bool,
    store: Option<StoreClient>,
    server: Option<StoreServer>,
}

impl Drop for Context {
    fn drop(&mut self) {
        // Leaving cleanly: the store must not report this rank as lost.
        if let Some(s) = &self.store {
            let _ = s.bye();
        }
        if let Some(srv) = &self.server {
            // The store lives in this process: keep it until every rank has left.
            srv.wait_all_bye(self.env.size, self.cfg.host.timeout);
        }
        self.store.take();
        self.server.take();
        #[cfg(feature = "mpi")]
        sucl_mpi::finalize();
    }
}

/// Information about a received message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// Elements received.
    pub count: usize,
}

/// A group of ranks that communicate. Created by [`init`] (the world) or [`Communicator::split`].
///
/// Methods take `&self`; a communicator is used from one thread at a time (it is `Send`, not
/// `Sync`). Every argument of every call is validated locally before anything is posted, and
/// every wait is bounded by the configured timeout (`SUCL_TIMEOUT`).
///
/// Ranks that disagree on a collective's arguments get [`Error::Mismatch`]: always, on every
/// rank and before the call's data moves, with `SUCL_CHECK_COLLECTIVES=1` (config key
/// `check_collectives`), which compares every collective's descriptor across the ranks first;
/// without it wherever the backend can tell (shm: always; tcp: when a frame's descriptor differs
/// from the receiver's, or when a later call finds a message the disagreeing call left behind —
/// collective messages carry their call's sequence number, so no later call can take them; mpi:
/// when MPI reports a message longer than its receive buffer, on that rank, the others getting
/// it at their next call or, if they wait inside MPI already, ending the job, which the mpi
/// backend does whenever a collective cannot return in time: see `sucl_mpi`).
/// After a disagreement on a collective the communicator is poisoned, on every backend: every
/// later call on it returns [`Error::Unusable`], which quotes the `Mismatch` and names the
/// operation that got it (details and the checking mode's cost: the `agree` module's
/// documentation, `crates/sucl-runtime/src/agree.rs`).
pub struct Communicator {
    rank: usize,
    size: usize,
    local_rank: usize,
    world_ranks: Vec<usize>,
    backends: RefCell<Vec<Box<dyn Backend>>>,
    selector: select::Selector,
    pinned: Cell<Option<usize>>,
    /// The device backend every call on device buffers is pinned to (`nccl`, `staged`), if any.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    device_pin: Cell<Option<&'static str>>,
    /// The device side, set up at the first call on device buffers (declared before `ctx`, so that NCCL
    /// goes before the store).
    #[cfg(feature = "cuda")]
    device: RefCell<Option<cuda::DeviceComm>>,
    ctx: Arc<Context>,
    prefix: String,
    splits: Cell<u64>,
    /// Collectives started on this communicator (the checking mode's sequence number).
    coll_seq: Cell<u64>,
    /// Whether collectives compare fingerprints first (the checking mode, with more than one
    /// rank): read on every call, so kept here rather than behind `ctx`.
    checking: bool,
    /// The disagreement that poisoned this communicator, if any (see [`agree`]); set once.
    poisoned: std::cell::OnceCell<agree::Poisoned>,
    /// The operation running now (or last), named by a poisoning it causes.
    current_op: Cell<&'static str>,
}

/// Bootstraps the world communicator from the launch environment (see [`sucl_core::bootstrap`])
/// and the `SUCL_*` settings. A process with no launcher is a world of one. Under an MPI
/// launcher without `MASTER_ADDR`, a build with the `mpi` feature meets the other ranks over MPI.
pub fn init() -> Result<Communicator> {
    let env = sucl_core::bootstrap::detect_with(&|k| std::env::var(k).ok(), &mpi_can_meet)?;
    init_with(env, Config::from_env()?)
}

/// Whether MPI can carry the bootstrap's exchange (it initializes MPI).
fn mpi_can_meet() -> bool {
    #[cfg(feature = "mpi")]
    return sucl_mpi::init().is_ok();
    #[cfg(not(feature = "mpi"))]
    false
}

/// Rank 0 starts the store and every rank learns its address over MPI (see
/// `sucl_mpi::meet_over_mpi`), for an environment with several ranks and no store address.
#[cfg(feature = "mpi")]
fn meet_over_mpi(env: &mut LaunchEnv, timeout: std::time::Duration) -> Result<(String, Option<StoreServer>)> {
    let net = sucl_core::bootstrap::Network::from_env()?;
    sucl_mpi::meet_over_mpi(env.rank, env.size, &net, timeout, &mut env.job_secret)
}

#[cfg(not(feature = "mpi"))]
fn meet_over_mpi(env: &mut LaunchEnv, _: std::time::Duration) -> Result<(String, Option<StoreServer>)> {
    Err(Error::Config(format!(
        "a world of {} ranks has no rendezvous address, and this build cannot meet over MPI (no `mpi` feature): set MASTER_ADDR",
        env.size
    )))
}

/// Bootstraps with an explicit launch environment and configuration.
pub fn init_with(mut env: LaunchEnv, cfg: Config) -> Result<Communicator> {
    let abort = AbortState::new();
    let timeout = cfg.host.timeout;
    let mut server = None;
    if let Some(agent) = env.agent_store.clone() {
        // torchrun's agent owns MASTER_PORT: meet there, at the address rank 0 publishes.
        let (addr, own) = sucl_core::bootstrap::meet_through_agent_store(
            env.rank,
            &agent,
            &sucl_core::bootstrap::Network::from_env()?,
            timeout,
            &mut env.job_secret,
        )?;
        (env.store_addr, env.rank0_hosts_store, server) = (Some(addr), true, own);
    }
    if env.store_addr.is_none() && env.size > 1 {
        // An MPI launcher and no address given (see sucl_core::bootstrap::detect_with).
        let (addr, own) = meet_over_mpi(&mut env, timeout)?;
        (env.store_addr, env.rank0_hosts_store, server) = (Some(addr), true, own);
    }
    if env.store_addr.is_none() {
        // A world of one still gets a private store, so every backend sets up the same way.
        env.job_secret = JobSecret::random().map_err(|e| Error::io(0, "making a secret for a private rendezvous store", e))?;
        let s = StoreServer::start("127.0.0.1:0", env.job_secret.clone())
            .map_err(|e| Error::io(0, "starting a private rendezvous store", e))?;
        env.store_addr = Some(s.addr().to_string());
        env.rank0_hosts_store = false;
        server = Some(s);
    }
    let store = match &env.store_addr {
        None => None,
        Some(addr) => {
            if env.rank0_hosts_store && env.rank == 0 && server.is_none() {
                // Loopback for a one-host job, else the address given (see sucl_core::bootstrap).
                let bind = sucl_core::bootstrap::store_bind_addrs(addr)?;
                server = Some(
                    StoreServer::start(&bind[..], env.job_secret.clone())
                        .map_err(|e| Error::io(0, format!("starting the rendezvous store on {bind:?}"), e))?,
                );
            }
            let server_rank = (env.rank0_hosts_store || env.size == 1).then_some(0);
            Some(StoreClient::connect(addr, env.rank, server_rank, timeout, abort.clone(), &env.job_secret)?)
        }
    };
    // Each rank publishes its host identity and the machine it really runs on: the identity
    // decides who shares memory, the machine how many processes share its cores.
    let me = format!("{}\n{}", host_identity(), sucl_core::bootstrap::hostname());
    let published = match &store {
        None => vec![me],
        Some(s) => {
            s.set(&format!("world/host/{}", env.rank), me.as_bytes())?;
            (0..env.size)
                .map(|r| s.get(&format!("world/host/{r}")).map(|v| String::from_utf8_lossy(&v).into_owned()))
                .collect::<Result<Vec<_>>>()?
        }
    };
    let split = |v: &String| -> (String, String) {
        let (id, machine) = v.split_once('\n').unwrap_or((v, v));
        (id.to_string(), machine.to_string())
    };
    let (hosts, machines): (Vec<String>, Vec<String>) = published.iter().map(split).unzip();
    let (rank, size, local_rank) = (env.rank, env.size, env.local_rank);
    let mut cfg = cfg;
    if !cfg.backoff_set {
        let here = machines.iter().filter(|m| **m == machines[rank]).count();
        cfg.host.backoff = sucl_core::wait::Backoff::for_local_ranks(here);
    }
    let store_ref = store.as_ref().expect("a store");
    // Settings that shape algorithms, layouts and protocols are rank 0's on every rank.
    config::agree_settings(&mut cfg, store_ref, rank)?;
    // What this rank may use: its platform's list plus the universal default, each loadable here.
    let platform = cfg.platforms.get("host").expect("host platform");
    // Backends named by the user must load; the built-in list just takes what is there.
    let explicit = cfg.backends_explicit;
    let forced = match &cfg.backend {
        BackendChoice::Named(n) => Some(n.clone()),
        BackendChoice::Auto => None,
    };
    let mut mine: Vec<String> = vec![];
    for name in platform.backends.iter().chain(std::iter::once(&cfg.default_backend)).chain(forced.iter()) {
        if mine.contains(name) {
            continue;
        }
        match backend_loadable(name, &env) {
            Ok(()) => mine.push(name.clone()),
            Err(why) if explicit || forced.as_ref() == Some(name) => {
                return Err(Error::BackendUnavailable { rank, backend: name.clone(), why })
            }
            Err(why) => tracing::debug!(backend = name.as_str(), why, "backend not loadable here"),
        }
    }
    store_ref.set(&format!("world/avail/{rank}"), mine.join(",").as_bytes())?;
    let avail = (0..size)
        .map(|r| store_ref.get(&format!("world/avail/{r}")).map(|v| String::from_utf8_lossy(&v).split(',').map(str::to_string).collect()))
        .collect::<Result<Vec<Vec<String>>>>()?;
    let own_policy = select::Policy::from_config(&cfg, "host");
    let policy = if rank == 0 {
        store_ref.set("world/policy", serde_json::to_string(&own_policy).expect("policy serializes").as_bytes())?;
        own_policy
    } else {
        let p: select::Policy = serde_json::from_slice(&store_ref.get("world/policy")?).map_err(|e| Error::Mismatch {
            rank,
            what: format!("rank 0's selection policy is unreadable ({e}): different sucl versions?"),
        })?;
        if p != own_policy {
            tracing::warn!(rank, "this rank's backend selection settings differ from rank 0's; rank 0's are used");
        }
        p
    };
    let check_collectives = agree_on_checking(store_ref, rank, cfg.check_collectives)?;
    let ctx = Arc::new(Context { env, cfg, abort, hosts, avail, policy, check_collectives, store, server });
    let world_ranks: Vec<usize> = (0..size).collect();
    let (backends, selector) = make_backends(&ctx, "world", rank, &world_ranks)?;
    if let Some(s) = &ctx.store {
        s.barrier("world/ready", size)?;
    }
    tracing::debug!(rank, size, backends = ?selector.names(), "sucl initialized");
    Ok(Communicator::member(rank, local_rank, world_ranks, backends, selector, ctx, "world".into()))
}

/// The name that says which ranks share a host: `SUCL_HOSTNAME` when set (tests and benchmarks
/// run several "hosts" on one machine with it), else the machine's hostname.
pub fn host_identity() -> String {
    std::env::var("SUCL_HOSTNAME").ok().filter(|h| !h.trim().is_empty()).unwrap_or_else(sucl_core::bootstrap::hostname)
}

/// Rank 0's checking mode, for every rank (one rank checking alone would wait for the others).
fn agree_on_checking(store: &StoreClient, rank: usize, mine: bool) -> Result<bool> {
    if rank == 0 {
        store.set("world/check-collectives", &[mine as u8])?;
        return Ok(mine);
    }
    let v = store.get("world/check-collectives")?;
    let theirs = v.first().is_some_and(|&b| b == 1);
    if theirs != mine {
        tracing::warn!(rank, "SUCL_CHECK_COLLECTIVES differs from rank 0's; rank 0's ({theirs}) is used");
    }
    Ok(theirs)
}

/// Whether backend `name` can be loaded by this process (shm's one-host condition is checked
/// per communicator).
fn backend_loadable(name: &str, env: &LaunchEnv) -> std::result::Result<(), String> {
    match name {
        "shm" | "tcp" | "hier" => Ok(()),
        "mpi" => mpi_loadable(env),
        other => Err(format!("unknown backend `{other}`")),
    }
}

#[cfg(feature = "mpi")]
fn mpi_loadable(env: &LaunchEnv) -> std::result::Result<(), String> {
    if !matches!(env.launcher, Launcher::OpenMpi | Launcher::Pmi | Launcher::Slurm) {
        return Err(format!("the job was not started by an MPI launcher (launcher: {})", env.launcher.name()));
    }
    sucl_mpi::init().map(|_| ())
}

#[cfg(not(feature = "mpi"))]
fn mpi_loadable(_env: &LaunchEnv) -> std::result::Result<(), String> {
    Err("built without the `mpi` feature".into())
}

/// The MPI library's version, if this build has MPI and it initializes.
pub fn mpi_version() -> std::result::Result<String, String> {
    #[cfg(feature = "mpi")]
    return sucl_mpi::version();
    #[cfg(not(feature = "mpi"))]
    Err("built without the `mpi` feature".into())
}

/// Availability of every backend this build knows, for `sucl info`.
pub fn backend_report(env: &LaunchEnv) -> Vec<(&'static str, std::result::Result<(), String>)> {
    config::KNOWN_BACKENDS
        .iter()
        .map(|&n| {
            let r = match n {
                "shm" => Ok(()),
                _ => backend_loadable(n, env),
            };
            (n, r)
        })
        .collect()
}

/// Builds every backend all members can use, in a fixed order, and the selector over them.
fn make_backends(
    ctx: &Arc<Context>,
    prefix: &str,
    rank: usize,
    world_ranks: &[usize],
) -> Result<(Vec<Box<dyn Backend>>, select::Selector)> {
    let wr = world_ranks[rank];
    let one_host = world_ranks.iter().all(|&w| ctx.hosts[w] == ctx.hosts[world_ranks[0]]);
    let layout = hier::Layout::of(&world_ranks.iter().map(|&w| ctx.hosts[w].as_str()).collect::<Vec<_>>());
    let everyone_has = |name: &str| world_ranks.iter().all(|&w| ctx.avail[w].iter().any(|a| a == name));
    let usable = |name: &str| match name {
        "shm" => one_host && everyone_has("shm"),
        // Composes shm inside hosts and tcp between them: needs both, and a grid of hosts.
        "hier" => layout.is_some() && everyone_has("shm") && everyone_has("tcp"),
        _ => everyone_has(name),
    };
    let policy = &ctx.policy;
    // Forcing hier asks for it wherever it applies: a sub-communicator that is no grid of hosts
    // (a split down to one rank per host, say) takes the other backends; the world must be one.
    let forced = policy.forced.as_ref().filter(|f| !(f.as_str() == select::HIER && layout.is_none() && prefix != "world"));
    if let Some(f) = forced {
        if !usable(f) {
            let why = if f == "shm" && !one_host {
                "the ranks are on more than one host".to_string()
            } else if f == "hier" && layout.is_none() {
                "it needs ranks on at least two hosts, the same number (at least two) on each".to_string()
            } else {
                let missing: Vec<usize> = world_ranks.iter().copied().filter(|&w| !ctx.avail[w].iter().any(|a| a == f)).collect();
                format!("ranks {missing:?} cannot use it (not allowed by their configuration or not loadable there)")
            };
            return Err(Error::BackendUnavailable { rank: wr, backend: f.clone(), why });
        }
    }
    let mut names: Vec<&'static str> = vec![];
    for &n in config::KNOWN_BACKENDS.iter() {
        let wanted = match forced {
            Some(f) => f == n || policy.default == n,
            None => true,
        };
        if wanted && usable(n) {
            names.push(n);
        }
    }
    if !names.contains(&policy.default.as_str()) {
        return Err(Error::BackendUnavailable {
            rank: wr,
            backend: policy.default.clone(),
            why: "the default backend must be usable by every rank".into(),
        });
    }
    let mut backends: Vec<Box<dyn Backend>> = vec![];
    for &n in &names {
        backends.push(match (n, &layout) {
            ("hier", Some(layout)) => make_hier(ctx, prefix, rank, world_ranks, layout.clone())?,
            _ => make_backend(ctx, prefix, rank, world_ranks, n)?,
        });
    }
    let selector = select::Selector::new(policy, &names, world_ranks.len());
    Ok((backends, selector))
}

/// The hierarchical backend: shm among this host's ranks, tcp among the ranks of this local
/// index on every host (see the `hier` module).
fn make_hier(ctx: &Arc<Context>, prefix: &str, rank: usize, world_ranks: &[usize], layout: hier::Layout) -> Result<Box<dyn Backend>> {
    let (h, l) = layout.pos[rank];
    let here: Vec<usize> = layout.at[h].iter().map(|&r| world_ranks[r]).collect();
    let across: Vec<usize> = layout.at.iter().map(|g| world_ranks[g[l]]).collect();
    let local = make_backend(ctx, &format!("{prefix}/hier/host{h}"), l, &here, "shm")?;
    let cross = make_backend(ctx, &format!("{prefix}/hier/index{l}"), h, &across, "tcp")?;
    let settings = hier::HierSettings { timeout: ctx.cfg.host.timeout, backoff: ctx.cfg.host.backoff };
    Ok(Box::new(hier::Hier::new(rank, world_ranks[rank], layout, local, cross, settings)))
}

fn make_backend(ctx: &Arc<Context>, prefix: &str, rank: usize, world_ranks: &[usize], name: &str) -> Result<Box<dyn Backend>> {
    let cfg = &ctx.cfg.host;
    let store = ctx.store.as_ref().ok_or_else(|| Error::Config("no rendezvous store".into()))?;
    match name {
        "shm" => {
            let nonce = store.add("shm-nonce", 1)?;
            let job: String = ctx.env.job_id.chars().filter(|c| c.is_ascii_alphanumeric()).take(40).collect();
            // Unique per job (store nonce), per creating process and per communicator in it.
            static CREATED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let local = CREATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let name = format!("/sucl-{job}-{}-{nonce}-{local}", std::process::id());
            Ok(Box::new(ShmBackend::connect(store, prefix, &name, rank, world_ranks.to_vec(), ctx.abort.clone(), cfg)?))
        }
        "tcp" => Ok(Box::new(TcpBackend::connect(store, prefix, rank, world_ranks.to_vec(), ctx.abort.clone(), cfg, &ctx.env.job_secret)?)),
        #[cfg(feature = "mpi")]
        "mpi" => Ok(Box::new(sucl_mpi::MpiBackend::new(rank, world_ranks.to_vec(), ctx.abort.clone(), cfg.timeout, cfg.backoff)?)),
        other => {
            Err(Error::BackendUnavailable { rank: world_ranks[rank], backend: other.into(), why: "not available in this build".into() })
        }
    }
}

/// The shared-memory segment name prefix of a job (the launcher removes leftovers with it).
pub fn shm_prefix(job_id: &str) -> String {
    let job: String = job_id.chars().filter(|c| c.is_ascii_alphanumeric()).take(40).collect();
    format!("sucl-{job}-")
}

impl Communicator {
    /// A communicator of the ranks `world_ranks` (this process is `rank` of them) with nothing
    /// pinned and no device side yet: the one place that lists every field.
    fn member(
        rank: usize,
        local_rank: usize,
        world_ranks: Vec<usize>,
        backends: Vec<Box<dyn Backend>>,
        selector: select::Selector,
        ctx: Arc<Context>,
        prefix: String,
    ) -> Communicator {
        let checking = ctx.check_collectives && world_ranks.len() > 1;
        Communicator {
            rank,
            size: world_ranks.len(),
            local_rank,
            world_ranks,
            backends: RefCell::new(backends),
            selector,
            pinned: Cell::new(None),
            device_pin: Cell::new(None),
            #[cfg(feature = "cuda")]
            device: RefCell::new(None),
            ctx,
            prefix,
            splits: Cell::new(0),
            coll_seq: Cell::new(0),
            checking,
            poisoned: std::cell::OnceCell::new(),
            current_op: Cell::new(""),
        }
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Rank among the processes on this host (world communicator: from the launcher).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The backend serving point-to-point calls (and, on one platform, most collectives).
    pub fn backend_name(&self) -> &'static str {
        self.selector.names()[self.p2p_index()]
    }

    /// `auto` when calls may go to different backends, else the one backend's name.
    pub fn backend_label(&self) -> &'static str {
        match self.pinned.get() {
            Some(i) => self.selector.names()[i],
            None => self.selector.label(),
        }
    }

    /// The backends this communicator loaded (those every member can use).
    pub fn backends(&self) -> Vec<&'static str> {
        self.selector.names().to_vec()
    }

    /// The backend a collective `op` on a buffer of `bytes` bytes (as `sucl bench` counts them)
    /// would use.
    pub fn backend_for(&self, op: CollOp, bytes: usize) -> &'static str {
        let i = self.pinned.get().unwrap_or_else(|| self.selector.pick(op, bytes as u64));
        self.selector.names()[i]
    }

    /// Sends every later call to backend `name` (None: back to automatic selection for host
    /// and calls on device buffers). A host backend pins host calls; `nccl` or `staged` pins calls on device buffers.
    /// For benchmarks and tuning; every rank must pin the same way at the same point.
    pub fn pin_backend(&self, name: Option<&str>) -> Result<()> {
        match name {
            None => {
                self.pinned.set(None);
                self.device_pin.set(None);
            }
            Some(n) if config::DEVICE_BACKENDS.contains(&n) => {
                #[cfg(feature = "cuda")]
                {
                    let loaded = self.device_backends();
                    if !loaded.is_empty() && !loaded.contains(&n) {
                        let why = match self.ipc_unavailable_reason() {
                            Some(why) if n == "ipc" => why,
                            _ => format!("not usable by this communicator (device backends: {loaded:?})"),
                        };
                        return Err(Error::BackendUnavailable { rank: self.wr(), backend: n.into(), why });
                    }
                    self.device_pin.set(config::DEVICE_BACKENDS.iter().copied().find(|&b| b == n));
                }
                #[cfg(not(feature = "cuda"))]
                return Err(Error::BackendUnavailable {
                    rank: self.wr(),
                    backend: n.into(),
                    why: "sucl was built without the `cuda` feature".into(),
                });
            }
            Some(n) => {
                let i = self.selector.names().iter().position(|&x| x == n).ok_or_else(|| Error::BackendUnavailable {
                    rank: self.wr(),
                    backend: n.into(),
                    why: format!("not loaded by this communicator (loaded: {:?})", self.selector.names()),
                })?;
                self.pinned.set(Some(i));
            }
        }
        Ok(())
    }

    fn p2p_index(&self) -> usize {
        self.selector.p2p_with(self.pinned.get())
    }

    /// The launch environment detected at [`init`].
    pub fn launch_env(&self) -> &LaunchEnv {
        &self.ctx.env
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.ctx.cfg
    }

    pub(crate) fn wr(&self) -> usize {
        self.world_ranks[self.rank]
    }

    fn check_rank(&self, arg: &'static str, r: usize) -> Result<()> {
        if r >= self.size {
            return Err(Error::invalid(self.wr(), arg, format!("rank {r} out of range (communicator size {})", self.size)));
        }
        Ok(())
    }

    fn check_tag(&self, tag: u32) -> Result<()> {
        if tag > MAX_TAG {
            return Err(Error::invalid(self.wr(), "tag", format!("{tag} exceeds the largest tag {MAX_TAG}")));
        }
        Ok(())
    }

    #[inline]
    fn check_len(&self, arg: &'static str, got: usize, want: usize, what: &str) -> Result<()> {
        if got != want {
            return Err(self.len_error(arg, got, want, what));
        }
        Ok(())
    }

    /// [`Communicator::check_len`]'s error, out of the calls' way.
    #[cold]
    #[inline(never)]
    fn len_error(&self, arg: &'static str, got: usize, want: usize, what: &str) -> Error {
        Error::invalid(self.wr(), arg, format!("has {got} elements but {what} needs {want}"))
    }

    pub(crate) fn backend_mut(&self) -> std::cell::RefMut<'_, Box<dyn Backend>> {
        let i = self.p2p_index();
        std::cell::RefMut::map(self.backends.borrow_mut(), |v| &mut v[i])
    }

    /// Checks the peer and tag of point-to-point operation `op` ("send", "irecv", ...) and that
    /// the communicator is usable.
    pub(crate) fn validate_p2p(&self, op: &'static str, peer: usize, tag: u32) -> Result<()> {
        self.check_rank("peer", peer)?;
        self.check_tag(tag)?;
        self.check_poisoned(op)?;
        self.current_op.set(op);
        Ok(())
    }

    /// Blocking send of `buf` (host or device memory) to `dest` with `tag`. Device buffers go
    /// over NCCL, which carries no tags (messages between two ranks match in call order and the
    /// receive must have the sent length), or staged through host memory.
    pub fn send<B: Buf + ?Sized>(&self, buf: &B, dest: usize, tag: u32) -> Result<()> {
        self.validate_p2p("send", dest, tag)?;
        // One arm without the `cuda` feature.
        #[allow(clippy::infallible_destructuring_match)]
        let bytes = match buf.mem() {
            Mem::Host(b) => b,
            #[cfg(feature = "cuda")]
            Mem::Device(m) => return self.device_send(m, dest, tag),
        };
        let mut b = self.backend_mut();
        // SAFETY: we wait (or cancel) before `buf`'s borrow ends.
        let r = unsafe { b.post_send(dest, tag as u64, bytes.as_ptr(), bytes.len()) };
        let r = r.and_then(|r| b.wait(r).map(|_| ()).inspect_err(|_| b.cancel(r)));
        drop(b);
        self.settle(r)
    }

    /// Blocking receive from `src` with `tag` into `buf` (messages from one source with one tag
    /// arrive in order). A message longer than `buf` is an error.
    pub fn recv<B: BufMut + ?Sized>(&self, buf: &mut B, src: usize, tag: u32) -> Result<Status> {
        self.validate_p2p("recv", src, tag)?;
        let es = std::mem::size_of::<B::Elem>();
        let n = match buf.mem_mut() {
            MemMut::Host(bytes) => {
                let mut b = self.backend_mut();
                // SAFETY: we wait (or cancel) before `buf`'s borrow ends.
                let r = unsafe { b.post_recv(src, tag as u64, bytes.as_mut_ptr(), bytes.len()) };
                let r = r.and_then(|r| b.wait(r).inspect_err(|_| b.cancel(r)));
                drop(b);
                self.settle(r)?
            }
            #[cfg(feature = "cuda")]
            MemMut::Device(m) => self.device_recv(m, src, tag)?,
        };
        if n % es != 0 {
            return Err(Error::Mismatch {
                rank: self.wr(),
                what: format!("message size: {n} bytes from rank {src} is not a whole number of {}", <B::Elem as Element>::DTYPE),
            });
        }
        Ok(Status { count: n / es })
    }

    /// Sends `sbuf` to `dest` while receiving into `rbuf` from `src` (no deadlock in rings).
    pub fn sendrecv<S: Buf + ?Sized, R: BufMut<Elem = S::Elem> + ?Sized>(
        &self,
        sbuf: &S,
        dest: usize,
        rbuf: &mut R,
        src: usize,
        tag: u32,
    ) -> Result<Status> {
        // Both halves first: a bad destination must not leave a posted receive waiting.
        self.validate_p2p("sendrecv", dest, tag)?;
        self.validate_p2p("sendrecv", src, tag)?;
        let es = std::mem::size_of::<S::Elem>();
        match (sbuf.mem(), rbuf.mem_mut()) {
            (Mem::Host(s), MemMut::Host(r)) => {
                let n = self.nonblocking(|sc| {
                    let rq = sc.irecv(r, src, tag)?;
                    let w = sc.isend(s, dest, tag)?;
                    w.wait()?;
                    rq.wait()
                });
                self.settle(n).map(|n| Status { count: n / es })
            }
            #[cfg(feature = "cuda")]
            (Mem::Device(s), MemMut::Device(r)) => self.device_sendrecv(s, dest, r, src, tag).map(|n| Status { count: n / es }),
            #[cfg(feature = "cuda")]
            _ => Err(self.mixed_memory()),
        }
    }

    #[inline]
    pub(crate) fn coll(&self, desc: CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        let mut bs = self.backends.borrow_mut();
        let i = self.host_backend_for(&bs, &desc);
        let done = bs[i].collective(&desc, send, recv);
        #[cfg(feature = "fault-hook")]
        if done.is_ok() && fault::hits(self.selector.names()[i], desc.op) {
            fault::corrupt_last(recv, desc.dtype.size());
        }
        done
    }

    /// [`Communicator::coll`] without the fault hook.
    pub(crate) fn coll_unhooked(&self, desc: CollDesc, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        let mut bs = self.backends.borrow_mut();
        let i = self.host_backend_for(&bs, &desc);
        bs[i].collective(&desc, send, recv)
    }

    /// The index in `bs` (the host backends) of the one that runs collective `desc`: the pinned
    /// one, else the one selection picks, unless it does not support `desc` (then the default).
    #[inline]
    fn host_backend_for(&self, bs: &[Box<dyn Backend>], desc: &CollDesc) -> usize {
        let i = match self.pinned.get() {
            Some(i) => i,
            None => self.selector.pick(desc.op, select::selection_bytes(desc, self.size)),
        };
        // The default backend serves whatever another one refuses, so only another is asked.
        let i = if i != self.selector.default() && !bs[i].supports(desc) { self.selector.default() } else { i };
        tracing::debug!(
            op = desc.op.name(),
            count = desc.count,
            dtype = desc.dtype.name(),
            backend = self.selector.names()[i],
            "collective"
        );
        i
    }

    /// Runs a collective on buffers wherever they live. `send == None`: in place (or not used on
    /// this rank); `recv == None`: not written on this rank. Host memory goes to the host
    /// backends, device memory to the device backends; one call may not mix the two.
    #[inline]
    fn call(&self, desc: CollDesc, send: Option<Mem<'_>>, recv: Option<MemMut<'_>>) -> Result<()> {
        self.enter_collective(&desc)?;
        let r = self.call_unchecked(desc, send, recv);
        self.settle(r)
    }

    /// [`Communicator::call`] after the agreement step.
    #[inline]
    fn call_unchecked(&self, desc: CollDesc, send: Option<Mem<'_>>, recv: Option<MemMut<'_>>) -> Result<()> {
        let device = send.as_ref().is_some_and(|m| m.is_device()) || recv.as_ref().is_some_and(|m| m.is_device());
        if device {
            #[cfg(feature = "cuda")]
            return self.device_call(desc, send, recv);
        }
        let send = match send {
            None => None,
            Some(Mem::Host(b)) => Some(b),
            #[cfg(feature = "cuda")]
            Some(_) => unreachable!("device memory handled above"),
        };
        match recv {
            None => self.coll(desc, send, &mut []),
            Some(MemMut::Host(b)) => self.coll(desc, send, b),
            #[cfg(feature = "cuda")]
            Some(_) => unreachable!("device memory handled above"),
        }
    }

    fn desc<T: Element>(op: CollOp, count: usize, redop: ReduceOp, root: usize) -> CollDesc {
        CollDesc { op, dtype: T::DTYPE, redop, root, count }
    }

    /// Blocks until every rank has called it.
    pub fn barrier(&self) -> Result<()> {
        self.enter_collective(&CollDesc::BARRIER)?;
        let r = self.coll(CollDesc::BARRIER, None, &mut []);
        self.settle(r)
    }

    /// Copies root's `buf` into every rank's `buf`.
    pub fn broadcast<B: BufMut + ?Sized>(&self, buf: &mut B, root: usize) -> Result<()> {
        self.check_rank("root", root)?;
        let d = Self::desc::<B::Elem>(CollOp::Broadcast, buf.len(), ReduceOp::Sum, root);
        self.call(d, None, Some(buf.mem_mut()))
    }

    /// `recv = reduce(op, every rank's send)` on every rank.
    pub fn all_reduce<S: Buf + ?Sized, R: BufMut<Elem = S::Elem> + ?Sized>(&self, send: &S, recv: &mut R, op: ReduceOp) -> Result<()> {
        self.check_len("recv", recv.len(), send.len(), "all_reduce (same as send)")?;
        let d = Self::desc::<S::Elem>(CollOp::AllReduce, send.len(), op, 0);
        self.call(d, Some(send.mem()), Some(recv.mem_mut()))
    }

    /// In-place all_reduce.
    pub fn all_reduce_in_place<B: BufMut + ?Sized>(&self, buf: &mut B, op: ReduceOp) -> Result<()> {
        let d = Self::desc::<B::Elem>(CollOp::AllReduce, buf.len(), op, 0);
        self.call(d, None, Some(buf.mem_mut()))
    }

    /// Reduces every rank's `send` into root's `recv` (other ranks' `recv` is not used; they may
    /// pass an empty one).
    pub fn reduce<S: Buf + ?Sized, R: BufMut<Elem = S::Elem> + ?Sized>(
        &self,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.check_rank("root", root)?;
        let d = Self::desc::<S::Elem>(CollOp::Reduce, send.len(), op, root);
        if self.rank == root {
            self.check_len("recv", recv.len(), send.len(), "reduce's root (same as send)")?;
            self.call(d, Some(send.mem()), Some(recv.mem_mut()))
        } else {
            self.call(d, Some(send.mem()), None)
        }
    }

    /// In-place reduce: `buf` is the input everywhere and the result on root.
    pub fn reduce_in_place<B: BufMut + ?Sized>(&self, buf: &mut B, op: ReduceOp, root: usize) -> Result<()> {
        self.check_rank("root", root)?;
        let d = Self::desc::<B::Elem>(CollOp::Reduce, buf.len(), op, root);
        if self.rank == root {
            self.call(d, None, Some(buf.mem_mut()))
        } else {
            self.call(d, Some(buf.mem()), None)
        }
    }

    /// Concatenates every rank's `send` (in rank order) into root's `recv` (`size × send.len()`;
    /// not used on other ranks).
    pub fn gather<S: Buf + ?Sized, R: BufMut<Elem = S::Elem> + ?Sized>(&self, send: &S, recv: &mut R, root: usize) -> Result<()> {
        self.check_rank("root", root)?;
        let d = Self::desc::<S::Elem>(CollOp::Gather, send.len(), ReduceOp::Sum, root);
        if self.rank == root {
            self.check_len("recv", recv.len(), send.len().saturating_mul(self.size), "gather's root (size × send)")?;
            self.call(d, Some(send.mem()), Some(recv.mem_mut()))
        } else {
            self.call(d, Some(send.mem()), None)
        }
    }

    /// Concatenates every rank's `send` into every rank's `recv` (`size × send.len()`).
    pub fn all_gather<S: Buf + ?Sized, R: BufMut<Elem = S::Elem> + ?Sized>(&self, send: &S, recv: &mut R) -> Result<()> {
        self.check_len("recv", recv.len(), send.len().saturating_mul(self.size), "all_gather (size × send)")?;
        let d = Self::desc::<S::Elem>(CollOp::AllGather, send.len(), ReduceOp::Sum, 0);
        self.call(d, Some(send.mem()), Some(recv.mem_mut()))
    }

    /// In-place all_gather: each rank's block already sits at its position in `buf`.
    pub fn all_gather_in_place<B: BufMut + ?Sized>(&self, buf: &mut B) -> Result<()> {
        self.check_multiple("buf", buf.len())?;
        let d = Self::desc::<B::Elem>(CollOp::AllGather, buf.len() / self.size, ReduceOp::Sum, 0);
        self.call(d, None, Some(buf.mem_mut()))
    }

    /// Sends block `j` of root's `send` (`size × recv.len()`; not used on other ranks) to rank
    /// `j`'s `recv`.
    pub fn scatter<S: Buf + ?Sized, R: BufMut<Elem = S::Elem> + ?Sized>(&self, send: &S, recv: &mut R, root: usize) -> Result<()> {
        self.check_rank("root", root)?;
        let d = Self::desc::<S::Elem>(CollOp::Scatter, recv.len(), ReduceOp::Sum, root);
        if self.rank == root {
            self.check_len("send", send.len(), recv.len().saturating_mul(self.size), "scatter's root (size × recv)")?;
            self.call(d, Some(send.mem()), Some(recv.mem_mut()))
        } else {
            self.call(d, None, Some(recv.mem_mut()))
        }
    }

    /// Block `j` of every rank's `send` goes to block `i` (the sender's rank) of rank `j`'s `recv`.
    pub fn all_to_all<S: Buf + ?Sized, R: BufMut<Elem = S::Elem> + ?Sized>(&self, send: &S, recv: &mut R) -> Result<()> {
        self.check_len("recv", recv.len(), send.len(), "all_to_all (same as send)")?;
        self.check_multiple("send", send.len())?;
        let d = Self::desc::<S::Elem>(CollOp::AllToAll, send.len() / self.size, ReduceOp::Sum, 0);
        self.call(d, Some(send.mem()), Some(recv.mem_mut()))
    }

    /// Reduces every rank's `send` (`size × recv.len()`); rank `r` receives block `r`.
    pub fn reduce_scatter<S: Buf + ?Sized, R: BufMut<Elem = S::Elem> + ?Sized>(&self, send: &S, recv: &mut R, op: ReduceOp) -> Result<()> {
        self.check_len("send", send.len(), recv.len().saturating_mul(self.size), "reduce_scatter (size × recv)")?;
        let d = Self::desc::<S::Elem>(CollOp::ReduceScatter, recv.len(), op, 0);
        self.call(d, Some(send.mem()), Some(recv.mem_mut()))
    }

    fn check_multiple(&self, arg: &'static str, len: usize) -> Result<()> {
        if !len.is_multiple_of(self.size) {
            return Err(Error::invalid(self.wr(), arg, format!("length {len} is not a multiple of the communicator size {}", self.size)));
        }
        Ok(())
    }
    /// Splits into sub-communicators: ranks with the same `color` form one, ordered by `key`
    /// then by rank. `None` (MPI_UNDEFINED) joins none and returns `None`. Collective.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        let n = self.splits.get() + 1;
        self.splits.set(n);
        let mine = [color.map(|c| c as u64).unwrap_or(u64::MAX), key as u64];
        let mut all = vec![0u64; 2 * self.size];
        self.all_gather(&mine, &mut all)?;
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<(i64, usize)> =
            (0..self.size).filter(|&r| all[2 * r] == color as u64).map(|r| (all[2 * r + 1] as i64, r)).collect();
        members.sort();
        let new_rank = members.iter().position(|&(_, r)| r == self.rank).expect("self is a member");
        let world_ranks: Vec<usize> = members.iter().map(|&(_, r)| self.world_ranks[r]).collect();
        let prefix = format!("{}/split{n}/c{color}", self.prefix);
        let (backends, selector) = make_backends(&self.ctx, &prefix, new_rank, &world_ranks)?;
        if let Some(s) = &self.ctx.store {
            s.barrier(&format!("{prefix}/ready"), world_ranks.len())?;
        }
        let my_host = &self.ctx.hosts[self.wr()];
        let local_rank = world_ranks[..new_rank].iter().filter(|&&w| &self.ctx.hosts[w] == my_host).count();
        Ok(Some(Communicator::member(new_rank, local_rank, world_ranks, backends, selector, self.ctx.clone(), prefix)))
    }

    /// Gathers `bytes` from every rank (in rank order) through the rendezvous store, not through
    /// any backend: for results that must not depend on the backend being checked (test totals,
    /// counts of wrong elements). Collective over this communicator; `key` must be the same on
    /// every rank and unique per call within this communicator. Every rank makes `size + 1`
    /// store round trips: meant for a few bytes now and then, never for data.
    pub fn oob_all_gather(&self, key: &str, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let store = self.ctx.store.as_ref().ok_or_else(|| Error::Config("no rendezvous store".into()))?;
        let base = format!("{}/oob/{key}", self.prefix);
        store.set(&format!("{base}/{}", self.rank), bytes)?;
        (0..self.size).map(|r| store.get(&format!("{base}/{r}"))).collect()
    }

    /// The world rank of this communicator's rank `r`.
    pub fn world_rank_of(&self, r: usize) -> Option<usize> {
        self.world_ranks.get(r).copied()
    }
}
